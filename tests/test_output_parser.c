/* Completion parsing: every parse[] case of v4-0731-openai.json, the lenient
 * rules, streaming (what is held back, and that any split of the text gives
 * the same message), and event order. */
#include <stdlib.h>
#include <string.h>

#include "golden.h"
#include "json.h"
#include "output_parser.h"
#include "tap.h"
#include "utf8.h"

#define EOS "<｜end▁of▁sentence｜>"
#define DS "｜DSML｜"
#define OPEN "\n\n<" DS "tool_calls>\n"
#define CLOSE "</" DS "tool_calls>"
#define INV(name) "<" DS "invoke name=\"" name "\">\n"
#define INV_END "</" DS "invoke>\n"
#define PAR(k, s, v) "<" DS "parameter name=\"" k "\" string=\"" s "\">" v "</" DS "parameter>\n"

static uint64_t xorshift(void *ctx)
{
    uint64_t *s = ctx;
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Events are checked for order and UTF-8 as they arrive. */
typedef struct {
    parsed_message msg;
    int open_call;        /* index of the call between BEGIN and END, or -1 */
    int calls, finishes;
    bool order_ok, utf8_ok;
} recorder;

static void record(void *ctx, const parse_event *ev)
{
    recorder *r = ctx;
    if (r->finishes) r->order_ok = false;   /* nothing after FINISH */
    switch (ev->kind) {
    case PARSE_REASONING:
    case PARSE_CONTENT:
        if (r->open_call >= 0 || !ev->len) r->order_ok = false;
        if (!utf8_valid(ev->text, ev->len, NULL)) r->utf8_ok = false;
        break;
    case PARSE_TOOL_BEGIN:
        if (r->open_call >= 0 || ev->index != r->calls) r->order_ok = false;
        r->open_call = ev->index;
        break;
    case PARSE_TOOL_ARGS:
        if (ev->index != r->open_call) r->order_ok = false;
        if (!utf8_valid(ev->text, ev->len, NULL)) r->utf8_ok = false;
        break;
    case PARSE_TOOL_END:
        if (ev->index != r->open_call) r->order_ok = false;
        r->open_call = -1;
        r->calls++;
        break;
    case PARSE_FINISH:
        if (r->open_call >= 0) r->order_ok = false;
        r->finishes++;
        break;
    }
    parsed_message_on_event(&r->msg, ev);
}

static void recorder_init(recorder *r)
{
    parsed_message_init(&r->msg);
    r->open_call = -1;
    r->calls = r->finishes = 0;
    r->order_ok = r->utf8_ok = true;
}

/* Parse text fed in pieces: cut = 0 whole, 1 byte by byte, else random
 * splits from that seed. */
static void parse_split(recorder *r, bool thinking, const char *text, size_t len,
                        enum gen_stop why, uint64_t cut)
{
    uint64_t ids = 42, rs = cut * 2654435761u + 1;
    recorder_init(r);
    output_parser *p = output_parser_new(thinking, record, r, xorshift, &ids);
    size_t i = 0;
    while (i < len) {
        size_t n = cut == 0 ? len : cut == 1 ? 1 : 1 + xorshift(&rs) % 7;
        if (cut > 1 && xorshift(&rs) % 5 == 0) n += xorshift(&rs) % 40;
        if (n > len - i) n = len - i;
        output_parser_feed(p, text + i, n);
        i += n;
    }
    output_parser_finish(p, why);
    output_parser_free(p);
}

static bool same_message(const parsed_message *a, const parsed_message *b)
{
    if (strcmp(a->content.data ? a->content.data : "", b->content.data ? b->content.data : "")
        || strcmp(a->reasoning.data ? a->reasoning.data : "",
                  b->reasoning.data ? b->reasoning.data : "")
        || a->n_calls != b->n_calls || a->finish != b->finish)
        return false;
    for (size_t i = 0; i < a->n_calls; i++)
        if (strcmp(a->calls[i].id, b->calls[i].id) || strcmp(a->calls[i].name, b->calls[i].name)
            || strcmp(a->calls[i].args.data, b->calls[i].args.data))
            return false;
    return true;
}

static const char *str_or_empty(const strbuf *s) { return s->data ? s->data : ""; }

/* The whole text at once, byte by byte and 40 random splits agree, events
 * are well ordered and every delta is whole UTF-8.  Returns the parse of
 * the whole text in *out. */
static void check_splits(const char *name, bool thinking, const char *text, size_t len,
                         enum gen_stop why, recorder *out)
{
    parse_split(out, thinking, text, len, why, 0);
    bool same = true, order = out->order_ok && out->finishes == 1, utf8 = out->utf8_ok;
    for (uint64_t cut = 1; cut < 42; cut++) {
        recorder r;
        parse_split(&r, thinking, text, len, why, cut);
        if (!same_message(&r.msg, &out->msg)) {
            if (same) diag("  split %llu: content '%s' reasoning '%s' calls %zu",
                           (unsigned long long)cut, str_or_empty(&r.msg.content),
                           str_or_empty(&r.msg.reasoning), r.msg.n_calls);
            same = false;
        }
        order = order && r.order_ok && r.finishes == 1;
        utf8 = utf8 && r.utf8_ok;
        parsed_message_free(&r.msg);
    }
    ok(same, "%s: any split of the text gives the same message", name);
    ok(order && utf8, "%s: events well ordered, deltas whole UTF-8", name);
}

static bool valid_id(const char *id)
{
    if (strncmp(id, "call_", 5) || strlen(id) != 29) return false;
    for (const char *c = id + 5; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9')))
            return false;
    return true;
}

typedef struct { const char *name, *args; } want_call;

static void expect_message(const char *name, bool thinking, const char *text,
                           enum gen_stop why, const char *content, const char *reasoning,
                           const want_call *calls, size_t n_calls, enum finish_reason finish)
{
    recorder r;
    check_splits(name, thinking, text, strlen(text), why, &r);
    is_str(str_or_empty(&r.msg.content), content, "%s: content", name);
    is_str(str_or_empty(&r.msg.reasoning), reasoning, "%s: reasoning", name);
    bool calls_ok = r.msg.n_calls == n_calls;
    for (size_t i = 0; calls_ok && i < n_calls; i++) {
        calls_ok = !strcmp(r.msg.calls[i].name, calls[i].name)
                   && !strcmp(r.msg.calls[i].args.data, calls[i].args)
                   && valid_id(r.msg.calls[i].id);
        for (size_t k = 0; k < i; k++)
            if (!strcmp(r.msg.calls[k].id, r.msg.calls[i].id)) calls_ok = false;
    }
    if (!ok(calls_ok, "%s: %zu tool call(s) with unique ids", name, n_calls))
        for (size_t i = 0; i < r.msg.n_calls; i++)
            diag("  got %s %s(%s)", r.msg.calls[i].id, r.msg.calls[i].name, r.msg.calls[i].args.data);
    is_str(finish_reason_name(r.msg.finish), finish_reason_name(finish), "%s: finish", name);
    parsed_message_free(&r.msg);
}

/* ---- the golden parse[] cases ---- */

static void golden_cases(void)
{
    yajl_val g;
    yajl_val cases = openai_golden_cases("parse", 6, &g);
    if (!cases) return;
    for (size_t i = 0; i < cases->u.array.len; i++) {
        yajl_val c = cases->u.array.values[i];
        const char *name = json_string(json_get(c, "name"));
        const char *text = json_string(json_get(c, "completion"));
        bool thinking = !strcmp(json_string(json_get(c, "thinking_mode")), "thinking");
        yajl_val parsed = json_get(c, "parsed");
        bool eos = strstr(text, EOS) != NULL;
        if (parsed) {
            /* Exactly the reference parser's result. */
            yajl_val tc = json_get(parsed, "tool_calls");
            want_call w[8];
            size_t n = json_len(tc);
            for (size_t k = 0; k < n && k < 8; k++) {
                yajl_val fn = json_get(tc->u.array.values[k], "function");
                w[k] = (want_call){ json_string(json_get(fn, "name")),
                                    json_string(json_get(fn, "arguments")) };
            }
            expect_message(name, thinking, text, eos ? GEN_STOP : GEN_LENGTH,
                           json_string(json_get(parsed, "content")),
                           json_string(json_get(parsed, "reasoning_content")), w, n,
                           n ? FINISH_TOOL_CALLS : FINISH_STOP);
        } else {
            /* The reference raises; the lenient rules apply: a missing
             * </think> leaves reasoning, truncated DSML is content. */
            recorder r;
            check_splits(name, thinking, text, strlen(text), GEN_LENGTH, &r);
            const char *body = text;
            size_t blen = eos ? (size_t)(strstr(text, EOS) - text) : strlen(text);
            strbuf want;
            sb_init(&want);
            sb_append(&want, body, blen);
            bool good = r.msg.n_calls == 0
                && !strcmp(thinking ? str_or_empty(&r.msg.reasoning) : str_or_empty(&r.msg.content),
                           want.data)
                && !(thinking ? r.msg.content.len : r.msg.reasoning.len)
                && r.msg.finish == (eos ? FINISH_STOP : FINISH_LENGTH);
            ok(good, "%s: reference error '%s' -> all text as %s, finish %s", name,
               json_string(json_get(c, "error")), thinking ? "reasoning" : "content",
               eos ? "stop" : "length");
            sb_free(&want);
            parsed_message_free(&r.msg);
        }
    }
    yajl_tree_free(g);
}

/* ---- lenient rules and corners (expected results derived by hand) ---- */

static void rules(void)
{
    const want_call f1[] = { { "f", "{\"a\": \"1\"}" } };
    expect_message("DSML opener before </think> ends the reasoning", true,
                   "think more" OPEN INV("f") PAR("a", "true", "1") INV_END CLOSE EOS,
                   GEN_STOP, "", "think more", f1, 1, FINISH_TOOL_CALLS);
    expect_message("length stop inside reasoning", true, "partial reason", GEN_LENGTH,
                   "", "partial reason", NULL, 0, FINISH_LENGTH);
    const want_call now[] = { { "now", "{}" } };
    expect_message("a call without parameters (\">\\n\\n</invoke\")", false,
                   OPEN INV("now") "\n" INV_END CLOSE EOS, GEN_STOP, "", "", now, 1,
                   FINISH_TOOL_CALLS);
    const want_call raw[] = { { "g", "{\"x\": \"hello world\", \"n\": -1.5e3, \"o\": { \"k\" : [1] }}" } };
    expect_message("string=false values: JSON raw, anything else as a string", false,
                   OPEN INV("g") PAR("x", "false", "hello world") PAR("n", "false", "-1.5e3")
                   PAR("o", "false", "{ \"k\" : [1] }") INV_END CLOSE EOS,
                   GEN_STOP, "", "", raw, 1, FINISH_TOOL_CALLS);
    const want_call esc[] = { { "w", "{\"v\": \"a \\\"b\\\" <c>\\n\\\\d\\t\\u0001\", \"k\\\"\": \"\"}" } };
    expect_message("string values are JSON-escaped; names may hold quotes", false,
                   OPEN INV("w") PAR("v", "true", "a \"b\" <c>\n\\d\t\x01") PAR("k\"", "true", "")
                   INV_END CLOSE EOS, GEN_STOP, "", "", esc, 1, FINISH_TOOL_CALLS);
    const want_call two[] = { { "a", "{}" }, { "b", "{\"q\": 2}" } };
    expect_message("text after a tool block is content; a second block parses", false,
                   "Hi" OPEN INV("a") "\n" INV_END CLOSE " then" OPEN INV("b")
                   PAR("q", "false", "2") INV_END CLOSE EOS,
                   GEN_STOP, "Hi then", "", two, 2, FINISH_TOOL_CALLS);
    const want_call one[] = { { "a", "{}" } };
    expect_message("malformed second invoke: first call kept, the rest is content", false,
                   "x" OPEN INV("a") "\n" INV_END INV("b") "garbage" EOS, GEN_STOP,
                   "x" INV("b") "garbage", "", one, 1, FINISH_TOOL_CALLS);
    expect_message("duplicate parameter names are malformed", false,
                   "x" OPEN INV("a") PAR("k", "true", "1") PAR("k", "true", "2") INV_END CLOSE EOS,
                   GEN_STOP, "x" OPEN INV("a") PAR("k", "true", "1") PAR("k", "true", "2")
                   INV_END CLOSE, "", NULL, 0, FINISH_STOP);
    expect_message("a block without '>\\n' after the opener is content", false,
                   "x\n\n<" DS "tool_calls> oops" EOS, GEN_STOP,
                   "x\n\n<" DS "tool_calls> oops", "", NULL, 0, FINISH_STOP);
    const want_call quirks[] = { { "f", "{\"a\": \"v\"}" } };
    expect_message("the reference regexes' corners: \\s* before name, '<\\n' before /parameter",
                   false, OPEN "<" DS "invoke \t\n name=\"f\">\n<" DS
                   "parameter name=\"a\" string=\"true\">v<\n/" DS "parameter>\n" INV_END CLOSE EOS,
                   GEN_STOP, "", "", quirks, 1, FINISH_TOOL_CALLS);
    const want_call trunc[] = { { "a", "{}" } };
    expect_message("length stop after a complete call", false,
                   OPEN INV("a") "\n" INV_END CLOSE, GEN_LENGTH, "", "", trunc, 1, FINISH_LENGTH);
    expect_message("text after EOS is ignored", false, "a" EOS "b", GEN_LENGTH, "a", "",
                   NULL, 0, FINISH_STOP);
    expect_message("ill-formed UTF-8 becomes U+FFFD", false, "a\xff b\xe4\xbd" EOS, GEN_STOP,
                   "a\xef\xbf\xbd b\xef\xbf\xbd", "", NULL, 0, FINISH_STOP);
    {
        recorder r;
        check_splits("NUL bytes", false, "a\0b" EOS, 4 + strlen(EOS), GEN_STOP, &r);
        is_str(str_or_empty(&r.msg.content), "a\xef\xbf\xbd" "b", "NUL bytes become U+FFFD");
        parsed_message_free(&r.msg);
    }
    expect_message("partial markers at a length stop are text", true,
                   "r</thi", GEN_LENGTH, "", "r</thi", NULL, 0, FINISH_LENGTH);
    expect_message("a partial opener and a partial EOS at the end are content", false,
                   "abc\n\n<" DS "tool<｜end▁of", GEN_LENGTH, "abc\n\n<" DS "tool<｜end▁of", "",
                   NULL, 0, FINISH_LENGTH);
    expect_message("special strings in content stay text", false,
                   "<think>a</think> <｜User｜>" EOS, GEN_STOP, "<think>a</think> <｜User｜>", "",
                   NULL, 0, FINISH_STOP);
    expect_message("chat mode: content ends at EOS, no reasoning", false, "</think>x" EOS,
                   GEN_STOP, "</think>x", "", NULL, 0, FINISH_STOP);
}

/* ---- what streaming holds back ---- */

static void held_back_is(bool thinking, const char *text, const char *emitted, const char *why)
{
    recorder r;
    uint64_t ids = 1;
    recorder_init(&r);
    output_parser *p = output_parser_new(thinking, record, &r, xorshift, &ids);
    output_parser_feed(p, text, strlen(text));
    is_str(thinking ? str_or_empty(&r.msg.reasoning) : str_or_empty(&r.msg.content),
           emitted, "streaming emits at once: %s", why);
    output_parser_free(p);
    parsed_message_free(&r.msg);
}

static void holdback(void)
{
    held_back_is(false, "Hello wor", "Hello wor", "plain text");
    held_back_is(false, "Hello\n", "Hello", "a newline may start the DSML opener");
    held_back_is(false, "a\n\n<" DS "tool", "a", "a partial DSML opener");
    held_back_is(false, "a <b> c<", "a <b> c", "'<' may start EOS");
    held_back_is(false, "a <｜end▁of▁sentence", "a ", "a partial EOS");
    held_back_is(false, "a\n\nb", "a\n\nb", "no marker continues");
    held_back_is(true, "Let me think.</thi", "Let me think.", "a partial </think>");
    held_back_is(true, "x </b>", "x </b>", "</b> is not </think>");
    held_back_is(false, "\xe6\x97\xa5\xe6\x9c", "\xe6\x97\xa5", "an unfinished character");

    /* A complete invoke is emitted before the block ends. */
    recorder r;
    uint64_t ids = 1;
    recorder_init(&r);
    output_parser *p = output_parser_new(false, record, &r, xorshift, &ids);
    const char *t = "ok" OPEN INV("f") PAR("a", "true", "1") INV_END;
    output_parser_feed(p, t, strlen(t));
    ok(r.msg.n_calls == 1 && !strcmp(r.msg.calls[0].args.data, "{\"a\": \"1\"}"),
       "a call is emitted as soon as its invoke closes");
    output_parser_free(p);
    parsed_message_free(&r.msg);
}

/* ---- ids ---- */

static uint64_t constant(void *ctx) { (void)ctx; return 7; }

static void ids(void)
{
    parsed_message m;
    parsed_message_init(&m);
    output_parser *p = output_parser_new(false, parsed_message_on_event, &m, constant, NULL);
    const char *t = OPEN INV("a") "\n" INV_END INV("b") "\n" INV_END INV("c") "\n" INV_END CLOSE;
    output_parser_feed(p, t, strlen(t));
    output_parser_finish(p, GEN_STOP);
    ok(m.n_calls == 3 && strcmp(m.calls[0].id, m.calls[1].id) && strcmp(m.calls[1].id, m.calls[2].id)
       && strcmp(m.calls[0].id, m.calls[2].id) && !strncmp(m.calls[2].id, "call_", 5),
       "ids stay unique even from a constant random source");
    strbuf js;
    sb_init(&js);
    parsed_message_json(&m, &js);
    char err[128];
    yajl_val v = json_parse(js.data, js.len, err, sizeof err);
    yajl_val c0 = json_get(v, "tool_calls") ? json_get(v, "tool_calls")->u.array.values[0] : NULL;
    ok(v && !strcmp(json_string(json_get(v, "content")), "")
       && !strcmp(json_string(json_get(v, "reasoning_content")), "")
       && json_len(json_get(v, "tool_calls")) == 3
       && !strcmp(json_string(json_get(c0, "type")), "function")
       && !strcmp(json_string(json_get(json_get(c0, "function"), "arguments")), "{}"),
       "message JSON: empty content and reasoning as \"\", OpenAI-shaped tool_calls: %s", js.data);
    yajl_tree_free(v);
    sb_free(&js);
    output_parser_free(p);
    parsed_message_free(&m);
}

int main(void)
{
    golden_cases();
    rules();
    holdback();
    ids();
    return exit_status();
}
