/* OpenAI chat-completions request -> encoder arguments, as vLLM maps them
 * for DeepSeek V4 (CHAT_FORMAT.md, "OpenAI request -> encoder arguments"). */
#include <string.h>

#include "chat_render.h"
#include "json.h"

static bool is_null(yajl_val v) { return !v || YAJL_IS_NULL(v); }

/* An optional boolean: *out unchanged when absent or null. */
static bool opt_bool(yajl_val v, const char *param, bool *out, bool *given,
                     chat_error *err)
{
    if (is_null(v)) return true;
    if (!json_bool(v, out)) {
        chat_fail(err, param, "expected a boolean");
        return false;
    }
    if (given) *given = true;
    return true;
}

/* Mode and effort: thinking when chat_template_kwargs.thinking or
 * .enable_thinking is true (the defaults when neither is given);
 * reasoning_effort from chat_template_kwargs, else top level, "none"
 * meaning chat mode. */
static bool load_options(yajl_val req, const chat_options *d, chat_options *o,
                         chat_error *err)
{
    *o = *d;
    yajl_val kw = json_get(req, "chat_template_kwargs");
    if (!is_null(kw) && !YAJL_IS_OBJECT(kw)) {
        chat_fail(err, "chat_template_kwargs", "expected an object");
        return false;
    }
    bool thinking = false, enable = false, given = false;
    if (!opt_bool(json_get(kw, "thinking"), "chat_template_kwargs.thinking",
                  &thinking, &given, err)
        || !opt_bool(json_get(kw, "enable_thinking"), "chat_template_kwargs.enable_thinking",
                     &enable, &given, err)
        || !opt_bool(json_get(kw, "drop_thinking"), "chat_template_kwargs.drop_thinking",
                     &o->drop_thinking, NULL, err))
        return false;
    if (given) o->thinking = thinking || enable;

    const char *param = "chat_template_kwargs.reasoning_effort";
    yajl_val effort = json_get(kw, "reasoning_effort");
    if (is_null(effort)) {
        param = "reasoning_effort";
        effort = json_get(req, "reasoning_effort");
    }
    if (!is_null(effort)) {
        if (!YAJL_IS_STRING(effort)) {
            chat_fail(err, param, "expected a string (none, minimal, low, medium, "
                      "high, xhigh or max)");
            return false;
        }
        if (!chat_effort_from_name(effort->u.string, &o->effort)) o->thinking = false;
    }
    return true;
}

/* response_format: text asks for nothing; json_object and json_schema are
 * handed to the encoder as given. */
static bool load_response_format(yajl_val req, yajl_val *out, chat_error *err)
{
    *out = NULL;
    yajl_val rf = json_get(req, "response_format");
    if (is_null(rf)) return true;
    const char *type = json_string(json_get(rf, "type"));
    char q[64];
    if (!YAJL_IS_OBJECT(rf)) {
        chat_fail(err, "response_format", "expected an object");
        return false;
    }
    if (!type) {
        chat_fail(err, "response_format.type", "expected one of text, json_object, json_schema");
        return false;
    }
    if (!strcmp(type, "text")) return true;
    if (!strcmp(type, "json_schema")) {
        yajl_val js = json_get(rf, "json_schema");
        if (!js || !YAJL_IS_OBJECT(js)) {
            chat_fail(err, "response_format.json_schema", "expected an object");
            return false;
        }
    } else if (strcmp(type, "json_object")) {
        chat_fail(err, "response_format.type", "unknown type '%s' (text, json_object "
                  "or json_schema)", chat_quote(q, type));
        return false;
    }
    *out = rf;
    return true;
}

int chat_render_request(yajl_val req, const chat_options *defaults,
                        chat_prompt *p, chat_error *err)
{
    if (!req || !YAJL_IS_OBJECT(req)) {
        chat_fail(err, "request", "expected a JSON object");
        return -1;
    }
    yajl_val msgs = json_get(req, "messages");
    if (!msgs || !YAJL_IS_ARRAY(msgs) || !msgs->u.array.len) {
        chat_fail(err, "messages", "expected a non-empty array of messages");
        return -1;
    }
    chat_options o;
    yajl_val rf;
    if (!load_options(req, defaults, &o, err) || !load_response_format(req, &rf, err))
        return -1;

    yajl_val tools = json_get(req, "tools");
    if (!chat_tools_valid(tools, "tools", err)) return -1;
    chat_conversation c;
    if (chat_conversation_from_json(&c, msgs, err)) return -1;
    if ((tools && json_len(tools)) || rf) {
        chat_message *sys = c.msgs[0].role == CHAT_SYSTEM
                                ? &c.msgs[0] : chat_conversation_insert(&c, 0, CHAT_SYSTEM);
        if (tools && json_len(tools)) sys->tools = tools;
        if (rf) sys->response_format = rf;
    }
    int rc = chat_render(&c, &o, p, err);
    chat_conversation_free(&c);
    return rc;
}
