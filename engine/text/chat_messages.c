/* Encoder-style messages from JSON, validated: every problem is reported
 * with the path of the field at fault.  The rules follow what DeepSeek's
 * encoder accepts; where it would crash or print Python's "None", we refuse
 * or use the empty string instead (docs/CHAT_FORMAT_NOTES.md). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_render.h"
#include "json.h"
#include "utf8.h"

void chat_fail(chat_error *err, const char *param, const char *fmt, ...)
{
    char text[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    snprintf(err->param, sizeof err->param, "%s", param);
    snprintf(err->message, sizeof err->message, "%s: %s", param, text);
}

const char *chat_quote(char buf[64], const char *s)
{
    size_t n = 0, i = 0;
    while (s[i] && n < 40) {
        int r = utf8_seq((const unsigned char *)s + i, strlen(s + i));
        if (r <= 0) r = 1;
        if (n + (size_t)r > 40) break;
        for (int k = 0; k < r; k++, i++)
            buf[n++] = (unsigned char)s[i] < 0x20 ? '?' : s[i];
    }
    if (s[i]) { memcpy(buf + n, "...", 3); n += 3; }
    buf[n] = 0;
    return buf;
}

static const struct { const char *name; enum chat_role role; } roles[] = {
    { "system", CHAT_SYSTEM }, { "user", CHAT_USER },
    { "assistant", CHAT_ASSISTANT }, { "tool", CHAT_TOOL },
    { "developer", CHAT_DEVELOPER }, { "latest_reminder", CHAT_LATEST_REMINDER },
};

static const char *const task_names[] = {
    [CHAT_TASK_ACTION] = "action", [CHAT_TASK_QUERY] = "query",
    [CHAT_TASK_AUTHORITY] = "authority", [CHAT_TASK_DOMAIN] = "domain",
    [CHAT_TASK_TITLE] = "title", [CHAT_TASK_READ_URL] = "read_url",
};

static bool is_null(yajl_val v) { return !v || YAJL_IS_NULL(v); }

static char *xstrdup(const char *s)
{
    char *d = strdup(s);
    if (!d) abort();
    return d;
}

/* A message's text: a string, or an array of {"type": "text", "text": ...}
 * parts joined by "\n\n" (each part is a block of the turn).  Absent or
 * null gives "". */
static char *load_text(yajl_val v, const char *path, chat_error *err)
{
    char p[160];
    if (is_null(v)) return xstrdup("");
    if (YAJL_IS_STRING(v)) {
        if (strlen(v->u.string) > CHAT_MAX_PROMPT_BYTES) {
            chat_fail(err, path, "%zu bytes, over the limit of %zu",
                      strlen(v->u.string), CHAT_MAX_PROMPT_BYTES);
            return NULL;
        }
        return xstrdup(v->u.string);
    }
    if (!YAJL_IS_ARRAY(v)) {
        chat_fail(err, path, "expected a string or an array of text parts");
        return NULL;
    }
    strbuf sb;
    sb_init(&sb);
    for (size_t j = 0; j < v->u.array.len; j++) {
        yajl_val part = v->u.array.values[j];
        const char *type = json_string(json_get(part, "type"));
        const char *text = json_string(json_get(part, "text"));
        char q[64];
        if (!YAJL_IS_OBJECT(part)) {
            snprintf(p, sizeof p, "%s[%zu]", path, j);
            chat_fail(err, p, "expected a content part object");
        } else if (!type || strcmp(type, "text")) {
            snprintf(p, sizeof p, "%s[%zu].type", path, j);
            if (type) chat_fail(err, p, "unsupported content part type '%s' (text only)",
                                chat_quote(q, type));
            else chat_fail(err, p, "expected the string \"text\"");
        } else if (!text) {
            snprintf(p, sizeof p, "%s[%zu].text", path, j);
            chat_fail(err, p, "expected a string");
        } else {
            if (j) sb_puts(&sb, "\n\n");
            sb_puts(&sb, text);
            if (sb.len <= CHAT_MAX_PROMPT_BYTES) continue;
            chat_fail(err, path, "over the limit of %zu bytes", CHAT_MAX_PROMPT_BYTES);
        }
        sb_free(&sb);
        return NULL;
    }
    return sb_steal(&sb);
}

/* An optional string field: NULL when absent or null. */
static bool load_opt_string(yajl_val v, const char *path, char **out, chat_error *err)
{
    *out = NULL;
    if (is_null(v)) return true;
    if (!YAJL_IS_STRING(v)) {
        chat_fail(err, path, "expected a string");
        return false;
    }
    *out = xstrdup(v->u.string);
    return true;
}

static void keep_tree(chat_conversation *c, yajl_val t)
{
    if (c->n_trees == c->cap_trees) {
        c->cap_trees = c->cap_trees ? 2 * c->cap_trees : 8;
        c->trees = realloc(c->trees, c->cap_trees * sizeof *c->trees);
        if (!c->trees) abort();
    }
    c->trees[c->n_trees++] = t;
}

/* Tool call arguments: a JSON object, or a string holding one (OpenAI's
 * form; "" is taken as {}). */
static bool load_arguments(chat_conversation *c, yajl_val v, const char *path,
                           yajl_val *out, chat_error *err)
{
    if (v && YAJL_IS_OBJECT(v)) { *out = v; return true; }
    if (!v || !YAJL_IS_STRING(v)) {
        chat_fail(err, path, "expected a JSON object in a string");
        return false;
    }
    const char *s = v->u.string;
    char perr[160];
    yajl_val t = json_parse(*s ? s : "{}", *s ? strlen(s) : 2, perr, sizeof perr);
    if (!t) {
        chat_fail(err, path, "not valid JSON: %s", perr);
        return false;
    }
    keep_tree(c, t);
    if (!YAJL_IS_OBJECT(t)) {
        chat_fail(err, path, "expected a JSON object, got %s",
                  YAJL_IS_ARRAY(t) ? "an array" : "a scalar");
        return false;
    }
    *out = t;
    return true;
}

static bool load_tool_calls(chat_conversation *c, chat_message *m, yajl_val v,
                            const char *path, chat_error *err)
{
    char p[200];
    if (is_null(v)) return true;
    if (!YAJL_IS_ARRAY(v)) {
        chat_fail(err, path, "expected an array");
        return false;
    }
    m->n_calls = v->u.array.len;
    m->calls = calloc(m->n_calls ? m->n_calls : 1, sizeof *m->calls);
    if (!m->calls) abort();
    for (size_t j = 0; j < m->n_calls; j++) {
        yajl_val tc = v->u.array.values[j];
        chat_tool_call *call = &m->calls[j];
        yajl_val fn = json_get(tc, "function");
        if (!YAJL_IS_OBJECT(tc)) {
            snprintf(p, sizeof p, "%s[%zu]", path, j);
            chat_fail(err, p, "expected an object");
            return false;
        }
        if (!fn || !YAJL_IS_OBJECT(fn)) {
            snprintf(p, sizeof p, "%s[%zu].function", path, j);
            chat_fail(err, p, "expected an object with name and arguments");
            return false;
        }
        /* The encoder takes the id from the call, else from its function. */
        yajl_val id = json_get(tc, "id");
        snprintf(p, sizeof p, "%s[%zu].id", path, j);
        if (is_null(id)) { id = json_get(fn, "id"); snprintf(p, sizeof p, "%s[%zu].function.id", path, j); }
        if (!load_opt_string(id, p, &call->id, err)) return false;
        const char *name = json_string(json_get(fn, "name"));
        snprintf(p, sizeof p, "%s[%zu].function.name", path, j);
        if (!name) {
            chat_fail(err, p, "expected a string");
            return false;
        }
        call->name = xstrdup(name);
        snprintf(p, sizeof p, "%s[%zu].function.arguments", path, j);
        if (!load_arguments(c, json_get(fn, "arguments"), p, &call->args, err))
            return false;
    }
    return true;
}

bool chat_tools_valid(yajl_val v, const char *path, chat_error *err)
{
    char p[200], q[64];
    if (is_null(v)) return true;
    if (!YAJL_IS_ARRAY(v)) {
        chat_fail(err, path, "expected an array of tools");
        return false;
    }
    for (size_t j = 0; j < v->u.array.len; j++) {
        yajl_val t = v->u.array.values[j];
        yajl_val type = json_get(t, "type");
        yajl_val fn = json_get(t, "function");
        if (!YAJL_IS_OBJECT(t)) {
            snprintf(p, sizeof p, "%s[%zu]", path, j);
            chat_fail(err, p, "expected an object");
        } else if (!is_null(type) && (!json_string(type) || strcmp(json_string(type), "function"))) {
            snprintf(p, sizeof p, "%s[%zu].type", path, j);
            chat_fail(err, p, "only function tools are supported, not %s",
                      json_string(type) ? chat_quote(q, json_string(type)) : "a non-string");
        } else if (!fn || !YAJL_IS_OBJECT(fn)) {
            snprintf(p, sizeof p, "%s[%zu].function", path, j);
            chat_fail(err, p, "expected an object");
        } else if (!json_string(json_get(fn, "name"))) {
            snprintf(p, sizeof p, "%s[%zu].function.name", path, j);
            chat_fail(err, p, "expected a string");
        } else {
            continue;
        }
        return false;
    }
    return true;
}

static bool load_message(chat_conversation *c, chat_message *m, yajl_val v,
                         size_t i, chat_error *err)
{
    char path[64], p[96], q[64];
    snprintf(path, sizeof path, "messages[%zu]", i);
    if (!YAJL_IS_OBJECT(v)) {
        chat_fail(err, path, "expected a message object");
        return false;
    }
    yajl_val role = json_get(v, "role");
    snprintf(p, sizeof p, "%s.role", path);
    if (is_null(role)) {
        chat_fail(err, p, "missing");
        return false;
    }
    if (!YAJL_IS_STRING(role)) {
        chat_fail(err, p, "expected a string");
        return false;
    }
    size_t r = 0;
    while (r < sizeof roles / sizeof roles[0] && strcmp(roles[r].name, role->u.string)) r++;
    if (r == sizeof roles / sizeof roles[0]) {
        chat_fail(err, p, "unknown role '%s'", chat_quote(q, role->u.string));
        return false;
    }
    m->role = roles[r].role;

    yajl_val content = json_get(v, "content");
    snprintf(p, sizeof p, "%s.content", path);
    if (!(m->content = load_text(content, p, err))) return false;
    if (m->role == CHAT_DEVELOPER && !*m->content) {
        chat_fail(err, p, "a developer message needs content");
        return false;
    }
    if (m->role == CHAT_LATEST_REMINDER && is_null(content)) {
        chat_fail(err, p, "a latest_reminder message needs content");
        return false;
    }

    if (m->role == CHAT_ASSISTANT) {
        /* reasoning_content (OpenAI/DeepSeek API), or vLLM's reasoning. */
        yajl_val rc = json_get(v, "reasoning_content");
        snprintf(p, sizeof p, "%s.reasoning_content", path);
        if (is_null(rc)) {
            rc = json_get(v, "reasoning");
            snprintf(p, sizeof p, "%s.reasoning", path);
        }
        if (!load_opt_string(rc, p, &m->reasoning, err)) return false;
        snprintf(p, sizeof p, "%s.tool_calls", path);
        if (!load_tool_calls(c, m, json_get(v, "tool_calls"), p, err)) return false;
        yajl_val wo = json_get(v, "wo_eos");
        snprintf(p, sizeof p, "%s.wo_eos", path);
        if (!is_null(wo) && !json_bool(wo, &m->wo_eos)) {
            chat_fail(err, p, "expected a boolean");
            return false;
        }
    }
    if (m->role == CHAT_TOOL) {
        snprintf(p, sizeof p, "%s.tool_call_id", path);
        if (!load_opt_string(json_get(v, "tool_call_id"), p, &m->tool_call_id, err))
            return false;
    }

    yajl_val tools = json_get(v, "tools");
    snprintf(p, sizeof p, "%s.tools", path);
    if (!chat_tools_valid(tools, p, err)) return false;
    if (!is_null(tools)) m->tools = tools;
    yajl_val rf = json_get(v, "response_format");
    snprintf(p, sizeof p, "%s.response_format", path);
    if (!is_null(rf)) {
        if (!YAJL_IS_OBJECT(rf)) {
            chat_fail(err, p, "expected an object");
            return false;
        }
        m->response_format = rf;
    }
    yajl_val task = json_get(v, "task");
    snprintf(p, sizeof p, "%s.task", path);
    if (!is_null(task)) {
        const char *t = json_string(task);
        if (!t) {
            chat_fail(err, p, "expected a string");
            return false;
        }
        for (int k = CHAT_TASK_ACTION; k <= CHAT_TASK_READ_URL; k++)
            if (!strcmp(t, task_names[k])) m->task = (enum chat_task)k;
        if (m->task == CHAT_TASK_NONE) {
            chat_fail(err, p, "unknown task '%s'", chat_quote(q, t));
            return false;
        }
    }
    return true;
}

/* A tool result must answer a call of the latest assistant message with
 * tool calls; one without tool_call_id keeps its place, as in the encoder. */
static bool check_tool_answers(const chat_conversation *c, chat_error *err)
{
    const chat_message *calls = NULL;
    char p[96], q[64];
    for (size_t i = 0; i < c->n; i++) {
        const chat_message *m = &c->msgs[i];
        if (m->role == CHAT_ASSISTANT && m->n_calls) calls = m;
        if (m->role != CHAT_TOOL || !m->tool_call_id) continue;
        snprintf(p, sizeof p, "messages[%zu].tool_call_id", i);
        if (!calls) {
            chat_fail(err, p, "'%s' answers no tool call: no assistant message "
                      "with tool_calls comes before it", chat_quote(q, m->tool_call_id));
            return false;
        }
        size_t k = 0;
        while (k < calls->n_calls && !(calls->calls[k].id
                                       && !strcmp(calls->calls[k].id, m->tool_call_id)))
            k++;
        if (k == calls->n_calls) {
            chat_fail(err, p, "no tool call with id '%s' in the preceding assistant "
                      "message (messages[%zu])", chat_quote(q, m->tool_call_id),
                      (size_t)(calls - c->msgs));
            return false;
        }
    }
    return true;
}

chat_message *chat_conversation_insert(chat_conversation *c, size_t at,
                                       enum chat_role role)
{
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 8;
        c->msgs = realloc(c->msgs, c->cap * sizeof *c->msgs);
        if (!c->msgs) abort();
    }
    memmove(c->msgs + at + 1, c->msgs + at, (c->n - at) * sizeof *c->msgs);
    c->n++;
    chat_message *m = &c->msgs[at];
    memset(m, 0, sizeof *m);
    m->role = role;
    m->content = xstrdup("");
    return m;
}

int chat_conversation_from_json(chat_conversation *c, yajl_val messages,
                                chat_error *err)
{
    memset(c, 0, sizeof *c);
    if (!messages || !YAJL_IS_ARRAY(messages)) {
        chat_fail(err, "messages", "expected an array of messages");
        return -1;
    }
    for (size_t i = 0; i < messages->u.array.len; i++) {
        chat_message *m = chat_conversation_insert(c, c->n, CHAT_USER);
        free(m->content);
        m->content = NULL;
        if (!load_message(c, m, messages->u.array.values[i], i, err)) {
            chat_conversation_free(c);
            return -1;
        }
    }
    if (!check_tool_answers(c, err)) {
        chat_conversation_free(c);
        return -1;
    }
    return 0;
}

void chat_conversation_free(chat_conversation *c)
{
    for (size_t i = 0; i < c->n; i++) {
        chat_message *m = &c->msgs[i];
        free(m->content);
        free(m->reasoning);
        free(m->tool_call_id);
        for (size_t j = 0; j < m->n_calls; j++) {
            free(m->calls[j].id);
            free(m->calls[j].name);
        }
        free(m->calls);
    }
    free(c->msgs);
    for (size_t i = 0; i < c->n_trees; i++) yajl_tree_free(c->trees[i]);
    free(c->trees);
    memset(c, 0, sizeof *c);
}
