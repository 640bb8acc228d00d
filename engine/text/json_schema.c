/* JSON Schema -> grammar (json_schema.h).  Strings never contain U+FF5C
 * (the fullwidth bar of DeepSeek's markers): the output parser cuts text at
 * EOS and DSML markers, which are spelled with it, so a string holding one
 * would not come back whole. */
#include "json_schema.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "strbuf.h"

#define MAX_UNROLL 1024     /* minItems/maxItems/minLength/maxLength */
#define MAX_DEPTH 64

typedef struct {
    char *ref;
    int rule;
} ref_rule;

typedef struct {
    grammar *g;
    yajl_val root;
    const char *root_path;
    schema_error *err;
    ref_rule *refs;
    int n_refs, cap_refs;
    int depth;
    /* shared rules, -1 until made */
    int ws, utf8, jchar, jchars, jstring, raw_chars, digits, integer, number, value,
        any_object;
} sctx;

static void fail(sctx *c, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fail(sctx *c, const char *path, const char *fmt, ...)
{
    if (c->err->message[0]) return;
    snprintf(c->err->path, sizeof c->err->path, "%s", path);
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(c->err->message, sizeof c->err->message, "%s: ", path);
    if (n > 0 && (size_t)n < sizeof c->err->message)
        vsnprintf(c->err->message + n, sizeof c->err->message - (size_t)n, fmt, ap);
    va_end(ap);
}

static void init_ctx(sctx *c, grammar *g, yajl_val root, const char *path, schema_error *err)
{
    memset(c, 0, sizeof *c);
    c->g = g;
    c->root = root;
    c->root_path = path;
    c->err = err;
    err->path[0] = err->message[0] = 0;
    c->ws = c->utf8 = c->jchar = c->jchars = c->jstring = c->raw_chars = c->digits
        = c->integer = c->number = c->value = c->any_object = -1;
}

static void free_ctx(sctx *c)
{
    for (int i = 0; i < c->n_refs; i++) free(c->refs[i].ref);
    free(c->refs);
}

/* ---- shared rules ---- */

/* rule := seq | "" */
static int optional(grammar *g, galt *a)
{
    int r = grammar_rule(g);
    grammar_add_alt(g, r, a);
    grammar_add_alt(g, r, a);   /* a is empty now: the empty alternative */
    return r;
}

/* rule := body rule | "" (body must not be nullable) */
static int star(grammar *g, int body)
{
    int r = grammar_rule(g);
    galt a = { 0 };
    galt_ref(&a, body);
    galt_ref(&a, r);
    grammar_add_alt(g, r, &a);
    grammar_add_alt(g, r, &a);
    galt_free(&a);
    return r;
}

static int ws_rule(sctx *c)
{
    if (c->ws < 0) {
        galt a = { 0 };
        galt_str(c->g, &a, " ");
        c->ws = optional(c->g, &a);
        galt_free(&a);
    }
    return c->ws;
}

/* One well-formed UTF-8 character of two to four bytes, not U+FF5C. */
static int utf8_rule(sctx *c)
{
    if (c->utf8 >= 0) return c->utf8;
    grammar *g = c->g;
    static const unsigned seqs[][4][2] = {
        { { 0xC2, 0xDF }, { 0x80, 0xBF } },
        { { 0xE0, 0xE0 }, { 0xA0, 0xBF }, { 0x80, 0xBF } },
        { { 0xE1, 0xEC }, { 0x80, 0xBF }, { 0x80, 0xBF } },
        { { 0xED, 0xED }, { 0x80, 0x9F }, { 0x80, 0xBF } },
        { { 0xEE, 0xEE }, { 0x80, 0xBF }, { 0x80, 0xBF } },
        { { 0xEF, 0xEF }, { 0x80, 0xBC }, { 0x80, 0xBF } },
        { { 0xEF, 0xEF }, { 0xBD, 0xBD }, { 0x80, 0x9B } },   /* U+FF40..U+FF5B */
        { { 0xEF, 0xEF }, { 0xBD, 0xBD }, { 0x9D, 0xBF } },   /* U+FF5D..U+FF7F */
        { { 0xEF, 0xEF }, { 0xBE, 0xBF }, { 0x80, 0xBF } },
        { { 0xF0, 0xF0 }, { 0x90, 0xBF }, { 0x80, 0xBF }, { 0x80, 0xBF } },
        { { 0xF1, 0xF3 }, { 0x80, 0xBF }, { 0x80, 0xBF }, { 0x80, 0xBF } },
        { { 0xF4, 0xF4 }, { 0x80, 0x8F }, { 0x80, 0xBF }, { 0x80, 0xBF } },
    };
    int r = grammar_rule(g);
    galt a = { 0 };
    for (size_t i = 0; i < sizeof seqs / sizeof seqs[0]; i++) {
        for (int k = 0; k < 4 && seqs[i][k][0]; k++)
            galt_range(g, &a, seqs[i][k][0], seqs[i][k][1]);
        grammar_add_alt(g, r, &a);
    }
    galt_free(&a);
    return c->utf8 = r;
}

static void hex(grammar *g, galt *a) {
    uint64_t s[4] = { 0 };
    for (const char *p = "0123456789abcdefABCDEF"; *p; p++)
        s[(uint8_t)*p >> 6] |= 1ULL << ((uint8_t)*p & 63);
    galt_set(g, a, s);
}

/* One JSON string character: unescaped, or an escape (\uXXXX neither
 * \u0000 nor a surrogate, which strict parsers refuse). */
static int jchar_rule(sctx *c)
{
    if (c->jchar >= 0) return c->jchar;
    grammar *g = c->g;
    int r = grammar_rule(g);
    galt a = { 0 };
    uint64_t s[4] = { 0 };
    for (unsigned b = 0x20; b < 0x80; b++)
        if (b != '"' && b != '\\') s[b >> 6] |= 1ULL << (b & 63);
    galt_set(g, &a, s);
    grammar_add_alt(g, r, &a);
    galt_ref(&a, utf8_rule(c));
    grammar_add_alt(g, r, &a);
    memset(s, 0, sizeof s);
    for (const char *p = "\"\\/bfnrt"; *p; p++) s[(uint8_t)*p >> 6] |= 1ULL << ((uint8_t)*p & 63);
    galt_str(g, &a, "\\");
    galt_set(g, &a, s);
    grammar_add_alt(g, r, &a);
    /* \u: first digit 1-9a-cA-Ce-fE-F; d/D then 0-7; 0 then nonzero... */
    galt_str(g, &a, "\\u");
    memset(s, 0, sizeof s);
    for (const char *p = "123456789abcABCefEF"; *p; p++) s[(uint8_t)*p >> 6] |= 1ULL << ((uint8_t)*p & 63);
    galt_set(g, &a, s);
    hex(g, &a); hex(g, &a); hex(g, &a);
    grammar_add_alt(g, r, &a);
    galt_str(g, &a, "\\u");
    memset(s, 0, sizeof s);
    s['d' >> 6] |= 1ULL << ('d' & 63);
    s['D' >> 6] |= 1ULL << ('D' & 63);
    galt_set(g, &a, s);
    galt_range(g, &a, '0', '7');
    hex(g, &a); hex(g, &a);
    grammar_add_alt(g, r, &a);
    static const char *const zero_tails[] = { "0", "00", "000" };
    for (int z = 0; z < 3; z++) {
        galt_str(g, &a, "\\u");
        galt_str(g, &a, zero_tails[z]);
        memset(s, 0, sizeof s);
        for (const char *p = "123456789abcdefABCDEF"; *p; p++)
            s[(uint8_t)*p >> 6] |= 1ULL << ((uint8_t)*p & 63);
        galt_set(g, &a, s);
        for (int k = z; k < 2; k++) hex(g, &a);
        grammar_add_alt(g, r, &a);
    }
    galt_free(&a);
    return c->jchar = r;
}

static int jstring_rule(sctx *c)
{
    if (c->jstring >= 0) return c->jstring;
    if (c->jchars < 0) c->jchars = star(c->g, jchar_rule(c));
    galt a = { 0 };
    galt_str(c->g, &a, "\"");
    galt_ref(&a, c->jchars);
    galt_str(c->g, &a, "\"");
    c->jstring = grammar_seq(c->g, &a);
    galt_free(&a);
    return c->jstring;
}

/* Raw text of a DSML string="true" parameter: any characters but NUL (and
 * U+FF5C). */
static int raw_chars_rule(sctx *c)
{
    if (c->raw_chars >= 0) return c->raw_chars;
    grammar *g = c->g;
    int ch = grammar_rule(g);
    galt a = { 0 };
    galt_range(g, &a, 0x01, 0x7F);
    grammar_add_alt(g, ch, &a);
    galt_ref(&a, utf8_rule(c));
    grammar_add_alt(g, ch, &a);
    galt_free(&a);
    return c->raw_chars = star(g, ch);
}

static int digits_rule(sctx *c)   /* [0-9]* */
{
    if (c->digits < 0) {
        galt a = { 0 };
        galt_range(c->g, &a, '0', '9');
        c->digits = star(c->g, grammar_seq(c->g, &a));
        galt_free(&a);
    }
    return c->digits;
}

/* At most n more digits: D_n := [0-9] D_{n-1} | "" */
static int digits_upto(sctx *c, int n)
{
    grammar *g = c->g;
    galt a = { 0 };
    int r = grammar_rule(g);
    grammar_add_alt(g, r, &a);
    for (int k = 1; k <= n; k++) {
        int o = grammar_rule(g);
        galt_range(g, &a, '0', '9');
        galt_ref(&a, r);
        grammar_add_alt(g, o, &a);
        grammar_add_alt(g, o, &a);
        r = o;
    }
    galt_free(&a);
    return r;
}

/* -?(0|[1-9][0-9]{0,14}): 15 digits at most, so every integer is exact in
 * a double and fits the 64-bit integers strict parsers (yajl) take. */
static int integer_rule(sctx *c)
{
    if (c->integer >= 0) return c->integer;
    grammar *g = c->g;
    galt a = { 0 };
    galt_str(g, &a, "-");
    int minus = optional(g, &a);
    int r = grammar_rule(g);
    galt_ref(&a, minus);
    galt_str(g, &a, "0");
    grammar_add_alt(g, r, &a);
    galt_ref(&a, minus);
    galt_range(g, &a, '1', '9');
    galt_ref(&a, digits_upto(c, 14));
    grammar_add_alt(g, r, &a);
    galt_free(&a);
    return c->integer = r;
}

/* integer (.[0-9]+)? ([eE][+-]?[0-9]{1,2})?: no exponent overflows a
 * double. */
static int number_rule(sctx *c)
{
    if (c->number >= 0) return c->number;
    grammar *g = c->g;
    galt a = { 0 };
    galt_str(g, &a, ".");
    galt_range(g, &a, '0', '9');
    galt_ref(&a, digits_rule(c));
    int frac = optional(g, &a);
    uint64_t s[4] = { 0 };
    s['+' >> 6] |= 1ULL << ('+' & 63);
    s['-' >> 6] |= 1ULL << ('-' & 63);
    galt_set(g, &a, s);
    int sign = optional(g, &a);
    memset(s, 0, sizeof s);
    s['e' >> 6] |= 1ULL << ('e' & 63);
    s['E' >> 6] |= 1ULL << ('E' & 63);
    galt_set(g, &a, s);
    galt_ref(&a, sign);
    galt_range(g, &a, '0', '9');
    galt_ref(&a, digits_upto(c, 1));
    int exp = optional(g, &a);
    galt_ref(&a, integer_rule(c));
    galt_ref(&a, frac);
    galt_ref(&a, exp);
    c->number = grammar_seq(g, &a);
    galt_free(&a);
    return c->number;
}

/* sep item sep item ... after a first item: rest := sep item rest | "" */
static int rest_rule(sctx *c, const char *sep, int item)
{
    grammar *g = c->g;
    int r = grammar_rule(g);
    galt a = { 0 };
    galt_str(g, &a, sep);
    if (*sep == ',') galt_ref(&a, ws_rule(c));
    galt_ref(&a, item);
    galt_ref(&a, r);
    grammar_add_alt(g, r, &a);
    grammar_add_alt(g, r, &a);
    galt_free(&a);
    return r;
}

/* open close | open item rest close */
static int list_rule(sctx *c, const char *open, const char *close, int item)
{
    grammar *g = c->g;
    int r = grammar_rule(g);
    galt a = { 0 };
    galt_str(g, &a, open);
    galt_str(g, &a, close);
    grammar_add_alt(g, r, &a);
    galt_str(g, &a, open);
    galt_ref(&a, item);
    galt_ref(&a, rest_rule(c, ",", item));
    galt_str(g, &a, close);
    grammar_add_alt(g, r, &a);
    galt_free(&a);
    return r;
}

static int member_rule(sctx *c, int value)   /* "key": value */
{
    galt a = { 0 };
    galt_ref(&a, jstring_rule(c));
    galt_str(c->g, &a, ":");
    galt_ref(&a, ws_rule(c));
    galt_ref(&a, value);
    int r = grammar_seq(c->g, &a);
    galt_free(&a);
    return r;
}

/* Any JSON value. */
static int value_rule(sctx *c)
{
    if (c->value >= 0) return c->value;
    grammar *g = c->g;
    int v = c->value = grammar_rule(g);
    c->any_object = list_rule(c, "{", "}", member_rule(c, v));
    int arr = list_rule(c, "[", "]", v);
    galt a = { 0 };
    int alts[] = { c->any_object, arr, jstring_rule(c), number_rule(c) };
    for (size_t i = 0; i < 4; i++) {
        galt_ref(&a, alts[i]);
        grammar_add_alt(g, v, &a);
    }
    static const char *const words[] = { "true", "false", "null" };
    for (int i = 0; i < 3; i++) {
        galt_str(g, &a, words[i]);
        grammar_add_alt(g, v, &a);
    }
    galt_free(&a);
    return v;
}

/* ---- schemas ---- */

static int schema_rule(sctx *c, yajl_val s, const char *path);

static const char *const annotations[] = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment",
    "strict", "$defs", "definitions", NULL,
};

static bool in_list(const char *k, const char *const *list)
{
    for (; *list; list++)
        if (!strcmp(k, *list)) return true;
    return false;
}

/* The literal JSON of a value (enum, const). */
static void literal_alt(sctx *c, galt *a, yajl_val v)
{
    strbuf sb;
    sb_init(&sb);
    json_dump(&sb, v, JSON_COMPACT);
    galt_lit(c->g, a, sb.data, sb.len);
    sb_free(&sb);
}

static bool get_count(sctx *c, yajl_val s, const char *key, const char *path, long long *out)
{
    yajl_val v = json_get(s, key);
    if (!v) return true;
    char p[200];
    snprintf(p, sizeof p, "%s.%s", path, key);
    if (!json_int(v, out) || *out < 0) {
        fail(c, p, "expected a non-negative integer");
        return false;
    }
    if (*out > MAX_UNROLL) {
        fail(c, p, "values above %d are not supported", MAX_UNROLL);
        return false;
    }
    return true;
}

/* item repeated: at least lo, at most hi (-1: unbounded), joined by sep,
 * between open and close. */
static int repeat_rule(sctx *c, const char *open, const char *close, const char *sep,
                       int item, long long lo, long long hi)
{
    grammar *g = c->g;
    galt a = { 0 };
    int tail;                       /* what may follow the first lo items */
    if (hi < 0) {
        tail = rest_rule(c, sep, item);
    } else {
        tail = grammar_rule(g);     /* O_0 := "" */
        grammar_add_alt(g, tail, &a);
        for (long long k = 1; k <= hi - (lo ? lo : 1); k++) {
            int o = grammar_rule(g);
            if (*sep) galt_str(g, &a, sep);
            if (*sep) galt_ref(&a, ws_rule(c));
            galt_ref(&a, item);
            galt_ref(&a, tail);
            grammar_add_alt(g, o, &a);
            grammar_add_alt(g, o, &a);
            tail = o;
        }
    }
    int r = grammar_rule(g);
    if (lo == 0) {
        galt_str(g, &a, open);
        galt_str(g, &a, close);
        grammar_add_alt(g, r, &a);
        if (hi == 0) { galt_free(&a); return r; }
    }
    galt_str(g, &a, open);
    galt_ref(&a, item);
    for (long long k = 1; k < lo; k++) {
        if (*sep) galt_str(g, &a, sep);
        if (*sep) galt_ref(&a, ws_rule(c));
        galt_ref(&a, item);
    }
    galt_ref(&a, tail);
    galt_str(g, &a, close);
    grammar_add_alt(g, r, &a);
    galt_free(&a);
    return r;
}

static const char *const formats[] = { "date", "time", "date-time", "uuid", NULL };

/* The characters of a format (no quotes). */
static int format_rule(sctx *c, const char *f)
{
    grammar *g = c->g;
    galt a = { 0 };
    int r;
    if (!strcmp(f, "uuid")) {
        static const int groups[] = { 8, 4, 4, 4, 12 };
        for (int i = 0; i < 5; i++) {
            if (i) galt_str(g, &a, "-");
            for (int k = 0; k < groups[i]; k++) hex(g, &a);
        }
        r = grammar_seq(g, &a);
    } else if (!strcmp(f, "date")) {
        int month = grammar_rule(g), day = grammar_rule(g);
        galt_str(g, &a, "0"); galt_range(g, &a, '1', '9'); grammar_add_alt(g, month, &a);
        galt_str(g, &a, "1"); galt_range(g, &a, '0', '2'); grammar_add_alt(g, month, &a);
        galt_str(g, &a, "0"); galt_range(g, &a, '1', '9'); grammar_add_alt(g, day, &a);
        galt_range(g, &a, '1', '2'); galt_range(g, &a, '0', '9'); grammar_add_alt(g, day, &a);
        galt_str(g, &a, "3"); galt_range(g, &a, '0', '1'); grammar_add_alt(g, day, &a);
        for (int k = 0; k < 4; k++) galt_range(g, &a, '0', '9');
        galt_str(g, &a, "-");
        galt_ref(&a, month);
        galt_str(g, &a, "-");
        galt_ref(&a, day);
        r = grammar_seq(g, &a);
    } else if (!strcmp(f, "time")) {
        int hour = grammar_rule(g);
        galt_range(g, &a, '0', '1'); galt_range(g, &a, '0', '9'); grammar_add_alt(g, hour, &a);
        galt_str(g, &a, "2"); galt_range(g, &a, '0', '3'); grammar_add_alt(g, hour, &a);
        galt_str(g, &a, "."); galt_range(g, &a, '0', '9'); galt_ref(&a, digits_rule(c));
        int frac = optional(g, &a);
        int zone = grammar_rule(g);
        galt_str(g, &a, "Z"); grammar_add_alt(g, zone, &a);
        uint64_t s[4] = { 0 };
        s['+' >> 6] |= 1ULL << ('+' & 63);
        s['-' >> 6] |= 1ULL << ('-' & 63);
        galt_set(g, &a, s);
        galt_ref(&a, hour); galt_str(g, &a, ":"); galt_range(g, &a, '0', '5'); galt_range(g, &a, '0', '9');
        grammar_add_alt(g, zone, &a);
        galt_ref(&a, hour);
        for (int k = 0; k < 2; k++) {
            galt_str(g, &a, ":"); galt_range(g, &a, '0', '5'); galt_range(g, &a, '0', '9');
        }
        galt_ref(&a, frac);
        galt_ref(&a, zone);
        r = grammar_seq(g, &a);
    } else {   /* date-time */
        galt_ref(&a, format_rule(c, "date"));
        galt_str(g, &a, "T");
        galt_ref(&a, format_rule(c, "time"));
        r = grammar_seq(g, &a);
    }
    galt_free(&a);
    return r;
}

static int string_rule(sctx *c, yajl_val s, const char *path)
{
    grammar *g = c->g;
    const char *f = json_string(json_get(s, "format"));
    if (json_get(s, "format") && (!f || !in_list(f, formats))) {
        char p[200];
        snprintf(p, sizeof p, "%s.format", path);
        fail(c, p, "format '%s' is not supported (date, time, date-time, uuid)", f ? f : "?");
        return -1;
    }
    long long lo = 0, hi = -1;
    if (!get_count(c, s, "minLength", path, &lo) || !get_count(c, s, "maxLength", path, &hi))
        return -1;
    galt a = { 0 };
    galt_str(g, &a, "\"");
    if (f) {
        if (lo || hi >= 0) {
            fail(c, path, "format with minLength or maxLength is not supported");
            galt_free(&a);
            return -1;
        }
        galt_ref(&a, format_rule(c, f));
    } else if (lo || hi >= 0) {
        if (hi >= 0 && hi < lo) {
            fail(c, path, "maxLength is below minLength");
            galt_free(&a);
            return -1;
        }
        galt_ref(&a, repeat_rule(c, "", "", "", jchar_rule(c), lo, hi));
    } else {
        if (c->jchars < 0) c->jchars = star(g, jchar_rule(c));
        galt_ref(&a, c->jchars);
    }
    galt_str(g, &a, "\"");
    int r = grammar_seq(g, &a);
    galt_free(&a);
    return r;
}

static int array_rule(sctx *c, yajl_val s, const char *path)
{
    long long lo = 0, hi = -1;
    if (!get_count(c, s, "minItems", path, &lo) || !get_count(c, s, "maxItems", path, &hi))
        return -1;
    if (hi >= 0 && hi < lo) {
        fail(c, path, "maxItems is below minItems");
        return -1;
    }
    yajl_val items = json_get(s, "items");
    char p[200];
    snprintf(p, sizeof p, "%s.items", path);
    int item = items ? schema_rule(c, items, p) : value_rule(c);
    if (item < 0) return -1;
    return repeat_rule(c, "[", "]", ",", item, lo, hi);
}

/* Properties in order, required ones always, optional ones maybe; each
 * member written by member(), joined by sep.  T[i][h]: members from i on,
 * h = whether one was written already. */
typedef struct {
    const char *name;
    int value;
    bool required;
} prop;

static int props_rule(sctx *c, const prop *ps, int n, const char *sep,
                      void (*member)(sctx *, galt *, const prop *))
{
    grammar *g = c->g;
    int (*t)[2] = malloc((size_t)(n + 1) * sizeof *t);
    if (!t) abort();
    for (int i = 0; i <= n; i++) { t[i][0] = grammar_rule(g); t[i][1] = grammar_rule(g); }
    galt a = { 0 };
    grammar_add_alt(g, t[n][0], &a);
    grammar_add_alt(g, t[n][1], &a);
    for (int i = n - 1; i >= 0; i--)
        for (int h = 0; h < 2; h++) {
            if (h) {
                galt_str(g, &a, sep);
                if (*sep == ',') galt_ref(&a, ws_rule(c));
            }
            member(c, &a, &ps[i]);
            galt_ref(&a, t[i + 1][1]);
            grammar_add_alt(g, t[i][h], &a);
            if (!ps[i].required) {
                galt_ref(&a, t[i + 1][h]);
                grammar_add_alt(g, t[i][h], &a);
            }
        }
    galt_free(&a);
    int r = t[0][0];
    free(t);
    return r;
}

static void json_member(sctx *c, galt *a, const prop *p)
{
    strbuf sb;
    sb_init(&sb);
    json_put_cstr(&sb, p->name);
    sb_putc(&sb, ':');
    galt_lit(c->g, a, sb.data, sb.len);
    galt_ref(a, ws_rule(c));
    galt_ref(a, p->value);
    sb_free(&sb);
}

/* Collect properties and required: returns n or -1. */
static int collect_props(sctx *c, yajl_val s, const char *path, prop **out,
                         int (*value)(sctx *, yajl_val, const char *, bool *), bool *raw)
{
    yajl_val props = json_get(s, "properties"), req = json_get(s, "required");
    char p[240];
    *out = NULL;
    if (props && !YAJL_IS_OBJECT(props)) {
        snprintf(p, sizeof p, "%s.properties", path);
        fail(c, p, "expected an object");
        return -1;
    }
    if (req && !YAJL_IS_ARRAY(req)) {
        snprintf(p, sizeof p, "%s.required", path);
        fail(c, p, "expected an array of property names");
        return -1;
    }
    size_t n = props ? props->u.object.len : 0;
    prop *ps = calloc(n + 1, sizeof *ps);
    if (!ps) abort();
    for (size_t i = 0; i < n; i++) {
        ps[i].name = props->u.object.keys[i];
        snprintf(p, sizeof p, "%s.properties.%s", path, ps[i].name);
        ps[i].value = value(c, props->u.object.values[i], p, raw ? &raw[i] : NULL);
        if (ps[i].value < 0) { free(ps); return -1; }
    }
    for (size_t k = 0; req && k < req->u.array.len; k++) {
        const char *name = json_string(req->u.array.values[k]);
        size_t i = 0;
        while (i < n && (!name || strcmp(ps[i].name, name))) i++;
        if (i == n) {
            snprintf(p, sizeof p, "%s.required[%zu]", path, k);
            fail(c, p, name ? "names '%s', which is not in properties"
                            : "expected a property name%s", name ? name : "");
            free(ps);
            return -1;
        }
        ps[i].required = true;
    }
    *out = ps;
    return (int)n;
}

static int plain_value(sctx *c, yajl_val s, const char *path, bool *raw)
{
    (void)raw;
    return schema_rule(c, s, path);
}

static int object_rule(sctx *c, yajl_val s, const char *path)
{
    grammar *g = c->g;
    yajl_val addl = json_get(s, "additionalProperties");
    char p[200];
    snprintf(p, sizeof p, "%s.additionalProperties", path);
    bool addl_false = addl && YAJL_IS_FALSE(addl);
    if (addl && !YAJL_IS_TRUE(addl) && !addl_false && !YAJL_IS_OBJECT(addl)) {
        fail(c, p, "expected a boolean or a schema");
        return -1;
    }
    if (!json_get(s, "properties") && !json_get(s, "required") && !addl_false) {
        /* a map: any keys, values under additionalProperties */
        int v = addl && YAJL_IS_OBJECT(addl) ? schema_rule(c, addl, p) : value_rule(c);
        return v < 0 ? -1 : list_rule(c, "{", "}", member_rule(c, v));
    }
    prop *ps;
    int n = collect_props(c, s, path, &ps, plain_value, NULL);
    if (n < 0) return -1;
    int body = props_rule(c, ps, n, ",", json_member);
    free(ps);
    galt a = { 0 };
    galt_str(g, &a, "{");
    galt_ref(&a, body);
    galt_str(g, &a, "}");
    int r = grammar_seq(g, &a);
    galt_free(&a);
    return r;
}

static int type_rule(sctx *c, const char *t, yajl_val s, const char *path)
{
    grammar *g = c->g;
    galt a = { 0 };
    int r = -1;
    if (!strcmp(t, "object")) return object_rule(c, s, path);
    if (!strcmp(t, "array")) return array_rule(c, s, path);
    if (!strcmp(t, "string")) return string_rule(c, s, path);
    if (!strcmp(t, "number")) return number_rule(c);
    if (!strcmp(t, "integer")) return integer_rule(c);
    if (!strcmp(t, "boolean")) {
        r = grammar_rule(g);
        galt_str(g, &a, "true");
        grammar_add_alt(g, r, &a);
        galt_str(g, &a, "false");
        grammar_add_alt(g, r, &a);
    } else if (!strcmp(t, "null")) {
        galt_str(g, &a, "null");
        r = grammar_seq(g, &a);
    } else {
        char p[200];
        snprintf(p, sizeof p, "%s.type", path);
        fail(c, p, "unknown type '%s'", t);
    }
    galt_free(&a);
    return r;
}

static int ref_rule_for(sctx *c, const char *ref, const char *path)
{
    for (int i = 0; i < c->n_refs; i++)
        if (!strcmp(c->refs[i].ref, ref)) return c->refs[i].rule;
    yajl_val target = NULL;
    char p[240];
    snprintf(p, sizeof p, "%s.$ref", path);
    if (!strcmp(ref, "#")) {
        target = c->root;
    } else {
        const char *name = NULL, *dir = NULL;
        if (!strncmp(ref, "#/$defs/", 8)) { dir = "$defs"; name = ref + 8; }
        else if (!strncmp(ref, "#/definitions/", 14)) { dir = "definitions"; name = ref + 14; }
        if (name && !strchr(name, '/') && !strchr(name, '~'))
            target = json_get(json_get(c->root, dir), name);
        if (!name || strchr(name, '/') || strchr(name, '~')) {
            fail(c, p, "'%s' is not supported: only #, #/$defs/NAME and "
                 "#/definitions/NAME", ref);
            return -1;
        }
    }
    if (!target) {
        fail(c, p, "'%s' names no definition", ref);
        return -1;
    }
    /* register first: the target may refer back to itself */
    int r = grammar_rule(c->g);
    if (c->n_refs == c->cap_refs) {
        c->cap_refs = c->cap_refs ? 2 * c->cap_refs : 8;
        c->refs = realloc(c->refs, (size_t)c->cap_refs * sizeof *c->refs);
        if (!c->refs) abort();
    }
    c->refs[c->n_refs++] = (ref_rule){ strdup(ref), r };
    char tp[240];
    snprintf(tp, sizeof tp, "%s%s", c->root_path, ref + 1);
    int body = schema_rule(c, target, tp);
    if (body < 0) return -1;
    galt a = { 0 };
    galt_ref(&a, body);
    grammar_add_alt(c->g, r, &a);
    galt_free(&a);
    return r;
}

static const char *const keywords[] = {
    "type", "properties", "required", "additionalProperties", "items", "minItems",
    "maxItems", "enum", "const", "anyOf", "$ref", "minLength", "maxLength", "format",
    NULL,
};

static int schema_rule(sctx *c, yajl_val s, const char *path)
{
    if (c->err->message[0]) return -1;
    if (s && YAJL_IS_TRUE(s)) return value_rule(c);
    if (!s || !YAJL_IS_OBJECT(s)) {
        fail(c, path, "expected a schema (an object)");
        return -1;
    }
    if (c->depth >= MAX_DEPTH) {
        fail(c, path, "schemas nested deeper than %d are not supported", MAX_DEPTH);
        return -1;
    }
    char p[240];
    int n_constraints = 0;
    for (size_t i = 0; i < s->u.object.len; i++) {
        const char *k = s->u.object.keys[i];
        if (in_list(k, annotations)) continue;
        if (!in_list(k, keywords)) {
            snprintf(p, sizeof p, "%s.%s", path, k);
            fail(c, p, "the JSON Schema keyword '%s' is not supported", k);
            return -1;
        }
        n_constraints++;
    }
    c->depth++;
    int r = -1;
    grammar *g = c->g;
    galt a = { 0 };
    yajl_val v;
    if ((v = json_get(s, "$ref"))) {
        if (!json_string(v)) fail(c, path, "$ref: expected a string");
        else if (n_constraints > 1) fail(c, path, "$ref beside other keywords is not supported");
        else r = ref_rule_for(c, v->u.string, path);
    } else if ((v = json_get(s, "anyOf"))) {
        snprintf(p, sizeof p, "%s.anyOf", path);
        if (!YAJL_IS_ARRAY(v) || !v->u.array.len) {
            fail(c, p, "expected a non-empty array of schemas");
        } else if (n_constraints > 1) {
            fail(c, path, "anyOf beside other keywords is not supported");
        } else {
            r = grammar_rule(g);
            for (size_t i = 0; i < v->u.array.len && r >= 0; i++) {
                snprintf(p, sizeof p, "%s.anyOf[%zu]", path, i);
                int alt = schema_rule(c, v->u.array.values[i], p);
                if (alt < 0) { r = -1; break; }
                galt_ref(&a, alt);
                grammar_add_alt(g, r, &a);
            }
        }
    } else if ((v = json_get(s, "enum"))) {
        snprintf(p, sizeof p, "%s.enum", path);
        if (!YAJL_IS_ARRAY(v) || !v->u.array.len) {
            fail(c, p, "expected a non-empty array");
        } else {
            r = grammar_rule(g);
            for (size_t i = 0; i < v->u.array.len; i++) {
                literal_alt(c, &a, v->u.array.values[i]);
                grammar_add_alt(g, r, &a);
            }
        }
    } else if ((v = json_get(s, "const"))) {
        literal_alt(c, &a, v);
        r = grammar_seq(g, &a);
    } else if ((v = json_get(s, "type"))) {
        if (json_string(v)) {
            r = type_rule(c, v->u.string, s, path);
        } else if (YAJL_IS_ARRAY(v) && v->u.array.len) {
            r = grammar_rule(g);
            for (size_t i = 0; i < v->u.array.len; i++) {
                const char *t = json_string(v->u.array.values[i]);
                int alt = t ? type_rule(c, t, s, path) : -1;
                if (!t) fail(c, path, "type: expected a string or an array of strings");
                if (alt < 0) { r = -1; break; }
                galt_ref(&a, alt);
                grammar_add_alt(g, r, &a);
            }
        } else {
            snprintf(p, sizeof p, "%s.type", path);
            fail(c, p, "expected a string or an array of strings");
        }
    } else if (json_get(s, "properties") || json_get(s, "required")
               || json_get(s, "additionalProperties")) {
        r = object_rule(c, s, path);
    } else if (json_get(s, "items") || json_get(s, "minItems") || json_get(s, "maxItems")) {
        r = array_rule(c, s, path);
    } else if (n_constraints) {
        r = string_rule(c, s, path);   /* format / minLength / maxLength */
    } else {
        r = value_rule(c);
    }
    galt_free(&a);
    c->depth--;
    return c->err->message[0] ? -1 : r;
}

int json_schema_rule(grammar *g, yajl_val schema, const char *path, schema_error *err)
{
    sctx c;
    init_ctx(&c, g, schema, path, err);
    int r = schema_rule(&c, schema, path);
    free_ctx(&c);
    return r;
}

int json_object_rule(grammar *g)
{
    sctx c;
    schema_error err;
    init_ctx(&c, g, NULL, "", &err);
    value_rule(&c);
    free_ctx(&c);
    return c.any_object;
}

/* ---- DSML tool calls ---- */

#define DSML "\xef\xbd\x9c" "DSML" "\xef\xbd\x9c"

/* A string="true" parameter: the schema is a plain string. */
static bool raw_string_schema(yajl_val s)
{
    if (!s || !YAJL_IS_OBJECT(s)) return false;
    if (json_get(s, "minLength") || json_get(s, "maxLength")) return false;
    const char *t = json_string(json_get(s, "type"));
    yajl_val e = json_get(s, "enum");
    if (e) {
        if (!YAJL_IS_ARRAY(e)) return false;
        for (size_t i = 0; i < e->u.array.len; i++)
            if (!json_string(e->u.array.values[i])) return false;
        return !t || !strcmp(t, "string");
    }
    if (json_get(s, "const")) return json_string(json_get(s, "const")) != NULL;
    return t && !strcmp(t, "string") && !json_get(s, "anyOf") && !json_get(s, "$ref");
}

static bool has_fullbar(const char *s) { return strstr(s, "\xef\xbd\x9c") != NULL; }

/* The raw text of a plain string schema (checked by schema_rule first). */
static int raw_value(sctx *c, yajl_val s, const char *path, bool *raw)
{
    int checked = schema_rule(c, s, path);
    if (checked < 0) return -1;
    *raw = raw_string_schema(s);
    if (!*raw) return checked;
    grammar *g = c->g;
    galt a = { 0 };
    yajl_val e = json_get(s, "enum"), k = json_get(s, "const");
    const char *f = json_string(json_get(s, "format"));
    int r;
    if (e || k) {
        r = grammar_rule(g);
        size_t n = e ? e->u.array.len : 1;
        for (size_t i = 0; i < n; i++) {
            const char *str = json_string(e ? e->u.array.values[i] : k);
            if (has_fullbar(str) || !*str) {   /* keep the JSON form */
                *raw = false;
                galt_free(&a);
                return checked;
            }
            galt_str(g, &a, str);
            grammar_add_alt(g, r, &a);
        }
    } else {
        r = f ? format_rule(c, f) : raw_chars_rule(c);
    }
    galt_free(&a);
    return r;
}

/* p->value is the whole parameter element (dsml_params) */
static void dsml_member(sctx *c, galt *a, const prop *p)
{
    (void)c;
    galt_ref(a, p->value);
}

static int dsml_params(sctx *c, yajl_val params, const char *path)
{
    grammar *g = c->g;
    prop *ps;
    bool raw[512] = { 0 };
    if (schema_rule(c, params, path) < 0) return -1;   /* every keyword checked */
    yajl_val props = json_get(params, "properties");
    if (props && YAJL_IS_OBJECT(props) && props->u.object.len > 512) {
        fail(c, path, "more than 512 parameters are not supported");
        return -1;
    }
    int n = collect_props(c, params, path, &ps, raw_value, raw);
    if (n < 0) return -1;
    /* each member: <PARAM name="K" string="B">VALUE</PARAM> */
    for (int i = 0; i < n; i++) {
        galt a = { 0 };
        strbuf sb;
        sb_init(&sb);
        sb_printf(&sb, "<" DSML "parameter name=\"%s\" string=\"%s\">", ps[i].name,
                  raw[i] ? "true" : "false");
        galt_lit(g, &a, sb.data, sb.len);
        galt_ref(&a, ps[i].value);
        galt_str(g, &a, "</" DSML "parameter>");
        ps[i].value = grammar_seq(g, &a);
        sb_free(&sb);
        galt_free(&a);
    }
    int r = props_rule(c, ps, n, "\n", dsml_member);
    free(ps);
    return r;
}

int dsml_tools_rule(grammar *g, yajl_val tools, const char *only_name, bool parallel,
                    bool opener, const char *path, schema_error *err)
{
    sctx c;
    init_ctx(&c, g, NULL, path, err);
    int invoke = grammar_rule(g), r = -1;
    int n_alts = 0;
    galt a = { 0 };
    char p[200];
    for (size_t i = 0; tools && YAJL_IS_ARRAY(tools) && i < tools->u.array.len; i++) {
        yajl_val fn = json_get(tools->u.array.values[i], "function");
        const char *name = json_string(json_get(fn, "name"));
        if (!name || (only_name && strcmp(name, only_name))) continue;
        yajl_val params = json_get(fn, "parameters");
        snprintf(p, sizeof p, "%s[%zu].function.parameters", path, i);
        if (params && !YAJL_IS_OBJECT(params)) {
            fail(&c, p, "expected an object schema");
            goto out;
        }
        const char *type = json_string(json_get(params, "type"));
        if (params && type && strcmp(type, "object")) {
            snprintf(p, sizeof p, "%s[%zu].function.parameters.type", path, i);
            fail(&c, p, "must be \"object\"");
            goto out;
        }
        if (has_fullbar(name) || strchr(name, '"')) {
            snprintf(p, sizeof p, "%s[%zu].function.name", path, i);
            fail(&c, p, "a name with '\"' or U+FF5C cannot be written in DSML");
            goto out;
        }
        c.root = params;
        c.root_path = p;
        for (int k = 0; k < c.n_refs; k++) free(c.refs[k].ref);
        c.n_refs = 0;   /* $refs are per schema */
        int body = params ? dsml_params(&c, params, p) : -1;
        if (!params) {   /* no parameters: an empty invoke */
            body = grammar_rule(g);
            grammar_add_alt(g, body, &a);
        }
        if (body < 0) goto out;
        strbuf sb;
        sb_init(&sb);
        sb_printf(&sb, "<" DSML "invoke name=\"%s\">\n", name);
        galt_lit(g, &a, sb.data, sb.len);
        sb_free(&sb);
        galt_ref(&a, body);
        galt_str(g, &a, "\n</" DSML "invoke>");
        grammar_add_alt(g, invoke, &a);
        n_alts++;
    }
    if (!n_alts) {
        fail(&c, path, only_name ? "no tool named '%s'" : "no function tools%s",
             only_name ? only_name : "");
        goto out;
    }
    int calls = parallel ? repeat_rule(&c, "", "", "\n", invoke, 1, -1) : invoke;
    galt_str(g, &a, opener ? "\n\n<" DSML "tool_calls>\n" : ">\n");
    galt_ref(&a, calls);
    galt_str(g, &a, "\n</" DSML "tool_calls>");
    r = grammar_seq(g, &a);
out:
    galt_free(&a);
    free_ctx(&c);
    return r;
}

/* KMP over the opener: K_k (k bytes of it matched) := b K_next(k, b) for
 * every byte, grouped by target, | "" ; the opener's last byte goes on
 * with the block's rest. */
int dsml_text_then_block_rule(grammar *g, int rest)
{
    static const char opener[] = "\n\n<" DSML "tool_calls";
    enum { L = sizeof opener - 1 };
    int fail[L + 1], k[L];
    fail[0] = -1;
    for (int i = 1, j = -1; i <= L; i++) {   /* classic prefix function */
        while (j >= 0 && opener[j] != opener[i - 1]) j = fail[j];
        fail[i] = ++j;
    }
    for (int i = 0; i < L; i++) k[i] = grammar_rule(g);
    galt a = { 0 };
    for (int i = 0; i < L; i++) {
        int target[256];
        for (int b = 0; b < 256; b++) {
            int j = i;
            while (j >= 0 && (uint8_t)opener[j] != b) j = fail[j];
            target[b] = j + 1;   /* 0..L */
        }
        for (int t = 0; t <= L; t++) {
            uint64_t set[4] = { 0 };
            bool any = false;
            for (int b = 0; b < 256; b++)
                if (target[b] == t) { set[b >> 6] |= 1ULL << (b & 63); any = true; }
            if (!any) continue;
            galt_set(g, &a, set);
            galt_ref(&a, t == L ? rest : k[t]);
            grammar_add_alt(g, k[i], &a);
        }
        grammar_add_alt(g, k[i], &a);   /* the text may end here */
    }
    galt_free(&a);
    return k[0];
}
