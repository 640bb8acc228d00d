/* Scheduler: see scheduler.h.
 *
 * Engine-side view of a slot: a sched_req is "active" from the moment its
 * submission is taken until the slot is finished or freed.  Active
 * sequences are on one list (for delivery); waiting ones are also on the
 * FIFO, running ones in running[].  The slot's state word is the truth
 * shared with the owner; every transition here is a CAS on it, so an
 * owner that cancels at the same moment is never overwritten. */
#include "scheduler.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "procfs.h"
#include "req_output.h"

enum phase { PH_NONE, PH_WAITING, PH_RUNNING };

struct sched_req {
    llm_request        pub;
    struct req_out out;
    enum phase     phase;
    bool           prepared;      /* runner->prepare was called: release later */
    bool           cancelled;     /* runner->cancel already called */
    uint32_t       gen;
    int32_t        pid;
    uint64_t       submit_ns;
    char          *req;
    int            act_prev, act_next;    /* active list */
    int            wait_prev, wait_next;  /* FIFO */
};

struct sched {
    sched_config      cfg;
    uint32_t          n;
    struct sched_req *seqs;
    int               act_head;
    int               wait_head, wait_tail, n_waiting;
    int              *running;
    int               n_running;
    int               n_rows;     /* batch rows of the running: their widths */
    int               n_probes;   /* of n_running: probes, in their own seats */
    llm_request         **batch;
    bool              draining;
    char              drain_msg[LLM_IPC_STATE_MSG];
    uint32_t         *fresh;      /* scratch for sched_scan */
};

/* ---- list plumbing ----------------------------------------------------- */

static void act_add(sched *S, int k)
{
    struct sched_req *q = &S->seqs[k];
    q->act_prev = -1;
    q->act_next = S->act_head;
    if (S->act_head >= 0) S->seqs[S->act_head].act_prev = k;
    S->act_head = k;
}

static void act_del(sched *S, int k)
{
    struct sched_req *q = &S->seqs[k];
    if (q->act_prev >= 0) S->seqs[q->act_prev].act_next = q->act_next;
    else S->act_head = q->act_next;
    if (q->act_next >= 0) S->seqs[q->act_next].act_prev = q->act_prev;
}

static void wait_push(sched *S, int k)
{
    struct sched_req *q = &S->seqs[k];
    q->wait_next = -1;
    q->wait_prev = S->wait_tail;
    if (S->wait_tail >= 0) S->seqs[S->wait_tail].wait_next = k;
    else S->wait_head = k;
    S->wait_tail = k;
    S->n_waiting++;
}

static void wait_del(sched *S, int k)
{
    struct sched_req *q = &S->seqs[k];
    if (q->wait_prev >= 0) S->seqs[q->wait_prev].wait_next = q->wait_next;
    else S->wait_head = q->wait_next;
    if (q->wait_next >= 0) S->seqs[q->wait_next].wait_prev = q->wait_prev;
    else S->wait_tail = q->wait_prev;
    S->n_waiting--;
}

static int width(const llm_request *s) { return s->width > 0 ? s->width : 1; }

static bool is_probe(const struct sched_req *q)
{
    return q->pub.kind == LLM_KIND_PROBE;
}

static void running_del(sched *S, int k)
{
    for (int i = 0; i < S->n_running; i++)
        if (S->running[i] == k) {
            S->n_rows -= width(&S->seqs[k].pub);
            if (is_probe(&S->seqs[k])) S->n_probes--;
            memmove(&S->running[i], &S->running[i + 1],
                    (size_t)(S->n_running - i - 1) * sizeof *S->running);
            S->n_running--;
            return;
        }
}

/* ---- slot words -------------------------------------------------------- */

static llm_ipc_slot *slot_of(sched *S, uint32_t k) { return llm_ipc_slot_at(S->cfg.hdr, k); }

static void ctr_add(sched *S, enum llm_ipc_counter c, uint64_t v)
{
    atomic_fetch_add_explicit(&S->cfg.hdr->counters[c], v, memory_order_relaxed);
}

static void ctr_set(sched *S, enum llm_ipc_counter c, uint64_t v)
{
    atomic_store_explicit(&S->cfg.hdr->counters[c], v, memory_order_relaxed);
}

/* Move slot k from word w to FREE, dropping whatever is left in its ring.
 * Only called when the engine owns the slot's end (CANCELLED, or an owner
 * that is gone). */
static bool free_slot(sched *S, uint32_t k, uint64_t w)
{
    llm_ipc_slot *s = slot_of(S, k);
    atomic_store_explicit(&s->tail, atomic_load_explicit(&s->head, memory_order_relaxed),
                          memory_order_relaxed);
    return atomic_compare_exchange_strong_explicit(
        &s->word, &w, LLM_SLOT_WORD(LLM_SLOT_GEN(w), 0, LLM_SLOT_FREE),
        memory_order_acq_rel, memory_order_relaxed);
}

/* ---- sequence end ------------------------------------------------------ */

static void forget(sched *S, int k)
{
    struct sched_req *q = &S->seqs[k];
    if (q->prepared) S->cfg.ops->release(S->cfg.runner, &q->pub);
    if (q->phase == PH_WAITING) wait_del(S, k);
    if (q->phase == PH_RUNNING) running_del(S, k);
    act_del(S, k);
    req_out_free(&q->out);
    free(q->req);
    q->req = NULL;
    q->phase = PH_NONE;
    q->prepared = q->cancelled = false;
}

static void count_end(sched *S, struct sched_req *q)
{
    switch (q->out.finish) {
    case LLM_FINISH_STOP:
    case LLM_FINISH_LENGTH:
    case LLM_FINISH_TOOL_CALLS: ctr_add(S, LLM_CTR_REQUESTS_FINISHED, 1); break;
    case LLM_FINISH_ERROR: ctr_add(S, LLM_CTR_REQUESTS_FAILED, 1); break;
    default: ctr_add(S, LLM_CTR_REQUESTS_CANCELLED, 1); break;
    }
}

/* Ring the owner if it is waiting for a doorbell. */
static void wake(sched *S, int k)
{
    struct sched_req *q = &S->seqs[k];
    q->out.wrote = false;
    if (llm_ipc_ring_wake(q->out.slot))
        S->cfg.notify(S->cfg.notify_ctx, (uint32_t)k, q->gen, q->pid);
}

/* All events including finish are in the ring: hand the slot back to its
 * owner (FINISHED), or free it if the owner abandoned it meanwhile. */
static void finalize(sched *S, int k)
{
    struct sched_req *q = &S->seqs[k];
    llm_ipc_slot *s = slot_of(S, k);
    uint64_t w = atomic_load_explicit(&s->word, memory_order_acquire);
    for (;;) {
        uint32_t st = LLM_SLOT_STATE(w);
        if (LLM_SLOT_GEN(w) != q->gen) break;        /* not ours any more */
        if (st == LLM_SLOT_CANCELLED) {
            if (free_slot(S, (uint32_t)k, w)) break;
        } else if (st == LLM_SLOT_SUBMITTED || st == LLM_SLOT_RUNNING) {
            if (atomic_compare_exchange_strong_explicit(
                    &s->word, &w, LLM_SLOT_WORD(q->gen, q->pid, LLM_SLOT_FINISHED),
                    memory_order_acq_rel, memory_order_acquire)) {
                wake(S, k);
                break;
            }
            continue;
        } else {
            break;
        }
        w = atomic_load_explicit(&s->word, memory_order_acquire);
    }
    count_end(S, q);
    forget(S, k);
}

/* The owner is gone or gave up: stop the sequence, free the slot. */
static void abandon(sched *S, int k)
{
    struct sched_req *q = &S->seqs[k];
    if (!q->out.finish) q->out.finish = LLM_FINISH_CANCELLED;
    count_end(S, q);
    forget(S, k);
}

/* Push output into the ring; finish the sequence once all of it is there. */
static void deliver(sched *S, int k)
{
    struct sched_req *q = &S->seqs[k];
    req_out_flush(&q->out);
    if (q->pub.done && !req_out_pending(&q->out)) finalize(S, k);
    else if (q->out.wrote) wake(S, k);
}

static void end_with_error(sched *S, int k, uint32_t status, const char *code,
                           const char *msg)
{
    llm_request *s = &S->seqs[k].pub;
    if (s->done) return;
    req_emit_error(s, status, code, NULL, "%s", msg);
    req_emit_finish(s, LLM_FINISH_ERROR);
}

/* ---- taking submissions ------------------------------------------------ */

static void take(sched *S, uint32_t k, uint64_t w)
{
    llm_ipc_header *h = S->cfg.hdr;
    llm_ipc_slot *s = slot_of(S, k);
    struct sched_req *q = &S->seqs[k];
    memset(&q->pub, 0, sizeof q->pub);
    q->gen = LLM_SLOT_GEN(w);
    q->pid = LLM_SLOT_PID(w);
    q->submit_ns = s->submit_ns;
    req_out_init(&q->out, s, llm_ipc_ring_at(h, k), h->ring_bytes, 2 * (size_t)h->ring_bytes);
    q->pub.slot = k;
    q->pub.kind = (enum llm_ipc_kind)s->kind;
    q->pub.out = &q->out;
    q->phase = PH_WAITING;
    act_add(S, (int)k);
    wait_push(S, (int)k);

    uint64_t len = s->request_len;
    char msg[256];
    if (s->epoch != h->epoch) {
        snprintf(msg, sizeof msg, "slot %u was claimed under engine epoch %016llx, "
                 "this engine is %016llx (engine restarted); resubmit", k,
                 (unsigned long long)s->epoch, (unsigned long long)h->epoch);
        end_with_error(S, (int)k, 503, "engine_restarted", msg);
        return;
    }
    if (!len || len > h->max_request_bytes || s->kind < LLM_KIND_CHAT || s->kind > LLM_KIND_ADMIN) {
        snprintf(msg, sizeof msg, "bad submission: request length %llu (limit %llu), kind %u",
                 (unsigned long long)len, (unsigned long long)h->max_request_bytes, s->kind);
        end_with_error(S, (int)k, 400, "invalid_request", msg);
        return;
    }
    if (S->draining) {
        end_with_error(S, (int)k, 503, "engine_draining", S->drain_msg);
        return;
    }
    /* The engine's own copy: the owner must not be able to change the
     * request under the parser. */
    q->req = malloc(len + 1);
    if (!q->req) {
        end_with_error(S, (int)k, 503, "engine_out_of_memory", "engine out of memory");
        return;
    }
    const char *area = llm_ipc_request_at(h, k);
    memcpy(q->req, area, len);
    q->req[len] = 0;
    q->pub.request = q->req;
    q->pub.request_len = len;
    if (len > LLM_IPC_REQ_RESERVED && S->cfg.shm_fd >= 0) {
        /* Give the pages of a large request back to /dev/shm. */
        uint64_t off = (uint64_t)(area - (const char *)h) + LLM_IPC_REQ_RESERVED;
        fallocate(S->cfg.shm_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off,
                  (off_t)(h->request_stride - LLM_IPC_REQ_RESERVED));
    }
    if (q->pub.kind == LLM_KIND_ADMIN) {
        if (S->cfg.ops->admin) S->cfg.ops->admin(S->cfg.runner, &q->pub);
        if (!q->pub.done)
            end_with_error(S, (int)k, 400, "invalid_request",
                           "this engine has no admin operations");
        return;
    }
    q->prepared = true;   /* from here on the runner gets release() */
    if (S->cfg.ops->prepare(S->cfg.runner, &q->pub) == 0 || q->pub.done) return;
    end_with_error(S, (int)k, 500, "internal_error", "runner refused the request without saying why");
}

static void cancel(sched *S, int k)
{
    struct sched_req *q = &S->seqs[k];
    if (q->cancelled || q->pub.done) return;
    q->cancelled = true;
    if (q->prepared) S->cfg.ops->cancel(S->cfg.runner, &q->pub);
    if (!q->pub.done) req_emit_finish(&q->pub, LLM_FINISH_CANCELLED);
}

void sched_poke(sched *S, uint32_t k)
{
    if (k >= S->n) return;
    llm_ipc_slot *s = slot_of(S, k);
    uint64_t w = atomic_load_explicit(&s->word, memory_order_acquire);
    struct sched_req *q = &S->seqs[k];
    bool tracked = q->phase != PH_NONE;
    if (tracked && LLM_SLOT_GEN(w) != q->gen) {     /* cannot happen: we free slots */
        fprintf(stderr, "llm-engine: slot %u changed generation under a running sequence\n", k);
        abandon(S, (int)k);
        tracked = false;
    }
    switch (LLM_SLOT_STATE(w)) {
    case LLM_SLOT_SUBMITTED:
    case LLM_SLOT_RUNNING:
        if (!tracked) {
            if (LLM_SLOT_STATE(w) == LLM_SLOT_SUBMITTED) take(S, k, w);
        } else if (atomic_load_explicit(&s->cancel_req, memory_order_acquire)) {
            cancel(S, (int)k);
        }
        break;
    case LLM_SLOT_CANCELLED:
        if (tracked) abandon(S, (int)k);
        free_slot(S, k, w);
        break;
    default:
        break;
    }
}

static int by_submit_time(const void *a, const void *b, void *ctx)
{
    sched *S = ctx;
    uint64_t x = slot_of(S, *(const uint32_t *)a)->submit_ns;
    uint64_t y = slot_of(S, *(const uint32_t *)b)->submit_ns;
    return x < y ? -1 : x > y;
}

void sched_scan(sched *S)
{
    uint32_t nf = 0;
    for (uint32_t k = 0; k < S->n; k++) {
        llm_ipc_slot *s = slot_of(S, k);
        uint64_t w = atomic_load_explicit(&s->word, memory_order_acquire);
        uint32_t st = LLM_SLOT_STATE(w);
        bool tracked = S->seqs[k].phase != PH_NONE;
        if (st == LLM_SLOT_SUBMITTED && !tracked) S->fresh[nf++] = k;
        else if (st == LLM_SLOT_CANCELLED
                 || (tracked && !S->seqs[k].cancelled
                     && atomic_load_explicit(&s->cancel_req, memory_order_relaxed)))
            sched_poke(S, k);
    }
    /* Submissions whose doorbell was lost join the queue in submit order. */
    qsort_r(S->fresh, nf, sizeof *S->fresh, by_submit_time, S);
    for (uint32_t i = 0; i < nf; i++) sched_poke(S, S->fresh[i]);
}

void sched_owner_gone(sched *S, int32_t pid)
{
    for (uint32_t k = 0; k < S->n; k++) {
        llm_ipc_slot *s = slot_of(S, k);
        uint64_t w = atomic_load_explicit(&s->word, memory_order_acquire);
        while (LLM_SLOT_STATE(w) != LLM_SLOT_FREE && LLM_SLOT_PID(w) == (pid & 0xffffff)) {
            if (S->seqs[k].phase != PH_NONE && S->seqs[k].gen == LLM_SLOT_GEN(w))
                abandon(S, (int)k);
            if (free_slot(S, k, w)) break;
            w = atomic_load_explicit(&s->word, memory_order_acquire);
        }
    }
}

void sched_reap_dead_owners(sched *S)
{
    int32_t seen[64];
    int nseen = 0;
    for (uint32_t k = 0; k < S->n; k++) {
        uint64_t w = atomic_load_explicit(&slot_of(S, k)->word, memory_order_relaxed);
        if (LLM_SLOT_STATE(w) == LLM_SLOT_FREE) continue;
        int32_t pid = LLM_SLOT_PID(w);
        bool known = false;
        for (int i = 0; i < nseen && !known; i++) known = seen[i] == pid;
        if (known) continue;
        if (nseen < 64) seen[nseen++] = pid;
        if (!pid_alive(pid)) sched_owner_gone(S, pid);
    }
}

void sched_drain(sched *S, const char *why)
{
    S->draining = true;
    snprintf(S->drain_msg, sizeof S->drain_msg, "%s", why);
    for (int k = S->wait_head; k >= 0; k = S->seqs[k].wait_next)
        end_with_error(S, k, 503, "engine_draining", why);
}

void sched_abort_all(sched *S, uint32_t status, const char *code, const char *why)
{
    for (int k = S->act_head; k >= 0; k = S->seqs[k].act_next)
        end_with_error(S, k, status, code, why);
    for (int k = S->act_head, next; k >= 0; k = next) {
        next = S->seqs[k].act_next;
        deliver(S, k);
    }
}

/* ---- stepping ---------------------------------------------------------- */

static void deliver_all(sched *S)
{
    for (int k = S->act_head, next; k >= 0; k = next) {
        next = S->seqs[k].act_next;
        deliver(S, k);
    }
}

/* Admit from the FIFO: user sequences in order while max_num_seqs has
 * room; probes first, into their own seats (LLM_IPC_PROBE_SEATS), wherever
 * they are in the queue. */
static void admit(sched *S, bool probes)
{
    for (int k = S->wait_head, next; k >= 0; k = next) {
        struct sched_req *q = &S->seqs[k];
        next = q->wait_next;
        if (q->pub.done || is_probe(q) != probes) continue;   /* ending (error, cancel) */
        /* n choices take n rows (a runner refuses n > max_num_seqs); a
         * probe takes a seat of its own */
        if (probes ? S->n_probes >= LLM_IPC_PROBE_SEATS
                   : S->n_rows - S->n_probes + width(&q->pub) > S->cfg.max_num_seqs)
            break;
        if (S->cfg.ops->admit && !S->cfg.ops->admit(S->cfg.runner, &q->pub)) {
            if (probes) continue;            /* a probe never holds up another */
            break;
        }
        llm_ipc_slot *s = slot_of(S, (uint32_t)k);
        uint64_t w = LLM_SLOT_WORD(q->gen, q->pid, LLM_SLOT_SUBMITTED);
        if (!atomic_compare_exchange_strong_explicit(
                &s->word, &w, LLM_SLOT_WORD(q->gen, q->pid, LLM_SLOT_RUNNING),
                memory_order_acq_rel, memory_order_acquire)) {
            sched_poke(S, (uint32_t)k);      /* abandoned meanwhile */
            continue;
        }
        wait_del(S, k);
        q->phase = PH_RUNNING;
        S->running[S->n_running++] = k;
        S->n_rows += width(&q->pub);
        if (probes) S->n_probes++;
        ctr_add(S, LLM_CTR_TOKENS_IN, (uint64_t)q->pub.prompt_tokens);
    }
}

/* The admission numbers (LLM_CTR_SEQS_FREE, _KV_BLOCKS_FREE), counting a
 * sequence that has emitted its finish as gone: called before output is
 * delivered, so an owner that reads a finish finds the seat free. */
static void publish_capacity(sched *S)
{
    int busy = 0;
    for (int k = S->act_head; k >= 0; k = S->seqs[k].act_next) {
        const struct sched_req *q = &S->seqs[k];
        if (!q->pub.done && !is_probe(q)) busy += width(&q->pub);
    }
    ctr_set(S, LLM_CTR_SEQS_FREE,
            busy < S->cfg.max_num_seqs ? (uint64_t)(S->cfg.max_num_seqs - busy) : 0);
    if (S->cfg.ops->stats) {
        runner_stats st = { 0 };
        S->cfg.ops->stats(S->cfg.runner, &st);
        ctr_set(S, LLM_CTR_KV_BLOCKS_USED, (uint64_t)st.kv_blocks_used);
        ctr_set(S, LLM_CTR_KV_BLOCKS_FREE, (uint64_t)st.kv_blocks_free);
        ctr_set(S, LLM_CTR_PREFIX_CACHE_HITS, (uint64_t)st.prefix_cache_hits);
        ctr_set(S, LLM_CTR_PREFIX_CACHE_QUERIES, (uint64_t)st.prefix_cache_queries);
        ctr_set(S, LLM_CTR_PREFIX_CACHE_QUERY_TOKENS, (uint64_t)st.prefix_cache_query_tokens);
        ctr_set(S, LLM_CTR_PREFIX_CACHE_HIT_QUERIES, (uint64_t)st.prefix_cache_hit_queries);
        ctr_set(S, LLM_CTR_PREFIX_CACHE_BLOCKS, (uint64_t)st.prefix_cache_blocks);
        ctr_set(S, LLM_CTR_PREFIX_CACHE_HOST_BYTES, (uint64_t)st.prefix_cache_host_bytes);
        ctr_set(S, LLM_CTR_PREFIX_CACHE_HOST_COPIES, (uint64_t)st.prefix_cache_host_copies);
    }
}

int sched_step(sched *S, strbuf *err)
{
    uint64_t t0 = llm_ipc_now_ns(), runner_ns = 0;
    publish_capacity(S);
    deliver_all(S);
    if (S->cfg.ops->poll) S->cfg.ops->poll(S->cfg.runner);
    admit(S, true);
    admit(S, false);
    int n = 0;
    for (int i = 0; i < S->n_running; i++) {
        struct sched_req *q = &S->seqs[S->running[i]];
        if (!q->pub.done && !req_out_paused(&q->out)) S->batch[n++] = &q->pub;
    }
    if (n) {
        uint64_t t1 = llm_ipc_now_ns();
        int tokens = S->cfg.ops->step(S->cfg.runner, S->batch, n, err);
        runner_ns = llm_ipc_now_ns() - t1;
        if (tokens < 0) return -1;
        ctr_add(S, LLM_CTR_TOKENS_OUT, (uint64_t)tokens);
        publish_capacity(S);
        deliver_all(S);
    }

    int runnable = 0, paused = 0;
    for (int i = 0; i < S->n_running; i++) {
        struct sched_req *q = &S->seqs[S->running[i]];
        if (q->pub.done) continue;
        if (req_out_paused(&q->out)) paused++;
        else runnable++;
    }
    ctr_set(S, LLM_CTR_RUNNING, (uint64_t)S->n_running);
    ctr_set(S, LLM_CTR_WAITING, (uint64_t)S->n_waiting);
    ctr_set(S, LLM_CTR_PAUSED, (uint64_t)paused);
    publish_capacity(S);
    if (n) {
        ctr_add(S, LLM_CTR_STEPS, 1);
        ctr_set(S, LLM_CTR_STEP_OVERHEAD_NS, llm_ipc_now_ns() - t0 - runner_ns);
    }
    if (runnable) return STEP_BUSY;
    return S->act_head >= 0 ? STEP_BLOCKED : STEP_IDLE;
}

bool sched_idle(const sched *S)
{
    return S->act_head < 0;
}

/* ---- life -------------------------------------------------------------- */

sched *sched_create(const sched_config *cfg)
{
    sched *S = calloc(1, sizeof *S);
    if (!S) return NULL;
    S->cfg = *cfg;
    S->n = cfg->hdr->n_slots;
    S->seqs = calloc(S->n, sizeof *S->seqs);
    size_t seats = (size_t)cfg->max_num_seqs + LLM_IPC_PROBE_SEATS;
    S->running = calloc(seats, sizeof *S->running);
    S->batch = calloc(seats, sizeof *S->batch);
    S->fresh = calloc(S->n, sizeof *S->fresh);
    if (!S->seqs || !S->running || !S->batch || !S->fresh) {
        sched_destroy(S);
        return NULL;
    }
    S->act_head = S->wait_head = S->wait_tail = -1;
    publish_capacity(S);
    return S;
}

void sched_destroy(sched *S)
{
    if (!S) return;
    while (S->seqs && S->act_head >= 0) forget(S, S->act_head);
    free(S->seqs);
    free(S->running);
    free(S->batch);
    free(S->fresh);
    free(S);
}
