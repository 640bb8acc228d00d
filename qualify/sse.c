#include "sse.h"

#include <string.h>

void sse_init(sse_parser *p, sse_event_fn fn, void *user)
{
    sb_init(&p->line);
    sb_init(&p->event);
    sb_init(&p->data);
    p->has_data = 0;
    p->fn = fn;
    p->user = user;
}

void sse_free(sse_parser *p)
{
    sb_free(&p->line);
    sb_free(&p->event);
    sb_free(&p->data);
}

/* One complete line (without its end). */
static int sse_line(sse_parser *p, const char *s, size_t n)
{
    if (n == 0) {   /* blank line: dispatch */
        int rc = 0;
        if (p->has_data)
            rc = p->fn(p->user, p->event.data ? p->event.data : "", p->data.data ? p->data.data : "",
                       p->data.len);
        sb_reset(&p->event);
        sb_reset(&p->data);
        p->has_data = 0;
        return rc;
    }
    if (s[0] == ':') return 0;   /* comment */
    const char *colon = memchr(s, ':', n);
    size_t klen = colon ? (size_t)(colon - s) : n;
    const char *v = colon ? colon + 1 : s + n;
    size_t vlen = (size_t)(s + n - v);
    if (vlen && *v == ' ') {
        v++;
        vlen--;
    }
    if (klen == 4 && !memcmp(s, "data", 4)) {
        if (p->has_data) sb_putc(&p->data, '\n');
        sb_append(&p->data, v, vlen);
        p->has_data = 1;
    } else if (klen == 5 && !memcmp(s, "event", 5)) {
        sb_reset(&p->event);
        sb_append(&p->event, v, vlen);
    }
    return 0;
}

int sse_feed(sse_parser *p, const char *buf, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char c = buf[i];
        if (c != '\n') {
            sb_putc(&p->line, c);
            continue;
        }
        size_t len = p->line.len;
        if (len && p->line.data[len - 1] == '\r') len--;
        int rc = sse_line(p, p->line.data ? p->line.data : "", len);
        sb_reset(&p->line);
        if (rc) return rc;
    }
    return 0;
}

int sse_finish(sse_parser *p)
{
    int pending = p->has_data || p->line.len;
    sb_reset(&p->line);
    sb_reset(&p->event);
    sb_reset(&p->data);
    p->has_data = 0;
    return pending;
}
