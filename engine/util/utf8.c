#include "utf8.h"

#include <string.h>

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

int utf8_decode(const unsigned char *s, size_t n, uint32_t *cp)
{
    if (n == 0) return 0;
    int len = utf8_seq(s, n);
    if (len <= 0) return 0;
    static const unsigned char mask[5] = { 0, 0x7F, 0x1F, 0x0F, 0x07 };
    uint32_t c = s[0] & mask[len];
    for (int i = 1; i < len; i++) c = (c << 6) | (s[i] & 0x3F);
    *cp = c;
    return len;
}

size_t utf8_valid_prefix(const char *s, size_t n)
{
    size_t bad;
    return utf8_valid(s, n, &bad) ? n : bad;
}

int utf8_encode(uint32_t cp, char out[4])
{
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

void utf8_stream_init(utf8_stream *r) { r->nheld = 0; }

void utf8_stream_feed(utf8_stream *r, const char *s, size_t n, strbuf *out)
{
    if (!r->nheld) {
        size_t used = utf8_repair(out, s, n, false);
        r->nheld = (int)(n - used);          /* an incomplete tail, < 4 bytes */
        memcpy(r->held, s + used, (size_t)r->nheld);
        return;
    }
    /* Complete the held tail with as few new bytes as it can take, then
     * carry on with the rest of s in place. */
    char tmp[8];
    size_t k = n < 4 ? n : 4;
    memcpy(tmp, r->held, (size_t)r->nheld);
    memcpy(tmp + r->nheld, s, k);
    size_t held = (size_t)r->nheld, total = held + k;
    strbuf part;
    sb_init(&part);
    size_t used = utf8_repair(&part, tmp, held + 1, false);
    size_t m = held + 1;
    while (used == 0 && m < total) used = (sb_reset(&part), utf8_repair(&part, tmp, ++m, false));
    if (used == 0) {                         /* still incomplete */
        memcpy(r->held, tmp, total);
        r->nheld = (int)total;
        sb_free(&part);
        return;
    }
    sb_append(out, part.data, part.len);
    sb_free(&part);
    r->nheld = 0;
    /* used >= held: the held bytes were resolved (kept or replaced) */
    utf8_stream_feed(r, s + (used - held), n - (used - held), out);
}

void utf8_stream_finish(utf8_stream *r, strbuf *out)
{
    if (r->nheld) utf8_repair(out, r->held, (size_t)r->nheld, true);
    r->nheld = 0;
}
