#include "fingerprint.h"

#include "sha256.h"

void prompt_fingerprint_ids(const int32_t *ids, size_t n, prompt_fingerprint *out)
{
    sha256_ctx c;
    uint8_t buf[4 * 256], digest[32];
    sha256_init(&c);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)ids[i];
        buf[k++] = (uint8_t)v;
        buf[k++] = (uint8_t)(v >> 8);
        buf[k++] = (uint8_t)(v >> 16);
        buf[k++] = (uint8_t)(v >> 24);
        if (k == sizeof buf) { sha256_update(&c, buf, k); k = 0; }
    }
    sha256_update(&c, buf, k);
    sha256_final(&c, digest);
    sha256_to_hex(digest, out->hex);
    out->n_tokens = n;
}
