// The CUDA backend (engine/model/backend.h): one instance per tensor-parallel
// rank, rank r on device r with its own stream and an NCCL communicator
// over the group.  Activations and the cache are device memory (float32);
// weights are uploaded once, as the rank's shard in stored precision.
// Host-side inputs of an op (positions, token ids, block addresses) are
// staged through a small cache of pinned buffers keyed by content, so the
// same array used by many ops of a step is copied once.  This file holds
// the ops; the rest of the backend is in the cuda_*.cu files beside it
// (kernels/cuda/README.md), its state in backend_cuda.cuh.
#include "backend_cuda.cuh"
#include "moe_decode.cuh"
#include "moe_gemm_fp8.cuh"

// Attention and the indexer of prefill steps on tensor cores, which take
// keys as bf16: always under bf16; under bf16x2 only when the cache holds
// them exactly in bf16 (BF16, FP8), so that on a float32 cache the default
// mode stays within its 2^-16 of the float32 reference (fp8: as bf16x2).
static bool tensor_core_keys(cu_impl *c, enum kv_dtype t)
{
    return c->gemm == BACKEND_GEMM_BF16 || (attn_split(c) && t != KV_F32);
}

void fail(cu_impl *c, const char *fmt, ...)
{
    if (c->failed) return;
    c->failed = true;
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(c->err, sizeof c->err, "device %d: ", c->dev);
    vsnprintf(c->err + n, sizeof c->err - n, fmt, ap);
    va_end(ap);
}

bool to_dqw(cu_impl *c, const qweight *w, dqw *q)
{
    const cuda_qw *d = (const cuda_qw *)w->dev;
    if (!d) {
        fail(c, "a %dx%d weight was never uploaded", w->rows, w->cols);
        return false;
    }
    *q = dqw{ (int)w->type, w->rows, w->cols, d->data, d->scale, d->ld, d->sld,
              w->row0 - d->row0, w->col0 - d->col0, d->estride, d->sestride, d->bf,
              d->bstride };
    return true;
}

static bool to_rope(cu_impl *c, const rope_table *rt, drope *r)
{
    if (rt->npairs > ROPE_MAX_PAIRS) {
        fail(c, "RoPE with %d channel pairs (at most %d)", rt->npairs, ROPE_MAX_PAIRS);
        return false;
    }
    r->npairs = rt->npairs;
    r->attn_factor = rt->attn_factor;
    memcpy(r->inv_freq, rt->inv_freq, rt->npairs * sizeof(float));
    return true;
}

// A batched op's staged buffer (stage_begin): its structs, then each
// sequence's block addresses from `off` on (with a staged array per
// sequence a large batch would outlast the staging entries).
struct seg_pack {
    char *host;
    const char *dev;
    size_t off;
};

// Room for the block addresses of rows [0, nrows_cap) of p.
static size_t paged_bytes(const paged_rows *p, int nrows_cap)
{
    int ncap = nrows_cap > 0 ? (nrows_cap + p->per_block - 1) / p->per_block : 0;
    return round_up(ncap * sizeof(char *), 16);
}

// A batched op's bytes for p's block addresses in its staged buffer:
// none under a graph, where to_paged puts them in the arena.
static size_t pack_bytes(cu_impl *c, const paged_rows *p, int nrows_cap)
{
    return in_graph(c) ? 0 : paged_bytes(p, nrows_cap);
}

// Device block addresses for rows [0, nrows) of p (under a graph, in
// room for rows [0, nrows_cap)); into sp's buffer when given, except
// under a graph: there a sequence's list (the same host array for every
// layer's ops: its cache blocks) goes to the arena once a step
// (arena_put), not once per op and layer (a 64-sequence step copied
// ~900 of them, 512 bytes each at 8K).
static bool to_paged(cu_impl *c, const paged_rows *p, int nrows, int nrows_cap, dpaged *d,
                     seg_pack *sp = NULL)
{
    int nblk = nrows > 0 ? (nrows + p->per_block - 1) / p->per_block : 0;
    int ncap = nrows_cap > 0 ? (nrows_cap + p->per_block - 1) / p->per_block : 0;
    if (sp && !in_graph(c)) {
        memcpy(sp->host + sp->off, p->blocks, nblk * sizeof(char *));
        d->blocks = (char *const *)(sp->dev + sp->off);
        sp->off += paged_bytes(p, nrows_cap);
    } else {
        d->blocks = (char *const *)(in_graph(c) ? arena_put(c, p->blocks, nblk * sizeof(char *),
                                                            ncap * sizeof(char *))
                                                : stage(c, p->blocks, nblk * sizeof(char *)));
    }
    d->off = (long long)p->off;
    d->per_block = p->per_block;
    d->row_len = p->row_len;
    d->dtype = (int)p->dtype;
    return !c->failed;
}

static const char *cu_error(backend *b)
{
    cu_impl *c = impl(b);
    return c->failed ? c->err : NULL;
}

// Decode batches of 9-64 tokens, FP8 or BF16 weights, on tensor cores
// (not under f32): below GEMM_MODE_MIN_T x split in two bf16 parts in
// every mode (within 2^-16 of each x: the bf16x2 bound of the float32
// product these steps promise); at 64 the prefill mode's x (bf16: rounded
// once; bf16x2: split; fp8: act_quant(x) for FP8 weights, exact in bf16,
// and rounded once for BF16 ones).
// By default (SMALL_MMA_AUTO), as runs H4 and I2-I3 measured each against
// the others per rank6 matrix and end to end: up to SMALL_MMA_MAX_T tokens
// BF16 matrices of up to 4096 rows on cu_matmul_mma (where SM2 measured it
// faster: its `measured`), the others (FP8, the head) on cu_matmul_stream;
// from stream_max_t + 1 (STREAM_MAX_T) cuBLASLt, whose one GEMM over x's
// stacked parts (lt_gemm) beats the streamed kernel there (its
// instructions per weight grow with the tokens; cu_matmul_wgmma, run I2,
// is slower still).  false: not taken.
static bool small_mma(cu_impl *c, const dqw &q, const float *x, int ldx, int T, float *y,
                      int ldy)
{
    int mode = c->small_mma;
    if (mode == SMALL_MMA_OFF || c->gemm == BACKEND_GEMM_F32 || T <= 8 || T > CU_GEMV_MAX_T ||
        (mode == SMALL_MMA_AUTO && T > c->stream_max_t) || (q.type != QT_FP8 && q.type != QT_BF16) ||
        q.rows <= 0 || q.cols <= 0)
        return false;
    bool quant = fp8_quantized(c, q.type, T);
    bool split = T < GEMM_MODE_MIN_T || (!quant && split_mode(c));
    if (quant) {
        float *xq = (float *)grow(c, &c->xq, (size_t)T * q.cols * sizeof(float));
        if (c->failed) return true;
        cu_act_quant_round(c->st, x, ldx, T, q.cols, xq, q.cols);
        x = xq, ldx = q.cols;
    }
    if (mode == SMALL_MMA_WGMMA)
        return cu_matmul_wgmma(c->st, q, x, ldx, T, y, ldy, split, c->wgmma_wg);
    if (mode == SMALL_MMA_STREAM || (mode == SMALL_MMA_AUTO && (T > SMALL_MMA_MAX_T ||
                                                                q.type == QT_FP8 || q.rows > 4096)))
        return cu_matmul_stream(c->st, q, x, ldx, T, y, ldy, split);
    return cu_matmul_mma(c->st, q, x, ldx, T, y, ldy, split, mode == SMALL_MMA_AUTO);
}

// With the FP8 weights' bf16 copies, cuBLASLt over x's stacked parts
// beats the streamed kernel on every FP8 rank6 matrix and the head from 9
// tokens (run K4, `bench_cuda_gemv batch` at 12 and 16: wo_b 15.1 against
// 28.2 us, the head 142 against 165), not the staged kernel on BF16
// matrices of up to 4096 rows: from lt_min_t tokens those matrices go to
// cuBLASLt first (LLM_CUDA_LT_MIN_T).
static bool lt_first(const cu_impl *c, const dqw &q, int T)
{
    return c->small_mma == SMALL_MMA_AUTO && c->gemm != BACKEND_GEMM_F32 && T >= c->lt_min_t &&
           ((q.type == QT_FP8 && q.bf) || (q.type == QT_BF16 && q.rows > 4096));
}

// Where float x of the held attention output (c->held) is in bf16; NULL:
// x is not in it.
static uint16_t *held_bf16(cu_impl *c, const float *x)
{
    const float *h = c->held.x;
    return h && x >= h && x < h + c->held.n ? (uint16_t *)h + (x - h) : NULL;
}

// Up to gemv_max_t tokens (decode batches) the GEMV kernel reads the
// weights in stored precision (under fp8, from GEMM_MODE_MIN_T tokens on,
// times act_quant(x): the products of the CPU's fp8 mode).  More: the
// prefill GEMMs (dense_matmul: cuBLASLt; below GEMM_MODE_MIN_T tokens x
// split in two bf16 parts in every mode but f32).  9-64 tokens of FP8
// and BF16 weights: lt_first, then small_mma.  x in the attention output
// held in bf16: held_matmul.
static void matmul_any(cu_impl *c, const dqw &q, const float *x, int ldx, int T, float *y,
                       int ldy)
{
    if (const uint16_t *h = held_bf16(c, x)) {
        held_matmul(c, q, h, ldx, T, y, ldy);
        return;
    }
    bool lt = lt_first(c, q, T);
    if (!lt && small_mma(c, q, x, ldx, T, y, ldy)) return;
    if (lt || T > c->gemv_max_t) {
        dense_matmul(c, q, x, ldx, T, y, ldy);
        return;
    }
    if (fp8_quantized(c, q.type, T) && q.cols > 0) {
        float *xq = (float *)grow(c, &c->xq, (size_t)T * q.cols * sizeof(float));
        if (c->failed) return;
        cu_act_quant_round(c->st, x, ldx, T, q.cols, xq, q.cols);
        x = xq, ldx = q.cols;
    }
    cu_matmul(c->st, q, x, ldx, T, y, ldy);
}

static void cu_matmul_op(backend *b, const qweight *w, const float *x, int ldx, int T, float *y,
                         int ldy)
{
    cu_impl *c = enter(b);
    dqw q;
    if (recording(c) || !to_dqw(c, w, &q)) return;
    matmul_any(c, q, x, ldx, T, y, ldy);
    launched(c, "matmul");
}

// Runs of consecutive matrices of one format and width in one GEMV launch
// each (few tokens; with norm_w, all of them in one launch that normalizes
// x on the way in, else x normalized once into scratch); the rest one by
// one as cu_matmul_op.
static void cu_matmuls_op(backend *b, int n, const qweight *const *w, const float *const *x,
                          int ldx, int T, float *const *y, const int *ldy, const float *norm_w,
                          float eps)
{
    cu_impl *c = enter(b);
    if (recording(c)) return;
    dqw q[CU_MULTI_MAX];
    const float *xs[CU_MULTI_MAX];
    if (norm_w) {
        bool one = n <= CU_MULTI_MAX && T < LT_MIN_T;
        for (int i = 0; one && i < n; i++) {
            if (!to_dqw(c, w[i], &q[i])) return;
            one = q[i].type == q[0].type && q[i].cols == q[0].cols;
        }
        if (one && cu_matmul_multi(c->st, n, q, x, ldx, T, y, ldy, norm_w, eps)) {
            launched(c, "matmuls");
            return;
        }
        float *xn = (float *)grow(c, &c->xn, (size_t)T * ldx * sizeof(float));
        if (c->failed) return;
        cu_rmsnorm(c->st, x[0], ldx, T, w[0]->cols, norm_w, eps, xn, ldx);
        for (int i = 0; i < CU_MULTI_MAX; i++) xs[i] = xn;
    }
    if (!norm_w && held_bf16(c, x[0])) {    // one by one: no joined or batched form reads it
        for (int i = 0; i < n && to_dqw(c, w[i], &q[0]); i++)
            matmul_any(c, q[0], x[i], ldx, T, y[i], ldy[i]);
        launched(c, "matmuls");
        return;
    }
    xkeep_scope keep(c);    // prefill GEMMs of one x split it into bf16 parts once
    for (int i = 0, k; i < n && !c->failed; i += k) {
        const float *const *xi = norm_w ? xs : x + i;
        // the run of matrices of this x: one GEMM where join_weights laid
        // them out as one (decode batches from lt_min_t tokens, where
        // cuBLASLt takes their bf16 forms)
        for (k = 0; joins(c, T) && k < CU_SEG_MAX && i + k < n && xi[k] == xi[0]; k++)
            if (!to_dqw(c, w[i + k], &q[k])) return;
        if (k > 1 && lt_joined(c, k, q, xi[0], ldx, T, y + i, ldy + i)) continue;
        // views of one matrix, each with its own slice of x: one batch
        int m = n - i < CU_SEG_MAX ? n - i : CU_SEG_MAX;
        if (k <= 1 && batches(c, m, T)) {
            for (k = 0; k < m; k++)
                if (!to_dqw(c, w[i + k], &q[k])) return;
            if (lt_batched(c, m, q, xi, ldx, T, y + i, ldy + i)) continue;
        }
        for (k = 0; k < CU_MULTI_MAX && i + k < n; k++) {
            if (!to_dqw(c, w[i + k], &q[k])) return;
            if (k && (q[k].type != q[0].type || q[k].cols != q[0].cols)) break;
        }
        if (T < LT_MIN_T && k > 1 &&
            cu_matmul_multi(c->st, k, q, xi, ldx, T, y + i, ldy + i, NULL, 0))
            continue;
        for (int j = 0; j < k; j++) matmul_any(c, q[j], xi[j], ldx, T, y[i + j], ldy[i + j]);
    }
    launched(c, "matmuls");
}

static void cu_embed_op(backend *b, const qweight *w, const int32_t *ids, int T, int copies,
                        float *out)
{
    cu_impl *c = enter(b);
    dqw q;
    if (!to_dqw(c, w, &q)) return;
    const int *d = (const int *)stage(c, ids, T * sizeof *ids);
    if (c->failed || recording(c)) return;
    cu_embed(c->st, q, d, T, copies, out);
    launched(c, "embed");
}

static void cu_rmsnorm_op(backend *b, const float *x, int ldx, int T, int n, const float *weight,
                          float eps, float *out, int ldo)
{
    cu_impl *c = enter(b);
    if (recording(c)) return;
    cu_rmsnorm(c->st, x, ldx, T, n, weight, eps, out, ldo);
    launched(c, "rmsnorm");
}

static void cu_rope_op(backend *b, float *x, int ld, int T, int nheads, int head_dim,
                       const rope_table *rt, const int32_t *pos, bool inverse)
{
    cu_impl *c = enter(b);
    drope r;
    if (!to_rope(c, rt, &r)) return;
    const int *d = (const int *)stage(c, pos, T * sizeof *pos);
    if (c->failed || recording(c)) return;
    cu_rope(c->st, x, ld, T, nheads, head_dim, r, d, inverse);
    launched(c, "rope");
}

static void cu_scale_op(backend *b, float *x, int ld, int T, int n, float s)
{
    cu_impl *c = enter(b);
    if (recording(c)) return;
    cu_scale(c->st, x, ld, T, n, s);
    launched(c, "scale");
}

static bool hc_ok(cu_impl *c, int hc)
{
    if (hc > BACKEND_HC_MAX) fail(c, "hc_mult %d (at most %d)", hc, BACKEND_HC_MAX);
    return hc <= BACKEND_HC_MAX;
}

// Many tokens, unless LLM_CUDA_HC_FUSED_MANY=0 or the shapes do not fit
// (cu_hc_post_logits): hc_post (y not NULL) with the logits in one pass
// over the streams, then the mix, the collapse and (normed not NULL) the
// RMSNorm in a second: two launches.  false: nothing launched.
static bool hc_pre_many(cu_impl *c, float *h, const float *y, int T, int hc, int H,
                        const float *fn, const float *base, const float *scale, int iters,
                        float hc_eps, float norm_eps, float *m, float *post, float *comb,
                        float *collapsed, const float *norm_w, float *normed)
{
    if (!c->hc_many || T < c->hc_many_t) return false;
    int S = c->hc_split ? cu_hc_post_logits_slices(T, H, c->hc_slice_chunks) : 1;
    void *part = S > 1 ? grow(c, &c->hcpart, cu_hc_post_logits_part(T, hc, S)) : NULL;
    // the slices' sums added by the collapse's blocks, a token each
    bool later = part && cu_hc_slices_later(S, hc, H);
    if (c->failed || !cu_hc_post_logits(c->st, h, y, T, hc, H, fn, post, comb, norm_eps, m, part,
                                         S, later ? NULL : c->hc_count))
        return false;
    phase(c, "hc_pre logits");
    cu_hc_collapse_norm(c->st, h, T, hc, H, m, later ? part : NULL, S, base, scale, iters, hc_eps,
                        norm_eps, norm_w, post, comb, collapsed, normed, c->hc_tail);
    return true;
}

// Few tokens: a block per (logit, token).  Many: hc_pre_many, or a block
// per 32 tokens with all the logits (or, for shapes that kernel does not
// take, the logits as a float32 GEMM over the raw streams, scaled per
// token by the rms factor), then the collapse.
static void hc_pre(cu_impl *c, const float *h, int T, int hc, int H, const float *fn,
                   const float *base, const float *scale, int iters, float hc_eps,
                   float norm_eps, float *post, float *comb, float *collapsed, bool head)
{
    if (!hc_ok(c, hc) || T <= 0) return;
    int nmix = head ? hc : (2 + hc) * hc, n = hc * H;
    float *m = (float *)grow(c, &c->hcm, (size_t)T * (nmix + 1) * sizeof(float));
    if (c->failed) return;
    if (!head && hc_pre_many(c, (float *)h, NULL, T, hc, H, fn, base, scale, iters, hc_eps,
                             norm_eps, m, post, comb, collapsed, NULL, NULL))
        return;
    float *r = NULL;
    bool many = T >= c->hc_many_t;
    size_t pb = many && c->hc_split ? cu_hc_logits_many_part(T, n, nmix) : 0;
    void *part = pb ? grow(c, &c->hcpart, pb) : NULL;
    if (c->failed) return;
    if (many && !cu_hc_logits_many(c->st, h, T, n, fn, nmix, norm_eps, m, part, c->hc_count)) {
        r = m + (size_t)T * nmix;
        cu_hc_rms(c->st, h, T, n, norm_eps, r);
        lt_gemm(c, gemm_op{ fn, n, false, 0, 0 }, nmix, n, gemm_op{ h, n, false, 0, 0 }, T, m,
                nmix);
    } else if (!many) {
        cu_hc_logits(c->st, h, T, n, fn, nmix, norm_eps, m);
    }
    phase(c, head ? "hc_head logits" : "hc_pre logits");
    cu_hc_collapse(c->st, h, T, hc, H, m, r, base, scale, iters, hc_eps, post, comb, collapsed,
                   head);
}

static void cu_hc_pre_op(backend *b, const float *h, int T, int hc, int H, const float *fn,
                         const float *base, const float *scale, int iters, float hc_eps,
                         float norm_eps, float *post, float *comb, float *collapsed)
{
    cu_impl *c = enter(b);
    if (recording(c)) return;
    hc_pre(c, h, T, hc, H, fn, base, scale, iters, hc_eps, norm_eps, post, comb, collapsed, false);
    launched(c, "hc_pre");
}

// Few tokens: one launch (cu_hc_pre_norm); many: two (hc_pre_many); else
// hc_post (with y), hc_pre, then the RMSNorm.
static void cu_hc_pre_norm_op(backend *b, float *h, const float *y, int T, int hc, int H,
                              const float *fn, const float *base, const float *scale, int iters,
                              float hc_eps, float norm_eps, float *post, float *comb,
                              float *collapsed, const float *norm_w, float *normed)
{
    cu_impl *c = enter(b);
    if (recording(c) || !hc_ok(c, hc) || T <= 0) return;
    int nmix = (2 + hc) * hc;
    size_t bytes = HC_FUSED_SCRATCH(nmix, T), pre_bytes = (size_t)T * (nmix + 1) * sizeof(float);
    void *m = grow(c, &c->hcm, bytes > pre_bytes ? bytes : pre_bytes);
    // collapsed NULL: not stored by the collapse of many tokens (a
    // prefill chunk's 128 MB of 768 at V4's shapes), else into scratch
    bool many = T >= c->hc_many_t;
    auto col_scratch = [&] { return (float *)grow(c, &c->hccol, (size_t)T * H * sizeof(float)); };
    if (!collapsed && !many) collapsed = col_scratch();
    if (c->failed) return;
    bool done = !many ? cu_hc_pre_norm(c->st, h, y, T, hc, H, fn, base, scale, iters, hc_eps,
                                       norm_eps, norm_w, m, c->hc_count, post, comb, collapsed,
                                       normed, c->hc_tail, c->hc_cluster)
                      : hc_pre_many(c, h, y, T, hc, H, fn, base, scale, iters, hc_eps, norm_eps,
                                    (float *)m, post, comb, collapsed, norm_w, normed);
    if (!done) {
        if (!collapsed) collapsed = col_scratch();
        if (c->failed) return;
        if (y) cu_hc_post(c->st, h, y, post, comb, T, hc, H);
        hc_pre(c, h, T, hc, H, fn, base, scale, iters, hc_eps, norm_eps, post, comb, collapsed,
               false);
        cu_rmsnorm(c->st, collapsed, H, T, H, norm_w, norm_eps, normed, H);
    }
    launched(c, "hc_pre_norm");
}

// The router's outputs for T tokens (scores [T][E]; choices, weights and
// their order [T][K]) in the buffers the moe op reads them from, sized
// alike by it and by hc_pre_norm_route (which fills them before it).
struct route_bufs {
    float *sc, *wt;
    int *idx, *ord;
};
static route_bufs route_scratch(cu_impl *c, int T, int E, int K)
{
    size_t ns = (size_t)T * K;
    return { (float *)grow(c, &c->sc, (size_t)T * E * sizeof(float)),
             (float *)grow(c, &c->wt, ns * sizeof(float)),
             (int *)grow(c, &c->idx, ns * sizeof(int)), (int *)grow(c, &c->ord, ns * sizeof(int)) };
}

// hc_pre_norm with the MoE router in its clusters (cu_hc_pre_norm_route):
// scored routing (not hashed) of a bf16 gate, few tokens, where the
// clusters run; the moe op then finds sc, idx, wt and ord filled.
static bool cu_hc_pre_norm_route_op(backend *b, float *h, const float *y, int T, int hc, int H,
                                    const float *fn, const float *base, const float *scale,
                                    int iters, float hc_eps, float norm_eps, float *post,
                                    float *comb, float *collapsed, const float *norm_w,
                                    float *normed, const moe_args *a)
{
    cu_impl *c = enter(b);
    int E = a->n_experts, K = a->topk;
    dqw gate = {};
    bool ok = c->hc_route && hc == 4 && T < c->hc_many_t && a->T == T && a->x == normed &&
              !a->tid2eid && a->gate->type == QT_BF16 && a->gate->rows == E &&
              a->gate->cols == H && to_dqw(c, a->gate, &gate);
    cu_hc_route r = { ok ? gate.data + (gate.r0 * gate.ld + gate.c0) * 2 : NULL, gate.ld, a->bias,
                      E, K, a->sigmoid_scores, a->routed_scale, NULL, NULL, NULL, NULL };
    if (!ok || !cu_hc_route_fits(T, H, r) || c->failed) return false;
    if (recording(c)) return true;
    route_bufs rb = route_scratch(c, T, E, K);
    if (!collapsed) collapsed = (float *)grow(c, &c->hccol, (size_t)T * H * sizeof(float));
    if (c->failed) return false;
    r.sc = rb.sc, r.idx = rb.idx, r.order = rb.ord, r.wt = rb.wt;
    if (!cu_hc_pre_norm_route(c->st, h, y, T, H, fn, base, scale, iters, hc_eps, norm_eps,
                              norm_w, post, comb, collapsed, normed, r)) {
        fail(c, "hc_pre_norm_route: a gate of %d x %d, top %d, H %d it cannot take", E, H, K, H);
        return false;
    }
    launched(c, "hc_pre_norm");
    return true;
}

static void cu_hc_head_op(backend *b, const float *h, int T, int hc, int H, const float *fn,
                          const float *base, const float *scale, float hc_eps, float norm_eps,
                          float *out)
{
    cu_impl *c = enter(b);
    if (recording(c)) return;
    hc_pre(c, h, T, hc, H, fn, base, scale, 0, hc_eps, norm_eps, NULL, NULL, out, true);
    launched(c, "hc_head");
}

// hc_post, hc_head and the final RMSNorm in one launch (cu_hc_head_norm:
// a few tokens, where cu_hc_pre_norm's clusters run).
static bool cu_hc_head_norm_op(backend *b, float *h, const float *y, const float *post,
                               const float *comb, int T, int hc, int H, const float *fn,
                               const float *base, const float *scale, float hc_eps,
                               float norm_eps, float *collapsed, const float *norm_w,
                               float *normed)
{
    cu_impl *c = enter(b);
    if (!c->hc_cluster || !c->hc_head_fuse || T >= c->hc_many_t || T > HC_FUSED_MAX_T ||
        c->failed)
        return false;
    // replaying a graph: the same answer as at its capture, no launch
    bool rec = recording(c);
    if (!cu_hc_head_norm(c->st, h, y, rec ? 0 : T, hc, H, fn, base, scale, hc_eps, norm_eps,
                         norm_w, post, comb, collapsed, normed))
        return false;
    if (!rec) launched(c, "hc_head");
    return true;
}

static void cu_hc_post_op(backend *b, float *h, const float *y, const float *post,
                          const float *comb, int T, int hc, int H)
{
    cu_impl *c = enter(b);
    if (recording(c) || !hc_ok(c, hc)) return;
    cu_hc_post(c->st, h, y, post, comb, T, hc, H);
    launched(c, "hc_post");
}

// The sequences of a step that add one token each (decode) run in one
// launch of each kernel when there are several: their indices in a, in
// order (c->hidx), and their count; 0 when fewer than two.
template <class A> static int one_token_segs(cu_impl *c, const A *a, int nseg)
{
    int k = 0;
    for (int i = 0; i < nseg; i++) k += a[i].n == 1;
    if (k < 2) return 0;
    if ((size_t)nseg > c->hidx_cap) {
        int *p = (int *)realloc(c->hidx, nseg * sizeof(int));
        if (!p) return 0;   // one launch per sequence then
        c->hidx = p;
        c->hidx_cap = nseg;
    }
    k = 0;
    for (int i = 0; i < nseg; i++)
        if (a[i].n == 1) c->hidx[k++] = i;
    return k;
}

// A batched op over a step's sequences: every sequence outside the
// one-token batch by one(x) (false: stop), the batch's as structs D in one
// staged buffer (then their block addresses: extra(x) bytes each), each
// written by pack(x, &d, &sp), launched by batch(h, dev, n1) with the host
// copy h to read the launch's shape from.
template <class D, class A, class One, class Extra, class Pack, class Batch>
static void run_segs(cu_impl *c, const A *a, int nseg, One one, Extra extra, Pack pack,
                     Batch batch)
{
    int n1 = one_token_segs(c, a, nseg), *idx = c->hidx;
    for (int i = 0, k = 0; i < nseg; i++) {
        if (k < n1 && idx[k] == i) {
            k++;
            continue;
        }
        if (!one(a[i])) return;
    }
    if (!n1) return;
    size_t head = round_up(n1 * sizeof(D), 16), bytes = head;
    for (int k = 0; k < n1; k++) bytes += extra(a[idx[k]]);
    seg_pack sp = { NULL, NULL, head };
    if (!(sp.host = stage_begin(c, bytes, &sp.dev))) return;
    D *h = (D *)sp.host;
    for (int k = 0; k < n1; k++) pack(a[idx[k]], &h[k], &sp);
    stage_end(c);
    if (!c->failed && !recording(c)) batch((const D *)h, (const D *)sp.dev, n1);
}

static bool to_dcomp(cu_impl *c, const compress_args *a, dcomp *d, seg_pack *sp = NULL)
{
    *d = dcomp{ a->n, a->pos0, a->ratio, a->d, a->overlap, a->ld, a->kv, a->gate, a->ape,
                a->norm, a->eps, a->state, {}, step_values(c, a->pos0, a->state) };
    return to_paged(c, &a->out, (a->pos0 + a->n) / a->ratio,
                    pos_end(c, a->pos0, a->n) / a->ratio, &d->out, sp);
}

static void cu_compress_op(backend *b, const compress_args *a, int nseg)
{
    cu_impl *c = enter(b);
    if (nseg <= 0) return;
    drope r;
    if (!to_rope(c, a->rope, &r)) return;
    run_segs<dcomp>(
        c, a, nseg,
        [&](const compress_args &x) {
            dcomp d;
            if (!to_dcomp(c, &x, &d)) return false;
            if (!recording(c)) cu_compress(c->st, d, r, NULL, c->comp_fuse);
            return true;
        },
        [&](const compress_args &x) {
            return pack_bytes(c, &x.out, pos_end(c, x.pos0, x.n) / x.ratio);
        },
        [&](const compress_args &x, dcomp *d, seg_pack *sp) { to_dcomp(c, &x, d, sp); },
        [&](const dcomp *h, const dcomp *dev, int n1) {
            dcomp shape = h[0];
            shape.n = n1;
            cu_compress(c->st, shape, r, dev, c->comp_fuse);
        });
    launched(c, "compress");
}

static bool to_dindexer(cu_impl *c, const indexer_args *a, dindexer *d, seg_pack *sp = NULL)
{
    int end = pos_end(c, a->pos0, a->n);
    *d = dindexer{ a->n, a->pos0, a->ratio, a->nheads, a->d, a->topk, a->q, a->w, {}, a->sel,
                   a->nsel, end, step_values(c, a->pos0, NULL) };
    return to_paged(c, &a->keys, (a->pos0 + a->n) / a->ratio, end / a->ratio, &d->keys, sp);
}

// Scores of `rows` rows of up to maxvis entries, at most 64M floats at
// once (token chunks beyond that; a batch of sequences always at once).
static float *indexer_scores(cu_impl *c, size_t rows, int maxvis, bool whole, size_t *cap)
{
    size_t want = rows * (maxvis > 0 ? maxvis : 1);
    *cap = whole || want < ((size_t)64 << 20) ? want : ((size_t)64 << 20);
    if (*cap < (size_t)maxvis) *cap = maxvis;
    return (float *)grow(c, &c->iscores, *cap * sizeof(float));
}

// The candidates of the top-k over several blocks a token (long contexts,
// few rows), or NULL: not needed (its clusters need none), or
// LLM_CUDA_TOPK_BLOCKS=0.
static unsigned *indexer_cand(cu_impl *c, const dindexer &d, size_t scores_cap)
{
    size_t bytes = c->topk_blocks && !c->topk_cluster ? cu_indexer_cand_bytes(d, scores_cap) : 0;
    return bytes ? (unsigned *)grow(c, &c->icand, bytes) : NULL;
}

// Steps of few tokens (decode) score on tensor cores straight from the
// cache (cu_indexer_dec) where the GEMM mode puts the prefill's scores
// there: the same bf16 queries a prefill chunk selects with.
static bool decode_mma(cu_impl *c, const dindexer &d)
{
    return c->idx_dec && tensor_core_keys(c, (enum kv_dtype)d.keys.dtype) &&
           cu_indexer_dec_fits(d);
}

// The prefill's tensor-core kernel: e4m3 where the fp8 mode scores in
// FP8 (indexer_fp8_scores, as the CPU's fp8 mode), else bf16 on wgmma or
// mma.sync (the switches: comparisons).
static enum cuda_indexer_kernel indexer_kernel(cu_impl *c, const indexer_args *a)
{
    if (c->gemm == BACKEND_GEMM_FP8 && c->idx_fp8 && indexer_fp8_scores(a))
        return c->idx_fp8_k128 ? CUDA_INDEXER_WGMMA_FP8_K128 : CUDA_INDEXER_WGMMA_FP8;
    return c->idx_wgmma ? CUDA_INDEXER_WGMMA : CUDA_INDEXER_MMA_SYNC;
}
static_assert(IDX_MMA_MIN_T == GEMM_MODE_MIN_T, "prefill steps score as the CPU's fp8 mode");

static void indexer_one(cu_impl *c, const indexer_args *a)
{
    dindexer d;
    if (!to_dindexer(c, a, &d) || recording(c)) return;
    int maxvis = d.pos_end / a->ratio;
    size_t cap;
    float *sc = indexer_scores(c, a->n, maxvis, false, &cap);
    unsigned *cand = indexer_cand(c, d, cap);
    // Many tokens: tensor-core scores over keys gathered as bf16 and the
    // queries rounded to bf16, in scratch the profile step at load
    // allocates (a step of the most tokens).
    uint16_t *keys = NULL;
    if (!in_graph(c) && a->n >= IDX_MMA_MIN_T && cu_indexer_mma_fits(a->nheads, a->d) &&
        tensor_core_keys(c, a->keys.dtype))
        keys = (uint16_t *)grow(c, &c->ikeys,
                                ((size_t)CU_INDEXER_KTILE + (size_t)a->n * CU_INDEXER_QROWS) *
                                    a->d * sizeof(uint16_t));
    if (c->failed) return;
    cu_mark mark = { [](void *x, const char *span) { phase((cu_impl *)x, span); }, c };
    cu_indexer(c->st, d, sc, cap, cand, keys, c->idx_tiled, indexer_kernel(c, a), decode_mma(c, d),
               c->topk_cluster, NULL, c->profile ? &mark : NULL);   // (profiles: no graphs)
}

// The launch shape of a batch: its first sequence's, with the largest
// position bound and the batch's count.
template <class D> static D batch_shape(const D *h, int n1)
{
    D shape = h[0];
    for (int k = 1; k < n1; k++)
        if (h[k].pos_end > shape.pos_end) shape = h[k];
    shape.n = n1;
    return shape;
}

static void cu_indexer_op(backend *b, const indexer_args *a, int nseg)
{
    cu_impl *c = enter(b);
    if (nseg <= 0) return;
    run_segs<dindexer>(
        c, a, nseg,
        [&](const indexer_args &x) {
            indexer_one(c, &x);
            return true;
        },
        [&](const indexer_args &x) {
            return pack_bytes(c, &x.keys, pos_end(c, x.pos0, x.n) / x.ratio);
        },
        [&](const indexer_args &x, dindexer *d, seg_pack *sp) { to_dindexer(c, &x, d, sp); },
        [&](const dindexer *h, const dindexer *dev, int n1) {
            dindexer shape = batch_shape(h, n1);
            size_t cap;
            float *sc = indexer_scores(c, n1, shape.pos_end / shape.ratio, true, &cap);
            unsigned *cand = indexer_cand(c, shape, cap);
            if (!c->failed)
                cu_indexer(c->st, shape, sc, cap, cand, NULL, c->idx_tiled, CUDA_INDEXER_WGMMA,
                           decode_mma(c, shape), c->topk_cluster, dev);
        });
    launched(c, "indexer");
}

// orope: a->out_rope's table in device memory (attn_orope), or NULL.
static bool to_dattn(cu_impl *c, const attention_args *a, dattn *d, seg_pack *sp = NULL,
                     const drope *orope = NULL)
{
    int end = pos_end(c, a->pos0, a->n);
    *d = dattn{ a->n, a->pos0, a->nheads, a->head_dim, a->window, a->scale, a->q, a->kv,
                (const char *)a->ring, (int)a->dtype, a->sinks, a->ratio, {}, a->sel, a->nsel,
                a->sel_ld, a->out, end, step_values(c, a->pos0, a->ring), orope,
                a->store_ring, held_bf16(c, a->out_matmul ? a->out : NULL) };
    return !a->ratio ||
           to_paged(c, &a->comp, (a->pos0 + a->n) / a->ratio, end / a->ratio, &d->comp, sp);
}

// Decode steps and short chunks (flash-decoding partials in c->apart when
// the plan splits the keys); segs: a batch of sequences.  At least
// LLM_CUDA_ATTN_MMA_MIN_T query tokens (or sequences) in a tensor-core
// mode, keys the tensor cores take exactly: attention_mma.cu's decode
// launch (a token's heads share each key tile).  Else the float32
// kernels: up to CU_ATTD_MAX_T tokens the one-launch decode kernel
// (attention_decode.cu); more, a head_dim it does not take, or
// LLM_CUDA_ATTN_DECODE=0: cu_attention and its combine.
enum attn_path { ATTN_MMA_DECODE, ATTN_DECODE, ATTN_SPLIT };

static attn_path attention_path(cu_impl *c, const dattn &d)
{
    int keys = d.window + (d.ratio ? (d.sel ? d.sel_ld : d.pos_end / d.ratio) : 0);
    bool many = c->attn_mma_t && d.n >= c->attn_mma_t;
    bool far = c->attn_mma_keys && keys >= c->attn_mma_keys;
    if ((many || far) && tensor_core_keys(c, (enum kv_dtype)d.ring_t) &&
        cu_attention_mma_decode_fits(d))
        return ATTN_MMA_DECODE;
    return c->attn_decode && cu_attention_decode_fits(d) ? ATTN_DECODE : ATTN_SPLIT;
}

static void attention_run(cu_impl *c, const dattn &d, const dattn *segs)
{
    int hpb = 0, splits, chunk;
    attn_path path = attention_path(c, d);
    bool mma = path == ATTN_MMA_DECODE, dec = path == ATTN_DECODE;
    if (mma) cu_attention_mma_decode_plan(d, c->attm_target, c->attm_cluster, &splits, &chunk);
    else if (dec) cu_attention_decode_plan(d, c->attd_target, &splits, &chunk);
    else cu_attention_plan(d, &hpb, &splits, &chunk);
    float *part = NULL;
    if (splits > 1) {
        part = (float *)grow(c, &c->apart,
                             (size_t)d.n * d.nheads * splits * (d.hd + 2) * sizeof(float));
        if (c->failed) return;
    }
    if (mma)
        cu_attention_mma_decode(c->st, d, c->attm_target, c->attm_cluster, attn_split(c), part,
                                c->attn_count, segs);
    else if (dec) cu_attention_decode(c->st, d, c->attd_target, part, c->attn_count, segs);
    else if (!cu_attention(c->st, d, part, segs))
        fail(c, "attention: head_dim %d is too large for the kernel", d.hd);
}

// A prefill step's HCA op (every entry visible to the chunk's later
// tokens, none chosen) over an FP8 cache: its entries as one bf16 tile,
// decoded once a step instead of by every query token's block of the
// tensor-core kernel (the FP8 conversion was 22-24% of its instructions,
// run T3; at 1M an entry was decoded 8,192 times a chunk).  The same bf16
// values the blocks made, so the same output bits; the tile (8 MB at 1M)
// stays in L2 for the blocks' reads.  Graphs never read it (prefill).
static void hca_keys_bf16(cu_impl *c, dattn *d)
{
    int n = d->pos_end / d->ratio;
    if (!c->attn_hca_bf16 || !d->ratio || d->sel || d->comp.dtype != KV_FP8 || n <= 0) return;
    uint16_t *tile = (uint16_t *)grow_outside(c, &c->hcakeys, (size_t)n * d->hd * sizeof(uint16_t));
    if (c->failed) return;
    cu_gather_bf16(c->st, d->comp, 0, n, d->hd, tile);
    char *block = (char *)tile;
    const void *blocks = stage(c, &block, sizeof block);
    if (blocks) d->comp = dpaged{ (char *const *)blocks, 0, n, d->hd, KV_BF16 };
}

// A prefill chunk's attention on the tensor-core kernel (attention_one).
static bool attention_prefill_mma(cu_impl *c, const attention_args *a)
{
    return !in_graph(c) && a->n >= ATT_MMA_MIN_T && tensor_core_keys(c, a->dtype);
}

static void attention_one(cu_impl *c, const attention_args *a, const drope *orope)
{
    dattn d;
    if (!to_dattn(c, a, &d, NULL, orope) || recording(c)) return;
    if (attention_prefill_mma(c, a)) {
        dattn e = d;
        hca_keys_bf16(c, &e);
        if (c->failed || cu_attention_mma(c->st, e, attn_split_prefill(c), c->attn_tokens)) return;
    }
    if (d.obf || (d.orope && a->n > 1))
        fail(c, "attention: a %d-token chunk's output asked for in bf16 or rotated back "
             "(attention_fused said so) that its kernel does not make", a->n);
    else
        attention_run(c, d, NULL);
}

// LLM_CUDA_ATTN_FUSE: the ops after attention in its kernels.  Decode
// steps: the ring store and the output's inverse RoPE, where every
// sequence has one query token (the ring slot a token's key goes to holds
// no key of any window the op reads) and the op takes one of the decode
// kernels (attention_one and attention_run's choice for such steps: the
// sequence alone, or the batch's shape).  Prefill steps on the
// tensor-core kernel: the inverse RoPE, and under the one-part bf16 modes
// the output in bf16 for wo_a, whose GEMM would round it so (c->held: the
// 4 round_bf16 launches of a layer's output and half its bytes, 2-3% of a
// 32K prefill).  Not the ring store there: the chunk's blocks read the
// ring's keys while others would overwrite them.
static unsigned cu_attention_fused_op(backend *b, const attention_args *a, int nseg)
{
    cu_impl *c = impl(b);
    if (!c->attn_fuse || nseg <= 0) return 0;
    bool pre = true;
    for (int i = 0; i < nseg; i++)
        pre = pre && attention_prefill_mma(c, &a[i]) &&
              cu_attention_mma_fits(a[i].head_dim);
    if (pre)
        return ATTN_FUSE_ROPE | (c->gemm == BACKEND_GEMM_BF16 || c->gemm == BACKEND_GEMM_FP8
                                     ? ATTN_FUSE_MATMUL : 0);
    if (nseg > CU_ATTD_MAX_T) return 0;
    for (int i = 0; i < nseg; i++)
        if (a[i].n != 1 || a[i].ratio != a[0].ratio || a[i].dtype != a[0].dtype) return 0;
    dattn d = {};
    d.n = nseg, d.nheads = a[0].nheads, d.hd = a[0].head_dim, d.ring_t = (int)a[0].dtype;
    return attention_path(c, d) != ATTN_SPLIT ? ATTN_FUSE_ROPE | ATTN_FUSE_RING : 0;
}

// A device copy of rope table rt for the decode kernels (dattn.orope).
// Not stage(): under a graph that stores a host array once per step by
// its address, and every call's r is at the same address (layers of
// different tables would all get the first one's).
static const drope *attn_orope(cu_impl *c, const rope_table *rt)
{
    drope r;
    const char *dev;
    if (!rt || !to_rope(c, rt, &r)) return NULL;
    char *h = stage_begin(c, sizeof r, &dev);
    if (!h) return NULL;
    memcpy(h, &r, sizeof r);
    stage_end(c);
    return (const drope *)dev;
}

// The region of the sequences' outputs held in bf16 (attention_args'
// out_matmul: all or none of them), from the lowest row on.
static void hold_outputs(cu_impl *c, const attention_args *a, int nseg)
{
    c->held.x = NULL;
    if (!a[0].out_matmul) return;
    const float *lo = a[0].out, *hi = lo;
    for (int i = 0; i < nseg; i++) {
        const float *o = a[i].out, *e = o + (size_t)a[i].n * a[i].nheads * a[i].head_dim;
        lo = o < lo ? o : lo, hi = e > hi ? e : hi;
    }
    c->held.x = lo, c->held.n = hi - lo;
}

static void cu_attention_op(backend *b, const attention_args *a, int nseg)
{
    cu_impl *c = enter(b);
    if (nseg <= 0) return;
    hold_outputs(c, a, nseg);
    const drope *orope = attn_orope(c, a[0].out_rope);
    run_segs<dattn>(
        c, a, nseg,
        [&](const attention_args &x) {
            attention_one(c, &x, orope);
            return true;
        },
        [&](const attention_args &x) {
            return x.ratio ? pack_bytes(c, &x.comp, pos_end(c, x.pos0, x.n) / x.ratio) : 0;
        },
        [&](const attention_args &x, dattn *d, seg_pack *sp) { to_dattn(c, &x, d, sp, orope); },
        [&](const dattn *h, const dattn *dev, int n1) {
            attention_run(c, batch_shape(h, n1), dev);
        });
    launched(c, !a[0].ratio ? "attention sliding" : a[0].sel ? "attention CSA" : "attention HCA");
}

static void cu_ring_store_op(backend *b, const ring_args *a, int nseg, enum kv_dtype t,
                             int window, int head_dim)
{
    cu_impl *c = enter(b);
    if (nseg <= 0) return;
    run_segs<dring>(
        c, a, nseg,
        [&](const ring_args &x) {
            const dstep *dyn = step_values(c, x.pos0, x.ring);
            if (!recording(c))
                cu_ring_store(c->st, (char *)x.ring, (int)t, window, head_dim, x.kv, x.n, x.pos0,
                              dyn);
            return true;
        },
        [](const ring_args &) { return (size_t)0; },
        [&](const ring_args &x, dring *d, seg_pack *) {
            *d = dring{ (char *)x.ring, x.kv, x.pos0, step_values(c, x.pos0, x.ring) };
        },
        [&](const dring *, const dring *dev, int n1) {
            cu_ring_store_batch(c->st, dev, n1, (int)t, window, head_dim);
        });
    launched(c, "ring_store");
}

static void cu_kv_round_op(backend *b, float *x, int ld, int T, int n, enum kv_dtype t)
{
    cu_impl *c = enter(b);
    if (recording(c)) return;
    cu_kv_round(c->st, x, ld, T, n, (int)t);
    launched(c, "kv_round");
}

static void cu_qk_prep_op(backend *b, const qk_args *a)
{
    cu_impl *c = enter(b);
    drope r, ir = {};
    if (a->hd > CU_QK_MAX_HD || (a->qi && a->ihd > CU_QK_MAX_HD)) {
        fail(c, "qk_prep: heads of %d and %d channels (at most %d)", a->hd, a->ihd, CU_QK_MAX_HD);
        return;
    }
    if (!to_rope(c, a->rope, &r) || (a->qi && !to_rope(c, a->irope, &ir))) return;
    const int *d = (const int *)stage(c, a->pos, a->T * sizeof *a->pos);
    if (c->failed || recording(c)) return;
    cu_qk_prep(c->st, a->T, a->q, a->nh, a->hd, a->kv, a->kv_norm, a->eps, r, (int)a->dtype, a->qi,
               a->inh, a->ihd, ir, a->iw, a->iw_scale, d);
    launched(c, "qk_prep");
}

// Router, then the routed experts (one row per token and choice: slot
// t*K + k) and the shared expert, then the weighted sum.  A few tokens:
// fused matrix-vector products per slot reading its expert's weights;
// more: slots grouped by expert into tiles.
// An on/off comparison switch in the environment: unset or 1 is on, 0
// off, anything else an error.
static bool env_switch(cu_impl *c, const char *name)
{
    const char *v = getenv(name);
    if (v && strcmp(v, "0") && strcmp(v, "1")) fail(c, "%s=%s: expected 0 or 1", name, v);
    return !(v && !strcmp(v, "0"));
}

// A number in the environment (comparisons, tests): unset, def; not a
// whole number in [lo, hi], an error naming it.
static long long env_int(cu_impl *c, const char *name, long long lo, long long hi,
                         long long def)
{
    const char *v = getenv(name);
    if (!v) return def;
    char *end;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end || x < lo || x > hi) {
        fail(c, "%s=%s: expected %lld to %lld", name, v, lo, hi);
        return def;
    }
    return x;
}

// The most tiles of up to m slots moe_sort can make of ns slots over E
// experts: each of the A <= min(E, ns) experts chosen makes ceil(n_e / m)
// <= (n_e + m - 1) / m, so all (ns + (m - 1) A) / m.  The grids launch
// this many tiles and those past the count return at once: the old bound
// ns / m + A launched 48 more a layer for w1 and w3 at 32 sequences (768
// empty blocks), 64 more at 64.
static int moe_max_tiles(int ns, int E, int m)
{
    long long a = E < ns ? E : ns;
    return (int)((ns + (m - 1) * a) / m);
}

static void cu_moe_op(backend *b, const moe_args *a)
{
    cu_impl *c = enter(b);
    int T = a->T, H = a->H, E = a->n_experts, K = a->topk, I = a->w1[0].rows, ns = T * K;
    int sgw = a->sw1->rows > I ? a->sw1->rows : I;    // sg rows: the shared or the routed width
    if (K > 16) {
        fail(c, "moe: %d experts per token (at most 16)", K);
        return;
    }
    const int *ids = a->tid2eid ? (const int *)stage(c, a->ids, T * sizeof(int32_t)) : NULL;
    if (recording(c)) return;
    dqw gate, w1, w2, w3, s1, s2, s3;
    if (!to_dqw(c, a->gate, &gate) || !to_dqw(c, &a->w1[0], &w1) || !to_dqw(c, &a->w2[0], &w2) ||
        !to_dqw(c, &a->w3[0], &w3) || !to_dqw(c, a->sw1, &s1) || !to_dqw(c, a->sw2, &s2) ||
        !to_dqw(c, a->sw3, &s3))
        return;
    route_bufs rb = route_scratch(c, T, E, K);
    float *sc = rb.sc, *wt = rb.wt;
    int *idx = rb.idx, *ord = rb.ord;
    float *g = (float *)grow(c, &c->g, (size_t)ns * I * sizeof(float) + 4);
    float *u = (float *)grow(c, &c->u, (size_t)ns * I * sizeof(float) + 4);
    float *ys = (float *)grow(c, &c->ys, (size_t)ns * H * sizeof(float));
    float *sg = (float *)grow(c, &c->sg, (size_t)T * sgw * sizeof(float) + 4);
    float *su = (float *)grow(c, &c->su, (size_t)T * I * sizeof(float) + 4);
    float *sy = (float *)grow(c, &c->sy, (size_t)T * H * sizeof(float));
    if (c->failed) return;

    // The router's scores in float32 (every mode): steps of more than
    // gate_gemv_t tokens on cuBLASLt's float32 GEMM rather than the GEMV
    // (which reads the gate once per 8 tokens) or matmul.cu's float32
    // tiles (1.48 ms a call at 8,192 tokens, 6.6% of a 131,072-token
    // prefill; LLM_CUDA_GATE_LT=0 keeps them: comparisons).
    // (a->routed: sc, idx, wt and ord hold hc_pre_norm_route's already)
    if (!a->routed && T > c->gate_gemv_t && c->gate_lt) f32_matmul(c, gate, a->x, H, T, sc, E);
    else if (!a->routed) cu_matmul(c->st, gate, a->x, H, T, sc, E);
    // Up to LLM_CUDA_MOE_DECODE tokens (default 2, at most 8; 0: never),
    // MXFP4 experts and an FP8 shared expert (V4's): routing, up and down
    // after the gate's GEMV (moe_decode.cuh).  Measured on the H200 (run
    // W1, bench_cuda_moe): T = 1 55.3 us fused against 58.5 separate, T =
    // 8 288 against 235 (the separate GEMVs share a row's loads over the
    // 8 tokens better), so more tokens take the separate launches below;
    // T = 2 (run N2): 75.2 fused, 71.0 on tensor cores, 76.6 separate
    // (rank6 batch 2: 1.38 ms on tensor cores, 1.42 fused, 1.41 separate).
    int fused_t = (int)env_int(c, "LLM_CUDA_MOE_DECODE", 0, 8, 2);
    // Steps of at least tiles_t tokens take the sorted expert tiles (on
    // tensor cores where LLM_CUDA_MOE_MMA allows) instead of the per-slot
    // GEMVs below: since the tiles stage and send only their real tokens
    // (run M2) they win from 3 tokens (run M4, rank6 8K, ms a step, GEMVs
    // against tiles: B = 3 1.81-1.83 / 1.79, 4 1.98-2.01 / 1.92, 6
    // 2.74-2.75 / 2.61-2.63, 8 3.04-3.05 / 2.85-2.87; B = 2 1.41 / 1.43;
    // bench_cuda_moe 2 / 3 / 4 / 8: 76.8 / 101.9 / 121.8 / 218.1 us
    // against 79.4 / 103.8 / 113.4 / 191.7).  LLM_CUDA_MOE_MMA_MIN_T:
    // comparisons.
    int tiles_t = (int)env_int(c, "LLM_CUDA_MOE_MMA_MIN_T", 1, 9, 3);
    // The fused decode MoE routes its tokens in a launch of its own
    // (route_kernel) before the up kernel, rather than in every routed
    // block of the up kernel before its first weight load, where the
    // routing was about 45% of a block's time and ran once per wave (run
    // M1, ncu at T = 1: the block's other warps waiting at the barrier
    // after it).  Run M2, bench_cuda_moe 1: 55.4 -> 51.2 us an op; rank6
    // batch 1 at 8K 1.16 -> 1.13-1.15 ms.  LLM_CUDA_MOE_ROUTE_FIRST=0: in
    // the up kernel (comparisons).
    bool route_first = env_switch(c, "LLM_CUDA_MOE_ROUTE_FIRST");
    // The fused decode MoE's up and down kernels on tensor cores
    // (moe_decode_mma.cu: x and g split in two bf16 parts, as the expert
    // tiles; not under f32): run N2, bench_cuda_moe 1 / 2 49.0 / 75.2 ->
    // 44.0 / 71.0 us, rank6 batch 1 at 8K 1.14 -> 1.08 ms, 131K 1.25 ->
    // 1.21-1.22.  LLM_CUDA_MOE_DEC_MMA=0: matmul.cu's float32 kernels
    // (comparisons); LLM_CUDA_MOE_DEC_MMA_S: warps a row group of the up
    // kernel (2, 4, 8: within 3% of each other in N2; 4 by runs P1-P2,
    // bench_cuda_moe 2 66.3 against 8's 68.5 us, batch 1 at 131K
    // 1.21-1.22 against 1.22-1.24 ms, batch 2 1.36 against 1.37-1.39).
    bool dec_mma = env_switch(c, "LLM_CUDA_MOE_DEC_MMA") && c->gemm != BACKEND_GEMM_F32;
    int dec_s = (int)env_int(c, "LLM_CUDA_MOE_DEC_MMA_S", 2, 8, 4);
    if (dec_s & (dec_s - 1)) fail(c, "LLM_CUDA_MOE_DEC_MMA_S=%d: expected 2, 4 or 8", dec_s);
    // The router's warp with its state in registers where it applies
    // (route_warp_regs): run P1, bench_cuda_moe 1 / 2 45.2 / 72.5 ->
    // 41.7 / 69.3 us, rank6 batch 1 at 8K 1.09-1.10 -> 1.08-1.09 ms.
    // LLM_CUDA_ROUTE_REGS=0: route_warp's shared-memory rounds everywhere
    // (comparisons; the same choices and weights, tested).
    bool route_regs = env_switch(c, "LLM_CUDA_ROUTE_REGS");
    if (c->failed) return;
    if (T <= fused_t && T < tiles_t) {
        cu_moe_dec m = { T, K, E, w1, w3, w2, s1, s3, s2, a->x, sc, a->bias, H, a->tid2eid,
                         a->tid_i64, a->sigmoid_scores, ids, a->routed_scale, a->limit, idx, wt,
                         g, sg, a->out, route_first ? ord : NULL, dec_mma ? dec_s : 0,
                         route_regs, a->routed };
        if (cu_moe_decode(c->st, m)) {
            launched(c, "moe");
            return;
        }
    }
    // The shared expert (w1 and w3 joined or not, SwiGLU, w2) into sy, up
    // and down.  x8, xs: act_quant(x) already in fp8_matmul's scratch (the
    // routed W4A8 GEMMs' codes, the same function's), which its FP8 w1 and
    // w3 then take instead of quantizing x again.
    auto shared_up = [&](const void *x8, const void *xs) {
        xkeep_scope keep(c);    // x split into bf16 parts (or quantized) once for both
        if (x8) keep.codes(a->x, H, T, H, x8, xs);
        dqw s13[2] = { s1, s3 };
        float *y13[2] = { sg, su };
        int ld13[2] = { I, I };
        if (!lt_joined(c, 2, s13, a->x, H, T, y13, ld13)) {
            matmul_any(c, s1, a->x, H, T, sg, I);
            matmul_any(c, s3, a->x, H, T, su, I);
        }
        cu_swiglu(c->st, sg, su, (long long)T * I, a->limit);
    };
    auto shared_down = [&] { matmul_any(c, s2, sg, I, T, sy, H); };
    bool shared_done = false;
    auto shared_expert = [&] {
        shared_up(NULL, NULL);
        shared_down();
    };
    // Decode batches on the expert tiles (T >= tiles_t, few slots an
    // expert, x not quantized): the shared expert on a stream of its own
    // beside the router, the sort and the routed experts (LLM_CUDA_MOE_SIDE),
    // joined before the sum that adds it.  Its GEMMs and theirs share no
    // scratch (the gate's, which does, is done before the fork); under
    // LLM_CUDA_PROFILE the ops stay in one stream, timed one by one.
    side_scope side(c, c->moe_side && !c->profile && T >= tiles_t && ns < 32 * E &&
                           !fp8_quantized(c, w1.type, T));
    if (side.on) {
        shared_expert();
        side.end();
    }
    if (!a->routed)
        cu_moe_route(c->st, sc, T, E, K, a->sigmoid_scores, a->bias, a->tid2eid, a->tid_i64,
                     ids, a->routed_scale, idx, wt, ord, route_regs);
    phase(c, "moe router");
    // fp8: the routed experts multiply act_quant(x) and act_quant(g): on
    // FP8 tensor cores as codes and scales (moe_gemm_fp8.cu), else as
    // floats (exact in bf16: the tensor-core kernels take them unsplit).
    const float *xr = a->x;
    bool quant = fp8_quantized(c, w1.type, T);
    auto quantize_x = [&] {
        float *xq = (float *)grow(c, &c->xq, (size_t)T * H * sizeof(float));
        if (!c->failed) cu_act_quant_round(c->st, a->x, H, T, H, xq, H);
        xr = xq;
    };
    if (T < tiles_t) {
        // A few tokens, other formats: four launches, GEMVs that read each
        // slot's expert:
        // the shared expert (w1 and w3 with SwiGLU, w2), the chosen
        // experts' w1 and w3 with SwiGLU, then their w2 with the routing
        // weights, summed over the experts and added to the shared
        // expert's output.  Below GEMM_MODE_MIN_T no prefill mode
        // quantizes, so this is the float32 math of every mode.
        if (!cu_gemv_swiglu(c->st, s1, s3, NULL, a->x, H, 1, T, a->limit, sg, I))
            fail(c, "moe: the shared expert's w1 and w3 differ in layout");
        cu_matmul(c->st, s2, sg, I, T, sy, H);
        phase(c, "moe shared");
        if (!cu_gemv_swiglu(c->st, w1, w3, idx, a->x, H, K, ns, a->limit, g, I))
            fail(c, "moe: the experts' w1 and w3 differ in layout");
        cu_gemv_combine(c->st, w2, idx, K, wt, g, I, T, sy, a->out, H);
        launched(c, "moe experts");
        return;
    } else {
        // Slots sorted by expert into tiles: of a few slots for the GEMVs
        // (decode batches, short steps: few slots per expert), else of
        // CU_TILE_M for the GEMMs (CU_TILE_M8 for the W4A8 ones).
        bool gv = ns < 32 * E;
        // Decode batches' tiles on tensor cores (cu_moe_tiles_mma: MXFP4
        // experts, not under f32): tiles of 8 slots, the kernel's N.
        bool mma = gv && c->moe_mma && c->gemm != BACKEND_GEMM_F32 && w1.type == QT_MXFP4 &&
                   w3.type == QT_MXFP4 && w2.type == QT_MXFP4;
        // fp8 (W4A8): read at each MoE op, LLM_CUDA_MOE_FP8=0 keeps these
        // GEMMs on moe_gemm.cu's bf16 kernel (comparison: the same
        // products, summed in another order and precision).
        const char *f8 = getenv("LLM_CUDA_MOE_FP8");
        dmoe_gemm w13 = {}, w2v = {};
        w13.w1 = w1, w13.w3 = w3, w13.swiglu = true, w2v.w1 = w2;
        bool w4a8 = quant && !gv && !c->moe_lt && w2.type == QT_MXFP4 &&
                    !(f8 && !strcmp(f8, "0")) && cu_moe_gemm_fp8_ok(w13) &&
                    cu_moe_gemm_fp8_ok(w2v);
        int tm = w4a8 ? CU_TILE_M8 : !gv ? CU_TILE_M : mma || ns > 4 * E ? 8 : 4;
        int max_tiles = moe_max_tiles(ns, E, tm);
        // On the tensor cores w1 and w3 take a table of their own, of
        // tiles of moe_tile_m slots (4: x staged in 4 rows, their 4,096
        // columns over clusters of 2 blocks, not 4 -- twice a warp's
        // stages for the same prologue and end; w2's 1,024 lose by it)
        bool own13 = mma && c->moe_tile_m != tm;
        int tm13 = own13 ? c->moe_tile_m : tm;
        int max13 = own13 ? moe_max_tiles(ns, E, tm13) : max_tiles;
        int *perm = (int *)grow(c, &c->perm, ns * sizeof(int));
        int4 *tiles = (int4 *)grow(c, &c->tiles,
                                   (max_tiles + (own13 ? max13 : 0)) * sizeof(int4));
        int *ntiles = (int *)grow(c, &c->ntiles, 2 * sizeof(int));
        int *offs = (int *)grow(c, &c->offs, (E + 1) * sizeof(int));
        if (c->failed) return;
        int4 *tiles13 = own13 ? tiles + max_tiles : tiles;
        int *ntiles13 = own13 ? ntiles + 1 : ntiles;
        cu_moe_sort(c->st, idx, ns, E, perm, tiles, ntiles, offs, tm, own13 ? tiles13 : NULL,
                    ntiles13, tm13);
        // Tensor cores: w1 and w3 with SwiGLU into g (slots sorted by
        // expert), then w2 scattered back to slot order.
        dmoe_gemm m13 = { w1, w3, true, a->limit, tiles, ntiles, perm, xr, H, K, g, I,
                          false, false, false };
        dmoe_gemm m2 = { w2, {}, false, 0, tiles, ntiles, perm, g, I, 0, ys, H, true, false,
                         false };
        bool split = !quant && split_mode(c);
        if (quant && !w4a8) {
            quantize_x();
            m13.x = xr;
            if (c->failed) return;
        }
        if (w4a8) {
            // codes and scales of x, then of g (after w1 and w3 read x's)
            size_t nq = (size_t)ns * I > (size_t)T * H ? (size_t)ns * I : (size_t)T * H;
            size_t nsc = (size_t)((H + 127) / 128) * T > (size_t)((I + 127) / 128) * ns
                             ? (size_t)((H + 127) / 128) * T
                             : (size_t)((I + 127) / 128) * ns;
            uint8_t *q8 = (uint8_t *)grow(c, &c->x8, nq);
            float *s8 = (float *)grow(c, &c->xsc, nsc * sizeof(float));
            if (c->failed) return;
            cu_act_quant_fp8(c->st, a->x, H, T, H, q8, H, s8);
            // the shared expert's w1 and w3 now, while q8 holds x's codes
            // (its FP8 GEMMs take them: one act_quant of x, not two)
            shared_up(q8, s8);
            phase(c, "moe shared up");
            cu_moe_gemm_fp8(c->st, dmoe_gemm8{ m13, q8, s8, H, T }, max_tiles);
            phase(c, "moe w1 w3");
            cu_act_quant_fp8(c->st, g, I, ns, I, q8, I, s8);
            cu_moe_gemm_fp8(c->st, dmoe_gemm8{ m2, q8, s8, I, ns }, max_tiles);
            phase(c, "moe w2");
            shared_down();
            shared_done = true;
        } else if (gv) {
            // Each tile's expert read once (w1 and w3 with SwiGLU into g
            // in sorted order, then w2 scattered back to slot order),
            // rather than float32 tiles of 64 slots that hold one or two
            // here (run S1: 13x slower at 32 sequences): on tensor cores
            // (x split in two bf16 parts; quantized x and g are exact in
            // bf16), else the GEMV over the tiles (float32 products).
            // Tiles expected: the experts the slots choose, uniform routing.
            int est = (int)(E * (1.0 - pow(1.0 - (double)K / E, T)) + 0.5);
            if (!(mma && cu_moe_tiles_mma(c->st, w1, &w3, tiles13, ntiles13, max13, tm13, est,
                                          perm, false, xr, H, K, a->limit, g, I, !quant,
                                          c->moe_mma_sm, c->moe_l2)) &&
                !cu_gemv_tiles(c->st, w1, &w3, tiles13, ntiles13, max13, tm13, perm, false, xr,
                               H, K, a->limit, g, I))
                fail(c, "moe: the experts' w1 and w3 differ in layout");
            if (quant) cu_act_quant_round(c->st, g, I, ns, I, g, I);
            if (!(mma && cu_moe_tiles_mma(c->st, w2, NULL, tiles, ntiles, max_tiles, tm, est, perm,
                                          true, g, I, 0, 0, ys, H, !quant, c->moe_mma_sm,
                                          c->moe_l2)))
                cu_gemv_tiles(c->st, w2, NULL, tiles, ntiles, max_tiles, tm, perm, true, g, I, 1,
                              0, ys, H);
        } else if (c->gemm != BACKEND_GEMM_F32 && !c->moe_lt && w2.type == QT_MXFP4 &&
                   cu_moe_gemm(c->st, m13, max_tiles, split)) {
            if (quant) cu_act_quant_round(c->st, g, I, ns, I, g, I);
            phase(c, "moe w1 w3");
            cu_moe_gemm(c->st, m2, max_tiles, split);
            phase(c, "moe w2");
        } else {
            // Float32 operands (or LLM_CUDA_MOE=cublaslt, or weights not in
            // MXFP4): rows sorted by expert, each expert's block through
            // cuBLASLt (the host needs the counts: one wait per MoE layer).
            float *yss = (float *)grow(c, &c->yss, (size_t)ns * H * sizeof(float));
            int *ho = (int *)malloc((E + 1) * sizeof(int));
            CK(c, cudaMemcpyAsync(ho, offs, (E + 1) * sizeof(int), cudaMemcpyDeviceToHost,
                                  c->st));
            CK(c, cudaStreamSynchronize(c->st));
            phase(c, "moe sort");
            gemm_op xs = gemm_input(c, use_bf16(c, w1), quant, xr, H, perm, K, ns, H);
            expert_gemms(c, w1, E, ho, xs, g, I);
            expert_gemms(c, w3, E, ho, xs, u, I);
            phase(c, "moe w1 w3");
            cu_swiglu(c->st, g, u, (long long)ns * I, a->limit);
            if (quant) cu_act_quant_round(c->st, g, I, ns, I, g, I);
            expert_gemms(c, w2, E, ho,
                         gemm_input(c, use_bf16(c, w2), quant, g, I, NULL, 1, ns, I), yss, H);
            phase(c, "moe w2");
            cu_rows_scatter(c->st, yss, H, perm, ns, ys);
            free(ho);
        }
    }
    phase(c, "moe experts");
    if (side.on) side.join();
    else if (!shared_done) shared_expert();
    cu_moe_combine(c->st, ys, wt, ord, T, K, H, sy, a->out);
    launched(c, "moe shared");
}

static void cu_gather_cols(backend *b, const float *part, int rows, int nv, float *out, int ldo,
                           int v0)
{
    cu_impl *c = enter(b);
    if (rows > 0 && nv > 0)
        CK(c, cudaMemcpy2DAsync(out + v0, ldo * sizeof(float), part, nv * sizeof(float),
                                nv * sizeof(float), rows, cudaMemcpyDeviceToHost, c->st));
    CK(c, cudaStreamSynchronize(c->st));
    launched(c, "gather_cols");
    if (c->profile) prof_flush(c);
}

// row_argmax's keys for rows rows (cu_row_argmax_slices a row), in pinned
// host memory the kernel writes.  Graphs hold its address: growing it
// retires them (it does not grow inside a capture: the step then runs as
// usual).
static bool argmax_bufs(cu_impl *c, int rows, int nv, unsigned long long **h)
{
    size_t n = (size_t)rows * cu_row_argmax_slices(rows, nv);
    if (n > c->hkeys_cap) {
        if (c->gmode == G_CAPTURE) {
            c->gbad = true;
            return false;
        }
        CK(c, cudaStreamSynchronize(c->st));
        if (c->hkeys) CK(c, cudaFreeHost(c->hkeys));
        c->hkeys = NULL;
        c->hkeys_cap = 0;
        size_t cap = n < 1024 ? 1024 : 2 * n;
        CK(c, cudaMallocHost((void **)&c->hkeys, cap * sizeof(unsigned long long)));
        if (c->hkeys) c->hkeys_cap = cap;
        c->gen++;
    }
    *h = c->hkeys;
    return !c->failed && *h;
}

// Issued inside a decode step's graph (before graph_end): the argmax's
// nodes follow the step's last kernel in the replay, where launches
// queued from the host after the replay waited for it to end; the
// row_argmax of the same rows then only waits and reads.
static void cu_row_argmax_issue_op(backend *b, const float *part, int rows, int nv)
{
    cu_impl *c = enter(b);
    unsigned long long *h;
    c->amax_part = NULL;
    if (rows <= 0 || !argmax_bufs(c, rows, nv, &h)) return;
    if (!recording(c)) cu_row_argmax(c->st, part, rows, nv, h);
    if (!c->failed) c->amax_part = part, c->amax_rows = rows;
}

static void cu_row_argmax_op(backend *b, const float *part, int rows, int nv, int v0, float *val,
                             int32_t *idx)
{
    cu_impl *c = enter(b);
    bool issued = c->amax_part == part && c->amax_rows == rows;
    c->amax_part = NULL;
    if (rows <= 0) return;
    unsigned long long *h;
    if (!issued) {
        if (!argmax_bufs(c, rows, nv, &h)) {
            if (!c->failed) fail(c, "row_argmax: out of memory for %d rows", rows);
            return;
        }
        cu_row_argmax(c->st, part, rows, nv, h);
    }
    CK(c, cudaStreamSynchronize(c->st));
    h = c->hkeys;
    int slices = cu_row_argmax_slices(rows, nv);
    // the key: the value's bits, sign-flipped to sort as the floats do,
    // above ~column (ops.cu's argmax_key); a row's the largest of its slices'
    for (int r = 0; r < rows && !c->failed; r++) {
        const unsigned long long *hr = h + (size_t)r * slices;
        unsigned long long k = 0;
        for (int s = 0; s < slices; s++) k = hr[s] > k ? hr[s] : k;
        uint32_t hi = (uint32_t)(k >> 32), u = hi & 0x80000000u ? hi & 0x7fffffffu : ~hi;
        memcpy(&val[r], &u, sizeof u);
        if (!k) val[r] = -INFINITY;
        idx[r] = k ? v0 + (int32_t)(0xffffffffu - (uint32_t)k) : -1;
    }
    launched(c, "row_argmax");
    if (c->profile) prof_flush(c);
}

static void cu_destroy(backend *b)
{
    cu_impl *c = enter(b);
    cudaStreamSynchronize(c->st);
    if (c->profile) {
        prof_flush(c);
        print_profile(c);
        for (int i = 0; i < 2 * NSPAN; i++) cudaEventDestroy(c->spans[i]);
        free(c->spans);
    }
    for (int i = 0; i < NGRAPH; i++) graph_drop(&c->graph[i]);
    for (int i = 0; i < 2; i++)
        if (c->gev[i]) cudaEventDestroy(c->gev[i]);
    arena_free(c);
    grow_buf *bufs[] = { &c->sc, &c->idx, &c->wt, &c->ord, &c->perm, &c->tiles, &c->ntiles,
                         &c->g, &c->u, &c->ys, &c->sg, &c->su, &c->sy, &c->iscores, &c->icand,
                         &c->ikeys, &c->wdeq, &c->hcm, &c->hcpart, &c->hccol, &c->apart,
                         &c->offs, &c->xs, &c->yss, &c->xbf, &c->xq, &c->x8, &c->xsc, &c->wsc,
                         &c->xn, &c->ystk, &c->hcakeys };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]->p) cudaFreeAsync(bufs[i]->p, c->st);
    for (int i = 0; i < NSTAGE; i++) {
        if (c->stage[i].host) cudaFreeHost(c->stage[i].host);
        if (c->stage[i].dev) cudaFreeAsync(c->stage[i].dev, c->st);
        cudaEventDestroy(c->stage[i].ev);
    }
    cudaStreamSynchronize(c->st);
    if (c->lt_ws) cudaFree(c->lt_ws);
    if (c->hc_count) cudaFree(c->hc_count);
    if (c->attn_count) cudaFree(c->attn_count);
    if (c->lt_op) cublasLtMatmulDescDestroy(c->lt_op);
    if (c->lt_op8) cublasLtMatmulDescDestroy(c->lt_op8);
    if (c->lt) cublasLtDestroy(c->lt);
    fork_free(c->pf);           // prefetches read the weights freed below
    fork_free(c->side);
    for (size_t i = 0; i < c->nowned; i++) cudaFree(c->owned[i]);
    for (size_t i = 0; i < c->ndescs; i++) free(c->descs[i]);
    free(c->owned);
    free(c->descs);
    if (c->comm) ncclCommDestroy(c->comm);
    if (c->ar_mem) cudaFree(c->ar_mem);
    copies_free(c);
    uploads_free(c);
    cudaStreamDestroy(c->st);
    free(c->hidx);
    if (c->hkeys) cudaFreeHost(c->hkeys);
    free(c);
    free(b);
}


backend *cu_new(int dev, int rank, int nranks, const backend_modes *modes, char *err,
                size_t errlen)
{
    if (cudaSetDevice(dev) != cudaSuccess) {
        snprintf(err, errlen, "cannot use CUDA device %d: %s", dev,
                 cudaGetErrorString(cudaGetLastError()));
        return NULL;
    }
    cu_impl *c = (cu_impl *)calloc(1, sizeof *c);
    c->dev = dev;
    c->rank = rank;
    c->nranks = nranks;
    CK(c, cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking));
    for (int i = 0; i < NSTAGE; i++)
        CK(c, cudaEventCreateWithFlags(&c->stage[i].ev, cudaEventDisableTiming));
    if (cublasLtCreate(&c->lt) != CUBLAS_STATUS_SUCCESS) fail(c, "cuBLASLt: cannot create a handle");
    CK(c, cudaMalloc(&c->lt_ws, LT_WS_BYTES));
    static_assert(HC_COUNT_MAX >= HC_FUSED_MAX_T, "one counter array for the mHC kernels");
    CK(c, cudaMalloc(&c->hc_count, HC_COUNT_MAX * sizeof(int)));
    if (c->hc_count) CK(c, cudaMemset(c->hc_count, 0, HC_COUNT_MAX * sizeof(int)));
    CK(c, cudaMalloc(&c->attn_count, CU_ATTD_COUNTERS * sizeof(int)));
    if (c->attn_count) CK(c, cudaMemset(c->attn_count, 0, CU_ATTD_COUNTERS * sizeof(int)));
    lt_op_new(c);
    // Output-changing modes come from the recipe (and its LLM_CUDA_*
    // overrides, applied by the model loader): they are in the fingerprint.
    c->gemm = modes->gemm;
    c->moe_lt = modes->moe == BACKEND_MOE_CUBLASLT;
    c->attn_tokens = modes->attn_tokens;
    // LLM_CUDA_ATTN_DECODE=0: decode attention on cu_attention and its
    // combine (comparisons; the sums' order differs, within the kernels' bounds).
    c->attn_decode = env_switch(c, "LLM_CUDA_ATTN_DECODE");
    // LLM_CUDA_ATTN_FUSE=0: the ring store and the output's inverse RoPE
    // as ops of their own, not in the decode attention kernels
    // (cu_attention_fused_op; the same bits either way).
    c->attn_fuse = env_switch(c, "LLM_CUDA_ATTN_FUSE");
    // LLM_CUDA_ATTN_HCA_BF16=0: the prefill attention's HCA entries of an
    // FP8 cache decoded by every query token's block, not once a step
    // (hca_keys_bf16; the same bits either way).
    c->attn_hca_bf16 = env_switch(c, "LLM_CUDA_ATTN_HCA_BF16");
    // LLM_CUDA_ATTN_MMA_MIN_T: decode steps of at least this many tokens
    // or sequences on tensor cores in the tensor-core modes (attention_run;
    // 0: never).
    c->attn_mma_t = (int)env_int(c, "LLM_CUDA_ATTN_MMA_MIN_T", 0, 1 << 20, ATT_DEC_MMA_MIN_T);
    // LLM_CUDA_ATTN_MMA_MIN_KEYS: ... and those whose key bound (window
    // plus the entries at the graph's position bound, or CSA's top-k) is
    // at least this many, from one token (HCA at 131K and more; 0: off).
    c->attn_mma_keys =
        (int)env_int(c, "LLM_CUDA_ATTN_MMA_MIN_KEYS", 0, 1 << 24, ATT_DEC_MMA_MIN_KEYS);
    // LLM_CUDA_ATTD_BLOCKS: the blocks the float32 decode attention
    // kernel's key splits aim at (comparisons).
    c->attd_target = (int)env_int(c, "LLM_CUDA_ATTD_BLOCKS", 1, 4096, ATTD_TARGET);
    // LLM_CUDA_ATTM_BLOCKS: the same for the tensor-core decode kernel
    // (batches of ATTN_MMA_MIN_T+ sequences; comparisons).
    c->attm_target = (int)env_int(c, "LLM_CUDA_ATTM_BLOCKS", 1, 4096, ATTM_TARGET);
    // LLM_CUDA_ATTN_CLUSTER: that kernel's splits merged in clusters of up
    // to this many blocks (2, 4 or 8; 1: by the last block), where the
    // device runs such clusters.
    c->attm_cluster =
        (int)env_int(c, "LLM_CUDA_ATTN_CLUSTER", 1, CU_ATTM_MAX_CLUSTER, ATTM_CLUSTER);
    if (c->attm_cluster & (c->attm_cluster - 1))
        fail(c, "LLM_CUDA_ATTN_CLUSTER=%d: not 1, 2, 4 or 8", c->attm_cluster);
    else if (c->attm_cluster > 1 && !cu_attention_mma_cluster_runs(c->attm_cluster))
        c->attm_cluster = 1;
    // LLM_CUDA_TOPK_BLOCKS=0: the indexer's top-k on one block a token
    // also at long contexts (comparisons; the same entries either way).
    c->topk_blocks = env_switch(c, "LLM_CUDA_TOPK_BLOCKS");
    // LLM_CUDA_TOPK_CLUSTER=0: those blocks in two launches (their top k
    // each, then one over the candidates) rather than one cluster.
    c->topk_cluster = c->topk_blocks && env_switch(c, "LLM_CUDA_TOPK_CLUSTER")
                          ? cu_indexer_topk_cluster_max()
                          : 0;
    // LLM_CUDA_HC_FUSED_MANY=0: the mHC ops of steps of 64+ tokens as four
    // launches (hc_post, logits, collapse, RMSNorm) instead of two.
    c->hc_many = env_switch(c, "LLM_CUDA_HC_FUSED_MANY");
    // LLM_CUDA_HC_MANY_MIN_T: steps of at least this many tokens (1 to 64)
    // take those two launches instead of the one-launch kernel of few
    // tokens (comparisons).  LLM_CUDA_HC_SPLIT=0: their logits a block per
    // 32 tokens however few the blocks (before: a 64-token decode batch
    // ran 2 blocks, ~0.3 ms a sublayer); else few token groups also split
    // the columns (ops.cu, hc_store_logits).
    // Run K5 (decode batches at 8K): from 20 tokens the two launches win
    // (B = 28 4.41 -> 4.27 ms a step, 32 4.72 -> 4.56, 48 5.77 -> 5.37),
    // below they lose or tie (B = 12 3.49 -> 3.53, 16 3.69 -> 3.73, 20
    // 3.78 -> 3.77).
    c->hc_many_t = (int)env_int(c, "LLM_CUDA_HC_MANY_MIN_T", 1, LT_MIN_T, HC_MANY_MIN_T);
    c->hc_split = env_switch(c, "LLM_CUDA_HC_SPLIT");
    // LLM_CUDA_HC_SLICE_CHUNKS: the fewest 32-column chunks a slice of
    // hc_post_logits (1 to 4; comparisons).  2 from run G2, when one block
    // added every slice and more slices made that longer; 1 since the
    // collapse's blocks add them (run A3, H100: B = 32 3.457, 3.460 ->
    // 3.441, 3.453 ms a step's graph, B = 64 4.559, 4.545 -> 4.537, 4.541).
    c->hc_slice_chunks = (int)env_int(c, "LLM_CUDA_HC_SLICE_CHUNKS", 1, 4, 1);
    // LLM_CUDA_PREFETCH=0: decode steps without the L2 prefetch of the
    // weights the next matmuls read (cuda_prefetch.cu; comparisons).
    c->prefetch = env_switch(c, "LLM_CUDA_PREFETCH");
    // LLM_CUDA_INDEXER_TILED=0: the indexer's float32 scores on
    // indexer_scores_kernel (comparisons; the sum over heads in another order).
    c->idx_tiled = env_switch(c, "LLM_CUDA_INDEXER_TILED");
    // LLM_CUDA_INDEXER_WGMMA=0: the prefill indexer's tensor-core scores on
    // mma.sync (indexer_mma_kernel; comparisons) rather than wgmma.
    c->idx_wgmma = env_switch(c, "LLM_CUDA_INDEXER_WGMMA");
    // LLM_CUDA_INDEXER_FP8=0: the fp8 mode's prefill indexer on bf16
    // queries and keys as the bf16 modes' (comparisons; the CPU's fp8 mode
    // scores in FP8, indexer_fp8_scores).
    c->idx_fp8 = env_switch(c, "LLM_CUDA_INDEXER_FP8");
    // LLM_CUDA_INDEXER_FP8_KEYS=128: its blocks take 128 keys, not 256
    // (comparisons: each token's queries then travel from L2 twice as often).
    int fk = (int)env_int(c, "LLM_CUDA_INDEXER_FP8_KEYS", 128, 256, 256);
    if (fk != 128 && fk != 256) fail(c, "LLM_CUDA_INDEXER_FP8_KEYS=%d: expected 128 or 256", fk);
    c->idx_fp8_k128 = fk == 128;
    // LLM_CUDA_INDEXER_DECODE_MMA=0: decode steps' indexer scores in
    // float32 (the CPU's bits) in every GEMM mode, not on tensor cores
    // where the mode puts the prefill's there.
    c->idx_dec = env_switch(c, "LLM_CUDA_INDEXER_DECODE_MMA");
    // LLM_CUDA_HC_PRE_TAIL=0: hc_pre_norm's last block, and the
    // collapse of many tokens (cu_hc_collapse_norm), as before (their
    // loads one column at a time; the same operations and results).
    c->hc_tail = env_switch(c, "LLM_CUDA_HC_PRE_TAIL");
    // LLM_CUDA_HC_PRE_CLUSTER=0: hc_pre_norm of hc = 4 with the last block
    // (above) rather than in clusters of 16 blocks a token.
    // LLM_CUDA_HC_ROUTE=0: the MoE's gate and router in launches of their
    // own rather than in hc_pre_norm's clusters.
    bool route_ok = false;
    c->hc_cluster = env_switch(c, "LLM_CUDA_HC_PRE_CLUSTER") && cu_hc_pre_cluster_init(&route_ok);
    c->hc_route = env_switch(c, "LLM_CUDA_HC_ROUTE") && c->hc_cluster && route_ok;
    // LLM_CUDA_MOE_MMA=0: the expert tiles of decode batches on the GEMV
    // (float32 products; comparisons) instead of cu_moe_tiles_mma.
    c->moe_mma = env_switch(c, "LLM_CUDA_MOE_MMA");
    // LLM_CUDA_GATE_LT=0: the router's scores of prefill steps on
    // matmul.cu's float32 tiles (comparisons) instead of cuBLASLt's.
    c->gate_lt = env_switch(c, "LLM_CUDA_GATE_LT");
    c->gate_gemv_t = (int)env_int(c, "LLM_CUDA_GATE_GEMV_MAX_T", 1, CU_GEMV_MAX_T,
                                  GATE_GEMV_MAX_T);
    // LLM_CUDA_MOE_MMA_BLOCKS: the blocks an SM its plan aims at
    // (comparisons; 2: every w1 and w3 block a quarter of the columns).
    c->moe_mma_sm = (int)env_int(c, "LLM_CUDA_MOE_MMA_BLOCKS", 1, 2, 2);
    // LLM_CUDA_MOE_TILE_M: the slots a tile of w1 and w3 on the tensor
    // cores, 4 or 8 (w2's: 8).
    c->moe_tile_m = (int)env_int(c, "LLM_CUDA_MOE_TILE_M", 4, 8, 4);
    if (c->moe_tile_m != 4 && c->moe_tile_m != 8)
        fail(c, "LLM_CUDA_MOE_TILE_M=%d: expected 4 or 8", c->moe_tile_m);
    // Their weights copied in whole 128-byte lines and their scales
    // through shared memory (cu_moe_tiles_mma's l2; run D3, H100:
    // bench_cuda_moe 32 483 -> 450 us, B = 32 4.14 -> 3.89-3.95 ms a step,
    // B = 64 5.67 -> 5.33).  LLM_CUDA_MOE_L2=0: 64 bytes a row and stage,
    // the scales loaded a byte at a time (comparisons).
    c->moe_l2 = env_switch(c, "LLM_CUDA_MOE_L2");
    // Each FP8 weight also uploaded as its exact bf16 values (two more
    // bytes a weight: 0.6 GiB for rank6's 6 layers), which cuBLASLt then
    // reads directly: decode batches past the small-M kernels' tokens and
    // prefill chunks outside fp8 mode skip dequantizing into scratch at
    // every call (5.5-6 us for a 4 MB matrix; run K1: B = 32 5.02 -> 4.79
    // ms a step, B = 64 6.20 -> 5.98).  LLM_CUDA_FP8_SHADOW=0: without
    // (memory; comparisons).
    c->fp8_shadow = env_switch(c, "LLM_CUDA_FP8_SHADOW");
    // LLM_CUDA_JOIN=0: each projection of a shared x its own GEMM
    // (comparisons; join_weights then leaves the matrices as they are)
    c->join = env_switch(c, "LLM_CUDA_JOIN");
    // The shared expert of decode batches (9+ tokens) on a second stream
    // beside the router and the routed experts (cu_moe_op); run K9: B = 32
    // 4.39-4.40 -> 4.22-4.29 ms, B = 64 5.60-5.71 -> 5.51-5.56.
    // LLM_CUDA_MOE_SIDE=0: one stream (comparisons).
    c->moe_side = env_switch(c, "LLM_CUDA_MOE_SIDE");
    // Decode steps of up to 8 tokens run an attention layer's compressor
    // projections and compressors on a second stream beside wq_a, wkv
    // and wq_b (backend.h side_begin; forward.c attention), joined before
    // qk_prep: run P3, rank6 batch 1 at 8K 1.08-1.10 -> 1.06-1.07 ms,
    // 131K 1.21-1.22 -> 1.19-1.20, batch 4 1.96-1.98 -> 1.93, 8 2.86-2.88
    // -> 2.82-2.83.  LLM_CUDA_ATTN_SIDE=0: one stream (comparisons).
    c->attn_side = env_switch(c, "LLM_CUDA_ATTN_SIDE");
    // LLM_CUDA_GEMV_TOKENS (1, 2, 4 or 8; comparisons): the most tokens a
    // GEMV block takes.  Run D3: 8 tokens as two blocks of 4 took 0.53-0.85x
    // the time of one block of 8 on every matrix of bench_cuda_gemv, and a
    // decode step of 8 sequences 3.40-3.43 ms against 3.85-4.12.
    long long gt = env_int(c, "LLM_CUDA_GEMV_TOKENS", 1, 8, 4);
    if (gt & (gt - 1)) fail(c, "LLM_CUDA_GEMV_TOKENS=%lld: expected 1, 2, 4 or 8", gt);
    else cu_gemv_tokens = (int)gt;
    // LLM_CUDA_GEMV_ROWS (2, 4 or 8; comparisons): the rows a warp of one
    // token's dense GEMV takes, so the blocks it needs.
    long long gr = env_int(c, "LLM_CUDA_GEMV_ROWS", 2, 8, 4);
    if (gr & (gr - 1)) fail(c, "LLM_CUDA_GEMV_ROWS=%lld: expected 2, 4 or 8", gr);
    else cu_gemv_rows = (int)gr;
    // Dense matmuls of up to this many tokens on the GEMV kernel (decode
    // batches), more through cuBLASLt; LLM_CUDA_GEMV_MAX_T: comparisons.
    // Run G4: with 63 (before) a decode step of 33-63 sequences ran the
    // GEMV in token chunks of 8, each decoding every weight again: 48,
    // 56, 63 sequences 10.87, 12.29, 13.34 ms a step against 64's 7.75
    // (G5 with 32: 7.58, 8.40; G6: cuBLASLt also beats cu_matmul_mma at
    // 24 and 32 tokens, not at 12 and 16: SMALL_MMA_MAX_T).
    c->gemv_max_t = (int)env_int(c, "LLM_CUDA_GEMV_MAX_T", 0, CU_GEMV_MAX_T, GEMV_MAX_T);
    // Weight uploads staged through pinned buffers of this many bytes;
    // LLM_CUDA_UPLOAD_STAGE: comparisons (0: straight from the mapping)
    // and tests (a small size: many chunks, rows wider than a buffer).
    c->up_bytes = (size_t)env_int(c, "LLM_CUDA_UPLOAD_STAGE", 0, 1ll << 32, UP_STAGE_BYTES);
    // ... packed by this many host threads of a persistent pool
    // (LLM_CUDA_UPLOAD_THREADS: comparisons; run E2, 23.8 GB warm: 2
    // threads 2.4-2.8 s, 4 2.1-2.3 s, 8 2.0 s).
    c->up_threads = (int)env_int(c, "LLM_CUDA_UPLOAD_THREADS", 1, UP_THREADS_MAX, UP_THREADS);
    // LLM_CUDA_SMALL_MMA: 0, 9-64 tokens as before the tensor-core kernels
    // (GEMV up to gemv_max_t, then cuBLASLt; comparisons); 1,
    // cu_matmul_mma for every matmul it takes; 2, cu_matmul_stream for
    // every one; 3, cu_matmul_wgmma for every one (tests, benches); unset,
    // each where measured faster.
    c->small_mma = SMALL_MMA_AUTO;
    // LLM_CUDA_STREAM_MAX_T: the default's last token count on
    // cu_matmul_stream (comparisons).
    c->stream_max_t = (int)env_int(c, "LLM_CUDA_STREAM_MAX_T", 8, 64, STREAM_MAX_T);
    // LLM_CUDA_LT_MIN_T: lt_first's first token count (comparisons; 17:
    // as before it, 9-16 tokens on the small-M kernels).
    c->lt_min_t = (int)env_int(c, "LLM_CUDA_LT_MIN_T", 2, 17, LT_BF16_MIN_T);
    // LLM_CUDA_LT_BATCH_T: lt_batched's first token count (comparisons;
    // 65: never, each view its own matmul as before it).
    c->lt_batch_t = (int)env_int(c, "LLM_CUDA_LT_BATCH_T", 2, 65, LT_BF16_MIN_T);
    // LLM_CUDA_LT_TUNE: a decode batch's cuBLASLt GEMMs (x's bf16 parts
    // stacked) timed over up to this many of the heuristic's candidates
    // at their shape's first run (lt_fastest); 1: the heuristic's first,
    // as before (comparisons).  Runs B3-B5 (H100, alternated 4-6 times):
    // B = 32 3.430 -> 3.397 ms a step's graph, B = 64 4.515 -> 4.491.
    c->lt_tune = (int)env_int(c, "LLM_CUDA_LT_TUNE", 1, LT_TUNE_MAX, LT_TUNE_DEFAULT);
    // LLM_CUDA_WGMMA_WG: cu_matmul_wgmma's blocks of 1 or 2 warpgroups
    // (unset: its plan's choice; comparisons).
    c->wgmma_wg = (int)env_int(c, "LLM_CUDA_WGMMA_WG", 1, 2, 0);
    if (const char *sm = getenv("LLM_CUDA_SMALL_MMA")) {
        if (strcmp(sm, "0") && strcmp(sm, "1") && strcmp(sm, "2") && strcmp(sm, "3"))
            fail(c, "LLM_CUDA_SMALL_MMA=%s: expected 0, 1, 2 or 3", sm);
        c->small_mma = !strcmp(sm, "0")   ? SMALL_MMA_OFF
                       : !strcmp(sm, "1") ? SMALL_MMA_ALL
                       : !strcmp(sm, "2") ? SMALL_MMA_STREAM
                                          : SMALL_MMA_WGMMA;
    }
    if (c->gemm < 0 || c->gemm >= BACKEND_GEMM_N)
        fail(c, "gemm_mode %d: unknown", c->gemm);
    if (c->attn_tokens < 1 || c->attn_tokens > BACKEND_ATTN_TOKENS_MAX)
        fail(c, "attn_tokens %d: expected 1 to %d", c->attn_tokens, BACKEND_ATTN_TOKENS_MAX);
    const char *pe = getenv("LLM_CUDA_PROFILE"), *ge = getenv("LLM_CUDA_GRAPHS");
    c->profile = pe && *pe && strcmp(pe, "0");
    if (c->profile) {
        c->spans = (cudaEvent_t *)calloc(2 * NSPAN, sizeof *c->spans);
        for (int i = 0; i < 2 * NSPAN; i++) CK(c, cudaEventCreate(&c->spans[i]));
    }
    // Profiling waits for every op: no graphs then.
    c->graphs = !c->profile && !(ge && !strcmp(ge, "0"));
    if (c->graphs) arena_grow(c, ARENA_BYTES);
    // LLM_CUDA_GRAPH_KERNELS=1: each captured step's kernels by name
    // (cuda_graphs.cu's kernel_table), what its launch count is made of.
    c->gnames = env_int(c, "LLM_CUDA_GRAPH_KERNELS", 0, 1, 0);
    // LLM_CUDA_COMPRESS_FUSE=0: a decode step's compressor in three
    // launches (entry, overlap half, window row) as before
    // compress_step_kernel (comparisons).
    c->comp_fuse = env_switch(c, "LLM_CUDA_COMPRESS_FUSE");
    // LLM_CUDA_HC_HEAD_FUSE=0: the model's last collapse as hc_post,
    // hc_head and the RMSNorm (comparisons; cu_hc_head_norm otherwise).
    c->hc_head_fuse = env_switch(c, "LLM_CUDA_HC_HEAD_FUSE");
    // LLM_CUDA_PREWALK=0: no decode step walked ahead while the one
    // before runs (graph_prepare; comparisons).
    c->prewalk = c->graphs && env_switch(c, "LLM_CUDA_PREWALK");
    // LLM_CUDA_GRAPH_TIME=1: each replay's device time (graph_time).
    const char *gtime = getenv("LLM_CUDA_GRAPH_TIME");
    if (c->graphs && gtime && !strcmp(gtime, "1"))
        for (int i = 0; i < 2; i++) CK(c, cudaEventCreate(&c->gev[i]));
    if (c->failed) {
        snprintf(err, errlen, "%s", c->err);
        free(c);
        return NULL;
    }
    backend *b = (backend *)calloc(1, sizeof *b);
    b->name = "cuda";
    b->impl = c;
    b->alloc = cu_alloc;
    b->release = cu_release;
    b->copy_rows = cu_copy_rows;
    b->write = cu_write;
    b->read = cu_read;
    b->upload_weights = cu_upload_weights;
    b->join_weights = cu_join_weights;
    b->upload = cu_upload;
    b->error = cu_error;
    b->mem_info = cu_mem_info;
    b->host_alloc = cu_host_alloc;
    b->host_free = cu_host_free;
    b->copy_async = cu_copy_async;
    b->copy_fence = cu_copy_fence;
    b->matmul = cu_matmul_op;
    b->matmuls = cu_matmuls_op;
    b->embed = cu_embed_op;
    b->rmsnorm = cu_rmsnorm_op;
    b->rope = cu_rope_op;
    b->scale = cu_scale_op;
    b->hc_pre = cu_hc_pre_op;
    b->hc_pre_norm = cu_hc_pre_norm_op;
    b->hc_pre_norm_route = cu_hc_pre_norm_route_op;
    b->hc_post = cu_hc_post_op;
    b->hc_head = cu_hc_head_op;
    b->hc_head_norm = cu_hc_head_norm_op;
    b->compress = cu_compress_op;
    b->indexer = cu_indexer_op;
    b->attention = cu_attention_op;
    b->attention_fused = cu_attention_fused_op;
    b->ring_store = cu_ring_store_op;
    b->kv_round = cu_kv_round_op;
    b->moe = cu_moe_op;
    b->qk_prep = cu_qk_prep_op;
    b->allreduce = cu_allreduce;
    b->gather_cols = cu_gather_cols;
    b->row_argmax = cu_row_argmax_op;
    b->row_argmax_issue = cu_row_argmax_issue_op;
    b->prefetch = cu_prefetch_op;
    b->side_begin = cu_side_begin;
    b->side_end = cu_side_end;
    b->side_join = cu_side_join;
    b->graph_begin = cu_graph_begin;
    b->graph_end = cu_graph_end;
    b->graph_prepare = cu_graph_prepare;
    b->graph_prepared = cu_graph_prepared;
    b->graph_launch_prepared = cu_graph_launch_prepared;
    b->graph_counts = cu_graph_counts;
    b->graph_time = cu_graph_time;
    b->graph_kernels = cu_graph_kernels;
    b->destroy = cu_destroy;
    return b;
}
