// y = x W^T over weights in their stored precision (FP8 with UE8M0 128x128
// blocks, MXFP4, BF16, F32), float32 accumulation.
//   few tokens (decode): GEMV with 16-byte weight loads dequantized in
//     registers, several rows per warp and 8 loads in flight per lane,
//     every token (up to 8) against each load; fused forms for the MoE
//     experts (w1 and w3 with SwiGLU, w2 with the routing weights and the
//     sum over a token's experts);
//   many tokens (prefill): 64x64 output tiles, weights dequantized into
//     shared memory once per tile, also grouped by expert.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "moe_decode.cuh"

// Elements per 16-byte load.
template <int QT> struct vec_of { static constexpr int n = 4; };
template <> struct vec_of<QT_BF16> { static constexpr int n = 8; };
template <> struct vec_of<QT_FP8> { static constexpr int n = 16; };
template <> struct vec_of<QT_MXFP4> { static constexpr int n = 32; };

// Floats of x per token staged in shared memory at a time (32 KB).
template <int NT> struct xtile { static constexpr int n = 8192 / NT; };

// Where float4 q of a staged x row lives: a lane reads VEC/4 consecutive
// float4s for its chunk, so lanes 8 apart in q would hit the same banks;
// the xor spreads every 8 consecutive lanes over all banks.
__device__ __forceinline__ int xswz(int q) { return q ^ ((q >> 3) & 7); }

__device__ __forceinline__ float comp(const float4 &v, int k)
{
    return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}

// a[r][t] += the 16 bytes u[r] decoded, without their block scale, times
// token t's x over the same columns (staged float4s from q0 on).  FP8
// codes go through the hardware's f16x2 conversion; E2M1 codes are placed
// under an f16 exponent (exactly the value times 2^-14), nibbles k and
// k + 4 of a word as one f16x2; BF16 is the high half of a float32.
template <int QT, int NT, int R>
__device__ __forceinline__ void dot16(const uint4 (&u)[R], const float4 *xs, int q0,
                                      float (&a)[R][NT])
{
    constexpr int XT4 = xtile<NT>::n / 4;
    if (QT == QT_MXFP4) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float4 xa[NT], xb[NT];
#pragma unroll
            for (int t = 0; t < NT; t++) {
                xa[t] = xs[t * XT4 + xswz(q0 + 2 * j)];
                xb[t] = xs[t * XT4 + xswz(q0 + 2 * j + 1)];
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                uint32_t p = word(u[r], j);
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    uint32_t m = k < 3 ? p << (9 - 4 * k) : p >> 3;
                    float2 f = half2f((m & 0x0e000e00u) | ((p << (12 - 4 * k)) & 0x80008000u));
#pragma unroll
                    for (int t = 0; t < NT; t++)
                        a[r][t] = fmaf(f.y, comp(xb[t], k), fmaf(f.x, comp(xa[t], k), a[r][t]));
                }
            }
        }
    } else if (QT == QT_FP8) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float4 xv[NT];
#pragma unroll
            for (int t = 0; t < NT; t++) xv[t] = xs[t * XT4 + xswz(q0 + j)];
#pragma unroll
            for (int r = 0; r < R; r++) {
                uint32_t p = word(u[r], j);
                float2 lo = half2f(e4m3x2_f16x2(p)), hi = half2f(e4m3x2_f16x2(p >> 16));
#pragma unroll
                for (int t = 0; t < NT; t++)
                    a[r][t] = fmaf(hi.y, xv[t].w, fmaf(hi.x, xv[t].z, fmaf(lo.y, xv[t].y,
                                   fmaf(lo.x, xv[t].x, a[r][t]))));
            }
        }
    } else if (QT == QT_BF16) {
#pragma unroll
        for (int j = 0; j < 2; j++) {
            float4 xv[NT];
#pragma unroll
            for (int t = 0; t < NT; t++) xv[t] = xs[t * XT4 + xswz(q0 + j)];
#pragma unroll
            for (int r = 0; r < R; r++) {
                uint32_t p0 = word(u[r], 2 * j), p1 = word(u[r], 2 * j + 1);
                float v0 = __uint_as_float(p0 << 16), v1 = __uint_as_float(p0 & 0xffff0000u);
                float v2 = __uint_as_float(p1 << 16), v3 = __uint_as_float(p1 & 0xffff0000u);
#pragma unroll
                for (int t = 0; t < NT; t++)
                    a[r][t] = fmaf(v3, xv[t].w, fmaf(v2, xv[t].z, fmaf(v1, xv[t].y,
                                   fmaf(v0, xv[t].x, a[r][t]))));
            }
        }
    } else {
        float4 xv[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) xv[t] = xs[t * XT4 + xswz(q0)];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < NT; t++)
                a[r][t] = fmaf(__uint_as_float(u[r].w), xv[t].w,
                               fmaf(__uint_as_float(u[r].z), xv[t].z,
                                    fmaf(__uint_as_float(u[r].y), xv[t].y,
                                         fmaf(__uint_as_float(u[r].x), xv[t].x, a[r][t]))));
    }
}

// What the kernel's outputs are (see the launchers in kernels.cuh).
enum { GV_PLAIN, GV_SWIGLU, GV_COMBINE };

struct gv_args {
    // PLAIN: nm matrices of one format and width in one launch, matrix i
    // (its x and y) owning blocks [mb[i], mb[i + 1]); else nm = 1.
    int nm, mb[CU_MULTI_MAX + 1];
    dqw w[CU_MULTI_MAX], w3;    // w3: SWIGLU's second matrix (same shape and layout as w)
    const int *experts;     // SWIGLU: per slot (blockIdx.y); COMBINE: [T][K]; NULL: dense
    const float *x[CU_MULTI_MAX];
    int ldx, xdiv, T;       // T: tokens (dense) or slots
    float *y[CU_MULTI_MAX];
    int ldy[CU_MULTI_MAX];
    const float *nw;        // PLAIN: x's rows RMS-normalized with weight nw first (NULL: not)
    float neps;
    int K;                  // COMBINE: slots per token
    const float *wt, *add;  // COMBINE: routing weights [T][K]; rows added [T][ldy] or NULL
    float limit;            // SWIGLU
    int S;                  // warps per row group, each a slice of the columns
    int vec;                // 16-byte weight loads possible (else element by element)
    int x4;                 // x staged as float4s (aligned rows, columns a multiple of 4)
    int tok_fast;           // blockIdx.x: the token chunk, blockIdx.y: the rows (L2 reuse)
    // Grouped by expert (PLAIN, SWIGLU): blockIdx.y is tile i of moe_sort's
    // table (none past *ntiles), its slots j = tiles[i].y + t (t < tiles[i].z
    // <= NT) of expert tiles[i].x; x row perm[j] / xdiv (gather) or j, y
    // row j, or perm[j] (scatter).
    const int4 *tiles;
    const int *ntiles, *perm;
    int scatter, tile_m;    // tile_m: slots per tile (1, 2, 4, 8); T is then the tiles' bound
    // The fused decode MoE (moe_up_kernel, moe_down_kernel): the shared
    // expert's matrices (up: sw, sw3; down: sw), its x rows (sldx apart,
    // svec, sx4 as vec, x4) and y rows; the router's inputs and outputs.
    dqw sw, sw3;
    const float *sx;
    int sldx, svec, sx4, sldy;
    float *sy;
    const float *scores, *bias;
    const void *tid2eid;
    const int *ids;
    int E, sigmoid, tid_i64;
    float rscale;
    int *idx;
    float *rwt;
    int routed;             // moe_up_kernel: idx already holds the choices (route_kernel)
};

// The column loop of gemv_kernel: acc[r][t] += row[r] of bd / bs (the
// group's rows, their expert applied) times token t's x (x rows xrow[t] of
// ax, ldx apart; COMBINE: the token's slots scaled by their weights, slot
// k's columns at eoff[.][k]) over Kv columns.  Ends with the block's
// threads still reading xs: a second call stages x after a barrier.
template <int QT, int NT, int R, int MODE>
__device__ __forceinline__ void gv_accum(const gv_args &a, const dqw &w, const float *ax, int ldx,
                                         int vec, int x4, int Kv, int t0,
                                         const uint8_t *const (&bd)[R],
                                         const uint8_t *const (&bs)[R],
                                         const long long (&row)[R], bool dense, float4 *xs,
                                         const int *xrow, const long long (*eoff)[16],
                                         float (&acc)[R][NT])
{
    constexpr int VEC = vec_of<QT>::n, XT = xtile<NT>::n, D = 8 / R;
    constexpr int EB = QT == QT_F32 ? 32 : QT == QT_BF16 ? 16 : QT == QT_FP8 ? 8 : 4;
    constexpr int SSH = QT == QT_FP8 ? 7 : 5;       // columns per scale: 1 << SSH
    int lane = threadIdx.x & 31, S = a.S, sub = (threadIdx.x >> 5) % S, I = w.cols;
    int nvec = vec ? Kv / VEC * VEC : 0;
    float *xf = (float *)xs;
    uint4 u[D][R];
    uint32_t sb[D][R];
    // Chunks c, c + 32S, ... (D of them) of every row of the group.
    auto load = [&](int k0, int c, int nch) {
#pragma unroll
        for (int d = 0; d < D; d++) {
            int cc = c + d * 32 * S;
            int vc = k0 + (cc < nch ? cc : c) * VEC;    // a valid address either way
            long long col = vc, od = 0, os = 0;
            if (MODE == GV_COMBINE) {
                int k = vc / I;
                col = vc - k * I, od = eoff[0][k], os = eoff[1][k];
            }
            col += w.c0;
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (cc < nch) u[d][r] = ld_weights(bd[r] + od + (row[r] * w.ld + col) * EB / 8);
                else u[d][r] = make_uint4(0, 0, 0, 0);
                sb[d][r] = 127;
                if (QT == QT_FP8 && cc < nch)
                    sb[d][r] = bs[r][os + (row[r] >> 7) * w.sld + (col >> SSH)];
                if (QT == QT_MXFP4 && cc < nch)
                    sb[d][r] = bs[r][os + row[r] * w.sld + (col >> SSH)];
            }
        }
    };
    for (int k0 = 0; k0 < Kv; k0 += XT) {
        int kn = min(XT, Kv - k0), nch = max(0, min(kn, nvec - k0)) / VEC;
        int c = lane + 32 * sub;
        // The first weights are on their way while x is staged.
        if (c < nch) load(k0, c, nch);
        if (dense && k0 == 0) pdl_wait();
        __syncthreads();
        if (x4) {
            // float4s, all of a thread's loads before its stores (at most
            // 8: NT * XT / 4 = 2048 per tile).
            int kn4 = kn >> 2;
            float4 v[8];
#pragma unroll
            for (int j = 0; j < 8; j++) {
                int i = threadIdx.x + j * 256, t = i / kn4, q = i - t * kn4, vc = k0 + 4 * q;
                v[j] = make_float4(0, 0, 0, 0);
                if (i >= NT * kn4) continue;
                if (MODE == GV_COMBINE) {
                    int k = vc / I;
                    long long sl = (long long)t0 * a.K + k;
                    float4 g = *(const float4 *)(ax + sl * ldx + vc - k * I);
                    float f = a.wt[sl];
                    v[j] = make_float4(f * g.x, f * g.y, f * g.z, f * g.w);
                } else if (xrow[t] >= 0) {
                    v[j] = *(const float4 *)(ax + (long long)xrow[t] * ldx + vc);
                }
            }
#pragma unroll
            for (int j = 0; j < 8; j++) {
                int i = threadIdx.x + j * 256, t = i / kn4, q = i - t * kn4;
                if (i < NT * kn4) xs[t * (XT / 4) + xswz(q)] = v[j];
            }
        } else {
            for (int i = threadIdx.x; i < NT * kn; i += blockDim.x) {
                int t = i / kn, q = i - t * kn, vc = k0 + q;
                float v = 0;
                if (MODE == GV_COMBINE) {
                    int k = vc / I;
                    long long sl = (long long)t0 * a.K + k;
                    v = a.wt[sl] * ax[sl * ldx + vc - k * I];
                } else if (xrow[t] >= 0) {
                    v = ax[(long long)xrow[t] * ldx + vc];
                }
                xf[t * XT + xswz(q >> 2) * 4 + (q & 3)] = v;
            }
        }
        __syncthreads();
        if (MODE == GV_PLAIN && a.nw) {
            // Each token's row is whole in this tile: its RMSNorm in place
            // (rmsnorm_kernel's operations).
            __shared__ double nsh[32];
            for (int t = 0; t < NT; t++) {
                float *xt = xf + t * XT;
                double ss = 0;
                for (int q = threadIdx.x; q < kn; q += blockDim.x) {
                    float v = xt[xswz(q >> 2) * 4 + (q & 3)];
                    ss += (double)v * v;
                }
                ss = block_sum(ss, nsh);
                float r = 1.0f / sqrtf((float)(ss / kn) + a.neps);
                for (int q = threadIdx.x; q < kn; q += blockDim.x) {
                    float *v = &xt[xswz(q >> 2) * 4 + (q & 3)];
                    *v = a.nw[q] * (*v * r);
                }
            }
            __syncthreads();
        }
        while (c < nch) {
#pragma unroll
            for (int d = 0; d < D; d++) {
                int cc = c + d * 32 * S;
                if (cc >= nch) break;
                float p[R][NT];
#pragma unroll
                for (int r = 0; r < R; r++)
#pragma unroll
                    for (int t = 0; t < NT; t++) p[r][t] = 0;
                dot16<QT, NT, R>(u[d], xs, cc * (VEC / 4), p);
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float s = e8m0f(sb[d][r]);
#pragma unroll
                    for (int t = 0; t < NT; t++) {
                        if (QT == QT_MXFP4) acc[r][t] = fmaf(p[r][t] * 16384.0f, s, acc[r][t]);
                        else if (QT == QT_FP8) acc[r][t] = fmaf(p[r][t], s, acc[r][t]);
                        else acc[r][t] += p[r][t];
                    }
                }
            }
            c += 32 * S * D;
            if (c < nch) load(k0, c, nch);
        }
        // Columns the 16-byte loads do not cover, one element at a time.
        for (int q = max(0, nvec - k0) + lane + 32 * sub; q < kn; q += 32 * S) {
            int vc = k0 + q;
            long long col = vc, od = 0, os = 0;
            if (MODE == GV_COMBINE) {
                int k = vc / I;
                col = vc - k * I, od = eoff[0][k], os = eoff[1][k];
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                float v = qw_at<QT>(w, bd[r] + od, bs[r] + os, row[r], w.c0 + col);
#pragma unroll
                for (int t = 0; t < NT; t++)
                    acc[r][t] += v * xf[t * XT + xswz(q >> 2) * 4 + (q & 3)];
            }
        }
    }
}

// Matrix-vector products for a few tokens, the weights read once at
// memory speed.  A warp owns a group of R rows (SWIGLU: R/2 rows of w and
// the same rows of w3) and a slice of the columns (S warps per group);
// each lane reads 16 bytes of every row of the group per chunk, D chunks
// at once, so 8 loads of 16 bytes are in flight per lane, and each x
// value read from shared memory serves R rows.  The tokens' x is staged
// in shared memory once per block, a tile at a time.  COMBINE treats the
// K slots of token blockIdx.y as one row of K * cols columns (slot k's
// columns read from its expert, its x scaled by its routing weight).
template <int QT, int NT, int R, int MODE>
__global__ void __launch_bounds__(256, 2) gemv_kernel(const __grid_constant__ gv_args a)
{
    constexpr int XT = xtile<NT>::n, RO = MODE == GV_SWIGLU ? R / 2 : R;
    __shared__ float4 xs[NT * XT / 4];
    __shared__ float part[8][R][NT];
    __shared__ long long eoff[2][16];
    __shared__ int xrow[NT], yrow[NT];  // token t's x and y rows, -1: none
    int rb = a.tok_fast ? blockIdx.y : blockIdx.x, tb = a.tok_fast ? blockIdx.x : blockIdx.y;
    int m = 0;
    if (MODE == GV_PLAIN)
        while (m + 1 < a.nm && rb >= a.mb[m + 1]) m++;
    rb -= a.mb[m];
    const dqw &w = a.w[m];
    const float *ax = a.x[m];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, S = a.S, sub = warp % S;
    int n0 = (rb * (8 / S) + warp / S) * RO, t0 = tb * NT;
    int I = w.cols, Kv = MODE == GV_COMBINE ? a.K * I : I;
    long long tile_e = -1;
    if (MODE != GV_COMBINE && a.tiles) {
        pdl_wait();         // the table comes from the kernel before
        if (tb >= *a.ntiles) return;
        int4 tl = a.tiles[tb];
        tile_e = tl.x;
        if (threadIdx.x < NT) {
            int t = threadIdx.x, j = tl.y + t;
            xrow[t] = t < tl.z ? (a.scatter ? j : a.perm[j] / a.xdiv) : -1;
            yrow[t] = t < tl.z ? (a.scatter ? a.perm[j] : j) : -1;
        }
    } else if (threadIdx.x < NT) {
        int t = t0 + threadIdx.x;
        xrow[threadIdx.x] = t < a.T ? t / a.xdiv : -1;
        yrow[threadIdx.x] = t < a.T ? t : -1;
    }
    __syncthreads();

    const uint8_t *bd[R], *bs[R];   // row r's matrix (expert applied), its row, scale row
    long long row[R];
    // Experts come from the kernel before: wait for it first.  Else the
    // first weights load while it finishes (pdl_wait below).
    bool dense = MODE != GV_COMBINE && !a.experts && !a.tiles;
    if (!dense) pdl_wait();
    {
        const uint8_t *d = w.data, *s = w.scale, *d3 = a.w3.data, *s3 = a.w3.scale;
        if (MODE != GV_COMBINE && (a.experts || a.tiles)) {
            long long e = a.tiles ? tile_e : a.experts[t0];
            d += e * w.estride, s += e * w.sestride;
            d3 += e * a.w3.estride, s3 += e * a.w3.sestride;
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            bool second = MODE == GV_SWIGLU && r >= RO;
            bd[r] = second ? d3 : d;
            bs[r] = second ? s3 : s;
            row[r] = w.r0 + min(n0 + r % RO, w.rows - 1);
        }
    }
    if (MODE == GV_COMBINE && threadIdx.x < a.K) {
        long long e = a.experts[(long long)t0 * a.K + threadIdx.x];
        eoff[0][threadIdx.x] = e * w.estride;
        eoff[1][threadIdx.x] = e * w.sestride;
    }
    if (MODE == GV_COMBINE) __syncthreads();
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0;
    gv_accum<QT, NT, R, MODE>(a, w, ax, a.ldx, a.vec, a.x4, Kv, t0, bd, bs, row, dense, xs, xrow,
                              eoff, acc);
    if (dense) pdl_wait();      // no columns: the loop never waited
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float s = warp_sum(acc[r][t]);
            if (lane == 0) part[warp][r][t] = s;
        }
    __syncthreads();
    if (sub) return;
    for (int o = lane; o < RO * NT; o += 32) {
        int r = o / NT, t = o % NT, n = n0 + r;
        if (n >= w.rows || (MODE != GV_COMBINE && yrow[t] < 0) ||
            (MODE == GV_COMBINE && t0 + t >= a.T))
            continue;
        float v = 0, u = 0;
        for (int k = 0; k < S; k++) {
            v += part[warp + k][r][t];
            if (MODE == GV_SWIGLU) u += part[warp + k][r + RO][t];
        }
        long long yi = (long long)(MODE == GV_COMBINE ? t0 + t : yrow[t]) * a.ldy[m] + n;
        if (MODE == GV_SWIGLU) v = swiglu1(v, u, a.limit);
        if (MODE == GV_COMBINE && a.add) v += a.add[yi];
        a.y[m][yi] = v;
    }
}

// The fused decode MoE (moe_decode.cuh), one token per block (NT = 1).
// Each block's rows as gemv_kernel's (R per warp group, S warps a group).
template <int R>
__device__ __forceinline__ void gv_rows(const dqw &w, const dqw &w3, long long e, int n0, int ro,
                                        const uint8_t *(&bd)[R], const uint8_t *(&bs)[R],
                                        long long (&row)[R])
{
#pragma unroll
    for (int r = 0; r < R; r++) {
        const dqw &m = r >= ro ? w3 : w;
        bd[r] = m.data + e * m.estride;
        bs[r] = m.scale + e * m.sestride;
        row[r] = w.r0 + min(n0 + r % ro, w.rows - 1);
    }
}

// Up: blockIdx.y < T*K a routed slot (expert of QTE), else a token's
// shared-expert slot (QTS); SwiGLU of w1 and w3 rows into g or sg.
template <int QTE, int QTS, int R>
__global__ void __launch_bounds__(256, 2) moe_up_kernel(const __grid_constant__ gv_args a)
{
    constexpr int RO = R / 2;
    __shared__ float4 xs[xtile<1>::n / 4];
    __shared__ float part[8][R][1];
    __shared__ int xrow[1];
    __shared__ long long ex;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, S = a.S, sub = warp % S;
    int ns = a.T * a.K, slot = blockIdx.y;
    bool sh = slot >= ns;
    int tok = sh ? slot - ns : slot / a.K;
    const dqw &w = sh ? a.sw : a.w[0], &w3 = sh ? a.sw3 : a.w3;
    int n0 = (blockIdx.x * (8 / S) + warp / S) * RO;
    if (blockIdx.x * (8 / S) * RO >= w.rows) return;    // the other matrix is taller
    if (!sh) {
        pdl_wait();     // scores from the gate's GEMV, or idx from route_kernel
        if (a.routed) {
            if (threadIdx.x == 0) ex = a.idx[slot];
        } else if (warp == 0) {
            // xs as the router's scratch until x is staged (E * 9 bytes)
            // (the weights only where they are stored: off the others'
            // path to their first weight load)
            int sel[TOPK_MAX], k = slot - tok * a.K;
            bool first = blockIdx.x == 0 && k == 0;
            float wt[TOPK_MAX];
            float *act = (float *)xs, *val = act + a.E;
            route_warp(a.scores + (long long)tok * a.E, a.E, a.K, a.sigmoid, a.bias, a.tid2eid,
                       a.tid_i64, a.tid2eid ? a.ids[tok] : 0, a.rscale, act, val,
                       (unsigned char *)(val + a.E), sel, first, wt);
            if (lane == 0) {
                ex = sel[k];
                if (first)
                    for (int j = 0; j < a.K; j++) {
                        a.idx[(long long)tok * a.K + j] = sel[j];
                        a.rwt[(long long)tok * a.K + j] = wt[j];
                    }
            }
        }
    }
    if (threadIdx.x == 0) xrow[0] = tok;
    __syncthreads();
    const uint8_t *bd[R], *bs[R];
    long long row[R];
    gv_rows<R>(w, w3, sh ? 0 : ex, n0, RO, bd, bs, row);
    float acc[R][1];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r][0] = 0;
    if (sh)     // dense: its first weights load before it waits
        gv_accum<QTS, 1, R, GV_SWIGLU>(a, w, a.sx, a.sldx, a.svec, a.sx4, w.cols, tok, bd, bs,
                                       row, true, xs, xrow, NULL, acc);
    else
        gv_accum<QTE, 1, R, GV_SWIGLU>(a, w, a.x[0], a.ldx, a.vec, a.x4, w.cols, tok, bd, bs,
                                       row, false, xs, xrow, NULL, acc);
#pragma unroll
    for (int r = 0; r < R; r++) {
        float s = warp_sum(acc[r][0]);
        if (lane == 0) part[warp][r][0] = s;
    }
    __syncthreads();
    if (sub) return;
    for (int o = lane; o < RO; o += 32) {
        int n = n0 + o;
        if (n >= w.rows) continue;
        float v = 0, u = 0;
        for (int k = 0; k < S; k++) v += part[warp + k][o][0], u += part[warp + k][o + RO][0];
        float *y = sh ? a.sy + (long long)tok * a.sldy : a.y[0] + (long long)slot * a.ldy[0];
        y[n] = swiglu1(v, u, a.limit);
    }
}

// Down: token blockIdx.y's K slots (w2 of QTE, one row of K * I columns,
// as GV_COMBINE), then its shared expert's w2 (QTS) over sg; the routed
// sum plus the shared one.
template <int QTE, int QTS, int R>
__global__ void __launch_bounds__(256, 2) moe_down_kernel(const __grid_constant__ gv_args a)
{
    __shared__ float4 xs[xtile<1>::n / 4];
    __shared__ float part[2][8][R][1];
    __shared__ long long eoff[2][16];
    __shared__ int xrow[1];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, S = a.S, sub = warp % S;
    int t0 = blockIdx.y, n0 = (blockIdx.x * (8 / S) + warp / S) * R;
    const dqw &w = a.w[0], &sw = a.sw;
    pdl_wait();         // experts, weights, g and sg from moe_up_kernel
    if (threadIdx.x < a.K) {
        long long e = a.experts[(long long)t0 * a.K + threadIdx.x];
        eoff[0][threadIdx.x] = e * w.estride;
        eoff[1][threadIdx.x] = e * w.sestride;
    }
    if (threadIdx.x == 0) xrow[0] = t0;
    __syncthreads();
    const uint8_t *bd[R], *bs[R], *sbd[R], *sbs[R];
    long long row[R], srow[R];
    gv_rows<R>(w, w, 0, n0, R, bd, bs, row);
    gv_rows<R>(sw, sw, 0, n0, R, sbd, sbs, srow);
    float acc[R][1], sacc[R][1];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r][0] = sacc[r][0] = 0;
    gv_accum<QTE, 1, R, GV_COMBINE>(a, w, a.x[0], a.ldx, a.vec, a.x4, a.K * w.cols, t0, bd, bs,
                                    row, false, xs, xrow, eoff, acc);
    gv_accum<QTS, 1, R, GV_PLAIN>(a, sw, a.sx, a.sldx, a.svec, a.sx4, sw.cols, t0, sbd, sbs,
                                  srow, false, xs, xrow, NULL, sacc);
#pragma unroll
    for (int r = 0; r < R; r++) {
        float s = warp_sum(acc[r][0]), ss = warp_sum(sacc[r][0]);
        if (lane == 0) part[0][warp][r][0] = s, part[1][warp][r][0] = ss;
    }
    __syncthreads();
    if (sub) return;
    for (int o = lane; o < R; o += 32) {
        int n = n0 + o;
        if (n >= w.rows) continue;
        float v = 0, u = 0;
        for (int k = 0; k < S; k++) v += part[0][warp + k][o][0], u += part[1][warp + k][o][0];
        a.y[0][(long long)t0 * a.ldy[0] + n] = v + u;
    }
}

#define TM CU_TILE_M
#define TN 64
#define TK 32

// 64 tokens x 64 output rows per block, 4x4 per thread: tokens m0.. of x.
template <int QT>
__global__ void __launch_bounds__(256)
tiled_kernel(dqw w, const float *x, int ldx, int T, float *y, int ldy)
{
    pdl_wait();
    __shared__ __align__(16) float xs[TK][TM + 4];
    __shared__ __align__(16) float ws[TK][TN + 4];
    int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
    int n0 = blockIdx.y * TN, m0 = blockIdx.x * TM, mcount = min(TM, T - m0);
    const uint8_t *data = w.data, *scale = w.scale;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < w.cols; k0 += TK) {
#pragma unroll
        for (int i = 0; i < TM * TK / 256; i++) {
            int idx = tid + i * 256, m = idx / TK, k = idx % TK;
            float v = 0;
            if (m < mcount && k0 + k < w.cols) v = x[(long long)(m0 + m) * ldx + k0 + k];
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
        long long tok = m0 + m;
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

int cu_sm_count()
{
    static int n[64];
    int dev = 0;
    cudaGetDevice(&dev);
    if (dev < 0 || dev >= 64) return 132;
    if (!n[dev] && cudaDeviceGetAttribute(&n[dev], cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        n[dev] = 132;
    return n[dev];
}

int cu_gemv_tokens = 4;

// Tokens a GEMV block takes: the power of two that covers T, up to 8
// tokens at most cu_gemv_tokens (more: blocks of that many); more than 8
// in blocks of 8 as before (not measured per matrix with 4).
static int gv_tokens(int T)
{
    if (T > 8) return 8;
    int nt = T <= 1 ? 1 : T <= 2 ? 2 : T <= 4 ? 4 : 8;
    return nt < cu_gemv_tokens ? nt : cu_gemv_tokens;
}

// Warps per row group: the columns (chunks of 16 bytes a row) split over S
// warps until about two blocks per SM are busy (each lane still reading at
// least one chunk of its slice).
static int gv_slices(long long groups, int ny, int chunks)
{
    long long target = 16LL * cu_sm_count();
    int S = 1;
    while (groups * S * ny < target && S < 8 && chunks >= 64 * S) S *= 2;
    return S;
}

int cu_gemv_rows = 4;

// Rows a warp takes: 8 tokens fewer (or registers spill); one token of a
// dense matrix cu_gemv_rows.
template <int MODE>
static int gv_rows_of(int NT, const gv_args &a)
{
    return NT == 8 ? 2 : NT == 1 && MODE == GV_PLAIN && !a.tiles ? cu_gemv_rows : 4;
}

template <int QT, int NT, int MODE>
static void launch_nt(cudaStream_t st, dim3 grid, const gv_args &a, bool one_row)
{
    constexpr int R = NT == 8 ? 2 : 4;
    if constexpr (MODE == GV_PLAIN) {
        if (one_row) {
            cu_launch(gemv_kernel<QT, NT, 1, MODE>, grid, 256, 0, st, a);
            return;
        }
        // (compile-time NT: the other row counts only where they can run)
        if constexpr (NT == 1)
            if (gv_rows_of<MODE>(NT, a) != R) {
                if (cu_gemv_rows == 2) cu_launch(gemv_kernel<QT, 1, 2, MODE>, grid, 256, 0, st, a);
                else cu_launch(gemv_kernel<QT, 1, 8, MODE>, grid, 256, 0, st, a);
                return;
            }
    }
    cu_launch(gemv_kernel<QT, NT, R, MODE>, grid, 256, 0, st, a);
}

template <int QT, int MODE>
static void launch_qt(cudaStream_t st, dim3 grid, const gv_args &a, int NT, bool one_row)
{
    if constexpr (MODE == GV_COMBINE) {
        launch_nt<QT, 1, MODE>(st, grid, a, one_row);
    } else {
        switch (NT) {
        case 1: launch_nt<QT, 1, MODE>(st, grid, a, one_row); break;
        case 2: launch_nt<QT, 2, MODE>(st, grid, a, one_row); break;
        case 4: launch_nt<QT, 4, MODE>(st, grid, a, one_row); break;
        default: launch_nt<QT, 8, MODE>(st, grid, a, one_row); break;
        }
    }
}

// Tokens per block (1, 2, 4, 8), then the shape: R rows per warp, or one
// row when that leaves too few warps (short matrices); the columns split
// over S warps until about two blocks per SM are busy (each lane still
// reading at least one chunk of its slice).
// A multi launch (nm > 1) takes the shape its matrices' rows together
// would get, each matrix starting on a block of its own.
template <int MODE>
static void gemv_launch(cudaStream_t st, gv_args a)
{
    const dqw &w = a.w[0];
    int VEC = vec_elems(w.type), Kv = MODE == GV_COMBINE ? a.K * w.cols : w.cols;
    int NT = MODE == GV_COMBINE || a.experts ? 1 : a.tiles ? a.tile_m : gv_tokens(a.T);
    int ny = MODE == GV_COMBINE || a.experts || a.tiles ? a.T : (a.T + NT - 1) / NT;
    int R = gv_rows_of<MODE>(NT, a), RO = MODE == GV_SWIGLU ? R / 2 : R;
    long long target = 16LL * cu_sm_count();
    auto ngroups = [&](int ro) {
        long long g = 0;
        for (int i = 0; i < a.nm; i++) g += (a.w[i].rows + ro - 1) / ro;
        return g;
    };
    auto slices = [&](int ro) { return gv_slices(ngroups(ro), ny, Kv / VEC); };
    a.S = slices(RO);
    bool one_row = MODE == GV_PLAIN && ngroups(RO) * a.S * ny < target / 2;
    if (one_row) {
        RO = 1;
        a.S = slices(1);
    }
    int per_block = 8 / a.S;
    a.mb[0] = 0;
    for (int i = 0; i < a.nm; i++) {
        int groups = (a.w[i].rows + RO - 1) / RO;
        a.mb[i + 1] = a.mb[i] + (groups + per_block - 1) / per_block;
    }
    dim3 grid(a.mb[a.nm], ny);
    // More than 8 tokens: the chunks of a group of rows run one after the
    // other, so all but the first read the rows from L2.
    if (MODE == GV_PLAIN && !a.tiles && ny > 1 && grid.x <= 65535) {
        a.tok_fast = 1;
        grid = dim3(ny, grid.x);
    }
    QT_DISPATCH(w.type, launch_qt<QT, MODE>(st, grid, a, NT, one_row));
}

static gv_args gv_make(const dqw &w, const float *x, int ldx, int T, float *y, int ldy)
{
    gv_args a = {};
    a.nm = 1;
    a.w[0] = a.w3 = w;
    a.x[0] = x, a.ldx = ldx, a.xdiv = 1, a.T = T, a.y[0] = y, a.ldy[0] = ldy;
    a.vec = w.c0 % vec_elems(w.type) == 0;
    a.x4 = (uintptr_t)x % 16 == 0 && ldx % 4 == 0 && w.cols % 4 == 0;
    return a;
}

void cu_matmul(cudaStream_t st, const dqw &w, const float *x, int ldx, int T, float *y, int ldy)
{
    if (w.rows <= 0 || T <= 0) return;
    if (T <= CU_GEMV_MAX_T) {
        gemv_launch<GV_PLAIN>(st, gv_make(w, x, ldx, T, y, ldy));
    } else {
        dim3 grid((T + TM - 1) / TM, (w.rows + TN - 1) / TN);
        QT_DISPATCH(w.type, cu_launch(tiled_kernel<QT>, grid, 256, 0, st, w, x, ldx, T, y, ldy));
    }
}

bool cu_matmul_multi(cudaStream_t st, int n, const dqw *w, const float *const *x, int ldx, int T,
                     float *const *y, const int *ldy, const float *nw, float eps)
{
    int NT = gv_tokens(T);
    if (n < 1 || n > CU_MULTI_MAX || T < 1 || T > 8 || (nw && w[0].cols > 8192 / NT))
        return false;
    gv_args a = gv_make(w[0], x[0], ldx, T, y[0], ldy[0]);
    a.nw = nw, a.neps = eps;
    for (int i = 0; i < n; i++) {
        const gv_args b = gv_make(w[i], x[i], ldx, T, y[i], ldy[i]);
        if (w[i].type != w[0].type || w[i].cols != w[0].cols || w[i].rows <= 0 ||
            b.vec != a.vec || b.x4 != a.x4)
            return false;
        a.w[i] = w[i], a.x[i] = x[i], a.y[i] = y[i], a.ldy[i] = ldy[i];
    }
    a.nm = n;
    gemv_launch<GV_PLAIN>(st, a);
    return true;
}

bool cu_gemv_swiglu(cudaStream_t st, const dqw &w1, const dqw &w3, const int *experts,
                    const float *x, int ldx, int xdiv, int T, float limit, float *y, int ldy)
{
    if (w1.type != w3.type || w1.rows != w3.rows || w1.cols != w3.cols || w1.ld != w3.ld ||
        w1.sld != w3.sld || w1.r0 != w3.r0 || w1.c0 != w3.c0)
        return false;
    if (w1.rows <= 0 || T <= 0) return true;
    gv_args a = gv_make(w1, x, ldx, T, y, ldy);
    a.w3 = w3, a.experts = experts, a.xdiv = xdiv, a.limit = limit;
    gemv_launch<GV_SWIGLU>(st, a);
    return true;
}

bool cu_gemv_combine(cudaStream_t st, const dqw &w, const int *experts, int K, const float *wt,
                     const float *x, int ldx, int T, const float *add, float *y, int ldy)
{
    if (K > 16) return false;
    if (w.rows <= 0 || T <= 0) return true;
    gv_args a = gv_make(w, x, ldx, T, y, ldy);
    a.experts = experts, a.K = K, a.wt = wt, a.add = add;
    a.vec = a.vec && w.cols % vec_elems(w.type) == 0;
    gemv_launch<GV_COMBINE>(st, a);
    return true;
}

bool cu_gemv_tiles(cudaStream_t st, const dqw &w1, const dqw *w3, const int4 *tiles,
                   const int *ntiles, int max_tiles, int tile_m, const int *perm, bool scatter,
                   const float *x, int ldx, int xdiv, float limit, float *y, int ldy)
{
    if (w3 && (w1.type != w3->type || w1.rows != w3->rows || w1.cols != w3->cols ||
               w1.ld != w3->ld || w1.sld != w3->sld || w1.r0 != w3->r0 || w1.c0 != w3->c0))
        return false;
    if (tile_m != 1 && tile_m != 2 && tile_m != 4 && tile_m != 8) return false;
    if (w1.rows <= 0 || max_tiles <= 0) return true;
    gv_args a = gv_make(w1, x, ldx, max_tiles, y, ldy);
    a.tiles = tiles, a.ntiles = ntiles, a.perm = perm, a.scatter = scatter, a.tile_m = tile_m;
    a.xdiv = xdiv, a.limit = limit;
    if (w3) {
        a.w3 = *w3;
        gemv_launch<GV_SWIGLU>(st, a);
    } else {
        gemv_launch<GV_PLAIN>(st, a);
    }
    return true;
}

static bool same_layout(const dqw &a, const dqw &b)
{
    return a.type == b.type && a.rows == b.rows && a.cols == b.cols && a.ld == b.ld &&
           a.sld == b.sld && a.r0 == b.r0 && a.c0 == b.c0;
}

bool cu_moe_decode(cudaStream_t st, const cu_moe_dec &m)
{
    constexpr int R = 4;        // NT = 1 (launch_nt)
    const int QE = QT_MXFP4, QS = QT_FP8, VE = 32, VS = 16;
    int I = m.w1.rows, Is = m.s1.rows, H = m.w2.rows;
    if (m.T < 1 || m.T > 8 || m.K < 1 || m.K > 16 || m.E < m.K ||
        (!m.order && m.E * 9 > xtile<1>::n * 4) || m.w1.type != QE || m.w2.type != QE ||
        m.s1.type != QS || m.s2.type != QS ||
        !same_layout(m.w1, m.w3) || !same_layout(m.s1, m.s3) || m.s2.rows != H ||
        m.w2.cols != I || m.s2.cols != Is || I <= 0 || Is <= 0 || H <= 0 ||
        (uintptr_t)m.g % 16 || (uintptr_t)m.sg % 16)
        return false;
    bool x4 = (uintptr_t)m.x % 16 == 0 && m.x_ld % 4 == 0 && m.w1.cols % 4 == 0;
    gv_args a = {};
    a.nm = 1, a.T = m.T, a.K = m.K, a.limit = m.limit;
    a.scores = m.scores, a.bias = m.bias, a.tid2eid = m.tid2eid, a.ids = m.ids, a.E = m.E;
    a.sigmoid = m.sigmoid, a.tid_i64 = m.tid_i64, a.rscale = m.rscale;
    a.idx = m.idx, a.rwt = m.wt;
    if (m.order) {
        if (!m.routed)
            cu_moe_route(st, m.scores, m.T, m.E, m.K, m.sigmoid, m.bias, m.tid2eid, m.tid_i64,
                         m.ids, m.rscale, m.idx, m.wt, m.order, m.route_regs);
        a.routed = 1;
        if (m.mma_s && cu_moe_decode_mma(st, m)) return true;
    }

    // up: experts' w1 / w3 over x, shared s1 / s3 over x
    a.w[0] = m.w1, a.w3 = m.w3, a.x[0] = m.x, a.ldx = m.x_ld, a.vec = m.w1.c0 % VE == 0;
    a.x4 = x4, a.y[0] = m.g, a.ldy[0] = I;
    a.sw = m.s1, a.sw3 = m.s3, a.sx = m.x, a.sldx = m.x_ld, a.svec = m.s1.c0 % VS == 0;
    a.sx4 = x4 && m.s1.cols % 4 == 0, a.sy = m.sg, a.sldy = Is;
    int ny = m.T * m.K + m.T, RO = R / 2;
    long long groups = ((I > Is ? I : Is) + RO - 1) / RO;
    int ch = m.w1.cols / VE < m.s1.cols / VS ? m.w1.cols / VE : m.s1.cols / VS;
    a.S = gv_slices(groups, ny, ch);
    int per = 8 / a.S;
    cu_launch(moe_up_kernel<QE, QS, R>, dim3((unsigned)((groups + per - 1) / per), ny), 256, 0,
              st, a);

    // down: experts' w2 over g (weighted), shared s2 over sg, summed
    a.w[0] = m.w2, a.x[0] = m.g, a.ldx = I, a.experts = m.idx, a.wt = m.wt;
    a.vec = m.w2.c0 % VE == 0 && I % VE == 0, a.x4 = I % 4 == 0, a.y[0] = m.out, a.ldy[0] = H;
    a.sw = m.s2, a.sx = m.sg, a.sldx = Is, a.svec = m.s2.c0 % VS == 0, a.sx4 = Is % 4 == 0;
    groups = (H + R - 1) / R;
    ch = m.K * I / VE < Is / VS ? m.K * I / VE : Is / VS;
    a.S = gv_slices(groups, m.T, ch);
    per = 8 / a.S;
    cu_launch(moe_down_kernel<QE, QS, R>, dim3((unsigned)((groups + per - 1) / per), m.T), 256,
              0, st, a);
    return true;
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
    pdl_wait();
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
            float4 f0 = fp8x4f(u.x, s), f1 = fp8x4f(u.y, s);
            float f[8] = { f0.x, f0.y, f0.z, f0.w, f1.x, f1.y, f1.z, f1.w };
#pragma unroll
            for (int j = 0; j < 8; j++) v[j] = out_of<O>(f[j]);
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
        QT_DISPATCH(w.type, cu_launch(dequant_kernel<QT, uint16_t>, grid, 256, 0, st, w,
                                      (uint16_t *)out, ldo));
    } else {
        QT_DISPATCH(w.type, cu_launch(dequant_kernel<QT, float>, grid, 256, 0, st, w, (float *)out,
                                      ldo));
    }
}

// A block per (chunk of 1,024 columns, row; rows past 65,535 in turn), 4
// consecutive columns a thread: a float4 load and each part's 4 bf16s as
// one 8-byte store where the rows allow it (v4), else element by element.
// (One element a thread with a 64-bit division for its row and column
// took 162 us for 8,192 x 4,096 x 2 parts, three times its bytes' time.)
__global__ void round_bf16_kernel(const float *x, int ldx, const int *rows, int div, int T,
                                  int K, uint16_t *out, int ldo, int lo, int parts, bool v4)
{
    pdl_wait();
    int k = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (k >= K) return;
    int m = K - k < 4 ? K - k : 4;
    for (int t = blockIdx.y; t < T; t += gridDim.y) {
        const float *xr = x + (long long)(rows ? rows[t] / div : t) * ldx + k;
        uint16_t *o = out + (long long)t * ldo + k;
        float v[4];
        if (v4) {
            *(float4 *)v = *(const float4 *)xr;
        } else {
#pragma unroll
            for (int j = 0; j < 4; j++) v[j] = j < m ? xr[j] : 0.0f;
        }
        for (int p = 0; p < parts; p++) {
            uint16_t h[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                h[j] = bf16_rn(v[j]);
                v[j] -= bf16f(h[j]);    // exact: h is v's leading bits, rounded
            }
            if (v4) {
                *(uint2 *)(o + (long long)p * lo) =
                    make_uint2(h[0] | (uint32_t)h[1] << 16, h[2] | (uint32_t)h[3] << 16);
            } else {
                for (int j = 0; j < m; j++) o[(long long)p * lo + j] = h[j];
            }
        }
    }
}

void cu_round_bf16(cudaStream_t st, const float *x, int ldx, const int *rows, int div, int T,
                   int K, uint16_t *out, int ldo, int lo, int parts)
{
    if (T <= 0 || K <= 0) return;
    bool v4 = K % 4 == 0 && ldx % 4 == 0 && (uintptr_t)x % 16 == 0 && ldo % 4 == 0 &&
              lo % 4 == 0 && (uintptr_t)out % 8 == 0;
    dim3 grid((unsigned)((K + 1023) / 1024), grid_rows(T));
    cu_launch(round_bf16_kernel, grid, 256, 0, st, x, ldx, rows, div, T, K, out, ldo, lo, parts,
              v4);
}

__global__ void sum_parts_kernel(const float *c, int N, long long T, int parts, cu_ysegs g)
{
    pdl_wait();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= T * N) return;
    long long t = i / N, n = i % N;
    const float *s = c + t * parts * N + n;
    float v = s[0];
    for (int p = 1; p < parts; p++) v += s[(long long)p * N];
    int k = 0;
    while (n >= g.end[k]) k++;
    g.y[k][t * g.ldy[k] + n - (k ? g.end[k - 1] : 0)] = v;
}

void cu_sum_parts_segs(cudaStream_t st, const float *c, int N, int T, int parts,
                       const cu_ysegs &s)
{
    long long n = (long long)T * N;
    if (n <= 0) return;
    cu_launch(sum_parts_kernel, (unsigned)((n + 255) / 256), 256, 0, st, c, N, (long long)T, parts,
              s);
}

void cu_sum_parts(cudaStream_t st, const float *c, int N, int T, int parts, float *y, int ldy)
{
    cu_ysegs s = { 1, { N }, { ldy }, { y } };
    cu_sum_parts_segs(st, c, N, T, parts, s);
}
