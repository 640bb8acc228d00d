/* /tokenize in chat form: the way a client measures a prompt exactly as
 * the server will count it (OPENAI_API.md). */
#ifndef QUALIFY_TOKENIZE_H
#define QUALIFY_TOKENIZE_H

#include <stddef.h>
#include <stdint.h>

#include "qualify.h"

typedef struct {
    long     count;
    long     max_model_len;          /* 0 when absent */
    uint32_t *ids;                    /* count ids (NULL when the server sent none) */
    char     fingerprint[65];         /* SHA-256 of ids as LE uint32, ours */
    char     server_fingerprint[129]; /* what the server said, "" if nothing */
} tok_result;

/* POST body (a chat request's fields: model, messages, ...) to /tokenize.
 * keep: store the exchange as artifacts (label), else only on failure.
 * 0, or -1 with the reason in why. */
int tokenize_chat(qctx *q, const char *label, const char *body, size_t len, int keep,
                  tok_result *t, strbuf *why);
void tok_result_free(tok_result *t);

/* The prompt fingerprint (engine/text/fingerprint.h definition). */
void ids_fingerprint(const uint32_t *ids, size_t n, char hex[65]);

#endif
