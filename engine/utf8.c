#include "utf8.h"

#include <string.h>

/* Sequence length announced by a lead byte; 0 for bytes that cannot start
 * a sequence (continuations, C0, C1, F5..FF). */
static int lead_len(unsigned char b)
{
    if (b < 0x80) return 1;
    if (b >= 0xC2 && b <= 0xDF) return 2;
    if (b >= 0xE0 && b <= 0xEF) return 3;
    if (b >= 0xF0 && b <= 0xF4) return 4;
    return 0;
}

/* Whether b may follow the bytes held so far (lead = held[0], at position
 * pos >= 1).  The second byte's range excludes overlongs, surrogates and
 * code points above U+10FFFF. */
static bool continues(unsigned char lead, int pos, unsigned char b)
{
    if (pos == 1) {
        switch (lead) {
        case 0xE0: return b >= 0xA0 && b <= 0xBF;
        case 0xED: return b >= 0x80 && b <= 0x9F;
        case 0xF0: return b >= 0x90 && b <= 0xBF;
        case 0xF4: return b >= 0x80 && b <= 0x8F;
        }
    }
    return b >= 0x80 && b <= 0xBF;
}

int utf8_decode(const unsigned char *s, size_t n, uint32_t *cp)
{
    if (n == 0) return 0;
    int len = lead_len(s[0]);
    if (len == 0 || (size_t)len > n) return 0;
    for (int i = 1; i < len; i++)
        if (!continues(s[0], i, s[i])) return 0;
    static const unsigned char mask[5] = { 0, 0x7F, 0x1F, 0x0F, 0x07 };
    uint32_t c = s[0] & mask[len];
    for (int i = 1; i < len; i++) c = (c << 6) | (s[i] & 0x3F);
    *cp = c;
    return len;
}

size_t utf8_valid_prefix(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (p[i] < 0x80) { i++; continue; }
        uint32_t cp;
        int len = utf8_decode(p + i, n - i, &cp);
        if (!len) return i;
        i += (size_t)len;
    }
    return n;
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

static const char REPLACEMENT[] = "\xEF\xBF\xBD";

void utf8_repair_init(utf8_repair *r) { r->nheld = 0; }

void utf8_repair_feed(utf8_repair *r, const char *s, size_t n, strbuf *out)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (r->nheld == 0) {
            /* Copy the valid run in one go; stop at the first bad or
             * incomplete sequence. */
            size_t ok = utf8_valid_prefix((const char *)p + i, n - i);
            sb_append(out, p + i, ok);
            i += ok;
            if (i == n) break;
            if (lead_len(p[i]) == 0) {
                sb_append(out, REPLACEMENT, 3);
                i++;
                continue;
            }
            r->held[r->nheld++] = p[i++];
            continue;
        }
        unsigned char b = p[i];
        if (!continues(r->held[0], r->nheld, b)) {
            /* The held bytes are a maximal invalid subpart; b starts anew. */
            sb_append(out, REPLACEMENT, 3);
            r->nheld = 0;
            continue;
        }
        r->held[r->nheld++] = b;
        i++;
        if (r->nheld == lead_len(r->held[0])) {
            sb_append(out, r->held, (size_t)r->nheld);
            r->nheld = 0;
        }
    }
}

void utf8_repair_finish(utf8_repair *r, strbuf *out)
{
    if (r->nheld) sb_append(out, REPLACEMENT, 3);
    r->nheld = 0;
}
