/* llm-engine bench --model DIR | --synthetic CONFIG.json
 *                  [--backend cpu|cuda] [--tp N] [--threads N]
 *                  [--prompt N | --prompts N,N,...] [--batch B,B,...]
 *                  [--chunk N] [--decode N] [--logits argmax|copy]
 *                  [--peak-gbs X] [--peak-tflops Y] [--gpu-memory-utilization U]
 *                  [--kv-cache-dtype auto|bf16|fp8]
 *                  [--prefix-repeat NEW [--rounds R] [--kv-offloading-size GIB]]
 * Per prompt length: one sequence, the prompt of pseudo-random tokens
 * prefilled in steps of at most --chunk tokens (default 8192, the
 * recipes' max_num_batched_tokens; time to first token = their sum), then
 * decoding token by token at that context (the first WARM_STEPS timed
 * apart).  --batch B: B sequences, each with its own prompt of that
 * length, decode together (one step carries a token of each): aggregate
 * tokens/s, ms/token per sequence, and the bandwidth floor of the bytes a
 * step reads (weights once, the routed experts being the expected union
 * of the batch's choices under balanced routing, as a trained router's
 * and the synthetic one's are -- test_model_synthetic; not a count of
 * what the router chose -- and every sequence's cache).  --logits: what a
 * decode step hands back, `argmax` (default) each sequence's greedy choice
 * found on the device, as a greedy request's step, or `copy` every
 * sequence's logits row to the host, as a sampled request's step (the
 * decode numbers before 2026-12-02's ninth session).  The tokens fed stay
 * pseudo-random either way.  --synthetic builds random weights of the
 * config's exact shapes and dtypes on the GPUs (no files; cuda only).
 * Prints a table with load time, memory, cache capacity at 128K/384K/1M
 * positions, and roofline fractions: prefill FLOPs per GPU-second over
 * --peak-tflops, decode weight and cache bytes per token per rank over
 * --peak-gbs (defaults: the H200 ceilings measured on the GPU machine,
 * 788 TFLOP/s dense bf16 and 4300 GB/s device copy, KINDS.md).
 * --gpu-memory-utilization sizes the cache pool as the server does (a
 * profile step of the longest prompt at load) and reports that pool's
 * capacity instead of the free memory's.  --prefix-repeat NEW measures
 * prefix caching instead (cli_bench_prefix.c): TTFT of the --prompt cold,
 * and of it plus NEW tokens from the cache's GPU tier and its host tier
 * (--kv-offloading-size GiB, default 4), --rounds times (default 3). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "cpu/qweight.h"
#include "model.h"
#include "model_weights.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Stored bytes of a [rows][cols] matrix. */
static double qbytes(enum qtype t, double rows, double cols)
{
    switch (t) {
    case QT_FP8: return rows * cols + ceil(rows / 128) * ceil(cols / 128);
    case QT_MXFP4: return rows * cols / 2 + rows * cols / 32;
    case QT_BF16: return 2 * rows * cols;
    default: return 4 * rows * cols;
    }
}

/* Compressed entries a query at position p attends to in layer l. */
static double ncomp(const v4_config *c, int l, double p)
{
    int r = v4_layer_ratio(c, l);
    if (!r) return 0;
    double nvis = floor((p + 1) / r);
    return c->attn[l] == V4_ATTN_CSA ? fmin(nvis, c->index_topk) : nvis;
}

/* Cache bytes one decode token at position p reads on one rank (all
 * layers), stored as t. */
static double cache_bytes(const v4_config *c, enum kv_dtype t, double p)
{
    double b = 0;
    for (int l = 0; l < c->n_layers; l++) {
        int ratio = v4_layer_ratio(c, l);
        if (c->attn[l] == V4_ATTN_CSA)
            b += (double)kv_row_bytes(t, c->index_head_dim) * floor((p + 1) / ratio);
        b += (double)kv_row_bytes(t, c->head_dim) * (fmin(c->sliding_window, p + 1) + ncomp(c, l, p));
    }
    return b;
}

/* One routed expert's bytes in one layer on rank s. */
static double expert_bytes(const v4_config *c, const v4_shard *s)
{
    return 3 * qbytes(QT_MXFP4, s->ni, c->hidden_size);
}

/* Expected distinct routed experts per layer that B tokens choose, each
 * topk of n_experts uniformly (what random weights and tokens give):
 * E (1 - (1 - k/E)^B); exactly topk for one token. */
static double experts_read(const v4_config *c, int B)
{
    double E = c->n_experts;
    return B == 1 ? c->topk : E * (1 - pow(1 - c->topk / E, B));
}

/* Weight bytes one decode step reads on rank s, routed experts excluded
 * (the head, embeddings and every dense projection, once per step). */
static double dense_bytes(const v4_config *c, const v4_shard *s)
{
    int H = c->hidden_size, hc = c->hc_mult, hd = c->head_dim, qlr = c->q_lora_rank;
    int mix = (2 + hc) * hc, ihd = c->index_head_dim, ih = c->index_heads;
    double b = qbytes(QT_BF16, 1, H) + qbytes(QT_BF16, s->nv, H) + 4.0 * hc * hc * H;
    for (int l = 0; l < c->n_layers; l++) {
        int ratio = v4_layer_ratio(c, l);
        bool csa = c->attn[l] == V4_ATTN_CSA;
        b += 2 * 4.0 * mix * hc * H;
        b += qbytes(QT_FP8, qlr, H) + qbytes(QT_FP8, (double)s->nh * hd, qlr) +
             qbytes(QT_FP8, hd, H) +
             qbytes(QT_BF16, (double)s->ng * c->o_lora_rank, (double)c->n_heads / c->o_groups * hd) +
             qbytes(QT_FP8, H, (double)s->ng * c->o_lora_rank);
        if (ratio) b += 2 * qbytes(QT_BF16, (csa ? 2 : 1) * hd, H);
        if (csa)
            b += 2 * qbytes(QT_BF16, 2 * ihd, H) + qbytes(QT_FP8, (double)ih * ihd, qlr) +
                 qbytes(QT_BF16, ih, H);
        b += qbytes(QT_BF16, c->n_experts, H) + 3 * qbytes(QT_FP8, s->ni, H);
    }
    return b;
}

/* Bytes one decode step of B sequences at position p reads on rank s:
 * the weights once (routed experts: the expected union of the batch's
 * choices) and each sequence's cache. */
static double step_bytes(const v4_config *c, const v4_shard *s, enum kv_dtype t, int B, double p)
{
    return dense_bytes(c, s) + c->n_layers * experts_read(c, B) * expert_bytes(c, s) +
           B * cache_bytes(c, t, p);
}

/* Floating-point operations of the whole model (all ranks) for the
 * token at position p, logits excluded. */
static double token_flops(const v4_config *c, double p)
{
    double H = c->hidden_size, hc = c->hc_mult, hd = c->head_dim, qlr = c->q_lora_rank;
    double nh = c->n_heads, olr = c->o_lora_rank, og = c->o_groups, I = c->moe_inter;
    double ihd = c->index_head_dim, ih = c->index_heads, mix = (2 + hc) * hc;
    double f = 0;
    for (int l = 0; l < c->n_layers; l++) {
        int ratio = v4_layer_ratio(c, l);
        bool csa = c->attn[l] == V4_ATTN_CSA;
        double params = qlr * H + nh * hd * qlr + hd * H + nh * hd * olr + og * olr * H +
                        c->n_experts * H + (c->topk + 1) * 3 * H * I + 2 * mix * hc * H;
        if (ratio) params += 2 * (csa ? 2 : 1) * hd * H;
        if (csa) params += 4 * ihd * H + ih * ihd * qlr + ih * H;
        f += 2 * params;
        f += 4 * nh * hd * (fmin(c->sliding_window, p + 1) + ncomp(c, l, p));
        if (csa && floor((p + 1) / ratio) > c->index_topk)
            f += 2 * ih * ihd * floor((p + 1) / ratio);
    }
    return f;
}

/* Decode steps timed apart: the first runs op by op, the second is
 * captured as a graph (backends with graphs). */
#define WARM_STEPS 2

/* A comma-separated list of 1..2^24 into v; -1 when malformed or longer
 * than max (an error naming the option, not values silently dropped). */
static int parse_list(const char *opt, const char *s, int *v, int max)
{
    int n = 0;
    while (*s) {
        if (n == max) {
            fprintf(stderr, "llm-engine bench: %s takes at most %d values\n", opt, max);
            return -1;
        }
        char *end;
        long x = strtol(s, &end, 10);
        if (end == s || x < 1 || x > 1 << 24 || (*end && *end != ',')) return -1;
        v[n++] = (int)x;
        s = *end ? end + 1 : end;
    }
    return n;
}

#define BENCH_LIST_MAX 16   /* values of --prompts and --batch */

static int usage(void)
{
    fprintf(stderr, "usage: llm-engine bench --model DIR | --synthetic CONFIG.json "
            "[--backend cpu|cuda] [--tp N] [--threads N] [--prompt N | --prompts N,N,...] "
            "[--batch B,B,...] [--chunk N] [--decode N] [--logits argmax|copy] [--peak-gbs X] [--peak-tflops Y] [--gpu-memory-utilization U] "
            "[--kv-cache-dtype auto|bf16|fp8] "
            "[--prefix-repeat NEW [--rounds R] [--kv-offloading-size GIB]]\n");
    return 2;
}

static void load_log(void *user, const char *line)
{
    (void)user;
    fprintf(stderr, "llm-engine bench: %s\n", line);
}

int cmd_bench(int argc, char **argv)
{
    const char *model = NULL;
    int prompts[BENCH_LIST_MAX] = { 128 }, nprompts = 1, decode = 32, chunk = 8192;
    int batches[BENCH_LIST_MAX] = { 1 }, nbatches = 1;
    double peak_gbs = 4300, peak_tflops = 788, host_gib = 4;
    int repeat = 0, rounds = 3;
    bool copy_logits = false;
    v4_options opt = { .tp = 1, .log = load_log };
    if (argc % 2 == 0) return usage();
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--synthetic")) model = v, opt.synthetic = true;
        else if (!strcmp(a, "--tp")) opt.tp = atoi(v);
        else if (!strcmp(a, "--threads")) opt.threads_per_rank = atoi(v);
        else if (!strcmp(a, "--prompt")) prompts[0] = atoi(v), nprompts = prompts[0] > 0;
        else if (!strcmp(a, "--prompts")) nprompts = parse_list(a, v, prompts, BENCH_LIST_MAX);
        else if (!strcmp(a, "--batch")) nbatches = parse_list(a, v, batches, BENCH_LIST_MAX);
        else if (!strcmp(a, "--decode")) decode = atoi(v);
        else if (!strcmp(a, "--chunk")) chunk = atoi(v);
        else if (!strcmp(a, "--logits") && (!strcmp(v, "copy") || !strcmp(v, "argmax")))
            copy_logits = !strcmp(v, "copy");
        else if (!strcmp(a, "--backend")) opt.backend = v;
        else if (!strcmp(a, "--peak-gbs")) peak_gbs = atof(v);
        else if (!strcmp(a, "--peak-tflops")) peak_tflops = atof(v);
        else if (!strcmp(a, "--gpu-memory-utilization")) opt.gpu_memory_utilization = atof(v);
        else if (!strcmp(a, "--prefix-repeat")) repeat = atoi(v);
        else if (!strcmp(a, "--rounds")) rounds = atoi(v);
        else if (!strcmp(a, "--kv-offloading-size")) host_gib = atof(v);
        else if (!strcmp(a, "--kv-cache-dtype") && v4_kv_dtype_parse(v) >= 0)
            opt.kv_dtype = (enum kv_dtype)v4_kv_dtype_parse(v);
        else return usage();
    }
    if (!model || nprompts < 1 || nbatches < 1 || decode < 0 || chunk < 1 || opt.tp < 1 || peak_gbs <= 0 || peak_tflops <= 0 ||
        opt.gpu_memory_utilization < 0 || opt.gpu_memory_utilization > 1 || repeat < 0 ||
        rounds < 1 || !(host_gib >= 0 && host_gib <= 1 << 20) ||
        (repeat && (nprompts != 1 || nbatches != 1 || prompts[0] < 2)))
        return usage();
    if (opt.synthetic && !opt.backend) opt.backend = "cuda";
    int maxp = 0;
    for (int i = 0; i < nprompts; i++) maxp = prompts[i] > maxp ? prompts[i] : maxp;
    int maxb = 0;
    for (int i = 0; i < nbatches; i++) maxb = batches[i] > maxb ? batches[i] : maxb;
    opt.max_seqs = maxb;
    opt.cache_tokens = (int64_t)maxb * (maxp + decode);
    opt.max_step_tokens = maxp < chunk ? maxp : chunk;
    if (opt.max_step_tokens < maxb) opt.max_step_tokens = maxb;
    if (repeat) {
        /* the prompt and two extensions cached, snapshots beside them */
        opt.prefix_cache = true;
        opt.cache_tokens = 3 * ((int64_t)maxp + repeat);
        opt.prefix_host_bytes = (size_t)(host_gib * 1073741824.0);
    }
    strbuf err;
    sb_init(&err);
    v4_model *m = NULL;
    double t0 = now();
    if (v4_model_load(&m, model, &opt, &err)) {
        fprintf(stderr, "llm-engine bench: %s", err.data);
        sb_free(&err);
        return 1;
    }
    double t_load = now() - t0;
    const v4_config *c = v4_model_config(m);
    int V = c->vocab_size, tp = v4_model_tp(m);
    printf("model            %s%s\n", model, opt.synthetic ? " (synthetic weights)" : "");
    printf("backend          %s, tp %d\n", opt.backend ? opt.backend : "cpu", tp);
    printf("load             %.2f s\n", t_load);
    fflush(stdout);
    if (repeat) {
        int prc = bench_prefix(m, prompts[0], repeat, rounds, chunk);
        v4_model_free(m);
        sb_free(&err);
        return prc;
    }

    int32_t *ids = malloc(maxp * sizeof *ids), *dec = malloc(maxb * sizeof *dec);
    int32_t *amax = malloc(maxb * sizeof *amax);
    bool pinned;
    float *logits = v4_logits_alloc(m, (size_t)maxb * V, &pinned);
    v4_seq **seqs = calloc(maxb, sizeof *seqs);
    v4_step_item *items = malloc(maxb * sizeof *items);
    v4_shard sh;
    v4_shard_plan(c, tp, 0, &sh, &err);
    int rc = 1;
    for (int pi = 0; pi < nprompts; pi++)
    for (int bi = 0; bi < nbatches; bi++) {
        int n = prompts[pi], B = batches[bi];
        /* Each sequence its own pseudo-random prompt (the first one's is
         * the same at every B), prefilled one sequence at a time. */
        double tp0 = 0;
        for (int j = 0; j < B; j++) {
            uint64_t x = 88172645463325252ULL + 0x9E3779B97F4A7C15ULL * (uint64_t)j;
            for (int i = 0; i < n; i++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                ids[i] = (int32_t)(x % (uint64_t)V);
            }
            if (!(seqs[j] = v4_seq_new(m, &err))) goto out;
            t0 = now();
            for (int p = 0; p < n; p += chunk) {
                v4_step_item it = { seqs[j], ids + p, n - p < chunk ? n - p : chunk,
                                    logits + (size_t)j * V, false, NULL };
                if (v4_step(m, &it, 1, &err)) goto out;
            }
            tp0 += now() - t0;
        }
        double t = tp0 / B, fl = 0;
        for (int p = 0; p < n; p++) fl += token_flops(c, p);
        double per_gpu = fl / t / tp;
        int nonfinite = 0;
        for (size_t v = 0; v < (size_t)B * V; v++) nonfinite += !isfinite(logits[v]);
        if (B == 1 || bi == 0)
            printf("prefill %-8d %.3f s = %.0f tokens/s, TTFT %.1f ms (%d steps); %.1f TFLOP, "
                   "%.1f TFLOP/s per GPU = %.2f%% of %.0f%s\n", n, t, n / t, t * 1e3,
                   (n + chunk - 1) / chunk, fl / 1e12, per_gpu / 1e12,
                   100 * per_gpu / 1e12 / peak_tflops, peak_tflops,
                   nonfinite ? " (logits NOT finite)" : "");
        else if (nonfinite)
            printf("prefill          %d sequences: logits NOT finite\n", B);
        fflush(stdout);
        if (decode) {
            /* The first WARM steps run op by op and capture a graph (on
             * backends with graphs): timed apart.  Each step feeds every
             * sequence a pseudo-random token (greedy choice would cost a
             * host pass over B x vocabulary logits per step and routes
             * no differently on random weights). */
            double bytes = 0, t_warm = 0;
            int warm = decode > 2 * WARM_STEPS ? WARM_STEPS : 0;
            uint64_t x = 0x2545F4914F6CDD1DULL;
            long long gr0 = 0, gr1;
            double gms0 = 0, gms1;
            v4_host_time h0 = { 0 }, h1;
            t0 = now();
            for (int i = 0; i < decode; i++) {
                if (i == warm) {
                    t_warm = now() - t0, t0 = now();
                    v4_model_graph_time(m, &gr0, &gms0);
                    v4_model_host_time(m, &h0);
                }
                for (int j = 0; j < B; j++) {
                    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                    dec[j] = (int32_t)(x % (uint64_t)V);
                    items[j] = (v4_step_item){ seqs[j], dec + j, 1,
                                               copy_logits ? logits + (size_t)j * V : NULL,
                                               false, copy_logits ? NULL : amax + j };
                }
                if (i >= warm) bytes += step_bytes(c, &sh, opt.kv_dtype, B, n + i);
                if (v4_step(m, items, B, &err)) goto out;
            }
            int nd = decode - warm;
            double td = now() - t0, floor_s = bytes / nd / (peak_gbs * 1e9);
            long long ncap, nrep;
            v4_model_graph_counts(m, &ncap, &nrep);
            printf("decode B=%-3d     %d steps at context %d: %.2f ms/token per sequence = "
                   "%.2f tokens/s aggregate; %.2f GB per step per rank (%.1f of %d experts "
                   "per layer), floor %.3f ms = %.2f%% of %.0f GB/s\n", B, nd, n + warm,
                   td * 1e3 / nd, (double)B * nd / td, bytes / nd / 1e9, experts_read(c, B),
                   c->n_experts, floor_s * 1e3, 100 * floor_s / (td / nd), peak_gbs);
            printf("decode warm-up   first %d steps %.1f ms; graphs: %lld captured, %lld "
                   "replays (over the ranks, so far); logits %s\n", warm, t_warm * 1e3, ncap,
                   nrep, copy_logits ? "copied to the host" : "argmax on the device");
            if (v4_model_graph_time(m, &gr1, &gms1) && gr1 > gr0)
                printf("decode device    %.3f ms a step's graph on rank 0 (%lld of %d steps "
                       "timed): the other %.3f ms of a step are the host's\n",
                       (gms1 - gms0) / (gr1 - gr0), gr1 - gr0, nd,
                       td * 1e3 / nd - (gms1 - gms0) / (gr1 - gr0));
            v4_model_host_time(m, &h1);
            long long hs = h1.steps - h0.steps, ha = h1.ahead_steps - h0.ahead_steps;
            if (hs > 0 && nrep > 0)     /* (without graphs the walk is the compute) */
                printf("decode host      %.3f ms a step on rank 0 walking the ops (they fill "
                       "the replayed graph's inputs), %.3f launching it; %lld of %lld steps "
                       "walked ahead while the step before ran (%.3f ms a walk)\n",
                       (h1.walk_ms - h0.walk_ms) / hs, (h1.launch_ms - h0.launch_ms) / hs, ha,
                       hs, h1.ahead_walks > h0.ahead_walks
                               ? (h1.ahead_ms - h0.ahead_ms) / (h1.ahead_walks - h0.ahead_walks)
                               : 0.0);
            long long nk = v4_model_graph_kernels(m);
            if (nk)
                printf("decode launches  %lld kernels per step on rank 0 = %.1f per layer over "
                       "%d layers (embedding and head included)\n", nk,
                       (double)nk / c->n_layers, c->n_layers);
            fflush(stdout);
        }
        for (int j = 0; j < B; j++) v4_seq_free(m, seqs[j]), seqs[j] = NULL;
    }

    v4_cache_info ci;
    v4_cache_info_get(m, &ci);
    size_t mfree, mtotal;
    v4_model_mem(m, &mfree, &mtotal);
    printf("cache per token  %.0f bytes per rank (+ %zu bytes state per sequence)\n",
           v4_cache_bytes_per_token(m), ci.state_bytes);
    if (mtotal)
        printf("memory per rank  %.1f GiB free of %.1f GiB after the runs\n", mfree / 1073741824.0,
               mtotal / 1073741824.0);
    const int64_t lens[] = { 131072, 393216, 1048576 };
    if (opt.gpu_memory_utilization > 0) {
        double pool = ci.blocks_total * (double)ci.block_bytes + ci.seqs_total * (double)ci.state_bytes;
        printf("cache pool       %lld tokens (%lld blocks) in %.2f GiB per rank, from "
               "gpu_memory_utilization %.3g\n", (long long)ci.blocks_total * ci.block_tokens,
               (long long)ci.blocks_total, pool / 1073741824.0, opt.gpu_memory_utilization);
        for (int i = 0; i < 3; i++)
            printf("capacity %-7lld maximum concurrency %.2fx (pool blocks / blocks per "
                   "sequence)\n", (long long)lens[i],
                   (double)ci.blocks_total / v4_blocks_for_tokens(m, lens[i]));
    } else if (mtotal) {
        for (int i = 0; i < 3; i++) {
            double per = ci.state_bytes + (double)v4_blocks_for_tokens(m, lens[i]) * ci.block_bytes;
            printf("capacity %-7lld %.2f GiB per sequence per rank: %d sequences fit in the free "
                   "memory\n", (long long)lens[i], per / 1073741824.0, (int)(mfree / per));
        }
    }
    rc = 0;
out:
    if (rc) fprintf(stderr, "llm-engine bench: %s", err.data);
    for (int j = 0; j < maxb; j++)
        if (seqs[j]) v4_seq_free(m, seqs[j]);
    v4_logits_free(m, logits, pinned);
    v4_model_free(m);
    free(seqs);
    free(items);
    free(ids);
    free(dec);
    free(amax);
    sb_free(&err);
    return rc;
}
