// Launchers of the CUDA kernels (host functions, C++), used by the
// backend's files (backend_cuda.cu, cuda_gemm.cu).  Every pointer is
// device memory unless it says host; every launch goes to stream `st`
// (through cu_launch, common.cuh) and skips empty grids.  Each kernel
// computes what the CPU backend op of the same name computes
// (kernels/cpu/backend_cpu.c), in float32.
#pragma once

#include "common.cuh"
#include "cuda/indexer_mma.h"

// ---- matmul.cu ----
// y[t][0..w.rows) = x[t] . W^T for T tokens: up to CU_GEMV_MAX_T (decode
// batches) the GEMV kernel, blocks of up to 8 tokens (cu_gemv_tokens; the
// weights read once per block of tokens, all but once from L2), else 64 x 64
// float32 tiles.
#define CU_GEMV_MAX_T 64
// Tokens a GEMV block takes at most for steps of up to 8 (1, 2, 4 or 8;
// the backend sets it, LLM_CUDA_GEMV_TOKENS): more tokens run as blocks
// of that many, a row group's blocks back to back, so all but the first
// read its weights from L2 (9-64 tokens: blocks of 8).
extern int cu_gemv_tokens;
// Rows a warp of one token's dense GEMV takes (2, 4 or 8; the backend
// sets it, LLM_CUDA_GEMV_ROWS: comparisons).
extern int cu_gemv_rows;
// Multiprocessors of the current device (launch plans).
int cu_sm_count();
void cu_matmul(cudaStream_t st, const dqw &w, const float *x, int ldx, int T, float *y, int ldy);
// ---- matmul_mma.cu ----
// y[t][0..w.rows) = x[t] . W^T for T <= 64 tokens (decode batches) on
// tensor cores, FP8 or BF16 weights read once: x in two bf16 parts
// (split: hi = bf16(x), lo = bf16(x - hi)) or, at T > 48, rounded once;
// weights exact in bf16, float32 sums in a fixed order.  false: nothing
// launched (another format, a view whose columns or rows do not start on
// 16 bytes, a shape the plan has no room for, a cluster that cannot run;
// with `measured`, a plan unlike those run SM2 measured faster than the
// GEMV: up to 32 tokens, blocks of at least 256 columns).
bool cu_matmul_mma(cudaStream_t st, const dqw &w, const float *x, int ldx, int T, float *y,
                   int ldy, bool split, bool measured);
// ---- matmul_stream.cu ----
// The same products (split, or unsplit at 57-64 tokens) with x streamed
// through the pipeline beside the weights, so a block's columns are not
// bounded by shared memory and the plan fills the GPU at 17-64 tokens.
// false: nothing launched (as cu_matmul_mma).
bool cu_matmul_stream(cudaStream_t st, const dqw &w, const float *x, int ldx, int T, float *y,
                      int ldy, bool split);
// ---- matmul_wgmma.cu ----
// The same products on Hopper's wgmma (x as B from shared memory, in the
// order of its two parts or rounded once), x streamed as above: up to 64
// tokens, in blocks of wg warpgroups (1 or 2; 0: the plan's choice).
// false: nothing launched (not an sm_90 device, or as above).
bool cu_matmul_wgmma(cudaStream_t st, const dqw &w, const float *x, int ldx, int T, float *y,
                     int ldy, bool split, int wg);
bool cu_wgmma_ok();     // the device runs the sm_90a kernels (wgmma)
// The routed experts of decode batches on cu_matmul_mma's kernel: cu_gemv_tiles'
// products (below: moe_sort's tiles of tile_m <= 8 slots, w3 NULL or
// SwiGLU with w3, perm / xdiv / scatter alike) for MXFP4 experts, each
// tile's expert read once for its slots (padded to 8 tokens as N), x split
// in two bf16 parts or (split false: x exact in bf16) taken as it is,
// float32 sums.  est_tiles: about how many tiles *ntiles will hold, and
// per_sm (1 or 2) the blocks an SM (the plan); l2: the weights in
// 128-byte lines and the scales through shared memory where the view
// allows (smm_l2_ok; else the copies of 64 bytes a row).  false: nothing launched
// (not MXFP4, a view not on 32-column boundaries, w1 and w3 of different
// shapes, a cluster that cannot run).
bool cu_moe_tiles_mma(cudaStream_t st, const dqw &w, const dqw *w3, const int4 *tiles,
                      const int *ntiles, int max_tiles, int tile_m, int est_tiles, const int *perm,
                      bool scatter, const float *x, int ldx, int xdiv, float limit, float *y,
                      int ldy, bool split, int per_sm, bool l2);
// The view (nexp packed experts from w.data on) dequantized into [rows][ldo]
// matrices one after another, float32 or bf16 (ldo a multiple of 8 >= cols,
// columns past cols zero).  Exact: every stored format is a float32 value
// times a power of two, and FP8 / E2M1 / BF16 values fit bf16's 8
// significant bits (short of scales below 2^-133).
void cu_dequant(cudaStream_t st, const dqw &w, int nexp, bool bf16, void *out, long long ldo);
// out[t][p * lo + k] for p < parts (1 to 3): x[t or rows[t] / div][k]
// rounded to bf16 (nearest even), then each rest after the parts before
// it, rounded (three parts hold a float32 exactly, short of values below
// 2^-110).
void cu_round_bf16(cudaStream_t st, const float *x, int ldx, const int *rows, int div, int T,
                   int K, uint16_t *out, int ldo, int lo, int parts);
// y[t][n] = c[t * parts][n] + c[t * parts + 1][n] + ... (rows of N floats,
// added in part order): the products of x's parts as one GEMM's columns.
void cu_sum_parts(cudaStream_t st, const float *c, int N, int T, int parts, float *y, int ldy);
// The same, the N columns cut into n <= CU_SEG_MAX segments (a joined
// GEMM's matrices): segment s, columns [end[s - 1], end[s]), into y[s].
// Its kernel indexes this struct, a kernel parameter, by a computed
// segment.  Mind its layout: without `n` first (fa3f8be) ptxas copied the
// whole struct to a 128-byte stack frame in every thread (`nvcc -Xptxas
// -v`: "128 bytes stack frame"; as it is, 0), which made decode steps of
// 16-64 sequences 0.15-0.55 ms slower (runs K7-K9).
#define CU_SEG_MAX 8
struct cu_ysegs {
    int n, end[CU_SEG_MAX], ldy[CU_SEG_MAX];
    float *y[CU_SEG_MAX];
};
void cu_sum_parts_segs(cudaStream_t st, const float *c, int N, int T, int parts,
                       const cu_ysegs &s);
// y[i][n] = swiglu(x_i . w1[n], x_i . w3[n], limit) for the rows n of w1.
// experts NULL: i = tokens 0..T-1 (a few: the weights are read once per 8
// tokens), x_i = x[i]; else i = slots 0..T-1 with their own experts,
// experts[i], and x_i = x[i / xdiv].  false: w1 and w3 differ in shape or
// layout (nothing launched).
// y[i] = x[i] . W[i]^T for n <= CU_MULTI_MAX matrices of one format and
// width (T <= 8 tokens, rows of every x ldx apart, y[i]'s ldy[i] apart) in
// one GEMV launch; nw not NULL: x[i]'s rows RMS-normalized (weight nw,
// eps) on the way in, x unchanged.  false (nothing launched): not such a
// list, or with nw rows wider than one staged tile (8192 / tokens rounded
// up to 1, 2, 4, 8).
#define CU_MULTI_MAX 8
bool cu_matmul_multi(cudaStream_t st, int n, const dqw *w, const float *const *x, int ldx, int T,
                     float *const *y, const int *ldy, const float *nw, float eps);
bool cu_gemv_swiglu(cudaStream_t st, const dqw &w1, const dqw &w3, const int *experts,
                    const float *x, int ldx, int xdiv, int T, float limit, float *y, int ldy);
// y[t] = add[t] + sum over k < K of wt[t*K+k] * (x[t*K+k] . W[experts[t*K+k]]^T)
// for T tokens (add NULL: nothing added).  false: K > 16.
bool cu_gemv_combine(cudaStream_t st, const dqw &w, const int *experts, int K, const float *wt,
                     const float *x, int ldx, int T, const float *add, float *y, int ldy);
// Grouped by expert in tiles (moe_sort's table, tiles of tile_m slots):
// tile i holds slots perm[tiles[i].y ..+ tiles[i].z) of expert tiles[i].x.
#define CU_TILE_M 64
// The GEMV kernel over such tiles of tile_m = 1, 2, 4 or 8 slots (each
// expert's weights read once per tile; max_tiles bounds *ntiles): with w3,
// y[j] = swiglu(x_j . w1[e], x_j . w3[e], limit) for sorted position j
// and x_j = x[perm[j] / xdiv]; without, y[perm[j]] = x[j] . w1[e]^T when
// scatter (else y[j] = x[perm[j] / xdiv] . w1[e]^T).  false: w1 and w3
// differ in shape or layout, or tile_m is not one of those.
bool cu_gemv_tiles(cudaStream_t st, const dqw &w1, const dqw *w3, const int4 *tiles,
                   const int *ntiles, int max_tiles, int tile_m, const int *perm, bool scatter,
                   const float *x, int ldx, int xdiv, float limit, float *y, int ldy);

// ---- moe_gemm.cu ----
// The routed experts of a prefill step on tensor cores, one launch per
// matrix over moe_sort's tiles (blocks past *ntiles exit): for each
// sorted slot s (perm[s] its slot), y row = x row . W^T with W its
// expert's, x rounded to bf16 (split: in two bf16 parts, hi + lo), bf16
// products, float32 sums.  x row: x[perm[s] / xdiv], or x[s] when xdiv
// is 0; y row: y[perm[s]] when scatter, else y[s].  swiglu: W = w1 and
// y = swiglu1(x . w1, x . w3, limit) per output.
struct dmoe_gemm {
    dqw w1, w3;
    bool swiglu;
    float limit;
    const int4 *tiles;
    const int *ntiles, *perm;
    const float *x;
    int ldx, xdiv;
    float *y;
    int ldy;
    bool scatter;
    bool xvec, wvec;        // set by the launcher: 16-byte loads
};
// false: not MXFP4 weights, w1 and w3 of different shapes, or too many
// tiles (nothing launched).
bool cu_moe_gemm(cudaStream_t st, const dmoe_gemm &a, int max_tiles, bool split);

// ---- act_quant.cu ----
// DeepSeek's act_quant per row of x [T][K] (cpu/quant.h: e4m3 codes per
// 128 channels, UE8M0 scales, the same bytes as act_quant_fp8): codes
// q [T][ldq] and scales s[g * T + t]; or (round) out [T][ldo] = code * s
// as floats (out may be x).
void cu_act_quant_fp8(cudaStream_t st, const float *x, int ldx, int T, int K, uint8_t *q, int ldq,
                      float *s);
void cu_act_quant_round(cudaStream_t st, const float *x, int ldx, int T, int K, float *out,
                        int ldo);
// out[rb][cb] = 2^(scale[rb][cb] - 127) for nrb x ncb UE8M0 block scales
// (rows sld bytes apart), rows of out ldo >= ncb floats, zero past ncb.
void cu_fp8_wscales(cudaStream_t st, const uint8_t *scale, long long sld, int nrb, int ncb,
                    float *out, int ldo);

// ---- ops.cu ----
void cu_embed(cudaStream_t st, const dqw &w, const int *ids, int T, int copies, float *out);
void cu_rmsnorm(cudaStream_t st, const float *x, int ldx, int T, int n, const float *weight,
                float eps, float *out, int ldo);
void cu_rope(cudaStream_t st, float *x, int ld, int T, int nheads, int head_dim, const drope &rt,
             const int *pos, bool inverse);
void cu_scale(cudaStream_t st, float *x, int ld, int T, int n, float s);
// Hyper-connections in two steps.  The mix logits m [T][nmix] of the
// normalized streams (n = hc*H): cu_hc_logits, or (many tokens) the rms
// factors r [T] from cu_hc_rms with m = h . fn^T from a GEMM, scaled by r
// in the collapse.  Then cu_hc_collapse: the mix (Sinkhorn unless head),
// post, comb, and the collapsed streams.
void cu_hc_logits(cudaStream_t st, const float *h, int T, int n, const float *fn, int nmix,
                  float norm_eps, float *m);
// The same for many tokens: a block per 32 tokens and all nmix logits
// (fn read once per block).  false: n not a multiple of 64, h or fn not
// 16-byte aligned, or nmix > 32 (nothing launched).  Few token groups
// (under one an SM) also split the columns, given part (scratch of
// cu_hc_logits_many_part bytes, 8-byte aligned; NULL: no split) and count
// (HC_COUNT_MAX zeros, left zero).
#define HC_COUNT_MAX 256
size_t cu_hc_logits_many_part(int T, int n, int nmix);
bool cu_hc_logits_many(cudaStream_t st, const float *h, int T, int n, const float *fn, int nmix,
                       float norm_eps, float *m, void *part, int *count);
void cu_hc_rms(cudaStream_t st, const float *h, int T, int n, float norm_eps, float *r);
void cu_hc_collapse(cudaStream_t st, const float *h, int T, int hc, int H, const float *m,
                    const float *r, const float *base, const float *scale, int iters,
                    float hc_eps, float *post, float *comb, float *collapsed, bool head);
void cu_hc_post(cudaStream_t st, float *h, const float *y, const float *post, const float *comb,
                int T, int hc, int H);
// hc_pre (few tokens: cu_hc_logits then cu_hc_collapse) and the RMSNorm
// of the collapsed rows (weight nw or NULL) into out, in one launch; y not
// NULL: cu_hc_post(h, y, post, comb) first.  m: HC_FUSED_SCRATCH bytes of
// scratch (8-byte aligned), count [T] zeros (left zero).  false (nothing
// launched): hc > HC_FUSED_MAX (the Sinkhorn on one warp), T >
// HC_FUSED_MAX_T or H > 12K (the collapsed row in shared memory).  tail:
// the last block as ops.cu's hc_tail where it takes the shape (false:
// LLM_CUDA_HC_PRE_TAIL=0; the same results).  cluster (where
// cu_hc_pre_cluster_init said yes): hc = 4 with 16-byte rows and out in
// clusters of 16 blocks a token (ops.cu's hc_pre_cluster_kernel: no last
// block; sums in another order); LLM_CUDA_HC_PRE_CLUSTER=0 turns it off.
#define HC_FUSED_MAX 5
#define HC_FUSED_MAX_T 63
// Column slices per logit: about 128 blocks in all, at most 8.
#define HC_SPLITS(nmix, T) \
    ((nmix) * (T) >= 64 ? 1 : 128 / ((nmix) * (T)) < 8 ? 128 / ((nmix) * (T)) : 8)
// Bytes of the scratch m for T tokens.
#define HC_FUSED_SCRATCH(nmix, T) ((size_t)(T) * HC_SPLITS(nmix, T) * (8 + 4 * (size_t)(nmix)))
bool cu_hc_pre_norm(cudaStream_t st, float *h, const float *y, int T, int hc, int H,
                    const float *fn, const float *base, const float *scale, int iters,
                    float hc_eps, float norm_eps, const float *nw, void *m, int *count,
                    float *post, float *comb, float *collapsed, float *out, bool tail,
                    bool cluster);
// The model's last collapse for a few tokens (hc = 4, where the clusters
// run): hc_post with y (y not NULL), hc_head into collapsed and the final
// RMSNorm (weights nw) into out, in one launch of cu_hc_pre_norm's
// clusters.  false: nothing launched (shapes or alignments it does not
// take).
bool cu_hc_head_norm(cudaStream_t st, float *h, const float *y, int T, int hc, int H,
                     const float *fn, const float *base, const float *scale, float hc_eps,
                     float norm_eps, const float *nw, const float *post, const float *comb,
                     float *collapsed, float *out);
// Whether this device runs hc_pre_norm's clusters of 16 (non-portable);
// *route: also with the MoE router (cu_hc_pre_norm_route's shared memory).
bool cu_hc_pre_cluster_init(bool *route);
// The MoE router fused into hc_pre_norm's clusters (hc = 4): a bf16 gate
// [E][ld] (the view's origin applied) over the normed rows out.
struct cu_hc_route {
    const uint8_t *gate;
    long long ld;
    const float *bias;          // [E] or NULL
    int E, K, sigmoid;
    float rscale;
    float *sc;                  // [T][E] the scores
    int *idx, *order;           // [T][K] route_kernel's outputs
    float *wt;
};
// The shapes cu_hc_pre_norm_route takes: 1 or 2 tokens, H a multiple of
// 128 up to 4,096, E up to 256, K up to TOPK_MAX, 16-byte gate rows.
bool cu_hc_route_fits(int T, int H, const cu_hc_route &r);
// cu_hc_pre_norm's clusters (y, nw and the outputs as there), then each
// token's gate scores (a part from every block's columns, added by rank 0
// in rank order) and route_kernel's choices, weights and order from them
// (the same order of candidates: the same choices for the same scores).
// False, nothing launched: not cu_hc_route_fits, or rows not 16-byte
// aligned.
bool cu_hc_pre_norm_route(cudaStream_t st, float *h, const float *y, int T, int H,
                          const float *fn, const float *base, const float *scale, int iters,
                          float hc_eps, float norm_eps, const float *nw, float *post,
                          float *comb, float *collapsed, float *out, const cu_hc_route &r);
// The same for many tokens in two launches (T >= 64, hc 2 to 4): first
// cu_hc_post_logits, y not NULL: cu_hc_post(h, y, post, comb) with the
// logits m [T][(2 + hc) hc] of the new streams in one pass over them (y
// NULL: the logits of h, left as it is); then cu_hc_collapse_norm: per
// token the mix, post, comb, collapsed, and (out not NULL) its RMSNorm,
// over a second read of the streams (tail: decode batches as
// hc_pre_norm's hc_tail where the shape allows; the same results;
// collapsed NULL: not stored).  false (nothing launched): hc not 2
// to 4, H not a multiple of 4 or over 12K (the collapsed row in shared
// memory), h or y not 16-byte aligned.  part and count as
// cu_hc_logits_many's, over S column slices (cu_hc_post_logits_slices:
// of at least per chunks; part of cu_hc_post_logits_part bytes; part
// NULL: one), except that count NULL leaves the S > 1 slices' sums in
// part, unadded, for cu_hc_collapse_norm given part and S (each of its
// blocks adds its token's, in the same order: the same logits), where
// they fit its shared memory (cu_hc_slices_later); part NULL: the
// logits from m.
int cu_hc_post_logits_slices(int T, int H, int per);
size_t cu_hc_post_logits_part(int T, int hc, int S);
bool cu_hc_post_logits(cudaStream_t st, float *h, const float *y, int T, int hc, int H,
                       const float *fn, const float *post, const float *comb, float norm_eps,
                       float *m, void *part, int S, int *count);
bool cu_hc_slices_later(int S, int hc, int H);
void cu_hc_collapse_norm(cudaStream_t st, const float *h, int T, int hc, int H, const float *m,
                         const void *part, int S, const float *base, const float *scale,
                         int iters, float hc_eps, float norm_eps, const float *nw, float *post,
                         float *comb, float *collapsed, float *out, bool tail);
// qk_args (backend.h) for T tokens at device positions pos: q and kv
// normalized and rotated, kv rounded to dtype; qi (NULL: none) rotated and
// iw [T][inh] scaled.  Heads of at most CU_QK_MAX_HD channels.
#define CU_QK_MAX_HD 4096
void cu_qk_prep(cudaStream_t st, int T, float *q, int nh, int hd, float *kv, const float *kv_norm,
                float eps, const drope &rt, int dtype, float *qi, int inh, int ihd,
                const drope &irt, float *iw, float iw_scale, const int *pos);
// Store the chunk's last min(n, window) keys in the ring (a region of
// `window` rows stored as t).  dyn: pos0 and ring from device memory
// (graph replay), or NULL.
void cu_ring_store(cudaStream_t st, char *ring, int t, int window, int head_dim, const float *kv,
                   int n, int pos0, const dstep *dyn);
// The same for nseg sequences of one new key each, in one launch.
struct dring {
    char *ring;
    const float *kv;        // the key, [head_dim]
    int pos0;
    const dstep *dyn;       // pos0 and ring, or NULL
};
void cu_ring_store_batch(cudaStream_t st, const dring *segs, int nseg, int t, int window,
                         int head_dim);
// x[r][0..n) = the values the cache stores as t, for T rows of stride ld.
void cu_kv_round(cudaStream_t st, float *x, int ld, int T, int n, int t);
void cu_swiglu(cudaStream_t st, float *g, const float *u, long long n, float limit);
// Router: scores [T][E] logits in, per token the chosen experts idx[T][K],
// weights wt[T][K] and order[T][K] (the k's by ascending expert id).
// regs: its warp's state in registers where it applies (route_warp_regs,
// each lane storing its own choice; LLM_CUDA_ROUTE_REGS=0 compares).
void cu_moe_route(cudaStream_t st, const float *scores, int T, int E, int K, bool sigmoid,
                  const float *bias, const void *tid2eid, bool tid_i64, const int *ids,
                  float routed_scale, int *idx, float *wt, int *order,
                  bool regs);
// Slots (t*K + k) grouped by expert: perm, tiles of tile_m slots, and
// offs [E + 1]: where each expert's slots start in perm; with tiles2, a
// second table of the same slots in tiles of tile_m2.
void cu_moe_sort(cudaStream_t st, const int *idx, int nslots, int E, int *perm, int4 *tiles,
                 int *ntiles, int *offs, int tile_m = CU_TILE_M, int4 *tiles2 = NULL,
                 int *ntiles2 = NULL, int tile_m2 = 0);
// dst[i] = src[map[i] / div] (rows of H floats), and dst[map[i]] = src[i].
void cu_rows_gather(cudaStream_t st, const float *src, int H, const int *map, int div, int n,
                    float *dst);
void cu_rows_scatter(cudaStream_t st, const float *src, int H, const int *map, int n, float *dst);
// Row r of part[rows][nv]'s largest value (NaN skipped) and its lowest
// column j as keys (ops.cu's argmax_key; 0: nothing above -inf), one a
// slice of the row: keys[r][cu_row_argmax_slices(rows, nv)], the row's
// the largest of them, for backend.h's row_argmax to take on the host
// (keys: pinned host memory the kernel writes, or device memory).
int cu_row_argmax_slices(int rows, int nv);
void cu_row_argmax(cudaStream_t st, const float *part, int rows, int nv,
                   unsigned long long *keys);
// out[t] = sum over k (ascending expert) ys[t*K+k] * wt + shared[t].
void cu_moe_combine(cudaStream_t st, const float *ys, const float *wt, const int *order, int T,
                    int K, int H, const float *shared, float *out);

// Random contents for synthetic weights: FILL_FP8 e4m3 codes of moderate
// size, FILL_BYTES random bytes (MXFP4 codes), FILL_CONST every byte
// `byte` (scales), FILL_BF16 / FILL_F32 uniform in +-amp.  bytes: a
// multiple of 4.
enum { FILL_FP8, FILL_BYTES, FILL_CONST, FILL_BF16, FILL_F32 };
void cu_fill(cudaStream_t st, void *p, size_t bytes, int kind, float amp, uint32_t byte,
             unsigned long long seed);

// ---- attention.cu ----
// Launch configurations depend on n and the ratio only; the windows a
// chunk completes are worked out on the device.
struct dcomp {
    int n, pos0, ratio, d, overlap, ld;
    const float *kv, *gate, *ape, *norm;
    float eps;
    float *state;
    dpaged out;
    const dstep *dyn;       // pos0 and state, or NULL
};
// Sequences batched into one launch (every op below): segs, NULL or nseg
// sequences' arguments in device memory, one new token each (decode
// steps); block (or block row) s works on segs[s].  `a` then gives the
// launch its shape: the fields the sequences share, n = nseg, pos_end
// their largest.
// fuse: one token a sequence (decode steps) in one launch
// (compress_step_kernel) instead of three.
void cu_compress(cudaStream_t st, const dcomp &a, const drope &rt, const dcomp *segs = NULL,
                 bool fuse = true);

// pos_end sizes the launches: pos0 + n, or a bound of it under graph replay.
struct dindexer {
    int n, pos0, ratio, nheads, d, topk;
    const float *q, *w;
    dpaged keys;
    int *sel, *nsel;
    int pos_end;
    const dstep *dyn;       // pos0, or NULL
};
// scores: scratch of at least chunk * ((pos0+n)/ratio) floats for some chunk >= 1.
// cand: scratch of cu_indexer_cand_bytes(a, scores_cap) bytes (none when
// 0) for the top-k over several blocks per token, or NULL: one block each.
// keys: NULL, scores in float32 (decode; LLM_CUDA_GEMM=f32); or scratch
// of (CU_INDEXER_KTILE + n * CU_INDEXER_QROWS) * d bf16 for the tensor-core scores
// (a key tile, then the queries; indexer_mma.cu;
// cu_indexer_mma_fits, not under graph capture: dyn must be NULL).
// tiled: float32 scores on indexer_scores_cpu_kernel (the CPU's scores,
// bit for bit) where it takes the shape (false: indexer_scores_kernel,
// LLM_CUDA_INDEXER_TILED=0).  mma: the tensor-core scores' kernel
// (cu_indexer_mma: wgmma, bf16 or e4m3, or mma.sync).  dec:
// without keys, the scores on tensor cores by cu_indexer_dec (its fits
// checked) rather than in float32.  topk_cluster: cu_indexer_topk's.
// mark: LLM_CUDA_PROFILE's spans (NULL: none), the scores' launches and
// the top-k's apart.
struct cu_mark {
    void (*fn)(void *ctx, const char *span);    // the launches so far are `span`
    void *ctx;
};
void cu_indexer(cudaStream_t st, const dindexer &a, float *scores, size_t scores_cap,
                unsigned *cand, uint16_t *keys, bool tiled, enum cuda_indexer_kernel mma,
                bool dec, int topk_cluster, const dindexer *segs = NULL,
                const cu_mark *mark = NULL);
size_t cu_indexer_cand_bytes(const dindexer &a, size_t scores_cap);

// ---- indexer_topk.cu ----
// A token of at least IDX_TOPK_MULTI_MIN visible entries, in a launch of
// at most IDX_TOPK_MULTI_MAX_T rows (decode: fewer blocks than SMs, one a
// token), takes a cluster of blocks for its top-k (cluster > 1: up to
// that many, one launch), or floor(sqrt(nvis / topk)) blocks, then one.
#define IDX_TOPK_MULTI_MIN 16384
#define IDX_TOPK_MULTI_MAX_T 64
// Candidates (unsigned) per row that launches of `rows` rows with tokens
// of up to maxvis entries use: 0 when none spreads over blocks.
long long cu_indexer_topk_ld(int maxvis, int topk, int rows);
// The chosen entries of rows [t0, t0+nt) of the step (sequences t0.. of
// segs: segs points at the first), scores row r - t0 at r * ldsc; cand
// (NULL: one block per token) nt * ldc unsigned, ldc from
// cu_indexer_topk_ld; none needed where a cluster takes the rows.
void cu_indexer_topk(cudaStream_t st, const dindexer &a, int t0, int nt, const float *scores,
                     long long ldsc, unsigned *cand, long long ldc, const dindexer *segs,
                     int cluster);
// The most blocks a top-k cluster can have on this device (16, 8, ..., 0:
// none).
int cu_indexer_topk_cluster_max();

// ---- indexer_mma.cu ----
// Rows [k0, k1) of a paged cache (any kv dtype; d a multiple of 4) as
// contiguous bf16 rows of d at out (row k - k0): FP8 and BF16 exactly.
void cu_gather_bf16(cudaStream_t st, const dpaged &keys, int k0, int k1, int d, uint16_t *out);
// Keys gathered per tile of at most this many entries (bf16 scratch).
#define CU_INDEXER_KTILE 32768
// A token's rows (d bf16 each) in that scratch: its heads' queries (at
// most 64, cu_indexer_mma_fits) padded to 64, as the wgmma kernel's
// stages hold them, then one row's room for the 64 heads' float weights.
#define CU_INDEXER_QROWS 65
bool cu_indexer_mma_fits(int nheads, int d);
// Scores rows [t0, t0+nt) of the step (row i - t0 of scores, stride
// ldsc) of tokens that see more than topk entries, keys gathered into kt
// (ktile * d bf16) tile by tile, the rows' queries rounded to bf16 after
// them (nt * CU_INDEXER_QROWS * d more), by `kernel` (not the decode
// one; wgmma, bf16 or e4m3, where the device has it, else mma.sync).
void cu_indexer_mma(cudaStream_t st, const dindexer &a, int t0, int nt, float *scores,
                    long long ldsc, uint16_t *kt, int ktile, enum cuda_indexer_kernel kernel);
// The same scores for steps of few tokens (or segs, a batch of one-token
// sequences) with no gathered tile: keys read from the cache (FP8 or
// bf16 rows of 128, 16-byte aligned) on wgmma, the queries rounded to
// bf16 per block; dyn honoured.
bool cu_indexer_dec_fits(const dindexer &a);
void cu_indexer_dec(cudaStream_t st, const dindexer &a, int t0, int nt, float *scores,
                    long long ldsc, const dindexer *segs);

struct dattn {
    int n, pos0, nheads, hd, window;
    float scale;
    const float *q, *kv;
    const char *ring;
    int ring_t;             // the ring's storage (enum kv_dtype)
    const float *sinks;
    int ratio;
    dpaged comp;
    const int *sel, *nsel;
    int sel_ld;
    float *out;
    int pos_end;            // as dindexer's
    const dstep *dyn;       // pos0 and ring, or NULL
    // The model's ops after attention, fused: the output's RoPE channels
    // rotated back at the token's position (orope, device memory; NULL:
    // not; the decode kernels and attention_mma.cu's prefill launch), the
    // token's key stored into its ring slot (store_ring; the decode
    // kernels, one query token a sequence), and the prefill launch's
    // output in bf16 at obf (rows as out's; NULL: float32 at out), as the
    // GEMM that reads it would round it.
    const drope *orope;
    int store_ring;
    uint16_t *obf;
};
// The launch: heads per block, key splits (flash-decoding when > 1) and
// keys per split.
void cu_attention_plan(const dattn &a, int *hpb, int *splits, int *chunk);
// part: scratch of n * nheads * splits * (hd + 2) floats when the plan
// splits the keys.  Returns false when head_dim is too large for the kernel.
bool cu_attention(cudaStream_t st, const dattn &a, float *part, const dattn *segs = NULL);
// The same on tensor cores (attention_mma.cu: keys in BF16, queries and
// probabilities in BF16, or split in two BF16 parts when `split`; float32
// sums), for prefill chunks; `tokens` (1 or 2) query tokens per block
// share each key tile.  false: head_dim not 64, 128, 256 or 512.
bool cu_attention_mma(cudaStream_t st, const dattn &a, bool split, int tokens);
bool cu_attention_mma_fits(int hd);     // the head_dims it takes
// Decode steps on those tensor cores: a.n query tokens, or the a.n
// one-token sequences of segs, a block each, their keys split over blocks
// (the plan's) and merged by the last block of each token, or with
// `cluster` > 1 (LLM_CUDA_ATTN_CLUSTER) in clusters of up to that many
// blocks through distributed shared memory, then over the clusters by the
// last block of each channel slice (count: as cu_attention_decode's;
// part: n * nheads * splits * (hd + 2) floats when the plan splits).
// false: head_dim not 64, 128, 256 or 512.
bool cu_attention_mma_decode_fits(const dattn &a);
// target: blocks the plan aims at (attn_split_plan), ATTM_TARGET unless
// compared (LLM_CUDA_ATTM_BLOCKS): two an SM.
#define ATTM_TARGET 264
// The largest cluster (portable) and whether clusters of `cluster` blocks
// of the largest instantiation can run on this device.
#define CU_ATTM_MAX_CLUSTER 8
bool cu_attention_mma_cluster_runs(int cluster);
void cu_attention_mma_decode_plan(const dattn &a, int target, int cluster, int *splits,
                                  int *chunk);
bool cu_attention_mma_decode(cudaStream_t st, const dattn &a, int target, int cluster, bool split,
                             float *part, int *count, const dattn *segs = NULL);

// ---- attention_decode.cu ----
// Decode steps (at most CU_ATTD_MAX_T query tokens or one-token sequences,
// head_dim a multiple of 4 up to 512): the same float32 attention in one
// launch, the flash-decoding merge done by the last block of each (token,
// group of 4 heads).  count: CU_ATTD_COUNTERS zero-filled ints, left zero
// by every launch; part: n * nheads * splits * (hd + 2) floats when the
// plan splits the keys.
#define CU_ATTD_MAX_T 64
#define CU_ATTD_MAX_GROUPS 64
#define CU_ATTD_COUNTERS (CU_ATTD_MAX_T * CU_ATTD_MAX_GROUPS * CU_ATTM_MAX_CLUSTER)
bool cu_attention_decode_fits(const dattn &a);
// target: blocks the plan aims at (attn_split_plan), ATTD_TARGET unless
// compared: four an SM, not the two of attn_split_plan's default, since a
// block of this kernel stages and scores one or a few key tiles and its
// split's merge is short (run L4, rank6, batch 1 at 131K: 1.31-1.33 ms a
// token with 264 blocks, 1.29-1.30 with 528, 1.30-1.31 with 1,056,
// 1.34-1.35 with 132, 1.41 with 66; 8K and batches of 8 within noise
// from 264 to 1,056).
#define ATTD_TARGET 528
void cu_attention_decode_plan(const dattn &a, int target, int *splits, int *chunk);
void cu_attention_decode(cudaStream_t st, const dattn &a, int target, float *part, int *count,
                         const dattn *segs = NULL);

// ---- allreduce.cu ----
// Peer memory of every rank of one process's group: inboxes [2][tp][cap]
// floats and flags [2][AR_MAX_BLOCKS][AR_MAX_RANKS]; and this rank's
// per-block epoch counters [AR_MAX_BLOCKS]; all zero-filled at creation.
#define AR_MAX_RANKS 8
#define AR_MAX_BLOCKS 32
struct ar_peers {
    int rank, tp;
    size_t cap;                         // floats per inbox
    float *inbox[AR_MAX_RANKS];
    unsigned *flags[AR_MAX_RANKS];
    unsigned *epoch;
};
// buf[0..n) = the sum over the ranks (n <= cap, n % 4 == 0, buf 16-byte
// aligned); every rank of the group must call it with the same n.
void cu_allreduce_oneshot(cudaStream_t st, float *buf, size_t n, const ar_peers &P);
