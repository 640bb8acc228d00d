/* Cold managed start: run --start-cmd in its own process group and time
 * until /health answers 200 and a one-token request succeeds.  The stack
 * we started is stopped when the run ends (unless --keep-running). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "qualify.h"

bool stack_failed(qctx *q)
{
    if (q->stack_pid > 0 && !q->stack_exited
        && waitpid(q->stack_pid, &q->stack_status, WNOHANG) == q->stack_pid)
        q->stack_exited = true;
    return q->stack_exited && !(WIFEXITED(q->stack_status) && WEXITSTATUS(q->stack_status) == 0);
}

void stack_stop(qctx *q)
{
    if (q->stack_pid <= 0) return;
    pid_t pg = q->stack_pid;
    q->stack_pid = 0;
    if (kill(-pg, SIGTERM) < 0 && errno == ESRCH) {
        waitpid(pg, NULL, WNOHANG);
        return;
    }
    /* Give the group 10 s to exit, then SIGKILL what is left. */
    for (int i = 0; i < 100; i++) {
        waitpid(pg, NULL, WNOHANG);
        if (kill(-pg, 0) < 0 && errno == ESRCH) return;
        usleep(100 * 1000);
    }
    fprintf(stderr, "llm-qualify: the managed stack did not stop on SIGTERM; sending SIGKILL\n");
    kill(-pg, SIGKILL);
    waitpid(pg, NULL, 0);
}

static void describe_exit(int st, strbuf *out)
{
    if (WIFEXITED(st)) sb_printf(out, "exited with status %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st)) sb_printf(out, "was killed by signal %d", WTERMSIG(st));
    else sb_puts(out, "stopped");
}

/* The log's last lines, for a failure message. */
static void log_tail(const char *path, strbuf *out)
{
    strbuf all;
    sb_init(&all);
    if (sb_read_file(&all, path) == 0 && all.len) {
        while (all.len && (all.data[all.len - 1] == '\n' || all.data[all.len - 1] == ' '))
            all.data[--all.len] = 0;
        size_t start = all.len > 400 ? all.len - 400 : 0;
        sb_printf(out, "; log tail: %s", all.data + start);
    }
    sb_free(&all);
}

void gate_cold_start(qctx *q, gate *g)
{
    jw_str(&g->mw, "start_cmd", q->start_cmd);
    /* Something already answering means nothing cold is measured. */
    http_resp r;
    http_resp_init(&r);
    q_http(q, "before-start-health", "GET", "/health", NULL, 0, false, NULL, NULL, &r);
    long before = r.status;
    http_resp_free(&r);
    if (before) {
        gate_check(g, ST_FAIL, "nothing serving before start",
                   "%s already answers /health with HTTP %ld before --start-cmd ran: stop it "
                   "first, or leave out --start-cmd", q->base_url, before);
        return;
    }
    gate_check(g, ST_PASS, "nothing serving before start", "no HTTP answer at %s", q->base_url);

    strbuf err;
    sb_init(&err);
    int idx = art_reserve(&q->art, g->id, "start-cmd", ".log", &q->stack_log, &err);
    if (idx < 0) {
        gate_check(g, ST_FAIL, "start", "%s", err.data);
        sb_free(&err);
        return;
    }
    jw_str(&g->aw, NULL, q->art.items[idx].path);
    fflush(NULL);
    double t0 = now_s();
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        int fd = open(q->stack_log.data, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0) dup2(devnull, 0);
        execl("/bin/sh", "sh", "-c", q->start_cmd, (char *)NULL);
        _exit(127);
    }
    if (pid < 0) {
        gate_check(g, ST_FAIL, "start", "fork: %s", strerror(errno));
        sb_free(&err);
        return;
    }
    setpgid(pid, pid);   /* both sides, so no signal can race the child's */
    q->stack_pid = pid;

    strbuf why;
    sb_init(&why);
    double took = wait_ready(q, "start", q->deadline - now_s(), &why);
    if (took >= 0) took = now_s() - t0;
    jw_num(&g->mw, "seconds_to_ready", took >= 0 ? took : NAN, 3);
    jw_num(&g->mw, "bound_s", g->bound_s, 0);
    if (took >= 0) {
        gate_check(g, ST_PASS, "ready", "/health 200 and a one-token request in %.1f s", took);
        gate_summary(g, "Passed health and a one-token request in %.1f seconds", took);
        if (q->stack_exited)
            gate_caveat(g, "the start command exited 0 before the stack was ready: llm-qualify "
                        "stops what remains in its process group at the end; processes that left "
                        "the group (daemons) need --stop-cmd");
    } else if (stack_failed(q)) {
        strbuf d;
        sb_init(&d);
        describe_exit(q->stack_status, &d);
        sb_puts(&d, " before the stack was ready");
        log_tail(q->stack_log.data, &d);
        gate_check(g, ST_FAIL, "ready", "the start command %s", d.data);
        sb_free(&d);
    } else {
        gate_check(g, ST_FAIL, "ready", "not ready within %.0f s; last: %s", g->bound_s,
                   why.data ? why.data : "");
    }
    sb_free(&why);
    sb_free(&err);
}
