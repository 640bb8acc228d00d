/* Every op of the CUDA backend against the CPU backend (the reference) on
 * fresh random inputs at several sizes (make test-gpu; needs a GPU).
 * Outputs are poisoned with NaN before each GPU run, so an unwritten
 * element fails; NaN never passes.  Tolerances: relative L2 error 1e-5
 * for everything (all paths are float32 with weights decoded exactly;
 * only summation order differs); index outputs (indexer top-k, router)
 * must match exactly; the NCCL all-reduce of two ranks exactly.  The
 * indexer's tensor-core path (bf16 inputs) has its own bound, derived
 * from the input rounding (test_indexer_mma).
 *
 * Prefill GEMMs (T >= LT_MIN_T tokens) run three times, by
 * LLM_CUDA_GEMM: f32 (float32 operands: the 1e-5 above), bf16x2 (the
 * default) and bf16 (weights exact in bf16, float32 accumulation; x
 * rounded to bf16, or under bf16x2 split into hi = bf16(x) and
 * lo = bf16(x - hi), the product W hi + W lo).  Such a matmul must equal
 * the CPU's on the x the GPU multiplies (bf16(x), or hi + lo; 1e-5: the
 * same values, summation order aside), and every element must lie within
 * the rounding bound of the exact product:
 *   |y~ - y| <= u sum_k |x_k| |w_k| + 2 K 2^-24 sum_k |x_k| |w_k|,
 * u = 2^-8 the unit roundoff of bf16's 8 significant bits (each x_k moves
 * by at most u |x_k|; bf16x2: u = 2^-16, x - hi - lo being the rounding
 * error of bf16(x - hi)), the second term float32 summation on both sides.
 * MoE: relative L2 <= 4u + 1e-5.  The decode MoE (T <= 8, float32
 * operands in every mode): relative L2 <= 1e-5 (TOL) against the CPU,
 * fused (cu_moe_decode) or not: the same products summed in float32 in
 * another order, per output K * I + I of them (w2's sums; K * I + I =
 * 7168 at V4's rank shapes: about sqrt(7168) 2^-24 = 5e-6 of the sum of
 * the terms' magnitudes for rounding errors of random sign), the same
 * bound the separate launches have met on these shapes; the same experts
 * (the gate's GEMV and route_warp are shared by both paths; a near-tie
 * that the GEMV's order flips against the CPU's fails loudly).  Its up
 * and down kernels on tensor cores (moe_decode_mma.cu, by default in
 * every mode but f32; LLM_CUDA_MOE_DEC_MMA=0: the float32 ones): x and
 * g split in two bf16 parts as the expert tiles split them, so the
 * tiles' bound below, 4 2^-16 + 1e-5.
 * LLM_CUDA_GEMM=fp8 (DeepSeek's numerics): in steps of 64+ tokens the
 * matmuls of FP8 and MXFP4 weights multiply act_quant(x) (cpu/quant.h),
 * FP8 weights as FP8 x FP8 with block scales (cuBLASLt), MXFP4 ones as
 * bf16 (exact on those values); the reference is the CPU backend in its
 * fp8 mode (backend_cpu_set_fp8), which quantizes the same x into the
 * same codes.  Every element within
 *   |y~ - y8| <= (2^-13 + 2 K 2^-24) sum_k |x8_k| |w_k|
 * of the CPU's y8 on the quantized x8: Hopper's FP8 tensor cores keep
 * about 14 bits of their running sums inside a 128-deep scale block
 * (DeepSeek-V3 report, 3.3.2) before cuBLASLt adds the block into float32.
 * BF16 weights multiply x rounded to bf16 once (u = 2^-8, DeepSeek's
 * bf16 activations; the CPU's fp8 mode rounds it the same way); attention
 * of 64+ tokens with bf16 queries and probabilities as under bf16 (the
 * CPU's fp8 mode rounds them too), decode launches as under bf16x2, the
 * indexer of 64+ tokens in FP8 (its own bound,
 * test_indexer_mma).  MoE against the CPU's fp8 mode: relative L2 <= 1e-2.  Where
 * no quantized value differs it is float32 noise (measured 1e-7..2e-6);
 * but g, quantized again before w2, comes from float32 sums that differ
 * in their last bits, so a g value next to an e4m3 rounding boundary
 * lands on the other side on one of the two (one e4m3 step, 6-12% of that
 * value): measured 3.1e-3 for the 920K values of g at T=600, H=1024.  Relative errors add along the chain:
 * at most u from the rounded x into w1 and w3, times 1.28 through SiLU
 * for the gate's (its log-derivative 1 + g (1 - sigmoid g) peaks at
 * 1.28), u from the up projection, u from the rounded SwiGLU output into
 * w2: 3.3u; the shared expert the same.
 * Under fp8 the grouped expert GEMMs (moe_gemm_fp8.cu: MXFP4 as exact
 * e5m2, x as act_quant's codes, wgmma with float32 promotion per 128
 * columns) multiply the same values with the tensor cores' running sums
 * over each 128-column group, the bound of cuBLASLt's FP8 GEMMs above
 * (2^-13 + 2 K 2^-24) sum_k |x8_k| |w_k| per GEMM; through the chain
 * the same 1e-2 (LLM_CUDA_MOE_FP8=0, moe_gemm.cu's bf16 kernel on the
 * quantized floats, is tested alike).
 * Decode batches of 9-64 tokens with FP8 or BF16 weights run on tensor
 * cores in every mode but f32 (matmul_mma.cu; the backends here set
 * LLM_CUDA_SMALL_MMA=1: wherever it can run, not only where it was
 * measured faster; views it cannot take run on the GEMV; the same cases
 * again on matmul_stream.cu, LLM_CUDA_SMALL_MMA=2, and on matmul_wgmma.cu,
 * =3): below 64 tokens x split in two bf16 parts in every such mode,
 * so the bf16x2 bound above (u = 2^-16) against the CPU's float32 product
 * (fp8 too: its reference quantizes nothing below 64 tokens); at 64 the
 * mode's own numerics and bound (bf16: x rounded once; fp8: act_quant(x),
 * exact in bf16, times the weights with float32 sums: within the fp8
 * bound's summation term).  The MoE of such steps (its shared expert on
 * that kernel, its routed experts' tiles on the same kernel for MXFP4:
 * weights exact in bf16, x and g split in two bf16 parts): relative L2
 * <= 4 2^-16 + 1e-5, as the MoE bound above (at 64+ tokens the mode's
 * MoE bound; under fp8 x and g are quantized there, exact in bf16).
 * Cache storage (kv_dtype): the ring and kv_round store the same bytes
 * as the CPU; the compressor's entries, rounded from float32 values that
 * differ in the last bits, may land on the other side of a rounding
 * boundary: their decoded values are held to a bound per format (see
 * test_compress).
 * Seed: $SEED (default fixed). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "cpu/quant.h"
#include "cuda/act_quant.h"
#include "cuda/device_info.h"
#include "cuda/indexer_mma.h"
#include "kv_cache.h"
#include "tap.h"
#include "tp.h"

#define TOL 1e-5
#define LT_MIN_T 64             /* backend_cuda.cuh: prefill GEMMs from this many tokens */
#define GEMV_MAX_T 16           /* backend_cuda.cuh: dense matmuls on the GEMV up to this many */

static backend *C, *G;
/* per GEMM mode: LLM_CUDA_SMALL_MMA=2, decode batches' matmuls with x
 * streamed (matmul_stream.cu) wherever that kernel runs; =3, on wgmma
 * (matmul_wgmma.cu) */
static backend *G_stream[4], *G_wgmma[4];
/* per GEMM mode: LLM_CUDA_LT_TUNE=1, decode batches' cuBLASLt GEMMs on
 * the heuristic's first algorithm (the default times 8 candidates) */
static backend *G_ltfirst[4];
/* bf16x2 with LLM_CUDA_MOE_MMA=0: decode batches' expert tiles on the
 * GEMV; with LLM_CUDA_MOE_MMA_BLOCKS=1: on tensor cores, one block an SM */
static backend *G_tiles_gemv, *G_tiles_1sm;
/* bf16x2 with LLM_CUDA_MOE_SIDE=0: decode batches' shared expert on the
 * main stream after the routed experts (G: on a second stream beside them) */
static backend *G_moe_side;
/* bf16x2 with LLM_CUDA_MOE_TILE_M=8: decode batches' w1 and w3 over
 * tiles of up to 8 slots, as w2 (G: 4, x staged in 4 rows) */
static backend *G_tiles_m8;
/* bf16x2 with LLM_CUDA_MOE_L2=0: the expert tiles' weights copied 64 bytes
 * a row and stage, their scales loaded a byte at a time (G: whole 128-byte
 * lines and the scales through shared memory wherever the view is on
 * 512-column boundaries: H = 1024 and 4096's w1 and w3, H = 4096's w2) */
static backend *G_tiles_64;
/* per GEMM mode (bf16x2, fp8), LLM_CUDA_SMALL_MMA=0 (17-64 tokens reach
 * cuBLASLt): FP8 weights also in bf16 (the default) and, with
 * LLM_CUDA_FP8_SHADOW=0, not */
static backend *G_shadow[4], *G_deq[4];
/* per GEMM mode (bf16x2, fp8), LLM_CUDA_SMALL_MMA unset: the default's
 * choices (9-16 tokens: FP8 with its bf16 copy and BF16 of more than
 * 4096 rows on cuBLASLt, lt_first) */
static backend *G_auto[4];
/* appended to the hc tests' names: which sequence of launches G runs */
static const char *hc_variant = "";
/* G's prefill GEMMs (LLM_CUDA_GEMM), and the bound u on the relative
 * change of each activation they multiply (fp8: x of BF16 weights is
 * rounded once, as under bf16) */
enum { GEMM_F32, GEMM_BF16, GEMM_BF16X2, GEMM_FP8 };
static int gemm_mode;
static const char *const gemm_names[] = { "f32", "bf16", "bf16x2", "fp8" };
static double gemm_u(void) { return gemm_mode == GEMM_BF16 || gemm_mode == GEMM_FP8 ? 0x1p-8 : 0x1p-16; }
/* The same for a T-token matmul: decode batches split x in every mode. */
static double gemm_u_at(int T) { return T < LT_MIN_T ? 0x1p-16 : gemm_u(); }
#define FP8_ACC_U 0x1p-13      /* FP8 tensor-core sums within a scale block (header) */
static backend *C8;            /* the CPU backend in its fp8 mode */
static backend *G8;            /* the GPU's fp8 mode, for the indexer's choice */
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

/* d's bytes in fresh host memory, read on backend b (after b's ops) */
static void *hcopy_on(backend *b, const void *d, size_t bytes)
{
    void *h = malloc(bytes + 4);
    b->read(b, h, d, bytes);
    return h;
}

static void *hcopy(const void *d, size_t bytes) { return hcopy_on(G, d, bytes); }

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
static void check_tol(const char *what, const float *got, const float *want, size_t n,
                      double tol)
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
    ok(!e && !bad && rel <= tol, "[%s GEMMs] %s: rel L2 %.2e, max abs %.2e%s%s",
       gemm_names[gemm_mode], what, rel, ma, bad ? " (NaN or unwritten)" : "", e ? e : "");
}

static void check(const char *what, const float *got, const float *want, size_t n)
{
    check_tol(what, got, want, n, TOL);
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

/* x as the bf16 GEMMs of T tokens multiply it: bf16(x), or (bf16x2, and
 * every mode below 64 tokens) hi + lo. */
static float gemm_x(float x, int T)
{
    float hi = bf16_to_f32(f32_to_bf16(x));
    return gemm_u_at(T) == 0x1p-8 ? hi : hi + bf16_to_f32(f32_to_bf16(x - hi));
}

/* A bf16 GEMM's result got [T][N] (y: the CPU's on the exact x): equal to
 * the CPU's on the x it multiplies, and within the rounding bound of y
 * everywhere (header). */
static void bf16_bound(const char *name, const qweight *w, const float *x, int ldx, int T,
                       const float *got, const float *y)
{
    int K = w->cols, N = w->rows;
    float *xr = malloc((size_t)T * ldx * sizeof *xr), *yr = malloc((size_t)T * N * sizeof *yr);
    for (size_t i = 0; i < (size_t)T * ldx; i++) xr[i] = gemm_x(x[i], T);
    C->matmul(C, w, xr, ldx, T, yr, N);
    char what[200];
    snprintf(what, sizeof what, "%s equals the CPU on the x it multiplies", name);
    check_tol(what, got, yr, (size_t)T * N, TOL);
    if (gemm_mode == GEMM_FP8 && T >= LT_MIN_T) {
        /* the reference multiplies that x too */
        float *y8 = malloc((size_t)T * N * sizeof *y8);
        C8->matmul(C8, w, x, ldx, T, y8, N);
        ok(!memcmp(y8, yr, (size_t)T * N * sizeof *y8), "%s: the CPU's fp8 mode is its matmul "
           "on x rounded to bf16", name);
        free(y8);
    }
    float *row = malloc(K * sizeof *row);
    size_t over = 0;
    double worst = 0;
    for (int n = 0; n < N; n++) {
        qweight_row(w, n, 0, K, row);
        for (int t = 0; t < T; t++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += fabs((double)x[(size_t)t * ldx + k] * row[k]);
            double e = fabs((double)got[(size_t)t * N + n] - y[(size_t)t * N + n]);
            double bound = (gemm_u_at(T) + 2.0 * K * 0x1p-24) * s;
            over += !(e <= bound);
            worst = fmax(worst, s > 0 ? e / s : 0);
        }
    }
    ok(!over, "[%s GEMMs] %s: %zu of %d elements past the bound (largest error %.2e of "
       "sum|x||w|, u = %.2e); rel L2 to the float32 product %.2e", gemm_names[gemm_mode], name,
       over, T * N, worst, gemm_u_at(T), rel_err(got, y, (size_t)T * N));
    free(xr), free(yr), free(row);
}

/* The GPU's act_quant (cuda/act_quant.h) against the CPU's: codes, scales
 * and the quantized values as floats byte for byte, outputs poisoned.
 * Groups of random magnitudes (2^-24 to 2^12: scales from the 1e-4 floor
 * up), one all zeros, one of a single value; rows of ldx >= K channels
 * (16-byte accesses where K and ldx are multiples of 4, else 4-byte
 * ones), a short last group where K % 128. */
static void test_act_quant(int T, int K, int ldx)
{
    int ng = (K + ACT_GROUP - 1) / ACT_GROUP, ldq = K + (K % 4 ? 0 : 4), ldo = ldx;
    float *x = malloc((size_t)T * ldx * sizeof *x);
    for (int t = 0; t < T; t++)
        for (int g = 0; g < (ldx + ACT_GROUP - 1) / ACT_GROUP; g++) {
            float mag = ldexpf(1.0f, (int)(rnd() % 37) - 24);
            for (int k = g * ACT_GROUP; k < (g + 1) * ACT_GROUP && k < ldx; k++) {
                float v = frand() * mag;
                if ((t + g) % 11 == 3) v = 0;
                if ((t + g) % 13 == 5) v = k == g * ACT_GROUP + 7 ? -mag : 0;
                x[(size_t)t * ldx + k] = v;
            }
        }
    uint8_t *wq = malloc((size_t)T * ldq + 4);
    float *ws = malloc((size_t)ng * T * sizeof *ws), *wo = malloc((size_t)T * ldo * sizeof *wo);
    float *sc = malloc(ng * sizeof *sc);
    memset(wq, 0xA5, (size_t)T * ldq);
    memcpy(wo, x, (size_t)T * ldo * sizeof *wo);
    for (int t = 0; t < T; t++) {
        act_quant_fp8(x + (size_t)t * ldx, K, wq + (size_t)t * ldq, sc);
        for (int g = 0; g < ng; g++) ws[(size_t)g * T + t] = sc[g];
        act_quant_round(wo + (size_t)t * ldo, K);
    }
    float *dx = dcopy(x, (size_t)T * ldx * 4), *ds = G->alloc(G, (size_t)ng * T * 4);
    float *dout = dcopy(x, (size_t)T * ldo * 4);
    uint8_t *dq = G->alloc(G, (size_t)T * ldq);
    uint8_t *fill = malloc((size_t)T * ldq);
    memset(fill, 0xA5, (size_t)T * ldq);
    G->write(G, dq, fill, (size_t)T * ldq);
    poison(ds, (size_t)ng * T * 4);
    char err[256] = "";
    int rc = cuda_act_quant(dx, ldx, T, K, dq, ldq, ds, NULL, 0, err, sizeof err);
    if (!rc) rc = cuda_act_quant(dx, ldx, T, K, NULL, 0, NULL, dout, ldo, err, sizeof err);
    uint8_t *gq = hcopy(dq, (size_t)T * ldq);
    float *gs = hcopy(ds, (size_t)ng * T * 4), *go = hcopy(dout, (size_t)T * ldo * 4);
    size_t dc = 0, dsc = 0, dvo = 0;
    for (size_t i = 0; i < (size_t)T * ldq; i++) dc += gq[i] != wq[i];
    for (size_t i = 0; i < (size_t)ng * T; i++) dsc += memcmp(&gs[i], &ws[i], 4) != 0;
    for (size_t i = 0; i < (size_t)T * ldo; i++) dvo += memcmp(&go[i], &wo[i], 4) != 0;
    ok(!rc && !dc && !dsc && !dvo, "act_quant T=%d K=%d ldx=%d: the CPU's codes (%zu bytes "
       "differ), scales (%zu) and rounded values (%zu, the row tails untouched) %s", T, K, ldx,
       dc, dsc, dvo, err);
    void *d[] = { dx, ds, dout, dq };
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) G->release(G, d[i]);
    free(x), free(wq), free(ws), free(wo), free(sc), free(fill), free(gq), free(gs), free(go);
}

static void act_quant_cases(void)
{
    test_act_quant(300, 4096, 4096);    /* V4's x, 32 groups: 8 warps a row */
    test_act_quant(257, 1024, 1024);    /* g: 8 groups */
    test_act_quant(70, 1000, 1004);     /* a short last group (104), rows 1004 apart */
    test_act_quant(33, 520, 520);       /* 5 groups: a warp of 1 */
    test_act_quant(9, 1001, 1001);      /* K % 4: 4-byte accesses */
    test_act_quant(5, 64, 66);          /* one short group, ldx % 4 */
}

/* fp8 mode: got [T][N] within the FP8 bound (header) of the CPU's product
 * on act_quant_round(x). */
static void fp8_bound(const char *name, const qweight *w, const float *x, int ldx, int T,
                      const float *got, const float *y)
{
    int K = w->cols, N = w->rows;
    float *xq = malloc((size_t)T * K * sizeof *xq + 4), *yq = malloc((size_t)T * N * sizeof *yq);
    for (int t = 0; t < T; t++) {
        memcpy(xq + (size_t)t * K, x + (size_t)t * ldx, K * sizeof *xq);
        act_quant_round(xq + (size_t)t * K, K);
    }
    C->matmul(C, w, xq, K, T, yq, N);
    float *y8 = malloc((size_t)T * N * sizeof *y8);
    C8->matmul(C8, w, x, ldx, T, y8, N);
    char what[400];
    snprintf(what, sizeof what, "%s: the CPU's fp8 mode is its matmul on act_quant_round(x)", name);
    ok(!memcmp(y8, yq, (size_t)T * N * sizeof *y8), "%s", what);
    float *row = malloc(K * sizeof *row);
    size_t over = 0;
    double worst = 0, u = w->type == QT_FP8 ? FP8_ACC_U : 0;
    for (int n = 0; n < N; n++) {
        qweight_row(w, n, 0, K, row);
        for (int t = 0; t < T; t++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += fabs((double)xq[(size_t)t * K + k] * row[k]);
            double e = fabs((double)got[(size_t)t * N + n] - yq[(size_t)t * N + n]);
            over += !(e <= (u + 2.0 * K * 0x1p-24) * s);
            worst = fmax(worst, s > 0 ? e / s : 0);
        }
    }
    ok(!over, "[fp8 GEMMs] %s: %zu of %d elements past the bound of the CPU's fp8 product "
       "(largest error %.2e of sum|x8||w|, u = %.2e); rel L2 to it %.2e, to the float32 "
       "product %.2e", name, over, T * N, worst, u, rel_err(got, yq, (size_t)T * N),
       rel_err(got, y, (size_t)T * N));
    free(xq), free(yq), free(y8), free(row);
}

/* G's product a of T tokens of x (ldx apart) and cw against the CPU's b
 * within the bound of the path G took: tensor cores (cu_matmul_mma at
 * 9-64 tokens for FP8 and BF16: the backends here set
 * LLM_CUDA_SMALL_MMA=1; past the GEMV's 16 tokens cuBLASLt with x split,
 * backend_cuda.cu) or the GEMV's float32 sums. */
static void mm_check(const char *name, const qweight *cw, const float *x, int ldx, int T,
                     const float *a, const float *b)
{
    bool mma = (T > 8 && T <= LT_MIN_T && (cw->type == QT_FP8 || cw->type == QT_BF16)) ||
               T > GEMV_MAX_T;
    if (gemm_mode == GEMM_FP8 && T >= LT_MIN_T && (cw->type == QT_FP8 || cw->type == QT_MXFP4))
        fp8_bound(name, cw, x, ldx, T, a, b);
    else if (gemm_mode != GEMM_F32 && (T >= LT_MIN_T || mma) && cw->type != QT_F32)
        bf16_bound(name, cw, x, ldx, T, a, b);
    else check(name, a, b, (size_t)T * cw->rows);
}

static void mm_case(const char *what, const qweight *cw, const qweight *gw, int T)
{
    int K = cw->cols, N = cw->rows, ldy = N + 1;
    int ldx = K + (T % 2 ? 4 : 0) + (T > 8 && T < LT_MIN_T && T % 3 == 0);
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
    mm_check(name, cw, x, ldx, T, a, b);
    G->release(G, dx);
    G->release(G, dy);
    free(x), free(yc), free(yg), free(a), free(b);
}

/* matmuls (n matrices in one call, each with its x and y) against one
 * CPU matmul each, within TOL: a list mixing formats (runs of one format
 * and width share a launch), and views of one matrix whose x and y are
 * column slices of one buffer (the grouped output projection).  Few
 * tokens take the GEMV; 20 the one-by-one fallback. */
static void mms_case(const char *what, int n, const qweight *cw, const qweight *gw,
                     const int *xoff, int ldx, const int *yoff, const int *ldy, size_t ylen,
                     bool stacked, bool norm, int T)
{
    /* norm: x (one for all) RMS-normalized with a random weight first */
    /* stacked: y i starts at yoff[i] * T (its own rows), else at yoff[i] */
    int ym = stacked ? T : 1;
    float *x = hrand((size_t)T * ldx, 1.0f), *yc = calloc(ylen * T, sizeof *yc);
    float *dx = dcopy(x, (size_t)T * ldx * 4), *dy = G->alloc(G, ylen * T * 4);
    poison(dy, ylen * T * 4);
    float *nw = norm ? hrand(cw[0].cols, 1.0f) : NULL;
    float *dnw = norm ? dcopy(nw, cw[0].cols * 4) : NULL;
    float *x0 = malloc((size_t)T * ldx * 4);
    memcpy(x0, x, (size_t)T * ldx * 4);
    if (norm) C->rmsnorm(C, x, ldx, T, cw[0].cols, nw, 1e-6f, x, ldx);
    const qweight *gp[8];
    const float *gx[8];
    float *gy[8];
    for (int i = 0; i < n; i++) {
        C->matmul(C, &cw[i], x + xoff[i], ldx, T, yc + (size_t)yoff[i] * ym, ldy[i]);
        gp[i] = &gw[i], gx[i] = dx + xoff[i], gy[i] = dy + (size_t)yoff[i] * ym;
    }
    G->matmuls(G, n, gp, gx, ldx, T, gy, ldy, dnw, 1e-6f);
    float *yg = hcopy(dy, ylen * T * 4);
    float *xg = hcopy(dx, (size_t)T * ldx * 4);
    ok(!memcmp(xg, x0, (size_t)T * ldx * 4) && !G->error(G), "matmuls %s T=%d: x left as it was",
       what, T);
    for (int i = 0; i < n; i++) {
        float *a = pack(yg + (size_t)yoff[i] * ym, T, cw[i].rows, ldy[i]);
        float *b = pack(yc + (size_t)yoff[i] * ym, T, cw[i].rows, ldy[i]);
        char name[160];
        snprintf(name, sizeof name, "matmuls %s: matrix %d of %d (%s %dx%d) T=%d", what, i, n,
                 tname(cw[i].type), cw[i].rows, cw[i].cols, T);
        check(name, a, b, (size_t)T * cw[i].rows);
        free(a), free(b);
    }
    G->release(G, dx), G->release(G, dy);
    if (dnw) G->release(G, dnw);
    free(x), free(x0), free(xg), free(nw), free(yc), free(yg);
}

static void test_matmuls(void)
{
    enum qtype ty[] = { QT_FP8, QT_FP8, QT_BF16, QT_BF16, QT_BF16, QT_MXFP4 };
    int rows[] = { 1024, 512, 300, 64, 5, 70 }, K = 4096, n = 6;
    qweight cw[8], gw[8];
    int xoff[8], yoff[8], ldy[8];
    size_t ylen = 0;
    for (int i = 0; i < n; i++) {
        cw[i] = make_w(ty[i], rows[i], K);
        gw[i] = up(&cw[i]);
        xoff[i] = 0, ldy[i] = rows[i] + i, yoff[i] = (int)ylen;
        ylen += (size_t)ldy[i];
    }
    int Ts[] = { 1, 3, 8, 20 };
    for (int k = 0; k < 4; k++)
        mms_case("mixed formats", n, cw, gw, xoff, K + 4, yoff, ldy, ylen, true, false, Ts[k]);
    /* four groups: rows 96g.. of a bf16 matrix times columns 256g.. of x,
     * into columns 96g.. of one y */
    qweight big = make_w(QT_BF16, 4 * 96, 256), gbig = up(&big);
    for (int g = 0; g < 4; g++) {
        cw[g] = qweight_view(&big, g * 96, 96, 0, 256);
        gw[g] = qweight_view(&gbig, g * 96, 96, 0, 256);
        xoff[g] = g * 256, yoff[g] = g * 96, ldy[g] = 4 * 96 + 3;
    }
    for (int T = 1; T <= 8; T += 7)
        mms_case("groups", 4, cw, gw, xoff, 4 * 256 + 8, yoff, ldy, 4 * 96 + 3, false, false, T);
    /* x RMS-normalized on the way in (q_norm before wq_b and iwq_b): in
     * the one launch (rows of up to 8192 / tokens), else through scratch
     * (2048 columns at 5 tokens, 20 tokens, two formats) */
    int nr[] = { 300, 200 }, nK[] = { 1024, 2048 };
    for (int kk = 0; kk < 2; kk++) {
        size_t yl = 0;
        for (int i = 0; i < 2; i++) {
            cw[i] = make_w(QT_FP8, nr[i], nK[kk]);
            gw[i] = up(&cw[i]);
            xoff[i] = 0, ldy[i] = nr[i] + 1, yoff[i] = (int)yl;
            yl += (size_t)ldy[i];
        }
        int Tn[] = { 1, 3, 5, 8, 20 };
        for (int k = 0; k < 5; k++)
            mms_case("normalized x", 2, cw, gw, xoff, nK[kk] + 4, yoff, ldy, yl, true, true,
                     Tn[k]);
    }
    cw[0] = make_w(QT_FP8, 300, 1024), gw[0] = up(&cw[0]);
    cw[1] = make_w(QT_BF16, 64, 1024), gw[1] = up(&cw[1]);
    ldy[0] = 301, ldy[1] = 64, yoff[0] = 0, yoff[1] = 301;
    mms_case("normalized x, two formats", 2, cw, gw, xoff, 1024, yoff, ldy, 301 + 64, true, true,
             2);
}

static void fp8_shadow_cases(void);
static void matmuls_keep_cases(void);
static void joined_cases(void);
static void batched_cases(void);

static void test_matmul(void)
{
    enum qtype types[] = { QT_F32, QT_BF16, QT_FP8, QT_MXFP4 };
    int Ts[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 64, 70, 300 };
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
        mm_case(what, &v, &gv, 100);
        /* whole 128x128 blocks and token counts cuBLASLt's block-scaled
         * FP8 GEMM takes (fp8 mode; on the H200 it had no algorithm for
         * 300 rows, which take the exact fallback), up to a prefill step */
        if (t == QT_FP8) {
            qweight b8 = make_w(t, 256, 512);
            qweight gb8 = up(&b8);
            int T8[] = { 128, 200, 1024, 8192 };
            for (int i = 0; i < 4; i++) mm_case("fp8 256x512", &b8, &gb8, T8[i]);
        }
        /* a shard on FP8 block boundaries */
        qweight av = qweight_view(&big, 128, 256, 256, 512);
        qweight gav = up(&av);
        snprintf(what, sizeof what, "%s shard rows 128+256 cols 256+512", tname(t));
        mm_case(what, &av, &gav, 100);
        mm_case(what, &av, &gav, 300);
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
        mm_case(what, &o, &go, 65);
        /* decode batches of 9-64 tokens: FP8 and BF16 on tensor cores
         * (matmul_mma.cu, then on the backend with x streamed:
         * matmul_stream.cu, and on wgmma: matmul_wgmma.cu) outside f32
         * mode, the others and f32 on the GEMV; views from inside the
         * 128x128 blocks, a column origin off the blocks but on 16 bytes,
         * the unaligned view (the GEMV's), row and column tails; x rows
         * not 16-byte aligned at T % 3 == 0 */
        backend *kern[4] = { G, gemm_mode == GEMM_F32 ? NULL : G_stream[gemm_mode],
                             gemm_mode == GEMM_F32 ? NULL : G_wgmma[gemm_mode],
                             gemm_mode == GEMM_F32 ? NULL : G_ltfirst[gemm_mode] };
        for (int ki = 0; ki < 4 && (t == QT_FP8 || t == QT_BF16) && kern[ki]; ki++) {
            backend *keep = G;
            G = kern[ki];
            const char *k = ki == 1 ? ", x streamed" : ki == 2 ? ", wgmma"
                            : ki == 3 ? ", the heuristic's algorithm" : "";
            int Tb[] = { 9, 16, 17, 31, 32, 33, 48, 63, 64 };
            qweight ov = qweight_view(&big, 3, 77, 48, 400), gov = up(&ov);
            for (size_t i = 0; i < sizeof Tb / sizeof Tb[0]; i++) {
                snprintf(what, sizeof what, "%s 300x512 (batch%s)", tname(t), k);
                mm_case(what, &w, &g, Tb[i]);
                snprintf(what, sizeof what, "%s shard rows 130+200 cols 256+320 (batch%s)",
                         tname(t), k);
                mm_case(what, &v, &gv, Tb[i]);
                snprintf(what, sizeof what, "%s shard rows 128+256 cols 256+512 (batch%s)",
                         tname(t), k);
                mm_case(what, &av, &gav, Tb[i]);
                snprintf(what, sizeof what, "%s sub-view of a shard (batch%s)", tname(t), k);
                mm_case(what, &sv, &sg, Tb[i]);
                snprintf(what, sizeof what, "%s view rows 3+77 cols 48+400 (batch%s)", tname(t), k);
                mm_case(what, &ov, &gov, Tb[i]);
                snprintf(what, sizeof what, "%s unaligned view (batch%s)", tname(t), k);
                mm_case(what, &o, &go, Tb[i]);
            }
            /* V4-Flash rank shapes: columns over a cluster of 8 blocks
             * (4096), 4096 rows of 1024 columns, a short BF16 matrix, a
             * tall one (one block along the columns) */
            qweight r1 = make_w(t, 1024, 4096), r2 = make_w(t, 4096, 1024);
            qweight r3 = make_w(t, 256, 4096), r4 = make_w(t, 8192, 256);
            qweight gr1 = up(&r1), gr2 = up(&r2), gr3 = up(&r3), gr4 = up(&r4);
            snprintf(what, sizeof what, "%s 1024x4096%s", tname(t), k);
            mm_case(what, &r1, &gr1, 32);
            mm_case(what, &r1, &gr1, 64);
            snprintf(what, sizeof what, "%s 4096x1024%s", tname(t), k);
            mm_case(what, &r2, &gr2, 33);
            mm_case(what, &r2, &gr2, 64);
            snprintf(what, sizeof what, "%s 256x4096%s", tname(t), k);
            mm_case(what, &r3, &gr3, 16);
            mm_case(what, &r3, &gr3, 24);
            snprintf(what, sizeof what, "%s 8192x256%s", tname(t), k);
            mm_case(what, &r4, &gr4, 20);
            mm_case(what, &r4, &gr4, 64);
            G = keep;
        }
        /* GEMV shapes: few rows of long columns (one row per warp, the
         * columns split over warps); x in several shared-memory tiles */
        qweight sr = make_w(t, 5, 4096), lk = make_w(t, 70, 9216);
        qweight gsr = up(&sr), glk = up(&lk);
        snprintf(what, sizeof what, "%s 5x4096", tname(t));
        for (int T = 1; T <= 8; T *= 2) mm_case(what, &sr, &gsr, T);
        snprintf(what, sizeof what, "%s 70x9216", tname(t));
        for (int T = 1; T <= 8; T += 3) mm_case(what, &lk, &glk, T);
    }
    fp8_shadow_cases();
    matmuls_keep_cases();
    joined_cases();
    batched_cases();
}

/* FP8 weights multiplied from their bf16 copy (G_shadow): against the
 * CPU within mm_case's bounds on a whole tensor, a shard and an unaligned
 * view, decode batches past the GEMV and prefill steps; then bit for bit
 * against the per-call dequantization (G_deq) on the whole tensor, whose
 * copy rows are as long as the scratch's (the same GEMM either way). */
static void fp8_shadow_cases(void)
{
    backend *keep = G;
    if (!G_shadow[gemm_mode] || !G_deq[gemm_mode]) return;
    qweight w = make_w(QT_FP8, 300, 512), big = make_w(QT_FP8, 384, 1024);
    qweight v = qweight_view(&big, 130, 200, 256, 320), o = qweight_view(&big, 3, 77, 6, 101);
    int Ts[] = { 17, 33, 64, 100, 300 };
    G = G_deq[gemm_mode];
    qweight dw = up(&w);
    G = G_shadow[gemm_mode];
    qweight gw = up(&w), gv = up(&v), go = up(&o);
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
        int T = Ts[i], K = w.cols, N = w.rows;
        mm_case("fp8 300x512 (bf16 copy)", &w, &gw, T);
        mm_case("fp8 shard rows 130+200 cols 256+320 (bf16 copy)", &v, &gv, T);
        mm_case("fp8 unaligned view (bf16 copy)", &o, &go, T);
        float *x = hrand((size_t)T * K, 1.0f);
        float *dx = dcopy(x, (size_t)T * K * 4), *d1 = G->alloc(G, (size_t)T * N * 4),
              *d2 = G->alloc(G, (size_t)T * N * 4);
        poison(d1, (size_t)T * N * 4), poison(d2, (size_t)T * N * 4);
        G_shadow[gemm_mode]->matmul(G_shadow[gemm_mode], &gw, dx, K, T, d1, N);
        G_deq[gemm_mode]->matmul(G_deq[gemm_mode], &dw, dx, K, T, d2, N);
        float *y1 = hcopy(d1, (size_t)T * N * 4), *y2 = hcopy(d2, (size_t)T * N * 4);
        ok(!memcmp(y1, y2, (size_t)T * N * 4),
           "matmul fp8 300x512 T=%d (%s): bf16 copy = dequantized per call, bit for bit", T,
           gemm_names[gemm_mode]);
        G->release(G, dx), G->release(G, d1), G->release(G, d2);
        free(x), free(y1), free(y2);
    }
    if (G_auto[gemm_mode]) {
        qweight h = make_w(QT_BF16, 4200, 256);
        G = G_auto[gemm_mode];
        qweight aw = up(&w), ah = up(&h);
        for (int T = 9; T <= 16; T += 7) {
            mm_case("fp8 300x512 (default: bf16 copy on cuBLASLt)", &w, &aw, T);
            mm_case("bf16 4200x256 (default: cuBLASLt)", &h, &ah, T);
        }
    }
    G = keep;
}

/* join_weights on the default backend (G_auto): FP8 matrices (their
 * bf16 copies) and BF16 ones of one width laid out as one, which matmuls
 * of one x then multiply as one GEMM from 9 tokens (lt_joined): each
 * matrix's outputs against the CPU within mm_check's bounds (x as it is
 * and RMS-normalized on the way in); each joined matrix alone (its rows'
 * new place read by the GEMV, the small-M kernels and cuBLASLt); a list
 * of two widths left as it is. */
static void joined_cases(void)
{
    backend *B = G_auto[gemm_mode], *keep = G;
    if (!B) return;
    G = B;
    enum qtype ty[] = { QT_FP8, QT_FP8, QT_BF16, QT_BF16, QT_BF16 };
    int rows[] = { 300, 128, 200, 64, 40 }, K = 512, n = 5, ldx = K + 4;
    qweight cw[5], gw[5], *jp[5];
    for (int i = 0; i < n; i++) {
        cw[i] = make_w(ty[i], rows[i], K);
        gw[i] = up(&cw[i]);
        jp[i] = &gw[i];
    }
    ok(B->join_weights(B, jp, n) == 0, "join_weights: %d matrices of width %d (%s)", n, K,
       gemm_names[gemm_mode]);
    qweight o1 = make_w(QT_FP8, 128, K), o2 = make_w(QT_FP8, 128, 2 * K);
    qweight go[2] = { up(&o1), up(&o2) }, *gop[2] = { &go[0], &go[1] };
    ok(B->join_weights(B, gop, 2) == 1, "join_weights: widths %d and %d left as they are", K,
       2 * K);
    int Ts[] = { 9, 16, 33, 64, 100 };
    for (int norm = 0; norm < 2; norm++)
        for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++) {
            int T = Ts[k], ld = 301;
            float *x = hrand((size_t)T * ldx, 1.0f), *nw = norm ? hrand(K, 1.0f) : NULL;
            float *dx = dcopy(x, (size_t)T * ldx * 4), *dnw = norm ? dcopy(nw, K * 4) : NULL;
            size_t yb = (size_t)n * T * ld * 4;
            float *dy = B->alloc(B, yb), *yc = calloc((size_t)n * T * ld, 4);
            poison(dy, yb);
            if (norm) C->rmsnorm(C, x, ldx, T, K, nw, 1e-6f, x, ldx);
            const qweight *gp[5];
            const float *gx[5];
            float *gy[5];
            int ldy[5];
            for (int i = 0; i < n; i++) {
                gp[i] = &gw[i], gx[i] = dx, gy[i] = dy + (size_t)i * T * ld, ldy[i] = ld;
                C->matmul(C, &cw[i], x, ldx, T, yc + (size_t)i * T * ld, ld);
            }
            B->matmuls(B, n, gp, gx, ldx, T, gy, ldy, dnw, 1e-6f);
            float *yg = hcopy(dy, yb);
            for (int i = 0; i < n; i++) {
                char name[160];
                snprintf(name, sizeof name, "matmuls joined%s: matrix %d (%s %dx%d) T=%d",
                         norm ? ", x normalized" : "", i, tname(ty[i]), rows[i], K, T);
                float *a = pack(yg + (size_t)i * T * ld, T, rows[i], ld);
                float *b = pack(yc + (size_t)i * T * ld, T, rows[i], ld);
                mm_check(name, &cw[i], x, ldx, T, a, b);
                free(a), free(b);
            }
            B->release(B, dx), B->release(B, dy);
            if (dnw) B->release(B, dnw);
            free(x), free(nw), free(yc), free(yg);
        }
    int Ta[] = { 1, 12, 64 };
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 3; k++)
            mm_case(ty[i] == QT_FP8 ? "fp8 joined" : "bf16 joined", &cw[i], &gw[i], Ta[k]);
    G = keep;
}

/* matmuls of views of one matrix (rows 128g.. of a BF16 matrix and of an
 * FP8 one with its bf16 copy), each times its own columns of x, into its
 * own columns of y (the grouped output projection wo_a) on the default
 * backend (G_auto): from 9 tokens the views as one strided-batched GEMM
 * (lt_batched); x's slices a fixed step apart or not (one by one), each
 * view against the CPU within mm_check's bounds. */
static void batched_cases(void)
{
    backend *B = G_auto[gemm_mode], *keep = G;
    if (!B) return;
    G = B;
    enum qtype ty[] = { QT_BF16, QT_FP8 };
    int n = 4, N = 128, K = 256, ldx = 4 * 300 + 8, ldy = 4 * N + 3;
    int steps[2][4] = { { 0, 256, 512, 768 }, { 0, 300, 520, 900 } };
    for (int f = 0; f < 2; f++) {
        qweight big = make_w(ty[f], n * N, K), gbig = up(&big), cw[4], gw[4];
        for (int g = 0; g < n; g++) {
            cw[g] = qweight_view(&big, g * N, N, 0, K);
            gw[g] = qweight_view(&gbig, g * N, N, 0, K);
        }
        int Ts[] = { 9, 16, 33, 64 };
        for (int st = 0; st < 2; st++)
            for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++) {
                int T = Ts[k];
                float *x = hrand((size_t)T * ldx, 1.0f), *dx = dcopy(x, (size_t)T * ldx * 4);
                float *dy = B->alloc(B, (size_t)T * ldy * 4), *yc = calloc((size_t)T * ldy, 4);
                poison(dy, (size_t)T * ldy * 4);
                const qweight *gp[4];
                const float *gx[4];
                float *gy[4];
                int ldys[4];
                for (int g = 0; g < n; g++) {
                    C->matmul(C, &cw[g], x + steps[st][g], ldx, T, yc + g * N, ldy);
                    gp[g] = &gw[g], gx[g] = dx + steps[st][g], gy[g] = dy + g * N, ldys[g] = ldy;
                }
                B->matmuls(B, n, gp, gx, ldx, T, gy, ldys, NULL, 0);
                float *yg = hcopy(dy, (size_t)T * ldy * 4);
                ok(!B->error(B), "matmuls of %s views, x %s: no error (%s)", tname(ty[f]),
                   st ? "slices apart unevenly" : "a slice each", B->error(B) ? B->error(B) : "");
                for (int g = 0; g < n; g++) {
                    char name[160];
                    snprintf(name, sizeof name, "matmuls of %s views, x %s: view %d T=%d",
                             tname(ty[f]), st ? "slices apart unevenly" : "a slice each", g, T);
                    float *a = pack(yg + g * N, T, N, ldy), *b = pack(yc + g * N, T, N, ldy);
                    mm_check(name, &cw[g], x + steps[st][g], ldx, T, a, b);
                    free(a), free(b);
                }
                B->release(B, dx), B->release(B, dy);
                free(x), free(yc), free(yg);
            }
    }
    G = keep;
}

/* matmuls through cuBLASLt (G_shadow: 17+ tokens there) split a shared x
 * into bf16 parts once for the whole list: its outputs equal each matrix's
 * own matmul bit for bit, for lists sharing x (mixed formats and widths
 * of rows) and lists whose x differ (column slices of one buffer, where
 * no split may be reused), at decode-batch and prefill token counts. */
static void matmuls_keep_cases(void)
{
    backend *B = G_shadow[gemm_mode];
    if (!B) return;
    enum qtype ty[] = { QT_FP8, QT_BF16, QT_FP8, QT_BF16 };
    int rows[] = { 1024, 300, 512, 64 }, K = 1024, n = 4, ldx = 4 * K + 4;
    qweight w[4], g[4];
    for (int i = 0; i < n; i++) {
        w[i] = make_w(ty[i], rows[i], K);
        g[i] = w[i];
        if (B->upload_weights(B, &g[i], 1)) diag("upload: %s", B->error(B));
    }
    int Ts[] = { 20, 33, 64, 100 };
    for (int sl = 0; sl < 2; sl++)
        for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++) {
            int T = Ts[k], ld = 1100;
            float *x = hrand((size_t)T * ldx, 1.0f), *dx = dcopy(x, (size_t)T * ldx * 4);
            size_t yb = (size_t)T * ld * n * 4;
            float *d1 = B->alloc(B, yb), *d2 = B->alloc(B, yb);
            poison(d1, yb), poison(d2, yb);
            const qweight *gp[4];
            const float *gx[4];
            float *gy[4];
            int ldy[4];
            for (int i = 0; i < n; i++) {
                gp[i] = &g[i], gx[i] = dx + (sl ? (size_t)i * K : 0);
                gy[i] = d1 + (size_t)i * T * ld, ldy[i] = ld;
                B->matmul(B, &g[i], gx[i], ldx, T, d2 + (size_t)i * T * ld, ld);
            }
            B->matmuls(B, n, gp, gx, ldx, T, gy, ldy, NULL, 0);
            float *y1 = hcopy(d1, yb), *y2 = hcopy(d2, yb);
            bool same = true;
            for (int i = 0; i < n; i++)
                for (int t = 0; t < T; t++) {
                    size_t o = (size_t)i * T * ld + (size_t)t * ld;
                    same &= !memcmp(y1 + o, y2 + o, rows[i] * 4);
                }
            ok(same && !B->error(B), "matmuls (%s, x %s) T=%d = one matmul each, bit for bit",
               gemm_names[gemm_mode], sl ? "column slices" : "shared", T);
            B->release(B, dx), B->release(B, d1), B->release(B, d2);
            free(x), free(y1), free(y2);
        }
}

/* ---- row ops ---- */

/* row_argmax (the logits' greedy choice where they are) against the rule
 * itself and the CPU backend, bit for bit: random rows, a maximum held
 * twice (the lower column), all -inf and all NaN (-inf, -1), NaN around
 * one value, +inf twice, the maximum in the last column; V4-Flash's rank
 * vocabulary and a short row, columns from v0 = 1000. */
static void test_row_argmax(void)
{
    int nvs[] = { 64640, 5 }, rows = 7, v0 = 1000;
    for (int k = 0; k < 2; k++) {
        int nv = nvs[k];
        float *x = hrand((size_t)rows * nv, 10.0f);
        float *r1 = x + nv, *r2 = x + 2 * nv, *r3 = x + 3 * nv, *r4 = x + 4 * nv;
        float *r5 = x + 5 * nv, *r6 = x + 6 * nv;
        r1[nv / 3] = r1[nv - 1] = 50.0f;
        for (int j = 0; j < nv; j++) r2[j] = -INFINITY, r3[j] = NAN, r5[j] = NAN;
        r3[nv / 2] = -3.0f;
        r4[1] = r4[nv - 2] = INFINITY;
        r6[nv - 1] = 100.0f;
        float want_v[7], cv[7], gv[7];
        int32_t want_i[7], ci[7], gi[7];
        for (int r = 0; r < rows; r++) {
            float best = -INFINITY;
            int at = -1;
            for (int j = 0; j < nv; j++)
                if (x[(size_t)r * nv + j] > best) best = x[(size_t)r * nv + j], at = v0 + j;
            want_v[r] = best, want_i[r] = at;
        }
        C->row_argmax(C, x, rows, nv, v0, cv, ci);
        float *dx = dcopy(x, (size_t)rows * nv * 4);
        G->row_argmax(G, dx, rows, nv, v0, gv, gi);
        ok(!memcmp(cv, want_v, sizeof cv) && !memcmp(ci, want_i, sizeof ci),
           "row_argmax nv=%d: CPU = the greedy rule (row 1 at %d, row 2 %d, row 4 %d)", nv,
           ci[1] - v0, ci[2], ci[4] - v0);
        ok(!memcmp(gv, want_v, sizeof gv) && !memcmp(gi, want_i, sizeof gi) && !G->error(G),
           "row_argmax nv=%d: CUDA = the greedy rule, bit for bit (rows %d %d %d %d %d %d %d)",
           nv, gi[0], gi[1], gi[2], gi[3], gi[4], gi[5], gi[6]);
        /* issued first (as inside a decode step's graph), then read; a
         * second issue for other rows replaces the first (rows 1.. read
         * as the direct call reads them) */
        float iv[7];
        int32_t ii[7];
        memset(iv, 0, sizeof iv), memset(ii, 0, sizeof ii);
        G->row_argmax_issue(G, dx, rows, nv);
        G->row_argmax(G, dx, rows, nv, v0, iv, ii);
        bool same = !memcmp(iv, want_v, sizeof iv) && !memcmp(ii, want_i, sizeof ii);
        G->row_argmax_issue(G, dx, rows, nv);
        G->row_argmax_issue(G, dx + nv, rows - 1, nv);
        G->row_argmax(G, dx + nv, rows - 1, nv, v0, iv, ii);
        same = same && !memcmp(iv, want_v + 1, 6 * sizeof *iv) &&
               !memcmp(ii, want_i + 1, 6 * sizeof *ii);
        G->row_argmax(G, dx, rows, nv, v0, iv, ii);     /* not issued: computed */
        same = same && !memcmp(iv, want_v, sizeof iv) && !memcmp(ii, want_i, sizeof ii);
        ok(same && !G->error(G),
           "row_argmax nv=%d: issued then read (row_argmax_issue) = the direct call, bit for bit",
           nv);
        G->release(G, dx);
        free(x);
    }
}

/* embed against the CPU: one copy of each row, and four (the mHC's
 * streams), each copy the row itself */
static void test_embed(void)
{
    qweight w = make_w(QT_BF16, 500, 192);
    qweight g = up(&w);
    int T = 7;
    int32_t ids[7] = { 0, 499, 17, 17, 250, 3, 111 };
    for (int copies = 1; copies <= 4; copies += 3) {
        size_t n = (size_t)T * copies * 192;
        float *yc = malloc(n * 4), *row = malloc(192 * 4);
        C->embed(C, &w, ids, T, copies, yc);
        float *dy = G->alloc(G, n * 4);
        poison(dy, n * 4);
        G->embed(G, &g, ids, T, copies, dy);
        float *yg = hcopy(dy, n * 4);
        char name[80];
        snprintf(name, sizeof name, "embed bf16 500x192 T=7, %d cop%s", copies,
                 copies > 1 ? "ies" : "y");
        check(name, yg, yc, n);
        bool rows = true;
        for (int t = 0; t < T; t++) {
            qweight_row(&w, ids[t], 0, 192, row);
            for (int k = 0; k < copies; k++)
                rows &= !memcmp(yc + ((size_t)t * copies + k) * 192, row, 192 * 4);
        }
        ok(rows, "%s: the CPU's copies are the rows of w", name);
        G->release(G, dy);
        free(yc), free(yg), free(row);
    }
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
    snprintf(name, sizeof name, "hc_pre post T=%d hc=%d H=%d%s", T, hc, H, hc_variant);
    check(name, g, post, (size_t)T * hc);
    free(g);
    g = hcopy(dcomb, (size_t)T * hc * hc * 4);
    snprintf(name, sizeof name, "hc_pre comb (Sinkhorn) T=%d hc=%d%s", T, hc, hc_variant);
    check(name, g, comb, (size_t)T * hc * hc);
    free(g);
    g = hcopy(dcol, (size_t)T * H * 4);
    snprintf(name, sizeof name, "hc_pre collapsed T=%d hc=%d H=%d%s", T, hc, H, hc_variant);
    check(name, g, col, (size_t)T * H);
    free(g);

    C->hc_post(C, h, y, post, comb, T, hc, H);
    G->hc_post(G, dh, dyy, dpost, dcomb, T, hc, H);
    g = hcopy(dh, (size_t)T * n * 4);
    snprintf(name, sizeof name, "hc_post T=%d hc=%d H=%d%s", T, hc, H, hc_variant);
    check(name, g, h, (size_t)T * n);
    free(g);

    poison(dcol, (size_t)T * H * 4);
    C->hc_head(C, h, T, hc, H, fn, base, scale, 1e-6f, 1e-6f, col);
    G->hc_head(G, dh, T, hc, H, dfn, dbase, dscale, 1e-6f, 1e-6f, dcol);
    g = hcopy(dcol, (size_t)T * H * 4);
    snprintf(name, sizeof name, "hc_head T=%d hc=%d H=%d%s", T, hc, H, hc_variant);
    check(name, g, col, (size_t)T * H);
    free(g);
    void *dev[] = { dh, dfn, dbase, dscale, dyy, dpost, dcomb, dcol };
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) G->release(G, dev[i]);
    free(h), free(fn), free(base), free(scale), free(y), free(post), free(comb), free(col);
}

/* hc_pre_norm against the CPU's hc_post (with y: the previous sublayer's
 * output, post and comb), hc_pre, then rmsnorm: the streams, post, comb,
 * collapsed and normed rows within TOL.  Run twice on fresh inputs with
 * outputs poisoned each time: the one-launch kernel's per-token counters
 * must be left ready for the next launch. */
static void test_hc_pre_norm(int T, int hc, int H, bool weight, bool with_y)
{
    int mix = (2 + hc) * hc, n = hc * H;
    for (int run = 0; run < 2; run++) {
        float *h = hrand((size_t)T * n, 1.0f), *fn = hrand((size_t)mix * n, 0.05f);
        float *base = hrand(mix, 0.5f), *scale = hrand(3, 1.0f);
        float *w = weight ? hrand(H, 1.0f) : NULL;
        float *y = hrand((size_t)T * H, 1.0f);
        float *post = hrand((size_t)T * hc, 1.0f), *comb = hrand((size_t)T * hc * hc, 0.5f);
        float *col = malloc((size_t)T * H * 4), *xn = malloc((size_t)T * H * 4);
        float *dh = dcopy(h, (size_t)T * n * 4), *dfn = dcopy(fn, (size_t)mix * n * 4);
        float *dbase = dcopy(base, mix * 4), *dscale = dcopy(scale, 12);
        float *dw = w ? dcopy(w, H * 4) : NULL, *dy = dcopy(y, (size_t)T * H * 4);
        float *dpost = dcopy(post, (size_t)T * hc * 4);
        float *dcomb = dcopy(comb, (size_t)T * hc * hc * 4);
        float *dcol = G->alloc(G, (size_t)T * H * 4), *dxn = G->alloc(G, (size_t)T * H * 4);
        if (!with_y) {
            poison(dpost, (size_t)T * hc * 4);
            poison(dcomb, (size_t)T * hc * hc * 4);
        }
        poison(dcol, (size_t)T * H * 4);
        poison(dxn, (size_t)T * H * 4);
        if (with_y) C->hc_post(C, h, y, post, comb, T, hc, H);
        C->hc_pre(C, h, T, hc, H, fn, base, scale, 20, 1e-6f, 1e-6f, post, comb, col);
        C->rmsnorm(C, col, H, T, H, w, 1e-6f, xn, H);
        G->hc_pre_norm(G, dh, with_y ? dy : NULL, T, hc, H, dfn, dbase, dscale, 20, 1e-6f, 1e-6f,
                       dpost, dcomb, dcol, dw, dxn);
        const float *want[] = { post, comb, col, xn, h };
        float *dev[] = { dpost, dcomb, dcol, dxn, dh };
        size_t len[] = { (size_t)T * hc, (size_t)T * hc * hc, (size_t)T * H, (size_t)T * H,
                         (size_t)T * n };
        const char *what[] = { "post", "comb (Sinkhorn)", "collapsed", "normed", "streams" };
        for (int i = 0; i < 5; i++) {
            char name[128];
            float *g = hcopy(dev[i], len[i] * 4);
            snprintf(name, sizeof name, "hc_pre_norm %s T=%d hc=%d H=%d%s%s%s, run %d", what[i],
                     T, hc, H, weight ? " weighted" : "", with_y ? " after hc_post" : "",
                     hc_variant, run + 1);
            check(name, g, want[i], len[i]);
            free(g);
        }
        void *d[] = { dh, dfn, dbase, dscale, dw, dy, dpost, dcomb, dcol, dxn };
        for (size_t i = 0; i < sizeof d / sizeof d[0]; i++)
            if (d[i]) G->release(G, d[i]);
        free(h), free(fn), free(base), free(scale), free(w), free(y), free(post), free(comb),
            free(col), free(xn);
    }
}

/* hc_head_norm (the model's last collapse: hc_post with y, hc_head, the
 * final RMSNorm, one launch of hc_pre_norm's clusters) against the CPU's
 * three ops: streams, collapsed and normed rows within TOL; post and comb
 * read, not written.  A few tokens at hc = 4: the backend must take it. */
static void test_hc_head_norm(int T, int H, bool with_y)
{
    int hc = 4, n = hc * H;
    float *h = hrand((size_t)T * n, 1.0f), *fn = hrand((size_t)hc * n, 0.05f);
    float *base = hrand(hc, 0.5f), *scale = hrand(1, 1.0f), *w = hrand(H, 1.0f);
    float *y = hrand((size_t)T * H, 1.0f);
    float *post = hrand((size_t)T * hc, 1.0f), *comb = hrand((size_t)T * hc * hc, 0.5f);
    float *col = malloc((size_t)T * H * 4), *xn = malloc((size_t)T * H * 4);
    float *dh = dcopy(h, (size_t)T * n * 4), *dfn = dcopy(fn, (size_t)hc * n * 4);
    float *dbase = dcopy(base, hc * 4), *dscale = dcopy(scale, 4), *dw = dcopy(w, H * 4);
    float *dy = dcopy(y, (size_t)T * H * 4), *dpost = dcopy(post, (size_t)T * hc * 4);
    float *dcomb = dcopy(comb, (size_t)T * hc * hc * 4);
    float *dcol = G->alloc(G, (size_t)T * H * 4), *dxn = G->alloc(G, (size_t)T * H * 4);
    poison(dcol, (size_t)T * H * 4);
    poison(dxn, (size_t)T * H * 4);
    if (with_y) C->hc_post(C, h, y, post, comb, T, hc, H);
    C->hc_head(C, h, T, hc, H, fn, base, scale, 1e-6f, 1e-6f, col);
    C->rmsnorm(C, col, H, T, H, w, 1e-6f, xn, H);
    bool done = G->hc_head_norm &&
                G->hc_head_norm(G, dh, with_y ? dy : NULL, dpost, dcomb, T, hc, H, dfn, dbase,
                                dscale, 1e-6f, 1e-6f, dcol, dw, dxn);
    char name[128];
    snprintf(name, sizeof name, "hc_head_norm T=%d H=%d%s: one launch", T, H,
             with_y ? " after hc_post" : "");
    ok(done && !G->error(G), "%s", name);
    const float *want[] = { col, xn, h, post, comb };
    float *dev[] = { dcol, dxn, dh, dpost, dcomb };
    size_t len[] = { (size_t)T * H, (size_t)T * H, (size_t)T * n, (size_t)T * hc,
                     (size_t)T * hc * hc };
    const char *what[] = { "collapsed", "normed", "streams", "post (unchanged)",
                           "comb (unchanged)" };
    for (int i = 0; done && i < 5; i++) {
        float *g = hcopy(dev[i], len[i] * 4);
        snprintf(name, sizeof name, "hc_head_norm %s T=%d H=%d%s", what[i], T, H,
                 with_y ? " after hc_post" : "");
        check(name, g, want[i], len[i]);
        free(g);
    }
    void *d[] = { dh, dfn, dbase, dscale, dw, dy, dpost, dcomb, dcol, dxn };
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) G->release(G, d[i]);
    free(h), free(fn), free(base), free(scale), free(w), free(y), free(post), free(comb),
        free(col), free(xn);
}

/* The last collapse at decode batches' sizes: rank shapes (H = 4096) and
 * the most tokens the backend takes it for (below HC_MANY_MIN_T, 20:
 * more go through the many-token mHC path). */
static void hc_head_cases(bool with_y)
{
    test_hc_head_norm(1, 4096, with_y);
    test_hc_head_norm(2, 4096, with_y);
    test_hc_head_norm(8, 4096, with_y);
    test_hc_head_norm(19, 1024, with_y);
}

/* hc_pre_norm on G and on O (LLM_CUDA_HC_PRE_TAIL=0: the last block as
 * before) from the same inputs, outputs poisoned: every output equal bit
 * for bit (the tail path changes where loads are issued and who waits,
 * not the operations or their order).  nocol: G's collapsed rows not
 * asked for (NULL), the other outputs still O's. */
static void test_hc_pre_norm_as(backend *O, int T, int hc, int H, bool with_y, bool nocol)
{
    int mix = (2 + hc) * hc, n = hc * H;
    float *h = hrand((size_t)T * n, 1.0f), *fn = hrand((size_t)mix * n, 0.05f);
    float *base = hrand(mix, 0.5f), *scale = hrand(3, 1.0f), *w = hrand(H, 1.0f);
    float *y = hrand((size_t)T * H, 1.0f);
    float *post = hrand((size_t)T * hc, 1.0f), *comb = hrand((size_t)T * hc * hc, 0.5f);
    size_t len[] = { (size_t)T * hc, (size_t)T * hc * hc, (size_t)T * H, (size_t)T * H,
                     (size_t)T * n };
    float *out[2][5];
    backend *B[2] = { G, O }, *g0 = G;
    for (int k = 0; k < 2; k++) {
        backend *b = G = B[k];      /* poison and hcopy go through G */
        float *dh = b->alloc(b, (size_t)T * n * 4), *dfn = b->alloc(b, (size_t)mix * n * 4);
        float *dbase = b->alloc(b, mix * 4), *dscale = b->alloc(b, 12), *dw = b->alloc(b, H * 4);
        float *dy = b->alloc(b, (size_t)T * H * 4), *dpost = b->alloc(b, len[0] * 4);
        float *dcomb = b->alloc(b, len[1] * 4), *dcol = b->alloc(b, len[2] * 4);
        float *dxn = b->alloc(b, len[3] * 4);
        b->write(b, dh, h, (size_t)T * n * 4), b->write(b, dfn, fn, (size_t)mix * n * 4);
        b->write(b, dbase, base, mix * 4), b->write(b, dscale, scale, 12);
        b->write(b, dw, w, H * 4), b->write(b, dy, y, (size_t)T * H * 4);
        if (with_y) {
            b->write(b, dpost, post, len[0] * 4), b->write(b, dcomb, comb, len[1] * 4);
        } else {
            poison(dpost, len[0] * 4), poison(dcomb, len[1] * 4);
        }
        poison(dcol, len[2] * 4), poison(dxn, len[3] * 4);
        b->hc_pre_norm(b, dh, with_y ? dy : NULL, T, hc, H, dfn, dbase, dscale, 20, 1e-6f, 1e-6f,
                       dpost, dcomb, nocol && k == 0 ? NULL : dcol, dw, dxn);
        float *dev[] = { dpost, dcomb, dcol, dxn, dh };
        for (int i = 0; i < 5; i++) out[k][i] = hcopy(dev[i], len[i] * 4);
        void *d[] = { dh, dfn, dbase, dscale, dw, dy, dpost, dcomb, dcol, dxn };
        for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) b->release(b, d[i]);
    }
    G = g0;
    size_t differ = 0;
    for (int i = 0; i < 5; i++) {
        for (size_t j = 0; j < len[i] && !(nocol && i == 2); j++)
            differ += memcmp(&out[0][i][j], &out[1][i][j], 4) != 0;
        free(out[0][i]), free(out[1][i]);
    }
    ok(!differ && !G->error(G) && !O->error(O), "hc_pre_norm T=%d hc=%d H=%d%s%s: the same bits "
       "as with LLM_CUDA_HC_PRE_TAIL=0 (%zu values differ)", T, hc, H,
       with_y ? " after hc_post" : "", nocol ? ", collapsed not asked for" : "", differ);
    free(h), free(fn), free(base), free(scale), free(w), free(y), free(post), free(comb);
}

static void test_hc_pre_norm_same(backend *O, int T, int hc, int H, bool with_y)
{
    test_hc_pre_norm_as(O, T, hc, H, with_y, false);
}

/* ---- paged rows on both sides ---- */

typedef struct {
    int nblk, per_block, row_len;
    enum kv_dtype dtype;
    size_t off, block_bytes;
    char *hbase, *dbase;
    char **hblocks, **dblocks;
} pages;

static const char *dname(enum kv_dtype t)
{
    return t == KV_F32 ? "f32" : t == KV_BF16 ? "bf16" : "fp8";
}

/* Blocks of per_block rows stored as t; random: rows of random floats
 * stored through the CPU's encoder. */
static pages pages_new(int nrows, int per_block, int row_len, bool random, enum kv_dtype t)
{
    pages p = { .per_block = per_block, .row_len = row_len, .dtype = t, .off = 32 };
    p.nblk = nrows / per_block + 1;
    p.block_bytes = p.off + kv_region_bytes(t, per_block, row_len);
    size_t all = (size_t)p.nblk * p.block_bytes;
    p.hbase = calloc(all, 1);
    p.hblocks = malloc(p.nblk * sizeof *p.hblocks);
    p.dblocks = malloc(p.nblk * sizeof *p.dblocks);
    p.dbase = G->alloc(G, all);
    /* blocks out of order, as a pool hands them out */
    for (int i = 0; i < p.nblk; i++) {
        int b = (i * 7 + 3) % p.nblk;
        if (p.nblk % 7 == 0) b = i;
        p.hblocks[i] = p.hbase + (size_t)b * p.block_bytes;
        p.dblocks[i] = p.dbase + (size_t)b * p.block_bytes;
    }
    if (random) {
        float *row = malloc(row_len * sizeof *row);
        for (int r = 0; r < p.nblk * per_block; r++) {
            for (int c = 0; c < row_len; c++) row[c] = frand();
            kv_store(t, p.hblocks[r / per_block] + p.off, per_block, row_len, r % per_block, row);
        }
        free(row);
    }
    G->write(G, p.dbase, p.hbase, all);
    return p;
}

static paged_rows pages_rows(const pages *p, bool dev)
{
    return (paged_rows){ dev ? p->dblocks : p->hblocks, p->off, p->per_block, p->row_len,
                         p->dtype };
}

static void pages_free(pages *p)
{
    G->release(G, p->dbase);
    free(p->hbase), free(p->hblocks), free(p->dblocks);
}

/* Every row one of `distinct` random rows (host and device): the
 * indexer's scores of a token then take at most `distinct` values, each
 * shared by about nrows / distinct entries spread over the whole range
 * (exact ties on both backends: the same row, the same arithmetic). */
static void pages_repeat(pages *p, int distinct)
{
    float *rows = hrand((size_t)distinct * p->row_len, 1.0f);
    for (int r = 0; r < p->nblk * p->per_block; r++)
        kv_store(p->dtype, p->hblocks[r / p->per_block] + p->off, p->per_block, p->row_len,
                 r % p->per_block, rows + (size_t)(rnd() % distinct) * p->row_len);
    G->write(G, p->dbase, p->hbase, (size_t)p->nblk * p->block_bytes);
    free(rows);
}

/* `count` rows (host and device) made random rows times 2^20: their
 * scores (those of them that come out positive) lie 20 binades above the
 * rest, so the k-th best key of a token lies below the staged top-k's
 * bins (its radix passes then choose). */
static void pages_outliers(pages *p, int count)
{
    float *row = hrand(p->row_len, 1048576.0f);
    for (int i = 0; i < count; i++) {
        int r = (int)(rnd() % (unsigned)(p->nblk * p->per_block));
        kv_store(p->dtype, p->hblocks[r / p->per_block] + p->off, p->per_block, p->row_len,
                 r % p->per_block, row);
    }
    G->write(G, p->dbase, p->hbase, (size_t)p->nblk * p->block_bytes);
    free(row);
}

/* ---- compressor: a sequence fed in chunks, state and entries compared
 * after every chunk ---- */

/* Stored entries (bf16, fp8) element by element.  Before rounding, the
 * GPU's float32 row and the CPU's agree within TOL of the row's L2 norm
 * (the float32 kernels' bound: pre); rounding then moves each value by at
 * most one step of the format at its magnitude m: 2^-7 m (bf16); 2^-3 m
 * (e4m3) at the coarser of two group scales that may differ by a power of
 * two when the group's amax sits on a boundary, or for subnormal codes
 * 2^-9 of the scale, below 2 amax / 448.  An element past that bound is
 * wrong.  (A bound on one element relative to itself alone fails for
 * elements near zero, where pre dominates.) */
static bool entry_close(enum kv_dtype t, float g, float c, float amax, double pre)
{
    double m = fmax(fabs(g), fabs(c)), e = fabs((double)g - c);
    if (t == KV_BF16) return e <= 0x1p-7 * m + pre;
    return e <= 0x1p-3 * m + 0x1p-9 * 2 * amax / 448 + pre;
}

/* Elements of rows [rows][d] past entry_close (groups of KV_FP8_GROUP). */
static size_t entries_far(enum kv_dtype t, const float *g, const float *c, int rows, int d)
{
    size_t far = 0;
    for (int r = 0; r < rows; r++) {
        const float *gr = g + (size_t)r * d, *cr = c + (size_t)r * d;
        double nrm = 0;
        for (int j = 0; j < d; j++) nrm += (double)cr[j] * cr[j];
        double pre = TOL * sqrt(nrm);
        for (int i = 0; i < d; i += KV_FP8_GROUP) {
            int n = d - i < KV_FP8_GROUP ? d - i : KV_FP8_GROUP;
            float amax = 0;
            for (int j = i; j < i + n; j++) amax = fmaxf(amax, fmaxf(fabsf(gr[j]), fabsf(cr[j])));
            for (int j = i; j < i + n; j++) far += !entry_close(t, gr[j], cr[j], amax, pre);
        }
    }
    return far;
}

/* Decoded entries: float32 within TOL; bf16 and fp8 element by element
 * (entries_far).  The relative L2 error of all entries is printed. */
static void test_compress(int ratio, bool overlap, int d, int npairs, const int *chunks, int nch,
                          enum kv_dtype t)
{
    int coff = overlap ? 2 : 1, wd = coff * d, ld = wd + 2, total = 0;
    size_t diff_bytes = 0;
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
    pages pg = pages_new(total / ratio, 3, d, false, t);
    int pos = 0, bad_chunk = -1;
    double worst_s = 0, worst_e = 0;
    size_t far = 0;
    for (int i = 0; i < nch && bad_chunk < 0; i++) {
        int n = chunks[i];
        compress_args a = { .n = n, .pos0 = pos, .ratio = ratio, .d = d, .overlap = overlap,
                            .kv = kv + (size_t)pos * ld, .gate = gate + (size_t)pos * ld,
                            .ld = ld, .ape = ape, .norm = norm, .eps = 1e-6f, .rope = &rt,
                            .state = state, .out = pages_rows(&pg, false) };
        C->compress(C, &a, 1);
        a.kv = dkv + (size_t)pos * ld, a.gate = dgate + (size_t)pos * ld;
        a.ape = dape, a.norm = dnorm, a.state = dstate, a.out = pages_rows(&pg, true);
        G->compress(G, &a, 1);
        pos += n;
        /* the whole state and every entry so far */
        int ne = pos / ratio;
        float *gs = hcopy(dstate, sf * 4);
        float *ec = malloc((size_t)(ne + 1) * d * 4), *eg = malloc((size_t)(ne + 1) * d * 4);
        paged_rows hr = pages_rows(&pg, false), dr = pages_rows(&pg, true);
        char *blocks = hcopy(pg.dbase, (size_t)pg.nblk * pg.block_bytes);
        for (int e = 0; e < ne; e++) {
            paged_load(&hr, e, ec + (size_t)e * d);
            size_t at = (size_t)(paged_region(&dr, e) - pg.dbase);
            kv_load(t, blocks + at, pg.per_block, d, e % pg.per_block, eg + (size_t)e * d);
        }
        if (i == nch - 1)
            for (size_t b = 0; b < (size_t)pg.nblk * pg.block_bytes; b++)
                diff_bytes += blocks[b] != pg.hbase[b];
        free(blocks);
        double rs_ = rel_err(gs, state, sf), re = rel_err(eg, ec, (size_t)ne * d);
        worst_s = fmax(worst_s, rs_);
        worst_e = fmax(worst_e, re);
        size_t nf = t == KV_F32 ? 0 : entries_far(t, eg, ec, ne, d);
        far += nf;
        if (!(rs_ <= TOL && (t == KV_F32 ? re <= TOL : !nf))) bad_chunk = i;
        free(gs), free(ec), free(eg);
    }
    ok(bad_chunk < 0 && !G->error(G), "compress ratio=%d %s d=%d %s over %d chunks: state rel "
       "%.2e, entries rel %.2e (%zu elements past one rounding step; %zu of %zu stored bytes "
       "differ; first bad chunk %d)",
       ratio, overlap ? "CSA" : "HCA", d, dname(t), nch, worst_s, worst_e, far, diff_bytes,
       (size_t)pg.nblk * pg.block_bytes, bad_chunk);
    pages_free(&pg);
    void *dev[] = { dstate, dkv, dgate, dape, dnorm };
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) G->release(G, dev[i]);
    free(kv), free(gate), free(ape), free(norm), free(inv), free(state);
}

/* ---- indexer ---- */

/* distinct > 0: keys repeat (pages_repeat), scores tie in groups;
 * distinct < 0: -distinct outlier rows (pages_outliers). */
static void test_indexer(int ratio, int nheads, int d, int topk, int pos0, int n, enum kv_dtype t,
                         int distinct)
{
    int nrows = (pos0 + n) / ratio;
    pages pg = pages_new(nrows, 5, d, true, t);
    if (distinct > 0) pages_repeat(&pg, distinct);
    if (distinct < 0) pages_outliers(&pg, -distinct);
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
    C->indexer(C, &a, 1);
    a.q = dq, a.w = dw, a.keys = pages_rows(&pg, true), a.sel = dsel, a.nsel = dnsel;
    G->indexer(G, &a, 1);      /* G: LLM_CUDA_GEMM=f32, the float32 path also for many tokens */
    int32_t *gs = hcopy(dsel, (size_t)n * topk * 4);
    int *gn = hcopy(dnsel, n * sizeof *gn);
    int bad = 0, first_bad = -1;
    for (int i = 0; i < n; i++) {
        bool same = gn[i] == nsel[i];
        for (int k = 0; same && k < nsel[i]; k++) same = gs[(size_t)i * topk + k] == sel[(size_t)i * topk + k];
        if (!same && first_bad < 0) first_bad = i;
        bad += !same;
    }
    ok(!bad && !G->error(G), "indexer ratio=%d heads=%d d=%d topk=%d pos0=%d n=%d keys %s%s: %d "
       "of %d tokens choose other entries (first %d)", ratio, nheads, d, topk, pos0, n, dname(t),
       distinct > 0 ? " (few distinct: ties)" : distinct < 0 ? " (outliers 2^20 up)" : "", bad, n,
       first_bad);
    pages_free(&pg);
    G->release(G, dq), G->release(G, dw), G->release(G, dsel), G->release(G, dnsel);
    free(q), free(w), free(sel), free(nsel), free(gs), free(gn);
}

/* The tensor-core path: q and k rounded to bf16 (relative error at most
 * u = 2^-8 each), products and sums in float32.  For token i and entry s,
 * with A = d^-0.5 * sum_h |w_h| * sum_c |q_hc| |k_c|, ReLU being
 * 1-Lipschitz bounds the error by A * (2u + u^2) plus float32 sums
 * (at most (d + heads) * 2^-22 of A, generously): tol(i, s).  The
 * reference is double.  (a) every score of the kernel within tol, every
 * future entry untouched; (b) the op's choice: count, ascending, no
 * duplicates or future entries, and each chosen entry's reference score
 * at least the reference k-th best minus tol of it and the largest tol of
 * the token (if s beat some e of the reference top k, ref(s) + tol_s >=
 * ref(e) - tol_e).
 * The fp8 mode's scores (indexer_fp8_scores: the FP8 kernel, the CPU's
 * fp8 mode) have a reference of their own, ref8 and tol8: the same sums
 * over each query head and key row quantized by act_quant_round, whose
 * products are exact; the error is then the tensor cores' running sums,
 * the FP8 GEMMs' bound of this file's header with A over the quantized
 * values: A8 * (2^-13 + 2 (d + heads) 2^-24). */
typedef struct {
    const float *q, *w;
    const paged_rows *keys;
    int n, pos0, ratio, nheads, d, S, nthreads, part;
    double *ref, *tol, *ref8, *tol8;    /* ref8, tol8: NULL, or the fp8 mode's */
} mma_ref_job;

/* sum_h w_h d^-0.5 ReLU(q_h . k) of one token and entry, and its A. */
static double mma_ref_score(const float *q, const float *w, const float *k, int nheads, int d,
                            double *A)
{
    double sm = 1 / sqrt(d), sc = 0;
    *A = 0;
    for (int h = 0; h < nheads; h++) {
        const float *qh = q + (size_t)h * d;
        double dot = 0, ab = 0;
        for (int c = 0; c < d; c++) {
            dot += (double)qh[c] * k[c];
            ab += fabs((double)qh[c] * k[c]);
        }
        sc += (dot > 0 ? dot : 0) * sm * w[h];
        *A += fabs(w[h]) * sm * ab;
    }
    return sc;
}

static void *mma_ref_part(void *arg)
{
    const mma_ref_job *J = arg;
    double u = 1.0 / 256, A;
    double eps = 2 * u + u * u + (J->d + J->nheads) / 4194304.0;
    double eps8 = 1.0 / 8192 + 2.0 * (J->d + J->nheads) / 16777216.0;
    size_t qn = (size_t)J->nheads * J->d;
    float *k = malloc((2 * J->d + qn) * sizeof *k), *k8 = k + J->d, *q8 = k8 + J->d;
    for (int i = J->part; i < J->n; i += J->nthreads) {
        int nvis = (J->pos0 + i + 1) / J->ratio;
        const float *q = J->q + (size_t)i * qn, *w = J->w + (size_t)i * J->nheads;
        if (J->ref8) {
            memcpy(q8, q, qn * sizeof *q8);
            for (int h = 0; h < J->nheads; h++) act_quant_round(q8 + (size_t)h * J->d, J->d);
        }
        for (int s = 0; s < nvis; s++) {
            size_t o = (size_t)i * J->S + s;
            paged_load(J->keys, s, k);
            J->ref[o] = mma_ref_score(q, w, k, J->nheads, J->d, &A);
            J->tol[o] = A * eps;
            if (!J->ref8) continue;
            memcpy(k8, k, J->d * sizeof *k8);
            act_quant_round(k8, J->d);
            J->ref8[o] = mma_ref_score(q8, w, k8, J->nheads, J->d, &A);
            J->tol8[o] = A * eps8;
        }
    }
    free(k);
    return NULL;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* ref and tol ([n][S]) of n tokens from pos0 over host keys, in threads
 * (and ref8, tol8 unless NULL). */
static void mma_ref(const float *q, const float *w, const paged_rows *keys, int n, int pos0,
                    int ratio, int nheads, int d, int S, double *ref, double *tol, double *ref8,
                    double *tol8)
{
    long nproc = sysconf(_SC_NPROCESSORS_ONLN);
    int nthr = nproc < 1 ? 1 : nproc > 32 ? 32 : (int)nproc;
    pthread_t th[32];
    mma_ref_job J[32];
    for (int p = 0; p < nthr; p++) {
        J[p] = (mma_ref_job){ q, w, keys, n, pos0, ratio, nheads, d, S, nthr, p,
                              ref, tol, ref8, tol8 };
        pthread_create(&th[p], NULL, mma_ref_part, &J[p]);
    }
    for (int p = 0; p < nthr; p++) pthread_join(th[p], NULL);
}

/* Whether a token's choice (sel, nsel of them; nvis visible entries, the
 * reference scores r with bounds tl) is one the bound allows: (b) above.
 * tmp: nvis doubles of scratch; *flips counts chosen entries below the
 * reference k-th best (near-ties). */
static bool choice_within(const double *r, const double *tl, int nvis, int topk,
                          const int32_t *sel, int nsel, double *tmp, long long *flips)
{
    int want = nvis < topk ? nvis : topk;
    bool good = nsel == want;
    for (int k = 0; good && k < want; k++)
        good = sel[k] >= 0 && sel[k] < nvis && (k == 0 || sel[k] > sel[k - 1]);
    if (good && nvis > topk) {
        double maxtol = 0;
        for (int s = 0; s < nvis; s++) {
            tmp[s] = -r[s];
            if (tl[s] > maxtol) maxtol = tl[s];
        }
        /* the reference k-th best: partial selection by sorting a copy */
        qsort(tmp, nvis, sizeof *tmp, cmp_double);
        double kth = -tmp[topk - 1];
        for (int k = 0; good && k < want; k++) {
            good = r[sel[k]] >= kth - tl[sel[k]] - maxtol;
            *flips += r[sel[k]] < kth;
        }
    }
    return good;
}

/* The op's choice by backend b (G8, C8: the fp8 mode's reference when
 * it scores in FP8) for a (topk > 0; device or host memory as b's):
 * test_indexer_mma's (b). */
static void indexer_choice(backend *b, const char *what, indexer_args a, const double *ref,
                           const double *tol, const double *ref8, const double *tol8)
{
    bool host = b == C8, f8 = (b == G8 || b == C8) && indexer_fp8_scores(&a);
    int n = a.n, topk = a.topk, S = (a.pos0 + n) / a.ratio;
    size_t sb = (size_t)n * topk * 4, nb = n * sizeof(int);
    int32_t *sel = host ? malloc(sb) : G->alloc(G, sb), *gs = sel;
    int *nsel = host ? malloc(nb) : G->alloc(G, nb), *gn = nsel;
    if (host) memset(sel, 0xff, sb), memset(nsel, 0xff, nb);
    else poison(sel, sb), poison(nsel, nb);
    a.sel = sel, a.nsel = nsel;
    b->indexer(b, &a, 1);
    if (!host)      /* read on b: its stream, not G's, ran the op */
        gs = hcopy_on(b, sel, sb), gn = hcopy_on(b, nsel, nb);
    int bad = 0, first_bad = -1;
    long long flips = 0;
    double *tmp = malloc((size_t)S * sizeof *tmp);
    for (int i = 0; i < n; i++) {
        int nvis = (a.pos0 + i + 1) / a.ratio;
        size_t o = (size_t)i * S;
        bool good = choice_within((f8 ? ref8 : ref) + o, (f8 ? tol8 : tol) + o, nvis, topk,
                                  gs + (size_t)i * topk, gn[i], tmp, &flips);
        if (!good && first_bad < 0) first_bad = i;
        bad += !good;
    }
    ok(!bad && !b->error(b), "indexer_mma choice (%s%s) heads=%d topk=%d pos0=%d n=%d: %d of %d "
       "tokens wrong (first %d); %lld chosen entries below the reference k-th best "
       "(near-ties)", what, f8 ? ", FP8 scores" : "", a.nheads, topk, a.pos0, n, bad, n,
       first_bad, flips);
    if (host) free(sel), free(nsel);
    else G->release(G, sel), G->release(G, nsel), free(gs), free(gn);
    free(tmp);
}

/* fp8: also the FP8 kernel's scores and the fp8 mode's choices (G8, C8). */
static void test_indexer_mma(int nheads, int topk, int pos0, int n, int chunk, int ktile,
                             enum kv_dtype t, bool fp8)
{
    int ratio = 4, d = 128, S = (pos0 + n) / ratio;
    pages pg = pages_new(S, 16, d, true, t);
    paged_rows hk = pages_rows(&pg, false);
    float *q = hrand((size_t)n * nheads * d, 1.0f), *w = hrand((size_t)n * nheads, 1.0f);
    double *ref = calloc((size_t)n * S, sizeof *ref), *tol = calloc((size_t)n * S, sizeof *tol);
    double *ref8 = fp8 ? calloc((size_t)n * S, sizeof *ref8) : NULL;
    double *tol8 = fp8 ? calloc((size_t)n * S, sizeof *tol8) : NULL;
    mma_ref(q, w, &hk, n, pos0, ratio, nheads, d, S, ref, tol, ref8, tol8);

    /* (a) the scores, every token (topk 0): on wgmma (the default on an
     * H200), on mma.sync (LLM_CUDA_INDEXER_WGMMA=0's kernel), on the
     * decode steps' kernel (keys read from the cache: FP8 and bf16), and
     * on the fp8 mode's e4m3 wgmma (against ref8) */
    float *dq = dcopy(q, (size_t)n * nheads * d * 4), *dw = dcopy(w, (size_t)n * nheads * 4);
    float *dsc = G->alloc(G, (size_t)n * S * 4);
    indexer_args a = { .n = n, .pos0 = pos0, .ratio = ratio, .nheads = nheads, .d = d,
                       .topk = 0, .q = dq, .w = dw, .keys = pages_rows(&pg, true) };
    static const char *const kname[] = { "mma.sync", "wgmma", "decode wgmma", "wgmma e4m3",
                                         "wgmma e4m3, 128 keys a block" };
    enum cuda_indexer_kernel ks[5] = { CUDA_INDEXER_WGMMA, CUDA_INDEXER_MMA_SYNC };
    int nk = 2;
    if (t != KV_F32) ks[nk++] = CUDA_INDEXER_DECODE;
    if (fp8) ks[nk++] = CUDA_INDEXER_WGMMA_FP8, ks[nk++] = CUDA_INDEXER_WGMMA_FP8_K128;
    for (int kx = 0; kx < nk; kx++) {
        bool k8 = ks[kx] >= CUDA_INDEXER_WGMMA_FP8;
        const double *r = k8 ? ref8 : ref, *tl = k8 ? tol8 : tol;
        poison(dsc, (size_t)n * S * 4);
        char err[256] = "";
        int rc = cuda_indexer_mma_scores(&a, dsc, S, chunk, ktile, ks[kx], err, sizeof err);
        float *sc = hcopy(dsc, (size_t)n * S * 4);
        long long over = 0, future = 0;
        double worst = 0, d2 = 0, z2 = 0;
        for (int i = 0; i < n; i++) {
            int nvis = (pos0 + i + 1) / ratio;
            for (int s = 0; s < S; s++) {
                size_t o = (size_t)i * S + s;
                if (s >= nvis) {
                    future += !isnan(sc[o]);
                    continue;
                }
                double e = fabs(sc[o] - r[o]);
                if (!(e <= tl[o])) over++;     /* NaN counts */
                if (e / tl[o] > worst) worst = e / tl[o];
                d2 += e * e, z2 += r[o] * r[o];
            }
        }
        ok(!rc && !over && !future, "indexer_mma scores (%s) heads=%d pos0=%d n=%d (%d %s "
           "entries) chunk=%d ktile=%d: %lld over the bound, %lld future written, worst error "
           "%.3g of the bound, rel L2 %.3g%s%s", kname[ks[kx]], nheads, pos0, n, S,
           dname(t), chunk, ktile, over, future, worst, sqrt(d2 / z2), rc ? ": " : "", err);
        free(sc);
    }

    /* (b) the op's choice (G under bf16: tensor-core scores, from 64 tokens
     * the prefill's kernels, below that the decode kernel; G8 and C8 under
     * fp8: from 64 tokens of BF16 or FP8 keys FP8 scores) */
    a.topk = topk;
    indexer_choice(G, "bf16", a, ref, tol, ref8, tol8);
    if (fp8 && G8) indexer_choice(G8, "fp8", a, ref, tol, ref8, tol8);
    if (fp8) {
        indexer_args h = a;
        h.q = q, h.w = w, h.keys = hk;
        indexer_choice(C8, "CPU fp8", h, ref, tol, ref8, tol8);
    }
    pages_free(&pg);
    G->release(G, dq), G->release(G, dw), G->release(G, dsc);
    free(q), free(w), free(ref), free(tol), free(ref8), free(tol8);
}

/* ---- attention ---- */

static double now(void);

/* reps > 0: also time that many launches (reported, not asserted). */
static int attn_tokens = 2;     /* G's LLM_CUDA_ATTN_TOKENS */
#define ATT_DEC_MMA_MIN_T 16    /* backend_cuda.cuh: decode steps on tensor cores from ... */
static int attn_mma_t = ATT_DEC_MMA_MIN_T;      /* G's LLM_CUDA_ATTN_MMA_MIN_T */
#define ATT_DEC_MMA_MIN_KEYS 1000   /* ... and decode ops of this many keys */
#define ATTN_MERGE_DEFAULT ", splits in clusters of up to 8"  /* LLM_CUDA_ATTN_CLUSTER unset */
static const char *attn_merge = ATTN_MERGE_DEFAULT;    /* G's, for the names */
/* G's mode with LLM_CUDA_ATTN_HCA_BF16=0 (prefill's HCA entries of an FP8
 * cache decoded by each block), or NULL: compared bit for bit; from
 * G_hca[mode][tokens per block - 1] */
static backend *G_hca0, *G_hca[4][2];

/* Whether G runs the attention of n query tokens (or n sequences) on
 * tensor cores: prefill steps of 64+ tokens and decode steps of at least
 * LLM_CUDA_ATTN_MMA_MIN_T or of at least ATT_DEC_MMA_MIN_KEYS keys (the
 * window + CSA's top-k or the entries up to the last position), under
 * bf16, and under bf16x2 and fp8 from bf16/fp8 caches (backend_cuda.cu,
 * tensor_core_keys). */
static bool attn_on_mma(int n, int hd, enum kv_dtype t, int window, int ratio, int topk,
                        int pos_end)
{
    int keys = window + (ratio ? (topk ? topk : pos_end / ratio) : 0);
    return (gemm_mode == GEMM_BF16 || (gemm_mode >= GEMM_BF16X2 && t != KV_F32)) &&
           (n >= 64 || (attn_mma_t && n >= attn_mma_t) || keys >= ATT_DEC_MMA_MIN_KEYS) &&
           (hd == 64 || hd == 128 || hd == 256 || hd == 512);
}

/* A RoPE table over the last channels of a head (up to 32 pairs) for
 * the output's rotation back; free its inv_freq. */
static rope_table out_rope_table(int hd)
{
    int np = hd / 8 < 32 ? hd / 8 : 32;
    float *inv = malloc(np * 4);
    for (int i = 0; i < np; i++) inv[i] = powf(10000.0f, -2.0f * i / (2 * np));
    return (rope_table){ np, inv, 1.25f };
}

static backend *gpu_backend(const char *gemm, const char *attn_tokens);

/* Once a mode: a matmul that cannot take the output held in bf16 (a
 * float32 weight: its GEMM multiplies float32 x) over it fails its
 * backend with an error that says so, not with wrong products (a fresh
 * backend: failures are sticky). */
static void check_held_refusal(const attention_args *a, float *dy, int N)
{
    static bool done[4];
    if (done[gemm_mode]) return;
    done[gemm_mode] = true;
    backend *gx = gpu_backend(gemm_names[gemm_mode], "2");
    if (!gx) return;
    int od = a->nheads * a->head_dim;
    qweight w = make_w(QT_F32, N, od), gw = w;
    bool up_ok = !gx->upload_weights(gx, &gw, 1);
    gx->attention(gx, a, 1);
    gx->matmul(gx, &gw, a->out, od, a->n, dy, N);
    const char *e = gx->error(gx);
    ok(up_ok && e && strstr(e, "held in bf16"), "  a float32 matmul over the output held in "
       "bf16 under %s: the backend fails saying so (%s)", gemm_names[gemm_mode],
       e ? e : "no error");
    gx->destroy(gx);
    free((void *)w.data);
}

/* A prefill chunk's attention with the ops after it fused as the model
 * asks for them (G's attention_fused): the inverse RoPE in the kernel, the
 * same output bits as the rope op after it; under the one-part bf16 modes
 * also the output held in bf16 for the matmuls that read it (two groups of
 * its columns through views of a BF16 weight, as wo_a's), whose products
 * are then those over the float output: within float32 summation order
 * (2 K 2^-24 sum |x w|: either order's sum lies within K 2^-24 sum |x w|
 * of the exact; cuBLASLt may choose another algorithm for x's row length).  a: as G ran it into dout, g: that output. */
static void check_attention_prefill_fused(attention_args *a, float *dout, const float *g)
{
    int n = a->n, hd = a->head_dim, nh = a->nheads;
    size_t od = (size_t)nh * hd, bytes = (size_t)n * od * 4;
    rope_table rt = out_rope_table(hd);
    int32_t *pos = malloc(n * 4);
    for (int i = 0; i < n; i++) pos[i] = a->pos0 + i;
    bool held = gemm_mode == GEMM_BF16 || gemm_mode == GEMM_FP8;
    unsigned f = G->attention_fused(G, a, 1);
    ok(f == (ATTN_FUSE_ROPE | (held ? ATTN_FUSE_MATMUL : 0)),
       "  attention_fused of a %d-token chunk under %s: %u (the inverse RoPE%s)", n,
       gemm_names[gemm_mode], f, held ? " and the output held in bf16" : "");
    /* the model's ops one after the other */
    G->write(G, dout, g, bytes);
    G->rope(G, dout, (int)od, n, nh, hd, &rt, pos, true);
    float *want = hcopy(dout, bytes);
    int gin = (int)od / 2, N = 64, ldy[2] = { 2 * N, 2 * N };
    qweight w = make_w(QT_BF16, 2 * N, gin), gw = up(&w);
    qweight v[2] = { qweight_view(&gw, 0, N, 0, gin), qweight_view(&gw, N, N, 0, gin) };
    const qweight *wp[2] = { &v[0], &v[1] };
    const float *xp[2] = { dout, dout + gin };
    float *dy = G->alloc(G, (size_t)n * 2 * N * 4), *yp[2] = { dy, dy + N };
    G->matmuls(G, 2, wp, xp, (int)od, n, yp, ldy, NULL, 0);
    float *ywant = hcopy(dy, (size_t)n * 2 * N * 4);
    /* fused */
    a->out_rope = &rt, a->out_matmul = f & ATTN_FUSE_MATMUL;
    poison(dout, bytes);
    G->attention(G, a, 1);
    if (!a->out_matmul) {
        float *got = hcopy(dout, bytes);
        size_t diff = 0;
        for (size_t i = 0; i < (size_t)n * od; i++) diff += memcmp(&got[i], &want[i], 4) != 0;
        ok(!diff && !G->error(G), "  the inverse RoPE in the prefill kernel: %zu of %zu outputs "
           "differ from the rope op's", diff, (size_t)n * od);
        free(got);
    } else {
        poison(dy, (size_t)n * 2 * N * 4);
        G->matmuls(G, 2, wp, xp, (int)od, n, yp, ldy, NULL, 0);
        float *ygot = hcopy(dy, (size_t)n * 2 * N * 4);
        const uint16_t *wd = w.data;
        double worst = 0;
        for (int t = 0; t < n; t++)
            for (int j = 0; j < 2 * N; j++) {
                double s = 0;
                const float *x = want + (size_t)t * od + (j / N) * gin;
                const uint16_t *wr = wd + (size_t)j * gin;
                for (int k = 0; k < gin; k++)
                    s += fabs(bf16_to_f32(f32_to_bf16(x[k])) * bf16_to_f32(wr[k]));
                double e = fabs((double)ygot[t * 2 * N + j] - ywant[t * 2 * N + j]);
                double r = e / (2.0 * gin * 0x1p-24 * s + 1e-30);
                worst = !(r <= worst) ? (r == r ? r : INFINITY) : worst;    /* NaN: fails */
            }
        ok(worst <= 1 && !G->error(G), "  the inverse RoPE and the output in bf16 for two "
           "grouped matmuls (%d x %d each): products %.3g of the summation-order bound from "
           "those over the float output%s%s", N, gin, worst, G->error(G) ? ": " : "",
           G->error(G) ? G->error(G) : "");
        free(ygot);
        check_held_refusal(a, dy, N);
    }
    a->out_rope = NULL, a->out_matmul = false;
    G->release(G, dy);
    free((void *)rt.inv_freq), free(pos), free(want), free(ywant);
    free((void *)w.data);
}

static void test_attention(int nheads, int hd, int window, int ratio, int topk, int pos0, int n,
                           enum kv_dtype t, int reps)
{
    int nrows = ratio ? (pos0 + n) / ratio : 0;
    pages pg = pages_new(nrows, 4, hd, true, t);
    float *q = hrand((size_t)n * nheads * hd, 1.0f), *kv = hrand((size_t)n * hd, 1.0f);
    float *sinks = hrand(nheads, 2.0f);
    /* the ring as stored, the chunk's keys rounded as the model does */
    size_t ring_bytes = kv_region_bytes(t, window, hd);
    char *ring = malloc(ring_bytes);
    float *row = hrand(hd, 1.0f);
    for (int r = 0; r < window; r++) {
        for (int c = 0; c < hd; c++) row[c] = frand();
        kv_store(t, ring, window, hd, r, row);
    }
    free(row);
    for (int i = 0; i < n; i++) kv_round(t, kv + (size_t)i * hd, hd);
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
    char *dring = dcopy(ring, ring_bytes);
    float *dsinks = dcopy(sinks, nheads * 4);
    float *dout = G->alloc(G, (size_t)n * nheads * hd * 4);
    int32_t *dsel = sel ? dcopy(sel, (size_t)n * topk * 4) : NULL;
    int *dnsel = nsel ? dcopy(nsel, n * sizeof *nsel) : NULL;
    poison(dout, (size_t)n * nheads * hd * 4);
    attention_args a = { .n = n, .pos0 = pos0, .nheads = nheads, .head_dim = hd,
                         .window = window, .scale = 1.0f / sqrtf(hd), .q = q, .kv = kv,
                         .ring = ring, .dtype = t, .sinks = sinks, .ratio = ratio,
                         .comp = pages_rows(&pg, false), .sel = sel, .nsel = nsel,
                         .sel_ld = topk, .out = out };
    C->attention(C, &a, 1);
    a.q = dq, a.kv = dkv, a.ring = dring, a.sinks = dsinks, a.comp = pages_rows(&pg, true);
    a.sel = dsel, a.nsel = dnsel, a.out = dout;
    G->attention(G, &a, 1);
    float *g = hcopy(dout, (size_t)n * nheads * hd * 4);
    char name[128];
    /* On tensor cores (attention_mma.cu; attn_on_mma): keys rounded to
     * bf16 (exact from bf16/fp8 caches), queries and probabilities
     * rounded (bf16, and fp8's prefill chunks of 64+ tokens: u = 2^-8
     * each) or split in two parts (bf16x2, fp8's decode launches:
     * 2^-16).  The logits move by at most (u_q + u_k) scale sum |q||k|,
     * the probabilities by that relative and u_p: 4u bounds the relative
     * L2 of the output with the largest u present. */
    bool mma = attn_on_mma(n, hd, t, window, ratio, topk, pos0 + n);
    double u = gemm_mode == GEMM_BF16 || (gemm_mode == GEMM_FP8 && n >= 64) ? 0x1p-8 : 0x1p-16;
    snprintf(name, sizeof name, "attention heads=%d hd=%d window=%d ratio=%d topk=%d pos0=%d n=%d "
             "cache %s%s%s%s%s", nheads, hd, window, ratio, topk, pos0, n, dname(t),
             mma ? ", tensor cores " : "", mma ? gemm_names[gemm_mode] : "",
             !mma ? "" : n < 64 ? ", decode launch" :
             attn_tokens == 1 ? ", 1 token per block" : ", 2 tokens per block",
             mma && n < 64 ? attn_merge : "");
    check_tol(name, g, out, (size_t)n * nheads * hd, mma ? 4 * u + TOL : TOL);
    if (gemm_mode == GEMM_FP8 && mma && n >= 64 && t != KV_F32 && attn_tokens == 1) {
        /* fp8's prefill chunk against the CPU's fp8 mode, which rounds the
         * same queries and probabilities at the same points (cpu_attend's
         * bf16 form: one token's keys in tiles of 32, the running max):
         * only the logits' last bits differ, so the output is much nearer
         * it than float32 (rounding elsewhere would put it about as far
         * from it as from float32, or further). */
        float *out8 = malloc((size_t)n * nheads * hd * 4);
        attention_args a8 = a;
        a8.q = q, a8.kv = kv, a8.ring = ring, a8.sinks = sinks, a8.comp = pages_rows(&pg, false);
        a8.sel = sel, a8.nsel = nsel, a8.out = out8;
        C8->attention(C8, &a8, 1);
        size_t ne = (size_t)n * nheads * hd;
        double r8 = rel_err(g, out8, ne), r = rel_err(g, out, ne);
        ok(r8 <= 0.5 * r, "  nearer the CPU's fp8 mode (bf16 at the kernel's rounding points) "
           "than float32: rel L2 %.3g against %.3g", r8, r);
        free(out8);
    }
    /* again: the decode kernel's counters are left zero for the next launch */
    poison(dout, (size_t)n * nheads * hd * 4);
    G->attention(G, &a, 1);
    G->read(G, g, dout, (size_t)n * nheads * hd * 4);
    snprintf(name, sizeof name, "attention heads=%d hd=%d ratio=%d topk=%d pos0=%d n=%d cache %s, "
             "run again", nheads, hd, ratio, topk, pos0, n, dname(t));
    check_tol(name, g, out, (size_t)n * nheads * hd, mma ? 4 * u + TOL : TOL);
    if (mma && n >= 64) check_attention_prefill_fused(&a, dout, g);
    if (G_hca0 && mma && n >= 64 && ratio && !topk && t == KV_FP8) {
        /* the entries as one bf16 tile decoded once (the default) or by
         * each block: the same bf16 values, so the same bits */
        backend *g0 = G;
        G = G_hca0;
        poison(dout, (size_t)n * nheads * hd * 4);
        G->attention(G, &a, 1);
        float *h = hcopy(dout, (size_t)n * nheads * hd * 4);
        ok(!G->error(G) && !memcmp(h, g, (size_t)n * nheads * hd * 4),
           "attention heads=%d ratio=%d pos0=%d n=%d cache %s: HCA entries decoded once a step "
           "= by every block (LLM_CUDA_ATTN_HCA_BF16=0), bit for bit", nheads, ratio, pos0, n,
           dname(t));
        free(h);
        G = g0;
    }
    if (reps > 0) {
        float one;
        G->attention(G, &a, 1);
        G->read(G, &one, dout, sizeof one);
        double t0 = now();
        for (int r = 0; r < reps; r++) G->attention(G, &a, 1);
        G->read(G, &one, dout, sizeof one);
        diag("attention heads=%d ratio=%d topk=%d context %d n=%d cache %s: %.1f us per call",
             nheads, ratio, topk, pos0 + n, n, dname(t), (now() - t0) / reps * 1e6);
    }
    pages_free(&pg);
    void *dev[] = { dq, dkv, dring, dsinks, dout, dsel, dnsel };
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) if (dev[i]) G->release(G, dev[i]);
    free(q), free(kv), free(ring), free(sinks), free(out), free(sel), free(nsel), free(g);
}

/* ---- decode batches: compress, indexer and attention of nseg sequences
 * at their own positions (one new token each) in one op, which the CUDA
 * backend runs as one launch per kernel; the CPU runs them one by one ---- */

typedef struct {
    int pos0;
    pages pg;                   /* compressed entries (indexer keys / attention) */
    float *state, *dstate;      /* compressor state */
    char *ring, *dring;
    float *q, *dq, *kv, *dkv, *w, *dw;
    int32_t *sel, *dsel;
    int *nsel, *dnsel;
} dseq;

/* Positions: the first at maxpos, one at 0..ratio, the rest random. */
static int dseq_pos(int s, int maxpos, int ratio)
{
    return s == 0 ? maxpos : s == 1 ? (int)(rnd() % (ratio + 1)) : (int)(rnd() % (maxpos + 1));
}

static void dseq_free(dseq *q)
{
    pages_free(&q->pg);
    void *dev[] = { q->dstate, q->dring, q->dq, q->dkv, q->dw, q->dsel, q->dnsel };
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) G->release(G, dev[i]);
    free(q->state), free(q->ring), free(q->q), free(q->kv), free(q->w), free(q->sel),
        free(q->nsel);
}

/* State and every entry of every sequence as the CPU's: the state within
 * TOL; entries within TOL (f32 cache) or element by element
 * (entries_far). */
static void test_compress_batch(int nseg, int ratio, bool overlap, int d, int maxpos,
                                enum kv_dtype t)
{
    int coff = overlap ? 2 : 1, wd = coff * d, ld = wd + 2, npairs = 8;
    float *inv = malloc(npairs * 4);
    for (int i = 0; i < npairs; i++) inv[i] = powf(160000.0f, -2.0f * i / (2 * npairs));
    rope_table rt = { npairs, inv, 1.0f };
    float *ape = hrand((size_t)ratio * wd, 0.5f), *norm = hrand(d, 1.0f);
    float *dape = dcopy(ape, (size_t)ratio * wd * 4), *dnorm = dcopy(norm, d * 4);
    size_t sf = comp_state_floats(ratio, coff, d);
    dseq *sq = calloc(nseg, sizeof *sq);
    compress_args *ca = calloc(nseg, sizeof *ca), *ga = calloc(nseg, sizeof *ga);
    for (int s = 0; s < nseg; s++) {
        dseq *q = &sq[s];
        /* a window that this token completes in most sequences */
        q->pos0 = s % 4 ? dseq_pos(s, maxpos, ratio) / ratio * ratio + ratio - 1
                        : dseq_pos(s, maxpos, ratio);
        q->pg = pages_new(q->pos0 / ratio + 1, 3, d, false, t);
        q->state = hrand(sf, 1.0f);    /* the window so far: any values */
        q->dstate = dcopy(q->state, sf * 4);
        q->kv = hrand(2 * (size_t)ld, 1.0f);   /* [kv row | gate row] */
        q->dkv = dcopy(q->kv, 2 * (size_t)ld * 4);
        ca[s] = (compress_args){ .n = 1, .pos0 = q->pos0, .ratio = ratio, .d = d,
                                 .overlap = overlap, .kv = q->kv, .gate = q->kv + ld, .ld = ld,
                                 .ape = ape, .norm = norm, .eps = 1e-6f, .rope = &rt,
                                 .state = q->state, .out = pages_rows(&q->pg, false) };
        ga[s] = ca[s];
        ga[s].kv = q->dkv, ga[s].gate = q->dkv + ld, ga[s].ape = dape, ga[s].norm = dnorm;
        ga[s].state = q->dstate, ga[s].out = pages_rows(&q->pg, true);
    }
    C->compress(C, ca, nseg);
    G->compress(G, ga, nseg);
    double worst_s = 0, worst_e = 0;
    size_t far = 0, nel = 0;
    for (int s = 0; s < nseg; s++) {
        dseq *q = &sq[s];
        float *gs = hcopy(q->dstate, sf * 4);
        worst_s = fmax(worst_s, rel_err(gs, q->state, sf));
        int ne = (q->pos0 + 1) / ratio;
        paged_rows hr = pages_rows(&q->pg, false), dr = pages_rows(&q->pg, true);
        char *blocks = hcopy(q->pg.dbase, (size_t)q->pg.nblk * q->pg.block_bytes);
        float *ec = malloc(((size_t)ne + 1) * d * 4), *eg = malloc(((size_t)ne + 1) * d * 4);
        for (int e = 0; e < ne; e++) {
            paged_load(&hr, e, ec + (size_t)e * d);
            size_t at = (size_t)(paged_region(&dr, e) - q->pg.dbase);
            kv_load(t, blocks + at, q->pg.per_block, d, e % q->pg.per_block, eg + (size_t)e * d);
        }
        if (ne) worst_e = fmax(worst_e, rel_err(eg, ec, (size_t)ne * d));
        if (t != KV_F32) far += entries_far(t, eg, ec, ne, d);
        nel += (size_t)ne * d;
        free(gs), free(blocks), free(ec), free(eg);
    }
    ok(worst_s <= TOL && (t == KV_F32 ? worst_e <= TOL : !far) && !G->error(G),
       "compress, a batch of %d sequences (positions up to %d) ratio=%d %s d=%d %s: state rel "
       "%.2e, entries rel %.2e, %zu of %zu elements past one rounding step", nseg, maxpos, ratio,
       overlap ? "CSA" : "HCA", d, dname(t), worst_s, worst_e, far, nel);
    for (int s = 0; s < nseg; s++) dseq_free(&sq[s]);
    G->release(G, dape), G->release(G, dnorm);
    free(sq), free(ca), free(ga), free(inv), free(ape), free(norm);
}

/* The compressor: chunks of every size (1-token chunks: the decode step's
 * one launch, compress_step_kernel, completing windows and not), then
 * decode batches of 1 (the op's one-sequence path) to 64 sequences at
 * Flash's rank shapes (CSA, HCA, the indexer's CSA) and each cache dtype. */
static void compress_cases(void)
{
    int ch1[] = { 7, 1, 1, 13, 5, 1, 1, 1, 40, 2 };
    int ch2[] = { 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1 };
    int ch3[] = { 300, 1, 1, 100, 1 };
    int nb[] = { 1, 2, 7, 33, 64 };
    for (int t = KV_F32; t <= KV_FP8; t++) {
        test_compress(4, true, 64, 8, ch1, 10, t);
        test_compress(4, true, 32, 8, ch2, 12, t);
        test_compress(8, false, 64, 8, ch1, 10, t);
        test_compress(128, false, 512, 32, ch3, 5, t);
        test_compress(4, true, 512, 32, ch3, 5, t);
        test_compress(4, true, 128, 32, ch3, 5, t);
        for (int i = 0; i < 5; i++) {
            test_compress_batch(nb[i], 4, true, 512, 9000, t);
            test_compress_batch(nb[i], 128, false, 512, 9000, t);
            test_compress_batch(nb[i], 4, true, 128, 300, t);
        }
    }
}

/* Every sequence chooses the CPU's entries (float32 scores: exactly), or
 * with `bound` (G scores on tensor cores) entries test_indexer_mma's
 * bound allows.  distinct > 0: keys repeat (pages_repeat).  graph: the
 * op as a decode step runs it, under a graph key four times (run,
 * captured, replayed: the positions read on the device, sizes for the
 * capped position bound), outputs poisoned before the last, which must
 * be a replay. */
static void test_indexer_batch(int nseg, int nheads, int d, int topk, int maxpos, enum kv_dtype t,
                               int distinct, bool graph, bool bound)
{
    int ratio = 4;
    dseq *sq = calloc(nseg, sizeof *sq);
    indexer_args *ca = calloc(nseg, sizeof *ca), *ga = calloc(nseg, sizeof *ga);
    for (int s = 0; s < nseg; s++) {
        dseq *q = &sq[s];
        q->pos0 = dseq_pos(s, maxpos, ratio);
        q->pg = pages_new((q->pos0 + 1) / ratio, 5, d, true, t);
        if (distinct) pages_repeat(&q->pg, distinct);
        q->q = hrand((size_t)nheads * d, 1.0f), q->w = hrand(nheads, 1.0f);
        q->dq = dcopy(q->q, (size_t)nheads * d * 4), q->dw = dcopy(q->w, nheads * 4);
        q->sel = malloc(topk * 4), q->nsel = malloc(sizeof *q->nsel);
        q->dsel = G->alloc(G, topk * 4), q->dnsel = G->alloc(G, sizeof *q->dnsel);
        poison(q->dsel, topk * 4);
        poison(q->dnsel, sizeof *q->dnsel);
        ca[s] = (indexer_args){ .n = 1, .pos0 = q->pos0, .ratio = ratio, .nheads = nheads,
                                .d = d, .topk = topk, .q = q->q, .w = q->w,
                                .keys = pages_rows(&q->pg, false), .sel = q->sel,
                                .nsel = q->nsel };
        ga[s] = ca[s];
        ga[s].q = q->dq, ga[s].w = q->dw, ga[s].keys = pages_rows(&q->pg, true);
        ga[s].sel = q->dsel, ga[s].nsel = q->dnsel;
    }
    C->indexer(C, ca, nseg);
    long long cap0 = 0, rep0 = 0, cap1 = 0, rep1 = 0;
    if (graph) {
        uint64_t key = 0x1D7B000000ull ^ ((uint64_t)maxpos << 8) ^ (uint64_t)nseg;
        G->graph_counts(G, &cap0, &rep0);
        /* as usual, captured (once more if the arena ran short), replayed */
        for (int r = 0; r < 4; r++) {
            for (int s = 0; r == 3 && s < nseg; s++) {
                poison(sq[s].dsel, topk * 4);
                poison(sq[s].dnsel, sizeof *sq[s].dnsel);
            }
            G->graph_begin(G, key);
            G->indexer(G, ga, nseg);
            while (G->graph_end(G)) G->indexer(G, ga, nseg);
        }
        G->graph_counts(G, &cap1, &rep1);
    } else {
        G->indexer(G, ga, nseg);
    }
    int bad = 0, first_bad = -1;
    long long flips = 0;
    for (int s = 0; s < nseg; s++) {
        dseq *q = &sq[s];
        int32_t *gs = hcopy(q->dsel, topk * 4);
        int gn;
        G->read(G, &gn, q->dnsel, sizeof gn);
        bool same = gn == q->nsel[0];
        if (bound) {
            int nvis = (q->pos0 + 1) / ratio, S = nvis > 0 ? nvis : 1;
            double *ref = calloc(S, sizeof *ref), *tol = calloc(S, sizeof *tol),
                   *tmp = malloc(S * sizeof *tmp);
            paged_rows hk = pages_rows(&q->pg, false);
            mma_ref(q->q, q->w, &hk, 1, q->pos0, ratio, nheads, d, S, ref, tol, NULL, NULL);
            same = choice_within(ref, tol, nvis, topk, gs, gn, tmp, &flips);
            free(ref), free(tol), free(tmp);
        }
        for (int k = 0; same && !bound && k < gn; k++) same = gs[k] == q->sel[k];
        if (!same && first_bad < 0) first_bad = s;
        bad += !same;
        free(gs);
    }
    ok(!bad && !G->error(G) && (!graph || rep1 > rep0), "indexer, a batch of %d sequences "
       "(positions up to %d) heads=%d d=%d topk=%d keys %s%s%s%s: %d choose other entries (first "
       "%d)%s", nseg, maxpos, nheads, d, topk, dname(t), distinct ? " (few distinct: ties)" : "",
       graph ? ", replayed as a graph" : "", bound ? ", tensor cores (within the bound)" : "",
       bad, first_bad, graph && rep1 <= rep0 ? "; the graph was not replayed" : "");
    if (bound) diag("  %lld chosen entries below the reference k-th best (near-ties)", flips);
    for (int s = 0; s < nseg; s++) dseq_free(&sq[s]);
    free(sq), free(ca), free(ga);
}

static backend *G_fused;    /* G with LLM_CUDA_ATTN_FUSE=1, or NULL */

/* G_fused's attention with the ring store and the inverse RoPE fused
 * (where its attention_fused says so: nseg <= 64) against G's attention,
 * ring_store and rope one after the other: the same output and ring bytes
 * (the same kernels, the fused ops' operations).  ga: the batch as G ran
 * it into dout (nseg rows of od), sq: its sequences (host rings as they
 * were before). */
static void check_attention_fused(attention_args *ga, dseq *sq, int nseg, float *dout,
                                  size_t od, enum kv_dtype t)
{
    int hd = ga[0].head_dim, window = ga[0].window;
    size_t rb = kv_region_bytes(t, window, hd);
    rope_table rt = out_rope_table(hd);
    bool fused = G_fused->attention_fused(G_fused, ga, nseg) ==
                 (ATTN_FUSE_ROPE | ATTN_FUSE_RING);
    if (nseg > 64) {    /* one split of the float32 kernel: not fused */
        ok(!fused, "attention_fused: no for a batch of %d sequences", nseg);
        free((void *)rt.inv_freq);
        return;
    }
    ring_args *ra = calloc(nseg, sizeof *ra);
    int32_t *pos = malloc(nseg * 4);
    for (int s = 0; s < nseg; s++) {
        ra[s] = (ring_args){ sq[s].dring, sq[s].dkv, 1, sq[s].pos0 };
        pos[s] = sq[s].pos0;
    }
    G->attention(G, ga, nseg);
    G->ring_store(G, ra, nseg, t, window, hd);
    G->rope(G, dout, (int)od, nseg, ga[0].nheads, hd, &rt, pos, true);
    float *want = hcopy(dout, nseg * od * 4);
    char *wring = malloc(nseg * rb);
    for (int s = 0; s < nseg; s++) G->read(G, wring + s * rb, sq[s].dring, rb);
    backend *g0 = G;
    G = G_fused;    /* its own stream: the writes, the op and the reads in order */
    for (int s = 0; s < nseg; s++) {
        G->write(G, sq[s].dring, sq[s].ring, rb);
        ga[s].out_rope = &rt, ga[s].store_ring = true;
    }
    poison(dout, nseg * od * 4);
    G->attention(G, ga, nseg);
    float *got = hcopy(dout, nseg * od * 4);
    size_t dout_diff = 0, dring = 0;
    for (size_t i = 0; i < nseg * od; i++) dout_diff += memcmp(&got[i], &want[i], 4) != 0;
    char *g = malloc(rb);
    for (int s = 0; s < nseg; s++) {
        G->read(G, g, sq[s].dring, rb);
        for (size_t i = 0; i < rb; i++) dring += g[i] != wring[s * rb + i];
        ga[s].out_rope = NULL, ga[s].store_ring = false;
    }
    G = g0;
    ok(fused && !dout_diff && !dring && !G_fused->error(G_fused), "  fused with the ring store "
       "and the inverse RoPE%s: %zu of %zu outputs and %zu of %zu ring bytes differ",
       fused ? "" : " (attention_fused said no)", dout_diff, nseg * od, dring, nseg * rb);
    free((void *)rt.inv_freq), free(ra), free(pos), free(want), free(wring), free(got), free(g);
}

/* Each sequence's output as the CPU's: within TOL (float32 kernel) or
 * test_attention's tensor-core bound (attn_on_mma); with G_fused, also
 * check_attention_fused. */
static void test_attention_batch(int nseg, int nheads, int hd, int window, int ratio, int topk,
                                 int maxpos, enum kv_dtype t)
{
    float *sinks = hrand(nheads, 2.0f), *dsinks = dcopy(sinks, nheads * 4);
    size_t od = (size_t)nheads * hd, ring_bytes = kv_region_bytes(t, window, hd);
    float *out = malloc(nseg * od * 4), *dout = G->alloc(G, nseg * od * 4);
    poison(dout, nseg * od * 4);
    dseq *sq = calloc(nseg, sizeof *sq);
    attention_args *ca = calloc(nseg, sizeof *ca), *ga = calloc(nseg, sizeof *ga);
    float *row = malloc(hd * 4);
    for (int s = 0; s < nseg; s++) {
        dseq *q = &sq[s];
        int p = q->pos0 = dseq_pos(s, maxpos, ratio ? ratio : 4);
        q->pg = pages_new(ratio ? (p + 1) / ratio : 0, 4, hd, true, t);
        q->ring = malloc(ring_bytes);
        for (int r = 0; r < window; r++) {
            for (int c = 0; c < hd; c++) row[c] = frand();
            kv_store(t, q->ring, window, hd, r, row);
        }
        q->dring = dcopy(q->ring, ring_bytes);
        q->q = hrand(od, 1.0f), q->kv = hrand(hd, 1.0f);
        kv_round(t, q->kv, hd);
        q->dq = dcopy(q->q, od * 4), q->dkv = dcopy(q->kv, hd * 4);
        ca[s] = (attention_args){ .n = 1, .pos0 = p, .nheads = nheads, .head_dim = hd,
                                  .window = window, .scale = 1.0f / sqrtf(hd), .q = q->q,
                                  .kv = q->kv, .ring = q->ring, .dtype = t, .sinks = sinks,
                                  .ratio = ratio, .comp = pages_rows(&q->pg, false),
                                  .out = out + s * od };
        if (topk) {     /* CSA: a random ascending choice */
            int nvis = (p + 1) / ratio, k = 0;
            q->sel = malloc(topk * 4), q->nsel = malloc(sizeof *q->nsel);
            for (int e = 0; e < nvis && k < topk; e++)
                if ((int)(rnd() % (nvis - e)) < topk - k) q->sel[k++] = e;
            q->nsel[0] = k;
            q->dsel = dcopy(q->sel, topk * 4), q->dnsel = dcopy(q->nsel, sizeof *q->nsel);
            ca[s].sel = q->sel, ca[s].nsel = q->nsel, ca[s].sel_ld = topk;
        }
        ga[s] = ca[s];
        ga[s].q = q->dq, ga[s].kv = q->dkv, ga[s].ring = q->dring, ga[s].sinks = dsinks;
        ga[s].comp = pages_rows(&q->pg, true), ga[s].out = dout + s * od;
        ga[s].sel = q->dsel, ga[s].nsel = q->dnsel;
    }
    C->attention(C, ca, nseg);
    G->attention(G, ga, nseg);
    float *g = hcopy(dout, nseg * od * 4);
    char name[192];
    bool mma = attn_on_mma(nseg, hd, t, window, ratio, topk, maxpos + 1);
    double tol = mma ? 4 * (gemm_mode == GEMM_BF16 ? 0x1p-8 : 0x1p-16) + TOL : TOL;
    snprintf(name, sizeof name, "attention, a batch of %d sequences (positions up to %d) heads=%d "
             "hd=%d window=%d ratio=%d topk=%d cache %s%s%s%s", nseg, maxpos, nheads, hd, window,
             ratio, topk, dname(t), mma ? ", tensor cores " : "", mma ? gemm_names[gemm_mode] : "",
             mma ? attn_merge : "");
    check_tol(name, g, out, nseg * od, tol);
    poison(dout, nseg * od * 4);    /* again: the counters were left zero */
    G->attention(G, ga, nseg);
    G->read(G, g, dout, nseg * od * 4);
    check_tol("  the same batch again", g, out, nseg * od, tol);
    if (G_fused) check_attention_fused(ga, sq, nseg, dout, od, t);
    for (int s = 0; s < nseg; s++) dseq_free(&sq[s]);
    G->release(G, dsinks), G->release(G, dout);
    free(sq), free(ca), free(ga), free(row), free(sinks), free(out), free(g);
}

/* Each sequence's ring holds the CPU's bytes. */
static void test_ring_store_batch(int nseg, int window, int hd, enum kv_dtype t)
{
    size_t rb = kv_region_bytes(t, window, hd);
    char *rings = malloc(nseg * rb), *drings = G->alloc(G, nseg * rb);
    for (size_t i = 0; i < nseg * rb; i++) rings[i] = (char)rnd();
    G->write(G, drings, rings, nseg * rb);
    float *kv = hrand((size_t)nseg * hd, 1.0f), *dkv = dcopy(kv, (size_t)nseg * hd * 4);
    ring_args *ca = calloc(nseg, sizeof *ca), *ga = calloc(nseg, sizeof *ga);
    for (int s = 0; s < nseg; s++) {
        int pos0 = dseq_pos(s, 100000, window);
        ca[s] = (ring_args){ rings + s * rb, kv + (size_t)s * hd, 1, pos0 };
        ga[s] = (ring_args){ drings + s * rb, dkv + (size_t)s * hd, 1, pos0 };
    }
    C->ring_store(C, ca, nseg, t, window, hd);
    G->ring_store(G, ga, nseg, t, window, hd);
    char *got = hcopy(drings, nseg * rb);
    size_t diff = 0;
    for (size_t i = 0; i < nseg * rb; i++) diff += got[i] != rings[i];
    ok(!diff && !G->error(G), "ring_store, a batch of %d sequences window=%d hd=%d %s: %zu of "
       "%zu bytes differ", nseg, window, hd, dname(t), diff, nseg * rb);
    G->release(G, drings), G->release(G, dkv);
    free(rings), free(kv), free(ca), free(ga), free(got);
}

/* The same bytes as the CPU (equal float32 input, exact encoders). */
static void test_ring_store(int window, int hd, int pos0, int n, enum kv_dtype t)
{
    size_t bytes = kv_region_bytes(t, window, hd);
    char *ring = (char *)hrand(bytes / 4, 1.0f);
    float *kv = hrand((size_t)n * hd, 3.0f);
    kv[0] = 0, kv[1] = -0.0f, kv[2] = 1e-7f, kv[3] = 1000.0f;     /* zeros, tiny, saturating */
    char *dring = dcopy(ring, bytes);
    float *dkv = dcopy(kv, (size_t)n * hd * 4);
    ring_args ca = { ring, kv, n, pos0 }, ga = { dring, dkv, n, pos0 };
    C->ring_store(C, &ca, 1, t, window, hd);
    G->ring_store(G, &ga, 1, t, window, hd);
    char *g = hcopy(dring, bytes);
    size_t diff = 0;
    for (size_t i = 0; i < bytes; i++) diff += g[i] != ring[i];
    ok(!diff && !G->error(G), "ring_store window=%d pos0=%d n=%d %s: %zu of %zu bytes differ",
       window, pos0, n, dname(t), diff, bytes);
    G->release(G, dring), G->release(G, dkv);
    free(ring), free(kv), free(g);
}

/* Bit for bit: rows of random magnitudes (groups spanning 2^-30..2^30),
 * a zero row, values that round to ties. */
static void test_kv_round(int T, int n, int ld, enum kv_dtype t)
{
    float *x = malloc((size_t)T * ld * sizeof *x);
    for (size_t i = 0; i < (size_t)T * ld; i++)
        x[i] = frand() * ldexpf(1.0f, (int)(rnd() % 61) - 30);
    for (int c = 0; c < n; c++) x[c] = 0;
    if (T > 1) x[ld] = 1.0625f, x[ld + 1] = 1.00390625f, x[ld + 2] = 448.0f;
    float *dx = dcopy(x, (size_t)T * ld * 4);
    C->kv_round(C, x, ld, T, n, t);
    G->kv_round(G, dx, ld, T, n, t);
    float *g = hcopy(dx, (size_t)T * ld * 4);
    size_t diff = 0;
    for (size_t i = 0; i < (size_t)T * ld; i++) diff += memcmp(&g[i], &x[i], 4) != 0;
    ok(!diff && !G->error(G), "kv_round T=%d n=%d %s: %zu of %zu floats differ", T, n, dname(t),
       diff, (size_t)T * ld);
    G->release(G, dx);
    free(x), free(g);
}

/* qk_prep against the CPU's ops in qk_args' order (rmsnorm, rope,
 * kv_round, scale).  q, qi and iw within TOL; kv as test_compress's
 * entries (float32 values equal to ~1e-7, then rounded to the cache's
 * dtype): relative L2 1e-4 (bf16), 2e-3 (fp8). */
static void test_qk_prep(int T, int nh, int hd, int npairs, int inh, int ihd, int ipairs,
                         enum kv_dtype t)
{
    int qd = nh * hd, iqd = inh * ihd;
    float *q = hrand((size_t)T * qd, 2.0f), *kv = hrand((size_t)T * hd, 2.0f);
    float *qi = inh ? hrand((size_t)T * iqd, 1.0f) : NULL;
    float *iw = inh ? hrand((size_t)T * inh, 1.0f) : NULL;
    float *kn = hrand(hd, 1.0f), *inv = malloc(npairs * 4), *iinv = malloc((ipairs + 1) * 4);
    for (int i = 0; i < npairs; i++) inv[i] = powf(10000.0f, -2.0f * i / (2 * npairs));
    for (int i = 0; i < ipairs; i++) iinv[i] = powf(160000.0f, -2.0f * i / (2 * ipairs));
    rope_table rt = { npairs, inv, 1.25f }, irt = { ipairs, iinv, 0.75f };
    int32_t *pos = malloc(T * 4);
    for (int i = 0; i < T; i++) pos[i] = rnd() % 1000000;
    float *dq = dcopy(q, (size_t)T * qd * 4), *dkv = dcopy(kv, (size_t)T * hd * 4);
    float *dqi = inh ? dcopy(qi, (size_t)T * iqd * 4) : NULL;
    float *diw = inh ? dcopy(iw, (size_t)T * inh * 4) : NULL;
    float *dkn = dcopy(kn, hd * 4);
    float sc = 1.0f / sqrtf((float)(inh ? inh : 1));
    C->rmsnorm(C, q, hd, T * nh, hd, NULL, 1e-6f, q, hd);
    C->rope(C, q, qd, T, nh, hd, &rt, pos, false);
    C->rmsnorm(C, kv, hd, T, hd, kn, 1e-6f, kv, hd);
    C->rope(C, kv, hd, T, 1, hd, &rt, pos, false);
    if (t != KV_F32) C->kv_round(C, kv, hd, T, hd, t);
    if (inh) {
        C->rope(C, qi, iqd, T, inh, ihd, &irt, pos, false);
        C->scale(C, iw, inh, T, inh, sc);
    }
    qk_args a = { .T = T, .pos = pos, .q = dq, .nh = nh, .hd = hd, .kv = dkv, .kv_norm = dkn,
                  .eps = 1e-6f, .rope = &rt, .dtype = t, .qi = dqi, .inh = inh, .ihd = ihd,
                  .irope = &irt, .iw = diw, .iw_scale = sc };
    G->qk_prep(G, &a);
    char name[112];
    float *g = hcopy(dq, (size_t)T * qd * 4);
    snprintf(name, sizeof name, "qk_prep q T=%d heads=%d hd=%d pairs=%d", T, nh, hd, npairs);
    check(name, g, q, (size_t)T * qd);
    free(g);
    g = hcopy(dkv, (size_t)T * hd * 4);
    snprintf(name, sizeof name, "qk_prep kv T=%d hd=%d %s", T, hd, dname(t));
    check_tol(name, g, kv, (size_t)T * hd, t == KV_FP8 ? 2e-3 : t == KV_BF16 ? 1e-4 : TOL);
    free(g);
    if (inh) {
        g = hcopy(dqi, (size_t)T * iqd * 4);
        snprintf(name, sizeof name, "qk_prep qi T=%d heads=%d hd=%d pairs=%d", T, inh, ihd,
                 ipairs);
        check(name, g, qi, (size_t)T * iqd);
        free(g);
        g = hcopy(diw, (size_t)T * inh * 4);
        snprintf(name, sizeof name, "qk_prep iw T=%d heads=%d", T, inh);
        check(name, g, iw, (size_t)T * inh);
        free(g);
        G->release(G, dqi), G->release(G, diw);
    }
    G->release(G, dq), G->release(G, dkv), G->release(G, dkn);
    free(q), free(kv), free(qi), free(iw), free(kn), free(inv), free(iinv), free(pos);
}

/* ---- mixture of experts: rank 1's slice of every expert ---- */

/* E experts of intermediate size I, this rank's slice [i0, i0 + ni); K
 * chosen per token. */
/* |W| of a view as a float32 weight (host). */
static qweight abs_w(const qweight *w)
{
    float *a = malloc((size_t)w->rows * w->cols * sizeof *a);
    for (int r = 0; r < w->rows; r++) {
        float *row = a + (size_t)r * w->cols;
        qweight_row(w, r, 0, w->cols, row);
        for (int c = 0; c < w->cols; c++) row[c] = fabsf(row[c]);
    }
    return (qweight){ .type = QT_F32, .rows = w->rows, .cols = w->cols, .data = a,
                      .ld = w->cols };
}

/* The bf16 / bf16x2 modes' MoE (64+ tokens): the experts' and the shared
 * expert's inputs x and g = swiglu(x.w1, x.w3) are rounded (relative u =
 * gemm_u() each) and every sum runs in another float32 order.  Per token
 * t and expert, first order plus the cross term: the pre-activations h1,
 * h3 move by at most a = (u + 2H 2^-24) (|W||x|); silu is 1.1-Lipschitz
 * and the clamps 1-Lipschitz, so g = silu(min(h1, L)) clamp(h3, L) moves
 * by at most dg = 1.1 a1 (|c3| + a3) + |s1| a3; rounding g adds u (|g| +
 * dg) and the w2 sum 2I 2^-24 of what it adds up: D.  The output then
 * moves by at most |W2| D.  The routed part is sum_k wt_k y_k with sum_k
 * wt_k <= routed_scale, so routed_scale times the largest of the bound
 * over all E experts bounds it whichever k were chosen; plus the shared
 * expert's own bound and the final additions (K + 2 terms of at most
 * routed_scale max|W2||g| and the shared |W2||g|, 2^-24 each, for both
 * sides).  Returns B [T][H] (the largest over experts, accumulated). */
static void moe_expert_bound(const qweight *w1, const qweight *w3, const qweight *w2,
                             const float *x, const float *ax, int T, int H, float limit,
                             float *bound, float *mag)
{
    int I = w1->rows;
    double u = gemm_u(), ein = u + 2.0 * H * 0x1p-24, esum = 2.0 * I * 0x1p-24;
    qweight a1w = abs_w(w1), a3w = abs_w(w3), a2w = abs_w(w2);
    float *h1 = malloc((size_t)T * I * 4), *h3 = malloc((size_t)T * I * 4);
    float *a1 = malloc((size_t)T * I * 4), *a3 = malloc((size_t)T * I * 4);
    float *b = malloc((size_t)T * H * 4), *m = malloc((size_t)T * H * 4);
    C->matmul(C, w1, x, H, T, h1, I);
    C->matmul(C, w3, x, H, T, h3, I);
    C->matmul(C, &a1w, ax, H, T, a1, I);
    C->matmul(C, &a3w, ax, H, T, a3, I);
    for (size_t i = 0; i < (size_t)T * I; i++) {
        double e1 = ein * a1[i], e3 = ein * a3[i];
        double v1 = fmin(h1[i], limit), c3 = fmax(fmin(h3[i], limit), -limit);
        double s1 = v1 / (1 + exp(-v1)), g = s1 * c3;
        double dg = 1.1 * e1 * (fabs(c3) + e3) + fabs(s1) * e3;
        double D = dg + u * (fabs(g) + dg);
        a1[i] = (float)(D + esum * (fabs(g) + D));     /* D */
        a3[i] = (float)fabs(g);                         /* |g| */
    }
    C->matmul(C, &a2w, a1, I, T, b, H);
    C->matmul(C, &a2w, a3, I, T, m, H);
    for (size_t i = 0; i < (size_t)T * H; i++) {
        bound[i] = fmaxf(bound[i], b[i]);
        mag[i] = fmaxf(mag[i], m[i]);
    }
    free((void *)a1w.data), free((void *)a3w.data), free((void *)a2w.data);
    free(h1), free(h3), free(a1), free(a3), free(b), free(m);
}

static void moe_bound_check(const char *name, const moe_args *a, const float *got,
                            const float *want)
{
    int T = a->T, H = a->H, K = a->topk;
    float *ax = malloc((size_t)T * H * 4);
    for (size_t i = 0; i < (size_t)T * H; i++) ax[i] = fabsf(a->x[i]);
    float *br = calloc((size_t)T * H, 4), *mr = calloc((size_t)T * H, 4);
    float *bs = calloc((size_t)T * H, 4), *ms = calloc((size_t)T * H, 4);
    for (int e = 0; e < a->n_experts; e++)
        moe_expert_bound(&a->w1[e], &a->w3[e], &a->w2[e], a->x, ax, T, H, a->limit, br, mr);
    moe_expert_bound(a->sw1, a->sw3, a->sw2, a->x, ax, T, H, a->limit, bs, ms);
    size_t over = 0, bad = 0;
    double worst = 0, rs = a->routed_scale * (1 + 1e-6);
    for (size_t i = 0; i < (size_t)T * H; i++) {
        double sum = rs * mr[i] + ms[i];
        double bound = (rs * br[i] + bs[i] + 2.0 * (K + 2) * 0x1p-24 * sum) * (1 + 1e-4);
        double e = fabs((double)got[i] - want[i]);
        bad += isnan(got[i]);
        over += !(e <= bound);
        worst = fmax(worst, bound > 0 ? e / bound : 0);
    }
    ok(!over && !bad && !G->error(G), "[%s GEMMs] %s: %zu of %d elements past the derived "
       "bound (largest error %.2f of its bound); rel L2 %.2e", gemm_names[gemm_mode], name, over,
       T * H, worst, rel_err(got, want, (size_t)T * H));
    free(ax), free(br), free(mr), free(bs), free(ms);
}

/* Routing of test_moe: top-k of sqrt(softplus) scores (V4), the hash
 * table (V4's first layers), top-k of sigmoid scores (V3). */
enum { ROUTE_TOPK, ROUTE_HASH, ROUTE_SIGMOID };

/* Added to the scale bytes (UE8M0 exponents) of the experts' and the
 * shared expert's down projections by test_moe: weights far from 1 both
 * ways, the whole output scaled alike (relative checks hold); in
 * particular scales above 2^1, which cu_moe_tiles_mma decodes in two
 * steps.  (Up projections: SwiGLU's clamps would hide their scale.) */
static int moe_w2_shift;

static void shift_scales(qweight *w, int by)
{
    size_t n = w->type == QT_MXFP4 ? (size_t)w->rows * w->scale_ld
                                   : (size_t)(w->rows + 127) / 128 * w->scale_ld;
    for (size_t i = 0; i < n; i++) ((uint8_t *)w->scale)[i] += by;
}

static void test_moe(int T, int routing, int H, int E, int K, int I, int i0, int ni)
{
    bool hash = routing == ROUTE_HASH;
    int vocab = 50;
    qweight gate = make_w(QT_BF16, E, H);
    qweight *w1 = calloc(6 * (size_t)E, sizeof *w1), *w2 = w1 + E, *w3 = w2 + E, *g1 = w3 + E,
            *g2 = g1 + E, *g3 = g2 + E;
    for (int e = 0; e < E; e++) {
        qweight a = make_w(QT_MXFP4, I, H), b = make_w(QT_MXFP4, H, I), c = make_w(QT_MXFP4, I, H);
        shift_scales(&b, moe_w2_shift);
        g1[e] = w1[e] = qweight_view(&a, i0, ni, 0, H);
        g2[e] = w2[e] = qweight_view(&b, 0, H, i0, ni);
        g3[e] = w3[e] = qweight_view(&c, i0, ni, 0, H);
    }
    qweight s1f = make_w(QT_FP8, I, H), s2f = make_w(QT_FP8, H, I), s3f = make_w(QT_FP8, I, H);
    shift_scales(&s2f, moe_w2_shift);
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
    bias[E - 1] = -100.0f;     /* top-k never picks the last expert: it gets no slots */
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
                   .topk = K, .routed_scale = 1.5f, .limit = 2.5f,
                   .sigmoid_scores = routing == ROUTE_SIGMOID, .w1 = w1, .w2 = w2, .w3 = w3,
                   .sw1 = &s1, .sw2 = &s2, .sw3 = &s3, .out = out };
    backend *ref = gemm_mode == GEMM_FP8 ? C8 : C;
    ref->moe(ref, &a);
    a.x = dx, a.gate = &gg, a.bias = hash ? NULL : dbias, a.tid2eid = hash ? dtid : NULL;
    a.w1 = g1, a.w2 = g2, a.w3 = g3, a.sw1 = &gs1, a.sw2 = &gs2, a.sw3 = &gs3, a.out = dout;
    G->moe(G, &a);
    float *g = hcopy(dout, (size_t)T * H * 4);
    char name[384];
    const char *fe = getenv("LLM_CUDA_MOE_DECODE");
    const char *f8 = getenv("LLM_CUDA_MOE_FP8");
    const char *mm = getenv("LLM_CUDA_MOE_MMA"), *mt = getenv("LLM_CUDA_MOE_MMA_MIN_T");
    bool tiles = T >= (mt ? atoi(mt) : 9);     /* the sorted expert tiles (backend_cuda.cu) */
    /* the fused decode MoE's up and down on tensor cores (x and g split
     * as the tiles split them; not under f32) */
    const char *dm = getenv("LLM_CUDA_MOE_DEC_MMA"), *rf = getenv("LLM_CUDA_MOE_ROUTE_FIRST");
    bool decmma = !tiles && T <= (fe ? atoi(fe) : 2) && !(dm && !strcmp(dm, "0")) &&
                  !(rf && !strcmp(rf, "0")) && gemm_mode != GEMM_F32;
    snprintf(name, sizeof name, "moe %s routing T=%d H=%d (E=%d K=%d, rank slice %d+%d of %d "
             "in MXFP4 experts)%s%s%s%s%s%s%s", hash ? "hash" : routing == ROUTE_SIGMOID ? "sigmoid" : "top-k",
             T, H, E, K, i0, ni, I, !tiles && T > (fe ? atoi(fe) : 2) ? " separate launches" : "",
             gemm_mode == GEMM_FP8 && f8 && !strcmp(f8, "0") ? " bf16 expert kernel" : "",
             moe_w2_shift > 0 ? " w2 scales x2^100" : moe_w2_shift < 0 ? " w2 scales x2^-100" : "",
             tiles && mm && !strcmp(mm, "0") ? " expert tiles on the GEMV" : "",
             tiles && T <= 8 ? " expert tiles (LLM_CUDA_MOE_MMA_MIN_T)" : "",
             decmma ? " on tensor cores (LLM_CUDA_MOE_DEC_MMA)" : "",
             getenv("LLM_CUDA_ROUTE_REGS") ? " LLM_CUDA_ROUTE_REGS=0" : "");
    if (T >= LT_MIN_T && (gemm_mode == GEMM_BF16 || gemm_mode == GEMM_BF16X2)) {
        a.x = x, a.gate = &gate, a.w1 = w1, a.w2 = w2, a.w3 = w3;
        a.sw1 = &s1, a.sw2 = &s2, a.sw3 = &s3;
        moe_bound_check(name, &a, g, out);
    } else {
        check_tol(name, g, out, (size_t)T * H,
                  decmma                          ? 4 * 0x1p-16 + TOL
                  : !tiles || gemm_mode == GEMM_F32 ? TOL
                  : T < LT_MIN_T                  ? 4 * 0x1p-16 + TOL
                                                  : 1e-2);
    }
    G->release(G, dx), G->release(G, dbias), G->release(G, dtid), G->release(G, dout);
    free(bias), free(x), free(tid), free(ids), free(out), free(g), free(w1);
}

/* The expert tiles' cases on backend b (a switch of their own): decode
 * batches of 9-64 tokens, V4's 4,096 columns, and experts of several
 * tiles (E = 8, T = 40, 100). */
static void moe_tile_cases(backend *b)
{
    backend *keep = G;
    G = b;
    int ts[] = { 9, 16, 32, 63, 64 };
    for (int i = 0; i < 5; i++) test_moe(ts[i], i % 2, 1024, 32, 6, 512, 256, 256);
    test_moe(64, false, 4096, 64, 6, 1024, 512, 512);
    test_moe(40, true, 128, 8, 2, 128, 64, 64);
    test_moe(100, false, 128, 8, 2, 128, 64, 64);
    G = keep;
}

/* hc_pre_norm with the MoE router in its clusters (hc_pre_norm_route,
 * hc = 4), then the moe op it routed, against hc_pre_norm and the moe op
 * routing for itself on the same backend (G) from the same inputs: the
 * mHC outputs within TOL of the CPU's; the MoE output within TOL of the
 * other path's and of the CPU's moe op on the normed rows the GPU made
 * (the same experts: a choice or a weight gone wrong moves it by far
 * more).  ties: K + 1 experts share one gate row and a bias that puts
 * them first, so the K lowest of them must be chosen, as the CPU does. */
static void test_hc_route(int T, int H, int E, int K, bool sigmoid, bool ties)
{
    int hc = 4, mix = (2 + hc) * hc, n = hc * H, I = 32;
    float *h = hrand((size_t)T * n, 1.0f), *fn = hrand((size_t)mix * n, 0.05f);
    float *base = hrand(mix, 0.5f), *scale = hrand(3, 1.0f), *nw = hrand(H, 1.0f);
    float *y = hrand((size_t)T * H, 1.0f), *post = hrand((size_t)T * hc, 1.0f);
    float *comb = hrand((size_t)T * hc * hc, 0.5f), *bias = hrand(E, 0.1f);
    qweight gate = make_w(QT_BF16, E, H);
    if (ties)
        for (int j = 1; j <= K; j++) {
            memcpy((uint16_t *)gate.data + (size_t)(3 + j) * H, (uint16_t *)gate.data + 3 * H,
                   (size_t)H * 2);
            bias[3] = bias[3 + j] = 50.0f;
        }
    qweight *w1 = calloc(3 * (size_t)E, sizeof *w1), *w2 = w1 + E, *w3 = w2 + E;
    for (int e = 0; e < E; e++)
        w1[e] = make_w(QT_MXFP4, I, H), w2[e] = make_w(QT_MXFP4, H, I),
        w3[e] = make_w(QT_MXFP4, I, H);
    qweight s1 = make_w(QT_FP8, I, H), s2 = make_w(QT_FP8, H, I), s3 = make_w(QT_FP8, I, H);
    /* the CPU: hc_post, hc_pre, rmsnorm, moe */
    float *col = malloc((size_t)T * H * 4), *xn = malloc((size_t)T * H * 4);
    float *out = malloc((size_t)T * H * 4), *h0 = malloc((size_t)T * n * 4);
    float *post0 = malloc((size_t)T * hc * 4), *comb0 = malloc((size_t)T * hc * hc * 4);
    memcpy(h0, h, (size_t)T * n * 4);
    memcpy(post0, post, (size_t)T * hc * 4), memcpy(comb0, comb, (size_t)T * hc * hc * 4);
    C->hc_post(C, h, y, post, comb, T, hc, H);
    C->hc_pre(C, h, T, hc, H, fn, base, scale, 20, 1e-6f, 1e-6f, post, comb, col);
    C->rmsnorm(C, col, H, T, H, nw, 1e-6f, xn, H);
    moe_args a = { .T = T, .H = H, .x = xn, .gate = &gate, .bias = bias, .n_experts = E,
                   .topk = K, .routed_scale = 1.5f, .limit = 2.5f, .sigmoid_scores = sigmoid,
                   .w1 = w1, .w2 = w2, .w3 = w3, .sw1 = &s1, .sw2 = &s2, .sw3 = &s3, .out = out };
    C->moe(C, &a);
    /* the GPU, fused (f = 0) and not (f = 1) */
    qweight gg = up(&gate), gs1 = up(&s1), gs2 = up(&s2), gs3 = up(&s3);
    if (G->upload_weights(G, w1, E) || G->upload_weights(G, w2, E) ||
        G->upload_weights(G, w3, E))
        diag("upload experts: %s", G->error(G));
    float *got[2][6];
    bool fused = false;
    for (int f = 0; f < 2; f++) {
        float *dh = dcopy(h0, (size_t)T * n * 4), *dfn = dcopy(fn, (size_t)mix * n * 4);
        float *dbase = dcopy(base, mix * 4), *dscale = dcopy(scale, 12), *dw = dcopy(nw, H * 4);
        float *dy = dcopy(y, (size_t)T * H * 4), *dpost = dcopy(post0, (size_t)T * hc * 4);
        float *dcomb = dcopy(comb0, (size_t)T * hc * hc * 4), *dbias = dcopy(bias, E * 4);
        float *dcol = G->alloc(G, (size_t)T * H * 4), *dxn = G->alloc(G, (size_t)T * H * 4);
        float *dout = G->alloc(G, (size_t)T * H * 4);
        poison(dcol, (size_t)T * H * 4), poison(dxn, (size_t)T * H * 4);
        poison(dout, (size_t)T * H * 4);
        moe_args ga = a;
        ga.x = dxn, ga.gate = &gg, ga.bias = dbias, ga.sw1 = &gs1, ga.sw2 = &gs2, ga.sw3 = &gs3;
        ga.out = dout;
        if (f == 0)
            fused = ga.routed = G->hc_pre_norm_route(G, dh, dy, T, hc, H, dfn, dbase, dscale, 20,
                                                     1e-6f, 1e-6f, dpost, dcomb, dcol, dw, dxn,
                                                     &ga);
        else
            G->hc_pre_norm(G, dh, dy, T, hc, H, dfn, dbase, dscale, 20, 1e-6f, 1e-6f, dpost,
                           dcomb, dcol, dw, dxn);
        G->moe(G, &ga);
        float *dev[] = { dpost, dcomb, dcol, dxn, dh, dout };
        size_t len[] = { (size_t)T * hc, (size_t)T * hc * hc, (size_t)T * H, (size_t)T * H,
                         (size_t)T * n, (size_t)T * H };
        for (int i = 0; i < 6; i++) got[f][i] = hcopy(dev[i], len[i] * 4);
        void *d[] = { dh, dfn, dbase, dscale, dw, dy, dpost, dcomb, dbias, dcol, dxn, dout };
        for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) G->release(G, d[i]);
    }
    char name[160];
    snprintf(name, sizeof name, "hc_pre_norm_route T=%d H=%d E=%d K=%d%s%s", T, H, E, K,
             sigmoid ? " sigmoid" : "", ties ? " ties" : "");
    ok(fused && !G->error(G), "%s: takes the fused path", name);
    const float *want[] = { post, comb, col, xn, h };
    size_t len[] = { (size_t)T * hc, (size_t)T * hc * hc, (size_t)T * H, (size_t)T * H,
                     (size_t)T * n };
    const char *what[] = { "post", "comb (Sinkhorn)", "collapsed", "normed", "streams" };
    for (int i = 0; i < 5; i++) {
        char nm[224];
        snprintf(nm, sizeof nm, "%s: %s", name, what[i]);
        check(nm, got[0][i], want[i], len[i]);
    }
    char nm[224];
    snprintf(nm, sizeof nm, "%s: moe output as with the moe op's own router", name);
    check(nm, got[0][5], got[1][5], (size_t)T * H);
    a.x = got[0][3], a.gate = &gate, a.bias = bias, a.sw1 = &s1, a.sw2 = &s2, a.sw3 = &s3;
    a.routed = false;
    C->moe(C, &a);
    snprintf(nm, sizeof nm, "%s: moe output as the CPU's from the same normed rows", name);
    check(nm, got[0][5], out, (size_t)T * H);
    for (int f = 0; f < 2; f++)
        for (int i = 0; i < 6; i++) free(got[f][i]);
    free(h), free(fn), free(base), free(scale), free(nw), free(y), free(post), free(comb);
    free(bias), free(col), free(xn), free(out), free(h0), free(post0), free(comb0), free(w1);
}

/* ---- all-reduce over two devices ---- */

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

/* Sums of `iters` back-to-back in-place all-reduces: fl(h0 + h1) * 2^(iters-1)
 * on both ranks, bit for bit (doubling is exact). */
static void allreduce_case(backend **b, tp_group *g, size_t n, int iters, const char *path)
{
    float *h0 = hrand(n, 1.0f), *h1 = hrand(n, 1.0f);
    ar_job J = { b, { NULL, NULL }, n, iters, { 0, 0 } };
    J.buf[0] = b[0]->alloc(b[0], n * 4);
    J.buf[1] = b[1]->alloc(b[1], n * 4);
    b[0]->write(b[0], J.buf[0], h0, n * 4);
    b[1]->write(b[1], J.buf[1], h1, n * 4);
    tp_run(g, ar_rank, &J);
    float *r0 = malloc(n * 4), *r1 = malloc(n * 4);
    b[0]->read(b[0], r0, J.buf[0], n * 4);
    b[1]->read(b[1], r1, J.buf[1], n * 4);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += r0[i] != ldexpf(h0[i] + h1[i], iters - 1) || memcmp(&r1[i], &r0[i], 4);
    ok(!bad && !b[0]->error(b[0]) && !b[1]->error(b[1]),
       "all-reduce (%s) of %zu floats over 2 devices, %d back to back: %zu wrong %s", path, n,
       iters, bad, b[0]->error(b[0]) ? b[0]->error(b[0]) : "");
    b[0]->release(b[0], J.buf[0]);
    b[1]->release(b[1], J.buf[1]);
    free(h0), free(h1), free(r0), free(r1);
}

/* The default group (one-shot over peer memory up to 256K floats, NCCL
 * above and for odd sizes), then an NCCL-only one (LLM_CUDA_ALLREDUCE=nccl). */
static void test_allreduce(void)
{
    if (llm_cuda_device_count() < 2) {
        skip(12, "all-reduce needs 2 CUDA devices");
        return;
    }
    tp_group *g = tp_group_new(2);
    for (int pass = 0; pass < 2; pass++) {
        const char *path = pass ? "NCCL" : "default";
        if (pass) setenv("LLM_CUDA_ALLREDUCE", "nccl", 1);
        backend *b[2];
        char err[256];
        backend_modes modes = BACKEND_MODES_DEFAULT;   /* LLM_CUDA_* override */
        if (backend_modes_env(&modes, err, sizeof err)
            || backend_cuda_new_group(2, &modes, b, err, sizeof err)) {
            ok(0, "CUDA group of 2 (%s): %s", path, err);
            continue;
        }
        size_t sizes[] = { 1, 4096, 4100, 65536, 262144, 1 << 20 };
        for (int si = 0; si < 6; si++) allreduce_case(b, g, sizes[si], si == 1 ? 1 : 64, path);
        /* Latency (reported, not asserted): back-to-back all-reduces. */
        size_t lat[] = { 2048, 4096, 4096 * 4, 4096 * 64 };
        for (int si = 0; si < 4; si++) {
            ar_job J = { b, { NULL, NULL }, lat[si], 20, { 0, 0 } };
            J.buf[0] = b[0]->alloc(b[0], lat[si] * 4);
            J.buf[1] = b[1]->alloc(b[1], lat[si] * 4);
            tp_run(g, ar_rank, &J);
            J.iters = 1000;
            tp_run(g, ar_rank, &J);
            diag("all-reduce (%s) %zu KB: %.1f us each (%d back to back)", path,
                 lat[si] * 4 / 1024, J.secs[0] / J.iters * 1e6, J.iters);
            b[0]->release(b[0], J.buf[0]);
            b[1]->release(b[1], J.buf[1]);
        }
        b[0]->destroy(b[0]);
        b[1]->destroy(b[1]);
    }
    unsetenv("LLM_CUDA_ALLREDUCE");
    tp_group_free(g);
}

static void test_moes(void)
{
    test_moe(1, false, 128, 8, 2, 128, 64, 64);
    test_moe(1, true, 128, 8, 2, 128, 64, 64);
    test_moe(5, false, 128, 8, 2, 128, 64, 64);
    /* decode sizes, MXFP4 experts and an FP8 shared expert: the fused
     * decode MoE (moe_decode.cuh: routing in a launch before the expert
     * kernels, the shared expert in the same grids) on matmul.cu's
     * float32 kernels (LLM_CUDA_MOE_DEC_MMA=0; by default f32's), every
     * T <= 8, each routing, three draws of weights and inputs (one in the
     * prefill modes' passes: no mode changes T <= 8); then the separate
     * launches it replaces (LLM_CUDA_MOE_DECODE=0), still the path of
     * other formats (LLM_CUDA_MOE_MMA_MIN_T=9: not the expert tiles, the
     * default from 3 tokens on) */
    setenv("LLM_CUDA_MOE_MMA_MIN_T", "9", 1);
    setenv("LLM_CUDA_MOE_DECODE", "8", 1);
    setenv("LLM_CUDA_MOE_DEC_MMA", "0", 1);
    for (int draw = 0; draw < (gemm_mode == GEMM_F32 ? 3 : 1); draw++)
        for (int T = 1; T <= 8; T++)
            for (int r = ROUTE_TOPK; r <= ROUTE_SIGMOID; r++)
                test_moe(T, r, 1024, 32, 6, 512, 256, 256);
    setenv("LLM_CUDA_MOE_DECODE", "0", 1);
    for (int T = 1; T <= 8; T++) test_moe(T, T % 2 == 0, 1024, 32, 6, 512, 256, 256);
    test_moe(2, false, 256, 8, 3, 96, 32, 48);
    setenv("LLM_CUDA_MOE_DECODE", "8", 1);
    test_moe(1, false, 4096, 16, 6, 256, 128, 128);
    test_moe(8, true, 4096, 16, 6, 256, 128, 128);
    /* the fused decode MoE with its routing in the up kernel's blocks
     * (by default route_kernel's launch before it) */
    setenv("LLM_CUDA_MOE_ROUTE_FIRST", "0", 1);
    for (int T = 1; T <= 8; T += 7)
        for (int r = ROUTE_TOPK; r <= ROUTE_SIGMOID; r++)
            test_moe(T, r, 4096, 16, 6, 256, 128, 128);
    test_moe(3, false, 512, 256, 6, 128, 64, 64);
    unsetenv("LLM_CUDA_MOE_ROUTE_FIRST");
    /* its up and down kernels on tensor cores (moe_decode_mma.cu, the
     * default; f32 keeps matmul.cu's): every T <= 8 and
     * routing, the up kernel's column slices 2 and 8 (default 4), E = 256,
     * a 64-column slice (half a chunk of w2: the lanes past it idle), w2
     * scales 2^+-100 (bf16 multipliers past one pair), a 48-column slice
     * (not whole scale blocks: matmul.cu's kernels), routing in the up
     * kernel (the switch needs route_kernel first: matmul.cu's) */
    unsetenv("LLM_CUDA_MOE_DEC_MMA");
    for (int T = 1; T <= 8; T++)
        for (int r = ROUTE_TOPK; r <= ROUTE_SIGMOID; r++)
            test_moe(T, r, 1024, 32, 6, 512, 256, 256);
    for (int sl = 2; sl <= 8; sl *= 4) {
        setenv("LLM_CUDA_MOE_DEC_MMA_S", sl == 2 ? "2" : "8", 1);
        test_moe(1, false, 4096, 16, 6, 256, 128, 128);
        test_moe(5, true, 1024, 32, 6, 512, 256, 256);
    }
    unsetenv("LLM_CUDA_MOE_DEC_MMA_S");
    test_moe(1, false, 4096, 16, 6, 256, 128, 128);
    test_moe(8, true, 4096, 16, 6, 256, 128, 128);
    test_moe(2, false, 512, 256, 6, 128, 64, 64);
    test_moe(1, false, 128, 8, 2, 128, 64, 64);
    for (moe_w2_shift = -100; moe_w2_shift <= 100; moe_w2_shift += 200)
        test_moe(2, false, 1024, 32, 6, 512, 256, 256);
    moe_w2_shift = 0;
    test_moe(2, false, 256, 8, 3, 96, 32, 48);
    setenv("LLM_CUDA_MOE_ROUTE_FIRST", "0", 1);
    test_moe(1, false, 1024, 32, 6, 512, 256, 256);
    unsetenv("LLM_CUDA_MOE_ROUTE_FIRST");
    unsetenv("LLM_CUDA_MOE_DECODE");
    unsetenv("LLM_CUDA_MOE_MMA_MIN_T");
    /* decode sizes through the sorted expert tiles (on tensor cores but
     * under f32), LLM_CUDA_MOE_MMA_MIN_T=1: the comparison issue 13 needs
     * (tiles of one or a few slots) */
    setenv("LLM_CUDA_MOE_MMA_MIN_T", "1", 1);
    for (int T = 1; T <= 8; T++) test_moe(T, T % 3, 1024, 32, 6, 512, 256, 256);
    unsetenv("LLM_CUDA_MOE_MMA_MIN_T");
    /* E = 256 (V4's) with K = 6: the router's scratch in the kernel */
    test_moe(3, false, 512, 256, 6, 128, 64, 64);
    /* more experts than moe_sort's block has threads (its scans carry
     * across chunks of 1,024), tiles of 4 and of 8 slots */
    test_moe(40, false, 128, 1100, 4, 64, 0, 64);
    test_moe(300, true, 128, 1100, 4, 64, 0, 64);
    /* a slice of 48 columns: w2's rows are not whole 16-byte loads */
    test_moe(2, false, 256, 8, 3, 96, 32, 48);
    test_moe(1, true, 256, 8, 3, 96, 32, 48);
    /* decode batches (fewer than 32 slots per expert): the experts in
     * tiles of up to 8 slots, on tensor cores (cu_moe_tiles_mma; f32:
     * the GEMV over the tiles): w1 and w3 over clusters of blocks, odd
     * tiles, experts with several tiles (E = 8), T = 64 (bf16 and
     * bf16x2: the derived bound; fp8: act_quant(x) unsplit); a slice
     * starting at column 16 (w2 not on 32-column boundaries: the GEMV,
     * while w1 and w3 take the kernel) */
    test_moe(9, false, 1024, 32, 6, 512, 256, 256);
    test_moe(16, false, 1024, 32, 6, 512, 256, 256);
    test_moe(32, true, 1024, 32, 6, 512, 256, 256);
    test_moe(32, false, 1024, 64, 6, 1024, 512, 512);
    test_moe(63, false, 1024, 32, 6, 512, 256, 256);
    test_moe(64, true, 1024, 64, 6, 1024, 512, 512);
    test_moe(64, false, 2048, 32, 6, 512, 256, 256);
    test_moe(64, true, 4096, 64, 6, 1024, 512, 512);   /* V4's columns: clusters */
    /* E = 256 (~200 experts chosen): w2's blocks stream 3 row groups of
     * 256 rows each through one pipeline of 128-byte lines and scale
     * chunks (R > 1, as rank6's w2 at B = 32-64) */
    test_moe(64, false, 4096, 256, 6, 512, 0, 512);
    test_moe(40, false, 128, 8, 2, 128, 64, 64);
    test_moe(40, true, 128, 8, 2, 128, 64, 64);
    test_moe(40, false, 256, 8, 3, 96, 16, 48);
    test_moe(100, false, 128, 8, 2, 128, 64, 64);  /* routed: tiles; shared expert: cuBLASLt */
    /* scales above 2^1 (two multiplies) in w2's tiles on the old copies
     * (a view of 256 columns) and on the 128-byte lines (1,024 columns:
     * the stage pairs' compile-time choice of the two-multiply decode) */
    for (moe_w2_shift = -100; moe_w2_shift <= 100; moe_w2_shift += 200) {
        test_moe(32, false, 1024, 32, 6, 512, 256, 256);
        test_moe(32, false, 1024, 32, 6, 1024, 0, 1024);
    }
    moe_w2_shift = 0;
    /* the shared expert after the routed experts on one stream
     * (LLM_CUDA_MOE_SIDE=0; G runs it beside them on a second stream):
     * the same kernels, within the same bounds of the CPU, at T = 9, 16,
     * 32 and 64 and with E = 8 at 40 */
    if (G_moe_side && gemm_mode == GEMM_BF16X2) {
        backend *keep = G;
        G = G_moe_side;
        int ts[] = { 9, 16, 32, 64 };
        for (int i = 0; i < 4; i++) test_moe(ts[i], i % 2, 1024, 32, 6, 512, 256, 256);
        test_moe(40, true, 128, 8, 2, 128, 64, 64);
        G = keep;
    }
    /* w1 and w3 over w2's tiles of up to 8 slots (LLM_CUDA_MOE_TILE_M=8;
     * G: tiles of 4 of their own, x staged in 4 rows, the mma's tokens g
     * and g + 4 reading one of them, the upper four's sums dropped; their
     * 4,096 columns over clusters of 2 blocks, at 8 of 4); experts of
     * several tiles (E = 8, T = 40, 100) */
    if (G_tiles_m8 && gemm_mode == GEMM_BF16X2) moe_tile_cases(G_tiles_m8);
    /* the copies of 64 bytes a row and stage everywhere (LLM_CUDA_MOE_L2=0;
     * G takes them only where a view is not on 512-column boundaries: H =
     * 128, w2's columns from 256 at H = 1024) */
    if (G_tiles_64 && gemm_mode == GEMM_BF16X2) moe_tile_cases(G_tiles_64);
    /* the GEMV over the tiles they replace (LLM_CUDA_MOE_MMA=0: a
     * backend of its own, the switch is read at creation) */
    if (G_tiles_gemv && gemm_mode == GEMM_BF16X2) {
        backend *keep = G;
        G = G_tiles_gemv;
        test_moe(32, true, 1024, 32, 6, 512, 256, 256);
        test_moe(64, false, 1024, 64, 6, 1024, 512, 512);
        /* the plan of one block an SM: every column in one block; at
         * E = 256, 2048 x 1024 and 1024 x 2048 views, 2 row groups of 256
         * rows a block (w1 with w3, and w2) through one pipeline */
        G = G_tiles_1sm;
        test_moe(32, false, 1024, 32, 6, 512, 256, 256);
        test_moe(32, false, 2048, 256, 6, 1024, 0, 1024);
        G = keep;
    }
    /* 32+ slots per expert: the grouped expert GEMMs (moe_gemm.cu; f32:
     * cuBLASLt per expert), partial tiles, odd counts, under top-k one
     * expert without slots */
    test_moe(300, false, 128, 8, 2, 128, 64, 64);
    test_moe(300, true, 256, 8, 2, 128, 64, 64);
    test_moe(600, false, 1024, 32, 6, 512, 256, 256);
    /* k tails (H = 160; w2's 96 columns), a slice of 48 that starts
     * inside a scale block (w2 element by element, w1 rows past the
     * slice in a block) */
    test_moe(300, true, 160, 8, 2, 192, 96, 96);
    test_moe(300, false, 256, 8, 3, 96, 16, 48);
    /* the router's shared-memory form everywhere (LLM_CUDA_ROUTE_REGS=0;
     * the cases above ran the register form where it applies: E <= 256
     * scored, else route_warp): the decode MoE (1 and 2 tokens), the
     * tiles (5, 40), the grouped GEMMs (300); E = 32, 256 (V4's), 1,100
     * and hashed */
    setenv("LLM_CUDA_ROUTE_REGS", "0", 1);
    for (int r = ROUTE_TOPK; r <= ROUTE_SIGMOID; r++) {
        test_moe(1, r, 1024, 32, 6, 512, 256, 256);
        test_moe(2, r, 512, 256, 6, 128, 64, 64);
        test_moe(5, r, 1024, 32, 6, 512, 256, 256);
    }
    test_moe(40, false, 128, 1100, 4, 64, 0, 64);
    test_moe(300, true, 128, 8, 2, 128, 64, 64);
    test_moe(300, false, 256, 8, 3, 96, 16, 48);
    unsetenv("LLM_CUDA_ROUTE_REGS");
    if (gemm_mode != GEMM_FP8) return;
    /* fp8: the grouped GEMMs on FP8 tensor cores (moe_gemm_fp8.cu; the
     * cases above with 32+ slots per expert ran there too, except the
     * slice starting inside a scale block: moe_gemm.cu's bf16 kernel),
     * one tile or less per expert (T = 64), partial tiles, several
     * tiles per expert with odd counts (T = 1500: 290 slots each); then
     * the bf16 kernel they replace (LLM_CUDA_MOE_FP8=0) */
    test_moe(64, false, 256, 8, 6, 128, 64, 64);
    test_moe(100, true, 1024, 8, 4, 256, 128, 128);
    test_moe(1500, false, 1024, 32, 6, 512, 256, 256);
    /* widths of 512: every matrix's scale rows read 16 bytes at a time
     * (V4's rank shapes; w2's slice starts at column 512) */
    test_moe(200, false, 512, 8, 4, 1024, 512, 512);
    setenv("LLM_CUDA_MOE_FP8", "0", 1);
    test_moe(300, true, 160, 8, 2, 192, 96, 96);
    test_moe(600, false, 1024, 32, 6, 512, 256, 256);
    unsetenv("LLM_CUDA_MOE_FP8");
}

/* The mHC of decode batches over slices of two column chunks
 * (LLM_CUDA_HC_SLICE_CHUNKS=2): half the slices for the collapse's blocks
 * to add (T = 32: 64; 64: 2 groups x 64; 20: the fewest tokens that take
 * the two launches). */
static void hc_slice_cases(backend *g2chunks)
{
    backend *keep = G;
    const char *keep_v = hc_variant;
    G = g2chunks, hc_variant = " (LLM_CUDA_HC_SLICE_CHUNKS=2)";
    for (int wy = 0; wy < 2; wy++) {
        test_hc_pre_norm(20, 4, 4096, true, wy);
        test_hc_pre_norm(32, 4, 4096, true, wy);
        test_hc_pre_norm(64, 4, 4096, true, wy);
    }
    G = keep, hc_variant = keep_v;
}

/* hc_pre_norm's one launch three ways: in clusters of 16 blocks a token
 * (gf, the default for hc = 4), with its last block (g_clu0:
 * LLM_CUDA_HC_PRE_CLUSTER=0) and that last block as before (g_tail0: also
 * LLM_CUDA_HC_PRE_TAIL=0). */
static void hc_tail_cases(backend *gf, backend *g_clu0, backend *g_tail0)
{
    /* the last block as before: against the CPU, and g_clu0's (hc_tail)
     * bit for bit against it; H = 5760: HC_TAIL_Q columns for every
     * collapsing thread, 5764: past hc_tail (the old last block either
     * way) */
    G = g_tail0, hc_variant = " (LLM_CUDA_HC_PRE_TAIL=0, LLM_CUDA_HC_PRE_CLUSTER=0)";
    for (int wy = 0; wy < 2; wy++) {
        test_hc_pre_norm(1, 4, 4096, true, wy);
        test_hc_pre_norm(8, 4, 4096, false, wy);
    }
    G = g_clu0, hc_variant = " (LLM_CUDA_HC_PRE_CLUSTER=0)";
    for (int wy = 0; wy < 2; wy++) {
        test_hc_pre_norm_same(g_tail0, 1, 4, 4096, wy);
        test_hc_pre_norm_same(g_tail0, 2, 4, 4096, wy);
        test_hc_pre_norm_same(g_tail0, 8, 4, 4096, wy);
        test_hc_pre_norm_same(g_tail0, 19, 4, 1024, wy);    /* the one launch's last count */
        test_hc_pre_norm(20, 4, 4096, true, wy);            /* the two launches' first */
        /* the two launches' collapse in hc_tail's form (T >= 20) against
         * the old, bit for bit; 5760 past its shape at 480 threads */
        test_hc_pre_norm_same(g_tail0, 20, 4, 4096, wy);
        test_hc_pre_norm_same(g_tail0, 64, 4, 1000, wy);
        test_hc_pre_norm_same(g_tail0, 24, 2, 128, wy);
        test_hc_pre_norm(24, 4, 5760, true, wy);
        /* the model asks for no collapsed rows: each form without them
         * (scratch where it needs them), the rest unchanged */
        test_hc_pre_norm_as(g_tail0, 300, 4, 4096, wy, true);
        test_hc_pre_norm_as(g_tail0, 70, 4, 5760, wy, true);
        test_hc_pre_norm_as(g_tail0, 20, 4, 4096, wy, true);
        test_hc_pre_norm_as(g_tail0, 2, 4, 4096, wy, true);
        test_hc_pre_norm_same(g_tail0, 2, 5, 96, wy);
        test_hc_pre_norm_same(g_tail0, 3, 2, 5760, wy);
        test_hc_pre_norm_same(g_tail0, 1, 4, 5764, wy);
        test_hc_pre_norm(1, 4, 5760, true, wy);
    }
    /* the clusters against the CPU: 1 to 19 tokens; 16-byte columns
     * spread unevenly over the 16 blocks (H = 1000: 250 of them), more
     * than a pass of 64 a block (5760: 90; 12,288: 192, the largest H) */
    G = gf, hc_variant = "";
    for (int wy = 0; wy < 2; wy++) {
        test_hc_pre_norm(1, 4, 4096, true, wy);
        test_hc_pre_norm(2, 4, 4096, false, wy);
        test_hc_pre_norm(19, 4, 1024, true, wy);
        test_hc_pre_norm(3, 4, 1000, true, wy);
        test_hc_pre_norm(1, 4, 5760, false, wy);
        test_hc_pre_norm(2, 4, 12288, true, wy);
    }
    /* with the router: V4's shapes at 1 and 2 tokens (the largest count:
     * cu_hc_route_fits), E = 64 over 1,024 columns, sigmoid scores, ties */
    test_hc_route(1, 4096, 256, 6, false, false);
    test_hc_route(2, 4096, 256, 6, false, true);
    test_hc_route(2, 2048, 256, 8, true, false);
    test_hc_route(1, 1024, 64, 4, false, true);
}

/* The top-k over several blocks a token (IDX_TOPK_MULTI_MIN = 16,384
 * entries, launches of up to 64 rows): tokens on both sides of the
 * threshold in one op; ranges of uneven lengths (40,001 entries: 16 blocks
 * of 2,500-2,501 in a cluster, 8 of 5,000-5,001 in two launches; 20,000
 * at top 8; 39,999 at top 2,048); 70 tokens (one block each); Flash's
 * shapes at 70,001 entries; 80 tokens at 70,000 (a prefill launch: 8
 * blocks of 8,750 staged entries a cluster).  Ties: 48 distinct keys
 * (about 400 entries share each score, the k-th among them, across block
 * ranges: the staged top-k's kept entries mark the equal ones), 3 (all of
 * the top k share the top score: the k-th key's bin holds more than a
 * block keeps, and the radix passes choose), at and past the threshold.
 * Eight rows 2^20 times the others (-8): the k-th key below the staged
 * bins (the radix passes again), in one block, a decode cluster and a
 * prefill cluster. */
static void topk_blocks_cases(enum kv_dtype t)
{
    test_indexer(4, 8, 32, 512, 4 * 16384 - 20, 40, t, 0);
    test_indexer(4, 8, 32, 512, 4 * 40000 + 1, 3, t, 0);
    test_indexer(4, 8, 32, 8, 4 * 20000, 2, t, 0);
    test_indexer(4, 8, 32, 2048, 4 * 40000 - 2, 3, t, 0);
    test_indexer(4, 8, 32, 512, 4 * 20000, 70, t, 0);
    test_indexer(4, 64, 128, 512, 4 * 70000 + 3, 2, t, 0);
    test_indexer(4, 8, 32, 512, 4 * 16384 - 20, 40, t, 48);
    test_indexer(4, 8, 32, 512, 4 * 20000 + 1, 3, t, 48);
    test_indexer(4, 8, 32, 512, 4 * 40000 + 1, 3, t, 3);
    test_indexer(4, 8, 32, 8, 4 * 20000, 2, t, 48);
    test_indexer(4, 8, 32, 512, 4 * 70000, 80, t, 0);
    test_indexer(4, 8, 32, 512, 4 * 70000, 80, t, 48);
    test_indexer(4, 8, 32, 64, 4 * 9000, 30, t, -8);
    test_indexer(4, 8, 32, 512, 4 * 40000 + 1, 3, t, -8);
    test_indexer(4, 8, 32, 512, 4 * 70000, 80, t, -8);
}

/* The indexer against the CPU on gf (f32 mode) and, for a few shapes, on
 * g_idx0 (LLM_CUDA_INDEXER_TILED=0) and g_tk2 (LLM_CUDA_TOPK_CLUSTER=0:
 * the top-k's blocks in two launches). */
static void indexer_cases(backend *gf, backend *g_idx0, backend *g_tk2)
{
    G = gf;
    for (int t = KV_F32; t <= KV_FP8; t++) {
        test_indexer(4, 8, 32, 8, 0, 40, t, 0);
        test_indexer(4, 8, 32, 8, 40, 24, t, 0);
        test_indexer(4, 64, 128, 64, 2000, 5, t, 0);
        test_indexer(4, 64, 128, 512, 8000, 3, t, 0);
        test_indexer(4, 16, 64, 32, 300, 300, t, 0);
        test_indexer(4, 64, 128, 512, 8000, 100, t, 0);
        topk_blocks_cases(t);
    }
    G = g_tk2;
    topk_blocks_cases(KV_BF16);
    /* the scores on indexer_scores_kernel (LLM_CUDA_INDEXER_TILED=0); the
     * CPU-order kernel ran every case above: SPLIT (short contexts; 8, 16
     * and 64 heads) and a thread an entry (70,001 entries and more); d =
     * 40: not a multiple of 16, the old kernel either way; one token at 1M */
    G = g_idx0;
    test_indexer(4, 64, 128, 512, 8000, 3, KV_FP8, 0);
    test_indexer(4, 64, 128, 512, 4 * 70000 + 3, 2, KV_BF16, 0);
    test_indexer(4, 8, 32, 512, 4 * 20000 + 1, 3, KV_F32, 48);
    G = gf;
    test_indexer(4, 8, 40, 64, 2000, 5, KV_FP8, 0);
    test_indexer(4, 64, 128, 512, 1048575, 1, KV_FP8, 0);      /* 262,143 entries */
    G = g_tk2;
    test_indexer(4, 64, 128, 512, 1048575, 1, KV_FP8, 0);
}

/* The small-M kernel of decode batches' matmuls the backends made next
 * take (LLM_CUDA_SMALL_MMA): 0, none (the GEMV, cuBLASLt from 17
 * tokens); 1, matmul_mma.cu; 2, matmul_stream.cu; 3, matmul_wgmma.cu. */
static const char *small_mma_kernel = "1";

/* A backend on device 0 whose prefill GEMMs are `gemm` (LLM_CUDA_GEMM). */
static backend *gpu_backend(const char *gemm, const char *attn_tokens)
{
    backend *one[1];
    char err[256];
    backend_modes modes = BACKEND_MODES_DEFAULT;   /* LLM_CUDA_* override */
    setenv("LLM_CUDA_GEMM", gemm, 1);
    setenv("LLM_CUDA_ATTN_TOKENS", attn_tokens, 1);
    if (small_mma_kernel) setenv("LLM_CUDA_SMALL_MMA", small_mma_kernel, 1);  /* wherever it runs */
    else unsetenv("LLM_CUDA_SMALL_MMA");
    if (backend_modes_env(&modes, err, sizeof err)
        || backend_cuda_new_group(1, &modes, one, err, sizeof err)) {
        ok(0, "CUDA backend with LLM_CUDA_GEMM=%s LLM_CUDA_ATTN_TOKENS=%s: %s", gemm,
           attn_tokens, err);
        return NULL;
    }
    return one[0];
}

/* The MoE's comparison backends: the expert tiles on the GEMV
 * (LLM_CUDA_MOE_MMA=0) and on tensor cores at one block an SM
 * (LLM_CUDA_MOE_MMA_BLOCKS=1); the shared expert on the main stream
 * (LLM_CUDA_MOE_SIDE=0); w1 and w3 over tiles of 8
 * (LLM_CUDA_MOE_TILE_M=8); the tiles' copies of 64 bytes a row
 * (LLM_CUDA_MOE_L2=0); bad values: bad_switches. */
static void moe_switches(void)
{
    setenv("LLM_CUDA_MOE_MMA", "0", 1);
    G_tiles_gemv = gpu_backend("bf16x2", "2");
    unsetenv("LLM_CUDA_MOE_MMA");
    setenv("LLM_CUDA_MOE_MMA_BLOCKS", "1", 1);
    G_tiles_1sm = gpu_backend("bf16x2", "2");
    unsetenv("LLM_CUDA_MOE_MMA_BLOCKS");
    if (!G_tiles_1sm && G_tiles_gemv) G_tiles_gemv->destroy(G_tiles_gemv), G_tiles_gemv = NULL;
    setenv("LLM_CUDA_MOE_SIDE", "0", 1);
    G_moe_side = gpu_backend("bf16x2", "2");
    unsetenv("LLM_CUDA_MOE_SIDE");
    setenv("LLM_CUDA_MOE_TILE_M", "8", 1);
    G_tiles_m8 = gpu_backend("bf16x2", "2");
    unsetenv("LLM_CUDA_MOE_TILE_M");
    setenv("LLM_CUDA_MOE_L2", "0", 1);
    G_tiles_64 = gpu_backend("bf16x2", "2");
    unsetenv("LLM_CUDA_MOE_L2");
}

/* Comparison switches read when a backend is made: a value out of range
 * refuses the backend with an error naming the variable and value. */
static void bad_switches(void)
{
    static const char *const bad[][2] = {
        { "LLM_CUDA_MOE_MMA", "2" },        { "LLM_CUDA_MOE_MMA_BLOCKS", "3" },
        { "LLM_CUDA_HC_SPLIT", "2" },       { "LLM_CUDA_HC_MANY_MIN_T", "0" },
        { "LLM_CUDA_HC_SLICE_CHUNKS", "0" }, { "LLM_CUDA_HC_SLICE_CHUNKS", "5" },
        { "LLM_CUDA_LT_TUNE", "0" },        { "LLM_CUDA_LT_TUNE", "17" },
        { "LLM_CUDA_HC_MANY_MIN_T", "65" }, { "LLM_CUDA_GEMV_ROWS", "3" },
        { "LLM_CUDA_GEMV_ROWS", "16" },     { "LLM_CUDA_GEMV_TOKENS", "3" },
        { "LLM_CUDA_ATTN_MMA_MIN_T", "-1" }, { "LLM_CUDA_SMALL_MMA", "4" },
        { "LLM_CUDA_STREAM_MAX_T", "7" },   { "LLM_CUDA_WGMMA_WG", "3" },
        { "LLM_CUDA_FP8_SHADOW", "2" },     { "LLM_CUDA_GATE_GEMV_MAX_T", "0" },
        { "LLM_CUDA_GATE_GEMV_MAX_T", "65" }, { "LLM_CUDA_LT_MIN_T", "1" },
        { "LLM_CUDA_LT_MIN_T", "18" },      { "LLM_CUDA_JOIN", "2" },
        { "LLM_CUDA_MOE_SIDE", "2" },       { "LLM_CUDA_MOE_TILE_M", "5" },
        { "LLM_CUDA_MOE_L2", "2" },
        { "LLM_CUDA_ATTD_BLOCKS", "-1" },
        { "LLM_CUDA_ATTM_BLOCKS", "0" },    { "LLM_CUDA_INDEXER_WGMMA", "2" },
        { "LLM_CUDA_HC_PRE_CLUSTER", "2" }, { "LLM_CUDA_HC_ROUTE", "2" },
        { "LLM_CUDA_INDEXER_DECODE_MMA", "2" }, { "LLM_CUDA_ATTN_CLUSTER", "3" },
        { "LLM_CUDA_ATTN_CLUSTER", "16" },  { "LLM_CUDA_ATTN_FUSE", "2" },
        { "LLM_CUDA_ATTN_MMA_MIN_KEYS", "-1" }, { "LLM_CUDA_ATTN_HCA_BF16", "2" },
        { "LLM_CUDA_INDEXER_FP8", "2" },   { "LLM_CUDA_INDEXER_FP8_KEYS", "200" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        backend *one[1];
        backend_modes modes = BACKEND_MODES_DEFAULT;
        char err[256] = "", want[64];
        setenv(bad[i][0], bad[i][1], 1);
        int rc = backend_modes_env(&modes, err, sizeof err) ||
                 backend_cuda_new_group(1, &modes, one, err, sizeof err);
        unsetenv(bad[i][0]);
        snprintf(want, sizeof want, "%s=%s", bad[i][0], bad[i][1]);
        ok(rc && strstr(err, want), "%s is refused: %s", want, err);
        if (!rc) one[0]->destroy(one[0]);
    }
}

/* Attention in float32 (G: the f32 backend): attention.cu's kernels and
 * the decode kernel (attention_decode.cu), every cache dtype. */
static void attention_cases(void)
{
    for (int t = KV_F32; t <= KV_FP8; t++) {
        test_attention(4, 64, 16, 0, 0, 0, 20, t, 0);
        test_attention(4, 64, 16, 0, 0, 40, 1, t, 0);
        test_attention(4, 64, 32, 8, 0, 100, 7, t, 0);
        test_attention(3, 64, 32, 4, 8, 100, 30, t, 0);
        test_attention(8, 512, 128, 128, 0, 1000, 3, t, 0);
        test_attention(8, 512, 128, 4, 512, 4000, 2, t, 0);
        test_attention(2, 512, 128, 4, 512, 0, 300, t, 0);
        /* enough tokens for several heads per block: 8 (with a partial
         * group of 4), 4 (partial group of 2), 8 at Flash's sizes */
        test_attention(12, 64, 32, 8, 0, 100, 64, t, 0);
        test_attention(6, 64, 32, 4, 8, 100, 64, t, 0);
        test_attention(8, 512, 128, 4, 512, 4000, 130, t, 0);
        /* decode at Flash's rank shapes (32 heads), keys split over
         * blocks: sliding only, CSA and HCA at context 8K, a few tokens,
         * a short context (fewer keys than one split) */
        test_attention(32, 512, 128, 0, 0, 8191, 1, t, 50);
        test_attention(32, 512, 128, 4, 512, 8191, 1, t, 50);
        test_attention(32, 512, 128, 128, 0, 8191, 1, t, 50);
        test_attention(32, 512, 128, 4, 512, 8000, 4, t, 0);
        test_attention(32, 512, 128, 128, 0, 300, 1, t, 0);
        test_attention(5, 64, 16, 4, 8, 10, 1, t, 0);
        /* decode (attention_decode.cu) at 131K and 1M positions: CSA's
         * 512 chosen + 128, HCA's 1,024 / 8,192 entries + 128 */
        test_attention(32, 512, 128, 4, 512, 131071, 1, t, 20);
        test_attention(32, 512, 128, 128, 0, 131071, 1, t, 20);
        test_attention(32, 512, 128, 4, 512, 1048575, 1, t, 0);
        test_attention(32, 512, 128, 128, 0, 1048575, 1, t, 0);
        /* a head_dim the decode kernel does not take (not a multiple of
         * 16; more than 512): cu_attention's splits and combine */
        test_attention(4, 40, 16, 4, 8, 200, 1, t, 0);
        test_attention(4, 1024, 32, 128, 0, 9000, 2, t, 0);
    }
}

/* Prefill attention on tensor cores (attention_mma.cu) in the mode of g
 * (two query tokens a block) and g1 (one); HCA cases from an FP8 cache
 * also against the same modes with LLM_CUDA_ATTN_HCA_BF16=0 (G_hca). */
static void attention_mma_cases(backend *g2, backend *g1)
{
    G = g2, G_hca0 = G_hca[gemm_mode][1];
    for (int t = KV_F32; t <= KV_FP8; t++) {
        test_attention(12, 64, 32, 8, 0, 100, 64, t, 0);
        test_attention(6, 64, 32, 4, 8, 100, 64, t, 0);
        test_attention(2, 512, 128, 4, 512, 0, 300, t, 0);
        test_attention(8, 512, 128, 4, 512, 4000, 130, t, 0);
        /* Flash's rank shapes: 32 heads, CSA and HCA, and 40 heads
         * (a second, partial group of 32) */
        test_attention(32, 512, 128, 4, 512, 8000, 130, t, 0);
        test_attention(32, 512, 128, 128, 0, 30000, 100, t, 0);
        test_attention(40, 128, 64, 4, 64, 500, 70, t, 0);
        /* two tokens per block over the union of their keys: odd n
         * (a last block of one token), chunks from position 0 (short
         * windows, HCA entries appearing inside a block at positions
         * 126/127 mod 128), CSA choices that differ per token, a
         * window shorter than a block's span, 40 heads, head_dim 256 */
        test_attention(32, 512, 128, 128, 0, 0, 301, t, 0);
        test_attention(32, 512, 128, 4, 16, 0, 257, t, 0);
        test_attention(40, 512, 128, 128, 0, 1000, 65, t, 0);
        test_attention(4, 64, 16, 0, 0, 0, 65, t, 0);
        test_attention(4, 64, 4, 8, 0, 7, 70, t, 0);
        test_attention(8, 256, 128, 8, 0, 3, 99, t, 0);
    }
    /* one token per block (LLM_CUDA_ATTN_TOKENS=1) */
    G = g1, G_hca0 = G_hca[gemm_mode][0], attn_tokens = 1;
    for (int t = KV_F32; t <= KV_FP8; t++) {
        test_attention(12, 64, 32, 8, 0, 100, 64, t, 0);
        test_attention(32, 512, 128, 128, 0, 30000, 100, t, 0);
        test_attention(40, 128, 64, 4, 64, 500, 70, t, 0);
        test_attention(32, 512, 128, 4, 16, 0, 257, t, 0);
    }
    attn_tokens = 2, G_hca0 = NULL;
}

/* Decode attention on tensor cores (attention_mma.cu's decode launch) in
 * the mode of gd, whose LLM_CUDA_ATTN_MMA_MIN_T is 1: a token or a
 * sequence a block, the keys split over blocks (up to 64 splits: HCA at
 * 1M, 8,320 keys) and merged by the last, or with LLM_CUDA_ATTN_CLUSTER
 * `cluster` in clusters (up to 8 x 64 splits: one cluster at 8K sliding
 * and HCA, with splits that hold no keys; several merged by the last
 * block of each channel slice: CSA's 20 tiles at 8K, HCA at 1M); a
 * sequence's few tokens (32 and 40 heads: a partial second group),
 * batches of 1 to 65 sequences (65: one split, no merge), CSA, HCA,
 * sliding only, a context shorter than a split. */
static void attention_decode_mma_cases(backend *gd, backend *gdf, const char *cluster)
{
    char merge[64] = "";
    if (strcmp(cluster, "1"))
        snprintf(merge, sizeof merge, ", splits in clusters of up to %s", cluster);
    G = gd, attn_mma_t = 1, attn_merge = merge, G_fused = gdf;
    /* clusters of 2 (many to merge): the FP8 cache only, a shorter run */
    for (int t = strcmp(cluster, "2") ? KV_F32 : KV_FP8; t <= KV_FP8; t++) {
        test_attention(32, 512, 128, 4, 512, 8191, 1, t, t == KV_FP8 ? 50 : 0);
        test_attention(32, 512, 128, 128, 0, 8191, 1, t, 0);
        test_attention(32, 512, 128, 0, 0, 8191, 1, t, 0);
        test_attention(32, 512, 128, 4, 512, 8000, 4, t, 0);
        test_attention(40, 128, 64, 4, 64, 500, 3, t, 0);
        test_attention(5, 64, 16, 4, 8, 10, 1, t, 0);
        test_attention(32, 512, 128, 128, 0, 1048575, 1, t, 0);
        /* every batch size from the FP8 cache, three from the others */
        int nb[] = { 2, 33, 65, 1, 7, 64 };
        for (int i = 0; i < (t == KV_FP8 ? 6 : 3); i++) {
            test_attention_batch(nb[i], 32, 512, 128, 4, 512, 9000, t);
            test_attention_batch(nb[i], 32, 512, 128, 128, 0, 9000, t);
            test_attention_batch(nb[i], 32, 512, 128, 0, 0, 9000, t);
            test_attention_batch(nb[i], 5, 64, 16, 4, 8, 40, t);
        }
    }
    test_attention_batch(3, 32, 512, 128, 128, 0, 1048575, KV_FP8);
    attn_mma_t = ATT_DEC_MMA_MIN_T, attn_merge = ATTN_MERGE_DEFAULT, G_fused = NULL;
}

/* attention_decode_mma_cases on each backend of gd[0] (gd[1]: the same
 * with LLM_CUDA_ATTN_FUSE=1); gd_destroy. */
static void gd_cases(backend *gd[2][3][2], const char *const cluster[3])
{
    for (int k = 0; k < 3; k++)
        for (gemm_mode = GEMM_BF16; gemm_mode <= GEMM_BF16X2; gemm_mode++)
            attention_decode_mma_cases(gd[0][k][gemm_mode - GEMM_BF16],
                                       gd[1][k][gemm_mode - GEMM_BF16], cluster[k]);
}

static void gd_destroy(backend *gd[2][3][2])
{
    for (int f = 0; f < 2; f++)
        for (int k = 0; k < 3; k++) gd[f][k][0]->destroy(gd[f][k][0]), gd[f][k][1]->destroy(gd[f][k][1]);
}

/* The backends every test uses (the per-mode GPU ones, the MoE tiles'
 * comparison ones, the CPU references). */
static void destroy_backends(backend **g, backend **g1)
{
    if (G_tiles_gemv) G_tiles_gemv->destroy(G_tiles_gemv), G_tiles_1sm->destroy(G_tiles_1sm);
    if (G_moe_side) G_moe_side->destroy(G_moe_side);
    if (G_tiles_m8) G_tiles_m8->destroy(G_tiles_m8);
    if (G_tiles_64) G_tiles_64->destroy(G_tiles_64);
    for (int m = 0; m < 4; m++) {
        g[m]->destroy(g[m]), g1[m]->destroy(g1[m]);
        if (G_stream[m]) G_stream[m]->destroy(G_stream[m]);
        if (G_wgmma[m]) G_wgmma[m]->destroy(G_wgmma[m]);
        if (G_ltfirst[m]) G_ltfirst[m]->destroy(G_ltfirst[m]);
        if (G_shadow[m]) G_shadow[m]->destroy(G_shadow[m]);
        if (G_auto[m]) G_auto[m]->destroy(G_auto[m]);
        if (G_deq[m]) G_deq[m]->destroy(G_deq[m]);
        for (int k = 0; k < 2; k++)
            if (G_hca[m][k]) G_hca[m][k]->destroy(G_hca[m][k]);
    }
    C->destroy(C);
    C8->destroy(C8);
}

/* `test_cuda_kernels matmul`: only the dense matmuls, in the tensor-core
 * modes (bf16x2, fp8): a short run after a change to them; `attention`:
 * attention in float32 and on tensor cores (every mode but f32);
 * `test_cuda_kernels mhc-indexer`: hc_pre_norm and the indexer;
 * `compress`: the compressor; `moe`:
 * only the MoE layers, in every mode; `argmax`: row_argmax, embed and
 * hc_head_norm (a step's first and last row ops). */
/* The indexer's tensor-core scores (G: a backend whose op takes that path
 * for every cache dtype): key tiles and token chunks (odd counts: a last
 * stage of one token), few entries, Flash's shapes. */
static void indexer_mma_cases(backend *g)
{
    G = g;
    /* fp8 (the e4m3 kernel, the fp8 mode's choices) where its parts
     * differ: tiles of keys, each stored kind of key, chunks, few tokens */
    test_indexer_mma(64, 64, 2000, 128, 48, 200, KV_F32, true);    /* key tiles and token chunks */
    test_indexer_mma(64, 64, 0, 300, 128, 32768, KV_F32, false);   /* few entries: all or top 64 */
    test_indexer_mma(16, 512, 7000, 300, 300, 32768, KV_F32, true);
    test_indexer_mma(64, 512, 30000, 200, 200, 32768, KV_F32, false);
    test_indexer_mma(64, 512, 120000, 64, 64, 32768, KV_F32, false);
    test_indexer_mma(64, 512, 30000, 200, 200, 32768, KV_BF16, true);  /* keys as the cache stores them */
    test_indexer_mma(64, 512, 30000, 200, 200, 32768, KV_FP8, true);
    test_indexer_mma(64, 512, 9000, 77, 33, 32768, KV_FP8, true);
    /* decode steps (the op's choice on the decode kernel): 1-5 tokens,
     * 32 heads (zeros past them), counts not a multiple of a chunk, 1M */
    test_indexer_mma(64, 512, 9000, 5, 5, 32768, KV_BF16, true);
    test_indexer_mma(32, 512, 4 * 70000 + 3, 2, 2, 32768, KV_FP8, false);
    test_indexer_mma(64, 512, 1048575, 1, 1, 32768, KV_FP8, false);
    /* a prefill chunk (more than 64 rows) of more than 16,384 entries a
     * row: the top-k in clusters that stage every row (2 and 4 blocks) */
    test_indexer_mma(64, 512, 4 * 20000, 100, 100, 32768, KV_FP8, true);
    test_indexer_mma(64, 512, 4 * 40000, 80, 80, 32768, KV_BF16, false);
    /* batches of one-token sequences, one replayed as a graph */
    test_indexer_batch(3, 64, 128, 512, 1048575, KV_FP8, 0, false, true);
    test_indexer_batch(7, 64, 128, 512, 9000, KV_BF16, 0, false, true);
    test_indexer_batch(8, 64, 128, 512, 131071, KV_FP8, 0, true, true);
    test_indexer_batch(1, 64, 128, 512, 131071, KV_FP8, 0, true, true);
}

int main(int argc, char **argv)
{
    const char *seed = getenv("SEED");
    if (seed) rs ^= strtoull(seed, NULL, 0) * 0x2545F4914F6CDD1Dull;
    if (llm_cuda_device_count() < 1) {
        skip(1, "no CUDA device");
        return exit_status();
    }
    backend *g[4], *g1[4];      /* g1: one query token per tensor-core attention block */
    /* g_hc4: mHC of 64+ tokens in the old four launches */
    setenv("LLM_CUDA_HC_FUSED_MANY", "0", 1);
    backend *g_hc4 = gpu_backend(gemm_names[GEMM_F32], "2");
    unsetenv("LLM_CUDA_HC_FUSED_MANY");
    /* g_sl1: hc_post_logits' slices of two column chunks at least (the
     * default is one: S = 128 at T = 32, H = 4096), added by the
     * collapse's blocks as with one */
    setenv("LLM_CUDA_HC_SLICE_CHUNKS", "2", 1);
    backend *g_sl1 = gpu_backend(gemm_names[GEMM_F32], "2");
    unsetenv("LLM_CUDA_HC_SLICE_CHUNKS");
    if (!g_hc4 || !g_sl1) return exit_status();
    /* g_clu0: hc_pre_norm with its last block; g_tail0: that last block
     * as before; g_idx0: the indexer's scores on indexer_scores_kernel */
    setenv("LLM_CUDA_HC_PRE_CLUSTER", "0", 1);
    backend *g_clu0 = gpu_backend(gemm_names[GEMM_F32], "2");
    setenv("LLM_CUDA_HC_PRE_TAIL", "0", 1);
    backend *g_tail0 = gpu_backend(gemm_names[GEMM_F32], "2");
    unsetenv("LLM_CUDA_HC_PRE_TAIL");
    unsetenv("LLM_CUDA_HC_PRE_CLUSTER");
    setenv("LLM_CUDA_INDEXER_TILED", "0", 1);
    backend *g_idx0 = gpu_backend(gemm_names[GEMM_F32], "2");
    unsetenv("LLM_CUDA_INDEXER_TILED");
    /* g_tk2: the indexer's top-k blocks in two launches, not a cluster */
    setenv("LLM_CUDA_TOPK_CLUSTER", "0", 1);
    backend *g_tk2 = gpu_backend(gemm_names[GEMM_F32], "2");
    unsetenv("LLM_CUDA_TOPK_CLUSTER");
    if (!g_clu0 || !g_tail0 || !g_idx0 || !g_tk2) return exit_status();
    for (int m = 0; m < 4; m++)
        if (!(g[m] = gpu_backend(gemm_names[m], "2")) || !(g1[m] = gpu_backend(gemm_names[m], "1")))
            return exit_status();
    /* G_hca: the tensor-core modes with LLM_CUDA_ATTN_HCA_BF16=0 */
    setenv("LLM_CUDA_ATTN_HCA_BF16", "0", 1);
    for (int m = GEMM_BF16; m <= GEMM_FP8; m++)
        if (!(G_hca[m][0] = gpu_backend(gemm_names[m], "1")) ||
            !(G_hca[m][1] = gpu_backend(gemm_names[m], "2")))
            return exit_status();
    unsetenv("LLM_CUDA_ATTN_HCA_BF16");
    small_mma_kernel = "2";
    for (int m = GEMM_BF16; m <= GEMM_FP8; m++)
        if (!(G_stream[m] = gpu_backend(gemm_names[m], "2"))) return exit_status();
    small_mma_kernel = "3";
    for (int m = GEMM_BF16; m <= GEMM_FP8; m++)
        if (!(G_wgmma[m] = gpu_backend(gemm_names[m], "2"))) return exit_status();
    small_mma_kernel = "0";
    setenv("LLM_CUDA_LT_TUNE", "1", 1);
    for (int m = GEMM_BF16; m <= GEMM_FP8; m++)
        if (!(G_ltfirst[m] = gpu_backend(gemm_names[m], "2"))) return exit_status();
    unsetenv("LLM_CUDA_LT_TUNE");
    for (int m = GEMM_BF16X2; m <= GEMM_FP8; m++) {
        G_shadow[m] = gpu_backend(gemm_names[m], "2");
        setenv("LLM_CUDA_FP8_SHADOW", "0", 1);
        G_deq[m] = gpu_backend(gemm_names[m], "2");
        unsetenv("LLM_CUDA_FP8_SHADOW");
        if (!G_shadow[m] || !G_deq[m]) return exit_status();
    }
    small_mma_kernel = NULL;
    for (int m = GEMM_BF16X2; m <= GEMM_FP8; m++)
        if (!(G_auto[m] = gpu_backend(gemm_names[m], "2"))) return exit_status();
    small_mma_kernel = "1";
    /* gd[f][k][m]: decode attention on tensor cores from one token (bf16,
     * bf16x2; from the float32 cache bf16x2's float32 kernel), the splits
     * merged by the last block or in clusters of up to gd_cluster[k] (2:
     * more clusters to merge at each context); f = 1: with the ring store
     * and the inverse RoPE fused (LLM_CUDA_ATTN_FUSE=1) */
    static const char *const gd_cluster[3] = { "1", "8", "2" };
    backend *gd[2][3][2];
    setenv("LLM_CUDA_ATTN_MMA_MIN_T", "1", 1);
    for (int f = 0; f < 2; f++)
        for (int k = 0; k < 3; k++) {
            setenv("LLM_CUDA_ATTN_FUSE", f ? "1" : "0", 1);
            setenv("LLM_CUDA_ATTN_CLUSTER", gd_cluster[k], 1);
            gd[f][k][0] = gpu_backend("bf16", "2"), gd[f][k][1] = gpu_backend("bf16x2", "2");
            if (!gd[f][k][0] || !gd[f][k][1]) return exit_status();
        }
    unsetenv("LLM_CUDA_ATTN_FUSE");
    unsetenv("LLM_CUDA_ATTN_CLUSTER");
    unsetenv("LLM_CUDA_ATTN_MMA_MIN_T");
    C = backend_cpu_new(4, NULL, 0);
    C8 = backend_cpu_new(4, NULL, 0);
    backend_cpu_set_fp8(C8, true);

    moe_switches();
    bad_switches();
    /* a short run after a change: one group of tests, then out */
    const char *only = argc > 1 ? argv[1] : NULL;
    if (only && strcmp(only, "moe") && strcmp(only, "mhc-indexer") && strcmp(only, "matmul") &&
        strcmp(only, "attention") && strcmp(only, "attention-decode") && strcmp(only, "argmax") &&
        strcmp(only, "compress")) {
        fprintf(stderr, "usage: test_cuda_kernels [moe|mhc-indexer|matmul|attention|"
                "attention-decode|argmax|compress]\n");
        return 2;
    }
    if (only && !strcmp(only, "argmax")) {
        G = g[GEMM_F32];
        test_row_argmax();
        test_embed();
        for (int wy = 0; wy < 2; wy++) hc_head_cases(wy);
    }
    if (only && !strcmp(only, "moe"))
        for (gemm_mode = GEMM_F32; gemm_mode <= GEMM_FP8; gemm_mode++) {
            G = g[gemm_mode];
            test_moes();
        }
    if (only && !strcmp(only, "mhc-indexer")) {
        G = g[GEMM_F32];
        for (int wy = 0; wy < 2; wy++) {
            test_hc_pre_norm(1, 4, 4096, true, wy);
            test_hc_pre_norm(8, 4, 4096, true, wy);
            test_hc_pre_norm(63, 4, 1024, true, wy);
            test_hc_pre_norm(3, 2, 130, false, wy);
            test_hc_pre_norm(2, 5, 96, true, wy);
            /* many tokens: the two launches (their collapse as hc_tail) */
            test_hc_pre_norm(32, 4, 4096, true, wy);
            test_hc_pre_norm(64, 4, 4096, true, wy);
            test_hc_pre_norm(300, 4, 4096, true, wy);
            test_hc_pre_norm(65, 3, 996, false, wy);
        }
        hc_slice_cases(g_sl1);
        hc_tail_cases(g[GEMM_F32], g_clu0, g_tail0);
        indexer_cases(g[GEMM_F32], g_idx0, g_tk2);
        test_indexer_batch(3, 64, 128, 512, 1048575, KV_FP8, 0, false, false);
        test_indexer_batch(7, 8, 32, 512, 160000, KV_FP8, 48, false, false);
        test_indexer_batch(64, 64, 128, 512, 9000, KV_BF16, 0, false, false);
        test_indexer_batch(8, 64, 128, 512, 131071, KV_FP8, 0, true, false);
        G8 = g[GEMM_FP8];
        indexer_mma_cases(g[GEMM_BF16]);
    }
    if (only && !strcmp(only, "matmul")) {
        G = g[GEMM_F32];
        act_quant_cases();
        for (gemm_mode = GEMM_BF16X2; gemm_mode <= GEMM_FP8; gemm_mode++) {
            G = g[gemm_mode];
            test_matmul();
        }
    }
    if (only && !strcmp(only, "compress")) {
        G = g[gemm_mode = GEMM_F32];
        compress_cases();
    }
    if (only && !strcmp(only, "attention")) {
        G = g[gemm_mode = GEMM_F32];
        attention_cases();
        for (gemm_mode = GEMM_BF16; gemm_mode <= GEMM_FP8; gemm_mode++)
            attention_mma_cases(g[gemm_mode], g1[gemm_mode]);
    }
    /* decode attention on tensor cores alone (the attention group's last part) */
    if (only && (!strcmp(only, "attention") || !strcmp(only, "attention-decode")))
        gd_cases(gd, gd_cluster);
    if (only) {
        g_hc4->destroy(g_hc4), g_tail0->destroy(g_tail0), g_idx0->destroy(g_idx0);
        g_clu0->destroy(g_clu0), g_tk2->destroy(g_tk2), g_sl1->destroy(g_sl1);
        gd_destroy(gd);
        destroy_backends(g, g1);
        return exit_status();
    }
    G = g[GEMM_F32];
    act_quant_cases();
    test_matmul();
    test_matmuls();
    test_row_argmax();
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
    test_rope(70, 32, 512, 32, true);
    test_scale();
    copy_case();
    test_hc(1, 4, 256);
    test_hc(7, 4, 4096);
    test_hc(3, 2, 128);
    test_hc(70, 4, 1024);
    /* many tokens: hc_pre in two launches (cu_hc_post_logits without y,
     * cu_hc_collapse_norm without the norm; H = 100: a partial column
     * chunk), hc_head's logits a block per 32 tokens (nmix 4, 2 and 3
     * padded to 8, a last partial block), and n not a multiple of 64
     * (hc_head's GEMM path); fewer token groups than SMs split the
     * columns too (T = 64 at H = 4096: 2 groups x 32 slices; 300: 27;
     * H = 100, 128: too few columns, one slice) */
    test_hc(64, 4, 4096);
    test_hc(300, 4, 4096);
    test_hc(100, 2, 128);
    test_hc(65, 3, 320);
    test_hc(64, 3, 100);
    /* one launch (T <= 63, hc <= 5; H = 130: the scalar path; the logits
     * over 5, 2 and 1 column slices at T = 1, 2, 8) and the fallback (hc
     * 6); 64+ tokens: two launches (hc 2 to 4: hc_post with the logits,
     * then collapse and RMSNorm; token groups of 32 full, of 6 and of one;
     * H not a multiple of the 32-column chunk: 1000, 996), or the old
     * four (hc 5, H not a multiple of 4); without and with hc_post first */
    for (int wy = 0; wy < 2; wy++) {
        test_hc_pre_norm(1, 4, 4096, true, wy);
        test_hc_pre_norm(2, 4, 4096, true, wy);
        test_hc_pre_norm(8, 4, 4096, true, wy);
        test_hc_pre_norm(3, 2, 130, false, wy);
        test_hc_pre_norm(2, 5, 96, true, wy);
        test_hc_pre_norm(63, 4, 1024, true, wy);
        hc_head_cases(wy);
        test_hc_pre_norm(70, 4, 1024, true, wy);
        test_hc_pre_norm(32, 4, 4096, true, wy);
        test_hc_pre_norm(64, 4, 4096, true, wy);
        test_hc_pre_norm(2, 6, 256, true, wy);
        test_hc_pre_norm(64, 4, 1000, true, wy);
        test_hc_pre_norm(65, 3, 996, false, wy);
        test_hc_pre_norm(300, 4, 4096, true, wy);
        test_hc_pre_norm(1000, 2, 1000, true, wy);
        test_hc_pre_norm(100, 5, 256, true, wy);
        test_hc_pre_norm(70, 4, 130, true, wy);
    }
    /* the old sequence (LLM_CUDA_HC_FUSED_MANY=0): hc_post, the logits,
     * the collapse, the RMSNorm */
    G = g_hc4, hc_variant = " (LLM_CUDA_HC_FUSED_MANY=0)";
    test_hc(300, 4, 4096);
    for (int wy = 0; wy < 2; wy++) test_hc_pre_norm(300, 4, 4096, true, wy);
    hc_slice_cases(g_sl1);
    hc_tail_cases(g[GEMM_F32], g_clu0, g_tail0);
    g_tail0->destroy(g_tail0), g_clu0->destroy(g_clu0);
    g_hc4->destroy(g_hc4), g_sl1->destroy(g_sl1);
    G = g[GEMM_F32];
    compress_cases();
    indexer_cases(g[GEMM_F32], g_idx0, g_tk2);
    g_idx0->destroy(g_idx0), g_tk2->destroy(g_tk2);
    G8 = g[GEMM_FP8];
    indexer_mma_cases(g[GEMM_BF16]);
    G = g[GEMM_F32];
    attention_cases();
    for (int t = KV_F32; t <= KV_FP8; t++) {
        /* decode batches at Flash's rank shapes (CSA, HCA, sliding only)
         * and small ones; 1 sequence (the op's one-sequence path) up to 64 */
        int nb[] = { 1, 2, 7, 33, 64 };
        for (int i = 0; i < 5; i++) {
            test_indexer_batch(nb[i], 64, 128, 512, 9000, t, 0, false, false);
            test_indexer_batch(nb[i], 8, 32, 8, 100, t, 0, false, false);
            test_attention_batch(nb[i], 32, 512, 128, 4, 512, 9000, t);
            test_attention_batch(nb[i], 32, 512, 128, 128, 0, 9000, t);
            test_attention_batch(nb[i], 32, 512, 128, 0, 0, 9000, t);
            test_attention_batch(nb[i], 5, 64, 16, 4, 8, 40, t);
            test_ring_store_batch(nb[i], 128, 512, t);
        }
    }
    /* 1M context: 262,144 entries */
    test_indexer_batch(3, 64, 128, 512, 1048575, KV_FP8, 0, false, false);
    for (int t = KV_F32; t <= KV_FP8; t++) {
        /* sequences below and above the top-k's threshold (16,384
         * entries) in one batch (positions spread below 160,000: 40,000
         * entries), without and with ties; 64 sequences (the most that
         * spread over blocks), 65 (one block each) */
        test_indexer_batch(7, 8, 32, 512, 160000, t, 0, false, false);
        test_indexer_batch(7, 8, 32, 512, 160000, t, 48, false, false);
        test_indexer_batch(7, 8, 32, 512, 160000, t, 3, false, false);
        test_indexer_batch(64, 8, 32, 512, 100000, t, 0, false, false);
        test_indexer_batch(65, 8, 32, 512, 100000, t, 48, false, false);
    }
    /* as a decode step runs it: one sequence (the op's one-token path)
     * and a batch, replayed from a graph; 1M context with ties */
    test_indexer_batch(1, 64, 128, 512, 131071, KV_FP8, 0, true, false);
    test_indexer_batch(8, 64, 128, 512, 131071, KV_FP8, 0, true, false);
    test_indexer_batch(3, 8, 32, 512, 1048575, KV_FP8, 48, true, false);
    test_attention_batch(3, 32, 512, 128, 4, 512, 1048575, KV_FP8);
    for (int t = KV_F32; t <= KV_FP8; t++) {   /* HCA's long contexts in a batch */
        test_attention_batch(7, 32, 512, 128, 128, 0, 131071, t);
        test_attention_batch(3, 32, 512, 128, 128, 0, 1048575, t);
    }
    /* long: 100,000 HCA entries (12.8M positions), dense */
    test_attention(4, 512, 128, 128, 0, 100000 * 128 - 1, 1, KV_F32, 10);
    test_attention(4, 512, 128, 128, 0, 100000 * 128 - 1, 1, KV_FP8, 10);
    for (int t = KV_F32; t <= KV_FP8; t++) {
        test_ring_store(16, 64, 0, 5, t);
        test_ring_store(16, 64, 30, 40, t);
        test_ring_store(128, 512, 1000, 1, t);
        test_kv_round(1, 512, 512, t);
        test_kv_round(37, 100, 130, t);
        test_kv_round(300, 512, 512, t);
        test_qk_prep(1, 32, 512, 32, 64, 128, 32, t);
        test_qk_prep(8, 4, 512, 32, 0, 0, 0, t);
        test_qk_prep(5, 3, 64, 8, 4, 32, 8, t);
        /* a prefill step's rows; blocks of 8 rows mixing q and qi heads,
         * qi rows longer than q's */
        test_qk_prep(70, 32, 512, 32, 64, 128, 32, t);
        test_qk_prep(3, 5, 64, 8, 9, 128, 16, t);
    }
    test_moes();
    /* the same matmuls, MoE layers and prefill attention on tensor cores */
    for (gemm_mode = GEMM_BF16; gemm_mode <= GEMM_FP8; gemm_mode++) {
        G = g[gemm_mode];
        test_matmul();
        test_moes();
        attention_mma_cases(g[gemm_mode], g1[gemm_mode]);
    }
    /* decode attention on tensor cores: from one token, and the default
     * rule in the batches of the default backend (33 and 64 sequences) */
    gd_cases(gd, gd_cluster);
    gd_destroy(gd);
    G = g[gemm_mode = GEMM_BF16X2];
    for (int t = KV_BF16; t <= KV_FP8; t++) {
        test_attention_batch(7, 32, 512, 128, 4, 512, 9000, t);
        test_attention_batch(33, 32, 512, 128, 4, 512, 9000, t);
        test_attention_batch(64, 32, 512, 128, 128, 0, 9000, t);
    }
    destroy_backends(g, g1);
    test_allreduce();
    return exit_status();
}
