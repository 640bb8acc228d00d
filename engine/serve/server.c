/* The engine daemon: see server.h.
 *
 * One thread runs everything that touches sequences: poll() on the
 * signalfd, the listening socket and every worker connection, then one
 * scheduler step.  A second thread only refreshes the heartbeat, so a
 * long step does not make a live engine look dead; the loop itself stamps
 * header.progress_ns every time it comes round, so a wedged step shows
 * (nginx calls the engine stalled past llm_health stall=). */
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "recipe.h"
#include "runner.h"
#include "scheduler.h"
#include "segment.h"

#define MAX_CONNS        1024
#define REAP_INTERVAL_NS 100000000ull   /* look for dead owners every 100 ms */

struct conn {
    int          fd;
    int32_t      pid;            /* from SO_PEERCRED */
    llm_ipc_msg *pending;        /* doorbells the socket had no room for */
    int          n_pending;
    bool         closing;
};

typedef struct {
    const char      *name;
    segment          seg;
    sched           *S;
    int              listen_fd;
    char             sock_path[108];
    struct conn      conns[MAX_CONNS];
    int              n_conns;
    int              pending_max;
    bool             draining;
    pthread_t        heartbeat;
    atomic_bool      heartbeat_stop;
} server;

static void logf_(server *sv, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_(server *sv, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "llm-engine[%s]: ", sv->name);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* ---- heartbeat --------------------------------------------------------- */

static void *heartbeat_main(void *arg)
{
    server *sv = arg;
    struct timespec period = { 0, LLM_IPC_HEARTBEAT_MS * 1000000L };
    while (!atomic_load(&sv->heartbeat_stop)) {
        atomic_store_explicit(&sv->seg.hdr->heartbeat_ns, llm_ipc_now_ns(), memory_order_relaxed);
        nanosleep(&period, NULL);
    }
    return NULL;
}

/* ---- connections ------------------------------------------------------- */

/* Queue a message; conn_flush sends the queue as packets at the end of
 * the loop iteration, so a worker gets one packet per step however many
 * of its slots have events.  A worker that leaves pending_max messages
 * unread is hung and loses its connection. */
static void conn_send(server *sv, struct conn *c, const llm_ipc_msg *m)
{
    if (c->closing) return;
    if (c->n_pending == sv->pending_max) {
        logf_(sv, "worker pid %d does not read its doorbell; dropping its connection", c->pid);
        c->closing = true;
        return;
    }
    c->pending[c->n_pending++] = *m;
}

static void conn_flush(struct conn *c)
{
    int i = 0;
    while (i < c->n_pending && !c->closing) {
        int k = c->n_pending - i;
        if (k > LLM_IPC_MSGS_PER_PACKET) k = LLM_IPC_MSGS_PER_PACKET;
        ssize_t r = send(c->fd, c->pending + i, (size_t)k * sizeof *c->pending,
                         MSG_DONTWAIT | MSG_NOSIGNAL);
        if (r < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) c->closing = true;
            break;
        }
        i += k;
    }
    memmove(c->pending, c->pending + i, (size_t)(c->n_pending - i) * sizeof *c->pending);
    c->n_pending -= i;
}

static void broadcast_state(server *sv, enum llm_ipc_state st)
{
    llm_ipc_msg m = { LLM_MSG_STATE, LLM_IPC_VERSION, (uint32_t)st, sv->seg.hdr->epoch };
    for (int i = 0; i < sv->n_conns; i++) conn_send(sv, &sv->conns[i], &m);
}

/* The scheduler's doorbell: the owner's most recent connection. */
static void notify(void *ctx, uint32_t slot, uint32_t gen, int32_t pid)
{
    server *sv = ctx;
    for (int i = sv->n_conns - 1; i >= 0; i--) {
        if ((sv->conns[i].pid & 0xffffff) != pid) continue;
        llm_ipc_msg m = { LLM_MSG_EVENTS, LLM_IPC_VERSION, slot, gen };
        conn_send(sv, &sv->conns[i], &m);
        return;
    }
}

static void accept_all(server *sv)
{
    for (;;) {
        int fd = accept4(sv->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        struct ucred cr;
        socklen_t len = sizeof cr;
        if (sv->n_conns == MAX_CONNS || getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0) {
            close(fd);
            continue;
        }
        struct conn *c = &sv->conns[sv->n_conns];
        c->pending = malloc((size_t)sv->pending_max * sizeof *c->pending);
        if (!c->pending) {
            close(fd);
            continue;
        }
        c->fd = fd;
        c->pid = cr.pid;
        c->n_pending = 0;
        c->closing = false;
        sv->n_conns++;
        llm_ipc_msg m = { LLM_MSG_WELCOME, LLM_IPC_VERSION, 0, sv->seg.hdr->epoch };
        conn_send(sv, c, &m);
        atomic_store(&sv->seg.hdr->counters[LLM_CTR_CONNECTIONS], (uint64_t)sv->n_conns);
    }
}

/* One worker message; -1 when the connection must close. */
static int handle_msg(server *sv, struct conn *c, const llm_ipc_msg *m)
{
    switch (m->type) {
    case LLM_MSG_HELLO:
        if (m->version != LLM_IPC_VERSION) {
            logf_(sv, "worker pid %d speaks protocol %u, engine %u; closing", c->pid,
                  m->version, LLM_IPC_VERSION);
            c->closing = true;
            return -1;
        }
        break;
    case LLM_MSG_SUBMIT:
    case LLM_MSG_CANCEL:
        sched_poke(sv->S, m->slot);
        break;
    default:
        break;
    }
    return 0;
}

static void read_conn(server *sv, struct conn *c)
{
    static llm_ipc_msg in[LLM_IPC_MSGS_PER_PACKET];
    for (;;) {
        ssize_t r = recv(c->fd, in, sizeof in, MSG_DONTWAIT);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (r <= 0) {
            c->closing = true;
            return;
        }
        for (size_t i = 0; i < (size_t)r / sizeof *in; i++)
            if (handle_msg(sv, c, &in[i]) < 0) return;
    }
}

/* Drop closed connections; an owner left with none forfeits its slots. */
static void reap_conns(server *sv)
{
    for (int i = 0; i < sv->n_conns;) {
        struct conn *c = &sv->conns[i];
        if (!c->closing) {
            i++;
            continue;
        }
        int32_t pid = c->pid;
        close(c->fd);
        free(c->pending);
        sv->conns[i] = sv->conns[--sv->n_conns];
        bool other = false;
        for (int j = 0; j < sv->n_conns && !other; j++) other = sv->conns[j].pid == pid;
        if (!other) sched_owner_gone(sv->S, pid);
    }
    atomic_store(&sv->seg.hdr->counters[LLM_CTR_CONNECTIONS], (uint64_t)sv->n_conns);
}

/* ---- setup ------------------------------------------------------------- */

static int mkdir_p(const char *dir)
{
    char p[4096];
    snprintf(p, sizeof p, "%s", dir);
    for (char *s = p + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        if (mkdir(p, 0755) < 0 && errno != EEXIST) return -1;
        *s = '/';
    }
    return mkdir(p, 0755) < 0 && errno != EEXIST ? -1 : 0;
}

static int open_socket(server *sv, const char *run_dir, strbuf *err)
{
    int n = snprintf(sv->sock_path, sizeof sv->sock_path, "%s/%s.sock", run_dir, sv->name);
    if (n < 0 || (size_t)n >= sizeof sv->sock_path) {
        sb_printf(err, "socket path %s/%s.sock is too long", run_dir, sv->name);
        return -1;
    }
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        sb_printf(err, "socket: %s", strerror(errno));
        return -1;
    }
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    memcpy(a.sun_path, sv->sock_path, strlen(sv->sock_path));
    unlink(sv->sock_path);   /* stale: we hold the name's lock */
    if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(fd, 256) < 0) {
        sb_printf(err, "cannot listen on %s: %s", sv->sock_path, strerror(errno));
        close(fd);
        return -1;
    }
    chmod(sv->sock_path, 0660);
    sv->listen_fd = fd;
    return 0;
}

/* One engine per name and run_dir: an flock held for the process's life. */
static int take_lock(const char *run_dir, const char *name, strbuf *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.lock", run_dir, name);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0660);
    if (fd < 0) {
        sb_printf(err, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        sb_printf(err, "another engine named '%s' is running in %s (%s is locked)", name,
                  run_dir, path);
        close(fd);
        return -1;
    }
    return fd;
}

static void print_capacity(server *sv, const recipe *r, const runner_capacity *cap)
{
    double gib = (double)cap->kv_capacity_bytes / (1024.0 * 1024.0 * 1024.0);
    logf_(sv, "KV cache: %lld tokens in %.2f GiB (kv_cache_dtype %s); maximum concurrency at "
          "max_model_len %d: %.2fx", (long long)cap->kv_capacity_tokens, gib,
          r->kv_cache_dtype == KV_DTYPE_AUTO ? "auto = float32" : kv_cache_dtype_name(r->kv_cache_dtype),
          r->max_model_len,
          (double)cap->kv_capacity_tokens / r->max_model_len);
}

/* ---- the loop ---------------------------------------------------------- */

/* Returns 0 when drained, 1 when the runner failed. */
static int serve_loop(server *sv, int sig_fd, int wake_fd)
{
    struct pollfd *pfd = malloc((MAX_CONNS + 3) * sizeof *pfd);
    if (!pfd) return 1;
    strbuf err;
    sb_init(&err);
    int status = STEP_IDLE, rc = 0;
    uint64_t next_reap = 0;
    for (;;) {
        atomic_store_explicit(&sv->seg.hdr->progress_ns, llm_ipc_now_ns(), memory_order_relaxed);
        pfd[0] = (struct pollfd){ sig_fd, POLLIN, 0 };
        pfd[1] = (struct pollfd){ sv->listen_fd, POLLIN, 0 };
        pfd[2] = (struct pollfd){ wake_fd, POLLIN, 0 };   /* -1: ignored */
        for (int i = 0; i < sv->n_conns; i++)
            pfd[3 + i] = (struct pollfd){ sv->conns[i].fd,
                                          (short)(POLLIN | (sv->conns[i].n_pending ? POLLOUT : 0)), 0 };
        int n_conns = sv->n_conns;
        int timeout = status == STEP_BUSY ? 0 : status == STEP_BLOCKED ? 2 : 50;
        if (poll(pfd, (nfds_t)(3 + n_conns), timeout) < 0 && errno != EINTR) break;
        if (pfd[2].revents & POLLIN) {
            uint64_t v;
            if (read(wake_fd, &v, sizeof v) < 0 && errno != EAGAIN) logf_(sv, "wake fd: %s", strerror(errno));
        }

        if (pfd[0].revents & POLLIN) {
            struct signalfd_siginfo si;
            while (read(sig_fd, &si, sizeof si) == (ssize_t)sizeof si) {
                if (!sv->draining) {
                    char msg[LLM_IPC_STATE_MSG];
                    snprintf(msg, sizeof msg, "engine '%s' is draining (%s): running requests "
                             "finish, new ones go elsewhere", sv->name, strsignal((int)si.ssi_signo));
                    logf_(sv, "%s; signal again to stop now", msg);
                    sv->draining = true;
                    segment_set_state(&sv->seg, LLM_STATE_DRAINING, msg);
                    broadcast_state(sv, LLM_STATE_DRAINING);
                    sched_drain(sv->S, msg);
                } else {
                    logf_(sv, "second %s: stopping now", strsignal((int)si.ssi_signo));
                    sched_abort_all(sv->S, 503, "engine_stopped",
                                    "the engine was stopped before this request finished");
                    goto out;
                }
            }
        }
        for (int i = 0; i < n_conns; i++) {
            struct conn *c = &sv->conns[i];
            if (pfd[3 + i].revents & POLLIN) read_conn(sv, c);
            if (pfd[3 + i].revents & POLLOUT) conn_flush(c);
            if (pfd[3 + i].revents & (POLLHUP | POLLERR)) c->closing = true;
        }
        if (pfd[1].revents & POLLIN) accept_all(sv);

        sched_scan(sv->S);
        uint64_t now = llm_ipc_now_ns();
        if (now >= next_reap) {
            sched_reap_dead_owners(sv->S);
            next_reap = now + REAP_INTERVAL_NS;
        }
        status = sched_step(sv->S, &err);
        atomic_store_explicit(&sv->seg.hdr->progress_ns, llm_ipc_now_ns(), memory_order_relaxed);
        if (status < 0) {
            char msg[LLM_IPC_STATE_MSG];
            snprintf(msg, sizeof msg, "runner failed: %s", err.data ? err.data : "unknown error");
            logf_(sv, "%s", msg);
            sched_abort_all(sv->S, 500, "engine_failed", msg);
            segment_set_state(&sv->seg, LLM_STATE_FAILED, msg);
            broadcast_state(sv, LLM_STATE_FAILED);
            rc = 1;
            break;
        }
        for (int i = 0; i < sv->n_conns; i++)
            if (sv->conns[i].n_pending) conn_flush(&sv->conns[i]);
        reap_conns(sv);
        if (sv->draining && sched_idle(sv->S)) break;
    }
out:
    free(pfd);
    sb_free(&err);
    return rc;
}

static const char *const *served_names(const recipe *r)
{
    return (const char *const *)r->served_model_name;
}

int server_run(const server_opts *o)
{
    recipe r;
    strbuf err;
    sb_init(&err);
    if (recipe_load(&r, o->recipe_path, &err)) {
        fputs(err.data, stderr);
        recipe_free(&r);
        sb_free(&err);
        return 2;
    }
    server *sv = calloc(1, sizeof *sv);
    if (!sv) {
        recipe_free(&r);
        sb_free(&err);
        return 1;
    }
    const char *run_dir = o->run_dir ? o->run_dir : r.run_dir;
    sv->name = o->name ? o->name : r.name;
    sv->listen_fd = -1;
    sv->pending_max = 2 * r.slots;
    int exit_code = 2, lock_fd = -1, sig_fd = -1;
    bool heartbeat = false;
    void *runner = NULL;
    const runner_ops *ops = runner_lookup(o->runner);

    if (mkdir_p(run_dir) < 0) {
        sb_printf(&err, "cannot create run_dir %s: %s", run_dir, strerror(errno));
        goto done;
    }
    if ((lock_fd = take_lock(run_dir, sv->name, &err)) < 0) goto done;
    segment_params sp = {
        .name = sv->name, .run_dir = run_dir,
        .models = served_names(&r), .n_models = r.n_served,
        .n_slots = (uint32_t)r.slots,
        .ring_bytes = r.ring_bytes ? (uint32_t)r.ring_bytes : LLM_IPC_RING_DEFAULT,
        .max_request_bytes = (uint64_t)r.max_request_bytes,
        .max_model_len = (uint32_t)r.max_model_len, .max_num_seqs = (uint32_t)r.max_num_seqs,
        .max_num_batched_tokens = (uint32_t)r.max_num_batched_tokens,
    };
    if (segment_create(&sv->seg, &sp, &err) < 0) goto done;
    if (open_socket(sv, run_dir, &err) < 0) {
        segment_close(&sv->seg, 1);
        goto done;
    }
    /* Signals arrive through a signalfd; block them before any thread starts. */
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    signal(SIGPIPE, SIG_IGN);
    sig_fd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    heartbeat = pthread_create(&sv->heartbeat, NULL, heartbeat_main, sv) == 0;

    exit_code = 1;
    segment_set_state(&sv->seg, LLM_STATE_LOADING, NULL);
    runner_capacity cap;
    memset(&cap, 0, sizeof cap);
    if (!ops) {
        sb_printf(&err, "no '%s' runner in this build", o->runner);
    } else if (ops->load(&runner, &r, &cap, &err) == 0) {
        sched_config sc = {
            .hdr = sv->seg.hdr, .shm_fd = sv->seg.fd, .ops = ops, .runner = runner,
            .max_num_seqs = r.max_num_seqs, .notify = notify, .notify_ctx = sv,
        };
        sv->S = sched_create(&sc);
        if (!sv->S) sb_printf(&err, "out of memory creating the scheduler");
    }
    if (!sv->S) {
        char msg[LLM_IPC_STATE_MSG];
        snprintf(msg, sizeof msg, "load failed: %s", err.data ? err.data : "unknown error");
        sb_reset(&err);
        sb_puts(&err, msg);
        segment_set_state(&sv->seg, LLM_STATE_FAILED, msg);
        goto stop;     /* the FAILED segment stays for nginx and status to read */
    }
    llm_ipc_header *h = sv->seg.hdr;
    atomic_store(&h->counters[LLM_CTR_KV_CAPACITY_TOKENS], (uint64_t)cap.kv_capacity_tokens);
    atomic_store(&h->counters[LLM_CTR_KV_CAPACITY_BYTES], (uint64_t)cap.kv_capacity_bytes);
    atomic_store(&h->counters[LLM_CTR_KV_BLOCKS_TOTAL], (uint64_t)cap.kv_blocks_total);
    snprintf(h->fingerprint, sizeof h->fingerprint, "%s", cap.fingerprint);
    print_capacity(sv, &r, &cap);
    atomic_store(&h->progress_ns, llm_ipc_now_ns());   /* loading was no stall */
    segment_set_state(&sv->seg, LLM_STATE_READY, NULL);
    logf_(sv, "ready: pid %d, epoch %016llx, runner %s, %u slots, socket %s", (int)getpid(),
          (unsigned long long)h->epoch, ops->name, h->n_slots, sv->sock_path);

    exit_code = serve_loop(sv, sig_fd, ops->wake_fd ? ops->wake_fd(runner) : -1);
    if (exit_code == 0) {
        segment_set_state(&sv->seg, LLM_STATE_STOPPED, NULL);
        broadcast_state(sv, LLM_STATE_STOPPED);
        logf_(sv, "drained; stopped");
    }
    sb_reset(&err);
stop:
    for (int i = 0; i < sv->n_conns; i++) {
        conn_flush(&sv->conns[i]);
        close(sv->conns[i].fd);
        free(sv->conns[i].pending);
    }
    close(sv->listen_fd);
    unlink(sv->sock_path);
    sched_destroy(sv->S);
    if (runner) ops->unload(runner);
    if (heartbeat) {
        atomic_store(&sv->heartbeat_stop, true);
        pthread_join(sv->heartbeat, NULL);
    }
    /* A failed engine leaves its segment (state FAILED, reason) behind:
     * the janitor or the next start removes it once this pid is gone. */
    segment_close(&sv->seg, exit_code == 0);
done:
    if (err.len) fprintf(stderr, "llm-engine[%s]: %s\n", sv->name, err.data);
    if (sig_fd >= 0) close(sig_fd);
    if (lock_fd >= 0) close(lock_fd);
    free(sv);
    recipe_free(&r);
    sb_free(&err);
    return exit_code;
}
