#include "synth_model.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cpu/quant.h"

int synth_preset(synth_spec *s, const char *name)
{
    memset(s, 0, sizeof *s);
    if (!strcmp(name, "tiny")) {
        /* Four layers: sliding, CSA, HCA (window 8 to see entries early), CSA. */
        *s = (synth_spec){ .vocab = 97, .hidden = 64, .layers = 4, .heads = 4, .head_dim = 32,
                           .rope_dim = 8, .q_lora = 48, .o_groups = 2, .o_lora = 24,
                           .experts = 6, .topk = 2, .moe_inter = 64, .hash_layers = 1,
                           .sliding_window = 8, .index_heads = 2, .index_head_dim = 16,
                           .index_topk = 3, .hc_mult = 3, .sinkhorn_iters = 20,
                           .swiglu_limit = 10, .routed_scale = 1.5, .ratios = { 0, 4, 8, 4 } };
        return 0;
    }
    if (!strcmp(name, "mid")) {
        *s = (synth_spec){ .vocab = 32000, .hidden = 1024, .layers = 6, .heads = 16,
                           .head_dim = 128, .rope_dim = 32, .q_lora = 384, .o_groups = 4,
                           .o_lora = 256, .experts = 32, .topk = 4, .moe_inter = 512,
                           .hash_layers = 1, .sliding_window = 128, .index_heads = 8,
                           .index_head_dim = 64, .index_topk = 64, .hc_mult = 4,
                           .sinkhorn_iters = 20, .swiglu_limit = 10, .routed_scale = 1.5,
                           .ratios = { 0, 4, 128, 4, 128, 4 } };
        return 0;
    }
    return -1;
}

int synth_spec_from_config(synth_spec *s, const v4_config *c, int layers, strbuf *err)
{
    memset(s, 0, sizeof *s);
    int L = layers > 0 && layers < c->n_layers ? layers : c->n_layers;
    if (L > SYNTH_MAX_LAYERS) {
        sb_printf(err, "%d layers: at most %d (--layers N takes the first N)\n", L,
                  SYNTH_MAX_LAYERS);
        return -1;
    }
    if (c->n_shared_experts != 1 || c->scoring != V4_SCORE_SQRTSOFTPLUS || c->topk > 64) {
        sb_printf(err, "the config has %d shared experts, %s scores and top-%d routing; "
                  "synth writes 1 shared expert, sqrtsoftplus, top-k <= 64\n",
                  c->n_shared_experts, c->scoring == V4_SCORE_SIGMOID ? "sigmoid" : "sqrtsoftplus",
                  c->topk);
        return -1;
    }
    *s = (synth_spec){ .vocab = c->vocab_size, .hidden = c->hidden_size, .layers = L,
                       .heads = c->n_heads, .head_dim = c->head_dim, .rope_dim = c->rope_dim,
                       .q_lora = c->q_lora_rank, .o_groups = c->o_groups,
                       .o_lora = c->o_lora_rank, .experts = c->n_experts, .topk = c->topk,
                       .moe_inter = c->moe_inter, .sliding_window = c->sliding_window,
                       .index_heads = c->index_heads, .index_head_dim = c->index_head_dim,
                       .index_topk = c->index_topk, .hc_mult = c->hc_mult,
                       .sinkhorn_iters = c->hc_sinkhorn_iters, .swiglu_limit = c->swiglu_limit,
                       .routed_scale = c->routed_scale, .codes = true };
    for (int l = 0; l < L; l++) {
        s->ratios[l] = c->ratio[l];
        if (c->hash_moe[l]) s->hash_layers = l + 1;
        if ((c->attn[l] == V4_ATTN_CSA) != (c->ratio[l] == 4)) {
            sb_printf(err, "layer %d: compress ratio %d with %s attention; synth writes CSA "
                      "exactly for ratio 4\n", l, c->ratio[l],
                      c->attn[l] == V4_ATTN_CSA ? "CSA" : "other");
            return -1;
        }
    }
    return 0;
}

void synth_config_json(const synth_spec *s, strbuf *o)
{
    sb_printf(o, "{\n  \"architectures\": [\"DeepseekV4ForCausalLM\"],\n"
              "  \"model_type\": \"deepseek_v4\",\n");
    sb_printf(o, "  \"vocab_size\": %d,\n  \"hidden_size\": %d,\n  \"num_hidden_layers\": %d,\n",
              s->vocab, s->hidden, s->layers);
    sb_printf(o, "  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": 1,\n"
              "  \"head_dim\": %d,\n  \"qk_rope_head_dim\": %d,\n", s->heads, s->head_dim,
              s->rope_dim);
    sb_printf(o, "  \"q_lora_rank\": %d,\n  \"o_groups\": %d,\n  \"o_lora_rank\": %d,\n",
              s->q_lora, s->o_groups, s->o_lora);
    sb_printf(o, "  \"n_routed_experts\": %d,\n  \"n_shared_experts\": 1,\n"
              "  \"num_experts_per_tok\": %d,\n  \"moe_intermediate_size\": %d,\n",
              s->experts, s->topk, s->moe_inter);
    sb_printf(o, "  \"scoring_func\": \"sqrtsoftplus\",\n  \"norm_topk_prob\": true,\n"
              "  \"routed_scaling_factor\": %g,\n  \"swiglu_limit\": %g,\n"
              "  \"num_hash_layers\": %d,\n", s->routed_scale, s->swiglu_limit, s->hash_layers);
    sb_printf(o, "  \"sliding_window\": %d,\n  \"index_n_heads\": %d,\n"
              "  \"index_head_dim\": %d,\n  \"index_topk\": %d,\n", s->sliding_window,
              s->index_heads, s->index_head_dim, s->index_topk);
    sb_printf(o, "  \"hc_mult\": %d,\n  \"hc_sinkhorn_iters\": %d,\n  \"hc_eps\": 1e-06,\n"
              "  \"rms_norm_eps\": 1e-06,\n", s->hc_mult, s->sinkhorn_iters);
    sb_printf(o, "  \"rope_theta\": 10000,\n  \"compress_rope_theta\": 160000,\n"
              "  \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 16, "
              "\"original_max_position_embeddings\": 65536, \"beta_fast\": 32, "
              "\"beta_slow\": 1},\n  \"max_position_embeddings\": 1048576,\n");
    sb_printf(o, "  \"compress_ratios\": [");
    for (int l = 0; l < s->layers; l++) sb_printf(o, "%s%d", l ? ", " : "", s->ratios[l]);
    sb_printf(o, ", 0],\n");
    sb_printf(o, "  \"bos_token_id\": 0,\n  \"eos_token_id\": 1,\n"
              "  \"tie_word_embeddings\": false,\n  \"expert_dtype\": \"fp4\",\n"
              "  \"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", "
              "\"scale_fmt\": \"ue8m0\", \"weight_block_size\": [128, 128]}\n}\n");
}

/* ---- random numbers (xorshift64*, Box-Muller) ---- */

/* codes: synth_spec.codes (weights drawn as codes of their format). */
typedef struct { uint64_t s; bool codes; } rng;

static uint64_t next_u64(rng *r)
{
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545F4914F6CDD1DULL;
}

static double uniform(rng *r) { return ((next_u64(r) >> 11) + 0.5) / 9007199254740992.0; }

static float normal(rng *r, float std)
{
    return (float)(std * sqrt(-2 * log(uniform(r))) * cos(2 * M_PI * uniform(r)));
}

/* Normal values, or with r->codes uniform ones of the same mean and std
 * (a hundred times cheaper than Box-Muller at full shapes). */
static float *randn(rng *r, size_t n, float mean, float std)
{
    float *v = malloc(n * sizeof *v);
    if (!v) abort();
    if (r->codes) {
        float a = std * sqrtf(3.0f) / 2147483648.0f;
        for (size_t i = 0; i < n; i++) v[i] = mean + a * (float)((int64_t)(next_u64(r) >> 32) - 2147483648LL);
    } else {
        for (size_t i = 0; i < n; i++) v[i] = mean + normal(r, std);
    }
    return v;
}

/* Random FP8 e4m3 codes of magnitude below 4 (0x00-0x47, no NaN) with
 * one UE8M0 scale for std about 1/sqrt(C); their RMS is near 1.1. */
static void codes_fp8(rng *r, uint8_t *q, uint8_t *sc, size_t n, size_t nscale, int C)
{
    for (size_t i = 0; i < n; i += 4) {
        uint64_t x = next_u64(r);
        for (size_t k = 0; k < 4 && i + k < n; k++, x >>= 16)
            q[i + k] = (uint8_t)((((x & 0xff) * 72) >> 8) | (x & 0x100 ? 0x80 : 0));
    }
    memset(sc, 127 + (int)lrint(log2(1.0 / (sqrt((double)C) * 1.1))), nscale);
}

/* Random MXFP4 bytes (two uniform E2M1 codes, RMS near 2.93) with UE8M0
 * scales for std about 1/sqrt(C). */
static void codes_fp4(rng *r, uint8_t *q, uint8_t *sc, size_t n, size_t nscale, int C)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t x = next_u64(r);
        memcpy(q + i, &x, 8);
    }
    for (; i < n; i++) q[i] = (uint8_t)next_u64(r);
    memset(sc, 127 + (int)lrint(log2(1.0 / (sqrt((double)C) * 2.93))), nscale);
}

/* Power-of-two scale exponent that brings amax within the format's max. */
static int scale_exp(float amax, float fmax)
{
    if (amax <= 0) return 0;
    int e = (int)ceil(log2(amax / fmax));
    return e < -127 ? -127 : e > 127 ? 127 : e;
}

static void put_f32(st_writer *w, const char *name, int ndim, int64_t d0, int64_t d1,
                    const float *v)
{
    int64_t shape[2] = { d0, d1 };
    stw_tensor *t = stw_add(w, name, ST_F32, ndim, shape);
    memcpy(t->data, v, t->nbytes);
}

static void put_bf16(st_writer *w, const char *name, int ndim, int64_t d0, int64_t d1,
                     const float *v)
{
    int64_t shape[2] = { d0, d1 };
    stw_tensor *t = stw_add(w, name, ST_BF16, ndim, shape);
    uint16_t *h = t->data;
    for (int64_t i = 0; i < d0 * (ndim > 1 ? d1 : 1); i++) h[i] = f32_to_bf16(v[i]);
}

/* FP8 e4m3 with one UE8M0 scale per 128x128 block. */
static void put_fp8(st_writer *w, const char *p, int R, int C, const float *v)
{
    char n[192];
    int sr = (R + 127) / 128, sc = (C + 127) / 128;
    int64_t shape[2] = { R, C }, sshape[2] = { sr, sc };
    snprintf(n, sizeof n, "%s.weight", p);
    uint8_t *q = stw_add(w, n, ST_F8_E4M3, 2, shape)->data;
    snprintf(n, sizeof n, "%s.scale", p);
    uint8_t *s = stw_add(w, n, ST_F8_E8M0, 2, sshape)->data;
    for (int br = 0; br < sr; br++)
        for (int bc = 0; bc < sc; bc++) {
            float amax = 0;
            for (int r = br * 128; r < R && r < br * 128 + 128; r++)
                for (int c = bc * 128; c < C && c < bc * 128 + 128; c++)
                    amax = fmaxf(amax, fabsf(v[(size_t)r * C + c]));
            int e = scale_exp(amax, 448);
            s[br * sc + bc] = (uint8_t)(e + 127);
            for (int r = br * 128; r < R && r < br * 128 + 128; r++)
                for (int c = bc * 128; c < C && c < bc * 128 + 128; c++)
                    q[(size_t)r * C + c] = f32_to_fp8_e4m3(ldexpf(v[(size_t)r * C + c], -e));
        }
}

/* MXFP4: E2M1 pairs (low nibble first), one UE8M0 scale per 32 inputs. */
static void put_fp4(st_writer *w, const char *p, int R, int C, const float *v)
{
    char n[192];
    int64_t shape[2] = { R, C / 2 }, sshape[2] = { R, C / 32 };
    snprintf(n, sizeof n, "%s.weight", p);
    uint8_t *q = stw_add(w, n, ST_I8, 2, shape)->data;
    snprintf(n, sizeof n, "%s.scale", p);
    uint8_t *s = stw_add(w, n, ST_F8_E8M0, 2, sshape)->data;
    for (int r = 0; r < R; r++)
        for (int b = 0; b < C / 32; b++) {
            const float *x = v + (size_t)r * C + b * 32;
            float amax = 0;
            for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
            int e = scale_exp(amax, 6);
            s[(size_t)r * (C / 32) + b] = (uint8_t)(e + 127);
            for (int i = 0; i < 32; i += 2) {
                uint8_t lo = f32_to_fp4_e2m1(ldexpf(x[i], -e));
                uint8_t hi = f32_to_fp4_e2m1(ldexpf(x[i + 1], -e));
                q[((size_t)r * C + b * 32 + i) / 2] = (uint8_t)(lo | hi << 4);
            }
        }
}

/* A linear layer [R][C] with std 1/sqrt(C), in the given storage. */
enum store { S_FP8, S_FP4, S_BF16 };
static void linear(st_writer *w, rng *r, enum store st, int R, int C, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static void linear(st_writer *w, rng *r, enum store st, int R, int C, const char *fmt, ...)
{
    char p[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p, sizeof p, fmt, ap);
    va_end(ap);
    if (r->codes && st != S_BF16) {
        char n[176];
        int64_t shape[2] = { R, st == S_FP8 ? C : C / 2 };
        int64_t sshape[2] = { st == S_FP8 ? (R + 127) / 128 : R,
                              st == S_FP8 ? (C + 127) / 128 : C / 32 };
        snprintf(n, sizeof n, "%s.weight", p);
        stw_tensor *t = stw_add(w, n, st == S_FP8 ? ST_F8_E4M3 : ST_I8, 2, shape);
        uint8_t *q = t->data;   /* t moves when the next tensor is added */
        size_t nq = t->nbytes;
        snprintf(n, sizeof n, "%s.scale", p);
        t = stw_add(w, n, ST_F8_E8M0, 2, sshape);
        (st == S_FP8 ? codes_fp8 : codes_fp4)(r, q, t->data, nq, t->nbytes, C);
        return;
    }
    float *v = randn(r, (size_t)R * C, 0, 1.0f / sqrtf((float)C));
    if (st == S_FP8) put_fp8(w, p, R, C, v);
    else if (st == S_FP4) put_fp4(w, p, R, C, v);
    else {
        char n[176];
        snprintf(n, sizeof n, "%s.weight", p);
        put_bf16(w, n, 2, R, C, v);
    }
    free(v);
}

static void norm_w(st_writer *w, rng *r, int n, const char *name)
{
    float *v = randn(r, n, 1.0f, 0.1f);
    put_bf16(w, name, 1, n, 0, v);
    free(v);
}

static void f32_rand(st_writer *w, rng *r, const char *name, int ndim, int d0, int d1,
                     float mean, float std)
{
    float *v = randn(r, (size_t)d0 * (ndim > 1 ? d1 : 1), mean, std);
    put_f32(w, name, ndim, d0, d1, v);
    free(v);
}

static void hc_params(st_writer *w, rng *r, const char *p, int nmix, int hc, int H, int nscale)
{
    char n[96];
    snprintf(n, sizeof n, "%s_fn", p);
    f32_rand(w, r, n, 2, nmix, hc * H, 0, 1.0f / sqrtf((float)(hc * H)));
    snprintf(n, sizeof n, "%s_base", p);
    f32_rand(w, r, n, 1, nmix, 0, 0, 0.5f);
    snprintf(n, sizeof n, "%s_scale", p);
    f32_rand(w, r, n, 1, nscale, 0, 1.0f, 0.2f);
}

static void compressor(st_writer *w, rng *r, const char *p, int ratio, int coff, int d, int H)
{
    char n[128];
    linear(w, r, S_BF16, coff * d, H, "%s.wkv", p);
    linear(w, r, S_BF16, coff * d, H, "%s.wgate", p);
    snprintf(n, sizeof n, "%s.ape", p);
    f32_rand(w, r, n, 2, ratio, coff * d, 0, 0.5f);
    snprintf(n, sizeof n, "%s.norm.weight", p);
    norm_w(w, r, d, n);
}

void synth_tensors(const synth_spec *s, uint64_t seed, st_writer *w)
{
    rng r = { seed * 0x9E3779B97F4A7C15ULL + 1, s->codes };
    int H = s->hidden, hc = s->hc_mult, hd = s->head_dim, E = s->experts, I = s->moe_inter;
    char p[128];
    float *emb = randn(&r, (size_t)s->vocab * H, 0, 1.0f);
    put_bf16(w, "embed.weight", 2, s->vocab, H, emb);
    free(emb);
    linear(w, &r, S_BF16, s->vocab, H, "head");
    norm_w(w, &r, H, "norm.weight");
    hc_params(w, &r, "hc_head", hc, hc, H, 1);
    for (int l = 0; l < s->layers; l++) {
        snprintf(p, sizeof p, "layers.%d.attn_norm.weight", l);
        norm_w(w, &r, H, p);
        snprintf(p, sizeof p, "layers.%d.ffn_norm.weight", l);
        norm_w(w, &r, H, p);
        snprintf(p, sizeof p, "layers.%d.hc_attn", l);
        hc_params(w, &r, p, (2 + hc) * hc, hc, H, 3);
        snprintf(p, sizeof p, "layers.%d.hc_ffn", l);
        hc_params(w, &r, p, (2 + hc) * hc, hc, H, 3);

        linear(w, &r, S_FP8, s->q_lora, H, "layers.%d.attn.wq_a", l);
        snprintf(p, sizeof p, "layers.%d.attn.q_norm.weight", l);
        norm_w(w, &r, s->q_lora, p);
        linear(w, &r, S_FP8, s->heads * hd, s->q_lora, "layers.%d.attn.wq_b", l);
        linear(w, &r, S_FP8, hd, H, "layers.%d.attn.wkv", l);
        snprintf(p, sizeof p, "layers.%d.attn.kv_norm.weight", l);
        norm_w(w, &r, hd, p);
        linear(w, &r, S_BF16, s->o_groups * s->o_lora, s->heads * hd / s->o_groups,
               "layers.%d.attn.wo_a", l);
        linear(w, &r, S_FP8, H, s->o_groups * s->o_lora, "layers.%d.attn.wo_b", l);
        snprintf(p, sizeof p, "layers.%d.attn.attn_sink", l);
        f32_rand(w, &r, p, 1, s->heads, 0, 0, 1.0f);
        int ratio = s->ratios[l];
        if (ratio) {
            snprintf(p, sizeof p, "layers.%d.attn.compressor", l);
            compressor(w, &r, p, ratio, s->ratios[l] == 4 ? 2 : 1, hd, H);
        }
        if (s->ratios[l] == 4) {
            snprintf(p, sizeof p, "layers.%d.attn.indexer.compressor", l);
            compressor(w, &r, p, ratio, 2, s->index_head_dim, H);
            linear(w, &r, S_FP8, s->index_heads * s->index_head_dim, s->q_lora,
                   "layers.%d.attn.indexer.wq_b", l);
            linear(w, &r, S_BF16, s->index_heads, H, "layers.%d.attn.indexer.weights_proj", l);
        }

        linear(w, &r, S_BF16, E, H, "layers.%d.ffn.gate", l);
        if (l < s->hash_layers) {
            int64_t shape[2] = { s->vocab, s->topk };
            snprintf(p, sizeof p, "layers.%d.ffn.gate.tid2eid", l);
            stw_tensor *t = stw_add(w, p, s->tid_i32 ? ST_I32 : ST_I64, 2, shape);
            for (int v = 0; v < s->vocab; v++) {
                /* topk distinct experts per token */
                int chosen[64], n = 0;
                while (n < s->topk) {
                    int e = (int)(next_u64(&r) % (uint64_t)E), dup = 0;
                    for (int j = 0; j < n; j++) dup |= chosen[j] == e;
                    if (!dup) chosen[n++] = e;
                }
                for (int k = 0; k < s->topk; k++) {
                    if (s->tid_i32) ((int32_t *)t->data)[v * s->topk + k] = chosen[k];
                    else ((int64_t *)t->data)[v * s->topk + k] = chosen[k];
                }
            }
        } else {
            snprintf(p, sizeof p, "layers.%d.ffn.gate.bias", l);
            /* small: a trained router's bias balances the experts' load,
             * and this random gate has none to balance (model_weights.c's
             * synth_data says what a large one did to a batch's experts) */
            f32_rand(w, &r, p, 1, E, 0, 0, 0.01f);
        }
        for (int e = 0; e < E; e++) {
            linear(w, &r, S_FP4, I, H, "layers.%d.ffn.experts.%d.w1", l, e);
            linear(w, &r, S_FP4, H, I, "layers.%d.ffn.experts.%d.w2", l, e);
            linear(w, &r, S_FP4, I, H, "layers.%d.ffn.experts.%d.w3", l, e);
        }
        linear(w, &r, S_FP8, I, H, "layers.%d.ffn.shared_experts.w1", l);
        linear(w, &r, S_FP8, H, I, "layers.%d.ffn.shared_experts.w2", l);
        linear(w, &r, S_FP8, I, H, "layers.%d.ffn.shared_experts.w3", l);
    }
}

int synth_write_dir(const synth_spec *s, uint64_t seed, const char *dir, int nshards,
                    strbuf *err)
{
    if (mkdir(dir, 0755) && errno != EEXIST) {
        sb_printf(err, "%s: cannot create: %s\n", dir, strerror(errno));
        return -1;
    }
    strbuf cfg, path;
    sb_init(&cfg);
    sb_init(&path);
    synth_config_json(s, &cfg);
    sb_printf(&path, "%s/config.json", dir);
    FILE *f = fopen(path.data, "w");
    int rc = 0;
    if (!f || sb_fwrite(&cfg, f)) {
        sb_printf(err, "%s: cannot write\n", path.data);
        rc = -1;
    }
    if (f) fclose(f);
    if (!rc) {
        st_writer w;
        stw_init(&w);
        synth_tensors(s, seed, &w);
        rc = stw_write_dir(&w, dir, nshards, err);
        stw_free(&w);
    }
    sb_free(&cfg);
    sb_free(&path);
    return rc;
}
