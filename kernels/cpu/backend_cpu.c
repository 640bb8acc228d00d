/* The reference CPU backend: float32 everywhere, weights dequantized on
 * the fly, work split over a per-rank thread pool.
 *
 * Allocation policy: ops take their scratch with scratch(), which checks
 * it; a shortage marks the backend out of memory (error() says what
 * needed how much), the op skips its work, and the step is discarded by
 * the model, which ends that step's requests and calls recover(): the
 * backend holds no state a failed op could have left half-written. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu/matmul.h"
#include "cpu/ops.h"
#include "cpu/quant.h"
#include "threadpool.h"
#include "tp.h"

typedef struct {
    threadpool *pool;
    tp_group *group;
    int rank;
    atomic_bool oom;        /* an op lacked scratch since the last recover() */
    char oom_msg[160];      /* written by the op that set oom first */
    bool fp8;               /* backend_cpu_set_fp8 */
} cpu_impl;

static threadpool *pool_of(backend *b) { return ((cpu_impl *)b->impl)->pool; }

static void out_of_memory(cpu_impl *c, const char *what, size_t bytes)
{
    bool no = false;
    if (atomic_compare_exchange_strong(&c->oom, &no, true))
        snprintf(c->oom_msg, sizeof c->oom_msg,
                 "out of host memory: %s needs %zu bytes of scratch", what, bytes);
}

/* Checked scratch for an op (see the allocation policy above). */
static void *scratch(cpu_impl *c, const char *what, size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) out_of_memory(c, what, bytes);
    return p;
}

static void *cpu_alloc(backend *b, size_t bytes)
{
    (void)b;
    size_t n = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, n ? n : 64);
    if (p) memset(p, 0, n);
    return p;
}

static void cpu_release(backend *b, void *p) { (void)b; free(p); }

static void cpu_copy_rows(backend *b, float *dst, int ldd, const float *src, int lds,
                          int rows, int n)
{
    (void)b;
    for (int r = 0; r < rows; r++)
        memcpy(dst + (size_t)r * ldd, src + (size_t)r * lds, n * sizeof(float));
}

static void cpu_write(backend *b, void *dst, const void *src, size_t bytes)
{
    (void)b;
    memcpy(dst, src, bytes);
}

static const char *cpu_error(backend *b)
{
    cpu_impl *c = b->impl;
    return atomic_load(&c->oom) ? c->oom_msg : NULL;
}

static bool cpu_recover(backend *b)
{
    atomic_store(&((cpu_impl *)b->impl)->oom, false);
    return true;
}

/* cpu_matmul over n rows of x, in a step of T tokens, a scratch shortage
 * reported as the backend's: under the fp8 mode (backend_cpu_set_fp8), in
 * steps of GEMM_MODE_MIN_T+ tokens, on a copy of x quantized for FP8 and
 * MXFP4 weights (act_quant_round) or rounded to bf16 for BF16 ones
 * (DeepSeek's bf16 activations), unless exact (the router's scores). */
static void matmul(cpu_impl *c, int T, const qweight *w, bool exact, const float *x, int ldx,
                   int n, float *y, int ldy)
{
    float *q = NULL;
    bool quant = w->type == QT_FP8 || w->type == QT_MXFP4;
    if (c->fp8 && !exact && T >= GEMM_MODE_MIN_T && (quant || w->type == QT_BF16)) {
        int K = w->cols;
        q = scratch(c, "fp8 activations", (size_t)n * K * sizeof *q + 4);
        if (!q) return;
        for (int t = 0; t < n; t++) {
            float *qt = q + (size_t)t * K;
            memcpy(qt, x + (size_t)t * ldx, K * sizeof *q);
            if (quant) act_quant_round(qt, K);
            else
                for (int k = 0; k < K; k++) qt[k] = bf16_round(qt[k]);
        }
        x = q;
        ldx = K;
    }
    if (cpu_matmul(c->pool, w, x, ldx, n, y, ldy))
        out_of_memory(c, "matmul", (size_t)4 * w->cols * sizeof(float));
    free(q);
}

static void cpu_matmul_op(backend *b, const qweight *w, const float *x, int ldx, int T,
                          float *y, int ldy)
{
    matmul(b->impl, T, w, false, x, ldx, T, y, ldy);
}

static void cpu_embed(backend *b, const qweight *w, const int32_t *ids, int T, int copies,
                      float *out)
{
    (void)b;
    size_t n = w->cols;
    for (int t = 0; t < T; t++) {
        float *o = out + (size_t)t * copies * n;
        qweight_row(w, ids[t], 0, w->cols, o);
        for (int k = 1; k < copies; k++) memcpy(o + k * n, o, n * sizeof *o);
    }
}

static void cpu_rmsnorm(backend *b, const float *x, int ldx, int T, int n,
                        const float *weight, float eps, float *out, int ldo)
{
    (void)b;
    for (int t = 0; t < T; t++)
        cpu_rmsnorm_row(x + (size_t)t * ldx, n, weight, eps, out + (size_t)t * ldo);
}

static void cpu_rope(backend *b, float *x, int ld, int T, int nheads, int head_dim,
                     const rope_table *rt, const int32_t *pos, bool inverse)
{
    (void)b;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nheads; h++)
            cpu_rope_head(x + (size_t)t * ld + (size_t)h * head_dim, head_dim, rt->npairs,
                          rt->inv_freq, rt->attn_factor, pos[t], inverse);
}

static void cpu_scale(backend *b, float *x, int ld, int T, int n, float s)
{
    (void)b;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < n; i++) x[(size_t)t * ld + i] *= s;
}

/* ---- hyper-connections ---- */

typedef struct {
    const float *h, *fn, *base, *scale;
    int hc, H, iters;
    float hc_eps, norm_eps;
    float *post, *comb, *out;
    bool head;          /* hc_head: only the pre weights, no Sinkhorn */
    cpu_impl *c;
} hc_job;

static void hc_task(void *ctx, int t)
{
    hc_job *J = ctx;
    int hc = J->hc, H = J->H, n = hc * H;
    int nmix = J->head ? hc : (2 + hc) * hc;
    const float *h = J->h + (size_t)t * n;
    float *flat = scratch(J->c, "hc_pre", ((size_t)n + nmix + hc) * sizeof *flat);
    if (!flat) return;
    float *m = flat + n, *pre = m + nmix;
    /* Unweighted RMSNorm over all streams, then the mix projection. */
    cpu_rmsnorm_row(h, n, NULL, J->norm_eps, flat);
    for (int j = 0; j < nmix; j++) m[j] = cpu_dot(flat, J->fn + (size_t)j * n, n);
    if (J->head) {
        for (int s = 0; s < hc; s++)
            pre[s] = cpu_sigmoid(m[s] * J->scale[0] + J->base[s]) + J->hc_eps;
    } else {
        cpu_hc_mix(m, hc, J->base, J->scale, J->iters, J->hc_eps, pre,
                   J->post + (size_t)t * hc, J->comb + (size_t)t * hc * hc);
    }
    float *o = J->out + (size_t)t * H;
    for (int d = 0; d < H; d++) {
        float s = 0;
        for (int k = 0; k < hc; k++) s += pre[k] * h[(size_t)k * H + d];
        o[d] = s;
    }
    free(flat);
}

static void cpu_hc_pre(backend *b, const float *h, int T, int hc, int H, const float *fn,
                       const float *base, const float *scale, int iters, float hc_eps,
                       float norm_eps, float *post, float *comb, float *collapsed)
{
    hc_job J = { h, fn, base, scale, hc, H, iters, hc_eps, norm_eps, post, comb, collapsed,
                 false, b->impl };
    threadpool_run(pool_of(b), hc_task, &J, T);
}

static void cpu_hc_head(backend *b, const float *h, int T, int hc, int H, const float *fn,
                        const float *base, const float *scale, float hc_eps, float norm_eps,
                        float *out)
{
    hc_job J = { h, fn, base, scale, hc, H, 0, hc_eps, norm_eps, NULL, NULL, out, true, b->impl };
    threadpool_run(pool_of(b), hc_task, &J, T);
}

static void cpu_hc_post(backend *b, float *h, const float *y, const float *post,
                        const float *comb, int T, int hc, int H)
{
    (void)b;
    float old[BACKEND_HC_MAX];
    for (int t = 0; t < T; t++) {
        float *ht = h + (size_t)t * hc * H;
        const float *pt = post + (size_t)t * hc, *ct = comb + (size_t)t * hc * hc;
        const float *yt = y + (size_t)t * H;
        for (int d = 0; d < H; d++) {
            for (int j = 0; j < hc; j++) old[j] = ht[(size_t)j * H + d];
            for (int k = 0; k < hc; k++) {
                float s = 0;
                for (int j = 0; j < hc; j++) s += ct[j * hc + k] * old[j];
                ht[(size_t)k * H + d] = pt[k] * yt[d] + s;
            }
        }
    }
}

/* ---- compressor ---- */

static void cpu_compress1(backend *b, const compress_args *a)
{
    int m = a->ratio, d = a->d, coff = a->overlap ? 2 : 1, wd = coff * d;
    float *win = a->state;                          /* m rows of [kv wd | gate wd] */
    float *ovl = win + (size_t)m * 2 * wd;          /* m rows of [Ca d | Ga d] */
    float *entry = scratch(b->impl, "compress", ((size_t)d + 4 * m) * sizeof *entry);
    if (!entry) return;
    float *lg = entry + d, *val = lg + 2 * m;
    for (int i = 0; i < a->n; i++) {
        int pos = a->pos0 + i, s = pos % m;
        float *row = win + (size_t)s * 2 * wd;
        const float *kv = a->kv + (size_t)i * a->ld, *g = a->gate + (size_t)i * a->ld;
        const float *ape = a->ape + (size_t)s * wd;
        for (int c = 0; c < wd; c++) {
            row[c] = kv[c];
            row[wd + c] = g[c] + ape[c];
        }
        if (s != m - 1) continue;
        int w = pos / m;
        for (int c = 0; c < d; c++) {
            int ns = 0;
            if (a->overlap && w > 0)
                for (int j = 0; j < m; j++) {
                    lg[ns] = ovl[(size_t)j * 2 * d + d + c];
                    val[ns++] = ovl[(size_t)j * 2 * d + c];
                }
            int off = a->overlap ? d : 0;   /* CSA: this window's Cb half */
            for (int j = 0; j < m; j++) {
                lg[ns] = win[(size_t)j * 2 * wd + wd + off + c];
                val[ns++] = win[(size_t)j * 2 * wd + off + c];
            }
            float mx = -INFINITY, sum = 0, acc = 0;
            for (int j = 0; j < ns; j++) mx = lg[j] > mx ? lg[j] : mx;
            for (int j = 0; j < ns; j++) { lg[j] = expf(lg[j] - mx); sum += lg[j]; }
            for (int j = 0; j < ns; j++) acc += val[j] * (lg[j] / sum);
            entry[c] = acc;
        }
        cpu_rmsnorm_row(entry, d, a->norm, a->eps, entry);
        cpu_rope_head(entry, d, a->rope->npairs, a->rope->inv_freq, a->rope->attn_factor,
                      w * m, 0);
        paged_store(&a->out, w, entry);
        if (a->overlap)
            for (int j = 0; j < m; j++) {
                memcpy(ovl + (size_t)j * 2 * d, win + (size_t)j * 2 * wd, d * sizeof(float));
                memcpy(ovl + (size_t)j * 2 * d + d, win + (size_t)j * 2 * wd + wd,
                       d * sizeof(float));
            }
    }
    free(entry);
}

/* ---- lightning indexer ---- */

static int cmp_i32(const void *x, const void *y)
{
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return (a > b) - (a < b);
}

typedef struct {
    const indexer_args *a;
    cpu_impl *c;
    bool fp8;               /* indexer_fp8_scores under the fp8 mode */
} indexer_job;

static void indexer_task(void *ctx, int i)
{
    const indexer_job *J = ctx;
    const indexer_args *a = J->a;
    int p = a->pos0 + i, nvis = (p + 1) / a->ratio;
    int32_t *sel = a->sel + (size_t)i * a->topk;
    if (nvis <= a->topk) {
        /* Every visible entry is chosen whatever the scores. */
        for (int s = 0; s < nvis; s++) sel[s] = s;
        a->nsel[i] = nvis;
        return;
    }
    size_t qn = J->fp8 ? (size_t)a->nheads * a->d : 0;
    float *score = scratch(J->c, "indexer", ((size_t)nvis + a->d + qn) * sizeof *score);
    if (!score) return;
    float *k = score + nvis;
    const float *q = a->q + (size_t)i * a->nheads * a->d, *w = a->w + (size_t)i * a->nheads;
    if (J->fp8) {
        /* each head's queries as their FP8 codes times the head's scale */
        float *q8 = k + a->d;
        memcpy(q8, q, qn * sizeof *q8);
        for (int h = 0; h < a->nheads; h++) act_quant_round(q8 + (size_t)h * a->d, a->d);
        q = q8;
    }
    float sm = (float)pow(a->d, -0.5);
    for (int s = 0; s < nvis; s++) {
        paged_load(&a->keys, s, k);
        if (J->fp8) act_quant_round(k, a->d);
        float acc = 0;
        for (int h = 0; h < a->nheads; h++) {
            float dot = cpu_dot(q + (size_t)h * a->d, k, a->d);
            acc += (dot > 0 ? dot : 0) * sm * w[h];
        }
        score[s] = acc;
    }
    cpu_topk(score, nvis, a->topk, sel);
    qsort(sel, a->topk, sizeof *sel, cmp_i32);
    a->nsel[i] = a->topk;
    free(score);
}

static void cpu_indexer1(backend *b, const indexer_args *a)
{
    cpu_impl *c = b->impl;
    indexer_job J = { a, c, c->fp8 && indexer_fp8_scores(a) };
    threadpool_run(pool_of(b), indexer_task, &J, a->n);
}

/* ---- attention ---- */

#define HEADS_PER_TASK 4

typedef struct {
    const attention_args *a;
    cpu_impl *c;
} attention_job;

/* Under the fp8 mode, chunks of GEMM_MODE_MIN_T+ tokens over a BF16 or
 * FP8 cache attend with bf16 queries and probabilities: the CUDA
 * backend's tensor-core kernel for such chunks in that mode (one bf16
 * part each, as DeepSeek's attention kernels; decode steps keep float32
 * here and two parts there), over the same tiles of a token's keys as
 * its default one token a block (LLM_CUDA_ATTN_TOKENS=2 tiles the union
 * of two tokens' keys, so rounds at other points). */
static bool attention_in_bf16(const cpu_impl *c, const attention_args *a)
{
    return c->fp8 && a->n >= GEMM_MODE_MIN_T && a->dtype != KV_F32;
}

static void attention_task(void *ctx, int task)
{
    const attention_job *J = ctx;
    const attention_args *a = J->a;
    int hchunks = (a->nheads + HEADS_PER_TASK - 1) / HEADS_PER_TASK;
    int i = task / hchunks, h0 = task % hchunks * HEADS_PER_TASK;
    int nh = a->nheads - h0 < HEADS_PER_TASK ? a->nheads - h0 : HEADS_PER_TASK;
    int p = a->pos0 + i, hd = a->head_dim;
    int first = p - a->window + 1 > 0 ? p - a->window + 1 : 0;
    int ncomp = 0;
    if (a->ratio) ncomp = a->sel ? a->nsel[i] : (p + 1) / a->ratio;
    int nk = p - first + 1 + ncomp;
    /* Keys stored in float32 are read in place, others decoded into dec. */
    size_t nkeys = (size_t)nk * sizeof(const float *);
    char *mem = scratch(J->c, "attention",
                        nkeys + ((size_t)nk + hd + (size_t)nk * hd + 1) * sizeof(float));
    if (!mem) return;
    const float **keys = (const float **)mem;
    float *work = (float *)(mem + nkeys), *dec = work + nk + hd;
    int k = 0;
    for (int j = first; j <= p; j++, k++) {
        if (j >= a->pos0) keys[k] = a->kv + (size_t)(j - a->pos0) * hd;
        else if (a->dtype == KV_F32) keys[k] = (const float *)a->ring + (size_t)(j % a->window) * hd;
        else {
            kv_load(a->dtype, a->ring, a->window, hd, j % a->window, dec + (size_t)k * hd);
            keys[k] = dec + (size_t)k * hd;
        }
    }
    for (int s = 0; s < ncomp; s++, k++) {
        int r = a->sel ? a->sel[(size_t)i * a->sel_ld + s] : s;
        if (a->comp.dtype == KV_F32) {
            keys[k] = (const float *)paged_region(&a->comp, r) + (size_t)(r % a->comp.per_block) * hd;
        } else {
            paged_load(&a->comp, r, dec + (size_t)k * hd);
            keys[k] = dec + (size_t)k * hd;
        }
    }
    size_t qo = (size_t)i * a->nheads * hd + (size_t)h0 * hd;
    cpu_attend(a->q + qo, nh, hd, keys, nk, a->scale, a->sinks + h0, attention_in_bf16(J->c, a),
               a->out + qo, work);
    free(mem);
}

static void cpu_attention1(backend *b, const attention_args *a)
{
    int hchunks = (a->nheads + HEADS_PER_TASK - 1) / HEADS_PER_TASK;
    attention_job J = { a, b->impl };
    threadpool_run(pool_of(b), attention_task, &J, a->n * hchunks);
}

static void cpu_ring_store(backend *b, const ring_args *a, int nseg, enum kv_dtype t, int window,
                           int head_dim)
{
    (void)b;
    for (int i = 0; i < nseg; i++) {
        int pos0 = a[i].pos0, n = a[i].n;
        int from = pos0 + n - window > pos0 ? pos0 + n - window : pos0;
        for (int j = from; j < pos0 + n; j++)
            kv_store(t, a[i].ring, window, head_dim, j % window,
                     a[i].kv + (size_t)(j - pos0) * head_dim);
    }
}

static void cpu_kv_round(backend *b, float *x, int ld, int T, int n, enum kv_dtype t)
{
    (void)b;
    for (int r = 0; r < T; r++) kv_round(t, x + (size_t)r * ld, n);
}

/* ---- mixture of experts ---- */

static void swiglu(const float *g, const float *u, size_t n, float limit, float *out)
{
    for (size_t i = 0; i < n; i++) {
        float gv = g[i] > limit ? limit : g[i];          /* clamp(max=limit) */
        float uv = u[i] > limit ? limit : u[i] < -limit ? -limit : u[i];
        out[i] = cpu_silu(gv) * uv;
    }
}

/* One expert (or the shared one) on `n` gathered rows of a T-token step:
 * out = mlp(x). */
static void expert(cpu_impl *c, int T, const qweight *w1, const qweight *w2,
                   const qweight *w3, const float *x, int n, int H, float limit, float *out)
{
    int I = w1->rows;
    float *g = scratch(c, "moe expert", (size_t)2 * n * I * sizeof *g);
    if (!g) return;
    float *u = g + (size_t)n * I;
    matmul(c, T, w1, false, x, H, n, g, I);
    matmul(c, T, w3, false, x, H, n, u, I);
    swiglu(g, u, (size_t)n * I, limit, g);
    matmul(c, T, w2, false, g, I, n, out, H);
    free(g);
}

static void cpu_moe(backend *b, const moe_args *a)
{
    cpu_impl *c = b->impl;
    int T = a->T, H = a->H, E = a->n_experts, K = a->topk;
    size_t TK = (size_t)T * K;
    /* scores [T][E], biased [E], weights [T][K], then (as floats' room)
     * ids [T][K], rows [T][K], gathered rows xs and ys [T][K][H] */
    float *scores = scratch(c, "moe", ((size_t)T * E + E + TK * (3 + 2 * (size_t)H))
                                      * sizeof(float));
    if (!scores) return;
    float *biased = scores + (size_t)T * E, *wt = biased + E;
    int32_t *idx = (int32_t *)(wt + TK);
    int *rows = (int *)(idx + TK);
    float *xs = (float *)(rows + TK), *ys = xs + TK * H;
    matmul(c, T, a->gate, true, a->x, H, T, scores, E);
    for (int t = 0; t < T; t++) {
        float *sc = scores + (size_t)t * E;
        for (int e = 0; e < E; e++)
            sc[e] = a->sigmoid_scores ? cpu_sigmoid(sc[e]) : sqrtf(cpu_softplus(sc[e]));
        int32_t *it = idx + (size_t)t * K;
        if (a->tid2eid) {
            for (int k = 0; k < K; k++)
                it[k] = a->tid_i64 ? (int32_t)((const int64_t *)a->tid2eid)[(size_t)a->ids[t] * K + k]
                                   : ((const int32_t *)a->tid2eid)[(size_t)a->ids[t] * K + k];
        } else {
            for (int e = 0; e < E; e++) biased[e] = sc[e] + a->bias[e];
            cpu_topk(biased, E, K, it);
        }
        float sum = 0;
        for (int k = 0; k < K; k++) sum += sc[it[k]];
        for (int k = 0; k < K; k++) wt[(size_t)t * K + k] = sc[it[k]] / (sum + 1e-20f) * a->routed_scale;
    }
    memset(a->out, 0, (size_t)T * H * sizeof(float));
    /* Experts in ascending order, each on the rows routed to it. */
    for (int e = 0; e < E; e++) {
        int n = 0;
        for (int t = 0; t < T; t++)
            for (int k = 0; k < K; k++)
                if (idx[(size_t)t * K + k] == e) {
                    rows[n] = t * K + k;
                    memcpy(xs + (size_t)n * H, a->x + (size_t)t * H, H * sizeof(float));
                    n++;
                }
        if (!n) continue;
        expert(c, T, &a->w1[e], &a->w2[e], &a->w3[e], xs, n, H, a->limit, ys);
        for (int j = 0; j < n; j++) {
            float w = wt[rows[j]];
            float *o = a->out + (size_t)(rows[j] / K) * H;
            const float *y = ys + (size_t)j * H;
            for (int d = 0; d < H; d++) o[d] += y[d] * w;
        }
    }
    expert(c, T, a->sw1, a->sw2, a->sw3, a->x, T, H, a->limit, ys);
    for (size_t i = 0; i < (size_t)T * H; i++) a->out[i] += ys[i];
    free(scores);
}

static void cpu_allreduce(backend *b, float *buf, size_t n)
{
    cpu_impl *c = b->impl;
    tp_allreduce_sum(c->group, c->rank, buf, n);
}

static void cpu_gather_cols(backend *b, const float *part, int rows, int nv, float *out,
                            int ldo, int v0)
{
    (void)b;
    for (int r = 0; r < rows; r++)
        memcpy(out + (size_t)r * ldo + v0, part + (size_t)r * nv, nv * sizeof(float));
}

static void cpu_row_argmax(backend *b, const float *part, int rows, int nv, int v0, float *val,
                           int32_t *idx)
{
    (void)b;
    for (int r = 0; r < rows; r++) {
        const float *x = part + (size_t)r * nv;
        float best = -INFINITY;
        int at = -1;
        for (int j = 0; j < nv; j++)
            if (x[j] > best) best = x[j], at = j;
        val[r] = best;
        idx[r] = at < 0 ? -1 : v0 + at;
    }
}

static void cpu_destroy(backend *b)
{
    threadpool_free(pool_of(b));
    free(b->impl);
    free(b);
}

void backend_cpu_set_fp8(backend *b, bool on) { ((cpu_impl *)b->impl)->fp8 = on; }

/* The sequences of a step one after the other. */
static void cpu_compress(backend *b, const compress_args *a, int nseg)
{
    for (int i = 0; i < nseg; i++) cpu_compress1(b, &a[i]);
}

static void cpu_indexer(backend *b, const indexer_args *a, int nseg)
{
    for (int i = 0; i < nseg; i++) cpu_indexer1(b, &a[i]);
}

static void cpu_attention(backend *b, const attention_args *a, int nseg)
{
    for (int i = 0; i < nseg; i++) cpu_attention1(b, &a[i]);
}

backend *backend_cpu_new(int threads, tp_group *g, int rank)
{
    backend *b = calloc(1, sizeof *b);
    cpu_impl *c = calloc(1, sizeof *c);
    threadpool *p = b && c ? threadpool_new(threads) : NULL;
    if (!p) {
        free(b);
        free(c);
        return NULL;
    }
    c->pool = p;
    c->group = g;
    c->rank = rank;
    b->name = "cpu";
    b->impl = c;
    b->alloc = cpu_alloc;
    b->release = cpu_release;
    b->copy_rows = cpu_copy_rows;
    b->write = cpu_write;
    b->read = cpu_write;
    b->error = cpu_error;
    b->recover = cpu_recover;
    b->matmul = cpu_matmul_op;
    b->embed = cpu_embed;
    b->rmsnorm = cpu_rmsnorm;
    b->rope = cpu_rope;
    b->scale = cpu_scale;
    b->hc_pre = cpu_hc_pre;
    b->hc_post = cpu_hc_post;
    b->hc_head = cpu_hc_head;
    b->compress = cpu_compress;
    b->indexer = cpu_indexer;
    b->attention = cpu_attention;
    b->ring_store = cpu_ring_store;
    b->kv_round = cpu_kv_round;
    b->moe = cpu_moe;
    b->allreduce = cpu_allreduce;
    b->gather_cols = cpu_gather_cols;
    b->row_argmax = cpu_row_argmax;
    b->destroy = cpu_destroy;
    return b;
}
