/* req_emit_* (runner.h) and the ring/overflow path (req_output.h). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "runner.h"
#include "req_output.h"

void req_out_init(struct req_out *o, llm_ipc_slot *slot, unsigned char *ring,
                  uint32_t ring_bytes, size_t overflow_max)
{
    memset(o, 0, sizeof *o);
    o->slot = slot;
    o->ring = ring;
    o->ring_bytes = ring_bytes;
    o->overflow_max = overflow_max;
    sb_init(&o->overflow);
}

void req_out_free(struct req_out *o)
{
    sb_free(&o->overflow);
}

size_t req_out_pending(const struct req_out *o)
{
    return o->overflow.len - o->overflow_off;
}

void req_out_flush(struct req_out *o)
{
    while (req_out_pending(o)) {
        const char *rec = o->overflow.data + o->overflow_off;
        llm_ev_hdr h;
        memcpy(&h, rec, sizeof h);
        size_t len = sizeof h + h.len;
        if (!llm_ipc_ring_put(o->slot, o->ring, o->ring_bytes, rec, len)) return;
        o->overflow_off += len;
        o->wrote = true;
    }
    sb_reset(&o->overflow);
    o->overflow_off = 0;
}

/* The record's flags: its choice (n > 1), and whether it ends one. */
static void set_flags(void *rec, uint16_t flags)
{
    llm_ev_hdr h;
    memcpy(&h, rec, sizeof h);
    h.flags = flags;
    memcpy(rec, &h, sizeof h);
}

/* One encoded record: into the ring if nothing is queued before it and it
 * fits, else behind the queued ones. */
static void put_flagged(llm_request *s, void *rec, size_t len, uint16_t flags)
{
    struct req_out *o = s->out;
    if (!len) return;   /* an encoder refused its arguments; callers bound them */
    set_flags(rec, flags);
    if (s->done) {
        llm_ev_hdr h;
        memcpy(&h, rec, sizeof h);
        fprintf(stderr, "llm-engine: runner emitted %s after finish on slot %u (dropped)\n",
                llm_ipc_event_name(h.type), s->slot);
        return;
    }
    if (!req_out_pending(o) && llm_ipc_ring_put(o->slot, o->ring, o->ring_bytes, rec, len)) {
        o->wrote = true;
        return;
    }
    sb_append(&o->overflow, rec, len);
}

static void put(llm_request *s, void *rec, size_t len)
{
    put_flagged(s, rec, len, s->choice);
}

/* Longest prefix of at most max bytes that ends on a code point boundary. */
static size_t utf8_cut(const char *t, size_t len, size_t max)
{
    if (len <= max) return len;
    size_t n = max;
    while (n > 0 && ((unsigned char)t[n] & 0xc0) == 0x80) n--;
    return n ? n : max;
}

void req_emit_text(llm_request *s, enum llm_ev_type type, const char *text, size_t len)
{
    unsigned char rec[LLM_IPC_EVENT_MAX];
    while (len) {
        size_t n = utf8_cut(text, len, LLM_IPC_TEXT_MAX);
        put(s, rec, llm_ipc_enc_text(rec, sizeof rec, type, text, n));
        text += n;
        len -= n;
    }
}

void req_emit_tool_begin(llm_request *s, uint32_t index, const char *id, const char *name)
{
    unsigned char rec[LLM_IPC_EVENT_MAX];
    size_t il = utf8_cut(id, strlen(id), LLM_IPC_ID_MAX);
    size_t nl = utf8_cut(name, strlen(name), LLM_IPC_ID_MAX);
    put(s, rec, llm_ipc_enc_tool_begin(rec, sizeof rec, index, id, il, name, nl));
}

void req_emit_tool_args(llm_request *s, uint32_t index, const char *text, size_t len)
{
    unsigned char rec[LLM_IPC_EVENT_MAX];
    while (len) {
        size_t n = utf8_cut(text, len, LLM_IPC_TEXT_MAX);
        put(s, rec, llm_ipc_enc_tool_args(rec, sizeof rec, index, text, n));
        text += n;
        len -= n;
    }
}

void req_emit_tool_end(llm_request *s, uint32_t index)
{
    unsigned char rec[16];
    put(s, rec, llm_ipc_enc_tool_end(rec, sizeof rec, index));
}

void req_emit_tokens(llm_request *s, const uint32_t *ids, size_t n)
{
    unsigned char rec[LLM_IPC_EVENT_MAX];
    do {
        size_t k = n < LLM_IPC_TOKENS_MAX ? n : LLM_IPC_TOKENS_MAX;
        put(s, rec, llm_ipc_enc_tokens(rec, sizeof rec, ids, k));
        ids += k;
        n -= k;
    } while (n);
}

void req_emit_prompt_info(llm_request *s, uint32_t prompt_tokens, uint32_t cached_tokens,
                          uint64_t fingerprint)
{
    unsigned char rec[32];
    put(s, rec, llm_ipc_enc_prompt_info(rec, sizeof rec, prompt_tokens, cached_tokens,
                                        fingerprint));
}

void req_emit_logprob(llm_request *s, uint32_t token_id, float logprob, const char *bytes,
                      size_t bytes_len, uint32_t n_top, const float *top_lp,
                      const char *const *top_bytes, const size_t *top_len)
{
    unsigned char rec[LLM_IPC_EVENT_MAX];
    put(s, rec, llm_ipc_enc_logprob(rec, sizeof rec, token_id, logprob, bytes, bytes_len,
                                    n_top, top_lp, top_bytes, top_len));
}

void req_emit_usage(llm_request *s, const llm_ipc_usage *u)
{
    unsigned char rec[32];
    put(s, rec, llm_ipc_enc_usage(rec, sizeof rec, u));
}

void req_emit_error(llm_request *s, uint32_t status, const char *code, const char *param,
                    const char *fmt, ...)
{
    char msg[LLM_IPC_ERRMSG_MAX + 1];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    unsigned char rec[LLM_IPC_EVENT_MAX];
    char c[LLM_IPC_CODE_MAX + 1], p[LLM_IPC_CODE_MAX + 1];
    snprintf(c, sizeof c, "%s", code ? code : "");
    snprintf(p, sizeof p, "%s", param ? param : "");
    put(s, rec, llm_ipc_enc_error(rec, sizeof rec, status, c, p, msg,
                                  utf8_cut(msg, strlen(msg), LLM_IPC_ERRMSG_MAX)));
}

void req_emit_finish(llm_request *s, enum llm_finish_reason reason)
{
    unsigned char rec[16];
    s->choice = 0;
    put(s, rec, llm_ipc_enc_finish(rec, sizeof rec, reason, s->stop));
    if (!s->done) s->out->finish = (uint32_t)reason;
    s->done = true;
}

void req_emit_choice_finish(llm_request *s, enum llm_finish_reason reason)
{
    unsigned char rec[16];
    put_flagged(s, rec, llm_ipc_enc_finish(rec, sizeof rec, reason, s->stop),
                (uint16_t)(LLM_EV_CHOICE_END | s->choice));
}
