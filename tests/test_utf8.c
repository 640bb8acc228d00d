/* UTF-8 validation and lossy repair.  The repair cases are the Unicode
 * Standard's examples of U+FFFD substitution of maximal subparts (chapter
 * 3, tables 3-8 to 3-11), which Rust's from_utf8_lossy, and so HF's
 * decoders, follow. */
#include <string.h>

#include "tap.h"
#include "utf8.h"

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
        utf8_repair r;
        utf8_repair_init(&r);
        utf8_repair_feed(&r, in, n, &whole);
        utf8_repair_finish(&r, &whole);
        is_str(whole.data, repairs[i].out, "repair %s", repairs[i].what);
        utf8_repair_init(&r);
        bool chunks_valid = true;
        for (size_t k = 0; k < n; k++) {
            size_t before = bytewise.len;
            utf8_repair_feed(&r, in + k, 1, &bytewise);
            chunks_valid &= utf8_valid_prefix(bytewise.data + before, bytewise.len - before)
                            == bytewise.len - before;
        }
        utf8_repair_finish(&r, &bytewise);
        ok(chunks_valid && !strcmp(bytewise.data, repairs[i].out), "byte by byte: %s", repairs[i].what);
        sb_free(&whole);
        sb_free(&bytewise);
    }
}

int main(void)
{
    test_decode();
    test_repair();
    return exit_status();
}
