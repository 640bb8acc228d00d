/* Prefill GEMM micro-benchmark on one GPU (not a test: prints times,
 * asserts nothing): the dense matmuls of one layer at V4-Flash's rank
 * shapes at TP=2 (conf/models/deepseek-v4-flash-rank6.json: hidden 4096,
 * q_lora 1024, 32 heads x 512, o_lora 1024 x 4 groups, indexer 64 x 128,
 * shared expert 1024), FP8 weights with synthetic values, for a step of
 * T tokens, in each prefill GEMM mode (LLM_CUDA_GEMM); and the mHC ops
 * of a sublayer of the same step (hc_pre; hc_pre_norm after hc_post;
 * hc_mult 4) in two launches and as the old four (LLM_CUDA_HC_FUSED_MANY).
 * Milliseconds per op (activation quantization or splitting included),
 * TFLOP/s of the matmul's products.
 *   build/tests/gpu/bench_cuda_prefill [T]   (default 8192) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "bench_util.h"
#include "cuda/device_info.h"

#define REPS 10

static const struct { const char *name; int rows, cols; } shapes[] = {
    { "wq_a", 1024, 4096 }, { "wq_b", 16384, 1024 }, { "wkv", 512, 4096 },
    { "wo_a (a group)", 1024, 4096 }, { "wo_b", 4096, 4096 }, { "indexer wq_b", 8192, 1024 },
    { "shared w1/w3", 1024, 4096 }, { "shared w2", 4096, 1024 },
};

static void sync(backend *G, float *d)
{
    float h;
    G->read(G, &h, d, 4);
}

static backend *make(const char *gemm)
{
    setenv("LLM_CUDA_GEMM", gemm, 1);
    backend *one[1];
    char err[256];
    backend_modes modes = BACKEND_MODES_DEFAULT;   /* LLM_CUDA_GEMM overrides */
    if (backend_modes_env(&modes, err, sizeof err)
        || backend_cuda_new_group(1, &modes, one, err, sizeof err)) {
        printf("LLM_CUDA_GEMM=%s: %s\n", gemm, err);
        return NULL;
    }
    return one[0];
}

static float *random_dev(backend *G, size_t n, float amp)
{
    float *h = malloc(n * 4), *d = G->alloc(G, n * 4);
    for (size_t i = 0; i < n; i++) h[i] = amp * ((float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f);
    G->write(G, d, h, n * 4);
    free(h);
    return d;
}

static void bench_matmuls(const char *gemm, int T)
{
    backend *G = make(gemm);
    if (!G) return;
    float *x = random_dev(G, (size_t)T * 16384, 1.0f), *y = G->alloc(G, (size_t)T * 16384 * 4);
    double all_ms = 0, all_tf = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        qweight w = { .type = QT_FP8, .rows = shapes[i].rows, .cols = shapes[i].cols,
                      .ld = shapes[i].cols };
        if (G->upload_weights(G, &w, 1)) break;
        G->matmul(G, &w, x, w.cols, T, y, w.rows);
        sync(G, y);
        double t0 = now();
        for (int r = 0; r < REPS; r++) G->matmul(G, &w, x, w.cols, T, y, w.rows);
        sync(G, y);
        double ms = (now() - t0) / REPS * 1e3, tf = 2.0 * T * w.rows * w.cols / 1e12;
        all_ms += ms, all_tf += tf;
        printf("  %-6s %-16s %5d x %5d, T=%d: %7.3f ms %6.0f TFLOP/s\n", gemm, shapes[i].name,
               w.rows, w.cols, T, ms, tf / (ms * 1e-3));
    }
    printf("  %-6s all eight: %.3f ms, %.0f TFLOP/s\n", gemm, all_ms, all_tf / (all_ms * 1e-3));
    const char *e = G->error(G);
    if (e) printf("  %s: %s\n", gemm, e);
    G->destroy(G);
}

/* The mHC ops of a sublayer (hc_mult 4): hc_pre alone, and hc_pre_norm
 * after the previous sublayer's hc_post (what the model runs), by the
 * two-launch path for many tokens (fused "1") or the old sequence (fused
 * "0": hc_post, logits, collapse, RMSNorm; LLM_CUDA_HC_FUSED_MANY=0). */
static void bench_hc(int T, const char *fused)
{
    setenv("LLM_CUDA_HC_FUSED_MANY", fused, 1);
    backend *G = make("bf16x2");
    unsetenv("LLM_CUDA_HC_FUSED_MANY");
    if (!G) return;
    int hc = 4, H = 4096, mix = (2 + hc) * hc;
    float *h = random_dev(G, (size_t)T * hc * H, 1.0f), *fn = random_dev(G, (size_t)mix * hc * H, 0.01f);
    float *base = random_dev(G, mix, 0.5f), *scale = random_dev(G, 3, 1.0f);
    float *y = random_dev(G, (size_t)T * H, 1.0f), *nw = random_dev(G, H, 1.0f);
    float *post = G->alloc(G, (size_t)T * hc * 4), *comb = G->alloc(G, (size_t)T * hc * hc * 4);
    float *col = G->alloc(G, (size_t)T * H * 4), *xn = G->alloc(G, (size_t)T * H * 4);
    G->hc_pre(G, h, T, hc, H, fn, base, scale, 20, 1e-6f, 1e-6f, post, comb, col);
    sync(G, col);
    double t0 = now();
    for (int r = 0; r < REPS; r++)
        G->hc_pre(G, h, T, hc, H, fn, base, scale, 20, 1e-6f, 1e-6f, post, comb, col);
    sync(G, col);
    double ms = (now() - t0) / REPS * 1e3, mb = T * (double)hc * H * 4 / 1e6;
    printf("  LLM_CUDA_HC_FUSED_MANY=%s hc_pre (logits + Sinkhorn + collapse) T=%d hc=%d H=%d: "
           "%.3f ms (reads %.0f MB of streams: %.0f GB/s)\n", fused, T, hc, H, ms, mb, mb / ms);
    /* at least: the streams read, written and read again; y read,
     * collapsed and normed written */
    double mb2 = 3 * mb + 3 * T * (double)H * 4 / 1e6;
    G->hc_pre_norm(G, h, y, T, hc, H, fn, base, scale, 20, 1e-6f, 1e-6f, post, comb, col, nw, xn);
    sync(G, xn);
    t0 = now();
    for (int r = 0; r < REPS; r++)
        G->hc_pre_norm(G, h, y, T, hc, H, fn, base, scale, 20, 1e-6f, 1e-6f, post, comb, col, nw,
                       xn);
    sync(G, xn);
    ms = (now() - t0) / REPS * 1e3;
    printf("  LLM_CUDA_HC_FUSED_MANY=%s hc_pre_norm after hc_post T=%d hc=%d H=%d: %.3f ms "
           "(%.0f MB moved at least: %.0f GB/s)\n", fused, T, hc, H, ms, mb2, mb2 / ms);
    const char *e = G->error(G);
    if (e) printf("  hc: %s\n", e);
    G->destroy(G);
}

int main(int argc, char **argv)
{
    int T = argc > 1 ? atoi(argv[1]) : 8192;
    if (llm_cuda_device_count() < 1) {
        fprintf(stderr, "bench_cuda_prefill: no CUDA device\n");
        return 1;
    }
    printf("dense FP8-weight matmuls of a rank6 layer, %d tokens:\n", T);
    const char *modes[] = { "bf16x2", "bf16", "fp8" };
    for (int m = 0; m < 3; m++) bench_matmuls(modes[m], T);
    bench_hc(T, "1");
    bench_hc(T, "0");
    return 0;
}
