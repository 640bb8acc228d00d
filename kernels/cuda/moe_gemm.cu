// The routed experts' GEMMs of prefill steps on tensor cores, all experts
// of one matrix in one launch (no host wait for the per-expert counts).
// A block takes one tile of moe_sort's table (up to CU_TILE_M slots of
// one expert) and MG_N rows of the expert's weight: [64 slots x MG_N]
// through mma.sync m16n8k16 (bf16 in, float32 accumulation).  The
// weights are read in their stored MXFP4 form and dequantized into
// shared memory as bf16 (exact: E2M1 values times a power of two); the
// activations are read as float32 and rounded there to bf16, or split in
// two bf16 parts (hi = bf16(x), lo = bf16(x - hi)) whose two products
// share the weight fragments.  The K loop is double-buffered: the next
// stage's codes and activations load into registers while the tensor
// cores work on the current one.  w1 and w3 share a block (MG_N / 2 rows
// of each) so SwiGLU happens in registers; w2 writes each slot's row back
// in slot order (scatter through perm).

#include "kernels.cuh"
#include "mma.cuh"

#define MG_M CU_TILE_M      // slots per block
#define MG_N 128            // weight rows per block (fused: 64 of w1, 64 of w3)
#define MG_K 64             // k per stage
#define MG_THREADS 128      // 4 warps: 2 (slots) x 2 (weight rows), 32 x 64 each

// Shared tiles are [rows][MG_K] bf16, 8 chunks of 16 bytes per row,
// chunk c of row r stored at chunk sw(r, c): lanes (g, t) of a fragment
// load read rows g, chunks t (or t + 4) and land in distinct banks, and
// a warp storing one chunk of 8 consecutive rows does too.
__device__ __forceinline__ int mg_sw(int r, int c) { return c ^ ((r & 1) << 2) ^ ((r >> 1) & 3); }

__device__ __forceinline__ uint4 *mg_chunk(uint16_t *tile, int r, int c)
{
    return (uint4 *)(tile + r * MG_K) + mg_sw(r, c);
}

// A stage's global data, held in registers until it is stored: per thread
// 4 runs of 8 activations (slot rows unit / 8, k (unit % 8) * 8) and one
// weight row's 64 codes (two 16-byte loads) with their 2 scales.
struct mg_regs {
    float x[4][8];
    uint4 codes[2];
    uint32_t scale[2];
};

template <bool SPLIT, bool SWIGLU>
__global__ void __launch_bounds__(MG_THREADS, 2) moe_gemm_kernel(dmoe_gemm a)
{
    pdl_wait();
    // All of it dynamic (two stages, then the slots' x rows and the E2M1
    // values), so the launcher's size is the whole: at 48 KB and above it
    // must be allowed explicitly.
    extern __shared__ __align__(16) uint16_t mg_sh[];
    const int stage = (SPLIT ? 2 * MG_M : MG_M) * MG_K + MG_N * MG_K;    // bf16 per stage
    int *xrow = (int *)(mg_sh + 2 * stage);
    float *lut = (float *)(xrow + MG_M);
    if ((int)blockIdx.y >= *a.ntiles) return;
    int4 tl = a.tiles[blockIdx.y];
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    int wm = warp >> 1, wn = warp & 1;
    int cols = a.w1.cols, nout = SWIGLU ? MG_N / 2 : MG_N, n0 = blockIdx.x * nout;

    // This thread's weight row of the tile: B row tid.
    const dqw &W = SWIGLU && tid >= MG_N / 2 ? a.w3 : a.w1;
    int wr = n0 + (SWIGLU ? tid % (MG_N / 2) : tid);
    bool wok = wr < W.rows;
    const uint8_t *wdata = W.data + tl.x * W.estride, *wscale = W.scale + tl.x * W.sestride;
    const uint8_t *wrow = wdata + ((long long)(W.r0 + wr) * W.ld + W.c0) / 2;
    const uint8_t *srow = wscale + (long long)(W.r0 + wr) * W.sld + W.c0 / 32;

    if (tid < MG_M) {
        int s = tl.y + tid;
        xrow[tid] = tid >= tl.z ? -1 : a.xdiv ? a.perm[s] / a.xdiv : s;
    }
    if (tid < 16) lut[tid] = fp4f(tid);
    __syncthreads();

    auto load = [&](mg_regs &R, int k0) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int unit = tid + MG_THREADS * i, r = unit >> 3, k = k0 + (unit & 7) * 8;
            int row = xrow[r];
            const float *p = a.x + (long long)row * a.ldx + k;
            if (row >= 0 && a.xvec && k + 8 <= cols) {
                float4 u = ((const float4 *)p)[0], v = ((const float4 *)p)[1];
                R.x[i][0] = u.x, R.x[i][1] = u.y, R.x[i][2] = u.z, R.x[i][3] = u.w;
                R.x[i][4] = v.x, R.x[i][5] = v.y, R.x[i][6] = v.z, R.x[i][7] = v.w;
            } else {
#pragma unroll
                for (int e = 0; e < 8; e++) R.x[i][e] = row >= 0 && k + e < cols ? p[e] : 0.0f;
            }
        }
        if (wok && a.wvec && k0 + MG_K <= cols) {
            R.codes[0] = ((const uint4 *)(wrow + k0 / 2))[0];
            R.codes[1] = ((const uint4 *)(wrow + k0 / 2))[1];
            R.scale[0] = srow[k0 / 32];
            R.scale[1] = srow[k0 / 32 + 1];
        }
    };

    auto store = [&](const mg_regs &R, int buf, int k0) {
        uint16_t *xs = mg_sh + buf * stage, *ws = xs + (SPLIT ? 2 : 1) * MG_M * MG_K;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int unit = tid + MG_THREADS * i, r = unit >> 3, c = unit & 7;
            uint32_t hi[4], lo[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float v0 = R.x[i][2 * e], v1 = R.x[i][2 * e + 1];
                hi[e] = pack_bf16x2(v0, v1);
                // v - hi is exact in float32
                lo[e] = pack_bf16x2(v0 - bf16f(hi[e] & 0xffff), v1 - bf16f(hi[e] >> 16));
            }
            *mg_chunk(xs, r, c) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
            if (SPLIT) *mg_chunk(xs + MG_M * MG_K, r, c) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
        }
        if (wok && a.wvec && k0 + MG_K <= cols) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float s = e8m0f(R.scale[h]);
                const uint32_t *cw = (const uint32_t *)&R.codes[h];
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    uint32_t u = cw[q], o[4];
#pragma unroll
                    for (int b = 0; b < 4; b++) {
                        uint32_t l = __float_as_uint(lut[(u >> (8 * b)) & 15] * s);
                        uint32_t m = __float_as_uint(lut[(u >> (8 * b + 4)) & 15] * s);
                        o[b] = __byte_perm(l, m, 0x7632);   // exact: the upper halves
                    }
                    *mg_chunk(ws, tid, 4 * h + q) = make_uint4(o[0], o[1], o[2], o[3]);
                }
            }
        } else {    // tails, unaligned views, rows past the weight: element by element
            for (int c = 0; c < 8; c++) {
                uint32_t o[4];
                for (int b = 0; b < 4; b++) {
                    int k = k0 + 8 * c + 2 * b;
                    float l = 0, m = 0;
                    if (wok && k < cols) l = qw_at<QT_MXFP4>(W, wdata, wscale, W.r0 + wr, W.c0 + k);
                    if (wok && k + 1 < cols)
                        m = qw_at<QT_MXFP4>(W, wdata, wscale, W.r0 + wr, W.c0 + k + 1);
                    o[b] = __byte_perm(__float_as_uint(l), __float_as_uint(m), 0x7632);
                }
                *mg_chunk(ws, tid, c) = make_uint4(o[0], o[1], o[2], o[3]);
            }
        }
    };

    // Warp (wm, wn): slots 32 wm.. (2 m-tiles); 8 n-tiles of weight rows:
    // fused, w1 rows 32 wn + 8 j and the same w3 rows (64 + ...), so a
    // lane holds the gate and up values of the same outputs.
    float acc[2][8][4] = {};
    mg_regs R;
    int nk = (cols + MG_K - 1) / MG_K;
    if (nk > 0) {
        load(R, 0);
        store(R, 0, 0);
    }
    __syncthreads();
    for (int kt = 0; kt < nk; kt++) {
        bool next = kt + 1 < nk;
        if (next) load(R, (kt + 1) * MG_K);
        const uint16_t *xs = mg_sh + (kt & 1) * stage, *ws = xs + (SPLIT ? 2 : 1) * MG_M * MG_K;
#pragma unroll
        for (int jj = 0; jj < 2; jj++) {
            uint4 bf[8];
#pragma unroll
            for (int j = 0; j < 8; j++) {
                int br = (SWIGLU ? (j < 4 ? 32 * wn + 8 * j : 64 + 32 * wn + 8 * (j - 4))
                                 : 64 * wn + 8 * j) + g;
                bf[j] = *mg_chunk((uint16_t *)ws, br, 4 * jj + t);
            }
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                int r = 32 * wm + 16 * mt + g;
#pragma unroll
                for (int part = 0; part < (SPLIT ? 2 : 1); part++) {
                    uint16_t *xp = (uint16_t *)xs + part * MG_M * MG_K;
                    uint4 lo = *mg_chunk(xp, r, 4 * jj + t), hi = *mg_chunk(xp, r + 8, 4 * jj + t);
#pragma unroll
                    for (int j = 0; j < 8; j++) {
                        mma_bf16_16816(acc[mt][j], lo.x, hi.x, lo.y, hi.y, bf[j].x, bf[j].y);
                        mma_bf16_16816(acc[mt][j], lo.z, hi.z, lo.w, hi.w, bf[j].z, bf[j].w);
                    }
                }
            }
        }
        if (next) store(R, (kt + 1) & 1, (kt + 1) * MG_K);
        __syncthreads();
    }

    int nrows = a.w1.rows;
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int m = 32 * wm + 16 * mt + 8 * h + g;
            if (m >= tl.z) continue;
            int s = tl.y + m;
            float *y = a.y + (long long)(a.scatter ? a.perm[s] : s) * a.ldy;
#pragma unroll
            for (int j = 0; j < (SWIGLU ? 4 : 8); j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int n = n0 + (SWIGLU ? 32 * wn : 64 * wn) + 8 * j + 2 * t + e;
                    if (n >= nrows) continue;
                    float v = acc[mt][j][2 * h + e];
                    y[n] = SWIGLU ? swiglu1(v, acc[mt][j + 4][2 * h + e], a.limit) : v;
                }
        }
}

bool cu_moe_gemm(cudaStream_t st, const dmoe_gemm &a, int max_tiles, bool split)
{
    bool swiglu = a.swiglu;
    if (a.w1.type != QT_MXFP4 || (swiglu && (a.w3.type != QT_MXFP4 || a.w3.rows != a.w1.rows ||
                                             a.w3.cols != a.w1.cols)) ||
        max_tiles > 65535)
        return false;
    int nout = swiglu ? MG_N / 2 : MG_N;
    if (a.w1.rows <= 0 || max_tiles <= 0) return true;
    dmoe_gemm b = a;
    b.xvec = a.ldx % 4 == 0 && (uintptr_t)a.x % 16 == 0;
    b.wvec = a.w1.c0 % 32 == 0 && a.w1.ld % 32 == 0 && (uintptr_t)a.w1.data % 16 == 0 &&
             a.w1.estride % 16 == 0 &&
             (!swiglu || (a.w3.c0 % 32 == 0 && a.w3.ld % 32 == 0 &&
                          (uintptr_t)a.w3.data % 16 == 0 && a.w3.estride % 16 == 0));
    dim3 grid((a.w1.rows + nout - 1) / nout, max_tiles);
    size_t smem = 2 * (size_t)((split ? 2 * MG_M : MG_M) * MG_K + MG_N * MG_K) * 2 +
                  MG_M * sizeof(int) + 16 * sizeof(float);
#define MG_LAUNCH(S, W)                                                                          \
    do {                                                                                         \
        smem_attr<S * 2 + W>(moe_gemm_kernel<S, W>, smem);                                       \
        cu_launch(moe_gemm_kernel<S, W>, grid, MG_THREADS, smem, st, b);                     \
    } while (0)
    if (split && swiglu) MG_LAUNCH(true, true);
    else if (split) MG_LAUNCH(true, false);
    else if (swiglu) MG_LAUNCH(false, true);
    else MG_LAUNCH(false, false);
#undef MG_LAUNCH
    return true;
}
