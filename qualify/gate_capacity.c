/* Near-limit capacity.  Each target is a prompt whose actual token count
 * equals the target (calibrate.h), sent as a streaming chat request with
 * the completion budget; the API-reported usage.prompt_tokens must agree.
 * Measured per target: TTFT (first token-bearing delta), end-to-end,
 * effective prefill tok/s (prompt tokens / TTFT) and decode tok/s
 * ((completion tokens - 1) / (E2E - TTFT)).  A one-token request after
 * every probe shows the endpoint stayed healthy.  Finally a prompt one
 * token over the limit must get HTTP 400 context_length_exceeded with a
 * message that states the limit, the prompt tokens and the completion
 * tokens (the r33 400 at 120K came with no explanation). */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "calibrate.h"
#include "chat.h"
#include "json.h"
#include "tokenize.h"

typedef struct {
    qctx       *q;
    calibrator *cal;
    char        head[160];
} cap_ctx;

static const char cap_tail[] =
    "\n\nWhich animal jumps in the text above? Answer in one short sentence.";

static void cap_body(cap_ctx *c, const calib_fill *f, long max_tokens, bool stream, strbuf *body)
{
    strbuf content;
    sb_init(&content);
    sb_puts(&content, c->head);
    calib_text(c->cal, f, NULL, &content);
    sb_puts(&content, cap_tail);
    jw w;
    chat_body_begin(c->q, &w, body);
    chat_user_message(&w, content.data);
    if (max_tokens > 0) jw_int(&w, "max_tokens", max_tokens);
    if (stream) {
        jw_bool(&w, "stream", true);
        jw_json(&w, "stream_options", "{\"include_usage\":true}");
    }
    jw_end(&w);
    sb_free(&content);
}

static int cap_measure(void *user, const calib_fill *f, long *tokens, strbuf *err)
{
    cap_ctx *c = user;
    strbuf body;
    sb_init(&body);
    cap_body(c, f, 0, false, &body);   /* only the fields that shape the prompt */
    tok_result t;
    int rc = tokenize_chat(c->q, "calibrate", body.data, body.len, 0, &t, err);
    *tokens = t.count;
    tok_result_free(&t);
    sb_free(&body);
    return rc;
}

/* Does text state n as a number (digits, optionally grouped by commas,
 * underscores or spaces between digit groups of three)? */
static bool mentions_number(const char *text, long n)
{
    for (const char *p = text; p && *p; p++) {
        if (!isdigit((unsigned char)*p) || (p > text && isdigit((unsigned char)p[-1]))) continue;
        long v = 0;
        const char *s = p;
        for (;;) {
            if (isdigit((unsigned char)*s)) {
                v = v * 10 + (*s - '0');
                s++;
            } else if ((*s == ',' || *s == '_' || *s == ' ') && isdigit((unsigned char)s[1])
                       && isdigit((unsigned char)s[2]) && isdigit((unsigned char)s[3])
                       && !isdigit((unsigned char)s[4])) {
                s++;
            } else {
                break;
            }
            if (v > 1000000000000L) break;
        }
        if (v == n) return true;
    }
    return false;
}

static void set_head(cap_ctx *c, const char *what, long target)
{
    /* A fresh nonce per probe, so no probe is served from another's
     * prefix cache. */
    snprintf(c->head, sizeof c->head, "Capacity probe %s %08lx-%ld. Read the text below.\n\n", what,
             (unsigned long)(random() & 0xffffffffUL), target);
}

static void calib_json(jw *w, const calibrator *cal, const calib_result *cr)
{
    jw_obj(w, "calibration");
    jw_int(w, "tokenize_calls", cr->probes);
    jw_int(w, "base_tokens", cr->base);
    jw_num(w, "unit_tokens", cal->unit_cost, 4);
    jw_int(w, "units", cr->fill.n_units);
    jw_str(w, "fine_unit", cr->fill.fine);
    jw_int(w, "fine_units", cr->fill.n_fine);
    jw_end(w);
}

/* One target: calibrate, send, measure, smoke.  Returns the reported
 * prompt tokens (-1 when the probe failed). */
static long probe_target(qctx *q, gate *g, cap_ctx *c, long target, long budget, int i,
                         double *last[4])
{
    char name[64];
    snprintf(name, sizeof name, "target %ld", target);
    set_head(c, "T", target);
    calib_result cr;
    strbuf err;
    sb_init(&err);
    jw *m = &g->mw;
    jw_obj(m, NULL);
    jw_int(m, "target", target);
    long reported = -1;
    if (calibrate(c->cal, target, &cr, &err) < 0) {
        jw_null(m, "prompt_tokens_reported");
        jw_end(m);
        gate_check(g, ST_FAIL, name, "could not build a prompt of exactly %ld tokens: %s", target,
                   err.data);
        sb_free(&err);
        return -1;
    }
    jw_int(m, "prompt_tokens_tokenize", cr.actual);
    calib_json(m, c->cal, &cr);
    strbuf body;
    sb_init(&body);
    cap_body(c, &cr.fill, budget, true, &body);
    char label[64];
    chat_result r;
    chat_result_init(&r);
    /* r33 replayed a failed context probe; so may we, --capacity-retries
     * times, but every failed attempt stays in the record. */
    int attempt = 0;
    for (;;) {
        snprintf(label, sizeof label, "probe-%d-%ld%s", i + 1, target, attempt ? "-retry" : "");
        chat_send(q, label, body.data, body.len, true, &r);
        if (r.ok || attempt >= q->capacity_retries || time_left(q) <= 0) break;
        gate_caveat(g, "retained failure: target %ld, attempt %d: %s", target, attempt + 1,
                    r.problem.data);
        attempt++;
        chat_result_free(&r);
        chat_result_init(&r);
    }
    jw_int(m, "attempts", attempt + 1);
    if (!r.ok) {
        jw_null(m, "prompt_tokens_reported");
        gate_check(g, ST_FAIL, name, "%s%s", r.problem.data, attempt ? " (also on every retry)" : "");
    } else {
        reported = r.prompt_tokens;
        double decode = -1, prefill = -1;
        if (r.ttft_s > 0) prefill = (double)r.prompt_tokens / r.ttft_s;
        if (r.ttft_s > 0 && r.completion_tokens >= 2 && r.e2e_s > r.ttft_s)
            decode = (double)(r.completion_tokens - 1) / (r.e2e_s - r.ttft_s);
        jw_int(m, "prompt_tokens_reported", r.prompt_tokens);
        jw_int(m, "cached_tokens", r.cached_tokens);
        jw_int(m, "completion_tokens", r.completion_tokens);
        jw_str(m, "finish_reason", r.finish_reason);
        jw_num(m, "ttft_s", r.ttft_s >= 0 ? r.ttft_s : NAN, 3);
        jw_num(m, "e2e_s", r.e2e_s, 3);
        jw_num(m, "prefill_tok_s", prefill >= 0 ? prefill : NAN, 1);
        jw_num(m, "decode_tok_s", decode >= 0 ? decode : NAN, 2);
        if (r.prompt_tokens != target)
            gate_check(g, ST_FAIL, name, "usage.prompt_tokens is %lld but /tokenize counted %ld "
                       "for the same request", r.prompt_tokens, target);
        else
            gate_check(g, ST_PASS, name, "%lld prompt tokens as reported by the API; TTFT %.3f s, "
                       "E2E %.3f s", r.prompt_tokens, r.ttft_s, r.e2e_s);
        if (r.cached_tokens > 0)
            gate_caveat(g, "target %ld: %lld prompt tokens came from the prefix cache, so its "
                        "prefill rate is not a cold prefill", target, r.cached_tokens);
        if (r.ttft_s < 0)
            gate_caveat(g, "target %ld: no token-bearing delta arrived, so no TTFT", target);
        if (decode < 0 && r.ttft_s >= 0)
            gate_caveat(g, "target %ld: %lld completion tokens are too few for a decode rate",
                        target, r.completion_tokens);
        *last[0] = r.ttft_s;
        *last[1] = r.e2e_s;
        *last[2] = prefill;
        *last[3] = decode;
    }
    /* r33: "a short smoke passed after every context probe" */
    strbuf why;
    sb_init(&why);
    snprintf(label, sizeof label, "probe-%d-after", i + 1);
    bool healthy = one_token(q, label, &why) == 0;
    jw_bool(m, "healthy_after", healthy);
    if (!healthy) gate_check(g, ST_FAIL, name, "not healthy after the probe: %s", why.data);
    jw_end(m);
    chat_result_free(&r);
    sb_free(&body);
    sb_free(&why);
    sb_free(&err);
    return reported;
}

static void over_limit(qctx *q, gate *g, cap_ctx *c, long budget)
{
    long prompt = q->max_model_len - budget + 1;
    set_head(c, "O", prompt);
    calib_result cr;
    strbuf err;
    sb_init(&err);
    jw *m = &g->mw;
    jw_obj(m, "over_limit");
    jw_int(m, "prompt_tokens", prompt);
    jw_int(m, "max_tokens", budget);
    if (calibrate(c->cal, prompt, &cr, &err) < 0) {
        jw_end(m);
        gate_check(g, ST_FAIL, "over limit", "could not build a prompt of exactly %ld tokens: %s",
                   prompt, err.data);
        sb_free(&err);
        return;
    }
    strbuf body;
    sb_init(&body);
    cap_body(c, &cr.fill, budget, false, &body);
    http_resp r;
    http_resp_init(&r);
    q_http(q, "over-limit", "POST", "/v1/chat/completions", body.data, body.len, false, NULL, NULL,
           &r);
    char jerr[128];
    yajl_val v = json_parse(r.body.data ? r.body.data : "", r.body.len, jerr, sizeof jerr);
    yajl_val e = json_get(v, "error");
    const char *code = json_string(json_get(e, "code"));
    const char *msg = json_string(json_get(e, "message"));
    jw_int(m, "status", r.status);
    jw_str(m, "code", code);
    jw_str(m, "message", msg);
    jw_end(m);
    strbuf missing;
    sb_init(&missing);
    if (msg && !mentions_number(msg, q->max_model_len))
        sb_printf(&missing, " the limit %ld;", q->max_model_len);
    if (msg && !mentions_number(msg, prompt)) sb_printf(&missing, " the prompt's %ld tokens;", prompt);
    if (msg && !mentions_number(msg, budget))
        sb_printf(&missing, " the %ld requested completion tokens;", budget);
    if (missing.len) missing.data[--missing.len] = 0;   /* the last ";" */
    if (r.status != 400) {
        strbuf d;
        sb_init(&d);
        describe_error(&r, &d);
        gate_check(g, ST_FAIL, "over limit", "%ld + %ld tokens (limit %ld) got %s, not HTTP 400",
                   prompt, budget, q->max_model_len, d.data);
        sb_free(&d);
    } else if (!code || strcmp(code, "context_length_exceeded")) {
        gate_check(g, ST_FAIL, "over limit", "HTTP 400 but error.code is %s, not "
                   "context_length_exceeded", code ? code : "missing");
    } else if (!msg || missing.len) {
        gate_check(g, ST_FAIL, "over limit", "the message does not state%s: \"%s\"",
                   msg ? missing.data : " anything (no error.message)", msg ? msg : "");
    } else {
        gate_check(g, ST_PASS, "over limit", "HTTP 400 context_length_exceeded stating the limit, "
                   "prompt and completion tokens");
    }
    yajl_tree_free(v);
    http_resp_free(&r);
    sb_free(&missing);
    sb_free(&body);
    sb_free(&err);
}

/* The targets: explicit ones, or fractions of the limit. */
static int make_targets(qctx *q, gate *g, long limit, long *t)
{
    int n = 0;
    if (q->n_targets) {
        for (int i = 0; i < q->n_targets; i++) {
            if (q->targets[i] > limit) {
                gate_check(g, ST_FAIL, "targets", "target %ld exceeds max_model_len %ld minus the "
                           "%d-token completion budget (%ld)", q->targets[i], q->max_model_len,
                           q->capacity_max_tokens, limit);
                continue;
            }
            t[n++] = q->targets[i];
        }
        return n;
    }
    for (int i = 0; i < q->n_fracs; i++) {
        long v = (long)(q->target_fracs[i] * (double)limit);
        if (v > limit) v = limit;
        if (v >= 1 && (n == 0 || v > t[n - 1])) t[n++] = v;
    }
    return n;
}

void gate_capacity(qctx *q, gate *g)
{
    long budget = q->capacity_max_tokens;
    long limit = q->max_model_len - budget;
    jw *m = &g->mw;
    jw_int(m, "max_model_len", q->max_model_len);
    jw_int(m, "completion_budget", budget);
    jw_int(m, "prompt_limit", limit);
    if (limit < 1) {
        gate_check(g, ST_FAIL, "budget", "the completion budget %ld leaves no room in max_model_len "
                   "%ld", budget, q->max_model_len);
        return;
    }
    long targets[MAX_TARGETS];
    int n = make_targets(q, g, limit, targets);
    srandom((unsigned)(time(NULL) ^ getpid()));
    calibrator cal;
    cap_ctx c = { q, &cal, "" };
    calib_init(&cal, cap_measure, &c);

    jw_arr(m, "probes");
    long prev = 0, largest = -1;
    bool monotonic = true;
    double ttft = -1, e2e = -1, prefill = -1, decode = -1;
    double *last[4] = { &ttft, &e2e, &prefill, &decode };
    for (int i = 0; i < n && time_left(q) > 0; i++) {
        long got = probe_target(q, g, &c, targets[i], budget, i, last);
        if (got < 0) continue;
        if (got <= prev) monotonic = false;
        prev = got;
        if (got > largest) largest = got;
    }
    jw_end(m);
    if (largest > 0)
        gate_check(g, monotonic ? ST_PASS : ST_FAIL, "monotonic",
                   monotonic ? "reported prompt tokens rise strictly with the targets"
                             : "reported prompt tokens do not rise strictly with the targets");
    if (time_left(q) > 0) over_limit(q, g, &c, budget);
    jw_int(m, "largest_prompt_tokens", largest);
    if (largest > 0)
        gate_summary(g, "%ld actual prompt tokens; %.3f s TTFT; %.3f s E2E; %.0f effective prefill "
                     "tok/s; %.2f decode tok/s", largest, ttft, e2e, prefill, decode);
}
