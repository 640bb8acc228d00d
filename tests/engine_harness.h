/* Test harness for engine integration tests: a private run dir, unique
 * engine names, engines started with fork/exec (the scripted runner:
 * build/tests/llm-engine-test; the model runner: build/bin/llm-engine),
 * and cleanup of processes, segments and files
 * even when a test fails or hangs (a 20 s alarm ends it, test_env.h).  Header-only;
 * include after tap.h. */
#ifndef LLM_ENGINE_HARNESS_H
#define LLM_ENGINE_HARNESS_H

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test_env.h"
#include "event_json.h"
#include "ipc/llm_ipc_client.h"
#include "json.h"

#define H_MAX_ENGINES 8
#define H_MAX_CHILDREN 32
#define H_ENGINE_BIN build_path("bin/llm-engine")
#define H_ENGINE_TEST_BIN build_path("tests/llm-engine-test")

static char h_run_dir[256];
static char h_names[H_MAX_ENGINES][64];
static int h_n_names;
static pid_t h_engines[H_MAX_ENGINES];
static pid_t h_children[H_MAX_CHILDREN];
static int h_n_children;
static pid_t h_parent;

static inline void h_cleanup(void)
{
    if (getpid() != h_parent) return;
    for (int i = 0; i < H_MAX_ENGINES; i++)
        if (h_engines[i] > 0) {
            kill(h_engines[i], SIGKILL);
            waitpid(h_engines[i], NULL, 0);
            h_engines[i] = 0;
        }
    for (int i = 0; i < h_n_children; i++)
        if (h_children[i] > 0) {
            kill(h_children[i], SIGKILL);
            waitpid(h_children[i], NULL, 0);
            h_children[i] = 0;
        }
    for (int i = 0; i < h_n_names; i++) {
        char shm[LLM_IPC_SHM_NAME_MAX];
        if (llm_ipc_shm_name(shm, h_run_dir, h_names[i]) == 0) shm_unlink(shm);
    }
    if (h_run_dir[0]) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", h_run_dir);
        if (system(cmd) != 0) fprintf(stderr, "# could not remove %s\n", h_run_dir);
        h_run_dir[0] = 0;
    }
}

static char h_alarm_msg[64];

static inline void h_on_alarm(int sig)
{
    (void)sig;
    if (write(1, h_alarm_msg, strlen(h_alarm_msg)) < 0) _exit(2);
    h_cleanup();
    _exit(1);
}

/* Call first: private run dir, cleanup at exit, a 20 s bound (times
 * $LLM_TEST_TIME_SCALE). */
static inline void h_init(const char *test)
{
    h_parent = getpid();
    snprintf(h_run_dir, sizeof h_run_dir, "/tmp/llm-%s-XXXXXX", test);
    if (!mkdtemp(h_run_dir)) {
        perror("mkdtemp");
        exit(1);
    }
    atexit(h_cleanup);
    signal(SIGALRM, h_on_alarm);
    signal(SIGPIPE, SIG_IGN);
    unsigned bound = test_time_bound(20);
    snprintf(h_alarm_msg, sizeof h_alarm_msg, "not ok - test ran past its %u s bound\n", bound);
    alarm(bound);
}

/* A unique engine name for this test run ("t-<tag>-<pid>"). */
static inline const char *h_name(const char *tag)
{
    snprintf(h_names[h_n_names], sizeof h_names[0], "t-%s-%d", tag, (int)getpid());
    return h_names[h_n_names++];
}

/* Write a recipe for the scripted runner (max_model_len 4096 unless
 * extra sets it); returns its path (static). */
static inline const char *h_recipe(const char *name, int max_num_seqs, int slots, const char *extra)
{
    static char path[320];
    snprintf(path, sizeof path, "%s/%s.yaml", h_run_dir, name);
    FILE *f = fopen(path, "w");
    fprintf(f, "name: %s\nrun_dir: %s\nbackend: cpu\nmodel:\n  path: /nonexistent/%s\n"
               "max_num_seqs: %d\nslots: %d\nmax_request_bytes: 1MiB\n%s%s",
            name, h_run_dir, name, max_num_seqs, slots,
            extra && strstr(extra, "max_model_len:") ? "" : "max_model_len: 4096\n",
            extra ? extra : "");
    fclose(f);
    return path;
}

static inline int h_engine_index(pid_t pid)
{
    for (int i = 0; i < H_MAX_ENGINES; i++)
        if (h_engines[i] == pid) return i;
    return -1;
}

/* Where h_start_engine_with sends an engine's stderr. */
static inline void h_log_path(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s.log", h_run_dir, name);
}

/* The engine's log so far into out (replacing its contents; empty when
 * there is none). */
static inline void h_engine_log(const char *name, strbuf *out)
{
    char log[320];
    h_log_path(log, sizeof log, name);
    sb_reset(out);
    sb_read_file(out, log);
}

/* fork/exec `llm-engine serve` with the given runner ("model": the
 * production binary, else the test binary's test runner); stderr goes to
 * <run_dir>/<name>.log. */
static inline pid_t h_start_engine_with(const char *name, const char *recipe, const char *runner)
{
    pid_t pid = fork();
    if (pid == 0) {
        char log[320];
        h_log_path(log, sizeof log, name);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) dup2(fd, 2);
        if (!strcmp(runner, "model"))
            execl(H_ENGINE_BIN, H_ENGINE_BIN, "serve", "--recipe", recipe, (char *)NULL);
        else
            execl(H_ENGINE_TEST_BIN, H_ENGINE_TEST_BIN, "serve", "--recipe", recipe,
                  "--test-runner", runner, (char *)NULL);
        _exit(127);
    }
    int slot = h_engine_index(0);
    if (slot >= 0) h_engines[slot] = pid;
    return pid;
}

static inline pid_t h_start_engine(const char *name, const char *recipe)
{
    return h_start_engine_with(name, recipe, "scripted");
}

static inline void h_forget_engine(pid_t pid)
{
    int i = h_engine_index(pid);
    if (i >= 0) h_engines[i] = 0;
}

static inline void h_track_child(pid_t pid)
{
    if (h_n_children < H_MAX_CHILDREN) h_children[h_n_children++] = pid;
}

static inline long h_now_ms(void)
{
    return (long)(llm_ipc_now_ns() / 1000000);
}

static inline void h_sleep_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

/* Attach (and connect) once the engine is READY; 0 on success. */
static inline int h_attach_ready(llm_ipc_client *c, const char *name, long timeout_ms)
{
    char err[256] = "";
    long end = h_now_ms() + timeout_ms;
    while (h_now_ms() < end) {
        if (llm_ipc_attach(c, h_run_dir, name, 0, err, sizeof err) == 0) {
            if (llm_ipc_engine_state(c) == LLM_STATE_READY
                && llm_ipc_connect(c, err, sizeof err) >= 0)
                return 0;
            llm_ipc_detach(c);
        }
        h_sleep_ms(10);
    }
    diag("engine %s not ready after %ld ms: %s", name, timeout_ms, err);
    return -1;
}

/* h_attach_ready with 5 s to come up; when it does not, the check
 * "engine ready" fails and -1 is returned. */
static inline int h_ready(llm_ipc_client *c, const char *name)
{
    if (h_attach_ready(c, name, 5000) == 0) return 0;
    ok(0, "engine ready");
    return -1;
}

/* Exit status of pid within timeout_ms, or -1 if still running. */
static inline int h_wait_exit(pid_t pid, long timeout_ms)
{
    long end = h_now_ms() + timeout_ms;
    int st;
    while (h_now_ms() < end) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) {
            h_forget_engine(pid);
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        h_sleep_ms(5);
    }
    return -1;
}

/* Claim a slot, write body, submit.  Returns 0 or a client error code. */
static inline int h_submit(llm_ipc_client *c, llm_ipc_handle *h, const char *body, enum llm_ipc_kind kind)
{
    int rc = llm_ipc_claim(c, h);
    if (rc) return rc;
    size_t len = strlen(body);
    if ((rc = llm_ipc_write_request(c, h, body, len)) || (rc = llm_ipc_submit(c, h, kind, len))) {
        llm_ipc_release(c, h);
        return rc;
    }
    return 0;
}

/* Read one request's events until finish (or timeout / engine death),
 * appending each as a JSON line to out and the concatenated content text
 * to content (either may be NULL).  Returns the finish reason, 0 on
 * timeout, LLM_IPC_EDEAD if the engine died first, other negatives on
 * protocol errors. */
static inline int h_collect(llm_ipc_client *c, const llm_ipc_handle *h, long timeout_ms, strbuf *out,
                     strbuf *content)
{
    static unsigned char buf[2 * LLM_IPC_EVENT_MAX];
    long end = h_now_ms() + timeout_ms;
    while (h_now_ms() < end) {
        struct pollfd p = { c->sock_fd, POLLIN, 0 };
        poll(&p, 1, 50);
        llm_ipc_msg msgs[32];
        int m = llm_ipc_recv(c, msgs, 32);
        long n;
        while ((n = llm_ipc_read_events(c, h, buf, sizeof buf)) > 0) {
            size_t off = 0;
            llm_ipc_event ev;
            int r;
            while ((r = llm_ipc_event_next(buf, (size_t)n, &off, &ev)) > 0) {
                if (out) {
                    event_to_json(out, &ev);
                    sb_putc(out, '\n');
                }
                if (content && ev.type == LLM_EV_CONTENT_DELTA) sb_append(content, ev.text, ev.text_len);
                if (ev.type == LLM_EV_FINISH && !ev.choice_end) return (int)ev.reason;
            }
            if (r < 0) return LLM_IPC_EPROTO;
        }
        if (n < 0) return (int)n;
        if (m == LLM_IPC_EDEAD) return LLM_IPC_EDEAD;
    }
    return 0;
}

/* Run `llm-engine ARGS...` and capture stdout; returns the exit status. */
static inline int h_run_cli(strbuf *out, const char *const *args)
{
    int pfd[2];
    if (pipe(pfd) < 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pfd[1], 1);
        close(pfd[0]);
        close(pfd[1]);
        char *argv[16];
        int n = 0;
        argv[n++] = (char *)H_ENGINE_BIN;
        for (int i = 0; args[i] && n < 15; i++) argv[n++] = (char *)args[i];
        argv[n] = NULL;
        execv(H_ENGINE_BIN, argv);
        _exit(127);
    }
    close(pfd[1]);
    char buf[4096];
    ssize_t r;
    while ((r = read(pfd[0], buf, sizeof buf)) > 0) sb_append(out, buf, (size_t)r);
    close(pfd[0]);
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* `llm-engine status` for name, parsed; caller frees with yajl_tree_free. */
static inline yajl_val h_status(const char *name)
{
    strbuf out;
    sb_init(&out);
    const char *args[] = { "status", "--run-dir", h_run_dir, "--name", name, NULL };
    h_run_cli(&out, args);
    char err[128];
    yajl_val v = out.len ? json_parse(out.data, out.len, err, sizeof err) : NULL;
    sb_free(&out);
    return v;
}

/* A counter from the mapped header. */
static inline uint64_t h_counter(const llm_ipc_client *c, enum llm_ipc_counter k)
{
    return atomic_load_explicit(&c->hdr->counters[k], memory_order_relaxed);
}

/* Slots of the mapped segment in state st. */
static inline int h_slots_in(const llm_ipc_client *c, enum llm_slot_state st)
{
    int n = 0;
    for (uint32_t k = 0; k < c->hdr->n_slots; k++)
        n += LLM_SLOT_STATE(atomic_load(&llm_ipc_slot_at(c->hdr, k)->word)) == (uint32_t)st;
    return n;
}

#endif
