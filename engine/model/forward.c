/* The DeepSeek V4 forward pass of one tensor-parallel rank, written once
 * for every backend: it only computes sizes and addresses and calls the
 * backend's ops (backend.h).  Follows transformers' modeling_deepseek_v4.py;
 * docs/MODEL.md lists the points where the order of operations matters. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

/* Grow the rank's activation buffers to hold T tokens and nout logits rows. */
/* The rank's buffers for a step of T tokens (nout logits rows), its
 * block addresses and nseg sequences' op arguments; false when memory ran
 * short (everything this step would have used is released and the next
 * step tries again). */
static bool ensure_scratch(v4_model *M, v4_rank *R, int T, int nout, int64_t nb, int nseg)
{
    const v4_config *c = &M->cfg;
    v4_scratch *s = &R->s;
    backend *be = R->be;
    int H = c->hidden_size, hc = c->hc_mult, hd = c->head_dim;
    int qd = R->shard.nh * hd, ihd = c->index_head_dim, inh = c->index_heads;
    if (T > s->cap_T) {
        float **bufs[] = { &s->h, &s->x, &s->col, &s->y, &s->post, &s->comb, &s->qr, &s->q,
                           &s->kv, &s->attn, &s->oa, &s->ckv, &s->cg, &s->ikv, &s->ig,
                           &s->qi, &s->iw };
        size_t widths[] = { (size_t)hc * H, H, H, H, hc, (size_t)hc * hc, c->q_lora_rank, qd,
                            hd, qd, (size_t)R->shard.ng * c->o_lora_rank, 2 * hd, 2 * hd,
                            2 * ihd, 2 * ihd, (size_t)inh * ihd, inh };
        bool ok = true;
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
            be->release(be, *bufs[i]);
            *bufs[i] = be->alloc(be, (size_t)T * widths[i] * sizeof(float));
            ok = ok && *bufs[i];
        }
        be->release(be, s->sel);
        be->release(be, s->nsel);
        s->sel = be->alloc(be, (size_t)T * c->index_topk * sizeof *s->sel);
        s->nsel = be->alloc(be, (size_t)T * sizeof *s->nsel);
        s->cap_T = ok && s->sel && s->nsel ? T : 0;
        if (!s->cap_T) return false;
    }
    if (nout > s->cap_out) {
        be->release(be, s->head_in);
        be->release(be, s->logits);
        s->head_in = be->alloc(be, (size_t)nout * H * sizeof(float));
        s->logits = be->alloc(be, (size_t)nout * R->shard.nv * sizeof(float));
        s->cap_out = s->head_in && s->logits ? nout : 0;
        if (!s->cap_out) return false;
    }
    /* host arrays: each grown to its count, the capacity raised once all
     * are (a shortfall leaves it, and the next step tries again) */
    void *grown;
#define GROW(p, n) ((grown = realloc((p), (size_t)(n) * sizeof *(p))) && ((p) = grown, true))
    if (nout > R->cap_amax) {
        if (!GROW(R->amax_val, nout) || !GROW(R->amax_idx, nout)) return false;
        R->cap_amax = nout;
    }
    if (nb > R->cap_blockptr) {
        if (!GROW(R->blockptr, nb) || !GROW(R->pblk, nb)) return false;
        R->cap_blockptr = nb;
    }
    if (nseg > R->cap_args) {
        if (!GROW(R->cargs, nseg) || !GROW(R->iargs, nseg) || !GROW(R->aargs, nseg) ||
            !GROW(R->rargs, nseg) || !GROW(R->pseg, nseg) || !GROW(R->pids, nseg) ||
            !GROW(R->ppos, nseg) || !GROW(R->pslot, nseg))
            return false;
        R->cap_args = nseg;
    }
#undef GROW
    return true;
}

static char *seq_state(v4_model *M, v4_rank *R, const v4_segment *g)
{
    return R->state_mem + (size_t)g->seq->c.slot * M->layout.state_bytes;
}

static paged_rows seg_rows(v4_model *M, v4_rank *R, const v4_segment *g, size_t off,
                           int ratio, int row_len)
{
    return (paged_rows){ R->blockptr + g->blk0, off, M->layout.block_tokens / ratio, row_len,
                         M->layout.dtype };
}

/* Run the compressor over every segment's new tokens. */
static void compress_all(v4_model *M, v4_rank *R, const v4_batch *B, const v4_comp_w *cw,
                         int l, bool indexer, const float *kv, const float *gate)
{
    const v4_config *c = &M->cfg;
    bool csa = c->attn[l] == V4_ATTN_CSA;
    int ratio = v4_layer_ratio(c, l), d = indexer ? c->index_head_dim : c->head_dim;
    int ld = (csa ? 2 : 1) * d;
    size_t state_off = indexer ? M->layout.icomp_off[l] : M->layout.comp_off[l];
    size_t rows_off = indexer ? M->layout.ikey_off[l] : M->layout.entry_off[l];
    compress_args *args = R->cargs;
    for (int i = 0; i < B->nseg; i++) {
        const v4_segment *g = &B->segs[i];
        args[i] = (compress_args){
            .n = g->n, .pos0 = g->pos0, .ratio = ratio, .d = d, .overlap = csa,
            .kv = kv + (size_t)g->t0 * ld, .gate = gate + (size_t)g->t0 * ld, .ld = ld,
            .ape = cw->ape, .norm = cw->norm, .eps = (float)c->rms_eps, .rope = &M->rope_comp,
            .state = (float *)(seq_state(M, R, g) + state_off),
            .out = seg_rows(M, R, g, rows_off, ratio, d),
        };
    }
    R->be->compress(R->be, args, B->nseg);
}

/* An attention layer's compressors over its projections' outputs: the
 * entries attention reads, and in CSA layers the indexer's keys. */
static void compressors(v4_model *M, v4_rank *R, const v4_batch *B, int l)
{
    const v4_config *c = &M->cfg;
    const v4_layer *L = &R->w.layers[l];
    v4_scratch *s = &R->s;
    if (v4_layer_ratio(c, l)) compress_all(M, R, B, &L->comp, l, false, s->ckv, s->cg);
    if (c->attn[l] == V4_ATTN_CSA) compress_all(M, R, B, &L->icomp, l, true, s->ikv, s->ig);
}

/* Projections of one step run together: the backend's matmuls (which may
 * launch matrices of one format as one kernel), or one matmul each. */
#define PROJ_MAX 8
typedef struct {
    int n;
    const qweight *w[PROJ_MAX];
    const float *x[PROJ_MAX];
    float *y[PROJ_MAX];
    int ldy[PROJ_MAX];
} proj_list;

static void proj_add(proj_list *p, const qweight *w, const float *x, float *y, int ldy)
{
    p->w[p->n] = w, p->x[p->n] = x, p->y[p->n] = y, p->ldy[p->n] = ldy;
    p->n++;
}

/* Decode batches (weights read once a step, at memory speed) ask the
 * backend to prefetch the weights of the matmuls ahead while latency-bound
 * ops run (backend.h prefetch); prefill reuses each weight across
 * thousands of tokens and asks nothing.  One token neither: on one H200
 * the prefetches cost it 5% (1.39 against 1.32 ms a step at 8K) and gained
 * 2-5% at 8-64 tokens (docs/PERFORMANCE.md, run C2).  Nor 9 or more since
 * the CUDA backend multiplies those with FP8 weights' bf16 copies, twice
 * the bytes, more than L2 holds for a layer's projections (run K5, the
 * prefetch off: 12-64 sequences 0.07-0.13 ms a step faster). */
#define PREFETCH_MIN_TOKENS 2
#define PREFETCH_MAX_TOKENS 8

static void prefetch(backend *be, int T, const qweight *const *w, int n)
{
    if (be->prefetch && T >= PREFETCH_MIN_TOKENS && T <= PREFETCH_MAX_TOKENS)
        be->prefetch(be, w, n);
}

/* norm_w not NULL: every x is xn, RMS-normalized first (in place when the
 * backend has no matmuls). */
static void proj_run(backend *be, const proj_list *p, int ldx, int T, float *xn,
                     const float *norm_w, float eps)
{
    if (be->matmuls) {
        be->matmuls(be, p->n, p->w, p->x, ldx, T, p->y, p->ldy, norm_w, eps);
        return;
    }
    if (norm_w) be->rmsnorm(be, xn, ldx, T, p->w[0]->cols, norm_w, eps, xn, ldx);
    for (int i = 0; i < p->n; i++) be->matmul(be, p->w[i], p->x[i], ldx, T, p->y[i], p->ldy[i]);
}

/* qk_args' work through the plain ops (backends without qk_prep). */
static void qk_prep_ops(backend *be, const qk_args *a)
{
    int T = a->T, qd = a->nh * a->hd, hd = a->hd;
    be->rmsnorm(be, a->q, hd, T * a->nh, hd, NULL, a->eps, a->q, hd);
    be->rope(be, a->q, qd, T, a->nh, hd, a->rope, a->pos, false);
    be->rmsnorm(be, a->kv, hd, T, hd, a->kv_norm, a->eps, a->kv, hd);
    be->rope(be, a->kv, hd, T, 1, hd, a->rope, a->pos, false);
    if (a->dtype != KV_F32) be->kv_round(be, a->kv, hd, T, hd, a->dtype);
    if (!a->qi) return;
    int iqd = a->inh * a->ihd;
    be->rope(be, a->qi, iqd, T, a->inh, a->ihd, a->irope, a->pos, false);
    be->scale(be, a->iw, a->inh, T, a->inh, a->iw_scale);
}

/* Attention sublayer: x [T][H] -> partial output y [T][H] (this rank's heads). */
static void attention(v4_model *M, v4_rank *R, const v4_batch *B, int l)
{
    const v4_config *c = &M->cfg;
    const v4_layer *L = &R->w.layers[l];
    v4_scratch *s = &R->s;
    backend *be = R->be;
    int T = B->T, H = c->hidden_size, hd = c->head_dim, qlr = c->q_lora_rank;
    int nh = R->shard.nh, qd = nh * hd, olr = c->o_lora_rank, ng = R->shard.ng;
    int ratio = v4_layer_ratio(c, l);
    bool csa = c->attn[l] == V4_ATTN_CSA;
    float eps = (float)c->rms_eps;
    const rope_table *rt = ratio ? &M->rope_comp : &M->rope_main;

    int ihd = c->index_head_dim, inh = c->index_heads, cd = (csa ? 2 : 1) * hd;
    /* Every projection of x, then those of qr normalized (q_norm).  The
     * compressors' projections (and the indexer's weights) and the
     * compressors depend on x alone until qk_prep: beside the queries'
     * where the backend has a second stream for the step (short,
     * latency-bound launches that then overlap), else issued with them
     * and after qk_prep as one sequence. */
    proj_list px = { 0 }, pc = { 0 }, pq = { 0 };
    proj_add(&px, &L->wq_a, s->x, s->qr, qlr);
    proj_add(&px, &L->wkv, s->x, s->kv, hd);
    if (ratio) {
        proj_add(&pc, &L->comp.wkv, s->x, s->ckv, cd);
        proj_add(&pc, &L->comp.wgate, s->x, s->cg, cd);
    }
    if (csa) {
        proj_add(&pc, &L->icomp.wkv, s->x, s->ikv, 2 * ihd);
        proj_add(&pc, &L->icomp.wgate, s->x, s->ig, 2 * ihd);
        proj_add(&pc, &L->iweights, s->x, s->iw, inh);
    }
    bool side = pc.n && be->side_begin && be->side_begin(be, T);
    if (side) {
        proj_run(be, &pc, H, T, NULL, NULL, 0);
        compressors(M, R, B, l);
        be->side_end(be);
    } else {
        for (int i = 0; i < pc.n; i++) proj_add(&px, pc.w[i], pc.x[i], pc.y[i], pc.ldy[i]);
    }
    proj_run(be, &px, H, T, NULL, NULL, 0);
    proj_add(&pq, &L->wq_b, s->qr, s->q, qd);
    if (csa) proj_add(&pq, &L->iwq_b, s->qr, s->qi, inh * ihd);
    proj_run(be, &pq, qlr, T, s->qr, L->q_norm, eps);
    /* the output projections' weights arrive while qk_prep, the
     * compressors, the indexer and attention run */
    prefetch(be, T, (const qweight *const[]){ &L->wo_a, &L->wo_b }, 2);
    if (side) be->side_join(be);
    /* The chunk's keys end rounded as the ring will hold them, so attention
     * sees the same values from the chunk as from the cache (DeepSeek's
     * reference rounds kv in place the same way). */
    qk_args qa = {
        .T = T, .pos = B->pos, .q = s->q, .nh = nh, .hd = hd, .kv = s->kv,
        .kv_norm = L->kv_norm, .eps = eps, .rope = rt, .dtype = M->layout.dtype,
        .qi = csa ? s->qi : NULL, .inh = inh, .ihd = ihd, .irope = &M->rope_comp, .iw = s->iw,
        .iw_scale = (float)pow(inh, -0.5),
    };
    if (be->qk_prep) be->qk_prep(be, &qa);
    else qk_prep_ops(be, &qa);

    if (!side) compressors(M, R, B, l);
    if (csa) {
        indexer_args *ia = R->iargs;
        for (int i = 0; i < B->nseg; i++) {
            const v4_segment *g = &B->segs[i];
            ia[i] = (indexer_args){
                .n = g->n, .pos0 = g->pos0, .ratio = ratio, .nheads = inh, .d = ihd,
                .topk = c->index_topk, .q = s->qi + (size_t)g->t0 * inh * ihd,
                .w = s->iw + (size_t)g->t0 * inh,
                .keys = seg_rows(M, R, g, M->layout.ikey_off[l], ratio, ihd),
                .sel = s->sel + (size_t)g->t0 * c->index_topk, .nsel = s->nsel + g->t0,
            };
        }
        be->indexer(be, ia, B->nseg);
    }

    attention_args *aa = R->aargs;
    for (int i = 0; i < B->nseg; i++) {
        const v4_segment *g = &B->segs[i];
        attention_args *a = &aa[i];
        *a = (attention_args){
            .n = g->n, .pos0 = g->pos0, .nheads = nh, .head_dim = hd,
            .window = c->sliding_window, .scale = (float)pow(hd, -0.5),
            .q = s->q + (size_t)g->t0 * qd, .kv = s->kv + (size_t)g->t0 * hd,
            .ring = seq_state(M, R, g) + M->layout.ring_off[l], .dtype = M->layout.dtype,
            .sinks = L->sink, .ratio = ratio,
            .out = s->attn + (size_t)g->t0 * qd,
        };
        if (ratio) a->comp = seg_rows(M, R, g, M->layout.entry_off[l], ratio, hd);
        if (csa) {
            a->sel = s->sel + (size_t)g->t0 * c->index_topk;
            a->nsel = s->nsel + g->t0;
            a->sel_ld = c->index_topk;
        }
    }
    /* Then the chunk's keys go into the ring, and K = V carried RoPE into
     * the output: rotate it back at the query position (both in the
     * attention op where the backend fuses them), then the grouped output
     * projection. */
    unsigned fused = be->attention_fused ? be->attention_fused(be, aa, B->nseg) : 0;
    for (int i = 0; i < B->nseg; i++) {
        aa[i].out_rope = fused & ATTN_FUSE_ROPE ? rt : NULL;
        aa[i].store_ring = fused & ATTN_FUSE_RING;
        /* only wo_a reads it: a BF16 matrix, as released (a backend that
         * holds the output in bf16 has no float x to quantize for FP8) */
        aa[i].out_matmul = (fused & ATTN_FUSE_MATMUL) && L->wo_a.type == QT_BF16;
    }
    be->attention(be, aa, B->nseg);
    if (!(fused & ATTN_FUSE_RING)) {
        for (int i = 0; i < B->nseg; i++) {
            const v4_segment *g = &B->segs[i];
            R->rargs[i] = (ring_args){ seq_state(M, R, g) + M->layout.ring_off[l],
                                       s->kv + (size_t)g->t0 * hd, g->n, g->pos0 };
        }
        be->ring_store(be, R->rargs, B->nseg, M->layout.dtype, c->sliding_window, hd);
    }
    if (!(fused & ATTN_FUSE_ROPE)) be->rope(be, s->attn, qd, T, nh, hd, rt, B->pos, true);
    int gin = (c->n_heads / c->o_groups) * hd;
    for (int g0 = 0; g0 < ng; g0 += PROJ_MAX) {
        qweight wg[PROJ_MAX];
        proj_list po = { 0 };
        for (int gi = g0; gi < ng && gi < g0 + PROJ_MAX; gi++) {
            wg[gi - g0] = qweight_view(&L->wo_a, gi * olr, olr, 0, gin);
            proj_add(&po, &wg[gi - g0], s->attn + (size_t)gi * gin, s->oa + (size_t)gi * olr,
                     ng * olr);
        }
        proj_run(be, &po, qd, T, NULL, NULL, 0);
    }
    be->matmul(be, &L->wo_b, s->oa, ng * olr, T, s->y, H);
}

static moe_args ffn_args(v4_model *M, v4_rank *R, const v4_batch *B, int l)
{
    const v4_config *c = &M->cfg;
    const v4_layer *L = &R->w.layers[l];
    return (moe_args){
        .T = B->T, .H = c->hidden_size, .x = R->s.x, .ids = B->ids, .gate = &L->gate,
        .bias = L->gate_bias, .tid2eid = L->tid2eid, .tid_i64 = L->tid_i64,
        .n_experts = c->n_experts, .topk = c->topk,
        .sigmoid_scores = c->scoring == V4_SCORE_SIGMOID,
        .routed_scale = (float)c->routed_scale, .limit = (float)c->swiglu_limit,
        .w1 = L->w1, .w2 = L->w2, .w3 = L->w3, .sw1 = &L->sw1, .sw2 = &L->sw2, .sw3 = &L->sw3,
        .out = R->s.y,
    };
}

/* One hyper-connected sublayer: expand the previous sublayer's output into
 * the streams (first: none), collapse them, normalize, run the sublayer,
 * all-reduce its partial output (left in s->y for the next one). */
static void sublayer(v4_model *M, v4_rank *R, const v4_batch *B, int l, bool is_ffn)
{
    const v4_config *c = &M->cfg;
    const v4_layer *L = &R->w.layers[l];
    v4_scratch *s = &R->s;
    backend *be = R->be;
    int T = B->T, H = c->hidden_size, hc = c->hc_mult;
    const float *fn = is_ffn ? L->hc_ffn_fn : L->hc_attn_fn;
    const float *base = is_ffn ? L->hc_ffn_base : L->hc_attn_base;
    const float *scale = is_ffn ? L->hc_ffn_scale : L->hc_attn_scale;
    const float *norm = is_ffn ? L->ffn_norm : L->attn_norm;
    float eps = (float)c->rms_eps;
    const float *y = l || is_ffn ? s->y : NULL;
    /* the sublayer's first matmuls' weights arrive during the mHC */
    if (is_ffn) {
        prefetch(be, T, (const qweight *const[]){ &L->gate, &L->sw1, &L->sw3, &L->sw2 }, 4);
    } else {
        const qweight *w[] = { &L->wq_a, &L->wkv, &L->wq_b, &L->comp.wkv, &L->comp.wgate,
                               &L->icomp.wkv, &L->icomp.wgate, &L->iweights, &L->iwq_b };
        bool csa = c->attn[l] == V4_ATTN_CSA;
        prefetch(be, T, w, csa ? 9 : v4_layer_ratio(c, l) ? 5 : 3);
    }
    /* the MoE's router with the mHC where the backend can; the collapsed
     * rows are wanted only normed */
    moe_args ma = is_ffn ? ffn_args(M, R, B, l) : (moe_args){ 0 };
    if (is_ffn && be->hc_pre_norm_route &&
        be->hc_pre_norm_route(be, s->h, y, T, hc, H, fn, base, scale, c->hc_sinkhorn_iters,
                              (float)c->hc_eps, eps, s->post, s->comb, NULL, norm, s->x, &ma)) {
        ma.routed = true;
    } else if (be->hc_pre_norm) {
        be->hc_pre_norm(be, s->h, y, T, hc, H, fn, base, scale, c->hc_sinkhorn_iters,
                        (float)c->hc_eps, eps, s->post, s->comb, NULL, norm, s->x);
    } else {
        if (y) be->hc_post(be, s->h, y, s->post, s->comb, T, hc, H);
        be->hc_pre(be, s->h, T, hc, H, fn, base, scale, c->hc_sinkhorn_iters,
                   (float)c->hc_eps, eps, s->post, s->comb, s->col);
        be->rmsnorm(be, s->col, H, T, H, norm, eps, s->x, H);
    }
    if (is_ffn) be->moe(be, &ma);
    else attention(M, R, B, l);
    be->allreduce(be, s->y, (size_t)T * H);
}

/* Every op of the step from the embedding to this rank's logits slice. */
static void forward_ops(v4_model *M, v4_rank *R, const v4_batch *B)
{
    const v4_config *c = &M->cfg;
    backend *be = R->be;
    v4_scratch *s = &R->s;
    int T = B->T, H = c->hidden_size, hc = c->hc_mult;
    be->embed(be, &R->w.embed, B->ids, T, hc, s->h);
    for (int l = 0; l < c->n_layers; l++) {
        sublayer(M, R, B, l, false);
        sublayer(M, R, B, l, true);
    }
    const float *y = c->n_layers ? s->y : NULL;
    float hc_eps = (float)c->hc_eps, eps = (float)c->rms_eps;

    /* The last hc_post, the head's collapse and the final norm only for
     * the rows whose logits are wanted (out_tok increases), a run of
     * consecutive rows at a time (a decode step's: all of them; a prefill
     * chunk's: its last row, not the 8,192 before), in one op where the
     * backend has it; run i's normed rows into head_in from row i on. */
    for (int i = 0, k; i < B->nout; i += k) {
        int t0 = B->out_tok[i];
        for (k = 1; i + k < B->nout && B->out_tok[i + k] == t0 + k; k++) {}
        float *h = s->h + (size_t)t0 * hc * H, *post = s->post + (size_t)t0 * hc;
        float *comb = s->comb + (size_t)t0 * hc * hc, *col = s->col + (size_t)i * H;
        float *hin = s->head_in + (size_t)i * H;
        const float *yt = y ? y + (size_t)t0 * H : NULL;
        if (be->hc_head_norm &&
            be->hc_head_norm(be, h, yt, post, comb, k, hc, H, R->w.hc_fn, R->w.hc_base,
                             R->w.hc_scale, hc_eps, eps, col, R->w.norm, hin))
            continue;
        if (yt) be->hc_post(be, h, yt, post, comb, k, hc, H);
        be->hc_head(be, h, k, hc, H, R->w.hc_fn, R->w.hc_base, R->w.hc_scale, hc_eps, eps, col);
        be->rmsnorm(be, col, H, k, H, R->w.norm, eps, hin, H);
    }
    be->matmul(be, &R->w.head, s->head_in, H, B->nout, s->logits, R->shard.nv);
}

/* Decode steps (one new token per sequence, up to 64 sequences: the
 * batches `bench --batch` and the recipes' max_num_seqs run) repeat the
 * same launches with new positions: the backend may replay them as a
 * graph.  The key: the token count and each sequence's position bound
 * (graph_pos_cap); 0 when the step is not one of those. */
#define GRAPH_MAX_TOKENS 64

static uint64_t graph_key(const v4_batch *B, const backend *be)
{
    if (!be->graph_begin || B->T > GRAPH_MAX_TOKENS || B->nout != B->T) return 0;
    uint64_t h = 1469598103934665603ULL;
    h = (h ^ (uint64_t)B->T) * 1099511628211ULL;
    for (int i = 0; i < B->nseg; i++) {
        if (B->segs[i].n != 1) return 0;
        h = (h ^ (uint64_t)graph_pos_cap(B->segs[i].pos0 + 1)) * 1099511628211ULL;
    }
    return h ? h : 1;
}

/* A decode step under a graph whose items all want only the greedy
 * choice (one row each): its argmax goes into the graph
 * (row_argmax_issue), so the row_argmax after graph_end only reads it. */
static void argmax_in_graph(v4_rank *R, const v4_batch *B)
{
    backend *be = R->be;
    if (!be->row_argmax_issue) return;
    for (int i = 0; i < B->nseg; i++)
        if (!B->items[i].argmax) return;
    be->row_argmax_issue(be, R->s.logits, B->nout, R->shard.nv);
}

/* The next decode step walked ahead (backend graph_prepare) while this
 * one runs on the device: the same sequences one position on, as a
 * decode batch's next step mostly is (no sequence finished or admitted),
 * and only where each already has the block that position goes into.
 * The ids are not known yet: the walk stages zeros, which the launch
 * replaces.  The step, if it is that one (ahead_matches), then launches
 * without a walk of its own while the device waits. */
static void walk_ahead(v4_model *M, v4_rank *R, const v4_batch *B, int64_t nb)
{
    backend *be = R->be;
    R->pre.ok = false;
    if (!be->graph_prepare) return;
    bool argmax = true;
    for (int i = 0; i < B->nseg; i++) {
        const v4_segment *g = &B->segs[i];
        if (cache_blocks_for(&M->layout, (int64_t)g->pos0 + 2) > g->seq->c.nblocks) return;
        R->pseg[i] = *g;
        R->pseg[i].pos0++;
        R->pids[i] = 0;
        R->ppos[i] = R->pseg[i].pos0;
        R->pslot[i] = g->seq->c.slot;
        argmax = argmax && B->items[i].argmax;
    }
    v4_batch N = *B;
    N.segs = R->pseg, N.ids = R->pids, N.pos = R->ppos;
    uint64_t key = graph_key(&N, be);
    double t0 = model_now_s();
    if (!key || !be->graph_prepare(be, key)) return;
    forward_ops(M, R, &N);
    argmax_in_graph(R, &N);
    bool ok = be->graph_prepared(be, R->pids);
    R->ahead_walks++;
    R->ahead_ms += (model_now_s() - t0) * 1e3;
    if (!ok) return;
    memcpy(R->pblk, R->blockptr, nb * sizeof *R->pblk);
    R->pre.argmax = argmax, R->pre.key = key, R->pre.nseg = B->nseg, R->pre.nb = nb;
    R->pre.ok = true;
}

/* Whether step B (key, nb block addresses, in blockptr) is the one walked
 * ahead: everything the walk read but the ids. */
static bool ahead_matches(const v4_rank *R, const v4_batch *B, uint64_t key, int64_t nb)
{
    if (!R->pre.ok || R->pre.key != key || R->pre.nseg != B->nseg || R->pre.nb != nb)
        return false;
    bool argmax = true;
    for (int i = 0; i < B->nseg; i++) {
        const v4_segment *g = &B->segs[i], *p = &R->pseg[i];
        if (g->seq != p->seq || g->n != p->n || g->pos0 != p->pos0 || g->t0 != p->t0 ||
            g->blk0 != p->blk0 || g->seq->c.slot != R->pslot[i])
            return false;
        argmax = argmax && B->items[i].argmax;
    }
    return argmax == R->pre.argmax && !memcmp(R->blockptr, R->pblk, nb * sizeof *R->pblk);
}

void v4_forward_rank(void *batch, int rank)
{
    v4_batch *B = batch;
    v4_model *M = B->m;
    v4_rank *R = &M->ranks[rank];
    const v4_config *c = &M->cfg;
    backend *be = R->be;
    int64_t nb = 0;
    for (int i = 0; i < B->nseg; i++) nb += B->segs[i].seq->c.nblocks;
    R->short_of_memory = !ensure_scratch(M, R, B->T, B->nout, nb, B->nseg);
    /* All ranks run the step or none: they meet in all-reduces. */
    tp_barrier(M->group);
    for (int r = 0; r < M->tp; r++)
        if (M->ranks[r].short_of_memory) return;

    /* Block addresses of every segment in this rank's memory. */
    for (int i = 0; i < B->nseg; i++) {
        const seq_cache *sc = &B->segs[i].seq->c;
        for (int64_t b = 0; b < sc->nblocks; b++)
            R->blockptr[B->segs[i].blk0 + b] =
                R->block_mem + (size_t)sc->blocks[b] * M->layout.block_bytes;
    }

    uint64_t key = graph_key(B, be);
    double t0 = model_now_s(), t1 = t0;
    bool ahead = key && ahead_matches(R, B, key, nb) &&
                 be->graph_launch_prepared(be, key, B->ids, (size_t)B->T * sizeof *B->ids);
    R->pre.ok = false;
    if (!ahead) {
        if (key) be->graph_begin(be, key);
        bool again;
        do {
            forward_ops(M, R, B);
            if (key) argmax_in_graph(R, B);
            t1 = model_now_s();
            again = key && be->graph_end(be);
        } while (again);
    }
    if (B->T == B->nseg) {      /* a decode step: every sequence one token */
        double t2 = model_now_s();
        R->host_steps++;
        R->ahead_steps += ahead;
        R->host_walk_ms += (t1 - t0) * 1e3;
        R->host_launch_ms += (t2 - t1) * 1e3;
    }
    if (key) walk_ahead(M, R, B, nb);

    /* This rank's columns of the logits rows straight into the items'
     * buffers (pinned where the caller took them from v4_logits_alloc), a
     * copy per run of items whose buffers follow each other: one for a
     * batch in one buffer.  (A step-sized buffer in between, malloc'd and
     * copied again, cost a 64-sequence decode step ~3.5 ms: pageable
     * memory's staged copy, its page faults, the second copy.)  Items
     * that want only the greedy choice: one row_argmax per run of them,
     * into this rank's amax arrays (v4_step takes the best over ranks). */
    size_t V = c->vocab_size;
    for (int i = 0, o = 0, j; i < B->nseg; i = j) {
        const v4_step_item *it = &B->items[i];
        int rows = it->all_logits ? it->n_tokens : 1;
        if (it->argmax) {
            for (j = i + 1; j < B->nseg && B->items[j].argmax; j++) rows++;
            be->row_argmax(be, R->s.logits + (size_t)o * R->shard.nv, rows, R->shard.nv,
                           R->shard.v0, R->amax_val + o, R->amax_idx + o);
            o += rows;
            continue;
        }
        float *dst = it->logits;
        for (j = i + 1; j < B->nseg && !B->items[j].argmax &&
                        B->items[j].logits == dst + rows * V; j++)
            rows += B->items[j].all_logits ? B->items[j].n_tokens : 1;
        be->gather_cols(be, R->s.logits + (size_t)o * R->shard.nv, rows, R->shard.nv, dst, V,
                        R->shard.v0);
        o += rows;
    }
}
