/* JSON helpers: Python-style dumps (the chat format embeds JSON exactly as
 * json.dumps writes it) and compact output. */
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
