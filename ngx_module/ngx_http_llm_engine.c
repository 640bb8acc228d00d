/*
 * Per-worker engine connections: the doorbell socket of every engine in
 * nginx's event loop, slot ownership, reconnection.
 */

#include "ngx_http_llm_module.h"


ngx_int_t
ngx_http_llm_worker_init(ngx_cycle_t *cycle, ngx_http_llm_main_conf_t *lmcf)
{
    return NGX_OK;
}


void
ngx_http_llm_worker_exit(ngx_cycle_t *cycle, ngx_http_llm_main_conf_t *lmcf)
{
}
