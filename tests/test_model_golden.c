/* Logits against the transformers goldens committed under tests/fixtures/
 * (tools/make_tiny_v4.py on the GPU machine): every fixture directory with
 * ids.txt and logits.f32, at TP=1 and TP=2, full and incremental (first
 * half as one prefill, then one token at a time), relative L2 error
 * <= 1e-4 and max abs error <= 1e-3, greedy next token equal to the
 * golden one at >= 99% of positions, incremental equal to full (relative
 * L2 <= 1e-5); plus the logits CLI end to end.  The backend is
 * $LLM_TEST_BACKEND (default cpu; tools/test_gpu.sh runs it with cuda).
 *
 * CUDA's prefill GEMMs (steps of >= 64 tokens) run on bf16 tensor cores
 * unless LLM_CUDA_GEMM=f32 (then the float32 bounds above hold).  The
 * default, bf16x2, splits each activation into two bf16 parts (what is
 * left is within 2^-16 of it): relative L2 <= 2e-3, max abs <= 2e-2
 * (golden and full run), greedy agreement >= 99%.  LLM_CUDA_GEMM=bf16
 * rounds activations once (2^-8): measured on these fixtures (bf16 branch
 * runs A and B, docs/GPU_NOTES.md) rel L2 up to 0.058, max abs 2.04, incremental
 * vs full 0.036, greedy agreement 96.25% (tiny-b) to 99%: bounds 0.1, 4,
 * 0.1 and >= 95%, short of the 99% the float32 and bf16x2 paths keep.
 * LLM_CUDA_GEMM=fp8 (DeepSeek's FP8 numerics: activations of the FP8 and
 * MXFP4 matmuls quantized to e4m3 per 128 channels) drifts further on
 * these tiny random models, and the CPU backend in the same numerics
 * (gemm_mode fp8) drifts as far: measured (docs/MODEL.md) rel L2
 * 0.173-0.236, max abs 3.7, incremental vs full 0.22, greedy 70-79%:
 * bounds 0.35, 6, 0.3, >= 65%.  Its full pass must also be nearer the
 * CPU's fp8 mode than the golden: rel L2 to the CPU's at most 0.95 of its
 * rel L2 to the golden (measured 0.77-0.86, run Q3; 0.66-0.75 while the
 * x of BF16 weights was split in two bf16 parts on the GPU and left
 * float32 on the CPU: each rounding both sides share is one more place
 * for last-bit differences to flip a value; a path that did not quantize
 * sits ~1e-5 from the golden and ~0.2 from the CPU's fp8 mode, a ratio of
 * 10^4).  A weak check: the two cannot agree to float32 noise, as a value
 * next to an e4m3 (or bf16) rounding boundary lands on either side from
 * sums that differ in their last bits, and on these tiny models with
 * sharp logits such flips compound over the layers; test_cuda_kernels
 * holds each fp8 kernel to the CPU's fp8 numerics tightly. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model_fixtures.h"

#define FIXTURES "tests/fixtures"

static const char *backend = "cpu";
static int max_tp;         /* test_max_tp() */
static const char *gemm;   /* cuda: its prefill GEMMs (LLM_CUDA_GEMM) */
static double tol_rel = 1e-4, tol_abs = 1e-3, tol_inc = 1e-5, tol_greedy = 0.99;

/* Share of positions whose greedy next token is the golden one. */
static void greedy(const char *what, const float *got, const float *want, int n, int V)
{
    int same = greedy_agree(got, want, n, V);
    ok(same >= tol_greedy * n, "%s: greedy next token agrees at %d of %d positions", what, same,
       n);
}

static void compare(const char *what, const float *got, const float *want, size_t n)
{
    double d = 0, z = 0, ma = 0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)got[i] - want[i];
        d += e * e;
        z += (double)want[i] * want[i];
        ma = fmax(ma, fabs(e));
    }
    double rel = sqrt(d / z);
    ok(rel <= tol_rel && ma <= tol_abs, "%s: rel L2 %.3g, max abs %.3g", what, rel, ma);
}

static int run(const char *dir, int tp, bool incremental, const int32_t *ids, int n, float *out,
               int *vocab)
{
    v4_options o = { .tp = tp, .cache_tokens = n, .backend = backend };
    return fixture_logits(dir, &o, incremental, ids, n, out, vocab, NULL);
}

/* fp8: the full pass got against the CPU backend in the same numerics. */
static void cpu_fp8_case(const char *what, const char *dir, const int32_t *ids, int n,
                         const float *got, const float *gold, size_t ng)
{
    v4_options o = { .tp = 1, .cache_tokens = n, .backend = "cpu",
                     .modes = { .gemm = BACKEND_GEMM_FP8 } };
    float *ref = malloc(ng * sizeof *ref);
    int V = 0;
    if (fixture_logits(dir, &o, false, ids, n, ref, &V, NULL) || (size_t)V * n != ng) {
        ok(0, "%s: the CPU's fp8 mode runs", what);
    } else {
        double r = rel_l2(got, ref, ng), rg = rel_l2(got, gold, ng), rc = rel_l2(ref, gold, ng);
        ok(r <= 0.95 * rg, "%s vs the CPU's fp8 mode: rel L2 %.3g (to the golden %.3g; the "
           "CPU's fp8 mode to the golden %.3g)", what, r, rg, rc);
    }
    free(ref);
}

static void fixture(const char *name)
{
    char dir[256];
    int32_t *ids;
    float *gold;
    size_t ng;
    int n = load_fixture(name, dir, sizeof dir, &ids, &gold, &ng);
    if (n < 0) return;
    float *out = malloc(ng * sizeof *out), *full = malloc(ng * sizeof *full);
    for (int tp = 1; tp <= 2; tp++)
        for (int inc = 0; inc < 2; inc++) {
            if (tp > max_tp) {
                char why[160];
                snprintf(why, sizeof why, "%s tp=%d: LLM_TEST_MAX_TP=%d", name, tp, max_tp);
                skip(inc ? 3 : 2, why);
                continue;
            }
            char what[128];
            int V = 0;
            snprintf(what, sizeof what, "%s %s%s%s%s tp=%d %s", name, backend,
                     gemm ? " (" : "", gemm ? gemm : "", gemm ? " GEMMs)" : "", tp,
                     inc ? "incremental" : "full");
            memset(out, 0, ng * sizeof *out);
            if (run(dir, tp, inc, ids, n, out, &V) || (size_t)V * n != ng) {
                ok(0, "%s runs", what);
                continue;
            }
            compare(what, out, gold, ng);
            greedy(what, out, gold, n, V);
            if (!inc && tp == 1 && gemm && !strcmp(gemm, "fp8")) cpu_fp8_case(what, dir, ids, n, out, gold, ng);
            if (!inc) memcpy(full, out, ng * sizeof *out);
            else {
                double r = rel_l2(out, full, ng);
                ok(r <= tol_inc, "%s equals full: rel L2 %.3g", what, r);
            }
        }
    /* The CPU backend's fp8 mode (the GPU fp8 mode's reference, recipe key
     * gemm_mode fp8) quantizes: its drift from the golden is the stated
     * one (0.165-0.226 measured; bound 0.35), and far above float32
     * noise (a path that did not quantize sits ~1e-5 from the golden). */
    if (!strcmp(backend, "cpu")) {
        v4_options o = { .tp = 1, .cache_tokens = n, .backend = "cpu",
                         .modes = { .gemm = BACKEND_GEMM_FP8 } };
        int V = 0;
        if (fixture_logits(dir, &o, false, ids, n, out, &V, NULL) || (size_t)V * n != ng) {
            ok(0, "%s cpu fp8 mode runs", name);
        } else {
            double r = rel_l2(out, gold, ng);
            ok(r > 1e-3 && r <= 0.35, "%s cpu gemm_mode fp8: rel L2 to the golden %.3g "
               "(quantized: > 1e-3; stated drift: <= 0.35)", name, r);
        }
    }
    /* The CLI end to end: same numbers through the file format. */
    strbuf cmd;
    sb_init(&cmd);
    int cli_tp = max_tp < 2 ? max_tp : 2;
    sb_printf(&cmd, "%s logits --model %s --backend %s --tp %d "
              "--mode incremental --ids ", build_path("bin/llm-engine"), dir, backend, cli_tp);
    for (int i = 0; i < n; i++) sb_printf(&cmd, "%s%d", i ? "," : "", ids[i]);
    char tmp[] = "/tmp/golden_logits.XXXXXX";
    int fd = mkstemp(tmp);
    if (fd >= 0) close(fd);
    sb_printf(&cmd, " --out %s", tmp);
    int rc = system(cmd.data);
    size_t nc = 0;
    float *cli = rc == 0 ? read_f32(tmp, &nc) : NULL;
    char what[128];
    snprintf(what, sizeof what, "%s via the logits CLI, --tp %d --mode incremental", name, cli_tp);
    if (cli && nc == ng) compare(what, cli, gold, ng);
    else ok(0, "%s: logits CLI wrote %zu floats (want %zu), exit %d", name, nc, ng, rc);
    remove(tmp);
    free(cli);
    sb_free(&cmd);
    free(out);
    free(full);
    free(gold);
    free(ids);
}

int main(void)
{
    if (getenv("LLM_TEST_BACKEND")) backend = getenv("LLM_TEST_BACKEND");
    max_tp = test_max_tp();
    if (!strcmp(backend, "cuda")) {
        const char *g = getenv("LLM_CUDA_GEMM");
        gemm = g && *g ? g : "bf16x2";
        if (!strcmp(gemm, "bf16x2")) tol_rel = 2e-3, tol_abs = 2e-2, tol_inc = 2e-3;
        else if (!strcmp(gemm, "bf16")) tol_rel = 0.1, tol_abs = 4, tol_inc = 0.1, tol_greedy = 0.95;
        else if (!strcmp(gemm, "fp8")) tol_rel = 0.35, tol_abs = 6, tol_inc = 0.3, tol_greedy = 0.65;
    }
    DIR *d = opendir(FIXTURES);
    struct dirent *e;
    char *names[64];
    int n = 0;
    while (d && (e = readdir(d)) && n < 64) {
        char p[320];
        snprintf(p, sizeof p, FIXTURES "/%s/logits.f32", e->d_name);
        FILE *f = fopen(p, "rb");
        if (f) {
            fclose(f);
            names[n++] = strdup(e->d_name);
        }
    }
    if (d) closedir(d);
    if (!n) {
        skip(1, "no golden fixtures under " FIXTURES " yet (tools/make_tiny_v4.py on the GPU machine)");
        return exit_status();
    }
    for (int i = 0; i < n; i++) {
        fixture(names[i]);
        free(names[i]);
    }
    return exit_status();
}
