/* Client library: attach, doorbell, slot life cycle.  See llm_ipc_client.h
 * for the contract and README.md for the state machine. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "llm_ipc_client.h"

static int fail(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(char *err, size_t errlen, int rc, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

/* Check a mapped header against this build's protocol and its own size. */
static int check_header(const llm_ipc_header *h, size_t size, char *err, size_t errlen)
{
    if (h->magic == 0)
        return fail(err, errlen, LLM_IPC_ENOTREADY, "engine is starting (header not written yet)");
    if (h->magic != LLM_IPC_MAGIC)
        return fail(err, errlen, LLM_IPC_EPROTO, "not an llm-engine segment (bad magic)");
    if (h->version != LLM_IPC_VERSION || h->header_bytes != sizeof *h)
        return fail(err, errlen, LLM_IPC_EPROTO,
                    "engine speaks protocol version %u (header %u bytes); this client "
                    "speaks %u (%zu bytes)", h->version, h->header_bytes, LLM_IPC_VERSION,
                    sizeof *h);
    uint64_t so, ro, qo, qs;
    uint64_t total = llm_ipc_layout(h->n_slots, h->ring_bytes, h->max_request_bytes,
                                    &so, &ro, &qo, &qs);
    if (!h->n_slots || h->ring_bytes < LLM_IPC_RING_MIN || (h->ring_bytes & (h->ring_bytes - 1))
        || total != h->segment_bytes || h->segment_bytes != size || so != h->slots_off
        || ro != h->rings_off || qo != h->requests_off || qs != h->request_stride)
        return fail(err, errlen, LLM_IPC_EPROTO,
                    "segment layout is inconsistent (size %zu, header says %llu)", size,
                    (unsigned long long)h->segment_bytes);
    return LLM_IPC_OK;
}

int llm_ipc_attach(llm_ipc_client *c, const char *run_dir, const char *name,
                   int readonly, char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    c->shm_fd = c->sock_fd = -1;
    c->readonly = readonly != 0;
    if (!name || !llm_ipc_valid_name(name, strlen(name)))
        return fail(err, errlen, LLM_IPC_EINVAL, "engine name '%s' is not valid",
                    name ? name : "(null)");
    if (!run_dir)
        return fail(err, errlen, LLM_IPC_EINVAL, "no run_dir for engine '%s'", name);
    llm_ipc_shm_name(c->shm_name, run_dir, name);
    int n = snprintf(c->sock_path, sizeof c->sock_path, "%s/%s.sock", run_dir, name);
    if (n < 0 || (size_t)n >= sizeof c->sock_path)
        return fail(err, errlen, LLM_IPC_EINVAL, "socket path %s/%s.sock is too long",
                    run_dir, name);
    int fd = shm_open(c->shm_name, readonly ? O_RDONLY : O_RDWR, 0);
    if (fd < 0)
        return fail(err, errlen, errno == ENOENT ? LLM_IPC_EDEAD : LLM_IPC_ESYS,
                    "cannot open shared memory %s: %s%s", c->shm_name, strerror(errno),
                    errno == ENOENT ? " (engine not running)" : "");
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = errno;
        close(fd);
        return fail(err, errlen, LLM_IPC_ESYS, "fstat %s: %s", c->shm_name, strerror(e));
    }
    if ((size_t)st.st_size < sizeof(llm_ipc_header)) {
        close(fd);
        return fail(err, errlen, LLM_IPC_ENOTREADY, "engine is starting (%s is %lld bytes)",
                    c->shm_name, (long long)st.st_size);
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | (readonly ? 0 : PROT_WRITE),
                   MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        close(fd);
        return fail(err, errlen, LLM_IPC_ESYS, "mmap %s: %s", c->shm_name, strerror(e));
    }
    atomic_thread_fence(memory_order_acquire);
    int rc = check_header(p, (size_t)st.st_size, err, errlen);
    if (rc) {
        munmap(p, (size_t)st.st_size);
        close(fd);
        return rc;
    }
    c->hdr = p;
    c->map_bytes = (size_t)st.st_size;
    c->shm_fd = fd;
    c->epoch = c->hdr->epoch;
    c->pid = (int32_t)getpid();
    return LLM_IPC_OK;
}

void llm_ipc_detach(llm_ipc_client *c)
{
    if (c->sock_fd >= 0) close(c->sock_fd);
    if (c->hdr) munmap(c->hdr, c->map_bytes);
    if (c->shm_fd >= 0) close(c->shm_fd);
    c->hdr = NULL;
    c->sock_fd = c->shm_fd = -1;
}

/* ---- doorbell -------------------------------------------------------- */

static int send_msg(llm_ipc_client *c, uint16_t type, uint32_t slot, uint64_t arg)
{
    if (c->sock_fd < 0) return LLM_IPC_OK;   /* the engine scans slot states too */
    llm_ipc_msg m = { type, LLM_IPC_VERSION, slot, arg };
    if (send(c->sock_fd, &m, sizeof m, MSG_DONTWAIT | MSG_NOSIGNAL) == (ssize_t)sizeof m)
        return LLM_IPC_OK;
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return LLM_IPC_EAGAIN;
    c->dead = 1;
    return LLM_IPC_EDEAD;
}

int llm_ipc_connect(llm_ipc_client *c, char *err, size_t errlen)
{
    if (c->sock_fd >= 0) return c->sock_fd;
    if (!c->hdr || c->readonly || !c->sock_path[0])
        return fail(err, errlen, LLM_IPC_EINVAL, "connect needs a read-write attach with a run_dir");
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return fail(err, errlen, LLM_IPC_ESYS, "socket: %s", strerror(errno));
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    memcpy(a.sun_path, c->sock_path, strlen(c->sock_path));
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        int e = errno;
        close(fd);
        return fail(err, errlen, e == EAGAIN ? LLM_IPC_EAGAIN : LLM_IPC_EDEAD,
                    "connect %s: %s", c->sock_path, strerror(e));
    }
    c->sock_fd = fd;
    int rc = send_msg(c, LLM_MSG_HELLO, 0, (uint64_t)c->pid);
    if (rc < 0) {
        close(fd);
        c->sock_fd = -1;
        return fail(err, errlen, rc, "hello to %s failed: %s", c->sock_path, strerror(errno));
    }
    return fd;
}

int llm_ipc_recv(llm_ipc_client *c, llm_ipc_msg *msgs, int max)
{
    int n = 0;
    if (c->sock_fd < 0) return c->dead ? LLM_IPC_EDEAD : 0;
    while (n < max) {
        if (c->in_off < c->in_n) {
            llm_ipc_msg m = c->in[c->in_off++];
            if (m.type == LLM_MSG_WELCOME) {
                if (m.arg != c->epoch) c->dead = 1;  /* a new engine behind the old socket */
                continue;
            }
            msgs[n++] = m;
            continue;
        }
        if (c->dead) break;
        ssize_t r = recv(c->sock_fd, c->in, sizeof c->in, MSG_DONTWAIT);
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {                 /* EOF or reset: the engine is gone */
            c->dead = 1;
            break;
        }
        c->in_n = (uint32_t)((size_t)r / sizeof(llm_ipc_msg));
        c->in_off = 0;
    }
    return n ? n : c->dead ? LLM_IPC_EDEAD : 0;
}

/* ---- engine status ----------------------------------------------------- */

uint32_t llm_ipc_engine_state(const llm_ipc_client *c)
{
    return atomic_load_explicit(&c->hdr->state, memory_order_acquire);
}

static int64_t age_ms(const _Atomic uint64_t *stamp)
{
    uint64_t t = atomic_load_explicit(stamp, memory_order_relaxed);
    uint64_t now = llm_ipc_now_ns();
    return now > t ? (int64_t)((now - t) / 1000000) : 0;
}

int64_t llm_ipc_heartbeat_age_ms(const llm_ipc_client *c)
{
    return age_ms(&c->hdr->heartbeat_ns);
}

int64_t llm_ipc_progress_age_ms(const llm_ipc_client *c)
{
    return age_ms(&c->hdr->progress_ns);
}

void llm_ipc_counters(const llm_ipc_client *c, uint64_t *out)
{
    for (int i = 0; i < LLM_CTR_N; i++)
        out[i] = atomic_load_explicit(&c->hdr->counters[i], memory_order_relaxed);
}

/* ---- slots ------------------------------------------------------------- */

/* The handle's slot, if it is still this process's claim of that
 * generation in this engine epoch. */
static int owned(const llm_ipc_client *c, const llm_ipc_handle *h, llm_ipc_slot **s,
                 uint64_t *w)
{
    if (!c->hdr || h->epoch != c->epoch) return LLM_IPC_ESTALE;
    if (h->slot >= c->hdr->n_slots) return LLM_IPC_EINVAL;
    *s = llm_ipc_slot_at(c->hdr, h->slot);
    *w = atomic_load_explicit(&(*s)->word, memory_order_acquire);
    if (LLM_SLOT_GEN(*w) != h->gen || LLM_SLOT_PID(*w) != (c->pid & 0xffffff)
        || LLM_SLOT_STATE(*w) == LLM_SLOT_FREE)
        return LLM_IPC_ESTALE;
    return LLM_IPC_OK;
}

int llm_ipc_claim(llm_ipc_client *c, llm_ipc_handle *h)
{
    if (!c->hdr || c->readonly) return LLM_IPC_EINVAL;
    if (c->dead) return LLM_IPC_EDEAD;
    if (llm_ipc_engine_state(c) != LLM_STATE_READY) return LLM_IPC_ENOTREADY;
    uint32_t n = c->hdr->n_slots;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t k = (c->next_slot + i) % n;
        llm_ipc_slot *s = llm_ipc_slot_at(c->hdr, k);
        uint64_t w = atomic_load_explicit(&s->word, memory_order_relaxed);
        if (LLM_SLOT_STATE(w) != LLM_SLOT_FREE) continue;
        uint32_t gen = LLM_SLOT_GEN(w) + 1;
        if (!gen) gen = 1;
        if (!atomic_compare_exchange_strong_explicit(&s->word, &w,
                                                     LLM_SLOT_WORD(gen, c->pid, LLM_SLOT_CLAIMED),
                                                     memory_order_acq_rel, memory_order_relaxed))
            continue;
        /* No producer touches a claimed slot: reset the consumer side. */
        s->epoch = c->epoch;
        s->request_len = 0;
        s->kind = 0;
        atomic_store_explicit(&s->cancel_req, 0, memory_order_relaxed);
        atomic_store_explicit(&s->tail, atomic_load_explicit(&s->head, memory_order_relaxed),
                              memory_order_relaxed);
        atomic_store_explicit(&s->armed, 1, memory_order_relaxed);
        c->next_slot = k + 1;
        h->slot = k;
        h->gen = gen;
        h->epoch = c->epoch;
        return LLM_IPC_OK;
    }
    return LLM_IPC_EFULL;
}

char *llm_ipc_request_area(llm_ipc_client *c, const llm_ipc_handle *h, size_t len, int *rc)
{
    llm_ipc_slot *s;
    uint64_t w;
    *rc = owned(c, h, &s, &w);
    if (*rc) return NULL;
    if (LLM_SLOT_STATE(w) != LLM_SLOT_CLAIMED) {
        *rc = LLM_IPC_EINVAL;
        return NULL;
    }
    if (len > c->hdr->max_request_bytes) {
        *rc = LLM_IPC_ETOOBIG;
        return NULL;
    }
    uint64_t off = c->hdr->requests_off + (uint64_t)h->slot * c->hdr->request_stride;
    /* The engine backs the first LLM_IPC_REQ_RESERVED bytes; reserve the
     * rest now so a full /dev/shm is an error here, not a SIGBUS later. */
    if (len > LLM_IPC_REQ_RESERVED
        && fallocate(c->shm_fd, 0, (off_t)(off + LLM_IPC_REQ_RESERVED),
                     (off_t)(len - LLM_IPC_REQ_RESERVED)) < 0
        && errno != EOPNOTSUPP) {
        *rc = errno == ENOSPC ? LLM_IPC_ENOSPC : LLM_IPC_ESYS;
        return NULL;
    }
    return (char *)c->hdr + off;
}

int llm_ipc_write_request(llm_ipc_client *c, const llm_ipc_handle *h,
                          const void *body, size_t len)
{
    int rc;
    char *p = llm_ipc_request_area(c, h, len, &rc);
    if (!p) return rc;
    memcpy(p, body, len);
    return LLM_IPC_OK;
}

int llm_ipc_submit(llm_ipc_client *c, const llm_ipc_handle *h,
                   enum llm_ipc_kind kind, size_t len)
{
    llm_ipc_slot *s;
    uint64_t w;
    int rc = owned(c, h, &s, &w);
    if (rc) return rc;
    if (LLM_SLOT_STATE(w) != LLM_SLOT_CLAIMED || !len || kind < LLM_KIND_CHAT
        || kind > LLM_KIND_ADMIN)
        return LLM_IPC_EINVAL;
    if (len > c->hdr->max_request_bytes) return LLM_IPC_ETOOBIG;
    if (c->dead) return LLM_IPC_EDEAD;
    s->kind = (uint32_t)kind;
    s->request_len = len;
    s->submit_ns = llm_ipc_now_ns();
    uint64_t nw = LLM_SLOT_WORD(h->gen, c->pid, LLM_SLOT_SUBMITTED);
    if (!atomic_compare_exchange_strong_explicit(&s->word, &w, nw, memory_order_release,
                                                 memory_order_relaxed))
        return LLM_IPC_ESTALE;   /* the engine reclaimed it meanwhile */
    rc = send_msg(c, LLM_MSG_SUBMIT, h->slot, h->gen);
    return rc == LLM_IPC_EDEAD ? rc : LLM_IPC_OK;
}

long llm_ipc_read_events(llm_ipc_client *c, const llm_ipc_handle *h, void *buf, size_t cap)
{
    llm_ipc_slot *s;
    uint64_t w;
    int rc = owned(c, h, &s, &w);
    if (rc) return rc;
    uint32_t st = LLM_SLOT_STATE(w);
    if (st != LLM_SLOT_SUBMITTED && st != LLM_SLOT_RUNNING && st != LLM_SLOT_FINISHED)
        return LLM_IPC_EINVAL;
    long n = llm_ipc_ring_get(s, llm_ipc_ring_at(c->hdr, h->slot), c->hdr->ring_bytes, buf, cap);
    return n < 0 ? LLM_IPC_EPROTO : n;
}

int llm_ipc_cancel(llm_ipc_client *c, const llm_ipc_handle *h)
{
    llm_ipc_slot *s;
    uint64_t w;
    int rc = owned(c, h, &s, &w);
    if (rc) return rc;
    uint32_t st = LLM_SLOT_STATE(w);
    if (st == LLM_SLOT_FINISHED) return LLM_IPC_OK;
    if (st != LLM_SLOT_SUBMITTED && st != LLM_SLOT_RUNNING) return LLM_IPC_EINVAL;
    atomic_store_explicit(&s->cancel_req, 1, memory_order_release);
    rc = send_msg(c, LLM_MSG_CANCEL, h->slot, h->gen);
    return rc == LLM_IPC_EDEAD ? rc : LLM_IPC_OK;
}

int llm_ipc_release(llm_ipc_client *c, const llm_ipc_handle *h)
{
    for (;;) {
        llm_ipc_slot *s;
        uint64_t w, nw;
        int rc = owned(c, h, &s, &w);
        if (rc) return rc;
        switch (LLM_SLOT_STATE(w)) {
        case LLM_SLOT_CLAIMED:
            nw = LLM_SLOT_WORD(h->gen, 0, LLM_SLOT_FREE);
            break;
        case LLM_SLOT_FINISHED:
            /* The engine is done with it: drop unread events and free. */
            atomic_store_explicit(&s->tail, atomic_load_explicit(&s->head, memory_order_acquire),
                                  memory_order_relaxed);
            nw = LLM_SLOT_WORD(h->gen, 0, LLM_SLOT_FREE);
            break;
        case LLM_SLOT_SUBMITTED:
        case LLM_SLOT_RUNNING:
            nw = LLM_SLOT_WORD(h->gen, c->pid, LLM_SLOT_CANCELLED);
            break;
        default:                      /* already CANCELLED: the engine frees it */
            return LLM_IPC_OK;
        }
        if (atomic_compare_exchange_strong_explicit(&s->word, &w, nw, memory_order_acq_rel,
                                                    memory_order_relaxed)) {
            if (LLM_SLOT_STATE(nw) == LLM_SLOT_CANCELLED)
                send_msg(c, LLM_MSG_CANCEL, h->slot, h->gen);
            return LLM_IPC_OK;
        }
        /* The engine moved the slot on (e.g. RUNNING → FINISHED): retry. */
    }
}

int llm_ipc_slot_state(const llm_ipc_client *c, const llm_ipc_handle *h)
{
    llm_ipc_slot *s;
    uint64_t w;
    int rc = owned(c, h, &s, &w);
    return rc ? rc : (int)LLM_SLOT_STATE(w);
}

const char *llm_ipc_strerror(int rc)
{
    switch (rc) {
    case LLM_IPC_OK: return "ok";
    case LLM_IPC_EAGAIN: return "doorbell socket full, try again";
    case LLM_IPC_EFULL: return "no free request slot";
    case LLM_IPC_ESTALE: return "stale handle (engine restarted or slot reclaimed)";
    case LLM_IPC_EDEAD: return "engine gone (doorbell socket closed)";
    case LLM_IPC_EINVAL: return "invalid argument or slot state";
    case LLM_IPC_ETOOBIG: return "request larger than max_request_bytes";
    case LLM_IPC_ENOSPC: return "no shared memory left for the request";
    case LLM_IPC_ENOTREADY: return "engine not ready";
    case LLM_IPC_EPROTO: return "protocol error (corrupt ring or version mismatch)";
    case LLM_IPC_ESYS: return "system call failed";
    default: return "unknown error";
    }
}
