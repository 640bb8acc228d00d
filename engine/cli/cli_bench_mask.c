/* llm-engine bench-mask: the cost of constrained decoding per token.
 *
 *   llm-engine bench-mask --tokenizer FILE --request FILE [--walks N]
 *                         [--max-tokens N] [--seed S]
 *
 * The request (JSON: tools + tool_choice, or response_format, as a chat
 * request carries them) is compiled and its cache prewarmed once, as the
 * engine's prep thread does for a new grammar; each walk is then a request
 * (a matcher over the shared cache) that samples uniformly among the
 * allowed tokens until EOS.  Timed per step on one core: the mask
 * (token_matcher_mask), split by whether the step had to sort a chain the
 * prewarm missed, and the advance (token_matcher_accept).  Times are the
 * thread's CPU time, so a shared machine's preemptions do not count. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "constraint.h"
#include "json.h"
#include "token_mask.h"
#include "tokenizer.h"

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int by_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void row(const char *what, double *v, size_t n)
{
    if (!n) { printf("| %s | 0 | | | | |\n", what); return; }
    qsort(v, n, sizeof *v, by_double);
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += v[i];
    printf("| %s | %zu | %.1f | %.1f | %.1f | %.1f |\n", what, n, sum / (double)n, v[n / 2],
           v[(size_t)((double)n * 0.99)], v[n - 1]);
}

int cmd_bench_mask(int argc, char **argv)
{
    const char *usage = "llm-engine bench-mask --tokenizer FILE --request FILE [--walks N] "
                        "[--max-tokens N] [--seed S]";
    const char *tok_path = NULL, *req_path = NULL;
    int walks = 20, max_tokens = 256;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) { fprintf(stderr, "bench-mask: %s needs a value\nusage: %s\n", argv[i], usage); return 2; }
        if (!strcmp(argv[i], "--tokenizer")) tok_path = v;
        else if (!strcmp(argv[i], "--request")) req_path = v;
        else if (!strcmp(argv[i], "--walks")) walks = atoi(v);
        else if (!strcmp(argv[i], "--max-tokens")) max_tokens = atoi(v);
        else if (!strcmp(argv[i], "--seed")) seed = strtoull(v, NULL, 10);
        else { fprintf(stderr, "bench-mask: unknown option %s\nusage: %s\n", argv[i], usage); return 2; }
        i++;
    }
    if (!tok_path || !req_path || walks < 1 || max_tokens < 1) {
        fprintf(stderr, "usage: %s\n", usage);
        return 2;
    }
    char err[512];
    tokenizer *tok = tok_load(tok_path, err, sizeof err);
    if (!tok) { fprintf(stderr, "bench-mask: %s\n", err); return 1; }
    strbuf text;
    sb_init(&text);
    if (sb_read_file(&text, req_path)) {
        fprintf(stderr, "bench-mask: cannot read %s\n", req_path);
        tok_free(tok);
        return 1;
    }
    yajl_val req = json_parse(text.data, text.len, err, sizeof err);
    if (!req) { fprintf(stderr, "bench-mask: %s: %s\n", req_path, err); tok_free(tok); return 1; }
    double t0 = now_us();
    token_trie *trie = token_trie_new(tok, tok_vocab_size(tok), err, sizeof err);
    double t_trie = now_us() - t0;
    if (!trie) { fprintf(stderr, "bench-mask: %s\n", err); return 1; }
    int32_t eos = tok_eos_id(tok), V = token_trie_vocab(trie);
    uint64_t *mask = malloc(token_mask_words(trie) * sizeof *mask);
    int32_t *ids = malloc((size_t)V * sizeof *ids);
    size_t cap = (size_t)walks * (size_t)(max_tokens + 1);
    double *warm = malloc(cap * sizeof *warm), *cold = malloc(cap * sizeof *cold),
           *adv = malloc(cap * sizeof *adv), *compile = malloc((size_t)walks * sizeof *compile);
    size_t n_warm = 0, n_cold = 0, n_adv = 0, tokens = 0, bytes = 0;
    uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
    schema_error serr;
    grammar *g;
    t0 = now_us();
    if (constraint_from_request(req, trie, &g, &serr) || !g) {
        fprintf(stderr, "bench-mask: %s\n", g ? serr.message : "the request constrains nothing");
        return 1;
    }
    mask_cache *mc = mask_cache_new(trie, g);
    compile[0] = now_us() - t0;
    t0 = now_us();
    mask_cache_prewarm(mc, 4096);
    double t_warm = now_us() - t0;
    size_t chains = mask_cache_size(mc);
    for (int w = 0; w < walks; w++) {
        token_matcher *m = token_matcher_shared(mc, eos);
        if (token_matcher_min(m) + 1 > max_tokens) {
            fprintf(stderr, "bench-mask: --max-tokens %d is below the shortest reply (%d)\n",
                    max_tokens, token_matcher_min(m) + 1);
            return 1;
        }
        for (int used = 0; used < max_tokens; used++) {
            size_t caches = token_matcher_n_caches(m);
            double a = now_us();
            token_matcher_mask(m, max_tokens - used, mask);
            double b = now_us();
            int n = 0;
            for (int32_t t = 0; t < V; t++)
                if (token_mask_has(mask, t)) ids[n++] = t;
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            int32_t t = ids[x % (uint64_t)n];
            double c = now_us();
            token_matcher_accept(m, t);
            adv[n_adv++] = now_us() - c;
            if (token_matcher_n_caches(m) != caches) cold[n_cold++] = b - a;
            else warm[n_warm++] = b - a;
            tokens++;
            if (t == eos) break;
            size_t l;
            tok_id_bytes(tok, t, &l);
            bytes += l;
        }
        token_matcher_free(m);
    }
    printf("vocab %d: trie %.1f ms; grammar %.2f ms; prewarm %.1f ms (%zu chains sorted, %zu "
           "after the walks, %.1f MiB)\n%d walks, %zu tokens (%.1f bytes/token)\n\n", V,
           t_trie / 1e3, compile[0] / 1e3, t_warm / 1e3, chains, mask_cache_size(mc),
           (double)mask_cache_bytes(mc) / (1 << 20), walks, tokens,
           tokens ? (double)bytes / (double)tokens : 0.0);
    printf("| µs per step | steps | mean | p50 | p99 | max |\n| --- | --- | --- | --- | --- | --- |\n");
    row("mask, step that sorted a new stack top", cold, n_cold);
    row("mask, other steps", warm, n_warm);
    row("advance by the token", adv, n_adv);
    free(mask); free(ids); free(warm); free(cold); free(adv); free(compile);
    mask_cache_unref(mc);
    token_trie_free(trie);
    yajl_tree_free(req);
    sb_free(&text);
    tok_free(tok);
    return 0;
}
