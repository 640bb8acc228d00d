/* Route and readmission: drain the engine behind the route through the
 * admin API, see the drain take effect, resume it, and time until the
 * route is readmitted (/health 200 and a one-token request) within
 * --readmit-timeout (r33: a readmission failed after about 543 s).  The
 * routes and promotions in /admin/status must be the same before and
 * after.  Once a drain was sent, a resume is always sent too. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "json.h"
#include "qualify.h"

/* Routes (model, pool, promoted) and engine names: what must not change. */
static void topology(yajl_val st, strbuf *out)
{
    jw w;
    jw_init(&w, out);
    jw_obj(&w, NULL);
    jw_arr(&w, "routes");
    yajl_val routes = json_get(st, "routes");
    for (size_t i = 0; YAJL_IS_ARRAY(routes) && i < routes->u.array.len; i++) {
        yajl_val r = routes->u.array.values[i], pool = json_get(r, "engines");
        strbuf eng;
        sb_init(&eng);
        if (pool) json_dump(&eng, pool, JSON_COMPACT);
        else sb_puts(&eng, "null");
        jw_obj(&w, NULL);
        jw_str(&w, "model", json_string(json_get(r, "model")));
        jw_raw(&w, "engines", eng.data, eng.len);
        jw_bool(&w, "promoted", YAJL_IS_TRUE(json_get(r, "promoted")));
        jw_end(&w);
        sb_free(&eng);
    }
    jw_end(&w);
    jw_arr(&w, "engines");
    yajl_val engines = json_get(st, "engines");
    for (size_t i = 0; YAJL_IS_ARRAY(engines) && i < engines->u.array.len; i++)
        jw_str(&w, NULL, json_string(json_get(engines->u.array.values[i], "name")));
    jw_end(&w);
    jw_end(&w);
}

static yajl_val engine_of(yajl_val st, const char *name)
{
    yajl_val engines = json_get(st, "engines");
    for (size_t i = 0; YAJL_IS_ARRAY(engines) && i < engines->u.array.len; i++) {
        const char *n = json_string(json_get(engines->u.array.values[i], "name"));
        if (n && !strcmp(n, name)) return engines->u.array.values[i];
    }
    return NULL;
}

static int admin_post(qctx *q, const char *label, const char *op, const char *engine, strbuf *why)
{
    strbuf path;
    sb_init(&path);
    sb_printf(&path, "/admin/%s?engine=", op);
    for (const char *p = engine; *p; p++) {
        unsigned char c = (unsigned char)*p;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-'
            || c == '_' || c == '.')
            sb_putc(&path, (char)c);
        else
            sb_printf(&path, "%%%02X", c);
    }
    http_resp r;
    http_resp_init(&r);
    q_http(q, label, "POST", path.data, "", 0, true, NULL, NULL, &r);
    int rc = 0;
    if (r.status != 200 || r.error[0]) {
        sb_printf(why, "POST %s: ", path.data);
        describe_error(&r, why);
        rc = -1;
    }
    http_resp_free(&r);
    sb_free(&path);
    return rc;
}

/* Resume even when the gate is out of time or the run was interrupted:
 * an engine must not stay drained because of us. */
static int resume(qctx *q, const char *engine, strbuf *why)
{
    int saved = http_interrupted;
    double deadline = q->deadline;
    http_interrupted = 0;
    if (q->deadline < now_s() + 30) q->deadline = now_s() + 30;
    int rc = admin_post(q, "resume", "resume", engine, why);
    q->deadline = deadline;
    http_interrupted = saved;
    return rc;
}

/* Poll /admin/status until the engine reports draining (bounded). */
static int wait_draining(qctx *q, const char *engine, double bound_s, strbuf *state)
{
    double end = now_s() + bound_s;
    for (int i = 0; now_s() < end && time_left(q) > 0; i++) {
        strbuf why;
        sb_init(&why);
        char label[32];
        snprintf(label, sizeof label, "status-draining-%d", i);
        yajl_val st = get_json(q, label, "/admin/status", true, &why);
        yajl_val e = engine_of(st, engine);
        const char *s = json_string(json_get(e, "state"));
        sb_reset(state);
        sb_puts(state, s ? s : why.len ? why.data : "unknown");
        int done = YAJL_IS_TRUE(json_get(e, "draining")) || (s && !strcmp(s, "draining"));
        yajl_tree_free(st);
        sb_free(&why);
        if (done) return 0;
        usleep(200 * 1000);
    }
    return -1;
}

void gate_route(qctx *q, gate *g)
{
    strbuf why, before_t, after_t, state;
    sb_init(&why);
    sb_init(&before_t);
    sb_init(&after_t);
    sb_init(&state);
    yajl_val before = get_json(q, "status-before", "/admin/status", true, &why), after = NULL;
    char pool_names[8][128];
    const char *engine = NULL;
    if (!before) {
        gate_check(g, ST_FAIL, "admin status", "%s", why.data);
        goto out;
    }
    topology(before, &before_t);
    int pool = route_engines(before, q->model, pool_names, 8);
    engine = q->engine_name ? q->engine_name : pool ? pool_names[0] : NULL;
    if (!engine || !engine_of(before, engine)) {
        if (engine)
            gate_check(g, ST_FAIL, "engine", "/admin/status lists no engine \"%s\"", engine);
        else
            gate_check(g, ST_FAIL, "engine", "/admin/status lists no engine serving \"%s\"", q->model);
        goto out;
    }
    jw_str(&g->mw, "engine", engine);
    jw_int(&g->mw, "route_pool_size", pool);

    /* drain (mode-leave) */
    sb_reset(&why);
    if (admin_post(q, "drain", "drain", engine, &why) < 0) {
        gate_check(g, ST_FAIL, "drain", "%s", why.data);
        goto out;
    }
    if (wait_draining(q, engine, 10, &state) < 0) {
        gate_check(g, ST_FAIL, "drain", "engine %s did not report draining within 10 s (state %s)",
                   engine, state.data);
    } else {
        gate_check(g, ST_PASS, "drain", "engine %s is draining", engine);
        /* A route whose only engine drains must refuse new work with 503. */
        if (q->drain_check && pool == 1) {
            http_resp r;
            http_resp_init(&r);
            strbuf body;
            sb_init(&body);
            sb_puts(&body, "{\"model\":");
            json_put_cstr(&body, q->model);
            sb_puts(&body, ",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":1}");
            q_http(q, "while-draining", "POST", "/v1/chat/completions", body.data, body.len, false,
                   NULL, NULL, &r);
            char ra[32] = "";
            http_header(&r, "retry-after", ra, sizeof ra);
            if (r.status == 503 && ra[0])
                gate_check(g, ST_PASS, "refused while draining", "HTTP 503 with Retry-After %s", ra);
            else
                gate_check(g, ST_FAIL, "refused while draining", "a request to a route whose only "
                           "engine drains got HTTP %ld%s, not 503 with Retry-After", r.status,
                           r.status == 503 ? " without Retry-After" : "");
            sb_free(&body);
            http_resp_free(&r);
        }
    }

    /* resume and readmission */
    sb_reset(&why);
    double t0 = now_s();
    if (resume(q, engine, &why) < 0) {
        gate_check(g, ST_FAIL, "resume", "%s", why.data);
        goto out;
    }
    double bound = q->readmit_timeout_s;
    double took = wait_ready(q, "readmit", bound, &why);
    if (took >= 0) took = now_s() - t0;
    jw_num(&g->mw, "readmission_s", took >= 0 ? took : NAN, 3);
    jw_num(&g->mw, "readmission_bound_s", bound, 0);
    if (took < 0 && http_interrupted)
        gate_check(g, ST_FAIL, "readmission", "interrupted %.1f s after the resume, before "
                   "readmission; last: %s", now_s() - t0, why.data);
    else if (took < 0)
        gate_check(g, ST_FAIL, "readmission", "not readmitted within %.0f s of the resume; last: %s",
                   bound, why.data);
    else
        gate_check(g, ST_PASS, "readmission", "health 200 and a one-token request %.2f s after "
                   "the resume", took);

    sb_reset(&why);
    after = get_json(q, "status-after", "/admin/status", true, &why);
    if (!after) {
        gate_check(g, ST_FAIL, "no route change", "%s", why.data);
        goto out;
    }
    topology(after, &after_t);
    if (strcmp(before_t.data, after_t.data))
        gate_check(g, ST_FAIL, "no route change", "routes or promotions changed: before %s, after %s",
                   before_t.data, after_t.data);
    else
        gate_check(g, ST_PASS, "no route change", "routes, pools and promotions as before");
    const char *e0 = json_string(json_get(engine_of(before, engine), "epoch"));
    const char *e1 = json_string(json_get(engine_of(after, engine), "epoch"));
    if (e0 && e1 && strcmp(e0, e1))
        gate_caveat(g, "engine %s has a new epoch (%s -> %s): it restarted during the gate", engine,
                    e0, e1);
    if (took >= 0 && !g->n_fail)
        gate_summary(g, "Drained and readmitted %s in %.2f s (bound %.0f s); no route or promotion "
                     "changed", engine, took, bound);
out:
    yajl_tree_free(before);
    yajl_tree_free(after);
    sb_free(&why);
    sb_free(&before_t);
    sb_free(&after_t);
    sb_free(&state);
}
