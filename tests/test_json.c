/* JSON helpers: Python-style dumps (the chat format embeds JSON exactly as
 * json.dumps writes it) and compact output. */
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "tap.h"

static void dump_is(const char *in, enum json_style st, const char *want)
{
    char err[128];
    yajl_val v = json_parse(in, strlen(in), err, sizeof err);
    strbuf sb;
    sb_init(&sb);
    if (v) json_dump(&sb, v, st);
    is_str(v ? sb.data : err, want, "dump %s", in);
    sb_free(&sb);
    yajl_tree_free(v);
}

static void double_is(double d, const char *want)
{
    strbuf sb;
    sb_init(&sb);
    json_put_double(&sb, d);
    is_str(sb.data, want, "repr(%.17g)", d);
    sb_free(&sb);
}

int main(void)
{
    dump_is("{\"a\":1,\"b\":[true,null,\"x\"]}", JSON_PYTHON,
            "{\"a\": 1, \"b\": [true, null, \"x\"]}");
    dump_is("{ \"a\" : 1 , \"b\" : [ ] }", JSON_COMPACT, "{\"a\":1,\"b\":[]}");
    dump_is("{\"z\":1,\"a\":2}", JSON_COMPACT, "{\"z\":1,\"a\":2}");  /* order kept */
    dump_is("[\"\xe4\xbd\xa0\\u597d\",\"\\n\\t\\u0001\\\"\\\\\"]", JSON_PYTHON,
            "[\"\xe4\xbd\xa0\xe5\xa5\xbd\", \"\\n\\t\\u0001\\\"\\\\\"]");
    dump_is("[1.0,1e5,0.1,-2.50,1E-7,12345678901234567890]", JSON_PYTHON,
            "[1.0, 100000.0, 0.1, -2.5, 1e-07, 12345678901234567890]");
    /* What json.loads builds: duplicates collapse at the first position
     * with the last value; -0 is the integer 0. */
    dump_is("{\"a\":1,\"b\":2,\"a\":3,\"c\":{\"x\":1,\"x\":[-0,1E400,-0.0]}}", JSON_PYTHON,
            "{\"a\": 3, \"b\": 2, \"c\": {\"x\": [0, Infinity, -0.0]}}");
    dump_is("{\"k\":1,\"k\":2,\"k\":3}", JSON_COMPACT, "{\"k\":3}");
    double_is(1.0, "1.0");
    double_is(0.1, "0.1");
    double_is(1e16, "1e+16");
    double_is(1e15, "1000000000000000.0");
    double_is(0.0001, "0.0001");
    double_is(0.00001, "1e-05");
    double_is(123.456, "123.456");
    double_is(-0.0, "-0.0");
    double_is(1.5e300, "1.5e+300");
    double_is(0.30000000000000004, "0.30000000000000004");

    char err[128];
    ok(json_parse("{\"a\":", 5, err, sizeof err) == NULL && err[0], "truncated JSON fails");
    ok(json_parse("\"\xff\"", 3, err, sizeof err) == NULL, "invalid UTF-8 fails");
    ok(json_parse("\"\xed\xa0\x80\"", 5, err, sizeof err) == NULL && strstr(err, "UTF-8"),
       "an encoded surrogate is ill-formed UTF-8: %s", err);
    ok(json_parse("[\"a\\u0000b\"]", 12, err, sizeof err) == NULL && strstr(err, "u0000"),
       "\\u0000 is refused rather than truncated: %s", err);
    yajl_val bs = json_parse("[\"a\\\\u0000b\"]", 13, err, sizeof err);
    ok(bs != NULL, "an escaped backslash before u0000 is plain text");
    yajl_tree_free(bs);
    {
        size_t n = 200000;
        char *deep = malloc(2 * n);
        memset(deep, '[', n);
        memset(deep + n, ']', n);
        ok(json_parse(deep, 2 * n, err, sizeof err) == NULL && strstr(err, "nesting"),
           "deep nesting is refused, not a stack overflow: %s", err);
        size_t m = JSON_MAX_DEPTH;
        memset(deep, '[', m);
        memset(deep + m, ']', m);
        yajl_val d = json_parse(deep, 2 * m, err, sizeof err);
        ok(d != NULL, "nesting of exactly JSON_MAX_DEPTH parses");
        yajl_tree_free(d);
        free(deep);
    }
    const char *obj = "{\"n\":3,\"f\":2.5,\"s\":\"x\",\"b\":false,\"n\":4}";
    yajl_val v = json_parse(obj, strlen(obj), err, sizeof err);
    long long i;
    double d;
    bool b;
    ok(v && json_int(json_get(v, "n"), &i) && i == 4, "last duplicate key wins");
    ok(!json_int(json_get(v, "f"), &i) && json_number(json_get(v, "f"), &d) && d == 2.5,
       "2.5 is a number, not an integer");
    ok(json_bool(json_get(v, "b"), &b) && !b, "bool");
    is_str(json_string(json_get(v, "s")), "x", "string");
    ok(json_get(v, "missing") == NULL && json_string(json_get(v, "n")) == NULL, "typed misses");
    yajl_tree_free(v);
    return exit_status();
}
