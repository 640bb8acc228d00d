/* Synthetic weights (llm-engine bench --synthetic): every tensor the loader
 * binds from a real checkpoint is there with the same format, shape and
 * layout; matrices carry no host data (the GPU fills them), small tensors
 * carry finite values, hash tables valid experts; V4-Flash's config binds;
 * loading synthetic weights on the CPU backend is refused with a message. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "model_weights.h"
#include "safetensors.h"
#include "tap.h"

static int bad;

static uint64_t rs = 0x9E3779B97F4A7C15ULL;

static double unit(void)
{
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return ((rs >> 11) + 0.5) / 9007199254740992.0;
}

/* The experts a batch of T tokens routes to through a score-routed layer's
 * synthetic bias: the scores sqrt(softplus(z)) of a random gate, z ~ N(0, 1)
 * (gate rows of std 1/sqrt(H) against a normed x), plus the bias, top K of
 * E; the mean over `reps` batches. */
static double experts_routed(const float *bias, int E, int K, int T, int reps)
{
    double total = 0;
    for (int r = 0; r < reps; r++) {
        char seen[512] = { 0 };
        for (int t = 0; t < T; t++) {
            float s[512];
            for (int e = 0; e < E; e++) {
                double z = sqrt(-2 * log(unit())) * cos(6.283185307179586 * unit());
                s[e] = (float)sqrt(log1p(exp(z))) + bias[e];
            }
            for (int k = 0; k < K; k++) {
                int best = -1;
                for (int e = 0; e < E; e++)
                    if (s[e] > -1e30f && (best < 0 || s[e] > s[best])) best = e;
                total += !seen[best]++;
                s[best] = -1e38f;
            }
        }
    }
    return total / reps;
}

static void same_q(const char *what, int l, const qweight *a, const qweight *b)
{
    if (a->type != b->type || a->rows != b->rows || a->cols != b->cols || a->ld != b->ld ||
        a->scale_ld != b->scale_ld || b->data || b->scale) {
        if (bad++ < 5) diag("layer %d %s: real %d %dx%d ld %lld, synthetic %d %dx%d ld %lld%s", l,
                            what, a->type, a->rows, a->cols, (long long)a->ld, b->type, b->rows,
                            b->cols, (long long)b->ld, b->data ? " with data" : "");
    }
}

static void all_finite(const char *what, int l, const float *v, size_t n)
{
    size_t i = 0;
    while (i < n && v && isfinite(v[i])) i++;
    if (i < n && bad++ < 5) diag("layer %d %s: %s", l, what, v ? "not finite" : "missing");
}

int main(void)
{
    const char *dir = "tests/fixtures/tiny-a";
    v4_config c;
    strbuf err;
    sb_init(&err);
    if (v4_config_load(&c, "tests/fixtures/tiny-a/config.json", &err)) {
        ok(0, "config: %s", err.data);
        return exit_status();
    }
    safetensors st;
    v4_weights real, syn;
    int rc = st_open_dir(&st, dir, &err) || v4_weights_load(&real, &c, &st, dir, &err);
    ok(!rc, "real weights load %s", err.data ? err.data : "");
    int src = v4_weights_synthetic(&syn, &c, 7, &err);
    ok(src == 0, "synthetic weights bind %s", err.data ? err.data : "");
    int H = c.hidden_size, hc = c.hc_mult, mix = (2 + hc) * hc;
    same_q("embed", -1, &real.embed, &syn.embed);
    same_q("head", -1, &real.head, &syn.head);
    all_finite("norm", -1, syn.norm, H);
    all_finite("hc_fn", -1, syn.hc_fn, (size_t)hc * hc * H);
    for (int l = 0; l < c.n_layers; l++) {
        v4_layer *a = &real.layers[l], *b = &syn.layers[l];
        same_q("wq_a", l, &a->wq_a, &b->wq_a);
        same_q("wq_b", l, &a->wq_b, &b->wq_b);
        same_q("wkv", l, &a->wkv, &b->wkv);
        same_q("wo_a", l, &a->wo_a, &b->wo_a);
        same_q("wo_b", l, &a->wo_b, &b->wo_b);
        same_q("gate", l, &a->gate, &b->gate);
        same_q("sw1", l, &a->sw1, &b->sw1);
        same_q("sw2", l, &a->sw2, &b->sw2);
        for (int e = 0; e < c.n_experts; e++) {
            same_q("w1", l, &a->w1[e], &b->w1[e]);
            same_q("w2", l, &a->w2[e], &b->w2[e]);
        }
        if (c.attn[l] != V4_ATTN_SLIDING) {
            same_q("comp.wkv", l, &a->comp.wkv, &b->comp.wkv);
            all_finite("comp.ape", l, b->comp.ape, (size_t)v4_layer_ratio(&c, l) * c.head_dim);
        }
        if (c.attn[l] == V4_ATTN_CSA) same_q("iwq_b", l, &a->iwq_b, &b->iwq_b);
        all_finite("attn_norm", l, b->attn_norm, H);
        all_finite("hc_attn_fn", l, b->hc_attn_fn, (size_t)mix * hc * H);
        all_finite("hc_ffn_scale", l, b->hc_ffn_scale, 3);
        all_finite("sink", l, b->sink, c.n_heads);
        if (c.hash_moe[l] != !!b->tid2eid && bad++ < 5) diag("layer %d: hash table", l);
        for (int v = 0; b->tid2eid && v < c.vocab_size * c.topk; v++) {
            int64_t e = b->tid_i64 ? ((const int64_t *)b->tid2eid)[v]
                                   : ((const int32_t *)b->tid2eid)[v];
            if ((e < 0 || e >= c.n_experts) && bad++ < 5) diag("layer %d: expert %lld", l, (long long)e);
        }
        if (!c.hash_moe[l]) all_finite("gate_bias", l, b->gate_bias, c.n_experts);
    }
    ok(!bad, "synthetic weights match the real ones in format, shape and layout (%d problems)", bad);
    v4_weights_free(&syn);
    if (!rc) v4_weights_free(&real);
    st_close(&st);
    v4_config_free(&c);

    sb_reset(&err);
    v4_config f;
    rc = v4_config_load(&f, "conf/models/deepseek-v4-flash.json", &err);
    ok(!rc, "V4-Flash config loads %s", err.data ? err.data : "");
    if (!rc) {
        src = v4_weights_synthetic(&syn, &f, 1, &err);
        ok(src == 0, "V4-Flash synthetic weights bind %s", err.data ? err.data : "");
        ok(syn.layers[42].w1[255].type == QT_MXFP4 && syn.layers[42].w1[255].rows == 2048 &&
           syn.layers[0].wq_b.rows == 64 * 512 && syn.layers[2].iwq_b.cols == 1024,
           "V4-Flash shapes: experts MXFP4 2048x4096, wq_b 32768 rows, indexer wq_b 1024 cols");
        /* The router's bias balances the load, as a trained one does: a
         * decode batch routes to about as many experts as uniform routing
         * would (what `bench --batch` assumes for the bytes a step reads);
         * +-0.5, as before, gave 82 of 136 at 32 tokens. */
        int E = f.n_experts, K = f.topk, l = f.n_layers - 1;
        double want = E * (1 - pow(1 - (double)K / E, 32)), got = 0;
        if (!f.hash_moe[l] && E <= 512) got = experts_routed(syn.layers[l].gate_bias, E, K, 32, 8);
        ok(got >= 0.95 * want && got <= 1.05 * want,
           "layer %d's synthetic router spreads 32 tokens over %.1f experts (uniform: %.1f)", l,
           got, want);
        v4_weights_free(&syn);
        v4_config_free(&f);
    }

    sb_reset(&err);
    v4_model *m = NULL;
    v4_options o = { .synthetic = true, .backend = "cpu" };
    rc = v4_model_load(&m, "conf/models/deepseek-v4-flash.json", &o, &err);
    ok(rc == -1 && err.data && strstr(err.data, "need --backend cuda"),
       "synthetic on the CPU backend refused: %s", err.data ? err.data : "");
    sb_free(&err);
    return exit_status();
}
