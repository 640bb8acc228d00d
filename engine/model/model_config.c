#include "model_config.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "json.h"

/* Reader state: every problem is reported, not just the first. */
typedef struct {
    const char *name;
    strbuf *err;
    int nerr;
} reader;

static void fail(reader *R, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fail(reader *R, const char *field, const char *fmt, ...)
{
    va_list ap;
    sb_printf(R->err, "%s: %s: ", R->name, field);
    va_start(ap, fmt);
    sb_vprintf(R->err, fmt, ap);
    va_end(ap);
    sb_putc(R->err, '\n');
    R->nerr++;
}

/* Integer field; `def` < 0 means required.  Values must be >= min. */
static int get_int(reader *R, yajl_val obj, const char *key, long long def, long long min)
{
    yajl_val v = json_get(obj, key);
    long long x;
    if (!v || YAJL_IS_NULL(v)) {
        if (def < 0) fail(R, key, "missing (an integer is required)");
        return (int)(def < 0 ? 0 : def);
    }
    if (!json_int(v, &x)) { fail(R, key, "expected an integer"); return 0; }
    if (x < min || x > 1000000000LL) {
        fail(R, key, "%lld is out of range (minimum %lld)", x, min);
        return 0;
    }
    return (int)x;
}

static double get_num(reader *R, yajl_val obj, const char *key, bool required, double def)
{
    yajl_val v = json_get(obj, key);
    double x;
    if (!v || YAJL_IS_NULL(v)) {
        if (required) fail(R, key, "missing (a number is required)");
        return def;
    }
    if (!json_number(v, &x) || !isfinite(x)) { fail(R, key, "expected a number"); return def; }
    return x;
}

static bool get_bool(reader *R, yajl_val obj, const char *key, bool def)
{
    yajl_val v = json_get(obj, key);
    bool b;
    if (!v || YAJL_IS_NULL(v)) return def;
    if (!json_bool(v, &b)) { fail(R, key, "expected true or false"); return def; }
    return b;
}

/* YaRN attention factor when the config does not give one
 * (transformers' get_mscale). */
static double yarn_mscale(double scale, double mscale)
{
    return scale <= 1 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

/* One rope parameter dict: {"rope_type"|"type", "rope_theta", "factor", ...}.
 * `theta` overrides the dict's rope_theta when >= 0 (the flat form, where
 * the compress table takes compress_rope_theta).  `yarn_af_default`: the
 * attention factor a yarn table gets when the dict has none (transformers
 * forces 1.0 for the compress table built from a flat rope_scaling). */
static void get_rope(reader *R, yajl_val d, const char *field, double theta,
                     double max_pos, bool force_af_one, v4_rope *out)
{
    memset(out, 0, sizeof *out);
    out->theta = theta;
    out->attention_factor = 1.0;
    if (!d || YAJL_IS_NULL(d)) return;
    char f[96];
    if (!YAJL_IS_OBJECT(d)) { fail(R, field, "expected an object"); return; }
    const char *type = json_string(json_get(d, "rope_type"));
    if (!type) type = json_string(json_get(d, "type"));
    if (!type) type = "default";
    if (theta < 0) {
        snprintf(f, sizeof f, "%s.rope_theta", field);
        out->theta = get_num(R, d, "rope_theta", false, 0);
        if (!json_get(d, "rope_theta")) fail(R, f, "missing (a number is required)");
    }
    if (!strcmp(type, "default")) return;
    if (strcmp(type, "yarn")) {
        snprintf(f, sizeof f, "%s.rope_type", field);
        fail(R, f, "\"%s\" is not supported (default or yarn)", type);
        return;
    }
    out->yarn = true;
    out->original_max_pos = get_num(R, d, "original_max_position_embeddings", false, max_pos);
    yajl_val fv = json_get(d, "factor");
    if (fv && !YAJL_IS_NULL(fv)) out->factor = get_num(R, d, "factor", true, 1);
    else out->factor = max_pos / out->original_max_pos;
    /* transformers: `get("beta_fast") or 32` — zero also means the default */
    out->beta_fast = get_num(R, d, "beta_fast", false, 0);
    out->beta_slow = get_num(R, d, "beta_slow", false, 0);
    if (out->beta_fast == 0) out->beta_fast = 32;
    if (out->beta_slow == 0) out->beta_slow = 1;
    yajl_val af = json_get(d, "attention_factor");
    if (af && !YAJL_IS_NULL(af)) {
        out->attention_factor = get_num(R, d, "attention_factor", true, 1);
    } else if (force_af_one) {
        out->attention_factor = 1.0;
    } else {
        double ms = get_num(R, d, "mscale", false, 0);
        double msa = get_num(R, d, "mscale_all_dim", false, 0);
        out->attention_factor = ms != 0 && msa != 0
            ? yarn_mscale(out->factor, ms) / yarn_mscale(out->factor, msa)
            : yarn_mscale(out->factor, 1);
    }
    if (out->factor <= 0 || out->original_max_pos <= 0) {
        snprintf(f, sizeof f, "%s.factor", field);
        fail(R, f, "yarn needs a positive factor and original_max_position_embeddings");
    }
}

static void get_ropes(reader *R, yajl_val root, v4_config *c)
{
    yajl_val rp = json_get(root, "rope_parameters");
    yajl_val main_d = json_get(rp, "main"), comp_d = json_get(rp, "compress");
    if (main_d && comp_d && YAJL_IS_OBJECT(main_d) && YAJL_IS_OBJECT(comp_d)) {
        /* transformers' nested form: each table complete on its own. */
        get_rope(R, main_d, "rope_parameters.main", -1, c->max_pos, false, &c->rope_main);
        get_rope(R, comp_d, "rope_parameters.compress", -1, c->max_pos, false,
                 &c->rope_compress);
        return;
    }
    /* Released form: rope_theta for the main table, compress_rope_theta
     * with the rope_scaling (YaRN) parameters for the compress table. */
    double theta = get_num(R, root, "rope_theta", true, 10000);
    double ctheta = get_num(R, root, "compress_rope_theta", true, 160000);
    yajl_val scaling = json_get(root, "rope_scaling");
    if (!scaling || YAJL_IS_NULL(scaling)) scaling = rp;
    get_rope(R, NULL, "rope_theta", theta, c->max_pos, false, &c->rope_main);
    get_rope(R, scaling, "rope_scaling", ctheta, c->max_pos, true, &c->rope_compress);
}

/* The weight formats the loader implements: FP8 in 128x128 blocks with
 * UE8M0 scales, MXFP4 experts.  Anything else would be misread. */
static void get_quant(reader *R, yajl_val root)
{
    yajl_val q = json_get(root, "quantization_config");
    if (q && !YAJL_IS_NULL(q)) {
        yajl_val bs = json_get(q, "weight_block_size");
        long long a, b;
        if (bs && !(YAJL_IS_ARRAY(bs) && bs->u.array.len == 2
                    && json_int(bs->u.array.values[0], &a) && json_int(bs->u.array.values[1], &b)
                    && a == 128 && b == 128))
            fail(R, "quantization_config.weight_block_size", "only [128, 128] is supported");
        const char *sf = json_string(json_get(q, "scale_fmt"));
        if (json_get(q, "scale_fmt") && (!sf || strcmp(sf, "ue8m0")))
            fail(R, "quantization_config.scale_fmt", "only \"ue8m0\" is supported");
    }
    const char *ed = json_string(json_get(root, "expert_dtype"));
    if (json_get(root, "expert_dtype") && (!ed || strcmp(ed, "fp4")))
        fail(R, "expert_dtype", "only \"fp4\" (MXFP4) experts are supported");
}

static const struct { const char *name; enum v4_attn type; } attn_names[] = {
    { "sliding_attention", V4_ATTN_SLIDING },
    { "compressed_sparse_attention", V4_ATTN_CSA },
    { "heavily_compressed_attention", V4_ATTN_HCA },
};

/* A per-layer array member.  0 when absent (or null); else 1, with *out
 * the array when it has n entries (or more, when `extra` entries are
 * allowed), or NULL with the problem reported. */
static int get_layer_array(reader *R, yajl_val root, const char *key, const char *of, int n,
                           bool extra, yajl_val *out)
{
    yajl_val a = json_get(root, key);
    *out = NULL;
    if (!a || YAJL_IS_NULL(a)) return 0;
    if (!YAJL_IS_ARRAY(a))
        fail(R, key, "expected an array of %s", of);
    else if ((int)a->u.array.len < n || (!extra && (int)a->u.array.len != n))
        fail(R, key, "has %zu entries, num_hidden_layers is %d", a->u.array.len, n);
    else
        *out = a;
    return 1;
}

static void get_layer_types(reader *R, yajl_val root, v4_config *c)
{
    int n = c->n_layers;
    char f[64];
    c->attn = calloc(n ? n : 1, sizeof *c->attn);
    c->ratio = calloc(n ? n : 1, sizeof *c->ratio);
    c->hash_moe = calloc(n ? n : 1, sizeof *c->hash_moe);

    /* transformers' per-type rates (compress_rates, or legacy scalars). */
    int rate[3] = { 0, 4, 128 };
    bool rates_given = false;
    yajl_val rates = json_get(root, "compress_rates");
    if (rates && YAJL_IS_OBJECT(rates)) {
        rate[V4_ATTN_CSA] = get_int(R, rates, "compressed_sparse_attention", 4, 1);
        rate[V4_ATTN_HCA] = get_int(R, rates, "heavily_compressed_attention", 128, 1);
        rates_given = true;
    } else if (rates && !YAJL_IS_NULL(rates)) {
        fail(R, "compress_rates", "expected an object");
    }
    if (json_get(root, "compress_rate_csa")) {
        rate[V4_ATTN_CSA] = get_int(R, root, "compress_rate_csa", 4, 1);
        rates_given = true;
    }
    if (json_get(root, "compress_rate_hca")) {
        rate[V4_ATTN_HCA] = get_int(R, root, "compress_rate_hca", 128, 1);
        rates_given = true;
    }

    yajl_val lt, cr, mt;
    if (get_layer_array(R, root, "layer_types", "strings", n, false, &lt)) {
        for (int i = 0; lt && i < n; i++) {
            const char *s = json_string(lt->u.array.values[i]);
            size_t k = 0;
            while (k < 3 && !(s && !strcmp(s, attn_names[k].name))) k++;
            snprintf(f, sizeof f, "layer_types[%d]", i);
            if (k == 3) {
                fail(R, f, "expected one of sliding_attention, "
                     "compressed_sparse_attention, heavily_compressed_attention");
            } else {
                c->attn[i] = attn_names[k].type;
                c->ratio[i] = rate[c->attn[i]];
            }
        }
    } else if (get_layer_array(R, root, "compress_ratios", "integers", n, true, &cr)) {
        /* Released per-layer ratios (plus trailing entries for draft
         * layers): 0 sliding, 4 CSA (overlapping windows and the indexer),
         * any other value HCA with that window, as DeepSeek's code reads
         * them.  transformers only maps 0/4/128 and takes the windows from
         * compress_rates; when both are given they must agree. */
        for (int i = 0; cr && i < n; i++) {
            long long r;
            snprintf(f, sizeof f, "compress_ratios[%d]", i);
            if (!json_int(cr->u.array.values[i], &r) || r < 0 || r > 1 << 20) {
                fail(R, f, "expected a non-negative integer");
                continue;
            }
            c->attn[i] = r == 0 ? V4_ATTN_SLIDING : r == 4 ? V4_ATTN_CSA : V4_ATTN_HCA;
            c->ratio[i] = (int)r;
            if (rates_given && r && r != rate[c->attn[i]])
                fail(R, f, "%lld disagrees with compress_rates (%s: %d)", r,
                     attn_names[c->attn[i]].name, rate[c->attn[i]]);
        }
    } else {
        fail(R, "compress_ratios", "missing (or layer_types)");
    }

    if (get_layer_array(R, root, "mlp_layer_types", "strings", n, false, &mt)) {
        for (int i = 0; mt && i < n; i++) {
            const char *s = json_string(mt->u.array.values[i]);
            snprintf(f, sizeof f, "mlp_layer_types[%d]", i);
            if (s && !strcmp(s, "hash_moe")) c->hash_moe[i] = true;
            else if (!s || strcmp(s, "moe")) fail(R, f, "expected \"hash_moe\" or \"moe\"");
        }
    } else if (json_get(root, "num_hash_layers")) {
        int nh = get_int(R, root, "num_hash_layers", 0, 0);
        for (int i = 0; i < n && i < nh; i++) c->hash_moe[i] = true;
    } else {
        fail(R, "num_hash_layers", "missing (or mlp_layer_types)");
    }
}

int v4_config_parse(v4_config *c, const char *text, size_t len, const char *name,
                    strbuf *err)
{
    reader R = { name, err, 0 };
    char perr[256];
    memset(c, 0, sizeof *c);
    yajl_val root = json_parse(text, len, perr, sizeof perr);
    if (!root) {
        sb_printf(err, "%s: invalid JSON: %s\n", name, perr);
        return -1;
    }
    if (!YAJL_IS_OBJECT(root)) {
        sb_printf(err, "%s: expected a JSON object\n", name);
        yajl_tree_free(root);
        return -1;
    }
    c->vocab_size = get_int(&R, root, "vocab_size", -1, 1);
    c->hidden_size = get_int(&R, root, "hidden_size", -1, 1);
    c->n_layers = get_int(&R, root, "num_hidden_layers", -1, 1);
    c->n_heads = get_int(&R, root, "num_attention_heads", -1, 1);
    c->head_dim = get_int(&R, root, "head_dim", -1, 2);
    c->q_lora_rank = get_int(&R, root, "q_lora_rank", -1, 1);
    c->o_groups = get_int(&R, root, "o_groups", -1, 1);
    c->o_lora_rank = get_int(&R, root, "o_lora_rank", -1, 1);
    c->n_experts = get_int(&R, root, "n_routed_experts", -1, 1);
    c->n_shared_experts = get_int(&R, root, "n_shared_experts", 1, 0);
    c->topk = get_int(&R, root, "num_experts_per_tok", -1, 1);
    c->moe_inter = get_int(&R, root, "moe_intermediate_size", -1, 1);
    c->routed_scale = get_num(&R, root, "routed_scaling_factor", true, 1);
    c->swiglu_limit = get_num(&R, root, "swiglu_limit", true, 0);
    c->sliding_window = get_int(&R, root, "sliding_window", -1, 1);
    c->index_heads = get_int(&R, root, "index_n_heads", -1, 1);
    c->index_head_dim = get_int(&R, root, "index_head_dim", -1, 2);
    c->index_topk = get_int(&R, root, "index_topk", -1, 1);
    c->hc_mult = get_int(&R, root, "hc_mult", -1, 1);
    c->hc_sinkhorn_iters = get_int(&R, root, "hc_sinkhorn_iters", -1, 1);
    c->hc_eps = get_num(&R, root, "hc_eps", true, 0);
    c->rms_eps = get_num(&R, root, "rms_norm_eps", true, 0);
    double mp = get_num(&R, root, "max_position_embeddings", true, 0);
    c->max_pos = (long long)mp;
    c->tie_embeddings = get_bool(&R, root, "tie_word_embeddings", false);
    c->bos_id = get_int(&R, root, "bos_token_id", 0x7fffffff, 0);
    if (c->bos_id == 0x7fffffff) c->bos_id = -1;
    yajl_val eos = json_get(root, "eos_token_id");
    long long e;
    c->eos_id = -1;
    if (eos && YAJL_IS_ARRAY(eos) && eos->u.array.len) eos = eos->u.array.values[0];
    if (eos && !YAJL_IS_NULL(eos)) {
        if (json_int(eos, &e) && e >= 0) c->eos_id = (int)e;
        else fail(&R, "eos_token_id", "expected a token id");
    }

    const char *sf = json_string(json_get(root, "scoring_func"));
    if (!json_get(root, "scoring_func")) fail(&R, "scoring_func", "missing (a string is required)");
    else if (sf && !strcmp(sf, "sqrtsoftplus")) c->scoring = V4_SCORE_SQRTSOFTPLUS;
    else if (sf && !strcmp(sf, "sigmoid")) c->scoring = V4_SCORE_SIGMOID;
    else fail(&R, "scoring_func", "expected \"sqrtsoftplus\" or \"sigmoid\"");
    const char *act = json_string(json_get(root, "hidden_act"));
    if (json_get(root, "hidden_act") && (!act || strcmp(act, "silu")))
        fail(&R, "hidden_act", "only \"silu\" is supported");
    if (json_get(root, "num_key_value_heads") && get_int(&R, root, "num_key_value_heads", 1, 1) != 1)
        fail(&R, "num_key_value_heads", "must be 1 (shared-KV attention)");
    if (c->n_shared_experts != 1)
        fail(&R, "n_shared_experts", "must be 1 (the model has one shared expert)");

    /* Partial RoPE: transformers keeps partial_rotary_factor and derives
     * the rope width as int(head_dim * factor); do the same arithmetic. */
    if (json_get(root, "qk_rope_head_dim")) {
        int rd = get_int(&R, root, "qk_rope_head_dim", 0, 0);
        if (c->head_dim) c->rope_dim = (int)(c->head_dim * ((double)rd / c->head_dim));
    } else if (json_get(root, "partial_rotary_factor")) {
        double prf = get_num(&R, root, "partial_rotary_factor", true, 0);
        c->rope_dim = (int)(c->head_dim * prf);
    } else {
        fail(&R, "qk_rope_head_dim", "missing (or partial_rotary_factor)");
    }
    get_ropes(&R, root, c);
    get_quant(&R, root);
    if (c->n_layers > 0 && c->n_layers <= 100000) get_layer_types(&R, root, c);

    /* Cross-field rules the model code relies on. */
    if (!R.nerr) {
        if (c->rope_dim <= 0 || c->rope_dim % 2 || c->rope_dim > c->head_dim
            || c->rope_dim > c->index_head_dim)
            fail(&R, "qk_rope_head_dim", "rope width %d must be even, positive and at most "
                 "head_dim (%d) and index_head_dim (%d)", c->rope_dim, c->head_dim,
                 c->index_head_dim);
        if (c->hc_mult > BACKEND_HC_MAX)
            fail(&R, "hc_mult", "%d exceeds %d, the most mHC streams a backend supports",
                 c->hc_mult, BACKEND_HC_MAX);
    if (c->n_heads % c->o_groups)
            fail(&R, "o_groups", "%d does not divide num_attention_heads %d",
                 c->o_groups, c->n_heads);
        if (c->topk > c->n_experts)
            fail(&R, "num_experts_per_tok", "%d exceeds n_routed_experts %d",
                 c->topk, c->n_experts);
        if (c->rms_eps < 0 || c->hc_eps < 0)
            fail(&R, "rms_norm_eps", "epsilons must not be negative");
    }
    yajl_tree_free(root);
    if (R.nerr) { v4_config_free(c); return -1; }
    return 0;
}

int v4_config_load(v4_config *c, const char *path, strbuf *err)
{
    strbuf sb;
    sb_init(&sb);
    memset(c, 0, sizeof *c);
    if (sb_read_file(&sb, path) < 0) {
        sb_printf(err, "%s: cannot read: %s\n", path, strerror(errno));
        sb_free(&sb);
        return -1;
    }
    int rc = v4_config_parse(c, sb.data, sb.len, path, err);
    sb_free(&sb);
    return rc;
}

void v4_config_free(v4_config *c)
{
    free(c->attn);
    free(c->ratio);
    free(c->hash_moe);
    c->attn = NULL;
    c->ratio = NULL;
    c->hash_moe = NULL;
}
