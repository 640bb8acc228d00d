#include "constraint.h"

#include <stdio.h>
#include <string.h>

#include "json.h"
#include "strbuf.h"

/* What the request constrains. */
enum what { C_NONE, C_CALLS, C_JSON, C_JSON_OR_CALLS, C_TEXT_ONE_CALL };

static enum what decide(yajl_val req, const char **name, bool *parallel)
{
    yajl_val tc = json_get(req, "tool_choice"), rf = json_get(req, "response_format");
    const char *mode = json_string(tc), *type = json_string(json_get(rf, "type"));
    *name = json_string(json_get(json_get(tc, "function"), "name"));
    *parallel = true;
    json_bool(json_get(req, "parallel_tool_calls"), parallel);
    bool tools = json_len(json_get(req, "tools")) > 0 && !(mode && !strcmp(mode, "none"));
    if (tools && (*name || (mode && !strcmp(mode, "required")))) return C_CALLS;
    if (type && strcmp(type, "text")) return tools ? C_JSON_OR_CALLS : C_JSON;
    if (tools && !*parallel) return C_TEXT_ONE_CALL;
    return C_NONE;
}

static int json_rule(grammar *g, yajl_val rf, schema_error *err)
{
    const char *type = json_string(json_get(rf, "type"));
    if (!strcmp(type, "json_object")) return json_object_rule(g);
    if (!strcmp(type, "json_schema")) {
        yajl_val schema = json_get(json_get(rf, "json_schema"), "schema");
        return schema ? json_schema_rule(g, schema, "response_format.json_schema.schema", err)
                      : json_object_rule(g);
    }
    snprintf(err->path, sizeof err->path, "response_format.type");
    snprintf(err->message, sizeof err->message,
             "response_format.type: unknown type '%.40s'", type);
    return -1;
}

int constraint_from_request(yajl_val req, const token_trie *trie, grammar **out,
                            schema_error *err)
{
    *out = NULL;
    err->path[0] = err->message[0] = 0;
    const char *name;
    bool parallel;
    enum what w = decide(req, &name, &parallel);
    if (w == C_NONE) return 0;
    yajl_val tools = json_get(req, "tools"), rf = json_get(req, "response_format");
    grammar *g = grammar_new();
    int start = -1, json = -1, calls = -1;
    switch (w) {
    case C_CALLS:
        start = dsml_tools_rule(g, tools, name, name ? false : parallel, true, "tools", err);
        break;
    case C_JSON:
        start = json_rule(g, rf, err);
        break;
    case C_JSON_OR_CALLS:   /* tool_choice auto: the JSON answer or calls */
        json = json_rule(g, rf, err);
        calls = json < 0 ? -1 : dsml_tools_rule(g, tools, NULL, parallel, true, "tools", err);
        if (calls >= 0) {
            galt a = { 0 };
            start = grammar_rule(g);
            galt_ref(&a, json);
            grammar_add_alt(g, start, &a);
            galt_ref(&a, calls);
            grammar_add_alt(g, start, &a);
            galt_free(&a);
        }
        break;
    case C_TEXT_ONE_CALL:
        calls = dsml_tools_rule(g, tools, NULL, false, false, "tools", err);
        start = calls < 0 ? -1 : dsml_text_then_block_rule(g, calls);
        break;
    case C_NONE:
        break;
    }
    char why[200];
    if (start >= 0 && grammar_finish(g, start, trie ? token_trie_lit_cost : NULL,
                                    (void *)trie, why, sizeof why)) {
        snprintf(err->path, sizeof err->path, w == C_JSON ? "response_format" : "tools");
        snprintf(err->message, sizeof err->message, "%s: the schema admits no finite value (%s)",
                 err->path, why);
        start = -1;
    }
    if (start < 0) {
        grammar_free(g);
        return -1;
    }
    *out = g;
    return 0;
}

char *constraint_key(yajl_val req)
{
    static const char *const fields[] = {
        "tool_choice", "parallel_tool_calls", "response_format", "tools",
    };
    const char *name;
    bool parallel;
    if (decide(req, &name, &parallel) == C_NONE) return NULL;
    strbuf sb;
    sb_init(&sb);
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        yajl_val v = json_get(req, fields[i]);
        if (i) sb_putc(&sb, '\n');
        if (v) json_dump(&sb, v, JSON_COMPACT);
    }
    return sb_steal(&sb);
}
