/* Repeated quality: a fixed set of questions with known answers, each
 * asked k times in thinking mode at --quality-effort, reported as
 * passes/k: arithmetic, logic, session recall across turns, a tool call
 * chosen by the model, and a needle in a context of --needle-tokens
 * (exact, calibrated).  A tiny random model fails these honestly; with
 * --model-is-random they are not_meaningful instead, never passed. */
#include <stdio.h>
#include <string.h>

#include "calibrate.h"
#include "json.h"
#include "prompts.h"
#include "tokenize.h"

#define NEEDLE_VALUE "48613"

typedef struct {
    int  passes, protocol_failures;
    strbuf first_bad;     /* the first wrong answer, for the detail */
} item;

/* The members after "messages" that shape a quality prompt (all that
 * /tokenize needs), and those every quality request carries. */
static void prompt_fields(qctx *q, jw *w)
{
    jw_json(w, "chat_template_kwargs", "{\"thinking\":true}");
    jw_str(w, "reasoning_effort", q->quality_effort);
}

static void reasoning_fields(qctx *q, jw *w)
{
    prompt_fields(q, w);
    jw_int(w, "max_tokens", gen_budget(q));
}

/* A quality request that asks one question. */
static void question_body(qctx *q, const char *question, strbuf *body)
{
    jw w;
    chat_body_begin(q, &w, body);
    chat_user_message(&w, question);
    reasoning_fields(q, &w);
    jw_end(&w);
}

/* Send; a protocol failure is recorded as a failed check of the item
 * and returns -1. */
static int post(qctx *q, gate *g, item *it, const char *label, const char *name,
                const strbuf *body, chat_result *r)
{
    if (chat_send(q, label, body->data, body->len, false, r) == 0) return 0;
    it->protocol_failures++;
    gate_check(g, ST_FAIL, name, "%s: %s", label, r->problem.data);
    return -1;
}

/* Send; on success the answer passes when it contains expect. */
static void ask(qctx *q, gate *g, item *it, const char *label, const char *name,
                const strbuf *body, const char *expect, chat_result *r)
{
    if (post(q, g, it, label, name, body, r) < 0) return;
    if (contains_ci(r->content.data, expect)) {
        it->passes++;
    } else if (!it->first_bad.len) {
        if (r->content.len) sb_printf(&it->first_bad, "%s answered %.80s", label, r->content.data);
        else sb_printf(&it->first_bad, "%s gave no content (finish_reason %s)", label, r->finish_reason);
    }
}

/* Report the item (and free it). */
static void report_item(qctx *q, gate *g, const char *name, item *it)
{
    jw_obj(&g->mw, name);
    jw_int(&g->mw, "passes", it->passes);
    jw_int(&g->mw, "k", q->quality_k);
    jw_end(&g->mw);
    if (!it->protocol_failures) {   /* else already failed with the reason */
        bool good = it->passes == q->quality_k;
        output_check(q, g, good, name, "%d/%d%s%s", it->passes, q->quality_k,
                     it->first_bad.len ? "; " : "", it->first_bad.data ? it->first_bad.data : "");
    }
    sb_free(&it->first_bad);
}

static void single_turn(qctx *q, gate *g, const char *name, const char *question, const char *expect)
{
    item it = { 0, 0, { 0 } };
    sb_init(&it.first_bad);
    for (int i = 0; i < q->quality_k && time_left(q) > 0; i++) {
        strbuf body;
        sb_init(&body);
        question_body(q, question, &body);
        char label[64];
        snprintf(label, sizeof label, "%s-%d", name, i + 1);
        chat_result r;
        chat_result_init(&r);
        ask(q, g, &it, label, name, &body, expect, &r);
        chat_result_free(&r);
        sb_free(&body);
    }
    report_item(q, g, name, &it);
}

static void session_recall(qctx *q, gate *g)
{
    static const char first[] = "Remember this code word for later: PLOVER-7. Reply only with OK.";
    static const char second[] = "What code word did I ask you to remember? Reply with the code word only.";
    item it = { 0, 0, { 0 } };
    sb_init(&it.first_bad);
    for (int i = 0; i < q->quality_k && time_left(q) > 0; i++) {
        strbuf body;
        sb_init(&body);
        question_body(q, first, &body);
        char label[64];
        snprintf(label, sizeof label, "session-recall-%d-turn1", i + 1);
        chat_result r1;
        chat_result_init(&r1);
        if (post(q, g, &it, label, "session recall", &body, &r1) == 0) {
            /* Turn 2 carries turn 1 back as the client would. */
            sb_reset(&body);
            jw w;
            chat_body_begin(q, &w, &body);
            jw_arr(&w, "messages");
            chat_message(&w, "user", first);
            chat_message(&w, "assistant", r1.content.data ? r1.content.data : "");
            chat_message(&w, "user", second);
            jw_end(&w);
            reasoning_fields(q, &w);
            jw_end(&w);
            snprintf(label, sizeof label, "session-recall-%d-turn2", i + 1);
            chat_result r2;
            chat_result_init(&r2);
            ask(q, g, &it, label, "session recall", &body, "PLOVER-7", &r2);
            chat_result_free(&r2);
        }
        chat_result_free(&r1);
        sb_free(&body);
    }
    report_item(q, g, "session recall", &it);
}

static void tools(qctx *q, gate *g)
{
    item it = { 0, 0, { 0 } };
    sb_init(&it.first_bad);
    for (int i = 0; i < q->quality_k && time_left(q) > 0; i++) {
        strbuf body;
        sb_init(&body);
        jw w;
        chat_body_begin(q, &w, &body);
        chat_user_message(&w, "Should I take an umbrella in Tokyo today? Check the weather first.");
        jw_json(&w, "tools", weather_tools);
        jw_str(&w, "tool_choice", "auto");
        reasoning_fields(q, &w);
        jw_end(&w);
        char label[64];
        snprintf(label, sizeof label, "tools-%d", i + 1);
        chat_result r;
        chat_result_init(&r);
        if (post(q, g, &it, label, "tools", &body, &r) == 0) {
            strbuf why;
            sb_init(&why);
            if (!r.n_calls) sb_printf(&why, "no tool call (finish_reason %s)", r.finish_reason);
            if (r.n_calls && check_weather_call(&r.calls[0], "Tokyo", &why) == 0) it.passes++;
            else if (!it.first_bad.len) sb_printf(&it.first_bad, "%s: %s", label, why.data);
            sb_free(&why);
        }
        chat_result_free(&r);
        sb_free(&body);
    }
    report_item(q, g, "tools", &it);
}

/* ---- needle ------------------------------------------------------------ */

typedef struct {
    qctx        *q;
    calibrator  *cal;
} needle_ctx;

static const char needle_head[] =
    "Below is a long document. Somewhere inside it is one sentence that states a secret "
    "number.\n\n";
static const char needle_tail[] =
    "\n\nWhat is the secret number stated in the document? Answer with just the number.";
static const char needle_text[] = " The secret number is " NEEDLE_VALUE ".";

static void needle_body(qctx *q, calibrator *cal, const calib_fill *f, bool for_tokenize,
                        strbuf *body)
{
    strbuf content;
    sb_init(&content);
    sb_puts(&content, needle_head);
    calib_text(cal, f, needle_text, &content);
    sb_puts(&content, needle_tail);
    jw w;
    chat_body_begin(q, &w, body);
    chat_user_message(&w, content.data);
    if (for_tokenize) prompt_fields(q, &w);
    else reasoning_fields(q, &w);
    jw_end(&w);
    sb_free(&content);
}

static int needle_measure(void *user, const calib_fill *f, long *tokens, strbuf *err)
{
    needle_ctx *n = user;
    strbuf body;
    sb_init(&body);
    needle_body(n->q, n->cal, f, true, &body);
    tok_result t;
    int rc = tokenize_chat(n->q, "needle-calibrate", body.data, body.len, 0, &t, err);
    *tokens = t.count;
    tok_result_free(&t);
    sb_free(&body);
    return rc;
}

static void needle(qctx *q, gate *g)
{
    long size = q->needle_tokens;
    long room = q->max_model_len - gen_budget(q);
    if (size > room) {
        gate_caveat(g, "needle context cut from %ld to %ld tokens (max_model_len %ld minus the "
                    "%ld-token completion budget)", size, room, q->max_model_len, gen_budget(q));
        size = room;
    }
    calibrator cal;
    needle_ctx nc = { q, &cal };
    calib_init(&cal, needle_measure, &nc);
    calib_result cr;
    strbuf err;
    sb_init(&err);
    char name[64];
    snprintf(name, sizeof name, "needle %ldK", (size + 512) / 1024);
    jw_obj(&g->mw, "needle");
    jw_int(&g->mw, "prompt_tokens_target", size);
    if (calibrate(&cal, size, &cr, &err) < 0) {
        jw_end(&g->mw);
        gate_check(g, ST_FAIL, name, "could not build a %ld-token prompt: %s", size, err.data);
        sb_free(&err);
        return;
    }
    item it = { 0, 0, { 0 } };
    sb_init(&it.first_bad);
    long reported = -1;
    for (int i = 0; i < q->quality_k && time_left(q) > 0; i++) {
        strbuf body;
        sb_init(&body);
        needle_body(q, &cal, &cr.fill, false, &body);
        char label[64];
        snprintf(label, sizeof label, "needle-%d", i + 1);
        chat_result r;
        chat_result_init(&r);
        ask(q, g, &it, label, name, &body, NEEDLE_VALUE, &r);
        if (r.ok) reported = r.prompt_tokens;
        if (r.ok && r.prompt_tokens != cr.actual) {
            gate_check(g, ST_FAIL, name, "usage.prompt_tokens %lld differs from /tokenize's %ld",
                       r.prompt_tokens, cr.actual);
            it.protocol_failures++;
        }
        chat_result_free(&r);
        sb_free(&body);
    }
    jw_int(&g->mw, "prompt_tokens_reported", reported);
    jw_end(&g->mw);
    report_item(q, g, name, &it);
    sb_free(&err);
}

void gate_quality(qctx *q, gate *g)
{
    jw_str(&g->mw, "reasoning_effort", q->quality_effort);
    jw_int(&g->mw, "max_tokens", gen_budget(q));
    single_turn(q, g, "arithmetic", "What is 17 * 24? Answer with just the number.", "408");
    if (time_left(q) > 0)
        single_turn(q, g, "logic", "All bloops are razzies and all razzies are lazzies. Are all "
                    "bloops definitely lazzies? Answer yes or no.", "yes");
    if (time_left(q) > 0) session_recall(q, g);
    if (time_left(q) > 0) tools(q, g);
    if (time_left(q) > 0) needle(q, g);
    gate_summary(g, "%d check%s passed, %d failed, %d not meaningful (k=%d, effort %s)", g->n_pass,
                 g->n_pass == 1 ? "" : "s", g->n_fail, g->n_not_meaningful, q->quality_k,
                 q->quality_effort);
}
