/* llm-engine client --run-dir DIR --name NAME --request FILE [--kind KIND]
 *                   [--repeat N]
 *
 * Submits one request body through the client library, exactly as an
 * nginx worker does, and prints every event as one JSON line with a
 * "type" field.  With --repeat N the request runs N times, one after the
 * other, and only a timing line is printed (the baseline the serving
 * benchmark compares nginx with: docs/PERFORMANCE.md).  Exit: 0 after finish (stop, length, tool_calls), 1 after
 * finish{error} or finish{cancelled}, 2 on usage errors, 3 when the
 * engine is unavailable or dies mid-request (noticed at once: its socket
 * closes). */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "event_json.h"
#include "ipc/llm_ipc_client.h"

#define STALE_HEARTBEAT_MS 3000

static const char usage_text[] =
    "usage: llm-engine client --run-dir DIR --name NAME --request FILE [--kind KIND] [--repeat N]\n"
    "  KIND: chat (default), completions, responses, tokenize, detokenize, probe, admin\n";

/* Read what is in the ring; print it unless quiet.  Returns the finish
 * reason once seen, 0 before, -1 on a protocol error. */
static int read_events(llm_ipc_client *c, const llm_ipc_handle *h, strbuf *line, bool quiet)
{
    static unsigned char buf[4 * LLM_IPC_EVENT_MAX];
    int finish = 0;
    long n;
    while ((n = llm_ipc_read_events(c, h, buf, sizeof buf)) > 0) {
        size_t off = 0;
        llm_ipc_event ev;
        int r;
        while ((r = llm_ipc_event_next(buf, (size_t)n, &off, &ev)) > 0) {
            if (!quiet) {
                sb_reset(line);
                event_to_json(line, &ev);
                puts(line->data);
            }
            if (ev.type == LLM_EV_FINISH && !ev.choice_end) finish = (int)ev.reason;
        }
        if (r < 0) return -1;
    }
    if (!quiet) fflush(stdout);
    if (n < 0) return -1;
    return finish;
}

/* One request start to finish.  Returns the exit code of the command. */
static int run_once(llm_ipc_client *c, int fd, const char *name, const strbuf *body, int kind,
                    strbuf *line, bool quiet)
{
    llm_ipc_handle h;
    int r = llm_ipc_claim(c, &h);
    if (r == LLM_IPC_ENOTREADY)
        fprintf(stderr, "client: engine '%s' is %s: %s\n", name,
                llm_ipc_state_name(llm_ipc_engine_state(c)), c->hdr->state_msg);
    else if (r < 0)
        fprintf(stderr, "client: cannot claim a slot: %s\n", llm_ipc_strerror(r));
    if (r < 0) return 3;
    if ((r = llm_ipc_write_request(c, &h, body->data, body->len)) < 0
        || (r = llm_ipc_submit(c, &h, (enum llm_ipc_kind)kind, body->len)) < 0) {
        fprintf(stderr, "client: cannot submit: %s\n", llm_ipc_strerror(r));
        llm_ipc_release(c, &h);
        return 3;
    }
    for (;;) {
        struct pollfd p = { fd, POLLIN, 0 };
        poll(&p, 1, 100);
        llm_ipc_msg msgs[64];
        int m = llm_ipc_recv(c, msgs, 64);
        /* Read the ring whatever the doorbell said: events written before
         * an engine died are still there to print. */
        int finish = read_events(c, &h, line, quiet);
        if (finish > 0) {
            llm_ipc_release(c, &h);
            return finish == LLM_FINISH_ERROR || finish == LLM_FINISH_CANCELLED ? 1 : 0;
        }
        if (finish < 0) {
            fprintf(stderr, "client: corrupt event ring from engine '%s'\n", name);
            return 3;
        }
        if (m == LLM_IPC_EDEAD) {
            fprintf(stderr, "client: engine '%s' died before the request finished "
                    "(doorbell socket closed)\n", name);
            return 3;
        }
        int64_t age = llm_ipc_heartbeat_age_ms(c);
        if (age > STALE_HEARTBEAT_MS) {
            fprintf(stderr, "client: engine '%s' stopped its heartbeat %lld ms ago\n", name,
                    (long long)age);
            return 3;
        }
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int cmd_client(int argc, char **argv)
{
    const char *run_dir = NULL, *name = NULL, *path = NULL, *kind_name = "chat";
    long repeat = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--run-dir") && i + 1 < argc) run_dir = argv[++i];
        else if (!strcmp(argv[i], "--name") && i + 1 < argc) name = argv[++i];
        else if (!strcmp(argv[i], "--request") && i + 1 < argc) path = argv[++i];
        else if (!strcmp(argv[i], "--kind") && i + 1 < argc) kind_name = argv[++i];
        else if (!strcmp(argv[i], "--repeat") && i + 1 < argc) repeat = atol(argv[++i]);
        else {
            fprintf(stderr, "client: unexpected argument '%s'\n%s", argv[i], usage_text);
            return 2;
        }
    }
    int kind = llm_ipc_kind_from_name(kind_name);
    if (!run_dir || !name || !path || !kind || repeat < 1) {
        if (!kind) fprintf(stderr, "client: unknown --kind '%s'\n", kind_name);
        fputs(usage_text, stderr);
        return 2;
    }
    strbuf body, line;
    sb_init(&body);
    sb_init(&line);
    if (sb_read_file(&body, path) < 0) {
        fprintf(stderr, "client: cannot read %s: %s\n", path, strerror(errno));
        return 2;
    }

    llm_ipc_client c;
    char err[256];
    int rc = 3;
    if (llm_ipc_attach(&c, run_dir, name, 0, err, sizeof err) < 0) {
        fprintf(stderr, "client: %s\n", err);
        sb_free(&body);
        sb_free(&line);
        return 3;
    }
    int fd = llm_ipc_connect(&c, err, sizeof err);
    if (fd < 0) {
        fprintf(stderr, "client: %s\n", err);
    } else if (repeat == 1) {
        rc = run_once(&c, fd, name, &body, kind, &line, false);
    } else {
        double *ms = malloc((size_t)repeat * sizeof *ms);
        long done = 0;
        for (; done < repeat; done++) {
            uint64_t t0 = llm_ipc_now_ns();
            rc = run_once(&c, fd, name, &body, kind, &line, true);
            ms[done] = (double)(llm_ipc_now_ns() - t0) / 1e6;
            if (rc) break;
        }
        if (done) {
            double total = 0;
            for (long i = 0; i < done; i++) total += ms[i];
            qsort(ms, (size_t)done, sizeof *ms, cmp_double);
            printf("%ld requests, one at a time: %.1f requests/s, latency median %.3f ms, "
                   "p99 %.3f ms\n", done, done / (total / 1e3), ms[done / 2],
                   ms[(long)(done * 0.99)]);
        }
        free(ms);
    }
    llm_ipc_detach(&c);
    sb_free(&body);
    sb_free(&line);
    return rc;
}
