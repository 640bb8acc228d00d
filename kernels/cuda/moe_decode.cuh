// The MoE of a decode step (T <= 8 tokens) in four launches: the gate's
// GEMV (cu_matmul), then cu_moe_decode's routing, up and down (matmul.cu;
// with mma_s, up and down on tensor cores: moe_decode_mma.cu).
// Also the router's choice for one token on one warp, shared by the
// router kernel (ops.cu) and the up kernel's prologue (where routing is
// not a launch of its own), so both choose the same experts with the
// same weights.  A header of its own: only the files that use it
// recompile.
#pragma once
#include "kernels.cuh"

#define TOPK_MAX 16

__device__ __forceinline__ float route_act(float x, int sigmoid)
{
    return sigmoid ? 1.0f / (1.0f + expf(-x)) : sqrtf(x > 20.0f ? x : log1pf(expf(x)));
}

// The warp's best (value bv, expert be; be < 0: none) over its lanes':
// larger first, ties to the lower expert.  Every lane gets it.
__device__ __forceinline__ void route_best(float &bv, int &be)
{
    for (int o = 16; o; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oe = __shfl_xor_sync(0xffffffffu, be, o);
        if (oe >= 0 && (be < 0 || ov > bv || (ov == bv && oe < be))) bv = ov, be = oe;
    }
}

// wt[k] = the chosen activations acts[k] normalized (summed in k order),
// times rscale.
__device__ __forceinline__ void route_weights(const float (&acts)[TOPK_MAX], int K, float rscale,
                                              float (&wt)[TOPK_MAX])
{
    float sum = 0;
#pragma unroll
    for (int k = 0; k < TOPK_MAX; k++)
        if (k < K) sum += acts[k];
#pragma unroll
    for (int k = 0; k < TOPK_MAX; k++)
        if (k < K) wt[k] = acts[k] / (sum + 1e-20f) * rscale;
}

// The router's outputs for one token, by a warp: lane k stores choice k
// (idx) and its place in ascending expert order (order: ties in k order,
// moe_combine_kernel's summation order), lane 0 the weights w (wt).
__device__ __forceinline__ void route_store(const int (&sel)[TOPK_MAX],
                                            const float (&w)[TOPK_MAX], int K, int *idx,
                                            float *wt, int *order)
{
    int lane = threadIdx.x & 31, mine = 0, rank = 0;
#pragma unroll
    for (int k = 0; k < TOPK_MAX; k++)
        if (k < K && k == lane) mine = sel[k];
#pragma unroll
    for (int j = 0; j < TOPK_MAX; j++)
        if (j < K) rank += sel[j] < mine || (sel[j] == mine && j < lane);
    if (lane < K) {
        idx[lane] = mine;
        order[rank] = lane;
    }
    if (lane == 0)
#pragma unroll
        for (int k = 0; k < TOPK_MAX; k++)
            if (k < K) wt[k] = w[k];
}

// Token scores sc[E] -> its K experts sel[] (every lane gets them) and,
// on lane 0 when want_wt, their weights wt[] (the chosen scores
// normalized, times rscale).  Scored: the activations once into act and
// the biased scores into val (2 E floats of shared memory, taken: E
// bytes), then K rounds of arg-max over them (larger first, ties to the
// lower expert), each lane's candidates loaded ROUTE_U at a time before
// they are compared in expert order (the loads' latencies overlap: one
// LDS after another was most of a round); hashed (tid2eid): the table's
// row id.
#define ROUTE_U 8
__device__ __forceinline__ void route_warp(const float *sc, int E, int K, int sigmoid,
                                           const float *bias, const void *tid2eid, int tid_i64,
                                           int id, float rscale, float *act, float *val,
                                           unsigned char *taken, int (&sel)[TOPK_MAX],
                                           bool want_wt, float (&wt)[TOPK_MAX])
{
    int lane = threadIdx.x & 31;
    if (tid2eid) {
        for (int k = 0; k < K; k++)
            sel[k] = tid_i64 ? (int)((const long long *)tid2eid)[(long long)id * K + k]
                             : ((const int *)tid2eid)[(long long)id * K + k];
    } else {
        // (batched's one value a load would leave the bias loads behind
        // the shared stores, which the compiler cannot move them past)
        for (int e0 = lane; e0 < E; e0 += 32 * ROUTE_U) {
            float x[ROUTE_U], b[ROUTE_U];
#pragma unroll
            for (int u = 0; u < ROUTE_U; u++) {
                int e = e0 + 32 * u;
                x[u] = e < E ? sc[e] : 0.0f;
                b[u] = e < E ? bias[e] : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < ROUTE_U; u++) {
                int e = e0 + 32 * u;
                if (e >= E) break;
                float v = route_act(x[u], sigmoid);
                act[e] = v, val[e] = v + b[u], taken[e] = 0;
            }
        }
        __syncwarp();
        for (int k = 0; k < K; k++) {
            float bv = 0;
            int be = -1;
            for (int e0 = lane; e0 < E; e0 += 32 * ROUTE_U) {
                float v[ROUTE_U];
                bool tk[ROUTE_U];
#pragma unroll
                for (int u = 0; u < ROUTE_U; u++) {
                    int e = e0 + 32 * u;
                    tk[u] = e >= E || taken[e];
                    v[u] = e < E ? val[e] : 0.0f;
                }
#pragma unroll
                for (int u = 0; u < ROUTE_U; u++) {
                    int e = e0 + 32 * u;
                    if (!tk[u] && (be < 0 || v[u] > bv || (v[u] == bv && e < be)))
                        bv = v[u], be = e;
                }
            }
            route_best(bv, be);
            sel[k] = be;
            if (lane == 0 && be >= 0) taken[be] = 1;
            __syncwarp();
        }
    }
    if (!want_wt) return;
    // lane k scores choice k (the loads and activations side by side, not
    // one after another on lane 0), lane 0 sums them in k order
    int mine = 0;
#pragma unroll
    for (int k = 0; k < TOPK_MAX; k++)
        if (k < K && k == lane) mine = sel[k];
    float a = lane < K ? (tid2eid ? route_act(sc[mine], sigmoid) : act[mine]) : 0.0f;
    float acts[TOPK_MAX];
#pragma unroll
    for (int k = 0; k < TOPK_MAX; k++) acts[k] = __shfl_sync(0xffffffffu, a, k);
    if (lane) return;
    route_weights(acts, K, rscale, wt);
}

// route_warp for E <= 32 ROUTE_U scored experts (not hashed) with its
// state in registers, its outputs stored by the lanes (route_kernel's
// default; LLM_CUDA_ROUTE_REGS=0 compares): lane l's candidates l + 32 u,
// u < ROUTE_U, the chosen ones a bit mask; choice k is kept by lane k
// (mine), which also finds its activation, its rank in ascending expert
// order and its weight.  The same activations, comparisons and sums in
// the same order as route_warp and route_weights (inside a lane e grows
// with u, so an equal value never displaces an earlier one, as
// route_warp's e < be test; the weights' sum in k order from 0), so the
// same choices and weights.  Its loops over the K rounds and choices are
// not unrolled: unrolled to TOPK_MAX its code was ~98 KB, read afresh by
// each of a step's SMs once a layer (run N3 had counted ~250
// instructions a round in route_warp, the shared-memory form).
__device__ __forceinline__ void route_warp_regs(const float *sc, int E, int K, int sigmoid,
                                                const float *bias, float rscale, int *idx,
                                                float *wt, int *order)
{
    int lane = threadIdx.x & 31, mine = 0;
    float act[ROUTE_U], val[ROUTE_U];
    unsigned taken = 0;     // bit u: candidate u chosen, or past E
#pragma unroll
    for (int u = 0; u < ROUTE_U; u++) {
        int e = lane + 32 * u;
        float x = e < E ? sc[e] : 0.0f, b = e < E ? bias[e] : 0.0f;
        act[u] = route_act(x, sigmoid);
        val[u] = act[u] + b;
        if (e >= E) taken |= 1u << u;
    }
#pragma unroll 1
    for (int k = 0; k < K; k++) {
        float bv = 0;
        int be = -1;
#pragma unroll
        for (int u = 0; u < ROUTE_U; u++)
            if (!(taken >> u & 1) && (be < 0 || val[u] > bv)) bv = val[u], be = lane + 32 * u;
        route_best(bv, be);
        if (lane == k) mine = be;
        if (be >= 0 && (be & 31) == lane) taken |= 1u << (be >> 5);
    }
    // choice k's activation from its lane (each u's value from the owner
    // lane, the one for mine's u kept: no indexed registers)
    float a = 0;
#pragma unroll
    for (int u = 0; u < ROUTE_U; u++) {
        float v = __shfl_sync(0xffffffffu, act[u], mine & 31);
        if (u == mine >> 5) a = v;
    }
    float sum = 0;
    int rank = 0;
#pragma unroll 1
    for (int j = 0; j < K; j++) {
        sum += __shfl_sync(0xffffffffu, a, j);
        int sj = __shfl_sync(0xffffffffu, mine, j);
        rank += sj < mine || (sj == mine && j < lane);
    }
    if (lane < K) {
        idx[lane] = mine;
        order[rank] = lane;
        wt[lane] = a / (sum + 1e-20f) * rscale;
    }
}

// The fused decode MoE after the gate's GEMV wrote scores [T][E]:
//   up:   blocks (rows, slot) for the T*K routed slots and T shared-expert
//         slots in one grid; a routed block first routes its token
//         (route_warp; the first block of a token's first slot stores
//         idx and wt [T][K]) -- or, given order, reads idx, which
//         route_kernel stored in a launch before -- then g[slot] =
//         SwiGLU(x . w1_e, x . w3_e), a shared block sg[t] = SwiGLU(x .
//         s1, x . s3);
//   down: blocks (rows, token): out[t] = (sum over the token's K slots of
//         wt * (g[slot] . w2_e), one dot product over K * I columns) +
//         (sg[t] . s2) -- the routed sum first, then the shared expert
//         added, as cu_gemv_combine with add.
// False (nothing launched): not this path's formats or shapes (MXFP4
// experts with an FP8 shared expert, T <= 8, K <= 16, with the routing
// in the up kernel E <= 3640 scores in its shared memory, w1 / w3 and s1
// / s3 of one layout, w2 and s2 of H rows); the caller then routes and
// runs the separate GEMVs.
struct cu_moe_dec {
    int T, K, E;
    dqw w1, w3, w2, s1, s3, s2;     // experts (packed, estride apart), shared expert
    const float *x, *scores, *bias; // x [T][x_ld]; bias NULL when hashed
    int x_ld;
    const void *tid2eid;            // hashed layer: [vocab][K] experts, ids [T] the tokens
    bool tid_i64, sigmoid;
    const int *ids;
    float rscale, limit;
    int *idx;                       // [T][K] experts chosen
    float *wt;                      // [T][K] their weights
    float *g, *sg;                  // [T*K][w1.rows], [T][s1.rows] (16-byte aligned)
    float *out;                     // [T][w2.rows]
    int *order;                     // [T][K] scratch: not NULL, the routing in a launch
                                    // of its own first (route_kernel), not in up's blocks
    int mma_s;                      // with order: > 0, up and down on tensor cores
                                    // (moe_decode_mma.cu; S = mma_s warps a row group of up)
    bool route_regs;                // route_kernel's register form where it applies
    bool routed;                    // idx, wt and order filled (cu_hc_pre_norm_route)
};
bool cu_moe_decode(cudaStream_t st, const cu_moe_dec &m);
// cu_moe_decode's up and down after route_kernel on tensor cores (x and g
// in two bf16 parts, as the expert tiles): false, nothing launched, where
// the views or the sizes do not suit it (the caller runs matmul.cu's).
bool cu_moe_decode_mma(cudaStream_t st, const cu_moe_dec &m);
