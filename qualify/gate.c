/* The gate record, HTTP exchanges kept as artifacts, and the readiness
 * helpers several gates share. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "json.h"
#include "qualify.h"

const char *status_name(enum gate_status s)
{
    switch (s) {
    case ST_PASS: return "pass";
    case ST_FAIL: return "fail";
    case ST_SKIPPED: return "skipped";
    case ST_NOT_MEANINGFUL: return "not_meaningful";
    }
    return "?";
}

void gate_init(gate *g, const char *id, const char *title, double bound_s)
{
    memset(g, 0, sizeof *g);
    g->id = id;
    g->title = title;
    g->bound_s = bound_s;
    g->selected = g->required = true;
    strbuf *bufs[] = { &g->skip_reason, &g->summary, &g->meas, &g->checks, &g->caveats,
                       &g->arts, &g->first_failure };
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) sb_init(bufs[i]);
    /* Each writer appends bare members/elements; report.c adds brackets. */
    jw_init(&g->mw, &g->meas);
    jw_init(&g->cw, &g->checks);
    jw_init(&g->vw, &g->caveats);
    jw_init(&g->aw, &g->arts);
}

void gate_free(gate *g)
{
    strbuf *bufs[] = { &g->skip_reason, &g->summary, &g->meas, &g->checks, &g->caveats,
                       &g->arts, &g->first_failure };
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) sb_free(bufs[i]);
}

void gate_begin(qctx *q, gate *g)
{
    q->g = g;
    g->ran = true;
    g->t0 = now_s();
    q->deadline = g->t0 + g->bound_s;
    fprintf(stderr, "llm-qualify: %s ...\n", g->title);
}

void gate_end(qctx *q, gate *g)
{
    g->duration_s = g->ran ? now_s() - g->t0 : 0;
    if (g->skipped) g->status = ST_SKIPPED;
    else if (g->n_fail) g->status = ST_FAIL;
    else if (g->n_pass + g->n_not_meaningful == 0) {
        gate_check(g, ST_FAIL, "ran", "the gate made no check (an internal error)");
        g->status = ST_FAIL;
    } else if (g->n_not_meaningful) g->status = ST_NOT_MEANINGFUL;
    else g->status = ST_PASS;
    if (!g->summary.len) {
        if (g->skipped) gate_summary(g, "skipped: %s", g->skip_reason.data);
        else if (g->n_fail) gate_summary(g, "failed: %s", g->first_failure.data);
    }
    fprintf(stderr, "llm-qualify: %s: %s (%.1f s)%s%s\n", g->title, status_name(g->status),
            g->duration_s, g->status == ST_FAIL ? " - " : "",
            g->status == ST_FAIL ? g->first_failure.data : "");
    q->g = NULL;
}

void gate_skip(gate *g, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sb_reset(&g->skip_reason);
    sb_vprintf(&g->skip_reason, fmt, ap);
    va_end(ap);
    g->skipped = true;
}

void gate_check(gate *g, enum gate_status st, const char *name, const char *fmt, ...)
{
    strbuf detail;
    sb_init(&detail);
    va_list ap;
    va_start(ap, fmt);
    sb_vprintf(&detail, fmt, ap);
    va_end(ap);
    jw_obj(&g->cw, NULL);
    jw_str(&g->cw, "name", name);
    jw_str(&g->cw, "status", status_name(st));
    jw_str(&g->cw, "detail", detail.data ? detail.data : "");
    jw_end(&g->cw);
    if (st == ST_FAIL) {
        if (!g->n_fail) sb_printf(&g->first_failure, "%s: %s", name, detail.data ? detail.data : "");
        g->n_fail++;
    } else if (st == ST_NOT_MEANINGFUL) {
        g->n_not_meaningful++;
    } else if (st == ST_PASS) {
        g->n_pass++;
    }
    sb_free(&detail);
}

void gate_caveat(gate *g, const char *fmt, ...)
{
    strbuf s;
    sb_init(&s);
    va_list ap;
    va_start(ap, fmt);
    sb_vprintf(&s, fmt, ap);
    va_end(ap);
    jw_str(&g->vw, NULL, s.data ? s.data : "");
    sb_free(&s);
}

void gate_summary(gate *g, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sb_reset(&g->summary);
    sb_vprintf(&g->summary, fmt, ap);
    va_end(ap);
}

double time_left(qctx *q)
{
    double left = q->deadline - now_s();
    if (http_interrupted) left = 0;
    if (left > 0) return left;
    if (q->g && !q->g->out_of_time) {
        q->g->out_of_time = true;
        if (http_interrupted)
            gate_check(q->g, ST_FAIL, "bound", "interrupted by a signal before the gate finished");
        else
            gate_check(q->g, ST_FAIL, "bound", "the gate used its whole %.0f s bound before finishing",
                       q->g->bound_s);
    }
    return 0;
}

double req_timeout(qctx *q)
{
    double left = q->deadline - now_s();
    if (left < 0.001) left = 0.001;
    return left < q->request_timeout_s ? left : q->request_timeout_s;
}

void q_keep(qctx *q, const char *label, const char *ext, const char *data, size_t n)
{
    strbuf err;
    sb_init(&err);
    const char *gid = q->g ? q->g->id : "run";
    int idx = art_write(&q->art, gid, label, ext, data, n, &err);
    if (idx < 0) fprintf(stderr, "llm-qualify: %s\n", err.data);
    else if (q->g) jw_str(&q->g->aw, NULL, q->art.items[idx].path);
    sb_free(&err);
}

int q_http(qctx *q, const char *label, const char *method, const char *path, const char *body,
           size_t body_len, bool auth, http_data_fn on_data, void *user, http_resp *r)
{
    strbuf name;
    sb_init(&name);
    if (body) {
        sb_printf(&name, "%s.request", label);
        q_keep(q, name.data, ".json", body, body_len);
    }
    int rc = http_request(q->http, method, path, body, body_len, auth, req_timeout(q), on_data,
                          user, r);
    strbuf kept;
    sb_init(&kept);
    sb_printf(&kept, "%s %s\n", method, path);
    if (r->error[0]) sb_printf(&kept, "transport error: %s\n", r->error);
    sb_printf(&kept, "seconds: %.6f\n\n", r->seconds);
    sb_append(&kept, r->headers.data ? r->headers.data : "", r->headers.len);
    sb_append(&kept, r->body.data ? r->body.data : "", r->body.len);
    sb_reset(&name);
    sb_printf(&name, "%s.response", label);
    q_keep(q, name.data, ".txt", kept.data, kept.len);
    sb_free(&kept);
    sb_free(&name);
    return rc;
}

void describe_error(const http_resp *r, strbuf *out)
{
    if (!r->status) {
        sb_printf(out, "no HTTP response: %s", r->error);
        return;
    }
    char err[128];
    yajl_val v = json_parse(r->body.data ? r->body.data : "", r->body.len, err, sizeof err);
    yajl_val e = json_get(v, "error");
    const char *msg = json_string(json_get(e, "message"));
    const char *code = json_string(json_get(e, "code"));
    const char *type = json_string(json_get(e, "type"));
    sb_printf(out, "HTTP %ld", r->status);
    if (type || code) sb_printf(out, " %s/%s", type ? type : "-", code ? code : "-");
    if (msg) sb_printf(out, ": %s", msg);
    else if (r->body.len) sb_printf(out, ": %.200s", r->body.data);
    if (r->error[0]) sb_printf(out, " (%s)", r->error);
    yajl_tree_free(v);
}

yajl_val get_json(qctx *q, const char *label, const char *path, bool auth, strbuf *why)
{
    http_resp r;
    http_resp_init(&r);
    yajl_val v = NULL;
    q_http(q, label, "GET", path, NULL, 0, auth, NULL, NULL, &r);
    if (r.status == 200 && !r.error[0]) {
        char err[256];
        v = json_parse(r.body.data ? r.body.data : "", r.body.len, err, sizeof err);
        if (!v) sb_printf(why, "GET %s: the body is not JSON: %s", path, err);
    } else {
        sb_printf(why, "GET %s: ", path);
        describe_error(&r, why);
    }
    http_resp_free(&r);
    return v;
}

int one_token(qctx *q, const char *label, strbuf *why)
{
    strbuf body;
    sb_init(&body);
    sb_puts(&body, "{\"model\":");
    json_put_cstr(&body, q->model);
    sb_puts(&body, ",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":1}");
    http_resp r;
    http_resp_init(&r);
    q_http(q, label, "POST", "/v1/chat/completions", body.data, body.len, false, NULL, NULL, &r);
    int rc = -1;
    if (r.status == 200 && !r.error[0]) {
        char err[256];
        yajl_val v = json_parse(r.body.data, r.body.len, err, sizeof err);
        long long n = -1;
        json_int(json_get(json_get(v, "usage"), "completion_tokens"), &n);
        if (!v) sb_printf(why, "one-token request: the body is not JSON: %s", err);
        else if (json_len(json_get(v, "choices")) < 1) sb_puts(why, "one-token request: no choices");
        else if (n != 1) sb_printf(why, "one-token request: usage.completion_tokens is %lld, not 1", n);
        else rc = 0;
        yajl_tree_free(v);
    } else {
        sb_puts(why, "one-token request: ");
        describe_error(&r, why);
    }
    http_resp_free(&r);
    sb_free(&body);
    return rc;
}

/* A /health answer in a line: its status and each engine's state and
 * reason, rather than the whole body. */
static void describe_health(const http_resp *r, strbuf *out)
{
    char err[128];
    yajl_val v = r->status ? json_parse(r->body.data ? r->body.data : "", r->body.len, err, sizeof err)
                           : NULL;
    yajl_val engines = json_get(v, "engines");
    if (!json_len(engines)) {
        describe_error(r, out);
    } else {
        sb_printf(out, "HTTP %ld", r->status);
        for (size_t i = 0; i < json_len(engines); i++) {
            yajl_val e = engines->u.array.values[i];
            const char *name = json_string(json_get(e, "name"));
            const char *state = json_string(json_get(e, "state"));
            const char *reason = json_string(json_get(e, "reason"));
            sb_printf(out, "%s engine %s %s", i ? ";" : ",", name ? name : "?", state ? state : "?");
            if (reason && *reason) sb_printf(out, " (%s)", reason);
        }
    }
    yajl_tree_free(v);
}

double wait_ready(qctx *q, const char *label, double bound_s, strbuf *why)
{
    double t0 = now_s(), end = t0 + bound_s;
    strbuf path, name;
    sb_init(&path);
    sb_init(&name);
    sb_printf(&path, "/health?model=");
    for (const char *p = q->model; *p; p++) {   /* percent-encode the name */
        unsigned char c = (unsigned char)*p;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
            || c == '-' || c == '_' || c == '.')
            sb_putc(&path, (char)c);
        else
            sb_printf(&path, "%%%02X", c);
    }
    double took = -1;
    int polls = 0;
    double saved_deadline = q->deadline;
    if (q->deadline > end) q->deadline = end;
    while (!http_interrupted) {
        if (stack_failed(q)) {
            sb_reset(why);
            sb_puts(why, "the start command exited");
            break;
        }
        http_resp r;
        http_resp_init(&r);
        /* Polls are kept only while they change nothing: the first and
         * every 20th, so a long start does not leave thousands of files. */
        sb_reset(&name);
        sb_printf(&name, "%s-health-%d", label, polls);
        if (polls % 20 == 0) q_http(q, name.data, "GET", path.data, NULL, 0, false, NULL, NULL, &r);
        else http_request(q->http, "GET", path.data, NULL, 0, false, req_timeout(q), NULL, NULL, &r);
        polls++;
        sb_reset(why);
        if (r.status == 200) {
            sb_reset(&name);
            sb_printf(&name, "%s-one-token", label);
            if (one_token(q, name.data, why) == 0) took = now_s() - t0;
        } else {
            sb_puts(why, "/health: ");
            describe_health(&r, why);
        }
        http_resp_free(&r);
        if (took >= 0 || now_s() + 0.25 > end) break;
        usleep(250 * 1000);
    }
    if (took < 0 && http_interrupted) sb_puts(why, " (interrupted)");
    q->deadline = saved_deadline;
    sb_free(&path);
    sb_free(&name);
    return took;
}
