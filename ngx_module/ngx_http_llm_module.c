/*
 * ngx_http_llm_module: the OpenAI-compatible front door of the serving
 * system.  This file holds the module definition and its directives; the
 * handlers that talk to engines over engine/ipc arrive with the serving
 * work.  Until then every API location answers 503 with an OpenAI error
 * body saying so, rather than pretending to serve.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>


typedef struct {
    ngx_str_t                 name;
    ngx_str_t                 run_dir;
} ngx_http_llm_engine_conf_t;


typedef struct {
    ngx_array_t               engines;   /* ngx_http_llm_engine_conf_t */
} ngx_http_llm_main_conf_t;


typedef struct {
    ngx_str_t                 api;
} ngx_http_llm_loc_conf_t;


static ngx_int_t ngx_http_llm_handler(ngx_http_request_t *r);
static char *ngx_http_llm_engine(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_llm_api(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static void *ngx_http_llm_create_main_conf(ngx_conf_t *cf);
static void *ngx_http_llm_create_loc_conf(ngx_conf_t *cf);


static ngx_command_t  ngx_http_llm_commands[] = {

    { ngx_string("llm_engine"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE2,
      ngx_http_llm_engine,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("llm_api"),
      NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_llm_api,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

      ngx_null_command
};


static ngx_http_module_t  ngx_http_llm_module_ctx = {
    NULL,                                  /* preconfiguration */
    NULL,                                  /* postconfiguration */

    ngx_http_llm_create_main_conf,         /* create main configuration */
    NULL,                                  /* init main configuration */

    NULL,                                  /* create server configuration */
    NULL,                                  /* merge server configuration */

    ngx_http_llm_create_loc_conf,          /* create location configuration */
    NULL                                   /* merge location configuration */
};


ngx_module_t  ngx_http_llm_module = {
    NGX_MODULE_V1,
    &ngx_http_llm_module_ctx,              /* module context */
    ngx_http_llm_commands,                 /* module directives */
    NGX_HTTP_MODULE,                       /* module type */
    NULL,                                  /* init master */
    NULL,                                  /* init module */
    NULL,                                  /* init process */
    NULL,                                  /* init thread */
    NULL,                                  /* exit thread */
    NULL,                                  /* exit process */
    NULL,                                  /* exit master */
    NGX_MODULE_V1_PADDING
};


static ngx_str_t  ngx_http_llm_apis[] = {
    ngx_string("chat_completions"),
    ngx_string("completions"),
    ngx_string("responses"),
    ngx_string("models"),
    ngx_string("tokenize"),
    ngx_string("detokenize"),
    ngx_string("health"),
    ngx_string("metrics"),
    ngx_string("admin"),
    ngx_null_string
};


static ngx_int_t
ngx_http_llm_handler(ngx_http_request_t *r)
{
    ngx_int_t     rc;
    ngx_buf_t    *b;
    ngx_chain_t   out;

    static u_char  body[] =
        "{\"error\":{\"message\":\"the serving path is not built yet: "
        "no engine connection\",\"type\":\"service_unavailable\","
        "\"param\":null,\"code\":\"service_unavailable\"}}\n";

    rc = ngx_http_discard_request_body(r);
    if (rc != NGX_OK) {
        return rc;
    }

    r->headers_out.status = NGX_HTTP_SERVICE_UNAVAILABLE;
    r->headers_out.content_length_n = sizeof(body) - 1;
    ngx_str_set(&r->headers_out.content_type, "application/json");

    rc = ngx_http_send_header(r);
    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        return rc;
    }

    b = ngx_calloc_buf(r->pool);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    b->pos = body;
    b->last = body + sizeof(body) - 1;
    b->memory = 1;
    b->last_buf = 1;

    out.buf = b;
    out.next = NULL;

    return ngx_http_output_filter(r, &out);
}


static char *
ngx_http_llm_engine(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_llm_main_conf_t  *lmcf = conf;

    ngx_str_t                   *value;
    ngx_http_llm_engine_conf_t  *ec;

    value = cf->args->elts;

    if (ngx_strncmp(value[2].data, "run_dir=", 8) != 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid parameter \"%V\", expected run_dir=DIR",
                           &value[2]);
        return NGX_CONF_ERROR;
    }

    ec = ngx_array_push(&lmcf->engines);
    if (ec == NULL) {
        return NGX_CONF_ERROR;
    }

    ec->name = value[1];
    ec->run_dir.data = value[2].data + 8;
    ec->run_dir.len = value[2].len - 8;

    return NGX_CONF_OK;
}


static char *
ngx_http_llm_api(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_llm_loc_conf_t  *llcf = conf;

    ngx_str_t                 *value;
    ngx_uint_t                 i;
    ngx_http_core_loc_conf_t  *clcf;

    if (llcf->api.data) {
        return "is duplicate";
    }

    value = cf->args->elts;

    for (i = 0; ngx_http_llm_apis[i].len; i++) {
        if (value[1].len == ngx_http_llm_apis[i].len
            && ngx_strncmp(value[1].data, ngx_http_llm_apis[i].data,
                           value[1].len) == 0)
        {
            break;
        }
    }

    if (ngx_http_llm_apis[i].len == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "unknown llm_api \"%V\"", &value[1]);
        return NGX_CONF_ERROR;
    }

    llcf->api = value[1];

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
    clcf->handler = ngx_http_llm_handler;

    return NGX_CONF_OK;
}


static void *
ngx_http_llm_create_main_conf(ngx_conf_t *cf)
{
    ngx_http_llm_main_conf_t  *lmcf;

    lmcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_llm_main_conf_t));
    if (lmcf == NULL) {
        return NULL;
    }

    if (ngx_array_init(&lmcf->engines, cf->pool, 2,
                       sizeof(ngx_http_llm_engine_conf_t))
        != NGX_OK)
    {
        return NULL;
    }

    return lmcf;
}


static void *
ngx_http_llm_create_loc_conf(ngx_conf_t *cf)
{
    return ngx_pcalloc(cf->pool, sizeof(ngx_http_llm_loc_conf_t));
}
