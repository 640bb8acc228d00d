/* Prompt fingerprint: identifies the exact token sequence a prompt became,
 * so a client (or the r33 reasoning-prompt gate) can pin it.
 *
 * Definition: SHA-256 over the token ids in order, each id written as 4
 * bytes, unsigned 32-bit little-endian; reported as 64 lowercase hex digits
 * together with the number of ids.  The empty prompt hashes zero bytes. */
#ifndef LLM_FINGERPRINT_H
#define LLM_FINGERPRINT_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    char   hex[65];
    size_t n_tokens;
} prompt_fingerprint;

void prompt_fingerprint_ids(const int32_t *ids, size_t n, prompt_fingerprint *out);

#endif
