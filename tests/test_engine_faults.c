/* Faults: a client killed mid-stream (with and without a doorbell
 * connection), the engine killed mid-stream (library and CLI notice at
 * once), restart with a new epoch (old handles stale), a runner that
 * fails to load or fails mid-run (FAILED with the reason), and a second
 * engine under a taken name. */
#include "tap.h"
#include "engine_harness.h"

static const char *long_body =
    "{\"test_script\":{\"content\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\","
    "\"tokens_per_step\":1,\"step_ms\":20}}";

/* Wait until every slot of c's segment is FREE; returns the ms it took or -1. */
static long wait_all_free(const llm_ipc_client *c, long timeout_ms)
{
    long t0 = h_now_ms();
    while (h_now_ms() - t0 < timeout_ms) {
        if (h_slots_in(c, LLM_SLOT_FREE) == (int)c->hdr->n_slots) return h_now_ms() - t0;
        h_sleep_ms(2);
    }
    return -1;
}

/* A child that submits a long request, reads a little, tells us, and
 * waits to be killed.  connect: whether it opens a doorbell socket. */
static pid_t doomed_client(const char *name, int connect, int *ready_fd)
{
    int p[2];
    if (pipe(p) < 0) return -1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        llm_ipc_client c;
        char err[256];
        if (connect ? h_attach_ready(&c, name, 3000)
                    : llm_ipc_attach(&c, h_run_dir, name, 0, err, sizeof err))
            _exit(10);
        llm_ipc_handle h;
        if (h_submit(&c, &h, long_body, LLM_KIND_CHAT)) _exit(11);
        if (connect) {
            static unsigned char buf[LLM_IPC_EVENT_MAX];
            long t0 = h_now_ms();
            while (llm_ipc_read_events(&c, &h, buf, sizeof buf) <= 0 && h_now_ms() - t0 < 3000)
                h_sleep_ms(5);
        }
        if (write(p[1], "r", 1) != 1) _exit(12);
        for (;;) pause();
    }
    close(p[1]);
    h_track_child(pid);
    *ready_fd = p[0];
    return pid;
}

static void test_client_killed(const char *name, llm_ipc_client *c, int connect)
{
    int fd = -1;
    const char *how = connect ? "with a doorbell connection" : "without a doorbell connection";
    pid_t kid = doomed_client(name, connect, &fd);
    char ch;
    ok(read(fd, &ch, 1) == 1, "client %s is streaming", how);
    close(fd);
    long t0 = h_now_ms();
    while (h_slots_in(c, LLM_SLOT_RUNNING) < 1 && h_now_ms() - t0 < 3000) h_sleep_ms(2);
    is_int(h_slots_in(c, LLM_SLOT_RUNNING), 1, "its request runs");
    kill(kid, SIGKILL);
    waitpid(kid, NULL, 0);
    long ms = wait_all_free(c, 3000);
    ok(ms >= 0, "kill -9 of the client %s: its slot is freed (%ld ms)", how, ms);
    is_int(h_counter(c, LLM_CTR_RUNNING), 0, "nothing left running");

    llm_ipc_handle h;
    strbuf content;
    sb_init(&content);
    h_submit(c, &h, "{\"test_script\":{\"content\":\"still here\",\"tokens_per_step\":5}}", LLM_KIND_CHAT);
    is_int(h_collect(c, &h, 3000, NULL, &content), LLM_FINISH_STOP, "the engine keeps serving");
    is_str(content.data, "still here", "with the right output");
    llm_ipc_release(c, &h);
    sb_free(&content);
}

static void test_engine_killed(void)
{
    const char *name = h_name("ekill");
    const char *recipe = h_recipe(name, 2, 8, NULL);
    pid_t eng = h_start_engine(name, recipe);
    llm_ipc_client c;
    if (h_ready(&c, name)) return;
    uint64_t epoch1 = c.epoch;
    /* A worker that attached to this engine but connects only after the
     * restart must notice the new engine behind the socket. */
    llm_ipc_client late;
    char err[256];
    int late_ok = llm_ipc_attach(&late, h_run_dir, name, 0, err, sizeof err) == 0;
    llm_ipc_handle h;
    h_submit(&c, &h, long_body, LLM_KIND_CHAT);
    h_sleep_ms(100);
    long t0 = h_now_ms();
    kill(eng, SIGKILL);
    int rc = h_collect(&c, &h, 3000, NULL, NULL);
    long ms = h_now_ms() - t0;
    waitpid(eng, NULL, 0);
    h_forget_engine(eng);
    is_int(rc, LLM_IPC_EDEAD, "kill -9 of the engine: the client library reports it dead");
    ok(ms < 1000, "within 1 s (%ld ms)", ms);
    is_int(llm_ipc_claim(&c, &h), LLM_IPC_EDEAD, "no claims on a dead engine");

    /* Restart under the same name: the stale segment is replaced, new epoch. */
    eng = h_start_engine(name, recipe);
    llm_ipc_client c2;
    if (h_attach_ready(&c2, name, 5000)) {
        ok(0, "restarted engine ready");
        return;
    }
    ok(c2.epoch != epoch1, "restarted engine has a new epoch");
    if (late_ok && llm_ipc_connect(&late, err, sizeof err) >= 0) {
        llm_ipc_msg m[4];
        int r = 0;
        for (long t = h_now_ms(); r == 0 && h_now_ms() - t < 2000; h_sleep_ms(2)) r = llm_ipc_recv(&late, m, 4);
        is_int(r, LLM_IPC_EDEAD, "a client of the old epoch connecting to the new engine is told it is stale");
        llm_ipc_detach(&late);
    } else {
        ok(0, "late client attach/connect: %s", err);
    }
    is_int(llm_ipc_slot_state(&c2, &h), LLM_IPC_ESTALE, "a handle from before the restart is stale");
    is_int(llm_ipc_release(&c2, &h), LLM_IPC_ESTALE, "and cannot touch the new engine's slot");
    llm_ipc_handle h2;
    strbuf content;
    sb_init(&content);
    h_submit(&c2, &h2, "{\"test_script\":{\"content\":\"new epoch\"}}", LLM_KIND_CHAT);
    is_int(h_collect(&c2, &h2, 3000, NULL, &content), LLM_FINISH_STOP, "the new engine serves");
    llm_ipc_release(&c2, &h2);
    sb_free(&content);
    llm_ipc_detach(&c);

    /* The CLI client notices an engine death too. */
    char req[320];
    snprintf(req, sizeof req, "%s/long.json", h_run_dir);
    FILE *f = fopen(req, "w");
    fputs(long_body, f);
    fclose(f);
    int p[2];
    if (pipe(p) < 0) return;
    fflush(stdout);
    pid_t cli = fork();
    if (cli == 0) {
        dup2(p[1], 2);
        close(p[0]);
        close(p[1]);
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 1);
        execl(H_ENGINE_BIN, H_ENGINE_BIN, "client", "--run-dir", h_run_dir, "--name", name,
              "--request", req, (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    h_track_child(cli);
    t0 = h_now_ms();
    while (h_slots_in(&c2, LLM_SLOT_RUNNING) < 1 && h_now_ms() - t0 < 3000) h_sleep_ms(2);
    t0 = h_now_ms();
    kill(eng, SIGKILL);
    int st = -1;
    while (h_now_ms() - t0 < 3000 && waitpid(cli, &st, WNOHANG) == 0) h_sleep_ms(2);
    ms = h_now_ms() - t0;
    waitpid(eng, NULL, 0);
    h_forget_engine(eng);
    char msg[512] = "";
    ssize_t n = read(p[0], msg, sizeof msg - 1);
    msg[n > 0 ? n : 0] = 0;
    close(p[0]);
    ok(WIFEXITED(st) && WEXITSTATUS(st) == 3, "the client command exits 3 when the engine dies");
    ok(ms < 1000, "within 1 s (%ld ms)", ms);
    msg[strcspn(msg, "\n")] = 0;
    ok(strstr(msg, "died before the request finished") != NULL, "saying so: %s", msg);
    llm_ipc_detach(&c2);
}

static void test_load_failure(void)
{
    const char *name = h_name("lfail");
    pid_t eng = h_start_engine_with(name, h_recipe(name, 1, 4, NULL), "no-such-runner");
    is_int(h_wait_exit(eng, 5000), 1, "a runner that cannot load: engine exits 1");
    yajl_val st = h_status(name);
    const char *state = json_string(json_get(st, "state"));
    const char *msg = json_string(json_get(st, "state_msg"));
    is_str(state, "failed", "the segment stays, state failed");
    ok(msg && strstr(msg, "load failed: no 'no-such-runner' runner"), "with the reason: %s", msg ? msg : "");
    yajl_tree_free(st);
    char sock[320];
    snprintf(sock, sizeof sock, "%s/%s.sock", h_run_dir, name);
    ok(access(sock, F_OK) < 0, "the socket is gone");
    llm_ipc_client c;
    char err[256];
    if (llm_ipc_attach(&c, h_run_dir, name, 0, err, sizeof err) == 0) {
        llm_ipc_handle h;
        is_int(llm_ipc_claim(&c, &h), LLM_IPC_ENOTREADY, "a FAILED engine takes no requests");
        llm_ipc_detach(&c);
    } else {
        ok(0, "attach to the failed segment: %s", err);
    }
    /* The next start replaces the failed segment (its pid is dead). */
    eng = h_start_engine(name, h_recipe(name, 1, 4, NULL));
    ok(h_attach_ready(&c, name, 5000) == 0, "a new engine replaces the failed one's segment");
    llm_ipc_detach(&c);
    kill(eng, SIGKILL);
    h_wait_exit(eng, 3000);
}

static void test_runtime_failure(void)
{
    const char *name = h_name("rfail");
    pid_t eng = h_start_engine(name, h_recipe(name, 1, 4, NULL));
    llm_ipc_client c;
    if (h_ready(&c, name)) return;
    llm_ipc_handle h;
    strbuf out;
    sb_init(&out);
    h_submit(&c, &h, "{\"test_script\":{\"content\":\"abcdefghij\",\"fail_after\":3}}", LLM_KIND_CHAT);
    is_int(h_collect(&c, &h, 3000, &out, NULL), LLM_FINISH_ERROR, "a runner failure mid-run ends the request in error");
    ok(strstr(out.data, "\"status\":500,\"code\":\"engine_failed\"") != NULL, "as 500 engine_failed");
    is_int(h_wait_exit(eng, 3000), 1, "the engine exits 1");
    is_int(llm_ipc_engine_state(&c), LLM_STATE_FAILED, "state FAILED");
    ok(strstr(c.hdr->state_msg, "scripted failure after 3 tokens") != NULL, "reason: %s", c.hdr->state_msg);
    llm_ipc_detach(&c);
    sb_free(&out);
}

static void test_name_taken(const char *name, const char *recipe)
{
    pid_t second = h_start_engine(name, recipe);
    is_int(h_wait_exit(second, 5000), 2, "a second engine under a running engine's name exits 2");
    strbuf text;
    sb_init(&text);
    h_engine_log(name, &text);
    ok(text.data && strstr(text.data, "another engine named") != NULL,
       "saying the name is taken");
    sb_free(&text);
}

int main(void)
{
    h_init("faults");
    const char *name = h_name("faults");
    const char *recipe = h_recipe(name, 2, 8, NULL);
    h_start_engine(name, recipe);
    llm_ipc_client c;
    if (h_ready(&c, name)) return exit_status();
    test_client_killed(name, &c, 1);
    test_client_killed(name, &c, 0);
    test_name_taken(name, recipe);
    llm_ipc_detach(&c);
    test_engine_killed();
    test_load_failure();
    test_runtime_failure();
    return exit_status();
}
