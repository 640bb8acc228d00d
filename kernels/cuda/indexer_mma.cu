// The lightning indexer's scores on tensor cores, for steps of many new
// tokens (prefill chunks): score[i][s] = sum_h w[i][h] * d^-0.5 *
// ReLU(q[i][h] . k[s]) with q and k rounded to bf16 and float32 sums
// (the reference model keeps both in bf16 and scores them in float32).
// The visible keys are first gathered from the paged cache into a
// contiguous bf16 tile (indexer_gather_kernel, cu_gather_bf16: also the
// prefill attention's HCA entries) and the queries rounded to bf16 once
// (indexer_qround_kernel; for wgmma indexer_qimage_kernel, laid out as its
// stages hold them), then one fused kernel does the products
// (mma.sync m16n8k16), ReLU, weights, the sum over heads and the causal
// mask, writing the [token][entry] rows the radix top-k reads.  On
// sm_90a the products run on wgmma (indexer_wgmma_kernel), else on
// mma.sync (indexer_mma_kernel; LLM_CUDA_INDEXER_WGMMA=0 compares).
// Decode steps take indexer_wgmma_dec_kernel: no tile, each block reads
// its keys straight from the cache and rounds its row's queries itself.
// Under the fp8 GEMM mode (indexer_fp8_scores) the prefill's wgmma kernel
// multiplies e4m3 codes instead, as DeepSeek's lightning indexer does:
// queries quantized per head and keys per row as act_quant quantizes 128
// channels (indexer_qimage8_kernel, indexer_gather8_kernel), the codes'
// products on FP8 wgmma, the heads' scales folded into their weights and
// the key's scale applied to its summed score (a power of two > 0, so it
// commutes with the ReLU and the sum).
#include <stdio.h>

#include "indexer_mma.h"
#include "smm.cuh"
#include "wgmma.cuh"

#define MMA_WARPS 8
#define MMA_KEYS (32 * MMA_WARPS)   // keys per block: 32 per warp, in registers
#define MMA_QG 64                   // tokens per block (grid.y)
#define MMA_QB 2                    // tokens per shared-memory stage
#define MMA_D 128                   // head dim this kernel is written for
#define MMA_QST (MMA_D + 32)        // bf16 row stride of q in shared memory (no bank conflicts)
// dynamic shared memory: two stages of MMA_QB tokens' bf16 queries and weights
#define MMA_SMEM (2 * MMA_QB * 64 * (MMA_QST * 2 + 4))

static unsigned blocks_for(long long n, int threads) { return (unsigned)((n + threads - 1) / threads); }

// Keys [k0, k1) of the paged cache (any kv dtype) as bf16 rows of d (d a
// multiple of 4).  BF16 and FP8 entries convert exactly.
__global__ void indexer_gather_kernel(dpaged keys, int k0, int k1, int d, uint2 *out)
{
    pdl_wait();
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int per = d / 4;
    if (idx >= (long long)(k1 - k0) * per) return;
    int s = k0 + (int)(idx / per), c = (int)(idx % per) * 4;
    kref r = dpaged_ref(keys, s);
    out[idx] = make_uint2(pack_bf16x2(kref_at(r, c), kref_at(r, c + 1)),
                          pack_bf16x2(kref_at(r, c + 2), kref_at(r, c + 3)));
}

// The queries of tokens [t0, t0 + nt) (nh x d floats each) as bf16 (d a
// multiple of 4), rows as they are: the same rounding the kernel's
// staging did per block (every block of a token re-read and converted its
// float32 queries: 2 MB of loads a block of 64 tokens, run T6).
__global__ void indexer_qround_kernel(const float4 *q, long long n4, uint2 *out)
{
    pdl_wait();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n4) return;
    float4 v = q[i];
    out[i] = make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
}

// The epilogue's terms of one n8 tile of sums (a: heads h0 + 2t, + 1 of
// rows g and g + 8, the mma layout): ReLU, the heads' weights, added to
// the rows' parts p, a fused multiply-add a term (two instructions a
// product with its ReLU, where a multiply, an FMA and an add a pair took
// five).
__device__ __forceinline__ void idx_heads(float (&p)[2], const float *a, float w0, float w1)
{
    p[0] = fmaf(fmaxf(a[1], 0), w1, fmaf(fmaxf(a[0], 0), w0, p[0]));
    p[1] = fmaf(fmaxf(a[3], 0), w1, fmaf(fmaxf(a[2], 0), w0, p[1]));
}

// The 4 lanes of a row group add up their parts (m-tile, row g / g + 8);
// lane t keeps part [t >> 1][t & 1], the score it stores.
__device__ __forceinline__ float idx_quad(float (&part)[2][2], int t)
{
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            part[mt][r] += __shfl_xor_sync(0xffffffffu, part[mt][r], 1);
            part[mt][r] += __shfl_xor_sync(0xffffffffu, part[mt][r], 2);
        }
    return t == 0 ? part[0][0] : t == 1 ? part[0][1] : t == 2 ? part[1][0] : part[1][1];
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// A warpgroup's products of its 128 keys (A: two m64 tiles, k steps in
// the mma fragment layout) with a token's 64 heads of queries at
// descriptor db (128-byte swizzle) into d, committed as one group: bf16,
// 8 k steps of 16 over two atoms of 64 k; F8 (e4m3), 4 k steps of 32
// over one atom of 128 (indexer_wgmma_kernel, indexer_wgmma_dec_kernel).
template <bool F8 = false>
__device__ __forceinline__ void idx_wg_issue(float (&d)[2][32],
                                             const uint32_t (&A)[2][F8 ? 4 : 8][4], uint64_t db)
{
    swm_pin(d[0]);
    swm_pin(d[1]);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int s = 0; s < (F8 ? 4 : 8); s++)
#pragma unroll
        for (int mt = 0; mt < 2; mt++) {
            if constexpr (F8) swm_wgmma_e4m3_64(d[mt], A[mt][s], db + 2 * s, s > 0);
            else swm_wgmma<64>(d[mt], A[mt][s], db + ((s >> 2) * (64 * 128) + (s & 3) * 32) / 16,
                               s > 0);
        }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
#endif

// Block (x, y): keys k0 + [x*MMA_KEYS, +MMA_KEYS) of the gathered tile
// kt (rows k0..k1) against tokens t0 + [y*MMA_QG, +MMA_QG) that see more
// than topk entries.  The matrix product has keys as M (each warp holds
// its 32 keys' fragments in registers for the whole block), heads as N
// (8 per mma, read from shared memory) and the head dim as K.  A sum
// over K may take its terms in any order, so lane (g, t) supplies, at
// k-step pair jj, dims 32*jj + 8*t .. +8 for both operands: one 16-byte
// load each.  The accumulator's columns are heads, so ReLU, the weight
// and the sum over heads happen in registers; the four lanes of a row
// then add up by shuffles.  The queries (qbf: bf16, row i - t0 token i)
// and weights of MMA_QB tokens come by cp.async into one of two stages
// while the other stage's tokens are scored.
__global__ void __launch_bounds__(32 * MMA_WARPS, 2)
indexer_mma_kernel(dindexer a, int t0, int nt, int k0, int k1, const uint16_t *kt,
                   const uint16_t *qbf, float smul, float *scores, long long ldsc)
{
    pdl_wait();
    extern __shared__ __align__(16) uint8_t ish[];
    uint16_t *qs2 = (uint16_t *)ish;                                  // [2][MMA_QB * 64][MMA_QST]
    float *ws2 = (float *)(ish + 2 * MMA_QB * 64 * MMA_QST * 2);      // [2][MMA_QB * 64]
    int nh = a.nheads, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    int s0 = k0 + blockIdx.x * MMA_KEYS, sw = s0 + 32 * warp;
    // Tokens that see more than max(topk, s0) entries: (pos0+i+1)/ratio > m.
    int m = a.topk > s0 ? a.topk : s0;
    int i0 = t0 + blockIdx.y * MMA_QG, i1 = min(i0 + MMA_QG, t0 + nt);
    i0 = max(i0, a.ratio * (m + 1) - a.pos0 - 1);
    if (i0 >= i1) return;

    uint32_t ka[2][2][4][4];    // [m-tile][row g / g+8][jj][word]
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int s = sw + 16 * mt + 8 * r + g;
            const uint4 *row = (const uint4 *)(kt + (long long)(s - k0) * MMA_D + 8 * t);
#pragma unroll
            for (int jj = 0; jj < 4; jj++) {
                uint4 v = s < k1 ? row[4 * jj] : make_uint4(0, 0, 0, 0);
                ka[mt][r][jj][0] = v.x, ka[mt][r][jj][1] = v.y;
                ka[mt][r][jj][2] = v.z, ka[mt][r][jj][3] = v.w;
            }
        }

    // Stage tokens ib.. (at most MMA_QB, before i1) into buffer b: 16-byte
    // copies of their heads' bf16 rows, their weights 4 bytes a copy.
    auto stage = [&](int ib, int b) {
        int nq = min(MMA_QB, i1 - ib);
        const uint16_t *src = qbf + (long long)(ib - t0) * nh * MMA_D;
        uint16_t *qd = qs2 + b * MMA_QB * 64 * MMA_QST;
        for (int x = threadIdx.x; x < nq * nh * (MMA_D / 8); x += blockDim.x) {
            int row = x / (MMA_D / 8), c = x % (MMA_D / 8) * 8;
            cp_async16(qd + row * MMA_QST + c, src + (long long)row * MMA_D + c, 16);
        }
        float *wd = ws2 + b * MMA_QB * 64;
        for (int x = threadIdx.x; x < nq * nh; x += blockDim.x)
            cp_async4(wd + x, a.w + (long long)ib * nh + x, true);
        cp_async_commit();
    };
    stage(i0, 0);
    for (int ib = i0, b = 0; ib < i1; ib += MMA_QB, b ^= 1) {
        int nq = min(MMA_QB, i1 - ib);
        // The other buffer was consumed (the barrier at the end of the
        // last round): the next tokens go there while these are scored.
        if (ib + MMA_QB < i1) stage(ib + MMA_QB, b ^ 1);
        else cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const uint16_t *qs = qs2 + b * MMA_QB * 64 * MMA_QST;
        const float *ws = ws2 + b * MMA_QB * 64;
        for (int qb = 0; qb < nq; qb++) {
            int i = ib + qb, nvis = (a.pos0 + i + 1) / a.ratio;
            if (sw >= nvis) continue;
            float part[2][2] = { { 0, 0 }, { 0, 0 } };
            for (int h0 = 0; h0 < nh; h0 += 8) {
                const uint16_t *qrow = qs + (qb * nh + h0 + g) * MMA_QST + 8 * t;
                float acc[2][4] = { { 0, 0, 0, 0 }, { 0, 0, 0, 0 } };
#pragma unroll
                for (int jj = 0; jj < 4; jj++) {
                    uint4 b = *(const uint4 *)(qrow + 32 * jj);
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
                        const uint32_t *lo = ka[mt][0][jj], *hi = ka[mt][1][jj];
                        mma_bf16_16816(acc[mt], lo[0], hi[0], lo[1], hi[1], b.x, b.y);
                        mma_bf16_16816(acc[mt], lo[2], hi[2], lo[3], hi[3], b.z, b.w);
                    }
                }
                float w0 = ws[qb * nh + h0 + 2 * t] * smul, w1 = ws[qb * nh + h0 + 2 * t + 1] * smul;
#pragma unroll
                for (int mt = 0; mt < 2; mt++) idx_heads(part[mt], acc[mt], w0, w1);
            }
            // Lane (g, t) stores key 16*(t>>1) + 8*(t&1) + g: 32 keys, one per lane.
            float v = idx_quad(part, t);
            int s = sw + 16 * (t >> 1) + 8 * (t & 1) + g;
            if (s < nvis && s < k1) scores[(long long)(i - t0) * ldsc + s] = v;
        }
        __syncthreads();    // this buffer is free for the round after next
    }
}

// The same scores on wgmma (m64n64k16, A in registers, B in shared
// memory).  Block (x, y), one warpgroup: keys k0 + [x*WG_KEYS, +WG_KEYS)
// against tokens t0 + [y*WG_QG, +WG_QG) that see more than topk entries,
// as indexer_mma_kernel.  Its keys are two m64 tiles of A fragments (the
// mma layout, k in order), loaded once; each token's queries (64 heads x
// 128 dims: N x K) and weights come as qimg's image of them, by two bulk
// copies WG_ST - 1 tokens ahead, into a ring of WG_ST stages (an mbarrier
// each counts the bytes landed).  Three blocks share an SM, each reducing while the
// others multiply (run T9: one block of two warpgroups in lockstep
// waited at its barriers 38% of the time).  The sums over heads:
// indexer_mma_kernel's epilogue, the same order (a lane's accumulator
// columns are heads 8 j + 2t, + 1, as an n8 tile's).  F8: the keys are
// e4m3 rows with a float scale each (ksc), the images
// indexer_qimage8_kernel's, and each score times its key's scale.
#define WG_KEYS 128
#define WG_QG 64
#define WG_ST 4
#define WG_QB (64 * MMA_D * 2)  // bytes of a stage's queries
#define WG_WB (64 * 4)          // bytes of its weights
#define WG_IMG (WG_QB + WG_WB)  // a token's image (indexer_qimage_kernel)
#define WG8_QB (64 * MMA_D)     // F8: bytes of a stage's e4m3 queries
#define WG8_IMG (WG8_QB + WG_WB)
// a stage's queries, weights and mbarrier, after room to align to 1024
#define WG_SMEM(img) (1024 + WG_ST * ((img) + 8))
static_assert(WG_IMG == CU_INDEXER_QROWS * MMA_D * 2, "a token's image fills its scratch rows");

// Where dims 8 c16 .. 8 c16 + 7 of head n sit in a stage's queries: two
// atoms of 64 dims, rows of 128 bytes, 16-byte chunks in the 128-byte
// swizzle (as wgmma reads B from a 1024-byte aligned stage).
__host__ __device__ constexpr int wg_qoff(int n, int c16)
{
    return (c16 >> 3) * (64 * 128) + n * 128 + (((c16 & 7) ^ (n & 7)) << 4);
}

// A call's tokens (queries q: nh x d floats each; weights w: nh each) as
// images of indexer_wgmma_kernel's stages, WG_IMG bytes a token: its
// queries as bf16 where a stage holds them (zeros past the heads), then
// its weights times smul (zeros past the heads).  A stage is then a bulk
// copy of contiguous bytes, where a block's cp.async loop spent ~100
// instructions a thread a token on addresses and swizzle (ptx of the
// loop), and the weights' scaling is done once, not by every block (the
// same products: the same bits).  The queries' rounding is
// indexer_qround_kernel's.
__global__ void indexer_qimage_kernel(const float *q, const float *w, int nh, float smul,
                                      long long units, uint4 *out)
{
    pdl_wait();
    long long u = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (u >= units) return;
    long long i = u / (WG_IMG / 16);
    int r = (int)(u % (WG_IMG / 16));
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r >= WG_QB / 16) {      // weights 4 (r - WG_QB / 16) .. + 3
        float f[4];
        for (int k = 0; k < 4; k++) {
            int h = 4 * (r - WG_QB / 16) + k;
            f[k] = h < nh ? w[i * nh + h] * smul : 0.0f;
        }
        v = make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]),
                       __float_as_uint(f[3]));
        out[u] = v;
        return;
    }
    int n = r >> 4, c16 = r & 15;
    if (n < nh) {
        const float4 *src = (const float4 *)(q + (i * nh + n) * MMA_D + 8 * c16);
        float4 x = src[0], y = src[1];
        v = make_uint4(pack_bf16x2(x.x, x.y), pack_bf16x2(x.z, x.w), pack_bf16x2(y.x, y.y),
                       pack_bf16x2(y.z, y.w));
    }
    out[i * (WG_IMG / 16) + wg_qoff(n, c16) / 16] = v;
}

// A warp's 128 channels (lane l: channels 4l .. 4l + 3 in v) quantized
// as act_quant_kernel quantizes a group: the lane's four e4m3 codes (the
// lowest channel in the low byte); the group's scale in *sc.
__device__ __forceinline__ uint32_t idx_quant128(float4 v, float *sc)
{
    float s = act_scale(warp_max(fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)),
                                       fmaxf(fabsf(v.z), fabsf(v.w)))));
    *sc = s;
    return fp8_enc(v.x / s) | fp8_enc(v.y / s) << 8 | fp8_enc(v.z / s) << 16 |
           fp8_enc(v.w / s) << 24;
}

// F8's queries: the 64 heads' rows of 128 codes (one 128-byte swizzle
// atom column; a token's image as the stage holds it), the weights after
// them.  A warp per (token, head), quantized by idx_quant128; the head's
// weight times smul and its scale (exact: a power of two).  Heads past
// nh: zero codes and weights.
__global__ void indexer_qimage8_kernel(const float *q, const float *w, int nh, float smul,
                                       long long warps, uint8_t *out)
{
    pdl_wait();
    long long u = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (u >= warps) return;
    long long i = u >> 6;
    int n = (int)(u & 63), c16 = lane >> 2;
    uint8_t *img = out + i * WG8_IMG;
    uint32_t code = 0;
    float wt = 0;
    if (n < nh) {
        float sc;
        code = idx_quant128(((const float4 *)(q + (i * nh + n) * MMA_D))[lane], &sc);
        wt = w[i * nh + n] * smul * sc;
    }
    *(uint32_t *)(img + n * 128 + ((c16 ^ (n & 7)) << 4) + 4 * (lane & 3)) = code;
    if (lane == 0) ((float *)(img + WG8_QB))[n] = wt;
}

// F8's keys: rows [k0, k1) of the paged cache (any kv dtype, rows of
// 128) as e4m3 codes [k1 - k0][128] and a float scale a row, quantized as
// indexer_qimage8_kernel quantizes a head (a warp a row).
__global__ void indexer_gather8_kernel(dpaged keys, int k0, int k1, uint32_t *codes,
                                       float *scales)
{
    pdl_wait();
    long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (r >= k1 - k0) return;
    kref k = dpaged_ref(keys, k0 + (int)r);
    float sc;
    codes[r * 32 + lane] = idx_quant128(make_float4(kref_at(k, 4 * lane), kref_at(k, 4 * lane + 1),
                                                    kref_at(k, 4 * lane + 2),
                                                    kref_at(k, 4 * lane + 3)),
                                        &sc);
    if (lane == 0) scales[r] = sc;
}

// P pairs of m64 tiles a warpgroup (WG_KEYS P keys a block): each pair's
// products and reduction in turn into the same accumulators, so a token's
// image, the L2 traffic that bounds the kernel (a block's 64 tokens bring
// 64 images for its keys: 1 MB of bf16 for 128 keys), serves P times the
// keys.  bf16: P = 1.  F8: P = 2 unless LLM_CUDA_INDEXER_FP8_KEYS=128.
template <bool F8, int P>
__global__ void __launch_bounds__(128, F8 && P == 1 ? 4 : 3)
indexer_wgmma_kernel(dindexer a, int t0, int nt, int k0, int k1, const uint8_t *kt,
                     const float *ksc, const uint8_t *qimg, float *scores, long long ldsc)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    // a stage's query bytes, a token's image, a key row's bytes, k steps
    constexpr int QB = F8 ? WG8_QB : WG_QB, IMG = QB + WG_WB, RB = F8 ? MMA_D : 2 * MMA_D;
    constexpr int KS = RB / 32;
    pdl_wait();
    extern __shared__ __align__(16) uint8_t wsh_raw[];
    uint8_t *qst = (uint8_t *)(((uintptr_t)wsh_raw + 1023) & ~(uintptr_t)1023);
    float *wst = (float *)(qst + WG_ST * QB);
    const uint32_t qa = (uint32_t)__cvta_generic_to_shared(qst), wa = qa + WG_ST * QB;
    const uint32_t bar0 = qa + WG_ST * IMG;     // WG_ST mbarriers
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wq = warp, g = lane >> 2, t = lane & 3;
    const int s0 = k0 + blockIdx.x * WG_KEYS * P;
    int m = a.topk > s0 ? a.topk : s0;
    int i0 = t0 + blockIdx.y * WG_QG, i1 = min(i0 + WG_QG, t0 + nt);
    i0 = max(i0, a.ratio * (m + 1) - a.pos0 - 1);
    if (i0 >= i1) return;
    const int ntok = i1 - i0;

    // Token i's queries and weights into stage b: thread 0's two bulk
    // copies of its image, counted on stage b's mbarrier.
    auto stage = [&](int i, int b) {
        if (tid) return;
        const uint8_t *img = qimg + (long long)(i - t0) * IMG;
        swm_bar_expect(bar0 + 8 * b, IMG);
        swm_bulk_load(qa + b * QB, img, QB, bar0 + 8 * b);
        swm_bulk_load(wa + b * WG_WB, img + QB, WG_WB, bar0 + 8 * b);
    };
    if (tid == 0) {
        for (int b = 0; b < WG_ST; b++) swm_bar_init(bar0 + 8 * b, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    for (int j = 0; j < WG_ST - 1 && j < ntok; j++) stage(i0 + j, j);

    // A: keys kb + 16 wq + g (+ 8) of m-tile mt (kb = s0 + 64 mt);
    // k step s: row bytes 32 s + 4t .. + 3 in words 0-1, 32 s + 16 + 4t
    // .. + 3 in 2-3 (bf16: dims 16 s + 2t, + 1 and 16 s + 8 + 2t, + 1;
    // e4m3: dims 32 s + 4t .. + 3 and 32 s + 16 + 4t .. + 3).
    uint32_t A[P][2][KS][4];
#pragma unroll
    for (int mt = 0; mt < 2 * P; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int key = s0 + 64 * mt + 16 * wq + g + 8 * r;
            const uint32_t *row = (const uint32_t *)(kt + (long long)(key - k0) * RB);
#pragma unroll
            for (int s = 0; s < KS; s++) {
                A[mt >> 1][mt & 1][s][r] = key < k1 ? row[8 * s + t] : 0;
                A[mt >> 1][mt & 1][s][2 + r] = key < k1 ? row[8 * s + 4 + t] : 0;
            }
        }

    // Token j's scores of pair p from d (its products done).
    auto finish = [&](int j, int p, float (&d)[2][32]) {
        int i = i0 + j, nvis = (a.pos0 + i + 1) / a.ratio;
        const float *ws = wst + (j % WG_ST) * 64;
        float part[2][2] = { { 0, 0 }, { 0, 0 } };
        // every head of the image: past nh its queries and weights are
        // zeros, whose terms (+0) leave the sums as they are
#pragma unroll
        for (int jn = 0; jn < 8; jn++) {
            float2 w = *(const float2 *)(ws + 8 * jn + 2 * t);
#pragma unroll
            for (int mt = 0; mt < 2; mt++) idx_heads(part[mt], d[mt] + 4 * jn, w.x, w.y);
        }
        float v = idx_quad(part, t);
        int key = s0 + 128 * p + 64 * (t >> 1) + 16 * wq + g + 8 * (t & 1);
        if (key < nvis && key < k1)
            scores[(long long)(i - t0) * ldsc + key] = F8 ? v * ksc[key - k0] : v;
    };
    // Token j: its stage landed (the mbarrier's phase j / WG_ST; the next
    // two may be in flight) and stage (j + 3) % WG_ST free (token j - 1
    // finished by every warp): fill it, multiply, reduce.  (Token j + 1's
    // wgmma issued before token j's reduction, into a second accumulator
    // set behind wait_group 1, made ptxas serialize the groups, warning
    // C7514: it cannot tell which group's registers the reduction reads.
    // The SM's other blocks multiply meanwhile.)
    float acc[2][32];
    for (int j = 0; j < ntok; j++) {
        swm_bar_wait(bar0 + 8 * (j % WG_ST), (j / WG_ST) & 1);
        __syncthreads();
        if (j + WG_ST - 1 < ntok) stage(i0 + j + WG_ST - 1, (j + WG_ST - 1) % WG_ST);
        int nvis = (a.pos0 + i0 + j + 1) / a.ratio;
#pragma unroll
        for (int p = 0; p < P; p++) {
            if (p && s0 + 128 * p >= nvis) break;   // the token sees none of them
            idx_wg_issue<F8>(acc, A[p], swm_desc(qa + (j % WG_ST) * QB));
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            swm_pin(acc[0]);
            swm_pin(acc[1]);
            finish(j, p, acc);
        }
    }
#elif defined(__CUDA_ARCH__)
    __trap();   // built for sm_90a only (wgmma)
#endif
}

void cu_gather_bf16(cudaStream_t st, const dpaged &keys, int k0, int k1, int d, uint16_t *out)
{
    cu_launch(indexer_gather_kernel, blocks_for((long long)(k1 - k0) * d / 4, 256), 256, 0, st,
              keys, k0, k1, d, (uint2 *)out);
}

bool cu_indexer_mma_fits(int nheads, int d) { return d == MMA_D && nheads % 8 == 0 && nheads <= 64; }

// Decode steps (a few tokens, or a batch of one-token sequences: segs):
// the same scores with no gathered tile.  Each lane reads its keys'
// channels straight from the paged cache, 32 consecutive channels a row
// (FP8 codes and their group's scale: two 16-byte loads; bf16: four),
// exactly in bf16.  The sum over the head dim may take its terms in any
// order, so lane t's channels 32t .. 32t+31 play the k indices its A
// fragment holds (k step s, pair h: channels 32t + 4s + 2h, +1; dec_chan)
// and the queries are staged in that order, rounded to bf16 as
// indexer_qround_kernel rounds them.  A block (one warpgroup) stages its
// row's queries once, then takes chunks of DEC_KEYS entries blockIdx.x,
// + gridDim.x, ... up to the row's visible count (read from dyn under
// graph replay: the grid is sized for the launch's bound).  The sums
// over heads: indexer_wgmma_kernel's epilogue.
#define DEC_KEYS 128
#define DEC_QLOADS (64 * MMA_D / 4 / 128)   // float4 of queries a thread stages
#define DEC_SMEM (1024 + WG_QB + 64 * 4)

// The channel that plays k index k (0..127) of the A fragment's order.
__host__ __device__ constexpr int dec_chan(int k)
{
    return 32 * ((k & 7) >> 1) + 4 * (k >> 4) + 2 * ((k >> 3) & 1) + (k & 1);
}

__global__ void __launch_bounds__(128, 3)
indexer_wgmma_dec_kernel(dindexer a, int t0, float smul, float *scores, long long ldsc,
                         const dindexer *segs)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    pdl_wait();
    extern __shared__ __align__(16) uint8_t dsh_raw[];
    uint8_t *qs = (uint8_t *)(((uintptr_t)dsh_raw + 1023) & ~(uintptr_t)1023);
    float *ws = (float *)(qs + WG_QB);
    int i = t0 + blockIdx.y;
    if (segs) a = segs[blockIdx.y], i = 0;      // sequence t0 + blockIdx.y of a batch
    int nvis = ((a.dyn ? a.dyn->pos0 : a.pos0) + i + 1) / a.ratio;
    if (nvis <= a.topk || (int)blockIdx.x * DEC_KEYS >= nvis) return;
    const int nh = a.nheads, tid = threadIdx.x, lane = tid & 31, wq = tid >> 5;
    const int g = lane >> 2, t = lane & 3;

    // Queries: float4 x of head n holds channels 4v .. 4v+3 (v = x % 32),
    // k indices 16 (v & 7) + 2 (v >> 3) + {0, 1} and the same + 8; stored
    // as wgmma reads B (indexer_wgmma_kernel's stage: 128-byte swizzle,
    // two atoms of 64 k).  A thread's loads all go out before any store
    // (one round trip, not 16: run V2 timed the staging at ~9 us).
    const float4 *q4 = (const float4 *)(a.q + (long long)i * nh * MMA_D);
    float4 f[DEC_QLOADS];
#pragma unroll
    for (int u = 0; u < DEC_QLOADS; u++) {
        int x = tid + 128 * u;
        f[u] = x >> 5 < nh ? q4[x] : make_float4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < DEC_QLOADS; u++) {
        int x = tid + 128 * u, n = x >> 5, v = x & 31, k = 16 * (v & 7) + 2 * (v >> 3);
        uint32_t w2[2] = { pack_bf16x2(f[u].x, f[u].y), pack_bf16x2(f[u].z, f[u].w) };
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int kk = k + 8 * h, c16 = kk >> 3;
            *(uint32_t *)(qs + wg_qoff(n, c16) + 2 * (kk & 7)) = w2[h];
        }
    }
    if (tid < 64) ws[tid] = tid < nh ? a.w[(long long)i * nh + tid] * smul : 0.0f;
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const uint64_t db = swm_desc((uint32_t)__cvta_generic_to_shared(qs));
    const bool fp8 = a.keys.dtype == KV_FP8;

    for (int c = blockIdx.x; c * DEC_KEYS < nvis; c += gridDim.x) {
        const int s0 = c * DEC_KEYS;
        // A: key s0 + 64 mt + 16 wq + g + 8 r, k step s: words 0-1 (row r)
        // channels 32t + 4s, +1; words 2-3 channels 32t + 4s + 2, +3.
        // The four rows' addresses, then all their loads, then the
        // conversions: two round trips a chunk.
        kref kr[2][2];
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                int key = s0 + 64 * mt + 16 * wq + g + 8 * r;
                kr[mt][r] = key < nvis ? dpaged_ref(a.keys, key) : kref{ NULL, NULL, 0 };
            }
        uint4 raw[2][2][4];
        int sexp[2][2];     // FP8: the channels' group scale exponent
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const kref &k = kr[mt][r];
                const uint4 *p = (const uint4 *)(k.p + (fp8 ? 32 : 64) * t);
#pragma unroll
                for (int u = 0; u < 4; u++)
                    raw[mt][r][u] = k.p && (u < 2 || !fp8) ? p[u] : make_uint4(0, 0, 0, 0);
                sexp[mt][r] = k.p && fp8 ? (int)k.s[t >> 1] - 127 : 0;
            }
        uint32_t A[2][8][4];
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const uint32_t *w = (const uint32_t *)raw[mt][r];
                if (fp8) {
                    float sc = pow2i(sexp[mt][r]);
#pragma unroll
                    for (int s = 0; s < 8; s++) {
                        float4 f = fp8x4f(w[s], sc);
                        A[mt][s][r] = pack_bf16x2(f.x, f.y);
                        A[mt][s][2 + r] = pack_bf16x2(f.z, f.w);
                    }
                } else {
#pragma unroll
                    for (int s = 0; s < 8; s++)
                        A[mt][s][r] = w[2 * s], A[mt][s][2 + r] = w[2 * s + 1];
                }
            }
        float acc[2][32];
        idx_wg_issue(acc, A, db);
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        swm_pin(acc[0]);
        swm_pin(acc[1]);
        float part[2][2] = { { 0, 0 }, { 0, 0 } };
#pragma unroll
        for (int jn = 0; jn < 8; jn++) {
            if (8 * jn >= nh) break;
            float w0 = ws[8 * jn + 2 * t], w1 = ws[8 * jn + 2 * t + 1];
#pragma unroll
            for (int mt = 0; mt < 2; mt++) idx_heads(part[mt], acc[mt] + 4 * jn, w0, w1);
        }
        float v = idx_quad(part, t);
        int key = s0 + 64 * (t >> 1) + 16 * wq + g + 8 * (t & 1);
        if (key < nvis) scores[(long long)blockIdx.y * ldsc + key] = v;
    }
#elif defined(__CUDA_ARCH__)
    __trap();   // built for sm_90a only (wgmma)
#endif
}

static_assert(dec_chan(0) == 0 && dec_chan(1) == 1 && dec_chan(2) == 32 && dec_chan(8) == 2 &&
                  dec_chan(16) == 4 && dec_chan(127) == 127,
              "dec_chan: lane t's channels 32t .. 32t+31");

bool cu_indexer_dec_fits(const dindexer &a)
{
    return cu_wgmma_ok() && cu_indexer_mma_fits(a.nheads, a.d) && a.keys.row_len == MMA_D &&
           a.keys.off % 16 == 0 && (a.keys.dtype == KV_FP8 || a.keys.dtype == KV_BF16);
}

void cu_indexer_dec(cudaStream_t st, const dindexer &a, int t0, int nt, float *scores,
                    long long ldsc, const dindexer *segs)
{
    int dev = 0, sms = 132, per_sm = 1;
    if (cudaGetDevice(&dev) == cudaSuccess)
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, indexer_wgmma_dec_kernel, 128, DEC_SMEM);
    int per_grid = sms * (per_sm > 0 ? per_sm : 1);
    int chunks = (int)blocks_for(a.pos_end / a.ratio, DEC_KEYS), per_row = per_grid / nt;
    dim3 grid(chunks < per_row ? chunks : per_row > 1 ? per_row : 1, nt);
    cu_launch(indexer_wgmma_dec_kernel, grid, 128, DEC_SMEM, st, a, t0, (float)pow(a.d, -0.5),
              scores, ldsc, segs);
}

void cu_indexer_mma(cudaStream_t st, const dindexer &a, int t0, int nt, float *scores,
                    long long ldsc, uint16_t *kt, int ktile, enum cuda_indexer_kernel kernel)
{
    bool f8 = (kernel == CUDA_INDEXER_WGMMA_FP8 || kernel == CUDA_INDEXER_WGMMA_FP8_K128) &&
              cu_wgmma_ok();
    bool wgmma = f8 || (kernel == CUDA_INDEXER_WGMMA && cu_wgmma_ok());
    int maxvis = (a.pos0 + a.n) / a.ratio;
    float smul = (float)pow(a.d, -0.5);
    // the queries of the rows, bf16, after the key tile: as they are for
    // mma.sync, as images of the stages (with the weights) for wgmma;
    // F8: the tile's codes, then its scales, the images (e4m3) after them
    uint16_t *qb = kt + (size_t)ktile * a.d;
    const float *q = a.q + (long long)t0 * a.nheads * a.d;
    float *ksc = (float *)((uint8_t *)kt + (size_t)ktile * MMA_D);
    if (f8) {
        long long warps = (long long)nt * 64;
        cu_launch(indexer_qimage8_kernel, blocks_for(warps * 32, 256), 256, 0, st, q,
                  a.w + (long long)t0 * a.nheads, a.nheads, smul, warps, (uint8_t *)qb);
    } else if (wgmma) {
        long long units = (long long)nt * (WG_IMG / 16);
        cu_launch(indexer_qimage_kernel, blocks_for(units, 256), 256, 0, st, q,
                  a.w + (long long)t0 * a.nheads, a.nheads, smul, units, (uint4 *)qb);
    } else {
        long long n4 = (long long)nt * a.nheads * a.d / 4;
        cu_launch(indexer_qround_kernel, blocks_for(n4, 256), 256, 0, st, (const float4 *)q, n4,
                  (uint2 *)qb);
    }
    smem_attr<0>(indexer_mma_kernel, MMA_SMEM);
    smem_attr<1>(indexer_wgmma_kernel<false, 1>, WG_SMEM(WG_IMG));
    int f8p = kernel == CUDA_INDEXER_WGMMA_FP8_K128 ? 1 : 2;    // pairs of m64 key tiles
    for (int k0 = 0; k0 < maxvis; k0 += ktile) {
        int k1 = maxvis - k0 < ktile ? maxvis : k0 + ktile;
        dim3 grid(blocks_for(k1 - k0, WG_KEYS), blocks_for(nt, WG_QG));
        if (f8) {
            cu_launch(indexer_gather8_kernel, blocks_for((long long)(k1 - k0) * 32, 256), 256, 0,
                      st, a.keys, k0, k1, (uint32_t *)kt, ksc);
            grid.x = blocks_for(k1 - k0, WG_KEYS * f8p);
            cu_launch(f8p == 2 ? indexer_wgmma_kernel<true, 2> : indexer_wgmma_kernel<true, 1>,
                      grid, 128, WG_SMEM(WG8_IMG), st, a, t0, nt, k0, k1, (const uint8_t *)kt,
                      (const float *)ksc, (const uint8_t *)qb, scores, ldsc);
            continue;
        }
        cu_gather_bf16(st, a.keys, k0, k1, a.d, kt);
        if (wgmma)
            cu_launch(indexer_wgmma_kernel<false, 1>, grid, 128, WG_SMEM(WG_IMG), st, a, t0, nt, k0,
                      k1, (const uint8_t *)kt, (const float *)NULL, (const uint8_t *)qb, scores,
                      ldsc);
        else
            cu_launch(indexer_mma_kernel, dim3(blocks_for(k1 - k0, MMA_KEYS), blocks_for(nt, MMA_QG)),
                      32 * MMA_WARPS, MMA_SMEM, st, a, t0, nt, k0, k1, kt, qb, smul, scores, ldsc);
    }
}

// ---- C entry for tests ----

extern "C" int cuda_indexer_mma_scores(const indexer_args *a, float *scores, int ld, int chunk,
                                       int ktile, enum cuda_indexer_kernel kernel, char *err,
                                       size_t errlen)
{
    if (errlen) *err = 0;
    if (!cu_indexer_mma_fits(a->nheads, a->d)) {
        snprintf(err, errlen, "indexer_mma: %d heads of %d (needs d %d, heads a multiple of 8, "
                 "at most 64)", a->nheads, a->d, MMA_D);
        return -1;
    }
    int maxvis = (a->pos0 + a->n) / a->ratio;
    int nblk = maxvis > 0 ? (maxvis + a->keys.per_block - 1) / a->keys.per_block : 1;
    char **blocks = NULL;
    uint16_t *kt = NULL;
    cudaError_t e = cudaMalloc(&blocks, nblk * sizeof(char *));
    if (e == cudaSuccess)
        e = cudaMalloc(&kt, ((size_t)ktile + (size_t)chunk * CU_INDEXER_QROWS) * a->d *
                                    sizeof(uint16_t));
    if (e == cudaSuccess)
        e = cudaMemcpy(blocks, a->keys.blocks, nblk * sizeof(char *), cudaMemcpyHostToDevice);
    dindexer d = { a->n, a->pos0, a->ratio, a->nheads, a->d, a->topk, a->q, a->w,
                   { blocks, (long long)a->keys.off, a->keys.per_block, a->keys.row_len,
                     (int)a->keys.dtype },
                   a->sel, a->nsel, a->pos0 + a->n, NULL };
    if (kernel == CUDA_INDEXER_DECODE && !cu_indexer_dec_fits(d)) {
        snprintf(err, errlen, "indexer_mma: the decode kernel takes FP8 or bf16 keys on sm_90a");
        e = cudaErrorInvalidValue;
    }
    for (int t0 = 0; t0 < a->n && e == cudaSuccess; t0 += chunk) {
        int nt = a->n - t0 < chunk ? a->n - t0 : chunk;
        if (kernel == CUDA_INDEXER_DECODE)
            cu_indexer_dec(0, d, t0, nt, scores + (size_t)t0 * ld, ld, NULL);
        else
            cu_indexer_mma(0, d, t0, nt, scores + (size_t)t0 * ld, ld, kt, ktile, kernel);
    }
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e == cudaSuccess) e = cudaGetLastError();
    cudaFree(blocks);
    cudaFree(kt);
    if (e != cudaSuccess) {
        if (errlen && !*err) snprintf(err, errlen, "indexer_mma: %s", cudaGetErrorString(e));
        return -1;
    }
    return 0;
}
