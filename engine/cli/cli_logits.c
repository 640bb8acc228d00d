/* llm-engine logits --model DIR --ids 1,2,3 [--tp N] [--mode full|incremental]
 *                   [--backend cpu|cuda] [--threads N] [--kv-cache-dtype auto|bf16|fp8]
 *                   --out FILE
 * Writes float32 little-endian logits [n_ids][vocab], one row per position.
 * full: one forward pass over all ids.  incremental: the first half as one
 * prefill, then one token at a time through the cache. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "model.h"

static int parse_ids(const char *s, int32_t **out, int *n)
{
    int cap = 16;
    *out = malloc(cap * sizeof **out);
    *n = 0;
    while (*s) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < 0 || v > 0x7fffffff || (*end && *end != ',')) return -1;
        if (*n == cap) *out = realloc(*out, (cap *= 2) * sizeof **out);
        (*out)[(*n)++] = (int32_t)v;
        s = *end ? end + 1 : end;
        if (*end == ',' && !*s) return -1;
    }
    return *n ? 0 : -1;
}

static int usage(void)
{
    fprintf(stderr, "usage: llm-engine logits --model DIR --ids 1,2,3 [--tp N] "
            "[--mode full|incremental] [--backend cpu|cuda] [--threads N] "
            "[--kv-cache-dtype auto|bf16|fp8] [--gemm-mode bf16x2|bf16|f32|fp8] --out FILE\n");
    return 2;
}

int cmd_logits(int argc, char **argv)
{
    const char *model = NULL, *ids_s = NULL, *mode = "full", *out = NULL;
    v4_options opt = { .tp = 1, .backend = "cpu" };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return usage();
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--ids")) ids_s = v;
        else if (!strcmp(a, "--mode")) mode = v;
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--backend")) opt.backend = v;
        else if (!strcmp(a, "--tp")) opt.tp = atoi(v);
        else if (!strcmp(a, "--threads")) opt.threads_per_rank = atoi(v);
        else if (!strcmp(a, "--gemm-mode")) {
            /* the recipe's gemm_mode: on the CPU only fp8 changes the
             * numerics (DeepSeek's act_quant), on CUDA each mode */
            int g = 0;
            while (backend_gemm_names[g] && strcmp(backend_gemm_names[g], v)) g++;
            if (!backend_gemm_names[g]) {
                fprintf(stderr, "llm-engine logits: --gemm-mode must be bf16x2, bf16, f32 or "
                        "fp8\n");
                return 2;
            }
            opt.modes.gemm = g;
        }
        else if (!strcmp(a, "--kv-cache-dtype")) {
            int t = v4_kv_dtype_parse(v);
            if (t < 0) {
                fprintf(stderr, "llm-engine logits: --kv-cache-dtype must be auto, bf16 or fp8\n");
                return 2;
            }
            opt.kv_dtype = (enum kv_dtype)t;
        }
        else return usage();
        i++;
    }
    if (!model || !ids_s || !out) return usage();
    if (strcmp(mode, "full") && strcmp(mode, "incremental")) {
        fprintf(stderr, "llm-engine logits: --mode must be full or incremental\n");
        return 2;
    }
    if (opt.tp < 1) {
        fprintf(stderr, "llm-engine logits: --tp must be a positive integer\n");
        return 2;
    }
    int32_t *ids;
    int n;
    if (parse_ids(ids_s, &ids, &n)) {
        fprintf(stderr, "llm-engine logits: --ids must be comma-separated token ids\n");
        free(ids);
        return 2;
    }
    opt.cache_tokens = n;
    strbuf err;
    sb_init(&err);
    v4_model *m = NULL;
    int rc = 1;
    float *logits = NULL;
    v4_seq *seq = NULL;
    if (v4_model_load(&m, model, &opt, &err)) goto fail;
    size_t V = v4_model_config(m)->vocab_size;
    logits = malloc((size_t)n * V * sizeof *logits);
    if (!(seq = v4_seq_new(m, &err))) goto fail;
    int first = !strcmp(mode, "full") ? n : n / 2;
    if (first > 0) {
        v4_step_item it = { seq, ids, first, logits, true, NULL };
        if (v4_step(m, &it, 1, &err)) goto fail;
    }
    for (int t = first; t < n; t++) {
        v4_step_item it = { seq, ids + t, 1, logits + (size_t)t * V, false, NULL };
        if (v4_step(m, &it, 1, &err)) goto fail;
    }
    FILE *f = fopen(out, "wb");
    if (!f) {
        sb_printf(&err, "%s: cannot create: %s\n", out, strerror(errno));
        goto fail;
    }
    size_t wrote = fwrite(logits, sizeof *logits, (size_t)n * V, f);
    if (fclose(f) || wrote != (size_t)n * V) {
        sb_printf(&err, "%s: write failed\n", out);
        goto fail;
    }
    rc = 0;
fail:
    if (rc) fprintf(stderr, "llm-engine logits: %s", err.data);
    if (m) {
        v4_seq_free(m, seq);
        v4_model_free(m);
    }
    free(logits);
    free(ids);
    sb_free(&err);
    return rc;
}
