/* HTTP through libcurl: one reused handle (keep-alive), a hard timeout per
 * request, optional streaming of the body to a callback, and a flag that
 * aborts transfers when the run is interrupted. */
#ifndef QUALIFY_HTTP_H
#define QUALIFY_HTTP_H

#include <stdbool.h>
#include <stddef.h>

#include "strbuf.h"

typedef struct {
    long   status;          /* 0 when no HTTP response came (see error) */
    strbuf headers;         /* raw header lines of the final response */
    strbuf body;
    char   error[256];      /* transport failure, "" otherwise */
    double seconds;         /* request start to last byte */
} http_resp;

/* Called with each piece of body as it arrives; return non-zero to stop. */
typedef int (*http_data_fn)(void *user, const char *data, size_t n);

typedef struct http_client http_client;

http_client *http_new(const char *base_url, const char *bearer_token);
void http_free(http_client *c);
/* Set by a signal handler: the running transfer is aborted. */
extern volatile int http_interrupted;

void http_resp_init(http_resp *r);
void http_resp_free(http_resp *r);

/* method GET or POST; body NULL for none (POST sends it as JSON).  When
 * auth is true the bearer token goes in Authorization.  on_data (may be
 * NULL) sees the body as it arrives; it is kept in r->body either way.
 * Returns 0 when an HTTP response arrived (any status), -1 otherwise. */
int http_request(http_client *c, const char *method, const char *path, const char *body,
                 size_t body_len, bool auth, double timeout_s, http_data_fn on_data, void *user,
                 http_resp *r);

/* A response header's value (case-insensitive name), copied to out;
 * 0 when present. */
int http_header(const http_resp *r, const char *name, char *out, size_t cap);

/* Seconds on CLOCK_MONOTONIC. */
double now_s(void);

#endif
