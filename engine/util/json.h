/* JSON helpers over yajl's tree API: parse with a readable error, typed
 * lookups, and writers.  Two output styles exist because the chat format
 * embeds JSON exactly as Python's json.dumps(..., ensure_ascii=False)
 * writes it (", " and ": " separators, Python float repr), while our own
 * protocol and HTTP bodies use compact JSON. */
#ifndef LLM_JSON_H
#define LLM_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <yajl/yajl_tree.h>

#include "strbuf.h"

enum json_style {
    JSON_COMPACT,   /* {"a":1,"b":[1,2]} */
    JSON_PYTHON,    /* {"a": 1, "b": [1, 2]}  (json.dumps default) */
};

/* Deepest array/object nesting json_parse accepts (Python's json stops
 * near 1000 too). */
#define JSON_MAX_DEPTH 1000

/* Parse text[0..len) (need not be NUL-terminated).  On failure returns NULL
 * and writes a one-line reason into err.  Rejects ill-formed UTF-8, nesting
 * beyond JSON_MAX_DEPTH and \u0000 in strings. */
yajl_val json_parse(const char *text, size_t len, char *err, size_t errlen);

/* Object member by key, or NULL when obj is not an object or lacks it. */
yajl_val json_get(yajl_val obj, const char *key);
/* Typed views; NULL/false when the value has another type. */
const char *json_string(yajl_val v);
bool json_int(yajl_val v, long long *out);      /* integral numbers only */
bool json_number(yajl_val v, double *out);      /* any number */
bool json_bool(yajl_val v, bool *out);
size_t json_len(yajl_val v);                    /* array/object length */

/* Write s[0..n) as a quoted JSON string.  Control characters, '"' and '\\'
 * are escaped; everything else (including non-ASCII) is copied. */
void json_put_string(strbuf *sb, const char *s, size_t n);
void json_put_cstr(strbuf *sb, const char *s);
/* Serialize a parsed tree in the given style, with the values Python's
 * json.loads would have built: numbers keep their integer text (-0 is 0),
 * non-integral numbers are written as repr(float) does, and a key repeated
 * in one object appears once, at its first position, with its last value. */
void json_dump(strbuf *sb, yajl_val v, enum json_style style);
/* An object's members as a Python dict holds them: for member i, the index
 * of the value kept at position i (the last duplicate of its key), or the
 * object's length when a duplicate key earlier in the object already took
 * its place.  NULL when the object has no duplicate keys (slot i is i).
 * The caller frees the array. */
size_t *json_object_slots(yajl_val obj);
/* A double as Python's repr(float) writes it: shortest round-trip digits,
 * "1.0", "1e-05", "1.5e+16". */
void json_put_double(strbuf *sb, double d);

#endif
