// The CUDA backend's state and the functions its files share (private to
// kernels/cuda: backend_cuda.cu and the cuda_*.cu files beside it).
#pragma once

#include <math.h>
#include <cublasLt.h>
#include <nccl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

extern "C" {
#include "backend.h"
}
#include "kernels.cuh"

// Where a weight view's device copy is (qweight.dev).
struct cuda_qw {
    const uint8_t *data, *scale;
    long long ld, sld, estride, sestride;
    int row0, col0;             // copy origin in the stored tensor
    const uint8_t *bf;          // FP8: the copy in bf16 (fp8_shadow), else NULL
    long long bstride;
};

#define NSTAGE 32
#define NGRAPH 16       // step shapes kept as graphs per rank
#define NPUT 512        // host arrays deduplicated in the arena per step
#define PUT_HASH 1024   // ... found by their address (open addressing, NPUT of PUT_HASH)
#define ARENA_BYTES ((size_t)4 << 20)

// Graph modes of a step under graph_begin.
enum { G_OFF, G_WARM, G_CAPTURE, G_RECORD };

struct graph_ent {
    uint64_t key;
    cudaGraphExec_t exec;
    unsigned long long gen;     // memory generation the graph was captured in
    unsigned long long warm_gen;
    bool warm;                  // ran once as usual at warm_gen
    size_t arena_len;
    unsigned long long used;
};

struct arena_put_ent {
    const void *host;
    size_t bytes, reserve, off;
};

struct stage_ent {
    void *host, *dev;           // pinned copy of the content, device copy
    size_t bytes, cap;
    unsigned long long used;
    cudaEvent_t ev;             // the copy out of `host` is done
};

// Device scratch that grows on demand (stream-ordered allocations).
struct grow_buf {
    void *p;
    size_t cap;
};

// LLM_CUDA_PROFILE=1: every op (and the phases of the larger ones) is a
// span between two events recorded in the stream, read when the stream is
// waited for anyway (gather_cols) or the spans run out, so the ops still
// run back to back (graphs are off: each op is launched on its own).
// Totals per op are printed when the backend is destroyed.
#define NPROF 32
#define NSPAN 2048
struct prof_ent {
    const char *op;
    long long calls;
    double ms;
};

// cuBLASLt's algorithm for a GEMM shape, the token count rounded up to a
// power of two (MoE experts see every count): choosing one costs more
// host time than launching it.
#define NALGO 128
#define ALGO_KEY 11
struct lt_algo {
    int key[ALGO_KEY];
    cublasLtMatmulAlgo_t algo;
};

// A GEMM operand: float32 or bf16 elements, rows ld elements apart;
// stride: bytes between packed experts; parts (2 or 3; 0 or 1: one):
// activations in bf16 parts, each lo elements after the one before (the
// first rounded, the next ones the rests); scale: FP8 e4m3
// elements with float32 block scales (weights: [N / 128][round_up(K / 128,
// 4)], K blocks contiguous; activations: [K / 128][T], tokens contiguous).
struct gemm_op {
    const void *p;
    long long ld;
    bool bf16;
    long long stride;
    int lo;
    const float *scale;
    int parts;
};

// A second stream beside st (cuda_prefetch.cu), made on first use: its
// fork from st (fork_from: it waits for st's work so far) and its join
// (fork_end records its work so far, fork_wait makes st wait for that).
struct cu_fork {
    cudaStream_t s;
    cudaEvent_t ev[2];
};

struct cu_impl {
    int dev, rank, nranks;
    bool profile;
    cudaEvent_t *spans;         // [2 * NSPAN]: start and end of each span
    const char *span_op[NSPAN];
    int nspan;
    prof_ent prof[NPROF];
    cudaStream_t st;
    ncclComm_t comm;
    ar_peers ar;                // one-shot all-reduce (ar.tp > 1: ready)
    void *ar_mem;
    char err[512];
    bool failed;
    void **owned;               // uploads, freed at destroy
    size_t nowned, capowned;
    cuda_qw **descs;
    size_t ndescs, capdescs;
    stage_ent stage[NSTAGE];
    stage_ent *filling;         // stage_begin's entry until stage_end
    int *hidx;                  // the sequences of a batched op (one_token_segs)
    size_t hidx_cap;
    unsigned long long *hkeys;  // row_argmax's keys on the host (pinned)
    size_t hkeys_cap;
    const float *amax_part;     // row_argmax_issue's rows, queued (NULL: none)
    int amax_rows;
    unsigned long long tick, fills;
    grow_buf sc, idx, wt, ord, perm, tiles, ntiles, offs, xs, yss, g, u, ys, sg, su, sy,
        iscores, icand, ikeys, wdeq, hcm, hcpart, hccol, xbf, apart, xq, x8, xsc, wsc, xn,
        ystk, hcakeys;
    int *hc_count;              // [HC_COUNT_MAX] zeros: the mHC kernels' counters
    int *attn_count;            // [CU_ATTD_COUNTERS] zeros: cu_attention_decode's counters
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t lt_op;
    cublasLtMatmulDesc_t lt_op8;    // FP8 x FP8 with DeepSeek's block scales (lt_gemm)
    void *lt_ws;
    int gemm;                   // gemm_mode: enum backend_gemm (backend_modes.h)
    int attn_tokens;            // attn_tokens: query tokens per tensor-core attention block
    int gemv_max_t;             // dense matmuls of up to this many tokens on the GEMV kernel
    int small_mma;              // LLM_CUDA_SMALL_MMA: 9-64 tokens on cu_matmul_mma (enum below)
    int stream_max_t;           // LLM_CUDA_STREAM_MAX_T (STREAM_MAX_T)
    int lt_min_t;               // LLM_CUDA_LT_MIN_T (LT_BF16_MIN_T)
    int lt_batch_t;             // lt_batched from this many tokens (LLM_CUDA_LT_BATCH_T; 65: never)
    int lt_tune;                // decode GEMMs timed over this many candidates (LLM_CUDA_LT_TUNE)
    int wgmma_wg;               // LLM_CUDA_WGMMA_WG (0: the plan's choice)
    bool attn_decode;           // decode attention on cu_attention_decode (LLM_CUDA_ATTN_DECODE)
    bool attn_fuse;             // ... with the model's ring store and inverse RoPE (LLM_CUDA_ATTN_FUSE)
    bool comp_fuse;             // decode compressors in one launch (LLM_CUDA_COMPRESS_FUSE)
    bool hc_head_fuse;          // the last collapse in one launch (LLM_CUDA_HC_HEAD_FUSE)
    int attn_mma_t;             // ... on tensor cores from this many tokens (LLM_CUDA_ATTN_MMA_MIN_T)
    int attn_mma_keys;          // ... or from this many keys (LLM_CUDA_ATTN_MMA_MIN_KEYS)
    int attd_target;            // ... on the float32 kernel: blocks its splits aim at (LLM_CUDA_ATTD_BLOCKS)
    int attm_target;            // ... on the tensor-core kernel (LLM_CUDA_ATTM_BLOCKS)
    int attm_cluster;           // ... its splits merged in clusters of up to this many (LLM_CUDA_ATTN_CLUSTER)
    bool attn_hca_bf16;         // prefill's HCA entries of an FP8 cache decoded once (LLM_CUDA_ATTN_HCA_BF16)
    bool topk_blocks;           // the indexer's top-k over several blocks a token (LLM_CUDA_TOPK_BLOCKS)
    int topk_cluster;           // their cluster's most blocks, 0: two launches (LLM_CUDA_TOPK_CLUSTER)
    bool idx_tiled;             // the indexer's tiled score kernel (LLM_CUDA_INDEXER_TILED)
    bool idx_wgmma;             // its tensor-core scores on wgmma (LLM_CUDA_INDEXER_WGMMA)
    bool idx_fp8;               // the fp8 mode's in FP8 (LLM_CUDA_INDEXER_FP8)
    bool idx_fp8_k128;          // ... 128 keys a block (LLM_CUDA_INDEXER_FP8_KEYS)
    bool idx_dec;               // decode's on tensor cores (LLM_CUDA_INDEXER_DECODE_MMA)
    bool hc_tail;               // hc_pre_norm's batched last block (LLM_CUDA_HC_PRE_TAIL)
    bool hc_cluster;            // hc_pre_norm in clusters (LLM_CUDA_HC_PRE_CLUSTER)
    bool hc_route;              // with the MoE router in them (LLM_CUDA_HC_ROUTE)
    bool hc_many;               // hc_pre(_norm) of 64+ tokens in two launches (LLM_CUDA_HC_FUSED_MANY)
    int hc_many_t;              // ... of this many tokens on (LLM_CUDA_HC_MANY_MIN_T)
    bool hc_split;              // ... over column slices when few (LLM_CUDA_HC_SPLIT)
    int hc_slice_chunks;        // ... of this many chunks at least (LLM_CUDA_HC_SLICE_CHUNKS)
    bool prefetch;              // decode weights into L2 ahead of their matmuls (LLM_CUDA_PREFETCH)
    cu_fork pf;                 // cuda_prefetch.cu: the prefetches' stream,
    bool pf_pending;            // a prefetch since the last join
    bool moe_side;              // the shared expert of decode batches beside the routed ones
                                // (LLM_CUDA_MOE_SIDE)
    cu_fork side;               // side_scope's stream (and side_begin's)
    bool attn_side;             // decode attention's compressors beside its queries
    bool side_on;               // between side_begin and side_end
    cudaStream_t side_main;     // the main stream then
    bool moe_mma;               // decode batches' expert tiles on tensor cores (LLM_CUDA_MOE_MMA)
    bool gate_lt;               // the router's scores of many tokens on cuBLASLt (LLM_CUDA_GATE_LT)
    int gate_gemv_t;            // ... from this many + 1 (LLM_CUDA_GATE_GEMV_MAX_T)
    int moe_mma_sm;             // their blocks an SM, 1 or 2 (LLM_CUDA_MOE_MMA_BLOCKS)
    int moe_tile_m;             // their slots a tile, 4 or 8 (LLM_CUDA_MOE_TILE_M)
    bool moe_l2;                // their 128-byte lines, scales in shared memory (LLM_CUDA_MOE_L2)
    bool fp8_shadow;            // FP8 weights also kept in bf16 (LLM_CUDA_FP8_SHADOW=0: not)
    bool join;                  // join_weights lays matrices out as one (LLM_CUDA_JOIN=0: not)
    // x's bf16 parts kept for the next dense_matmul of the same x during
    // one matmuls op (its projections share an input): which x, and them;
    // so its act_quant codes and scales (fp8_matmul: q8 the x they are
    // of, in the scratch at x8 and xs)
    struct {
        bool on, set;
        const float *x;
        int ldx, T, K;
        gemm_op op;
        struct {
            const float *x;
            int ldx, T, K;
            const void *x8, *xs;
        } q8;
    } xkeep;
    // The attention output a prefill's attention op wrote in bf16 for the
    // matmuls that read it (attention_args.out_matmul): float x[i] of the
    // region [x, x + n) is bf16 element i from x on (x's first half);
    // till the next attention op.
    struct {
        const float *x;
        long long n;
    } held;
    lt_algo algos[NALGO];
    int nalgos;                 // ever chosen (the cache is a ring)
    double expert_host_ms;      // profiling: host time queuing the expert GEMMs
    bool moe_lt;                // moe_kernel cublaslt: experts through cuBLASLt in every mode
    // graph replay
    bool graphs;                // LLM_CUDA_GRAPHS is not 0 and not profiling
    int gmode;
    bool gbad;                  // this capture cannot be used (ran short of something)
    unsigned long long gen, gtick;
    graph_ent graph[NGRAPH], *gcur;
    long long ncaptures, nreplays;
    long long gkernels;         // kernel nodes of the graph captured last
    bool gnames;                // ... listed by name on stderr (LLM_CUDA_GRAPH_KERNELS)
    // LLM_CUDA_GRAPH_TIME=1: events around each replay (gev_set: the last
    // one's, not yet read), the replays read and their device time
    cudaEvent_t gev[2];
    bool gev_set;
    long long gtimed;
    double gtimed_ms;
    char *arena_h, *arena_d;    // pinned host (one of arena_hb) / device, same layout
    // Two host arenas taken in turn by the steps: a step's ops write one
    // while the copy of the step before, queued and not yet run, reads the
    // other (arena_ev[i]: arena_hb[i]'s last copy).
    char *arena_hb[2];
    cudaEvent_t arena_ev[2];
    int arena_i;
    size_t arena_cap, arena_len;
    arena_put_ent put[NPUT];
    int nput;
    short puth[PUT_HASH];       // put's index + 1 by host address, 0: none
    unsigned long long arena_turns;     // arena_next's calls
    // A decode step walked ahead (graph_prepare .. graph_prepared): its
    // graph, the generation, the host arena its values are in (and that
    // arena's turn), the ids' place there, its argmax rows
    bool prewalk;               // LLM_CUDA_PREWALK is not 0
    struct {
        bool ok;
        graph_ent *e;
        uint64_t key;
        unsigned long long gen, turn;
        int arena_i;
        size_t len, ids_off[4], ids_bytes;
        int nids;                       // the ids' copies in the arena
        const float *amax_part;
        int amax_rows;
    } prep;
    // host-tier copies (cuda_memory.cu): their stream, the events that
    // order it against st, copies issued since the last fence
    cudaStream_t cst;
    cudaEvent_t cev[2];
    bool cpend;
    // weight uploads (cuda_memory.cu): two pinned staging buffers of
    // up_bytes (0: copies straight from the pageable source), the event
    // after each one's last transfer, the one to fill next
    uint8_t *up_buf[2];
    cudaEvent_t up_ev[2];
    size_t up_bytes;
    int up_threads;             // host threads packing a buffer (LLM_CUDA_UPLOAD_THREADS)
    struct threadpool *up_pool; // ... kept for the whole upload (made with the buffers)
    int up_next;
};

// cu_impl.small_mma: never; the default (cu_matmul_mma up to
// SMALL_MMA_MAX_T tokens where run SM2 measured it faster than the GEMV,
// cu_matmul_stream above); cu_matmul_mma for every matmul it takes;
// cu_matmul_stream for every one; cu_matmul_wgmma for every one.
enum { SMALL_MMA_OFF, SMALL_MMA_AUTO, SMALL_MMA_ALL, SMALL_MMA_STREAM, SMALL_MMA_WGMMA };

#define LT_WS_BYTES (32u << 20)
#define LT_STACK_MAX 256    // x's bf16 parts as one GEMM's columns up to this many (lt_gemm)
#define LT_TUNE_MAX 16      // LLM_CUDA_LT_TUNE's most candidates
#define LT_TUNE_DEFAULT 8   // ... and its default
#define LT_TUNE_RUNS 9      // ... each timed over this many runs (lt_fastest)
#define LT_MIN_T GEMM_MODE_MIN_T    // prefill matmuls of at least this many tokens go to cuBLASLt
#define GEMV_MAX_T 16       // dense matmuls of up to this many tokens on the GEMV (LLM_CUDA_GEMV_MAX_T)
#define SMALL_MMA_MAX_T 16  // ... on cu_matmul_mma first (BF16 of up to 4096 rows) or
                            // cu_matmul_stream, from 9 tokens (small_mma; runs G6, H4)
#define GATE_GEMV_MAX_T 16  // the router's scores of up to this many tokens on the GEMV, more
                            // on cuBLASLt (LLM_CUDA_GATE_GEMV_MAX_T; J5: the GEMV reads the
                            // 4 MB gate once per 8 tokens, 28 us at 64)
#define STREAM_MAX_T 16     // ... on cu_matmul_stream up to this many, then cuBLASLt
                            // (run I3: 16 against 24 and 32, batches of 17-32)
#define LT_BF16_MIN_T 9     // FP8 matrices with bf16 copies and the head on cuBLASLt from
                            // this many tokens (lt_first; run K4)
#define HC_MANY_MIN_T 20    // the mHC of this many tokens on in two launches (hc_pre_many; K5)
#define WCHUNK_BYTES ((size_t)512 << 20)    // experts' weights dequantized at a time
#define UP_STAGE_BYTES ((size_t)32 << 20)   // each of the two pinned upload buffers
#define UP_THREADS 8                        // host threads packing a staging buffer (run E2)
#define UP_THREADS_MAX 32                   // LLM_CUDA_UPLOAD_THREADS' bound

// Prefill GEMM operands.  Weights are exact in bf16 (FP8, E2M1, BF16
// values times powers of two); activations are not: bf16x2 splits each
// into hi = bf16(x) and lo = bf16(x - hi) (x - hi - lo within 2^-16 |x|)
// and accumulates W hi + W lo, bf16 rounds x once (2^-8), f32 keeps
// float32 operands (no tensor cores).  fp8 runs DeepSeek's numerics: the
// activations of FP8 and MXFP4 matmuls quantized by act_quant (cpu/quant.h;
// e4m3 per 128 channels), FP8 weights multiplied as FP8 through cuBLASLt's
// block-scaled GEMM, MXFP4 ones as bf16 (exact on the quantized values);
// everything else (BF16 weights, attention, the indexer) as under bf16x2.
// The modes and their names are backend_modes.h's (recipe key gemm_mode).
#define IDX_MMA_MIN_T 64    // indexer steps of at least this many tokens score on tensor cores
#define ATT_MMA_MIN_T 64    // attention of steps of at least this many tokens on tensor cores
#define ATT_DEC_MMA_MIN_T 16    // ... of decode steps (attention_run; LLM_CUDA_ATTN_MMA_MIN_T)
#define ATT_DEC_MMA_MIN_KEYS 1000   // ... and decode ops of this many keys (LLM_CUDA_ATTN_MMA_MIN_KEYS)
#define ATTM_CLUSTER 8          // its splits merged in clusters of 8 (LLM_CUDA_ATTN_CLUSTER)

static inline cu_impl *impl(backend *b) { return (cu_impl *)b->impl; }
static inline size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

#define CK(c, call)                                                                              \
    do {                                                                                         \
        cudaError_t e_ = (call);                                                                 \
        if (e_ != cudaSuccess) fail(c, "%s:%d: %s: %s", __FILE__, __LINE__, #call,               \
                                    cudaGetErrorString(e_));                                     \
    } while (0)

static inline bool in_graph(cu_impl *c)
{
    return c->gmode == G_CAPTURE || c->gmode == G_RECORD;
}
// Replaying: an op only records its changing values, launches nothing.
static inline bool recording(cu_impl *c) { return c->gmode == G_RECORD; }


bool fork_from(cu_impl *c, cu_fork &f);
void fork_end(cu_impl *c, cu_fork &f);
void fork_wait(cu_impl *c, cu_fork &f);
void fork_free(cu_fork &f);     // after its work finished

// Ops on a second stream beside the main one (cuda_prefetch.cu): while
// `on` after construction (asked for, and the stream made), the launches
// go to c->st = the side stream, forked from the main one's work so far;
// end() puts the main stream back, join() makes it wait for the side
// work; leaving the scope joins if join() was not called (a graph capture
// must not end with a stream forked).
struct side_scope {
    cu_impl *c;
    cudaStream_t main = NULL;
    bool on, ended = false, joined = false;
    side_scope(cu_impl *c, bool want);
    void end();
    void join();
    ~side_scope() { join(); }
};

// While one is in scope, dense_matmul's GEMMs of the same x (pointer,
// size, unchanged in between: the caller's promise) reuse its bf16 parts.
struct xkeep_scope {
    cu_impl *c;
    explicit xkeep_scope(cu_impl *c) : c(c)
    {
        c->xkeep.on = true, c->xkeep.set = false, c->xkeep.q8.x = NULL;
    }
    ~xkeep_scope() { c->xkeep.on = false; }
    // act_quant(x) already in fp8_matmul's scratch (x8, xs): its FP8
    // GEMMs in this scope take those codes instead of quantizing x again
    void codes(const float *x, int ldx, int T, int K, const void *x8, const void *xs)
    {
        c->xkeep.q8 = { x, ldx, T, K, x8, xs };
    }
};

// Under fp8, the activations of a T-token matmul with weight type t are
// quantized (act_quant).
static inline bool fp8_quantized(cu_impl *c, int t, int T)
{
    return c->gemm == BACKEND_GEMM_FP8 && T >= GEMM_MODE_MIN_T && (t == QT_FP8 || t == QT_MXFP4);
}

// The mode whose matmul operands not exact in bf16 go in two bf16 parts
// (bf16x2).  fp8 rounds what it does not quantize (x of BF16 weights)
// once, as DeepSeek's inference code keeps its activations in bf16.
static inline bool split_mode(cu_impl *c)
{
    return c->gemm == BACKEND_GEMM_BF16X2;
}

// Attention on tensor cores with queries and probabilities in two bf16
// parts: under bf16x2, and in fp8's decode launches (the CPU's fp8 mode
// attends in float32 there).  fp8's prefill chunks round them once, as
// DeepSeek's attention kernels and the CPU's fp8 mode for such chunks
// (attn_split_prefill).
static inline bool attn_split(cu_impl *c)
{
    return c->gemm == BACKEND_GEMM_BF16X2 || c->gemm == BACKEND_GEMM_FP8;
}

// ... in prefill chunks (ATT_MMA_MIN_T+ tokens, attention_one): under
// bf16x2 only.  fp8 in two parts kept the tiny fixtures' fp8 runs as near
// the CPU's fp8 mode as the golden (run Q2: rel L2 0.153 against 0.156)
// while that mode attended in float32, and cost 2.1 ms of an 8,192-token
// step's 73.6.
static inline bool attn_split_prefill(cu_impl *c)
{
    return c->gemm == BACKEND_GEMM_BF16X2;
}

// Joined matrices (join_weights) run as one GEMM: decode batches from
// lt_min_t tokens under the default's choices (lt_joined).
static inline bool joins(const cu_impl *c, int T)
{
    return c->small_mma == SMALL_MMA_AUTO && T >= c->lt_min_t;
}

// Decode batches whose x lt_gemm takes as two bf16 parts stacked as
// columns, n matrices (lt_joined) ...
static inline bool stacks(cu_impl *c, int n, int T)
{
    return joins(c, T) && n >= 2 && n <= CU_SEG_MAX && c->gemm != BACKEND_GEMM_F32 &&
           (T < GEMM_MODE_MIN_T || split_mode(c)) && 2 * T <= LT_STACK_MAX;
}

// ... and, from lt_batch_t tokens (LLM_CUDA_LT_BATCH_T), views of one
// matrix each with its own x as one strided batch (lt_batched).
static inline bool batches(cu_impl *c, int n, int T)
{
    return T >= c->lt_batch_t && stacks(c, n, T);
}

// The prefill GEMMs of weight q run in bf16 unless LLM_CUDA_GEMM=f32 or
// the weight is float32 (not exact in bf16).
static inline bool use_bf16(cu_impl *c, const dqw &q)
{
    return c->gemm != BACKEND_GEMM_F32 && q.type != QT_F32;
}

// backend_cuda.cu
void fail(cu_impl *c, const char *fmt, ...);
bool to_dqw(cu_impl *c, const qweight *w, dqw *q);
backend *cu_new(int dev, int rank, int nranks, const backend_modes *modes, char *err,
                size_t errlen);

// cuda_profile.cu: every op starts with enter and ends with launched;
// phase closes a span inside an op (LLM_CUDA_PROFILE).
cu_impl *enter(backend *b);
void prof_flush(cu_impl *c);
void launched(cu_impl *c, const char *op);
void phase(cu_impl *c, const char *op);
void print_profile(cu_impl *c);

// cuda_arena.cu: scratch, the graph arena, staging of host inputs.
void *grow(cu_impl *c, grow_buf *g, size_t bytes);
// The same for scratch that no graph reads (used between graphs): its
// growth retires none (a new generation would re-warm every graph).
void *grow_outside(cu_impl *c, grow_buf *g, size_t bytes);
const void *arena_put(cu_impl *c, const void *host, size_t bytes, size_t reserve);
const dstep *step_values(cu_impl *c, int pos0, const void *ptr);
int pos_end(cu_impl *c, int pos0, int n);
const void *stage(cu_impl *c, const void *host, size_t bytes);
// Staging filled in place: `bytes` of pinned host memory to write (NULL
// when short: under a graph the step then runs again), their device
// address in *dev; stage_end copies them for this step's launches (under
// a graph: a fresh place in the arena, copied with it).  One at a time.
char *stage_begin(cu_impl *c, size_t bytes, const char **dev);
void stage_end(cu_impl *c);
void arena_free(cu_impl *c);
void arena_grow(cu_impl *c, size_t bytes);
// A step under a graph starts writing the host arena the copy before last
// read (waiting for that copy); arena_copy queues the copy of this one.
void arena_next(cu_impl *c);
void arena_copy(cu_impl *c);

// cuda_memory.cu: the seam's memory ops and weight upload.
void *cu_alloc(backend *b, size_t bytes);
void cu_release(backend *b, void *p);
void cu_copy_rows(backend *b, float *dst, int ldd, const float *src, int lds, int rows, int n);
void cu_write(backend *b, void *dst, const void *src, size_t bytes);
void cu_read(backend *b, void *dst, const void *src, size_t bytes);
void *cu_upload(backend *b, const void *host, size_t bytes);
int cu_upload_weights(backend *b, qweight *w, int n);
int cu_join_weights(backend *b, qweight *const *w, int n);
void cu_mem_info(backend *b, size_t *free_bytes, size_t *total_bytes);
void *cu_host_alloc(backend *b, size_t bytes);
void cu_host_free(backend *b, void *p);
void cu_copy_async(backend *b, void *dst, const void *src, size_t bytes, bool to_host);
void cu_copy_fence(backend *b, bool wait);

// cuda_prefetch.cu
void cu_prefetch_op(backend *b, const qweight *const *w, int n);
void cu_prefetch_join(cu_impl *c);
bool cu_side_begin(backend *b, int T);
void cu_side_end(backend *b);
void cu_side_join(backend *b);
void copies_free(cu_impl *c);
void uploads_free(cu_impl *c);

// cuda_gemm.cu: prefill GEMMs through cuBLASLt, algorithms cached per shape.
bool lt_op_new(cu_impl *c);
bool lt_gemm(cu_impl *c, gemm_op w, int N, int K, gemm_op x, int T, float *y, int ldy,
             const cu_ysegs *segs = nullptr, int nbatch = 1);
gemm_op gemm_input(cu_impl *c, bool bf16, bool exact, const float *x, int ldx, const int *rows,
                   int div, int T, int K);
void dense_matmul(cu_impl *c, const dqw &q, const float *x, int ldx, int T, float *y, int ldy);
void held_matmul(cu_impl *c, const dqw &q, const uint16_t *x, int ldx, int T, float *y, int ldy);
bool lt_joined(cu_impl *c, int n, const dqw *q, const float *x, int ldx, int T, float *const *y,
               const int *ldy);
bool lt_batched(cu_impl *c, int n, const dqw *q, const float *const *x, int ldx, int T,
                float *const *y, const int *ldy);
void f32_matmul(cu_impl *c, const dqw &q, const float *x, int ldx, int T, float *y, int ldy);
void expert_gemms(cu_impl *c, const dqw &w, int E, const int *ho, gemm_op x, float *y, int ldy);

// cuda_graphs.cu: decode steps as CUDA graphs.
void graph_drop(graph_ent *e);
void cu_graph_begin(backend *b, uint64_t key);
bool cu_graph_end(backend *b);
bool cu_graph_prepare(backend *b, uint64_t key);
bool cu_graph_prepared(backend *b, const void *ids);
bool cu_graph_launch_prepared(backend *b, uint64_t key, const void *ids, size_t bytes);
void cu_graph_counts(backend *b, long long *captures, long long *replays);
bool cu_graph_time(backend *b, long long *replays, double *ms);
long long cu_graph_kernels(backend *b);

// cuda_comm.cu: the all-reduce op; the group's NCCL and peer setup.
void cu_allreduce(backend *b, float *buf, size_t n);
