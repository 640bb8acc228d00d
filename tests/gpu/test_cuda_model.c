/* The model on the CUDA backend, beyond the golden logits (make test-gpu;
 * needs a GPU):
 *   - decode steps replayed as CUDA graphs give bit for bit the logits of
 *     the same steps run op by op (LLM_CUDA_GRAPHS=0): batch 1 and batches
 *     of two, one sequence's graph replayed for another (other state slot,
 *     other positions), the sequences of a batch swapped, a position bound
 *     (graph_pos_cap) crossed; at TP=1 and TP=2, and at TP=1 with an
 *     FP8 cache and the batches' attention on tensor cores, also with the
 *     shared expert on the main stream (LLM_CUDA_MOE_SIDE=0; by default
 *     a batch of 12's runs on a second one); steps launched from a walk
 *     made ahead while the step before ran (graph_prepare) among them,
 *     and none with LLM_CUDA_PREWALK=0;
 *   - gpu_memory_utilization sizes the cache pool from the device's
 *     memory: what is in use after loading is the asked share less the
 *     headroom, the pool computes the same logits as a token-sized one,
 *     and a share too small for the state is refused with a message.
 * Inputs are fixed token ids (never the model's own choices), so a
 * difference shows as a difference in logits, not a different path. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/device_info.h"
#include "model.h"
#include "tap.h"

#define DEMO "tests/fixtures/demo"
#define NIDS 1200
#define NBATCH 12   /* the script's largest decode batch */

static int32_t ids[NIDS];
static int V;       /* the demo's vocabulary */

static v4_model *load(int tp, bool graphs, const v4_options *extra)
{
    if (graphs) unsetenv("LLM_CUDA_GRAPHS");
    else setenv("LLM_CUDA_GRAPHS", "0", 1);
    v4_options o = { .tp = tp, .max_seqs = 16, .cache_tokens = 16 * 1024, .backend = "cuda" };
    if (extra) o = *extra;
    v4_model *m = NULL;
    strbuf err;
    sb_init(&err);
    if (v4_model_load(&m, DEMO, &o, &err)) diag("load: %s", err.data);
    sb_free(&err);
    return m;
}

/* The scripted steps; every step's logits appended to out (rows of V), or
 * with amax each row's greedy choice (v4_step_item.argmax) to amax. */
typedef struct {
    v4_model *m;
    float *out;
    size_t rows;
    int V;
    int rc;
    int32_t *amax;
} script;

static void step(script *S, v4_seq **seqs, const int *start, const int *n, int nitems)
{
    v4_step_item it[NBATCH];
    for (int i = 0; i < nitems; i++) {
        it[i] = (v4_step_item){ seqs[i], ids + start[i], n[i], S->out + S->rows * S->V, false, NULL };
        if (S->amax) it[i].logits = NULL, it[i].argmax = S->amax + S->rows;
        S->rows++;
    }
    strbuf err;
    sb_init(&err);
    if (!S->rc && v4_step(S->m, it, nitems, &err)) {
        diag("step: %s", err.data);
        S->rc = -1;
    }
    sb_free(&err);
}

/* A and B: prefills, 20 steps of [A, B], 6 of [B], 6 of [A], 4 of [B, A];
 * C: a prefill of 1010, then 30 steps crossing position 1024; then
 * NBATCH sequences with prompts of 10, 13, ... tokens decoding together
 * (more than 8 tokens a step: the GEMVs in token chunks, the MoE on
 * tiles by expert, attention of the batch in one launch). */
static int run_script(v4_model *m, float *out, int32_t *amax, size_t *rows)
{
    script S = { m, out, 0, V, 0, amax };
    strbuf err;
    sb_init(&err);
    v4_seq *A = v4_seq_new(m, &err), *B = v4_seq_new(m, &err), *C = v4_seq_new(m, &err);
    if (!A || !B || !C) {
        diag("seq: %s", err.data);
        S.rc = -1;
    }
    int a = 0, b = 500;                  /* next id index of A and B */
    int one = 1, pa = 100, pb = 37;
    step(&S, &A, &a, &pa, 1), a += pa;
    step(&S, &B, &b, &pb, 1), b += pb;
    for (int i = 0; i < 20; i++) {
        v4_seq *q[2] = { A, B };
        int st[2] = { a++, b++ }, n[2] = { 1, 1 };
        step(&S, q, st, n, 2);
    }
    for (int i = 0; i < 6; i++) step(&S, &B, &b, &one, 1), b++;
    for (int i = 0; i < 6; i++) step(&S, &A, &a, &one, 1), a++;
    for (int i = 0; i < 4; i++) {
        v4_seq *q[2] = { B, A };
        int st[2] = { b++, a++ }, n[2] = { 1, 1 };
        step(&S, q, st, n, 2);
    }
    int c = 0, pc = 1010;
    step(&S, &C, &c, &pc, 1), c += pc;
    for (int i = 0; i < 30; i++) step(&S, &C, &c, &one, 1), c++;
    v4_seq_free(m, A);
    v4_seq_free(m, B);
    v4_seq_free(m, C);
    v4_seq *D[NBATCH];
    int d[NBATCH], nd[NBATCH], ones[NBATCH];
    for (int k = 0; k < NBATCH; k++) {
        D[k] = v4_seq_new(m, &err);
        if (!D[k]) {
            diag("seq: %s", err.data);
            S.rc = -1;
            for (int j = 0; j < k; j++) v4_seq_free(m, D[j]);
            sb_free(&err);
            return S.rc;
        }
        d[k] = 100 + 60 * k, nd[k] = 10 + 3 * k, ones[k] = 1;
        step(&S, &D[k], &d[k], &nd[k], 1), d[k] += nd[k];
    }
    for (int i = 0; i < 8; i++) {
        step(&S, D, d, ones, NBATCH);
        for (int k = 0; k < NBATCH; k++) d[k]++;
    }
    for (int k = 0; k < NBATCH; k++) v4_seq_free(m, D[k]);
    sb_free(&err);
    *rows = S.rows;
    return S.rc;
}

/* appended to test_graphs' names: the switches it runs under */
static const char *variant = "";

/* The cache in dtype t (FP8: the batches' decode attention on tensor
 * cores from 2 sequences, LLM_CUDA_ATTN_MMA_MIN_T=2). */
static void test_graphs(int tp, enum kv_dtype t)
{
    size_t cap = 250 * (size_t)V;
    float *eager = malloc(cap * sizeof(float)), *graph = malloc(cap * sizeof(float));
    size_t re = 0, rg = 0;
    long long cap_e = -1, rep_e = -1, cap_g = 0, rep_g = 0;
    v4_options o = { .tp = tp, .max_seqs = 16, .cache_tokens = 16 * 1024, .backend = "cuda",
                     .kv_dtype = t };
    if (t == KV_FP8) setenv("LLM_CUDA_ATTN_MMA_MIN_T", "2", 1);
    v4_model *m = load(tp, false, &o);
    int rc = m ? run_script(m, eager, NULL, &re) : -1;
    if (m) v4_model_graph_counts(m, &cap_e, &rep_e);
    v4_model_free(m);
    m = load(tp, true, &o);
    rc |= m ? run_script(m, graph, NULL, &rg) : -1;
    v4_host_time h1 = { 0 }, h2 = { 0 };
    if (m) v4_model_graph_counts(m, &cap_g, &rep_g), v4_model_host_time(m, &h1);
    /* the same steps again taking only the greedy choices (graphs warm) */
    int32_t *amax = malloc(250 * sizeof *amax);
    size_t ra = 0;
    rc |= m ? run_script(m, NULL, amax, &ra) : -1;
    if (m) v4_model_host_time(m, &h2);
    v4_model_free(m);
    unsetenv("LLM_CUDA_ATTN_MMA_MIN_T");
    const char *cache = v4_kv_dtype_name(t);
    if (!ok(rc == 0 && re == rg, "tp=%d, cache %s%s: the script runs with and without graphs", tp,
            cache, variant)) {
        free(eager);
        free(graph);
        free(amax);
        return;
    }
    size_t differ = 0, first = 0;
    for (size_t r = 0; r < re; r++)
        if (memcmp(eager + r * V, graph + r * V, V * sizeof(float)) && !differ++) first = r;
    ok(cap_e == 0 && rep_e == 0, "tp=%d, cache %s%s, LLM_CUDA_GRAPHS=0: no graphs (%lld captures, "
       "%lld replays)", tp, cache, variant, cap_e, rep_e);
    /* Keys: batch 1 and 2 at bound 1024, batch 1 at 2048; per rank. */
    ok(cap_g >= 3 * tp && rep_g >= 50 * tp, "tp=%d, cache %s%s: decode steps replayed (%lld "
       "captures, %lld replays over the ranks)", tp, cache, variant, cap_g, rep_g);
    ok(differ == 0, "tp=%d, cache %s%s: graph replay equals op by op, bit for bit, over %zu logits "
       "rows (%zu differ, first %zu)", tp, cache, variant, re, differ, first);
    /* the replays above include steps walked ahead (the script's repeated
     * batches), except where LLM_CUDA_PREWALK=0 turns that off */
    bool ahead_off = getenv("LLM_CUDA_PREWALK") && !strcmp(getenv("LLM_CUDA_PREWALK"), "0");
    long long a1 = h1.ahead_steps, a2 = h2.ahead_steps - h1.ahead_steps;
    ok(ahead_off ? a1 == 0 && a2 == 0 : a1 > 0 && a2 > 0, "tp=%d, cache %s%s: decode steps "
       "launched from a walk ahead: %lld of %lld (logits), %lld of %lld (greedy choices)", tp,
       cache, variant, a1, h1.steps, a2, h2.steps - h1.steps);
    size_t wrong = 0;
    for (size_t r = 0; r < re && ra == re; r++) {
        const float *x = graph + r * V;
        float best = -INFINITY;
        int32_t at = 0;
        for (int j = 0; j < V; j++)
            if (x[j] > best) best = x[j], at = j;
        wrong += amax[r] != at;
    }
    ok(ra == re && wrong == 0, "tp=%d, cache %s%s: steps taking only the greedy choice get the "
       "greedy rule on the logits, %zu rows (%zu differ)", tp, cache, variant, ra, wrong);
    free(amax);
    free(eager);
    free(graph);
}

static void test_memory(void)
{
    v4_options o = { .tp = 2, .max_seqs = 4, .backend = "cuda", .gpu_memory_utilization = 0.5,
                     .max_step_tokens = 512 };
    v4_model *m = load(2, true, &o);
    if (!ok(m != NULL, "gpu_memory_utilization 0.5 at tp=2 loads")) return;
    size_t f, t;
    v4_model_mem(m, &f, &t);
    v4_cache_info ci;
    v4_cache_info_get(m, &ci);
    double gib = 1073741824.0, used = (double)(t - f), want = 0.5 * t - 0.5 * gib;
    double pool = ci.blocks_total * (double)ci.block_bytes + ci.seqs_total * (double)ci.state_bytes;
    ok(fabs(used - want) < 0.0625 * gib, "in use after loading %.3f GiB = 0.5 x %.2f GiB less "
       "0.5 GiB headroom (%.3f) within 64 MiB; pool %.2f GiB = %lld blocks of %zu bytes + 4 "
       "slots", used / gib, t / gib, want / gib, pool / gib, (long long)ci.blocks_total,
       ci.block_bytes);
    is_int(ci.seqs_total, 4, "the pool has max_seqs state slots");

    /* The same steps on this pool and on a token-sized one. */
    float *x = malloc(7 * (size_t)V * sizeof(float)), *y = malloc(7 * (size_t)V * sizeof(float));
    v4_model *ms[2] = { m, load(2, true, NULL) };
    int rc = ms[1] ? 0 : -1;
    for (int k = 0; k < 2 && !rc; k++) {
        float *out = k ? y : x;
        strbuf err;
        sb_init(&err);
        v4_seq *s = v4_seq_new(ms[k], &err);
        v4_step_item it = { s, ids, 300, out, false, NULL };
        rc = !s || v4_step(ms[k], &it, 1, &err);
        for (int i = 0; i < 6 && !rc; i++) {
            it = (v4_step_item){ s, ids + 300 + i, 1, out + (size_t)(i + 1) * V, false, NULL };
            rc = v4_step(ms[k], &it, 1, &err);
        }
        if (rc) diag("%s", err.data);
        v4_seq_free(ms[k], s);
        sb_free(&err);
    }
    ok(!rc && !memcmp(x, y, 7 * (size_t)V * sizeof(float)),
       "a memory-sized pool computes the same logits as a token-sized one");
    v4_model_free(ms[0]);
    v4_model_free(ms[1]);
    free(x);
    free(y);

    o.gpu_memory_utilization = 0.001;
    strbuf err;
    sb_init(&err);
    m = NULL;
    int lrc = v4_model_load(&m, DEMO, &o, &err);
    ok(lrc && !m && strstr(err.data, "gpu_memory_utilization 0.001 leaves"),
       "too small a share is refused: %s", err.data);
    v4_model_free(m);
    sb_free(&err);
}

int main(void)
{
    if (llm_cuda_device_count() < 1) {
        skip(1, "no CUDA device");
        return exit_status();
    }
    v4_config cfg;
    strbuf err;
    sb_init(&err);
    if (v4_config_load(&cfg, DEMO "/config.json", &err)) {
        ok(0, "demo config: %s", err.data);
        return exit_status();
    }
    V = cfg.vocab_size;
    v4_config_free(&cfg);
    sb_free(&err);
    uint64_t x = 88172645463325252ULL;
    for (int i = 0; i < NIDS; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ids[i] = (int32_t)(x % (uint64_t)V);
    }
    test_graphs(1, KV_F32);
    test_graphs(1, KV_FP8);
    /* the batch of 12's shared expert on the main stream, not on a
     * second one forked and joined inside the captured step (the default) */
    setenv("LLM_CUDA_MOE_SIDE", "0", 1);
    variant = ", LLM_CUDA_MOE_SIDE=0";
    test_graphs(1, KV_FP8);
    unsetenv("LLM_CUDA_MOE_SIDE");
    /* decode attention as before the defaults: splits merged by the last
     * block, the ring store and the inverse RoPE as ops of their own */
    setenv("LLM_CUDA_ATTN_FUSE", "0", 1);
    setenv("LLM_CUDA_ATTN_CLUSTER", "1", 1);
    variant = ", LLM_CUDA_ATTN_FUSE=0, LLM_CUDA_ATTN_CLUSTER=1";
    test_graphs(1, KV_FP8);
    unsetenv("LLM_CUDA_ATTN_FUSE");
    unsetenv("LLM_CUDA_ATTN_CLUSTER");
    /* every decode attention op on the tensor-core kernel from one token
     * (by default only those of 1,000+ keys: none at these contexts) */
    setenv("LLM_CUDA_ATTN_MMA_MIN_KEYS", "1", 1);
    variant = ", LLM_CUDA_ATTN_MMA_MIN_KEYS=1";
    test_graphs(1, KV_FP8);
    unsetenv("LLM_CUDA_ATTN_MMA_MIN_KEYS");
    /* every decode step walked as it comes, none ahead */
    setenv("LLM_CUDA_PREWALK", "0", 1);
    variant = ", LLM_CUDA_PREWALK=0";
    test_graphs(1, KV_FP8);
    unsetenv("LLM_CUDA_PREWALK");
    variant = "";
    if (llm_cuda_device_count() >= 2) {
        test_graphs(2, KV_F32);
        test_memory();
    } else {
        skip(8, "TP=2 graphs and the memory check need 2 CUDA devices");
    }
    return exit_status();
}
