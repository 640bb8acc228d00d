/* Out of memory in a step (the allocation policy): a step whose buffers or
 * CPU-backend scratch cannot be allocated returns V4_STEP_NOMEM with a
 * message, never crashes, and the model goes on: the next step computes
 * exactly what it computed before.  Large allocations are made to fail by
 * interposing malloc in this program (glibc's __libc_* do the work), which
 * AddressSanitizer's own malloc excludes: under it the test skips. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "tap.h"

#define DEMO "tests/fixtures/demo"

#if defined(__SANITIZE_ADDRESS__)
int main(void)
{
    puts("1..0 # SKIP malloc is interposed here, AddressSanitizer interposes it too");
    return 0;
}
#else

void *__libc_malloc(size_t n);
void *__libc_calloc(size_t n, size_t k);
void *__libc_realloc(void *p, size_t n);
void *__libc_memalign(size_t align, size_t n);
void __libc_free(void *p);

/* Allocations above this many bytes fail while armed. */
static _Atomic size_t fail_above = SIZE_MAX;

static int refuse(size_t n) { return n > atomic_load_explicit(&fail_above, memory_order_relaxed); }

void *malloc(size_t n) { return refuse(n) ? NULL : __libc_malloc(n); }
void *calloc(size_t n, size_t k) { return refuse(n * k) ? NULL : __libc_calloc(n, k); }
void *realloc(void *p, size_t n) { return refuse(n) ? NULL : __libc_realloc(p, n); }
void *aligned_alloc(size_t a, size_t n) { return refuse(n) ? NULL : __libc_memalign(a, n); }
int posix_memalign(void **out, size_t a, size_t n)
{
    *out = refuse(n) ? NULL : __libc_memalign(a, n);
    return *out ? 0 : 12;   /* ENOMEM */
}
void free(void *p) { __libc_free(p); }

static int step(v4_model *m, int T, float *logits, strbuf *err)
{
    int32_t *ids = __libc_malloc((size_t)T * sizeof *ids);
    for (int i = 0; i < T; i++) ids[i] = (int32_t)((i * 7 + 3) % 3919);
    sb_reset(err);
    v4_seq *s = v4_seq_new(m, err);
    v4_step_item it = { s, ids, T, logits, false };
    int rc = s ? v4_step(m, &it, 1, err) : -100;
    v4_seq_free(m, s);
    __libc_free(ids);
    return rc;
}

int main(void)
{
    v4_options o = { .tp = 2, .threads_per_rank = 2, .max_seqs = 4, .cache_tokens = 8192,
                     .max_step_tokens = 2048 };
    strbuf err;
    sb_init(&err);
    v4_model *m = NULL;
    if (v4_model_load(&m, DEMO, &o, &err)) {
        ok(0, "load %s: %s", DEMO, err.data);
        return exit_status();
    }
    int V = v4_model_config(m)->vocab_size;
    float *ref = __libc_calloc((size_t)V, sizeof *ref), *got = __libc_calloc((size_t)V, sizeof *got);

    is_int(step(m, 1024, got, &err), 0, "a step of 1024 tokens (scratch sized for it)");
    is_int(step(m, 64, ref, &err), 0, "reference step of 64 tokens");

    atomic_store(&fail_above, (size_t)3 << 20);
    int rc = step(m, 1024, got, &err);
    is_int(rc, V4_STEP_NOMEM, "no memory for the CPU backend's scratch: V4_STEP_NOMEM");
    ok(err.data && strstr(err.data, "out of host memory: moe needs"), "saying so: %s",
       err.data ? err.data : "");
    rc = step(m, 1536, got, &err);
    is_int(rc, V4_STEP_NOMEM, "no memory for a rank's step buffers: V4_STEP_NOMEM");
    ok(err.data && strstr(err.data, "out of memory for the buffers of a step of 1536 tokens"),
       "saying so: %s", err.data ? err.data : "");
    atomic_store(&fail_above, (size_t)1 << 20);
    rc = step(m, 2048, got, &err);
    is_int(rc, V4_STEP_NOMEM, "no memory for the all-reduce: V4_STEP_NOMEM");
    ok(err.data && strstr(err.data, "out of memory for the all-reduce of 2048 tokens"),
       "saying so: %s", err.data ? err.data : "");
    atomic_store(&fail_above, SIZE_MAX);

    memset(got, 0xff, (size_t)V * sizeof *got);   /* poisoned */
    is_int(step(m, 64, got, &err), 0, "the model goes on");
    ok(!memcmp(got, ref, (size_t)V * sizeof *got), "and computes exactly what it did before");
    is_int(step(m, 2048, got, &err), 0, "a large step works again once memory is there");

    __libc_free(ref);
    __libc_free(got);
    v4_model_free(m);
    sb_free(&err);
    return exit_status();
}
#endif
