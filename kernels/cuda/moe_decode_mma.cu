// The fused decode MoE's up and down kernels (cu_moe_decode, T <= 8) on
// tensor cores: the same grids of one slot (up) or one token (down) a
// block as matmul.cu's moe_up_kernel / moe_down_kernel, every product an
// mma.sync m16n8k16 instead of float32 FMAs.  Those kernels spend ~6.8
// instructions a weight on an E2M1 code (decode to f16, convert to
// float32, FMA; run M1's ncu at T = 1) and are issue-bound well below the
// bandwidth; here a weight costs its exact bf16 decode (matmul_mma.cu's
// fp4x8_bf16x2) and an eighth of an mma.
//
// Fragments (matmul_mma.cu's scheme): a warp owns 16 weight rows (up: 8
// rows of w1 and the same 8 of w3; down: 16 rows of w2 and of the shared
// s2) and a slice of the columns; in each chunk of columns lane (g, q)
// loads 16 bytes of its rows g and g + 8 at the lane's slice (MXFP4 32
// columns, one scale block; FP8 16), which are its A fragments for the
// chunk's k steps.  x is B: column 0 its bf16 hi part, column 1 its lo
// part (hi = bf16(x), lo = bf16(x - hi): within 2^-16 of x, the expert
// tiles' split), columns 2-7 zero, so lane (g, 0) ends with row g's two
// partial sums in c0, c1 and row g + 8's in c2, c3.
//
// Staged x (per block, its columns as units): MXFP4 units of 8 columns,
// hi as the bf16 pairs (c0,c4) (c1,c5) (c2,c6) (c3,c7) (fp4x8_bf16x2's
// order) then lo; FP8 units of 4 columns, (c0,c1) (c2,c3), hi then lo.  A
// chunk is 16 units, 4 a lane; lane q's unit j is stored at (j + q) mod 4
// of its four, so the 8 lanes that read hi and lo of their unit j hit 8
// distinct bank groups.
#include "moe_decode.cuh"
#include "smm.cuh"

template <int QT> struct mdm_fmt;
// UC columns a unit (4 UC bytes staged), SC a lane's slice, CH a chunk
template <> struct mdm_fmt<QT_MXFP4> { static constexpr int UC = 8, SC = 32, CH = 128; };
template <> struct mdm_fmt<QT_FP8> { static constexpr int UC = 4, SC = 16, CH = 64; };

#define MDM_D 4     // chunks in flight per warp (2 x 16 bytes a lane each)

struct mdm_args {
    int T, K, S;                // S: warps a row group (its column slices)
    dqw w1, w3, w2, s1, s3, s2;
    const float *x;
    int x_ld;
    const int *idx;             // [T][K] experts (route_kernel)
    const float *wt;            // [T][K] their weights
    float *g, *sg, *out;        // [T*K][w1.rows], [T][s1.rows], [T][w2.rows]
    float limit;
};

// Byte offset of unit u in staged x.
template <int QT> __device__ __forceinline__ int unit_at(int u)
{
    return ((u & ~3) | ((u + (u >> 2)) & 3)) * 4 * mdm_fmt<QT>::UC;
}

// Unit u of staged x from its UC floats r times f.
template <int QT>
__device__ __forceinline__ void put_unit(uint8_t *xs, int u, const float4 *r, float f)
{
    constexpr int UC = mdm_fmt<QT>::UC, FP4 = QT == QT_MXFP4;
    float v[UC];
#pragma unroll
    for (int i = 0; i < UC / 4; i++) {
        float4 a = r[i];
        v[4 * i] = f * a.x, v[4 * i + 1] = f * a.y, v[4 * i + 2] = f * a.z, v[4 * i + 3] = f * a.w;
    }
    uint32_t hi[UC / 2], lo[UC / 2];
#pragma unroll
    for (int e = 0; e < UC / 2; e++) {
        float f0 = FP4 ? v[e] : v[2 * e], f1 = FP4 ? v[e + 4] : v[2 * e + 1];
        hi[e] = pack_bf16x2(f0, f1);
        // f - hi is exact in float32
        lo[e] = pack_bf16x2(f0 - bf16f(hi[e] & 0xffff), f1 - bf16f(hi[e] >> 16));
    }
    uint8_t *d = xs + unit_at<QT>(u);
    if (FP4) {
        ((uint4 *)d)[0] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
        ((uint4 *)d)[1] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    } else {
        ((uint2 *)d)[0] = make_uint2(hi[0], hi[1]);
        ((uint2 *)d)[1] = make_uint2(lo[0], lo[1]);
    }
}

// Units 0..n-1 of staged x by the block's threads: staged unit dst(u)
// from the UC floats at src(u) (16-byte aligned) times f(u), U units a
// thread a round with every load of the round in flight before any is
// converted (one round trip a round: run N3 found the up kernel's staging
// at 17% of its samples with a load at a time).
template <int QT, int U, class Src, class Mul, class Dst>
__device__ __forceinline__ void stage_units(uint8_t *xs, int n, Src src, Mul f, Dst dst)
{
    constexpr int Q = mdm_fmt<QT>::UC / 4;
    for (int u0 = threadIdx.x; u0 < n; u0 += U * blockDim.x) {
        float4 r[U][Q];
#pragma unroll
        for (int k = 0; k < U; k++) {
            int u = u0 + k * blockDim.x;
            if (u < n)
#pragma unroll
                for (int i = 0; i < Q; i++) r[k][i] = ((const float4 *)src(u))[i];
        }
#pragma unroll
        for (int k = 0; k < U; k++) {
            int u = u0 + k * blockDim.x;
            if (u < n) put_unit<QT>(xs, dst(u), r[k], f(u));
        }
    }
}

// x's row (cols columns) staged in QT's units by the block's threads.
template <int QT>
__device__ __forceinline__ void stage_x(uint8_t *xs, const float *x, int cols)
{
    stage_units<QT, 2>(xs, cols / mdm_fmt<QT>::UC,
                       [&](int u) { return x + u * mdm_fmt<QT>::UC; }, [](int) { return 1.0f; },
                       [](int u) { return u; });
}

// One chunk's copies of a lane: 16 bytes of its rows g and g + 8 (zeros
// past the columns) and their scale bytes.
struct mdm_copy {
    uint4 a, b;
    uint32_t sa, sb;
};

// A lane's two rows at its slice of chunk 0 (row a of data da / scales
// qa, row b of db / qb, the layout w): copy pointers, scale rows, the
// slice's first copy column.  Chunk ch's copies are 64 bytes a chunk
// further (MXFP4 128 columns, FP8 64).
struct mdm_rows {
    const uint8_t *a, *b, *sa, *sb;
    int k0;
};

template <int QT>
__device__ __forceinline__ mdm_rows mdm_rows_at(const dqw &w, const uint8_t *da, const uint8_t *qa,
                                                long long ra, const uint8_t *db,
                                                const uint8_t *qb, long long rb)
{
    int k0 = w.c0 + (threadIdx.x & 3) * mdm_fmt<QT>::SC;
    if (QT == QT_MXFP4)
        return { da + ((ra * w.ld + k0) >> 1), db + ((rb * w.ld + k0) >> 1),
                 qa + ra * w.sld + (k0 >> 5), qb + rb * w.sld + (k0 >> 5), k0 };
    return { da + ra * w.ld + k0, db + rb * w.ld + k0, qa + (ra >> 7) * w.sld,
             qb + (rb >> 7) * w.sld, k0 };
}

// Chunk ch's copies of the lane's rows; zeros where the slice is past
// the view's columns (live false).
template <int QT>
__device__ __forceinline__ void mdm_load(mdm_copy &c, const mdm_rows &r, int ch, bool live)
{
    c.a = c.b = make_uint4(0, 0, 0, 0);
    c.sa = c.sb = 127;
    if (!live) return;
    c.a = ld_weights(r.a + ch * 64);
    c.b = ld_weights(r.b + ch * 64);
    int si = QT == QT_MXFP4 ? ch * 4 : (r.k0 + ch * 64) >> 7;
    c.sa = r.sa[si];
    c.sb = r.sb[si];
}

// acc += the chunk's products: copies c times staged x's chunk at xc
// (unit_at of its first unit); live: the lane's slice inside the columns.
template <int QT>
__device__ __forceinline__ void mdm_mma(float (&acc)[4], const mdm_copy &c, const uint8_t *xc,
                                        bool live)
{
    int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    bool bx = live && g < 2;    // lanes of B's columns 0 (hi) and 1 (lo)
    const uint8_t *xq = xc + q * 16 * mdm_fmt<QT>::UC;
    if (QT == QT_MXFP4) {
        // the multiplier of a scale up to 128 is one bf16 pair; a chunk
        // of the warp with a larger one (rare) takes fp4_mults' two
        uint32_t ma = ((c.sa + 126) << 7) * 0x10001u, mb = ((c.sb + 126) << 7) * 0x10001u;
        uint32_t ma2 = 0, mb2 = 0;
        bool big = __any_sync(0xffffffffu, c.sa > 128 || c.sb > 128);
        if (big) fp4_mults(c.sa, ma, ma2), fp4_mults(c.sb, mb, mb2);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            uint32_t p[4], r[4];
            fp4x8_bf16x2(word(c.a, j), ma, p);
            fp4x8_bf16x2(word(c.b, j), mb, r);
            if (big)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    p[i] = mul_bf16x2(p[i], ma2), r[i] = mul_bf16x2(r[i], mb2);
            uint4 xv = make_uint4(0, 0, 0, 0);
            if (bx) xv = *(const uint4 *)(xq + ((j + q) & 3) * 32 + g * 16);
            mma_bf16_16816(acc, p[0], r[0], p[1], r[1], xv.x, xv.y);
            mma_bf16_16816(acc, p[2], r[2], p[3], r[3], xv.z, xv.w);
        }
    } else {
        float fa = e8m0f(c.sa), fb = e8m0f(c.sb);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            uint32_t wa = word(c.a, j), wb = word(c.b, j);
            uint2 xv = make_uint2(0, 0);
            if (bx) xv = *(const uint2 *)(xq + ((j + q) & 3) * 16 + g * 8);
            mma_bf16_16816(acc, fp8x2_bf16x2(wa, fa), fp8x2_bf16x2(wb, fb),
                           fp8x2_bf16x2(wa >> 16, fa), fp8x2_bf16x2(wb >> 16, fb), xv.x, xv.y);
        }
    }
}

// Up, one slot a block (blockIdx.y: the T shared-expert slots of FP8,
// then the T * K routed slots of MXFP4 experts; the shared ones first, so
// that the first wave's blocks whose weights depend on nothing earlier
// load them while route_kernel runs): this warp's 8 rows of w1 and w3
// from n0 over its chunks, x staged, SwiGLU into g or sg.
template <int QT>
__device__ __forceinline__ void mdm_up(const mdm_args &a, uint8_t *xs, float (*part)[16])
{
    using F = mdm_fmt<QT>;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    int S = a.S, sub = warp % S, n0 = (blockIdx.x * (8 / S) + warp / S) * 8;
    bool sh = QT == QT_FP8;
    int slot = blockIdx.y - (sh ? 0 : a.T), tok = sh ? slot : slot / a.K;
    const dqw &w = sh ? a.s1 : a.w1, &w3 = sh ? a.s3 : a.w3;
    long long e = 0;
    if (!sh) {
        pdl_wait();     // the slot's expert from route_kernel
        e = a.idx[slot];
    }
    long long r = w.r0 + min(n0 + g, w.rows - 1);
    mdm_rows rw = mdm_rows_at<QT>(w, w.data + e * w.estride, w.scale + e * w.sestride, r,
                                  w3.data + e * w3.estride, w3.scale + e * w3.sestride, r);
    int nch = (w.cols + F::CH - 1) / F::CH, per = (nch + S - 1) / S;
    int cb = sub * per, ce = min(nch, cb + per), qc = q * F::SC;
    mdm_copy cp[MDM_D];
#pragma unroll
    for (int d = 0; d < MDM_D; d++)
        if (cb + d < ce) mdm_load<QT>(cp[d], rw, cb + d, (cb + d) * F::CH + qc < w.cols);
    if (sh) pdl_wait();     // the shared expert's weights were on their way first
    stage_x<QT>(xs, a.x + (long long)tok * a.x_ld, w.cols);
    __syncthreads();
    float acc[4] = { 0, 0, 0, 0 };
    for (int c = cb; c < ce; c += MDM_D) {
#pragma unroll
        for (int d = 0; d < MDM_D; d++) {
            if (c + d >= ce) break;
            mdm_mma<QT>(acc, cp[d], xs + unit_at<QT>((c + d) * 16),
                        (c + d) * F::CH + qc < w.cols);
            int nx = c + d + MDM_D;
            if (nx < ce) mdm_load<QT>(cp[d], rw, nx, nx * F::CH + qc < w.cols);
        }
    }
    if (q == 0) part[warp][g] = acc[0] + acc[1], part[warp][8 + g] = acc[2] + acc[3];
    __syncthreads();
    if (sub || lane >= 8 || n0 + lane >= w.rows) return;
    float v = 0, u = 0;
    for (int k = 0; k < S; k++) v += part[warp + k][lane], u += part[warp + k][8 + lane];
    float *y = sh ? a.sg + (long long)tok * a.s1.rows : a.g + (long long)slot * a.w1.rows;
    y[n0 + lane] = swiglu1(v, u, a.limit);
}

__global__ void __launch_bounds__(256, 2) moe_up_mma_kernel(const __grid_constant__ mdm_args a)
{
    extern __shared__ __align__(16) uint8_t mdm_sh[];
    __shared__ float part[8][16];
    bool sh = (int)blockIdx.y < a.T;
    const dqw &w = sh ? a.s1 : a.w1;
    if ((int)blockIdx.x * (8 / a.S) * 8 >= w.rows) return;     // the other matrix is taller
    if (sh) mdm_up<QT_FP8>(a, mdm_sh, part);
    else mdm_up<QT_MXFP4>(a, mdm_sh, part);
}

// Down, one token a block (blockIdx.y): this warp's 16 rows from n0 of
// the shared expert's s2 over sg (FP8 chunks, first: their weights load
// before the wait) and of the K chosen experts' w2 over their g rows
// times their weights (MXFP4 chunks, cpe an expert, the last one's slices
// past I empty: each chunk one expert's columns); out = the routed sum
// plus the shared one, as moe_down_kernel.
__global__ void __launch_bounds__(256, 2) moe_down_mma_kernel(const __grid_constant__ mdm_args a)
{
    extern __shared__ __align__(16) uint8_t mdm_sh[];
    __shared__ float part[2][8][16];
    __shared__ long long eo[2][16];
    __shared__ float ew[16];
    using FR = mdm_fmt<QT_MXFP4>;
    using FS = mdm_fmt<QT_FP8>;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    int S = a.S, sub = warp % S, n0 = (blockIdx.x * (8 / S) + warp / S) * 16, t = blockIdx.y;
    const dqw &w = a.w2, &sw = a.s2;
    int H = w.rows, I = w.cols, Is = sw.cols, K = a.K;
    int cpe = (I + FR::CH - 1) / FR::CH, nr = K * cpe, nsc = (Is + FS::CH - 1) / FS::CH;
    int rper = (nr + S - 1) / S, sper = (nsc + S - 1) / S;
    int r0 = sub * rper, r1 = min(nr, r0 + rper), s0 = sub * sper, s1 = min(nsc, s0 + sper);
    int nsw = max(0, s1 - s0), n = nsw + max(0, r1 - r0);    // this warp's chunks
    mdm_copy cp[MDM_D];
    uint8_t *xr = mdm_sh, *xsh = mdm_sh + (size_t)nr * 16 * 4 * FR::UC;
    long long ra = min(n0 + g, H - 1), rb = min(n0 + g + 8, H - 1);
    mdm_rows srw = mdm_rows_at<QT_FP8>(sw, sw.data, sw.scale, sw.r0 + ra, sw.data, sw.scale,
                                       sw.r0 + rb);
    ra += w.r0, rb += w.r0;
    // chunk i of the warp's sequence: shared s0 + i, then routed r0 + i - nsw
    // (expert lk, its chunk lc, its rows rw: followed as the loads go, in order)
    int lk = r0 / cpe, lc = r0 - lk * cpe;
    mdm_rows rw = {};
    auto load = [&](int d, int i) {
        if (i < nsw) {
            int c = s0 + i;
            mdm_load<QT_FP8>(cp[d], srw, c, c * FS::CH + q * FS::SC < Is);
        } else {
            if (lc == 0 || i == nsw) {
                const uint8_t *p = w.data + eo[0][lk], *s = w.scale + eo[1][lk];
                rw = mdm_rows_at<QT_MXFP4>(w, p, s, ra, p, s, rb);
            }
            mdm_load<QT_MXFP4>(cp[d], rw, lc, lc * FR::CH + q * FR::SC < I);
            if (++lc == cpe) lc = 0, lk++;
        }
    };
    // The token's experts and weights, from route_kernel (or the mHC
    // clusters) two kernels back: finished before this kernel starts (the
    // up kernel lets it start after its own wait), read past L1; so every
    // first chunk's weights load before the wait too.
    if (threadIdx.x < K) {
        long long e = __ldcg(a.idx + (long long)t * K + threadIdx.x);
        eo[0][threadIdx.x] = e * w.estride;
        eo[1][threadIdx.x] = e * w.sestride;
        ew[threadIdx.x] = __ldcg(a.wt + (long long)t * K + threadIdx.x);
    }
    __syncthreads();
#pragma unroll
    for (int d = 0; d < MDM_D; d++)
        if (d < n) load(d, d);
    pdl_wait();     // g and sg from the up kernel
    // staged: the K rows of g (unit u: expert k = u / (I / UC), its
    // columns i..) times their weights, then sg
    const int upk = I / FR::UC;
    auto g_at = [&](int u) { return a.g + ((long long)t * K + u / upk) * I + u % upk * FR::UC; };
    auto g_unit = [&](int u) {
        int k = u / upk, i = u % upk * FR::UC;
        return (k * cpe + i / FR::CH) * 16 + (i % FR::CH) / FR::UC;
    };
    stage_units<QT_MXFP4, 3>(xr, K * upk, g_at, [&](int u) { return ew[u / upk]; }, g_unit);
    stage_units<QT_FP8, 2>(xsh, Is / FS::UC,
                           [&](int u) { return a.sg + (long long)t * Is + u * FS::UC; },
                           [](int) { return 1.0f; }, [](int u) { return u; });
    __syncthreads();
    float acc[4] = { 0, 0, 0, 0 }, sacc[4] = { 0, 0, 0, 0 };
    int ck = r0 / cpe, cc = r0 - ck * cpe;   // the routed chunk computed next
    for (int i0 = 0; i0 < n; i0 += MDM_D) {
#pragma unroll
        for (int d = 0; d < MDM_D; d++) {
            int i = i0 + d;
            if (i >= n) break;
            if (i < nsw) {
                int c = s0 + i;
                mdm_mma<QT_FP8>(sacc, cp[d], xsh + unit_at<QT_FP8>(c * 16),
                                c * FS::CH + q * FS::SC < Is);
            } else {
                mdm_mma<QT_MXFP4>(acc, cp[d], xr + unit_at<QT_MXFP4>((ck * cpe + cc) * 16),
                                  cc * FR::CH + q * FR::SC < I);
                if (++cc == cpe) cc = 0, ck++;
            }
            if (i + MDM_D < n) load(d, i + MDM_D);
        }
    }
    if (q == 0) {
        part[0][warp][g] = acc[0] + acc[1], part[0][warp][8 + g] = acc[2] + acc[3];
        part[1][warp][g] = sacc[0] + sacc[1], part[1][warp][8 + g] = sacc[2] + sacc[3];
    }
    __syncthreads();
    if (sub || lane >= 16 || n0 + lane >= H) return;
    float v = 0, u = 0;
    for (int k = 0; k < S; k++) v += part[0][warp + k][lane], u += part[1][warp + k][lane];
    a.out[(long long)t * H + n0 + lane] = v + u;
}

// The views the kernels take: 16-byte copies (rows on 16 bytes, columns
// from a block boundary), whole units of x.
static bool mdm_view_ok(const dqw &w)
{
    if (w.type == QT_MXFP4)
        return w.ld % 32 == 0 && w.c0 % 32 == 0 && w.cols % 32 == 0 && w.estride % 16 == 0;
    return w.type == QT_FP8 && w.ld % 16 == 0 && w.c0 % 16 == 0 && w.cols % 16 == 0 &&
           w.estride % 16 == 0;
}

bool cu_moe_decode_mma(cudaStream_t st, const cu_moe_dec &m)
{
    int S = m.mma_s;
    int H = m.w2.rows, I = m.w1.rows, Is = m.s1.rows;
    if (!m.order || (S != 2 && S != 4 && S != 8) || !mdm_view_ok(m.w1) || !mdm_view_ok(m.w3) ||
        !mdm_view_ok(m.w2) || !mdm_view_ok(m.s1) || !mdm_view_ok(m.s3) || !mdm_view_ok(m.s2) ||
        m.w1.cols % 8 || (uintptr_t)m.x % 16 || m.x_ld % 4)
        return false;
    mdm_args a = { m.T, m.K, S, m.w1, m.w3, m.w2, m.s1, m.s3, m.s2, m.x, m.x_ld, m.idx, m.wt,
                   m.g, m.sg, m.out, m.limit };
    // x staged: 4 bytes a column, whole chunks (MXFP4 128 columns, FP8 64)
    auto bytes = [](int cols, int ch) { return (size_t)(cols + ch - 1) / ch * ch * 4; };
    size_t up = bytes(m.w1.cols, 128) > bytes(m.s1.cols, 64) ? bytes(m.w1.cols, 128)
                                                             : bytes(m.s1.cols, 64);
    size_t down = m.K * bytes(I, 128) + bytes(Is, 64);
    if (up > 96 * 1024 || down > 96 * 1024) return false;
    if (up > 48 * 1024)
        cudaFuncSetAttribute(moe_up_mma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)up);
    if (down > 48 * 1024)
        cudaFuncSetAttribute(moe_down_mma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)down);
    int per = 8 / S, gu = ((I > Is ? I : Is) + 7) / 8, gd = (H + 15) / 16;
    cu_launch(moe_up_mma_kernel, dim3((unsigned)((gu + per - 1) / per), m.T * m.K + m.T), 256,
              up, st, a);
    // down: a row group a block (8 warps of its columns: 256 blocks a
    // token at V4's H = 4,096)
    a.S = 8;
    cu_launch(moe_down_mma_kernel, dim3((unsigned)gd, m.T), 256, down, st, a);
    return true;
}
