/* v4_seq_fork: a sequence that copies another's cache after its prefill
 * continues exactly as one that prefilled the prompt itself.  The demo
 * model (tests/fixtures/demo: sliding window 128, CSA ratio 4 and HCA
 * ratio 128 layers) at TP 2, so the copy runs on every rank; a 300-token
 * prompt wraps the window ring and fills compressed entries in several
 * blocks.  Also the refusals (a target that holds positions, or lacks
 * blocks).  The backend is $LLM_TEST_BACKEND (default cpu; make test-gpu
 * runs it with cuda), at most $LLM_TEST_MAX_TP ranks. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "model.h"
#include "strbuf.h"

#define DEMO "tests/fixtures/demo"
#define PROMPT 300
#define CHUNK 100
#define DECODE 6

static int prefill(v4_model *m, v4_seq *s, const int32_t *ids, float *logits, strbuf *err)
{
    for (int at = 0; at < PROMPT; at += CHUNK) {
        v4_step_item it = { s, ids + at, CHUNK, logits, false, NULL };
        if (v4_step(m, &it, 1, err)) return -1;
    }
    return 0;
}

static void run(const char *dtype)
{
    v4_model *m = NULL;
    strbuf err;
    sb_init(&err);
    const char *max_tp = getenv("LLM_TEST_MAX_TP");
    v4_options opt = { .tp = max_tp && atoi(max_tp) == 1 ? 1 : 2, .max_seqs = 3,
                       .backend = getenv("LLM_TEST_BACKEND"),
                       .kv_dtype = v4_kv_dtype_parse(dtype) };
    if (v4_model_load(&m, DEMO, &opt, &err)) {
        ok(0, "%s: load the demo model: %s", dtype, err.data);
        sb_free(&err);
        return;
    }
    int vocab = v4_model_config(m)->vocab_size;
    int32_t ids[PROMPT];
    srand(7);
    for (int i = 0; i < PROMPT; i++) ids[i] = 2 + rand() % (vocab - 2);

    float *la = malloc(sizeof(float) * (size_t)vocab);
    float *lb = malloc(sizeof(float) * (size_t)vocab);
    float *lc = malloc(sizeof(float) * (size_t)vocab);
    v4_seq *a = v4_seq_new(m, &err), *b = v4_seq_new(m, &err), *c = v4_seq_new(m, &err);
    bool setup = a && b && c && !v4_seq_reserve(m, a, PROMPT + DECODE, &err)
                 && !v4_seq_reserve(m, b, PROMPT + DECODE, &err)
                 && !v4_seq_reserve(m, c, PROMPT + DECODE, &err)
                 && !prefill(m, a, ids, la, &err) && !prefill(m, c, ids, lc, &err);
    ok(setup, "%s: two sequences prefill the prompt %s", dtype, setup ? "" : err.data);

    ok(v4_seq_fork(m, b, a, &err) == 0 && v4_seq_len(b) == PROMPT,
       "%s: fork copies %d positions", dtype, PROMPT);

    /* decode the same tokens in all three: the fork equals both */
    bool same_ac = true, same_bc = true;
    int32_t next = ids[PROMPT - 1];
    for (int t = 0; t < DECODE && setup; t++) {
        v4_step_item it[3] = { { a, &next, 1, la, false, NULL }, { b, &next, 1, lb, false, NULL },
                               { c, &next, 1, lc, false, NULL } };
        if (v4_step(m, it, 3, &err)) { ok(0, "decode: %s", err.data); break; }
        same_ac = same_ac && !memcmp(la, lc, sizeof(float) * (size_t)vocab);
        same_bc = same_bc && !memcmp(lb, lc, sizeof(float) * (size_t)vocab);
        int best = 0;
        for (int i = 1; i < vocab; i++) if (lc[i] > lc[best]) best = i;
        next = best;
    }
    ok(same_ac, "%s: batched decode of two prefilled sequences agrees (reference)", dtype);
    ok(same_bc, "%s: the forked sequence decodes bit for bit as a prefilled one", dtype);

    /* refusals */
    sb_reset(&err);
    ok(v4_seq_fork(m, b, a, &err) == -1 && strstr(err.data ? err.data : "", "positions"),
       "%s: a target that holds positions is refused", dtype);
    v4_seq_free(m, c);
    c = v4_seq_new(m, &err);
    sb_reset(&err);
    ok(c && v4_seq_fork(m, c, a, &err) == -1 && strstr(err.data ? err.data : "", "blocks"),
       "%s: a target without the blocks is refused", dtype);

    v4_seq_free(m, a);
    v4_seq_free(m, b);
    v4_seq_free(m, c);
    free(la);
    free(lb);
    free(lc);
    v4_model_free(m);
    sb_free(&err);
}

int main(void)
{
    run("auto");
    run("fp8");
    return exit_status();
}
