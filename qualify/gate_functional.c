/* Functional preflight (r33: "6/6: smoke, JSON, 20/20 tool calls,
 * streaming tool, tool-result continuation, Responses API").  Protocol
 * checks (status, shapes, SSE framing) always count; checks on what the
 * model wrote are not_meaningful under --model-is-random when they fail.
 * JSON mode and forced tool calls pass even with a random model when the
 * server enforces them (constrained decoding): the output is then valid
 * whatever the model's weights, which is what the checks check. */
#include <stdio.h>
#include <string.h>

#include "json.h"
#include "prompts.h"
#include "sse.h"

/* Count what passes; the report reads "passed/total". */
typedef struct {
    int passed, total, meaningless;
} tally;

static void smoke(qctx *q, gate *g, tally *t)
{
    strbuf body;
    sb_init(&body);
    jw w;
    chat_body_begin(q, &w, &body);
    chat_user_message(&w, "Reply with the single word: hello");
    jw_int(&w, "max_tokens", gen_budget(q));
    jw_end(&w);
    chat_result r;
    chat_result_init(&r);
    t->total++;
    if (chat_send(q, "smoke", body.data, body.len, false, &r) < 0) {
        gate_check(g, ST_FAIL, "smoke", "%s", r.problem.data);
    } else if (r.completion_tokens < 1 || (!r.content.len && !r.reasoning.len)) {
        gate_check(g, ST_FAIL, "smoke", "no output: %lld completion tokens, empty content and "
                   "reasoning", r.completion_tokens);
    } else {
        t->passed++;
        gate_check(g, ST_PASS, "smoke", "%lld prompt + %lld completion tokens, finish_reason %s",
                   r.prompt_tokens, r.completion_tokens, r.finish_reason);
    }
    chat_result_free(&r);
    sb_free(&body);
}

static void json_mode(qctx *q, gate *g, tally *t)
{
    strbuf body;
    sb_init(&body);
    jw w;
    chat_body_begin(q, &w, &body);
    chat_user_message(&w, "Return a JSON object with one key \"capital\" whose value is the "
                          "capital of France. Output only the JSON.");
    jw_json(&w, "response_format", "{\"type\":\"json_object\"}");
    jw_int(&w, "max_tokens", gen_budget(q));
    jw_end(&w);
    chat_result r;
    chat_result_init(&r);
    t->total++;
    if (chat_send(q, "json", body.data, body.len, false, &r) < 0) {
        gate_check(g, ST_FAIL, "json", "%s", r.problem.data);
    } else {
        char err[256];
        yajl_val v = json_parse(r.content.data ? r.content.data : "", r.content.len, err, sizeof err);
        bool good = YAJL_IS_OBJECT(v);
        if (good) t->passed++;
        else if (q->model_is_random) t->meaningless++;
        if (good)
            output_check(q, g, true, "json", "content is a JSON object (%zu bytes)", r.content.len);
        else
            output_check(q, g, false, "json", "content is not a JSON object (finish_reason %s): %.100s",
                         r.finish_reason, r.content.data ? r.content.data : "");
        yajl_tree_free(v);
    }
    chat_result_free(&r);
    sb_free(&body);
}

/* The budget of a forced tool call: at least 128 tokens.  The server
 * constrains a forced call to a complete DSML call whose arguments match
 * the schema and refuses (400) a max_tokens that cannot hold the shortest
 * one (about 40 tokens for get_weather), so a tiny --max-tokens would test
 * the refusal instead of the call. */
static long call_budget(qctx *q)
{
    long b = gen_budget(q);
    if (b < 128) b = q->max_model_len && q->max_model_len / 2 < 128 ? q->max_model_len / 2 : 128;
    return b;
}

/* One forced tool call; returns 1 when it passed, 0 when the model got
 * it wrong, -1 on a protocol failure (recorded as a failed check). */
static int forced_call(qctx *q, gate *g, const char *label, bool stream, strbuf *why)
{
    strbuf body;
    sb_init(&body);
    jw w;
    chat_body_begin(q, &w, &body);
    chat_user_message(&w, "What is the weather in Paris right now? Use the tool.");
    jw_json(&w, "tools", weather_tools);
    jw_json(&w, "tool_choice", weather_choice);
    jw_int(&w, "max_tokens", call_budget(q));
    if (stream) {
        jw_bool(&w, "stream", true);
        jw_json(&w, "stream_options", "{\"include_usage\":true}");
    }
    jw_end(&w);
    chat_result r;
    chat_result_init(&r);
    int rc;
    if (chat_send(q, label, body.data, body.len, stream, &r) < 0) {
        gate_check(g, ST_FAIL, label, "%s", r.problem.data);
        rc = -1;
    } else if (r.n_calls == 0) {
        sb_printf(why, "no tool call (finish_reason %s, content %.80s)", r.finish_reason,
                  r.content.data ? r.content.data : "");
        rc = 0;
    } else {
        rc = check_weather_call(&r.calls[0], NULL, why) == 0;
        if (rc && !r.calls[0].id.len) {
            sb_puts(why, "the tool call has no id");
            rc = 0;
        }
    }
    chat_result_free(&r);
    sb_free(&body);
    return rc;
}

static void tool_calls(qctx *q, gate *g, tally *t)
{
    int passed = 0, n = 0, protocol = 0;
    strbuf first;
    sb_init(&first);
    for (int i = 0; i < q->tool_calls && time_left(q) > 0; i++) {
        char label[32];
        snprintf(label, sizeof label, "tool-call-%02d", i + 1);
        strbuf why;
        sb_init(&why);
        int rc = forced_call(q, g, label, false, &why);
        n++;
        if (rc > 0) passed++;
        else if (rc < 0) protocol++;
        else if (!first.len) sb_printf(&first, "%s: %s", label, why.data);
        sb_free(&why);
    }
    jw_obj(&g->mw, "tool_calls");
    jw_int(&g->mw, "passed", passed);
    jw_int(&g->mw, "sent", n);
    jw_int(&g->mw, "requested", q->tool_calls);
    jw_end(&g->mw);
    t->total++;
    bool good = passed == q->tool_calls;
    if (good) t->passed++;
    if (!protocol) {
        if (!good && q->model_is_random) t->meaningless++;
        output_check(q, g, good, "tool calls", "%d/%d forced calls valid against the schema%s%s",
                     passed, q->tool_calls, first.len ? "; first bad: " : "",
                     first.data ? first.data : "");
    }
    sb_free(&first);
}

static void stream_tool(qctx *q, gate *g, tally *t)
{
    strbuf why;
    sb_init(&why);
    t->total++;
    int rc = forced_call(q, g, "stream-tool", true, &why);
    if (rc > 0) t->passed++;
    else if (rc == 0 && q->model_is_random) t->meaningless++;
    if (rc >= 0)
        output_check(q, g, rc > 0, "stream tool", "%s", rc > 0 ? "SSE tool call assembled from "
                     "deltas and valid against the schema" : why.data);
    sb_free(&why);
}

static void continuation(qctx *q, gate *g, tally *t)
{
    static const char messages[] =
        "[{\"role\":\"user\",\"content\":\"What is the weather in Paris? Use the tool.\"},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_q1\",\"type\":"
        "\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":"
        "\"{\\\"city\\\": \\\"Paris\\\"}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"call_q1\",\"content\":"
        "\"{\\\"city\\\": \\\"Paris\\\", \\\"temperature_c\\\": 21, \\\"sky\\\": \\\"clear\\\"}\"}]";
    strbuf body;
    sb_init(&body);
    jw w;
    chat_body_begin(q, &w, &body);
    jw_json(&w, "messages", messages);
    jw_json(&w, "tools", weather_tools);
    jw_int(&w, "max_tokens", gen_budget(q));
    jw_end(&w);
    chat_result r;
    chat_result_init(&r);
    t->total++;
    if (chat_send(q, "tool-result", body.data, body.len, false, &r) < 0) {
        gate_check(g, ST_FAIL, "tool-result continuation", "%s", r.problem.data);
    } else {
        bool good = strstr(r.content.data ? r.content.data : "", "21") != NULL;
        if (good) t->passed++;
        else if (q->model_is_random) t->meaningless++;
        output_check(q, g, good, "tool-result continuation",
                     good ? "the answer uses the tool result (21)%s"
                          : "the answer does not mention the tool's 21 degrees: %.100s",
                     good ? "" : r.content.data ? r.content.data : "");
    }
    chat_result_free(&r);
    sb_free(&body);
}

/* Responses API: one plain request and one streamed. */
struct resp_stream {
    long long last_seq;
    int       events;
    char      first[64], last[64];
    strbuf    problem;
};

static int on_resp_event(void *user, const char *event, const char *data, size_t len)
{
    struct resp_stream *s = user;
    char err[256];
    yajl_val v = json_parse(data, len, err, sizeof err);
    const char *type = json_string(json_get(v, "type"));
    long long seq;
    if (!v || !type) {
        if (!s->problem.len) sb_printf(&s->problem, "event %d is not a JSON object with a type",
                                       s->events + 1);
    } else {
        if (!s->events) snprintf(s->first, sizeof s->first, "%s", type);
        snprintf(s->last, sizeof s->last, "%s", type);
        if (*event && strcmp(event, type) && !s->problem.len)
            sb_printf(&s->problem, "SSE event name \"%s\" but type \"%s\"", event, type);
        if (!json_int(json_get(v, "sequence_number"), &seq) || seq <= s->last_seq) {
            if (!s->problem.len)
                sb_printf(&s->problem, "%s: sequence_number missing or not increasing", type);
        } else {
            s->last_seq = seq;
        }
    }
    s->events++;
    yajl_tree_free(v);
    return 0;
}

static int on_resp_data(void *user, const char *data, size_t n)
{
    return sse_feed(user, data, n);
}

static void responses(qctx *q, gate *g, tally *t)
{
    t->total++;
    int passed = 0;
    for (int stream = 0; stream < 2; stream++) {
        strbuf body;
        sb_init(&body);
        jw w;
        jw_init(&w, &body);
        jw_obj(&w, NULL);
        jw_str(&w, "model", q->model);
        jw_str(&w, "input", "Reply with the single word: hello");
        jw_int(&w, "max_output_tokens", gen_budget(q));
        if (stream) jw_bool(&w, "stream", true);
        jw_end(&w);
        http_resp r;
        http_resp_init(&r);
        struct resp_stream s = { .last_seq = -1 };
        sb_init(&s.problem);
        sse_parser p;
        sse_init(&p, on_resp_event, &s);
        const char *name = stream ? "responses stream" : "responses";
        q_http(q, stream ? "responses-stream" : "responses", "POST", "/v1/responses", body.data,
               body.len, false, stream ? on_resp_data : NULL, &p, &r);
        if (r.status != 200 || r.error[0]) {
            strbuf d;
            sb_init(&d);
            describe_error(&r, &d);
            gate_check(g, ST_FAIL, name, "%s", d.data);
            sb_free(&d);
        } else if (stream) {
            if (sse_finish(&p) && !s.problem.len) sb_puts(&s.problem, "the stream ended inside an event");
            if (!s.problem.len && strcmp(s.first, "response.created"))
                sb_printf(&s.problem, "the first event is %s, not response.created", s.first);
            if (!s.problem.len && strcmp(s.last, "response.completed")
                && strcmp(s.last, "response.incomplete"))
                sb_printf(&s.problem, "the last event is %s, not response.completed", s.last);
            if (s.problem.len) gate_check(g, ST_FAIL, name, "%s", s.problem.data);
            else {
                passed++;
                gate_check(g, ST_PASS, name, "%d events, %s ... %s, sequence numbers increasing",
                           s.events, s.first, s.last);
            }
        } else {
            char err[256];
            yajl_val v = json_parse(r.body.data, r.body.len, err, sizeof err);
            const char *obj = json_string(json_get(v, "object"));
            yajl_val out = json_get(v, "output");
            yajl_val usage = json_get(v, "usage");
            long long in = -1, outn = -1;
            json_int(json_get(usage, "input_tokens"), &in);
            json_int(json_get(usage, "output_tokens"), &outn);
            int items = 0;
            for (size_t i = 0; YAJL_IS_ARRAY(out) && i < out->u.array.len; i++)
                if (json_string(json_get(out->u.array.values[i], "type"))) items++;
            if (!v || !obj || strcmp(obj, "response"))
                gate_check(g, ST_FAIL, name, "the body is not a response object");
            else if (!items)
                gate_check(g, ST_FAIL, name, "the response has no typed output items");
            else if (in < 1 || outn < 1)
                gate_check(g, ST_FAIL, name, "usage.input_tokens/output_tokens missing or zero");
            else {
                passed++;
                gate_check(g, ST_PASS, name, "%d output items, %lld input + %lld output tokens",
                           items, in, outn);
            }
            yajl_tree_free(v);
        }
        sse_free(&p);
        sb_free(&s.problem);
        http_resp_free(&r);
        sb_free(&body);
    }
    if (passed == 2) t->passed++;
}

void gate_functional(qctx *q, gate *g)
{
    tally t = { 0, 0, 0 };
    smoke(q, g, &t);
    if (time_left(q) > 0) json_mode(q, g, &t);
    if (time_left(q) > 0) tool_calls(q, g, &t);
    if (time_left(q) > 0) stream_tool(q, g, &t);
    if (time_left(q) > 0) continuation(q, g, &t);
    if (time_left(q) > 0) responses(q, g, &t);
    jw_int(&g->mw, "passed", t.passed);
    jw_int(&g->mw, "of", 6);
    gate_summary(g, "%d/6: smoke, JSON, tool calls, streaming tool, tool-result continuation, "
                 "Responses API%s", t.passed,
                 t.meaningless ? " (model output checks not meaningful: random model)" : "");
}
