/*
 * The API request life cycle: method and size checks, X-Request-Id, the
 * request body, validation, routing, and the error responses.
 */

#include "ngx_http_llm_module.h"


typedef struct {
    ngx_http_request_t        *request;
    ngx_http_llm_req_t         req;
    ngx_str_t                  request_id;     /* X-Request-Id */
} ngx_http_llm_ctx_t;


static void ngx_http_llm_body_handler(ngx_http_request_t *r);


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


/* an OpenAI error response; 429 and 503 carry Retry-After */
ngx_int_t
ngx_http_llm_send_error(ngx_http_request_t *r, ngx_uint_t status,
    const char *message, ngx_str_t *param, const char *code)
{
    ngx_str_t                  msg, cd, value;
    ngx_http_llm_wbuf_t        body;
    ngx_http_llm_main_conf_t  *lmcf;

    lmcf = ngx_http_get_module_main_conf(r, ngx_http_llm_module);

    msg.data = (u_char *) message;
    msg.len = ngx_strlen(message);
    cd.data = (u_char *) code;
    cd.len = code ? ngx_strlen(code) : 0;

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
        ngx_http_llm_loc_conf_t  *llcf;

        llcf = ngx_http_get_module_loc_conf(r, ngx_http_llm_module);

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
    ngx_http_llm_error_body(&body, status, &msg, param, &cd);

    return ngx_http_llm_send_json(r, status, &body);
}


static ngx_int_t
ngx_http_llm_send_req_error(ngx_http_request_t *r, ngx_http_llm_req_t *req)
{
    ngx_str_t            *param;
    ngx_http_llm_wbuf_t   body;

    param = req->err_param.len ? &req->err_param : NULL;

    ngx_http_llm_wbuf_init(&body, r->pool);
    ngx_http_llm_error_body(&body, req->status, &req->err_message, param,
                            &req->err_code);

    return ngx_http_llm_send_json(r, req->status, &body);
}


ngx_int_t
ngx_http_llm_handler(ngx_http_request_t *r)
{
    ngx_int_t                 rc;
    ngx_http_llm_ctx_t       *ctx;
    ngx_http_llm_loc_conf_t  *llcf;

    llcf = ngx_http_get_module_loc_conf(r, ngx_http_llm_module);

    ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_llm_ctx_t));
    if (ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ctx->request = r;
    ctx->req.api = llcf->api;

    ngx_http_set_ctx(r, ctx, ngx_http_llm_module);

    if (ngx_http_llm_request_id(r, ctx) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (!ngx_http_llm_api_generates(llcf->api)) {
        rc = ngx_http_discard_request_body(r);
        if (rc != NGX_OK) {
            return rc;
        }

        if (llcf->api == NGX_HTTP_LLM_API_NOT_FOUND) {
            return ngx_http_llm_send_error(r, NGX_HTTP_NOT_FOUND,
                                           "no such endpoint: see /v1/models "
                                           "and the API documentation",
                                           NULL, "model_not_found");
        }

        if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
            return ngx_http_llm_send_error(r, NGX_HTTP_NOT_ALLOWED,
                                           "this endpoint answers GET", NULL,
                                           "method_not_allowed");
        }

        return ngx_http_llm_send_error(r, NGX_HTTP_SERVICE_UNAVAILABLE,
                                       "this endpoint is not built yet",
                                       NULL, "service_unavailable");
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

    rc = ngx_http_read_client_request_body(r, ngx_http_llm_body_handler);

    if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        return rc;
    }

    return NGX_DONE;
}


/*
 * The body as one contiguous buffer.  nginx keeps a body larger than
 * client_body_buffer_size in a temporary file it just wrote; reading that
 * back is a page-cache copy, as nginx itself does for such bodies.
 */
static ngx_int_t
ngx_http_llm_body(ngx_http_request_t *r, ngx_str_t *body)
{
    off_t         len;
    u_char       *p;
    ssize_t       n;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    ngx_str_null(body);

    if (r->request_body == NULL) {
        return NGX_OK;
    }

    len = 0;

    for (cl = r->request_body->bufs; cl; cl = cl->next) {
        len += ngx_buf_size(cl->buf);
    }

    if (len == 0) {
        return NGX_OK;
    }

    p = ngx_pnalloc(r->pool, len);
    if (p == NULL) {
        return NGX_ERROR;
    }

    body->data = p;
    body->len = len;

    for (cl = r->request_body->bufs; cl; cl = cl->next) {
        b = cl->buf;

        if (b->in_file) {
            n = ngx_read_file(b->file, p, b->file_last - b->file_pos,
                              b->file_pos);
            if (n != b->file_last - b->file_pos) {
                return NGX_ERROR;
            }

            p += n;
            continue;
        }

        p = ngx_cpymem(p, b->pos, b->last - b->pos);
    }

    return NGX_OK;
}


static void
ngx_http_llm_body_handler(ngx_http_request_t *r)
{
    ngx_int_t                  rc, route;
    uint64_t                   pool;
    ngx_str_t                  body;
    ngx_http_llm_ctx_t        *ctx;
    ngx_http_llm_loc_conf_t   *llcf;
    ngx_http_llm_main_conf_t  *lmcf;

    ctx = ngx_http_get_module_ctx(r, ngx_http_llm_module);
    llcf = ngx_http_get_module_loc_conf(r, ngx_http_llm_module);
    lmcf = ngx_http_get_module_main_conf(r, ngx_http_llm_module);

    if (ngx_http_llm_body(r, &body) != NGX_OK) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    if (body.len > llcf->max_body_size) {
        rc = ngx_http_llm_send_error(r, NGX_HTTP_REQUEST_ENTITY_TOO_LARGE,
                                     "the request body is larger than "
                                     "llm_max_body_size", NULL,
                                     "request_too_large");
        ngx_http_finalize_request(r, rc);
        return;
    }

    rc = ngx_http_llm_request_parse(r->pool, &ctx->req, body.data, body.len);

    if (rc == NGX_ERROR
        || (rc == NGX_DECLINED && ctx->req.status == 0))
    {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    if (rc == NGX_DECLINED) {
        ngx_http_finalize_request(r, ngx_http_llm_send_req_error(r,
                                                                 &ctx->req));
        return;
    }

    if (ngx_http_llm_route_find(lmcf, &ctx->req.model, &route, &pool)
        != NGX_OK)
    {
        ngx_str_t  param = ngx_string("model");
        u_char    *msg;

        msg = ngx_pnalloc(r->pool, ctx->req.model.len + 128);
        if (msg == NULL) {
            ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
            return;
        }

        ngx_sprintf(msg, "the model \"%V\" does not exist: see /v1/models%Z",
                    &ctx->req.model);

        rc = ngx_http_llm_send_error(r, NGX_HTTP_NOT_FOUND, (char *) msg,
                                     &param, "model_not_found");
        ngx_http_finalize_request(r, rc);
        return;
    }

    rc = ngx_http_llm_send_error(r, NGX_HTTP_SERVICE_UNAVAILABLE,
                                 "no engine connection yet", NULL,
                                 "service_unavailable");
    ngx_http_finalize_request(r, rc);
}


ngx_int_t
ngx_http_llm_log_handler(ngx_http_request_t *r)
{
    return NGX_OK;
}
