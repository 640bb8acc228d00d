#include "json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "utf8.h"

/* What yajl lets through but must not reach the tree: ill-formed UTF-8
 * (yajl accepts encoded surrogates), nesting deep enough to overflow the
 * stack of yajl's or our recursive walkers, and \u0000, which yajl's
 * NUL-terminated strings would silently truncate. */
static bool json_prescan(const char *text, size_t len, char *err, size_t errlen)
{
    size_t bad;
    if (!utf8_valid(text, len, &bad)) {
        snprintf(err, errlen, "invalid UTF-8 at byte %zu", bad);
        return false;
    }
    int depth = 0;
    bool in_string = false;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (in_string) {
            if (c == '"') in_string = false;
            else if (c == '\\' && i + 1 < len) {
                if (text[i + 1] == 'u' && i + 5 < len && !memcmp(text + i + 2, "0000", 4)) {
                    snprintf(err, errlen, "\\u0000 in a string at byte %zu is not supported", i);
                    return false;
                }
                i++;
            }
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (++depth > JSON_MAX_DEPTH) {
                snprintf(err, errlen, "nesting deeper than %d at byte %zu", JSON_MAX_DEPTH, i);
                return false;
            }
        } else if (c == ']' || c == '}') {
            depth--;
        }
    }
    return true;
}

yajl_val json_parse(const char *text, size_t len, char *err, size_t errlen)
{
    /* yajl_tree_parse wants a NUL-terminated string. */
    char *copy = malloc(len + 1);
    if (!copy) { snprintf(err, errlen, "out of memory"); return NULL; }
    memcpy(copy, text, len);
    copy[len] = 0;
    if (strlen(copy) != len) {
        free(copy);
        snprintf(err, errlen, "NUL byte inside JSON text");
        return NULL;
    }
    if (!json_prescan(copy, len, err, errlen)) {
        free(copy);
        return NULL;
    }
    char ebuf[256];
    ebuf[0] = 0;
    yajl_val v = yajl_tree_parse(copy, ebuf, sizeof ebuf);
    free(copy);
    if (!v) {
        /* yajl's message spans lines; keep the first. */
        char *nl = strchr(ebuf, '\n');
        if (nl) *nl = 0;
        snprintf(err, errlen, "%s", ebuf[0] ? ebuf : "invalid JSON");
    }
    return v;
}

yajl_val json_get(yajl_val obj, const char *key)
{
    if (!obj || !YAJL_IS_OBJECT(obj)) return NULL;
    yajl_val found = NULL;
    /* The last duplicate wins, as in Python's json. */
    for (size_t i = 0; i < obj->u.object.len; i++)
        if (strcmp(obj->u.object.keys[i], key) == 0)
            found = obj->u.object.values[i];
    return found;
}

const char *json_string(yajl_val v)
{
    return v && YAJL_IS_STRING(v) ? v->u.string : NULL;
}

bool json_int(yajl_val v, long long *out)
{
    if (!v || !YAJL_IS_NUMBER(v)) return false;
    if (YAJL_IS_INTEGER(v)) { *out = v->u.number.i; return true; }
    /* 3.0 is accepted as 3, as Python clients sometimes send floats. */
    if (YAJL_IS_DOUBLE(v) && v->u.number.d == floor(v->u.number.d)
        && fabs(v->u.number.d) < 9.0e15) {
        *out = (long long)v->u.number.d;
        return true;
    }
    return false;
}

bool json_number(yajl_val v, double *out)
{
    if (!v || !YAJL_IS_NUMBER(v)) return false;
    if (YAJL_IS_INTEGER(v)) *out = (double)v->u.number.i;
    else if (YAJL_IS_DOUBLE(v)) *out = v->u.number.d;
    else *out = strtod(v->u.number.r, NULL);
    return true;
}

bool json_bool(yajl_val v, bool *out)
{
    if (!v) return false;
    if (YAJL_IS_TRUE(v)) { *out = true; return true; }
    if (YAJL_IS_FALSE(v)) { *out = false; return true; }
    return false;
}

size_t json_len(yajl_val v)
{
    if (!v) return 0;
    if (YAJL_IS_ARRAY(v)) return v->u.array.len;
    if (YAJL_IS_OBJECT(v)) return v->u.object.len;
    return 0;
}

void json_put_string(strbuf *sb, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    sb_reserve(sb, n + 2);
    sb_putc(sb, '"');
    size_t run = 0;   /* bytes copied verbatim in one go */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[7];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) {
                u[0] = '\\'; u[1] = 'u'; u[2] = '0'; u[3] = '0';
                u[4] = hex[c >> 4]; u[5] = hex[c & 15]; u[6] = 0;
                esc = u;
            }
        }
        if (esc) {
            sb_append(sb, s + i - run, run);
            run = 0;
            sb_puts(sb, esc);
        } else {
            run++;
        }
    }
    sb_append(sb, s + n - run, run);
    sb_putc(sb, '"');
}

void json_put_cstr(strbuf *sb, const char *s)
{
    json_put_string(sb, s, strlen(s));
}

void json_put_double(strbuf *sb, double d)
{
    if (isnan(d)) { sb_puts(sb, "NaN"); return; }
    if (isinf(d)) { sb_puts(sb, d > 0 ? "Infinity" : "-Infinity"); return; }
    if (d == 0) { sb_puts(sb, signbit(d) ? "-0.0" : "0.0"); return; }
    /* Shortest %.*e that reads back exactly. */
    char buf[64];
    for (int prec = 0; prec < 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec, d);
        if (strtod(buf, NULL) == d) break;
    }
    /* buf is [-]d[.ddd]e[+-]XX: collect digits and exponent. */
    char digits[32];
    int nd = 0, neg = 0;
    const char *p = buf;
    if (*p == '-') { neg = 1; p++; }
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[nd++] = *p;
    int exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    int decpt = exp10 + 1;   /* value = 0.digits * 10^decpt */
    if (neg) sb_putc(sb, '-');
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            sb_puts(sb, "0.");
            for (int i = 0; i < -decpt; i++) sb_putc(sb, '0');
            sb_append(sb, digits, (size_t)nd);
        } else if (decpt >= nd) {
            sb_append(sb, digits, (size_t)nd);
            for (int i = nd; i < decpt; i++) sb_putc(sb, '0');
            sb_puts(sb, ".0");
        } else {
            sb_append(sb, digits, (size_t)decpt);
            sb_putc(sb, '.');
            sb_append(sb, digits + decpt, (size_t)(nd - decpt));
        }
    } else {
        sb_putc(sb, digits[0]);
        if (nd > 1) {
            sb_putc(sb, '.');
            sb_append(sb, digits + 1, (size_t)(nd - 1));
        }
        sb_printf(sb, "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
    }
}

static bool number_is_integral_text(const char *r)
{
    return strpbrk(r, ".eE") == NULL;
}

typedef struct { const char *key; size_t i; } key_ref;

static int key_ref_cmp(const void *a, const void *b)
{
    const key_ref *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    return c ? c : (x->i > y->i) - (x->i < y->i);
}

size_t *json_object_slots(yajl_val v)
{
    size_t n = v->u.object.len;
    if (n < 2) return NULL;
    key_ref *refs = malloc(n * sizeof *refs);
    size_t *slot = malloc(n * sizeof *slot);
    if (!refs || !slot) abort();
    for (size_t i = 0; i < n; i++) {
        refs[i] = (key_ref){ v->u.object.keys[i], i };
        slot[i] = i;
    }
    qsort(refs, n, sizeof *refs, key_ref_cmp);
    bool dup = false;
    for (size_t g = 0; g < n;) {
        size_t e = g + 1;
        while (e < n && !strcmp(refs[e].key, refs[g].key)) e++;
        if (e - g > 1) {
            dup = true;
            slot[refs[g].i] = refs[e - 1].i;
            for (size_t k = g + 1; k < e; k++) slot[refs[k].i] = n;
        }
        g = e;
    }
    free(refs);
    if (!dup) { free(slot); return NULL; }
    return slot;
}

void json_dump(strbuf *sb, yajl_val v, enum json_style style)
{
    const char *comma = style == JSON_PYTHON ? ", " : ",";
    const char *colon = style == JSON_PYTHON ? ": " : ":";
    if (!v || YAJL_IS_NULL(v)) { sb_puts(sb, "null"); return; }
    if (YAJL_IS_TRUE(v)) { sb_puts(sb, "true"); return; }
    if (YAJL_IS_FALSE(v)) { sb_puts(sb, "false"); return; }
    if (YAJL_IS_STRING(v)) { json_put_cstr(sb, v->u.string); return; }
    if (YAJL_IS_NUMBER(v)) {
        const char *r = v->u.number.r;
        if (!number_is_integral_text(r))
            json_put_double(sb, strtod(r, NULL));
        else
            sb_puts(sb, strcmp(r, "-0") ? r : "0");
        return;
    }
    if (YAJL_IS_ARRAY(v)) {
        sb_putc(sb, '[');
        for (size_t i = 0; i < v->u.array.len; i++) {
            if (i) sb_puts(sb, comma);
            json_dump(sb, v->u.array.values[i], style);
        }
        sb_putc(sb, ']');
        return;
    }
    if (YAJL_IS_OBJECT(v)) {
        size_t n = v->u.object.len;
        size_t *slot = json_object_slots(v);
        bool first = true;
        sb_putc(sb, '{');
        for (size_t i = 0; i < n; i++) {
            size_t j = slot ? slot[i] : i;
            if (j == n) continue;
            if (!first) sb_puts(sb, comma);
            first = false;
            json_put_cstr(sb, v->u.object.keys[i]);
            sb_puts(sb, colon);
            json_dump(sb, v->u.object.values[j], style);
        }
        sb_putc(sb, '}');
        free(slot);
    }
}
