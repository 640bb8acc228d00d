/* SHA-256 (FIPS 180-4), for prompt fingerprints and content identities. */
#ifndef LLM_SHA256_H
#define LLM_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint32_t h[8];
    uint64_t len;        /* bytes hashed so far */
    uint8_t  buf[64];
    size_t   nbuf;
} sha256_ctx;

void sha256_init(sha256_ctx *c);
void sha256_update(sha256_ctx *c, const void *data, size_t n);
void sha256_final(sha256_ctx *c, uint8_t out[32]);
/* The digest of data[0..n) as 64 lowercase hex digits and a NUL. */
void sha256_hex(const void *data, size_t n, char hex[65]);
void sha256_to_hex(const uint8_t digest[32], char hex[65]);

#endif
