#include "constraint.h"

#include <stdio.h>
#include <string.h>

#include "json.h"
#include "strbuf.h"

int constraint_from_request(yajl_val req, const token_trie *trie, grammar **out,
                            schema_error *err)
{
    *out = NULL;
    err->path[0] = err->message[0] = 0;
    yajl_val tc = json_get(req, "tool_choice"), rf = json_get(req, "response_format");
    const char *mode = json_string(tc);
    const char *name = json_string(json_get(json_get(tc, "function"), "name"));
    bool parallel = true;
    json_bool(json_get(req, "parallel_tool_calls"), &parallel);
    const char *type = json_string(json_get(rf, "type"));
    bool tools = (mode && !strcmp(mode, "required")) || name;
    if (!tools && (!type || !strcmp(type, "text"))) return 0;

    grammar *g = grammar_new();
    int start;
    if (tools) {
        start = dsml_tools_rule(g, json_get(req, "tools"), name, name ? false : parallel,
                                "tools", err);
    } else if (!strcmp(type, "json_object")) {
        start = json_object_rule(g);
    } else if (!strcmp(type, "json_schema")) {
        yajl_val schema = json_get(json_get(rf, "json_schema"), "schema");
        start = schema ? json_schema_rule(g, schema, "response_format.json_schema.schema", err)
                       : json_object_rule(g);
    } else {
        snprintf(err->path, sizeof err->path, "response_format.type");
        snprintf(err->message, sizeof err->message,
                 "response_format.type: unknown type '%.40s'", type);
        start = -1;
    }
    char why[200];
    if (start >= 0 && grammar_finish(g, start, trie ? token_trie_lit_cost : NULL,
                                    (void *)trie, why, sizeof why)) {
        snprintf(err->path, sizeof err->path, tools ? "tools" : "response_format");
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
    yajl_val tc = json_get(req, "tool_choice"), rf = json_get(req, "response_format");
    const char *mode = json_string(tc), *type = json_string(json_get(rf, "type"));
    bool tools = (mode && !strcmp(mode, "required"))
                 || json_string(json_get(json_get(tc, "function"), "name"));
    if (!tools && (!type || !strcmp(type, "text"))) return NULL;
    strbuf sb;
    sb_init(&sb);
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        yajl_val v = json_get(req, fields[i]);
        if (i) sb_putc(&sb, '\n');
        if (v) json_dump(&sb, v, JSON_COMPACT);
    }
    return sb_steal(&sb);
}
