/* Prefill MoE micro-benchmark on one GPU (not a test: prints times,
 * asserts nothing): the whole MoE op (router, routed experts, shared
 * expert, combination) of one layer at V4-Flash's rank shapes at TP=2
 * (H = 4096, a rank's 1024 of each expert's 2048 intermediate rows,
 * 256 MXFP4 experts, top-6, FP8 shared expert) for a step of T tokens,
 * synthetic weights.  Each prefill GEMM mode (LLM_CUDA_GEMM bf16x2,
 * bf16; fp8 with the grouped GEMMs only) with the grouped tensor-core expert GEMMs (moe_gemm.cu) and with
 * cuBLASLt per expert (LLM_CUDA_MOE=cublaslt); milliseconds per op,
 * host waits included.
 *   build/tests/gpu/bench_cuda_moe [T]   (default 8192) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "bench_util.h"
#include "cuda/device_info.h"

#define REPS 5

static void sync(backend *G, float *d)
{
    float h;
    G->read(G, &h, d, 4);
}

static void bench(const char *gemm, const char *moe, int T)
{
    int H = 4096, E = 256, K = 6, I = 1024;
    setenv("LLM_CUDA_GEMM", gemm, 1);
    if (moe) setenv("LLM_CUDA_MOE", moe, 1);
    else unsetenv("LLM_CUDA_MOE");
    backend *one[1];
    char err[256];
    backend_modes modes = BACKEND_MODES_DEFAULT;   /* LLM_CUDA_* override */
    if (backend_modes_env(&modes, err, sizeof err)
        || backend_cuda_new_group(1, &modes, one, err, sizeof err)) {
        printf("%s: %s\n", gemm, err);
        return;
    }
    backend *G = one[0];
    /* rank 1's slice of each expert: w1 / w3 rows, w2 columns */
    float *dbias = G->alloc(G, E * 4);
    size_t n = (size_t)T * H;
    float *hx = malloc(n * 4), *bias = calloc(E, 4);
    for (size_t i = 0; i < n; i++) hx[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
    float *x = G->alloc(G, n * 4), *out = G->alloc(G, n * 4);
    G->write(G, x, hx, n * 4);
    G->write(G, dbias, bias, E * 4);
    moe_args a = bench_moe_layer(G, H, E, K, I, true, dbias);
    a.T = T, a.x = x, a.out = out;
    G->moe(G, &a);
    sync(G, out);
    double t0 = now();
    for (int r = 0; r < REPS; r++) G->moe(G, &a);
    sync(G, out);
    double ms = (now() - t0) / REPS * 1e3;
    double tflop = 2.0 * T * K * 3 * (double)I * H / 1e12;
    printf("moe prefill T=%d (E=%d K=%d H=%d I=%d) %-6s experts %-20s: %8.2f ms "
           "(%.0f TFLOP/s of routed products)\n", T, E, K, H, I, gemm,
           moe ? "cuBLASLt per expert" : "grouped (moe_gemm)", ms, tflop / (ms * 1e-3));
    const char *e = G->error(G);
    if (e) printf("moe: %s\n", e);
    G->release(G, x), G->release(G, out), G->release(G, dbias);
    G->destroy(G);
    bench_moe_free(&a);
    free(hx), free(bias);
}

int main(int argc, char **argv)
{
    int T = argc > 1 ? atoi(argv[1]) : 8192;
    if (llm_cuda_device_count() < 1) {
        fprintf(stderr, "bench_cuda_moe: no CUDA device\n");
        return 1;
    }
    bench("bf16x2", NULL, T);
    bench("bf16x2", "cublaslt", T);
    bench("bf16", NULL, T);
    bench("bf16", "cublaslt", T);
    bench("fp8", NULL, T);
    return 0;
}
