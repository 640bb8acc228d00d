/*
 * ngx_http_llm_module: the OpenAI-compatible front door of the serving
 * system.  This file holds the module definition, its directives, the
 * shared zone, and process start-up; README.md documents every directive.
 */

#include "ngx_http_llm_module.h"


static char *ngx_http_llm_engine(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_llm_route(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_llm_queue(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_llm_health(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_llm_api(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static void *ngx_http_llm_create_main_conf(ngx_conf_t *cf);
static char *ngx_http_llm_init_main_conf(ngx_conf_t *cf, void *conf);
static void *ngx_http_llm_create_loc_conf(ngx_conf_t *cf);
static char *ngx_http_llm_merge_loc_conf(ngx_conf_t *cf, void *parent,
    void *child);
static ngx_int_t ngx_http_llm_postconfiguration(ngx_conf_t *cf);
static ngx_int_t ngx_http_llm_init_zone(ngx_shm_zone_t *shm_zone,
    void *data);
static char *ngx_http_llm_admin_token(ngx_conf_t *cf, void *post,
    void *data);
static ngx_int_t ngx_http_llm_init_process(ngx_cycle_t *cycle);
static void ngx_http_llm_exit_process(ngx_cycle_t *cycle);


static ngx_conf_post_t  ngx_http_llm_admin_token_post = {
    ngx_http_llm_admin_token
};


static ngx_command_t  ngx_http_llm_commands[] = {

    { ngx_string("llm_engine"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE23,
      ngx_http_llm_engine,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("llm_route"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_2MORE,
      ngx_http_llm_route,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("llm_zone"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_size_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_llm_main_conf_t, zone_size),
      NULL },

    { ngx_string("llm_queue"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE12,
      ngx_http_llm_queue,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("llm_health"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_1MORE,
      ngx_http_llm_health,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("llm_retry_after"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_sec_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_llm_main_conf_t, retry_after),
      NULL },

    { ngx_string("llm_max_body_size"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_size_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_llm_loc_conf_t, max_body_size),
      NULL },

    { ngx_string("llm_read_timeout"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_llm_loc_conf_t, read_timeout),
      NULL },

    { ngx_string("llm_admin_token"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_llm_loc_conf_t, admin_token),
      &ngx_http_llm_admin_token_post },

    { ngx_string("llm_test_script"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_llm_loc_conf_t, test_script),
      NULL },

    { ngx_string("llm_api_key"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_llm_api_key,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("llm_api_key_file"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_llm_api_key_file,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("llm_api_key_required"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_llm_loc_conf_t, api_key_required),
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
    ngx_http_llm_postconfiguration,        /* postconfiguration */

    ngx_http_llm_create_main_conf,         /* create main configuration */
    ngx_http_llm_init_main_conf,           /* init main configuration */

    NULL,                                  /* create server configuration */
    NULL,                                  /* merge server configuration */

    ngx_http_llm_create_loc_conf,          /* create location configuration */
    ngx_http_llm_merge_loc_conf            /* merge location configuration */
};


ngx_module_t  ngx_http_llm_module = {
    NGX_MODULE_V1,
    &ngx_http_llm_module_ctx,              /* module context */
    ngx_http_llm_commands,                 /* module directives */
    NGX_HTTP_MODULE,                       /* module type */
    NULL,                                  /* init master */
    NULL,                                  /* init module */
    ngx_http_llm_init_process,             /* init process */
    NULL,                                  /* init thread */
    NULL,                                  /* exit thread */
    ngx_http_llm_exit_process,             /* exit process */
    NULL,                                  /* exit master */
    NGX_MODULE_V1_PADDING
};


ngx_str_t  ngx_http_llm_api_names[] = {
    ngx_string("chat_completions"),
    ngx_string("completions"),
    ngx_string("responses"),
    ngx_string("tokenize"),
    ngx_string("detokenize"),
    ngx_string("models"),
    ngx_string("health"),
    ngx_string("metrics"),
    ngx_string("admin"),
    ngx_string("not_found"),
    ngx_string("messages"),
    ngx_string("count_tokens"),
    ngx_string("error"),
    ngx_null_string
};


const char  *ngx_http_llm_state_names[] = {
    "absent", "starting", "probing", "healthy", "unhealthy", "draining"
};


/* an example token copied into production would open the admin API */
static char *
ngx_http_llm_admin_token(ngx_conf_t *cf, void *post, void *data)
{
    ngx_str_t  *token = data;

    static char  *placeholders[] = {
        "change-me", "changeme", "change_me", "replace-me", "replaceme",
        "secret", "password", "token", "admin", "example", "xxx", "test",
        NULL
    };

    char        **p;

    for (p = placeholders; *p; p++) {
        if (token->len == ngx_strlen(*p)
            && ngx_strncasecmp(token->data, (u_char *) *p, token->len) == 0)
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "llm_admin_token \"%V\" is a placeholder: "
                               "set a random secret (e.g. the output of "
                               "\"head -c 24 /dev/urandom | base64\")",
                               token);
            return NGX_CONF_ERROR;
        }
    }

    return NGX_CONF_OK;
}


/* llm_engine NAME run_dir=DIR [fingerprint=HEX]; */
static char *
ngx_http_llm_engine(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_llm_main_conf_t  *lmcf = conf;

    u_char                      *p;
    ngx_str_t                   *value;
    ngx_uint_t                   i;
    ngx_http_llm_engine_conf_t  *ec;

    value = cf->args->elts;

    if (!llm_ipc_valid_name((char *) value[1].data, value[1].len)) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid engine name \"%V\": it must be "
                           LLM_IPC_NAME_RULE, &value[1]);
        return NGX_CONF_ERROR;
    }

    if (ngx_http_llm_engine_find(lmcf, &value[1]) != -1) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "duplicate engine \"%V\"", &value[1]);
        return NGX_CONF_ERROR;
    }

    if (lmcf->engines.nelts == NGX_HTTP_LLM_MAX_ENGINES) {
        return "is repeated more than 32 times";
    }

    ec = ngx_array_push(&lmcf->engines);
    if (ec == NULL) {
        return NGX_CONF_ERROR;
    }

    ngx_memzero(ec, sizeof(ngx_http_llm_engine_conf_t));
    ec->name = value[1];
    ec->index = lmcf->engines.nelts - 1;

    for (i = 2; i < cf->args->nelts; i++) {

        if (ngx_strncmp(value[i].data, "run_dir=", 8) == 0) {
            ec->run_dir.data = value[i].data + 8;
            ec->run_dir.len = value[i].len - 8;
            continue;
        }

        if (ngx_strncmp(value[i].data, "fingerprint=", 12) == 0
            && value[i].len > 12 && value[i].len <= 12 + 16)
        {
            for (p = value[i].data + 12; p < value[i].data + value[i].len;
                 p++)
            {
                if (ngx_hextoi(p, 1) == NGX_ERROR) {
                    goto invalid;
                }

                ec->fingerprint = (ec->fingerprint << 4) | ngx_hextoi(p, 1);
            }

            continue;
        }

        goto invalid;
    }

    if (ec->run_dir.len == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "engine \"%V\" needs run_dir=DIR, expected "
                           "run_dir=DIR", &value[1]);
        return NGX_CONF_ERROR;
    }

    /* a relative run_dir is relative to the prefix, like nginx's paths */
    if (ngx_conf_full_name(cf->cycle, &ec->run_dir, 0) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;

invalid:

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid parameter \"%V\", expected run_dir=DIR or "
                       "fingerprint=HEX (up to 16 hex digits)", &value[i]);
    return NGX_CONF_ERROR;
}


/* llm_route MODEL ENGINE [ENGINE...]; */
static char *
ngx_http_llm_route(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_llm_main_conf_t  *lmcf = conf;

    ngx_str_t                  *value, *name;
    ngx_uint_t                  i;
    ngx_http_llm_route_conf_t  *rc;

    value = cf->args->elts;

    if (value[1].len == 0 || value[1].len >= LLM_IPC_MODEL_MAX) {
        return "has a model name that is empty or longer than 127 bytes";
    }

    rc = lmcf->routes.elts;

    for (i = 0; i < lmcf->routes.nelts; i++) {
        if (rc[i].model.len == value[1].len
            && ngx_strncmp(rc[i].model.data, value[1].data, value[1].len)
               == 0)
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "duplicate route \"%V\"", &value[1]);
            return NGX_CONF_ERROR;
        }
    }

    if (lmcf->routes.nelts == NGX_HTTP_LLM_MAX_ROUTES / 2) {
        return "is repeated more than 32 times";
    }

    rc = ngx_array_push(&lmcf->routes);
    if (rc == NULL) {
        return NGX_CONF_ERROR;
    }

    rc->model = value[1];
    rc->pool = 0;
    rc->names = ngx_array_create(cf->pool, cf->args->nelts - 2,
                                 sizeof(ngx_str_t));
    if (rc->names == NULL) {
        return NGX_CONF_ERROR;
    }

    for (i = 2; i < cf->args->nelts; i++) {
        name = ngx_array_push(rc->names);
        if (name == NULL) {
            return NGX_CONF_ERROR;
        }

        *name = value[i];
    }

    return NGX_CONF_OK;
}


/* llm_queue N [timeout=TIME]; */
static char *
ngx_http_llm_queue(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_llm_main_conf_t  *lmcf = conf;

    ngx_int_t   n;
    ngx_str_t  *value, s;

    if (lmcf->queue != NGX_CONF_UNSET_UINT) {
        return "is duplicate";
    }

    value = cf->args->elts;

    n = ngx_atoi(value[1].data, value[1].len);
    if (n == NGX_ERROR) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid queue length \"%V\"", &value[1]);
        return NGX_CONF_ERROR;
    }

    lmcf->queue = n;

    if (cf->args->nelts == 3) {
        if (ngx_strncmp(value[2].data, "timeout=", 8) != 0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid parameter \"%V\", expected "
                               "timeout=TIME", &value[2]);
            return NGX_CONF_ERROR;
        }

        s.data = value[2].data + 8;
        s.len = value[2].len - 8;

        lmcf->queue_timeout = ngx_parse_time(&s, 0);
        if (lmcf->queue_timeout == (ngx_msec_t) NGX_ERROR
            || lmcf->queue_timeout == 0)
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid queue timeout \"%V\"", &s);
            return NGX_CONF_ERROR;
        }
    }

    return NGX_CONF_OK;
}


/* llm_health interval=T fails=N passes=N heartbeat=T stall=T probe_timeout=T; */
static char *
ngx_http_llm_health(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_llm_main_conf_t  *lmcf = conf;

    ngx_int_t    n;
    ngx_str_t   *value, s;
    ngx_uint_t   i, j;
    ngx_msec_t   t;

    static struct {
        ngx_str_t    key;
        ngx_uint_t   time;
        size_t       offset;
    } params[] = {
        { ngx_string("interval="), 1,
          offsetof(ngx_http_llm_main_conf_t, interval) },
        { ngx_string("heartbeat="), 1,
          offsetof(ngx_http_llm_main_conf_t, heartbeat) },
        { ngx_string("stall="), 1,
          offsetof(ngx_http_llm_main_conf_t, stall) },
        { ngx_string("probe_timeout="), 1,
          offsetof(ngx_http_llm_main_conf_t, probe_timeout) },
        { ngx_string("fails="), 0,
          offsetof(ngx_http_llm_main_conf_t, fails) },
        { ngx_string("passes="), 0,
          offsetof(ngx_http_llm_main_conf_t, passes) },
        { ngx_null_string, 0, 0 }
    };

    value = cf->args->elts;

    for (i = 1; i < cf->args->nelts; i++) {

        for (j = 0; params[j].key.len; j++) {
            if (value[i].len > params[j].key.len
                && ngx_strncmp(value[i].data, params[j].key.data,
                               params[j].key.len) == 0)
            {
                break;
            }
        }

        if (params[j].key.len == 0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid parameter \"%V\", expected "
                               "interval=, fails=, passes=, heartbeat=, "
                               "stall= or probe_timeout=", &value[i]);
            return NGX_CONF_ERROR;
        }

        s.data = value[i].data + params[j].key.len;
        s.len = value[i].len - params[j].key.len;

        if (params[j].time) {
            t = ngx_parse_time(&s, 0);
            if (t == (ngx_msec_t) NGX_ERROR || t == 0) {
                goto invalid;
            }

            *(ngx_msec_t *) ((char *) lmcf + params[j].offset) = t;

        } else {
            n = ngx_atoi(s.data, s.len);
            if (n == NGX_ERROR || n == 0) {
                goto invalid;
            }

            *(ngx_uint_t *) ((char *) lmcf + params[j].offset) = n;
        }
    }

    return NGX_CONF_OK;

invalid:

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0, "invalid value in \"%V\"",
                       &value[i]);
    return NGX_CONF_ERROR;
}


static char *
ngx_http_llm_api(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_llm_loc_conf_t  *llcf = conf;

    ngx_str_t                 *value;
    ngx_uint_t                 i;
    ngx_http_core_loc_conf_t  *clcf;

    if (llcf->api != NGX_CONF_UNSET_UINT) {
        return "is duplicate";
    }

    value = cf->args->elts;

    for (i = 0; ngx_http_llm_api_names[i].len; i++) {
        if (value[1].len == ngx_http_llm_api_names[i].len
            && ngx_strncmp(value[1].data, ngx_http_llm_api_names[i].data,
                           value[1].len) == 0)
        {
            break;
        }
    }

    if (ngx_http_llm_api_names[i].len == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "unknown llm_api \"%V\"", &value[1]);
        return NGX_CONF_ERROR;
    }

    llcf->api = i;

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
        != NGX_OK
        || ngx_array_init(&lmcf->routes, cf->pool, 2,
                          sizeof(ngx_http_llm_route_conf_t))
           != NGX_OK)
    {
        return NULL;
    }

    lmcf->zone_size = NGX_CONF_UNSET_SIZE;
    lmcf->queue = NGX_CONF_UNSET_UINT;
    lmcf->queue_timeout = NGX_CONF_UNSET_MSEC;
    lmcf->interval = NGX_CONF_UNSET_MSEC;
    lmcf->heartbeat = NGX_CONF_UNSET_MSEC;
    lmcf->stall = NGX_CONF_UNSET_MSEC;
    lmcf->probe_timeout = NGX_CONF_UNSET_MSEC;
    lmcf->fails = NGX_CONF_UNSET_UINT;
    lmcf->passes = NGX_CONF_UNSET_UINT;
    lmcf->retry_after = NGX_CONF_UNSET;

    return lmcf;
}


/*
 * Resolves routes to engine masks and adds the shared zone.  The zone's
 * name carries a checksum of the engines and routes: a reload with the
 * same ones keeps the zone (health, promotions, queue survive), a reload
 * that changes them starts a fresh zone while old workers finish on the
 * old one.
 */
static char *
ngx_http_llm_init_main_conf(ngx_conf_t *cf, void *conf)
{
    ngx_http_llm_main_conf_t  *lmcf = conf;

    u_char                      *p;
    uint32_t                     crc;
    ngx_str_t                    name, *n;
    ngx_uint_t                   i, j, k;
    ngx_http_llm_route_conf_t   *rc;
    ngx_http_llm_engine_conf_t  *ec;

    ngx_conf_init_size_value(lmcf->zone_size, 1024 * 1024);
    ngx_conf_init_uint_value(lmcf->queue, 64);
    ngx_conf_init_msec_value(lmcf->queue_timeout, 60000);
    ngx_conf_init_msec_value(lmcf->interval, 1000);
    ngx_conf_init_msec_value(lmcf->heartbeat, 3000);
    ngx_conf_init_msec_value(lmcf->stall, 10000);
    ngx_conf_init_msec_value(lmcf->probe_timeout, 30000);
    ngx_conf_init_uint_value(lmcf->fails, 3);
    ngx_conf_init_uint_value(lmcf->passes, 2);
    ngx_conf_init_value(lmcf->retry_after, 1);

    ec = lmcf->engines.elts;
    rc = lmcf->routes.elts;

    ngx_crc32_init(crc);

    for (i = 0; i < lmcf->engines.nelts; i++) {
        ngx_crc32_update(&crc, ec[i].name.data, ec[i].name.len + 1);
        ngx_crc32_update(&crc, ec[i].run_dir.data, ec[i].run_dir.len + 1);
    }

    for (i = 0; i < lmcf->routes.nelts; i++) {
        n = rc[i].names->elts;

        for (j = 0; j < rc[i].names->nelts; j++) {
            for (k = 0; k < lmcf->engines.nelts; k++) {
                if (ec[k].name.len == n[j].len
                    && ngx_strncmp(ec[k].name.data, n[j].data, n[j].len) == 0)
                {
                    break;
                }
            }

            if (k == lmcf->engines.nelts) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "llm_route \"%V\" names unknown engine "
                                   "\"%V\"", &rc[i].model, &n[j]);
                return NGX_CONF_ERROR;
            }

            rc[i].pool |= (uint64_t) 1 << k;
        }

        ngx_crc32_update(&crc, rc[i].model.data, rc[i].model.len + 1);
        ngx_crc32_update(&crc, (u_char *) &rc[i].pool, sizeof(uint64_t));
    }

    ngx_crc32_final(crc);

    if (lmcf->engines.nelts == 0) {
        return NGX_CONF_OK;
    }

    if (lmcf->zone_size < (sizeof(ngx_http_llm_shctx_t)
                           + 16 * ngx_pagesize))
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "llm_zone %uz is too small, it needs at least %uz",
                           lmcf->zone_size,
                           sizeof(ngx_http_llm_shctx_t) + 16 * ngx_pagesize);
        return NGX_CONF_ERROR;
    }

    p = ngx_pnalloc(cf->pool, sizeof("llm_ffffffff") - 1);
    if (p == NULL) {
        return NGX_CONF_ERROR;
    }

    name.data = p;
    name.len = ngx_sprintf(p, "llm_%08xD", crc) - p;

    lmcf->shm_zone = ngx_shared_memory_add(cf, &name, lmcf->zone_size,
                                           &ngx_http_llm_module);
    if (lmcf->shm_zone == NULL) {
        return NGX_CONF_ERROR;
    }

    lmcf->shm_zone->init = ngx_http_llm_init_zone;
    lmcf->shm_zone->data = lmcf;

    return NGX_CONF_OK;
}


static ngx_int_t
ngx_http_llm_init_zone(ngx_shm_zone_t *shm_zone, void *data)
{
    ngx_http_llm_main_conf_t  *olmcf = data;

    size_t                       len;
    ngx_uint_t                   i;
    ngx_http_llm_shctx_t        *sh;
    ngx_http_llm_route_sh_t     *rs;
    ngx_http_llm_route_conf_t   *rc;
    ngx_http_llm_engine_sh_t    *es;
    ngx_http_llm_main_conf_t    *lmcf;
    ngx_http_llm_engine_conf_t  *ec;

    lmcf = shm_zone->data;

    if (olmcf) {
        /* a reload with the same engines and routes: keep the state */
        lmcf->shpool = olmcf->shpool;
        lmcf->sh = olmcf->sh;
        return NGX_OK;
    }

    lmcf->shpool = (ngx_slab_pool_t *) shm_zone->shm.addr;

    sh = ngx_slab_calloc(lmcf->shpool, sizeof(ngx_http_llm_shctx_t));
    if (sh == NULL) {
        return NGX_ERROR;
    }

    lmcf->sh = sh;
    lmcf->shpool->data = sh;

    ngx_queue_init(&sh->waiters);

    ec = lmcf->engines.elts;
    sh->nengines = lmcf->engines.nelts;

    for (i = 0; i < sh->nengines; i++) {
        es = &sh->engines[i];
        ngx_memcpy(es->name, ec[i].name.data, ec[i].name.len);
        ngx_cpystrn(es->reason, (u_char *) "not seen yet",
                    NGX_HTTP_LLM_REASON_LEN);
        es->since = ngx_time();
        es->state = NGX_HTTP_LLM_ABSENT;
        ngx_queue_init(&es->running_q);
    }

    rc = lmcf->routes.elts;
    sh->nroutes = lmcf->routes.nelts;

    for (i = 0; i < sh->nroutes; i++) {
        rs = &sh->routes[i];
        ngx_memcpy(rs->model, rc[i].model.data, rc[i].model.len);
        rs->len = rc[i].model.len;
        rs->pool = rc[i].pool;
    }

    /*
     * log_ctx points at the pool's one-byte "zero" field until set:
     * the name gets an allocation of its own, as in limit_req
     */
    len = sizeof(" in llm zone \"\"") + shm_zone->shm.name.len;

    lmcf->shpool->log_ctx = ngx_slab_alloc(lmcf->shpool, len);
    if (lmcf->shpool->log_ctx == NULL) {
        return NGX_ERROR;
    }

    ngx_sprintf(lmcf->shpool->log_ctx, " in llm zone \"%V\"%Z",
                &shm_zone->shm.name);

    return NGX_OK;
}


static void *
ngx_http_llm_create_loc_conf(ngx_conf_t *cf)
{
    ngx_http_llm_loc_conf_t  *llcf;

    llcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_llm_loc_conf_t));
    if (llcf == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     llcf->admin_token = { 0, NULL };
     */

    llcf->api = NGX_CONF_UNSET_UINT;
    llcf->max_body_size = NGX_CONF_UNSET_SIZE;
    llcf->read_timeout = NGX_CONF_UNSET_MSEC;
    llcf->test_script = NGX_CONF_UNSET;
    llcf->api_keys = NGX_CONF_UNSET_PTR;
    llcf->api_key_required = NGX_CONF_UNSET;

    return llcf;
}


static char *
ngx_http_llm_merge_loc_conf(ngx_conf_t *cf, void *parent, void *child)
{
    ngx_http_llm_loc_conf_t  *prev = parent;
    ngx_http_llm_loc_conf_t  *conf = child;

    ngx_http_core_loc_conf_t  *clcf;
    ngx_http_llm_main_conf_t  *lmcf;

    ngx_conf_merge_size_value(conf->max_body_size, prev->max_body_size,
                              8 * 1024 * 1024);
    ngx_conf_merge_msec_value(conf->read_timeout, prev->read_timeout,
                              600000);
    ngx_conf_merge_str_value(conf->admin_token, prev->admin_token, "");
    ngx_conf_merge_value(conf->test_script, prev->test_script, 0);
    ngx_conf_merge_ptr_value(conf->api_keys, prev->api_keys, NULL);

    /* unset stays unset: each endpoint has its own default (auth.c) */
    if (conf->api_key_required == NGX_CONF_UNSET) {
        conf->api_key_required = prev->api_key_required;
    }

    if (conf->api == NGX_CONF_UNSET_UINT) {
        return NGX_CONF_OK;
    }

    /*
     * llm_max_body_size replaces client_max_body_size here, so that an
     * oversized body gets an OpenAI error rather than nginx's HTML page
     * (the core module merged its value already).
     */
    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
    clcf->client_max_body_size = 0;

    lmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_llm_module);

    if (conf->api != NGX_HTTP_LLM_API_NOT_FOUND
        && conf->api != NGX_HTTP_LLM_API_ERROR
        && conf->api != NGX_HTTP_LLM_API_METRICS
        && lmcf->engines.nelts == 0)
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"llm_api %V\" needs at least one llm_engine",
                           &ngx_http_llm_api_names[conf->api]);
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


static ngx_int_t
ngx_http_llm_postconfiguration(ngx_conf_t *cf)
{
    ngx_http_handler_pt        *h;
    ngx_http_core_main_conf_t  *cmcf;

    cmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_core_module);

    h = ngx_array_push(&cmcf->phases[NGX_HTTP_LOG_PHASE].handlers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    *h = ngx_http_llm_log_handler;

    return ngx_http_llm_body_filter_init(cf);
}


static ngx_int_t
ngx_http_llm_init_process(ngx_cycle_t *cycle)
{
    ngx_http_llm_main_conf_t  *lmcf;

    if (ngx_process != NGX_PROCESS_WORKER
        && ngx_process != NGX_PROCESS_SINGLE)
    {
        return NGX_OK;
    }

    lmcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_llm_module);

    if (lmcf == NULL || lmcf->sh == NULL) {
        return NGX_OK;
    }

    if (ngx_http_llm_links_init(cycle, lmcf) != NGX_OK
        || ngx_http_llm_wake_init(cycle)
           != NGX_OK
        || ngx_http_llm_health_init(cycle, lmcf) != NGX_OK)
    {
        return NGX_ERROR;
    }

    return NGX_OK;
}


static void
ngx_http_llm_exit_process(ngx_cycle_t *cycle)
{
    ngx_http_llm_main_conf_t  *lmcf;

    lmcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_llm_module);

    if (lmcf == NULL || lmcf->sh == NULL) {
        return;
    }

    ngx_http_llm_health_exit(lmcf);
    ngx_http_llm_links_close();
    ngx_http_llm_wake_close();
}
