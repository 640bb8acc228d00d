/*
 * Anthropic's Messages API: POST /v1/messages and /v1/messages/count_tokens.
 *
 * A request is checked for Anthropic's structure here and rewritten as an
 * OpenAI chat request (system -> a system message, text blocks -> text
 * parts, tool_use -> tool_calls, tool_result -> tool messages, tools ->
 * function tools, thinking -> thinking mode and a reasoning effort), which
 * then goes through the chat validator like any other: the engine knows
 * one chat path.  The engine's events are formatted here as Anthropic's
 * message object or its SSE events (message_start, content_block_start /
 * delta / stop, message_delta, message_stop); errors take Anthropic's
 * {"type":"error","error":{"type","message"}} shape.
 */

#include "ngx_http_llm_module.h"


/* thinking.budget_tokens -> reasoning_effort (CHAT_FORMAT.md: low adds no
   effort paragraph, high and max add theirs) */
#define NGX_HTTP_LLM_BUDGET_HIGH  8192
#define NGX_HTTP_LLM_BUDGET_MAX   32768


typedef struct {
    ngx_pool_t            *pool;
    ngx_http_llm_req_t    *req;
    ngx_http_llm_wbuf_t    out;          /* the OpenAI chat request */
    ngx_uint_t             count;        /* count_tokens */
    ngx_uint_t             nmsg;         /* messages written */
} ngx_http_llm_actx_t;


/* formatter state: the content block open now and, for bodies, all */
typedef struct {
    ngx_array_t            blocks;       /* ngx_http_llm_item_t */
    ngx_http_llm_item_t   *open;
    ngx_uint_t             index;        /* blocks started */
    ngx_str_t             *stop;         /* the stop sequence that ended it */
} ngx_http_llm_astate_t;


/* ---- errors ------------------------------------------------------------ */

static const char *
ngx_http_llm_anthropic_type(ngx_uint_t status)
{
    switch (status) {

    case NGX_HTTP_BAD_REQUEST:
    case NGX_HTTP_NOT_ALLOWED:
    case NGX_HTTP_CONFLICT:
        return "invalid_request_error";

    case NGX_HTTP_UNAUTHORIZED:
        return "authentication_error";

    case NGX_HTTP_FORBIDDEN:
        return "permission_error";

    case NGX_HTTP_NOT_FOUND:
        return "not_found_error";

    case NGX_HTTP_REQUEST_ENTITY_TOO_LARGE:
        return "request_too_large";

    case NGX_HTTP_TOO_MANY_REQUESTS:
        return "rate_limit_error";

    case NGX_HTTP_SERVICE_UNAVAILABLE:
        return "overloaded_error";

    default:
        return "api_error";
    }
}


void
ngx_http_llm_anthropic_error_body(ngx_http_llm_wbuf_t *w, ngx_uint_t status,
    ngx_str_t *message)
{
    ngx_http_llm_printf(w, "{\"type\":\"error\",\"error\":{\"type\":\"%s\","
                        "\"message\":", ngx_http_llm_anthropic_type(status));
    ngx_http_llm_put_string(w, message->data, message->len);
    ngx_http_llm_puts(w, "}}");
}


/* a 400 naming the field the Anthropic way ("messages.0.content.1.type") */
static ngx_int_t
ngx_http_llm_abad(ngx_http_llm_actx_t *ctx, const char *fmt, ...)
{
    u_char   *p;
    va_list   args;

    p = ngx_pnalloc(ctx->pool, 1024);
    if (p == NULL) {
        return NGX_ERROR;
    }

    ctx->req->status = NGX_HTTP_BAD_REQUEST;
    ctx->req->err_message.data = p;

    va_start(args, fmt);
    p = ngx_vslprintf(p, p + 1024, fmt, args);
    va_end(args);

    ctx->req->err_message.len = p - ctx->req->err_message.data;

    return NGX_DECLINED;
}


/* ---- request ----------------------------------------------------------- */

static ngx_str_t *
ngx_http_llm_block_type(ngx_http_llm_json_t *b)
{
    ngx_http_llm_json_t  *t;

    if (b->type != NGX_HTTP_LLM_JSON_OBJECT) {
        return NULL;
    }

    t = ngx_http_llm_json_member(b, "type");

    return (t && t->type == NGX_HTTP_LLM_JSON_STRING) ? &t->value : NULL;
}


#define ngx_http_llm_is(s, lit)                                              \
    ((s)->len == sizeof(lit) - 1 && ngx_strncmp((s)->data, lit,             \
                                                sizeof(lit) - 1) == 0)


/* a text block's text, or a 400 */
static ngx_int_t
ngx_http_llm_text_block(ngx_http_llm_actx_t *ctx, ngx_http_llm_json_t *b,
    const char *where, ngx_http_llm_json_t **text)
{
    *text = ngx_http_llm_json_member(b, "text");

    if (*text == NULL || (*text)->type != NGX_HTTP_LLM_JSON_STRING) {
        return ngx_http_llm_abad(ctx, "%s.text: a string is required",
                                 where);
    }

    return NGX_OK;
}


/*
 * Text content as OpenAI text parts: a string, or an array of text blocks
 * (system, tool_result content).  prefix: a first part to add, or NULL.
 */
static ngx_int_t
ngx_http_llm_text_content(ngx_http_llm_actx_t *ctx, ngx_http_llm_json_t *v,
    const char *where, const char *prefix)
{
    u_char               *w;
    ngx_str_t            *type;
    ngx_uint_t            j;
    ngx_http_llm_json_t  *b, *text;

    if (v == NULL) {
        ngx_http_llm_printf(&ctx->out, "\"%s\"", prefix ? prefix : "");
        return NGX_OK;
    }

    if (v->type == NGX_HTTP_LLM_JSON_STRING && prefix == NULL) {
        ngx_http_llm_put_json(&ctx->out, v);
        return NGX_OK;
    }

    ngx_http_llm_puts(&ctx->out, "[");

    if (prefix) {
        ngx_http_llm_printf(&ctx->out, "{\"type\":\"text\",\"text\":\"%s\"}",
                            prefix);
    }

    if (v->type == NGX_HTTP_LLM_JSON_STRING) {
        ngx_http_llm_puts(&ctx->out, ",{\"type\":\"text\",\"text\":");
        ngx_http_llm_put_json(&ctx->out, v);
        ngx_http_llm_puts(&ctx->out, "}]");
        return NGX_OK;
    }

    if (v->type != NGX_HTTP_LLM_JSON_ARRAY) {
        return ngx_http_llm_abad(ctx, "%s: must be a string or an array of "
                                 "text blocks", where);
    }

    w = ngx_pnalloc(ctx->pool, 256);
    if (w == NULL) {
        return NGX_ERROR;
    }

    for (b = v->child, j = 0; b; b = b->next, j++) {
        ngx_sprintf(w, "%s.%ui%Z", where, j);

        type = ngx_http_llm_block_type(b);

        if (type == NULL || !ngx_http_llm_is(type, "text")) {
            return ngx_http_llm_abad(ctx, "%s.type: only \"text\" blocks "
                                     "are supported here (this model reads "
                                     "text only)", w);
        }

        if (ngx_http_llm_text_block(ctx, b, (char *) w, &text) != NGX_OK) {
            return NGX_DECLINED;
        }

        ngx_http_llm_puts(&ctx->out, (j || prefix) ? ",{\"type\":\"text\","
                                                     "\"text\":"
                                                   : "{\"type\":\"text\","
                                                     "\"text\":");
        ngx_http_llm_put_json(&ctx->out, text);
        ngx_http_llm_puts(&ctx->out, "}");
    }

    ngx_http_llm_puts(&ctx->out, "]");

    return NGX_OK;
}


static void
ngx_http_llm_msg_open(ngx_http_llm_actx_t *ctx, const char *role)
{
    ngx_http_llm_printf(&ctx->out, "%s{\"role\":\"%s\"",
                        ctx->nmsg++ ? "," : "", role);
}


/* a user turn: text blocks become one user message, each tool_result a
   tool message, in their order */
static ngx_int_t
ngx_http_llm_user_turn(ngx_http_llm_actx_t *ctx, ngx_http_llm_json_t *c,
    ngx_uint_t i)
{
    u_char                w[128];
    ngx_str_t            *type;
    ngx_uint_t            j, texts;
    ngx_http_llm_json_t  *b, *text, *id, *err;

    if (c->type == NGX_HTTP_LLM_JSON_STRING) {
        ngx_http_llm_msg_open(ctx, "user");
        ngx_http_llm_puts(&ctx->out, ",\"content\":");
        ngx_http_llm_put_json(&ctx->out, c);
        ngx_http_llm_puts(&ctx->out, "}");
        return NGX_OK;
    }

    texts = 0;

    for (b = c->child, j = 0; b; b = b->next, j++) {
        ngx_sprintf(w, "messages.%ui.content.%ui%Z", i, j);

        type = ngx_http_llm_block_type(b);
        if (type == NULL) {
            return ngx_http_llm_abad(ctx, "%s.type: a content block needs a "
                                     "type", w);
        }

        if (ngx_http_llm_is(type, "text")) {
            if (ngx_http_llm_text_block(ctx, b, (char *) w, &text) != NGX_OK)
            {
                return NGX_DECLINED;
            }

            if (texts++ == 0) {
                ngx_http_llm_msg_open(ctx, "user");
                ngx_http_llm_puts(&ctx->out, ",\"content\":[");

            } else {
                ngx_http_llm_puts(&ctx->out, ",");
            }

            ngx_http_llm_puts(&ctx->out, "{\"type\":\"text\",\"text\":");
            ngx_http_llm_put_json(&ctx->out, text);
            ngx_http_llm_puts(&ctx->out, "}");
            continue;
        }

        if (!ngx_http_llm_is(type, "tool_result")) {
            return ngx_http_llm_abad(ctx, "%s.type: \"%V\" blocks are not "
                                     "supported in user turns (text and "
                                     "tool_result are; this model reads "
                                     "text only)", w, type);
        }

        id = ngx_http_llm_json_member(b, "tool_use_id");
        if (id == NULL || id->type != NGX_HTTP_LLM_JSON_STRING) {
            return ngx_http_llm_abad(ctx, "%s.tool_use_id: a string is "
                                     "required", w);
        }

        err = ngx_http_llm_json_member(b, "is_error");
        if (err && err->type != NGX_HTTP_LLM_JSON_TRUE
            && err->type != NGX_HTTP_LLM_JSON_FALSE)
        {
            return ngx_http_llm_abad(ctx, "%s.is_error: must be a boolean",
                                     w);
        }

        if (texts) {
            ngx_http_llm_puts(&ctx->out, "]}");
            texts = 0;
        }

        ngx_http_llm_msg_open(ctx, "tool");
        ngx_http_llm_puts(&ctx->out, ",\"tool_call_id\":");
        ngx_http_llm_put_json(&ctx->out, id);
        ngx_http_llm_puts(&ctx->out, ",\"content\":");

        ngx_sprintf(w, "messages.%ui.content.%ui.content%Z", i, j);

        /* V4's format has no error flag: the text says it */
        if (ngx_http_llm_text_content(ctx, ngx_http_llm_json_member(b,
                                                                 "content"),
                                      (char *) w,
                                      err && err->type == NGX_HTTP_LLM_JSON_TRUE
                                      ? "Error:" : NULL)
            != NGX_OK)
        {
            return NGX_DECLINED;
        }

        ngx_http_llm_puts(&ctx->out, "}");
    }

    if (texts) {
        ngx_http_llm_puts(&ctx->out, "]}");
    }

    return NGX_OK;
}


/* an assistant turn: text, thinking and tool_use blocks -> one message */
static ngx_int_t
ngx_http_llm_assistant_turn(ngx_http_llm_actx_t *ctx, ngx_http_llm_json_t *c,
    ngx_uint_t i)
{
    u_char                w[128];
    ngx_str_t            *type;
    ngx_uint_t            j, texts, calls, thinking;
    ngx_http_llm_json_t  *b, *text, *id, *name, *input;
    ngx_http_llm_wbuf_t   content, reasoning, tools, args;

    ngx_http_llm_msg_open(ctx, "assistant");

    if (c->type == NGX_HTTP_LLM_JSON_STRING) {
        ngx_http_llm_puts(&ctx->out, ",\"content\":");
        ngx_http_llm_put_json(&ctx->out, c);
        ngx_http_llm_puts(&ctx->out, "}");
        return NGX_OK;
    }

    ngx_http_llm_wbuf_init(&content, ctx->pool);
    ngx_http_llm_wbuf_init(&reasoning, ctx->pool);
    ngx_http_llm_wbuf_init(&tools, ctx->pool);

    texts = 0;
    calls = 0;
    thinking = 0;

    for (b = c->child, j = 0; b; b = b->next, j++) {
        ngx_sprintf(w, "messages.%ui.content.%ui%Z", i, j);

        type = ngx_http_llm_block_type(b);
        if (type == NULL) {
            return ngx_http_llm_abad(ctx, "%s.type: a content block needs a "
                                     "type", w);
        }

        if (ngx_http_llm_is(type, "text")) {
            if (ngx_http_llm_text_block(ctx, b, (char *) w, &text) != NGX_OK)
            {
                return NGX_DECLINED;
            }

            ngx_http_llm_puts(&content, texts++ ? ",{\"type\":\"text\","
                                                  "\"text\":"
                                                : "{\"type\":\"text\","
                                                  "\"text\":");
            ngx_http_llm_put_json(&content, text);
            ngx_http_llm_puts(&content, "}");
            continue;
        }

        if (ngx_http_llm_is(type, "thinking")) {
            text = ngx_http_llm_json_member(b, "thinking");
            if (text == NULL || text->type != NGX_HTTP_LLM_JSON_STRING) {
                return ngx_http_llm_abad(ctx, "%s.thinking: a string is "
                                         "required", w);
            }

            /* raw bytes, joined: quoted once at the end */
            ngx_http_llm_put(&reasoning, text->value.data, text->value.len);
            thinking = 1;
            continue;
        }

        if (ngx_http_llm_is(type, "redacted_thinking")) {
            continue;       /* opaque to this server: nothing to render */
        }

        if (!ngx_http_llm_is(type, "tool_use")) {
            return ngx_http_llm_abad(ctx, "%s.type: \"%V\" blocks are not "
                                     "supported in assistant turns (text, "
                                     "thinking and tool_use are)", w, type);
        }

        id = ngx_http_llm_json_member(b, "id");
        name = ngx_http_llm_json_member(b, "name");
        input = ngx_http_llm_json_member(b, "input");

        if (id == NULL || id->type != NGX_HTTP_LLM_JSON_STRING) {
            return ngx_http_llm_abad(ctx, "%s.id: a string is required", w);
        }

        if (name == NULL || name->type != NGX_HTTP_LLM_JSON_STRING) {
            return ngx_http_llm_abad(ctx, "%s.name: a string is required",
                                     w);
        }

        if (input == NULL || input->type != NGX_HTTP_LLM_JSON_OBJECT) {
            return ngx_http_llm_abad(ctx, "%s.input: an object is required",
                                     w);
        }

        ngx_http_llm_wbuf_init(&args, ctx->pool);
        ngx_http_llm_put_json(&args, input);

        ngx_http_llm_puts(&tools, calls++ ? ",{\"id\":" : "{\"id\":");
        ngx_http_llm_put_json(&tools, id);
        ngx_http_llm_puts(&tools, ",\"type\":\"function\",\"function\":"
                                  "{\"name\":");
        ngx_http_llm_put_json(&tools, name);
        ngx_http_llm_puts(&tools, ",\"arguments\":");
        ngx_http_llm_put_string(&tools, args.start,
                                ngx_http_llm_wbuf_len(&args));
        ngx_http_llm_puts(&tools, "}}");

        if (args.failed) {
            return NGX_ERROR;
        }
    }

    ngx_http_llm_puts(&ctx->out, ",\"content\":");

    if (texts) {
        ngx_http_llm_puts(&ctx->out, "[");
        ngx_http_llm_put(&ctx->out, content.start,
                         ngx_http_llm_wbuf_len(&content));
        ngx_http_llm_puts(&ctx->out, "]");

    } else {
        ngx_http_llm_puts(&ctx->out, calls ? "null" : "\"\"");
    }

    if (thinking) {
        ngx_http_llm_puts(&ctx->out, ",\"reasoning_content\":");
        ngx_http_llm_put_string(&ctx->out, reasoning.start,
                                ngx_http_llm_wbuf_len(&reasoning));
    }

    if (calls) {
        ngx_http_llm_puts(&ctx->out, ",\"tool_calls\":[");
        ngx_http_llm_put(&ctx->out, tools.start,
                         ngx_http_llm_wbuf_len(&tools));
        ngx_http_llm_puts(&ctx->out, "]");
    }

    ngx_http_llm_puts(&ctx->out, "}");

    if (content.failed || reasoning.failed || tools.failed) {
        return NGX_ERROR;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_llm_amessages(ngx_http_llm_actx_t *ctx, ngx_http_llm_json_t *body)
{
    ngx_int_t             rc;
    ngx_uint_t            i;
    ngx_http_llm_json_t  *msgs, *m, *role, *c, *sys;

    msgs = ngx_http_llm_json_member(body, "messages");

    if (msgs == NULL || msgs->type != NGX_HTTP_LLM_JSON_ARRAY
        || msgs->count == 0)
    {
        return ngx_http_llm_abad(ctx, "messages: a non-empty array of "
                                 "messages is required");
    }

    ngx_http_llm_puts(&ctx->out, ",\"messages\":[");

    sys = ngx_http_llm_json_member(body, "system");

    if (sys) {
        ngx_http_llm_msg_open(ctx, "system");
        ngx_http_llm_puts(&ctx->out, ",\"content\":");

        if (ngx_http_llm_text_content(ctx, sys, "system", NULL) != NGX_OK) {
            return NGX_DECLINED;
        }

        ngx_http_llm_puts(&ctx->out, "}");
    }

    for (m = msgs->child, i = 0; m; m = m->next, i++) {

        if (m->type != NGX_HTTP_LLM_JSON_OBJECT) {
            return ngx_http_llm_abad(ctx, "messages.%ui: must be an object",
                                     i);
        }

        role = ngx_http_llm_json_member(m, "role");
        c = ngx_http_llm_json_member(m, "content");

        if (c == NULL || (c->type != NGX_HTTP_LLM_JSON_STRING
                          && c->type != NGX_HTTP_LLM_JSON_ARRAY))
        {
            return ngx_http_llm_abad(ctx, "messages.%ui.content: must be a "
                                     "string or an array of content blocks",
                                     i);
        }

        if (ngx_http_llm_json_is_string(role, "user")) {
            rc = ngx_http_llm_user_turn(ctx, c, i);

        } else if (ngx_http_llm_json_is_string(role, "assistant")) {
            if (m->next == NULL && !ctx->count) {
                return ngx_http_llm_abad(ctx, "messages.%ui: a final "
                                         "assistant turn (prefill) is not "
                                         "supported: end with a user turn",
                                         i);
            }

            rc = ngx_http_llm_assistant_turn(ctx, c, i);

        } else {
            return ngx_http_llm_abad(ctx, "messages.%ui.role: must be "
                                     "\"user\" or \"assistant\" (system "
                                     "text goes in the top-level system "
                                     "field)", i);
        }

        if (rc != NGX_OK) {
            return rc;
        }
    }

    ngx_http_llm_puts(&ctx->out, "]");

    return NGX_OK;
}


static ngx_int_t
ngx_http_llm_atools(ngx_http_llm_actx_t *ctx, ngx_http_llm_json_t *body)
{
    ngx_uint_t            i;
    ngx_http_llm_json_t  *tools, *t, *type, *name, *desc, *schema, *tc, *v;

    tools = ngx_http_llm_json_member(body, "tools");

    if (tools) {
        if (tools->type != NGX_HTTP_LLM_JSON_ARRAY) {
            return ngx_http_llm_abad(ctx, "tools: must be an array");
        }

        ngx_http_llm_puts(&ctx->out, ",\"tools\":[");

        for (t = tools->child, i = 0; t; t = t->next, i++) {
            if (t->type != NGX_HTTP_LLM_JSON_OBJECT) {
                return ngx_http_llm_abad(ctx, "tools.%ui: must be an object",
                                         i);
            }

            type = ngx_http_llm_json_member(t, "type");

            if (type && !ngx_http_llm_json_is_string(type, "custom")) {
                return ngx_http_llm_abad(ctx, "tools.%ui.type: only client "
                                         "tools (\"custom\", or no type) "
                                         "are supported", i);
            }

            name = ngx_http_llm_json_member(t, "name");
            desc = ngx_http_llm_json_member(t, "description");
            schema = ngx_http_llm_json_member(t, "input_schema");

            if (name == NULL || name->type != NGX_HTTP_LLM_JSON_STRING) {
                return ngx_http_llm_abad(ctx, "tools.%ui.name: a string is "
                                         "required", i);
            }

            if (schema == NULL || schema->type != NGX_HTTP_LLM_JSON_OBJECT) {
                return ngx_http_llm_abad(ctx, "tools.%ui.input_schema: an "
                                         "object is required", i);
            }

            ngx_http_llm_puts(&ctx->out, i ? ",{" : "{");
            ngx_http_llm_puts(&ctx->out, "\"type\":\"function\",\"function\""
                                         ":{\"name\":");
            ngx_http_llm_put_json(&ctx->out, name);

            if (desc) {
                ngx_http_llm_puts(&ctx->out, ",\"description\":");
                ngx_http_llm_put_json(&ctx->out, desc);
            }

            ngx_http_llm_puts(&ctx->out, ",\"parameters\":");
            ngx_http_llm_put_json(&ctx->out, schema);
            ngx_http_llm_puts(&ctx->out, "}}");
        }

        ngx_http_llm_puts(&ctx->out, "]");
    }

    tc = ngx_http_llm_json_member(body, "tool_choice");
    if (tc == NULL) {
        return NGX_OK;
    }

    type = ngx_http_llm_json_member(tc, "type");

    if (tc->type != NGX_HTTP_LLM_JSON_OBJECT || type == NULL) {
        return ngx_http_llm_abad(ctx, "tool_choice: must be an object with "
                                 "type \"auto\", \"any\", \"tool\" or "
                                 "\"none\"");
    }

    if (ngx_http_llm_json_is_string(type, "auto")) {
        ngx_http_llm_puts(&ctx->out, ",\"tool_choice\":\"auto\"");

    } else if (ngx_http_llm_json_is_string(type, "any")) {
        ngx_http_llm_puts(&ctx->out, ",\"tool_choice\":\"required\"");

    } else if (ngx_http_llm_json_is_string(type, "none")) {
        ngx_http_llm_puts(&ctx->out, ",\"tool_choice\":\"none\"");

    } else if (ngx_http_llm_json_is_string(type, "tool")) {
        name = ngx_http_llm_json_member(tc, "name");

        if (name == NULL || name->type != NGX_HTTP_LLM_JSON_STRING) {
            return ngx_http_llm_abad(ctx, "tool_choice.name: a string is "
                                     "required with type \"tool\"");
        }

        ngx_http_llm_puts(&ctx->out, ",\"tool_choice\":{\"type\":"
                                     "\"function\",\"function\":{\"name\":");
        ngx_http_llm_put_json(&ctx->out, name);
        ngx_http_llm_puts(&ctx->out, "}}");

    } else {
        return ngx_http_llm_abad(ctx, "tool_choice.type: must be \"auto\", "
                                 "\"any\", \"tool\" or \"none\"");
    }

    v = ngx_http_llm_json_member(tc, "disable_parallel_tool_use");

    if (v) {
        if (v->type != NGX_HTTP_LLM_JSON_TRUE
            && v->type != NGX_HTTP_LLM_JSON_FALSE)
        {
            return ngx_http_llm_abad(ctx, "tool_choice."
                                     "disable_parallel_tool_use: must be a "
                                     "boolean");
        }

        ngx_http_llm_printf(&ctx->out, ",\"parallel_tool_calls\":%s",
                            v->type == NGX_HTTP_LLM_JSON_TRUE ? "false"
                                                              : "true");
    }

    return NGX_OK;
}


/*
 * thinking: {"type":"enabled","budget_tokens":N} turns thinking mode on
 * with an effort from the budget (V4 knows three: below 8192 low, below
 * 32768 high, else max); the budget is not a hard cap on reasoning tokens.
 * {"type":"disabled"} turns it off; absent leaves the recipe's default.
 */
static ngx_int_t
ngx_http_llm_athinking(ngx_http_llm_actx_t *ctx, ngx_http_llm_json_t *body,
    int64_t max_tokens)
{
    int64_t               budget;
    const char           *effort;
    ngx_http_llm_json_t  *th, *type, *b;

    th = ngx_http_llm_json_member(body, "thinking");
    if (th == NULL) {
        return NGX_OK;
    }

    type = ngx_http_llm_json_member(th, "type");

    if (ngx_http_llm_json_is_string(type, "disabled")) {
        ngx_http_llm_puts(&ctx->out,
                          ",\"chat_template_kwargs\":{\"thinking\":false}");
        return NGX_OK;
    }

    if (!ngx_http_llm_json_is_string(type, "enabled")) {
        return ngx_http_llm_abad(ctx, "thinking.type: must be \"enabled\" or "
                                 "\"disabled\"");
    }

    b = ngx_http_llm_json_member(th, "budget_tokens");

    if (b == NULL || ngx_http_llm_json_int(b, &budget) != NGX_OK) {
        return ngx_http_llm_abad(ctx, "thinking.budget_tokens: an integer is "
                                 "required");
    }

    if (budget < 1024) {
        return ngx_http_llm_abad(ctx, "thinking.budget_tokens: must be >= "
                                 "1024");
    }

    if (max_tokens && budget >= max_tokens) {
        return ngx_http_llm_abad(ctx, "max_tokens must be greater than "
                                 "thinking.budget_tokens");
    }

    effort = budget < NGX_HTTP_LLM_BUDGET_HIGH ? "low"
             : budget < NGX_HTTP_LLM_BUDGET_MAX ? "high" : "max";

    ngx_http_llm_printf(&ctx->out, ",\"chat_template_kwargs\":"
                        "{\"thinking\":true},\"reasoning_effort\":\"%s\"",
                        effort);

    return NGX_OK;
}


/* copy a member as it is under another name: the chat validator checks it */
static void
ngx_http_llm_acopy(ngx_http_llm_actx_t *ctx, ngx_http_llm_json_t *body,
    const char *from, const char *to)
{
    ngx_http_llm_json_t  *v;

    v = ngx_http_llm_json_member(body, from);

    if (v) {
        ngx_http_llm_printf(&ctx->out, ",\"%s\":", to);
        ngx_http_llm_put_json(&ctx->out, v);
    }
}


ngx_int_t
ngx_http_llm_anthropic_parse(ngx_pool_t *pool, ngx_http_llm_req_t *req,
    u_char *body, size_t len)
{
    int64_t               max;
    ngx_str_t             err, *sv;
    ngx_http_llm_json_t  *root, *v, *s;
    ngx_http_llm_actx_t   ctx;

    ngx_memzero(&ctx, sizeof(ngx_http_llm_actx_t));

    ctx.pool = pool;
    ctx.req = req;
    ctx.count = (req->api == NGX_HTTP_LLM_API_COUNT_TOKENS);

    ngx_http_llm_wbuf_init(&ctx.out, pool);

    root = ngx_http_llm_json_parse(pool, body, len, &err, &req->err_param);

    if (root == NULL) {
        if (err.len == 0) {
            return NGX_ERROR;
        }

        req->status = NGX_HTTP_BAD_REQUEST;
        req->err_message = err;
        return NGX_DECLINED;
    }

    if (root->type != NGX_HTTP_LLM_JSON_OBJECT) {
        return ngx_http_llm_abad(&ctx, "the request body must be a JSON "
                                 "object");
    }

    max = 0;
    v = ngx_http_llm_json_member(root, "max_tokens");

    if (!ctx.count) {
        if (v == NULL) {
            return ngx_http_llm_abad(&ctx, "max_tokens: Field required");
        }

        if (ngx_http_llm_json_int(v, &max) != NGX_OK || max < 1) {
            return ngx_http_llm_abad(&ctx, "max_tokens: must be a positive "
                                     "integer");
        }
    }

    ngx_http_llm_puts(&ctx.out, "{");

    v = ngx_http_llm_json_get(root, "model");

    if (v) {
        ngx_http_llm_puts(&ctx.out, "\"model\":");
        ngx_http_llm_put_json(&ctx.out, v);

    } else {
        ngx_http_llm_puts(&ctx.out, "\"model\":null");
    }

    /* server-side features asked for: refused, never quietly absent */
    if (ngx_http_llm_json_member(root, "mcp_servers")) {
        return ngx_http_llm_abad(&ctx, "mcp_servers: MCP connectors are not "
                                 "supported (this server calls no tools "
                                 "itself: pass them as tools)");
    }

    if (ngx_http_llm_json_member(root, "container")) {
        return ngx_http_llm_abad(&ctx, "container: code execution containers "
                                 "are not supported");
    }

    if (ngx_http_llm_amessages(&ctx, root) != NGX_OK
        || ngx_http_llm_atools(&ctx, root) != NGX_OK
        || ngx_http_llm_athinking(&ctx, root, max) != NGX_OK)
    {
        return req->status ? NGX_DECLINED : NGX_ERROR;
    }

    if (!ctx.count) {
        v = ngx_http_llm_json_member(root, "stop_sequences");

        if (v) {
            if (v->type != NGX_HTTP_LLM_JSON_ARRAY) {
                return ngx_http_llm_abad(&ctx, "stop_sequences: must be an "
                                         "array of strings");
            }

            req->stops = ngx_array_create(pool, v->count + 1,
                                          sizeof(ngx_str_t));
            if (req->stops == NULL) {
                return NGX_ERROR;
            }

            for (s = v->child; s; s = s->next) {
                if (s->type != NGX_HTTP_LLM_JSON_STRING) {
                    return ngx_http_llm_abad(&ctx, "stop_sequences: must be "
                                             "an array of strings");
                }

                /* the engine names the one that matched by its index */
                sv = ngx_array_push(req->stops);
                if (sv == NULL) {
                    return NGX_ERROR;
                }

                *sv = s->value;
            }

            if (v->count) {
                ngx_http_llm_puts(&ctx.out, ",\"stop\":");
                ngx_http_llm_put_json(&ctx.out, v);
            }
        }

        ngx_http_llm_acopy(&ctx, root, "max_tokens", "max_tokens");
        ngx_http_llm_acopy(&ctx, root, "temperature", "temperature");
        ngx_http_llm_acopy(&ctx, root, "top_p", "top_p");
        ngx_http_llm_acopy(&ctx, root, "top_k", "top_k");
        ngx_http_llm_acopy(&ctx, root, "stream", "stream");
    }

    v = ngx_http_llm_json_get(root, "test_script");

    if (req->test_script && v) {
        ngx_http_llm_puts(&ctx.out, ",\"test_script\":");
        ngx_http_llm_put_json(&ctx.out, v);
    }

    ngx_http_llm_puts(&ctx.out, "}");

    if (ctx.out.failed) {
        return NGX_ERROR;
    }

    req->api = ctx.count ? NGX_HTTP_LLM_API_TOKENIZE : NGX_HTTP_LLM_API_CHAT;
    req->anthropic = 1;

    /* its errors name the chat field in their message ("stop ...") */
    return ngx_http_llm_request_parse(pool, req, ctx.out.start,
                                      ngx_http_llm_wbuf_len(&ctx.out));
}


/* ---- responses --------------------------------------------------------- */

static const char *
ngx_http_llm_stop_reason(ngx_http_llm_fmt_t *f)
{
    ngx_str_t              *finish = &f->finish;
    ngx_http_llm_astate_t  *st = f->anthropic;

    if (st->stop) {
        return "stop_sequence";
    }

    if (ngx_http_llm_is(finish, "length")) {
        return "max_tokens";
    }

    if (ngx_http_llm_is(finish, "tool_calls")) {
        return "tool_use";
    }

    return "end_turn";
}


static void
ngx_http_llm_stop_json(ngx_http_llm_astate_t *st, ngx_http_llm_wbuf_t *out)
{
    if (st->stop) {
        ngx_http_llm_put_string(out, st->stop->data, st->stop->len);

    } else {
        ngx_http_llm_puts(out, "null");
    }
}


static void
ngx_http_llm_sse(ngx_http_llm_wbuf_t *out, const char *event)
{
    ngx_http_llm_printf(out, "event: %s\ndata: {\"type\":\"%s\"", event,
                        event);
}


/* Anthropic counts prompt tokens read from the cache apart: input_tokens
 * are the others (input + cache_read = the whole prompt). */
static void
ngx_http_llm_usage_json(ngx_http_llm_fmt_t *f, ngx_http_llm_wbuf_t *out)
{
    uint64_t  cached;

    cached = f->cached < f->prompt ? f->cached : f->prompt;

    ngx_http_llm_printf(out, "\"usage\":{\"input_tokens\":%uL,"
                        "\"output_tokens\":%uL,"
                        "\"cache_read_input_tokens\":%uL,"
                        "\"cache_creation_input_tokens\":0}",
                        f->prompt - cached, f->completion, cached);
}


static void
ngx_http_llm_message_head(ngx_http_llm_fmt_t *f, ngx_http_llm_wbuf_t *out)
{
    ngx_http_llm_printf(out, "{\"id\":\"msg_%V\",\"type\":\"message\","
                        "\"role\":\"assistant\",\"model\":", &f->req->id);
    ngx_http_llm_put_string(out, f->req->model.data, f->req->model.len);
}


void
ngx_http_llm_anthropic_begin(ngx_http_llm_fmt_t *f, ngx_http_llm_wbuf_t *out)
{
    ngx_http_llm_astate_t  *st;

    if (f->started) {
        return;
    }

    f->started = 1;

    st = ngx_pcalloc(f->pool, sizeof(ngx_http_llm_astate_t));
    if (st == NULL
        || ngx_array_init(&st->blocks, f->pool, 4,
                          sizeof(ngx_http_llm_item_t))
           != NGX_OK)
    {
        f->failed = 1;
        return;
    }

    f->anthropic = st;

    if (!f->req->stream) {
        return;
    }

    /* the engine told the prompt's size before its first token */
    ngx_http_llm_sse(out, "message_start");
    ngx_http_llm_puts(out, ",\"message\":");
    ngx_http_llm_message_head(f, out);
    ngx_http_llm_puts(out, ",\"content\":[],\"stop_reason\":null,"
                      "\"stop_sequence\":null,");
    ngx_http_llm_usage_json(f, out);
    ngx_http_llm_puts(out, "}}\n\n");
    ngx_http_llm_puts(out, "event: ping\ndata: {\"type\":\"ping\"}\n\n");
}


static void
ngx_http_llm_block_close(ngx_http_llm_fmt_t *f, ngx_http_llm_wbuf_t *out)
{
    ngx_http_llm_astate_t  *st = f->anthropic;

    if (st->open == NULL) {
        return;
    }

    if (f->req->stream) {
        ngx_http_llm_sse(out, "content_block_stop");
        ngx_http_llm_printf(out, ",\"index\":%ui}\n\n", st->index - 1);
    }

    st->open->done = 1;
    st->open = NULL;
}


static ngx_http_llm_item_t *
ngx_http_llm_block_open(ngx_http_llm_fmt_t *f, ngx_http_llm_item_kind_e kind,
    ngx_http_llm_event_t *ev, ngx_http_llm_wbuf_t *out)
{
    ngx_http_llm_item_t    *it;
    ngx_http_llm_astate_t  *st = f->anthropic;

    if (st->open && st->open->kind == kind
        && (kind != NGX_HTTP_LLM_ITEM_TOOL || st->open->index == ev->index))
    {
        return st->open;
    }

    ngx_http_llm_block_close(f, out);

    it = ngx_http_llm_item_push(f, &st->blocks, kind, ev);
    if (it == NULL) {
        return NULL;
    }

    st->open = it;
    st->index++;

    if (!f->req->stream) {
        return it;
    }

    ngx_http_llm_sse(out, "content_block_start");
    ngx_http_llm_printf(out, ",\"index\":%ui,\"content_block\":",
                        st->index - 1);

    switch (kind) {

    case NGX_HTTP_LLM_ITEM_REASONING:
        ngx_http_llm_puts(out, "{\"type\":\"thinking\",\"thinking\":\"\","
                          "\"signature\":\"\"}}\n\n");
        break;

    case NGX_HTTP_LLM_ITEM_MESSAGE:
        ngx_http_llm_puts(out, "{\"type\":\"text\",\"text\":\"\"}}\n\n");
        break;

    default:
        ngx_http_llm_puts(out, "{\"type\":\"tool_use\",\"id\":");
        ngx_http_llm_put_string(out, it->id.data, it->id.len);
        ngx_http_llm_puts(out, ",\"name\":");
        ngx_http_llm_put_string(out, it->name.data, it->name.len);
        ngx_http_llm_puts(out, ",\"input\":{}}}\n\n");
        break;
    }

    return it;
}


static void
ngx_http_llm_block_delta(ngx_http_llm_fmt_t *f, ngx_http_llm_item_t *it,
    ngx_str_t *text, ngx_http_llm_wbuf_t *out)
{
    ngx_http_llm_astate_t  *st = f->anthropic;

    static const char  *deltas[] = {
        NULL,
        "\"thinking_delta\",\"thinking\":",      /* ITEM_REASONING */
        "\"text_delta\",\"text\":",              /* ITEM_MESSAGE */
        "\"input_json_delta\",\"partial_json\":" /* ITEM_TOOL */
    };

    if (text->len == 0) {
        return;
    }

    if (!f->req->stream) {
        ngx_http_llm_put(&it->text, text->data, text->len);

        if (it->text.failed) {
            f->failed = 1;
        }

        return;
    }

    ngx_http_llm_sse(out, "content_block_delta");
    ngx_http_llm_printf(out, ",\"index\":%ui,\"delta\":{\"type\":%s",
                        st->index - 1, deltas[it->kind]);
    ngx_http_llm_put_string(out, text->data, text->len);
    ngx_http_llm_puts(out, "}}\n\n");
}


void
ngx_http_llm_anthropic_event(ngx_http_llm_fmt_t *f, ngx_http_llm_event_t *ev,
    ngx_http_llm_wbuf_t *out)
{
    ngx_http_llm_item_t    *it;
    ngx_http_llm_astate_t  *st;

    ngx_http_llm_anthropic_begin(f, out);

    st = f->anthropic;
    if (st == NULL) {
        return;
    }

    switch (ev->type) {

    case LLM_EV_REASONING_DELTA:
    case LLM_EV_CONTENT_DELTA:
        if (ev->text.len == 0) {
            break;
        }

        it = ngx_http_llm_block_open(f, ev->type == LLM_EV_REASONING_DELTA
                                        ? NGX_HTTP_LLM_ITEM_REASONING
                                        : NGX_HTTP_LLM_ITEM_MESSAGE,
                                     ev, out);
        if (it) {
            ngx_http_llm_block_delta(f, it, &ev->text, out);
        }

        break;

    case LLM_EV_TOOL_CALL_BEGIN:
        ngx_http_llm_block_close(f, out);    /* a call is a block of its own */
        ngx_http_llm_block_open(f, NGX_HTTP_LLM_ITEM_TOOL, ev, out);
        break;

    case LLM_EV_TOOL_CALL_ARGS:
        it = st->open;

        if (it && it->kind == NGX_HTTP_LLM_ITEM_TOOL
            && it->index == ev->index)
        {
            ngx_http_llm_block_delta(f, it, &ev->text, out);
        }

        break;

    case LLM_EV_TOOL_CALL_END:
        ngx_http_llm_block_close(f, out);
        break;

    case LLM_EV_FINISH:
        f->finish.data = ngx_pstrdup(f->pool, &ev->name);
        f->finish.len = ev->name.len;

        if (f->finish.data == NULL && ev->name.len) {
            f->failed = 1;
        }

        if (ev->index && f->req->stops && ev->index <= f->req->stops->nelts) {
            st->stop = (ngx_str_t *) f->req->stops->elts + ev->index - 1;
        }

        break;

    case LLM_EV_USAGE:
        f->usage = 1;
        f->prompt = ev->prompt;
        f->completion = ev->completion;
        f->reasoning = ev->reasoning;
        f->cached = ev->cached;
        break;

    case LLM_EV_TOKENS:
        ngx_http_llm_put(&f->tokens, ev->tokens,
                         ev->ntokens * sizeof(uint32_t));

        if (f->tokens.failed) {
            f->failed = 1;
        }

        break;

    default: /* no log probabilities in this API */
        break;
    }
}


/* a tool_use block's input: the arguments as they are when they are a JSON
   object (the engine's parser writes one), else the text as a string */
static void
ngx_http_llm_tool_input(ngx_http_llm_fmt_t *f, ngx_http_llm_item_t *it,
    ngx_http_llm_wbuf_t *out)
{
    size_t                len;
    ngx_str_t             err, param;
    ngx_http_llm_json_t  *v;

    len = ngx_http_llm_wbuf_len(&it->text);

    if (len == 0) {
        ngx_http_llm_puts(out, "{}");
        return;
    }

    v = ngx_http_llm_json_parse(f->pool, it->text.start, len, &err, &param);

    if (v && v->type == NGX_HTTP_LLM_JSON_OBJECT) {
        ngx_http_llm_put(out, it->text.start, len);
        return;
    }

    ngx_http_llm_put_string(out, it->text.start, len);
}


void
ngx_http_llm_anthropic_end(ngx_http_llm_fmt_t *f, ngx_http_llm_wbuf_t *out)
{
    uint64_t                n;
    ngx_uint_t              i;
    ngx_http_llm_item_t    *it;
    ngx_http_llm_astate_t  *st;

    ngx_http_llm_anthropic_begin(f, out);

    st = f->anthropic;
    f->finished = 1;

    if (st == NULL) {
        return;
    }

    if (f->req->api == NGX_HTTP_LLM_API_TOKENIZE) {
        n = ngx_http_llm_wbuf_len(&f->tokens) / sizeof(uint32_t);
        ngx_http_llm_printf(out, "{\"input_tokens\":%uL}", n);
        return;
    }

    ngx_http_llm_block_close(f, out);

    if (f->req->stream) {
        ngx_http_llm_sse(out, "message_delta");
        ngx_http_llm_printf(out, ",\"delta\":{\"stop_reason\":\"%s\","
                            "\"stop_sequence\":",
                            ngx_http_llm_stop_reason(f));
        ngx_http_llm_stop_json(st, out);
        ngx_http_llm_puts(out, "},");
        ngx_http_llm_usage_json(f, out);
        ngx_http_llm_puts(out, "}\n\n");
        ngx_http_llm_puts(out, "event: message_stop\n"
                               "data: {\"type\":\"message_stop\"}\n\n");
        return;
    }

    ngx_http_llm_message_head(f, out);
    ngx_http_llm_puts(out, ",\"content\":[");

    it = st->blocks.elts;

    for (i = 0; i < st->blocks.nelts; i++) {
        if (i) {
            ngx_http_llm_puts(out, ",");
        }

        switch (it[i].kind) {

        case NGX_HTTP_LLM_ITEM_REASONING:
            ngx_http_llm_puts(out, "{\"type\":\"thinking\",\"thinking\":");
            ngx_http_llm_put_string(out, it[i].text.start,
                                    ngx_http_llm_wbuf_len(&it[i].text));
            ngx_http_llm_puts(out, ",\"signature\":\"\"}");
            break;

        case NGX_HTTP_LLM_ITEM_MESSAGE:
            ngx_http_llm_puts(out, "{\"type\":\"text\",\"text\":");
            ngx_http_llm_put_string(out, it[i].text.start,
                                    ngx_http_llm_wbuf_len(&it[i].text));
            ngx_http_llm_puts(out, "}");
            break;

        default:
            ngx_http_llm_puts(out, "{\"type\":\"tool_use\",\"id\":");
            ngx_http_llm_put_string(out, it[i].id.data, it[i].id.len);
            ngx_http_llm_puts(out, ",\"name\":");
            ngx_http_llm_put_string(out, it[i].name.data, it[i].name.len);
            ngx_http_llm_puts(out, ",\"input\":");
            ngx_http_llm_tool_input(f, &it[i], out);
            ngx_http_llm_puts(out, "}");
            break;
        }
    }

    ngx_http_llm_printf(out, "],\"stop_reason\":\"%s\",\"stop_sequence\":",
                        ngx_http_llm_stop_reason(f));
    ngx_http_llm_stop_json(st, out);
    ngx_http_llm_puts(out, ",");
    ngx_http_llm_usage_json(f, out);
    ngx_http_llm_puts(out, "}");
}


void
ngx_http_llm_anthropic_fail(ngx_http_llm_fmt_t *f, ngx_str_t *code,
    ngx_str_t *message, ngx_http_llm_wbuf_t *out)
{
    f->finished = 1;

    ngx_http_llm_puts(out, "event: error\ndata: ");
    ngx_http_llm_anthropic_error_body(out, NGX_HTTP_INTERNAL_SERVER_ERROR,
                                      message);
    ngx_http_llm_puts(out, "\n\n");
}
