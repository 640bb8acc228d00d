/* Prefill MoE micro-benchmark on one GPU (not a test: prints times,
 * asserts nothing): the whole MoE op (router, routed experts, shared
 * expert, combination) of one layer at V4-Flash's rank shapes at TP=2
 * (H = 4096, a rank's 1024 of each expert's 2048 intermediate rows,
 * 256 MXFP4 experts, top-6, FP8 shared expert) for a step of T tokens,
 * synthetic weights.  Each prefill GEMM mode (LLM_CUDA_GEMM bf16x2,
 * bf16; fp8 with the grouped GEMMs only) with the grouped tensor-core expert GEMMs (moe_gemm.cu) and with
 * cuBLASLt per expert (LLM_CUDA_MOE=cublaslt); fp8 with the W4A8 kernel
 * (moe_gemm_fp8.cu) and with moe_gemm.cu's (LLM_CUDA_MOE_FP8=0);
 * milliseconds per op, host waits included.
 * T <= 8: the decode MoE instead (gate GEMV, then the fused routing and
 * expert kernels of moe_decode.cuh, float32 (LLM_CUDA_MOE_DEC_MMA=0);
 * LLM_CUDA_MOE_DECODE=0: the separate
 * router, shared-expert and expert GEMVs), in CUDA graphs of 32 ops over
 * 8 layers' weights (every read from DRAM); then the fused MoE's up
 * and down on tensor cores (the default) at each column split S of
 * its up kernel (LLM_CUDA_MOE_DEC_MMA_S 8, 4, 2, then 8 again: the
 * first row after a switch can differ), then with the router's shared-
 * memory rounds (LLM_CUDA_ROUTE_REGS=0); GB/s of the
 * weight bytes one op reads (gate, T * 6 expert slots, T shared-expert reads: each slot
 * reads its expert, so T > 1 counts an expert twice when two tokens pick
 * it; the unique bytes are at most that).
 * 9 <= T <= 64: the decode batch's MoE the same way, its expert tiles on
 * tensor cores (cu_moe_tiles_mma) and on the GEMV (LLM_CUDA_MOE_MMA=0);
 * GB/s of the gate, the shared expert and the experts the batch is
 * expected to choose, E (1 - (1 - K/E)^T), each read once (x's rows are
 * independent, fill_x, so the router reaches about that many).
 *   build/tests/gpu/bench_cuda_moe [T [fp8]]   (default 8192; fp8: only
 *   the two fp8 rows; LLM_CUDA_PROFILE=1 prints the GEMMs' own times) */
#include <math.h>
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

/* x for the router: each element its own hash of its index, uniform in
 * [-1, 1], so the tokens' rows are independent and a batch routes to the
 * experts a balanced router reaches (the GB/s below count that union).
 * (Until 2026-12-07 a sawtooth, ((i * 2654435761) % 2001) / 1000 - 1, whose
 * rows are shifts of one another: 32 tokens chose 68 of the 136 experts,
 * 64 tokens 90 of 200, so the decode rows' GB/s counted bytes not read.) */
static void fill_x(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t z = i + 0x9E3779B97F4A7C15ULL;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        z ^= z >> 31;
        x[i] = (float)((double)(z >> 40) * (2.0 / 16777216.0) - 1.0);
    }
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
    fill_x(hx, n);
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
    const char *f8 = getenv("LLM_CUDA_MOE_FP8");
    printf("moe prefill T=%d (E=%d K=%d H=%d I=%d) %-6s experts %-26s: %8.2f ms "
           "(%.0f TFLOP/s of routed products)\n", T, E, K, H, I, gemm,
           moe ? "cuBLASLt per expert"
           : strcmp(gemm, "fp8") || (f8 && !strcmp(f8, "0")) ? "grouped (moe_gemm)"
                                                             : "grouped W4A8 (moe_gemm_fp8)",
           ms, tflop / (ms * 1e-3));
    const char *e = G->error(G);
    if (e) printf("moe: %s\n", e);
    G->release(G, x), G->release(G, out), G->release(G, dbias);
    G->destroy(G);
    bench_moe_free(&a);
    free(hx), free(bias);
}

#define DLAYERS 8
#define DOPS 32

typedef struct {
    backend *G;
    moe_args a[DLAYERS];
    float *x;
    int H, T;
} dec_ctx;

static void dec_run(void *p, int i)
{
    dec_ctx *c = p;
    moe_args a = c->a[i % DLAYERS];
    a.T = c->T;
    a.x = c->x + (size_t)(i % 4) * c->T * c->H;      /* another step's tokens */
    c->G->moe(c->G, &a);
}

/* fused: T <= 8, the fused decode MoE; above, the expert tiles on tensor
 * cores.  T <= 8 without tiles asked for (LLM_CUDA_MOE_MMA_MIN_T unset):
 * none (MIN_T 9), so that 3-8 tokens measure the fused and separate
 * paths, not the default tiles. */
static void bench_decode(int T, bool fused)
{
    int H = 4096, E = 256, K = 6, I = 1024;
    bool tiles = getenv("LLM_CUDA_MOE_MMA_MIN_T") != NULL;
    if (T <= 8 && !tiles) setenv("LLM_CUDA_MOE_MMA_MIN_T", "9", 1);
    if (T <= 8) setenv("LLM_CUDA_MOE_DECODE", fused ? "8" : "0", 1);
    if (T <= 8 && getenv("LLM_CUDA_MOE_DEC_MMA_S")) unsetenv("LLM_CUDA_MOE_DEC_MMA");
    else if (T <= 8) setenv("LLM_CUDA_MOE_DEC_MMA", "0", 1);
    else setenv("LLM_CUDA_MOE_MMA", fused ? "1" : "0", 1);
    backend *one[1];
    char err[256];
    backend_modes modes = BACKEND_MODES_DEFAULT;
    if (backend_modes_env(&modes, err, sizeof err)
        || backend_cuda_new_group(1, &modes, one, err, sizeof err)) {
        printf("decode: %s\n", err);
        return;
    }
    dec_ctx c = { .G = one[0], .H = H, .T = T };
    backend *G = c.G;
    size_t n = (size_t)4 * T * H;
    float *hx = malloc(n * 4), *bias = calloc(E, 4);
    fill_x(hx, n);
    c.x = G->alloc(G, n * 4);
    float *out = G->alloc(G, (size_t)T * H * 4), *dbias = G->alloc(G, E * 4);
    G->write(G, c.x, hx, n * 4);
    G->write(G, dbias, bias, E * 4);
    for (int l = 0; l < DLAYERS; l++) {
        c.a[l] = bench_moe_layer(G, H, E, K, I, true, dbias);
        c.a[l].out = out;
    }
    double sec = bench_graph(G, 0x30e0d0 ^ (uint64_t)T << 4 ^ fused, DOPS, 10, dec_run, &c);
    /* MXFP4: I*H/2 codes + I*H/32 scales; FP8: I*H + (I/128)*(H/128) */
    double ex = 3.0 * ((double)I * H / 2 + (double)I * H / 32);
    double sh = 3.0 * ((double)I * H + (double)(I / 128) * (H / 128));
    double bytes = T <= 8 ? 2.0 * E * H + T * (K * ex + sh)
                          : 2.0 * E * H + E * (1 - pow(1 - (double)K / E, T)) * ex + sh;
    const char *l2 = getenv("LLM_CUDA_MOE_L2");
    bool l2_off = l2 && !strcmp(l2, "0");
    char dec_name[32];
    snprintf(dec_name, sizeof dec_name, "fused, mma S=%s%s", getenv("LLM_CUDA_MOE_DEC_MMA_S"),
             getenv("LLM_CUDA_ROUTE_REGS") ? " route smem" : "");
    printf("moe decode T=%d (E=%d K=%d H=%d I=%d) %-22s: %8.2f us %7.0f GB/s\n", T, E, K, H, I,
           T > 8 || tiles
                  ? (!fused ? "tiles on the GEMV"
                     : getenv("LLM_CUDA_MOE_MMA_BLOCKS") ? "tensor cores, 1 block/SM"
                     : l2_off                            ? "tensor cores, 64 B copies"
                                                         : "tensor cores, 2 blocks/SM")
           : fused ? (getenv("LLM_CUDA_MOE_DEC_MMA_S") ? dec_name : "fused (3 launches)")
                   : "separate (6 launches)",
           sec * 1e6, bytes / sec / 1e9);
    const char *e = G->error(G);
    if (e) printf("moe decode: %s\n", e);
    if (T <= 8 && !tiles) unsetenv("LLM_CUDA_MOE_MMA_MIN_T");
    G->release(G, c.x), G->release(G, out), G->release(G, dbias);
    G->destroy(G);
    for (int l = 0; l < DLAYERS; l++) bench_moe_free(&c.a[l]);
    free(hx), free(bias);
}

int main(int argc, char **argv)
{
    int T = argc > 1 ? atoi(argv[1]) : 8192;
    if (llm_cuda_device_count() < 1) {
        fprintf(stderr, "bench_cuda_moe: no CUDA device\n");
        return 1;
    }
    if (T >= 1 && T <= 64) {
        bench_decode(T, false);
        bench_decode(T, true);
        if (T > 8) {    /* the tensor-core plan of one block an SM */
            setenv("LLM_CUDA_MOE_MMA_BLOCKS", "1", 1);
            bench_decode(T, true);
            unsetenv("LLM_CUDA_MOE_MMA_BLOCKS");
            /* the copies of 64 bytes a row and stage, the scales a byte
             * at a time (before 128-byte lines) */
            setenv("LLM_CUDA_MOE_L2", "0", 1);
            bench_decode(T, true);
            unsetenv("LLM_CUDA_MOE_L2");
        } else {    /* the sorted expert tiles on tensor cores (LLM_CUDA_MOE_MMA_MIN_T=1) */
            setenv("LLM_CUDA_MOE_MMA_MIN_T", "1", 1);
            bench_decode(T, true);
            unsetenv("LLM_CUDA_MOE_MMA_MIN_T");
            /* the fused MoE's up and down on tensor cores, the up kernel's
             * column slices S (LLM_CUDA_MOE_DEC_MMA_S) */
            static const char *const slices[] = { "8", "4", "2", "8" };
            for (int i = 0; i < 4; i++) {
                setenv("LLM_CUDA_MOE_DEC_MMA_S", slices[i], 1);
                bench_decode(T, true);
            }
            setenv("LLM_CUDA_ROUTE_REGS", "0", 1);     /* the router's shared-memory rounds */
            bench_decode(T, true);
            unsetenv("LLM_CUDA_ROUTE_REGS");
            unsetenv("LLM_CUDA_MOE_DEC_MMA_S");
        }
        return 0;
    }
    bool fp8_only = argc > 2 && !strcmp(argv[2], "fp8");
    if (!fp8_only) {
        bench("bf16x2", NULL, T);
        bench("bf16x2", "cublaslt", T);
        bench("bf16", NULL, T);
        bench("bf16", "cublaslt", T);
    }
    /* fp8: the W4A8 kernel, then moe_gemm.cu's bf16 one on the same
     * quantized values (LLM_CUDA_MOE_FP8=0) */
    bench("fp8", NULL, T);
    setenv("LLM_CUDA_MOE_FP8", "0", 1);
    bench("fp8", NULL, T);
    unsetenv("LLM_CUDA_MOE_FP8");
    return 0;
}
