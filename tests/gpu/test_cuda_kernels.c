/* Every op of the CUDA backend against the CPU backend (the reference) on
 * fresh random inputs at several sizes (make test-gpu; needs a GPU).
 * Outputs are poisoned with NaN before each GPU run, so an unwritten
 * element fails; NaN never passes.  Tolerances: relative L2 error 1e-5
 * for everything (all paths are float32 with weights decoded exactly;
 * only summation order differs); index outputs (indexer top-k, router)
 * must match exactly; the NCCL all-reduce of two ranks exactly.
 * Seed: $SEED (default fixed). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "cpu/quant.h"
#include "cuda/device_info.h"
#include "kv_cache.h"
#include "tap.h"
#include "tp.h"

#define TOL 1e-5

static backend *C, *G;
static uint64_t rs = 0x9E3779B97F4A7C15ull;

static uint32_t rnd(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs >> 32);
}

static float frand(void) { return (float)(rnd() / 4294967296.0 * 2 - 1); }

static float *hrand(size_t n, float s)
{
    float *p = malloc(n * sizeof *p + 4);
    for (size_t i = 0; i < n; i++) p[i] = frand() * s;
    return p;
}

static void *dcopy(const void *h, size_t bytes)
{
    void *d = G->alloc(G, bytes);
    G->write(G, d, h, bytes);
    return d;
}

static void poison(void *d, size_t bytes)
{
    size_t n = (bytes + 3) / 4;
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = NAN;
    G->write(G, d, p, bytes);
    free(p);
}

static void *hcopy(const void *d, size_t bytes)
{
    void *h = malloc(bytes + 4);
    G->read(G, h, d, bytes);
    return h;
}

/* Relative L2 error (absolute when want is 0); NaN where want has none
 * is infinite. */
static double rel_err(const float *got, const float *want, size_t n)
{
    double d = 0, z = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i]) != isnan(want[i])) return INFINITY;
        if (isnan(got[i])) continue;
        d += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        z += (double)want[i] * want[i];
    }
    return z > 0 ? sqrt(d / z) : sqrt(d);
}

/* got vs want: relative L2 (absolute when want is 0), NaN fails. */
static void check(const char *what, const float *got, const float *want, size_t n)
{
    double d = 0, z = 0, ma = 0;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i]) != isnan(want[i])) { bad++; continue; }
        if (isnan(got[i])) continue;
        double e = (double)got[i] - want[i];
        d += e * e;
        z += (double)want[i] * want[i];
        ma = fmax(ma, fabs(e));
    }
    double rel = z > 0 ? sqrt(d / z) : sqrt(d);
    const char *e = G->error(G);
    ok(!e && !bad && rel <= TOL, "%s: rel L2 %.2e, max abs %.2e%s%s", what, rel, ma,
       bad ? " (NaN or unwritten)" : "", e ? e : "");
}

/* A [T][n] view of rows with stride ld, made contiguous. */
static float *pack(const float *y, int T, int n, int ld)
{
    float *p = malloc((size_t)T * n * sizeof *p + 4);
    for (int t = 0; t < T; t++) memcpy(p + (size_t)t * n, y + (size_t)t * ld, n * sizeof *p);
    return p;
}

/* A random weight in stored format (host memory). */
static qweight make_w(enum qtype t, int rows, int cols)
{
    size_t n = (size_t)rows * cols;
    qweight q = { .type = t, .rows = rows, .cols = cols, .ld = cols };
    if (t == QT_F32) {
        q.data = hrand(n, 0.5f);
    } else if (t == QT_BF16) {
        uint16_t *d = malloc(n * 2);
        for (size_t i = 0; i < n; i++) d[i] = f32_to_bf16(frand() * 0.5f);
        q.data = d;
    } else if (t == QT_FP8) {
        uint8_t *d = malloc(n);
        for (size_t i = 0; i < n; i++) {
            d[i] = rnd() & 0xff;
            if ((d[i] & 0x7f) == 0x7f) d[i] ^= 1;      /* no NaN codes */
        }
        q.scale_ld = (cols + 127) / 128;
        size_t ns = (size_t)(rows + 127) / 128 * q.scale_ld;
        uint8_t *s = malloc(ns);
        for (size_t i = 0; i < ns; i++) s[i] = 118 + rnd() % 8;
        q.data = d;
        q.scale = s;
    } else {
        uint8_t *d = malloc(n / 2);
        for (size_t i = 0; i < n / 2; i++) d[i] = rnd() & 0xff;
        q.scale_ld = cols / 32;
        uint8_t *s = malloc((size_t)rows * q.scale_ld);
        for (size_t i = 0; i < (size_t)rows * q.scale_ld; i++) s[i] = 120 + rnd() % 8;
        q.data = d;
        q.scale = s;
    }
    return q;
}

static qweight up(const qweight *w)
{
    qweight g = *w;
    if (G->upload_weights(G, &g, 1)) diag("upload: %s", G->error(G));
    return g;
}

static const char *tname(enum qtype t)
{
    return t == QT_F32 ? "f32" : t == QT_BF16 ? "bf16" : t == QT_FP8 ? "fp8" : "mxfp4";
}

/* ---- matmul ---- */

static void mm_case(const char *what, const qweight *cw, const qweight *gw, int T)
{
    int K = cw->cols, N = cw->rows, ldx = K + (T % 2 ? 4 : 0), ldy = N + 1;
    float *x = hrand((size_t)T * ldx, 1.0f);
    float *yc = calloc((size_t)T * ldy, sizeof *yc);
    C->matmul(C, cw, x, ldx, T, yc, ldy);
    float *dx = dcopy(x, (size_t)T * ldx * 4), *dy = G->alloc(G, (size_t)T * ldy * 4);
    poison(dy, (size_t)T * ldy * 4);
    G->matmul(G, gw, dx, ldx, T, dy, ldy);
    float *yg = hcopy(dy, (size_t)T * ldy * 4);
    float *a = pack(yg, T, N, ldy), *b = pack(yc, T, N, ldy);
    char name[160];
    snprintf(name, sizeof name, "matmul %s T=%d", what, T);
    check(name, a, b, (size_t)T * N);
    G->release(G, dx);
    G->release(G, dy);
    free(x), free(yc), free(yg), free(a), free(b);
}

static void test_matmul(void)
{
    enum qtype types[] = { QT_F32, QT_BF16, QT_FP8, QT_MXFP4 };
    int Ts[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 70 };
    for (int ti = 0; ti < 4; ti++) {
        enum qtype t = types[ti];
        /* whole tensor */
        qweight w = make_w(t, 300, 512);
        qweight g = up(&w);
        char what[96];
        for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++) {
            snprintf(what, sizeof what, "%s 300x512", tname(t));
            mm_case(what, &w, &g, Ts[k]);
        }
        /* a shard (rows and columns from inside), as TP ranks hold, and
         * a sub-view of it, as the grouped output projection takes */
        qweight big = make_w(t, 384, 1024);
        qweight v = qweight_view(&big, 130, 200, 256, 320);
        qweight gv = up(&v);
        snprintf(what, sizeof what, "%s shard rows 130+200 cols 256+320", tname(t));
        mm_case(what, &v, &gv, 1);
        mm_case(what, &v, &gv, 33);
        qweight sv = qweight_view(&v, 64, 64, 0, 320), sg = qweight_view(&gv, 64, 64, 0, 320);
        snprintf(what, sizeof what, "%s sub-view of a shard", tname(t));
        mm_case(what, &sv, &sg, 4);
        /* columns not on a 16-byte boundary (scalar path), odd sizes */
        int c0 = t == QT_MXFP4 ? 2 : 6;
        qweight o = qweight_view(&big, 3, 77, c0, t == QT_MXFP4 ? 96 : 101);
        qweight go = up(&o);
        snprintf(what, sizeof what, "%s unaligned view", tname(t));
        mm_case(what, &o, &go, 1);
        mm_case(what, &o, &go, 5);
        mm_case(what, &o, &go, 20);
        /* GEMV shapes: few rows of long columns (one row per warp, the
         * columns split over warps); x in several shared-memory tiles */
        qweight sr = make_w(t, 5, 4096), lk = make_w(t, 70, 9216);
        qweight gsr = up(&sr), glk = up(&lk);
        snprintf(what, sizeof what, "%s 5x4096", tname(t));
        for (int T = 1; T <= 8; T *= 2) mm_case(what, &sr, &gsr, T);
        snprintf(what, sizeof what, "%s 70x9216", tname(t));
        for (int T = 1; T <= 8; T += 3) mm_case(what, &lk, &glk, T);
    }
}

/* ---- row ops ---- */

static void test_embed(void)
{
    qweight w = make_w(QT_BF16, 500, 192);
    qweight g = up(&w);
    int T = 7;
    int32_t ids[7] = { 0, 499, 17, 17, 250, 3, 111 };
    float *yc = malloc((size_t)T * 192 * 4);
    C->embed(C, &w, ids, T, yc);
    float *dy = G->alloc(G, (size_t)T * 192 * 4);
    poison(dy, (size_t)T * 192 * 4);
    G->embed(G, &g, ids, T, dy);
    float *yg = hcopy(dy, (size_t)T * 192 * 4);
    check("embed bf16 500x192 T=7", yg, yc, (size_t)T * 192);
    G->release(G, dy);
    free(yc), free(yg);
}

static void test_rmsnorm(int T, int n, int ld, bool weight, bool inplace)
{
    float *x = hrand((size_t)T * ld, 2.0f), *w = weight ? hrand(n, 1.0f) : NULL;
    float *yc = calloc((size_t)T * ld, 4);
    float *dx = dcopy(x, (size_t)T * ld * 4), *dw = w ? dcopy(w, n * 4) : NULL;
    float *dy = inplace ? dx : G->alloc(G, (size_t)T * ld * 4);
    if (!inplace) poison(dy, (size_t)T * ld * 4);
    C->rmsnorm(C, x, ld, T, n, w, 1e-6f, inplace ? x : yc, ld);
    G->rmsnorm(G, dx, ld, T, n, dw, 1e-6f, dy, ld);
    float *yg = hcopy(dy, (size_t)T * ld * 4);
    float *a = pack(yg, T, n, ld), *b = pack(inplace ? x : yc, T, n, ld);
    char name[96];
    snprintf(name, sizeof name, "rmsnorm T=%d n=%d%s%s", T, n, weight ? " weighted" : "",
             inplace ? " in place" : "");
    check(name, a, b, (size_t)T * n);
    G->release(G, dx);
    if (!inplace) G->release(G, dy);
    if (dw) G->release(G, dw);
    free(x), free(w), free(yc), free(yg), free(a), free(b);
}

static void test_rope(int T, int nheads, int hd, int npairs, bool inverse)
{
    int ld = nheads * hd + 8;
    float *x = hrand((size_t)T * ld, 1.0f), *inv = malloc(npairs * 4);
    for (int i = 0; i < npairs; i++) inv[i] = powf(10000.0f, -2.0f * i / (2 * npairs));
    rope_table rt = { npairs, inv, 1.25f };
    int32_t *pos = malloc(T * 4);
    for (int t = 0; t < T; t++) pos[t] = rnd() % 100000;
    float *dx = dcopy(x, (size_t)T * ld * 4);
    C->rope(C, x, ld, T, nheads, hd, &rt, pos, inverse);
    G->rope(G, dx, ld, T, nheads, hd, &rt, pos, inverse);
    float *yg = hcopy(dx, (size_t)T * ld * 4);
    char name[96];
    snprintf(name, sizeof name, "rope T=%d heads=%d hd=%d pairs=%d%s", T, nheads, hd, npairs,
             inverse ? " inverse" : "");
    check(name, yg, x, (size_t)T * ld);
    G->release(G, dx);
    free(x), free(inv), free(pos), free(yg);
}

static void test_scale(void)
{
    int T = 9, n = 33, ld = 40;
    float *x = hrand((size_t)T * ld, 1.0f);
    float *dx = dcopy(x, (size_t)T * ld * 4);
    C->scale(C, x, ld, T, n, 0.125f);
    G->scale(G, dx, ld, T, n, 0.125f);
    float *yg = hcopy(dx, (size_t)T * ld * 4);
    check("scale", yg, x, (size_t)T * ld);
    G->release(G, dx);
    free(x), free(yg);
}

static void copy_case(void)
{
    int rows = 5, n = 70, lds = 90, ldd = 75;
    float *s = hrand((size_t)rows * lds, 1.0f), *d = calloc((size_t)rows * ldd, 4);
    float *ds = dcopy(s, (size_t)rows * lds * 4), *dd = G->alloc(G, (size_t)rows * ldd * 4);
    poison(dd, (size_t)rows * ldd * 4);
    C->copy_rows(C, d, ldd, s, lds, rows, n);
    G->copy_rows(G, dd, ldd, ds, lds, rows, n);
    float *g = hcopy(dd, (size_t)rows * ldd * 4);
    float *a = pack(g, rows, n, ldd), *b = pack(d, rows, n, ldd);
    check("copy_rows", a, b, (size_t)rows * n);
    G->release(G, ds);
    G->release(G, dd);
    free(s), free(d), free(g), free(a), free(b);
}

/* ---- hyper-connections ---- */

static void test_hc(int T, int hc, int H)
{
    int mix = (2 + hc) * hc, n = hc * H;
    float *h = hrand((size_t)T * n, 1.0f), *fn = hrand((size_t)mix * n, 0.05f);
    float *base = hrand(mix, 0.5f), *scale = hrand(3, 1.0f), *y = hrand((size_t)T * H, 1.0f);
    float *post = malloc((size_t)T * hc * 4), *comb = malloc((size_t)T * hc * hc * 4);
    float *col = malloc((size_t)T * H * 4);
    float *dh = dcopy(h, (size_t)T * n * 4), *dfn = dcopy(fn, (size_t)mix * n * 4);
    float *dbase = dcopy(base, mix * 4), *dscale = dcopy(scale, 12), *dyy = dcopy(y, (size_t)T * H * 4);
    float *dpost = G->alloc(G, (size_t)T * hc * 4), *dcomb = G->alloc(G, (size_t)T * hc * hc * 4);
    float *dcol = G->alloc(G, (size_t)T * H * 4);
    poison(dpost, (size_t)T * hc * 4);
    poison(dcomb, (size_t)T * hc * hc * 4);
    poison(dcol, (size_t)T * H * 4);
    C->hc_pre(C, h, T, hc, H, fn, base, scale, 20, 1e-6f, 1e-6f, post, comb, col);
    G->hc_pre(G, dh, T, hc, H, dfn, dbase, dscale, 20, 1e-6f, 1e-6f, dpost, dcomb, dcol);
    char name[96];
    float *g = hcopy(dpost, (size_t)T * hc * 4);
    snprintf(name, sizeof name, "hc_pre post T=%d hc=%d H=%d", T, hc, H);
    check(name, g, post, (size_t)T * hc);
    free(g);
    g = hcopy(dcomb, (size_t)T * hc * hc * 4);
    snprintf(name, sizeof name, "hc_pre comb (Sinkhorn) T=%d hc=%d", T, hc);
    check(name, g, comb, (size_t)T * hc * hc);
    free(g);
    g = hcopy(dcol, (size_t)T * H * 4);
    snprintf(name, sizeof name, "hc_pre collapsed T=%d hc=%d H=%d", T, hc, H);
    check(name, g, col, (size_t)T * H);
    free(g);

    C->hc_post(C, h, y, post, comb, T, hc, H);
    G->hc_post(G, dh, dyy, dpost, dcomb, T, hc, H);
    g = hcopy(dh, (size_t)T * n * 4);
    snprintf(name, sizeof name, "hc_post T=%d hc=%d H=%d", T, hc, H);
    check(name, g, h, (size_t)T * n);
    free(g);

    poison(dcol, (size_t)T * H * 4);
    C->hc_head(C, h, T, hc, H, fn, base, scale, 1e-6f, 1e-6f, col);
    G->hc_head(G, dh, T, hc, H, dfn, dbase, dscale, 1e-6f, 1e-6f, dcol);
    g = hcopy(dcol, (size_t)T * H * 4);
    snprintf(name, sizeof name, "hc_head T=%d hc=%d H=%d", T, hc, H);
    check(name, g, col, (size_t)T * H);
    free(g);
    void *dev[] = { dh, dfn, dbase, dscale, dyy, dpost, dcomb, dcol };
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) G->release(G, dev[i]);
    free(h), free(fn), free(base), free(scale), free(y), free(post), free(comb), free(col);
}

/* ---- paged rows on both sides ---- */

typedef struct {
    int nblk, per_block, row_len;
    size_t off, block_bytes;
    char *hbase, *dbase;
    char **hblocks, **dblocks;
} pages;

static pages pages_new(int nrows, int per_block, int row_len, bool random)
{
    pages p = { .per_block = per_block, .row_len = row_len, .off = 32 };
    p.nblk = nrows / per_block + 1;
    p.block_bytes = p.off + (size_t)per_block * row_len * 4;
    size_t all = (size_t)p.nblk * p.block_bytes;
    p.hbase = random ? (char *)hrand(all / 4, 1.0f) : calloc(all, 1);
    p.dbase = dcopy(p.hbase, all);
    p.hblocks = malloc(p.nblk * sizeof *p.hblocks);
    p.dblocks = malloc(p.nblk * sizeof *p.dblocks);
    /* blocks out of order, as a pool hands them out */
    for (int i = 0; i < p.nblk; i++) {
        int b = (i * 7 + 3) % p.nblk;
        if (p.nblk % 7 == 0) b = i;
        p.hblocks[i] = p.hbase + (size_t)b * p.block_bytes;
        p.dblocks[i] = p.dbase + (size_t)b * p.block_bytes;
    }
    return p;
}

static paged_rows pages_rows(const pages *p, bool dev)
{
    return (paged_rows){ dev ? p->dblocks : p->hblocks, p->off, p->per_block, p->row_len };
}

static void pages_free(pages *p)
{
    G->release(G, p->dbase);
    free(p->hbase), free(p->hblocks), free(p->dblocks);
}

/* ---- compressor: a sequence fed in chunks, state and entries compared
 * after every chunk ---- */

static void test_compress(int ratio, bool overlap, int d, int npairs, const int *chunks, int nch)
{
    int coff = overlap ? 2 : 1, wd = coff * d, ld = wd + 2, total = 0;
    for (int i = 0; i < nch; i++) total += chunks[i];
    float *kv = hrand((size_t)total * ld, 1.0f), *gate = hrand((size_t)total * ld, 1.0f);
    float *ape = hrand((size_t)ratio * wd, 0.5f), *norm = hrand(d, 1.0f);
    float *inv = malloc(npairs * 4);
    for (int i = 0; i < npairs; i++) inv[i] = powf(160000.0f, -2.0f * i / (2 * npairs));
    rope_table rt = { npairs, inv, 1.0f };
    size_t sf = comp_state_floats(ratio, coff, d);
    float *state = calloc(sf, 4), *dstate = G->alloc(G, sf * 4);
    float *dkv = dcopy(kv, (size_t)total * ld * 4), *dgate = dcopy(gate, (size_t)total * ld * 4);
    float *dape = dcopy(ape, (size_t)ratio * wd * 4), *dnorm = dcopy(norm, d * 4);
    pages pg = pages_new(total / ratio, 3, d, false);
    int pos = 0, bad_chunk = -1;
    double worst_s = 0, worst_e = 0;
    for (int i = 0; i < nch && bad_chunk < 0; i++) {
        int n = chunks[i];
        compress_args a = { .n = n, .pos0 = pos, .ratio = ratio, .d = d, .overlap = overlap,
                            .kv = kv + (size_t)pos * ld, .gate = gate + (size_t)pos * ld,
                            .ld = ld, .ape = ape, .norm = norm, .eps = 1e-6f, .rope = &rt,
                            .state = state, .out = pages_rows(&pg, false) };
        C->compress(C, &a);
        a.kv = dkv + (size_t)pos * ld, a.gate = dgate + (size_t)pos * ld;
        a.ape = dape, a.norm = dnorm, a.state = dstate, a.out = pages_rows(&pg, true);
        G->compress(G, &a);
        pos += n;
        /* the whole state and every entry so far */
        int ne = pos / ratio;
        float *gs = hcopy(dstate, sf * 4);
        float *ec = malloc((size_t)(ne + 1) * d * 4), *eg = malloc((size_t)(ne + 1) * d * 4);
        paged_rows hr = pages_rows(&pg, false), dr = pages_rows(&pg, true);
        for (int e = 0; e < ne; e++) {
            memcpy(ec + (size_t)e * d, paged_row(&hr, e), d * 4);
            G->read(G, eg + (size_t)e * d, paged_row(&dr, e), d * 4);
        }
        double rs_ = rel_err(gs, state, sf), re = rel_err(eg, ec, (size_t)ne * d);
        worst_s = fmax(worst_s, rs_);
        worst_e = fmax(worst_e, re);
        if (!(rs_ <= TOL && re <= TOL)) bad_chunk = i;
        free(gs), free(ec), free(eg);
    }
    ok(bad_chunk < 0 && !G->error(G), "compress ratio=%d %s d=%d over %d chunks: state rel %.2e, "
       "entries rel %.2e (first bad chunk %d)", ratio, overlap ? "CSA" : "HCA", d, nch, worst_s,
       worst_e, bad_chunk);
    pages_free(&pg);
    void *dev[] = { dstate, dkv, dgate, dape, dnorm };
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) G->release(G, dev[i]);
    free(kv), free(gate), free(ape), free(norm), free(inv), free(state);
}

/* ---- indexer ---- */

static void test_indexer(int ratio, int nheads, int d, int topk, int pos0, int n)
{
    int nrows = (pos0 + n) / ratio;
    pages pg = pages_new(nrows, 5, d, true);
    float *q = hrand((size_t)n * nheads * d, 1.0f), *w = hrand((size_t)n * nheads, 1.0f);
    int32_t *sel = malloc((size_t)n * topk * 4);
    int *nsel = malloc(n * sizeof *nsel);
    float *dq = dcopy(q, (size_t)n * nheads * d * 4), *dw = dcopy(w, (size_t)n * nheads * 4);
    int32_t *dsel = G->alloc(G, (size_t)n * topk * 4);
    int *dnsel = G->alloc(G, n * sizeof *dnsel);
    poison(dsel, (size_t)n * topk * 4);
    poison(dnsel, n * sizeof *dnsel);
    indexer_args a = { .n = n, .pos0 = pos0, .ratio = ratio, .nheads = nheads, .d = d,
                       .topk = topk, .q = q, .w = w, .keys = pages_rows(&pg, false),
                       .sel = sel, .nsel = nsel };
    C->indexer(C, &a);
    a.q = dq, a.w = dw, a.keys = pages_rows(&pg, true), a.sel = dsel, a.nsel = dnsel;
    G->indexer(G, &a);
    int32_t *gs = hcopy(dsel, (size_t)n * topk * 4);
    int *gn = hcopy(dnsel, n * sizeof *gn);
    int bad = 0, first_bad = -1;
    for (int i = 0; i < n; i++) {
        bool same = gn[i] == nsel[i];
        for (int k = 0; same && k < nsel[i]; k++) same = gs[(size_t)i * topk + k] == sel[(size_t)i * topk + k];
        if (!same && first_bad < 0) first_bad = i;
        bad += !same;
    }
    ok(!bad && !G->error(G), "indexer ratio=%d heads=%d d=%d topk=%d pos0=%d n=%d: %d of %d "
       "tokens choose other entries (first %d)", ratio, nheads, d, topk, pos0, n, bad, n,
       first_bad);
    pages_free(&pg);
    G->release(G, dq), G->release(G, dw), G->release(G, dsel), G->release(G, dnsel);
    free(q), free(w), free(sel), free(nsel), free(gs), free(gn);
}

/* ---- attention ---- */

static void test_attention(int nheads, int hd, int window, int ratio, int topk, int pos0, int n)
{
    int nrows = ratio ? (pos0 + n) / ratio : 0;
    pages pg = pages_new(nrows, 4, hd, true);
    float *q = hrand((size_t)n * nheads * hd, 1.0f), *kv = hrand((size_t)n * hd, 1.0f);
    float *ring = hrand((size_t)window * hd, 1.0f), *sinks = hrand(nheads, 2.0f);
    float *out = malloc((size_t)n * nheads * hd * 4);
    int32_t *sel = NULL;
    int *nsel = NULL;
    if (topk) {     /* CSA: a random ascending choice of entries per token */
        sel = malloc((size_t)n * topk * 4);
        nsel = malloc(n * sizeof *nsel);
        for (int i = 0; i < n; i++) {
            int nvis = (pos0 + i + 1) / ratio, k = 0;
            for (int s = 0; s < nvis && k < topk; s++)
                if ((int)(rnd() % (nvis - s)) < topk - k) sel[(size_t)i * topk + k++] = s;
            nsel[i] = k;
        }
    }
    float *dq = dcopy(q, (size_t)n * nheads * hd * 4), *dkv = dcopy(kv, (size_t)n * hd * 4);
    float *dring = dcopy(ring, (size_t)window * hd * 4), *dsinks = dcopy(sinks, nheads * 4);
    float *dout = G->alloc(G, (size_t)n * nheads * hd * 4);
    int32_t *dsel = sel ? dcopy(sel, (size_t)n * topk * 4) : NULL;
    int *dnsel = nsel ? dcopy(nsel, n * sizeof *nsel) : NULL;
    poison(dout, (size_t)n * nheads * hd * 4);
    attention_args a = { .n = n, .pos0 = pos0, .nheads = nheads, .head_dim = hd,
                         .window = window, .scale = 1.0f / sqrtf(hd), .q = q, .kv = kv,
                         .ring = ring, .sinks = sinks, .ratio = ratio,
                         .comp = pages_rows(&pg, false), .sel = sel, .nsel = nsel,
                         .sel_ld = topk, .out = out };
    C->attention(C, &a);
    a.q = dq, a.kv = dkv, a.ring = dring, a.sinks = dsinks, a.comp = pages_rows(&pg, true);
    a.sel = dsel, a.nsel = dnsel, a.out = dout;
    G->attention(G, &a);
    float *g = hcopy(dout, (size_t)n * nheads * hd * 4);
    char name[128];
    snprintf(name, sizeof name, "attention heads=%d hd=%d window=%d ratio=%d topk=%d pos0=%d n=%d",
             nheads, hd, window, ratio, topk, pos0, n);
    check(name, g, out, (size_t)n * nheads * hd);
    pages_free(&pg);
    void *dev[] = { dq, dkv, dring, dsinks, dout, dsel, dnsel };
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) if (dev[i]) G->release(G, dev[i]);
    free(q), free(kv), free(ring), free(sinks), free(out), free(sel), free(nsel), free(g);
}

static void test_ring_store(int window, int hd, int pos0, int n)
{
    float *ring = hrand((size_t)window * hd, 1.0f), *kv = hrand((size_t)n * hd, 1.0f);
    float *dring = dcopy(ring, (size_t)window * hd * 4), *dkv = dcopy(kv, (size_t)n * hd * 4);
    C->ring_store(C, ring, window, hd, kv, n, pos0);
    G->ring_store(G, dring, window, hd, dkv, n, pos0);
    float *g = hcopy(dring, (size_t)window * hd * 4);
    char name[96];
    snprintf(name, sizeof name, "ring_store window=%d pos0=%d n=%d", window, pos0, n);
    check(name, g, ring, (size_t)window * hd);
    G->release(G, dring), G->release(G, dkv);
    free(ring), free(kv), free(g);
}

/* ---- mixture of experts: rank 1's slice of every expert ---- */

/* E experts of intermediate size I, this rank's slice [i0, i0 + ni); K
 * chosen per token. */
static void test_moe(int T, bool hash, int H, int E, int K, int I, int i0, int ni)
{
    int vocab = 50;
    qweight gate = make_w(QT_BF16, E, H);
    qweight w1[64], w2[64], w3[64], g1[64], g2[64], g3[64];
    for (int e = 0; e < E; e++) {
        qweight a = make_w(QT_MXFP4, I, H), b = make_w(QT_MXFP4, H, I), c = make_w(QT_MXFP4, I, H);
        g1[e] = w1[e] = qweight_view(&a, i0, ni, 0, H);
        g2[e] = w2[e] = qweight_view(&b, 0, H, i0, ni);
        g3[e] = w3[e] = qweight_view(&c, i0, ni, 0, H);
    }
    qweight s1f = make_w(QT_FP8, I, H), s2f = make_w(QT_FP8, H, I), s3f = make_w(QT_FP8, I, H);
    qweight s1 = qweight_view(&s1f, i0, ni, 0, H), s2 = qweight_view(&s2f, 0, H, i0, ni);
    qweight s3 = qweight_view(&s3f, i0, ni, 0, H);
    qweight gg = up(&gate), gs1 = up(&s1), gs2 = up(&s2), gs3 = up(&s3);
    if (G->upload_weights(G, g1, E) || G->upload_weights(G, g2, E) ||
        G->upload_weights(G, g3, E))
        diag("upload experts: %s", G->error(G));
    /* x's size falls with sqrt(H): the experts' pre-activations stay about
     * the SwiGLU limit, where an error in them is not amplified by a
     * cancellation of much larger ones */
    float *bias = hrand(E, 0.1f), *x = hrand((size_t)T * H, sqrtf(128.0f / H));
    int32_t *tid = malloc((size_t)vocab * K * 4), *ids = malloc(T * 4);
    for (int v = 0; v < vocab; v++)     /* K distinct experts */
        for (int k = 0; k < K; k++) {
            int e, dup;
            do {
                e = rnd() % E;
                dup = 0;
                for (int j = 0; j < k; j++) dup |= tid[v * K + j] == e;
            } while (dup);
            tid[v * K + k] = e;
        }
    for (int t = 0; t < T; t++) ids[t] = rnd() % vocab;
    float *out = malloc((size_t)T * H * 4);
    float *dx = dcopy(x, (size_t)T * H * 4), *dbias = dcopy(bias, E * 4);
    int32_t *dtid = dcopy(tid, (size_t)vocab * K * 4);
    float *dout = G->alloc(G, (size_t)T * H * 4);
    poison(dout, (size_t)T * H * 4);
    moe_args a = { .T = T, .H = H, .x = x, .ids = ids, .gate = &gate,
                   .bias = hash ? NULL : bias, .tid2eid = hash ? tid : NULL, .n_experts = E,
                   .topk = K, .routed_scale = 1.5f, .limit = 2.5f, .w1 = w1, .w2 = w2, .w3 = w3,
                   .sw1 = &s1, .sw2 = &s2, .sw3 = &s3, .out = out };
    C->moe(C, &a);
    a.x = dx, a.gate = &gg, a.bias = hash ? NULL : dbias, a.tid2eid = hash ? dtid : NULL;
    a.w1 = g1, a.w2 = g2, a.w3 = g3, a.sw1 = &gs1, a.sw2 = &gs2, a.sw3 = &gs3, a.out = dout;
    G->moe(G, &a);
    float *g = hcopy(dout, (size_t)T * H * 4);
    char name[96];
    snprintf(name, sizeof name, "moe %s routing T=%d H=%d (E=%d K=%d, rank slice %d+%d of %d "
             "in MXFP4 experts)", hash ? "hash" : "top-k", T, H, E, K, i0, ni, I);
    check(name, g, out, (size_t)T * H);
    G->release(G, dx), G->release(G, dbias), G->release(G, dtid), G->release(G, dout);
    free(bias), free(x), free(tid), free(ids), free(out), free(g);
}

/* ---- NCCL all-reduce over two devices ---- */

typedef struct {
    backend **b;
    float *buf[2];
    size_t n;
    int iters;
    double secs[2];
} ar_job;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void ar_rank(void *ctx, int r)
{
    ar_job *J = ctx;
    backend *b = J->b[r];
    float one;
    double t0 = now();
    for (int i = 0; i < J->iters; i++) b->allreduce(b, J->buf[r], J->n);
    b->read(b, &one, J->buf[r], sizeof one);
    J->secs[r] = now() - t0;
}

static void test_allreduce(void)
{
    if (llm_cuda_device_count() < 2) {
        skip(3, "all-reduce needs 2 CUDA devices");
        return;
    }
    backend *b[2];
    char err[256];
    if (backend_cuda_new_group(2, b, err, sizeof err)) {
        ok(0, "NCCL group of 2: %s", err);
        return;
    }
    tp_group *g = tp_group_new(2);
    size_t sizes[] = { 1, 4096, 1 << 20 };
    for (int si = 0; si < 3; si++) {
        size_t n = sizes[si];
        float *h0 = hrand(n, 1.0f), *h1 = hrand(n, 1.0f);
        ar_job J = { b, { NULL, NULL }, n, 1, { 0, 0 } };
        J.buf[0] = b[0]->alloc(b[0], n * 4);
        J.buf[1] = b[1]->alloc(b[1], n * 4);
        b[0]->write(b[0], J.buf[0], h0, n * 4);
        b[1]->write(b[1], J.buf[1], h1, n * 4);
        tp_run(g, ar_rank, &J);
        float *r0 = malloc(n * 4), *r1 = malloc(n * 4);
        b[0]->read(b[0], r0, J.buf[0], n * 4);
        b[1]->read(b[1], r1, J.buf[1], n * 4);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) bad += r0[i] != h0[i] + h1[i] || r1[i] != r0[i];
        ok(!bad && !b[0]->error(b[0]) && !b[1]->error(b[1]),
           "NCCL all-reduce of %zu floats over 2 devices: %zu wrong %s", n, bad,
           b[0]->error(b[0]) ? b[0]->error(b[0]) : "");
        b[0]->release(b[0], J.buf[0]);
        b[1]->release(b[1], J.buf[1]);
        free(h0), free(h1), free(r0), free(r1);
    }
    /* Latency (reported, not asserted): back-to-back all-reduces. */
    size_t lat[] = { 2048, 4096, 4096 * 4 };
    for (int si = 0; si < 3; si++) {
        ar_job J = { b, { NULL, NULL }, lat[si], 20, { 0, 0 } };
        J.buf[0] = b[0]->alloc(b[0], lat[si] * 4);
        J.buf[1] = b[1]->alloc(b[1], lat[si] * 4);
        tp_run(g, ar_rank, &J);
        J.iters = 1000;
        tp_run(g, ar_rank, &J);
        diag("NCCL all-reduce %zu KB: %.1f us each (%d back to back)", lat[si] * 4 / 1024,
             J.secs[0] / J.iters * 1e6, J.iters);
        b[0]->release(b[0], J.buf[0]);
        b[1]->release(b[1], J.buf[1]);
    }
    tp_group_free(g);
    b[0]->destroy(b[0]);
    b[1]->destroy(b[1]);
}

int main(void)
{
    const char *seed = getenv("SEED");
    if (seed) rs ^= strtoull(seed, NULL, 0) * 0x2545F4914F6CDD1Dull;
    if (llm_cuda_device_count() < 1) {
        skip(1, "no CUDA device");
        return exit_status();
    }
    backend *one[1];
    char err[256];
    if (backend_cuda_new_group(1, one, err, sizeof err)) {
        ok(0, "CUDA backend: %s", err);
        return exit_status();
    }
    G = one[0];
    C = backend_cpu_new(4, NULL, 0);

    test_matmul();
    test_embed();
    for (int inplace = 0; inplace < 2; inplace++) {
        test_rmsnorm(5, 64, 70, true, inplace);
        test_rmsnorm(3, 4096, 4096, false, inplace);
        test_rmsnorm(17, 1024, 1030, true, inplace);
    }
    test_rope(5, 4, 64, 8, false);
    test_rope(5, 4, 64, 8, true);
    test_rope(33, 16, 512, 32, false);
    test_rope(2, 1, 512, 32, true);
    test_scale();
    copy_case();
    test_hc(1, 4, 256);
    test_hc(7, 4, 4096);
    test_hc(3, 2, 128);
    test_hc(70, 4, 1024);
    int ch1[] = { 7, 1, 1, 13, 5, 1, 1, 1, 40, 2 };
    int ch2[] = { 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1 };
    int ch3[] = { 300, 1, 1, 100, 1 };
    test_compress(4, true, 64, 8, ch1, 10);
    test_compress(4, true, 32, 8, ch2, 12);
    test_compress(8, false, 64, 8, ch1, 10);
    test_compress(128, false, 512, 32, ch3, 5);
    test_compress(4, true, 512, 32, ch3, 5);
    test_compress(4, true, 128, 32, ch3, 5);
    test_indexer(4, 8, 32, 8, 0, 40);
    test_indexer(4, 8, 32, 8, 40, 24);
    test_indexer(4, 64, 128, 64, 2000, 5);
    test_indexer(4, 64, 128, 512, 8000, 3);
    test_indexer(4, 16, 64, 32, 300, 300);
    test_attention(4, 64, 16, 0, 0, 0, 20);
    test_attention(4, 64, 16, 0, 0, 40, 1);
    test_attention(4, 64, 32, 8, 0, 100, 7);
    test_attention(3, 64, 32, 4, 8, 100, 30);
    test_attention(8, 512, 128, 128, 0, 1000, 3);
    test_attention(8, 512, 128, 4, 512, 4000, 2);
    test_attention(2, 512, 128, 4, 512, 0, 300);
    /* enough tokens for several heads per block: 8 (with a partial group
     * of 4), 4 (partial group of 2), 8 at Flash's sizes */
    test_attention(12, 64, 32, 8, 0, 100, 64);
    test_attention(6, 64, 32, 4, 8, 100, 64);
    test_attention(8, 512, 128, 4, 512, 4000, 130);
    test_ring_store(16, 64, 0, 5);
    test_ring_store(16, 64, 30, 40);
    test_ring_store(128, 512, 1000, 1);
    test_moe(1, false, 128, 8, 2, 128, 64, 64);
    test_moe(1, true, 128, 8, 2, 128, 64, 64);
    test_moe(5, false, 128, 8, 2, 128, 64, 64);
    /* decode sizes: the fused expert GEMVs, columns split over warps */
    for (int T = 1; T <= 8; T++) test_moe(T, T % 2 == 0, 1024, 32, 6, 512, 256, 256);
    test_moe(1, false, 4096, 16, 6, 256, 128, 128);
    /* a slice of 48 columns: w2's rows are not whole 16-byte loads */
    test_moe(2, false, 256, 8, 3, 96, 32, 48);
    test_moe(1, true, 256, 8, 3, 96, 32, 48);
    test_moe(40, false, 128, 8, 2, 128, 64, 64);
    test_moe(40, true, 128, 8, 2, 128, 64, 64);
    test_moe(300, false, 128, 8, 2, 128, 64, 64);

    G->destroy(G);
    C->destroy(C);
    test_allreduce();
    return exit_status();
}
