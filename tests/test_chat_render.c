/* Chat rendering: DeepSeek's own encoder vectors (through the internal
 * API), every render[] case of v4-0731-openai.json (through the OpenAI
 * mapping), encoder rules the goldens do not reach, spans, and errors. */
#include <stdlib.h>
#include <string.h>

#include "chat_render.h"
#include "golden.h"
#include "json.h"
#include "tap.h"

#define BOS "<｜begin▁of▁sentence｜>"
#define EOS "<｜end▁of▁sentence｜>"
#define U "<｜User｜>"
#define A "<｜Assistant｜>"
#define TS "<think>"
#define TE "</think>"
#define DS "｜DSML｜"

static const chat_options chat_defaults = { false, CHAT_EFFORT_LOW, true };

/* Show where two strings part, for a failing comparison. */
static void diff_diag(const char *got, size_t got_len, const char *want)
{
    size_t i = 0, wl = strlen(want);
    while (i < got_len && i < wl && got[i] == want[i]) i++;
    size_t from = i > 40 ? i - 40 : 0;
    diag("  first difference at byte %zu (got %zu bytes, want %zu)", i, got_len, wl);
    diag("  got:  ...%.*s", (int)(got_len - from < 120 ? got_len - from : 120), got + from);
    diag("  want: ...%.*s", (int)(wl - from < 120 ? wl - from : 120), want + from);
}

static void prompt_is(const chat_prompt *p, const char *want, const char *name)
{
    bool same = p->text.len == strlen(want) && !memcmp(p->text.data, want, p->text.len);
    if (!ok(same, "%s: prompt matches byte for byte", name))
        diff_diag(p->text.data ? p->text.data : "", p->text.len, want);
}

/* Render a request given as JSON text; NULL on error (err filled). */
static int render_json(const char *json, const chat_options *d, chat_prompt *p,
                       chat_error *err)
{
    char perr[256];
    yajl_val req = json_parse(json, strlen(json), perr, sizeof perr);
    if (!req) {
        diag("bad test JSON: %s: %s", perr, json);
        snprintf(err->message, sizeof err->message, "test JSON: %s", perr);
        return -1;
    }
    int rc = chat_render_request(req, d, p, err);
    yajl_tree_free(req);
    return rc;
}

static void request_is(const char *json, const chat_options *d, const char *want,
                       const char *name)
{
    chat_prompt p;
    chat_error err;
    chat_prompt_init(&p);
    if (render_json(json, d, &p, &err)) {
        ok(0, "%s: renders", name);
        diag("  error: %s", err.message);
    } else {
        prompt_is(&p, want, name);
    }
    chat_prompt_free(&p);
}

static void request_fails(const char *json, const char *param, const char *text)
{
    chat_prompt p;
    chat_error err;
    chat_prompt_init(&p);
    memset(&err, 0, sizeof err);
    int rc = render_json(json, &chat_defaults, &p, &err);
    ok(rc == -1 && !strcmp(err.param, param) && strstr(err.message, text)
           && !strncmp(err.message, param, strlen(param)),
       "error %s: %s", param, err.message);
    if (rc == 0) diag("  rendered instead: %s", p.text.data);
    chat_prompt_free(&p);
}

/* ---- DeepSeek's own vectors: encoder arguments, no OpenAI mapping ---- */

static void official_case(int n, bool thinking)
{
    char rel[128];
    snprintf(rel, sizeof rel, "deepseek-official/test_input_%d.json", n);
    yajl_val in = load_golden_json(rel);
    snprintf(rel, sizeof rel, "deepseek-official/test_output_%d.txt", n);
    strbuf want;
    sb_init(&want);
    if (!in || read_golden(rel, &want)) {
        ok(0, "official case %d: golden files readable", n);
        yajl_tree_free(in);
        sb_free(&want);
        return;
    }
    /* Case 1 is {tools, messages}: the tools go onto messages[0]. */
    yajl_val msgs = YAJL_IS_OBJECT(in) ? json_get(in, "messages") : in;
    chat_conversation c;
    chat_error err;
    if (chat_conversation_from_json(&c, msgs, &err)) {
        ok(0, "official case %d loads: %s", n, err.message);
    } else {
        if (YAJL_IS_OBJECT(in)) c.msgs[0].tools = json_get(in, "tools");
        chat_options o = { thinking, CHAT_EFFORT_LOW, true };
        chat_prompt p;
        chat_prompt_init(&p);
        char name[64];
        snprintf(name, sizeof name, "official case %d", n);
        if (chat_render(&c, &o, &p, &err)) ok(0, "%s renders: %s", name, err.message);
        else prompt_is(&p, want.data, name);
        chat_prompt_free(&p);
        chat_conversation_free(&c);
    }
    yajl_tree_free(in);
    sb_free(&want);
}

/* ---- v4-0731-openai.json render[] through the OpenAI mapping ---- */

static void openai_cases(void)
{
    yajl_val g;
    yajl_val cases = openai_golden_cases("render", 20, &g);
    if (!cases) return;
    for (size_t i = 0; i < cases->u.array.len; i++) {
        yajl_val c = cases->u.array.values[i];
        const char *name = json_string(json_get(c, "name"));
        const char *want = json_string(json_get(c, "prompt"));
        chat_prompt p;
        chat_error err;
        chat_prompt_init(&p);
        if (chat_render_request(json_get(c, "request"), &chat_defaults, &p, &err))
            ok(0, "%s renders: %s", name, err.message);
        else
            prompt_is(&p, want, name);
        chat_prompt_free(&p);
    }
    yajl_tree_free(g);
}

/* ---- encoder rules beyond the goldens (expected text derived by hand
 * from DeepSeek's encode_messages) ---- */

static const chat_options thinking_low = { true, CHAT_EFFORT_LOW, true };

static void encoder_rules(void)
{
    request_is("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
               "{\"role\":\"user\",\"content\":\"b\"}]}", &chat_defaults,
               BOS U "a\n\nb" A TE, "consecutive user messages are one turn");

    request_is("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},"
               "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"x\","
               "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
               "{\"role\":\"tool\",\"tool_call_id\":\"x\",\"content\":\"r\"},"
               "{\"role\":\"user\",\"content\":\"more\"}]}", &chat_defaults,
               BOS U "q" A TE "\n\n<" DS "tool_calls>\n<" DS "invoke name=\"f\">\n\n</" DS
               "invoke>\n</" DS "tool_calls>" EOS U "<tool_result>r</tool_result>\n\nmore" A TE,
               "a call without arguments; user text after a tool result joins its turn");

    request_is("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},"
               "{\"role\":\"assistant\",\"tool_calls\":["
               "{\"id\":\"a\",\"function\":{\"name\":\"f1\",\"arguments\":\"{}\"}},"
               "{\"id\":\"b\",\"function\":{\"name\":\"f2\",\"arguments\":\"\"}}]},"
               "{\"role\":\"tool\",\"tool_call_id\":\"b\",\"content\":\"rb\"},"
               "{\"role\":\"user\",\"content\":\"note\"},"
               "{\"role\":\"tool\",\"tool_call_id\":\"a\",\"content\":\"ra\"}]}", &chat_defaults,
               BOS U "q" A TE "\n\n<" DS "tool_calls>\n<" DS "invoke name=\"f1\">\n\n</" DS
               "invoke>\n<" DS "invoke name=\"f2\">\n\n</" DS "invoke>\n</" DS "tool_calls>" EOS
               U "<tool_result>ra</tool_result>\n\nnote\n\n<tool_result>rb</tool_result>" A TE,
               "tool results sorted by call order among their own positions");

    request_is("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},"
               "{\"role\":\"assistant\",\"content\":\"ok\",\"tool_calls\":[{\"id\":\"c\","
               "\"function\":{\"name\":\"g\",\"arguments\":"
               "\"{\\\"a\\\": 1, \\\"b\\\": \\\"s\\\", \\\"a\\\": [true, null, 1.50, -0], \\\"n\\\": {\\\"k\\\": \\\"\\u00e9\\\\n\\\"}}\"}}]}]}",
               &chat_defaults,
               BOS U "q" A TE "ok\n\n<" DS "tool_calls>\n<" DS "invoke name=\"g\">\n"
               "<" DS "parameter name=\"a\" string=\"false\">[true, null, 1.5, 0]</" DS "parameter>\n"
               "<" DS "parameter name=\"b\" string=\"true\">s</" DS "parameter>\n"
               "<" DS "parameter name=\"n\" string=\"false\">{\"k\": \"\xc3\xa9\\n\"}</" DS "parameter>\n"
               "</" DS "invoke>\n</" DS "tool_calls>" EOS,
               "arguments as json.loads sees them: duplicate keys, floats, -0, nested JSON");

    request_is("{\"messages\":[{\"role\":\"user\",\"content\":\"t\",\"task\":\"title\"},"
               "{\"role\":\"assistant\",\"content\":\"x\",\"reasoning_content\":\"r\"}]}",
               &thinking_low, BOS U "t<｜title｜>x" EOS,
               "a task marker replaces the assistant prefix; its answer has no reasoning");
    request_is("{\"messages\":[{\"role\":\"user\",\"content\":\"t\",\"task\":\"action\"}]}",
               &thinking_low, BOS U "t" A TS "<｜action｜>", "action task in thinking mode");
    request_is("{\"messages\":[{\"role\":\"user\",\"content\":\"t\",\"task\":\"query\"},"
               "{\"role\":\"user\",\"content\":\"u\"}]}", &chat_defaults,
               BOS U "t" U "u" A TE, "a user message after a task turn starts a new turn");

    request_is("{\"messages\":[{\"role\":\"developer\",\"content\":\"d\"},"
               "{\"role\":\"user\",\"content\":\"u\"}]}", &thinking_low,
               BOS U "u" A TS, "thinking with drop_thinking drops developer turns before the last user turn");
    request_is("{\"messages\":[{\"role\":\"developer\",\"content\":\"d\"},"
               "{\"role\":\"user\",\"content\":\"u\"}]}", &chat_defaults,
               BOS U "d" U "u" A TE, "chat mode keeps developer turns");
    request_is("{\"messages\":[{\"role\":\"developer\",\"content\":\"d\"}]}", &thinking_low,
               BOS U "d" A TS, "a final developer turn gets the generation prompt");

    request_is("{\"messages\":[{\"role\":\"user\",\"content\":\"u\"},"
               "{\"role\":\"assistant\",\"content\":\"par\",\"wo_eos\":true}]}", &chat_defaults,
               BOS U "u" A TE "par", "wo_eos leaves the assistant turn open");
    request_is("{\"messages\":[{\"role\":\"user\",\"content\":\"u\"},"
               "{\"role\":\"latest_reminder\",\"content\":\"r\"}]}", &chat_defaults,
               BOS U "u" A TE "<｜latest_reminder｜>r", "latest_reminder after a user turn");
    request_is("{\"messages\":[{\"role\":\"user\",\"content\":\"u\"},"
               "{\"role\":\"system\",\"content\":\"s\"}]}", &chat_defaults,
               BOS U "us", "a trailing system message gets no generation prompt");

    request_is("{\"messages\":[{\"role\":\"user\",\"content\":\"u\"}],\"tools\":[],"
               "\"response_format\":{\"type\":\"text\"}}", &chat_defaults,
               BOS U "u" A TE, "empty tools and a text response_format add nothing");
    request_is("{\"messages\":[{\"role\":\"user\",\"content\":\"u\"}],"
               "\"response_format\":{\"type\":\"json_object\"}}", &chat_defaults,
               BOS "\n\n## Response Format:\n\nYou MUST strictly adhere to the following "
               "schema to reply:\n{\"type\": \"json_object\"}" U "u" A TE,
               "response_format goes onto a new system message");
    request_is("{\"messages\":[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"u\"}],"
               "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\","
               "\"schema\":{\"type\":\"object\"}}}}", &chat_defaults,
               BOS "S\n\n## Response Format:\n\nYou MUST strictly adhere to the following "
               "schema to reply:\n{\"type\": \"json_schema\", \"json_schema\": {\"name\": \"n\", "
               "\"schema\": {\"type\": \"object\"}}}" U "u" A TE,
               "response_format goes onto the first system message");

    request_is("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},"
               "{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":{\"x\":2}}}]},"
               "{\"role\":\"tool\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]}]}",
               &chat_defaults,
               BOS U "q" A TE "\n\n<" DS "tool_calls>\n<" DS "invoke name=\"f\">\n<" DS
               "parameter name=\"x\" string=\"false\">2</" DS "parameter>\n</" DS "invoke>\n</" DS
               "tool_calls>" EOS U "<tool_result>a\n\nb</tool_result>" A TE,
               "calls and results without ids, arguments as an object, tool content parts");

    /* Defaults stand in for what the request omits. */
    const chat_options recipe_like = { true, CHAT_EFFORT_MAX, true };
    request_is("{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", &recipe_like,
               BOS "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\n"
               "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to "
               "chance: exhaustively decompose the problem into its most fundamental components, "
               "trace every causal chain to its root, and resolve the underlying cause rather than "
               "any surface symptom.\nDo not stop reasoning until you have independently verified "
               "the solution from multiple angles and are certain that no assumption remains "
               "unchecked and no error remains undiscovered.\n\n" U "Hi" A TS,
               "recipe defaults: thinking with max effort");
    request_is("{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
               "\"chat_template_kwargs\":{\"thinking\":false}}", &recipe_like,
               BOS U "Hi" A TE, "the request's thinking:false beats the default");
    request_is("{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"reasoning_effort\":\"none\"}",
               &recipe_like, BOS U "Hi" A TE, "reasoning_effort none beats a thinking default");
    request_is("{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"reasoning_effort\":\"high\","
               "\"chat_template_kwargs\":{\"reasoning_effort\":\"low\",\"enable_thinking\":true}}",
               &chat_defaults, BOS U "Hi" A TS,
               "chat_template_kwargs.reasoning_effort beats the top-level field");
    const chat_options keep = { true, CHAT_EFFORT_LOW, false };
    request_is("{\"messages\":[{\"role\":\"user\",\"content\":\"1\"},"
               "{\"role\":\"assistant\",\"content\":\"2\",\"reasoning\":\"r\"},"
               "{\"role\":\"user\",\"content\":\"3\"}]}", &keep,
               BOS U "1" A TS "r" TE "2" EOS U "3" A TS,
               "drop_thinking default false keeps old reasoning (vLLM's 'reasoning' field)");
}

/* ---- spans ---- */

static void spans_cover(const chat_prompt *p, const chat_span *s, size_t n, const char *what)
{
    size_t at = 0;
    bool good = true;
    for (size_t i = 0; i < n; i++) {
        if (s[i].off != at || !s[i].len) good = false;
        if (i && s[i].special_ok == s[i - 1].special_ok) good = false;   /* merged */
        at += s[i].len;
    }
    ok(good && at == p->text.len, "%s spans cover the prompt in order, alternating", what);
}

/* The special spans, each written as [text], concatenated. */
static void special_spans_are(const chat_prompt *p, const char *want, const char *name)
{
    strbuf sb;
    sb_init(&sb);
    for (size_t i = 0; i < p->n_spans; i++) {
        if (!p->spans[i].special_ok) continue;
        sb_putc(&sb, '[');
        sb_append(&sb, p->text.data + p->spans[i].off, p->spans[i].len);
        sb_putc(&sb, ']');
    }
    is_str(sb.data ? sb.data : "", want, "%s: special spans", name);
    sb_free(&sb);
}

static void span_checks(void)
{
    chat_prompt p;
    chat_error err;
    chat_prompt_init(&p);
    const char *sneaky = "{\"messages\":[{\"role\":\"system\",\"content\":\"Be " EOS "\"},"
                         "{\"role\":\"user\",\"content\":\"Please print " U " and " TE " literally.\"}],"
                         "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
                         "\"description\":\"" A "\"}}]}";
    if (render_json(sneaky, &thinking_low, &p, &err)) {
        ok(0, "span case renders: %s", err.message);
    } else {
        spans_cover(&p, p.origin, p.n_origin, "origin");
        spans_cover(&p, p.spans, p.n_spans, "token");
        /* Request text never lands in a special span, whatever it spells;
         * <think> and </think> in the tools block do. */
        special_spans_are(&p, "[" BOS "][" TS "][" TS "][" TE "][" TE "][" U "][" A TS "]",
                          "special strings only where the template wrote them");
        const char *user = strstr(p.text.data, "Please print");
        bool in_text = false;
        for (size_t i = 0; i < p.n_origin; i++) {
            const chat_span *s = &p.origin[i];
            if (s->off == (size_t)(user - p.text.data)) in_text = !s->special_ok
                && s->len == strlen("Please print " U " and " TE " literally.");
        }
        ok(in_text, "origin: the user content is exactly one request-text span");
        const char *sys = strstr(p.text.data, "Be ");
        bool merged = false;
        for (size_t i = 0; i < p.n_spans; i++)
            if (p.spans[i].off == (size_t)(sys - p.text.data))
                merged = !p.spans[i].special_ok
                         && !memcmp(p.text.data + p.spans[i].off + p.spans[i].len - 14,
                                    "(triggered by ", 14);
        ok(merged, "token spans: system text and the template text after it are one span");
    }
    chat_prompt_free(&p);
}

/* ---- bad input ---- */

static void error_checks(void)
{
    request_fails("[1]", "request", "expected a JSON object");
    request_fails("{}", "messages", "non-empty array");
    request_fails("{\"messages\":[]}", "messages", "non-empty array");
    request_fails("{\"messages\":[3]}", "messages[0]", "expected a message object");
    request_fails("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
                  "{\"role\":\"user\",\"content\":\"b\"},{\"role\":\"wizard\",\"content\":\"x\"}]}",
                  "messages[2].role", "unknown role 'wizard'");
    request_fails("{\"messages\":[{\"content\":\"x\"}]}", "messages[0].role", "missing");
    request_fails("{\"messages\":[{\"role\":7}]}", "messages[0].role", "expected a string");
    request_fails("{\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages[0].content",
                  "expected a string or an array of text parts");
    request_fails("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}",
                  "messages[0].content[0].type", "unsupported content part type 'image_url'");
    request_fails("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}",
                  "messages[0].content[0].text", "expected a string");
    request_fails("{\"messages\":[{\"role\":\"developer\",\"content\":\"\"}]}",
                  "messages[0].content", "needs content");
    request_fails("{\"messages\":[{\"role\":\"latest_reminder\"}]}",
                  "messages[0].content", "needs content");
    request_fails("{\"messages\":[{\"role\":\"user\",\"content\":\"q\",\"task\":\"dance\"}]}",
                  "messages[0].task", "unknown task 'dance'");
    request_fails("{\"messages\":[{\"role\":\"assistant\",\"reasoning_content\":1}]}",
                  "messages[0].reasoning_content", "expected a string");
    request_fails("{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":{}}]}",
                  "messages[0].tool_calls", "expected an array");
    request_fails("{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"a\"}]}]}",
                  "messages[0].tool_calls[0].function", "expected an object");
    request_fails("{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":"
                  "{\"arguments\":\"{}\"}}]}]}", "messages[0].tool_calls[0].function.name",
                  "expected a string");
    request_fails("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\","
                  "\"tool_calls\":[{\"id\":\"a\",\"function\":{\"name\":\"f\",\"arguments\":"
                  "\"{\\\"x\\\": \"}}]}]}", "messages[1].tool_calls[0].function.arguments",
                  "not valid JSON");
    request_fails("{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":"
                  "{\"name\":\"f\",\"arguments\":\"[1]\"}}]}]}",
                  "messages[0].tool_calls[0].function.arguments", "expected a JSON object");
    request_fails("{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":"
                  "{\"name\":\"f\",\"arguments\":7}}]}]}",
                  "messages[0].tool_calls[0].function.arguments", "expected a JSON object");
    request_fails("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\","
                  "\"tool_calls\":[{\"id\":\"a\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
                  "{\"role\":\"tool\",\"tool_call_id\":\"zz\",\"content\":\"r\"}]}",
                  "messages[2].tool_call_id", "no tool call with id 'zz'");
    request_fails("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},"
                  "{\"role\":\"tool\",\"tool_call_id\":\"x\",\"content\":\"r\"}]}",
                  "messages[1].tool_call_id", "answers no tool call");
    request_fails("{\"messages\":[{\"role\":\"tool\",\"tool_call_id\":5}]}",
                  "messages[0].tool_call_id", "expected a string");
    request_fails("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"tools\":{}}",
                  "tools", "expected an array");
    request_fails("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"tools\":[{\"type\":"
                  "\"custom\",\"function\":{\"name\":\"f\"}}]}", "tools[0].type", "only function tools");
    request_fails("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"tools\":[{\"type\":"
                  "\"function\"}]}", "tools[0].function", "expected an object");
    request_fails("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"tools\":[{\"function\":"
                  "{\"description\":\"d\"}}]}", "tools[0].function.name", "expected a string");
    request_fails("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"
                  "\"chat_template_kwargs\":{\"thinking\":\"yes\"}}",
                  "chat_template_kwargs.thinking", "expected a boolean");
    request_fails("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"
                  "\"chat_template_kwargs\":[]}", "chat_template_kwargs", "expected an object");
    request_fails("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"
                  "\"chat_template_kwargs\":{\"drop_thinking\":1}}",
                  "chat_template_kwargs.drop_thinking", "expected a boolean");
    request_fails("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"reasoning_effort\":3}",
                  "reasoning_effort", "expected a string");
    request_fails("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"
                  "\"response_format\":{\"type\":\"yaml\"}}", "response_format.type",
                  "unknown type 'yaml'");
    request_fails("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"
                  "\"response_format\":{\"type\":\"json_schema\"}}",
                  "response_format.json_schema", "expected an object");
    request_fails("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"response_format\":\"json\"}",
                  "response_format", "expected an object");
    request_fails("{\"messages\":[{\"role\":\"user\",\"content\":\"x\\n\\u0001"
                  "0123456789012345678901234567890123456789012345678\",\"task\":\"x\\n\\u0001"
                  "0123456789012345678901234567890123456789012345678\"}]}", "messages[0].task",
                  "unknown task 'x??0123456789012345678901234567890123456...'");

    /* An absurdly long message: refused with the limit, not rendered. */
    size_t n = CHAT_MAX_PROMPT_BYTES + 16;
    char *big = malloc(n + 64);
    int k = sprintf(big, "{\"messages\":[{\"role\":\"user\",\"content\":\"");
    memset(big + k, 'a', n);
    strcpy(big + k + n, "\"}]}");
    request_fails(big, "messages[0].content", "over the limit");
    free(big);
}

int main(void)
{
    official_case(1, true);
    official_case(2, true);
    official_case(3, true);
    official_case(4, false);
    openai_cases();
    encoder_rules();
    span_checks();
    error_checks();
    return exit_status();
}
