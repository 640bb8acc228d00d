/*
 * Request validation: an OpenAI request body in, the canonical engine
 * request out (docs/NGINX.md, "Canonical engine request").
 *
 * Every known field is checked for type and range; a bad one is a 400
 * naming the field as "param".  Unknown fields are ignored.  The output is
 * compact JSON written from the validated values only, so the engine never
 * sees a field nginx did not check.  The Responses API is converted to chat
 * messages here, so the engine knows two generation kinds: chat (an OpenAI
 * chat request, as `llm-engine render` takes it) and completion.
 */

#include "ngx_http_llm_module.h"


typedef struct {
    ngx_pool_t            *pool;
    ngx_http_llm_req_t    *req;
    ngx_http_llm_wbuf_t    out;          /* canonical request */
    ngx_http_llm_wbuf_t    echo;         /* responses: echoed fields */
    ngx_array_t            tools;        /* ngx_str_t: declared tool names */
    ngx_int_t              thinking;     /* -1 unset, 0, 1 */
    int64_t                max_tokens;   /* 0: the engine's default */
} ngx_http_llm_vctx_t;


typedef struct {
    const char            *name;
    unsigned               integer:1;
    unsigned               min_open:1;   /* the minimum itself is excluded */
    double                 min;
    double                 max;
} ngx_http_llm_range_t;


/* sampling parameters shared by every generating endpoint */
#define ngx_http_llm_range(name, integer, min_open, min, max)               \
    { #name, integer, min_open, min, max },

static ngx_http_llm_range_t  ngx_http_llm_sampling[] = {
    LLM_REQ_SAMPLING(ngx_http_llm_range)
    { NULL, 0, 0, 0, 0 }
};


static const char  *ngx_http_llm_efforts[] = { LLM_REQ_EFFORTS, NULL };


/* ---- errors ------------------------------------------------------------ */

static ngx_str_t *
ngx_http_llm_path(ngx_http_llm_vctx_t *ctx, const char *fmt, ...)
{
    u_char     *p;
    va_list     args;
    ngx_str_t  *s;

    s = ngx_palloc(ctx->pool, sizeof(ngx_str_t));
    if (s == NULL) {
        return NULL;
    }

    s->data = ngx_pnalloc(ctx->pool, 256);
    if (s->data == NULL) {
        return NULL;
    }

    va_start(args, fmt);
    p = ngx_vslprintf(s->data, s->data + 256, fmt, args);
    va_end(args);

    s->len = p - s->data;

    return s;
}


/* "<param> <what>": sets a 400 on the request, returns NGX_DECLINED */
static ngx_int_t
ngx_http_llm_bad(ngx_http_llm_vctx_t *ctx, ngx_str_t *param,
    const char *fmt, ...)
{
    u_char              *p, *last;
    va_list              args;
    ngx_http_llm_req_t  *req = ctx->req;

    if (param == NULL) {
        return NGX_ERROR;
    }

    req->status = NGX_HTTP_BAD_REQUEST;
    req->err_param = *param;

    p = ngx_pnalloc(ctx->pool, 1024);
    if (p == NULL) {
        return NGX_ERROR;
    }

    last = p + 1024;
    req->err_message.data = p;

    p = ngx_slprintf(p, last, "%V ", param);

    va_start(args, fmt);
    p = ngx_vslprintf(p, last, fmt, args);
    va_end(args);

    req->err_message.len = p - req->err_message.data;

    return NGX_DECLINED;
}


/* a request feature this server does not provide */
static ngx_int_t
ngx_http_llm_unsupported(ngx_http_llm_vctx_t *ctx, const char *param,
    const char *why)
{
    ngx_int_t  rc;

    rc = ngx_http_llm_bad(ctx, ngx_http_llm_path(ctx, "%s", param), "%s",
                          why);
    ngx_str_set(&ctx->req->err_code, "unsupported_parameter");

    return rc;
}


/* fields asked for that this server does not provide: each present one of
 * a NULL-terminated table is refused with its reason */
typedef struct {
    const char  *name;
    const char  *why;
} ngx_http_llm_refusal_t;


static ngx_int_t
ngx_http_llm_refuse(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *body,
    const ngx_http_llm_refusal_t *r)
{
    for ( /* void */ ; r->name; r++) {
        if (ngx_http_llm_json_member(body, r->name)) {
            return ngx_http_llm_unsupported(ctx, r->name, r->why);
        }
    }

    return NGX_OK;
}


/* name of a member for messages: "prefix.name" or "name" */
static ngx_str_t *
ngx_http_llm_member_path(ngx_http_llm_vctx_t *ctx, ngx_str_t *prefix,
    const char *name)
{
    if (prefix == NULL || prefix->len == 0) {
        return ngx_http_llm_path(ctx, "%s", name);
    }

    return ngx_http_llm_path(ctx, "%V.%s", prefix, name);
}


/* ---- typed members ----------------------------------------------------- */

/* optional boolean member: *out stays as is when absent */
static ngx_int_t
ngx_http_llm_get_bool(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *obj,
    ngx_str_t *prefix, const char *name, ngx_int_t *out)
{
    ngx_http_llm_json_t  *v;

    v = ngx_http_llm_json_member(obj, name);
    if (v == NULL) {
        return NGX_OK;
    }

    if (v->type != NGX_HTTP_LLM_JSON_TRUE
        && v->type != NGX_HTTP_LLM_JSON_FALSE)
    {
        return ngx_http_llm_bad(ctx, ngx_http_llm_member_path(ctx, prefix,
                                                              name),
                                "must be a boolean, not %s",
                                ngx_http_llm_json_type_name(v));
    }

    *out = (v->type == NGX_HTTP_LLM_JSON_TRUE);

    return NGX_OK;
}


/* optional integer member in [min, max]: *set tells whether present */
static ngx_int_t
ngx_http_llm_get_int(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *obj,
    ngx_str_t *prefix, const char *name, int64_t min, int64_t max,
    int64_t *out, ngx_uint_t *set)
{
    ngx_int_t             rc;
    ngx_http_llm_json_t  *v;

    *set = 0;

    v = ngx_http_llm_json_member(obj, name);
    if (v == NULL) {
        return NGX_OK;
    }

    rc = ngx_http_llm_json_int(v, out);

    if (rc == NGX_ABORT) {
        return ngx_http_llm_bad(ctx, ngx_http_llm_member_path(ctx, prefix,
                                                              name),
                                "must be between %L and %L, got %V",
                                min, max, &v->value);
    }

    if (rc != NGX_OK) {
        return ngx_http_llm_bad(ctx, ngx_http_llm_member_path(ctx, prefix,
                                                              name),
                                "must be an integer, not %s%s",
                                ngx_http_llm_json_type_name(v),
                                v->type == NGX_HTTP_LLM_JSON_NUMBER
                                ? " with a fraction" : "");
    }

    if (*out < min || *out > max) {
        return ngx_http_llm_bad(ctx, ngx_http_llm_member_path(ctx, prefix,
                                                              name),
                                "must be between %L and %L, got %L",
                                min, max, *out);
    }

    *set = 1;

    return NGX_OK;
}


/* optional string member: *out NULL when absent */
static ngx_int_t
ngx_http_llm_get_string(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *obj,
    ngx_str_t *prefix, const char *name, ngx_http_llm_json_t **out)
{
    ngx_http_llm_json_t  *v;

    *out = NULL;

    v = ngx_http_llm_json_member(obj, name);
    if (v == NULL) {
        return NGX_OK;
    }

    if (v->type != NGX_HTTP_LLM_JSON_STRING) {
        return ngx_http_llm_bad(ctx, ngx_http_llm_member_path(ctx, prefix,
                                                              name),
                                "must be a string, not %s",
                                ngx_http_llm_json_type_name(v));
    }

    *out = v;

    return NGX_OK;
}


static ngx_int_t
ngx_http_llm_need_string(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *obj,
    ngx_str_t *prefix, const char *name, ngx_http_llm_json_t **out)
{
    if (ngx_http_llm_get_string(ctx, obj, prefix, name, out) != NGX_OK) {
        return NGX_DECLINED;
    }

    if (*out == NULL) {
        return ngx_http_llm_bad(ctx, ngx_http_llm_member_path(ctx, prefix,
                                                              name),
                                "is required");
    }

    return NGX_OK;
}


/* optional member that must have one JSON type */
static ngx_int_t
ngx_http_llm_get_typed(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *obj,
    ngx_str_t *prefix, const char *name, ngx_http_llm_json_type_e type,
    ngx_http_llm_json_t **out)
{
    ngx_http_llm_json_t  *v;

    *out = NULL;

    v = ngx_http_llm_json_member(obj, name);
    if (v == NULL) {
        return NGX_OK;
    }

    if (v->type != type) {
        return ngx_http_llm_bad(ctx, ngx_http_llm_member_path(ctx, prefix,
                                                              name),
                                "must be %s, not %s",
                                type == NGX_HTTP_LLM_JSON_OBJECT
                                ? "an object" : "an array",
                                ngx_http_llm_json_type_name(v));
    }

    *out = v;

    return NGX_OK;
}


/* an array of strings (NULL in *out when absent); a 400 naming the first
 * element that is not one */
static ngx_int_t
ngx_http_llm_get_strings(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *obj,
    const char *name, ngx_http_llm_json_t **out)
{
    ngx_uint_t            i;
    ngx_http_llm_json_t  *v;

    if (ngx_http_llm_get_typed(ctx, obj, NULL, name, NGX_HTTP_LLM_JSON_ARRAY,
                               out)
        != NGX_OK)
    {
        return NGX_DECLINED;
    }

    for (i = 0, v = *out ? (*out)->child : NULL; v; i++, v = v->next) {
        if (v->type != NGX_HTTP_LLM_JSON_STRING) {
            return ngx_http_llm_bad(ctx, ngx_http_llm_path(ctx, "%s[%ui]",
                                                           name, i),
                                    "must be a string, not %s",
                                    ngx_http_llm_json_type_name(v));
        }
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_llm_one_of(ngx_http_llm_json_t *v, const char **names)
{
    ngx_uint_t  i;

    for (i = 0; names[i]; i++) {
        if (ngx_http_llm_json_is_string(v, names[i])) {
            return 1;
        }
    }

    return 0;
}


/* a tool or schema name: [A-Za-z0-9_-]{1,64}, safe inside DSML markup */
static ngx_int_t
ngx_http_llm_check_name(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *v,
    ngx_str_t *param)
{
    u_char      c;
    ngx_uint_t  i;

    if (v->value.len == 0 || v->value.len > LLM_REQ_TOOL_NAME_MAX) {
        return ngx_http_llm_bad(ctx, param,
                                "must be 1 to %d characters long",
                                LLM_REQ_TOOL_NAME_MAX);
    }

    for (i = 0; i < v->value.len; i++) {
        c = v->value.data[i];

        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
            || (c >= '0' && c <= '9') || c == '_' || c == '-')
        {
            continue;
        }

        return ngx_http_llm_bad(ctx, param,
                                "may contain only letters, digits, "
                                "underscores and dashes");
    }

    return NGX_OK;
}


/* element i of an array that must hold objects: its path in *p */
static ngx_int_t
ngx_http_llm_element(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *v,
    ngx_str_t *array, ngx_uint_t i, ngx_str_t **p)
{
    *p = ngx_http_llm_path(ctx, "%V[%ui]", array, i);
    if (*p == NULL) {
        return NGX_ERROR;
    }

    if (v->type != NGX_HTTP_LLM_JSON_OBJECT) {
        return ngx_http_llm_bad(ctx, *p, "must be an object, not %s",
                                ngx_http_llm_json_type_name(v));
    }

    return NGX_OK;
}


/* ---- canonical output -------------------------------------------------- */

/* ,"name":<v> when v is there */
static void
ngx_http_llm_put_member(ngx_http_llm_vctx_t *ctx, const char *name,
    ngx_http_llm_json_t *v)
{
    if (v) {
        ngx_http_llm_printf(&ctx->out, ",\"%s\":", name);
        ngx_http_llm_put_json(&ctx->out, v);
    }
}


/* ,"name":true|false when b was set (not -1) */
static void
ngx_http_llm_put_bool(ngx_http_llm_vctx_t *ctx, const char *name,
    ngx_int_t b)
{
    if (b != -1) {
        ngx_http_llm_printf(&ctx->out, ",\"%s\":%s", name,
                            b ? "true" : "false");
    }
}


/* one tool call in the chat shape */
static void
ngx_http_llm_put_call(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *id,
    ngx_http_llm_json_t *name, ngx_http_llm_json_t *args)
{
    ngx_http_llm_puts(&ctx->out, "{\"id\":");
    ngx_http_llm_put_json(&ctx->out, id);
    ngx_http_llm_puts(&ctx->out,
                      ",\"type\":\"function\",\"function\":{\"name\":");
    ngx_http_llm_put_json(&ctx->out, name);
    ngx_http_llm_puts(&ctx->out, ",\"arguments\":");
    ngx_http_llm_put_json(&ctx->out, args);
    ngx_http_llm_puts(&ctx->out, "}}");
}


/* ---- shared parts ------------------------------------------------------ */

static ngx_int_t
ngx_http_llm_model(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *body)
{
    ngx_http_llm_json_t  *v;

    if (ngx_http_llm_need_string(ctx, body, NULL, "model", &v) != NGX_OK) {
        return NGX_DECLINED;
    }

    if (v->value.len == 0) {
        return ngx_http_llm_bad(ctx, ngx_http_llm_path(ctx, "model"),
                                "must not be empty");
    }

    ctx->req->model = v->value;

    return NGX_OK;
}


/*
 * logit_bias: {"token id": bias}, ids as decimal strings, biases from -100
 * to 100; the engine checks the ids against its vocabulary.  Written as
 * given (a repeated id: the last one wins, as in Python).
 */
static ngx_int_t
ngx_http_llm_logit_bias(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *body)
{
    double                d;
    ngx_uint_t            i;
    ngx_http_llm_json_t  *lb, *m;

    if (ngx_http_llm_get_typed(ctx, body, NULL, "logit_bias",
                               NGX_HTTP_LLM_JSON_OBJECT, &lb)
        != NGX_OK)
    {
        return NGX_DECLINED;
    }

    if (lb == NULL || lb->count == 0) {
        return NGX_OK;
    }

    ngx_http_llm_puts(&ctx->out, ",\"logit_bias\":{");

    for (m = lb->child; m; m = m->next) {

        for (i = 0; i < m->key.len && m->key.data[i] >= '0'
                    && m->key.data[i] <= '9';
             i++)
        {
            /* void */
        }

        if (m->key.len == 0 || m->key.len > 10 || i != m->key.len) {
            return ngx_http_llm_bad(ctx, ngx_http_llm_path(ctx,
                                                           "logit_bias"),
                                    "keys must be token ids (decimal "
                                    "integers), not \"%V\"", &m->key);
        }

        if (ngx_http_llm_json_double(m, &d) != NGX_OK
            || d < -100 || d > 100)
        {
            return ngx_http_llm_bad(ctx, ngx_http_llm_path(ctx,
                                                           "logit_bias"),
                                    "bias of token %V must be a number "
                                    "from -100 to 100", &m->key);
        }

        ngx_http_llm_printf(&ctx->out, "\"%V\":", &m->key);
        ngx_http_llm_put_str(&ctx->out, &m->value);

        if (m->next) {
            ngx_http_llm_puts(&ctx->out, ",");
        }
    }

    ngx_http_llm_puts(&ctx->out, "}");

    return NGX_OK;
}


static ngx_int_t
ngx_http_llm_sampling_params(ngx_http_llm_vctx_t *ctx,
    ngx_http_llm_json_t *body)
{
    double                 d;
    ngx_int_t              rc;
    int64_t                n;
    ngx_uint_t             set;
    ngx_http_llm_json_t   *v;
    ngx_http_llm_range_t  *r;

    for (r = ngx_http_llm_sampling; r->name; r++) {

        v = ngx_http_llm_json_member(body, r->name);
        if (v == NULL) {
            continue;
        }

        if (r->integer) {
            if (ngx_http_llm_get_int(ctx, body, NULL, r->name,
                                     (int64_t) r->min, (int64_t) r->max,
                                     &n, &set)
                != NGX_OK)
            {
                return NGX_DECLINED;
            }

            ngx_http_llm_printf(&ctx->out, ",\"%s\":%L", r->name, n);
            continue;
        }

        rc = ngx_http_llm_json_double(v, &d);

        if (rc == NGX_DECLINED) {
            return ngx_http_llm_bad(ctx, ngx_http_llm_path(ctx, "%s",
                                                           r->name),
                                    "must be a number, not %s",
                                    ngx_http_llm_json_type_name(v));
        }

        if (rc == NGX_ABORT || d < r->min || d > r->max
            || (r->min_open && d == r->min))
        {
            return ngx_http_llm_bad(ctx, ngx_http_llm_path(ctx, "%s",
                                                           r->name),
                                    "must be %s %.1f and at most %.1f, "
                                    "got %V",
                                    r->min_open ? "greater than"
                                                : "at least",
                                    r->min, r->max, &v->value);
        }

        ngx_http_llm_printf(&ctx->out, ",\"%s\":", r->name);
        ngx_http_llm_put_str(&ctx->out, &v->value);
    }

    if (ngx_http_llm_get_int(ctx, body, NULL, "seed", INT64_MIN, INT64_MAX,
                             &n, &set)
        != NGX_OK)
    {
        return NGX_DECLINED;
    }

    if (set) {
        ngx_http_llm_printf(&ctx->out, ",\"seed\":%L", n);
    }

    return ngx_http_llm_logit_bias(ctx, body);
}


static ngx_int_t
ngx_http_llm_stop(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *body)
{
    ngx_uint_t            i;
    ngx_http_llm_json_t  *v, *s;

    v = ngx_http_llm_json_member(body, "stop");
    if (v == NULL) {
        return NGX_OK;
    }

    if (v->type == NGX_HTTP_LLM_JSON_STRING) {
        if (v->value.len == 0) {
            return ngx_http_llm_bad(ctx, ngx_http_llm_path(ctx, "stop"),
                                    "must not be an empty string");
        }

        ngx_http_llm_puts(&ctx->out, ",\"stop\":[");
        ngx_http_llm_put_json(&ctx->out, v);
        ngx_http_llm_puts(&ctx->out, "]");
        return NGX_OK;
    }

    if (v->type != NGX_HTTP_LLM_JSON_ARRAY) {
        return ngx_http_llm_bad(ctx, ngx_http_llm_path(ctx, "stop"),
                                "must be a string or an array of strings, "
                                "not %s", ngx_http_llm_json_type_name(v));
    }

    if (v->count > LLM_REQ_STOP_MAX) {
        return ngx_http_llm_bad(ctx, ngx_http_llm_path(ctx, "stop"),
                                "may hold at most %d strings, got %ui",
                                LLM_REQ_STOP_MAX, v->count);
    }

    for (s = v->child, i = 0; s; s = s->next, i++) {
        if (s->type != NGX_HTTP_LLM_JSON_STRING || s->value.len == 0) {
            return ngx_http_llm_bad(ctx, ngx_http_llm_path(ctx, "stop[%ui]",
                                                           i),
                                    "must be a non-empty string");
        }
    }

    if (v->count) {
        ngx_http_llm_put_member(ctx, "stop", v);
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_llm_stream(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *body)
{
    ngx_int_t             stream, usage;
    ngx_str_t             prefix = ngx_string("stream_options");
    ngx_http_llm_json_t  *opts;

    stream = 0;
    usage = 0;

    if (ngx_http_llm_get_bool(ctx, body, NULL, "stream", &stream) != NGX_OK
        || ngx_http_llm_get_typed(ctx, body, NULL, "stream_options",
                                  NGX_HTTP_LLM_JSON_OBJECT, &opts)
           != NGX_OK)
    {
        return NGX_DECLINED;
    }

    if (opts) {
        if (!stream) {
            return ngx_http_llm_bad(ctx, &prefix,
                                    "is only allowed when stream is true");
        }

        if (ngx_http_llm_get_bool(ctx, opts, &prefix, "include_usage",
                                  &usage)
            != NGX_OK)
        {
            return NGX_DECLINED;
        }
    }

    ctx->req->stream = stream;
    ctx->req->include_usage = usage;

    return NGX_OK;
}


/*
 * n: choices, each a sequence of its own in the engine (which counts
 * them against max_num_seqs and refuses more than it runs at once)
 */
static ngx_int_t
ngx_http_llm_choices(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *body)
{
    int64_t     n;
    ngx_uint_t  set;

    if (ngx_http_llm_get_int(ctx, body, NULL, "n", 1, LLM_IPC_MAX_CHOICES,
                             &n, &set)
        != NGX_OK)
    {
        return NGX_DECLINED;
    }

    ctx->req->n = set ? (ngx_uint_t) n : 1;

    if (ctx->req->n > 1) {
        ngx_http_llm_printf(&ctx->out, ",\"n\":%L", n);
    }

    return NGX_OK;
}


/* best_of: one candidate per choice */
static ngx_int_t
ngx_http_llm_one_choice(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *body,
    const char *name)
{
    int64_t     n;
    ngx_uint_t  set;

    if (ngx_http_llm_get_int(ctx, body, NULL, name, 1, 128, &n, &set)
        != NGX_OK)
    {
        return NGX_DECLINED;
    }

    if (set && n != 1) {
        return ngx_http_llm_unsupported(ctx, name,
                                        "must be 1: this server samples "
                                        "each choice once (use n for more "
                                        "choices)");
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_llm_max_tokens(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *body,
    const char *name, int64_t dflt)
{
    int64_t     n;
    ngx_uint_t  set;

    if (ngx_http_llm_get_int(ctx, body, NULL, name, 1, INT32_MAX, &n, &set)
        != NGX_OK)
    {
        return NGX_DECLINED;
    }

    if (!set) {
        if (dflt == 0) {
            return NGX_OK;
        }

        n = dflt;
    }

    ctx->max_tokens = n;
    ngx_http_llm_printf(&ctx->out, ",\"max_tokens\":%L", n);

    return NGX_OK;
}


/* vLLM's extensions the engine honours: min_tokens, ignore_eos,
   skip_special_tokens (after max_tokens, which min_tokens must not pass) */
static ngx_int_t
ngx_http_llm_vllm_params(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *body)
{
    int64_t     n;
    ngx_int_t   ignore, skip;
    ngx_uint_t  set;

    ignore = -1;
    skip = -1;

    if (ngx_http_llm_get_int(ctx, body, NULL, "min_tokens", 0, INT32_MAX, &n,
                             &set)
        != NGX_OK
        || ngx_http_llm_get_bool(ctx, body, NULL, "ignore_eos", &ignore)
           != NGX_OK
        || ngx_http_llm_get_bool(ctx, body, NULL, "skip_special_tokens",
                                 &skip)
           != NGX_OK)
    {
        return NGX_DECLINED;
    }

    if (set) {
        if (ctx->max_tokens && n > ctx->max_tokens) {
            return ngx_http_llm_bad(ctx, ngx_http_llm_path(ctx, "min_tokens"),
                                    "must not exceed the maximum of %L "
                                    "tokens", ctx->max_tokens);
        }

        ngx_http_llm_printf(&ctx->out, ",\"min_tokens\":%L", n);
    }

    ngx_http_llm_put_bool(ctx, "ignore_eos", ignore);
    ngx_http_llm_put_bool(ctx, "skip_special_tokens", skip);

    return NGX_OK;
}


static ngx_int_t
ngx_http_llm_effort(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *obj,
    ngx_str_t *prefix, const char *name, ngx_http_llm_json_t **out)
{
    ngx_http_llm_json_t  *v;

    if (ngx_http_llm_get_string(ctx, obj, prefix, name, &v) != NGX_OK) {
        return NGX_DECLINED;
    }

    if (v == NULL) {
        return NGX_OK;
    }

    if (!ngx_http_llm_one_of(v, ngx_http_llm_efforts)) {
        return ngx_http_llm_bad(ctx, ngx_http_llm_member_path(ctx, prefix,
                                                              name),
                                "must be one of " LLM_REQ_EFFORTS_TEXT);
    }

    *out = v;

    return NGX_OK;
}


/* ---- chat messages ----------------------------------------------------- */

/* content: a string, or an array of text parts */
static ngx_int_t
ngx_http_llm_content(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *v,
    ngx_str_t *param, const char **types)
{
    ngx_int_t             rc;
    ngx_uint_t            i;
    ngx_str_t            *p;
    ngx_http_llm_json_t  *part, *type, *text;

    if (v->type == NGX_HTTP_LLM_JSON_STRING) {
        ngx_http_llm_put_json(&ctx->out, v);
        return NGX_OK;
    }

    if (v->type != NGX_HTTP_LLM_JSON_ARRAY) {
        return ngx_http_llm_bad(ctx, param,
                                "must be a string or an array of text parts, "
                                "not %s", ngx_http_llm_json_type_name(v));
    }

    ngx_http_llm_puts(&ctx->out, "[");

    for (part = v->child, i = 0; part; part = part->next, i++) {

        rc = ngx_http_llm_element(ctx, part, param, i, &p);
        if (rc != NGX_OK) {
            return rc;
        }

        type = ngx_http_llm_json_member(part, "type");

        if (type == NULL || type->type != NGX_HTTP_LLM_JSON_STRING) {
            return ngx_http_llm_bad(ctx, p, "needs a \"type\" string");
        }

        if (!ngx_http_llm_one_of(type, types)) {
            return ngx_http_llm_bad(ctx, p, "has type \"%V\": only text "
                                    "content is supported", &type->value);
        }

        if (ngx_http_llm_need_string(ctx, part, p, "text", &text)
            != NGX_OK)
        {
            return NGX_DECLINED;
        }

        ngx_http_llm_puts(&ctx->out, "{\"type\":\"text\",\"text\":");
        ngx_http_llm_put_json(&ctx->out, text);
        ngx_http_llm_puts(&ctx->out, part->next ? "}," : "}");
    }

    ngx_http_llm_puts(&ctx->out, "]");

    return NGX_OK;
}


/* arguments of a tool call: a string holding a JSON object */
static ngx_int_t
ngx_http_llm_arguments(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *v,
    ngx_str_t *param)
{
    ngx_str_t             err, where;
    ngx_http_llm_json_t  *args;

    args = ngx_http_llm_json_parse(ctx->pool, v->value.data, v->value.len,
                                   &err, &where);

    if (args == NULL && err.len == 0) {
        return NGX_ERROR;
    }

    if (args == NULL || args->type != NGX_HTTP_LLM_JSON_OBJECT) {
        return ngx_http_llm_bad(ctx, param,
                                "must be a JSON object encoded as a string%s"
                                "%V", args ? "" : ": ", &err);
    }

    return NGX_OK;
}


/* the function of a tool call: a checked name, arguments as a JSON string */
static ngx_int_t
ngx_http_llm_call_function(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *fn,
    ngx_str_t *p, ngx_http_llm_json_t **name, ngx_http_llm_json_t **args)
{
    if (ngx_http_llm_need_string(ctx, fn, p, "name", name) != NGX_OK
        || ngx_http_llm_check_name(ctx, *name,
                                   ngx_http_llm_path(ctx, "%V.name", p))
           != NGX_OK
        || ngx_http_llm_need_string(ctx, fn, p, "arguments", args)
           != NGX_OK
        || ngx_http_llm_arguments(ctx, *args,
                                  ngx_http_llm_path(ctx, "%V.arguments", p))
           != NGX_OK)
    {
        return NGX_DECLINED;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_llm_tool_calls(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *calls,
    ngx_str_t *param)
{
    ngx_int_t             rc;
    ngx_uint_t            i;
    ngx_str_t            *p, *fp;
    ngx_http_llm_json_t  *call, *id, *type, *fn, *name, *args;

    ngx_http_llm_puts(&ctx->out, ",\"tool_calls\":[");

    for (call = calls->child, i = 0; call; call = call->next, i++) {

        rc = ngx_http_llm_element(ctx, call, param, i, &p);
        if (rc != NGX_OK) {
            return rc;
        }

        if (ngx_http_llm_need_string(ctx, call, p, "id", &id) != NGX_OK) {
            return NGX_DECLINED;
        }

        type = ngx_http_llm_json_member(call, "type");
        if (type && !ngx_http_llm_json_is_string(type, "function")) {
            return ngx_http_llm_bad(ctx, ngx_http_llm_path(ctx, "%V.type", p),
                                    "must be \"function\"");
        }

        fn = ngx_http_llm_json_member(call, "function");
        fp = ngx_http_llm_path(ctx, "%V.function", p);

        if (fn == NULL || fn->type != NGX_HTTP_LLM_JSON_OBJECT) {
            return ngx_http_llm_bad(ctx, fp, "must be an object with name "
                                    "and arguments");
        }

        if (ngx_http_llm_call_function(ctx, fn, fp, &name, &args) != NGX_OK) {
            return NGX_DECLINED;
        }

        ngx_http_llm_put_call(ctx, id, name, args);
        ngx_http_llm_puts(&ctx->out, call->next ? "," : "");
    }

    ngx_http_llm_puts(&ctx->out, "]");

    return NGX_OK;
}


static ngx_int_t
ngx_http_llm_message(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *m,
    ngx_str_t *p)
{
    ngx_str_t            *cp;
    ngx_http_llm_json_t  *role, *content, *name, *calls, *reasoning, *id;

    static const char  *roles[] = {
        "system", "user", "assistant", "tool", "developer", NULL
    };
    static const char  *text_parts[] = { "text", NULL };

    if (ngx_http_llm_need_string(ctx, m, p, "role", &role) != NGX_OK) {
        return NGX_DECLINED;
    }

    if (!ngx_http_llm_one_of(role, roles)) {
        return ngx_http_llm_bad(ctx, ngx_http_llm_path(ctx, "%V.role", p),
                                "must be one of system, user, assistant, "
                                "tool, developer");
    }

    ngx_http_llm_puts(&ctx->out, "{\"role\":");
    ngx_http_llm_put_json(&ctx->out, role);

    calls = NULL;
    reasoning = NULL;

    if (ngx_http_llm_json_is_string(role, "assistant")) {
        if (ngx_http_llm_get_typed(ctx, m, p, "tool_calls",
                                   NGX_HTTP_LLM_JSON_ARRAY, &calls)
            != NGX_OK
            || ngx_http_llm_get_string(ctx, m, p, "reasoning_content",
                                       &reasoning)
               != NGX_OK)
        {
            return NGX_DECLINED;
        }

        if (calls && calls->count == 0) {
            calls = NULL;
        }
    }

    cp = ngx_http_llm_path(ctx, "%V.content", p);
    if (cp == NULL) {
        return NGX_ERROR;
    }

    content = ngx_http_llm_json_member(m, "content");

    if (content) {
        ngx_http_llm_puts(&ctx->out, ",\"content\":");

        if (ngx_http_llm_content(ctx, content, cp, text_parts) != NGX_OK) {
            return NGX_DECLINED;
        }

    } else if (ngx_http_llm_json_is_string(role, "assistant")) {
        if (calls == NULL && reasoning == NULL) {
            return ngx_http_llm_bad(ctx, cp, "is required unless the "
                                    "message has tool_calls");
        }

        ngx_http_llm_puts(&ctx->out, ",\"content\":null");

    } else {
        return ngx_http_llm_bad(ctx, cp, "is required");
    }

    if (ngx_http_llm_get_string(ctx, m, p, "name", &name) != NGX_OK) {
        return NGX_DECLINED;
    }

    ngx_http_llm_put_member(ctx, "name", name);
    ngx_http_llm_put_member(ctx, "reasoning_content", reasoning);

    if (calls
        && ngx_http_llm_tool_calls(ctx, calls,
                                   ngx_http_llm_path(ctx, "%V.tool_calls", p))
           != NGX_OK)
    {
        return NGX_DECLINED;
    }

    if (ngx_http_llm_json_is_string(role, "tool")) {
        if (ngx_http_llm_need_string(ctx, m, p, "tool_call_id", &id)
            != NGX_OK)
        {
            return NGX_DECLINED;
        }

        ngx_http_llm_put_member(ctx, "tool_call_id", id);
    }

    ngx_http_llm_puts(&ctx->out, "}");

    return NGX_OK;
}


static ngx_int_t
ngx_http_llm_messages(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *body)
{
    ngx_uint_t            i;
    ngx_str_t            *p, param = ngx_string("messages");
    ngx_http_llm_json_t  *msgs, *m;

    msgs = ngx_http_llm_json_member(body, "messages");

    if (msgs == NULL || msgs->type != NGX_HTTP_LLM_JSON_ARRAY
        || msgs->count == 0)
    {
        return ngx_http_llm_bad(ctx, &param,
                                "must be a non-empty array of messages%s",
                                msgs ? "" : " and is required");
    }

    ngx_http_llm_puts(&ctx->out, ",\"messages\":[");

    for (m = msgs->child, i = 0; m; m = m->next, i++) {
        if (ngx_http_llm_element(ctx, m, &param, i, &p) != NGX_OK
            || ngx_http_llm_message(ctx, m, p) != NGX_OK)
        {
            return NGX_DECLINED;
        }

        if (m->next) {
            ngx_http_llm_puts(&ctx->out, ",");
        }
    }

    ngx_http_llm_puts(&ctx->out, "]");

    return NGX_OK;
}


/* ---- tools, tool_choice, response_format ------------------------------- */

/*
 * What a function tool and a JSON schema share: a checked name, and
 * optionally a description, an object under "key" (parameters or schema)
 * and strict.  Written as "name":... and the members present.
 */
static ngx_int_t
ngx_http_llm_named_schema(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *obj,
    ngx_str_t *p, const char *key, ngx_http_llm_json_t **name)
{
    ngx_int_t             strict;
    ngx_http_llm_json_t  *desc, *schema;

    strict = -1;

    if (ngx_http_llm_need_string(ctx, obj, p, "name", name) != NGX_OK
        || ngx_http_llm_check_name(ctx, *name,
                                   ngx_http_llm_path(ctx, "%V.name", p))
           != NGX_OK
        || ngx_http_llm_get_string(ctx, obj, p, "description", &desc)
           != NGX_OK
        || ngx_http_llm_get_typed(ctx, obj, p, key, NGX_HTTP_LLM_JSON_OBJECT,
                                  &schema)
           != NGX_OK
        || ngx_http_llm_get_bool(ctx, obj, p, "strict", &strict) != NGX_OK)
    {
        return NGX_DECLINED;
    }

    ngx_http_llm_puts(&ctx->out, "\"name\":");
    ngx_http_llm_put_json(&ctx->out, *name);
    ngx_http_llm_put_member(ctx, "description", desc);
    ngx_http_llm_put_member(ctx, key, schema);
    ngx_http_llm_put_bool(ctx, "strict", strict);

    return NGX_OK;
}


/*
 * One function tool.  "fn" holds name/description/parameters/strict: the
 * chat API nests them under "function", the Responses API puts them flat.
 * Written in the chat shape.
 */
static ngx_int_t
ngx_http_llm_function(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *fn,
    ngx_str_t *p)
{
    ngx_str_t            *name;
    ngx_http_llm_json_t  *v;

    ngx_http_llm_puts(&ctx->out, "{\"type\":\"function\",\"function\":{");

    if (ngx_http_llm_named_schema(ctx, fn, p, "parameters", &v) != NGX_OK) {
        return NGX_DECLINED;
    }

    name = ngx_array_push(&ctx->tools);
    if (name == NULL) {
        return NGX_ERROR;
    }

    *name = v->value;

    ngx_http_llm_puts(&ctx->out, "}}");

    return NGX_OK;
}


static ngx_int_t
ngx_http_llm_tools(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *body,
    ngx_uint_t flat)
{
    ngx_int_t             rc;
    ngx_uint_t            i;
    ngx_str_t            *p, param = ngx_string("tools");
    ngx_http_llm_json_t  *tools, *t, *fn;

    if (ngx_http_llm_get_typed(ctx, body, NULL, "tools",
                               NGX_HTTP_LLM_JSON_ARRAY, &tools)
        != NGX_OK)
    {
        return NGX_DECLINED;
    }

    if (tools == NULL || tools->count == 0) {
        return NGX_OK;
    }

    ngx_http_llm_puts(&ctx->out, ",\"tools\":[");

    for (t = tools->child, i = 0; t; t = t->next, i++) {

        rc = ngx_http_llm_element(ctx, t, &param, i, &p);
        if (rc != NGX_OK) {
            return rc;
        }

        if (!ngx_http_llm_json_is_string(ngx_http_llm_json_get(t, "type"),
                                         "function"))
        {
            return ngx_http_llm_bad(ctx, ngx_http_llm_path(ctx, "%V.type", p),
                                    "must be \"function\": only function "
                                    "tools are supported");
        }

        if (flat) {
            fn = t;

        } else {
            fn = ngx_http_llm_json_member(t, "function");
            p = ngx_http_llm_path(ctx, "%V.function", p);

            if (fn == NULL || fn->type != NGX_HTTP_LLM_JSON_OBJECT) {
                return ngx_http_llm_bad(ctx, p, "must be an object");
            }
        }

        if (ngx_http_llm_function(ctx, fn, p) != NGX_OK) {
            return NGX_DECLINED;
        }

        if (t->next) {
            ngx_http_llm_puts(&ctx->out, ",");
        }
    }

    ngx_http_llm_puts(&ctx->out, "]");

    return NGX_OK;
}


static ngx_int_t
ngx_http_llm_tool_choice(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *body,
    ngx_uint_t flat)
{
    ngx_str_t            *name, param = ngx_string("tool_choice");
    ngx_uint_t            i;
    ngx_http_llm_json_t  *v, *fn, *n;

    static const char  *modes[] = { "none", "auto", "required", NULL };

    v = ngx_http_llm_json_member(body, "tool_choice");
    if (v == NULL) {
        return NGX_OK;
    }

    if (v->type == NGX_HTTP_LLM_JSON_STRING) {
        if (!ngx_http_llm_one_of(v, modes)) {
            return ngx_http_llm_bad(ctx, &param, "must be \"none\", "
                                    "\"auto\", \"required\" or a named "
                                    "function");
        }

        if (ctx->tools.nelts == 0
            && ngx_http_llm_json_is_string(v, "required"))
        {
            return ngx_http_llm_bad(ctx, &param, "\"required\" needs tools");
        }

        ngx_http_llm_put_member(ctx, "tool_choice", v);
        return NGX_OK;
    }

    if (v->type != NGX_HTTP_LLM_JSON_OBJECT
        || !ngx_http_llm_json_is_string(ngx_http_llm_json_get(v, "type"),
                                        "function"))
    {
        return ngx_http_llm_bad(ctx, &param, "must be \"none\", \"auto\", "
                                "\"required\" or {\"type\": \"function\", "
                                "...}");
    }

    fn = flat ? v : ngx_http_llm_json_member(v, "function");

    n = ngx_http_llm_json_member(fn, "name");
    if (n == NULL || n->type != NGX_HTTP_LLM_JSON_STRING) {
        return ngx_http_llm_bad(ctx, &param, "must name the function%s",
                                flat ? "" : " in function.name");
    }

    name = ctx->tools.elts;

    for (i = 0; i < ctx->tools.nelts; i++) {
        if (name[i].len == n->value.len
            && ngx_memcmp(name[i].data, n->value.data, n->value.len) == 0)
        {
            break;
        }
    }

    if (i == ctx->tools.nelts) {
        return ngx_http_llm_bad(ctx, &param, "names function \"%V\" which "
                                "is not in tools", &n->value);
    }

    ngx_http_llm_puts(&ctx->out, ",\"tool_choice\":{\"type\":\"function\","
                                 "\"function\":{\"name\":");
    ngx_http_llm_put_json(&ctx->out, n);
    ngx_http_llm_puts(&ctx->out, "}}");

    return NGX_OK;
}


/*
 * response_format (chat) or text.format (responses, "flat": name and
 * schema beside type instead of under json_schema).
 */
static ngx_int_t
ngx_http_llm_format(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *v,
    ngx_str_t *p, ngx_uint_t flat)
{
    ngx_str_t            *sp;
    ngx_http_llm_json_t  *type, *js, *name;

    static const char  *types[] = {
        "text", "json_object", "json_schema", NULL
    };

    if (v->type != NGX_HTTP_LLM_JSON_OBJECT) {
        return ngx_http_llm_bad(ctx, p, "must be an object, not %s",
                                ngx_http_llm_json_type_name(v));
    }

    type = ngx_http_llm_json_member(v, "type");

    if (!ngx_http_llm_one_of(type, types)) {
        return ngx_http_llm_bad(ctx, ngx_http_llm_path(ctx, "%V.type", p),
                                "must be \"text\", \"json_object\" or "
                                "\"json_schema\"");
    }

    ngx_http_llm_puts(&ctx->out, ",\"response_format\":{\"type\":");
    ngx_http_llm_put_json(&ctx->out, type);

    if (ngx_http_llm_json_is_string(type, "json_schema")) {

        if (flat) {
            js = v;
            sp = p;

        } else {
            js = ngx_http_llm_json_member(v, "json_schema");
            sp = ngx_http_llm_path(ctx, "%V.json_schema", p);

            if (js == NULL || js->type != NGX_HTTP_LLM_JSON_OBJECT) {
                return ngx_http_llm_bad(ctx, sp, "must be an object with "
                                        "name and schema");
            }
        }

        ngx_http_llm_puts(&ctx->out, ",\"json_schema\":{");

        if (ngx_http_llm_named_schema(ctx, js, sp, "schema", &name)
            != NGX_OK)
        {
            return NGX_DECLINED;
        }

        ngx_http_llm_puts(&ctx->out, "}");
    }

    ngx_http_llm_puts(&ctx->out, "}");

    return NGX_OK;
}


/*
 * chat_template_kwargs and reasoning_effort, resolved: "thinking" from
 * thinking or enable_thinking; the kwargs' reasoning_effort wins over the
 * top-level one.  Absent values are left to the engine's recipe defaults.
 */
static ngx_int_t
ngx_http_llm_chat_mode(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *body)
{
    ngx_int_t             thinking, enable, drop;
    ngx_str_t             prefix = ngx_string("chat_template_kwargs");
    ngx_http_llm_json_t  *kw, *effort;

    effort = NULL;
    thinking = ctx->thinking;
    enable = -1;
    drop = -1;

    if (ngx_http_llm_effort(ctx, body, NULL, "reasoning_effort", &effort)
        != NGX_OK
        || ngx_http_llm_get_typed(ctx, body, NULL, "chat_template_kwargs",
                                  NGX_HTTP_LLM_JSON_OBJECT, &kw)
           != NGX_OK)
    {
        return NGX_DECLINED;
    }

    if (kw) {
        if (ngx_http_llm_get_bool(ctx, kw, &prefix, "thinking", &thinking)
            != NGX_OK
            || ngx_http_llm_get_bool(ctx, kw, &prefix, "enable_thinking",
                                     &enable)
               != NGX_OK
            || ngx_http_llm_get_bool(ctx, kw, &prefix, "drop_thinking", &drop)
               != NGX_OK
            || ngx_http_llm_effort(ctx, kw, &prefix, "reasoning_effort",
                                   &effort)
               != NGX_OK)
        {
            return NGX_DECLINED;
        }

        if (enable != -1) {
            if (thinking != -1 && thinking != enable) {
                return ngx_http_llm_bad(ctx, &prefix, "has thinking and "
                                        "enable_thinking set to different "
                                        "values");
            }

            thinking = enable;
        }
    }

    if (thinking != -1 || drop != -1) {
        ngx_http_llm_puts(&ctx->out, ",\"chat_template_kwargs\":{");

        if (thinking != -1) {
            ngx_http_llm_printf(&ctx->out, "\"thinking\":%s%s",
                                thinking ? "true" : "false",
                                drop != -1 ? "," : "");
        }

        if (drop != -1) {
            ngx_http_llm_printf(&ctx->out, "\"drop_thinking\":%s",
                                drop ? "true" : "false");
        }

        ngx_http_llm_puts(&ctx->out, "}");
    }

    ngx_http_llm_put_member(ctx, "reasoning_effort", effort);

    return NGX_OK;
}


/*
 * vLLM's guided decoding fields: guided_json and structured_outputs.json (a
 * JSON Schema object) become response_format json_schema (chat only); the
 * other kinds (regex, choice, grammar) are refused, never ignored.
 */
static ngx_int_t
ngx_http_llm_guided(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *body,
    ngx_uint_t chat)
{
    ngx_uint_t            i;
    const char           *name;
    ngx_http_llm_json_t  *so, *schema;

    static const char  *other[] = {
        "guided_regex", "guided_choice", "guided_grammar",
        "guided_whitespace_pattern", NULL
    };
    static const char  *so_other[] = {
        "regex", "choice", "grammar", "structural_tag", NULL
    };

    for (i = 0; other[i]; i++) {
        if (ngx_http_llm_json_member(body, other[i])) {
            return ngx_http_llm_unsupported(ctx, other[i], "is not supported: "
                                            "only JSON Schema (guided_json, "
                                            "response_format) constrains "
                                            "output");
        }
    }

    if (ngx_http_llm_get_typed(ctx, body, NULL, "structured_outputs",
                               NGX_HTTP_LLM_JSON_OBJECT, &so)
        != NGX_OK)
    {
        return NGX_DECLINED;
    }

    for (i = 0; so && so_other[i]; i++) {
        if (ngx_http_llm_json_member(so, so_other[i])) {
            return ngx_http_llm_unsupported(ctx, "structured_outputs",
                                            "supports only \"json\" (a JSON "
                                            "Schema)");
        }
    }

    schema = ngx_http_llm_json_member(body, "guided_json");
    name = "guided_json";

    if (so && ngx_http_llm_json_member(so, "json")) {
        if (schema) {
            return ngx_http_llm_bad(ctx, ngx_http_llm_path(ctx, "%s", name),
                                    "and structured_outputs.json cannot "
                                    "both be given");
        }

        schema = ngx_http_llm_json_member(so, "json");
        name = "structured_outputs.json";
    }

    if (schema == NULL) {
        return NGX_OK;
    }

    if (!chat) {
        return ngx_http_llm_unsupported(ctx, name, "is supported on chat "
                                        "completions only");
    }

    if (schema->type != NGX_HTTP_LLM_JSON_OBJECT) {
        return ngx_http_llm_bad(ctx, ngx_http_llm_path(ctx, "%s", name),
                                "must be a JSON Schema object");
    }

    if (ngx_http_llm_json_member(body, "response_format")) {
        return ngx_http_llm_bad(ctx, ngx_http_llm_path(ctx, "%s", name),
                                "and response_format cannot both be given");
    }

    ngx_http_llm_puts(&ctx->out, ",\"response_format\":{\"type\":"
                                 "\"json_schema\",\"json_schema\":{\"name\":"
                                 "\"guided_json\",\"schema\":");
    ngx_http_llm_put_json(&ctx->out, schema);
    ngx_http_llm_puts(&ctx->out, "}}");

    return NGX_OK;
}


/* tools, tool_choice, parallel_tool_calls, response_format, chat mode */
static ngx_int_t
ngx_http_llm_chat_fields(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *body)
{
    ngx_int_t             parallel;
    ngx_str_t             p = ngx_string("response_format");
    ngx_http_llm_json_t  *rf;

    parallel = -1;

    if (ngx_http_llm_tools(ctx, body, 0) != NGX_OK
        || ngx_http_llm_tool_choice(ctx, body, 0) != NGX_OK
        || ngx_http_llm_get_bool(ctx, body, NULL, "parallel_tool_calls",
                                 &parallel)
           != NGX_OK)
    {
        return NGX_DECLINED;
    }

    ngx_http_llm_put_bool(ctx, "parallel_tool_calls", parallel);

    rf = ngx_http_llm_json_member(body, "response_format");

    if ((rf && ngx_http_llm_format(ctx, rf, &p, 0) != NGX_OK)
        || ngx_http_llm_guided(ctx, body, 1) != NGX_OK)
    {
        return NGX_DECLINED;
    }

    return ngx_http_llm_chat_mode(ctx, body);
}


/*
 * OpenAI chat fields that ask for what this server cannot do: refused, so
 * that no client takes their silence for an answer (legacy function
 * calling would leave the model without its tools; audio output and web
 * search would quietly not happen).  "modalities" may name text alone.
 */
static ngx_int_t
ngx_http_llm_chat_unsupported(ngx_http_llm_vctx_t *ctx,
    ngx_http_llm_json_t *body)
{
    ngx_http_llm_json_t  *m, *v;

    static const ngx_http_llm_refusal_t  refused[] = {
        { "functions", "is not supported: pass tools instead (functions is "
                       "OpenAI's deprecated form of them)" },
        { "function_call", "is not supported: pass tool_choice instead "
                           "(function_call is OpenAI's deprecated form of "
                           "it)" },
        { "audio", "is not supported: this model answers in text only" },
        { "web_search_options", "is not supported: this server does not "
                                "search the web" },
        { NULL, NULL }
    };

    if (ngx_http_llm_refuse(ctx, body, refused) != NGX_OK
        || ngx_http_llm_get_strings(ctx, body, "modalities", &m) != NGX_OK)
    {
        return NGX_DECLINED;
    }

    for (v = m ? m->child : NULL; v; v = v->next) {
        if (ngx_http_llm_json_is_string(v, "text")) {
            continue;
        }

        return ngx_http_llm_unsupported(ctx, "modalities", "may name only "
                                        "\"text\": this model answers in "
                                        "text only");
    }

    return NGX_OK;
}


/* ---- endpoints --------------------------------------------------------- */

static ngx_int_t
ngx_http_llm_chat(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *body)
{
    int64_t     top;
    ngx_int_t   logprobs;
    ngx_uint_t  set;

    logprobs = 0;

    if (ngx_http_llm_messages(ctx, body) != NGX_OK
        || ngx_http_llm_chat_unsupported(ctx, body) != NGX_OK
        || ngx_http_llm_chat_fields(ctx, body) != NGX_OK
        || ngx_http_llm_stream(ctx, body) != NGX_OK
        || ngx_http_llm_choices(ctx, body) != NGX_OK
        || ngx_http_llm_sampling_params(ctx, body) != NGX_OK
        || ngx_http_llm_stop(ctx, body) != NGX_OK
        || ngx_http_llm_get_bool(ctx, body, NULL, "logprobs", &logprobs)
           != NGX_OK
        || ngx_http_llm_get_int(ctx, body, NULL, "top_logprobs", 0,
                                LLM_REQ_TOP_LOGPROBS_MAX, &top,
                                &set)
           != NGX_OK)
    {
        return NGX_DECLINED;
    }

    if (ngx_http_llm_json_member(body, "max_completion_tokens")) {
        if (ngx_http_llm_max_tokens(ctx, body, "max_completion_tokens", 0)
            != NGX_OK)
        {
            return NGX_DECLINED;
        }

    } else if (ngx_http_llm_max_tokens(ctx, body, "max_tokens", 0)
               != NGX_OK)
    {
        return NGX_DECLINED;
    }

    if (ngx_http_llm_vllm_params(ctx, body) != NGX_OK) {
        return NGX_DECLINED;
    }

    if (set && !logprobs) {
        return ngx_http_llm_bad(ctx, ngx_http_llm_path(ctx, "top_logprobs"),
                                "needs logprobs set to true");
    }

    if (logprobs) {
        ctx->req->logprobs = 1;
        ngx_http_llm_printf(&ctx->out, ",\"logprobs\":true,"
                            "\"top_logprobs\":%L", set ? top : 0);
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_llm_token_ids(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *v,
    const char *name)
{
    int64_t               id;
    ngx_uint_t            i;
    ngx_http_llm_json_t  *t;

    if (v->count == 0) {
        return ngx_http_llm_bad(ctx, ngx_http_llm_path(ctx, "%s", name),
                                "must not be empty");
    }

    for (t = v->child, i = 0; t; t = t->next, i++) {
        if (ngx_http_llm_json_int(t, &id) != NGX_OK || id < 0
            || id > INT32_MAX)
        {
            return ngx_http_llm_bad(ctx, ngx_http_llm_path(ctx, "%s[%ui]",
                                                           name, i),
                                    "must be a token id (an integer from 0 "
                                    "to 2147483647)");
        }
    }

    ngx_http_llm_printf(&ctx->out, ",\"%s\":[", name);

    for (t = v->child; t; t = t->next) {
        (void) ngx_http_llm_json_int(t, &id);
        ngx_http_llm_printf(&ctx->out, t->next ? "%L," : "%L", id);
    }

    ngx_http_llm_puts(&ctx->out, "]");

    return NGX_OK;
}


/* prompt: a string, token ids, or a batch of exactly one of those */
static ngx_int_t
ngx_http_llm_prompt(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *body)
{
    ngx_str_t             param = ngx_string("prompt");
    ngx_http_llm_json_t  *v;

    v = ngx_http_llm_json_member(body, "prompt");

    if (v == NULL) {
        return ngx_http_llm_bad(ctx, &param, "is required");
    }

    if (v->type == NGX_HTTP_LLM_JSON_ARRAY && v->count == 1
        && (v->child->type == NGX_HTTP_LLM_JSON_STRING
            || v->child->type == NGX_HTTP_LLM_JSON_ARRAY))
    {
        v = v->child;

    } else if (v->type == NGX_HTTP_LLM_JSON_ARRAY && v->count > 1
               && v->child->type != NGX_HTTP_LLM_JSON_NUMBER)
    {
        return ngx_http_llm_unsupported(ctx, "prompt",
                                        "holds several prompts: send one "
                                        "prompt per request");
    }

    if (v->type == NGX_HTTP_LLM_JSON_STRING) {
        if (v->value.len == 0) {
            return ngx_http_llm_bad(ctx, &param, "must not be empty");
        }

        ngx_http_llm_put_member(ctx, "prompt", v);
        return NGX_OK;
    }

    if (v->type != NGX_HTTP_LLM_JSON_ARRAY) {
        return ngx_http_llm_bad(ctx, &param, "must be a string or an array "
                                "of token ids, not %s",
                                ngx_http_llm_json_type_name(v));
    }

    return ngx_http_llm_token_ids(ctx, v, "prompt");
}


static ngx_int_t
ngx_http_llm_completions(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *body)
{
    int64_t               logprobs;
    ngx_int_t             echo;
    ngx_uint_t            set;
    ngx_http_llm_json_t  *suffix;

    echo = 0;

    if (ngx_http_llm_prompt(ctx, body) != NGX_OK
        || ngx_http_llm_stream(ctx, body) != NGX_OK
        || ngx_http_llm_choices(ctx, body) != NGX_OK
        || ngx_http_llm_one_choice(ctx, body, "best_of") != NGX_OK
        || ngx_http_llm_max_tokens(ctx, body, "max_tokens", 16) != NGX_OK
        || ngx_http_llm_vllm_params(ctx, body) != NGX_OK
        || ngx_http_llm_sampling_params(ctx, body) != NGX_OK
        || ngx_http_llm_guided(ctx, body, 0) != NGX_OK
        || ngx_http_llm_stop(ctx, body) != NGX_OK
        || ngx_http_llm_get_bool(ctx, body, NULL, "echo", &echo) != NGX_OK
        || ngx_http_llm_get_string(ctx, body, NULL, "suffix", &suffix)
           != NGX_OK
        || ngx_http_llm_get_int(ctx, body, NULL, "logprobs", 0,
                                LLM_REQ_COMPLETION_LOGPROBS_MAX,
                                &logprobs, &set)
           != NGX_OK)
    {
        return NGX_DECLINED;
    }

    if (echo) {
        return ngx_http_llm_unsupported(ctx, "echo", "is not supported");
    }

    if (suffix && suffix->value.len) {
        return ngx_http_llm_unsupported(ctx, "suffix", "is not supported");
    }

    if (set) {
        ctx->req->logprobs = 1;
        ngx_http_llm_printf(&ctx->out, ",\"logprobs\":true,"
                            "\"top_logprobs\":%L", logprobs);
    }

    return NGX_OK;
}


/*
 * The Responses API as chat messages.  Consecutive function_call items
 * become one assistant message with tool_calls (joining a preceding
 * assistant message), a reasoning item becomes the reasoning_content of
 * the next assistant message, function_call_output becomes a tool
 * message, and instructions a leading system message.
 */

enum {
    NGX_HTTP_LLM_CONV_NONE = 0,
    NGX_HTTP_LLM_CONV_ASSISTANT,     /* assistant object open */
    NGX_HTTP_LLM_CONV_CALLS          /* its tool_calls array open */
};

typedef struct {
    ngx_uint_t             state;
    ngx_uint_t             count;          /* messages written */
    ngx_http_llm_wbuf_t    reasoning;      /* pending reasoning text */
    unsigned               has_reasoning:1;
} ngx_http_llm_conv_t;


static void
ngx_http_llm_conv_close(ngx_http_llm_vctx_t *ctx, ngx_http_llm_conv_t *cv)
{
    if (cv->state == NGX_HTTP_LLM_CONV_CALLS) {
        ngx_http_llm_puts(&ctx->out, "]}");

    } else if (cv->state == NGX_HTTP_LLM_CONV_ASSISTANT) {
        ngx_http_llm_puts(&ctx->out, "}");
    }

    cv->state = NGX_HTTP_LLM_CONV_NONE;
}


static void
ngx_http_llm_conv_open(ngx_http_llm_vctx_t *ctx, ngx_http_llm_conv_t *cv,
    const char *role)
{
    ngx_http_llm_conv_close(ctx, cv);

    ngx_http_llm_printf(&ctx->out, "%s{\"role\":\"%s\"",
                        cv->count++ ? "," : "", role);
}


static void
ngx_http_llm_conv_reasoning(ngx_http_llm_vctx_t *ctx,
    ngx_http_llm_conv_t *cv)
{
    if (!cv->has_reasoning) {
        return;
    }

    ngx_http_llm_puts(&ctx->out, ",\"reasoning_content\":");
    ngx_http_llm_put_string(&ctx->out, cv->reasoning.start,
                            ngx_http_llm_wbuf_len(&cv->reasoning));

    cv->has_reasoning = 0;
    cv->reasoning.last = cv->reasoning.start;
}


static ngx_int_t
ngx_http_llm_item_message(ngx_http_llm_vctx_t *ctx, ngx_http_llm_conv_t *cv,
    ngx_http_llm_json_t *item, ngx_str_t *p)
{
    ngx_str_t            *cp;
    ngx_http_llm_json_t  *role, *content;

    static const char  *roles[] = {
        "user", "system", "developer", "assistant", NULL
    };
    static const char  *parts[] = {
        "input_text", "output_text", "text", NULL
    };

    if (ngx_http_llm_need_string(ctx, item, p, "role", &role) != NGX_OK) {
        return NGX_DECLINED;
    }

    if (!ngx_http_llm_one_of(role, roles)) {
        return ngx_http_llm_bad(ctx, ngx_http_llm_path(ctx, "%V.role", p),
                                "must be one of user, system, developer, "
                                "assistant");
    }

    cp = ngx_http_llm_path(ctx, "%V.content", p);
    if (cp == NULL) {
        return NGX_ERROR;
    }

    content = ngx_http_llm_json_member(item, "content");
    if (content == NULL) {
        return ngx_http_llm_bad(ctx, cp, "is required");
    }

    ngx_http_llm_conv_open(ctx, cv, (char *) role->value.data);

    ngx_http_llm_puts(&ctx->out, ",\"content\":");

    if (ngx_http_llm_content(ctx, content, cp, parts) != NGX_OK) {
        return NGX_DECLINED;
    }

    if (ngx_http_llm_json_is_string(role, "assistant")) {
        ngx_http_llm_conv_reasoning(ctx, cv);
        cv->state = NGX_HTTP_LLM_CONV_ASSISTANT;
        return NGX_OK;
    }

    ngx_http_llm_puts(&ctx->out, "}");

    return NGX_OK;
}


static ngx_int_t
ngx_http_llm_item_call(ngx_http_llm_vctx_t *ctx, ngx_http_llm_conv_t *cv,
    ngx_http_llm_json_t *item, ngx_str_t *p)
{
    ngx_http_llm_json_t  *id, *name, *args;

    if (ngx_http_llm_need_string(ctx, item, p, "call_id", &id) != NGX_OK
        || ngx_http_llm_call_function(ctx, item, p, &name, &args) != NGX_OK)
    {
        return NGX_DECLINED;
    }

    switch (cv->state) {

    case NGX_HTTP_LLM_CONV_NONE:
        ngx_http_llm_conv_open(ctx, cv, "assistant");
        ngx_http_llm_puts(&ctx->out, ",\"content\":null");
        ngx_http_llm_conv_reasoning(ctx, cv);
        ngx_http_llm_puts(&ctx->out, ",\"tool_calls\":[");
        break;

    case NGX_HTTP_LLM_CONV_ASSISTANT:
        ngx_http_llm_puts(&ctx->out, ",\"tool_calls\":[");
        break;

    default:
        ngx_http_llm_puts(&ctx->out, ",");
    }

    cv->state = NGX_HTTP_LLM_CONV_CALLS;

    ngx_http_llm_put_call(ctx, id, name, args);

    return NGX_OK;
}


static ngx_int_t
ngx_http_llm_item_output(ngx_http_llm_vctx_t *ctx, ngx_http_llm_conv_t *cv,
    ngx_http_llm_json_t *item, ngx_str_t *p)
{
    ngx_http_llm_json_t  *id, *output;

    if (ngx_http_llm_need_string(ctx, item, p, "call_id", &id) != NGX_OK
        || ngx_http_llm_need_string(ctx, item, p, "output", &output)
           != NGX_OK)
    {
        return NGX_DECLINED;
    }

    ngx_http_llm_conv_open(ctx, cv, "tool");
    ngx_http_llm_put_member(ctx, "content", output);
    ngx_http_llm_put_member(ctx, "tool_call_id", id);
    ngx_http_llm_puts(&ctx->out, "}");

    return NGX_OK;
}


/* reasoning item: its reasoning_text parts (or summary) become pending */
static ngx_int_t
ngx_http_llm_item_reasoning(ngx_http_llm_vctx_t *ctx,
    ngx_http_llm_conv_t *cv, ngx_http_llm_json_t *item, ngx_str_t *p)
{
    ngx_uint_t            i;
    ngx_http_llm_json_t  *parts, *part, *text;

    ngx_http_llm_conv_close(ctx, cv);

    parts = ngx_http_llm_json_member(item, "content");
    if (parts == NULL || parts->count == 0) {
        parts = ngx_http_llm_json_member(item, "summary");
    }

    if (parts == NULL) {
        return NGX_OK;
    }

    if (parts->type != NGX_HTTP_LLM_JSON_ARRAY) {
        return ngx_http_llm_bad(ctx, ngx_http_llm_path(ctx, "%V.content", p),
                                "must be an array of reasoning_text parts");
    }

    for (part = parts->child, i = 0; part; part = part->next, i++) {
        text = ngx_http_llm_json_member(part, "text");

        if (text == NULL || text->type != NGX_HTTP_LLM_JSON_STRING) {
            return ngx_http_llm_bad(ctx, ngx_http_llm_path(ctx,
                                                           "%V.content[%ui]",
                                                           p, i),
                                    "must have a text string");
        }

        ngx_http_llm_put_str(&cv->reasoning, &text->value);
        cv->has_reasoning = 1;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_llm_input(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *body)
{
    ngx_int_t             rc;
    ngx_uint_t            i;
    ngx_str_t            *p, param = ngx_string("input");
    ngx_http_llm_conv_t   cv;
    ngx_http_llm_json_t  *input, *instr, *item, *type;

    ngx_memzero(&cv, sizeof(ngx_http_llm_conv_t));
    ngx_http_llm_wbuf_init(&cv.reasoning, ctx->pool);

    input = ngx_http_llm_json_member(body, "input");

    if (input == NULL) {
        return ngx_http_llm_bad(ctx, &param, "is required");
    }

    if (input->type != NGX_HTTP_LLM_JSON_STRING
        && input->type != NGX_HTTP_LLM_JSON_ARRAY)
    {
        return ngx_http_llm_bad(ctx, &param, "must be a string or an array of items, "
                                "not %s", ngx_http_llm_json_type_name(input));
    }

    if (ngx_http_llm_get_string(ctx, body, NULL, "instructions", &instr)
        != NGX_OK)
    {
        return NGX_DECLINED;
    }

    ngx_http_llm_puts(&ctx->out, ",\"messages\":[");

    if (instr) {
        ngx_http_llm_conv_open(ctx, &cv, "system");
        ngx_http_llm_put_member(ctx, "content", instr);
        ngx_http_llm_puts(&ctx->out, "}");
    }

    if (input->type == NGX_HTTP_LLM_JSON_STRING) {
        ngx_http_llm_conv_open(ctx, &cv, "user");
        ngx_http_llm_put_member(ctx, "content", input);
        ngx_http_llm_puts(&ctx->out, "}]");
        return NGX_OK;
    }

    for (item = input->child, i = 0; item; item = item->next, i++) {

        rc = ngx_http_llm_element(ctx, item, &param, i, &p);
        if (rc != NGX_OK) {
            return rc;
        }

        type = ngx_http_llm_json_member(item, "type");

        if (type == NULL || ngx_http_llm_json_is_string(type, "message")) {
            rc = ngx_http_llm_item_message(ctx, &cv, item, p);

        } else if (ngx_http_llm_json_is_string(type, "function_call")) {
            rc = ngx_http_llm_item_call(ctx, &cv, item, p);

        } else if (ngx_http_llm_json_is_string(type,
                                               "function_call_output"))
        {
            rc = ngx_http_llm_item_output(ctx, &cv, item, p);

        } else if (ngx_http_llm_json_is_string(type, "reasoning")) {
            rc = ngx_http_llm_item_reasoning(ctx, &cv, item, p);

        } else {
            rc = ngx_http_llm_bad(ctx, ngx_http_llm_path(ctx, "%V.type", p),
                                  "must be message, function_call, "
                                  "function_call_output or reasoning");
        }

        if (rc != NGX_OK) {
            return rc;
        }
    }

    ngx_http_llm_conv_close(ctx, &cv);

    if (cv.count == 0) {
        return ngx_http_llm_bad(ctx, &param,
                                "must hold at least one message");
    }

    ngx_http_llm_puts(&ctx->out, "]");

    return cv.reasoning.failed ? NGX_ERROR : NGX_OK;
}


/* echo a validated member into the response object, or null */
static void
ngx_http_llm_echo(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *body,
    const char *name, const char *dflt)
{
    ngx_http_llm_json_t  *v;

    v = ngx_http_llm_json_member(body, name);

    ngx_http_llm_printf(&ctx->echo, ",\"%s\":", name);

    if (v) {
        ngx_http_llm_put_json(&ctx->echo, v);

    } else {
        ngx_http_llm_put(&ctx->echo, dflt, ngx_strlen(dflt));
    }
}


/*
 * Responses "include": strings.  Log probabilities are refused (this
 * endpoint returns none); "reasoning.encrypted_content" passes (reasoning
 * items carry their text in the clear, and clients that send them back,
 * as stateless ones do, get them back in input); the rest name outputs of
 * tools other than functions, which "tools" refuses.
 */
static ngx_int_t
ngx_http_llm_include(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *body)
{
    ngx_http_llm_json_t  *inc, *v;

    if (ngx_http_llm_get_strings(ctx, body, "include", &inc) != NGX_OK) {
        return NGX_DECLINED;
    }

    for (v = inc ? inc->child : NULL; v; v = v->next) {
        if (ngx_http_llm_json_is_string(v, "message.output_text.logprobs")) {
            return ngx_http_llm_unsupported(ctx, "include", "may not ask for "
                                            "message.output_text.logprobs: "
                                            "the Responses API here returns "
                                            "no log probabilities (chat "
                                            "completions do)");
        }
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_llm_responses(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *body)
{
    int64_t               top;
    ngx_int_t             store, parallel, background;
    ngx_str_t             p = ngx_string("text.format");
    ngx_uint_t            set;
    ngx_http_llm_json_t  *prev, *reasoning, *effort, *text, *format;

    static const ngx_http_llm_refusal_t  refused[] = {
        { "conversation", "is not supported: this server keeps no "
                          "conversations; send the whole conversation in "
                          "input" },
        { "prompt", "is not supported: this server keeps no prompt "
                    "templates; send input and instructions" },
        { NULL, NULL }
    };

    store = 0;
    parallel = -1;
    background = 0;

    if (ngx_http_llm_get_string(ctx, body, NULL, "previous_response_id",
                                &prev)
        != NGX_OK
        || ngx_http_llm_get_bool(ctx, body, NULL, "store", &store) != NGX_OK)
    {
        return NGX_DECLINED;
    }

    if (prev) {
        return ngx_http_llm_unsupported(ctx, "previous_response_id",
                                        "is not supported: this server keeps "
                                        "no response store; send the whole "
                                        "conversation in input");
    }

    if (store) {
        return ngx_http_llm_unsupported(ctx, "store",
                                        "must be false: this server keeps no "
                                        "response store");
    }

    /* what needs a store, or log probabilities the endpoint does not
     * return: refused rather than answered without */
    if (ngx_http_llm_get_bool(ctx, body, NULL, "background", &background)
        != NGX_OK
        || ngx_http_llm_get_int(ctx, body, NULL, "top_logprobs", 0,
                                LLM_REQ_TOP_LOGPROBS_MAX, &top, &set)
           != NGX_OK)
    {
        return NGX_DECLINED;
    }

    if (background) {
        return ngx_http_llm_unsupported(ctx, "background",
                                        "must be false: this server answers "
                                        "on the request and keeps no response "
                                        "store to poll");
    }

    if (ngx_http_llm_refuse(ctx, body, refused) != NGX_OK) {
        return NGX_DECLINED;
    }

    if (set && top > 0) {
        return ngx_http_llm_unsupported(ctx, "top_logprobs",
                                        "is not supported: the Responses API "
                                        "here returns no log probabilities "
                                        "(chat completions do)");
    }

    if (ngx_http_llm_include(ctx, body) != NGX_OK) {
        return NGX_DECLINED;
    }

    if (ngx_http_llm_input(ctx, body) != NGX_OK
        || ngx_http_llm_tools(ctx, body, 1) != NGX_OK
        || ngx_http_llm_tool_choice(ctx, body, 1) != NGX_OK
        || ngx_http_llm_get_bool(ctx, body, NULL, "parallel_tool_calls",
                                 &parallel)
           != NGX_OK
        || ngx_http_llm_get_typed(ctx, body, NULL, "reasoning",
                                  NGX_HTTP_LLM_JSON_OBJECT, &reasoning)
           != NGX_OK
        || ngx_http_llm_get_typed(ctx, body, NULL, "text",
                                  NGX_HTTP_LLM_JSON_OBJECT, &text)
           != NGX_OK
        || ngx_http_llm_stream(ctx, body) != NGX_OK
        || ngx_http_llm_max_tokens(ctx, body, "max_output_tokens", 0)
           != NGX_OK
        || ngx_http_llm_sampling_params(ctx, body) != NGX_OK)
    {
        return NGX_DECLINED;
    }

    ngx_http_llm_put_bool(ctx, "parallel_tool_calls", parallel);

    format = ngx_http_llm_json_member(text, "format");

    if (format && ngx_http_llm_format(ctx, format, &p, 1) != NGX_OK) {
        return NGX_DECLINED;
    }

    effort = NULL;

    if (reasoning) {
        ngx_str_t  rp = ngx_string("reasoning");

        if (ngx_http_llm_effort(ctx, reasoning, &rp, "effort", &effort)
            != NGX_OK)
        {
            return NGX_DECLINED;
        }
    }

    if (effort) {
        ngx_http_llm_printf(&ctx->out,
                            ",\"chat_template_kwargs\":{\"thinking\":%s}"
                            ",\"reasoning_effort\":",
                            ngx_http_llm_json_is_string(effort, "none")
                            ? "false" : "true");
        ngx_http_llm_put_json(&ctx->out, effort);
    }

    ngx_http_llm_echo(ctx, body, "instructions", "null");
    ngx_http_llm_echo(ctx, body, "max_output_tokens", "null");
    ngx_http_llm_echo(ctx, body, "parallel_tool_calls", "true");
    ngx_http_llm_echo(ctx, body, "reasoning", "null");
    ngx_http_llm_echo(ctx, body, "temperature", "null");
    ngx_http_llm_echo(ctx, body, "text", "{\"format\":{\"type\":\"text\"}}");
    ngx_http_llm_echo(ctx, body, "tool_choice", "\"auto\"");
    ngx_http_llm_echo(ctx, body, "tools", "[]");
    ngx_http_llm_echo(ctx, body, "top_p", "null");

    return NGX_OK;
}


static ngx_int_t
ngx_http_llm_tokenize(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *body)
{
    ngx_int_t   special, gen;

    special = -1;
    gen = -1;

    if (ngx_http_llm_json_member(body, "messages") == NULL) {
        if (ngx_http_llm_json_member(body, "prompt") == NULL) {
            return ngx_http_llm_bad(ctx, ngx_http_llm_path(ctx, "prompt"),
                                    "or messages is required");
        }

        if (ngx_http_llm_prompt(ctx, body) != NGX_OK
            || ngx_http_llm_get_bool(ctx, body, NULL, "add_special_tokens",
                                     &special)
               != NGX_OK)
        {
            return NGX_DECLINED;
        }

        ngx_http_llm_put_bool(ctx, "add_special_tokens", special);

        return NGX_OK;
    }

    if (ngx_http_llm_messages(ctx, body) != NGX_OK
        || ngx_http_llm_chat_fields(ctx, body) != NGX_OK
        || ngx_http_llm_get_bool(ctx, body, NULL, "add_generation_prompt",
                                 &gen)
           != NGX_OK)
    {
        return NGX_DECLINED;
    }

    ngx_http_llm_put_bool(ctx, "add_generation_prompt", gen);

    return NGX_OK;
}


static ngx_int_t
ngx_http_llm_detokenize(ngx_http_llm_vctx_t *ctx, ngx_http_llm_json_t *body)
{
    ngx_http_llm_json_t  *v;

    v = ngx_http_llm_json_member(body, "tokens");

    if (v == NULL || v->type != NGX_HTTP_LLM_JSON_ARRAY) {
        return ngx_http_llm_bad(ctx, ngx_http_llm_path(ctx, "tokens"),
                                "must be an array of token ids%s",
                                v ? "" : " and is required");
    }

    return ngx_http_llm_token_ids(ctx, v, "tokens");
}


static const char  *ngx_http_llm_kinds[] = {
    "chat", "completion", "chat", "tokenize", "detokenize"
};


/*
 * Validates body for req->api and fills req.  Returns NGX_OK, NGX_DECLINED
 * for a client error (req->status and the err_* fields say what), or
 * NGX_ERROR when memory ran out.
 */
ngx_int_t
ngx_http_llm_request_parse(ngx_pool_t *pool, ngx_http_llm_req_t *req,
    u_char *body, size_t len)
{
    ngx_int_t             rc;
    ngx_str_t             err;
    ngx_http_llm_json_t  *root, *v;
    ngx_http_llm_vctx_t   ctx;

    ngx_memzero(&ctx, sizeof(ngx_http_llm_vctx_t));

    ctx.pool = pool;
    ctx.req = req;
    ctx.thinking = -1;
    req->n = 1;

    ngx_http_llm_wbuf_init(&ctx.out, pool);
    ngx_http_llm_wbuf_init(&ctx.echo, pool);

    if (ngx_array_init(&ctx.tools, pool, 4, sizeof(ngx_str_t)) != NGX_OK) {
        return NGX_ERROR;
    }

    root = ngx_http_llm_json_parse(pool, body, len, &err, &req->err_param);

    if (root == NULL) {
        if (err.len == 0) {
            return NGX_ERROR;
        }

        req->status = NGX_HTTP_BAD_REQUEST;
        req->err_message = err;
        return NGX_DECLINED;
    }

    if (root->type != NGX_HTTP_LLM_JSON_OBJECT) {
        req->status = NGX_HTTP_BAD_REQUEST;
        ngx_str_set(&req->err_message,
                    "the request body must be a JSON object");
        return NGX_DECLINED;
    }

    rc = ngx_http_llm_model(&ctx, root);
    if (rc != NGX_OK) {
        return rc;
    }

    ngx_http_llm_printf(&ctx.out, "{\"kind\":\"%s\",\"id\":\"%V\",\"model\":",
                        ngx_http_llm_kinds[req->api], &req->id);
    ngx_http_llm_put_string(&ctx.out, req->model.data, req->model.len);

    switch (req->api) {

    case NGX_HTTP_LLM_API_CHAT:
        rc = ngx_http_llm_chat(&ctx, root);
        break;

    case NGX_HTTP_LLM_API_COMPLETIONS:
        rc = ngx_http_llm_completions(&ctx, root);
        break;

    case NGX_HTTP_LLM_API_RESPONSES:
        rc = ngx_http_llm_responses(&ctx, root);
        break;

    case NGX_HTTP_LLM_API_TOKENIZE:
        rc = ngx_http_llm_tokenize(&ctx, root);
        break;

    default: /* NGX_HTTP_LLM_API_DETOKENIZE */
        rc = ngx_http_llm_detokenize(&ctx, root);
        break;
    }

    if (rc != NGX_OK) {
        return rc;
    }

    /* for the engine's scripted test runner only (llm_test_script on) */
    v = ngx_http_llm_json_get(root, "test_script");

    if (req->test_script && v && v->type == NGX_HTTP_LLM_JSON_OBJECT) {
        ngx_http_llm_puts(&ctx.out, ",\"test_script\":");
        ngx_http_llm_put_json(&ctx.out, v);
    }

    ngx_http_llm_puts(&ctx.out, "}");

    if (ctx.out.failed || ctx.echo.failed) {
        return NGX_ERROR;
    }

    req->canonical.data = ctx.out.start;
    req->canonical.len = ngx_http_llm_wbuf_len(&ctx.out);
    req->echo.data = ctx.echo.start;
    req->echo.len = ngx_http_llm_wbuf_len(&ctx.echo);

    return NGX_OK;
}
