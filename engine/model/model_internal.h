/* Internals shared by model.c (API, loading, scheduling of a step) and
 * forward.c (the forward pass of one rank). */
#ifndef LLM_MODEL_INTERNAL_H
#define LLM_MODEL_INTERNAL_H

#include <pthread.h>

#include "backend.h"
#include "kv_cache.h"
#include "model.h"
#include "model_weights.h"
#include "prefix_cache.h"
#include "prefix_disk.h"
#include "safetensors.h"
#include "tp.h"

/* Activation buffers of one rank (backend memory), sized for cap_T tokens. */
typedef struct {
    int cap_T, cap_out;
    float *h, *x, *col, *y, *post, *comb;
    float *qr, *q, *kv, *attn, *oa;
    float *ckv, *cg, *ikv, *ig, *qi, *iw;
    int32_t *sel;
    int *nsel;
    float *head_in, *logits;
} v4_scratch;

/* One sequence's part of a step. */
typedef struct {
    v4_seq *seq;
    int n, pos0;            /* new tokens, position of the first */
    int t0;                 /* offset in the step's token arrays */
    int64_t blk0;           /* offset of its block addresses in blockptr */
} v4_segment;

typedef struct {
    int rank;
    v4_shard shard;
    v4_weights w;           /* views of the model's weights */
    backend *be;
    char *state_mem;        /* max_seqs state slots */
    char *block_mem;        /* pool blocks */
    v4_scratch s;
    char **blockptr;        /* per step: block addresses of every segment */
    int64_t cap_blockptr;
    /* per step: each sequence's arguments of compress, indexer, attention */
    compress_args *cargs;
    indexer_args *iargs;
    attention_args *aargs;
    ring_args *rargs;
    int cap_args;
    /* per step: each logits row's greedy choice on this rank's columns
     * (row_argmax), for items that take only that */
    float *amax_val;
    int32_t *amax_idx;
    int cap_amax;
    bool short_of_memory;   /* this step: scratch or blockptr not had */
    /* decode steps so far: host time walking the ops (which fill a
     * graph's inputs when one replays) and in graph_end (the launch) */
    long long host_steps;
    double host_walk_ms, host_launch_ms;
    /* The next decode step walked ahead (forward.c's walk_ahead): the
     * segments, positions, ids (zeros) and block addresses it took, each
     * sequence's state slot, whether every item wanted only the greedy
     * choice; decode steps launched from such a walk, the walks made and
     * their host time (spent while the device ran the step before) */
    struct {
        bool ok, argmax;
        uint64_t key;
        int nseg;
        int64_t nb;
    } pre;
    v4_segment *pseg;       /* [cap_args] */
    int32_t *pids, *ppos, *pslot;
    char **pblk;            /* [cap_blockptr] */
    long long ahead_steps, ahead_walks;
    double ahead_ms;
} v4_rank;

struct v4_model {
    v4_config cfg;
    safetensors st;
    v4_weights w;
    int tp, threads;
    v4_rank *ranks;
    tp_group *group;
    cache_layout layout;
    backend_modes modes;    /* in effect (cuda) */
    block_pool pool;
    prefix_cache pc;        /* model_prefix.c */
    bool copies_pending;    /* host-tier copies issued since the last fence */
    prefix_disk disk;       /* the disk tier (disk.dir NULL: none) */
    float *inv_main, *inv_comp;
    rope_table rope_main, rope_comp;
    pthread_mutex_t mu;
};

struct v4_seq {
    seq_cache c;
    seq_prefix p;           /* model_prefix.c */
};

typedef struct {
    v4_model *m;
    int nseg, T;
    v4_segment *segs;
    const int32_t *ids, *pos;   /* [T] */
    int nout;
    const int32_t *out_tok;     /* [nout] token index of each logits row */
    const v4_step_item *items;  /* [nseg]: where each one's logits rows go */
} v4_batch;

/* Prefix caching (model_prefix.c), called with the model's mutex held:
 * set up after the pool (off unless o->prefix_cache); a sequence's chain
 * state opened, copied by a fork and closed (its entries touched last to
 * first); full blocks entered and snapshots taken after a step; room for
 * `need` free blocks made by eviction. */
int prefix_init(v4_model *m, const v4_options *o, const char *dir, strbuf *err);
void prefix_free(v4_model *m);      /* the host tier's memory, then the cache */
void prefix_seq_open(v4_model *m, v4_seq *s);
void prefix_seq_fork(v4_model *m, v4_seq *dst, const v4_seq *src);
void prefix_seq_close(v4_model *m, v4_seq *s);
void prefix_after_step(v4_model *m, const v4_step_item *items, int n);
bool prefix_make_room(v4_model *m, int64_t need);
/* n bytes (a multiple of 4) from src to dst in one rank's backend memory. */
void copy_bytes(backend *be, char *dst, const char *src, size_t n);

/* Seconds on the monotonic clock (model.c). */
double model_now_s(void);

/* Forward pass of `rank` over the batch (a tp_fn). */
void v4_forward_rank(void *batch, int rank);

/* RoPE inverse frequencies as transformers computes them (float32). */
void v4_rope_inv_freq(const v4_rope *r, int dim, float *inv_freq);

#endif
