/* The cache stored in BF16 and FP8 (kv_cache_dtype) on the committed
 * fixtures: on the CPU, incremental decode (half as one prefill, then
 * token by token) equals the full forward pass bit for bit, at TP=1 and
 * TP=2, because the chunk's keys are rounded to the cache's dtype before
 * attention (on CUDA, where prefill and decode use other kernels, within
 * INC_REL); the logits stay near the transformers golden (float32) within
 * a bound per dtype, and greedy tokens agree; the layout's bytes per
 * token shrink as the format says; the logits CLI takes
 * --kv-cache-dtype, and on the CPU --gemm-mode fp8 (DeepSeek's FP8
 * numerics, as a recipe's gemm_mode gives them).  The backend is
 * $LLM_TEST_BACKEND (default cpu). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model_fixtures.h"

static const char *backend = "cpu";
static int max_tp;         /* test_max_tp() */

/* bytes_per_token: the cache layout's. */
static int run(const char *dir, int tp, enum kv_dtype t, bool incremental, const int32_t *ids,
               int n, float *out, double *bytes_per_token)
{
    v4_options o = { .tp = tp, .cache_tokens = n, .backend = backend, .kv_dtype = t };
    int V;
    return fixture_logits(dir, &o, incremental, ids, n, out, &V, bytes_per_token);
}

/* Bounds against the float32 golden, from measurements on the three
 * fixtures on the CPU (rel L2 of all logits; share of positions whose
 * greedy token is the golden one):
 *   bf16: rel L2 0.017 to 0.028, greedy 99.4% to 100%;
 *   fp8:  rel L2 0.059 to 0.121, greedy 89.5% to 95.7%.
 * The error is not proportional to the rounding step (2^-8 for bf16,
 * 2^-4 for fp8): the tiny random models have sharp logits, and rounded
 * indexer keys change which entries the top-k picks (a discrete change).
 * Asserted with about 2x margin on the error and half the miss rate
 * again on greedy agreement, so only a different format or a bug trips
 * them. */
#define BF16_REL 0.06
#define BF16_GREEDY 0.97
#define FP8_REL 0.25
#define FP8_GREEDY 0.80
/* CUDA: float32 differences of ~1e-7 between the prefill and decode
 * kernels can move a value across a rounding boundary of the cache
 * format, so incremental and full differ by more than float32 noise. */
#define INC_REL 0.05
/* CUDA under LLM_CUDA_GEMM=fp8: the activations' e4m3 rounding drifts
 * more than any cache dtype (test_model_golden, docs/MODEL.md), so every
 * cache is held to that mode's bounds instead. */
static double bf16_rel = BF16_REL, bf16_greedy = BF16_GREEDY, fp8_rel = FP8_REL,
              fp8_greedy = FP8_GREEDY, inc_rel = INC_REL;

/* CUDA under fp8 with this cache: the full pass against the CPU's fp8
 * mode over the same cache (prefill attention in bf16 on both) held to
 * the bounds each is held to against the golden (rel L2 and greedy
 * agreement).  Not nearer than the golden: the two sit 0.13-0.25 apart
 * on these fixtures whichever attention rounding either side uses (run
 * L4, docs/GPU_NOTES.md: four pairings, each over or under 0.95 of the
 * distance to the golden somewhere), because e4m3 codes flip on last-bit
 * differences and the random weights amplify the flips; the kernel test
 * (test_cuda_kernels attention) is where the bf16 attention's match with
 * the CPU's form is checked. */
static bool gpu_fp8;

static void cpu_fp8_near(const char *name, const char *dir, enum kv_dtype t, const int32_t *ids,
                         int n, const float *got, size_t ng)
{
    v4_options o = { .tp = 1, .cache_tokens = n, .backend = "cpu", .kv_dtype = t,
                     .modes = { .gemm = BACKEND_GEMM_FP8 } };
    float *ref = malloc(ng * sizeof *ref);
    int V = 0;
    if (fixture_logits(dir, &o, false, ids, n, ref, &V, NULL) || (size_t)V * n != ng) {
        ok(0, "%s %s cache: the CPU's fp8 mode runs", name, v4_kv_dtype_name(t));
    } else {
        double r = rel_l2(got, ref, ng);
        int same = greedy_agree(got, ref, n, V);
        ok(r <= fp8_rel && same >= fp8_greedy * n, "%s %s cache under fp8 vs the CPU's fp8 mode "
           "over the same cache: rel L2 %.3g (bound %.3g), greedy %d of %d", name,
           v4_kv_dtype_name(t), r, fp8_rel, same, n);
    }
    free(ref);
}

static bool same_logits(const char *what, const float *a, const float *b, size_t n)
{
    size_t diff = 0;
    double d = 0, z = 0;
    for (size_t i = 0; i < n; i++) {
        diff += memcmp(&a[i], &b[i], sizeof *a) != 0;
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        z += (double)b[i] * b[i];
    }
    if (!strcmp(backend, "cpu"))
        return ok(!diff, "%s: incremental == full bit for bit (%zu of %zu differ)", what, diff, n);
    return ok(sqrt(d / z) <= inc_rel, "%s: incremental vs full rel L2 %.3g (%zu of %zu differ)",
              what, sqrt(d / z), diff, n);
}

static void fixture(const char *name)
{
    char dir[256];
    int32_t *ids;
    float *gold;
    size_t ng;
    int n = load_fixture(name, dir, sizeof dir, &ids, &gold, &ng);
    if (n < 0) return;
    int V = (int)(ng / n);
    float *full = malloc(ng * sizeof *full), *inc = malloc(ng * sizeof *inc);
    double bpt[3] = { 0 };
    static const enum kv_dtype types[3] = { KV_F32, KV_BF16, KV_FP8 };
    for (int ti = 0; ti < 3; ti++) {
        enum kv_dtype t = types[ti];
        const char *tn = v4_kv_dtype_name(t);
        if (run(dir, 1, t, false, ids, n, full, &bpt[ti])) {
            ok(0, "%s %s runs", name, tn);
            continue;
        }
        if (t == KV_F32) continue;      /* test_model_golden covers float32 */
        for (int tp = 1; tp <= 2; tp++) {
            double b;
            if (tp > max_tp) {
                char why[160];
                snprintf(why, sizeof why, "%s %s tp=%d: LLM_TEST_MAX_TP=%d", name, tn, tp, max_tp);
                skip(1, why);
                continue;
            }
            memset(inc, 0, ng * sizeof *inc);
            if (run(dir, tp, t, true, ids, n, inc, &b)) {
                ok(0, "%s %s tp=%d incremental runs", name, tn, tp);
                continue;
            }
            char what[128];
            snprintf(what, sizeof what, "%s %s cache tp=%d", name, tn, tp);
            if (tp == 1) {
                same_logits(what, inc, full, ng);
            } else {
                /* TP=2 splits the heads, and the all-reduce sums the halves:
                 * other rounding, so equal to its own full pass only. */
                double b2;
                float *full2 = malloc(ng * sizeof *full2);
                if (run(dir, 2, t, false, ids, n, full2, &b2)) ok(0, "%s full runs", what);
                else same_logits(what, inc, full2, ng);
                free(full2);
            }
        }
        double d = 0, z = 0, ma = 0;
        for (size_t i = 0; i < ng; i++) {
            double e = (double)full[i] - gold[i];
            d += e * e;
            z += (double)gold[i] * gold[i];
            ma = fmax(ma, fabs(e));
        }
        int same = greedy_agree(full, gold, n, V);
        double rel = sqrt(d / z), want = t == KV_BF16 ? bf16_rel : fp8_rel;
        double greedy = t == KV_BF16 ? bf16_greedy : fp8_greedy;
        ok(rel <= want && same >= greedy * n, "%s %s cache vs the float32 golden: rel L2 %.3g "
           "(bound %.3g), max abs %.3g, greedy %d of %d", name, tn, rel, want, ma, same, n);
        if (gpu_fp8) cpu_fp8_near(name, dir, t, ids, n, full, ng);
    }
    /* bytes per token: bf16 half of float32 (up to the 16-byte rounding of
     * each region); fp8 a quarter plus a scale byte per 64 channels
     * (Flash: (520 + 130) / (2048 + 512) = 0.254 of float32) */
    double rb = bpt[1] / bpt[0], rf = bpt[2] / bpt[0];
    ok(rb >= 0.49 && rb <= 0.51 && rf >= 0.25 * (1 + 1.0 / 64) && rf <= 0.27,
       "%s bytes per token: float32 %.1f, bf16 %.1f (%.3f), fp8 %.1f (%.3f)", name, bpt[0],
       bpt[1], rb, bpt[2], rf);
    /* The CLI: the same fp8 logits through the file format (full mode,
     * TP=1: the in-process run above), and a bad name refused. */
    if (!strcmp(name, "tiny-a") && run(dir, 1, KV_FP8, false, ids, n, full, &bpt[2]) == 0) {
        strbuf cmd;
        sb_init(&cmd);
        char tmp[] = "/tmp/kv_dtype_logits.XXXXXX";
        int fd = mkstemp(tmp);
        if (fd >= 0) close(fd);
        sb_printf(&cmd, "%s logits --model %s --backend %s --kv-cache-dtype fp8 "
                  "--out %s --ids ", build_path("bin/llm-engine"), dir, backend, tmp);
        for (int i = 0; i < n; i++) sb_printf(&cmd, "%s%d", i ? "," : "", ids[i]);
        int rc = system(cmd.data);
        size_t nc = 0;
        float *cli = rc == 0 ? read_f32(tmp, &nc) : NULL;
        ok(cli && nc == ng && !memcmp(cli, full, ng * sizeof *cli),
           "logits CLI --kv-cache-dtype fp8 writes the fp8 logits (exit %d, %zu floats)", rc, nc);
        free(cli);
        remove(tmp);
        sb_reset(&cmd);
        sb_printf(&cmd, "%s logits --model %s --kv-cache-dtype fp16 --ids 1 "
                  "--out %s 2>%s", build_path("bin/llm-engine"), dir, tmp, tmp);
        rc = system(cmd.data);
        strbuf msg;
        sb_init(&msg);
        sb_read_file(&msg, tmp);
        ok(WIFEXITED(rc) && WEXITSTATUS(rc) == 2 && msg.data &&
           strstr(msg.data, "--kv-cache-dtype must be auto, bf16 or fp8"),
           "logits CLI refuses --kv-cache-dtype fp16: %s", msg.data ? msg.data : "");
        remove(tmp);
        sb_free(&msg);
        if (!strcmp(backend, "cpu")) {
            /* --gemm-mode fp8: the CPU's fp8 mode in process, bit for bit,
             * and not the float32 numerics */
            v4_options o8 = { .tp = 1, .cache_tokens = n, .backend = "cpu",
                              .modes = { .gemm = BACKEND_GEMM_FP8 } };
            float *ref = malloc(ng * sizeof *ref);
            int V8 = 0;
            int rr = fixture_logits(dir, &o8, false, ids, n, ref, &V8, NULL);
            sb_reset(&cmd);
            sb_printf(&cmd, "%s logits --model %s --backend cpu --gemm-mode fp8 --out %s --ids ",
                      build_path("bin/llm-engine"), dir, tmp);
            for (int i = 0; i < n; i++) sb_printf(&cmd, "%s%d", i ? "," : "", ids[i]);
            rc = system(cmd.data);
            nc = 0;
            cli = rc == 0 ? read_f32(tmp, &nc) : NULL;
            double dg = 0, zg = 0;
            for (size_t i = 0; cli && nc == ng && i < ng; i++)
                dg += (cli[i] - gold[i]) * (double)(cli[i] - gold[i]), zg += gold[i] * (double)gold[i];
            ok(rr == 0 && cli && nc == ng && !memcmp(cli, ref, ng * sizeof *cli) && dg > 0,
               "logits CLI --gemm-mode fp8 writes the CPU's fp8-mode logits (exit %d, %zu "
               "floats; rel L2 to the float32 golden %.3g)", rc, nc, zg > 0 ? sqrt(dg / zg) : 0);
            free(cli);
            free(ref);
            remove(tmp);
            sb_reset(&cmd);
            sb_printf(&cmd, "%s logits --model %s --gemm-mode fp16 --ids 1 --out %s 2>%s",
                      build_path("bin/llm-engine"), dir, tmp, tmp);
            rc = system(cmd.data);
            sb_init(&msg);
            sb_read_file(&msg, tmp);
            ok(WIFEXITED(rc) && WEXITSTATUS(rc) == 2 && msg.data &&
               strstr(msg.data, "--gemm-mode must be bf16x2, bf16, f32 or fp8"),
               "logits CLI refuses --gemm-mode fp16: %s", msg.data ? msg.data : "");
            remove(tmp);
            sb_free(&msg);
        }
        sb_free(&cmd);
    }
    free(full), free(inc), free(gold), free(ids);
}

int main(void)
{
    if (getenv("LLM_TEST_BACKEND")) backend = getenv("LLM_TEST_BACKEND");
    max_tp = test_max_tp();
    const char *g = getenv("LLM_CUDA_GEMM");
    if (!strcmp(backend, "cuda") && g && !strcmp(g, "fp8"))
        bf16_rel = fp8_rel = 0.35, bf16_greedy = fp8_greedy = 0.65, inc_rel = 0.3, gpu_fp8 = true;
    const char *names[] = { "tiny-a", "tiny-b", "demo" };
    for (int i = 0; i < 3; i++) fixture(names[i]);
    return exit_status();
}
