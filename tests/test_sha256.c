/* SHA-256 against FIPS 180-4 / NIST vectors (checked with Python's
 * hashlib), chunked updates, and the prompt fingerprint encoding. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "fingerprint.h"
#include "sha256.h"
#include "tap.h"

static void vector(const char *msg, size_t n, const char *want, const char *name)
{
    char hex[65];
    sha256_hex(msg, n, hex);
    is_str(hex, want, "sha256(%s)", name);
}

int main(void)
{
    vector("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", "\"\"");
    vector("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", "abc");
    const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    vector(m448, strlen(m448),
           "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1", "448 bits");
    const char *m896 = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmn"
                       "hijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu";
    vector(m896, strlen(m896),
           "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1", "896 bits");
    char *million = malloc(1000000);
    memset(million, 'a', 1000000);
    vector(million, 1000000,
           "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0", "a x 1e6");

    /* The same bytes in uneven pieces (crossing block boundaries). */
    unsigned char bytes[768];
    for (int i = 0; i < 768; i++) bytes[i] = (unsigned char)i;
    bool same = true;
    for (size_t step = 1; step < 130; step += 7) {
        sha256_ctx c;
        uint8_t d[32];
        char hex[65];
        sha256_init(&c);
        for (size_t i = 0; i < sizeof bytes; i += step)
            sha256_update(&c, bytes + i, i + step <= sizeof bytes ? step : sizeof bytes - i);
        sha256_final(&c, d);
        sha256_to_hex(d, hex);
        same = same && !strcmp(hex, "f3a25aa93aa2fbba28d79260535bbd6a5eb0fc1c24a8b0f04e12b484c1dfe363");
    }
    ok(same, "chunked updates give the one-shot digest");

    /* Fingerprint: uint32 little-endian per id; hashlib of
     * struct.pack('<5I', 0, 128803, 19923, 128804, 128798). */
    int32_t ids[] = { 0, 128803, 19923, 128804, 128798 };
    prompt_fingerprint fp;
    prompt_fingerprint_ids(ids, 5, &fp);
    is_str(fp.hex, "a41ab4cfa9d18c3c0b9e805b68562702b74065152fc3e8c6a12ddb40a7fdce86",
           "fingerprint of 5 ids");
    is_int(fp.n_tokens, 5, "fingerprint counts the ids");
    /* More ids than the internal buffer holds: equals hashing the bytes. */
    int32_t *many = malloc(1000 * sizeof *many);
    unsigned char *le = malloc(4000);
    for (int i = 0; i < 1000; i++) {
        many[i] = i * 131 + 7;
        for (int b = 0; b < 4; b++) le[4 * i + b] = (unsigned char)((uint32_t)many[i] >> (8 * b));
    }
    char want[65];
    sha256_hex(le, 4000, want);
    prompt_fingerprint_ids(many, 1000, &fp);
    is_str(fp.hex, want, "fingerprint of 1000 ids = sha256 of their LE bytes");
    prompt_fingerprint_ids(NULL, 0, &fp);
    is_str(fp.hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
           "empty prompt");
    free(many);
    free(le);
    free(million);
    return exit_status();
}
