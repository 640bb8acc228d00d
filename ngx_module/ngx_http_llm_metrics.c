/*
 * Prometheus metrics (text format 0.0.4), namespace llm_.  Counters and
 * histograms live in the shared zone and are updated with atomic adds, so
 * every worker reports the same numbers; engine-side numbers (KV blocks,
 * the engine's own running/waiting) come from the engine's segment header
 * as this worker maps it.  docs/NGINX.md lists every metric.
 */

#include "ngx_http_llm_module.h"


/* histogram bucket bounds, microseconds */
static uint64_t  ngx_http_llm_bounds[NGX_HTTP_LLM_HISTS]
                                    [NGX_HTTP_LLM_BUCKETS] = {
    /* queue time */
    { 1000, 5000, 10000, 50000, 100000, 250000, 500000, 1000000, 2500000,
      5000000, 10000000, 30000000, 60000000, 120000000, 300000000,
      600000000 },
    /* time to first token */
    { 10000, 25000, 50000, 100000, 250000, 500000, 750000, 1000000,
      2500000, 5000000, 10000000, 20000000, 40000000, 80000000, 160000000,
      320000000 },
    /* inter-token latency */
    { 1000, 2500, 5000, 10000, 20000, 30000, 50000, 75000, 100000, 150000,
      200000, 300000, 500000, 1000000, 2000000, 5000000 },
    /* request duration */
    { 100000, 250000, 500000, 1000000, 2500000, 5000000, 10000000,
      20000000, 40000000, 80000000, 160000000, 320000000, 640000000,
      1280000000, 2560000000ULL, 5120000000ULL }
};

static const char  *ngx_http_llm_hist_names[] = {
    "llm_queue_time_seconds",
    "llm_time_to_first_token_seconds",
    "llm_inter_token_latency_seconds",
    "llm_request_duration_seconds"
};

static const char  *ngx_http_llm_hist_help[] = {
    "Time from request to admission (0 when admitted at once).",
    "Time from request to the first generated token.",
    "Time between consecutive generated tokens of a request.",
    "Time from request to the last byte of the response."
};

static ngx_uint_t  ngx_http_llm_statuses[NGX_HTTP_LLM_STATUSES] = {
    0, 200, 400, 401, 403, 404, 405, 409, 413, 429, 499, 500, 503, 504
};

/* metric families read from the engine header's counters */
#define NGX_HTTP_LLM_KV_RATIO  LLM_CTR_N

typedef struct {
    const char   *name;
    const char   *type;
    const char   *help;
    const char   *label;
    ngx_uint_t    counter;      /* LLM_CTR_*, or NGX_HTTP_LLM_KV_RATIO */
} ngx_http_llm_family_t;

static ngx_http_llm_family_t  ngx_http_llm_engine_families[] = {
    { "llm_engine_kv_usage_ratio", "gauge",
      "KV cache blocks in use over blocks in total.", "",
      NGX_HTTP_LLM_KV_RATIO },
    { "llm_engine_kv_blocks_used", "gauge", "KV cache blocks in use.", "",
      LLM_CTR_KV_BLOCKS_USED },
    { "llm_engine_kv_blocks_total", "gauge", "KV cache blocks in total.", "",
      LLM_CTR_KV_BLOCKS_TOTAL },
    { "llm_engine_kv_capacity_tokens", "gauge",
      "Tokens the KV cache holds.", "", LLM_CTR_KV_CAPACITY_TOKENS },
    { "llm_engine_kv_capacity_bytes", "gauge",
      "Bytes of the KV cache.", "", LLM_CTR_KV_CAPACITY_BYTES },
    { "llm_engine_sequences", "gauge",
      "The engine's own count of running and waiting sequences.",
      ",state=\"running\"", LLM_CTR_RUNNING },
    { "llm_engine_sequences", NULL, NULL, ",state=\"waiting\"",
      LLM_CTR_WAITING },
    { "llm_engine_prefix_cache_hit_tokens", "counter",
      "Prompt tokens served from the prefix cache.", "",
      LLM_CTR_PREFIX_CACHE_HITS },
    { "llm_engine_prefix_cache_queries", "counter",
      "Admitted prompts looked up in the prefix cache.", "",
      LLM_CTR_PREFIX_CACHE_QUERIES },
    { "llm_engine_prefix_cache_query_tokens", "counter",
      "Prompt tokens of the prefix cache lookups.", "",
      LLM_CTR_PREFIX_CACHE_QUERY_TOKENS },
    { "llm_engine_prefix_cache_hits", "counter",
      "Prefix cache lookups that reused a cached prefix.", "",
      LLM_CTR_PREFIX_CACHE_HIT_QUERIES },
    { "llm_engine_prefix_cache_blocks", "gauge",
      "KV cache blocks the prefix cache holds (entries and snapshots).", "",
      LLM_CTR_PREFIX_CACHE_BLOCKS },
    { "llm_engine_prefix_cache_host_bytes", "gauge",
      "Bytes in the prefix cache's host-memory tier.", "",
      LLM_CTR_PREFIX_CACHE_HOST_BYTES },
    { "llm_engine_prefix_cache_host_copies", "counter",
      "Prefix cache entries copied to or from the host-memory tier.", "",
      LLM_CTR_PREFIX_CACHE_HOST_COPIES },
    { NULL, NULL, NULL, NULL, 0 }
};

static const char  *ngx_http_llm_token_names[] = {
    "prompt", "completion", "reasoning", "cached"
};


void
ngx_http_llm_observe(ngx_http_llm_main_conf_t *lmcf, ngx_http_llm_hist_e h,
    uint64_t ns)
{
    uint64_t              us;
    ngx_uint_t            i;
    ngx_http_llm_hist_t  *hist;

    hist = &lmcf->sh->metrics.hist[h];
    us = ns / 1000;

    for (i = 0; i < NGX_HTTP_LLM_BUCKETS; i++) {
        if (us <= ngx_http_llm_bounds[h][i]) {
            break;
        }
    }

    ngx_atomic_fetch_add(&hist->bucket[i], 1);
    ngx_atomic_fetch_add(&hist->sum_us, us);
}


void
ngx_http_llm_count_request(ngx_http_llm_main_conf_t *lmcf, ngx_uint_t api,
    ngx_uint_t status)
{
    ngx_uint_t  i;

    if (lmcf->sh == NULL) {
        return;
    }

    for (i = 1; i < NGX_HTTP_LLM_STATUSES; i++) {
        if (ngx_http_llm_statuses[i] == status) {
            break;
        }
    }

    if (i == NGX_HTTP_LLM_STATUSES) {
        i = 0;
    }

    ngx_atomic_fetch_add(&lmcf->sh->metrics.requests[api][i], 1);
}


void
ngx_http_llm_count_tokens(ngx_http_llm_main_conf_t *lmcf, llm_ipc_usage *u)
{
    ngx_atomic_t  *t;

    t = lmcf->sh->metrics.tokens;

    ngx_atomic_fetch_add(&t[NGX_HTTP_LLM_T_PROMPT], u->prompt_tokens);
    ngx_atomic_fetch_add(&t[NGX_HTTP_LLM_T_COMPLETION], u->completion_tokens);
    ngx_atomic_fetch_add(&t[NGX_HTTP_LLM_T_REASONING], u->reasoning_tokens);
    ngx_atomic_fetch_add(&t[NGX_HTTP_LLM_T_CACHED], u->cached_tokens);
}


static void
ngx_http_llm_help(ngx_http_llm_wbuf_t *w, const char *name,
    const char *type, const char *help)
{
    /* a family's second label set continues the group: no HELP again */
    if (help == NULL) {
        return;
    }

    ngx_http_llm_printf(w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name,
                        type);
}


static void
ngx_http_llm_hist_text(ngx_http_llm_wbuf_t *w, ngx_http_llm_hist_e h,
    ngx_http_llm_hist_t *hist)
{
    uint64_t    n;
    ngx_uint_t  i;

    ngx_http_llm_help(w, ngx_http_llm_hist_names[h], "histogram",
                      ngx_http_llm_hist_help[h]);

    n = 0;

    for (i = 0; i < NGX_HTTP_LLM_BUCKETS; i++) {
        n += hist->bucket[i];
        ngx_http_llm_printf(w, "%s_bucket{le=\"%uL.%06uL\"} %uL\n",
                            ngx_http_llm_hist_names[h],
                            ngx_http_llm_bounds[h][i] / 1000000,
                            ngx_http_llm_bounds[h][i] % 1000000, n);
    }

    n += hist->bucket[NGX_HTTP_LLM_BUCKETS];

    ngx_http_llm_printf(w, "%s_bucket{le=\"+Inf\"} %uL\n%s_sum %uL.%06uL\n"
                        "%s_count %uL\n",
                        ngx_http_llm_hist_names[h], n,
                        ngx_http_llm_hist_names[h],
                        (uint64_t) hist->sum_us / 1000000,
                        (uint64_t) hist->sum_us % 1000000,
                        ngx_http_llm_hist_names[h], n);
}


static void
ngx_http_llm_metrics_text(ngx_http_llm_shctx_t *sh, ngx_http_llm_wbuf_t *w)
{
    uint64_t                   ctr[NGX_HTTP_LLM_MAX_ENGINES][LLM_CTR_N];
    uint64_t                   running, used, total;
    ngx_uint_t                 i, j, have[NGX_HTTP_LLM_MAX_ENGINES];
    ngx_http_llm_link_t       *link;
    ngx_http_llm_family_t     *f;
    ngx_http_llm_metrics_t    *m;
    ngx_http_llm_engine_sh_t  *es;

    m = &sh->metrics;

    ngx_http_llm_help(w, "llm_requests_total", "counter",
                      "HTTP requests by endpoint and status.");

    for (i = 0; i < NGX_HTTP_LLM_API_COUNT; i++) {
        for (j = 0; j < NGX_HTTP_LLM_STATUSES; j++) {
            if (m->requests[i][j] == 0) {
                continue;
            }

            ngx_http_llm_printf(w, "llm_requests_total{endpoint=\"%V\","
                                "status=\"", &ngx_http_llm_api_names[i]);

            if (j == 0) {
                ngx_http_llm_puts(w, "other");
            } else {
                ngx_http_llm_printf(w, "%ui", ngx_http_llm_statuses[j]);
            }

            ngx_http_llm_printf(w, "\"} %uA\n", m->requests[i][j]);
        }
    }

    running = 0;

    for (i = 0; i < sh->nengines; i++) {
        running += sh->engines[i].running;
    }

    ngx_http_llm_help(w, "llm_running", "gauge",
                      "Sequences admitted by nginx and running now.");
    ngx_http_llm_printf(w, "llm_running %uL\n", running);
    ngx_http_llm_help(w, "llm_waiting", "gauge",
                      "Requests waiting in the admission queue.");
    ngx_http_llm_printf(w, "llm_waiting %ui\n", sh->waiting);

    for (i = 0; i < NGX_HTTP_LLM_HISTS; i++) {
        ngx_http_llm_hist_text(w, i, &m->hist[i]);
    }

    for (i = 0; i < NGX_HTTP_LLM_TOKEN_KINDS; i++) {
        ngx_http_llm_printf(w, "# HELP llm_%s_tokens_total %s tokens of "
                            "finished requests, as the engine counted "
                            "them.\n# TYPE llm_%s_tokens_total counter\n"
                            "llm_%s_tokens_total %uA\n",
                            ngx_http_llm_token_names[i],
                            ngx_http_llm_token_names[i],
                            ngx_http_llm_token_names[i],
                            ngx_http_llm_token_names[i], m->tokens[i]);
    }

    ngx_http_llm_help(w, "llm_probes_total", "counter",
                      "Health probes by result.");
    ngx_http_llm_printf(w, "llm_probes_total{result=\"ok\"} %uA\n"
                        "llm_probes_total{result=\"failed\"} %uA\n",
                        m->probes_ok, m->probes_failed);

    ngx_http_llm_help(w, "llm_engine_state", "gauge",
                      "1 for the engine's current health state.");

    for (i = 0; i < sh->nengines; i++) {
        es = &sh->engines[i];

        for (j = 0; j < NGX_HTTP_LLM_STATES; j++) {
            ngx_http_llm_printf(w, "llm_engine_state{engine=\"%s\","
                                "state=\"%s\"} %d\n", es->name,
                                ngx_http_llm_state_names[j],
                                es->state == j);
        }
    }

    ngx_http_llm_help(w, "llm_engine_transitions_total", "counter",
                      "Health state transitions by the state entered.");

    for (i = 0; i < sh->nengines; i++) {
        es = &sh->engines[i];

        for (j = 0; j < NGX_HTTP_LLM_STATES; j++) {
            ngx_http_llm_printf(w, "llm_engine_transitions_total{engine="
                                "\"%s\",to=\"%s\"} %uA\n", es->name,
                                ngx_http_llm_state_names[j],
                                es->entered[j]);
        }
    }

    ngx_http_llm_help(w, "llm_engine_running", "gauge",
                      "Sequences nginx admitted to the engine.");

    for (i = 0; i < sh->nengines; i++) {
        ngx_http_llm_printf(w, "llm_engine_running{engine=\"%s\"} %ui\n",
                            sh->engines[i].name, sh->engines[i].running);
    }

    /* the engines' own numbers, as this worker maps their segments */
    for (i = 0; i < sh->nengines; i++) {
        link = ngx_http_llm_link(i);
        have[i] = (link && link->attached);

        if (have[i]) {
            llm_ipc_counters(&link->client, ctr[i]);
        }
    }

    for (f = ngx_http_llm_engine_families; f->name; f++) {
        ngx_http_llm_help(w, f->name, f->type, f->help);

        for (i = 0; i < sh->nengines; i++) {
            if (!have[i]) {
                continue;
            }

            if (f->counter == NGX_HTTP_LLM_KV_RATIO) {
                used = ctr[i][LLM_CTR_KV_BLOCKS_USED];
                total = ctr[i][LLM_CTR_KV_BLOCKS_TOTAL];

                ngx_http_llm_printf(w, "%s{engine=\"%s\"} %uL.%06uL\n",
                                    f->name, sh->engines[i].name,
                                    total ? used / total : 0,
                                    total ? (used % total) * 1000000 / total
                                          : 0);
                continue;
            }

            ngx_http_llm_printf(w, "%s{engine=\"%s\"%s} %uL\n", f->name,
                                sh->engines[i].name, f->label,
                                ctr[i][f->counter]);
        }
    }

}


ngx_int_t
ngx_http_llm_metrics_handler(ngx_http_request_t *r)
{
    ngx_int_t                  rc;
    ngx_buf_t                 *b;
    ngx_chain_t                out;
    ngx_http_llm_wbuf_t        w;
    ngx_http_llm_shctx_t      *sh;
    ngx_http_llm_main_conf_t  *lmcf;

    lmcf = ngx_http_get_module_main_conf(r, ngx_http_llm_module);

    rc = ngx_http_discard_request_body(r);
    if (rc != NGX_OK) {
        return rc;
    }

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
        return ngx_http_llm_send_error(r, NGX_HTTP_NOT_ALLOWED,
                                       "this endpoint answers GET", NULL,
                                       "method_not_allowed");
    }

    ngx_http_llm_wbuf_init(&w, r->pool);

    if (lmcf->sh) {
        sh = ngx_palloc(r->pool, sizeof(ngx_http_llm_shctx_t));
        if (sh == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        ngx_shmtx_lock(&lmcf->shpool->mutex);
        ngx_memcpy(sh, lmcf->sh, sizeof(ngx_http_llm_shctx_t));
        ngx_shmtx_unlock(&lmcf->shpool->mutex);

        ngx_http_llm_metrics_text(sh, &w);
    }

    if (w.failed) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    r->headers_out.status = NGX_HTTP_OK;
    r->headers_out.content_length_n = ngx_http_llm_wbuf_len(&w);
    ngx_str_set(&r->headers_out.content_type,
                "text/plain; version=0.0.4; charset=utf-8");
    r->headers_out.content_type_len = r->headers_out.content_type.len;

    rc = ngx_http_send_header(r);
    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only || w.start == NULL)
    {
        return rc;
    }

    b = ngx_calloc_buf(r->pool);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    b->pos = w.start;
    b->last = w.last;
    b->memory = 1;
    b->last_buf = 1;

    out.buf = b;
    out.next = NULL;

    return ngx_http_output_filter(r, &out);
}
