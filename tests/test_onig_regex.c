/* Oniguruma-compatible regexes on PCRE2.  Expected matches are what HF
 * tokenizers 0.23.2's regex engine does (probed through its Split
 * pre-tokenizer; tools/hf_unicode_categories.cjs does the same for all of
 * Unicode). */
#include <stdlib.h>
#include <string.h>

#include "onig_regex.h"
#include "onig_unicode.h"
#include "tap.h"
#include "utf8.h"

static onig_scratch *sc;

static onig_regex *compile(const char *pat)
{
    char err[256];
    onig_regex *re = onig_regex_compile(pat, strlen(pat), false, err, sizeof err);
    if (!re) diag("%s: %s", pat, err);
    return re;
}

/* Whether pat matches the whole of the one code point cp. */
static bool matches_cp(const char *pat, uint32_t cp)
{
    onig_regex *re = compile(pat);
    char s[4];
    int n = utf8_encode(cp, s);
    onig_spans sp = { 0 };
    bool hit = re && onig_regex_find_all(re, sc, s, (size_t)n, &sp) == 0 && sp.n == 1
               && sp.v[0].start == 0 && sp.v[0].end == (size_t)n;
    onig_spans_free(&sp);
    onig_regex_free(re);
    return hit;
}

static void test_classes(void)
{
    static const struct { const char *pat; uint32_t cp; bool hit; } cases[] = {
        { "\\s", 0x85, true }, { "\\s", 0xA0, true }, { "\\s", 0x3000, true }, { "\\s", 0x2028, true },
        { "\\s", 0x0B, true }, { "\\s", 0x180E, false }, { "\\s", 0x200B, false }, { "\\s", 0x1C, false },
        { "\\S", 0x180E, true }, { "\\S", 0x85, false },
        { "[\\s]", 0x85, true }, { "[^\\s]", 0x3000, false },
        { "\\w", 0x301, true }, { "\\w", 0x203F, true }, { "\\w", 0xBD, true }, { "\\w", 0x216B, true },
        { "\\w", 0x200D, true }, { "\\w", 0x24B6, true }, { "\\w", '-', false },
        { "\\d", 0x663, true }, { "\\d", 0xBD, false },
        { "\\h", 'f', true }, { "\\h", ' ', false }, { "\\H", 'g', true },
        { "\\p{L}", 0x10D50, true },     /* Garay, Unicode 16.0 */
        { "\\p{L}", 0x2EBF0, true },     /* CJK Extension I, 15.1 */
        { "\\p{Lo}", 0x31350, true },    /* CJK Extension H, 15.0 */
        { "\\p{L}", 0x323B0, false },    /* CJK Extension J, 17.0: not yet in HF */
        { "\\p{So}", 0x1FAE8, true },    /* shaking face, 15.0 */
        { "\\P{L}", 0x10D50, false }, { "[^\\p{L}]", 0x10D50, false },
        { "[^\\r\\n\\p{L}\\p{P}\\p{S}]", 0x1FAE8, false },
        { "\\p{^N}", '5', false }, { "\\u0041", 'A', true },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        is_int(matches_cp(cases[i].pat, cases[i].cp), cases[i].hit, "%s %s U+%04X", cases[i].pat,
               cases[i].hit ? "matches" : "does not match", cases[i].cp);
    /* Every code point of the Unicode 15/16 table reaches its category. */
    size_t missed = 0;
    for (size_t i = 0; i < onig_unicode_gap_len; i++) {
        char pat[16];
        snprintf(pat, sizeof pat, "\\p{%s}", onig_unicode_gap[i].gc);
        missed += !matches_cp(pat, onig_unicode_gap[i].lo) + !matches_cp(pat, onig_unicode_gap[i].hi);
    }
    is_int(missed, 0, "all %zu Unicode 15-16 ranges match their category", onig_unicode_gap_len);
}

static void test_find_all(void)
{
    /* onig's find_iter: an empty match is allowed, but not right after the
     * previous match (HF splits "abxxc" by x* into a, b, xx, c). */
    onig_regex *re = compile("x*");
    onig_spans sp = { 0 };
    onig_regex_find_all(re, sc, "abxxc", 5, &sp);
    static const size_t want[][2] = { { 0, 0 }, { 1, 1 }, { 2, 4 }, { 5, 5 } };
    bool same = sp.n == 4;
    for (size_t i = 0; same && i < 4; i++) same = sp.v[i].start == want[i][0] && sp.v[i].end == want[i][1];
    ok(same, "x* over abxxc: (0,0) (1,1) (2,4) (5,5)");
    onig_regex_free(re);
    sp.n = 0;
    /* A space run before a word gives up its last space; a trailing run goes whole. */
    re = compile("\\s+(?!\\S)|\\s+");
    onig_regex_find_all(re, sc, "a   b  ", 7, &sp);
    ok(sp.n == 3 && sp.v[0].start == 1 && sp.v[0].end == 3 && sp.v[1].start == 3 && sp.v[1].end == 4
       && sp.v[2].start == 5 && sp.v[2].end == 7,
       "\\s+(?!\\S) leaves one space before a word, takes a trailing run whole");
    onig_regex_free(re);
    sp.n = 0;
    re = compile("^a");
    onig_regex_find_all(re, sc, "a\na", 3, &sp);
    ok(sp.n == 2 && sp.v[1].start == 2, "^ anchors at line starts, as in Ruby syntax");
    onig_regex_free(re);
    sp.n = 0;
    char err[256];
    re = onig_regex_compile("a.b", 3, true, err, sizeof err);
    ok(re && onig_regex_find_all(re, sc, "axb a.b", 7, &sp) == 0 && sp.n == 1 && sp.v[0].start == 4,
       "literal pattern matches only itself");
    onig_regex_free(re);
    onig_spans_free(&sp);
}

/* Deep backtracking outgrows PCRE2's default JIT stack; matching must
 * carry on with a bigger one rather than fail. */
static void test_deep(void)
{
    size_t n = 400000;
    char *s = malloc(n + 1);
    for (size_t i = 0; i < n; i++) s[i] = "ab"[i % 2];
    s[n] = 'c';
    onig_regex *re = compile("(?:a|b)*c");
    onig_spans sp = { 0 };
    int rc = onig_regex_find_all(re, sc, s, n + 1, &sp);
    ok(rc == 0 && sp.n == 1 && sp.v[0].start == 0 && sp.v[0].end == n + 1,
       "(?:a|b)*c over %zu bytes matches whole (rc %d)", n + 1, rc);
    onig_spans_free(&sp);
    onig_regex_free(re);
    free(s);
}

static void test_errors(void)
{
    char err[256];
    ok(!onig_regex_compile("[a[b]]", 6, false, err, sizeof err) && strstr(err, "nested"),
       "nested class is an error: %s", err);
    ok(!onig_regex_compile("(ab", 3, false, err, sizeof err) && strstr(err, "PCRE2"),
       "syntax error reported: %s", err);
    ok(!onig_regex_compile("[a-z&&[^b]]", 11, false, err, sizeof err), "class intersection is an error");
}

int main(void)
{
    sc = onig_scratch_new();
    test_classes();
    test_find_all();
    test_deep();
    test_errors();
    onig_scratch_free(sc);
    return exit_status();
}
