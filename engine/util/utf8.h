/* Strict UTF-8 (Unicode Table 3-7: no overlongs, no surrogates, nothing
 * above U+10FFFF), encoding and decoding of code points, and repair of
 * invalid input the way Python's bytes.decode("utf-8", "replace") and
 * Rust's String::from_utf8_lossy (so HF's decoders) do it: each maximal
 * ill-formed subpart becomes one U+FFFD.  Used to reject bad requests, to
 * tokenize, and to keep model output valid text when it is streamed in
 * arbitrary chunks. */
#ifndef LLM_UTF8_H
#define LLM_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strbuf.h"

/* Classify the bytes at s[0..n), n >= 1:
 *   > 0  a complete well-formed sequence of that many bytes;
 *   0    a well-formed but incomplete prefix (more bytes needed);
 *   < 0  ill-formed: the first -r bytes are one maximal subpart to replace. */
int utf8_seq(const unsigned char *s, size_t n);

/* True when s[0..n) is entirely well-formed; otherwise *bad_at (if given)
 * is the offset of the first ill-formed byte. */
bool utf8_valid(const char *s, size_t n, size_t *bad_at);

/* Offset of the first byte that does not belong to valid UTF-8; n when the
 * whole text is valid. */
size_t utf8_valid_prefix(const char *s, size_t n);

/* Decode the code point at s[0..n): its length (1-4) with *cp set, or 0
 * when the bytes there are not a complete valid sequence. */
int utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);

/* Write cp (at most U+10FFFF) as UTF-8 into out; returns the length. */
int utf8_encode(uint32_t cp, char out[4]);

/* Append s[0..n) to sb with ill-formed subparts replaced by U+FFFD.  Unless
 * final, a trailing incomplete sequence is left unconsumed so a later call
 * can complete it.  Returns the number of bytes consumed. */
size_t utf8_repair(strbuf *sb, const char *s, size_t n, bool final);

/* The same repair as a stream that keeps the incomplete tail itself:
 * feeding a byte string in any number of pieces gives exactly the repair
 * of the whole; finish turns a held tail into U+FFFD. */
typedef struct {
    char held[8];
    int  nheld;
} utf8_stream;

void utf8_stream_init(utf8_stream *r);
void utf8_stream_feed(utf8_stream *r, const char *s, size_t n, strbuf *out);
void utf8_stream_finish(utf8_stream *r, strbuf *out);

#endif
