#include "model_weights.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu/quant.h"

/* Binding state: stops at the first problem, which is the one reported.
 * Synthetic binding (benchmarks) makes each tensor up instead: small ones
 * (vectors, F32 tensors, the hash table) get random host data kept in
 * w->synth; matrices get none, and a backend fills them on the device. */
typedef struct {
    const safetensors *st;
    const char *dir;
    strbuf *err;
    bool *used;         /* per st->tensors index */
    bool failed;
    v4_weights *synth;  /* synthetic: the weights that own the made-up data */
    const v4_config *cfg;
    uint64_t rng;
    st_tensor fake;
} binder;

static void bfail(binder *B, const st_tensor *t, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void bfail(binder *B, const st_tensor *t, const char *name, const char *fmt, ...)
{
    if (B->failed) return;
    B->failed = true;
    va_list ap;
    sb_printf(B->err, "%s: tensor %s: ", t ? st_file_of(B->st, t) : B->dir, name);
    va_start(ap, fmt);
    sb_vprintf(B->err, fmt, ap);
    va_end(ap);
    sb_putc(B->err, '\n');
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape)
{
    size_t o = snprintf(buf, n, "[");
    for (int i = 0; i < ndim && o < n; i++)
        o += snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

static float synth_uniform(binder *B)
{
    B->rng ^= B->rng << 13;
    B->rng ^= B->rng >> 7;
    B->rng ^= B->rng << 17;
    return (float)((B->rng >> 11) * (2.0 / 9007199254740992.0) - 1);
}

/* Random contents for a made-up small tensor: F32 matrices with std
 * 1/sqrt(cols), "*_scale" near 1, the router's bias within +-0.01, other
 * F32 within +-0.5, BF16 vectors (norm weights) near 1, hash tables valid
 * experts.  The bias is small because a trained router's bias balances
 * the experts' load, and the random gate here has no expert to balance:
 * at +-0.5 against scores sqrt(softplus(z)), z ~ N(0, 1), the same few
 * experts won every token's top 6, and a batch read far fewer experts
 * than one of a trained model (32 tokens 82 of the 136 uniform routing
 * reads, 64 tokens 101 of 200; run C2's trace: the score-routed layers'
 * expert tiles 188 + 104 us against the hash layer's 305 + 161). */
static void synth_data(binder *B, const char *name, st_tensor *t)
{
    int64_t n = st_numel(t);
    size_t es = t->dtype == ST_I64 ? 8 : t->dtype == ST_BF16 ? 2 : 4;
    void *p = malloc(n * es);
    v4_weights *w = B->synth;
    w->synth_mem = realloc(w->synth_mem, (w->n_synth_mem + 1) * sizeof *w->synth_mem);
    w->synth_mem[w->n_synth_mem++] = p;
    size_t len = strlen(name);
    bool scale = len > 6 && !strcmp(name + len - 6, "_scale");
    bool bias = len > 9 && !strcmp(name + len - 9, "gate.bias");
    float amp = t->ndim == 2 ? sqrtf(3.0f / t->shape[1]) : bias ? 0.01f : 0.5f;
    for (int64_t i = 0; i < n; i++) {
        float u = synth_uniform(B);
        if (t->dtype == ST_I64) ((int64_t *)p)[i] = (B->rng >> 20) % B->cfg->n_experts;
        else if (t->dtype == ST_I32) ((int32_t *)p)[i] = (B->rng >> 20) % B->cfg->n_experts;
        else if (t->dtype == ST_BF16) ((uint16_t *)p)[i] = f32_to_bf16(1.0f + 0.1f * u);
        else ((float *)p)[i] = scale ? 1.0f + 0.2f * u : amp * u;
    }
    t->data = p;
}

static const st_tensor *need_synth(binder *B, const char *name, const enum st_dtype *dt,
                                   int ndim, int64_t d0, int64_t d1)
{
    st_tensor *t = &B->fake;
    *t = (st_tensor){ .dtype = dt[0], .ndim = ndim, .shape = { d0, d1 } };
    bool small = dt[0] == ST_F32 || dt[0] == ST_I64 || (dt[0] == ST_BF16 && ndim == 1);
    if (small) synth_data(B, name, t);
    return t;
}

/* Find `name` with one of the dtypes in `dt` (ST_NDTYPES-terminated) and
 * exactly the given shape. */
static const st_tensor *need(binder *B, const char *name, const enum st_dtype *dt,
                             int ndim, int64_t d0, int64_t d1)
{
    if (B->failed) return NULL;
    if (B->synth) return need_synth(B, name, dt, ndim, d0, d1);
    const st_tensor *t = st_find(B->st, name);
    if (!t) { bfail(B, NULL, name, "missing"); return NULL; }
    bool ok = false;
    for (int i = 0; dt[i] != ST_NDTYPES; i++) ok |= t->dtype == dt[i];
    if (!ok) {
        char want[64] = "";
        for (int i = 0; dt[i] != ST_NDTYPES; i++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%s",
                     i ? " or " : "", st_dtype_name(dt[i]));
        bfail(B, t, name, "dtype %s, expected %s", st_dtype_name(t->dtype), want);
        return NULL;
    }
    int64_t want[2] = { d0, d1 };
    bool same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == want[i];
    if (!same) {
        char got[96], exp[64];
        shape_str(got, sizeof got, t->ndim, t->shape);
        shape_str(exp, sizeof exp, ndim, want);
        bfail(B, t, name, "shape %s, expected %s", got, exp);
        return NULL;
    }
    B->used[t - B->st->tensors] = true;
    return t;
}

static const enum st_dtype DT_F8[] = { ST_F8_E4M3, ST_NDTYPES };
static const enum st_dtype DT_E8M0[] = { ST_F8_E8M0, ST_NDTYPES };
static const enum st_dtype DT_BF16[] = { ST_BF16, ST_NDTYPES };
static const enum st_dtype DT_F32[] = { ST_F32, ST_NDTYPES };
static const enum st_dtype DT_FP4[] = { ST_I8, ST_U8, ST_NDTYPES };
static const enum st_dtype DT_IDX[] = { ST_I64, ST_I32, ST_NDTYPES };

static const char *fmt_name(char *buf, size_t n, const char *fmt, va_list ap)
{
    vsnprintf(buf, n, fmt, ap);
    return buf;
}

/* FP8 e4m3 matrix "<p>.weight" [rows, cols] with "<p>.scale" UE8M0 blocks. */
static void bind_fp8(binder *B, qweight *q, int rows, int cols, const char *fmt, ...)
{
    char p[160], n[192];
    va_list ap;
    va_start(ap, fmt);
    fmt_name(p, sizeof p, fmt, ap);
    va_end(ap);
    snprintf(n, sizeof n, "%s.weight", p);
    const st_tensor *w = need(B, n, DT_F8, 2, rows, cols);
    snprintf(n, sizeof n, "%s.scale", p);
    const st_tensor *s = need(B, n, DT_E8M0, 2, (rows + 127) / 128, (cols + 127) / 128);
    if (!w || !s) return;
    *q = (qweight){ .type = QT_FP8, .rows = rows, .cols = cols, .data = w->data,
                    .scale = s->data, .ld = cols, .scale_ld = (cols + 127) / 128 };
}

/* MXFP4 matrix: "<p>.weight" [rows, cols/2] packed E2M1, "<p>.scale"
 * UE8M0 [rows, cols/32]. */
static void bind_fp4(binder *B, qweight *q, int rows, int cols, const char *fmt, ...)
{
    char p[160], n[192];
    va_list ap;
    va_start(ap, fmt);
    fmt_name(p, sizeof p, fmt, ap);
    va_end(ap);
    snprintf(n, sizeof n, "%s.weight", p);
    if (cols % 32) {
        bfail(B, NULL, n, "MXFP4 needs an input size divisible by 32, not %d", cols);
        return;
    }
    const st_tensor *w = need(B, n, DT_FP4, 2, rows, cols / 2);
    snprintf(n, sizeof n, "%s.scale", p);
    const st_tensor *s = need(B, n, DT_E8M0, 2, rows, cols / 32);
    if (!w || !s) return;
    *q = (qweight){ .type = QT_MXFP4, .rows = rows, .cols = cols, .data = w->data,
                    .scale = s->data, .ld = cols, .scale_ld = cols / 32 };
}

static void bind_bf16(binder *B, qweight *q, int rows, int cols, const char *fmt, ...)
{
    char n[192];
    va_list ap;
    va_start(ap, fmt);
    fmt_name(n, sizeof n, fmt, ap);
    va_end(ap);
    const st_tensor *w = need(B, n, DT_BF16, 2, rows, cols);
    if (w) *q = (qweight){ .type = QT_BF16, .rows = rows, .cols = cols, .data = w->data,
                           .ld = cols };
}

/* BF16 vector converted to float32 (norm weights). */
static float *bind_vec(binder *B, int n, const char *fmt, ...)
{
    char name[192];
    va_list ap;
    va_start(ap, fmt);
    fmt_name(name, sizeof name, fmt, ap);
    va_end(ap);
    const st_tensor *t = need(B, name, DT_BF16, 1, n, 0);
    if (!t) return NULL;
    float *v = malloc(n * sizeof *v);
    const uint16_t *h = t->data;
    for (int i = 0; i < n; i++) v[i] = bf16_to_f32(h[i]);
    return v;
}

static const float *bind_f32(binder *B, int ndim, int d0, int d1, const char *fmt, ...)
{
    char name[192];
    va_list ap;
    va_start(ap, fmt);
    fmt_name(name, sizeof name, fmt, ap);
    va_end(ap);
    const st_tensor *t = need(B, name, DT_F32, ndim, d0, d1);
    return t ? t->data : NULL;
}

static void bind_comp(binder *B, v4_comp_w *cw, int ratio, int coff, int d, int H,
                      const char *prefix)
{
    bind_bf16(B, &cw->wkv, coff * d, H, "%s.wkv.weight", prefix);
    bind_bf16(B, &cw->wgate, coff * d, H, "%s.wgate.weight", prefix);
    cw->ape = bind_f32(B, 2, ratio, coff * d, "%s.ape", prefix);
    cw->norm = bind_vec(B, d, "%s.norm.weight", prefix);
}

static void bind_layer(binder *B, const v4_config *c, int l, v4_layer *L)
{
    int H = c->hidden_size, hc = c->hc_mult, mix = (2 + hc) * hc;
    int hd = c->head_dim, nh = c->n_heads, E = c->n_experts, I = c->moe_inter;
    char p[64];
    L->attn_norm = bind_vec(B, H, "layers.%d.attn_norm.weight", l);
    L->ffn_norm = bind_vec(B, H, "layers.%d.ffn_norm.weight", l);
    L->hc_attn_fn = bind_f32(B, 2, mix, hc * H, "layers.%d.hc_attn_fn", l);
    L->hc_attn_base = bind_f32(B, 1, mix, 0, "layers.%d.hc_attn_base", l);
    L->hc_attn_scale = bind_f32(B, 1, 3, 0, "layers.%d.hc_attn_scale", l);
    L->hc_ffn_fn = bind_f32(B, 2, mix, hc * H, "layers.%d.hc_ffn_fn", l);
    L->hc_ffn_base = bind_f32(B, 1, mix, 0, "layers.%d.hc_ffn_base", l);
    L->hc_ffn_scale = bind_f32(B, 1, 3, 0, "layers.%d.hc_ffn_scale", l);

    bind_fp8(B, &L->wq_a, c->q_lora_rank, H, "layers.%d.attn.wq_a", l);
    L->q_norm = bind_vec(B, c->q_lora_rank, "layers.%d.attn.q_norm.weight", l);
    bind_fp8(B, &L->wq_b, nh * hd, c->q_lora_rank, "layers.%d.attn.wq_b", l);
    bind_fp8(B, &L->wkv, hd, H, "layers.%d.attn.wkv", l);
    L->kv_norm = bind_vec(B, hd, "layers.%d.attn.kv_norm.weight", l);
    bind_bf16(B, &L->wo_a, c->o_groups * c->o_lora_rank, nh * hd / c->o_groups,
              "layers.%d.attn.wo_a.weight", l);
    bind_fp8(B, &L->wo_b, H, c->o_groups * c->o_lora_rank, "layers.%d.attn.wo_b", l);
    L->sink = bind_f32(B, 1, nh, 0, "layers.%d.attn.attn_sink", l);

    int ratio = v4_layer_ratio(c, l);
    if (c->attn[l] != V4_ATTN_SLIDING) {
        int coff = c->attn[l] == V4_ATTN_CSA ? 2 : 1;
        snprintf(p, sizeof p, "layers.%d.attn.compressor", l);
        bind_comp(B, &L->comp, ratio, coff, hd, H, p);
    }
    if (c->attn[l] == V4_ATTN_CSA) {
        int ihd = c->index_head_dim;
        snprintf(p, sizeof p, "layers.%d.attn.indexer.compressor", l);
        bind_comp(B, &L->icomp, ratio, 2, ihd, H, p);
        bind_fp8(B, &L->iwq_b, c->index_heads * ihd, c->q_lora_rank,
                 "layers.%d.attn.indexer.wq_b", l);
        bind_bf16(B, &L->iweights, c->index_heads, H,
                  "layers.%d.attn.indexer.weights_proj.weight", l);
    }

    bind_bf16(B, &L->gate, E, H, "layers.%d.ffn.gate.weight", l);
    if (c->hash_moe[l]) {
        char name[96];
        snprintf(name, sizeof name, "layers.%d.ffn.gate.tid2eid", l);
        const st_tensor *t = need(B, name, DT_IDX, 2, c->vocab_size, c->topk);
        if (t) {
            L->tid2eid = t->data;
            L->tid_i64 = t->dtype == ST_I64;
            /* Routing indexes expert arrays with these: check them all. */
            for (int64_t i = 0; i < st_numel(t); i++) {
                int64_t e = L->tid_i64 ? ((const int64_t *)t->data)[i]
                                       : ((const int32_t *)t->data)[i];
                if (e < 0 || e >= E) {
                    bfail(B, t, name, "entry %lld is expert %lld, outside [0, %d)",
                          (long long)i, (long long)e, E);
                    break;
                }
            }
        }
    } else {
        L->gate_bias = bind_f32(B, 1, E, 0, "layers.%d.ffn.gate.bias", l);
    }
    L->w1 = calloc(E, sizeof *L->w1);
    L->w2 = calloc(E, sizeof *L->w2);
    L->w3 = calloc(E, sizeof *L->w3);
    for (int e = 0; e < E && !B->failed; e++) {
        bind_fp4(B, &L->w1[e], I, H, "layers.%d.ffn.experts.%d.w1", l, e);
        bind_fp4(B, &L->w2[e], H, I, "layers.%d.ffn.experts.%d.w2", l, e);
        bind_fp4(B, &L->w3[e], I, H, "layers.%d.ffn.experts.%d.w3", l, e);
    }
    bind_fp8(B, &L->sw1, I, H, "layers.%d.ffn.shared_experts.w1", l);
    bind_fp8(B, &L->sw2, H, I, "layers.%d.ffn.shared_experts.w2", l);
    bind_fp8(B, &L->sw3, I, H, "layers.%d.ffn.shared_experts.w3", l);
}

static int bind_all(binder *B_, v4_weights *w, const v4_config *c, const safetensors *st)
{
    binder B = *B_;
    int H = c->hidden_size, hc = c->hc_mult;
    w->n_layers = c->n_layers;
    w->n_experts = c->n_experts;
    w->owns_vectors = true;
    bind_bf16(&B, &w->embed, c->vocab_size, H, "embed.weight");
    if (c->tie_embeddings) {
        w->head = w->embed;
        const st_tensor *t = st_find(st, "head.weight");
        if (t) B.used[t - st->tensors] = true;
    } else {
        bind_bf16(&B, &w->head, c->vocab_size, H, "head.weight");
    }
    w->norm = bind_vec(&B, H, "norm.weight");
    w->hc_fn = bind_f32(&B, 2, hc, hc * H, "hc_head_fn");
    w->hc_base = bind_f32(&B, 1, hc, 0, "hc_head_base");
    w->hc_scale = bind_f32(&B, 1, 1, 0, "hc_head_scale");
    w->layers = calloc(c->n_layers, sizeof *w->layers);
    for (int l = 0; l < c->n_layers && !B.failed; l++) bind_layer(&B, c, l, &w->layers[l]);

    /* Anything left over is a tensor this model does not know. */
    for (size_t i = 0; i < st->ntensors && !B.failed; i++) {
        const char *n = st->tensors[i].name;
        if (!B.used[i] && strncmp(n, "mtp.", 4))
            bfail(&B, &st->tensors[i], n, "unknown to this model (config: %d layers, "
                  "%d experts)", c->n_layers, c->n_experts);
    }
    free(B.used);
    if (B.failed) { v4_weights_free(w); return -1; }
    return 0;
}

int v4_weights_load(v4_weights *w, const v4_config *c, const safetensors *st,
                    const char *dir, strbuf *err)
{
    memset(w, 0, sizeof *w);
    binder B = { .st = st, .dir = dir, .err = err,
                 .used = calloc(st->ntensors + 1, sizeof(bool)) };
    return bind_all(&B, w, c, st);
}

int v4_weights_synthetic(v4_weights *w, const v4_config *c, uint64_t seed, strbuf *err)
{
    static const safetensors none;
    memset(w, 0, sizeof *w);
    binder B = { .st = &none, .dir = "synthetic", .err = err, .used = calloc(1, sizeof(bool)),
                 .synth = w, .cfg = c, .rng = seed | 1 };
    return bind_all(&B, w, c, &none);
}

void v4_weights_free(v4_weights *w)
{
    for (int l = 0; w->layers && l < w->n_layers; l++) {
        v4_layer *L = &w->layers[l];
        if (w->owns_vectors) {
            free(L->attn_norm);
            free(L->ffn_norm);
            free(L->q_norm);
            free(L->kv_norm);
            free(L->comp.norm);
            free(L->icomp.norm);
        }
        free(L->w1);
        free(L->w2);
        free(L->w3);
    }
    if (w->owns_vectors) free(w->norm);
    for (size_t i = 0; i < w->n_synth_mem; i++) free(w->synth_mem[i]);
    free(w->synth_mem);
    free(w->layers);
    memset(w, 0, sizeof *w);
}

/* Split n items over tp ranks as evenly as possible, each share a
 * multiple of `granule` (the last takes the remainder). */
static void split(int n, int tp, int rank, int granule, int *start, int *count)
{
    int units = (n + granule - 1) / granule;
    int base = units / tp, extra = units % tp;
    int u0 = rank * base + (rank < extra ? rank : extra);
    int nu = base + (rank < extra);
    *start = u0 * granule;
    int end = (u0 + nu) * granule;
    if (end > n) end = n;
    if (*start > n) *start = n;
    *count = end - *start;
}

int v4_shard_plan(const v4_config *c, int tp, int rank, v4_shard *s, strbuf *err)
{
    if (tp < 1 || rank < 0 || rank >= tp) {
        sb_printf(err, "tp %d, rank %d: no such rank\n", tp, rank);
        return -1;
    }
    /* Whole output groups (with their heads) per rank, as even as the
     * group count allows: 3 groups over 2 ranks are 2 + 1.  A rank may end
     * up with none when tp exceeds the groups; it then adds zeros. */
    int hpg = c->n_heads / c->o_groups;
    split(c->o_groups, tp, rank, 1, &s->g0, &s->ng);
    s->h0 = s->g0 * hpg;
    s->nh = s->ng * hpg;
    /* Even boundaries keep MXFP4 nibble pairs on one rank. */
    split(c->moe_inter, tp, rank, 2, &s->i0, &s->ni);
    split(c->vocab_size, tp, rank, 1, &s->v0, &s->nv);
    return 0;
}

void v4_weights_shard(const v4_weights *full, const v4_config *c, const v4_shard *s,
                      v4_weights *out)
{
    int hd = c->head_dim, olr = c->o_lora_rank, E = c->n_experts;
    *out = *full;
    out->owns_vectors = false;
    out->synth_mem = NULL;      /* the full weights own the made-up data */
    out->n_synth_mem = 0;
    out->head = qweight_view(&full->head, s->v0, s->nv, 0, full->head.cols);
    out->layers = calloc(c->n_layers, sizeof *out->layers);
    for (int l = 0; l < c->n_layers; l++) {
        const v4_layer *F = &full->layers[l];
        v4_layer *L = &out->layers[l];
        *L = *F;
        L->wq_b = qweight_view(&F->wq_b, s->h0 * hd, s->nh * hd, 0, F->wq_b.cols);
        L->wo_a = qweight_view(&F->wo_a, s->g0 * olr, s->ng * olr, 0, F->wo_a.cols);
        L->wo_b = qweight_view(&F->wo_b, 0, F->wo_b.rows, s->g0 * olr, s->ng * olr);
        L->sink = F->sink + s->h0;
        L->w1 = calloc(E, sizeof *L->w1);
        L->w2 = calloc(E, sizeof *L->w2);
        L->w3 = calloc(E, sizeof *L->w3);
        for (int e = 0; e < E; e++) {
            L->w1[e] = qweight_view(&F->w1[e], s->i0, s->ni, 0, F->w1[e].cols);
            L->w3[e] = qweight_view(&F->w3[e], s->i0, s->ni, 0, F->w3[e].cols);
            L->w2[e] = qweight_view(&F->w2[e], 0, F->w2[e].rows, s->i0, s->ni);
        }
        L->sw1 = qweight_view(&F->sw1, s->i0, s->ni, 0, F->sw1.cols);
        L->sw3 = qweight_view(&F->sw3, s->i0, s->ni, 0, F->sw3.cols);
        L->sw2 = qweight_view(&F->sw2, 0, F->sw2.rows, s->i0, s->ni);
    }
}

/* A backend copy of host vector p of n bytes; after the first failure
 * (which the caller reports) p itself. */
static void *up_vec(backend *be, const void *p, size_t n, bool *ok)
{
    void *d = *ok && p ? be->upload(be, p, n) : NULL;
    if (p && !d) *ok = false;
    return d ? d : (void *)p;
}

/* The projections forward.c runs as one matmuls list of one x, in its
 * order (x: wq_a, wkv, the compressor's, the indexer's; qr: wq_b,
 * iwq_b), and the shared expert's w1 and w3, offered to the backend to
 * lay out as one matrix each. */
static bool join_projections(backend *be, v4_layer *L, const v4_config *c, int l)
{
    if (!be->join_weights) return true;
    qweight *px[7], *pq[2];
    int n = 0, ratio = v4_layer_ratio(c, l);
    bool csa = c->attn[l] == V4_ATTN_CSA;
    px[n++] = &L->wq_a, px[n++] = &L->wkv;
    if (ratio) px[n++] = &L->comp.wkv, px[n++] = &L->comp.wgate;
    if (csa) px[n++] = &L->icomp.wkv, px[n++] = &L->icomp.wgate, px[n++] = &L->iweights;
    pq[0] = &L->wq_b, pq[1] = &L->iwq_b;
    qweight *s13[2] = { &L->sw1, &L->sw3 };
    return be->join_weights(be, px, n) >= 0 && (!csa || be->join_weights(be, pq, 2) >= 0) &&
           be->join_weights(be, s13, 2) >= 0;
}

#define UPV(field, bytes) ((field) = up_vec(be, (field), (bytes), &ok))
#define UPW(qw) (ok = ok && be->upload_weights(be, &(qw), 1) == 0)

int v4_weights_upload(v4_weights *w, const v4_config *c, const v4_shard *s, backend *be,
                      strbuf *err)
{
    int H = c->hidden_size, hc = c->hc_mult, mix = (2 + hc) * hc, hd = c->head_dim;
    int E = c->n_experts;
    size_t f = sizeof(float);
    bool ok = true;
    UPW(w->embed);
    UPW(w->head);
    UPV(w->norm, H * f);
    UPV(w->hc_fn, (size_t)hc * hc * H * f);
    UPV(w->hc_base, hc * f);
    UPV(w->hc_scale, f);
    for (int l = 0; l < c->n_layers && ok; l++) {
        v4_layer *L = &w->layers[l];
        UPV(L->attn_norm, H * f);
        UPV(L->ffn_norm, H * f);
        UPV(L->hc_attn_fn, (size_t)mix * hc * H * f);
        UPV(L->hc_attn_base, mix * f);
        UPV(L->hc_attn_scale, 3 * f);
        UPV(L->hc_ffn_fn, (size_t)mix * hc * H * f);
        UPV(L->hc_ffn_base, mix * f);
        UPV(L->hc_ffn_scale, 3 * f);
        UPW(L->wq_a);
        UPW(L->wq_b);
        UPW(L->wkv);
        UPW(L->wo_a);
        UPW(L->wo_b);
        UPV(L->q_norm, c->q_lora_rank * f);
        UPV(L->kv_norm, hd * f);
        UPV(L->sink, s->nh * f);
        int ratio = v4_layer_ratio(c, l);
        if (ratio) {
            int coff = c->attn[l] == V4_ATTN_CSA ? 2 : 1;
            UPW(L->comp.wkv);
            UPW(L->comp.wgate);
            UPV(L->comp.ape, (size_t)ratio * coff * hd * f);
            UPV(L->comp.norm, hd * f);
        }
        if (c->attn[l] == V4_ATTN_CSA) {
            int ihd = c->index_head_dim;
            UPW(L->icomp.wkv);
            UPW(L->icomp.wgate);
            UPV(L->icomp.ape, (size_t)ratio * 2 * ihd * f);
            UPV(L->icomp.norm, ihd * f);
            UPW(L->iwq_b);
            UPW(L->iweights);
        }
        UPW(L->gate);
        if (L->tid2eid)
            UPV(L->tid2eid, (size_t)c->vocab_size * c->topk * (L->tid_i64 ? 8 : 4));
        else
            UPV(L->gate_bias, E * f);
        ok = ok && be->upload_weights(be, L->w1, E) == 0 &&
             be->upload_weights(be, L->w2, E) == 0 && be->upload_weights(be, L->w3, E) == 0;
        UPW(L->sw1);
        UPW(L->sw2);
        UPW(L->sw3);
        ok = ok && join_projections(be, L, c, l);
    }
    if (!ok) {
        const char *e = be->error(be);
        sb_printf(err, "uploading weights to the %s backend: %s\n", be->name,
                  e ? e : "failed");
        return -1;
    }
    return 0;
}
