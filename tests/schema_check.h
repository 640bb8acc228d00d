/* A JSON Schema validator for the subset json_schema.c compiles (tests
 * only): type, properties, required, additionalProperties, items,
 * minItems, maxItems, enum, const, anyOf, $ref (#, #/$defs, #/definitions),
 * minLength, maxLength (in characters), format (date, time, date-time,
 * uuid; shape only). */
#ifndef LLM_TEST_SCHEMA_CHECK_H
#define LLM_TEST_SCHEMA_CHECK_H

#include <ctype.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "json.h"
#include "strbuf.h"

static bool sc_equal(yajl_val a, yajl_val b)
{
    strbuf x, y;
    sb_init(&x);
    sb_init(&y);
    json_dump(&x, a, JSON_COMPACT);
    json_dump(&y, b, JSON_COMPACT);
    bool eq = x.len == y.len && !memcmp(x.data, y.data, x.len);
    sb_free(&x);
    sb_free(&y);
    return eq;
}

static size_t sc_chars(const char *s)
{
    size_t n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static bool sc_shape(const char *s, const char *shape)   /* 9: digit, x: hex */
{
    for (; *shape; shape++, s++) {
        if (*shape == '9' ? !isdigit((unsigned char)*s)
            : *shape == 'x' ? !isxdigit((unsigned char)*s) : *s != *shape)
            return false;
    }
    return true;
}

static bool sc_format(const char *f, const char *s)
{
    if (!strcmp(f, "uuid")) return strlen(s) == 36 && sc_shape(s, "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx");
    if (!strcmp(f, "date")) return strlen(s) == 10 && sc_shape(s, "9999-99-99");
    if (!strcmp(f, "time")) return sc_shape(s, "99:99:99") && (strchr(s, 'Z') || strchr(s + 8, '+') || strchr(s + 8, '-'));
    if (!strcmp(f, "date-time")) return sc_shape(s, "9999-99-99T99:99:99");
    return false;
}

static bool sc_valid(yajl_val root, yajl_val s, yajl_val v);

static bool sc_type(const char *t, yajl_val v)
{
    long long i;
    if (!strcmp(t, "object")) return YAJL_IS_OBJECT(v);
    if (!strcmp(t, "array")) return YAJL_IS_ARRAY(v);
    if (!strcmp(t, "string")) return YAJL_IS_STRING(v);
    if (!strcmp(t, "number")) return YAJL_IS_NUMBER(v);
    if (!strcmp(t, "integer")) return YAJL_IS_NUMBER(v) && json_int(v, &i);
    if (!strcmp(t, "boolean")) return YAJL_IS_TRUE(v) || YAJL_IS_FALSE(v);
    if (!strcmp(t, "null")) return YAJL_IS_NULL(v);
    return false;
}

static bool sc_valid(yajl_val root, yajl_val s, yajl_val v)
{
    yajl_val k;
    long long n;
    if (!s || YAJL_IS_TRUE(s)) return true;
    if ((k = json_get(s, "$ref"))) {
        const char *r = json_string(k);
        yajl_val t = !strcmp(r, "#") ? root
                   : !strncmp(r, "#/$defs/", 8) ? json_get(json_get(root, "$defs"), r + 8)
                   : json_get(json_get(root, "definitions"), r + 14);
        return sc_valid(root, t, v);
    }
    if ((k = json_get(s, "anyOf"))) {
        for (size_t i = 0; i < k->u.array.len; i++)
            if (sc_valid(root, k->u.array.values[i], v)) return true;
        return false;
    }
    if ((k = json_get(s, "enum"))) {
        size_t i = 0;
        while (i < k->u.array.len && !sc_equal(k->u.array.values[i], v)) i++;
        if (i == k->u.array.len) return false;
    }
    if ((k = json_get(s, "const")) && !sc_equal(k, v)) return false;
    if ((k = json_get(s, "type"))) {
        bool any = false;
        if (json_string(k)) any = sc_type(k->u.string, v);
        for (size_t i = 0; YAJL_IS_ARRAY(k) && i < k->u.array.len; i++)
            any |= sc_type(json_string(k->u.array.values[i]), v);
        if (!any) return false;
    }
    if (YAJL_IS_OBJECT(v)) {
        yajl_val props = json_get(s, "properties"), req = json_get(s, "required");
        yajl_val addl = json_get(s, "additionalProperties");
        for (size_t i = 0; req && i < req->u.array.len; i++)
            if (!json_get(v, json_string(req->u.array.values[i]))) return false;
        for (size_t i = 0; i < v->u.object.len; i++) {
            yajl_val ps = json_get(props, v->u.object.keys[i]);
            if (ps) { if (!sc_valid(root, ps, v->u.object.values[i])) return false; }
            else if (addl && YAJL_IS_FALSE(addl)) return false;
            else if (addl && YAJL_IS_OBJECT(addl) && !sc_valid(root, addl, v->u.object.values[i])) return false;
        }
    }
    if (YAJL_IS_ARRAY(v)) {
        if (json_int(json_get(s, "minItems"), &n) && v->u.array.len < (size_t)n) return false;
        if (json_int(json_get(s, "maxItems"), &n) && v->u.array.len > (size_t)n) return false;
        for (size_t i = 0; (k = json_get(s, "items")) && i < v->u.array.len; i++)
            if (!sc_valid(root, k, v->u.array.values[i])) return false;
    }
    if (YAJL_IS_STRING(v)) {
        if (json_int(json_get(s, "minLength"), &n) && sc_chars(v->u.string) < (size_t)n) return false;
        if (json_int(json_get(s, "maxLength"), &n) && sc_chars(v->u.string) > (size_t)n) return false;
        if ((k = json_get(s, "format")) && !sc_format(k->u.string, v->u.string)) return false;
    }
    return true;
}

#endif
