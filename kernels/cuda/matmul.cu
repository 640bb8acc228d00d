// y = x W^T over weights in their stored precision (FP8 with UE8M0 128x128
// blocks, MXFP4, BF16, F32), float32 accumulation.
//   few tokens (decode): one warp per output row, 16-byte weight loads
//     dequantized in registers, every token of the tile against each load;
//   many tokens (prefill): 64x64 output tiles, weights dequantized into
//     shared memory once per tile.
// Both have a grouped form for MoE experts packed by the backend.
#include <cuda_bf16.h>

#include "kernels.cuh"

// Elements per 16-byte load.
template <int QT> struct vec_of { static constexpr int n = 4; };
template <> struct vec_of<QT_BF16> { static constexpr int n = 8; };
template <> struct vec_of<QT_FP8> { static constexpr int n = 16; };
template <> struct vec_of<QT_MXFP4> { static constexpr int n = 32; };

// Dequantize the 16 bytes holding copy columns [c, c + VEC) of row r.
template <int QT>
__device__ __forceinline__ void load_vec(const dqw &w, const uint8_t *data, const uint8_t *scale,
                                         long long r, long long c, float *v)
{
    if (QT == QT_F32) {
        float4 f = *(const float4 *)((const float *)data + r * w.ld + c);
        v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
    } else if (QT == QT_BF16) {
        uint4 u = *(const uint4 *)((const uint16_t *)data + r * w.ld + c);
        uint32_t p[4] = { u.x, u.y, u.z, u.w };
#pragma unroll
        for (int i = 0; i < 4; i++) {
            v[2 * i] = __uint_as_float(p[i] << 16);
            v[2 * i + 1] = __uint_as_float(p[i] & 0xffff0000u);
        }
    } else if (QT == QT_FP8) {
        // e4m3's 7 magnitude bits as a float32's low exponent bits and top
        // mantissa bits: a float32 (subnormal for e = 0) that is the value
        // times 2^-120.  The scale folds into the factor unless that would
        // overflow; 0x7f codes are NaN (rare: checked four bytes at once).
        uint4 u = *(const uint4 *)(data + r * w.ld + c);
        float s = e8m0f(scale[(r >> 7) * w.sld + (c >> 7)]);
        bool fold = s < 128.0f;
        float k = fold ? s * 0x1p120f : 0x1p120f;
        uint32_t p[4] = { u.x, u.y, u.z, u.w };
#pragma unroll
        for (int i = 0; i < 16; i++) {
            uint32_t b = p[i / 4] >> (8 * (i % 4));
            v[i] = __uint_as_float(((b & 0x7f) << 20) | ((b & 0x80) << 24)) * k;
        }
        if (!fold) {
#pragma unroll
            for (int i = 0; i < 16; i++) v[i] *= s;
        }
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (__vcmpeq4(p[j] & 0x7f7f7f7fu, 0x7f7f7f7fu))
                for (int i = 0; i < 4; i++)
                    if (((p[j] >> (8 * i)) & 0x7f) == 0x7f) v[4 * j + i] = __uint_as_float(0x7fc00000u);
    } else {
        // E2M1 likewise: 3 magnitude bits under the float32 exponent, the
        // value times 2^-126.
        uint4 u = *(const uint4 *)(data + ((r * w.ld + c) >> 1));
        float s = e8m0f(scale[r * w.sld + (c >> 5)]);
        bool fold = s < 4.0f;
        float k = fold ? s * 0x1p126f : 0x1p126f;
        uint32_t p[4] = { u.x, u.y, u.z, u.w };
#pragma unroll
        for (int i = 0; i < 32; i++) {
            uint32_t b = p[i / 8] >> (4 * (i % 8));
            v[i] = __uint_as_float(((b & 7) << 22) | ((b & 8) << 28)) * k;
        }
        if (!fold) {
#pragma unroll
            for (int i = 0; i < 32; i++) v[i] *= s;
        }
    }
}

// Floats of x per token staged in shared memory at a time (32 KB).
template <int NT> struct xtile { static constexpr int n = 8192 / NT; };

// Where float4 q of a staged x row lives: a lane reads VEC/4 consecutive
// float4s for its chunk, so lanes 8 apart in q would hit the same banks;
// the xor spreads every 8 consecutive lanes over all banks.
__device__ __forceinline__ int xswz(int q) { return q ^ ((q >> 3) & 7); }

// SPLIT warps per output row n (each a slice of the chunks, summed in
// shared memory), NT tokens per block row (blockIdx.y).  With `experts`,
// NT is 1 and blockIdx.y is a slot with its own expert.  The tokens' x is
// staged in shared memory a tile at a time (coalesced, where each lane's
// own chunk of x straight from global memory would touch a cache line
// per lane).
template <int QT, int NT, int SPLIT>
__global__ void __launch_bounds__(256)
gemv_kernel(dqw w, const int *experts, const float *x, int ldx, int xdiv, int T, float *y,
            int ldy, int vec_ok)
{
    constexpr int VEC = vec_of<QT>::n, RPB = 8 / SPLIT, XT = xtile<NT>::n;
    __shared__ float part[8][NT];
    __shared__ float4 xs[NT][XT / 4];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, sub = warp % SPLIT;
    int n = blockIdx.x * RPB + warp / SPLIT;
    bool live = n < w.rows;
    int t0 = blockIdx.y * NT, nt = min(NT, T - t0);
    const uint8_t *data = w.data, *scale = w.scale;
    if (experts) {
        int e = experts[t0];
        data += e * w.estride;
        scale += e * w.sestride;
    }
    long long r = w.r0 + n;
    const float *xr[NT];
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) {
        xr[t] = x + (long long)((t0 + (t < nt ? t : 0)) / xdiv) * ldx;
        acc[t] = 0;
    }
    int nvec = vec_ok ? w.cols / VEC * VEC : 0;
    for (int k0 = 0; k0 < nvec; k0 += XT) {
        int kn4 = min(XT, nvec - k0) / 4;
        __syncthreads();
        for (int i = threadIdx.x; i < NT * kn4; i += blockDim.x) {
            int t = i / kn4, q = i % kn4;
            const float *xt = x + (long long)((t0 + (t < nt ? t : 0)) / xdiv) * ldx;
            xs[t][xswz(q)] = ((const float4 *)(xt + k0))[q];
        }
        __syncthreads();
        int nch = live ? kn4 * 4 / VEC : 0;
#pragma unroll 4
        for (int ch = lane + 32 * sub; ch < nch; ch += 32 * SPLIT) {
            float v[VEC];
            load_vec<QT>(w, data, scale, r, w.c0 + k0 + ch * VEC, v);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= nt) break;
                float a = 0;
#pragma unroll
                for (int i = 0; i < VEC / 4; i++) {
                    float4 xv = xs[t][xswz(ch * (VEC / 4) + i)];
                    a += v[4 * i] * xv.x + v[4 * i + 1] * xv.y + v[4 * i + 2] * xv.z +
                         v[4 * i + 3] * xv.w;
                }
                acc[t] += a;
            }
        }
    }
    int c1 = live ? w.cols : 0;
    for (int c = nvec + lane + 32 * sub; c < c1; c += 32 * SPLIT) {
        float v = qw_at<QT>(w, data, scale, r, w.c0 + c);
#pragma unroll
        for (int t = 0; t < NT; t++)
            if (t < nt) acc[t] += v * xr[t][c];
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float s = warp_sum(acc[t]);
        if (SPLIT == 1 && lane == 0 && live && t < nt) y[(long long)(t0 + t) * ldy + n] = s;
        if (SPLIT > 1 && lane == 0) part[warp][t] = s;
    }
    if (SPLIT > 1) {
        __syncthreads();
        if (sub == 0 && lane < nt && live) {
            float s = 0;
            for (int k = 0; k < SPLIT; k++) s += part[warp + k][lane];
            y[(long long)(t0 + lane) * ldy + n] = s;
        }
    }
}

#define TM CU_TILE_M
#define TN 64
#define TK 32

// 64 tokens x 64 output rows per block, 4x4 per thread.  Tokens are rows
// m0.. of x, or (tiles) the slots of one expert's tile through perm.
template <int QT>
__global__ void __launch_bounds__(256)
tiled_kernel(dqw w, const float *x, int ldx, int xdiv, int T, float *y, int ldy,
             const int4 *tiles, const int *ntiles, const int *perm)
{
    __shared__ __align__(16) float xs[TK][TM + 4];
    __shared__ __align__(16) float ws[TK][TN + 4];
    int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
    int n0 = blockIdx.y * TN, m0 = 0, mcount;
    const uint8_t *data = w.data, *scale = w.scale;
    const int *rows = NULL;
    if (tiles) {
        if ((int)blockIdx.x >= *ntiles) return;
        int4 tl = tiles[blockIdx.x];
        data += tl.x * w.estride;
        scale += tl.x * w.sestride;
        rows = perm + tl.y;
        mcount = tl.z;
    } else {
        m0 = blockIdx.x * TM;
        mcount = min(TM, T - m0);
    }
    float acc[4][4] = {};
    for (int k0 = 0; k0 < w.cols; k0 += TK) {
#pragma unroll
        for (int i = 0; i < TM * TK / 256; i++) {
            int idx = tid + i * 256, m = idx / TK, k = idx % TK;
            float v = 0;
            if (m < mcount && k0 + k < w.cols) {
                int tok = rows ? rows[m] : m0 + m;
                v = x[(long long)(tok / xdiv) * ldx + k0 + k];
            }
            xs[k][m] = v;
        }
#pragma unroll
        for (int i = 0; i < TN * TK / 256; i++) {
            int idx = tid + i * 256, n = idx / TK, k = idx % TK;
            float v = 0;
            if (n0 + n < w.rows && k0 + k < w.cols)
                v = qw_at<QT>(w, data, scale, w.r0 + n0 + n, w.c0 + k0 + k);
            ws[k][n] = v;
        }
        __syncthreads();
#pragma unroll 8
        for (int k = 0; k < TK; k++) {
            float4 a = *(const float4 *)&xs[k][ty * 4];
            float4 b = *(const float4 *)&ws[k][tx * 4];
            float av[4] = { a.x, a.y, a.z, a.w }, bv[4] = { b.x, b.y, b.z, b.w };
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] += av[i] * bv[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int m = ty * 4 + i;
        if (m >= mcount) continue;
        long long tok = rows ? rows[m] : m0 + m;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int n = n0 + tx * 4 + j;
            if (n < w.rows) y[tok * ldy + n] = acc[i][j];
        }
    }
}

#define QT_DISPATCH(t, ...)                                                                      \
    switch (t) {                                                                                 \
    case QT_F32: { constexpr int QT = QT_F32; __VA_ARGS__; } break;                              \
    case QT_BF16: { constexpr int QT = QT_BF16; __VA_ARGS__; } break;                            \
    case QT_FP8: { constexpr int QT = QT_FP8; __VA_ARGS__; } break;                              \
    default: { constexpr int QT = QT_MXFP4; __VA_ARGS__; } break;                                \
    }

static int vec_elems(int type)
{
    return type == QT_F32 ? 4 : type == QT_BF16 ? 8 : type == QT_FP8 ? 16 : 32;
}

// 16-byte loads need aligned weight columns and aligned x rows.
static int vec_ok(const dqw &w, const float *x, int ldx)
{
    return w.c0 % vec_elems(w.type) == 0 && (uintptr_t)x % 16 == 0 && ldx % 4 == 0;
}

// Few output rows (fewer than two blocks per SM at a warp per row): four
// warps per row, so long rows are read with more loads in flight.
template <int NT>
static void gemv(cudaStream_t st, const dqw &w, const int *experts, const float *x, int ldx,
                 int xdiv, int T, float *y, int ldy)
{
    int ok = vec_ok(w, x, ldx), ny = (T + NT - 1) / NT;
    if ((long long)(w.rows + 7) / 8 * ny < 264 && w.cols >= 512) {
        dim3 grid((w.rows + 1) / 2, ny);
        QT_DISPATCH(w.type, gemv_kernel<QT, NT, 4><<<grid, 256, 0, st>>>(w, experts, x, ldx, xdiv,
                                                                           T, y, ldy, ok));
    } else {
        dim3 grid((w.rows + 7) / 8, ny);
        QT_DISPATCH(w.type, gemv_kernel<QT, NT, 1><<<grid, 256, 0, st>>>(w, experts, x, ldx, xdiv,
                                                                           T, y, ldy, ok));
    }
}

void cu_matmul(cudaStream_t st, const dqw &w, const float *x, int ldx, int T, float *y, int ldy)
{
    if (w.rows <= 0 || T <= 0) return;
    if (T == 1) gemv<1>(st, w, NULL, x, ldx, 1, T, y, ldy);
    else if (T == 2) gemv<2>(st, w, NULL, x, ldx, 1, T, y, ldy);
    else if (T <= 4) gemv<4>(st, w, NULL, x, ldx, 1, T, y, ldy);
    else if (T <= 8) gemv<8>(st, w, NULL, x, ldx, 1, T, y, ldy);
    else {
        dim3 grid((T + TM - 1) / TM, (w.rows + TN - 1) / TN);
        QT_DISPATCH(w.type, tiled_kernel<QT><<<grid, 256, 0, st>>>(w, x, ldx, 1, T, y, ldy, NULL,
                                                                   NULL, NULL));
    }
}

void cu_matmul_slots(cudaStream_t st, const dqw &w, const int *experts, const float *x, int ldx,
                     int xdiv, int nslots, float *y, int ldy)
{
    if (w.rows <= 0 || nslots <= 0) return;
    gemv<1>(st, w, experts, x, ldx, xdiv, nslots, y, ldy);
}

void cu_matmul_tiles(cudaStream_t st, const dqw &w, const int4 *tiles, const int *ntiles,
                     int max_tiles, const int *perm, const float *x, int ldx, int xdiv, float *y,
                     int ldy)
{
    if (w.rows <= 0 || max_tiles <= 0) return;
    dim3 grid(max_tiles, (w.rows + TN - 1) / TN);
    QT_DISPATCH(w.type, tiled_kernel<QT><<<grid, 256, 0, st>>>(w, x, ldx, xdiv, 0, y, ldy, tiles,
                                                               ntiles, perm));
}

// Operands of the prefill GEMMs (cuBLASLt, backend_cuda.cu): weights
// dequantized to bf16 or float32, activations rounded to bf16.

// float32 to bf16, round to nearest even (NaN stays NaN).
__device__ __forceinline__ uint16_t bf16_rn(float v)
{
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

template <typename O> __device__ __forceinline__ O out_of(float v);
template <> __device__ __forceinline__ float out_of<float>(float v) { return v; }
template <> __device__ __forceinline__ uint16_t out_of<uint16_t>(float v) { return bf16_rn(v); }

// Eight consecutive outputs per thread (16 bytes of bf16): row r, columns
// [c, c + 8) of expert blockIdx.y, zeros past the view's columns.
template <int QT, typename O>
__global__ void dequant_kernel(dqw w, O *out, long long ldo)
{
    long long per = (long long)w.rows * ldo;
    long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i >= per) return;
    long long r = i / ldo, c = i % ldo;
    const uint8_t *data = w.data + blockIdx.y * w.estride;
    const uint8_t *scale = w.scale + blockIdx.y * w.sestride;
    __align__(16) O v[8];
    long long rr = w.r0 + r, cc = w.c0 + c;
    if (cc % 8 == 0 && c + 8 <= w.cols && QT != QT_F32) {
        // Eight codes in one load, one scale (copy rows are padded to 16
        // bytes, so the load is aligned).
        if (QT == QT_BF16) {
            uint4 u = *(const uint4 *)((const uint16_t *)data + rr * w.ld + cc);
            const uint16_t *h = (const uint16_t *)&u;
#pragma unroll
            for (int j = 0; j < 8; j++) v[j] = out_of<O>(bf16f(h[j]));
        } else if (QT == QT_FP8) {
            uint2 u = *(const uint2 *)(data + rr * w.ld + cc);
            float s = e8m0f(scale[(rr >> 7) * w.sld + (cc >> 7)]);
            const uint8_t *b = (const uint8_t *)&u;
#pragma unroll
            for (int j = 0; j < 8; j++) v[j] = out_of<O>(fp8f(b[j]) * s);
        } else {
            uint32_t u = *(const uint32_t *)(data + ((rr * w.ld + cc) >> 1));
            float s = e8m0f(scale[rr * w.sld + (cc >> 5)]);
#pragma unroll
            for (int j = 0; j < 8; j++) v[j] = out_of<O>(fp4f(u >> (4 * j)) * s);
        }
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++)
            v[j] = out_of<O>(c + j < w.cols ? qw_at<QT>(w, data, scale, rr, cc + j) : 0.0f);
    }
    O *o = out + blockIdx.y * per + i;
    if (sizeof(O) == 2) {
        *(uint4 *)o = *(const uint4 *)v;
    } else {
        ((float4 *)o)[0] = ((const float4 *)v)[0];
        ((float4 *)o)[1] = ((const float4 *)v)[1];
    }
}

void cu_dequant(cudaStream_t st, const dqw &w, int nexp, bool bf16, void *out, long long ldo)
{
    long long n = (long long)w.rows * ldo / 8;
    if (n <= 0 || nexp <= 0) return;
    dim3 grid((unsigned)((n + 255) / 256), nexp);
    if (bf16) {
        QT_DISPATCH(w.type, dequant_kernel<QT, uint16_t><<<grid, 256, 0, st>>>(w, (uint16_t *)out,
                                                                                ldo));
    } else {
        QT_DISPATCH(w.type, dequant_kernel<QT, float><<<grid, 256, 0, st>>>(w, (float *)out, ldo));
    }
}

__global__ void round_bf16_kernel(const float *x, int ldx, const int *rows, int div, long long T,
                                  int K, uint16_t *out, int ldo, int lo)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= T * K) return;
    long long t = i / K, k = i % K, src = rows ? rows[t] / div : t;
    float v = x[src * ldx + k];
    uint16_t h = bf16_rn(v);
    out[t * ldo + k] = h;
    if (lo) out[t * ldo + lo + k] = bf16_rn(v - bf16f(h));     // v - h is exact
}

void cu_round_bf16(cudaStream_t st, const float *x, int ldx, const int *rows, int div, int T,
                   int K, uint16_t *out, int ldo, int lo)
{
    long long n = (long long)T * K;
    if (n <= 0) return;
    round_bf16_kernel<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(x, ldx, rows, div, T, K, out,
                                                                    ldo, lo);
}
