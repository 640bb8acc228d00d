/* One chat-completions call, streaming or not, reduced to what the gates
 * check: content, reasoning, tool calls, finish_reason, usage, timing,
 * and any protocol problem (a malformed chunk, a missing [DONE], an error
 * event, tool-call deltas out of order). */
#ifndef QUALIFY_CHAT_H
#define QUALIFY_CHAT_H

#include <stdbool.h>

#include "qualify.h"
#include "sse.h"

#define CHAT_MAX_CALLS 8

typedef struct {
    strbuf id, name, args;
} chat_tool_call;

typedef struct {
    http_resp http;
    bool      ok;                 /* HTTP 200, well-formed, no error event */
    strbuf    problem;            /* why not ok (or a protocol remark) */
    strbuf    content, reasoning;
    chat_tool_call calls[CHAT_MAX_CALLS];
    int       n_calls;
    char      finish_reason[32];
    long long prompt_tokens, completion_tokens, cached_tokens;   /* -1: absent */
    bool      stream, saw_done;
    int       chunks;
    double    t_start, ttft_s, e2e_s;   /* ttft: first token-bearing delta (stream) */
    sse_parser sse;               /* stream state */
} chat_result;

void chat_result_init(chat_result *r);
void chat_result_free(chat_result *r);

/* POST body to /v1/chat/completions (the body's "stream" decides the
 * mode; pass stream to match).  Fills r; returns 0 when r->ok. */
int chat_send(qctx *q, const char *label, const char *body, size_t len, bool stream,
              chat_result *r);

/* Start a request body {"model":...; the caller adds members and closes
 * it with jw_end. */
void chat_body_begin(qctx *q, jw *w, strbuf *sb);

/* One {"role": role, "content": text} element of an open messages array,
 * and the member "messages": [{"role": "user", "content": text}]. */
void chat_message(jw *w, const char *role, const char *text);
void chat_user_message(jw *w, const char *text);

#endif
