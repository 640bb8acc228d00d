/* The model runner's prepare() does no parsing, rendering or tokenizing on
 * the caller's thread (the engine's main thread, which steps every running
 * decode): every kind only queues its request for the prep thread, and is
 * answered or made ready by poll() once that thread is done.  Driven
 * through runner_ops directly, with the demo model and a ring in memory. */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "recipe.h"
#include "runner.h"
#include "req_output.h"
#include "tap.h"

static llm_ipc_slot slot;
static _Alignas(64) unsigned char ring[1 << 16];

/* poll() until s is answered (done) or ready to run (prompt_tokens set). */
static void wait_prepared(const runner_ops *ops, void *R, llm_request *s)
{
    int fd = ops->wake_fd(R);
    for (int i = 0; i < 1000 && !s->done && !s->prompt_tokens; i++) {
        struct pollfd p = { fd, POLLIN, 0 };
        if (poll(&p, 1, 10) > 0) {
            uint64_t v;
            if (read(fd, &v, sizeof v) < 0) { /* raced with another read: fine */ }
        }
        ops->poll(R);
    }
}

int main(void)
{
    char dir[] = "/tmp/llm-test-prep-XXXXXX", path[300], cwd[4096];
    if (!mkdtemp(dir) || !getcwd(cwd, sizeof cwd)) return 1;
    snprintf(path, sizeof path, "%s/r.yaml", dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "name: prep\nrun_dir: %s\nbackend: cpu\nmodel:\n  path: %s/tests/fixtures/demo\n"
            "max_model_len: 256\nmax_num_seqs: 2\ncpu_threads: 1\n", dir, cwd);
    fclose(f);
    recipe r;
    strbuf err;
    sb_init(&err);
    if (recipe_load(&r, path, &err)) {
        ok(0, "recipe: %s", err.data);
        return exit_status();
    }
    const runner_ops *ops = runner_lookup("model");
    void *R = NULL;
    runner_capacity cap;
    if (!ops || ops->load(&R, &r, &cap, &err)) {
        ok(0, "load: %s", err.data ? err.data : "no model runner");
        return exit_status();
    }

    static const struct {
        enum llm_ipc_kind kind;
        const char *body, *what;
        bool answered;       /* ends at prepare time (no generation) */
    } cases[] = {
        { LLM_KIND_TOKENIZE, "{\"prompt\":\"hello world\"}", "tokenize", true },
        { LLM_KIND_TOKENIZE, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
          "tokenize (chat messages)", true },
        { LLM_KIND_DETOKENIZE, "{\"tokens\":[5,6,7]}", "detokenize", true },
        { LLM_KIND_DETOKENIZE, "{\"tokens\":[999999]}", "detokenize (bad id)", true },
        { LLM_KIND_TOKENIZE, "{", "tokenize (not JSON)", true },
        { LLM_KIND_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "chat",
          false },
        { LLM_KIND_COMPLETIONS, "{\"prompt\":\"hi\"}", "completions", false },
        { LLM_KIND_PROBE, "{}", "probe", false },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        memset(&slot, 0, sizeof slot);
        struct req_out out;
        req_out_init(&out, &slot, ring, sizeof ring, 1 << 20);
        llm_request s = { .kind = cases[i].kind, .request = cases[i].body,
                      .request_len = strlen(cases[i].body), .out = &out };
        int rc = ops->prepare(R, &s);
        ok(rc == 0 && !s.done && !s.prompt_tokens && atomic_load(&slot.head) == 0,
           "%s: prepare only queues the work (nothing emitted on the caller's thread)",
           cases[i].what);
        wait_prepared(ops, R, &s);
        if (cases[i].answered)
            ok(s.done && out.finish && atomic_load(&slot.head) > 0,
               "%s: answered from poll (finish %u)", cases[i].what, out.finish);
        else
            ok(!s.done && s.prompt_tokens > 0, "%s: ready to run from poll (%d prompt tokens)",
               cases[i].what, s.prompt_tokens);
        ops->release(R, &s);
        req_out_free(&out);
    }
    ops->unload(R);
    recipe_free(&r);
    sb_free(&err);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) diag("could not remove %s", dir);
    return exit_status();
}
