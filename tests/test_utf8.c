/* UTF-8 validation and repair; expected bytes are Python's
 * bytes.decode("utf-8", "replace").encode(). */
#include <stdbool.h>
#include <string.h>

#include "tap.h"
#include "utf8.h"

static const struct { const char *in; size_t n; const char *want; } cases[] = {
    { "\x61\x62\x63", 3, "\x61\x62\x63" },
    { "\xff", 1, "\xef\xbf\xbd" },
    { "\x61\xc3", 2, "\x61\xef\xbf\xbd" },
    { "\xc3\xa9", 2, "\xc3\xa9" },
    { "\xe2\x82", 2, "\xef\xbf\xbd" },
    { "\xe2\x82\xac", 3, "\xe2\x82\xac" },
    { "\xe2\x82\x41", 3, "\xef\xbf\xbd\x41" },
    { "\xed\xa0\x80", 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd" },
    { "\xf0\x9f\x9a\x80", 4, "\xf0\x9f\x9a\x80" },
    { "\xf0\x9f\x9a", 3, "\xef\xbf\xbd" },
    { "\xf4\x90\x80\x80", 4, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd" },
    { "\xc0\xaf", 2, "\xef\xbf\xbd\xef\xbf\xbd" },
    { "\xe0\x80\xaf", 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd" },
    { "\xf5\x80", 2, "\xef\xbf\xbd\xef\xbf\xbd" },
    { "\x80\x80", 2, "\xef\xbf\xbd\xef\xbf\xbd" },
    { "\xf0\x8f\xbf\xbf", 4, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd" },
    { "\x61\xe4\xbd\xe4\xbd\xa0\x62", 7, "\x61\xef\xbf\xbd\xe4\xbd\xa0\x62" },
};

static void test_python_cases(void)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        strbuf whole, pieces;
        sb_init(&whole);
        sb_init(&pieces);
        utf8_repair(&whole, cases[i].in, cases[i].n, true);
        /* Byte by byte, each call keeping what it could not finish. */
        char pend[8];
        size_t np = 0;
        for (size_t k = 0; k < cases[i].n; k++) {
            pend[np++] = cases[i].in[k];
            size_t used = utf8_repair(&pieces, pend, np, false);
            memmove(pend, pend + used, np - used);
            np -= used;
        }
        utf8_repair(&pieces, pend, np, true);
        ok(whole.len == strlen(cases[i].want) && !memcmp(whole.data, cases[i].want, whole.len)
           && pieces.len == whole.len && !memcmp(pieces.data, whole.data, whole.len),
           "repair case %zu, whole and byte by byte", i);
        bool valid = !strcmp(cases[i].want, cases[i].in) && strlen(cases[i].in) == cases[i].n;
        ok(utf8_valid(cases[i].in, cases[i].n, NULL) == valid, "valid() of case %zu is %d", i, valid);
        sb_free(&whole);
        sb_free(&pieces);
    }
    size_t bad = 99;
    ok(!utf8_valid("ab\xc3(", 4, &bad) && bad == 2, "bad_at points at the ill-formed byte");
    is_int(utf8_seq((const unsigned char *)"\xf0\x9f", 2), 0, "incomplete prefix");
    is_int(utf8_seq((const unsigned char *)"\xf0\x9f\x41", 3), -2, "maximal subpart of 2");

}
#define R "\xEF\xBF\xBD"

static const struct {
    const char *in, *out;
    const char *what;
} repairs[] = {
    { "\xC0\xAF\xE0\x80\xBF\xF0\x81\x82\x41", R R R R R R R R "A", "non-shortest forms (table 3-8)" },
    { "\xED\xA0\x80\xED\xBF\xBF\xED\xAF\x41", R R R R R R R R "A", "surrogates (table 3-9)" },
    { "\xF4\x91\x92\x93\xFF\x41\x80\xBF\x42", R R R R R "A" R R "B", "other ill-formed (table 3-10)" },
    { "\xE1\x80\xE2\xF0\x91\x92\xF1\xBF\x41", R R R R "A", "truncated sequences (table 3-11)" },
    { "a\xE4\xB8", "a" R, "incomplete at the end" },
    { "\xE4\xB8\xAD\xF0\x9F\x98\x80z", "\xE4\xB8\xAD\xF0\x9F\x98\x80z", "valid text passes" },
};

static void test_decode(void)
{
    uint32_t cp;
    is_int(utf8_decode((const unsigned char *)"\xF0\x9F\x98\x80", 4, &cp), 4, "4-byte sequence");
    is_int(cp, 0x1F600, "U+1F600 decoded");
    is_int(utf8_decode((const unsigned char *)"\xC0\x80", 2, &cp), 0, "overlong NUL rejected");
    is_int(utf8_decode((const unsigned char *)"\xED\xA0\x80", 3, &cp), 0, "surrogate rejected");
    is_int(utf8_decode((const unsigned char *)"\xF4\x90\x80\x80", 4, &cp), 0, "above U+10FFFF rejected");
    is_int(utf8_decode((const unsigned char *)"\xF4\x8F\xBF\xBF", 4, &cp), 4, "U+10FFFF accepted");
    is_int(utf8_decode((const unsigned char *)"\xE4\xB8", 2, &cp), 0, "truncated rejected");
    is_int(utf8_valid_prefix("ab\xE4\xB8\xADx\xFFy", 8), 6, "first invalid byte offset");
    is_int(utf8_valid_prefix("a\0b", 3), 3, "NUL is valid UTF-8");
    char buf[4];
    is_int(utf8_encode(0x10FFFF, buf), 4, "encode U+10FFFF length");
    ok(!memcmp(buf, "\xF4\x8F\xBF\xBF", 4), "encode U+10FFFF bytes");
}

static void test_repair(void)
{
    for (size_t i = 0; i < sizeof repairs / sizeof repairs[0]; i++) {
        const char *in = repairs[i].in;
        size_t n = strlen(in);
        strbuf whole, bytewise;
        sb_init(&whole);
        sb_init(&bytewise);
        utf8_stream r;
        utf8_stream_init(&r);
        utf8_stream_feed(&r, in, n, &whole);
        utf8_stream_finish(&r, &whole);
        is_str(whole.data, repairs[i].out, "repair %s", repairs[i].what);
        utf8_stream_init(&r);
        bool chunks_valid = true;
        for (size_t k = 0; k < n; k++) {
            size_t before = bytewise.len;
            utf8_stream_feed(&r, in + k, 1, &bytewise);
            chunks_valid &= utf8_valid_prefix(bytewise.data + before, bytewise.len - before)
                            == bytewise.len - before;
        }
        utf8_stream_finish(&r, &bytewise);
        ok(chunks_valid && !strcmp(bytewise.data, repairs[i].out), "byte by byte: %s", repairs[i].what);
        sb_free(&whole);
        sb_free(&bytewise);
    }
}

int main(void)
{
    test_python_cases();
    test_decode();
    test_repair();
    return exit_status();
}
