/* Incremental text/event-stream parser: feed bytes as they arrive, get one
 * callback per complete event with its `event:` name (or "") and its
 * `data:` lines joined by "\n".  Handles LF and CRLF line ends and events
 * split anywhere across feeds; ignores comments and other fields. */
#ifndef QUALIFY_SSE_H
#define QUALIFY_SSE_H

#include <stddef.h>

#include "strbuf.h"

/* Return non-zero to stop parsing (sse_feed then returns that value). */
typedef int (*sse_event_fn)(void *user, const char *event, const char *data, size_t len);

typedef struct {
    strbuf       line;     /* the current, unfinished line */
    strbuf       event;
    strbuf       data;
    int          has_data;
    sse_event_fn fn;
    void        *user;
} sse_parser;

void sse_init(sse_parser *p, sse_event_fn fn, void *user);
int sse_feed(sse_parser *p, const char *buf, size_t n);
/* End of stream: an event not yet ended by a blank line is dropped, as
 * the spec says; returns 1 when such a partial event was pending. */
int sse_finish(sse_parser *p);
void sse_free(sse_parser *p);

#endif
