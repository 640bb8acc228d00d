/*
 * JSON for the module: a parse tree built from yajl's event parser in the
 * request pool, and a growable writer for bodies and engine requests.
 *
 * yajl's own tree API loses string lengths (an embedded \u0000 truncates a
 * string) and keeps duplicate keys in an order nobody defines; building
 * the tree here keeps exact bytes, lets the last duplicate win as Python's
 * json does, bounds the nesting depth, and frees nothing by hand.
 *
 * Every string and key must be Unicode text the engine can take: yajl
 * turns a lone surrogate escape into "?" and passes overlong forms,
 * encoded surrogates and \u0000 on, so the raw token is checked here and
 * the first bad one is reported with the path of its field.
 */

#include "ngx_http_llm_module.h"

#include <math.h>
#include <yajl/yajl_parse.h>


typedef struct {
    ngx_pool_t            *pool;
    yajl_handle            h;
    const u_char          *data;                   /* the raw text */
    const char            *bad;                    /* why a string is bad */
    ngx_uint_t             bad_key;                /* ... it is a key */
    ngx_str_t              bad_path;
    ngx_http_llm_json_t   *root;
    ngx_http_llm_json_t   *stack[NGX_HTTP_LLM_JSON_MAX_DEPTH];
    ngx_uint_t             depth;
    ngx_str_t              key;
    unsigned               too_deep:1;
    unsigned               nomem:1;
} ngx_http_llm_json_ctx_t;


static ngx_http_llm_json_t *
ngx_http_llm_json_add(ngx_http_llm_json_ctx_t *ctx,
    ngx_http_llm_json_type_e type)
{
    ngx_http_llm_json_t  *v, *parent;

    v = ngx_pcalloc(ctx->pool, sizeof(ngx_http_llm_json_t));
    if (v == NULL) {
        ctx->nomem = 1;
        return NULL;
    }

    v->type = type;

    if (ctx->depth == 0) {
        ctx->root = v;
        return v;
    }

    parent = ctx->stack[ctx->depth - 1];

    if (parent->type == NGX_HTTP_LLM_JSON_OBJECT) {
        v->key = ctx->key;
    }

    if (parent->last) {
        parent->last->next = v;

    } else {
        parent->child = v;
    }

    parent->last = v;
    parent->count++;

    return v;
}


static ngx_int_t
ngx_http_llm_json_copy(ngx_http_llm_json_ctx_t *ctx, ngx_str_t *dst,
    const u_char *src, size_t len)
{
    /* NUL-terminated so that numbers can go to strtod() directly */
    dst->data = ngx_pnalloc(ctx->pool, len + 1);
    if (dst->data == NULL) {
        ctx->nomem = 1;
        return NGX_ERROR;
    }

    ngx_memcpy(dst->data, src, len);
    dst->data[len] = '\0';
    dst->len = len;

    return NGX_OK;
}


/* 4 hex digits of a \u escape */
static ngx_uint_t
ngx_http_llm_json_hex4(const u_char *p)
{
    u_char      c;
    ngx_uint_t  i, n;

    n = 0;

    for (i = 0; i < 4; i++) {
        c = p[i] | 0x20;
        n = n * 16 + ((c >= 'a') ? c - 'a' + 10 : c - '0');
    }

    return n;
}


/* why the raw string token [p, end) (quotes included) is not text, or NULL */
static const char *
ngx_http_llm_json_bad_text(const u_char *p, const u_char *end)
{
    u_char      c, lo, hi;
    ngx_uint_t  cp, n;

    for (p++, end--; p < end; /* void */ ) {
        c = *p;

        if (c == '\\') {
            if (p[1] != 'u') {
                p += 2;
                continue;
            }

            cp = ngx_http_llm_json_hex4(p + 2);
            p += 6;

            if (cp == 0) {
                return "contains \\u0000 (NUL), which is not allowed";
            }

            if (cp >= 0xdc00 && cp <= 0xdfff) {
                return "contains an unpaired UTF-16 surrogate";
            }

            if (cp >= 0xd800 && cp <= 0xdbff) {
                if (end - p < 6 || p[0] != '\\' || p[1] != 'u') {
                    return "contains an unpaired UTF-16 surrogate";
                }

                cp = ngx_http_llm_json_hex4(p + 2);

                if (cp < 0xdc00 || cp > 0xdfff) {
                    return "contains an unpaired UTF-16 surrogate";
                }

                p += 6;
            }

            continue;
        }

        if (c < 0x80) {
            p++;
            continue;
        }

        /* the shortest forms only, no surrogates, at most U+10FFFF */
        lo = 0x80;
        hi = 0xbf;

        if (c >= 0xc2 && c <= 0xdf) {
            n = 1;

        } else if (c >= 0xe0 && c <= 0xef) {
            n = 2;
            lo = (c == 0xe0) ? 0xa0 : 0x80;
            hi = (c == 0xed) ? 0x9f : 0xbf;

        } else if (c >= 0xf0 && c <= 0xf4) {
            n = 3;
            lo = (c == 0xf0) ? 0x90 : 0x80;
            hi = (c == 0xf4) ? 0x8f : 0xbf;

        } else {
            n = 0;
        }

        if (n == 0 || (ngx_uint_t) (end - p) <= n || p[1] < lo || p[1] > hi
            || (n > 1 && (p[2] & 0xc0) != 0x80)
            || (n > 2 && (p[3] & 0xc0) != 0x80))
        {
            return "is not valid UTF-8 (an overlong form, an encoded "
                   "surrogate or a code point above U+10FFFF)";
        }

        p += n + 1;
    }

    return NULL;
}


/*
 * The path of what is being parsed, as the validator names fields
 * (messages[0].content): the open containers, then, for a value (not a
 * key), its own key or index in the innermost one.
 */
static void
ngx_http_llm_json_path(ngx_http_llm_json_ctx_t *ctx, ngx_uint_t value)
{
    u_char               *p, *last;
    ngx_uint_t            i;
    ngx_http_llm_json_t  *parent;

    p = ngx_pnalloc(ctx->pool, 512);
    if (p == NULL) {
        ctx->nomem = 1;
        return;
    }

    ctx->bad_path.data = p;
    last = p + 512;

    for (i = 1; i <= ctx->depth; i++) {
        parent = ctx->stack[i - 1];

        if (i == ctx->depth && !value) {
            break;
        }

        if (parent->type == NGX_HTTP_LLM_JSON_ARRAY) {
            p = ngx_slprintf(p, last, "[%ui]",
                             (i < ctx->depth) ? parent->count - 1
                                              : parent->count);

        } else {
            p = ngx_slprintf(p, last, (p == ctx->bad_path.data) ? "%V"
                                                                 : ".%V",
                             (i < ctx->depth) ? &ctx->stack[i]->key
                                              : &ctx->key);
        }
    }

    ctx->bad_path.len = p - ctx->bad_path.data;
}


/* check the token yajl just read: 1 if it is text, else 0 with the reason */
static int
ngx_http_llm_json_check_text(ngx_http_llm_json_ctx_t *ctx, ngx_uint_t value)
{
    size_t         end, q, n;
    const u_char  *d;

    d = ctx->data;
    end = yajl_get_bytes_consumed(ctx->h);

    if (end < 2 || d[end - 1] != '"') {
        return 1;            /* not where yajl is documented to be */
    }

    /* the opening quote: the first one before it not escaped */
    for (q = end - 1; q-- > 0; /* void */ ) {
        if (d[q] != '"') {
            continue;
        }

        for (n = 0; n < q && d[q - 1 - n] == '\\'; n++) { /* void */ }

        if (n % 2 == 0) {
            break;
        }
    }

    ctx->bad = ngx_http_llm_json_bad_text(d + q, d + end);

    if (ctx->bad == NULL) {
        return 1;
    }

    ctx->bad_key = !value;
    ngx_http_llm_json_path(ctx, value);

    return 0;
}


static int
ngx_http_llm_json_on_null(void *data)
{
    return ngx_http_llm_json_add(data, NGX_HTTP_LLM_JSON_NULL) != NULL;
}


static int
ngx_http_llm_json_on_bool(void *data, int b)
{
    return ngx_http_llm_json_add(data, b ? NGX_HTTP_LLM_JSON_TRUE
                                         : NGX_HTTP_LLM_JSON_FALSE)
           != NULL;
}


static int
ngx_http_llm_json_on_number(void *data, const char *s, size_t len)
{
    ngx_http_llm_json_ctx_t  *ctx = data;

    ngx_http_llm_json_t  *v;

    v = ngx_http_llm_json_add(ctx, NGX_HTTP_LLM_JSON_NUMBER);
    if (v == NULL) {
        return 0;
    }

    return ngx_http_llm_json_copy(ctx, &v->value, (u_char *) s, len)
           == NGX_OK;
}


static int
ngx_http_llm_json_on_string(void *data, const unsigned char *s, size_t len)
{
    ngx_http_llm_json_ctx_t  *ctx = data;

    ngx_http_llm_json_t  *v;

    if (!ngx_http_llm_json_check_text(ctx, 1)) {
        return 0;
    }

    v = ngx_http_llm_json_add(ctx, NGX_HTTP_LLM_JSON_STRING);
    if (v == NULL) {
        return 0;
    }

    return ngx_http_llm_json_copy(ctx, &v->value, s, len) == NGX_OK;
}


static int
ngx_http_llm_json_open(ngx_http_llm_json_ctx_t *ctx,
    ngx_http_llm_json_type_e type)
{
    ngx_http_llm_json_t  *v;

    if (ctx->depth == NGX_HTTP_LLM_JSON_MAX_DEPTH) {
        ctx->too_deep = 1;
        return 0;
    }

    v = ngx_http_llm_json_add(ctx, type);
    if (v == NULL) {
        return 0;
    }

    ctx->stack[ctx->depth++] = v;

    return 1;
}


static int
ngx_http_llm_json_on_start_map(void *data)
{
    return ngx_http_llm_json_open(data, NGX_HTTP_LLM_JSON_OBJECT);
}


static int
ngx_http_llm_json_on_start_array(void *data)
{
    return ngx_http_llm_json_open(data, NGX_HTTP_LLM_JSON_ARRAY);
}


static int
ngx_http_llm_json_on_key(void *data, const unsigned char *s, size_t len)
{
    ngx_http_llm_json_ctx_t  *ctx = data;

    if (!ngx_http_llm_json_check_text(ctx, 0)) {
        return 0;
    }

    return ngx_http_llm_json_copy(ctx, &ctx->key, s, len) == NGX_OK;
}


static int
ngx_http_llm_json_on_close(void *data)
{
    ngx_http_llm_json_ctx_t  *ctx = data;

    ctx->depth--;

    return 1;
}


static yajl_callbacks  ngx_http_llm_json_callbacks = {
    ngx_http_llm_json_on_null,
    ngx_http_llm_json_on_bool,
    NULL,
    NULL,
    ngx_http_llm_json_on_number,
    ngx_http_llm_json_on_string,
    ngx_http_llm_json_on_start_map,
    ngx_http_llm_json_on_key,
    ngx_http_llm_json_on_close,
    ngx_http_llm_json_on_start_array,
    ngx_http_llm_json_on_close
};


/*
 * Returns the tree, or NULL with err set to a message for the client
 * (err->len == 0 means the failure was ours: out of memory).
 */
ngx_http_llm_json_t *
ngx_http_llm_json_parse(ngx_pool_t *pool, u_char *data, size_t len,
    ngx_str_t *err, ngx_str_t *param)
{
    u_char                   *msg, *p;
    size_t                    n, at;
    yajl_handle               h;
    yajl_status               st;
    ngx_http_llm_json_ctx_t  *ctx;

    ngx_str_null(err);
    ngx_str_null(param);

    if (len == 0) {
        ngx_str_set(err, "the request body is empty; expected a JSON object");
        return NULL;
    }

    ctx = ngx_pcalloc(pool, sizeof(ngx_http_llm_json_ctx_t));
    if (ctx == NULL) {
        return NULL;
    }

    ctx->pool = pool;
    ctx->data = data;

    h = yajl_alloc(&ngx_http_llm_json_callbacks, NULL, ctx);
    if (h == NULL) {
        return NULL;
    }

    ctx->h = h;

    st = yajl_parse(h, data, len);
    at = yajl_get_bytes_consumed(h);

    if (st == yajl_status_ok) {
        st = yajl_complete_parse(h);
        at = len;
    }

    if (st == yajl_status_ok) {
        yajl_free(h);
        return ctx->root;
    }

    if (ctx->nomem) {
        yajl_free(h);
        return NULL;
    }

    if (ctx->bad) {
        yajl_free(h);

        *param = ctx->bad_path;

        err->data = ngx_pnalloc(pool, ctx->bad_path.len + 128);
        if (err->data == NULL) {
            return NULL;
        }

        p = ngx_sprintf(err->data, "%s%V%s %s",
                        ctx->bad_path.len ? "" : "the request body",
                        &ctx->bad_path,
                        ctx->bad_key ? " has a key that" : "", ctx->bad);
        err->len = p - err->data;

        return NULL;
    }

    if (ctx->too_deep) {
        yajl_free(h);
        ngx_str_set(err, "malformed JSON: nested deeper than 128 levels");
        return NULL;
    }

    msg = yajl_get_error(h, 0, data, len);

    n = msg ? ngx_strlen(msg) : 0;
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == ' ')) {
        n--;
    }

    err->data = ngx_pnalloc(pool, n + 64);
    if (err->data != NULL) {
        p = ngx_sprintf(err->data, "malformed JSON at byte %uz: %*s",
                        at, n, msg ? msg : (u_char *) "");
        err->len = p - err->data;
    }

    if (msg) {
        yajl_free_error(h, msg);
    }

    yajl_free(h);

    if (err->data == NULL) {
        err->len = 0;
    }

    return NULL;
}


ngx_http_llm_json_t *
ngx_http_llm_json_get(ngx_http_llm_json_t *obj, const char *key)
{
    size_t                len;
    ngx_http_llm_json_t  *v, *found;

    if (obj == NULL || obj->type != NGX_HTTP_LLM_JSON_OBJECT) {
        return NULL;
    }

    len = ngx_strlen(key);
    found = NULL;

    for (v = obj->child; v; v = v->next) {
        if (v->key.len == len && ngx_memcmp(v->key.data, key, len) == 0) {
            found = v;
        }
    }

    return found;
}


ngx_http_llm_json_t *
ngx_http_llm_json_member(ngx_http_llm_json_t *obj, const char *key)
{
    ngx_http_llm_json_t  *v;

    v = ngx_http_llm_json_get(obj, key);

    if (v && v->type == NGX_HTTP_LLM_JSON_NULL) {
        return NULL;
    }

    return v;
}


/*
 * An integer: plain integer text exactly (64-bit), or a number with a
 * fraction or exponent whose value is integral (1.0, 1e3), as Python's
 * validators accept.  NGX_DECLINED: not a number, or one with a fraction;
 * NGX_ABORT: an integer outside what this parser represents (the caller
 * reports its range).
 */
ngx_int_t
ngx_http_llm_json_int(ngx_http_llm_json_t *v, int64_t *out)
{
    u_char    *p, *end;
    double     d;
    uint64_t   n, limit;
    ngx_uint_t neg;

    if (v == NULL || v->type != NGX_HTTP_LLM_JSON_NUMBER) {
        return NGX_DECLINED;
    }

    p = v->value.data;
    end = p + v->value.len;

    if (ngx_strlchr(p, end, '.') || ngx_strlchr(p, end, 'e')
        || ngx_strlchr(p, end, 'E'))
    {
        switch (ngx_http_llm_json_double(v, &d)) {
        case NGX_OK:
            break;
        case NGX_ABORT:
            return NGX_ABORT;
        default:
            return NGX_DECLINED;
        }

        if (d != floor(d)) {
            return NGX_DECLINED;
        }

        if (fabs(d) > 9007199254740992.0) {
            return NGX_ABORT;
        }

        *out = (int64_t) d;
        return NGX_OK;
    }

    neg = (p < end && *p == '-');
    p += neg;

    limit = neg ? (uint64_t) INT64_MAX + 1 : (uint64_t) INT64_MAX;
    n = 0;

    if (p == end) {
        return NGX_DECLINED;
    }

    for ( /* void */ ; p < end; p++) {
        if (*p < '0' || *p > '9') {
            return NGX_DECLINED;
        }

        if (n > (limit - (*p - '0')) / 10) {
            return NGX_ABORT;
        }

        n = n * 10 + (*p - '0');
    }

    *out = neg ? (int64_t) (0 - n) : (int64_t) n;

    return NGX_OK;
}


ngx_int_t
ngx_http_llm_json_double(ngx_http_llm_json_t *v, double *out)
{
    char  *end;

    if (v == NULL || v->type != NGX_HTTP_LLM_JSON_NUMBER) {
        return NGX_DECLINED;
    }

    /* number text is NUL-terminated by the parser */
    *out = strtod((char *) v->value.data, &end);

    if (end != (char *) v->value.data + v->value.len || isnan(*out)) {
        return NGX_DECLINED;
    }

    /* JSON has no infinity: this is a finite number too large for double */
    return isinf(*out) ? NGX_ABORT : NGX_OK;
}


ngx_int_t
ngx_http_llm_json_is_string(ngx_http_llm_json_t *v, const char *s)
{
    size_t  len;

    if (v == NULL || v->type != NGX_HTTP_LLM_JSON_STRING) {
        return 0;
    }

    len = ngx_strlen(s);

    return v->value.len == len && ngx_memcmp(v->value.data, s, len) == 0;
}


const char *
ngx_http_llm_json_type_name(ngx_http_llm_json_t *v)
{
    static const char  *names[] = {
        "null", "false", "true", "a number", "a string", "an array",
        "an object"
    };

    if (v == NULL) {
        return "missing";
    }

    return names[v->type];
}


void
ngx_http_llm_wbuf_init(ngx_http_llm_wbuf_t *w, ngx_pool_t *pool)
{
    ngx_memzero(w, sizeof(ngx_http_llm_wbuf_t));
    w->pool = pool;
}


u_char *
ngx_http_llm_wbuf_reserve(ngx_http_llm_wbuf_t *w, size_t n)
{
    size_t   used, size;
    u_char  *p;

    if (w->failed) {
        return NULL;
    }

    if ((size_t) (w->end - w->last) >= n) {
        return w->last;
    }

    used = w->last - w->start;
    size = ngx_max(2 * (size_t) (w->end - w->start), used + n);
    size = ngx_max(size, 256);

    p = ngx_pnalloc(w->pool, size);
    if (p == NULL) {
        w->failed = 1;
        return NULL;
    }

    if (used) {
        ngx_memcpy(p, w->start, used);
    }

    /* large blocks go back to the system; small ones stay in the pool */
    if (w->start) {
        ngx_pfree(w->pool, w->start);
    }

    w->start = p;
    w->last = p + used;
    w->end = p + size;

    return w->last;
}


void
ngx_http_llm_put(ngx_http_llm_wbuf_t *w, const void *data, size_t len)
{
    if (len == 0 || ngx_http_llm_wbuf_reserve(w, len) == NULL) {
        return;
    }

    w->last = ngx_cpymem(w->last, data, len);
}


void
ngx_http_llm_put_str(ngx_http_llm_wbuf_t *w, ngx_str_t *s)
{
    ngx_http_llm_put(w, s->data, s->len);
}


void
ngx_http_llm_put_string(ngx_http_llm_wbuf_t *w, u_char *data, size_t len)
{
    size_t  n;

    n = len + ngx_escape_json(NULL, data, len) + 2;

    if (ngx_http_llm_wbuf_reserve(w, n) == NULL) {
        return;
    }

    *w->last++ = '"';
    w->last = (u_char *) ngx_escape_json(w->last, data, len);
    *w->last++ = '"';
}


void
ngx_http_llm_put_json(ngx_http_llm_wbuf_t *w, ngx_http_llm_json_t *v)
{
    ngx_http_llm_json_t  *m;

    switch (v->type) {

    case NGX_HTTP_LLM_JSON_NULL:
        ngx_http_llm_puts(w, "null");
        return;

    case NGX_HTTP_LLM_JSON_FALSE:
        ngx_http_llm_puts(w, "false");
        return;

    case NGX_HTTP_LLM_JSON_TRUE:
        ngx_http_llm_puts(w, "true");
        return;

    case NGX_HTTP_LLM_JSON_NUMBER:
        ngx_http_llm_put_str(w, &v->value);
        return;

    case NGX_HTTP_LLM_JSON_STRING:
        ngx_http_llm_put_string(w, v->value.data, v->value.len);
        return;

    case NGX_HTTP_LLM_JSON_ARRAY:
        ngx_http_llm_puts(w, "[");

        for (m = v->child; m; m = m->next) {
            ngx_http_llm_put_json(w, m);

            if (m->next) {
                ngx_http_llm_puts(w, ",");
            }
        }

        ngx_http_llm_puts(w, "]");
        return;

    case NGX_HTTP_LLM_JSON_OBJECT:
        ngx_http_llm_puts(w, "{");

        for (m = v->child; m; m = m->next) {
            ngx_http_llm_put_string(w, m->key.data, m->key.len);
            ngx_http_llm_puts(w, ":");
            ngx_http_llm_put_json(w, m);

            if (m->next) {
                ngx_http_llm_puts(w, ",");
            }
        }

        ngx_http_llm_puts(w, "}");
        return;
    }
}


/* short formatted pieces (numbers, ids): at most 256 bytes per call */
void
ngx_http_llm_printf(ngx_http_llm_wbuf_t *w, const char *fmt, ...)
{
    va_list  args;

    if (ngx_http_llm_wbuf_reserve(w, 256) == NULL) {
        return;
    }

    va_start(args, fmt);
    w->last = ngx_vslprintf(w->last, w->last + 256, fmt, args);
    va_end(args);
}
