/* Event records: encoders (engine) and the decoder (clients).  Layouts are
 * listed with enum llm_ev_type in llm_ipc.h; integers are native-endian
 * and read with memcpy, so records need no alignment inside a buffer. */
#include <string.h>

#include "llm_ipc.h"

#define HDR sizeof(llm_ev_hdr)

/* Start a record: returns the payload pointer or NULL when it won't fit. */
static unsigned char *rec_begin(void *buf, size_t cap, enum llm_ev_type type, size_t len)
{
    if (HDR + len > cap || HDR + len > LLM_IPC_EVENT_MAX) return NULL;
    llm_ev_hdr h = { (uint16_t)type, 0, (uint32_t)len };
    memcpy(buf, &h, HDR);
    return (unsigned char *)buf + HDR;
}

static unsigned char *put(unsigned char *p, const void *src, size_t n)
{
    if (n) memcpy(p, src, n);
    return p + n;
}

static unsigned char *put32(unsigned char *p, uint32_t v) { return put(p, &v, 4); }
static unsigned char *put16(unsigned char *p, uint16_t v) { return put(p, &v, 2); }

size_t llm_ipc_enc_text(void *buf, size_t cap, enum llm_ev_type type,
                        const char *text, size_t len)
{
    if (len > LLM_IPC_TEXT_MAX) return 0;
    unsigned char *p = rec_begin(buf, cap, type, len);
    if (!p) return 0;
    put(p, text, len);
    return HDR + len;
}

size_t llm_ipc_enc_tool_begin(void *buf, size_t cap, uint32_t index,
                              const char *id, size_t id_len,
                              const char *name, size_t name_len)
{
    if (id_len > LLM_IPC_ID_MAX || name_len > LLM_IPC_ID_MAX) return 0;
    size_t len = 8 + id_len + name_len;
    unsigned char *p = rec_begin(buf, cap, LLM_EV_TOOL_CALL_BEGIN, len);
    if (!p) return 0;
    p = put32(p, index);
    p = put16(p, (uint16_t)id_len);
    p = put16(p, (uint16_t)name_len);
    p = put(p, id, id_len);
    put(p, name, name_len);
    return HDR + len;
}

size_t llm_ipc_enc_tool_args(void *buf, size_t cap, uint32_t index,
                             const char *text, size_t len)
{
    if (len > LLM_IPC_TEXT_MAX) return 0;
    unsigned char *p = rec_begin(buf, cap, LLM_EV_TOOL_CALL_ARGS, 4 + len);
    if (!p) return 0;
    put(put32(p, index), text, len);
    return HDR + 4 + len;
}

static size_t enc_u32(void *buf, size_t cap, enum llm_ev_type type, uint32_t v)
{
    unsigned char *p = rec_begin(buf, cap, type, 4);
    if (!p) return 0;
    put32(p, v);
    return HDR + 4;
}

size_t llm_ipc_enc_tool_end(void *buf, size_t cap, uint32_t index)
{
    return enc_u32(buf, cap, LLM_EV_TOOL_CALL_END, index);
}

size_t llm_ipc_enc_finish(void *buf, size_t cap, enum llm_finish_reason reason,
                          uint32_t stop)
{
    unsigned char *p = rec_begin(buf, cap, LLM_EV_FINISH, 8);
    if (!p) return 0;
    put32(put32(p, (uint32_t)reason), stop);
    return HDR + 8;
}

size_t llm_ipc_enc_usage(void *buf, size_t cap, const llm_ipc_usage *u)
{
    unsigned char *p = rec_begin(buf, cap, LLM_EV_USAGE, 16);
    if (!p) return 0;
    p = put32(p, u->prompt_tokens);
    p = put32(p, u->completion_tokens);
    p = put32(p, u->reasoning_tokens);
    put32(p, u->cached_tokens);
    return HDR + 16;
}

size_t llm_ipc_enc_error(void *buf, size_t cap, uint32_t status, const char *code,
                         const char *param, const char *msg, size_t msg_len)
{
    size_t code_len = code ? strlen(code) : 0, param_len = param ? strlen(param) : 0;
    if (code_len > LLM_IPC_CODE_MAX || param_len > LLM_IPC_CODE_MAX) return 0;
    if (msg_len > LLM_IPC_ERRMSG_MAX) msg_len = LLM_IPC_ERRMSG_MAX;
    size_t len = 8 + code_len + param_len + msg_len;
    unsigned char *p = rec_begin(buf, cap, LLM_EV_ERROR, len);
    if (!p) return 0;
    p = put32(p, status);
    p = put16(p, (uint16_t)code_len);
    p = put16(p, (uint16_t)param_len);
    p = put(p, code, code_len);
    p = put(p, param, param_len);
    put(p, msg, msg_len);
    return HDR + len;
}

size_t llm_ipc_enc_prompt_info(void *buf, size_t cap, uint32_t prompt_tokens,
                               uint32_t cached_tokens, uint64_t fingerprint)
{
    unsigned char *p = rec_begin(buf, cap, LLM_EV_PROMPT_INFO, 16);
    if (!p) return 0;
    p = put32(p, prompt_tokens);
    p = put32(p, cached_tokens);
    put(p, &fingerprint, 8);
    return HDR + 16;
}

size_t llm_ipc_enc_tokens(void *buf, size_t cap, const uint32_t *ids, size_t n)
{
    if (n > LLM_IPC_TOKENS_MAX) return 0;
    unsigned char *p = rec_begin(buf, cap, LLM_EV_TOKENS, 4 * n);
    if (!p) return 0;
    put(p, ids, 4 * n);
    return HDR + 4 * n;
}

size_t llm_ipc_enc_logprob(void *buf, size_t cap, uint32_t token_id, float logprob,
                           const char *bytes, size_t bytes_len, uint32_t n_top,
                           const float *top_lp, const char *const *top_bytes,
                           const size_t *top_len)
{
    if (n_top > LLM_IPC_TOP_MAX || bytes_len > LLM_IPC_ID_MAX) return 0;
    size_t len = 12 + bytes_len;
    for (uint32_t i = 0; i < n_top; i++) {
        if (top_len[i] > LLM_IPC_ID_MAX) return 0;
        len += 6 + top_len[i];
    }
    unsigned char *p = rec_begin(buf, cap, LLM_EV_LOGPROB, len);
    if (!p) return 0;
    p = put32(p, token_id);
    p = put(p, &logprob, 4);
    p = put16(p, (uint16_t)bytes_len);
    p = put16(p, (uint16_t)n_top);
    p = put(p, bytes, bytes_len);
    for (uint32_t i = 0; i < n_top; i++) {
        p = put(p, &top_lp[i], 4);
        p = put16(p, (uint16_t)top_len[i]);
        p = put(p, top_bytes[i], top_len[i]);
    }
    return HDR + len;
}

/* ---- decoding -------------------------------------------------------- */

static uint32_t get32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint16_t get16(const unsigned char *p) { uint16_t v; memcpy(&v, p, 2); return v; }

int llm_ipc_event_next(const void *buf, size_t len, size_t *off, llm_ipc_event *ev)
{
    if (*off >= len) return 0;
    if (len - *off < HDR) return -1;
    const unsigned char *r = (const unsigned char *)buf + *off;
    llm_ev_hdr h;
    memcpy(&h, r, HDR);
    size_t size = (HDR + (size_t)h.len + 7) & ~(size_t)7;
    if (h.len > LLM_IPC_EVENT_MAX || size > len - *off) return -1;
    const unsigned char *p = r + HDR;
    size_t n = h.len;
    memset(ev, 0, sizeof *ev);
    ev->type = h.type;
    ev->choice = h.flags & LLM_EV_CHOICE_MASK;
    ev->choice_end = (h.flags & LLM_EV_CHOICE_END) != 0;
    ev->text = ev->id = ev->name = ev->code = ev->param = "";
    switch (h.type) {
    case LLM_EV_REASONING_DELTA:
    case LLM_EV_CONTENT_DELTA:
        ev->text = (const char *)p;
        ev->text_len = n;
        break;
    case LLM_EV_TOOL_CALL_BEGIN:
        if (n < 8) return -1;
        ev->index = get32(p);
        ev->id_len = get16(p + 4);
        ev->name_len = get16(p + 6);
        if (8 + ev->id_len + ev->name_len != n) return -1;
        ev->id = (const char *)p + 8;
        ev->name = ev->id + ev->id_len;
        break;
    case LLM_EV_TOOL_CALL_ARGS:
        if (n < 4) return -1;
        ev->index = get32(p);
        ev->text = (const char *)p + 4;
        ev->text_len = n - 4;
        break;
    case LLM_EV_TOOL_CALL_END:
        if (n != 4) return -1;
        ev->index = get32(p);
        break;
    case LLM_EV_FINISH:
        if (n != 8) return -1;
        ev->reason = get32(p);
        ev->stop = get32(p + 4);
        break;
    case LLM_EV_USAGE:
        if (n != 16) return -1;
        ev->usage.prompt_tokens = get32(p);
        ev->usage.completion_tokens = get32(p + 4);
        ev->usage.reasoning_tokens = get32(p + 8);
        ev->usage.cached_tokens = get32(p + 12);
        break;
    case LLM_EV_ERROR:
        if (n < 8) return -1;
        ev->status = get32(p);
        ev->code_len = get16(p + 4);
        ev->param_len = get16(p + 6);
        if (8 + ev->code_len + ev->param_len > n) return -1;
        ev->code = (const char *)p + 8;
        ev->param = ev->code + ev->code_len;
        ev->text = ev->param + ev->param_len;
        ev->text_len = n - 8 - ev->code_len - ev->param_len;
        break;
    case LLM_EV_PROMPT_INFO:
        if (n != 16) return -1;
        ev->prompt_tokens = get32(p);
        ev->cached_tokens = get32(p + 4);
        memcpy(&ev->fingerprint, p + 8, 8);
        break;
    case LLM_EV_TOKENS:
        if (n % 4) return -1;
        ev->n_items = (uint32_t)(n / 4);
        ev->items = p;
        ev->items_len = n;
        break;
    case LLM_EV_LOGPROB: {
        if (n < 12) return -1;
        ev->token_id = get32(p);
        memcpy(&ev->logprob, p + 4, 4);
        ev->text_len = get16(p + 8);
        ev->n_items = get16(p + 10);
        if (12 + ev->text_len > n) return -1;
        ev->text = (const char *)p + 12;
        ev->items = p + 12 + ev->text_len;
        ev->items_len = n - 12 - ev->text_len;
        /* every entry must lie inside the record */
        size_t pos = 0;
        for (uint32_t i = 0; i < ev->n_items; i++) {
            if (pos + 6 > ev->items_len) return -1;
            pos += 6 + get16(ev->items + pos + 4);
        }
        if (pos != ev->items_len) return -1;
        break;
    }
    default:
        return -1;
    }
    *off += size;
    return 1;
}

uint32_t llm_ipc_event_token(const llm_ipc_event *ev, uint32_t i)
{
    return i < ev->n_items && ev->type == LLM_EV_TOKENS ? get32(ev->items + 4 * i) : 0;
}

int llm_ipc_event_top(const llm_ipc_event *ev, size_t *pos, float *logprob,
                      const char **bytes, size_t *len)
{
    if (ev->type != LLM_EV_LOGPROB || *pos + 6 > ev->items_len) return 0;
    const unsigned char *e = ev->items + *pos;
    memcpy(logprob, e, 4);
    *len = get16(e + 4);
    *bytes = (const char *)e + 6;
    *pos += 6 + *len;
    return 1;
}

/* ---- names ----------------------------------------------------------- */

static const char *name_in(const char *const *names, size_t n, uint32_t i)
{
    return i < n && names[i] ? names[i] : "unknown";
}
#define NAME_IN(tab, i) name_in(tab, sizeof tab / sizeof tab[0], i)

static const char *const event_names[] = {
    "pad", "reasoning_delta", "content_delta", "tool_call_begin", "tool_call_args_delta",
    "tool_call_end", "finish", "usage", "error", "logprob", "prompt_info", "tokens",
};
static const char *const finish_names[] = {
    NULL, "stop", "length", "tool_calls", "cancelled", "error",
};
static const char *const state_names[] = {
    NULL, "starting", "loading", "ready", "draining", "stopped", "failed",
};
static const char *const slot_names[] = {
    "free", "claimed", "submitted", "running", "finished", "cancelled",
};
static const char *const kind_names[] = {
    NULL, "chat", "completions", "responses", "tokenize", "detokenize", "probe", "admin",
};

static const char *const counter_names[] = {
    "running", "waiting", "paused", "tokens_in", "tokens_out", "kv_blocks_used",
    "kv_blocks_total", "kv_capacity_tokens", "kv_capacity_bytes", "prefix_cache_hits",
    "requests_finished", "requests_failed", "requests_cancelled", "steps",
    "step_overhead_ns", "connections", "seqs_free", "kv_blocks_free",
    "prefix_cache_queries", "prefix_cache_query_tokens",
    "prefix_cache_hit_queries", "prefix_cache_blocks", "prefix_cache_host_bytes",
    "prefix_cache_host_copies",
};
_Static_assert(sizeof counter_names / sizeof counter_names[0] == LLM_CTR_N,
               "one name per counter");

const char *llm_ipc_counter_name(uint32_t i) { return NAME_IN(counter_names, i); }
const char *llm_ipc_event_name(uint32_t type) { return NAME_IN(event_names, type); }
const char *llm_ipc_finish_name(uint32_t reason) { return NAME_IN(finish_names, reason); }
const char *llm_ipc_state_name(uint32_t state) { return NAME_IN(state_names, state); }
const char *llm_ipc_slot_state_name(uint32_t state) { return NAME_IN(slot_names, state); }

int llm_ipc_kind_from_name(const char *name)
{
    for (size_t i = 1; i < sizeof kind_names / sizeof kind_names[0]; i++)
        if (!strcmp(name, kind_names[i])) return (int)i;
    return 0;
}
