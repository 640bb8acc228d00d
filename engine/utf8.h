/* Strict UTF-8 (Unicode Table 3-7: no overlongs, no surrogates, nothing
 * above U+10FFFF) and repair of invalid input the way Python's
 * bytes.decode("utf-8", "replace") does it: each maximal ill-formed subpart
 * becomes one U+FFFD.  Used to reject bad requests and to keep model output
 * valid text when it is streamed in arbitrary chunks. */
#ifndef LLM_UTF8_H
#define LLM_UTF8_H

#include <stdbool.h>
#include <stddef.h>

#include "strbuf.h"

/* Classify the bytes at s[0..n), n >= 1:
 *   > 0  a complete well-formed sequence of that many bytes;
 *   0    a well-formed but incomplete prefix (more bytes needed);
 *   < 0  ill-formed: the first -r bytes are one maximal subpart to replace. */
int utf8_seq(const unsigned char *s, size_t n);

/* True when s[0..n) is entirely well-formed; otherwise *bad_at (if given)
 * is the offset of the first ill-formed byte. */
bool utf8_valid(const char *s, size_t n, size_t *bad_at);

/* Append s[0..n) to sb with ill-formed subparts replaced by U+FFFD.  Unless
 * final, a trailing incomplete sequence is left unconsumed so a later call
 * can complete it.  Returns the number of bytes consumed. */
size_t utf8_repair(strbuf *sb, const char *s, size_t n, bool final);

#endif
