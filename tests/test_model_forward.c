/* The forward pass on a synthetic tiny checkpoint (every layer kind: sliding,
 * CSA with the indexer choosing 3 of up to 10 entries, HCA):
 *   - against a dense double-precision re-derivation of transformers'
 *     formulation (whole-sequence masks, the Ca/Cb slot layout of the
 *     compressors, top-k over masked scores) that shares no code with the
 *     engine's forward beyond weight dequantization and RoPE frequencies;
 *   - full pass = one prefill + decode = chunked prefill = sequences mixed
 *     in one batch;
 *   - TP=2 = TP=1 within float rounding;
 *   - the block pool: capacity, exhaustion leaves sequences unchanged. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cpu/qweight.h"
#include "model_internal.h"
#include "synth_model.h"
#include "tap.h"

#define N 40

static char dir[64];
static int32_t ids[N];

/* ---------- dense reference (double) ---------- */

static double *dq(const qweight *w)      /* whole matrix as double */
{
    double *m = malloc((size_t)w->rows * w->cols * sizeof *m);
    float *row = malloc(w->cols * sizeof *row);
    for (int r = 0; r < w->rows; r++) {
        qweight_row(w, r, 0, w->cols, row);
        for (int c = 0; c < w->cols; c++) m[(size_t)r * w->cols + c] = row[c];
    }
    free(row);
    return m;
}

/* y[T][R] = x[T][C] W^T */
static double *lin(const qweight *w, const double *x, int T)
{
    double *W = dq(w), *y = calloc((size_t)T * w->rows, sizeof *y);
    for (int t = 0; t < T; t++)
        for (int r = 0; r < w->rows; r++) {
            double s = 0;
            for (int c = 0; c < w->cols; c++) s += x[(size_t)t * w->cols + c] * W[(size_t)r * w->cols + c];
            y[(size_t)t * w->rows + r] = s;
        }
    free(W);
    return y;
}

static void rms(double *x, int n, const float *w, double eps)
{
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double r = 1 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) x[i] = x[i] * r * (w ? w[i] : 1);
}

static void rope(double *x, int hd, const rope_table *rt, int pos, int inv)
{
    double *r = x + hd - 2 * rt->npairs;
    for (int i = 0; i < rt->npairs; i++) {
        double a = (double)(float)(rt->inv_freq[i] * (float)pos), c = cos(a), s = sin(a);
        if (inv) s = -s;
        double x0 = r[2 * i], x1 = r[2 * i + 1];
        r[2 * i] = x0 * c - x1 * s;
        r[2 * i + 1] = x1 * c + x0 * s;
    }
}

static double sigm(double x) { return 1 / (1 + exp(-x)); }

/* Compressor over the whole sequence as transformers lays it out: entry w
 * combines slots [Ca of window w-1 (CSA only) | C(b) of window w]. */
static double *ref_compress(const v4_comp_w *cw, const double *x, int T, int H, int m, int d,
                            bool csa, const rope_table *rt, double eps, int *nwin)
{
    int coff = csa ? 2 : 1, wd = coff * d;
    qweight kvw = cw->wkv, gw = cw->wgate;
    (void)H;
    double *kv = lin(&kvw, x, T), *g = lin(&gw, x, T);
    *nwin = T / m;
    double *out = calloc((size_t)*nwin * d + 1, sizeof *out);
    for (int w = 0; w < *nwin; w++) {
        for (int c = 0; c < d; c++) {
            double lg[512], v[512];
            int ns = 0;
            for (int j = 0; csa && j < m; j++) {          /* Ca of the previous window */
                if (w == 0) { lg[ns] = -INFINITY; v[ns++] = 0; continue; }
                int t = (w - 1) * m + j;
                lg[ns] = g[(size_t)t * wd + c] + cw->ape[j * wd + c];
                v[ns++] = kv[(size_t)t * wd + c];
            }
            for (int j = 0; j < m; j++) {
                int t = w * m + j, off = csa ? d : 0;
                lg[ns] = g[(size_t)t * wd + off + c] + cw->ape[j * wd + off + c];
                v[ns++] = kv[(size_t)t * wd + off + c];
            }
            double mx = -INFINITY, z = 0, acc = 0;
            for (int j = 0; j < ns; j++) mx = fmax(mx, lg[j]);
            for (int j = 0; j < ns; j++) z += exp(lg[j] - mx);
            for (int j = 0; j < ns; j++) acc += v[j] * exp(lg[j] - mx) / z;
            out[(size_t)w * d + c] = acc;
        }
        rms(out + (size_t)w * d, d, cw->norm, eps);
        rope(out + (size_t)w * d, d, rt, w * m, 0);
    }
    free(kv);
    free(g);
    return out;
}

static int cmp_desc(const void *a, const void *b, void *v)
{
    const double *s = v;
    int x = *(const int *)a, y = *(const int *)b;
    return s[x] > s[y] ? -1 : s[x] < s[y] ? 1 : x - y;
}

static double *ref_forward(v4_model *M, const int32_t *tok, int T)
{
    const v4_config *c = &M->cfg;
    const v4_weights *W = &M->w;
    int H = c->hidden_size, hc = c->hc_mult, hd = c->head_dim, nh = c->n_heads;
    double eps = (float)c->rms_eps, hce = (float)c->hc_eps;
    double *h = malloc((size_t)T * hc * H * sizeof *h), *xin = malloc((size_t)T * H * sizeof *xin);
    float *row = malloc(H * sizeof *row);
    for (int t = 0; t < T; t++) {
        qweight_row(&W->embed, tok[t], 0, H, row);
        for (int k = 0; k < hc; k++)
            for (int d = 0; d < H; d++) h[((size_t)t * hc + k) * H + d] = row[d];
    }
    double *post = malloc(T * hc * sizeof *post), *comb = malloc(T * hc * hc * sizeof *comb);
    for (int l = 0; l < c->n_layers; l++) {
        const v4_layer *L = &W->layers[l];
        for (int site = 0; site < 2; site++) {
            const float *fn = site ? L->hc_ffn_fn : L->hc_attn_fn;
            const float *base = site ? L->hc_ffn_base : L->hc_attn_base;
            const float *sc = site ? L->hc_ffn_scale : L->hc_attn_scale;
            for (int t = 0; t < T; t++) {
                double *ht = h + (size_t)t * hc * H, ss = 0, mix[64 * 66];
                for (int i = 0; i < hc * H; i++) ss += ht[i] * ht[i];
                double r = 1 / sqrt(ss / (hc * H) + eps);
                for (int j = 0; j < (2 + hc) * hc; j++) {
                    double s = 0;
                    for (int i = 0; i < hc * H; i++) s += ht[i] * r * fn[(size_t)j * hc * H + i];
                    mix[j] = s;
                }
                double pre[64], *cb = comb + t * hc * hc;
                for (int k = 0; k < hc; k++) {
                    pre[k] = sigm(mix[k] * sc[0] + base[k]) + hce;
                    post[t * hc + k] = 2 * sigm(mix[hc + k] * sc[1] + base[hc + k]);
                }
                for (int i = 0; i < hc; i++) {
                    double z = 0;
                    for (int j = 0; j < hc; j++)
                        z += cb[i * hc + j] = exp(mix[2 * hc + i * hc + j] * sc[2] + base[2 * hc + i * hc + j]);
                    for (int j = 0; j < hc; j++) cb[i * hc + j] = cb[i * hc + j] / z + hce;
                }
                for (int it = 0; it < c->hc_sinkhorn_iters; it++) {
                    for (int i = 0; it && i < hc; i++) {
                        double z = 0;
                        for (int j = 0; j < hc; j++) z += cb[i * hc + j];
                        for (int j = 0; j < hc; j++) cb[i * hc + j] /= z + hce;
                    }
                    for (int j = 0; j < hc; j++) {
                        double z = 0;
                        for (int i = 0; i < hc; i++) z += cb[i * hc + j];
                        for (int i = 0; i < hc; i++) cb[i * hc + j] /= z + hce;
                    }
                }
                for (int d = 0; d < H; d++) {
                    double s = 0;
                    for (int k = 0; k < hc; k++) s += pre[k] * ht[(size_t)k * H + d];
                    xin[(size_t)t * H + d] = s;
                }
                rms(xin + (size_t)t * H, H, site ? L->ffn_norm : L->attn_norm, eps);
            }
            double *y = calloc((size_t)T * H, sizeof *y);
            if (!site) {
                int m = v4_layer_ratio(c, l), qlr = c->q_lora_rank;
                bool csa = c->attn[l] == V4_ATTN_CSA;
                const rope_table *rt = m ? &M->rope_comp : &M->rope_main;
                double *qr = lin(&L->wq_a, xin, T);
                for (int t = 0; t < T; t++) rms(qr + (size_t)t * qlr, qlr, L->q_norm, eps);
                double *q = lin(&L->wq_b, qr, T), *kv = lin(&L->wkv, xin, T);
                for (int t = 0; t < T; t++) {
                    for (int k = 0; k < nh; k++) {
                        rms(q + ((size_t)t * nh + k) * hd, hd, NULL, eps);
                        rope(q + ((size_t)t * nh + k) * hd, hd, rt, t, 0);
                    }
                    rms(kv + (size_t)t * hd, hd, L->kv_norm, eps);
                    rope(kv + (size_t)t * hd, hd, rt, t, 0);
                }
                int nwin = 0;
                double *ce = m ? ref_compress(&L->comp, xin, T, H, m, hd, csa, &M->rope_comp, eps, &nwin) : NULL;
                /* allowed[t][w]: which compressed entries query t sees */
                char *allowed = calloc((size_t)T * (nwin + 1), 1);
                for (int t = 0; t < T; t++)
                    for (int w = 0; w < nwin; w++) allowed[(size_t)t * nwin + w] = !csa && w < (t + 1) / m;
                if (csa) {
                    int ihd = c->index_head_dim, inh = c->index_heads, iw_n;
                    double *ik = ref_compress(&L->icomp, xin, T, H, m, ihd, true, &M->rope_comp, eps, &iw_n);
                    double *qi = lin(&L->iwq_b, qr, T), *wt = lin(&L->iweights, xin, T);
                    for (int t = 0; t < T; t++) {
                        for (int k = 0; k < inh; k++) rope(qi + ((size_t)t * inh + k) * ihd, ihd, &M->rope_comp, t, 0);
                        double score[4096];
                        int order[4096];
                        for (int w = 0; w < nwin; w++) {
                            double s = 0;
                            for (int k = 0; k < inh; k++) {
                                double dot = 0;
                                for (int e = 0; e < ihd; e++)
                                    dot += qi[((size_t)t * inh + k) * ihd + e] * ik[(size_t)w * ihd + e];
                                s += fmax(dot, 0) * pow(ihd, -0.5) * wt[(size_t)t * inh + k] * pow(inh, -0.5);
                            }
                            score[w] = w < (t + 1) / m ? s : -INFINITY;
                            order[w] = w;
                        }
                        qsort_r(order, nwin, sizeof *order, cmp_desc, score);
                        int k = nwin < c->index_topk ? nwin : c->index_topk;
                        for (int j = 0; j < k; j++)
                            if (order[j] < (t + 1) / m) allowed[(size_t)t * nwin + order[j]] = 1;
                    }
                    free(ik), free(qi), free(wt);
                }
                double *o = calloc((size_t)T * nh * hd, sizeof *o);
                for (int t = 0; t < T; t++)
                    for (int k = 0; k < nh; k++) {
                        const double *qv = q + ((size_t)t * nh + k) * hd;
                        double lg[4096], z = 0, mx = L->sink[k];
                        const double *key[4096];
                        int nk = 0;
                        for (int j = 0; j <= t; j++)
                            if (t - j < c->sliding_window) key[nk++] = kv + (size_t)j * hd;
                        for (int w = 0; w < nwin; w++)
                            if (allowed[(size_t)t * nwin + w]) key[nk++] = ce + (size_t)w * hd;
                        for (int j = 0; j < nk; j++) {
                            double s = 0;
                            for (int e = 0; e < hd; e++) s += qv[e] * key[j][e];
                            lg[j] = s * pow(hd, -0.5);
                            mx = fmax(mx, lg[j]);
                        }
                        z = exp(L->sink[k] - mx);
                        for (int j = 0; j < nk; j++) z += lg[j] = exp(lg[j] - mx);
                        double *ov = o + ((size_t)t * nh + k) * hd;
                        for (int j = 0; j < nk; j++)
                            for (int e = 0; e < hd; e++) ov[e] += lg[j] / z * key[j][e];
                        rope(ov, hd, rt, t, 1);
                    }
                /* grouped output projection */
                int G = c->o_groups, olr = c->o_lora_rank, gin = nh / G * hd;
                double *WA = dq(&L->wo_a), *oa = calloc((size_t)T * G * olr, sizeof *oa);
                for (int t = 0; t < T; t++)
                    for (int g = 0; g < G; g++)
                        for (int r = 0; r < olr; r++) {
                            double s = 0;
                            for (int e = 0; e < gin; e++)
                                s += WA[((size_t)g * olr + r) * gin + e] * o[(size_t)t * nh * hd + g * gin + e];
                            oa[((size_t)t * G + g) * olr + r] = s;
                        }
                free(y);
                y = lin(&L->wo_b, oa, T);
                free(WA), free(oa), free(o), free(qr), free(q), free(kv), free(ce), free(allowed);
            } else {
                int E = c->n_experts, K = c->topk;
                double *lg = lin(&L->gate, xin, T);
                for (int t = 0; t < T; t++) {
                    double s[256], b[256];
                    int idx[256];
                    for (int e = 0; e < E; e++) {
                        double v = lg[(size_t)t * E + e];
                        s[e] = sqrt(v > 20 ? v : log1p(exp(v)));
                        b[e] = s[e] + (L->gate_bias ? L->gate_bias[e] : 0);
                        idx[e] = e;
                    }
                    if (L->tid2eid) {
                        for (int k = 0; k < K; k++)
                            idx[k] = L->tid_i64 ? (int)((const int64_t *)L->tid2eid)[tok[t] * K + k]
                                                : ((const int32_t *)L->tid2eid)[tok[t] * K + k];
                    } else {
                        qsort_r(idx, E, sizeof *idx, cmp_desc, b);
                    }
                    double z = 0;
                    for (int k = 0; k < K; k++) z += s[idx[k]];
                    for (int k = 0; k < K + 1; k++) {
                        /* K routed experts, then the shared one with weight 1 */
                        const qweight *w1 = k < K ? &L->w1[idx[k]] : &L->sw1;
                        const qweight *w2 = k < K ? &L->w2[idx[k]] : &L->sw2;
                        const qweight *w3 = k < K ? &L->w3[idx[k]] : &L->sw3;
                        double wt = k < K ? s[idx[k]] / z * c->routed_scale : 1;
                        double *g = lin(w1, xin + (size_t)t * H, 1), *u = lin(w3, xin + (size_t)t * H, 1);
                        double lim = c->swiglu_limit;
                        for (int i = 0; i < w1->rows; i++) {
                            double gv = fmin(g[i], lim), uv = fmax(-lim, fmin(u[i], lim));
                            g[i] = gv * sigm(gv) * uv;
                        }
                        double *yy = lin(w2, g, 1);
                        for (int d = 0; d < H; d++) y[(size_t)t * H + d] += wt * yy[d];
                        free(g), free(u), free(yy);
                    }
                }
                free(lg);
            }
            for (int t = 0; t < T; t++) {
                double *ht = h + (size_t)t * hc * H, *cb = comb + t * hc * hc;
                double *old = malloc((size_t)hc * H * sizeof *old);
                memcpy(old, ht, (size_t)hc * H * sizeof *old);
                for (int k = 0; k < hc; k++)
                    for (int d = 0; d < H; d++) {
                        double s = post[t * hc + k] * y[(size_t)t * H + d];
                        for (int j = 0; j < hc; j++) s += cb[j * hc + k] * old[(size_t)j * H + d];
                        ht[(size_t)k * H + d] = s;
                    }
                free(old);
            }
            free(y);
        }
    }
    /* hc_head, final norm, head */
    for (int t = 0; t < T; t++) {
        double *ht = h + (size_t)t * hc * H, ss = 0;
        for (int i = 0; i < hc * H; i++) ss += ht[i] * ht[i];
        double r = 1 / sqrt(ss / (hc * H) + eps);
        for (int d = 0; d < H; d++) xin[(size_t)t * H + d] = 0;
        for (int k = 0; k < hc; k++) {
            double mx = 0;
            for (int i = 0; i < hc * H; i++) mx += ht[i] * r * W->hc_fn[(size_t)k * hc * H + i];
            double pre = sigm(mx * W->hc_scale[0] + W->hc_base[k]) + hce;
            for (int d = 0; d < H; d++) xin[(size_t)t * H + d] += pre * ht[(size_t)k * H + d];
        }
        rms(xin + (size_t)t * H, H, W->norm, eps);
    }
    double *logits = lin(&W->head, xin, T);
    free(h), free(xin), free(row), free(post), free(comb);
    return logits;
}

/* ---------- engine runs ---------- */

static v4_model *load(int tp, int max_seqs, int64_t cache_tokens)
{
    v4_options o = { .tp = tp, .threads_per_rank = 1, .max_seqs = max_seqs,
                     .cache_tokens = cache_tokens };
    v4_model *m;
    strbuf err;
    sb_init(&err);
    if (v4_model_load(&m, dir, &o, &err)) {
        diag("load: %s", err.data);
        m = NULL;
    }
    sb_free(&err);
    return m;
}

/* Run ids through one sequence in chunks of the given sizes (cycled);
 * logits of every position into out [N][V]. */
static int run_chunks(v4_model *m, const int *chunks, int nchunks, float *out)
{
    strbuf err;
    sb_init(&err);
    v4_seq *s = v4_seq_new(m, &err);
    int V = m->cfg.vocab_size, t = 0, k = 0, rc = 0;
    while (s && t < N && !rc) {
        int n = chunks[k++ % nchunks];
        if (n > N - t) n = N - t;
        v4_step_item it = { s, ids + t, n, out + (size_t)t * V, true, NULL };
        rc = v4_step(m, &it, 1, &err);
        t += n;
    }
    if (rc || !s) diag("run: %s", err.data);
    v4_seq_free(m, s);
    sb_free(&err);
    return rc || !s ? -1 : 0;
}

/* Relative L2 error over all rows, and the max abs difference. */
/* Error text without its final newline. */
static const char *msg(strbuf *e)
{
    while (e->len && e->data[e->len - 1] == '\n') e->data[--e->len] = 0;
    return e->data;
}

static double rel_err(const float *a, const double *b, size_t n, double *maxabs)
{
    double d = 0, z = 0;
    *maxabs = 0;
    for (size_t i = 0; i < n; i++) {
        d += (a[i] - b[i]) * (a[i] - b[i]);
        z += b[i] * b[i];
        *maxabs = fmax(*maxabs, fabs(a[i] - b[i]));
    }
    return sqrt(d / z);
}

static double rel_errf(const float *a, const float *b, size_t n, double *maxabs)
{
    double *bd = malloc(n * sizeof *bd);
    for (size_t i = 0; i < n; i++) bd[i] = b[i];
    double r = rel_err(a, bd, n, maxabs);
    free(bd);
    return r;
}

static void run_case(const synth_spec *sp, const char *name);

int main(void)
{
    synth_spec spec;
    synth_preset(&spec, "tiny");
    run_case(&spec, "tiny");
    /* Other shapes: CSA first, an HCA window of 16, 4 streams and 7
     * Sinkhorn rounds, 3 output groups (uneven over 2 ranks), 2 hash layers
     * with I32 tid2eid, an active SwiGLU clamp. */
    spec.heads = 6, spec.o_groups = 3, spec.o_lora = 16, spec.hc_mult = 4;
    spec.sinkhorn_iters = 7, spec.hash_layers = 2, spec.tid_i32 = true;
    spec.swiglu_limit = 0.5, spec.routed_scale = 2.5, spec.topk = 3, spec.index_topk = 5;
    spec.sliding_window = 12, spec.layers = 4;
    spec.ratios[0] = 4, spec.ratios[1] = 16, spec.ratios[2] = 0, spec.ratios[3] = 4;
    run_case(&spec, "variant");
    return exit_status();
}

/* The sampler's greedy rule: the lowest id among equal maxima, NaN
 * never, 0 when nothing is above -inf. */
static int32_t greedy_of(const float *x, int V)
{
    float best = -INFINITY;
    int32_t at = 0;
    for (int i = 0; i < V; i++)
        if (x[i] > best) best = x[i], at = i;
    return at;
}

/* Items that take only the greedy choice (v4_step_item.argmax) beside
 * items that take logits, in one step: each choice is the greedy rule on
 * the logits the same step gives when every item takes them (same
 * batch, so the same bits), the logits items' rows unchanged; then a
 * decode step of argmax items only; bad items refused. */
static void argmax_items(v4_model *m, int tp)
{
    int V = m->cfg.vocab_size;
    strbuf err;
    sb_init(&err);
    const int n[3] = { 5, 7, 3 };
    float *lg = calloc((size_t)6 * V, sizeof *lg), *ref = calloc((size_t)6 * V, sizeof *ref);
    int32_t k[3] = { -1, -1, -1 }, next[3];
    bool pass = true;
    for (int round = 0; round < 2 && pass; round++) {     /* 0: reference, 1: argmax for 1 */
        v4_seq *s[3];
        for (int i = 0; i < 3; i++) s[i] = v4_seq_new(m, &err);
        if (!s[0] || !s[1] || !s[2]) {
            ok(0, "tp %d: three sequences: %s", tp, err.data ? err.data : "");
            pass = false;
            break;
        }
        float *out = round ? lg : ref;
        v4_step_item it[3];
        for (int i = 0; i < 3; i++)
            it[i] = (v4_step_item){ s[i], ids + 2 * i, n[i], out + (size_t)i * V, false, NULL };
        if (round) it[1].logits = NULL, it[1].argmax = &k[1];
        int rc = v4_step(m, it, 3, &err);
        for (int i = 0; i < 3; i++) next[i] = ids[20 + i];
        /* decode: every item argmax in round 1 */
        for (int i = 0; i < 3 && !rc; i++) {
            it[i] = (v4_step_item){ s[i], &next[i], 1, out + (size_t)(3 + i) * V, false, NULL };
            if (round) it[i].logits = NULL, it[i].argmax = &k[i];
        }
        if (!rc) rc = v4_step(m, it, 3, &err);
        ok(rc == 0, "tp %d: argmax round %d steps: %s", tp, round, rc ? err.data : "ok");
        pass = rc == 0;
        for (int i = 0; i < 3; i++) v4_seq_free(m, s[i]);
        if (!round) continue;
        /* the prefill step's logits items and argmax item */
        ok(!memcmp(lg, ref, (size_t)V * sizeof *lg) &&
           !memcmp(lg + 2 * V, ref + 2 * V, (size_t)V * sizeof *lg),
           "tp %d: logits items beside an argmax item get the same logits", tp);
    }
    if (pass) {
        /* round 1's k[] hold the decode step's choices; the prefill one
         * (k[1] of the first step) was overwritten: compare the decode's */
        bool same = true;
        for (int i = 0; i < 3; i++) same &= k[i] == greedy_of(ref + (size_t)(3 + i) * V, V);
        ok(same, "tp %d: a decode step's argmax items = the greedy rule on its logits "
           "(%d %d %d)", tp, k[0], k[1], k[2]);
    }
    /* a prefill chunk alone: its argmax against its logits */
    v4_seq *a = v4_seq_new(m, &err);
    int32_t k1 = -1;
    v4_step_item one = { a, ids + 2, n[1], ref, false, NULL };
    int rc = a ? v4_step(m, &one, 1, &err) : -1;
    v4_seq_free(m, a);
    a = v4_seq_new(m, &err);
    one = (v4_step_item){ a, ids + 2, n[1], NULL, false, &k1 };
    rc = rc || !a ? -1 : v4_step(m, &one, 1, &err);
    ok(!rc && k1 == greedy_of(ref, V),
       "tp %d: a prefill chunk's argmax = the greedy rule on its last row (%d)", tp, k1);
    v4_seq_free(m, a);
    a = v4_seq_new(m, &err);
    one = (v4_step_item){ a, ids, 3, NULL, true, &k1 };
    sb_reset(&err);
    rc = v4_step(m, &one, 1, &err);
    ok(rc < 0 && strstr(err.data, "argmax only"),
       "tp %d: argmax with every row's logits is refused: %s", tp, err.data);
    one = (v4_step_item){ a, ids, 3, NULL, false, NULL };
    sb_reset(&err);
    rc = v4_step(m, &one, 1, &err);
    ok(rc < 0 && strstr(err.data, "argmax slot"),
       "tp %d: an item with neither logits nor argmax is refused: %s", tp, err.data);
    v4_seq_free(m, a);
    free(lg), free(ref);
    sb_free(&err);
}

static void run_case(const synth_spec *sp, const char *name)
{
    synth_spec spec = *sp;
    diag("case %s", name);
    snprintf(dir, sizeof dir, "/tmp/test_model_forward.XXXXXX");
    if (!mkdtemp(dir)) return;
    strbuf err;
    sb_init(&err);
    if (synth_write_dir(&spec, 3, dir, 1, &err)) {
        diag("synth: %s", err.data);
        return;
    }
    for (int i = 0; i < N; i++) ids[i] = (i * 37 + 11) % spec.vocab;
    v4_model *m = load(1, 3, 4 * N);
    if (!m) return;
    int V = m->cfg.vocab_size;
    size_t NV = (size_t)N * V;
    float *full = malloc(NV * sizeof *full), *other = malloc(NV * sizeof *other);
    double ma;

    int all[1] = { N };
    ok(run_chunks(m, all, 1, full) == 0, "full forward of %d tokens", N);
    double *ref = ref_forward(m, ids, N);
    double re = rel_err(full, ref, NV, &ma);
    ok(re < 1e-5 && ma < 1e-4, "full forward = dense double reference (rel L2 %.2g, max abs %.2g)", re, ma);
    int argmax_same = 1;
    for (int t = 0; t < N; t++) {
        int a = 0, b = 0;
        for (int v = 1; v < V; v++) {
            a = full[(size_t)t * V + v] > full[(size_t)t * V + a] ? v : a;
            b = ref[(size_t)t * V + v] > ref[(size_t)t * V + b] ? v : b;
        }
        argmax_same &= a == b;
    }
    ok(argmax_same, "greedy tokens agree with the reference at every position");

    int halves[] = { N / 2, 1 };
    run_chunks(m, halves, 2, other);
    re = rel_errf(other, full, NV, &ma);
    ok(re < 1e-6, "half prefill + token-by-token decode = full (rel %.2g)", re);
    int odd[] = { 3, 5, 1, 7, 2, 9, 4 };
    run_chunks(m, odd, 7, other);
    re = rel_errf(other, full, NV, &ma);
    ok(re < 1e-6, "chunks of 3,5,1,7,2,9,4 = full (rel %.2g)", re);
    int ones[] = { 1 };
    run_chunks(m, ones, 1, other);
    re = rel_errf(other, full, NV, &ma);
    ok(re < 1e-6, "all token by token = full (rel %.2g)", re);

    /* Three sequences in the same steps: A prefills in chunks while B
     * decodes and C starts late; each must equal its own full pass. */
    {
        v4_seq *s[3];
        for (int i = 0; i < 3; i++) s[i] = v4_seq_new(m, &err);
        float *out[3];
        int pos[3] = { 0, 0, 0 }, step = 0, bad = 0;
        for (int i = 0; i < 3; i++) out[i] = malloc(NV * sizeof(float));
        while ((pos[0] < N || pos[1] < N || pos[2] < N) && !bad) {
            v4_step_item it[3];
            int n = 0;
            int want[3] = { step % 2 ? 6 : 2, 1, step < 4 ? 0 : 3 };
            for (int i = 0; i < 3; i++) {
                int k = want[i] < N - pos[i] ? want[i] : N - pos[i];
                if (k <= 0) continue;
                it[n++] = (v4_step_item){ s[i], ids + pos[i], k, out[i] + (size_t)pos[i] * V, true, NULL };
                pos[i] += k;
            }
            bad = v4_step(m, it, n, &err);
            step++;
        }
        double worst = 0;
        for (int i = 0; i < 3; i++) {
            worst = fmax(worst, rel_errf(out[i], full, NV, &ma));
            free(out[i]);
            v4_seq_free(m, s[i]);
        }
        ok(!bad && worst < 1e-6, "3 sequences batched with mixed chunk sizes = full (rel %.2g)", worst);
    }

    /* last-position logits only */
    {
        v4_seq *s = v4_seq_new(m, &err);
        float *last = malloc(V * sizeof *last);
        v4_step_item it = { s, ids, N, last, false, NULL };
        v4_step(m, &it, 1, &err);
        ok(!memcmp(last, full + (size_t)(N - 1) * V, V * sizeof *last),
           "last-position logits equal the last row of the full pass");
        ok(v4_seq_len(s) == N, "sequence length advances");
        free(last);
        v4_seq_free(m, s);
    }

    /* Pool bookkeeping and errors. */
    {
        v4_cache_info ci;
        v4_cache_info_get(m, &ci);
        size_t want = 0;
        bool divisible = ci.block_tokens >= 64;
        for (int l = 0; l < spec.layers; l++) {
            int r = spec.ratios[l];
            if (!r) continue;
            divisible &= ci.block_tokens % r == 0;
            want += (size_t)(ci.block_tokens / r) * (spec.head_dim + (r == 4 ? spec.index_head_dim : 0));
        }
        ok(divisible && ci.blocks_used == 0 && ci.seqs_total == 3 && ci.seqs_used == 0,
           "pool: block of %d positions (a multiple of every window), all free", ci.block_tokens);
        ok(ci.block_bytes == want * sizeof(float),
           "block bytes = compressed entries + indexer keys of its positions");
        ok(v4_blocks_for_tokens(m, 1) == 1 && v4_blocks_for_tokens(m, ci.block_tokens + 1) == 2
           && v4_blocks_for_tokens(m, 0) == 0, "blocks for n tokens");
        v4_seq *a = v4_seq_new(m, &err), *b = v4_seq_new(m, &err), *c = v4_seq_new(m, &err);
        sb_reset(&err);
        v4_seq *d = v4_seq_new(m, &err);
        ok(a && b && c && !d && strstr(err.data, "no free sequence slot"), "max_seqs enforced: %s",
           msg(&err));
        v4_cache_info_get(m, &ci);
        int64_t free_blocks = ci.blocks_total - ci.blocks_used;
        int32_t *big = calloc((size_t)(free_blocks + 1) * ci.block_tokens, sizeof *big);
        float *lg = malloc(V * sizeof *lg);
        v4_step_item it[2] = { { a, ids, 5, lg, false, NULL },
                               { b, big, (int)((free_blocks) * ci.block_tokens), lg, false, NULL } };
        sb_reset(&err);
        int rc = v4_step(m, it, 2, &err);
        v4_cache_info_get(m, &ci);
        ok(rc < 0 && strstr(err.data, "cache pool exhausted") && v4_seq_len(a) == 0
           && v4_seq_len(b) == 0 && ci.blocks_used == 0,
           "pool exhaustion fails the step and leaves every sequence as it was: %s", msg(&err));
        bool full_slots = !v4_can_admit(m, 10);
        v4_seq_free(m, c);
        c = NULL;
        ok(full_slots && v4_can_admit(m, 10) && v4_can_admit(m, free_blocks * ci.block_tokens)
           && !v4_can_admit(m, free_blocks * ci.block_tokens + 1),
           "admission needs a free slot and enough free blocks");
        /* Reservation at admission: b takes all but one block up front;
         * a can still run one block's worth, and nothing more fits. */
        rc = v4_seq_reserve(m, b, (free_blocks - 1) * ci.block_tokens, &err);
        v4_cache_info_get(m, &ci);
        ok(rc == 0 && ci.blocks_used == free_blocks - 1, "reserve takes blocks up front");
        sb_reset(&err);
        ok(v4_seq_reserve(m, a, 2 * ci.block_tokens, &err) < 0 && strstr(err.data, "2 blocks needed"),
           "a reservation that does not fit fails whole: %s", msg(&err));
        it[0] = (v4_step_item){ a, ids, 5, lg, false, NULL };
        it[1] = (v4_step_item){ b, ids, 7, lg, false, NULL };
        v4_cache_info_get(m, &ci);
        int64_t used = ci.blocks_used;
        rc = v4_step(m, it, 2, &err);
        v4_cache_info_get(m, &ci);
        ok(rc == 0 && ci.blocks_used == used + 1 && v4_seq_len(b) == 7,
           "steps inside a reservation take no new blocks");
        it[0].n_tokens = 1;
        int32_t badtok = V;
        it[0].tokens = &badtok;
        sb_reset(&err);
        rc = v4_step(m, it, 1, &err);
        ok(rc < 0 && strstr(err.data, "outside the vocabulary"),
           "token outside the vocabulary is rejected: %s", msg(&err));
        v4_seq_free(m, a), v4_seq_free(m, b), v4_seq_free(m, c);
        free(big), free(lg);
    }
    argmax_items(m, 1);
    v4_model_free(m);

    /* TP=2 and TP=4 (more ranks than output groups: some hold no heads)
     * against TP=1, full and incremental. */
    for (int tp = 2; tp <= 4; tp += 2) {
        m = load(tp, 3, 4 * N);
        ok(m != NULL, "tp %d loads", tp);
        if (!m) continue;
        run_chunks(m, all, 1, other);
        re = rel_errf(other, full, NV, &ma);
        ok(re < 1e-5 && ma < 1e-4, "tp %d full = tp 1 (rel %.2g, max abs %.2g)", tp, re, ma);
        run_chunks(m, halves, 2, other);
        re = rel_errf(other, full, NV, &ma);
        ok(re < 1e-5, "tp %d incremental = tp 1 (rel %.2g)", tp, re);
        argmax_items(m, tp);
        v4_model_free(m);
    }
    free(full), free(other), free(ref);
    sb_free(&err);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) diag("could not remove %s", dir);
}
