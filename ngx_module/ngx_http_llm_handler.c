/*
 * The API request life cycle:
 *
 *   handler      method and size checks, X-Request-Id, read the body
 *   body         validate -> canonical request, route by model, admit
 *   queued       (maybe) wait in the admission queue: a wake-up or the
 *                queue timeout ends the wait
 *   running      submit to the engine's slot; each doorbell drains the
 *                slot's ring into the formatter and flushes the output
 *   complete     after the finish event: last bytes, release the slot and
 *                the admission place, finalize
 *
 * A client that goes away at any point ends in the pool cleanup, which
 * leaves the queue or releases the slot (the engine then cancels the
 * sequence within a step) and the admission place.  While the client
 * reads slower than the engine writes, no more events are taken from the
 * ring: the engine's own backpressure holds the sequence.
 */

#include "ngx_http_llm_module.h"


typedef struct {
    ngx_http_request_t        *request;
    ngx_http_llm_req_t         req;
    ngx_http_llm_fmt_t         fmt;
    ngx_str_t                  request_id;     /* X-Request-Id */

    ngx_int_t                  route;
    uint64_t                   pool;
    ngx_int_t                  engine;
    ngx_http_llm_ticket_t     *ticket;
    ngx_queue_t                waiting;        /* this worker's queue */
    ngx_event_t                timer;          /* queue, then engine */
    ngx_http_llm_seq_t         seq;

    ngx_http_llm_wbuf_t        out;            /* formatted, not sent */
    ngx_chain_t               *free;
    ngx_chain_t               *busy;

    off_t                      received;       /* body bytes */
    ngx_str_t                  body;           /* kept, up to the limit */
    size_t                     body_cap;
    uint64_t                   start;          /* ns, monotonic */
    uint64_t                   last;           /* last token event */

    ngx_uint_t                 err_status;     /* engine error event */
    ngx_str_t                  err_code;
    ngx_str_t                  err_param;
    ngx_str_t                  err_message;

    unsigned                   too_large:1;    /* body over the limit */
    unsigned                   queued:1;
    unsigned                   header_sent:1;
    unsigned                   finished:1;     /* finish event seen */
    unsigned                   failed:1;       /* error event seen */
    unsigned                   done:1;
} ngx_http_llm_ctx_t;


static void ngx_http_llm_body_handler(ngx_http_request_t *r);
static void ngx_http_llm_start(ngx_http_llm_ctx_t *ctx);
static void ngx_http_llm_process(ngx_http_llm_ctx_t *ctx);


static ngx_queue_t  ngx_http_llm_waiting;

static ngx_http_request_body_filter_pt   ngx_http_llm_next_body_filter;


static ngx_int_t
ngx_http_llm_add_header(ngx_http_request_t *r, const char *key,
    ngx_str_t *value)
{
    ngx_table_elt_t  *h;

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    h->hash = 1;
    h->key.data = (u_char *) key;
    h->key.len = ngx_strlen(key);
    h->value = *value;

    return NGX_OK;
}


/*
 * X-Request-Id: the client's, when it is a sane token, else ours.  Ours
 * (32 hex digits) also names the response objects (chatcmpl-..., resp_...).
 */
static ngx_int_t
ngx_http_llm_request_id(ngx_http_request_t *r, ngx_http_llm_ctx_t *ctx)
{
    u_char           *p, c;
    ngx_uint_t        i, j;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *h;

    p = ngx_pnalloc(r->pool, 32);
    if (p == NULL) {
        return NGX_ERROR;
    }

    for (i = 0; i < 32; i++) {
        p[i] = "0123456789abcdef"[ngx_random() & 0xf];
    }

    ctx->req.id.data = p;
    ctx->req.id.len = 32;
    ctx->request_id = ctx->req.id;

    part = &r->headers_in.headers.part;
    h = part->elts;

    for (i = 0; /* void */ ; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                break;
            }

            part = part->next;
            h = part->elts;
            i = 0;
        }

        if (h[i].key.len != sizeof("X-Request-Id") - 1
            || ngx_strncasecmp(h[i].key.data, (u_char *) "X-Request-Id",
                               sizeof("X-Request-Id") - 1) != 0
            || h[i].value.len == 0 || h[i].value.len > 128)
        {
            continue;
        }

        for (j = 0; j < h[i].value.len; j++) {
            c = h[i].value.data[j];

            if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
                  || (c >= '0' && c <= '9') || ngx_strchr("-_.:/+=", c)))
            {
                break;
            }
        }

        if (j == h[i].value.len) {
            ctx->request_id = h[i].value;
        }

        break;
    }

    return ngx_http_llm_add_header(r, "X-Request-Id", &ctx->request_id);
}


ngx_int_t
ngx_http_llm_send_json(ngx_http_request_t *r, ngx_uint_t status,
    ngx_http_llm_wbuf_t *body)
{
    ngx_int_t     rc;
    ngx_buf_t    *b;
    ngx_chain_t   out;

    if (body->failed) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ngx_http_llm_puts(body, "\n");

    r->headers_out.status = status;
    r->headers_out.content_length_n = ngx_http_llm_wbuf_len(body);
    ngx_str_set(&r->headers_out.content_type, "application/json");
    r->headers_out.content_type_len = r->headers_out.content_type.len;

    rc = ngx_http_send_header(r);
    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        return rc;
    }

    b = ngx_calloc_buf(r->pool);
    if (b == NULL) {
        return NGX_ERROR;
    }

    b->pos = body->start;
    b->last = body->last;
    b->memory = 1;
    b->last_buf = (r == r->main) ? 1 : 0;
    b->last_in_chain = 1;

    out.buf = b;
    out.next = NULL;

    return ngx_http_output_filter(r, &out);
}


ngx_int_t
ngx_http_llm_send_error(ngx_http_request_t *r, ngx_uint_t status,
    const char *message, ngx_str_t *param, const char *code)
{
    ngx_str_t  msg, cd;

    msg.data = (u_char *) message;
    msg.len = ngx_strlen(message);
    cd.data = (u_char *) code;
    cd.len = code ? ngx_strlen(code) : 0;

    return ngx_http_llm_send_error_str(r, status, &msg, param, &cd);
}


/* an OpenAI error response; 429 and 503 carry Retry-After */
ngx_int_t
ngx_http_llm_send_error_str(ngx_http_request_t *r, ngx_uint_t status,
    ngx_str_t *msg, ngx_str_t *param, ngx_str_t *code)
{
    ngx_str_t                  value;
    ngx_http_llm_wbuf_t        body;
    ngx_http_llm_loc_conf_t   *llcf;
    ngx_http_llm_main_conf_t  *lmcf;

    lmcf = ngx_http_get_module_main_conf(r, ngx_http_llm_module);
    llcf = ngx_http_get_module_loc_conf(r, ngx_http_llm_module);

    if (status == NGX_HTTP_TOO_MANY_REQUESTS
        || status == NGX_HTTP_SERVICE_UNAVAILABLE)
    {
        value.data = ngx_pnalloc(r->pool, NGX_TIME_T_LEN);
        if (value.data == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        value.len = ngx_sprintf(value.data, "%T", lmcf->retry_after)
                    - value.data;

        if (ngx_http_llm_add_header(r, "Retry-After", &value) != NGX_OK) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }
    }

    if (status == NGX_HTTP_NOT_ALLOWED) {
        if (ngx_http_llm_api_generates(llcf->api)) {
            ngx_str_set(&value, "POST");

        } else if (llcf->api == NGX_HTTP_LLM_API_ADMIN) {
            ngx_str_set(&value, "GET, POST");

        } else {
            ngx_str_set(&value, "GET, HEAD");
        }

        if (ngx_http_llm_add_header(r, "Allow", &value) != NGX_OK) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }
    }

    ngx_http_llm_wbuf_init(&body, r->pool);

    if (ngx_http_llm_api_anthropic(llcf->api)) {
        ngx_http_llm_anthropic_error_body(&body, status, msg);

    } else {
        ngx_http_llm_error_body(&body, status, msg, param, code);
    }

    return ngx_http_llm_send_json(r, status, &body);
}


static ngx_int_t
ngx_http_llm_send_req_error(ngx_http_request_t *r, ngx_http_llm_req_t *req)
{
    return ngx_http_llm_send_error_str(r, req->status, &req->err_message,
                                       req->err_param.len ? &req->err_param
                                                          : NULL,
                                       &req->err_code);
}


static void
ngx_http_llm_ticket_drop(ngx_http_llm_main_conf_t *lmcf,
    ngx_http_llm_ctx_t *ctx)
{
    if (ctx->ticket == NULL) {
        return;
    }

    /* a ticket granted meanwhile holds a running place: give it back */
    if (ngx_http_llm_admit_check(lmcf, ctx->ticket, 1) >= 0) {
        ngx_http_llm_admit_release(lmcf, ctx->ticket);
    }

    ctx->ticket = NULL;
}


static void
ngx_http_llm_cleanup(void *data)
{
    ngx_http_llm_ctx_t  *ctx = data;

    ngx_http_llm_main_conf_t  *lmcf;

    lmcf = ngx_http_get_module_main_conf(ctx->request, ngx_http_llm_module);

    if (ctx->queued) {
        ngx_queue_remove(&ctx->waiting);
        ctx->queued = 0;
    }

    if (ctx->timer.timer_set) {
        ngx_del_timer(&ctx->timer);
    }

    /* before finish this abandons the slot: the engine cancels */
    ngx_http_llm_seq_release(&ctx->seq);

    ngx_http_llm_ticket_drop(lmcf, ctx);
}


ngx_int_t
ngx_http_llm_handler(ngx_http_request_t *r)
{
    ngx_int_t                 rc;
    ngx_http_llm_ctx_t       *ctx;
    ngx_pool_cleanup_t       *cln;
    ngx_http_llm_loc_conf_t  *llcf;

    llcf = ngx_http_get_module_loc_conf(r, ngx_http_llm_module);

    ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_llm_ctx_t));
    if (ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ctx->request = r;
    ctx->req.api = llcf->api;
    ctx->engine = -1;
    ctx->start = llm_ipc_now_ns();

    ngx_http_set_ctx(r, ctx, ngx_http_llm_module);

    if (ngx_http_llm_request_id(r, ctx) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    rc = ngx_http_llm_auth(r);
    if (rc != NGX_DECLINED) {
        return rc;
    }

    if (llcf->api == NGX_HTTP_LLM_API_METRICS) {
        return ngx_http_llm_metrics_handler(r);
    }

    if (!ngx_http_llm_api_generates(llcf->api)) {
        return ngx_http_llm_info_handler(r);
    }

    if (!(r->method & NGX_HTTP_POST)) {
        rc = ngx_http_discard_request_body(r);
        if (rc != NGX_OK) {
            return rc;
        }

        return ngx_http_llm_send_error(r, NGX_HTTP_NOT_ALLOWED,
                                       "this endpoint answers POST", NULL,
                                       "method_not_allowed");
    }

    if (r->headers_in.content_length_n > (off_t) llcf->max_body_size) {
        rc = ngx_http_discard_request_body(r);
        if (rc != NGX_OK) {
            return rc;
        }

        return ngx_http_llm_send_error(r, NGX_HTTP_REQUEST_ENTITY_TOO_LARGE,
                                       "the request body is larger than "
                                       "llm_max_body_size", NULL,
                                       "request_too_large");
    }

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    cln->handler = ngx_http_llm_cleanup;
    cln->data = ctx;

    /* the body filter keeps the body: no temporary file, even if asked */
    r->request_body_in_file_only = 0;

    rc = ngx_http_read_client_request_body(r, ngx_http_llm_body_handler);

    if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        return rc;
    }

    return NGX_DONE;
}


/*
 * Keeps the request body in the module's own buffer as nginx reads it, so
 * it never reaches nginx's save filter, which writes bodies larger than
 * client_body_buffer_size to a temporary file that the worker would have
 * to read back on its event loop.  Past llm_max_body_size the rest is
 * read and dropped, so even a chunked body gets an OpenAI-style 413.
 * (llm_api locations turn nginx's own client_max_body_size off: this
 * limit replaces it.)  Only the last, emptied buffer is passed on: it
 * tells nginx the body ended.
 */
static ngx_int_t
ngx_http_llm_body_filter(ngx_http_request_t *r, ngx_chain_t *in)
{
    u_char                   *p;
    size_t                    size, cap;
    ngx_chain_t              *cl, *last;
    ngx_http_llm_ctx_t       *ctx;
    ngx_http_llm_loc_conf_t  *llcf;

    ctx = ngx_http_get_module_ctx(r, ngx_http_llm_module);

    if (ctx == NULL || r != r->main) {
        return ngx_http_llm_next_body_filter(r, in);
    }

    llcf = ngx_http_get_module_loc_conf(r, ngx_http_llm_module);
    last = NULL;

    for (cl = in; cl; cl = cl->next) {
        size = cl->buf->last - cl->buf->pos;
        ctx->received += size;

        if (ctx->received > (off_t) llcf->max_body_size) {
            ctx->too_large = 1;
        }

        if (size && !ctx->too_large) {

            if (ctx->body.len + size > ctx->body_cap) {
                /* the declared length at once, else doubling */
                cap = ngx_max(ctx->body_cap * 2, ctx->body.len + size);

                if (r->headers_in.content_length_n > (off_t) cap) {
                    cap = (size_t) r->headers_in.content_length_n;
                }

                cap = ngx_min(cap, llcf->max_body_size);

                p = ngx_pnalloc(r->pool, cap);
                if (p == NULL) {
                    return NGX_HTTP_INTERNAL_SERVER_ERROR;
                }

                if (ctx->body.len) {
                    ngx_memcpy(p, ctx->body.data, ctx->body.len);
                }

                ctx->body.data = p;
                ctx->body_cap = cap;
            }

            ngx_memcpy(ctx->body.data + ctx->body.len, cl->buf->pos, size);
            ctx->body.len += size;
        }

        cl->buf->pos = cl->buf->last;

        if (cl->buf->last_buf) {
            last = cl;
        }
    }

    if (last == NULL) {
        return NGX_OK;
    }

    /* the last buffer ends the chain */
    return ngx_http_llm_next_body_filter(r, last);
}


ngx_int_t
ngx_http_llm_body_filter_init(ngx_conf_t *cf)
{
    ngx_http_llm_next_body_filter = ngx_http_top_request_body_filter;
    ngx_http_top_request_body_filter = ngx_http_llm_body_filter;

    return NGX_OK;
}


static void
ngx_http_llm_queue_timeout(ngx_event_t *ev)
{
    ngx_int_t                  e;
    ngx_connection_t          *c;
    ngx_http_request_t        *r;
    ngx_http_llm_ctx_t        *ctx;
    ngx_http_llm_main_conf_t  *lmcf;

    ctx = ev->data;
    r = ctx->request;
    c = r->connection;
    lmcf = ngx_http_get_module_main_conf(r, ngx_http_llm_module);

    ngx_queue_remove(&ctx->waiting);
    ctx->queued = 0;

    e = ngx_http_llm_admit_check(lmcf, ctx->ticket, 1);

    if (e >= 0) {
        /* granted just before the timeout: run */
        ctx->engine = e;
        ngx_http_llm_start(ctx);

    } else {
        ctx->ticket = NULL;
        ngx_http_finalize_request(r,
            ngx_http_llm_send_error(r, NGX_HTTP_SERVICE_UNAVAILABLE,
                                    "the request waited in the admission "
                                    "queue longer than its timeout", NULL,
                                    "queue_timeout"));
    }

    ngx_http_run_posted_requests(c);
}


/* wake-up: start this worker's requests whose tickets were granted */
void
ngx_http_llm_waiters_run(ngx_event_t *ev)
{
    ngx_int_t                  e;
    ngx_queue_t               *q, *next;
    ngx_connection_t          *c;
    ngx_http_llm_ctx_t        *ctx;
    ngx_http_llm_main_conf_t  *lmcf;

    if (ngx_http_llm_waiting.next == NULL) {
        return;
    }

    for (q = ngx_queue_head(&ngx_http_llm_waiting);
         q != ngx_queue_sentinel(&ngx_http_llm_waiting);
         q = next)
    {
        next = ngx_queue_next(q);
        ctx = ngx_queue_data(q, ngx_http_llm_ctx_t, waiting);
        lmcf = ngx_http_get_module_main_conf(ctx->request,
                                             ngx_http_llm_module);

        e = ngx_http_llm_admit_check(lmcf, ctx->ticket, 0);
        if (e < 0) {
            continue;
        }

        ngx_queue_remove(q);
        ctx->queued = 0;
        ctx->engine = e;

        if (ctx->timer.timer_set) {
            ngx_del_timer(&ctx->timer);
        }

        c = ctx->request->connection;

        /* may finalize the request: next was taken before */
        ngx_http_llm_start(ctx);

        ngx_http_run_posted_requests(c);
    }
}


static void
ngx_http_llm_send_not_found(ngx_http_request_t *r, ngx_http_llm_ctx_t *ctx)
{
    ngx_http_finalize_request(r,
        ngx_http_llm_send_model_not_found(r, &ctx->req.model));
}


/* the 404 for a model no route or engine serves */
ngx_int_t
ngx_http_llm_send_model_not_found(ngx_http_request_t *r, ngx_str_t *model)
{
    u_char     *msg;
    ngx_str_t   param = ngx_string("model");

    msg = ngx_pnalloc(r->pool, model->len + 64);
    if (msg == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ngx_sprintf(msg, "the model \"%V\" does not exist: see /v1/models%Z",
                model);

    return ngx_http_llm_send_error(r, NGX_HTTP_NOT_FOUND, (char *) msg,
                                   &param, "model_not_found");
}


static void
ngx_http_llm_body_handler(ngx_http_request_t *r)
{
    ngx_int_t                  rc;
    ngx_str_t                  body;
    const char                *why;
    ngx_http_llm_ctx_t        *ctx;
    ngx_http_llm_loc_conf_t   *llcf;
    ngx_http_llm_main_conf_t  *lmcf;

    ctx = ngx_http_get_module_ctx(r, ngx_http_llm_module);
    llcf = ngx_http_get_module_loc_conf(r, ngx_http_llm_module);
    lmcf = ngx_http_get_module_main_conf(r, ngx_http_llm_module);

    if (ctx->too_large) {
        ngx_http_finalize_request(r,
            ngx_http_llm_send_error(r, NGX_HTTP_REQUEST_ENTITY_TOO_LARGE,
                                    "the request body is larger than "
                                    "llm_max_body_size", NULL,
                                    "request_too_large"));
        return;
    }

    body = ctx->body;

    ctx->req.test_script = llcf->test_script;

    rc = ngx_http_llm_api_anthropic(llcf->api)
         ? ngx_http_llm_anthropic_parse(r->pool, &ctx->req, body.data,
                                        body.len)
         : ngx_http_llm_request_parse(r->pool, &ctx->req, body.data,
                                      body.len);

    if (rc == NGX_ERROR || (rc == NGX_DECLINED && ctx->req.status == 0)) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    if (rc == NGX_DECLINED) {
        ngx_http_finalize_request(r, ngx_http_llm_send_req_error(r,
                                                                 &ctx->req));
        return;
    }

    if (ngx_http_llm_route_find(lmcf, &ctx->req.model, &ctx->route,
                                &ctx->pool)
        != NGX_OK)
    {
        ngx_http_llm_send_not_found(r, ctx);
        return;
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "llm request %V: %V", &ctx->request_id,
                   &ctx->req.canonical);

    rc = ngx_http_llm_admit(lmcf, ctx->route, ctx->pool, ctx->req.n,
                            &ctx->ticket, &why);

    switch (rc) {

    case NGX_OK:
        ctx->engine = ctx->ticket->engine;
        ngx_http_llm_start(ctx);
        return;

    case NGX_AGAIN:
        if (ngx_http_llm_waiting.next == NULL) {
            ngx_queue_init(&ngx_http_llm_waiting);
        }

        ngx_queue_insert_tail(&ngx_http_llm_waiting, &ctx->waiting);
        ctx->queued = 1;

        ctx->timer.handler = ngx_http_llm_queue_timeout;
        ctx->timer.data = ctx;
        ctx->timer.log = r->connection->log;
        ngx_add_timer(&ctx->timer, lmcf->queue_timeout);

        /* notice a client that leaves while queued */
        r->read_event_handler = ngx_http_test_reading;
        r->write_event_handler = ngx_http_request_empty_handler;
        return;

    case NGX_BUSY:
        ngx_http_finalize_request(r,
            ngx_http_llm_send_error(r, NGX_HTTP_TOO_MANY_REQUESTS,
                                    "too many requests: the admission queue "
                                    "is full, retry later", NULL,
                                    "queue_full"));
        return;

    case NGX_DECLINED:
        ngx_http_finalize_request(r,
            ngx_http_llm_send_error(r, NGX_HTTP_SERVICE_UNAVAILABLE, why,
                                    NULL, "service_unavailable"));
        return;

    default:
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                      "llm: %s (request %V)", why, &ctx->request_id);
        ngx_http_finalize_request(r,
            ngx_http_llm_send_error(r, NGX_HTTP_SERVICE_UNAVAILABLE, why,
                                    NULL, "service_unavailable"));
        return;
    }
}


/* ---- running ----------------------------------------------------------- */

static ngx_int_t
ngx_http_llm_send_header(ngx_http_llm_ctx_t *ctx, off_t length)
{
    ngx_int_t            rc;
    ngx_str_t            v;
    ngx_http_request_t  *r = ctx->request;

    ctx->header_sent = 1;

    r->headers_out.status = NGX_HTTP_OK;
    r->headers_out.content_length_n = length;

    if (ctx->req.stream) {
        ngx_str_set(&r->headers_out.content_type, "text/event-stream");

        ngx_str_set(&v, "no-cache");
        if (ngx_http_llm_add_header(r, "Cache-Control", &v) != NGX_OK) {
            return NGX_ERROR;
        }

        /* a proxy in front must not hold tokens back either */
        ngx_str_set(&v, "no");
        if (ngx_http_llm_add_header(r, "X-Accel-Buffering", &v) != NGX_OK) {
            return NGX_ERROR;
        }

    } else {
        ngx_str_set(&r->headers_out.content_type, "application/json");
    }

    r->headers_out.content_type_len = r->headers_out.content_type.len;

    rc = ngx_http_send_header(r);

    return (rc == NGX_ERROR || rc > NGX_OK) ? NGX_ERROR : NGX_OK;
}


/* send what the formatter produced; last: end the response */
static ngx_int_t
ngx_http_llm_flush(ngx_http_llm_ctx_t *ctx, ngx_uint_t last)
{
    size_t                     len;
    ngx_int_t                  rc;
    ngx_buf_t                 *b;
    ngx_chain_t               *cl;
    ngx_http_request_t        *r = ctx->request;
    ngx_http_core_loc_conf_t  *clcf;

    if (ctx->out.failed) {
        return NGX_ERROR;
    }

    len = ngx_http_llm_wbuf_len(&ctx->out);

    if (len == 0 && !last) {
        return NGX_OK;
    }

    if (!ctx->header_sent
        && ngx_http_llm_send_header(ctx, ctx->req.stream ? -1 : (off_t) len)
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (r->header_only) {
        ctx->out.last = ctx->out.start;
        return NGX_OK;
    }

    cl = ngx_chain_get_free_buf(r->pool, &ctx->free);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    b = cl->buf;

    if (len && (b->start == NULL || (size_t) (b->end - b->start) < len)) {
        b->start = ngx_palloc(r->pool, ngx_max(len, 4096));
        if (b->start == NULL) {
            return NGX_ERROR;
        }

        b->end = b->start + ngx_max(len, 4096);
    }

    b->pos = b->start;
    b->last = len ? ngx_cpymem(b->start, ctx->out.start, len) : b->start;
    b->temporary = (len != 0);
    b->tag = (ngx_buf_tag_t) &ngx_http_llm_module;
    b->flush = 1;
    b->last_buf = (last && r == r->main);
    b->last_in_chain = 1;

    ctx->out.last = ctx->out.start;

    rc = ngx_http_output_filter(r, cl);

    ngx_chain_update_chains(r->pool, &ctx->free, &ctx->busy, &cl,
                            (ngx_buf_tag_t) &ngx_http_llm_module);

    if (rc == NGX_ERROR) {
        return NGX_ERROR;
    }

    if (ctx->busy && !last) {
        clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);

        if (!r->connection->write->delayed) {
            ngx_add_timer(r->connection->write, clcf->send_timeout);
        }

        if (ngx_handle_write_event(r->connection->write, clcf->send_lowat)
            != NGX_OK)
        {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


/* the client can take more: push what is pending, then read events again */
static void
ngx_http_llm_write_handler(ngx_http_request_t *r)
{
    ngx_int_t                  rc;
    ngx_event_t               *wev;
    ngx_http_llm_ctx_t        *ctx;
    ngx_http_core_loc_conf_t  *clcf;

    ctx = ngx_http_get_module_ctx(r, ngx_http_llm_module);
    wev = r->connection->write;
    clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);

    if (wev->timedout) {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, NGX_ETIMEDOUT,
                      "llm: client timed out reading the stream");
        r->connection->timedout = 1;
        ngx_http_finalize_request(r, NGX_HTTP_REQUEST_TIME_OUT);
        return;
    }

    rc = ngx_http_output_filter(r, NULL);

    ngx_chain_update_chains(r->pool, &ctx->free, &ctx->busy, NULL,
                            (ngx_buf_tag_t) &ngx_http_llm_module);

    if (rc == NGX_ERROR) {
        ngx_http_finalize_request(r, NGX_ERROR);
        return;
    }

    if (ctx->busy) {
        if (!wev->delayed) {
            ngx_add_timer(wev, clcf->send_timeout);
        }

        if (ngx_handle_write_event(wev, clcf->send_lowat) != NGX_OK) {
            ngx_http_finalize_request(r, NGX_ERROR);
        }

        return;
    }

    if (wev->timer_set) {
        ngx_del_timer(wev);
    }

    ngx_http_llm_process(ctx);
}


static ngx_str_t *
ngx_http_llm_copy(ngx_pool_t *pool, ngx_str_t *dst, const char *src,
    size_t len)
{
    dst->data = ngx_pnalloc(pool, len + 1);
    if (dst->data == NULL) {
        return NULL;
    }

    ngx_memcpy(dst->data, src, len);
    dst->data[len] = '\0';
    dst->len = len;

    return dst;
}


/* end the request with an error: an HTTP error, or an SSE error event */
static void
ngx_http_llm_end_error(ngx_http_llm_ctx_t *ctx, ngx_uint_t status,
    ngx_str_t *code, ngx_str_t *param, ngx_str_t *message)
{
    ngx_int_t                  rc;
    ngx_uint_t                 level;
    ngx_http_request_t        *r = ctx->request;
    ngx_http_llm_main_conf_t  *lmcf;

    lmcf = ngx_http_get_module_main_conf(r, ngx_http_llm_module);

    ctx->done = 1;

    if (ctx->timer.timer_set) {
        ngx_del_timer(&ctx->timer);
    }

    ngx_http_llm_seq_release(&ctx->seq);
    ngx_http_llm_ticket_drop(lmcf, ctx);

    level = (status >= 500) ? NGX_LOG_ERR : NGX_LOG_INFO;

    ngx_log_error(level, r->connection->log, 0, "llm request %V: %ui %V: %V",
                  &ctx->request_id, status, code, message);

    if (!ctx->header_sent) {
        rc = ngx_http_llm_send_error_str(r, status, message, param, code);
        ngx_http_finalize_request(r, rc);
        return;
    }

    ngx_http_llm_fmt_fail(&ctx->fmt, code, message, &ctx->out);

    rc = ngx_http_llm_flush(ctx, 1);

    ngx_http_finalize_request(r, rc == NGX_OK ? NGX_OK : NGX_ERROR);
}


/* the engine failed this request (counts against its health) */
static void
ngx_http_llm_engine_failed(ngx_http_llm_ctx_t *ctx, const char *code,
    const char *fmt, ...)
{
    u_char                    *p;
    va_list                    args;
    ngx_str_t                  c, m;
    ngx_http_llm_main_conf_t  *lmcf;

    lmcf = ngx_http_get_module_main_conf(ctx->request, ngx_http_llm_module);

    m.data = ngx_pnalloc(ctx->request->pool, 512);
    if (m.data == NULL) {
        ngx_str_set(&m, "engine failure");

    } else {
        va_start(args, fmt);
        p = ngx_vslprintf(m.data, m.data + 511, fmt, args);
        va_end(args);
        *p = '\0';
        m.len = p - m.data;
    }

    c.data = (u_char *) code;
    c.len = ngx_strlen(code);

    if (ctx->engine >= 0) {
        ngx_http_llm_engine_outcome(lmcf, ctx->engine, NGX_ERROR, &m);
    }

    ngx_http_llm_end_error(ctx, NGX_HTTP_SERVICE_UNAVAILABLE, &c, NULL, &m);
}


static void
ngx_http_llm_engine_timeout(ngx_event_t *ev)
{
    ngx_connection_t          *c;
    ngx_http_llm_ctx_t        *ctx = ev->data;
    ngx_http_llm_loc_conf_t   *llcf;

    c = ctx->request->connection;
    llcf = ngx_http_get_module_loc_conf(ctx->request, ngx_http_llm_module);

    ngx_http_llm_engine_failed(ctx, "engine_timeout", "the engine sent "
                               "nothing for %M ms (llm_read_timeout)",
                               llcf->read_timeout);

    ngx_http_run_posted_requests(c);
}


static void
ngx_http_llm_seq_handler(ngx_http_llm_seq_t *seq)
{
    ngx_connection_t    *c;
    ngx_http_llm_ctx_t  *ctx = seq->data;

    c = ctx->request->connection;

    ngx_http_llm_process(ctx);

    ngx_http_run_posted_requests(c);
}


static void
ngx_http_llm_start(ngx_http_llm_ctx_t *ctx)
{
    ngx_int_t                  rc;
    ngx_str_t                  why, fp;
    llm_ipc_header            *h;
    ngx_http_request_t        *r = ctx->request;
    ngx_http_llm_link_t       *link;
    enum llm_ipc_kind          kind;
    ngx_http_llm_loc_conf_t   *llcf;

    /* the Responses API arrives as a chat request (request.c converts) */
    static enum llm_ipc_kind  kinds[] = {
        LLM_KIND_CHAT, LLM_KIND_COMPLETIONS, LLM_KIND_CHAT,
        LLM_KIND_TOKENIZE, LLM_KIND_DETOKENIZE
    };
    static ngx_str_t  unavailable = ngx_string("engine_unavailable");

    llcf = ngx_http_get_module_loc_conf(r, ngx_http_llm_module);

    link = ngx_http_llm_link(ctx->engine);
    kind = kinds[ctx->req.api];

    ctx->seq.handler = ngx_http_llm_seq_handler;
    ctx->seq.data = ctx;

    rc = ngx_http_llm_seq_submit(&ctx->seq, link, kind, &ctx->req.canonical,
                                 &why);

    if (rc != NGX_OK) {
        if (rc == NGX_DECLINED) {
            ngx_http_llm_engine_failed(ctx, "engine_unavailable",
                                       "the engine could not take the "
                                       "request: %V", &why);
            return;
        }

        ngx_http_llm_end_error(ctx, NGX_HTTP_SERVICE_UNAVAILABLE,
                               &unavailable, NULL, &why);
        return;
    }

    /* a copy: the segment is unmapped when the engine goes away */
    h = link->client.hdr;
    fp.len = ngx_strnlen((u_char *) h->fingerprint, sizeof(h->fingerprint));
    fp.data = ngx_pnalloc(r->pool, fp.len + 1);

    if (fp.data == NULL) {
        ngx_http_llm_cleanup(ctx);
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    ngx_memcpy(fp.data, h->fingerprint, fp.len);

    if (ngx_http_llm_fmt_init(&ctx->fmt, r->pool, &ctx->req, &fp, ngx_time())
        != NGX_OK)
    {
        ngx_http_llm_cleanup(ctx);
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    ctx->fmt.max_model_len = h->max_model_len;
    ngx_http_llm_wbuf_init(&ctx->out, r->pool);

    if (ngx_http_llm_fmt_choices(&ctx->fmt, ctx->req.n) != NGX_OK) {
        ngx_http_llm_cleanup(ctx);
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    ctx->timer.handler = ngx_http_llm_engine_timeout;
    ctx->timer.data = ctx;
    ctx->timer.log = r->connection->log;
    ngx_add_timer(&ctx->timer, llcf->read_timeout);

    r->read_event_handler = ngx_http_test_reading;
    r->write_event_handler = ngx_http_llm_write_handler;
}


/* one engine event into the formatter (and the metrics) */
static ngx_int_t
ngx_http_llm_event(ngx_http_llm_ctx_t *ctx, llm_ipc_event *raw)
{
    float                      lp;
    size_t                     pos, len;
    uint64_t                   now;
    uint32_t                   ids[LLM_IPC_TOKENS_MAX], i;
    const char                *bytes;
    ngx_pool_t                *pool;
    ngx_http_llm_fmt_t        *f;
    ngx_http_llm_top_t         top[LLM_IPC_TOP_MAX];
    ngx_http_llm_event_t       ev;
    ngx_http_llm_main_conf_t  *lmcf;

    lmcf = ngx_http_get_module_main_conf(ctx->request, ngx_http_llm_module);
    pool = ctx->request->pool;

    /* n > 1: each choice's events go to its own formatter */
    f = (raw->choice && raw->choice <= ctx->fmt.n_more)
        ? &ctx->fmt.more[raw->choice - 1] : &ctx->fmt;

    ngx_memzero(&ev, sizeof(ngx_http_llm_event_t));
    ev.type = raw->type;

    switch (raw->type) {

    case LLM_EV_REASONING_DELTA:
    case LLM_EV_CONTENT_DELTA:
    case LLM_EV_TOOL_CALL_BEGIN:
    case LLM_EV_TOOL_CALL_ARGS:
    case LLM_EV_TOOL_CALL_END:
        now = llm_ipc_now_ns();

        if (ctx->last == 0) {
            ngx_http_llm_observe(lmcf, NGX_HTTP_LLM_H_TTFT, now - ctx->start);

        } else {
            ngx_http_llm_observe(lmcf, NGX_HTTP_LLM_H_ITL, now - ctx->last);
        }

        ctx->last = now;

        ev.index = raw->index;
        ev.text.data = (u_char *) raw->text;
        ev.text.len = raw->text_len;
        ev.id.data = (u_char *) raw->id;
        ev.id.len = raw->id_len;
        ev.name.data = (u_char *) raw->name;
        ev.name.len = raw->name_len;
        break;

    case LLM_EV_USAGE:
        ev.prompt = raw->usage.prompt_tokens;
        ev.completion = raw->usage.completion_tokens;
        ev.reasoning = raw->usage.reasoning_tokens;
        ev.cached = raw->usage.cached_tokens;
        ngx_http_llm_count_tokens(lmcf, &raw->usage);
        break;

    case LLM_EV_LOGPROB:
        ev.text.data = (u_char *) raw->text;
        ev.text.len = raw->text_len;
        ev.logprob = raw->logprob;
        ev.top = top;
        pos = 0;

        while (ev.ntop < LLM_IPC_TOP_MAX
               && llm_ipc_event_top(raw, &pos, &lp, &bytes, &len) == 1)
        {
            top[ev.ntop].bytes.data = (u_char *) bytes;
            top[ev.ntop].bytes.len = len;
            top[ev.ntop].logprob = lp;
            ev.ntop++;
        }

        break;

    case LLM_EV_TOKENS:
        for (i = 0; i < raw->n_items && i < LLM_IPC_TOKENS_MAX; i++) {
            ids[i] = llm_ipc_event_token(raw, i);
        }

        ev.tokens = ids;
        ev.ntokens = i;
        break;

    case LLM_EV_ERROR:
        if (ctx->failed) {
            return NGX_OK;
        }

        ctx->failed = 1;
        ctx->err_status = raw->status ? raw->status
                                      : NGX_HTTP_INTERNAL_SERVER_ERROR;

        if (ngx_http_llm_copy(pool, &ctx->err_code,
                              raw->code_len ? raw->code : "engine_error",
                              raw->code_len ? raw->code_len
                                            : sizeof("engine_error") - 1)
               == NULL
            || ngx_http_llm_copy(pool, &ctx->err_param, raw->param,
                                 raw->param_len) == NULL
            || ngx_http_llm_copy(pool, &ctx->err_message, raw->text,
                                 raw->text_len) == NULL)
        {
            return NGX_ERROR;
        }

        return NGX_OK;

    case LLM_EV_FINISH:
        if (raw->choice_end) {
            /* one choice of n ended; the request goes on */
            ev.index = raw->stop;
            ev.name.data = (u_char *) llm_ipc_finish_name(raw->reason);
            ev.name.len = ngx_strlen(ev.name.data);
            break;
        }

        ctx->finished = 1;

        if (raw->reason == LLM_FINISH_ERROR
            || raw->reason == LLM_FINISH_CANCELLED)
        {
            if (!ctx->failed) {
                ctx->failed = 1;
                ctx->err_status = NGX_HTTP_INTERNAL_SERVER_ERROR;
                ngx_str_set(&ctx->err_code, "engine_error");

                if (raw->reason == LLM_FINISH_CANCELLED) {
                    ngx_str_set(&ctx->err_message,
                                "the engine cancelled the request");
                } else {
                    ngx_str_set(&ctx->err_message,
                                "the engine failed the request");
                }
            }

            return NGX_OK;
        }

        if (ctx->fmt.n_more) {
            return NGX_OK;      /* every choice had its finish */
        }

        ev.index = raw->stop;
        ev.name.data = (u_char *) llm_ipc_finish_name(raw->reason);
        ev.name.len = ngx_strlen(ev.name.data);
        break;

    case LLM_EV_PROMPT_INFO:
        ev.prompt = raw->prompt_tokens;
        ev.cached = raw->cached_tokens;
        break;

    default:
        return NGX_OK;
    }

    if (ctx->failed) {
        return NGX_OK;
    }

    ngx_http_llm_fmt_event(f, &ev, &ctx->out);

    return f->failed ? NGX_ERROR : NGX_OK;
}


/* after the finish event: the last bytes, release everything, finalize */
static void
ngx_http_llm_complete(ngx_http_llm_ctx_t *ctx)
{
    ngx_int_t                  rc;
    ngx_http_request_t        *r = ctx->request;
    ngx_http_llm_main_conf_t  *lmcf;

    lmcf = ngx_http_get_module_main_conf(r, ngx_http_llm_module);

    ngx_http_llm_observe(lmcf, NGX_HTTP_LLM_H_DURATION,
                         llm_ipc_now_ns() - ctx->start);

    if (ctx->failed) {
        /* the engine's 4xx are the client's errors: no health count */
        if (ctx->err_status >= 500) {
            ngx_http_llm_engine_outcome(lmcf, ctx->engine, NGX_ERROR,
                                        &ctx->err_message);
        }

        ngx_http_llm_end_error(ctx, ctx->err_status, &ctx->err_code,
                               ctx->err_param.len ? &ctx->err_param : NULL,
                               &ctx->err_message);
        return;
    }

    ngx_http_llm_engine_outcome(lmcf, ctx->engine, NGX_OK, NULL);

    ctx->done = 1;

    if (ctx->timer.timer_set) {
        ngx_del_timer(&ctx->timer);
    }

    ngx_http_llm_seq_release(&ctx->seq);
    ngx_http_llm_ticket_drop(lmcf, ctx);

    ngx_http_llm_fmt_end(&ctx->fmt, &ctx->out);

    if (!ctx->req.stream) {
        ngx_http_llm_puts(&ctx->out, "\n");
    }

    rc = ngx_http_llm_flush(ctx, 1);

    ngx_http_finalize_request(r, rc == NGX_OK ? NGX_OK : NGX_ERROR);
}


/*
 * Drain the slot's ring into the formatter and flush; stop early while the
 * client has not taken the last flush (backpressure), unless the engine is
 * gone (then everything left in the ring is read at once).
 */
static void
ngx_http_llm_process(ngx_http_llm_ctx_t *ctx)
{
    long                      n;
    size_t                    off;
    ngx_int_t                 rc, got;
    llm_ipc_event             raw;
    ngx_http_request_t       *r = ctx->request;
    ngx_http_llm_loc_conf_t  *llcf;

    if (ctx->done) {
        return;
    }

    got = 0;

    while (!ctx->finished && (ctx->busy == NULL || ctx->seq.dead)) {

        n = ngx_http_llm_seq_read(&ctx->seq, ngx_http_llm_evbuf,
                                  NGX_HTTP_LLM_EVBUF);
        if (n < 0) {
            ngx_http_llm_engine_failed(ctx, "engine_error", "reading the "
                                       "engine's events failed: %s",
                                       llm_ipc_strerror((int) n));
            return;
        }

        if (n == 0) {
            break;
        }

        got = 1;
        off = 0;
        rc = 0;

        while (!ctx->finished
               && (rc = llm_ipc_event_next(ngx_http_llm_evbuf, n, &off, &raw))
                  == 1)
        {
            if (ngx_http_llm_event(ctx, &raw) != NGX_OK) {
                ngx_http_llm_cleanup(ctx);
                ctx->done = 1;
                ngx_http_finalize_request(r, NGX_ERROR);
                return;
            }
        }

        if (rc == -1) {
            ngx_http_llm_engine_failed(ctx, "engine_error", "the engine "
                                       "wrote a malformed event record");
            return;
        }

        if (ctx->finished) {
            break;
        }

        if (ctx->req.stream && !ctx->failed
            && ngx_http_llm_flush(ctx, 0) != NGX_OK)
        {
            ngx_http_llm_cleanup(ctx);
            ctx->done = 1;
            ngx_http_finalize_request(r, NGX_ERROR);
            return;
        }
    }

    if (ctx->finished) {
        ngx_http_llm_complete(ctx);
        return;
    }

    if (ctx->seq.dead || !ctx->seq.active) {
        ngx_http_llm_engine_failed(ctx, "engine_error", "the engine went "
                                   "away before the request finished");
        return;
    }

    /* the engine timer measures its silence, not a slow client */
    if (ctx->busy) {
        if (ctx->timer.timer_set) {
            ngx_del_timer(&ctx->timer);
        }

    } else if (got || !ctx->timer.timer_set) {
        llcf = ngx_http_get_module_loc_conf(r, ngx_http_llm_module);
        ngx_add_timer(&ctx->timer, llcf->read_timeout);
    }
}


ngx_int_t
ngx_http_llm_log_handler(ngx_http_request_t *r)
{
    ngx_uint_t                 status;
    ngx_http_llm_loc_conf_t   *llcf;
    ngx_http_llm_main_conf_t  *lmcf;

    llcf = ngx_http_get_module_loc_conf(r, ngx_http_llm_module);

    if (llcf->api == NGX_CONF_UNSET_UINT) {
        return NGX_OK;
    }

    lmcf = ngx_http_get_module_main_conf(r, ngx_http_llm_module);

    status = r->headers_out.status;

    if (status == 0 && r->connection->error) {
        status = NGX_HTTP_CLIENT_CLOSED_REQUEST;
    }

    ngx_http_llm_count_request(lmcf, llcf->api, status);

    return NGX_OK;
}
