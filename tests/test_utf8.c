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

int main(void)
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
    return exit_status();
}
