/* KV allocation: the KV cache capacity the engine reports (tokens, bytes)
 * and what it means at max_model_len (r33: "15.27 GiB, 283,917 tokens,
 * 2.17x capacity at the configured 131,072-token envelope").  Read from
 * /health JSON (engines[].kv_capacity_tokens / kv_capacity_bytes, or a
 * "kv" object with capacity_tokens / capacity_bytes) or /metrics
 * (llm_engine_kv_capacity_tokens{engine=...}, ..._bytes). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "command.h"
#include "json.h"
#include "qualify.h"
#include "recipe.h"

typedef struct {
    double tokens, bytes;   /* < 0: not reported */
    char   engine[128];
    const char *source;
} kv_info;

#define MAX_KV 16

static double num_member(yajl_val o, const char *a, const char *kv_obj, const char *b)
{
    double d;
    if (json_number(json_get(o, a), &d)) return d;
    if (json_number(json_get(json_get(o, kv_obj), b), &d)) return d;
    return -1;
}

static int from_health(yajl_val h, kv_info *out)
{
    int n = 0;
    yajl_val engines = json_get(h, "engines");
    for (size_t i = 0; YAJL_IS_ARRAY(engines) && i < engines->u.array.len && n < MAX_KV; i++) {
        yajl_val e = engines->u.array.values[i];
        kv_info k = { num_member(e, "kv_capacity_tokens", "kv", "capacity_tokens"),
                      num_member(e, "kv_capacity_bytes", "kv", "capacity_bytes"), "", "/health" };
        const char *name = json_string(json_get(e, "name"));
        snprintf(k.engine, sizeof k.engine, "%s", name ? name : "");
        if (k.tokens >= 0) out[n++] = k;
    }
    if (n == 0) {
        kv_info k = { num_member(h, "kv_capacity_tokens", "kv", "capacity_tokens"),
                      num_member(h, "kv_capacity_bytes", "kv", "capacity_bytes"), "", "/health" };
        if (k.tokens >= 0) out[n++] = k;
    }
    return n;
}

/* Samples of one Prometheus metric: the engine label and the value. */
static int prom_samples(const char *text, const char *metric, char eng[][128], double *val, int max)
{
    int n = 0;
    size_t ml = strlen(metric);
    for (const char *p = text; p && *p && n < max;) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        if (len > ml && !strncmp(p, metric, ml) && (p[ml] == '{' || p[ml] == ' ')) {
            eng[n][0] = 0;
            const char *v = p + ml;
            if (*v == '{') {
                const char *close = memchr(v, '}', (size_t)(p + len - v));
                const char *lab = strstr(v, "engine=\"");
                if (lab && close && lab < close) {
                    lab += 8;
                    const char *q = memchr(lab, '"', (size_t)(close - lab));
                    if (q) snprintf(eng[n], 128, "%.*s", (int)(q - lab), lab);
                }
                v = close ? close + 1 : p + len;
            }
            char *end;
            double d = strtod(v, &end);
            if (end != v) val[n++] = d;
        }
        p += len + (eol ? 1 : 0);
    }
    return n;
}

static int from_metrics(const char *text, kv_info *out)
{
    static const char *const tok_names[] = { "llm_engine_kv_capacity_tokens", "llm_kv_capacity_tokens", NULL };
    static const char *const byte_names[] = { "llm_engine_kv_capacity_bytes", "llm_kv_capacity_bytes", NULL };
    char eng[MAX_KV][128], beng[MAX_KV][128];
    double val[MAX_KV], bval[MAX_KV];
    int n = 0, nb = 0;
    for (int i = 0; tok_names[i] && !n; i++) n = prom_samples(text, tok_names[i], eng, val, MAX_KV);
    for (int i = 0; byte_names[i] && !nb; i++) nb = prom_samples(text, byte_names[i], beng, bval, MAX_KV);
    for (int i = 0; i < n; i++) {
        out[i] = (kv_info){ val[i], -1, "", "/metrics" };
        memcpy(out[i].engine, eng[i], sizeof out[i].engine);
        for (int j = 0; j < nb; j++)
            if (!strcmp(beng[j], eng[i])) out[i].bytes = bval[j];
    }
    return n;
}

/* The engine's own header, through `llm-engine status` (same host). */
static int from_engine_status(qctx *q, kv_info *out, strbuf *why)
{
    recipe r;
    strbuf errors, text;
    sb_init(&errors);
    sb_init(&text);
    int n = 0;
    if (recipe_load(&r, q->recipe_path, &errors) != 0) {
        sb_printf(why, "the recipe does not load: %s", errors.data ? errors.data : "");
    } else {
        char *argv[] = { (char *)q->engine_bin, "status", "--run-dir", r.run_dir, "--name", r.name, NULL };
        int rc = run_command(q, argv, &text, why);
        q_keep(q, "engine-status", ".json", text.data ? text.data : "", text.len);
        char err[128];
        yajl_val v = rc == 0 ? json_parse(text.data, text.len, err, sizeof err) : NULL;
        double tokens, bytes;
        if (v && json_number(json_get(v, "kv_capacity_tokens"), &tokens) && tokens > 0) {
            out[0] = (kv_info){ tokens, -1, "", "llm-engine status" };
            if (json_number(json_get(v, "kv_capacity_bytes"), &bytes) && bytes > 0) out[0].bytes = bytes;
            snprintf(out[0].engine, sizeof out[0].engine, "%s", r.name);
            n = 1;
        } else if (rc == 0) {
            sb_printf(why, "llm-engine status for %s reports no kv_capacity_tokens", r.name);
        }
        yajl_tree_free(v);
    }
    recipe_free(&r);
    sb_free(&errors);
    sb_free(&text);
    return n;
}

void gate_kv(qctx *q, gate *g)
{
    kv_info kv[MAX_KV];
    int n = 0;
    strbuf why;
    sb_init(&why);
    http_resp r;
    http_resp_init(&r);
    q_http(q, "health", "GET", "/health", NULL, 0, false, NULL, NULL, &r);
    char err[128];
    yajl_val h = r.status ? json_parse(r.body.data ? r.body.data : "", r.body.len, err, sizeof err)
                          : NULL;
    if (h) n = from_health(h, kv);
    yajl_tree_free(h);
    if (!n) {
        q_http(q, "metrics", "GET", "/metrics", NULL, 0, false, NULL, NULL, &r);
        if (r.status == 200) n = from_metrics(r.body.data ? r.body.data : "", kv);
        else describe_error(&r, &why);
    }
    http_resp_free(&r);
    strbuf local;
    sb_init(&local);
    if (!n && q->recipe_path) n = from_engine_status(q, kv, &local);
    if (!n) {
        gate_check(g, ST_FAIL, "reported", "neither /health (engines[].kv_capacity_tokens) nor "
                   "/metrics (llm_engine_kv_capacity_tokens) reports the KV capacity%s%s%s%s",
                   why.len ? "; /metrics: " : "", why.data ? why.data : "",
                   q->recipe_path ? "; llm-engine status: " : " (with --recipe, llm-engine status "
                   "is asked too)", local.data ? local.data : "");
        sb_free(&local);
        sb_free(&why);
        return;
    }
    jw_arr(&g->mw, "engines");
    int worst = 0;
    for (int i = 0; i < n; i++) {
        jw_obj(&g->mw, NULL);
        jw_str(&g->mw, "engine", kv[i].engine[0] ? kv[i].engine : NULL);
        jw_str(&g->mw, "source", kv[i].source);
        jw_num(&g->mw, "capacity_tokens", kv[i].tokens, 0);
        jw_num(&g->mw, "capacity_bytes", kv[i].bytes >= 0 ? kv[i].bytes : NAN, 0);
        jw_num(&g->mw, "capacity_gib", kv[i].bytes >= 0 ? kv[i].bytes / 1073741824.0 : NAN, 2);
        jw_num(&g->mw, "concurrency_at_max_model_len",
               q->max_model_len ? kv[i].tokens / (double)q->max_model_len : NAN, 2);
        jw_end(&g->mw);
        if (kv[i].tokens < kv[worst].tokens) worst = i;
    }
    jw_end(&g->mw);
    kv_info *w = &kv[worst];
    double conc = q->max_model_len ? w->tokens / (double)q->max_model_len : NAN;
    strbuf gib;
    sb_init(&gib);
    if (w->bytes >= 0) sb_printf(&gib, "%.2f GiB, ", w->bytes / 1073741824.0);
    if (w->bytes < 0) gate_caveat(g, "the KV capacity in bytes is not reported");
    if (!q->max_model_len) {
        gate_check(g, ST_FAIL, "fits max_model_len", "max_model_len is unknown");
    } else if (w->tokens < (double)q->max_model_len) {
        gate_check(g, ST_FAIL, "fits max_model_len", "%s%.0f tokens cannot hold one %ld-token "
                   "sequence", gib.data ? gib.data : "", w->tokens, q->max_model_len);
    } else {
        gate_check(g, ST_PASS, "fits max_model_len", "%.0f tokens hold %.2fx max_model_len",
                   w->tokens, conc);
    }
    gate_summary(g, "%s%.0f tokens, %.2fx capacity at the configured %ld-token envelope (%s)",
                 gib.data ? gib.data : "", w->tokens, conc, q->max_model_len, w->source);
    sb_free(&gib);
    sb_free(&local);
    sb_free(&why);
}
