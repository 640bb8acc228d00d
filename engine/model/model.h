/* DeepSeek V4 inference engine: the API the serving runtime uses.
 *
 *   v4_model_load()    config.json + safetensors weights, split over tp ranks,
 *                      then the cache pool, sized from the options
 *   v4_seq_new/free()  per-sequence cache state from the pool
 *   v4_step()          run one batch: each item is a sequence with a chunk of
 *                      new tokens (a prefill chunk or one decode token); writes
 *                      the logits of the chunk's last position (or of all)
 *
 * Thread safety: every function may be called from any thread; calls are
 * serialized internally (one step at a time).  Logits match transformers'
 * DeepseekV4ForCausalLM in float32 (docs/MODEL.md). */
#ifndef LLM_MODEL_H
#define LLM_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend_modes.h"
#include "cpu/kv_quant.h"
#include "model_config.h"
#include "strbuf.h"

typedef struct v4_model v4_model;
typedef struct v4_seq v4_seq;

typedef struct {
    int tp;                 /* tensor-parallel ranks; 0 or 1: one */
    int threads_per_rank;   /* CPU kernel threads per rank; 0: cores / tp */
    int max_seqs;           /* sequences holding cache state at once; 0: 1 */
    int64_t cache_tokens;   /* pool capacity in positions, over all sequences,
                               when neither of the next two applies (0: 4096
                               per sequence) */
    size_t cache_bytes;     /* memory per rank for state slots and blocks */
    double gpu_memory_utilization;  /* cuda, cache_bytes 0: the pool gets this
                               share of each device's memory less what is in
                               use after loading and one step of
                               max_step_tokens (vLLM's rule; the smallest
                               rank decides); 0: sized by cache_tokens */
    int max_step_tokens;    /* most tokens one step carries; 0: 8192 */
    const char *backend;    /* "cpu" or "cuda" (NULL: cpu) */
    enum kv_dtype kv_dtype; /* storage of the ring, compressed entries and
                               indexer keys (cpu/kv_quant.h); KV_F32 (the
                               zero value) is the exact reference */
    backend_modes modes;    /* cuda: gemm_mode, moe_kernel, attn_tokens (the zero
                               value: bf16x2, grouped, 1); the LLM_CUDA_*
                               environment overrides them (backend_modes_env) */
    bool synthetic;         /* benchmarks: the load path is a config.json and
                               the weights are random, of its exact shapes and
                               dtypes, made on the device (cuda only) */
    int read_threads;       /* threads reading the checkpoint files ahead of
                               the upload (st_prefetch.h); 0: 8 */
    void (*log)(void *user, const char *line);  /* load progress; NULL: none */
    void *log_user;
    bool prefix_cache;      /* automatic prefix caching (v4_seq_prefix_attach) */
    int prefix_snapshot_every;  /* blocks between state snapshots of a
                               prefill or decode (besides each prompt's
                               last boundary); 0: the default, so that
                               snapshots cost at most a quarter of the
                               blocks they stand at the end of */
    int prefix_mark_min_tokens; /* a prompt's last boundary is snapshotted
                               (its prefill split there) only when it lies
                               this many tokens past the snapshot before it
                               (0: always) */
    const char *prefix_disk_dir;    /* a disk tier under the host tier (NULL: none):
                                     * files that survive restarts, docs/MODEL.md */
    uint64_t prefix_disk_bytes;     /* what it may hold */
    size_t prefix_host_bytes;   /* host-memory tier of the prefix cache, over
                               all ranks: entries evicted from the pool are
                               copied there and back when reused; 0: none */
} v4_options;

int v4_model_load(v4_model **out, const char *dir, const v4_options *opt, strbuf *err);
/* The backend modes in effect (options plus environment overrides): what
 * system_fingerprint must name. */
backend_modes v4_model_modes(const v4_model *m);
/* kv_cache_dtype names: "auto" (float32), "bf16", "fp8"; -1 for another. */
int v4_kv_dtype_parse(const char *name);
/* "float32", "bf16" or "fp8". */
const char *v4_kv_dtype_name(enum kv_dtype t);
/* Device memory of the most loaded rank after loading (the pool included):
 * free and total bytes; 0 and 0 on backends that do not tell. */
void v4_model_mem(v4_model *m, size_t *free_bytes, size_t *total_bytes);
/* Decode steps captured as graphs and replayed, over all ranks (0 and 0
 * on backends without graphs). */
void v4_model_graph_counts(v4_model *m, long long *captures, long long *replays);
/* n floats of host memory for the logits v4_step writes, the kind the
 * backend copies into fastest (pinned on CUDA: a decode batch's logits
 * arrive at DMA speed instead of through pageable staging), else malloc'd;
 * *pinned says which, for v4_logits_free (before v4_model_free). */
float *v4_logits_alloc(v4_model *m, size_t n, bool *pinned);
void v4_logits_free(v4_model *m, float *p, bool pinned);
/* Kernel launches in rank 0's graph captured last (a decode step when
 * decode ran last); 0 on backends that do not count. */
long long v4_model_graph_kernels(v4_model *m);
/* Rank 0's replays timed on the device and their milliseconds so far
 * (backend.h graph_time); false when its backend does not time them. */
bool v4_model_graph_time(v4_model *m, long long *replays, double *ms);
/* Rank 0's decode steps so far and the host's milliseconds in them: the
 * walks over the step's ops (which, when a graph replays, fill its inputs
 * while the device waits; a capture's two passes both counted) and the
 * graph's launch (graph_end; 0 without graphs); of the steps, those
 * launched from a walk made ahead, while the step before ran (backend.h
 * graph_prepare), and the walks made ahead and their milliseconds. */
typedef struct {
    long long steps;
    double walk_ms, launch_ms;
    long long ahead_steps, ahead_walks;
    double ahead_ms;
} v4_host_time;
void v4_model_host_time(v4_model *m, v4_host_time *t);
void v4_model_free(v4_model *m);
const v4_config *v4_model_config(const v4_model *m);
int v4_model_tp(const v4_model *m);

typedef struct {
    enum kv_dtype dtype;        /* storage of the cache */
    int block_tokens;           /* positions per block */
    size_t block_bytes;         /* per rank */
    size_t state_bytes;         /* fixed state per sequence per rank */
    int64_t blocks_total, blocks_used;  /* used: held by sequences */
    int64_t blocks_cached;      /* held by the prefix cache (some shared) */
    int seqs_total, seqs_used;
} v4_cache_info;

void v4_cache_info_get(v4_model *m, v4_cache_info *ci);
/* Blocks a sequence of n positions needs. */
int64_t v4_blocks_for_tokens(const v4_model *m, int64_t n);
/* Growing cache bytes per position, per rank (the fixed state excluded). */
double v4_cache_bytes_per_token(const v4_model *m);
/* Whether a new sequence of n positions fits in what is free now. */
bool v4_can_admit(v4_model *m, int64_t n);

/* NULL (message in err) when every state slot is taken. */
v4_seq *v4_seq_new(v4_model *m, strbuf *err);
/* Take the blocks for n positions now (admission), so later steps up to n
 * cannot run out.  -1 with a message, and nothing taken, if they are not
 * free.  Steps past n take more blocks as they go. */
int v4_seq_reserve(v4_model *m, v4_seq *s, int64_t n, strbuf *err);
void v4_seq_free(v4_model *m, v4_seq *s);
int64_t v4_seq_len(const v4_seq *s);
/* Make the fresh dst (nothing fed, room reserved for src's positions) hold
 * what src holds: its state slot and token blocks are copied on every rank
 * (backend memory to backend memory, ordered before the next step), so dst
 * continues from src's prefill without computing it.  -1 with a message. */
int v4_seq_fork(v4_model *m, v4_seq *dst, const v4_seq *src, strbuf *err);

/* Prefix caching (docs/MODEL.md "Prefix caching").  On a fresh sequence
 * (nothing fed, no blocks reserved), start from the longest cached prefix
 * of the prompt that ends at a snapshot and leaves at least one prompt
 * token to feed: its blocks are shared, its state copied on every rank.
 * Returns the positions now in the cache (0: none); the caller feeds
 * prompt[returned..n).  Also marks the prompt's last block boundary before
 * n for a snapshot, so a later prompt with this prefix resumes there. */
int64_t v4_seq_prefix_attach(v4_model *m, v4_seq *s, const int32_t *prompt, int64_t n);
/* The most of the next n prompt tokens to feed in one step so that the
 * chunk ends at a position the cache snapshots (n when none is near). */
int v4_seq_prefix_chunk(v4_model *m, const v4_seq *s, int n);

typedef struct {
    bool on;
    uint64_t seed;              /* the chain hash's seed (model, dtype, ...) */
    int block_tokens, snapshot_every;
    int64_t entries, snapshots, blocks_held;
    uint64_t queries, query_tokens;     /* attach calls and their prompt tokens */
    uint64_t hits, hit_tokens;          /* attaches that reused, and positions */
    uint64_t evicted;           /* blocks given back to make room */
    int64_t host_entries;       /* blocks (with snapshots) in the host tier */
    size_t host_bytes, host_budget;
    uint64_t spills, fills;     /* entries copied to and from the host tier */
    int64_t disk_files;         /* the disk tier's files now, and their bytes */
    uint64_t disk_bytes;
    uint64_t disk_writes, disk_reads, disk_rejected;   /* files written, read back,
                                                        * ignored (a failed check) */
} v4_prefix_stats;

void v4_prefix_stats_get(v4_model *m, v4_prefix_stats *st);
/* Move every cached entry no sequence holds from the pool to the host
 * tier, as eviction would (what does not fit there is dropped): a later
 * prompt with such a prefix restores it from host memory (benchmarks,
 * tests).  Returns the entries moved. */
int64_t v4_prefix_offload(v4_model *m);

/* What a clear dropped: entries in the pool and in the host tier, the pool
 * blocks given back (blocks running sequences share stay theirs), the
 * host tier's bytes, and the disk tier's files (deleted) and bytes. */
typedef struct {
    int64_t entries, blocks, host_entries, disk_files;
    size_t host_bytes;
    uint64_t disk_bytes;
} v4_prefix_cleared;

/* Forget every cached prefix (running sequences keep their blocks); out
 * (may be NULL) says what went. */
void v4_prefix_clear(v4_model *m, v4_prefix_cleared *out);

typedef struct {
    v4_seq *seq;
    const int32_t *tokens;
    int n_tokens;               /* >= 1 */
    float *logits;              /* [vocab], or [n_tokens][vocab] with all_logits */
    bool all_logits;
    /* Not NULL: only the greedy choice of the last row is wanted, the
     * sampler's rule (the lowest id among equal maxima, NaN never, 0 when
     * no logit is above -inf), found where the logits are and written
     * here; logits is then not written (may be NULL); not with all_logits. */
    int32_t *argmax;
} v4_step_item;

/* Each item's logits rows are written straight into its buffer (items
 * whose buffers follow each other in one copy; pinned buffers from
 * v4_logits_alloc copy fastest), or its greedy choice into *argmax
 * (no copy of the logits: a decode step of 64 sequences at V4-Flash's
 * vocabulary moves 16-33 MB less); after a failure their content is
 * undefined.  Returns 0; or -1 with a message (bad token, pool exhausted, a device
 * fault, ...), after which no sequence changed (a device fault leaves the
 * model unusable); or V4_STEP_NOMEM with a message when memory for this
 * step ran short: the model goes on, but the items' sequences may hold
 * partial state, so the caller ends them (their requests fail, others
 * do not). */
#define V4_STEP_NOMEM (-2)
int v4_step(v4_model *m, v4_step_item *items, int n_items, strbuf *err);

#endif
