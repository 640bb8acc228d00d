#include "command.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int run_command(qctx *q, char *const argv[], strbuf *out, strbuf *why)
{
    int p[2];
    if (pipe(p) < 0) {
        sb_printf(why, "pipe: %s", strerror(errno));
        return -1;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(p[1], 1);
        dup2(p[1], 2);
        close(p[0]);
        close(p[1]);
        execv(argv[0], argv);
        fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(p[1]);
    if (pid < 0) {
        close(p[0]);
        sb_printf(why, "fork: %s", strerror(errno));
        return -1;
    }
    char buf[4096];
    bool late = false;
    for (;;) {
        double left = q->deadline - now_s();
        struct pollfd pf = { p[0], POLLIN, 0 };
        int r = left > 0 ? poll(&pf, 1, (int)(left * 1000) + 1) : 0;
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            kill(pid, SIGKILL);
            late = true;
            break;
        }
        ssize_t n = read(p[0], buf, sizeof buf);
        if (n <= 0) break;
        sb_append(out, buf, (size_t)n);
    }
    close(p[0]);
    int st;
    waitpid(pid, &st, 0);
    if (late) {
        sb_printf(why, "%s %s did not finish within the gate's bound", argv[0], argv[1] ? argv[1] : "");
        return -1;
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        sb_printf(why, "%s %s exited with status %d: %.300s", argv[0], argv[1] ? argv[1] : "",
                  WIFEXITED(st) ? WEXITSTATUS(st) : -1, out->data ? out->data : "");
        return -1;
    }
    return 0;
}
