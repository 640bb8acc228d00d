/* Decode GEMV micro-benchmark on one GPU (not a test: prints times, asserts
 * nothing).  Every matrix shape one rank of V4-Flash at TP=2 reads per
 * decoded token, synthetic weights in their stored format, at T = 1, 4
 * and 8 tokens; then the whole MoE op at T = 1 (router, 6 of 256 MXFP4
 * experts, FP8 shared expert).  `batch`: the same shapes at T = 16, 32
 * and 64 (decode batches), each on the tensor-core small-M kernels
 * (matmul_mma.cu, matmul_stream.cu and matmul_wgmma.cu,
 * LLM_CUDA_SMALL_MMA=1, 2 and 3) and on
 * the path before them (LLM_CUDA_SMALL_MMA=0: the GEMV up to 16 tokens,
 * cuBLASLt above) and on the default's own choice (LLM_CUDA_SMALL_MMA
 * unset: from 9 tokens FP8 weights' bf16 copies and the head on
 * cuBLASLt), five backends in one process (`batch FILTER T,T,..`: those T only).  Each measurement is a CUDA graph of 32 ops replayed 10
 * times, the ops cycling over enough copies of the weights (>= 256 MB)
 * that every read comes from DRAM, not L2; GB/s counts the weight bytes
 * (codes + scales) only.
 *   build/tests/gpu/bench_cuda_gemv [filter | batch [filter [T,T,...]]]
 * (filter: a substring of the names) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "bench_util.h"
#include "cuda/device_info.h"

#define NOPS 32
#define REPS 10

static backend *G;

static size_t wbytes(enum qtype t, int rows, int cols)
{
    size_t n = (size_t)rows * cols;
    switch (t) {
    case QT_F32: return 4 * n;
    case QT_BF16: return 2 * n;
    case QT_FP8: return n + (size_t)(rows + 127) / 128 * ((cols + 127) / 128);
    default: return n / 2 + (size_t)rows * (cols / 32);
    }
}

/* Seconds per op of `run(i)` (i = 0..NOPS-1), replayed as a graph. */
static double timed(uint64_t key, void (*run)(void *, int), void *ctx)
{
    return bench_graph(G, key, NOPS, REPS, run, ctx);
}

typedef struct {
    qweight *w;
    int copies, T;
    float *x, *y;
} mm_ctx;

static void mm_run(void *p, int i)
{
    mm_ctx *c = p;
    const qweight *w = &c->w[i % c->copies];
    G->matmul(G, w, c->x, w->cols, c->T, c->y, w->rows);
}

/* The matrix's copies uploaded to b, and T-token x and y there. */
static mm_ctx mm_setup(backend *b, const char *name, enum qtype t, int rows, int cols, int maxT)
{
    size_t bytes = wbytes(t, rows, cols);
    int copies = (int)((256u << 20) / bytes) + 1;
    if (copies > NOPS) copies = NOPS;
    mm_ctx c = { calloc(copies, sizeof(qweight)), copies, 1, NULL, NULL };
    for (int i = 0; i < copies; i++)
        c.w[i] = (qweight){ .type = t, .rows = rows, .cols = cols, .ld = cols };
    if (b->upload_weights(b, c.w, copies)) {
        printf("%s: upload: %s\n", name, b->error(b));
        exit(1);
    }
    size_t nx = (size_t)maxT * cols;
    float *hx = malloc(nx * 4);
    for (size_t i = 0; i < nx; i++) hx[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
    c.x = b->alloc(b, nx * 4);
    c.y = b->alloc(b, (size_t)maxT * rows * 4);
    b->write(b, c.x, hx, nx * 4);
    free(hx);
    return c;
}

static void mm_free(backend *b, mm_ctx *c)
{
    const char *e = b->error(b);
    if (e) printf("%s\n", e);
    b->release(b, c->x);
    b->release(b, c->y);
    free(c->w);
}

static const char *fmt(enum qtype t)
{
    return t == QT_BF16 ? "bf16" : t == QT_FP8 ? "fp8" : t == QT_MXFP4 ? "mxfp4" : "f32";
}

static uint64_t mm_key(int rows, int cols, enum qtype t, int T)
{
    return ((uint64_t)rows << 40) ^ ((uint64_t)cols << 8) ^ (t << 4) ^ (uint64_t)T << 20;
}

static void bench_matmul(const char *name, enum qtype t, int rows, int cols, const char *filter)
{
    if (filter && !strstr(name, filter)) return;
    size_t bytes = wbytes(t, rows, cols);
    mm_ctx c = mm_setup(G, name, t, rows, cols, 8);
    static const int Ts[] = { 1, 4, 8 };
    for (int k = 0; k < 3; k++) {
        c.T = Ts[k];
        double s = timed(mm_key(rows, cols, t, c.T), mm_run, &c);
        printf("gemv %-12s %-5s %6d x %-6d T=%d: %8.2f us %7.0f GB/s\n", name, fmt(t), rows, cols,
               c.T, s * 1e6, bytes / s / 1e9);
    }
    mm_free(G, &c);
}

/* Decode batches: the small-M kernels (b[1]: matmul_mma.cu, x staged
 * whole; b[2]: matmul_stream.cu; b[3]: matmul_wgmma.cu) against the path
 * before them (b[0]) and the default's choice (b[4]), the same shape and
 * T on each. */
static void bench_batch(backend *const b[5], const char *name, enum qtype t, int rows, int cols,
                        const char *filter, const int *Ts, int nT)
{
    if (filter && !strstr(name, filter)) return;
    size_t bytes = wbytes(t, rows, cols);
    double s[5][8];
    for (int i = 0; i < 5; i++) {
        G = b[i];
        mm_ctx c = mm_setup(G, name, t, rows, cols, 64);
        for (int k = 0; k < nT; k++) {
            c.T = Ts[k];
            s[i][k] = timed(mm_key(rows, cols, t, c.T), mm_run, &c);
        }
        mm_free(G, &c);
    }
    for (int k = 0; k < nT; k++)
        printf("batch %-10s %-4s %5d x %-5d T=%2d: before %7.2f us %5.0f GB/s, staged %7.2f us "
               "%5.0f GB/s, streamed %7.2f us %5.0f GB/s, wgmma %7.2f us %5.0f GB/s, default "
               "%7.2f us %5.0f GB/s\n", name, fmt(t), rows, cols, Ts[k], s[0][k] * 1e6,
               bytes / s[0][k] / 1e9, s[1][k] * 1e6, bytes / s[1][k] / 1e9, s[2][k] * 1e6,
               bytes / s[2][k] / 1e9, s[3][k] * 1e6, bytes / s[3][k] / 1e9, s[4][k] * 1e6,
               bytes / s[4][k] / 1e9);
}

/* The MoE op at T = 1 over 8 layers' worth of experts (each op another
 * layer's, another token). */
#define MLAYERS 8
typedef struct {
    moe_args a[MLAYERS];
    float *x, *out;
    int H;
} moe_ctx;

static void moe_run(void *p, int i)
{
    moe_ctx *c = p;
    moe_args a = c->a[i % MLAYERS];
    a.x = c->x + (size_t)(i % 16) * c->H;
    G->moe(G, &a);
}

static void bench_moe(const char *filter)
{
    if (filter && !strstr("moe", filter)) return;
    int H = 4096, E = 256, K = 6, I = 1024;
    moe_ctx c = { .H = H };
    c.x = G->alloc(G, (size_t)16 * H * 4);
    c.out = G->alloc(G, (size_t)H * 4);
    float *hx = malloc((size_t)16 * H * 4), *bias = calloc(E, 4);
    for (size_t i = 0; i < (size_t)16 * H; i++)
        hx[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
    G->write(G, c.x, hx, (size_t)16 * H * 4);
    float *dbias = G->alloc(G, E * 4);
    G->write(G, dbias, bias, E * 4);
    for (int l = 0; l < MLAYERS; l++) {
        c.a[l] = bench_moe_layer(G, H, E, K, I, false, dbias);
        c.a[l].out = c.out;
    }
    double sec = timed(0x3e3e3e, moe_run, &c);
    size_t bytes = 3 * K * wbytes(QT_MXFP4, I, H) + 3 * wbytes(QT_FP8, I, H) +
                   wbytes(QT_BF16, E, H);
    printf("moe T=1 (E=%d K=%d H=%d I=%d, gate + routed + shared): %8.2f us %7.0f GB/s\n", E, K,
           H, I, sec * 1e6, bytes / sec / 1e9);
    const char *e = G->error(G);
    if (e) printf("moe: %s\n", e);
    free(hx), free(bias);
}

/* A backend on device 0; small_mma "0": LLM_CUDA_SMALL_MMA=0; NULL:
 * the environment's as it was when the bench started. */
static const char *small_mma_env;

static backend *gpu(const char *small_mma)
{
    backend *one[1];
    char err[256];
    backend_modes modes = BACKEND_MODES_DEFAULT;   /* LLM_CUDA_* override */
    if (!small_mma) small_mma = small_mma_env;
    if (small_mma) setenv("LLM_CUDA_SMALL_MMA", small_mma, 1);
    else unsetenv("LLM_CUDA_SMALL_MMA");
    if (backend_modes_env(&modes, err, sizeof err)
        || backend_cuda_new_group(1, &modes, one, err, sizeof err)) {
        fprintf(stderr, "bench_cuda_gemv: no CUDA backend: %s\n", err);
        exit(1);
    }
    return one[0];
}

/* V4-Flash's dense shapes per rank at TP=2 (rows, columns, format). */
static const struct {
    const char *name;
    enum qtype t;
    int rows, cols;
} shapes[] = {
    { "wq_a", QT_FP8, 1024, 4096 },      { "wq_b", QT_FP8, 16384, 1024 },
    { "wkv", QT_FP8, 512, 4096 },        { "iwq_b", QT_FP8, 8192, 1024 },
    { "wo_b", QT_FP8, 4096, 4096 },      { "shared_w1", QT_FP8, 1024, 4096 },
    { "shared_w2", QT_FP8, 4096, 1024 }, { "comp_wkv", QT_BF16, 1024, 4096 },
    { "wo_a_group", QT_BF16, 1024, 4096 }, { "icomp_wkv", QT_BF16, 256, 4096 },
    { "gate", QT_BF16, 256, 4096 },      { "head", QT_BF16, 64640, 4096 },
};
#define NSHAPES (sizeof shapes / sizeof shapes[0])

int main(int argc, char **argv)
{
    if (llm_cuda_device_count() < 1) {
        fprintf(stderr, "bench_cuda_gemv: no CUDA device\n");
        return 1;
    }
    const char *sm = getenv("LLM_CUDA_SMALL_MMA");
    small_mma_env = sm ? strdup(sm) : NULL;     /* setenv may replace the string */
    if (argc > 1 && !strcmp(argv[1], "batch")) {
        const char *filter = argc > 2 && *argv[2] ? argv[2] : NULL;
        int Ts[8] = { 16, 32, 64 }, nT = 3;
        if (argc > 3) {
            char *p = argv[3];
            for (nT = 0; *p; nT++) {
                if (nT == 8) {
                    fprintf(stderr, "bench_cuda_gemv: at most 8 token counts: %s\n", argv[3]);
                    return 1;
                }
                Ts[nT] = (int)strtol(p, &p, 10);
                if (Ts[nT] < 1 || Ts[nT] > 64 || (*p && *p++ != ',')) {
                    fprintf(stderr, "bench_cuda_gemv: T must be 1-64: %s\n", argv[3]);
                    return 1;
                }
            }
        }
        backend *b[5] = { gpu("0"), gpu("1"), gpu("2"), gpu("3"), gpu(NULL) };
        for (size_t i = 0; i < NSHAPES; i++)
            if (strcmp(shapes[i].name, "gate"))     /* the router's gate stays float32 */
                bench_batch(b, shapes[i].name, shapes[i].t, shapes[i].rows, shapes[i].cols,
                            filter, Ts, nT);
        for (int i = 0; i < 5; i++) b[i]->destroy(b[i]);
        return 0;
    }
    const char *filter = argc > 1 ? argv[1] : NULL;
    G = gpu(NULL);
    for (size_t i = 0; i < NSHAPES; i++)
        bench_matmul(shapes[i].name, shapes[i].t, shapes[i].rows, shapes[i].cols, filter);
    bench_matmul("expert_w1", QT_MXFP4, 1024, 4096, filter);
    bench_matmul("expert_w2", QT_MXFP4, 4096, 1024, filter);
    bench_moe(filter);
    G->destroy(G);
    return 0;
}
