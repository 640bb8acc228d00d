/* llm-engine bench ... --prefix-repeat NEW: prefix caching's time to first
 * token (issue 17's done-when).  Each round takes a fresh pseudo-random
 * prompt P of --prompt N tokens and:
 *   cold       P prefilled from nothing (the prefix cache is empty);
 *   GPU tier   P + NEW new tokens, starting from P's cached blocks and
 *              its last-boundary snapshot in the pool;
 *   host tier  P + another NEW tokens after every cached entry moved to
 *              the host tier (v4_prefix_offload): the prefix is copied
 *              back from host memory first (pinned, asynchronous on CUDA).
 * TTFT: from the lookup to the logits of the prompt's last token, in steps
 * of at most --chunk tokens that end where the cache snapshots (as the
 * server feeds them).  The cache is cleared between rounds; a short
 * prompt first warms the backend (one-time costs) and is forgotten. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cli.h"
#include "model.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void random_ids(int32_t *ids, int n, int V, uint64_t seed)
{
    uint64_t x = 88172645463325252ULL ^ (0x9E3779B97F4A7C15ULL * seed);
    for (int i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ids[i] = (int32_t)(x % (uint64_t)V);
    }
}

/* One prompt as the server runs it: look up the cache, reserve, prefill
 * the rest.  Seconds to the last token's logits (-1 on failure, err says
 * why); *cached: the positions reused. */
static double ttft(v4_model *m, const int32_t *ids, int n, int chunk, float *logits,
                   int64_t *cached, strbuf *err)
{
    double t0 = now();
    v4_seq *s = v4_seq_new(m, err);
    if (!s) return -1;
    int64_t got = v4_seq_prefix_attach(m, s, ids, n);
    int rc = v4_seq_reserve(m, s, n, err);
    for (int64_t at = got; !rc && at < n;) {
        int k = v4_seq_prefix_chunk(m, s, n - at < chunk ? (int)(n - at) : chunk);
        v4_step_item it = { s, ids + at, k, logits, false, NULL };
        rc = v4_step(m, &it, 1, err);
        at += k;
    }
    double t = now() - t0;
    v4_seq_free(m, s);
    *cached = got;
    return rc ? -1 : t;
}

int bench_prefix(v4_model *m, int n, int fresh, int rounds, int chunk)
{
    const v4_config *c = v4_model_config(m);
    int V = c->vocab_size, total = n + fresh;
    int32_t *ids = malloc((size_t)total * sizeof *ids);
    float *logits = malloc((size_t)V * sizeof *logits);
    strbuf err;
    sb_init(&err);
    int rc = 1;
    int64_t got;
    v4_prefix_stats st;
    v4_prefix_stats_get(m, &st);
    if (!st.on) {
        sb_puts(&err, "the prefix cache is off (no pool blocks or snapshot room)\n");
        goto out;
    }
    /* warm-up: one step of another prompt, then forgotten */
    random_ids(ids, chunk < n ? chunk : n, V, 999);
    if (ttft(m, ids, chunk < n ? chunk : n, chunk, logits, &got, &err) < 0) goto out;
    v4_prefix_clear(m, NULL);
    printf("prefix-repeat    prompt %d tokens + %d new, %d rounds, steps of <= %d tokens; "
           "host tier %.2f GiB; blocks of %d positions, a snapshot every %d blocks\n", n, fresh,
           rounds, chunk, st.host_budget / 1073741824.0, st.block_tokens, st.snapshot_every);
    printf("| round | cold TTFT ms | GPU tier TTFT ms | cached | %% of cold | host tier TTFT ms "
           "| cached | %% of cold | host copies in, MB |\n"
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    double best[3] = { 1e30, 1e30, 1e30 };
    for (int r = 0; r < rounds; r++) {
        double t[3];
        int64_t cached[3];
        random_ids(ids, n, V, 2 * (uint64_t)r + 1);
        random_ids(ids + n, fresh, V, 1000 + 2 * (uint64_t)r);
        if ((t[0] = ttft(m, ids, n, chunk, logits, &cached[0], &err)) < 0) goto out;
        if ((t[1] = ttft(m, ids, total, chunk, logits, &cached[1], &err)) < 0) goto out;
        int64_t moved = v4_prefix_offload(m);
        v4_prefix_stats a, b;
        v4_prefix_stats_get(m, &a);
        if (a.blocks_held)
            fprintf(stderr, "llm-engine bench: %lld cached blocks stayed in the pool after "
                    "moving %lld entries to the host tier\n", (long long)a.blocks_held,
                    (long long)moved);
        random_ids(ids + n, fresh, V, 1001 + 2 * (uint64_t)r);
        if ((t[2] = ttft(m, ids, total, chunk, logits, &cached[2], &err)) < 0) goto out;
        v4_prefix_stats_get(m, &b);
        double in_mb = (double)(a.host_bytes - b.host_bytes) / 1e6;
        printf("| %d | %.1f | %.1f | %lld | %.1f%% | %.1f | %lld | %.1f%% | %llu, %.1f |\n", r + 1,
               t[0] * 1e3, t[1] * 1e3, (long long)cached[1], 100 * t[1] / t[0], t[2] * 1e3,
               (long long)cached[2], 100 * t[2] / t[0], (unsigned long long)(b.fills - a.fills),
               in_mb);
        fflush(stdout);
        for (int k = 0; k < 3; k++) best[k] = t[k] < best[k] ? t[k] : best[k];
        v4_prefix_clear(m, NULL);
    }
    printf("prefix-repeat    best of %d: cold %.1f ms, GPU tier %.1f ms = %.2f%% of cold, host "
           "tier %.1f ms = %.2f%% of cold\n", rounds, best[0] * 1e3, best[1] * 1e3,
           100 * best[1] / best[0], best[2] * 1e3, 100 * best[2] / best[0]);
    rc = 0;
out:
    if (rc) fprintf(stderr, "llm-engine bench: %s", err.data ? err.data : "failed\n");
    sb_free(&err);
    free(ids);
    free(logits);
    return rc;
}
