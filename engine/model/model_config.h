/* DeepSeek V4 model configuration, read from a checkpoint's config.json.
 *
 * Both spellings that exist in the wild are accepted: the released one
 * (compress_ratios, num_hash_layers, qk_rope_head_dim, rope_scaling) and
 * the one transformers writes back (layer_types, compress_rates,
 * mlp_layer_types, partial_rotary_factor, nested rope_parameters).  The
 * meaning follows transformers' DeepseekV4Config, which produces the golden
 * logits (see docs/MODEL.md for the points where that matters). */
#ifndef LLM_MODEL_CONFIG_H
#define LLM_MODEL_CONFIG_H

#include <stdbool.h>

#include "strbuf.h"

enum v4_attn { V4_ATTN_SLIDING, V4_ATTN_CSA, V4_ATTN_HCA };
enum v4_score { V4_SCORE_SQRTSOFTPLUS, V4_SCORE_SIGMOID };

/* One RoPE table: plain ("default") or YaRN-scaled frequencies. */
typedef struct {
    bool   yarn;
    double theta;
    double factor;              /* yarn only */
    double beta_fast, beta_slow;
    double original_max_pos;
    double attention_factor;    /* multiplies cos and sin */
} v4_rope;

typedef struct {
    int vocab_size, hidden_size, n_layers;
    int n_heads, head_dim, rope_dim;        /* rope on the last rope_dim channels */
    int q_lora_rank, o_groups, o_lora_rank;
    int n_experts, n_shared_experts, topk, moe_inter;
    enum v4_score scoring;
    double routed_scale, swiglu_limit;
    int sliding_window;
    int index_heads, index_head_dim, index_topk;
    int hc_mult, hc_sinkhorn_iters;
    double hc_eps, rms_eps;
    long long max_pos;
    v4_rope rope_main, rope_compress;
    bool tie_embeddings;
    int bos_id, eos_id;                     /* -1 when absent */
    enum v4_attn *attn;                     /* per layer */
    int *ratio;                             /* per layer: window size, 0 sliding */
    bool *hash_moe;                         /* per layer */
} v4_config;

/* Parse config JSON text; `name` is used in messages ("NAME: FIELD: why").
 * Returns 0, or -1 with one line per problem appended to err. */
int v4_config_parse(v4_config *c, const char *text, size_t len, const char *name,
                    strbuf *err);
int v4_config_load(v4_config *c, const char *path, strbuf *err);
void v4_config_free(v4_config *c);

/* Compression ratio of a layer (0 for sliding-only layers). */
static inline int v4_layer_ratio(const v4_config *c, int layer) { return c->ratio[layer]; }

#endif
