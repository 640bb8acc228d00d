/* Shared by the GPU micro-benchmarks (bench_cuda_*.c; no assertions, they
 * print tables): a clock, and one MoE layer of V4-Flash with synthetic
 * weights on the device. */
#ifndef LLM_TESTS_GPU_BENCH_UTIL_H
#define LLM_TESTS_GPU_BENCH_UTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "backend.h"

static inline double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* An MoE layer of E MXFP4 experts [I x H] / [H x I] (slice: rank 1's half
 * of 2I-wide experts, as TP=2 views them), a BF16 router and an FP8
 * shared expert, uploaded to G as synthetic weights (exits on failure).
 * The arguments of a one-token step; the caller sets T, x and out. */
static inline moe_args bench_moe_layer(backend *G, int H, int E, int K, int I, bool slice,
                                       const float *dbias)
{
    qweight *w1 = calloc(E, sizeof *w1), *w2 = calloc(E, sizeof *w2), *w3 = calloc(E, sizeof *w3);
    qweight *s = calloc(4, sizeof *s);
    for (int e = 0; e < E; e++) {
        w1[e] = w3[e] = (qweight){ .type = QT_MXFP4, .rows = I, .cols = H, .ld = H,
                                   .row0 = slice ? I : 0 };
        w2[e] = (qweight){ .type = QT_MXFP4, .rows = H, .cols = I, .ld = slice ? 2 * I : I,
                           .col0 = slice ? I : 0 };
    }
    s[0] = (qweight){ .type = QT_BF16, .rows = E, .cols = H, .ld = H };
    s[1] = s[3] = (qweight){ .type = QT_FP8, .rows = I, .cols = H, .ld = H };
    s[2] = (qweight){ .type = QT_FP8, .rows = H, .cols = I, .ld = I };
    if (G->upload_weights(G, w1, E) || G->upload_weights(G, w2, E) ||
        G->upload_weights(G, w3, E) || G->upload_weights(G, &s[0], 1) ||
        G->upload_weights(G, &s[1], 1) || G->upload_weights(G, &s[2], 1) ||
        G->upload_weights(G, &s[3], 1)) {
        printf("moe: upload: %s\n", G->error(G));
        exit(1);
    }
    return (moe_args){ .T = 1, .H = H, .gate = &s[0], .bias = dbias, .n_experts = E, .topk = K,
                       .routed_scale = 1.5f, .limit = 10.0f, .w1 = w1, .w2 = w2, .w3 = w3,
                       .sw1 = &s[1], .sw2 = &s[2], .sw3 = &s[3] };
}

/* Seconds per op of run(ctx, i), i = 0..nops-1, captured as one CUDA
 * graph (after three warm-ups: as usual, captured, replayed) and replayed
 * reps times; a read of 4 bytes waits for the device's queue. */
static inline double bench_graph(backend *G, uint64_t key, int nops, int reps,
                                 void (*run)(void *, int), void *ctx)
{
    float h, *d = G->alloc(G, 4);
    for (int warm = 0; warm < 3; warm++) {
        G->graph_begin(G, key);
        for (int i = 0; i < nops; i++) run(ctx, i);
        while (G->graph_end(G)) for (int i = 0; i < nops; i++) run(ctx, i);
    }
    G->read(G, &h, d, 4);
    double t0 = now();
    for (int r = 0; r < reps; r++) {
        G->graph_begin(G, key);
        for (int i = 0; i < nops; i++) run(ctx, i);
        while (G->graph_end(G)) for (int i = 0; i < nops; i++) run(ctx, i);
    }
    G->read(G, &h, d, 4);
    double s = (now() - t0) / (reps * nops);
    G->release(G, d);
    return s;
}

/* The host views bench_moe_layer allocated. */
static inline void bench_moe_free(moe_args *a)
{
    free((void *)a->w1), free((void *)a->w2), free((void *)a->w3), free((void *)a->gate);
}

#endif
