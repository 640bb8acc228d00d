/* Out of memory in a step (the allocation policy): a step whose buffers or
 * CPU-backend scratch cannot be allocated returns V4_STEP_NOMEM with a
 * message, never crashes, and the model goes on: the next step computes
 * exactly what it computed before.  Through the model runner, the requests
 * of such a step end with 503 engine_out_of_memory and the engine goes on.  Large allocations are made to fail by
 * interposing malloc in this program (glibc's __libc_* do the work), which
 * AddressSanitizer's own malloc excludes: under it the test skips. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ipc/llm_ipc.h"
#include "model.h"
#include "recipe.h"
#include "req_output.h"
#include "runner.h"
#include "tap.h"
#include <unistd.h>

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
    v4_step_item it = { s, ids, T, logits, false, NULL };
    int rc = s ? v4_step(m, &it, 1, err) : -100;
    v4_seq_free(m, s);
    __libc_free(ids);
    while (err->len && err->data[err->len - 1] == '\n') err->data[--err->len] = 0;
    return rc;
}

static llm_ipc_slot slot;
static _Alignas(64) unsigned char ring[1 << 16];

/* The event types of the ring, in order, as a string ("8,6" ...). */
static void ring_types(strbuf *out)
{
    static unsigned char buf[1 << 16];
    sb_reset(out);
    long n = llm_ipc_ring_get(&slot, ring, sizeof ring, buf, sizeof buf);
    size_t off = 0;
    llm_ipc_event ev;
    while (n > 0 && llm_ipc_event_next(buf, (size_t)n, &off, &ev) == 1) {
        sb_printf(out, "%s%s", out->len ? "," : "", llm_ipc_event_name(ev.type));
        if (ev.type == LLM_EV_ERROR) sb_printf(out, "(%u %.*s)", ev.status, (int)ev.code_len, ev.code);
    }
}

/* One chat request through the model runner's ops: prepare, admit, steps
 * up to its first token.  Returns the last step's result; the ring's
 * events in *events. */
static int runner_request(const runner_ops *ops, void *R, const char *body, strbuf *events)
{
    memset(&slot, 0, sizeof slot);
    struct req_out out;
    req_out_init(&out, &slot, ring, sizeof ring, 1 << 20);
    llm_request s = { .kind = LLM_KIND_CHAT, .request = body, .request_len = strlen(body),
                      .out = &out };
    int rc = -100;
    strbuf err;
    sb_init(&err);
    if (ops->prepare(R, &s) == 0) {
        for (int i = 0; i < 2000 && !s.done && !s.prompt_tokens; i++) {
            usleep(1000);
            ops->poll(R);
        }
        llm_request *batch[1] = { &s };
        /* steps until one makes a token (prefill chunks end at the
         * prefix cache's snapshot points) or the request ends */
        if (!s.done && ops->admit(R, &s))
            for (int k = 0; k < 8 && !s.done; k++)
                if ((rc = ops->step(R, batch, 1, &err)) != 0) break;
    }
    req_out_flush(&out);
    ring_types(events);
    ops->release(R, &s);
    req_out_free(&out);
    sb_free(&err);
    return rc;
}

static void through_the_runner(void)
{
    char dir[] = "/tmp/llm-test-oom-XXXXXX", path[300], cwd[4096];
    if (!mkdtemp(dir) || !getcwd(cwd, sizeof cwd)) return;
    snprintf(path, sizeof path, "%s/r.yaml", dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "name: oom\nrun_dir: %s\nbackend: cpu\nmodel:\n  path: %s/" DEMO "\n"
            "max_model_len: 4096\nmax_num_seqs: 2\ncpu_threads: 2\n", dir, cwd);
    fclose(f);
    recipe r;
    strbuf err, ev;
    sb_init(&err);
    sb_init(&ev);
    const runner_ops *ops = runner_lookup("model");
    void *R = NULL;
    runner_capacity cap;
    if (recipe_load(&r, path, &err) || ops->load(&R, &r, &cap, &err)) {
        ok(0, "runner: %s", err.data);
        recipe_free(&r);
        return;
    }
    /* a prompt of some 1500 tokens: its step needs megabytes of scratch */
    strbuf body;
    sb_init(&body);
    sb_puts(&body, "{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"");
    for (int i = 0; i < 1500; i++) sb_printf(&body, "w%d ", i % 97);
    sb_puts(&body, "\"}]}");

    atomic_store(&fail_above, (size_t)3 << 20);
    int rc = runner_request(ops, R, body.data, &ev);
    atomic_store(&fail_above, SIZE_MAX);
    is_int(rc, 0, "runner: a step out of memory is not fatal to the engine");
    ok(ev.data && strstr(ev.data, "error(503 engine_out_of_memory),finish"),
       "runner: the step's request ends with 503 engine_out_of_memory: %s",
       ev.data ? ev.data : "");
    rc = runner_request(ops, R, body.data, &ev);
    is_int(rc, 1, "runner: the same request runs once memory is there");
    ok(ev.data && strstr(ev.data, "usage,finish"), "runner: and finishes: %s",
       ev.data ? ev.data : "");
    sb_free(&body);
    sb_free(&ev);
    sb_free(&err);
    ops->unload(R);
    recipe_free(&r);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) diag("could not remove %s", dir);
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
    through_the_runner();
    return exit_status();
}
#endif
