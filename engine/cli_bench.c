/* llm-engine bench --model DIR [--tp N] [--threads N] [--prompt N] [--decode N]
 *                  [--backend cpu|cuda]
 * One sequence: a prompt of N pseudo-random tokens as one prefill (time to
 * first token), then greedy decoding token by token.  Prints a table. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "model.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int cmd_bench(int argc, char **argv)
{
    const char *model = NULL;
    int prompt = 128, decode = 32;
    v4_options opt = { .tp = 1 };
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model")) model = argv[i + 1];
        else if (!strcmp(argv[i], "--tp")) opt.tp = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) opt.threads_per_rank = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--prompt")) prompt = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--decode")) decode = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--backend")) opt.backend = argv[i + 1];
        else model = NULL, i = argc;
    }
    if (!model || argc % 2 == 0 || prompt < 1 || decode < 0 || opt.tp < 1) {
        fprintf(stderr, "usage: llm-engine bench --model DIR [--tp N] [--threads N] "
                "[--prompt N] [--decode N] [--backend cpu|cuda]\n");
        return 2;
    }
    opt.cache_tokens = prompt + decode;
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
    int V = v4_model_config(m)->vocab_size;
    int32_t *ids = malloc((prompt + decode) * sizeof *ids);
    uint64_t x = 88172645463325252ULL;
    for (int i = 0; i < prompt; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ids[i] = (int32_t)(x % (uint64_t)V);
    }
    float *logits = malloc((size_t)V * sizeof *logits);
    v4_seq *seq = v4_seq_new(m, &err);
    int rc = 1;
    t0 = now();
    v4_step_item it = { seq, ids, prompt, logits, false };
    if (!seq || v4_step(m, &it, 1, &err)) goto out;
    double t_prefill = now() - t0;
    t0 = now();
    for (int i = 0; i < decode; i++) {
        int best = 0;
        for (int v = 1; v < V; v++) best = logits[v] > logits[best] ? v : best;
        ids[prompt + i] = best;
        it = (v4_step_item){ seq, ids + prompt + i, 1, logits, false };
        if (v4_step(m, &it, 1, &err)) goto out;
    }
    double t_decode = now() - t0;
    v4_cache_info ci;
    v4_cache_info_get(m, &ci);
    printf("model            %s\n", model);
    printf("backend          %s\n", opt.backend ? opt.backend : "cpu");
    printf("tp x threads     %d x %d\n", v4_model_tp(m),
           opt.threads_per_rank ? opt.threads_per_rank : -1);
    printf("load             %.2f s\n", t_load);
    printf("prefill          %d tokens in %.3f s = %.1f tokens/s (TTFT %.1f ms)\n", prompt,
           t_prefill, prompt / t_prefill, t_prefill * 1e3);
    if (decode)
        printf("decode           %d tokens in %.3f s = %.2f tokens/s (%.1f ms/token)\n", decode,
               t_decode, decode / t_decode, t_decode * 1e3 / decode);
    printf("cache per token  %.0f bytes per rank (+ %zu bytes fixed per sequence)\n",
           v4_cache_bytes_per_token(m), ci.state_bytes);
    rc = 0;
out:
    if (rc) fprintf(stderr, "llm-engine bench: %s", err.data);
    v4_seq_free(m, seq);
    v4_model_free(m);
    free(ids);
    free(logits);
    sb_free(&err);
    return rc;
}
