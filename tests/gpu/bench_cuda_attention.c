/* Attention micro-benchmark on one GPU (not a test: prints times,
 * asserts nothing).  Prefill, and with `decode`, decode steps.  One rank of V4-Flash at TP=2: 32 heads of 512, window
 * 128, FP8 cache, a chunk of n query tokens (8192, the prefill step) at
 * context ~8K (the chunk starts at 0) and ~100K (it ends at 100,000):
 * sliding window only, CSA (ratio 4, top-512 chosen entries per token,
 * spread evenly over the visible ones) and HCA (ratio 128, all visible
 * entries).  The default mode (bf16x2; LLM_CUDA_GEMM picks another);
 * LLM_CUDA_ATTN_TOKENS picks the query tokens per block.  The key values
 * repeat (one block of random rows copied everywhere): only times matter.
 *   build/tests/gpu/bench_cuda_attention [n]
 * Decode: B sequences of one new token each at context ~8K and ~131K
 * (one sequence at the full context, the others spread below it, as a
 * batch is), one attention op per layer replayed as a CUDA graph of
 * NOPS ops (the decode step's way: no host work in the time), B = 1, 8,
 * 32, 64, and B = 1, 8 at ~1M; LLM_CUDA_ATTN_DECODE=0 times the
 * two-kernel path instead, LLM_CUDA_ATTN_MMA_MIN_T and
 * LLM_CUDA_ATTN_CLUSTER the tensor-core kernel and its merge.
 *   build/tests/gpu/bench_cuda_attention decode
 * Indexer: the lightning indexer op of a decode step (scores and top-k)
 * at rank6's shapes (64 heads of 128, top 512, ratio 4, FP8 keys, every
 * key row random) for B = 1 and 8 sequences at contexts 131,072 and
 * 1,048,576 (spread as above), NOPS ops a graph; LLM_CUDA_TOPK_BLOCKS=0
 * times the top-k on one block a token.  The hash of the chosen entries
 * must not change with the setting.
 *   build/tests/gpu/bench_cuda_attention indexer   */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "bench_util.h"
#include "cpu/kv_quant.h"
#include "cuda/device_info.h"

#define HEADS 32
#define HD 512
#define WINDOW 128
#define PER_BLOCK 64    /* cache rows per block */
#define REPS 5

static backend *G;

static unsigned long long rnd(void)    /* xorshift64 */
{
    static unsigned long long x = 88172645463325252ull;
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return x;
}

static float frand(void)        /* uniform in [-1, 1) */
{
    return (float)(rnd() >> 40) / (1 << 23) - 1.0f;
}

/* A device buffer of `count` floats, a block of random ones repeated. */
static float *dfill(size_t count)
{
    enum { CH = 1 << 20 };
    static float *h;
    if (!h) {
        h = malloc(CH * sizeof *h);
        for (int i = 0; i < CH; i++) h[i] = frand();
    }
    float *d = G->alloc(G, count * 4);
    for (size_t i = 0; i < count; i += CH) {
        size_t m = count - i < CH ? count - i : CH;
        G->write(G, d + i, h, m * 4);
    }
    return d;
}

/* `rows` FP8 rows of `width` random values in a region of that many rows. */
static void *region(int rows, int width)
{
    size_t bytes = kv_region_bytes(KV_FP8, rows, width);
    char *h = malloc(bytes);
    float row[HD];
    for (int r = 0; r < rows; r++) {
        for (int c = 0; c < width; c++) row[c] = frand();
        kv_store(KV_FP8, h, rows, width, r, row);
    }
    return h;
}

/* The device cache every query reads: `nent` compressed entries in FP8
 * blocks (one random block written to each) and the sliding ring. */
typedef struct {
    char *dcache, **blocks, *dring;
} bench_cache;

static bench_cache cache_new(int nent)
{
    int nblk = nent / PER_BLOCK + 1;
    size_t bbytes = kv_region_bytes(KV_FP8, PER_BLOCK, HD);
    char *blk = region(PER_BLOCK, HD), *ring = region(WINDOW, HD);
    bench_cache k = { G->alloc(G, nblk * bbytes), malloc(nblk * sizeof(char *)),
                      G->alloc(G, kv_region_bytes(KV_FP8, WINDOW, HD)) };
    for (int b = 0; b < nblk; b++) {
        k.blocks[b] = k.dcache + b * bbytes;
        G->write(G, k.blocks[b], blk, bbytes);
    }
    G->write(G, k.dring, ring, kv_region_bytes(KV_FP8, WINDOW, HD));
    free(blk), free(ring);
    return k;
}

static void cache_free(bench_cache *k)
{
    G->release(G, k->dcache), G->release(G, k->dring);
    free(k->blocks);
}

/* After a result line: a device error is sticky, so every later line
 * would time launches that fail at once; stop instead. */
static void stop_on_error(void)
{
    if (!G->error(G)) return;
    fprintf(stderr, "bench_cuda_attention: stopped after a device error: %s\n", G->error(G));
    exit(1);
}

static void bench(const char *name, int ratio, int topk, int pos0, int n)
{
    bench_cache k = cache_new(ratio ? (pos0 + n) / ratio : 0);
    char *dring = k.dring, **blocks = k.blocks;
    float *dq = dfill((size_t)n * HEADS * HD), *dkv = dfill((size_t)n * HD);
    float *dsinks = dfill(HEADS), *dout = G->alloc(G, (size_t)n * HEADS * HD * 4);
    G->kv_round(G, dkv, HD, n, HD, KV_FP8);
    int32_t *sel = NULL, *dsel = NULL;
    int *nsel = NULL, *dnsel = NULL;
    long long keys = 0;     /* keys over all tokens */
    if (topk) {
        sel = malloc((size_t)n * topk * 4), nsel = malloc(n * sizeof *nsel);
        for (int i = 0; i < n; i++) {
            int nvis = (pos0 + i + 1) / ratio, k = nvis < topk ? nvis : topk;
            for (int s = 0; s < k; s++) {   /* one in each of k even spans */
                long long lo = (long long)s * nvis / k, hi = (long long)(s + 1) * nvis / k;
                sel[(size_t)i * topk + s] = (int)(lo + rnd() % (hi - lo));
            }
            nsel[i] = k;
        }
        dsel = G->alloc(G, (size_t)n * topk * 4), dnsel = G->alloc(G, n * sizeof *nsel);
        G->write(G, dsel, sel, (size_t)n * topk * 4);
        G->write(G, dnsel, nsel, n * sizeof *nsel);
    }
    for (int i = 0; i < n; i++) {
        int p = pos0 + i;
        keys += (p < WINDOW ? p + 1 : WINDOW) + (topk ? nsel[i] : ratio ? (p + 1) / ratio : 0);
    }
    attention_args a = { .n = n, .pos0 = pos0, .nheads = HEADS, .head_dim = HD, .window = WINDOW,
                         .scale = 0.044f, .q = dq, .kv = dkv, .ring = dring, .dtype = KV_FP8,
                         .sinks = dsinks, .ratio = ratio,
                         .comp = { blocks, 0, PER_BLOCK, HD, KV_FP8 }, .sel = dsel,
                         .nsel = dnsel, .sel_ld = topk, .out = dout };
    float one;
    G->attention(G, &a, 1);
    G->read(G, &one, dout, sizeof one);
    double t0 = now();
    for (int r = 0; r < REPS; r++) G->attention(G, &a, 1);
    G->read(G, &one, dout, sizeof one);
    double s = (now() - t0) / REPS;
    /* 2 matmuls of 2 flop per head, key and channel */
    double tf = 4.0 * keys * HEADS * HD / s / 1e12;
    printf("attention %-8s context %6d n=%d: %8.3f ms  %6.1f keys/token  %6.1f TFLOP/s  out[0] %g%s%s\n",
           name, pos0 + n, n, s * 1e3, (double)keys / n, tf, one, G->error(G) ? "  error: " : "",
           G->error(G) ? G->error(G) : "");
    stop_on_error();
    void *dev[] = { dq, dkv, dsinks, dout, dsel, dnsel };
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) if (dev[i]) G->release(G, dev[i]);
    cache_free(&k);
    free(sel), free(nsel);
}

#define NOPS 32         /* decode: attention ops (layers) per graph */
#define DREPS 20

typedef struct {
    int nseg;
    const attention_args *a;
} dec_ctx;

static void sync1(void)
{
    static float *d;
    float h;
    if (!d) d = G->alloc(G, 4);
    G->read(G, &h, d, 4);
}

/* Seconds per op of NOPS attention ops replayed as a graph. */
static double dec_timed(uint64_t key, const dec_ctx *c)
{
    double t0 = 0;
    for (int r = 0; r < 3 + DREPS; r++) {       /* as usual, captured, replayed; then timed */
        if (r == 3) sync1(), t0 = now();
        G->graph_begin(G, key);
        for (int i = 0; i < NOPS; i++) G->attention(G, c->a, c->nseg);
        while (G->graph_end(G))
            for (int i = 0; i < NOPS; i++) G->attention(G, c->a, c->nseg);
    }
    sync1();
    return (now() - t0) / (DREPS * NOPS);
}

/* B sequences at positions up to pos (one at pos), one new token each;
 * every sequence reads the same cache blocks and ring (times only). */
static void bench_decode(const char *name, int ratio, int topk, int pos, int B)
{
    bench_cache k = cache_new(ratio ? (pos + 1) / ratio : 0);
    char *dring = k.dring, **blocks = k.blocks;
    float *dq = dfill((size_t)B * HEADS * HD), *dkv = dfill((size_t)B * HD);
    float *dsinks = dfill(HEADS), *dout = G->alloc(G, (size_t)B * HEADS * HD * 4);
    G->kv_round(G, dkv, HD, B, HD, KV_FP8);
    int32_t *sel = topk ? malloc((size_t)B * topk * 4) : NULL, *dsel = NULL;
    int *nsel = topk ? malloc(B * sizeof *nsel) : NULL, *dnsel = NULL;
    attention_args *a = calloc(B, sizeof *a);
    long long keys = 0;
    for (int s = 0; s < B; s++) {
        int p = s == 0 ? pos : (int)((long long)pos * s / B);
        int nvis = ratio ? (p + 1) / ratio : 0;
        if (topk) {
            int k = nvis < topk ? nvis : topk;
            for (int e = 0; e < k; e++) {
                long long lo = (long long)e * nvis / k, hi = (long long)(e + 1) * nvis / k;
                sel[(size_t)s * topk + e] = (int)(lo + rnd() % (hi - lo));
            }
            nsel[s] = k;
        }
        keys += (p < WINDOW ? p + 1 : WINDOW) + (topk ? nsel[s] : nvis);
        a[s] = (attention_args){ .n = 1, .pos0 = p, .nheads = HEADS, .head_dim = HD,
                                 .window = WINDOW, .scale = 0.044f, .q = dq + (size_t)s * HEADS * HD,
                                 .kv = dkv + (size_t)s * HD, .ring = dring, .dtype = KV_FP8,
                                 .sinks = dsinks, .ratio = ratio,
                                 .comp = { blocks, 0, PER_BLOCK, HD, KV_FP8 },
                                 .sel_ld = topk, .out = dout + (size_t)s * HEADS * HD };
    }
    if (topk) {
        dsel = G->alloc(G, (size_t)B * topk * 4), dnsel = G->alloc(G, B * sizeof *nsel);
        G->write(G, dsel, sel, (size_t)B * topk * 4);
        G->write(G, dnsel, nsel, B * sizeof *nsel);
        for (int s = 0; s < B; s++) a[s].sel = dsel + (size_t)s * topk, a[s].nsel = dnsel + s;
    }
    dec_ctx c = { B, a };
    uint64_t key = ((uint64_t)ratio << 40) ^ ((uint64_t)pos << 8) ^ (uint64_t)B;
    double t = dec_timed(key, &c);
    float one;
    G->read(G, &one, dout, sizeof one);
    /* key bytes each (sequence, head group) reads: codes and scales */
    double gb = (double)keys * (HD + HD / 64) / 1e9;
    printf("decode %-8s context %7d B=%2d: %8.2f us per op  %7.1f keys/seq  %6.1f GB/s of keys"
           "  out[0] %g%s%s\n", name, pos + 1, B, t * 1e6, (double)keys / B, gb / t, one,
           G->error(G) ? "  error: " : "", G->error(G) ? G->error(G) : "");
    stop_on_error();
    void *dev[] = { dq, dkv, dsinks, dout, dsel, dnsel };
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) if (dev[i]) G->release(G, dev[i]);
    cache_free(&k);
    free(sel), free(nsel), free(a);
}

#define IX_HEADS 64     /* rank6: index_n_heads, index_head_dim, index_topk */
#define IX_D 128
#define IX_TOPK 512

typedef struct {
    int nseg;
    const indexer_args *a;
} ix_ctx;

static void indexer_run(void *ctx, int i)
{
    const ix_ctx *c = ctx;
    (void)i;
    G->indexer(G, c->a, c->nseg);
}

/* The indexer op of B one-token sequences at positions up to pos (one
 * at pos): keys of nent = (pos + 1) / 4 random FP8 rows, shared. */
static void bench_indexer(int pos, int B)
{
    int nent = (pos + 1) / 4, nblk = nent / PER_BLOCK + 1;
    size_t bbytes = kv_region_bytes(KV_FP8, PER_BLOCK, IX_D);
    char *dkeys = G->alloc(G, nblk * bbytes), **blocks = malloc(nblk * sizeof(char *));
    for (int b = 0; b < nblk; b++) {
        char *h = region(PER_BLOCK, IX_D);
        blocks[b] = dkeys + b * bbytes;
        G->write(G, blocks[b], h, bbytes);
        free(h);
    }
    float *q = malloc((size_t)B * IX_HEADS * IX_D * 4), *w = malloc((size_t)B * IX_HEADS * 4);
    for (size_t i = 0; i < (size_t)B * IX_HEADS * IX_D; i++) q[i] = frand();
    for (int i = 0; i < B * IX_HEADS; i++) w[i] = frand();
    float *dq = G->alloc(G, (size_t)B * IX_HEADS * IX_D * 4), *dw = G->alloc(G, B * IX_HEADS * 4);
    G->write(G, dq, q, (size_t)B * IX_HEADS * IX_D * 4);
    G->write(G, dw, w, B * IX_HEADS * 4);
    int32_t *dsel = G->alloc(G, (size_t)B * IX_TOPK * 4);
    int *dnsel = G->alloc(G, B * sizeof(int));
    indexer_args *a = calloc(B, sizeof *a);
    long long ents = 0;
    for (int s = 0; s < B; s++) {
        int p = s == 0 ? pos : (int)((long long)pos * s / B);
        ents += (p + 1) / 4;
        a[s] = (indexer_args){ .n = 1, .pos0 = p, .ratio = 4, .nheads = IX_HEADS, .d = IX_D,
                               .topk = IX_TOPK, .q = dq + (size_t)s * IX_HEADS * IX_D,
                               .w = dw + (size_t)s * IX_HEADS,
                               .keys = { blocks, 0, PER_BLOCK, IX_D, KV_FP8 },
                               .sel = dsel + (size_t)s * IX_TOPK, .nsel = dnsel + s };
    }
    ix_ctx c = { B, a };
    uint64_t key = 0x1D000000000ull ^ ((uint64_t)pos << 8) ^ (uint64_t)B;
    double t = bench_graph(G, key, NOPS, DREPS, indexer_run, &c);
    /* FNV-1a over every sequence's count and chosen entries */
    int32_t *sel = malloc((size_t)B * IX_TOPK * 4);
    int *nsel = malloc(B * sizeof *nsel);
    G->read(G, sel, dsel, (size_t)B * IX_TOPK * 4);
    G->read(G, nsel, dnsel, B * sizeof *nsel);
    uint64_t h = 0xcbf29ce484222325ull;
    for (int s = 0; s < B; s++)
        for (int k = -1; k < (nsel[s] < IX_TOPK ? nsel[s] : IX_TOPK); k++)
            h = (h ^ (uint32_t)(k < 0 ? nsel[s] : sel[(size_t)s * IX_TOPK + k])) * 0x100000001b3ull;
    /* key bytes read (codes and scales) and multiply-adds of the scores */
    double gb = (double)ents * (IX_D + IX_D / 64) / 1e9, gmac = (double)ents * IX_HEADS * IX_D / 1e9;
    printf("indexer context %7d B=%d: %8.2f us per op  %8.1f entries/seq  %6.1f GB/s of keys  "
           "%6.1f TFLOP/s  selection hash %016llx%s%s\n", pos + 1, B, t * 1e6, (double)ents / B,
           gb / t, 2 * gmac / t / 1e3, (unsigned long long)h, G->error(G) ? "  error: " : "",
           G->error(G) ? G->error(G) : "");
    stop_on_error();
    G->release(G, dkeys), G->release(G, dq), G->release(G, dw), G->release(G, dsel),
        G->release(G, dnsel);
    free(blocks), free(q), free(w), free(a), free(sel), free(nsel);
}

int main(int argc, char **argv)
{
    bool decode = argc > 1 && !strcmp(argv[1], "decode");
    bool indexer = argc > 1 && !strcmp(argv[1], "indexer");
    int n = argc > 1 && !decode && !indexer ? atoi(argv[1]) : 8192;
    backend *one[1];
    char err[256];
    backend_modes modes = BACKEND_MODES_DEFAULT;   /* LLM_CUDA_* override */
    if (llm_cuda_device_count() < 1 || backend_modes_env(&modes, err, sizeof err)
        || backend_cuda_new_group(1, &modes, one, err, sizeof err)) {
        fprintf(stderr, "bench_cuda_attention: no CUDA backend\n");
        return 1;
    }
    G = one[0];
    const char *tk = getenv("LLM_CUDA_ATTN_TOKENS"), *gm = getenv("LLM_CUDA_GEMM");
    const char *ad = getenv("LLM_CUDA_ATTN_DECODE"), *amt = getenv("LLM_CUDA_ATTN_MMA_MIN_T");
    const char *acl = getenv("LLM_CUDA_ATTN_CLUSTER");
    if (indexer) {
        const char *tb = getenv("LLM_CUDA_TOPK_BLOCKS");
        printf("LLM_CUDA_TOPK_BLOCKS=%s, %d ops per graph\n", tb ? tb : "", NOPS);
        int ctx[] = { 131071, 1048575 };
        for (int k = 0; k < 2; k++) {
            bench_indexer(ctx[k], 1);
            bench_indexer(ctx[k], 8);
        }
        G->destroy(G);
        return 0;
    }
    if (decode) {
        printf("LLM_CUDA_ATTN_DECODE=%s LLM_CUDA_ATTN_MMA_MIN_T=%s LLM_CUDA_ATTN_CLUSTER=%s, "
               "%d ops per graph\n", ad ? ad : "", amt ? amt : "", acl ? acl : "", NOPS);
        int bs[] = { 1, 8, 32, 64 }, ctx[] = { 8191, 131071, 1048575 };
        for (int k = 0; k < 3; k++)
            for (int i = 0; i < (k < 2 ? 4 : 2); i++) {
                bench_decode("sliding", 0, 0, ctx[k], bs[i]);
                bench_decode("csa", 4, 512, ctx[k], bs[i]);
                bench_decode("hca", 128, 0, ctx[k], bs[i]);
            }
        G->destroy(G);
        return 0;
    }
    printf("LLM_CUDA_GEMM=%s LLM_CUDA_ATTN_TOKENS=%s\n", gm ? gm : "", tk ? tk : "");
    bench("sliding", 0, 0, 0, n);
    bench("csa", 4, 512, 0, n);
    bench("hca", 128, 0, 0, n);
    bench("csa", 4, 512, 100000 - n, n);
    bench("hca", 128, 0, 100000 - n, n);
    G->destroy(G);
    return 0;
}
