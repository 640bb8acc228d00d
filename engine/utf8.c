#include "utf8.h"

int utf8_seq(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    int len;
    unsigned char lo = 0x80, hi = 0xBF;   /* allowed range of the 2nd byte */
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;         /* overlong */
        if (c == 0xED) hi = 0x9F;         /* surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;         /* overlong */
        if (c == 0xF4) hi = 0x8F;         /* above U+10FFFF */
    } else {
        return -1;
    }
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n) return 0;
        unsigned char b = s[i];
        bool good = i == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
        if (!good) return -i;
    }
    return len;
}

bool utf8_valid(const char *s, size_t n, size_t *bad_at)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0x80) { i++; continue; }
        int r = utf8_seq(u + i, n - i);
        if (r <= 0) {
            if (bad_at) *bad_at = i;
            return false;
        }
        i += (size_t)r;
    }
    return true;
}

size_t utf8_repair(strbuf *sb, const char *s, size_t n, bool final)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0;   /* run: well-formed bytes not yet copied */
    while (i < n) {
        if (u[i] < 0x80) { i++; run++; continue; }
        int r = utf8_seq(u + i, n - i);
        if (r > 0) {
            i += (size_t)r;
            run += (size_t)r;
            continue;
        }
        if (r == 0 && !final) break;
        sb_append(sb, s + i - run, run);
        run = 0;
        sb_puts(sb, "\xEF\xBF\xBD");
        i += r == 0 ? n - i : (size_t)-r;
    }
    sb_append(sb, s + i - run, run);
    return i;
}
