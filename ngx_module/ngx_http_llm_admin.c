/*
 * Informational and admin endpoints: /v1/models, /health, the catch-all
 * 404, and /admin/{status,drain,resume,promote,reset_prefix_cache}.  The
 * admin location is
 * restricted by nginx itself (allow/deny) and by a bearer token
 * (llm_admin_token); without a token it is disabled.
 */

#include "ngx_http_llm_module.h"


typedef struct {
    ngx_http_request_t        *request;
    ngx_http_llm_probe_t       probe;
    ngx_str_t                  route;
} ngx_http_llm_promote_t;


/* an admin operation the engine itself answers (LLM_KIND_ADMIN) */
typedef struct {
    ngx_http_request_t        *request;
    ngx_http_llm_main_conf_t  *lmcf;
    ngx_str_t                  engine;
    ngx_http_llm_seq_t         seq;
    ngx_event_t                timer;
    ngx_http_llm_wbuf_t        answer;      /* content: the engine's JSON */
    ngx_uint_t                 status;      /* an error event's status */
    ngx_str_t                  message;     /* ... its message, or ours */
    ngx_str_t                  code;
    unsigned                   running:1;
} ngx_http_llm_control_t;

/* the most answer bytes kept from the engine */
#define NGX_HTTP_LLM_CONTROL_MAX  4096


static ngx_int_t
ngx_http_llm_arg(ngx_http_request_t *r, const char *name, ngx_str_t *value)
{
    u_char     *dst, *src;
    ngx_str_t   raw;

    if (ngx_http_arg(r, (u_char *) name, ngx_strlen(name), &raw) != NGX_OK
        || raw.len == 0)
    {
        return NGX_DECLINED;
    }

    value->data = ngx_pnalloc(r->pool, raw.len);
    if (value->data == NULL) {
        return NGX_ERROR;
    }

    dst = value->data;
    src = raw.data;
    ngx_unescape_uri(&dst, &src, raw.len, 0);
    value->len = dst - value->data;

    return NGX_OK;
}


/* Authorization: Bearer TOKEN, compared in constant time */
static ngx_int_t
ngx_http_llm_authorized(ngx_http_request_t *r, ngx_str_t *token)
{
    u_char      diff;
    ngx_str_t   v;
    ngx_uint_t  i;

    if (r->headers_in.authorization == NULL) {
        return 0;
    }

    v = r->headers_in.authorization->value;

    if (v.len < sizeof("Bearer ") - 1
        || ngx_strncasecmp(v.data, (u_char *) "Bearer ",
                           sizeof("Bearer ") - 1) != 0)
    {
        return 0;
    }

    v.data += sizeof("Bearer ") - 1;
    v.len -= sizeof("Bearer ") - 1;

    if (v.len != token->len) {
        return 0;
    }

    diff = 0;

    for (i = 0; i < v.len; i++) {
        diff |= v.data[i] ^ token->data[i];
    }

    return diff == 0;
}


static ngx_int_t
ngx_http_llm_admin_status(ngx_http_request_t *r)
{
    ngx_uint_t                 ready;
    ngx_http_llm_wbuf_t        w;
    ngx_http_llm_main_conf_t  *lmcf;

    lmcf = ngx_http_get_module_main_conf(r, ngx_http_llm_module);

    ngx_http_llm_wbuf_init(&w, r->pool);
    ngx_http_llm_status_json(lmcf, &w, NULL, &ready);

    return ngx_http_llm_send_json(r, NGX_HTTP_OK, &w);
}


/* the engine named by ?engine=, or an error response in *rc */
static ngx_int_t
ngx_http_llm_admin_engine(ngx_http_request_t *r, ngx_str_t *name,
    ngx_int_t *rc)
{
    ngx_int_t                  e;
    ngx_str_t                  param = ngx_string("engine");
    ngx_http_llm_main_conf_t  *lmcf;

    lmcf = ngx_http_get_module_main_conf(r, ngx_http_llm_module);

    if (ngx_http_llm_arg(r, "engine", name) != NGX_OK) {
        *rc = ngx_http_llm_send_error(r, NGX_HTTP_BAD_REQUEST,
                                      "name the engine: ?engine=NAME",
                                      &param, NULL);
        return -1;
    }

    e = ngx_http_llm_engine_find(lmcf, name);

    if (e == -1) {
        *rc = ngx_http_llm_send_error(r, NGX_HTTP_NOT_FOUND,
                                      "no such engine", &param,
                                      "engine_not_found");
    }

    return e;
}


static ngx_int_t
ngx_http_llm_admin_drain(ngx_http_request_t *r, ngx_uint_t drain)
{
    ngx_int_t                  e, rc;
    ngx_str_t                  name;
    const char                *why;
    ngx_http_llm_wbuf_t        w;
    ngx_http_llm_main_conf_t  *lmcf;

    lmcf = ngx_http_get_module_main_conf(r, ngx_http_llm_module);

    e = ngx_http_llm_admin_engine(r, &name, &rc);
    if (e == -1) {
        return rc;
    }

    (void) ngx_http_llm_engine_drain(lmcf, e, drain, &why);

    ngx_http_llm_wbuf_init(&w, r->pool);
    ngx_http_llm_puts(&w, "{\"engine\":");
    ngx_http_llm_put_string(&w, name.data, name.len);
    ngx_http_llm_printf(&w, ",\"draining\":%s,\"state\":\"%s\"}",
                        drain ? "true" : "false",
                        ngx_http_llm_state_names[lmcf->sh->engines[e].state]);

    return ngx_http_llm_send_json(r, NGX_HTTP_OK, &w);
}


static void
ngx_http_llm_promote_abort(void *data)
{
    ngx_http_llm_promote_t  *pr = data;

    ngx_http_llm_probe_abort(&pr->probe);
}


static void
ngx_http_llm_promote_probed(ngx_http_llm_probe_t *p)
{
    u_char                    *msg;
    ngx_int_t                  rc;
    const char                *why;
    ngx_connection_t          *c;
    ngx_http_request_t        *r;
    ngx_http_llm_wbuf_t        w;
    ngx_http_llm_promote_t    *pr;

    pr = p->data;
    r = pr->request;
    c = r->connection;

    if (p->rc != NGX_OK) {
        msg = ngx_pnalloc(r->pool, NGX_HTTP_LLM_REASON_LEN + 64);
        if (msg == NULL) {
            ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
            return;
        }

        ngx_sprintf(msg, "promotion refused: the probe failed: %s%Z",
                    p->reason);

        rc = ngx_http_llm_send_error(r, NGX_HTTP_CONFLICT, (char *) msg,
                                     NULL, "probe_failed");
        goto done;
    }

    if (ngx_http_llm_route_promote(p->lmcf, &pr->route, p->engine, &why)
        != NGX_OK)
    {
        rc = ngx_http_llm_send_error(r, NGX_HTTP_CONFLICT, why, NULL,
                                     "promotion_refused");
        goto done;
    }

    ngx_http_llm_wbuf_init(&w, r->pool);
    ngx_http_llm_puts(&w, "{\"route\":");
    ngx_http_llm_put_string(&w, pr->route.data, pr->route.len);
    ngx_http_llm_puts(&w, ",\"engine\":");
    ngx_http_llm_put_string(&w, p->lmcf->sh->engines[p->engine].name,
                            ngx_strlen(p->lmcf->sh->engines[p->engine].name));
    ngx_http_llm_printf(&w, ",\"prompt_fingerprint\":\"%016xL\"}",
                        p->fingerprint);

    rc = ngx_http_llm_send_json(r, NGX_HTTP_OK, &w);

done:

    ngx_http_finalize_request(r, rc);
    ngx_http_run_posted_requests(c);
}


/*
 * Switch a route to one engine: refused unless the engine is healthy and
 * passes a probe sent now; the switch itself is one write under the lock.
 */
static ngx_int_t
ngx_http_llm_admin_promote(ngx_http_request_t *r)
{
    ngx_int_t                  e, rc;
    ngx_str_t                  name, param = ngx_string("route");
    ngx_pool_cleanup_t        *cln;
    ngx_http_llm_promote_t    *pr;
    ngx_http_llm_main_conf_t  *lmcf;

    lmcf = ngx_http_get_module_main_conf(r, ngx_http_llm_module);

    pr = ngx_pcalloc(r->pool, sizeof(ngx_http_llm_promote_t));
    if (pr == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (ngx_http_llm_arg(r, "route", &pr->route) != NGX_OK) {
        return ngx_http_llm_send_error(r, NGX_HTTP_BAD_REQUEST,
                                       "name the route: ?route=MODEL",
                                       &param, NULL);
    }

    e = ngx_http_llm_admin_engine(r, &name, &rc);
    if (e == -1) {
        return rc;
    }

    if (!ngx_http_llm_admissible(&lmcf->sh->engines[e])) {
        return ngx_http_llm_send_error(r, NGX_HTTP_CONFLICT,
                                       "promotion refused: the engine is "
                                       "not healthy (see /admin/status)",
                                       NULL, "engine_unhealthy");
    }

    pr->request = r;
    pr->probe.lmcf = lmcf;
    pr->probe.engine = e;
    pr->probe.handler = ngx_http_llm_promote_probed;
    pr->probe.data = pr;

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    cln->handler = ngx_http_llm_promote_abort;
    cln->data = pr;

    if (ngx_http_llm_probe_start(&pr->probe) != NGX_OK) {
        ngx_http_llm_promote_probed(&pr->probe);
        return NGX_DONE;
    }

    r->main->count++;

    return NGX_DONE;
}


static void
ngx_http_llm_control_abort(void *data)
{
    ngx_http_llm_control_t  *ct = data;

    if (!ct->running) {
        return;
    }

    ct->running = 0;

    if (ct->timer.timer_set) {
        ngx_del_timer(&ct->timer);
    }

    ngx_http_llm_seq_release(&ct->seq);
}


/* the engine answered, failed, went away or took too long */
static void
ngx_http_llm_control_end(ngx_http_llm_control_t *ct)
{
    ngx_int_t              rc;
    ngx_str_t              err, where;
    ngx_connection_t      *c;
    ngx_http_request_t    *r;
    ngx_http_llm_json_t   *v;
    ngx_http_llm_wbuf_t    w;

    r = ct->request;
    c = r->connection;

    ngx_http_llm_control_abort(ct);

    if (ct->status) {
        rc = ngx_http_llm_send_error_str(r, ct->status, &ct->message, NULL,
                                         &ct->code);
        goto done;
    }

    v = NULL;

    if (!ct->answer.failed && ngx_http_llm_wbuf_len(&ct->answer) > 0) {
        v = ngx_http_llm_json_parse(r->pool, ct->answer.start,
                                    ngx_http_llm_wbuf_len(&ct->answer),
                                    &err, &where);
    }

    if (v == NULL || v->type != NGX_HTTP_LLM_JSON_OBJECT) {
        rc = ngx_http_llm_send_error(r, NGX_HTTP_BAD_GATEWAY,
                                     "the engine's answer is not a JSON "
                                     "object", NULL, "bad_engine_answer");
        goto done;
    }

    ngx_http_llm_wbuf_init(&w, r->pool);
    ngx_http_llm_puts(&w, "{\"engine\":");
    ngx_http_llm_put_string(&w, ct->engine.data, ct->engine.len);
    ngx_http_llm_puts(&w, ",\"freed\":");
    ngx_http_llm_put_json(&w, v);
    ngx_http_llm_puts(&w, "}");

    rc = ngx_http_llm_send_json(r, NGX_HTTP_OK, &w);

done:

    ngx_http_finalize_request(r, rc);
    ngx_http_run_posted_requests(c);
}


static void
ngx_http_llm_control_fail(ngx_http_llm_control_t *ct, ngx_uint_t status,
    const char *code, const char *message)
{
    ct->status = status;
    ct->code.data = (u_char *) code;
    ct->code.len = ngx_strlen(code);
    ct->message.data = (u_char *) message;
    ct->message.len = ngx_strlen(message);
}


static void
ngx_http_llm_control_events(ngx_http_llm_seq_t *seq)
{
    long                     n;
    size_t                   off, room;
    llm_ipc_event            ev;
    ngx_pool_t              *pool;
    ngx_http_llm_control_t  *ct = seq->data;

    pool = ct->request->pool;

    for ( ;; ) {
        n = ngx_http_llm_seq_read(seq, ngx_http_llm_evbuf,
                                  NGX_HTTP_LLM_EVBUF);
        if (n < 0) {
            ngx_http_llm_control_fail(ct, NGX_HTTP_SERVICE_UNAVAILABLE,
                                      "engine_unavailable",
                                      llm_ipc_strerror((int) n));
            ngx_http_llm_control_end(ct);
            return;
        }

        if (n == 0) {
            break;
        }

        off = 0;

        while (llm_ipc_event_next(ngx_http_llm_evbuf, n, &off, &ev) == 1) {

            switch (ev.type) {

            case LLM_EV_CONTENT_DELTA:
                room = NGX_HTTP_LLM_CONTROL_MAX
                       - ngx_http_llm_wbuf_len(&ct->answer);
                ngx_http_llm_put(&ct->answer, ev.text,
                                 ngx_min(ev.text_len, room));
                break;

            case LLM_EV_ERROR:
                if (ct->status) {
                    break;
                }

                ct->status = ev.status >= 400 && ev.status < 600
                             ? ev.status : NGX_HTTP_INTERNAL_SERVER_ERROR;
                ct->message.data = ngx_pnalloc(pool, ev.text_len + 1);
                ct->code.data = ngx_pnalloc(pool, ev.code_len + 1);

                if (ct->message.data == NULL || ct->code.data == NULL) {
                    ngx_http_llm_control_fail(ct,
                                              NGX_HTTP_INTERNAL_SERVER_ERROR,
                                              "server_error",
                                              "out of memory");
                    break;
                }

                ct->message.len = ev.text_len;
                ngx_memcpy(ct->message.data, ev.text, ev.text_len);
                ct->code.len = ev.code_len;
                ngx_memcpy(ct->code.data, ev.code, ev.code_len);
                break;

            case LLM_EV_FINISH:
                ngx_http_llm_control_end(ct);
                return;

            default:
                break;
            }
        }
    }

    if (seq->dead) {
        ngx_http_llm_control_fail(ct, NGX_HTTP_SERVICE_UNAVAILABLE,
                                  "engine_unavailable",
                                  "the engine went away before it "
                                  "answered");
        ngx_http_llm_control_end(ct);
    }
}


static void
ngx_http_llm_control_timeout(ngx_event_t *ev)
{
    ngx_http_llm_control_t  *ct = ev->data;

    ngx_http_llm_control_fail(ct, NGX_HTTP_SERVICE_UNAVAILABLE,
                              "engine_timeout",
                              "the engine did not answer in time "
                              "(llm_health probe_timeout)");
    ngx_http_llm_control_end(ct);
}


/*
 * An operation the engine answers itself, now only reset_prefix_cache:
 * it forgets every cached prefix and says what it freed.
 */
static ngx_int_t
ngx_http_llm_admin_control(ngx_http_request_t *r, const char *op)
{
    u_char                    *last;
    ngx_int_t                  e, rc;
    ngx_str_t                  req, why;
    ngx_str_t                  code = ngx_string("engine_unavailable");
    ngx_pool_cleanup_t        *cln;
    ngx_http_llm_control_t    *ct;
    ngx_http_llm_main_conf_t  *lmcf;

    lmcf = ngx_http_get_module_main_conf(r, ngx_http_llm_module);

    ct = ngx_pcalloc(r->pool, sizeof(ngx_http_llm_control_t));
    if (ct == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    e = ngx_http_llm_admin_engine(r, &ct->engine, &rc);
    if (e == -1) {
        return rc;
    }

    req.data = ngx_pnalloc(r->pool, ngx_strlen(op) + 16);
    if (req.data == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    last = ngx_sprintf(req.data, "{\"op\":\"%s\"}", op);
    req.len = last - req.data;

    ct->request = r;
    ct->lmcf = lmcf;
    ngx_http_llm_wbuf_init(&ct->answer, r->pool);
    ct->seq.handler = ngx_http_llm_control_events;
    ct->seq.data = ct;

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    cln->handler = ngx_http_llm_control_abort;
    cln->data = ct;

    if (ngx_http_llm_seq_submit(&ct->seq, ngx_http_llm_link(e),
                                LLM_KIND_ADMIN, &req, &why)
        != NGX_OK)
    {
        return ngx_http_llm_send_error_str(r, NGX_HTTP_SERVICE_UNAVAILABLE,
                                           &why, NULL, &code);
    }

    ct->running = 1;

    ct->timer.handler = ngx_http_llm_control_timeout;
    ct->timer.data = ct;
    ct->timer.log = r->connection->log;
    ct->timer.cancelable = 1;

    ngx_add_timer(&ct->timer, lmcf->probe_timeout);

    r->main->count++;

    return NGX_DONE;
}


static ngx_int_t
ngx_http_llm_admin(ngx_http_request_t *r)
{
    ngx_str_t                 *uri, op;
    ngx_uint_t                 reset;
    ngx_http_llm_loc_conf_t   *llcf;

    llcf = ngx_http_get_module_loc_conf(r, ngx_http_llm_module);

    if (llcf->admin_token.len == 0) {
        return ngx_http_llm_send_error(r, NGX_HTTP_FORBIDDEN,
                                       "the admin API is disabled: set "
                                       "llm_admin_token", NULL,
                                       "admin_disabled");
    }

    if (!ngx_http_llm_authorized(r, &llcf->admin_token)) {
        ngx_str_t  v = ngx_string("Bearer");
        ngx_table_elt_t  *h;

        h = ngx_list_push(&r->headers_out.headers);
        if (h == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        h->hash = 1;
        ngx_str_set(&h->key, "WWW-Authenticate");
        h->value = v;

        return ngx_http_llm_send_error(r, NGX_HTTP_UNAUTHORIZED,
                                       "a valid bearer token is required",
                                       NULL, "invalid_token");
    }

    /* the operation is the last path segment */
    uri = &r->uri;
    op.data = uri->data + uri->len;

    while (op.data > uri->data && op.data[-1] != '/') {
        op.data--;
    }

    op.len = uri->data + uri->len - op.data;

    if (op.len == 6 && ngx_strncmp(op.data, "status", 6) == 0) {
        if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
            return ngx_http_llm_send_error(r, NGX_HTTP_NOT_ALLOWED,
                                           "status answers GET", NULL,
                                           "method_not_allowed");
        }

        return ngx_http_llm_admin_status(r);
    }

    reset = (op.len == sizeof("reset_prefix_cache") - 1
             && ngx_strncmp(op.data, "reset_prefix_cache", op.len) == 0);

    if (!((op.len == 5 && ngx_strncmp(op.data, "drain", 5) == 0)
          || (op.len == 6 && ngx_strncmp(op.data, "resume", 6) == 0)
          || (op.len == 7 && ngx_strncmp(op.data, "promote", 7) == 0)
          || reset))
    {
        return ngx_http_llm_send_error(r, NGX_HTTP_NOT_FOUND,
                                       "no such admin operation: use "
                                       "status, drain, resume, promote or "
                                       "reset_prefix_cache",
                                       NULL, "not_found");
    }

    if (!(r->method & NGX_HTTP_POST)) {
        return ngx_http_llm_send_error(r, NGX_HTTP_NOT_ALLOWED,
                                       "this operation answers POST", NULL,
                                       "method_not_allowed");
    }

    if (reset) {
        return ngx_http_llm_admin_control(r, "reset_prefix_cache");
    }

    if (op.data[0] == 'd') {
        return ngx_http_llm_admin_drain(r, 1);
    }

    if (op.data[0] == 'r') {
        return ngx_http_llm_admin_drain(r, 0);
    }

    return ngx_http_llm_admin_promote(r);
}


/*
 * GET /v1/models, or /v1/models/{id}: the one model object (an id may
 * hold slashes; it is everything after "/models/", percent-decoded).
 */
static ngx_int_t
ngx_http_llm_models(ngx_http_request_t *r, ngx_http_llm_main_conf_t *lmcf,
    ngx_http_llm_wbuf_t *w)
{
    u_char               *p, *end, *dst, *msg;
    ngx_str_t             id, err, where, param = ngx_string("model");
    ngx_http_llm_json_t  *list, *m, *v;
    ngx_http_llm_wbuf_t   one;

    ngx_http_llm_models_json(lmcf, w);

    end = r->uri.data + r->uri.len;
    p = ngx_strlcasestrn(r->uri.data, end, (u_char *) "/models/",
                         sizeof("/models/") - 2);

    if (p == NULL || p + sizeof("/models/") - 1 == end) {
        return ngx_http_llm_send_json(r, NGX_HTTP_OK, w);
    }

    p += sizeof("/models/") - 1;

    id.data = ngx_pnalloc(r->pool, end - p);
    if (id.data == NULL || w->failed) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    dst = id.data;
    ngx_unescape_uri(&dst, &p, end - p, 0);
    id.len = dst - id.data;

    list = ngx_http_llm_json_parse(r->pool, w->start,
                                   ngx_http_llm_wbuf_len(w), &err, &where);
    if (list == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    m = ngx_http_llm_json_get(list, "data");

    for (m = m ? m->child : NULL; m; m = m->next) {
        v = ngx_http_llm_json_get(m, "id");

        if (v && v->value.len == id.len
            && ngx_memcmp(v->value.data, id.data, id.len) == 0)
        {
            ngx_http_llm_wbuf_init(&one, r->pool);
            ngx_http_llm_put_json(&one, m);
            return ngx_http_llm_send_json(r, NGX_HTTP_OK, &one);
        }
    }

    msg = ngx_pnalloc(r->pool, id.len + 64);
    if (msg == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ngx_sprintf(msg, "The model '%V' does not exist%Z", &id);

    return ngx_http_llm_send_error(r, NGX_HTTP_NOT_FOUND, (char *) msg,
                                   &param, "model_not_found");
}


/*
 * llm_api error, the target of error_page for the errors nginx raises
 * before a location's handler runs: r->err_status holds nginx's status.
 * The body is left alone (its framing may be what was wrong) and the
 * connection closes, as nginx does for these.
 */
static ngx_int_t
ngx_http_llm_nginx_error(ngx_http_request_t *r)
{
    char        *msg, *code;
    ngx_uint_t   status;

    status = r->err_status;

    switch (status) {

    case NGX_HTTP_BAD_REQUEST:
        msg = "malformed HTTP request: a bad request line, header or "
              "chunk size, no Host, or both Content-Length and "
              "Transfer-Encoding";
        code = "bad_request";
        break;

    case NGX_HTTP_REQUEST_TIME_OUT:
        msg = "the request was not received in time";
        code = "request_timeout";
        break;

    case NGX_HTTP_LENGTH_REQUIRED:
        msg = "the request needs a Content-Length or a chunked body";
        code = "length_required";
        break;

    case NGX_HTTP_REQUEST_ENTITY_TOO_LARGE:
        msg = "the request body is too large";
        code = "request_too_large";
        break;

    case NGX_HTTP_REQUEST_URI_TOO_LARGE:
        msg = "the request URI is too long";
        code = "uri_too_long";
        break;

    case NGX_HTTP_REQUEST_HEADER_TOO_LARGE:
        status = NGX_HTTP_BAD_REQUEST;
        msg = "a request header, or the headers together, are too large";
        code = "request_header_too_large";
        break;

    case NGX_HTTP_NOT_IMPLEMENTED:
        msg = "the request's Transfer-Encoding is not implemented";
        code = "not_implemented";
        break;

    case NGX_HTTP_VERSION_NOT_SUPPORTED:
        msg = "the request's HTTP version is not supported";
        code = "http_version_not_supported";
        break;

    default:
        if (status < NGX_HTTP_BAD_REQUEST) {
            /* reached without an error: nothing to report */
            status = NGX_HTTP_NOT_FOUND;
            msg = "no such endpoint: see the API documentation";
            code = "not_found";
            break;
        }

        msg = "the server failed to handle the request";
        code = "server_error";
    }

    r->err_status = status;
    r->keepalive = 0;

    return ngx_http_llm_send_error(r, status, msg, NULL, code);
}


ngx_int_t
ngx_http_llm_info_handler(ngx_http_request_t *r)
{
    uint64_t                   pool;
    ngx_int_t                  rc, route;
    ngx_str_t                  model, *only;
    ngx_uint_t                 ready;
    ngx_http_llm_wbuf_t        w;
    ngx_http_llm_loc_conf_t   *llcf;
    ngx_http_llm_main_conf_t  *lmcf;

    llcf = ngx_http_get_module_loc_conf(r, ngx_http_llm_module);
    lmcf = ngx_http_get_module_main_conf(r, ngx_http_llm_module);

    if (llcf->api == NGX_HTTP_LLM_API_ERROR) {
        return ngx_http_llm_nginx_error(r);
    }

    rc = ngx_http_discard_request_body(r);
    if (rc != NGX_OK) {
        return rc;
    }

    if (llcf->api == NGX_HTTP_LLM_API_NOT_FOUND) {
        return ngx_http_llm_send_error(r, NGX_HTTP_NOT_FOUND,
                                       "no such endpoint: see the API "
                                       "documentation", NULL,
                                       "model_not_found");
    }

    if (llcf->api == NGX_HTTP_LLM_API_ADMIN) {
        return ngx_http_llm_admin(r);
    }

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
        return ngx_http_llm_send_error(r, NGX_HTTP_NOT_ALLOWED,
                                       "this endpoint answers GET", NULL,
                                       "method_not_allowed");
    }

    ngx_http_llm_wbuf_init(&w, r->pool);

    if (llcf->api == NGX_HTTP_LLM_API_MODELS) {
        return ngx_http_llm_models(r, lmcf, &w);
    }

    /* /health: 200 when the route (?model=, else every route) can serve */
    rc = ngx_http_llm_arg(r, "model", &model);
    if (rc == NGX_ERROR) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    only = (rc == NGX_OK) ? &model : NULL;

    if (only
        && ngx_http_llm_route_find(lmcf, only, &route, &pool) != NGX_OK)
    {
        return ngx_http_llm_send_model_not_found(r, only);
    }

    ngx_http_llm_status_json(lmcf, &w, only, &ready);

    return ngx_http_llm_send_json(r, ready ? NGX_HTTP_OK
                                           : NGX_HTTP_SERVICE_UNAVAILABLE,
                                  &w);
}
