/*
 * API keys: llm_api_key, llm_api_key_file, llm_api_key_required.
 *
 * With keys configured, the inference endpoints (and /v1/models) require
 * "Authorization: Bearer KEY"; the Anthropic endpoints also take
 * "x-api-key: KEY", as Anthropic's clients send it.  /health and /metrics
 * are open unless llm_api_key_required turns the check on there.  A key
 * is compared with every configured key in time that does not depend on
 * where the bytes differ.
 */

#include "ngx_http_llm_module.h"


#define NGX_HTTP_LLM_KEY_MAX  512


static ngx_array_t *
ngx_http_llm_keys(ngx_conf_t *cf, ngx_http_llm_loc_conf_t *llcf)
{
    if (llcf->api_keys == NGX_CONF_UNSET_PTR) {
        llcf->api_keys = ngx_array_create(cf->pool, 2, sizeof(ngx_str_t));
    }

    return llcf->api_keys;
}


static char *
ngx_http_llm_key_add(ngx_conf_t *cf, ngx_array_t *keys, u_char *data,
    size_t len)
{
    ngx_str_t   *k;
    ngx_uint_t   i;

    if (len == 0 || len > NGX_HTTP_LLM_KEY_MAX) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0, "an API key must have 1 to "
                           "%d bytes", NGX_HTTP_LLM_KEY_MAX);
        return NGX_CONF_ERROR;
    }

    for (i = 0; i < len; i++) {
        if (data[i] <= ' ' || data[i] >= 0x7f) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0, "an API key must be "
                               "printable ASCII without spaces");
            return NGX_CONF_ERROR;
        }
    }

    k = ngx_array_push(keys);
    if (k == NULL) {
        return NGX_CONF_ERROR;
    }

    k->data = data;
    k->len = len;

    return NGX_CONF_OK;
}


/* llm_api_key KEY [KEY...]; */
char *
ngx_http_llm_api_key(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_llm_loc_conf_t  *llcf = conf;

    ngx_str_t    *value;
    ngx_uint_t    i;
    ngx_array_t  *keys;

    keys = ngx_http_llm_keys(cf, llcf);
    if (keys == NULL) {
        return NGX_CONF_ERROR;
    }

    value = cf->args->elts;

    for (i = 1; i < cf->args->nelts; i++) {
        if (ngx_http_llm_key_add(cf, keys, value[i].data, value[i].len)
            != NGX_CONF_OK)
        {
            return NGX_CONF_ERROR;
        }
    }

    return NGX_CONF_OK;
}


/* llm_api_key_file PATH;  one key a line; blank lines and # comments */
char *
ngx_http_llm_api_key_file(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_llm_loc_conf_t  *llcf = conf;

    off_t            size;
    u_char          *buf, *p, *end, *eol, *s, *e;
    ssize_t          n;
    ngx_str_t       *value, name;
    ngx_uint_t       before;
    ngx_file_t       file;
    ngx_array_t     *keys;
    ngx_file_info_t  fi;

    keys = ngx_http_llm_keys(cf, llcf);
    if (keys == NULL) {
        return NGX_CONF_ERROR;
    }

    value = cf->args->elts;
    name = value[1];

    if (ngx_conf_full_name(cf->cycle, &name, 1) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    ngx_memzero(&file, sizeof(ngx_file_t));
    file.name = name;
    file.log = cf->log;

    file.fd = ngx_open_file(name.data, NGX_FILE_RDONLY, NGX_FILE_OPEN, 0);
    if (file.fd == NGX_INVALID_FILE) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, ngx_errno,
                           ngx_open_file_n " \"%V\" failed", &name);
        return NGX_CONF_ERROR;
    }

    buf = NULL;
    n = -1;

    if (ngx_fd_info(file.fd, &fi) != NGX_FILE_ERROR) {
        size = ngx_file_size(&fi);

        if (size > 16 * 1024 * 1024) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0, "API key file \"%V\" "
                               "is larger than 16m", &name);
            ngx_close_file(file.fd);
            return NGX_CONF_ERROR;
        }

        buf = ngx_pnalloc(cf->pool, size + 1);
        if (buf) {
            n = ngx_read_file(&file, buf, size, 0);
            if (n != size) {
                n = -1;
            }
        }
    }

    ngx_close_file(file.fd);

    if (n < 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, ngx_errno,
                           "reading API key file \"%V\" failed", &name);
        return NGX_CONF_ERROR;
    }

    before = keys->nelts;
    end = buf + n;

    for (p = buf; p < end; p = eol + 1) {
        eol = ngx_strlchr(p, end, '\n');
        if (eol == NULL) {
            eol = end;
        }

        for (s = p; s < eol && (*s == ' ' || *s == '\t'); s++) { /* void */ }
        for (e = eol; e > s && (e[-1] == ' ' || e[-1] == '\t'
                                || e[-1] == '\r'); e--) { /* void */ }

        if (s == e || *s == '#') {
            continue;
        }

        if (ngx_http_llm_key_add(cf, keys, s, e - s) != NGX_CONF_OK) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0, "in API key file "
                               "\"%V\"", &name);
            return NGX_CONF_ERROR;
        }
    }

    if (keys->nelts == before) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0, "API key file \"%V\" holds "
                           "no key", &name);
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


ngx_uint_t
ngx_http_llm_api_anthropic(ngx_uint_t api)
{
    return api == NGX_HTTP_LLM_API_MESSAGES
           || api == NGX_HTTP_LLM_API_COUNT_TOKENS;
}


/* the value of request header "name", or NULL */
static ngx_str_t *
ngx_http_llm_header(ngx_http_request_t *r, const char *name)
{
    size_t            len;
    ngx_uint_t        i;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *h;

    len = ngx_strlen(name);
    part = &r->headers_in.headers.part;
    h = part->elts;

    for (i = 0; /* void */ ; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                return NULL;
            }

            part = part->next;
            h = part->elts;
            i = 0;
        }

        if (h[i].key.len == len
            && ngx_strncasecmp(h[i].key.data, (u_char *) name, len) == 0)
        {
            return &h[i].value;
        }
    }
}


/*
 * 1 when key equals one of keys.  Every configured key is compared in
 * full, whatever matched before, so the time depends on the keys' lengths
 * only, never on where a guess goes wrong.
 */
static ngx_uint_t
ngx_http_llm_key_match(ngx_array_t *keys, ngx_str_t *key)
{
    u_char      diff;
    ngx_str_t  *k;
    ngx_uint_t  i, j, found;

    k = keys->elts;
    found = 0;

    for (i = 0; i < keys->nelts; i++) {
        diff = (k[i].len != key->len);

        for (j = 0; j < k[i].len; j++) {
            diff |= k[i].data[j] ^ (key->len ? key->data[j % key->len] : 0);
        }

        found |= (diff == 0);
    }

    return found;
}


/*
 * The key check at the start of an llm_api location.  NGX_DECLINED: go
 * on; anything else is the 401 sent (OpenAI's or Anthropic's shape).
 */
ngx_int_t
ngx_http_llm_auth(ngx_http_request_t *r)
{
    ngx_int_t                 rc, required;
    ngx_str_t                 key, *v, www = ngx_string("Bearer");
    ngx_uint_t                given;
    ngx_table_elt_t          *h;
    ngx_http_llm_wbuf_t       body;
    ngx_http_llm_loc_conf_t  *llcf;

    llcf = ngx_http_get_module_loc_conf(r, ngx_http_llm_module);

    required = llcf->api_key_required;

    if (required == NGX_CONF_UNSET) {
        required = llcf->api != NGX_HTTP_LLM_API_HEALTH
                   && llcf->api != NGX_HTTP_LLM_API_METRICS
                   && llcf->api != NGX_HTTP_LLM_API_ADMIN
                   && llcf->api != NGX_HTTP_LLM_API_NOT_FOUND
                   && llcf->api != NGX_HTTP_LLM_API_ERROR;
    }

    if (!required || llcf->api_keys == NULL || llcf->api_keys->nelts == 0) {
        return NGX_DECLINED;
    }

    ngx_str_null(&key);
    given = 0;

    if (r->headers_in.authorization) {
        v = &r->headers_in.authorization->value;
        given = 1;

        if (v->len > sizeof("Bearer ") - 1
            && ngx_strncasecmp(v->data, (u_char *) "Bearer ",
                               sizeof("Bearer ") - 1) == 0)
        {
            key.data = v->data + sizeof("Bearer ") - 1;
            key.len = v->len - (sizeof("Bearer ") - 1);
        }
    }

    if (key.len == 0 && ngx_http_llm_api_anthropic(llcf->api)) {
        v = ngx_http_llm_header(r, "x-api-key");

        if (v) {
            key = *v;
            given = 1;
        }
    }

    if (key.len && ngx_http_llm_key_match(llcf->api_keys, &key)) {
        return NGX_DECLINED;
    }

    rc = ngx_http_discard_request_body(r);
    if (rc != NGX_OK) {
        return rc;
    }

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    h->hash = 1;
    ngx_str_set(&h->key, "WWW-Authenticate");
    h->value = www;

    ngx_http_llm_wbuf_init(&body, r->pool);

    if (ngx_http_llm_api_anthropic(llcf->api)) {
        ngx_http_llm_puts(&body, "{\"type\":\"error\",\"error\":{\"type\":"
                          "\"authentication_error\",\"message\":");
        ngx_http_llm_puts(&body, given ? "\"invalid x-api-key\"}}"
                                       : "\"x-api-key header is required\"}}");

    } else {
        /* OpenAI's own 401 bodies */
        ngx_http_llm_puts(&body, "{\"error\":{\"message\":");
        ngx_http_llm_puts(&body, given
            ? "\"Incorrect API key provided.\""
            : "\"You didn't provide an API key. You need to provide your "
              "API key in an Authorization header using Bearer auth (i.e. "
              "Authorization: Bearer YOUR_KEY).\"");
        ngx_http_llm_puts(&body, ",\"type\":\"invalid_request_error\","
                          "\"param\":null,\"code\":");
        ngx_http_llm_puts(&body, given ? "\"invalid_api_key\"}}" : "null}}");
    }

    return ngx_http_llm_send_json(r, NGX_HTTP_UNAUTHORIZED, &body);
}
