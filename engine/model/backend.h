/* The seam between the model code (forward.c, shared by all backends) and
 * a backend that supplies memory and kernels.  The model code never reads
 * activation or cache memory itself: every touch goes through these ops,
 * so a CUDA backend can keep all of it on the device.  Host-side inputs
 * (token ids, positions, block pointers) are plain host arrays.
 *
 * One backend instance per tensor-parallel rank; ops on one instance are
 * called from that rank's thread only. */
#ifndef LLM_BACKEND_H
#define LLM_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend_modes.h"
#include "cpu/kv_quant.h"
#include "cpu/qweight.h"

/* The most mHC streams (config hc_mult) any backend takes: the CUDA
 * kernels keep a token's streams in registers and shared memory sized by
 * it, the CPU backend on its stack.  model_config refuses more at load,
 * so a config that loads runs on every backend. */
#define BACKEND_HC_MAX 16

/* RoPE frequencies (one table: "main" or "compress"): rotation of channel
 * pair i at position p is p * inv_freq[i]; cos and sin are multiplied by
 * attn_factor.  Applied to the last 2*npairs channels of each head. */
typedef struct {
    int npairs;
    const float *inv_freq;
    float attn_factor;
} rope_table;

/* Rows of one layer's compressed cache, spread over fixed-size blocks:
 * row i is row i % per_block of the region (cpu/kv_quant.h) of per_block
 * rows of `row_len` values stored as `dtype` at byte offset `off` of
 * blocks[i / per_block]. */
typedef struct {
    char *const *blocks;
    size_t off;
    int per_block;
    int row_len;
    enum kv_dtype dtype;
} paged_rows;

static inline char *paged_region(const paged_rows *p, int i)
{
    return p->blocks[i / p->per_block] + p->off;
}

static inline void paged_load(const paged_rows *p, int i, float *out)
{
    kv_load(p->dtype, paged_region(p, i), p->per_block, p->row_len, i % p->per_block, out);
}

static inline void paged_store(const paged_rows *p, int i, const float *x)
{
    kv_store(p->dtype, paged_region(p, i), p->per_block, p->row_len, i % p->per_block, x);
}

/* Compressor over one sequence's new tokens: fold each token's kv/gate
 * row into the window state; every completed window emits one entry
 * (softmax-gated sum, RMSNorm, RoPE at the window's first position). */
typedef struct {
    int n, pos0;            /* new tokens and the position of the first */
    int ratio, d;           /* window size and entry width */
    bool overlap;           /* CSA: rows are 2*d wide, [Ca | Cb] */
    const float *kv, *gate; /* [n][coff*d], row stride ld */
    int ld;
    const float *ape;       /* [ratio][coff*d] */
    const float *norm;      /* [d] */
    float eps;
    const rope_table *rope;
    float *state;           /* window rows (+ overlap rows), see kv_cache.c */
    paged_rows out;         /* entry i -> row i of out */
} compress_args;

/* Lightning indexer: for each new token choose the top-k visible
 * compressed entries by sum_h w_h * relu(q_h . k_s) * d^-0.5. */
typedef struct {
    int n, pos0, ratio;
    int nheads, d, topk;
    const float *q;         /* [n][nheads*d], RoPE applied */
    const float *w;         /* [n][nheads], already scaled */
    paged_rows keys;
    int32_t *sel;           /* [n][topk] out: chosen entries, ascending */
    int *nsel;              /* [n] out */
} indexer_args;

/* Attention of one sequence's new tokens over the sliding window (ring
 * plus this chunk's keys) and compressed entries, with per-head sinks.
 * The chunk's keys are float32 already rounded to the cache's dtype
 * (kv_round), so a key reads the same from the chunk or the ring. */
typedef struct {
    int n, pos0;
    int nheads, head_dim, window;
    float scale;
    const float *q;         /* [n][nheads*head_dim] */
    const float *kv;        /* [n][head_dim] this chunk's keys (= values) */
    const void *ring;       /* region of `window` rows: position p at row p % window */
    enum kv_dtype dtype;    /* the ring's storage (comp carries its own) */
    const float *sinks;     /* [nheads] */
    int ratio;              /* 0: no compressed entries */
    paged_rows comp;
    const int32_t *sel;     /* CSA: [n][sel_ld] chosen entries; NULL: all visible */
    const int *nsel;
    int sel_ld;
    float *out;             /* [n][nheads*head_dim] */
    /* Only as far as attention_fused said yes (its ATTN_FUSE_* bits):
     * after the attention, what the model's ops would do next — out's
     * RoPE channels rotated back at each token's position (rope with
     * out_rope, inverse; ATTN_FUSE_ROPE) and the chunk's keys stored into
     * the ring (ring_store; ATTN_FUSE_RING).  out_matmul
     * (ATTN_FUSE_MATMUL): out is read by nothing but the matmuls that take
     * it as x, before the next attention op, so the backend may hold it
     * in a form of its own that they read (out's floats are then
     * undefined). */
    const rope_table *out_rope;
    bool store_ring;
    bool out_matmul;
} attention_args;

enum { ATTN_FUSE_ROPE = 1, ATTN_FUSE_RING = 2, ATTN_FUSE_MATMUL = 4 };

/* One sequence's new keys for its ring (ring_store). */
typedef struct {
    void *ring;             /* region of `window` rows: position p at row p % window */
    const float *kv;        /* [n][head_dim] */
    int n, pos0;
} ring_args;

/* An attention layer's queries and key after their projections, in place
 * (T tokens at positions pos): q [T][nh*hd], an RMSNorm of each head
 * (no weight) then RoPE (rope); kv [T][hd], RMSNorm (kv_norm) then RoPE
 * (rope) then rounded to the cache's dtype (kv_round); when qi is not
 * NULL, the indexer's queries qi [T][inh*ihd] get RoPE (irope) and its
 * head weights iw [T][inh] are multiplied by iw_scale.  The ops rmsnorm,
 * rope, kv_round and scale in that order compute the same (the model runs
 * them where a backend has no qk_prep). */
typedef struct {
    int T;
    const int32_t *pos;
    float *q;
    int nh, hd;
    float *kv;
    const float *kv_norm;
    float eps;
    const rope_table *rope;
    enum kv_dtype dtype;
    float *qi;              /* NULL: no indexer */
    int inh, ihd;
    const rope_table *irope;
    float *iw;
    float iw_scale;
} qk_args;

/* Mixture of experts over T tokens (this rank's slice of every expert). */
typedef struct {
    int T, H;
    const float *x;         /* [T][H] */
    const int32_t *ids;     /* [T] token ids (hash routing) */
    const qweight *gate;    /* router [E][H] */
    const float *bias;      /* [E] or NULL */
    const void *tid2eid;    /* [vocab][topk] or NULL */
    bool tid_i64;
    int n_experts, topk;
    bool sigmoid_scores;    /* else sqrt(softplus) */
    float routed_scale, limit;
    const qweight *w1, *w2, *w3;    /* [E] */
    const qweight *sw1, *sw2, *sw3;
    float *out;             /* [T][H] */
    bool routed;            /* hc_pre_norm_route chose the experts of x already */
} moe_args;

/* The bound on pos0 + n that sizes an op under graph replay: a power of
 * two, at least 1024, so a decoding sequence changes it rarely. */
static inline int graph_pos_cap(int end)
{
    int c = 1024;
    while (c < end && c < (1 << 30)) c *= 2;
    return c;
}

typedef struct backend backend;
struct backend {
    const char *name;
    void *impl;

    void *(*alloc)(backend *b, size_t bytes);       /* zero-filled */
    void (*release)(backend *b, void *p);
    /* Copy `rows` rows of `n` floats between strided buffers. */
    void (*copy_rows)(backend *b, float *dst, int ldd, const float *src, int lds, int rows,
                      int n);
    /* Host <-> backend memory, `bytes` bytes (tests; staging). */
    void (*write)(backend *b, void *dst, const void *src, size_t bytes);
    void (*read)(backend *b, void *dst, const void *src, size_t bytes);

    /* Load time, on backends with memory of their own (NULL on the CPU,
     * which reads the mmap'd weights where they are).  upload_weights
     * copies n views of one shape (n > 1: a layer's experts, packed
     * together) in their stored precision and sets each w[i].dev (views
     * without host data, synthetic weights, get random values of their
     * format instead); upload returns a backend copy of a host array.
     * Both owned by the backend; -1 / NULL on failure (see error). */
    int (*upload_weights)(backend *b, qweight *w, int n);
    /* Optional (NULL: nothing to do): n uploaded matrices of one width
     * that matmuls will multiply by one x, in this order; the backend may
     * lay them out as one matrix.  0: joined; 1: left as they are (views,
     * formats or row lengths it cannot join); -1: failure (see error). */
    int (*join_weights)(backend *b, qweight *const *w, int n);
    void *(*upload)(backend *b, const void *host, size_t bytes);
    /* The first failure since creation, or NULL.  After one, outputs are
     * undefined: the step that saw it must be discarded. */
    const char *(*error)(backend *b);
    /* After a step that saw an error: true when it was a shortage of
     * scratch memory the backend has forgotten (the step is discarded,
     * the backend goes on); false, or NULL, when the backend is unusable. */
    bool (*recover)(backend *b);
    /* The prefix cache's host tier (NULL on the CPU backend, which uses
     * malloc'd memory and read/write).  host_alloc: host memory the
     * backend copies fastest (pinned), usable by every rank's backend
     * (NULL when it cannot be had); free it only when no copy of any rank
     * is in flight.  copy_async: `bytes` between backend memory and such
     * host memory, on a copy stream of the backend's own: after the ops
     * issued before it and the copies before it, without the host
     * waiting.  copy_fence: the ops issued after it wait (on the device)
     * for the copies issued before it; with `wait` the host waits for
     * them too. */
    void *(*host_alloc)(backend *b, size_t bytes);
    void (*host_free)(backend *b, void *p);
    void (*copy_async)(backend *b, void *dst, const void *src, size_t bytes, bool to_host);
    void (*copy_fence)(backend *b, bool wait);
    /* Free and total bytes of the backend's memory (NULL: not told). */
    void (*mem_info)(backend *b, size_t *free_bytes, size_t *total_bytes);

    /* y[t][0..w->rows) = x[t] . W^T */
    void (*matmul)(backend *b, const qweight *w, const float *x, int ldx, int T, float *y,
                   int ldy);
    /* Optional (NULL: one matmul each): y[i][t] = x[i][t] . W_i^T for n
     * matrices over the same T tokens, every x's rows ldx apart, y[i]'s
     * ldy[i].  norm_w not NULL: every x[i] is the same x, multiplied as
     * rmsnorm(x, norm_w, eps) (the rmsnorm op's values; x unchanged). */
    void (*matmuls)(backend *b, int n, const qweight *const *w, const float *const *x, int ldx,
                    int T, float *const *y, const int *ldy, const float *norm_w, float eps);
    /* out[t][k] = dequantized row ids[t] of w for k < copies (rows of
     * copies x cols: the mHC's streams start as copies of the embedding) */
    void (*embed)(backend *b, const qweight *w, const int32_t *ids, int T, int copies,
                  float *out);
    /* RMSNorm of T rows of n: out = weight * (x / rms); weight NULL: none.
     * In place is fine. */
    void (*rmsnorm)(backend *b, const float *x, int ldx, int T, int n, const float *weight,
                    float eps, float *out, int ldo);
    /* RoPE on T rows of nheads heads of head_dim; inverse rotates back. */
    void (*rope)(backend *b, float *x, int ld, int T, int nheads, int head_dim,
                 const rope_table *rt, const int32_t *pos, bool inverse);
    /* x[t][i] *= s */
    void (*scale)(backend *b, float *x, int ld, int T, int n, float s);

    /* Hyper-connection collapse: streams h [T][hc][H] -> post [T][hc],
     * comb [T][hc][hc] (Sinkhorn), collapsed [T][H]. */
    void (*hc_pre)(backend *b, const float *h, int T, int hc, int H, const float *fn,
                   const float *base, const float *scale, int iters, float hc_eps,
                   float norm_eps, float *post, float *comb, float *collapsed);
    /* h[k] = post[k] * y + sum_j comb[j][k] * h[j] */
    void (*hc_post)(backend *b, float *h, const float *y, const float *post,
                    const float *comb, int T, int hc, int H);
    /* Optional (NULL: the model calls hc_post when y is not NULL, hc_pre,
     * then rmsnorm of collapsed into normed): with y, first the previous
     * sublayer's hc_post(h, y, post, comb); then hc_pre and the RMSNorm
     * (weight norm_w, eps norm_eps) of its collapsed rows, normed [T][H].
     * collapsed NULL: not wanted (hc_pre_norm_route's too). */
    void (*hc_pre_norm)(backend *b, float *h, const float *y, int T, int hc, int H,
                        const float *fn, const float *base, const float *scale, int iters,
                        float hc_eps, float norm_eps, float *post, float *comb,
                        float *collapsed, const float *norm_w, float *normed);
    /* Optional (NULL: none): hc_pre_norm, then the router of the moe op
     * a that follows it (a->x = normed), in fewer launches.  True: done
     * (that moe op, given a->routed, skips its gate and router: the
     * backend keeps the choices); false: nothing done (the caller runs
     * hc_pre_norm, and the moe op routes). */
    bool (*hc_pre_norm_route)(backend *b, float *h, const float *y, int T, int hc, int H,
                              const float *fn, const float *base, const float *scale, int iters,
                              float hc_eps, float norm_eps, float *post, float *comb,
                              float *collapsed, const float *norm_w, float *normed,
                              const moe_args *a);
    /* Final collapse with sigmoid weights (hc_head). */
    void (*hc_head)(backend *b, const float *h, int T, int hc, int H, const float *fn,
                    const float *base, const float *scale, float hc_eps, float norm_eps,
                    float *out);
    /* Optional (NULL: none): with y, first the last sublayer's
     * hc_post(h, y, post, comb); then hc_head into collapsed and the
     * final RMSNorm (weight norm_w) of every row into normed, in fewer
     * launches.  True: done; false: nothing done (the caller runs
     * hc_post, hc_head and rmsnorm). */
    bool (*hc_head_norm)(backend *b, float *h, const float *y, const float *post,
                         const float *comb, int T, int hc, int H, const float *fn,
                         const float *base, const float *scale, float hc_eps, float norm_eps,
                         float *collapsed, const float *norm_w, float *normed);

    /* compress, indexer, attention: the arguments of nseg sequences (an
     * array, one per sequence of the step, in the step's order; each
     * independent of the others), which a backend may run together. */
    void (*compress)(backend *b, const compress_args *a, int nseg);
    void (*indexer)(backend *b, const indexer_args *a, int nseg);
    void (*attention)(backend *b, const attention_args *a, int nseg);
    /* Optional (NULL: none): which of the ops after it attention of
     * these arguments would also take (ATTN_FUSE_* bits: attention_args'
     * out_rope, store_ring, out_matmul), so that the model asks for those
     * and skips them. */
    unsigned (*attention_fused)(backend *b, const attention_args *a, int nseg);
    /* Keep the last `window` keys of each of nseg sequences' chunks in
     * its ring (a region of `window` rows stored as t), as above. */
    void (*ring_store)(backend *b, const ring_args *a, int nseg, enum kv_dtype t, int window,
                       int head_dim);
    /* Round T rows of n floats to the values the cache stores as t (in
     * place; nothing for KV_F32). */
    void (*kv_round)(backend *b, float *x, int ld, int T, int n, enum kv_dtype t);
    void (*moe)(backend *b, const moe_args *a);
    /* Optional (NULL: the model runs the ops qk_args names). */
    void (*qk_prep)(backend *b, const qk_args *a);

    /* Collectives over the tensor-parallel group, as this backend's rank.
     * allreduce: buf[0..n) = sum over ranks.  gather_cols: put this rank's
     * [rows][nv] slice at column v0 of the host matrix out (row stride ldo). */
    void (*allreduce)(backend *b, float *buf, size_t n);
    void (*gather_cols)(backend *b, const float *part, int rows, int nv, float *out,
                        int ldo, int v0);
    /* The greedy choice in each of the rows of this rank's [rows][nv]
     * slice (columns v0.. of the whole), into host memory: val[r] the
     * row's largest value (NaN skipped; -inf when none is above -inf) and
     * idx[r] the lowest column v0 + j holding it (-1 when val[r] is -inf):
     * the sampler's greedy rule, before the ranks' results meet. */
    void (*row_argmax)(backend *b, const float *part, int rows, int nv, int v0, float *val,
                       int32_t *idx);
    /* Optional (NULL: none): row_argmax's device part, issued between
     * graph_begin and graph_end so that a replayed step holds it; the
     * row_argmax of the same rows after graph_end then only reads the
     * result. */
    void (*row_argmax_issue)(backend *b, const float *part, int rows, int nv);

    /* Replay of repeated steps (NULL: not supported).  The model brackets
     * a step's ops with graph_begin(key) and graph_end(), key naming
     * everything the ops' launches depend on besides the values that
     * change from step to step (positions, token ids, block addresses,
     * state slots).  The first time a key is seen the ops run as usual,
     * the second time they are captured, and after that each op only
     * records its changing values and graph_end replays the capture.
     * graph_end returns true when the ops did not run and must be called
     * again (then as usual).  Under a key, sizes that depend on positions
     * are taken for graph_pos_cap(pos0 + n).  graph_counts: captures and
     * replays so far.  graph_kernels (NULL: not counted): the kernel
     * launches in the graph captured last.  graph_time (NULL, or false:
     * not timed; CUDA: LLM_CUDA_GRAPH_TIME=1): the replays timed on the
     * device so far and their milliseconds there, from the copy of their
     * inputs to the graph's end (a step's device time, without the host's
     * part between steps). */
    void (*graph_begin)(backend *b, uint64_t key);
    bool (*graph_end)(backend *b);
    /* Optional (NULL: none): the next decode step walked ahead while this
     * one runs.  graph_prepare(key) (false: not now, nothing done; key's
     * graph must have been captured) starts a walk whose ops record their
     * values as for a replay, into inputs of their own, and
     * graph_prepared(ids) ends it (false: it cannot be launched), ids
     * being the host array the walk gave as the step's token ids.  Then
     * graph_launch_prepared(key, ids, bytes), in place of the step's
     * graph_begin .. graph_end, launches it with the walk's ids replaced
     * by these bytes of ids; false (nothing launched)
     * when anything since (another step's walk, a release or allocation
     * of device memory) voided the walk.  The caller's promise: every
     * other value the walk read (positions, block addresses, state
     * slots, buffers) is the step's. */
    bool (*graph_prepare)(backend *b, uint64_t key);
    bool (*graph_prepared)(backend *b, const void *ids);
    bool (*graph_launch_prepared)(backend *b, uint64_t key, const void *ids, size_t bytes);
    void (*graph_counts)(backend *b, long long *captures, long long *replays);
    long long (*graph_kernels)(backend *b);
    bool (*graph_time)(backend *b, long long *replays, double *ms);
    /* A hint (NULL: none): the ops issued next read these weights soon;
     * the backend may start bringing them into its cache beside the ops
     * issued in between (CUDA: an L2 prefetch on a second stream, after
     * the ops issued so far).  Changes no result. */
    void (*prefetch)(backend *b, const qweight *const *w, int n);
    /* A second stream for a step of T tokens (NULL, or side_begin false:
     * none; the caller then issues the same ops in one sequence).  After
     * side_begin returns true the ops issued run after every op issued
     * before it, beside those issued after side_end, until side_join,
     * after which ops also wait for them.  The caller's promise: the ops
     * on either side neither write what the other side's read or write.
     * Changes no result. */
    bool (*side_begin)(backend *b, int T);
    void (*side_end)(backend *b);
    void (*side_join)(backend *b);

    void (*destroy)(backend *b);
};

/* Steps of at least this many tokens run their GEMMs in the backend's
 * prefill GEMM mode (LLM_CUDA_GEMM); fewer tokens multiply in float32
 * (on the CUDA backend, 9 or more tokens of FP8 and BF16 weights in any
 * mode but f32 may run on tensor cores with x in two bf16 parts, within
 * 2^-16 of each x value: kernels/cuda/matmul_mma.cu). */
#define GEMM_MODE_MIN_T 64

/* Whether the fp8 GEMM mode scores indexer op a as DeepSeek's lightning
 * indexer does in FP8: each query head and each key row quantized as
 * act_quant quantizes a group of 128 channels (cpu/quant.h: e4m3 codes,
 * a UE8M0 scale), the exact products summed in float32, then ReLU, the
 * heads' weights and their sum as in any mode.  Steps of GEMM_MODE_MIN_T+
 * tokens over a BF16 or FP8 cache, in the shapes the CUDA backend's FP8
 * tensor-core kernel takes (V4's 64 heads of 128: heads of 128 channels,
 * at most 64 of them in eights); elsewhere the fp8 mode scores as the
 * bf16 modes do.  Both backends decide by this. */
static inline bool indexer_fp8_scores(const indexer_args *a)
{
    return a->n >= GEMM_MODE_MIN_T && a->keys.dtype != KV_F32 && a->d == 128 &&
           a->nheads % 8 == 0 && a->nheads <= 64;
}

struct tp_group;
/* CPU backend for `rank` of group g with `threads` kernel threads. */
backend *backend_cpu_new(int threads, struct tp_group *g, int rank);
/* The CPU backend with the `fp8` GEMM mode's numerics (the reference the
 * CUDA backend's fp8 mode is checked against): in steps of at least
 * GEMM_MODE_MIN_T tokens, every matmul of an FP8 or MXFP4 weight (dense
 * and routed experts; not the router) multiplies act_quant_round(x)
 * (cpu/quant.h) instead of x, and every matmul of a BF16 weight (not the
 * router) x rounded to bf16; indexer ops indexer_fp8_scores takes score
 * FP8 queries and keys. */
void backend_cpu_set_fp8(backend *b, bool on);

/* CUDA backends for ranks 0..tp-1, rank r on device r, joined by an NCCL
 * communicator, computing in `modes` (builds with LLM_HAVE_CUDA only).  0,
 * or -1 with a message. */
int backend_cuda_new_group(int tp, const backend_modes *modes, backend **out, char *err,
                           size_t errlen);

#endif
