/* llm-engine-test bench-ipc [--iters N]: protocol and scheduler overheads
 * (docs/PERFORMANCE.md).  Not part of `make test`; in the test binary
 * because it drives the scheduler with the scripted runner.
 *
 * 1. Event round trip: a worker process (client library) rings "slot
 *    submitted" on a SOCK_SEQPACKET doorbell; an engine process wakes,
 *    writes one content_delta into the slot's ring and rings back; the
 *    worker wakes, reads and decodes the event.  Two doorbells, one ring
 *    write and one ring read per round trip.
 *    The engine stamps each event, so the one-way delivery is measured
 *    too (CLOCK_MONOTONIC is shared by both processes).
 * 2. Scheduler overhead per step outside the model: the real scheduler
 *    over B running sequences of the scripted runner (no sleep), each
 *    ring read until empty after every step so every sequence is rung
 *    every step, doorbells sent as the server does (one packet per worker
 *    per step); LLM_CTR_STEP_OVERHEAD_NS plus that send, per step. */
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine_test.h"
#include "ipc/llm_ipc_client.h"
#include "recipe.h"
#include "runner.h"
#include "scheduler.h"
#include "segment.h"

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void percentiles(uint64_t *v, int n, double *p50, double *p99)
{
    qsort(v, (size_t)n, sizeof *v, cmp_u64);
    *p50 = (double)v[n / 2] / 1000.0;
    *p99 = (double)v[(int)((long)n * 99 / 100)] / 1000.0;
}

/* Names the segment only (llm_ipc_shm_name): the bench connects its
 * worker and engine through a socketpair, not a socket in a run_dir. */
static const char bench_run_dir[] = "/tmp";

static int make_segment(segment *seg, const char *name, uint32_t slots, strbuf *err)
{
    const char *models[] = { "bench" };
    segment_params p = { .name = name, .run_dir = bench_run_dir, .models = models, .n_models = 1, .n_slots = slots,
                         .ring_bytes = LLM_IPC_RING_DEFAULT, .max_request_bytes = 65536,
                         .max_model_len = 65536, .max_num_seqs = slots,
                         .max_num_batched_tokens = 8192 };
    if (segment_create(seg, &p, err) < 0) return -1;
    segment_set_state(seg, LLM_STATE_READY, NULL);
    return 0;
}

/* The engine side of the round trip, in a child process.  Each event's
 * text carries the CLOCK_MONOTONIC time it was written, so the worker can
 * also measure the one-way delivery. */
static void echo_engine(llm_ipc_header *h, int fd)
{
    unsigned char rec[64];
    for (;;) {
        struct pollfd p = { fd, POLLIN, 0 };
        poll(&p, 1, -1);
        llm_ipc_msg m;
        ssize_t r;
        while ((r = recv(fd, &m, sizeof m, MSG_DONTWAIT)) == (ssize_t)sizeof m) {
            uint64_t now = llm_ipc_now_ns();
            size_t len = llm_ipc_enc_text(rec, sizeof rec, LLM_EV_CONTENT_DELTA,
                                          (const char *)&now, sizeof now);
            llm_ipc_slot *s = llm_ipc_slot_at(h, m.slot);
            llm_ipc_ring_put(s, llm_ipc_ring_at(h, m.slot), h->ring_bytes, rec, len);
            if (llm_ipc_ring_wake(s)) {
                llm_ipc_msg e = { LLM_MSG_EVENTS, LLM_IPC_VERSION, m.slot, m.arg };
                send(fd, &e, sizeof e, MSG_NOSIGNAL);
            }
        }
        if (r == 0) _exit(0);
    }
}

static int bench_round_trip(const char *name, int iters)
{
    segment seg;
    strbuf err;
    sb_init(&err);
    if (make_segment(&seg, name, 4, &err) < 0) {
        fprintf(stderr, "bench-ipc: %s\n", err.data);
        return 1;
    }
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) < 0) {
        perror("socketpair");
        return 1;
    }
    fflush(stdout);
    pid_t eng = fork();
    if (eng == 0) {
        close(sv[0]);
        echo_engine(seg.hdr, sv[1]);
    }
    close(sv[1]);
    llm_ipc_client c;
    char e[256];
    if (llm_ipc_attach(&c, bench_run_dir, name, 0, e, sizeof e) < 0) {
        fprintf(stderr, "bench-ipc: %s\n", e);
        return 1;
    }
    c.sock_fd = sv[0];
    llm_ipc_handle h;
    llm_ipc_claim(&c, &h);
    llm_ipc_write_request(&c, &h, "{}", 2);
    llm_ipc_submit(&c, &h, LLM_KIND_CHAT, 2);   /* rings once; the echo answers once */
    uint64_t *rtt = malloc((size_t)iters * sizeof *rtt), *one = malloc((size_t)iters * sizeof *one);
    unsigned char buf[LLM_IPC_EVENT_MAX];
    int warm = iters / 10;
    for (int i = -warm - 1; i < iters; i++) {
        uint64_t t0 = llm_ipc_now_ns();
        if (i >= -warm) {
            llm_ipc_msg m = { LLM_MSG_SUBMIT, LLM_IPC_VERSION, h.slot, h.gen };
            send(sv[0], &m, sizeof m, MSG_NOSIGNAL);
        }
        int got = 0;
        while (!got) {
            long n = llm_ipc_read_events(&c, &h, buf, sizeof buf);
            if (n > 0) {
                size_t off = 0;
                llm_ipc_event ev;
                while (llm_ipc_event_next(buf, (size_t)n, &off, &ev) == 1) {
                    uint64_t sent;
                    memcpy(&sent, ev.text, sizeof sent);
                    if (i >= 0) one[i] = llm_ipc_now_ns() - sent;
                    got++;
                }
                continue;
            }
            struct pollfd p = { sv[0], POLLIN, 0 };
            poll(&p, 1, 1000);
            llm_ipc_msg msgs[8];
            llm_ipc_recv(&c, msgs, 8);
        }
        if (i >= 0) rtt[i] = llm_ipc_now_ns() - t0;
    }
    double p50, p99;
    percentiles(one, iters, &p50, &p99);
    printf("| event delivery, engine → worker (ring write + doorbell → wake + ring read) | %d | %.2f | %.2f |\n",
           iters, p50, p99);
    percentiles(rtt, iters, &p50, &p99);
    printf("| round trip, worker → engine → worker (2 doorbells, ring write, ring read) | %d | %.2f | %.2f |\n",
           iters, p50, p99);
    close(sv[0]);
    c.sock_fd = -1;
    llm_ipc_detach(&c);
    waitpid(eng, NULL, 0);
    segment_close(&seg, 1);
    free(rtt);
    free(one);
    sb_free(&err);
    return 0;
}

/* The server's doorbell path for one worker connection: notify() queues,
 * and after the step the queue goes out as packets of up to
 * LLM_IPC_MSGS_PER_PACKET messages. */
struct outq {
    int         fd;
    int         n;
    llm_ipc_msg m[LLM_IPC_MSGS_PER_PACKET];
};

static void queue_notify(void *ctx, uint32_t slot, uint32_t gen, int32_t pid)
{
    (void)pid;
    struct outq *q = ctx;
    q->m[q->n++] = (llm_ipc_msg){ LLM_MSG_EVENTS, LLM_IPC_VERSION, slot, gen };
}

static void flush_notify(struct outq *q)
{
    if (q->n) send(q->fd, q->m, (size_t)q->n * sizeof *q->m, MSG_DONTWAIT | MSG_NOSIGNAL);
    q->n = 0;
}

static int bench_scheduler(const char *name, int batch, int steps)
{
    segment seg;
    strbuf err;
    sb_init(&err);
    if (make_segment(&seg, name, (uint32_t)batch, &err) < 0) {
        fprintf(stderr, "bench-ipc: %s\n", err.data);
        return 1;
    }
    recipe r;
    memset(&r, 0, sizeof r);
    r.name = (char *)"bench";
    r.max_model_len = 65536;
    r.max_tokens = 60000;
    r.kv_cache_memory_bytes = 16ll << 30;
    const runner_ops *ops = &runner_scripted;
    void *runner;
    runner_capacity cap;
    if (ops->load(&runner, &r, &cap, &err) < 0) return 1;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) < 0) return 1;
    struct outq q = { .fd = sv[0] };
    sched_config sc = { .hdr = seg.hdr, .shm_fd = seg.fd, .ops = ops, .runner = runner,
                        .max_num_seqs = batch, .notify = queue_notify, .notify_ctx = &q };
    sched *S = sched_create(&sc);
    llm_ipc_client c;
    char e[256];
    llm_ipc_attach(&c, bench_run_dir, name, 0, e, sizeof e);
    strbuf body;
    sb_init(&body);
    sb_puts(&body, "{\"test_script\":{\"content\":\"");
    for (int i = 0; i < steps + 100; i++) sb_putc(&body, 'x');
    sb_puts(&body, "\"}}");
    llm_ipc_handle *h = calloc((size_t)batch, sizeof *h);
    for (int i = 0; i < batch; i++) {
        llm_ipc_claim(&c, &h[i]);
        llm_ipc_write_request(&c, &h[i], body.data, body.len);
        llm_ipc_submit(&c, &h[i], LLM_KIND_CHAT, body.len);
    }
    sched_scan(S);
    uint64_t *ov = malloc((size_t)steps * sizeof *ov), *total = malloc((size_t)steps * sizeof *total);
    unsigned char buf[4 * LLM_IPC_EVENT_MAX];
    for (int i = 0; i < steps; i++) {
        uint64_t t0 = llm_ipc_now_ns();
        sched_scan(S);
        sched_step(S, &err);
        uint64_t t1 = llm_ipc_now_ns();
        flush_notify(&q);
        uint64_t t2 = llm_ipc_now_ns();
        total[i] = t2 - t0;
        ov[i] = atomic_load(&seg.hdr->counters[LLM_CTR_STEP_OVERHEAD_NS]) + (t2 - t1);
        /* As a worker does: read each ring until empty (which arms its
         * doorbell, so the next step rings every sequence), drain doorbells. */
        for (int k = 0; k < batch; k++)
            while (llm_ipc_read_events(&c, &h[k], buf, sizeof buf) > 0) {}
        llm_ipc_msg m[LLM_IPC_MSGS_PER_PACKET];
        while (recv(sv[1], m, sizeof m, MSG_DONTWAIT) > 0) {}
    }
    double o50, o99, t50, t99;
    percentiles(ov, steps, &o50, &o99);
    percentiles(total, steps, &t50, &t99);
    printf("| scheduler step, batch %d: overhead outside the runner (incl. doorbell send) | %d | %.2f | %.2f |\n",
           batch, steps, o50, o99);
    printf("| scheduler step, batch %d: whole step incl. scan and scripted runner | %d | %.2f | %.2f |\n",
           batch, steps, t50, t99);
    for (int i = 0; i < batch; i++) llm_ipc_release(&c, &h[i]);
    sched_scan(S);
    sched_step(S, &err);
    flush_notify(&q);
    sched_destroy(S);
    ops->unload(runner);
    llm_ipc_detach(&c);
    segment_close(&seg, 1);
    close(sv[0]);
    close(sv[1]);
    free(h);
    free(ov);
    free(total);
    sb_free(&body);
    sb_free(&err);
    return 0;
}

int cmd_bench_ipc(int argc, char **argv)
{
    int iters = 20000;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: llm-engine bench-ipc [--iters N]\n");
            return 2;
        }
    }
    if (iters < 100) iters = 100;
    char name[64];
    snprintf(name, sizeof name, "bench-ipc-%d", (int)getpid());
    signal(SIGPIPE, SIG_IGN);
    printf("| measurement | samples | median µs | p99 µs |\n| --- | ---: | ---: | ---: |\n");
    int rc = bench_round_trip(name, iters);
    int batches[] = { 1, 16, 64, 256 };
    for (int i = 0; i < 4 && !rc; i++) rc = bench_scheduler(name, batches[i], iters / 10 < 2000 ? iters / 10 : 2000);
    return rc;
}
