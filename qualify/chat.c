#include "chat.h"

#include <stdio.h>
#include <string.h>

#include "json.h"

void chat_result_init(chat_result *r)
{
    memset(r, 0, sizeof *r);
    http_resp_init(&r->http);
    sb_init(&r->problem);
    sb_init(&r->content);
    sb_init(&r->reasoning);
    for (int i = 0; i < CHAT_MAX_CALLS; i++) {
        sb_init(&r->calls[i].id);
        sb_init(&r->calls[i].name);
        sb_init(&r->calls[i].args);
    }
    r->prompt_tokens = r->completion_tokens = r->cached_tokens = -1;
    r->ttft_s = r->e2e_s = -1;
}

void chat_result_free(chat_result *r)
{
    http_resp_free(&r->http);
    sb_free(&r->problem);
    sb_free(&r->content);
    sb_free(&r->reasoning);
    for (int i = 0; i < CHAT_MAX_CALLS; i++) {
        sb_free(&r->calls[i].id);
        sb_free(&r->calls[i].name);
        sb_free(&r->calls[i].args);
    }
}

void chat_body_begin(qctx *q, jw *w, strbuf *sb)
{
    jw_init(w, sb);
    jw_obj(w, NULL);
    jw_str(w, "model", q->model);
}

void chat_message(jw *w, const char *role, const char *text)
{
    jw_obj(w, NULL);
    jw_str(w, "role", role);
    jw_str(w, "content", text);
    jw_end(w);
}

void chat_user_message(jw *w, const char *text)
{
    jw_arr(w, "messages");
    chat_message(w, "user", text);
    jw_end(w);
}

static void problem(chat_result *r, const char *fmt, const char *arg)
{
    if (r->problem.len) return;   /* the first one says most */
    sb_printf(&r->problem, fmt, arg);
}

static void take_usage(chat_result *r, yajl_val u)
{
    if (!YAJL_IS_OBJECT(u)) return;
    json_int(json_get(u, "prompt_tokens"), &r->prompt_tokens);
    json_int(json_get(u, "completion_tokens"), &r->completion_tokens);
    json_int(json_get(json_get(u, "prompt_tokens_details"), "cached_tokens"), &r->cached_tokens);
}

static void take_finish(chat_result *r, yajl_val choice)
{
    const char *f = json_string(json_get(choice, "finish_reason"));
    if (f) snprintf(r->finish_reason, sizeof r->finish_reason, "%s", f);
}

/* A complete (non-streamed) message's tool_calls. */
static void take_calls(chat_result *r, yajl_val calls)
{
    for (size_t i = 0; YAJL_IS_ARRAY(calls) && i < calls->u.array.len; i++) {
        if (r->n_calls == CHAT_MAX_CALLS) break;
        yajl_val c = calls->u.array.values[i];
        yajl_val fn = json_get(c, "function");
        const char *id = json_string(json_get(c, "id"));
        const char *name = json_string(json_get(fn, "name"));
        const char *args = json_string(json_get(fn, "arguments"));
        chat_tool_call *t = &r->calls[r->n_calls++];
        if (id) sb_puts(&t->id, id);
        if (name) sb_puts(&t->name, name);
        if (args) sb_puts(&t->args, args);
        if (!name || !args) problem(r, "%s", "a tool call lacks function.name or function.arguments");
    }
}

/* Streamed tool-call deltas: id and name in the first delta of a call,
 * argument text in later ones (OPENAI_API.md). */
static void take_call_deltas(chat_result *r, yajl_val calls)
{
    for (size_t i = 0; YAJL_IS_ARRAY(calls) && i < calls->u.array.len; i++) {
        yajl_val c = calls->u.array.values[i];
        long long idx = -1;
        if (!json_int(json_get(c, "index"), &idx) || idx < 0 || idx >= CHAT_MAX_CALLS) {
            problem(r, "%s", "a tool_calls delta without a valid index");
            continue;
        }
        yajl_val fn = json_get(c, "function");
        const char *id = json_string(json_get(c, "id"));
        const char *name = json_string(json_get(fn, "name"));
        const char *args = json_string(json_get(fn, "arguments"));
        if (idx > r->n_calls) problem(r, "%s", "tool call indexes skip a number");
        if (idx == r->n_calls) {
            r->n_calls++;
            if (!id || !name) problem(r, "%s", "the first delta of a tool call lacks its id or name");
        } else if (id || name) {
            problem(r, "%s", "a later delta of a tool call repeats its id or name");
        }
        chat_tool_call *t = &r->calls[idx];
        if (id && !t->id.len) sb_puts(&t->id, id);
        if (name && !t->name.len) sb_puts(&t->name, name);
        if (args) sb_puts(&t->args, args);
    }
}

static int on_event(void *user, const char *event, const char *data, size_t len)
{
    (void)event;
    chat_result *r = user;
    if (len == 6 && !memcmp(data, "[DONE]", 6)) {
        r->saw_done = true;
        return 0;
    }
    if (r->saw_done) problem(r, "%s", "data after [DONE]");
    char err[256];
    yajl_val v = json_parse(data, len, err, sizeof err);
    if (!v) {
        problem(r, "a stream chunk is not JSON: %s", err);
        return 0;
    }
    r->chunks++;
    yajl_val e = json_get(v, "error");
    if (e) {
        const char *msg = json_string(json_get(e, "message"));
        problem(r, "error event in the stream: %s", msg ? msg : "(no message)");
    }
    yajl_val choices = json_get(v, "choices");
    for (size_t i = 0; YAJL_IS_ARRAY(choices) && i < choices->u.array.len; i++) {
        yajl_val ch = choices->u.array.values[i];
        yajl_val d = json_get(ch, "delta");
        const char *c = json_string(json_get(d, "content"));
        const char *rc = json_string(json_get(d, "reasoning_content"));
        yajl_val calls = json_get(d, "tool_calls");
        if ((c && *c) || (rc && *rc) || json_len(calls)) {
            if (r->ttft_s < 0) r->ttft_s = now_s() - r->t_start;
        }
        if (c) sb_puts(&r->content, c);
        if (rc) sb_puts(&r->reasoning, rc);
        take_call_deltas(r, calls);
        take_finish(r, ch);
    }
    take_usage(r, json_get(v, "usage"));
    yajl_tree_free(v);
    return 0;
}

static int on_data(void *user, const char *data, size_t n)
{
    chat_result *r = user;
    return sse_feed(&r->sse, data, n);
}

int chat_send(qctx *q, const char *label, const char *body, size_t len, bool stream,
              chat_result *r)
{
    r->stream = stream;
    r->t_start = now_s();
    if (stream) sse_init(&r->sse, on_event, r);
    q_http(q, label, "POST", "/v1/chat/completions", body, len, false, stream ? on_data : NULL, r,
           &r->http);
    r->e2e_s = now_s() - r->t_start;
    if (stream) {
        if (sse_finish(&r->sse) && r->http.status == 200)
            problem(r, "%s", "the stream ended inside an event (no blank line after it)");
        sse_free(&r->sse);
    }
    if (r->http.status != 200 || r->http.error[0]) {
        sb_reset(&r->problem);
        describe_error(&r->http, &r->problem);
        return -1;
    }
    if (stream) {
        char ct[128] = "";
        http_header(&r->http, "content-type", ct, sizeof ct);
        if (!strstr(ct, "text/event-stream"))
            problem(r, "a stream answered with Content-Type \"%s\"", ct);
        if (!r->saw_done) problem(r, "%s", "the stream ended without data: [DONE]");
        if (!r->chunks) problem(r, "%s", "the stream had no chunks");
    } else {
        char err[256];
        yajl_val v = json_parse(r->http.body.data, r->http.body.len, err, sizeof err);
        yajl_val ch = json_get(v, "choices");
        yajl_val c0 = json_len(ch) ? ch->u.array.values[0] : NULL;
        yajl_val msg = json_get(c0, "message");
        if (!v) {
            problem(r, "the response is not JSON: %s", err);
        } else if (!YAJL_IS_OBJECT(msg)) {
            problem(r, "%s", "the response has no choices[0].message");
        } else {
            const char *c = json_string(json_get(msg, "content"));
            const char *rc = json_string(json_get(msg, "reasoning_content"));
            if (c) sb_puts(&r->content, c);
            if (rc) sb_puts(&r->reasoning, rc);
            take_calls(r, json_get(msg, "tool_calls"));
            take_finish(r, c0);
            take_usage(r, json_get(v, "usage"));
        }
        yajl_tree_free(v);
    }
    if (!r->finish_reason[0]) problem(r, "%s", "no finish_reason");
    if (r->prompt_tokens < 0 || r->completion_tokens < 0) problem(r, "%s", "no usage");
    r->ok = r->problem.len == 0;
    return r->ok ? 0 : -1;
}
