/* DeepSeek V4 weights in the released checkpoint layout and precision
 * (docs/MODEL.md has the table).  Large matrices stay in the mmap'd file
 * as qweight views; only small vectors (norm weights) are converted to
 * float32 at load.  Tensor-parallel shards are views of the same memory. */
#ifndef LLM_MODEL_WEIGHTS_H
#define LLM_MODEL_WEIGHTS_H

#include <stdbool.h>

#include "cpu/qweight.h"
#include "model_config.h"
#include "safetensors.h"
#include "strbuf.h"

/* A compressor: kv and gate projections (coff*d rows), the learned
 * position bias `ape` [ratio][coff*d] and the entry RMSNorm weight [d]. */
typedef struct {
    qweight wkv, wgate;
    const float *ape;
    float *norm;
} v4_comp_w;

typedef struct {
    float *attn_norm, *ffn_norm;
    const float *hc_attn_fn, *hc_attn_base, *hc_attn_scale;
    const float *hc_ffn_fn, *hc_ffn_base, *hc_ffn_scale;
    qweight wq_a, wq_b, wkv, wo_a, wo_b;
    float *q_norm, *kv_norm;
    const float *sink;
    v4_comp_w comp;             /* CSA and HCA layers */
    v4_comp_w icomp;            /* CSA: the indexer's compressor */
    qweight iwq_b, iweights;    /* CSA: indexer query and head weights */
    qweight gate;
    const float *gate_bias;     /* top-k layers */
    const void *tid2eid;        /* hash layers: [vocab][topk] */
    bool tid_i64;
    qweight *w1, *w2, *w3;      /* per expert: gate, down, up */
    qweight sw1, sw2, sw3;      /* shared expert */
} v4_layer;

typedef struct {
    qweight embed, head;
    float *norm;
    const float *hc_fn, *hc_base, *hc_scale;
    v4_layer *layers;
    int n_layers, n_experts;
    bool owns_vectors;          /* full weights own the float vectors */
    void **synth_mem;           /* synthetic weights: made-up host data */
    size_t n_synth_mem;
} v4_weights;

/* Bind every tensor the config needs, checking names, dtypes and shapes;
 * reject unknown tensors (mtp.* are skipped).  All or nothing: on error
 * returns -1 with one message naming the file and tensor. */
int v4_weights_load(v4_weights *w, const v4_config *c, const safetensors *st,
                    const char *dir, strbuf *err);
void v4_weights_free(v4_weights *w);
/* Made-up weights of the config's exact shapes and dtypes (benchmarks):
 * small tensors get random host data, matrices none (qweight.data NULL),
 * for a backend to fill on the device (upload_weights). */
int v4_weights_synthetic(v4_weights *w, const v4_config *c, uint64_t seed, strbuf *err);

/* What one tensor-parallel rank holds. */
typedef struct {
    int h0, nh;         /* attention heads */
    int g0, ng;         /* output groups (whole groups of heads) */
    int i0, ni;         /* routed and shared expert intermediate slice */
    int v0, nv;         /* vocabulary slice of the head */
} v4_shard;

/* Rank `rank` of tp: contiguous, as-even-as-possible slices (a slice may
 * be empty when tp exceeds a dimension).  -1 for an invalid rank. */
int v4_shard_plan(const v4_config *c, int tp, int rank, v4_shard *s, strbuf *err);
/* Views of `full` restricted to shard s (shares all data). */
void v4_weights_shard(const v4_weights *full, const v4_config *c, const v4_shard *s,
                      v4_weights *out);

/* Copy a rank's shard to a backend with memory of its own (one with
 * upload_weights): matrices get their .dev copies, float vectors and the
 * hash table are replaced by backend addresses.  -1 with a message. */
struct backend;
int v4_weights_upload(v4_weights *w, const v4_config *c, const v4_shard *s,
                      struct backend *be, strbuf *err);

#endif
