/*
 * OpenAI response formats from engine events: chat completions, text
 * completions and the Responses API, streamed (SSE) or as one body, plus
 * the tokenize/detokenize answers and the error object.
 *
 * Pure: the functions here append bytes to a buffer and touch nothing else,
 * so one event sequence always gives the same bytes (t/ tests feed them
 * through the scripted engine).  Streaming output is appended per event;
 * the caller decides when to flush (after every batch of events it reads).
 */

#include "ngx_http_llm_module.h"

#include <math.h>


static void ngx_http_llm_fmt_usage(ngx_http_llm_fmt_t *f,
    ngx_http_llm_wbuf_t *out);
static void ngx_http_llm_resp_object(ngx_http_llm_fmt_t *f,
    ngx_http_llm_wbuf_t *out, const char *status, ngx_str_t *code,
    ngx_str_t *message);
static const char *ngx_http_llm_resp_status(ngx_http_llm_fmt_t *f);


static const char *
ngx_http_llm_error_type(ngx_uint_t status)
{
    switch (status) {

    case NGX_HTTP_BAD_REQUEST:
    case NGX_HTTP_NOT_FOUND:
    case NGX_HTTP_NOT_ALLOWED:
    case NGX_HTTP_CONFLICT:
    case NGX_HTTP_REQUEST_ENTITY_TOO_LARGE:
        return "invalid_request_error";

    case NGX_HTTP_UNAUTHORIZED:
        return "authentication_error";

    case NGX_HTTP_FORBIDDEN:
        return "permission_error";

    case NGX_HTTP_TOO_MANY_REQUESTS:
        return "rate_limit_error";

    case NGX_HTTP_SERVICE_UNAVAILABLE:
        return "service_unavailable";

    default:
        return (status < NGX_HTTP_INTERNAL_SERVER_ERROR)
               ? "invalid_request_error" : "server_error";
    }
}


static void
ngx_http_llm_put_or_null(ngx_http_llm_wbuf_t *w, ngx_str_t *s)
{
    if (s == NULL || s->len == 0) {
        ngx_http_llm_puts(w, "null");
        return;
    }

    ngx_http_llm_put_string(w, s->data, s->len);
}


void
ngx_http_llm_error_body(ngx_http_llm_wbuf_t *w, ngx_uint_t status,
    ngx_str_t *message, ngx_str_t *param, ngx_str_t *code)
{
    ngx_http_llm_puts(w, "{\"error\":{\"message\":");
    ngx_http_llm_put_string(w, message->data, message->len);
    ngx_http_llm_printf(w, ",\"type\":\"%s\",\"param\":",
                        ngx_http_llm_error_type(status));
    ngx_http_llm_put_or_null(w, param);
    ngx_http_llm_puts(w, ",\"code\":");
    ngx_http_llm_put_or_null(w, code);
    ngx_http_llm_puts(w, "}}");
}


ngx_int_t
ngx_http_llm_fmt_init(ngx_http_llm_fmt_t *f, ngx_pool_t *pool,
    ngx_http_llm_req_t *req, ngx_str_t *fingerprint, time_t created)
{
    ngx_memzero(f, sizeof(ngx_http_llm_fmt_t));

    f->pool = pool;
    f->req = req;
    f->fingerprint = *fingerprint;
    f->created = created;

    ngx_http_llm_wbuf_init(&f->tokens, pool);
    ngx_http_llm_wbuf_init(&f->lp, pool);
    ngx_http_llm_wbuf_init(&f->lp_values, pool);
    ngx_http_llm_wbuf_init(&f->lp_tops, pool);
    ngx_http_llm_wbuf_init(&f->lp_offsets, pool);

    return ngx_array_init(&f->items, pool, 4, sizeof(ngx_http_llm_item_t));
}


/* n > 1: formatters for choices 1..n-1 beside f (choice 0) */
ngx_int_t
ngx_http_llm_fmt_choices(ngx_http_llm_fmt_t *f, ngx_uint_t n)
{
    ngx_uint_t  i;

    if (n <= 1) {
        return NGX_OK;
    }

    f->more = ngx_palloc(f->pool, (n - 1) * sizeof(ngx_http_llm_fmt_t));
    if (f->more == NULL) {
        return NGX_ERROR;
    }

    for (i = 0; i < n - 1; i++) {
        if (ngx_http_llm_fmt_init(&f->more[i], f->pool, f->req,
                                  &f->fingerprint, f->created)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        f->more[i].choice = i + 1;
        f->more[i].max_model_len = f->max_model_len;
    }

    f->n_more = n - 1;

    return NGX_OK;
}


/* ---- output items ------------------------------------------------------ */

/*
 * Items are kept for bodies and for the Responses API's done events; a
 * streamed chat or text completion needs none of them.
 */
static ngx_uint_t
ngx_http_llm_fmt_keeps(ngx_http_llm_fmt_t *f)
{
    return !f->req->stream || f->req->api == NGX_HTTP_LLM_API_RESPONSES;
}


static ngx_uint_t
ngx_http_llm_item_no(ngx_http_llm_fmt_t *f, ngx_http_llm_item_t *it)
{
    return it - (ngx_http_llm_item_t *) f->items.elts;
}


static void
ngx_http_llm_item_id(ngx_http_llm_fmt_t *f, ngx_http_llm_item_t *it,
    ngx_http_llm_wbuf_t *out)
{
    static const char  *prefix[] = { "", "rs", "msg", "fc" };

    ngx_http_llm_printf(out, "\"%s_%V_%ui\"", prefix[it->kind], &f->req->id,
                        ngx_http_llm_item_no(f, it));
}


/* a whole Responses API output item */
static void
ngx_http_llm_item_json(ngx_http_llm_fmt_t *f, ngx_http_llm_item_t *it,
    ngx_http_llm_wbuf_t *out)
{
    ngx_uint_t  done;

    done = it->done || f->finished;

    ngx_http_llm_puts(out, "{\"id\":");
    ngx_http_llm_item_id(f, it, out);

    switch (it->kind) {

    case NGX_HTTP_LLM_ITEM_REASONING:
        ngx_http_llm_puts(out, ",\"type\":\"reasoning\",\"summary\":[],"
                               "\"content\":[");

        if (done) {
            ngx_http_llm_puts(out, "{\"type\":\"reasoning_text\","
                                   "\"text\":");
            ngx_http_llm_put_string(out, it->text.start,
                                    ngx_http_llm_wbuf_len(&it->text));
            ngx_http_llm_puts(out, "}");
        }

        ngx_http_llm_puts(out, "]");
        break;

    case NGX_HTTP_LLM_ITEM_MESSAGE:
        ngx_http_llm_puts(out, ",\"type\":\"message\",\"role\":\"assistant\","
                               "\"content\":[");

        if (done) {
            ngx_http_llm_puts(out, "{\"type\":\"output_text\",\"text\":");
            ngx_http_llm_put_string(out, it->text.start,
                                    ngx_http_llm_wbuf_len(&it->text));
            ngx_http_llm_puts(out, ",\"annotations\":[],\"logprobs\":[]}");
        }

        ngx_http_llm_puts(out, "]");
        break;

    default: /* NGX_HTTP_LLM_ITEM_TOOL */
        ngx_http_llm_puts(out, ",\"type\":\"function_call\",\"call_id\":");
        ngx_http_llm_put_string(out, it->id.data, it->id.len);
        ngx_http_llm_puts(out, ",\"name\":");
        ngx_http_llm_put_string(out, it->name.data, it->name.len);
        ngx_http_llm_puts(out, ",\"arguments\":");

        if (done) {
            ngx_http_llm_put_string(out, it->text.start,
                                    ngx_http_llm_wbuf_len(&it->text));

        } else {
            ngx_http_llm_puts(out, "\"\"");
        }

        break;
    }

    /* the item the output limit cut short is as incomplete as the reply */
    ngx_http_llm_printf(out, ",\"status\":\"%s\"}",
                        !done ? "in_progress"
                        : (ngx_http_llm_item_no(f, it) + 1 == f->items.nelts)
                          ? ngx_http_llm_resp_status(f) : "completed");
}


/* "event: TYPE\ndata: {"type":"TYPE","sequence_number":N" */
static void
ngx_http_llm_resp_event(ngx_http_llm_fmt_t *f, ngx_http_llm_wbuf_t *out,
    const char *type)
{
    ngx_http_llm_printf(out, "event: %s\ndata: {\"type\":\"%s\","
                        "\"sequence_number\":%ui", type, type, f->seq++);
}


/* an event that carries the whole response object */
static void
ngx_http_llm_resp_state(ngx_http_llm_fmt_t *f, ngx_http_llm_wbuf_t *out,
    const char *type, const char *status, ngx_str_t *code,
    ngx_str_t *message)
{
    ngx_http_llm_resp_event(f, out, type);
    ngx_http_llm_puts(out, ",\"response\":");
    ngx_http_llm_resp_object(f, out, status, code, message);
    ngx_http_llm_puts(out, "}\n\n");
}


/* response.output_item.added or .done: the whole item */
static void
ngx_http_llm_resp_item_event(ngx_http_llm_fmt_t *f, ngx_http_llm_item_t *it,
    ngx_http_llm_wbuf_t *out, const char *type)
{
    ngx_http_llm_resp_event(f, out, type);
    ngx_http_llm_printf(out, ",\"output_index\":%ui,\"item\":",
                        ngx_http_llm_item_no(f, it));
    ngx_http_llm_item_json(f, it, out);
    ngx_http_llm_puts(out, "}\n\n");
}


/* ","item_id":"..","output_index":N[,"content_index":0]" */
static void
ngx_http_llm_resp_where(ngx_http_llm_fmt_t *f, ngx_http_llm_item_t *it,
    ngx_http_llm_wbuf_t *out)
{
    ngx_http_llm_puts(out, ",\"item_id\":");
    ngx_http_llm_item_id(f, it, out);
    ngx_http_llm_printf(out, ",\"output_index\":%ui",
                        ngx_http_llm_item_no(f, it));

    if (it->kind != NGX_HTTP_LLM_ITEM_TOOL) {
        ngx_http_llm_puts(out, ",\"content_index\":0");
    }
}


static void
ngx_http_llm_resp_part(ngx_http_llm_item_t *it, ngx_http_llm_wbuf_t *out,
    ngx_uint_t with_text)
{
    if (it->kind == NGX_HTTP_LLM_ITEM_REASONING) {
        ngx_http_llm_puts(out, ",\"part\":{\"type\":\"reasoning_text\","
                               "\"text\":");
    } else {
        ngx_http_llm_puts(out, ",\"part\":{\"type\":\"output_text\","
                               "\"annotations\":[],\"text\":");
    }

    if (with_text) {
        ngx_http_llm_put_string(out, it->text.start,
                                ngx_http_llm_wbuf_len(&it->text));
    } else {
        ngx_http_llm_puts(out, "\"\"");
    }

    ngx_http_llm_puts(out, "}");
}


static void
ngx_http_llm_resp_item_added(ngx_http_llm_fmt_t *f, ngx_http_llm_item_t *it,
    ngx_http_llm_wbuf_t *out)
{
    ngx_http_llm_resp_item_event(f, it, out, "response.output_item.added");

    if (it->kind == NGX_HTTP_LLM_ITEM_TOOL) {
        return;
    }

    ngx_http_llm_resp_event(f, out, "response.content_part.added");
    ngx_http_llm_resp_where(f, it, out);
    ngx_http_llm_resp_part(it, out, 0);
    ngx_http_llm_puts(out, "}\n\n");
}


static void
ngx_http_llm_resp_item_done(ngx_http_llm_fmt_t *f, ngx_http_llm_item_t *it,
    ngx_http_llm_wbuf_t *out)
{
    switch (it->kind) {

    case NGX_HTTP_LLM_ITEM_REASONING:
        ngx_http_llm_resp_event(f, out, "response.reasoning_text.done");
        ngx_http_llm_resp_where(f, it, out);
        ngx_http_llm_puts(out, ",\"text\":");
        break;

    case NGX_HTTP_LLM_ITEM_MESSAGE:
        ngx_http_llm_resp_event(f, out, "response.output_text.done");
        ngx_http_llm_resp_where(f, it, out);
        ngx_http_llm_puts(out, ",\"logprobs\":[],\"text\":");
        break;

    default: /* NGX_HTTP_LLM_ITEM_TOOL */
        ngx_http_llm_resp_event(f, out,
                                "response.function_call_arguments.done");
        ngx_http_llm_resp_where(f, it, out);
        ngx_http_llm_puts(out, ",\"name\":");
        ngx_http_llm_put_string(out, it->name.data, it->name.len);
        ngx_http_llm_puts(out, ",\"arguments\":");
        break;
    }

    ngx_http_llm_put_string(out, it->text.start,
                            ngx_http_llm_wbuf_len(&it->text));
    ngx_http_llm_puts(out, "}\n\n");

    if (it->kind != NGX_HTTP_LLM_ITEM_TOOL) {
        ngx_http_llm_resp_event(f, out, "response.content_part.done");
        ngx_http_llm_resp_where(f, it, out);
        ngx_http_llm_resp_part(it, out, 1);
        ngx_http_llm_puts(out, "}\n\n");
    }

    ngx_http_llm_resp_item_event(f, it, out, "response.output_item.done");
}


static void
ngx_http_llm_item_close(ngx_http_llm_fmt_t *f, ngx_http_llm_wbuf_t *out)
{
    ngx_http_llm_item_t  *it;

    it = f->open;
    if (it == NULL) {
        return;
    }

    it->done = 1;
    f->open = NULL;

    if (f->req->stream && f->req->api == NGX_HTTP_LLM_API_RESPONSES) {
        ngx_http_llm_resp_item_done(f, it, out);
    }
}


ngx_http_llm_item_t *
ngx_http_llm_item_push(ngx_http_llm_fmt_t *f, ngx_array_t *items,
    ngx_http_llm_item_kind_e kind, ngx_http_llm_event_t *ev)
{
    ngx_http_llm_item_t  *it;

    it = ngx_array_push(items);
    if (it == NULL) {
        f->failed = 1;
        return NULL;
    }

    ngx_memzero(it, sizeof(ngx_http_llm_item_t));
    it->kind = kind;
    ngx_http_llm_wbuf_init(&it->text, f->pool);

    if (kind != NGX_HTTP_LLM_ITEM_TOOL) {
        return it;
    }

    it->index = ev->index;
    it->id.data = ngx_pstrdup(f->pool, &ev->id);
    it->id.len = ev->id.len;
    it->name.data = ngx_pstrdup(f->pool, &ev->name);
    it->name.len = ev->name.len;

    if ((ev->id.len && it->id.data == NULL)
        || (ev->name.len && it->name.data == NULL))
    {
        items->nelts--;     /* no half-made item stays */
        f->failed = 1;
        return NULL;
    }

    return it;
}


/* the item that receives a delta of this kind, opened when needed */
static ngx_http_llm_item_t *
ngx_http_llm_item_open(ngx_http_llm_fmt_t *f, ngx_http_llm_item_kind_e kind,
    ngx_http_llm_event_t *ev, ngx_http_llm_wbuf_t *out)
{
    ngx_http_llm_item_t  *it;

    if (f->open && f->open->kind == kind && kind != NGX_HTTP_LLM_ITEM_TOOL) {
        return f->open;
    }

    ngx_http_llm_item_close(f, out);

    it = ngx_http_llm_item_push(f, &f->items, kind, ev);
    if (it == NULL) {
        return NULL;
    }

    f->open = it;

    if (f->req->stream && f->req->api == NGX_HTTP_LLM_API_RESPONSES) {
        ngx_http_llm_resp_item_added(f, it, out);
    }

    return it;
}


/* ---- log probabilities ------------------------------------------------- */

/* length of the valid UTF-8 sequence at p, or 0 */
static size_t
ngx_http_llm_utf8_len(u_char *p, u_char *end)
{
    size_t      n, i;
    uint32_t    c;

    c = *p;

    if (c < 0x80) {
        return 1;
    }

    n = (c >= 0xf0 && c < 0xf5) ? 4 : (c >= 0xe0) && c < 0xf0 ? 3
        : (c >= 0xc2 && c < 0xe0) ? 2 : 0;

    if (n == 0 || (size_t) (end - p) < n) {
        return 0;
    }

    c &= 0x7f >> n;

    for (i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80) {
            return 0;
        }

        c = (c << 6) | (p[i] & 0x3f);
    }

    if ((n == 3 && (c < 0x800 || (c >= 0xd800 && c < 0xe000)))
        || (n == 4 && (c < 0x10000 || c > 0x10ffff)))
    {
        return 0;
    }

    return n;
}


/*
 * A token as a JSON string.  A token may end inside a character: such
 * bytes become U+FFFD here, and "bytes" carries the exact ones.
 */
static void
ngx_http_llm_put_token(ngx_http_llm_wbuf_t *w, ngx_str_t *t)
{
    size_t   n;
    u_char  *p, *end, *run;

    ngx_http_llm_puts(w, "\"");

    p = t->data;
    end = p + t->len;
    run = p;

    while (p < end) {
        n = ngx_http_llm_utf8_len(p, end);

        if (n) {
            p += n;
            continue;
        }

        if (ngx_http_llm_wbuf_reserve(w, 6 * (p - run) + 6) == NULL) {
            return;
        }

        w->last = (u_char *) ngx_escape_json(w->last, run, p - run);
        ngx_http_llm_puts(w, "\\ufffd");

        run = ++p;
    }

    if (ngx_http_llm_wbuf_reserve(w, 6 * (p - run) + 1) != NULL) {
        w->last = (u_char *) ngx_escape_json(w->last, run, p - run);
    }

    ngx_http_llm_puts(w, "\"");
}


static void
ngx_http_llm_put_logprob(ngx_http_llm_wbuf_t *w, double lp)
{
    /* -inf (an impossible token) as OpenAI writes it */
    if (isnan(lp) || lp < -9999.0) {
        lp = -9999.0;
    }

    ngx_http_llm_printf(w, "%s%.6f", lp < 0 ? "-" : "", fabs(lp));
}


/* {"token","logprob","bytes"} without the closing brace */
static void
ngx_http_llm_put_lp(ngx_http_llm_wbuf_t *w, ngx_str_t *t, double lp)
{
    size_t  i;

    ngx_http_llm_puts(w, "{\"token\":");
    ngx_http_llm_put_token(w, t);
    ngx_http_llm_puts(w, ",\"logprob\":");
    ngx_http_llm_put_logprob(w, lp);
    ngx_http_llm_puts(w, ",\"bytes\":[");

    for (i = 0; i < t->len; i++) {
        ngx_http_llm_printf(w, i ? ",%ui" : "%ui", (ngx_uint_t) t->data[i]);
    }

    ngx_http_llm_puts(w, "]");
}


/* a chat / responses logprob entry */
static void
ngx_http_llm_lp_entry(ngx_http_llm_event_t *ev, ngx_http_llm_wbuf_t *w)
{
    ngx_uint_t  i;

    ngx_http_llm_put_lp(w, &ev->text, ev->logprob);
    ngx_http_llm_puts(w, ",\"top_logprobs\":[");

    for (i = 0; i < ev->ntop; i++) {
        ngx_http_llm_puts(w, i ? "," : "");
        ngx_http_llm_put_lp(w, &ev->top[i].bytes, ev->top[i].logprob);
        ngx_http_llm_puts(w, "}");
    }

    ngx_http_llm_puts(w, "]}");
}


/* the legacy completions shape: four parallel arrays */
static void
ngx_http_llm_lp_legacy(ngx_http_llm_fmt_t *f, ngx_http_llm_event_t *ev,
    ngx_uint_t first)
{
    size_t      i;
    ngx_uint_t  k;

    ngx_http_llm_puts(&f->lp, first ? "" : ",");
    ngx_http_llm_put_token(&f->lp, &ev->text);

    ngx_http_llm_puts(&f->lp_values, first ? "" : ",");
    ngx_http_llm_put_logprob(&f->lp_values, ev->logprob);

    ngx_http_llm_puts(&f->lp_tops, first ? "{" : ",{");

    for (k = 0; k < ev->ntop; k++) {
        ngx_http_llm_puts(&f->lp_tops, k ? "," : "");
        ngx_http_llm_put_token(&f->lp_tops, &ev->top[k].bytes);
        ngx_http_llm_puts(&f->lp_tops, ":");
        ngx_http_llm_put_logprob(&f->lp_tops, ev->top[k].logprob);
    }

    ngx_http_llm_puts(&f->lp_tops, "}");

    ngx_http_llm_printf(&f->lp_offsets, first ? "%uL" : ",%uL",
                        f->text_offset);

    /* characters, not bytes: skip UTF-8 continuation bytes */
    for (i = 0; i < ev->text.len; i++) {
        f->text_offset += (ev->text.data[i] & 0xc0) != 0x80;
    }
}


static void
ngx_http_llm_lp_legacy_json(ngx_http_llm_fmt_t *f, ngx_http_llm_wbuf_t *out)
{
    ngx_http_llm_puts(out, "{\"tokens\":[");
    ngx_http_llm_put(out, f->lp.start, ngx_http_llm_wbuf_len(&f->lp));
    ngx_http_llm_puts(out, "],\"token_logprobs\":[");
    ngx_http_llm_put(out, f->lp_values.start,
                     ngx_http_llm_wbuf_len(&f->lp_values));
    ngx_http_llm_puts(out, "],\"top_logprobs\":[");
    ngx_http_llm_put(out, f->lp_tops.start,
                     ngx_http_llm_wbuf_len(&f->lp_tops));
    ngx_http_llm_puts(out, "],\"text_offset\":[");
    ngx_http_llm_put(out, f->lp_offsets.start,
                     ngx_http_llm_wbuf_len(&f->lp_offsets));
    ngx_http_llm_puts(out, "]}");
}


/* "logprobs" of a choice at the end: all tokens, or null */
static void
ngx_http_llm_fmt_logprobs(ngx_http_llm_fmt_t *f, ngx_http_llm_wbuf_t *out)
{
    if (!f->req->logprobs) {
        ngx_http_llm_puts(out, "null");
        return;
    }

    if (f->req->api == NGX_HTTP_LLM_API_COMPLETIONS) {
        ngx_http_llm_lp_legacy_json(f, out);
        return;
    }

    ngx_http_llm_puts(out, "{\"content\":[");
    ngx_http_llm_put(out, f->lp.start, ngx_http_llm_wbuf_len(&f->lp));
    ngx_http_llm_puts(out, "],\"refusal\":null}");
}


static void ngx_http_llm_chunk_open(ngx_http_llm_fmt_t *f,
    ngx_http_llm_wbuf_t *out);
static void ngx_http_llm_chunk_close(ngx_http_llm_fmt_t *f,
    ngx_http_llm_wbuf_t *out);


static void
ngx_http_llm_fmt_logprob(ngx_http_llm_fmt_t *f, ngx_http_llm_event_t *ev,
    ngx_http_llm_wbuf_t *out)
{
    ngx_uint_t  first;

    if (!f->req->logprobs
        || (f->req->api != NGX_HTTP_LLM_API_CHAT
            && f->req->api != NGX_HTTP_LLM_API_COMPLETIONS))
    {
        return;
    }

    if (f->req->stream) {
        /* a chunk of its own: the token's text went out in its delta */
        f->lp.last = f->lp.start;
        f->lp_values.last = f->lp_values.start;
        f->lp_tops.last = f->lp_tops.start;
        f->lp_offsets.last = f->lp_offsets.start;
    }

    first = (ngx_http_llm_wbuf_len(&f->lp) == 0);

    if (f->req->api == NGX_HTTP_LLM_API_COMPLETIONS) {
        ngx_http_llm_lp_legacy(f, ev, first);

    } else {
        ngx_http_llm_puts(&f->lp, first ? "" : ",");
        ngx_http_llm_lp_entry(ev, &f->lp);
    }

    if (f->lp.failed || f->lp_values.failed || f->lp_tops.failed
        || f->lp_offsets.failed)
    {
        f->failed = 1;
        return;
    }

    if (!f->req->stream) {
        return;
    }

    ngx_http_llm_chunk_open(f, out);

    if (f->req->api == NGX_HTTP_LLM_API_CHAT) {
        ngx_http_llm_printf(out, "{\"index\":%ui,\"delta\":{},"
                            "\"logprobs\":", f->choice);
    } else {
        ngx_http_llm_printf(out, "{\"index\":%ui,\"text\":\"\","
                            "\"logprobs\":", f->choice);
    }

    ngx_http_llm_fmt_logprobs(f, out);
    ngx_http_llm_puts(out, ",\"finish_reason\":null}");
    ngx_http_llm_chunk_close(f, out);
}


/* ---- chat and text completion chunks ----------------------------------- */

/*
 * A chat or text completion object up to its choices: id, object (a chat
 * chunk's differs from its body's), created, model, system_fingerprint.
 */
static void
ngx_http_llm_completion_head(ngx_http_llm_fmt_t *f, ngx_http_llm_wbuf_t *out,
    const char *chat_object)
{
    ngx_http_llm_req_t  *req = f->req;

    if (req->api == NGX_HTTP_LLM_API_CHAT) {
        ngx_http_llm_printf(out, "{\"id\":\"chatcmpl-%V\",\"object\":\"%s\",",
                            &req->id, chat_object);
    } else {
        ngx_http_llm_printf(out, "{\"id\":\"cmpl-%V\",\"object\":"
                            "\"text_completion\",", &req->id);
    }

    ngx_http_llm_printf(out, "\"created\":%T,\"model\":", f->created);
    ngx_http_llm_put_string(out, req->model.data, req->model.len);
    ngx_http_llm_puts(out, ",\"system_fingerprint\":");
    ngx_http_llm_put_or_null(out, &f->fingerprint);
}


static void
ngx_http_llm_chunk_open(ngx_http_llm_fmt_t *f, ngx_http_llm_wbuf_t *out)
{
    ngx_http_llm_puts(out, "data: ");
    ngx_http_llm_completion_head(f, out, "chat.completion.chunk");
    ngx_http_llm_puts(out, ",\"choices\":[");
}


static void
ngx_http_llm_chunk_close(ngx_http_llm_fmt_t *f, ngx_http_llm_wbuf_t *out)
{
    ngx_http_llm_puts(out, "]");

    if (f->req->include_usage) {
        ngx_http_llm_puts(out, ",\"usage\":null");
    }

    ngx_http_llm_puts(out, "}\n\n");
}


/*
 * One chunk with one choice.  For chat, "delta" is the inside of the delta
 * object; for text completions it is the text.  finish is NULL until the
 * last choice chunk.
 */
static void
ngx_http_llm_chunk(ngx_http_llm_fmt_t *f, ngx_http_llm_wbuf_t *out,
    ngx_str_t *delta, ngx_str_t *text, ngx_str_t *finish)
{
    ngx_http_llm_chunk_open(f, out);

    if (f->req->api == NGX_HTTP_LLM_API_CHAT) {
        ngx_http_llm_printf(out, "{\"index\":%ui,\"delta\":{", f->choice);
        ngx_http_llm_put_str(out, delta);

        if (text) {
            ngx_http_llm_put_string(out, text->data, text->len);
        }

        ngx_http_llm_puts(out, "},\"logprobs\":null,\"finish_reason\":");

    } else {
        ngx_http_llm_printf(out, "{\"index\":%ui,\"text\":", f->choice);
        ngx_http_llm_put_string(out, text ? text->data : NULL,
                                text ? text->len : 0);
        ngx_http_llm_puts(out, ",\"logprobs\":null,\"finish_reason\":");
    }

    ngx_http_llm_put_or_null(out, finish);
    ngx_http_llm_puts(out, "}");

    ngx_http_llm_chunk_close(f, out);
}


/* a chat tool call's members: id, type and function with its arguments */
static void
ngx_http_llm_put_call(ngx_http_llm_wbuf_t *out, ngx_str_t *id,
    ngx_str_t *name, u_char *args, size_t len)
{
    ngx_http_llm_puts(out, "\"id\":");
    ngx_http_llm_put_string(out, id->data, id->len);
    ngx_http_llm_puts(out, ",\"type\":\"function\",\"function\":{\"name\":");
    ngx_http_llm_put_string(out, name->data, name->len);
    ngx_http_llm_puts(out, ",\"arguments\":");
    ngx_http_llm_put_string(out, args, len);
    ngx_http_llm_puts(out, "}");
}


static void
ngx_http_llm_chunk_tool(ngx_http_llm_fmt_t *f, ngx_http_llm_event_t *ev,
    ngx_http_llm_wbuf_t *out)
{
    ngx_http_llm_chunk_open(f, out);

    ngx_http_llm_printf(out, "{\"index\":%ui,\"delta\":{\"tool_calls\":"
                        "[{\"index\":%ui,", f->choice, ev->index);

    if (ev->type == LLM_EV_TOOL_CALL_BEGIN) {
        ngx_http_llm_put_call(out, &ev->id, &ev->name, NULL, 0);

    } else {
        ngx_http_llm_puts(out, "\"function\":{\"arguments\":");
        ngx_http_llm_put_string(out, ev->text.data, ev->text.len);
        ngx_http_llm_puts(out, "}");
    }

    ngx_http_llm_puts(out, "}]},\"logprobs\":null,\"finish_reason\":null}");

    ngx_http_llm_chunk_close(f, out);
}


/* ---- the event stream -------------------------------------------------- */

void
ngx_http_llm_fmt_begin(ngx_http_llm_fmt_t *f, ngx_http_llm_wbuf_t *out)
{
    ngx_str_t  role = ngx_string("\"role\":\"assistant\",\"content\":\"\"");

    if (f->req->anthropic) {
        ngx_http_llm_anthropic_begin(f, out);
        return;
    }

    if (f->started) {
        return;
    }

    f->started = 1;

    if (!f->req->stream) {
        return;
    }

    switch (f->req->api) {

    case NGX_HTTP_LLM_API_CHAT:
        ngx_http_llm_chunk(f, out, &role, NULL, NULL);
        break;

    case NGX_HTTP_LLM_API_RESPONSES:
        ngx_http_llm_resp_state(f, out, "response.created", "in_progress",
                                NULL, NULL);
        ngx_http_llm_resp_state(f, out, "response.in_progress",
                                "in_progress", NULL, NULL);
        break;

    default:
        break;
    }
}


static ngx_http_llm_item_t *
ngx_http_llm_item_find(ngx_http_llm_fmt_t *f, ngx_uint_t index)
{
    ngx_uint_t            i;
    ngx_http_llm_item_t  *it;

    it = f->items.elts;

    for (i = f->items.nelts; i; i--) {
        if (it[i - 1].kind == NGX_HTTP_LLM_ITEM_TOOL
            && it[i - 1].index == index)
        {
            return &it[i - 1];
        }
    }

    return NULL;
}


static void
ngx_http_llm_fmt_delta(ngx_http_llm_fmt_t *f, ngx_http_llm_event_t *ev,
    ngx_http_llm_wbuf_t *out)
{
    ngx_str_t             field;
    ngx_http_llm_item_t  *it;
    ngx_http_llm_req_t   *req = f->req;

    static ngx_str_t  reasoning = ngx_string("\"reasoning_content\":");
    static ngx_str_t  content = ngx_string("\"content\":");

    /* a text completion renders no chat markup: all text is text */
    if (req->api == NGX_HTTP_LLM_API_COMPLETIONS
        || req->api == NGX_HTTP_LLM_API_DETOKENIZE)
    {
        ev->type = LLM_EV_CONTENT_DELTA;
    }

    if (ngx_http_llm_fmt_keeps(f)) {
        it = ngx_http_llm_item_open(f, ev->type == LLM_EV_REASONING_DELTA
                                       ? NGX_HTTP_LLM_ITEM_REASONING
                                       : NGX_HTTP_LLM_ITEM_MESSAGE,
                                    ev, out);
        if (it == NULL) {
            return;
        }

        ngx_http_llm_put_str(&it->text, &ev->text);

        if (it->text.failed) {
            f->failed = 1;
        }
    }

    if (!req->stream) {
        return;
    }

    if (req->api == NGX_HTTP_LLM_API_RESPONSES) {
        ngx_http_llm_resp_event(f, out,
                                ev->type == LLM_EV_REASONING_DELTA
                                ? "response.reasoning_text.delta"
                                : "response.output_text.delta");
        ngx_http_llm_resp_where(f, f->open, out);

        if (ev->type == LLM_EV_CONTENT_DELTA) {
            ngx_http_llm_puts(out, ",\"logprobs\":[]");
        }

        ngx_http_llm_puts(out, ",\"delta\":");
        ngx_http_llm_put_string(out, ev->text.data, ev->text.len);
        ngx_http_llm_puts(out, "}\n\n");
        return;
    }

    field = (ev->type == LLM_EV_REASONING_DELTA) ? reasoning : content;

    ngx_http_llm_chunk(f, out, &field, &ev->text, NULL);
}


static void
ngx_http_llm_fmt_tool(ngx_http_llm_fmt_t *f, ngx_http_llm_event_t *ev,
    ngx_http_llm_wbuf_t *out)
{
    ngx_http_llm_item_t  *it;
    ngx_http_llm_req_t   *req = f->req;

    if (req->api != NGX_HTTP_LLM_API_CHAT
        && req->api != NGX_HTTP_LLM_API_RESPONSES)
    {
        return;
    }

    if (ngx_http_llm_fmt_keeps(f)) {

        switch (ev->type) {

        case LLM_EV_TOOL_CALL_BEGIN:
            if (ngx_http_llm_item_open(f, NGX_HTTP_LLM_ITEM_TOOL, ev, out)
                == NULL)
            {
                return;
            }

            break;

        case LLM_EV_TOOL_CALL_ARGS:
            it = ngx_http_llm_item_find(f, ev->index);
            if (it == NULL) {
                /* arguments without a begun call: engine bug, dropped */
                return;
            }

            ngx_http_llm_put_str(&it->text, &ev->text);

            if (it->text.failed) {
                f->failed = 1;
            }

            if (req->stream) {
                ngx_http_llm_resp_event(f, out,
                                      "response.function_call_arguments.delta");
                ngx_http_llm_resp_where(f, it, out);
                ngx_http_llm_puts(out, ",\"delta\":");
                ngx_http_llm_put_string(out, ev->text.data, ev->text.len);
                ngx_http_llm_puts(out, "}\n\n");
            }

            return;

        default: /* LLM_EV_TOOL_CALL_END */
            if (f->open && f->open->kind == NGX_HTTP_LLM_ITEM_TOOL) {
                ngx_http_llm_item_close(f, out);
            }

            return;
        }
    }

    if (req->stream && req->api == NGX_HTTP_LLM_API_CHAT
        && ev->type != LLM_EV_TOOL_CALL_END)
    {
        ngx_http_llm_chunk_tool(f, ev, out);
    }
}


void
ngx_http_llm_fmt_event(ngx_http_llm_fmt_t *f, ngx_http_llm_event_t *ev,
    ngx_http_llm_wbuf_t *out)
{
    static ngx_str_t  none = ngx_null_string;

    if (f->finished) {
        return;
    }

    /* no output yet: the headers go out with the first token */
    if (ev->type == LLM_EV_PROMPT_INFO) {
        f->prompt = ev->prompt;
        f->cached = ev->cached;
        return;
    }

    if (f->req->anthropic) {
        ngx_http_llm_anthropic_event(f, ev, out);
        return;
    }

    ngx_http_llm_fmt_begin(f, out);

    switch (ev->type) {

    case LLM_EV_REASONING_DELTA:
    case LLM_EV_CONTENT_DELTA:
        if (ev->text.len) {
            ngx_http_llm_fmt_delta(f, ev, out);
        }

        break;

    case LLM_EV_TOOL_CALL_BEGIN:
    case LLM_EV_TOOL_CALL_ARGS:
    case LLM_EV_TOOL_CALL_END:
        ngx_http_llm_fmt_tool(f, ev, out);
        break;

    case LLM_EV_FINISH:
        f->finish.data = ngx_pstrdup(f->pool, &ev->name);
        f->finish.len = ev->name.len;

        if (f->finish.data == NULL && ev->name.len) {
            f->failed = 1;
        }

        if (f->req->stream && (f->req->api == NGX_HTTP_LLM_API_CHAT
                               || f->req->api == NGX_HTTP_LLM_API_COMPLETIONS))
        {
            ngx_http_llm_chunk(f, out, &none, NULL, &f->finish);
        }

        break;

    case LLM_EV_USAGE:
        f->usage = 1;
        f->prompt = ev->prompt;
        f->completion = ev->completion;
        f->reasoning = ev->reasoning;
        f->cached = ev->cached;
        break;

    case LLM_EV_LOGPROB:
        ngx_http_llm_fmt_logprob(f, ev, out);
        break;

    case LLM_EV_TOKENS:
        ngx_http_llm_put(&f->tokens, ev->tokens,
                         ev->ntokens * sizeof(uint32_t));

        if (f->tokens.failed) {
            f->failed = 1;
        }

        break;

    default: /* errors are the caller's: fmt_fail or an HTTP error */
        break;
    }
}


/* ---- bodies ------------------------------------------------------------ */

static void
ngx_http_llm_fmt_usage(ngx_http_llm_fmt_t *f, ngx_http_llm_wbuf_t *out)
{
    if (!f->usage) {
        ngx_http_llm_puts(out, "null");
        return;
    }

    if (f->req->api == NGX_HTTP_LLM_API_RESPONSES) {
        ngx_http_llm_printf(out, "{\"input_tokens\":%uL,"
                            "\"input_tokens_details\":{\"cached_tokens\":%uL},"
                            "\"output_tokens\":%uL,",
                            f->prompt, f->cached, f->completion);
        ngx_http_llm_printf(out, "\"output_tokens_details\":"
                            "{\"reasoning_tokens\":%uL},"
                            "\"total_tokens\":%uL}",
                            f->reasoning, f->prompt + f->completion);
        return;
    }

    ngx_http_llm_printf(out, "{\"prompt_tokens\":%uL,\"completion_tokens\":"
                        "%uL,\"total_tokens\":%uL,",
                        f->prompt, f->completion, f->prompt + f->completion);
    ngx_http_llm_printf(out, "\"prompt_tokens_details\":{\"cached_tokens\":"
                        "%uL},\"completion_tokens_details\":"
                        "{\"reasoning_tokens\":%uL}}",
                        f->cached, f->reasoning);
}


/* all items of one kind, concatenated, as a JSON string; empty: "null" */
static void
ngx_http_llm_fmt_text(ngx_http_llm_fmt_t *f, ngx_http_llm_item_kind_e kind,
    const char *empty, ngx_http_llm_wbuf_t *out)
{
    size_t                len;
    u_char               *p;
    ngx_uint_t            i;
    ngx_http_llm_item_t  *it;

    it = f->items.elts;
    len = 0;

    for (i = 0; i < f->items.nelts; i++) {
        if (it[i].kind == kind) {
            len += ngx_http_llm_wbuf_len(&it[i].text);
        }
    }

    if (len == 0) {
        ngx_http_llm_put(out, empty, ngx_strlen(empty));
        return;
    }

    p = ngx_pnalloc(f->pool, len);
    if (p == NULL) {
        f->failed = 1;
        return;
    }

    len = 0;

    for (i = 0; i < f->items.nelts; i++) {
        if (it[i].kind == kind) {
            ngx_memcpy(p + len, it[i].text.start,
                       ngx_http_llm_wbuf_len(&it[i].text));
            len += ngx_http_llm_wbuf_len(&it[i].text);
        }
    }

    ngx_http_llm_put_string(out, p, len);
}


/* one choice of a chat or text completion body */
static void
ngx_http_llm_choice_json(ngx_http_llm_fmt_t *f, ngx_http_llm_wbuf_t *out)
{
    ngx_uint_t            i, n;
    ngx_http_llm_item_t  *it;

    if (f->req->api == NGX_HTTP_LLM_API_COMPLETIONS) {
        ngx_http_llm_printf(out, "{\"index\":%ui,\"text\":", f->choice);
        ngx_http_llm_fmt_text(f, NGX_HTTP_LLM_ITEM_MESSAGE, "\"\"", out);
        ngx_http_llm_puts(out, ",\"logprobs\":");
        ngx_http_llm_fmt_logprobs(f, out);
        ngx_http_llm_puts(out, ",\"finish_reason\":");

    } else {
        ngx_http_llm_printf(out, "{\"index\":%ui,\"message\":"
                            "{\"role\":\"assistant\",\"content\":", f->choice);
        ngx_http_llm_fmt_text(f, NGX_HTTP_LLM_ITEM_MESSAGE, "null", out);
        ngx_http_llm_puts(out, ",\"reasoning_content\":");
        ngx_http_llm_fmt_text(f, NGX_HTTP_LLM_ITEM_REASONING, "null", out);

        it = f->items.elts;
        n = 0;

        for (i = 0; i < f->items.nelts; i++) {
            if (it[i].kind != NGX_HTTP_LLM_ITEM_TOOL) {
                continue;
            }

            ngx_http_llm_puts(out, n++ ? ",{" : ",\"tool_calls\":[{");
            ngx_http_llm_put_call(out, &it[i].id, &it[i].name,
                                  it[i].text.start,
                                  ngx_http_llm_wbuf_len(&it[i].text));
            ngx_http_llm_puts(out, "}");
        }

        ngx_http_llm_puts(out, n ? "]}" : "}");
        ngx_http_llm_puts(out, ",\"logprobs\":");
        ngx_http_llm_fmt_logprobs(f, out);
        ngx_http_llm_puts(out, ",\"finish_reason\":");
    }

    ngx_http_llm_put_or_null(out, &f->finish);
    ngx_http_llm_puts(out, "}");
}


static void
ngx_http_llm_chat_body(ngx_http_llm_fmt_t *f, ngx_http_llm_wbuf_t *out)
{
    ngx_uint_t  i;

    ngx_http_llm_completion_head(f, out, "chat.completion");
    ngx_http_llm_puts(out, ",\"choices\":[");
    ngx_http_llm_choice_json(f, out);

    for (i = 0; i < f->n_more; i++) {
        ngx_http_llm_puts(out, ",");
        ngx_http_llm_choice_json(&f->more[i], out);
    }

    ngx_http_llm_puts(out, "],\"usage\":");
    ngx_http_llm_fmt_usage(f, out);
    ngx_http_llm_puts(out, "}");
}


static void
ngx_http_llm_resp_object(ngx_http_llm_fmt_t *f, ngx_http_llm_wbuf_t *out,
    const char *status, ngx_str_t *code, ngx_str_t *message)
{
    ngx_uint_t            i, live;
    ngx_http_llm_item_t  *it;
    ngx_http_llm_req_t   *req = f->req;

    live = (ngx_strcmp(status, "in_progress") == 0);

    ngx_http_llm_printf(out, "{\"id\":\"resp_%V\",\"object\":\"response\","
                        "\"created_at\":%T,\"status\":\"%s\",\"model\":",
                        &req->id, f->created, status);
    ngx_http_llm_put_string(out, req->model.data, req->model.len);
    ngx_http_llm_puts(out, ",\"output\":[");

    if (!live) {
        it = f->items.elts;

        for (i = 0; i < f->items.nelts; i++) {
            ngx_http_llm_item_json(f, &it[i], out);

            if (i + 1 < f->items.nelts) {
                ngx_http_llm_puts(out, ",");
            }
        }
    }

    ngx_http_llm_puts(out, "],\"usage\":");

    if (live) {
        ngx_http_llm_puts(out, "null");
    } else {
        ngx_http_llm_fmt_usage(f, out);
    }

    ngx_http_llm_puts(out, ",\"error\":");

    if (code) {
        ngx_http_llm_puts(out, "{\"code\":");
        ngx_http_llm_put_string(out, code->data, code->len);
        ngx_http_llm_puts(out, ",\"message\":");
        ngx_http_llm_put_string(out, message->data, message->len);
        ngx_http_llm_puts(out, "}");

    } else {
        ngx_http_llm_puts(out, "null");
    }

    ngx_http_llm_puts(out, ",\"incomplete_details\":");

    if (ngx_strcmp(status, "incomplete") == 0) {
        ngx_http_llm_puts(out, "{\"reason\":\"max_output_tokens\"}");
    } else {
        ngx_http_llm_puts(out, "null");
    }

    ngx_http_llm_puts(out, ",\"previous_response_id\":null,\"store\":false,"
                           "\"metadata\":{},\"truncation\":\"disabled\"");
    ngx_http_llm_put_str(out, &req->echo);
    ngx_http_llm_puts(out, "}");
}


static const char *
ngx_http_llm_resp_status(ngx_http_llm_fmt_t *f)
{
    if (f->finish.len == 6 && ngx_strncmp(f->finish.data, "length", 6) == 0)
    {
        return "incomplete";
    }

    return "completed";
}


void
ngx_http_llm_fmt_end(ngx_http_llm_fmt_t *f, ngx_http_llm_wbuf_t *out)
{
    uint32_t             id;
    ngx_uint_t           i, n;
    const char          *status;
    ngx_http_llm_req_t  *req = f->req;

    if (req->anthropic) {
        ngx_http_llm_anthropic_end(f, out);
        return;
    }

    ngx_http_llm_fmt_begin(f, out);
    ngx_http_llm_item_close(f, out);

    f->finished = 1;

    switch (req->api) {

    case NGX_HTTP_LLM_API_CHAT:
    case NGX_HTTP_LLM_API_COMPLETIONS:
        if (!req->stream) {
            ngx_http_llm_chat_body(f, out);
            return;
        }

        if (req->include_usage) {
            ngx_http_llm_chunk_open(f, out);
            ngx_http_llm_puts(out, "],\"usage\":");
            ngx_http_llm_fmt_usage(f, out);
            ngx_http_llm_puts(out, "}\n\n");
        }

        ngx_http_llm_puts(out, "data: [DONE]\n\n");
        return;

    case NGX_HTTP_LLM_API_RESPONSES:
        status = ngx_http_llm_resp_status(f);

        if (!req->stream) {
            ngx_http_llm_resp_object(f, out, status, NULL, NULL);
            return;
        }

        ngx_http_llm_resp_state(f, out, status[0] == 'i'
                                        ? "response.incomplete"
                                        : "response.completed",
                                status, NULL, NULL);
        return;

    case NGX_HTTP_LLM_API_TOKENIZE:
        n = ngx_http_llm_wbuf_len(&f->tokens) / sizeof(uint32_t);

        ngx_http_llm_printf(out, "{\"count\":%ui,\"max_model_len\":%uL,"
                            "\"tokens\":[", n, f->max_model_len);

        for (i = 0; i < n; i++) {
            /* the buffer is not aligned for uint32_t */
            ngx_memcpy(&id, f->tokens.start + i * sizeof(uint32_t),
                       sizeof(uint32_t));
            ngx_http_llm_printf(out, i ? ",%uD" : "%uD", id);
        }

        ngx_http_llm_puts(out, "]}");
        return;

    default: /* NGX_HTTP_LLM_API_DETOKENIZE */
        ngx_http_llm_puts(out, "{\"prompt\":");
        ngx_http_llm_fmt_text(f, NGX_HTTP_LLM_ITEM_MESSAGE, "\"\"", out);
        ngx_http_llm_puts(out, "}");
        return;
    }
}


void
ngx_http_llm_fmt_fail(ngx_http_llm_fmt_t *f, ngx_str_t *code,
    ngx_str_t *message, ngx_http_llm_wbuf_t *out)
{
    ngx_http_llm_req_t  *req = f->req;

    f->finished = 1;

    if (req->anthropic) {
        ngx_http_llm_anthropic_fail(f, code, message, out);
        return;
    }

    if (req->api == NGX_HTTP_LLM_API_RESPONSES) {
        ngx_http_llm_resp_event(f, out, "error");
        ngx_http_llm_puts(out, ",\"code\":");
        ngx_http_llm_put_string(out, code->data, code->len);
        ngx_http_llm_puts(out, ",\"message\":");
        ngx_http_llm_put_string(out, message->data, message->len);
        ngx_http_llm_puts(out, ",\"param\":null}\n\n");

        ngx_http_llm_resp_state(f, out, "response.failed", "failed", code,
                                message);
        return;
    }

    ngx_http_llm_puts(out, "data: ");
    ngx_http_llm_error_body(out, NGX_HTTP_INTERNAL_SERVER_ERROR, message,
                            NULL, code);
    ngx_http_llm_puts(out, "\n\ndata: [DONE]\n\n");
}
