/*
 * Routing and engine health: model name -> pool of engines, the health
 * state machine kept in the shared zone, probes, and /health.
 */

#include "ngx_http_llm_module.h"


static ngx_int_t
ngx_http_llm_served(ngx_http_llm_engine_sh_t *es, ngx_str_t *model)
{
    ngx_uint_t  i;

    for (i = 0; i < es->nmodels; i++) {
        if (ngx_strlen(es->models[i]) == model->len
            && ngx_strncmp(es->models[i], model->data, model->len) == 0)
        {
            return 1;
        }
    }

    return 0;
}


/*
 * A route named in llm_route (or created by promote) wins; otherwise the
 * model routes to every engine whose header lists it as a served name.
 */
ngx_int_t
ngx_http_llm_route_find(ngx_http_llm_main_conf_t *lmcf, ngx_str_t *model,
    ngx_int_t *route, uint64_t *pool)
{
    ngx_uint_t                i;
    ngx_http_llm_shctx_t     *sh = lmcf->sh;
    ngx_http_llm_route_sh_t  *rs;

    *route = -1;
    *pool = 0;

    if (sh == NULL) {
        return NGX_DECLINED;
    }

    ngx_shmtx_lock(&lmcf->shpool->mutex);

    for (i = 0; i < sh->nroutes; i++) {
        rs = &sh->routes[i];

        if (rs->len == model->len
            && ngx_strncmp(rs->model, model->data, model->len) == 0)
        {
            *route = i;
            *pool = rs->pool;
            break;
        }
    }

    if (*route == -1) {
        for (i = 0; i < sh->nengines; i++) {
            if (ngx_http_llm_served(&sh->engines[i], model)) {
                *pool |= (uint64_t) 1 << i;
            }
        }
    }

    ngx_shmtx_unlock(&lmcf->shpool->mutex);

    return *pool ? NGX_OK : NGX_DECLINED;
}
