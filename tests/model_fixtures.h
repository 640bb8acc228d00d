/* The committed model fixtures (tests/fixtures/NAME: config, weights,
 * ids.txt, logits.f32 from transformers) and a model run over them, for
 * the tests that compare logits (test_model_golden, test_model_kv_dtype). */
#ifndef LLM_TESTS_MODEL_FIXTURES_H
#define LLM_TESTS_MODEL_FIXTURES_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_env.h"
#include "model.h"
#include "tap.h"

static inline int read_ids(const char *path, int32_t **ids)
{
    strbuf sb;
    sb_init(&sb);
    if (sb_read_file(&sb, path) < 0) { sb_free(&sb); return -1; }
    int n = 0, cap = 64;
    *ids = malloc(cap * sizeof **ids);
    for (char *p = sb.data; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) { p++; continue; }
        if (n == cap) *ids = realloc(*ids, (cap *= 2) * sizeof **ids);
        (*ids)[n++] = (int32_t)v;
        p = end;
    }
    sb_free(&sb);
    return n;
}

static inline float *read_f32(const char *path, size_t *n)
{
    strbuf sb;
    sb_init(&sb);
    if (sb_read_file(&sb, path) < 0) { sb_free(&sb); return NULL; }
    *n = sb.len / 4;
    float *v = malloc(sb.len + 4);
    memcpy(v, sb.data, sb.len);
    sb_free(&sb);
    return v;
}

static inline int argmax(const float *v, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++) b = v[i] > v[b] ? i : b;
    return b;
}

/* tests/fixtures/NAME's ids and golden logits [n][vocab]: dir gets the
 * directory, *ids and *gold the arrays (the caller frees them), *ng the
 * logits' count.  The id count, or -1 after a failed check naming the
 * fixture. */
static inline int load_fixture(const char *name, char *dir, size_t dirlen, int32_t **ids,
                               float **gold, size_t *ng)
{
    char p[512];
    snprintf(dir, dirlen, "tests/fixtures/%s", name);
    snprintf(p, sizeof p, "%s/ids.txt", dir);
    *ids = NULL;
    int n = read_ids(p, ids);
    snprintf(p, sizeof p, "%s/logits.f32", dir);
    *gold = read_f32(p, ng);
    if (n <= 0 || !*gold || *ng % n) {
        ok(0, "%s: readable ids.txt and logits.f32 [n_ids, vocab]", name);
        free(*gold), free(*ids);
        return -1;
    }
    return n;
}

/* $LLM_TEST_MAX_TP: the largest TP to run (1 on a machine with one GPU;
 * tools/test_gpu.sh sets it from the device count), else 2. */
static inline int test_max_tp(void)
{
    const char *e = getenv("LLM_TEST_MAX_TP");
    return e ? atoi(e) : 2;
}

/* Positions (of n rows of V logits) whose greedy next token is the same in
 * got and want. */
static inline int greedy_agree(const float *got, const float *want, int n, int V)
{
    int same = 0;
    for (int i = 0; i < n; i++)
        same += argmax(got + (size_t)i * V, V) == argmax(want + (size_t)i * V, V);
    return same;
}

/* Relative L2 distance of got from want. */
static inline double rel_l2(const float *got, const float *want, size_t n)
{
    double d = 0, z = 0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)got[i] - want[i];
        d += e * e;
        z += (double)want[i] * want[i];
    }
    return sqrt(d / z);
}

/* Logits of every position of ids under options o: full = one step;
 * incremental = the first half as one step, then one token at a time.
 * *vocab gets the vocabulary size, *bytes_per_token (if not NULL) the
 * cache layout's.  0, or -1 with a diagnostic. */
static inline int fixture_logits(const char *dir, const v4_options *o, bool incremental,
                                 const int32_t *ids, int n, float *out, int *vocab,
                                 double *bytes_per_token)
{
    v4_model *m;
    strbuf err;
    sb_init(&err);
    int rc = v4_model_load(&m, dir, o, &err);
    v4_seq *s = rc ? NULL : v4_seq_new(m, &err);
    if (s) {
        int V = *vocab = v4_model_config(m)->vocab_size;
        if (bytes_per_token) *bytes_per_token = v4_cache_bytes_per_token(m);
        int first = incremental ? n / 2 : n;
        v4_step_item it = { s, ids, first, out, true, NULL };
        rc = first ? v4_step(m, &it, 1, &err) : 0;
        for (int t = first; t < n && !rc; t++) {
            it = (v4_step_item){ s, ids + t, 1, out + (size_t)t * V, false, NULL };
            rc = v4_step(m, &it, 1, &err);
        }
        v4_seq_free(m, s);
    }
    if (rc || !s) diag("%s: %s", dir, err.data);
    if (!rc) v4_model_free(m);
    sb_free(&err);
    return rc || !s ? -1 : 0;
}

#endif
