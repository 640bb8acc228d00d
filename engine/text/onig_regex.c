#include "onig_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onig_unicode.h"

struct onig_regex {
    pcre2_code *code;
};

struct onig_scratch {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *stack;
};

/* Unicode White_Space, which Oniguruma's \s is. */
static const char WHITE_SPACE[] =
    "\\t-\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

/* General category names PCRE2 and Oniguruma share, except C and Cn: code
 * points Unicode 15-16 assigned would have to leave those, and a class
 * can only gain members. */
static bool is_category(const char *name, size_t len)
{
    static const char *const names[] = {
        "L", "Lu", "Ll", "Lt", "Lm", "Lo", "M", "Mn", "Mc", "Me", "N", "Nd", "Nl", "No",
        "P", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "S", "Sm", "Sc", "Sk", "So",
        "Z", "Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co",
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strlen(names[i]) == len && memcmp(names[i], name, len) == 0) return true;
    return false;
}

/* Append, for use inside [...], the PCRE2 class items for category cat
 * ("L" or "Lu") plus the code points Oniguruma puts there and PCRE2's
 * older Unicode data does not. */
static void put_category(strbuf *out, const char *cat)
{
    sb_printf(out, "\\p{%s}", cat);
    size_t n = strlen(cat);
    for (size_t i = 0; i < onig_unicode_gap_len; i++) {
        const onig_gc_range *r = &onig_unicode_gap[i];
        if (strncmp(r->gc, cat, n) != 0) continue;
        if (r->lo == r->hi) sb_printf(out, "\\x{%X}", r->lo);
        else sb_printf(out, "\\x{%X}-\\x{%X}", r->lo, r->hi);
    }
}

static void put_word(strbuf *out)
{
    sb_puts(out, "\\p{Alphabetic}\\p{Join_Control}");
    put_category(out, "L");
    put_category(out, "M");
    put_category(out, "N");
    put_category(out, "Pc");
}

/* Emit a set (cat names the category of SET_CATEGORY): as class items
 * inside [...], else as a class of its own; negated sets outside a class
 * become [^...]. */
enum set { SET_SPACE, SET_WORD, SET_CATEGORY, SET_HEX };

static void put_set(strbuf *out, enum set set, const char *cat, bool negate, bool in_class)
{
    if (!in_class) sb_puts(out, negate ? "[^" : "[");
    switch (set) {
    case SET_SPACE: sb_puts(out, WHITE_SPACE); break;
    case SET_WORD: put_word(out); break;
    case SET_CATEGORY: put_category(out, cat); break;
    case SET_HEX: sb_puts(out, "0-9a-fA-F"); break;
    }
    if (!in_class) sb_putc(out, ']');
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Length of the UTF-8 character starting with byte c (1 for stray bytes). */
static size_t char_len(unsigned char c)
{
    return c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
}

int onig_regex_translate(const char *p, size_t len, strbuf *out, char *err, size_t errlen)
{
    bool in_class = false;
    size_t i = 0;
    while (i < len) {
        char c = p[i];
        if (c == '[') {
            if (in_class) {
                /* POSIX [:name:] passes; a nested class would change meaning. */
                if (i + 1 < len && p[i + 1] == ':') {
                    const char *end = memchr(p + i + 2, ']', len - i - 2);
                    if (!end) break;
                    sb_append(out, p + i, (size_t)(end - (p + i)) + 1);
                    i = (size_t)(end - p) + 1;
                    continue;
                }
                snprintf(err, errlen, "nested character class at offset %zu is not supported", i);
                return -1;
            }
            in_class = true;
            sb_putc(out, '[');
            i++;
            if (i < len && p[i] == '^') sb_putc(out, p[i++]);
            if (i < len && p[i] == ']') sb_putc(out, p[i++]);   /* literal ] */
            continue;
        }
        if (c == ']' && in_class) {
            in_class = false;
            sb_putc(out, c);
            i++;
            continue;
        }
        if (c == '&' && in_class && i + 1 < len && p[i + 1] == '&') {
            snprintf(err, errlen, "class intersection && at offset %zu is not supported", i);
            return -1;
        }
        if (c != '\\' || i + 1 >= len) {
            size_t n = char_len((unsigned char)c);
            if (n > len - i) n = len - i;
            sb_append(out, p + i, n);
            i += n;
            continue;
        }
        char e = p[i + 1];
        switch (e) {
        case 's': case 'w': case 'd': case 'h': {
            enum set set = e == 's' ? SET_SPACE : e == 'w' ? SET_WORD : e == 'd' ? SET_CATEGORY : SET_HEX;
            put_set(out, set, "Nd", false, in_class);
            i += 2;
            continue;
        }
        case 'S': case 'W': case 'D': case 'H': {
            enum set set = e == 'S' ? SET_SPACE : e == 'W' ? SET_WORD : e == 'D' ? SET_CATEGORY : SET_HEX;
            if (in_class && set == SET_HEX) {
                snprintf(err, errlen, "\\H inside a character class (offset %zu) is not supported", i);
                return -1;
            }
            if (in_class) sb_append(out, p + i, 2);     /* PCRE2's meaning */
            else put_set(out, set, "Nd", true, false);
            i += 2;
            continue;
        }
        case 'p': case 'P': {
            const char *open = p + i + 2, *close;
            if (i + 2 >= len || *open != '{' || !(close = memchr(open, '}', len - i - 2))) break;
            const char *name = open + 1;
            size_t nlen = (size_t)(close - name);
            bool negate = e == 'P';
            if (nlen && name[0] == '^') { negate = !negate; name++; nlen--; }
            if (is_category(name, nlen) && !(negate && in_class)) {
                char cat[3] = { name[0], nlen > 1 ? name[1] : 0, 0 };
                put_set(out, SET_CATEGORY, cat, negate, in_class);
            } else {
                sb_printf(out, "\\%c{%.*s}", negate ? 'P' : 'p', (int)nlen, name);
            }
            i = (size_t)(close - p) + 1;
            continue;
        }
        case 'u':
            if (i + 5 < len && hexval(p[i + 2]) >= 0 && hexval(p[i + 3]) >= 0
                && hexval(p[i + 4]) >= 0 && hexval(p[i + 5]) >= 0) {
                sb_printf(out, "\\x{%.4s}", p + i + 2);
                i += 6;
                continue;
            }
            break;
        }
        /* Any other escape means the same in both engines. */
        size_t n = char_len((unsigned char)e);
        if (n > len - i - 1) n = len - i - 1;
        sb_append(out, p + i, 1 + n);
        i += 1 + n;
    }
    return 0;
}

onig_regex *onig_regex_compile(const char *pattern, size_t len, bool literal,
                               char *err, size_t errlen)
{
    strbuf pat;
    sb_init(&pat);
    if (literal) sb_append(&pat, pattern, len);
    else if (onig_regex_translate(pattern, len, &pat, err, errlen)) {
        sb_free(&pat);
        return NULL;
    }
    pcre2_compile_context *cctx = pcre2_compile_context_create(NULL);
    pcre2_set_newline(cctx, PCRE2_NEWLINE_LF);
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP | PCRE2_MULTILINE);
    int code;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat.data, pat.len, opts, &code, &off, cctx);
    pcre2_compile_context_free(cctx);
    sb_free(&pat);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        snprintf(err, errlen, "%s (PCRE2, at offset %zu of the translated pattern)",
                 (char *)msg, (size_t)off);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);   /* the interpreter remains if JIT is absent */
    onig_regex *r = malloc(sizeof *r);
    if (!r) abort();
    r->code = re;
    return r;
}

void onig_regex_free(onig_regex *re)
{
    if (!re) return;
    pcre2_code_free(re->code);
    free(re);
}

onig_scratch *onig_scratch_new(void)
{
    onig_scratch *sc = malloc(sizeof *sc);
    if (!sc) abort();
    sc->md = pcre2_match_data_create(1, NULL);
    sc->mctx = pcre2_match_context_create(NULL);
    sc->stack = NULL;       /* made on first need: see match() */
    if (!sc->md || !sc->mctx) abort();
    return sc;
}

void onig_scratch_free(onig_scratch *sc)
{
    if (!sc) return;
    pcre2_match_data_free(sc->md);
    pcre2_match_context_free(sc->mctx);
    pcre2_jit_stack_free(sc->stack);
    free(sc);
}

void onig_spans_free(onig_spans *s)
{
    free(s->v);
    s->v = NULL;
    s->n = s->cap = 0;
}

static void spans_push(onig_spans *s, size_t start, size_t end)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 64;
        s->v = realloc(s->v, s->cap * sizeof *s->v);
        if (!s->v) abort();
    }
    s->v[s->n++] = (onig_span){ start, end };
}

/* pcre2_match, moving to a large JIT stack when PCRE2's default 32 KiB
 * one runs out (deep backtracking over long whitespace runs). */
static int match(const onig_regex *re, onig_scratch *sc, const char *s, size_t n, size_t pos,
                 uint32_t opts)
{
    int rc = pcre2_match(re->code, (PCRE2_SPTR)s, n, pos, opts, sc->md, sc->mctx);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !sc->stack) {
        sc->stack = pcre2_jit_stack_create(256 * 1024, 256 * 1024 * 1024, NULL);
        if (!sc->stack) return rc;
        pcre2_jit_stack_assign(sc->mctx, NULL, sc->stack);
        rc = pcre2_match(re->code, (PCRE2_SPTR)s, n, pos, opts, sc->md, sc->mctx);
    }
    return rc;
}

int onig_regex_find_all(const onig_regex *re, onig_scratch *sc,
                        const char *s, size_t n, onig_spans *out)
{
    size_t pos = 0, last_end = 0;
    bool matched = false;
    while (pos <= n) {
        int rc = match(re, sc, s, n, pos, PCRE2_NO_UTF_CHECK);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) return rc;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(sc->md);
        size_t ms = ov[0], me = ov[1];
        if (ms == me && matched && me == last_end) {
            /* No empty match right after the previous one: step a char. */
            pos += pos < n ? char_len((unsigned char)s[pos]) : 1;
            continue;
        }
        spans_push(out, ms, me);
        pos = last_end = me;
        matched = true;
    }
    return 0;
}

bool onig_regex_match_here(const onig_regex *re, onig_scratch *sc, const char *s, size_t n)
{
    return match(re, sc, s, n, 0, PCRE2_NO_UTF_CHECK | PCRE2_ANCHORED) > 0;
}
