/* engine/ipc unit tests: event encoding, the SPSC ring (wraparound,
 * padding, full ring, wakeups, corruption, a two-thread stress run), and
 * the slot state machine through the client library on an in-process
 * segment (generations, stale handles, limits). */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tap.h"
#include "ipc/llm_ipc_client.h"
#include "segment.h"

/* ---- events ------------------------------------------------------------ */

static void test_events(void)
{
    unsigned char buf[8 * LLM_IPC_EVENT_MAX];
    size_t n = 0;
    llm_ipc_usage u = { 11, 22, 5, 3 };
    uint32_t ids[3] = { 1, 70000, 3 };
    float top_lp[2] = { -0.5f, -1.5f };
    const char *top_b[2] = { "ab", "c" };
    size_t top_len[2] = { 2, 1 };
    n += llm_ipc_enc_text(buf + n, sizeof buf - n, LLM_EV_CONTENT_DELTA, "héllo", 6);
    n = (n + 7) & ~7u;
    n += llm_ipc_enc_tool_begin(buf + n, sizeof buf - n, 2, "call_x", 6, "get_weather", 11);
    n = (n + 7) & ~7u;
    n += llm_ipc_enc_tool_args(buf + n, sizeof buf - n, 2, "{\"a\":1}", 7);
    n = (n + 7) & ~7u;
    n += llm_ipc_enc_tool_end(buf + n, sizeof buf - n, 2);
    n = (n + 7) & ~7u;
    n += llm_ipc_enc_usage(buf + n, sizeof buf - n, &u);
    n = (n + 7) & ~7u;
    n += llm_ipc_enc_error(buf + n, sizeof buf - n, 400, "context_length_exceeded", "messages",
                           "too long", 8);
    n = (n + 7) & ~7u;
    n += llm_ipc_enc_prompt_info(buf + n, sizeof buf - n, 42, 16, 0x0123456789abcdefull);
    n = (n + 7) & ~7u;
    n += llm_ipc_enc_tokens(buf + n, sizeof buf - n, ids, 3);
    n = (n + 7) & ~7u;
    n += llm_ipc_enc_logprob(buf + n, sizeof buf - n, 77, -0.25f, "xy", 2, 2, top_lp, top_b, top_len);
    n = (n + 7) & ~7u;
    n += llm_ipc_enc_finish(buf + n, sizeof buf - n, LLM_FINISH_TOOL_CALLS, 2);
    n = (n + 7) & ~7u;               /* records are read back padded to 8 */

    size_t off = 0;
    llm_ipc_event ev;
    ok(llm_ipc_event_next(buf, n, &off, &ev) == 1 && ev.type == LLM_EV_CONTENT_DELTA
       && ev.text_len == 6 && !memcmp(ev.text, "héllo", 6), "content_delta round trip");
    ok(llm_ipc_event_next(buf, n, &off, &ev) == 1 && ev.type == LLM_EV_TOOL_CALL_BEGIN
       && ev.index == 2 && ev.id_len == 6 && !memcmp(ev.id, "call_x", 6) && ev.name_len == 11
       && !memcmp(ev.name, "get_weather", 11), "tool_call_begin round trip");
    ok(llm_ipc_event_next(buf, n, &off, &ev) == 1 && ev.type == LLM_EV_TOOL_CALL_ARGS
       && ev.index == 2 && ev.text_len == 7 && !memcmp(ev.text, "{\"a\":1}", 7),
       "tool_call_args_delta round trip");
    ok(llm_ipc_event_next(buf, n, &off, &ev) == 1 && ev.type == LLM_EV_TOOL_CALL_END
       && ev.index == 2, "tool_call_end round trip");
    ok(llm_ipc_event_next(buf, n, &off, &ev) == 1 && ev.type == LLM_EV_USAGE
       && ev.usage.prompt_tokens == 11 && ev.usage.completion_tokens == 22
       && ev.usage.reasoning_tokens == 5 && ev.usage.cached_tokens == 3, "usage round trip");
    ok(llm_ipc_event_next(buf, n, &off, &ev) == 1 && ev.type == LLM_EV_ERROR && ev.status == 400
       && ev.code_len == 23 && !memcmp(ev.code, "context_length_exceeded", 23)
       && ev.param_len == 8 && !memcmp(ev.param, "messages", 8) && ev.text_len == 8
       && !memcmp(ev.text, "too long", 8), "error round trip");
    ok(llm_ipc_event_next(buf, n, &off, &ev) == 1 && ev.type == LLM_EV_PROMPT_INFO
       && ev.prompt_tokens == 42 && ev.cached_tokens == 16
       && ev.fingerprint == 0x0123456789abcdefull, "prompt_info round trip");
    ok(llm_ipc_event_next(buf, n, &off, &ev) == 1 && ev.type == LLM_EV_TOKENS && ev.n_items == 3
       && llm_ipc_event_token(&ev, 0) == 1 && llm_ipc_event_token(&ev, 1) == 70000
       && llm_ipc_event_token(&ev, 2) == 3, "tokens round trip");
    int lp_ok = llm_ipc_event_next(buf, n, &off, &ev) == 1 && ev.type == LLM_EV_LOGPROB
                && ev.token_id == 77 && ev.logprob == -0.25f && ev.text_len == 2
                && !memcmp(ev.text, "xy", 2) && ev.n_items == 2;
    size_t pos = 0, len;
    float lp;
    const char *b;
    lp_ok = lp_ok && llm_ipc_event_top(&ev, &pos, &lp, &b, &len) && lp == -0.5f && len == 2
            && !memcmp(b, "ab", 2);
    lp_ok = lp_ok && llm_ipc_event_top(&ev, &pos, &lp, &b, &len) && lp == -1.5f && len == 1
            && *b == 'c';
    lp_ok = lp_ok && !llm_ipc_event_top(&ev, &pos, &lp, &b, &len);
    ok(lp_ok, "logprob round trip with two alternatives");
    ok(llm_ipc_event_next(buf, n, &off, &ev) == 1 && ev.type == LLM_EV_FINISH
       && ev.reason == LLM_FINISH_TOOL_CALLS && ev.stop == 2, "finish round trip");
    is_int(llm_ipc_event_next(buf, n, &off, &ev), 0, "end of buffer");

    /* limits and malformed records */
    static char big[LLM_IPC_TEXT_MAX + 1];
    is_int(llm_ipc_enc_text(buf, sizeof buf, LLM_EV_CONTENT_DELTA, big, sizeof big), 0,
           "text over LLM_IPC_TEXT_MAX is refused");
    is_int(llm_ipc_enc_tool_begin(buf, sizeof buf, 0, big, LLM_IPC_ID_MAX + 1, "f", 1), 0,
           "tool id over LLM_IPC_ID_MAX is refused");
    is_int(llm_ipc_enc_finish(buf, 8, LLM_FINISH_STOP, 0), 0, "encoder respects cap");
    size_t m = llm_ipc_enc_finish(buf, sizeof buf, LLM_FINISH_STOP, 0);
    llm_ev_hdr h;
    memcpy(&h, buf, sizeof h);
    h.len = 3;                       /* finish must carry 4 bytes */
    memcpy(buf, &h, sizeof h);
    off = 0;
    is_int(llm_ipc_event_next(buf, m, &off, &ev), -1, "finish with a short payload is malformed");
    h.type = 200;
    h.len = 4;
    memcpy(buf, &h, sizeof h);
    off = 0;
    is_int(llm_ipc_event_next(buf, m, &off, &ev), -1, "unknown event type is malformed");
    h.type = LLM_EV_CONTENT_DELTA;
    h.len = 5000;
    memcpy(buf, &h, sizeof h);
    off = 0;
    is_int(llm_ipc_event_next(buf, 64, &off, &ev), -1, "record longer than the buffer is malformed");
    m = llm_ipc_enc_tool_begin(buf, sizeof buf, 0, "id", 2, "nm", 2);
    buf[12] = 9;                     /* id_len past the record */
    off = 0;
    is_int(llm_ipc_event_next(buf, m, &off, &ev), -1, "tool_call_begin with bad lengths is malformed");
    is_str(llm_ipc_event_name(LLM_EV_TOOL_CALL_ARGS), "tool_call_args_delta", "event names");
    is_str(llm_ipc_finish_name(LLM_FINISH_CANCELLED), "cancelled", "finish names");
}

/* ---- ring -------------------------------------------------------------- */

#define RING LLM_IPC_RING_MIN

/* Record i: content_delta of (i * 37) % 3000 + 1 bytes, each byte i & 0xff. */
static size_t make_rec(unsigned char *rec, uint32_t i)
{
    static char text[LLM_IPC_TEXT_MAX];
    size_t len = (i * 37u) % 3000u + 1;
    memset(text, (int)(i & 0xff), len);
    memcpy(text, &i, 4 < len ? 4 : len);
    return llm_ipc_enc_text(rec, LLM_IPC_EVENT_MAX, LLM_EV_CONTENT_DELTA, text, len);
}

static int check_rec(const llm_ipc_event *ev, uint32_t i)
{
    size_t len = (i * 37u) % 3000u + 1;
    if (ev->type != LLM_EV_CONTENT_DELTA || ev->text_len != len) return 0;
    uint32_t got = 0;
    memcpy(&got, ev->text, 4 < len ? 4 : len);
    uint32_t want = 0;
    memcpy(&want, &i, 4 < len ? 4 : len);
    if (got != want) return 0;
    for (size_t k = 4; k < len; k++)
        if ((unsigned char)ev->text[k] != (i & 0xff)) return 0;
    return 1;
}

static void test_ring_single_thread(void)
{
    llm_ipc_slot *s = calloc(1, sizeof *s);
    unsigned char *ring = calloc(1, RING);
    unsigned char rec[LLM_IPC_EVENT_MAX], out[3 * LLM_IPC_EVENT_MAX];

    is_int(llm_ipc_ring_get(s, ring, RING, out, sizeof out), 0, "empty ring reads nothing");
    is_int(atomic_load(&s->armed), 1, "an empty read arms the doorbell");

    /* Fill: records go in until the ring refuses, nothing partial. */
    uint32_t put = 0, got = 0;
    size_t len;
    while ((len = make_rec(rec, put)), llm_ipc_ring_put(s, ring, RING, rec, len)) put++;
    ok(put > 5 && atomic_load(&s->head) <= RING, "ring fills to its size (%u records)", put);
    is_int(llm_ipc_ring_wake(s), 1, "producer sees the armed doorbell once");
    is_int(llm_ipc_ring_wake(s), 0, "and only once");

    /* Drain and refill many times, with reads of varying capacity, so the
     * positions wrap around many times and padding appears. */
    int order_ok = 1;
    uint64_t wraps_before = atomic_load(&s->head) / RING;
    for (int round = 0; round < 400; round++) {
        size_t cap = LLM_IPC_EVENT_MAX + (size_t)(round % 3) * LLM_IPC_EVENT_MAX;
        long n = llm_ipc_ring_get(s, ring, RING, out, cap);
        if (n < 0) {
            order_ok = 0;
            break;
        }
        size_t off = 0;
        llm_ipc_event ev;
        int r;
        while ((r = llm_ipc_event_next(out, (size_t)n, &off, &ev)) == 1) {
            if (!check_rec(&ev, got)) order_ok = 0;
            got++;
        }
        if (r < 0) order_ok = 0;     /* a PAD or broken record reached the reader */
        while ((len = make_rec(rec, put)), llm_ipc_ring_put(s, ring, RING, rec, len)) put++;
    }
    long n;
    while ((n = llm_ipc_ring_get(s, ring, RING, out, sizeof out)) > 0) {
        size_t off = 0;
        llm_ipc_event ev;
        while (llm_ipc_event_next(out, (size_t)n, &off, &ev) == 1) {
            if (!check_rec(&ev, got)) order_ok = 0;
            got++;
        }
    }
    ok(order_ok, "every record read back whole and in order (no padding returned)");
    is_int(got, put, "nothing lost: read %u of %u", got, put);
    ok(atomic_load(&s->head) / RING > wraps_before + 50, "positions wrapped %llu times",
       (unsigned long long)(atomic_load(&s->head) / RING));

    /* A reader buffer smaller than a record is refused, not truncated. */
    len = make_rec(rec, 77);          /* 77*37%3000+1 = 2850 bytes */
    llm_ipc_ring_put(s, ring, RING, rec, len);
    is_int(llm_ipc_ring_get(s, ring, RING, out, 100), -1, "buffer below a record size is an error");
    ok(llm_ipc_ring_get(s, ring, RING, out, sizeof out) > 0, "the record is still there after");

    /* Corruption: a header claiming more than was written. */
    llm_ev_hdr bad = { LLM_EV_CONTENT_DELTA, 0, 60000 };
    uint64_t head = atomic_load(&s->head);
    memcpy(ring + (head & (RING - 1)), &bad, sizeof bad);
    atomic_store(&s->head, head + 16);
    is_int(llm_ipc_ring_get(s, ring, RING, out, sizeof out), -1, "corrupt record length detected");
    free(s);
    free(ring);
}

struct stress {
    llm_ipc_slot  *s;
    unsigned char *ring;
    uint32_t       n;
    int            ok;
    uint64_t       wakes;
};

static void *producer(void *arg)
{
    struct stress *t = arg;
    unsigned char rec[LLM_IPC_EVENT_MAX];
    /* The first put waits for the consumer to find the ring empty (and
     * arm the doorbell), so at least one wake is certain however the two
     * threads are scheduled; the later ones depend on it (a loaded host
     * can keep the consumer behind for all 200,000 records). */
    while (!atomic_load(&t->s->armed)) sched_yield();
    for (uint32_t i = 0; i < t->n;) {
        size_t len = make_rec(rec, i);
        if (llm_ipc_ring_put(t->s, t->ring, RING, rec, len)) {
            i++;
            t->wakes += (uint64_t)llm_ipc_ring_wake(t->s);
        }
    }
    return NULL;
}

static void *consumer(void *arg)
{
    struct stress *t = arg;
    unsigned char out[2 * LLM_IPC_EVENT_MAX];
    uint32_t got = 0;
    t->ok = 1;
    while (got < t->n && t->ok) {
        long n = llm_ipc_ring_get(t->s, t->ring, RING, out, sizeof out);
        if (n < 0) t->ok = 0;
        size_t off = 0;
        llm_ipc_event ev;
        while (n > 0 && llm_ipc_event_next(out, (size_t)n, &off, &ev) == 1)
            if (!check_rec(&ev, got++)) t->ok = 0;
    }
    return NULL;
}

static void test_ring_threads(void)
{
    struct stress t = { calloc(1, sizeof(llm_ipc_slot)), calloc(1, RING), 200000, 0, 0 };
    pthread_t a, b;
    pthread_create(&a, NULL, producer, &t);
    pthread_create(&b, NULL, consumer, &t);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    ok(t.ok, "two threads: %u records of 1..3000 bytes arrive whole and in order", t.n);
    ok(t.wakes > 0, "the consumer was woken %llu times (armed when it found the ring empty)",
       (unsigned long long)t.wakes);
    free(t.s);
    free(t.ring);
}

/* ---- slots through the client library ---------------------------------- */

static char shm_name[LLM_IPC_SHM_NAME_MAX];
static void unlink_segment(void) { shm_unlink(shm_name); }

static void test_slots(void)
{
    char name[64];
    snprintf(name, sizeof name, "t-ring-%d", (int)getpid());
    llm_ipc_shm_name(shm_name, "/tmp", name);
    atexit(unlink_segment);
    const char *models[] = { "m" };
    segment_params p = { .name = name, .run_dir = "/tmp", .models = models, .n_models = 1,
                         .n_slots = 4,
                         .ring_bytes = LLM_IPC_RING_MIN, .max_request_bytes = 256 * 1024,
                         .max_model_len = 100, .max_num_seqs = 2, .max_num_batched_tokens = 64 };
    segment seg;
    strbuf err;
    sb_init(&err);
    if (segment_create(&seg, &p, &err) < 0) {
        ok(0, "segment_create: %s", err.data);
        return;
    }
    llm_ipc_client c;
    char e[256];
    is_int(llm_ipc_attach(&c, "/tmp", name, 0, e, sizeof e), 0, "attach to a fresh segment");
    llm_ipc_handle h[5];
    is_int(llm_ipc_claim(&c, &h[0]), LLM_IPC_ENOTREADY, "no claims before READY");
    segment_set_state(&seg, LLM_STATE_READY, NULL);
    int all = 1;
    for (int i = 0; i < 4; i++) all &= llm_ipc_claim(&c, &h[i]) == 0 && h[i].gen == 1;
    ok(all, "four claims get four slots at generation 1");
    is_int(llm_ipc_claim(&c, &h[4]), LLM_IPC_EFULL, "a fifth claim finds no free slot");
    uint64_t w = atomic_load(&llm_ipc_slot_at(c.hdr, h[0].slot)->word);
    ok(LLM_SLOT_PID(w) == getpid() && LLM_SLOT_STATE(w) == LLM_SLOT_CLAIMED,
       "the state word records owner pid and CLAIMED");
    is_int(llm_ipc_release(&c, &h[1]), 0, "release a claimed slot");
    is_int(llm_ipc_claim(&c, &h[4]), 0, "claim again");
    ok(h[4].slot == h[1].slot && h[4].gen == 2, "same slot, generation 2");
    is_int(llm_ipc_slot_state(&c, &h[1]), LLM_IPC_ESTALE, "the old handle is stale");
    is_int(llm_ipc_release(&c, &h[1]), LLM_IPC_ESTALE, "release with the old handle: stale");
    is_int(llm_ipc_write_request(&c, &h[1], "{}", 2), LLM_IPC_ESTALE, "write with the old handle: stale");

    is_int(llm_ipc_write_request(&c, &h[0], "x", 256 * 1024 + 1), LLM_IPC_ETOOBIG,
           "request over max_request_bytes refused");
    static char big[200 * 1024];
    memset(big, 'a', sizeof big);
    is_int(llm_ipc_write_request(&c, &h[0], big, sizeof big), 0,
           "request beyond the reserved prefix gets its pages reserved");
    is_int(llm_ipc_submit(&c, &h[0], (enum llm_ipc_kind)99, 10), LLM_IPC_EINVAL, "bad kind refused");
    is_int(llm_ipc_submit(&c, &h[0], LLM_KIND_CHAT, sizeof big), 0, "submit");
    is_int(llm_ipc_slot_state(&c, &h[0]), LLM_SLOT_SUBMITTED, "slot is SUBMITTED");
    is_int(llm_ipc_submit(&c, &h[0], LLM_KIND_CHAT, 2), LLM_IPC_EINVAL, "no second submit");
    is_int(llm_ipc_cancel(&c, &h[0]), 0, "cancel request");
    is_int(atomic_load(&llm_ipc_slot_at(c.hdr, h[0].slot)->cancel_req), 1, "cancel_req set");
    is_int(llm_ipc_release(&c, &h[0]), 0, "release a submitted slot");
    is_int(llm_ipc_slot_state(&c, &h[0]), LLM_SLOT_CANCELLED, "abandoned: CANCELLED for the engine to free");

    /* An engine restart: same name, new segment, new epoch. */
    llm_ipc_handle old = h[2];
    segment_close(&seg, 1);
    if (segment_create(&seg, &p, &err) < 0) {
        ok(0, "segment_create again: %s", err.data);
        return;
    }
    segment_set_state(&seg, LLM_STATE_READY, NULL);
    llm_ipc_client c2;
    is_int(llm_ipc_attach(&c2, "/tmp", name, 0, e, sizeof e), 0, "attach to the restarted engine");
    ok(c2.epoch != c.epoch, "new epoch %016llx vs %016llx", (unsigned long long)c2.epoch,
       (unsigned long long)c.epoch);
    is_int(llm_ipc_slot_state(&c2, &old), LLM_IPC_ESTALE, "a handle from the old epoch is stale");
    is_int(llm_ipc_release(&c2, &old), LLM_IPC_ESTALE, "and cannot release a new slot");
    llm_ipc_detach(&c);
    llm_ipc_detach(&c2);

    /* Version mismatch is refused with a reason. */
    seg.hdr->version = 99;
    int rc = llm_ipc_attach(&c, "/tmp", name, 1, e, sizeof e);
    ok(rc == LLM_IPC_EPROTO && strstr(e, "version 99"), "other protocol version refused: %s", e);
    segment_close(&seg, 1);
    rc = llm_ipc_attach(&c, "/tmp", name, 1, e, sizeof e);
    ok(rc == LLM_IPC_EDEAD && strstr(e, "not running"), "absent engine: %s", e);
    ok(llm_ipc_attach(&c, "/tmp", "../etc", 1, e, sizeof e) == LLM_IPC_EINVAL, "bad name refused");
    sb_free(&err);
}

int main(void)
{
    test_events();
    test_ring_single_thread();
    test_ring_threads();
    test_slots();
    return exit_status();
}
