/* llm-qualify's small parts: the SSE parser (events split at every byte,
 * CRLF, comments, multi-line data, a partial event at the end), the
 * JSON-schema subset validator (each keyword, with the path it names),
 * the JSON writer (output parses back) and the prompt fingerprint
 * (SHA-256 of the ids as little-endian uint32). */
#include <string.h>

#include "fingerprint.h"
#include "json.h"
#include "jsonw.h"
#include "schema.h"
#include "sha256.h"
#include "sse.h"
#include "tap.h"
#include "tokenize.h"

typedef struct {
    strbuf log;   /* "event|data\n" per event */
    int    n;
} events;

static int on_event(void *user, const char *event, const char *data, size_t len)
{
    events *e = user;
    sb_printf(&e->log, "%s|%.*s\n", event, (int)len, data);
    e->n++;
    return 0;
}

static const char stream[] =
    ": a comment\r\n"
    "data: {\"a\":1}\r\n\r\n"
    "event: response.created\n"
    "data: {\"type\":\"response.created\"}\n\n"
    "data: line one\n"
    "data: line two\n\n"
    "data:no-space\n\n"
    "id: 7\nretry: 10\n\n"            /* no data: no event */
    "data: [DONE]\n\n"
    "data: partial";

static const char expect[] =
    "|{\"a\":1}\n"
    "response.created|{\"type\":\"response.created\"}\n"
    "|line one\nline two\n"
    "|no-space\n"
    "|[DONE]\n";

static void sse_tests(void)
{
    size_t n = strlen(stream);
    int all_split_ok = 1, partial_ok = 1;
    /* Feed in two pieces split at every position, then byte by byte. */
    for (size_t cut = 0; cut <= n; cut++) {
        events e = { { 0 }, 0 };
        sb_init(&e.log);
        sse_parser p;
        sse_init(&p, on_event, &e);
        sse_feed(&p, stream, cut);
        sse_feed(&p, stream + cut, n - cut);
        if (!e.log.data || strcmp(e.log.data, expect)) all_split_ok = 0;
        if (!sse_finish(&p)) partial_ok = 0;
        sse_free(&p);
        sb_free(&e.log);
    }
    ok(all_split_ok, "SSE: the same 5 events whichever byte the stream is split at");
    ok(partial_ok, "SSE: a trailing event without its blank line is reported as partial");
    events e = { { 0 }, 0 };
    sb_init(&e.log);
    sse_parser p;
    sse_init(&p, on_event, &e);
    for (size_t i = 0; i < n; i++) sse_feed(&p, stream + i, 1);
    is_str(e.log.data, expect, "SSE: byte-by-byte feeding gives the same events");
    sse_free(&p);
    sb_free(&e.log);
}

static yajl_val parse(const char *s)
{
    char err[128];
    yajl_val v = json_parse(s, strlen(s), err, sizeof err);
    if (!v) diag("bad test JSON %s: %s", s, err);
    return v;
}

/* Validate value against schema; the message (or "ok"). */
static const char *validate(const char *schema, const char *value)
{
    static char out[512];
    yajl_val s = parse(schema), v = parse(value);
    strbuf why;
    sb_init(&why);
    int rc = schema_validate(s, v, &why);
    snprintf(out, sizeof out, "%s", rc == 0 ? "ok" : why.data ? why.data : "(no reason)");
    sb_free(&why);
    yajl_tree_free(s);
    yajl_tree_free(v);
    return out;
}

static void schema_tests(void)
{
    const char *w = "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},"
                    "\"unit\":{\"type\":\"string\",\"enum\":[\"celsius\",\"fahrenheit\"]},"
                    "\"days\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":"
                    "{\"type\":\"string\"}}},\"required\":[\"city\"],\"additionalProperties\":false}";
    is_str(validate(w, "{\"city\":\"Paris\",\"unit\":\"celsius\",\"days\":3,\"tags\":[\"a\"]}"), "ok",
           "schema: a valid object passes");
    is_str(validate(w, "{\"unit\":\"celsius\"}"), "$: required property \"city\" is missing",
           "schema: required");
    is_str(validate(w, "{\"city\":5}"), "$.city: 5 is not of type \"string\"", "schema: type of a property");
    is_str(validate(w, "{\"city\":\"Paris\",\"unit\":\"kelvin\"}"),
           "$.unit: \"kelvin\" is not one of [\"celsius\",\"fahrenheit\"]", "schema: enum");
    is_str(validate(w, "{\"city\":\"Paris\",\"days\":2.5}"), "$.days: 2.5 is not of type \"integer\"",
           "schema: integer rejects a fraction");
    is_str(validate(w, "{\"city\":\"Paris\",\"days\":2.0}"), "ok", "schema: 2.0 is an integer");
    is_str(validate(w, "{\"city\":\"Paris\",\"tags\":[\"a\",1]}"), "$.tags[1]: 1 is not of type \"string\"",
           "schema: array items, with the index in the path");
    is_str(validate(w, "{\"city\":\"Paris\",\"wind\":3}"), "$: property \"wind\" is not allowed",
           "schema: additionalProperties false");
    is_str(validate(w, "[\"Paris\"]"), "$: [\"Paris\"] is not of type \"object\"", "schema: top-level type");
    is_str(validate("{\"type\":[\"string\",\"null\"]}", "null"), "ok", "schema: a list of types");
    is_str(validate("{\"enum\":[1,\"a\",null]}", "1.0"), "ok", "schema: enum compares numbers by value");
    is_str(validate("{}", "{\"anything\":[1,2]}"), "ok", "schema: {} accepts anything");
}

static void jsonw_tests(void)
{
    strbuf sb;
    sb_init(&sb);
    jw w;
    jw_init(&w, &sb);
    jw_obj(&w, NULL);
    jw_str(&w, "s", "quote \" backslash \\ newline \n");
    jw_str(&w, "null", NULL);
    jw_int(&w, "i", -42);
    jw_num(&w, "x", 1.5, 3);
    jw_num(&w, "nan", 0.0 / 0.0, 3);
    jw_arr(&w, "a");
    jw_bool(&w, NULL, true);
    jw_obj(&w, NULL);
    jw_end(&w);
    jw_raw(&w, NULL, "[1]", 3);
    jw_end(&w);
    jw_end(&w);
    is_str(sb.data, "{\"s\":\"quote \\\" backslash \\\\ newline \\n\",\"null\":null,\"i\":-42,"
                    "\"x\":1.500,\"nan\":null,\"a\":[true,{},[1]]}",
           "jsonw: commas, nesting, escapes, NaN as null");
    yajl_val v = parse(sb.data);
    ok(v != NULL, "jsonw: the output parses");
    yajl_tree_free(v);
    sb_free(&sb);
}

static void fingerprint_tests(void)
{
    char hex[65], want[65];
    ids_fingerprint(NULL, 0, hex);
    sha256_hex("", 0, want);
    is_str(hex, want, "fingerprint of no ids is SHA-256 of no bytes");
    uint32_t ids[] = { 1, 0x01020304u, 128815 };
    const unsigned char le[] = { 1, 0, 0, 0, 4, 3, 2, 1, 0x2f, 0xf7, 0x01, 0x00 };
    ids_fingerprint(ids, 3, hex);
    sha256_hex(le, sizeof le, want);
    is_str(hex, want, "fingerprint: ids as 4-byte little-endian words, in order");
    prompt_fingerprint pf;
    prompt_fingerprint_ids((const int32_t *)ids, 3, &pf);
    is_str(hex, pf.hex, "and the same as the engine's prompt_fingerprint_ids");
}

int main(void)
{
    sse_tests();
    schema_tests();
    jsonw_tests();
    fingerprint_tests();
    return exit_status();
}
