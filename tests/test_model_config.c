/* config.json: both spellings (released and transformers), and a clear
 * message naming the file and field for each kind of mistake. */
#include <stdlib.h>
#include <string.h>

#include "model_config.h"
#include "synth_model.h"
#include "tap.h"

/* Parse text; returns the error text (empty when it parsed). */
static const char *parse(const char *text, v4_config *c)
{
    static strbuf err;
    sb_free(&err);
    sb_init(&err);
    if (v4_config_parse(c, text, strlen(text), "cfg.json", &err) == 0) return "";
    while (err.len && err.data[err.len - 1] == '\n') err.data[--err.len] = 0;
    return err.data;
}

/* The synthetic tiny config with one field's text replaced. */
static char *tiny_with(const char *from, const char *to)
{
    synth_spec s;
    synth_preset(&s, "tiny");
    strbuf sb;
    sb_init(&sb);
    synth_config_json(&s, &sb);
    char *p = from ? strstr(sb.data, from) : NULL;
    strbuf out;
    sb_init(&out);
    if (p) {
        sb_append(&out, sb.data, p - sb.data);
        sb_puts(&out, to);
        sb_puts(&out, p + strlen(from));
    } else {
        sb_puts(&out, sb.data);
    }
    sb_free(&sb);
    return sb_steal(&out);
}

static void expect_error(const char *from, const char *to, const char *want, const char *what)
{
    char *text = tiny_with(from, to);
    v4_config c;
    const char *e = parse(text, &c);
    ok(strstr(e, want) != NULL, "%s -> \"%s\"", what, e);
    if (!*e) v4_config_free(&c);
    free(text);
}

int main(void)
{
    v4_config c;
    char *text = tiny_with(NULL, NULL);
    is_str(parse(text, &c), "", "released-style tiny config parses");
    free(text);
    is_int(c.hidden_size, 64, "hidden_size");
    is_int(c.rope_dim, 8, "qk_rope_head_dim");
    ok(c.attn[0] == V4_ATTN_SLIDING && c.attn[1] == V4_ATTN_CSA && c.attn[2] == V4_ATTN_HCA
       && c.attn[3] == V4_ATTN_CSA, "compress_ratios 0 / 4 / other: sliding / CSA / HCA");
    ok(v4_layer_ratio(&c, 2) == 8 && v4_layer_ratio(&c, 1) == 4 && v4_layer_ratio(&c, 0) == 0,
       "compress_ratios values are the window sizes");
    ok(c.hash_moe[0] && !c.hash_moe[1], "num_hash_layers 1");
    ok(!c.rope_main.yarn && c.rope_main.theta == 10000, "main rope: default, rope_theta");
    ok(c.rope_compress.yarn && c.rope_compress.theta == 160000 && c.rope_compress.factor == 16
       && c.rope_compress.original_max_pos == 65536 && c.rope_compress.attention_factor == 1.0,
       "compress rope: yarn at compress_rope_theta, attention factor forced to 1");
    ok(c.eos_id == 1 && c.bos_id == 0 && !c.tie_embeddings, "token ids, untied head");
    v4_config_free(&c);

    /* transformers' own spelling, as config.to_json_file() writes it. */
    const char *hf =
        "{\"vocab_size\": 50, \"hidden_size\": 32, \"num_hidden_layers\": 2, "
        "\"num_attention_heads\": 2, \"head_dim\": 16, \"partial_rotary_factor\": 0.25, "
        "\"q_lora_rank\": 8, \"o_groups\": 1, \"o_lora_rank\": 8, \"n_routed_experts\": 4, "
        "\"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32, "
        "\"scoring_func\": \"sqrtsoftplus\", \"routed_scaling_factor\": 1.5, "
        "\"swiglu_limit\": 10.0, \"sliding_window\": 4, \"index_n_heads\": 2, "
        "\"index_head_dim\": 8, \"index_topk\": 2, \"hc_mult\": 2, \"hc_sinkhorn_iters\": 3, "
        "\"hc_eps\": 1e-6, \"rms_norm_eps\": 1e-6, \"max_position_embeddings\": 4096, "
        "\"layer_types\": [\"heavily_compressed_attention\", \"compressed_sparse_attention\"], "
        "\"compress_rates\": {\"compressed_sparse_attention\": 4, "
        "\"heavily_compressed_attention\": 16}, \"mlp_layer_types\": [\"hash_moe\", \"moe\"], "
        "\"rope_parameters\": {\"main\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0, "
        "\"partial_rotary_factor\": 0.25}, \"compress\": {\"rope_type\": \"yarn\", "
        "\"rope_theta\": 160000.0, \"factor\": 4.0, \"original_max_position_embeddings\": 1024, "
        "\"beta_fast\": 32, \"beta_slow\": 1, \"attention_factor\": 1.0, "
        "\"partial_rotary_factor\": 0.25}}}";
    is_str(parse(hf, &c), "", "transformers-style config parses");
    ok(c.rope_dim == 4 && c.attn[0] == V4_ATTN_HCA && c.ratio[0] == 16 && c.ratio[1] == 4 && c.hash_moe[0]
       && !c.hash_moe[1] && c.rope_compress.yarn && c.rope_compress.factor == 4
       && c.rope_compress.original_max_pos == 1024, "layer_types, rates, nested rope_parameters");
    v4_config_free(&c);

    expect_error("\"hidden_size\": 64", "\"hidden_size\": \"64\"", "cfg.json: hidden_size: expected an integer",
                 "wrong type");
    expect_error("\"hidden_size\": 64,", "", "cfg.json: hidden_size: missing", "missing field");
    expect_error("\"hc_eps\": 1e-06", "\"hc_eps\": [1]", "cfg.json: hc_eps: expected a number",
                 "number field given an array");
    expect_error("\"compress_ratios\": [0, 4, 8, 4, 0]", "\"compress_ratios\": [0, 4, -8, 4]",
                 "compress_ratios[2]: expected a non-negative integer", "negative ratio");
    expect_error("\"compress_ratios\": [0, 4, 8, 4, 0]",
                 "\"compress_ratios\": [0, 4, 8, 4], \"compress_rates\": "
                 "{\"compressed_sparse_attention\": 4, \"heavily_compressed_attention\": 16}",
                 "compress_ratios[2]: 8 disagrees with compress_rates (heavily_compressed_attention: 16)",
                 "ratios disagreeing with compress_rates");
    expect_error("\"compress_ratios\": [0, 4, 8, 4, 0]", "\"compress_ratios\": [0, 4]",
                 "compress_ratios: has 2 entries, num_hidden_layers is 4", "too few ratios");
    expect_error("\"scoring_func\": \"sqrtsoftplus\"", "\"scoring_func\": \"softmax\"",
                 "scoring_func: expected", "unsupported scoring function");
    expect_error("\"o_groups\": 2", "\"o_groups\": 3", "o_groups: 3 does not divide",
                 "heads not divisible into groups");
    expect_error("\"type\": \"yarn\"", "\"type\": \"ntk\"", "rope_scaling.rope_type: \"ntk\" is not supported",
                 "unknown rope type");
    expect_error("\"weight_block_size\": [128, 128]", "\"weight_block_size\": [64, 64]",
                 "quantization_config.weight_block_size: only [128, 128] is supported",
                 "other FP8 block size");
    expect_error("\"expert_dtype\": \"fp4\"", "\"expert_dtype\": \"fp8\"",
                 "expert_dtype: only \"fp4\" (MXFP4) experts are supported", "other expert format");
    expect_error("\"num_key_value_heads\": 1", "\"num_key_value_heads\": 2",
                 "num_key_value_heads: must be 1", "more than one KV head");
    ok(strstr(parse("[1, 2]", &c), "cfg.json: expected a JSON object") != NULL, "not an object");
    expect_error("\"vocab_size\": 97,", "\"vocab_size\": 97,,", "cfg.json: invalid JSON", "syntax error");
    /* one limit for every backend: a config that loads runs on the GPU too */
    expect_error("\"hc_mult\": 3,", "\"hc_mult\": 17,",
                 "hc_mult: 17 exceeds 16, the most mHC streams a backend supports",
                 "hc_mult over the backends' limit");

    strbuf err;
    sb_init(&err);
    ok(v4_config_load(&c, "/nonexistent/config.json", &err) < 0
       && strstr(err.data, "/nonexistent/config.json: cannot read"), "missing file is named");
    sb_free(&err);
    return exit_status();
}
