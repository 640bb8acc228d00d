/* UTF-8: strict validation, encoding, and the lossy repair HF's decoders
 * apply to decoded bytes (Rust's String::from_utf8_lossy: each maximal
 * invalid subpart becomes one U+FFFD), in a streaming form. */
#ifndef LLM_UTF8_H
#define LLM_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strbuf.h"

/* Decode the code point at s[0..n).  Returns its length (1-4) and sets *cp,
 * or 0 when the bytes there are not valid UTF-8 (overlong forms, surrogates
 * and values above U+10FFFF are invalid). */
int utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);

/* Offset of the first byte that does not belong to valid UTF-8; n when the
 * whole text is valid. */
size_t utf8_valid_prefix(const char *s, size_t n);

/* Write cp (at most U+10FFFF) as UTF-8 into out; returns the length. */
int utf8_encode(uint32_t cp, char out[4]);

/* Streaming repair: bytes in, valid UTF-8 out.  A sequence that is still
 * incomplete at the end of a feed is held back until the next feed shows
 * whether it completes; utf8_repair_finish turns a held tail into U+FFFD.
 * Feeding a byte string in any number of pieces gives exactly
 * from_utf8_lossy of the whole string. */
typedef struct {
    unsigned char held[4];
    int nheld;
} utf8_repair;

void utf8_repair_init(utf8_repair *r);
void utf8_repair_feed(utf8_repair *r, const char *s, size_t n, strbuf *out);
void utf8_repair_finish(utf8_repair *r, strbuf *out);

#endif
