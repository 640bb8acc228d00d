/* Synthetic DeepSeek V4 checkpoints in the released format (config.json +
 * safetensors with FP8 / MXFP4 / BF16 / F32 tensors), with random weights
 * scaled so activations stay O(1).  Used by the tests (self-consistency,
 * loader errors) and by `llm-engine synth` for benchmark models. */
#ifndef LLM_SYNTH_MODEL_H
#define LLM_SYNTH_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "model_config.h"
#include "safetensors.h"
#include "strbuf.h"

#define SYNTH_MAX_LAYERS 64

typedef struct {
    int vocab, hidden, layers, heads, head_dim, rope_dim;
    int q_lora, o_groups, o_lora;
    int experts, topk, moe_inter, hash_layers;
    int sliding_window, index_heads, index_head_dim, index_topk;
    int hc_mult, sinkhorn_iters;
    double swiglu_limit, routed_scale;
    int ratios[SYNTH_MAX_LAYERS];   /* per layer: 0 sliding, 4 CSA, else HCA window */
    bool tid_i32;                   /* tid2eid as I32 instead of I64 */
    bool codes;                     /* weights as random codes of their format
                                       (FP8, MXFP4) and uniform values, not
                                       quantized normals: full shapes in
                                       seconds, for benchmarks */
} synth_spec;

/* "tiny": every layer kind in a few KB; "mid": a benchmark-sized model;
 * returns -1 for an unknown name. */
int synth_preset(synth_spec *s, const char *name);

/* The shapes of a model config (its first `layers` layers; 0: all),
 * with codes set; -1 with a message when they do not fit a spec. */
int synth_spec_from_config(synth_spec *s, const v4_config *c, int layers, strbuf *err);

void synth_config_json(const synth_spec *s, strbuf *out);
/* All tensors of the checkpoint into w (initialized by the caller). */
void synth_tensors(const synth_spec *s, uint64_t seed, st_writer *w);
/* Create dir (if needed) with config.json and the weights in nshards files. */
int synth_write_dir(const synth_spec *s, uint64_t seed, const char *dir, int nshards,
                    strbuf *err);

#endif
