#include "stop_match.h"

#include <stdlib.h>
#include <string.h>

void stop_init(stop_matcher *m, const char *const *stops, int n)
{
    memset(m, 0, sizeof *m);
    sb_init(&m->held);
    for (int i = 0; i < n && m->n < LLM_REQ_STOP_MAX; i++) {
        size_t l = strlen(stops[i]);
        if (!l) continue;
        m->stop[m->n] = strdup(stops[i]);
        m->len[m->n++] = l;
    }
    m->which = -1;
}

void stop_free(stop_matcher *m)
{
    for (int i = 0; i < m->n; i++) free(m->stop[i]);
    sb_free(&m->held);
    memset(m, 0, sizeof *m);
}

/* Length of the longest suffix of s[0..n) that is a proper prefix of some
 * stop string. */
static size_t partial_suffix(const stop_matcher *m, const char *s, size_t n)
{
    size_t best = 0;
    for (int i = 0; i < m->n; i++) {
        size_t max = m->len[i] - 1 < n ? m->len[i] - 1 : n;
        for (size_t k = max; k > best; k--)
            if (!memcmp(s + n - k, m->stop[i], k)) { best = k; break; }
    }
    return best;
}

bool stop_feed(stop_matcher *m, const char *text, size_t len, strbuf *out)
{
    if (m->matched) return true;
    if (!m->n) { sb_append(out, text, len); return false; }
    sb_append(&m->held, text, len);
    const char *h = m->held.data;
    size_t n = m->held.len;
    /* earliest match of any stop string */
    size_t at = n;
    for (int i = 0; i < m->n; i++) {
        const char *p = memmem(h, n, m->stop[i], m->len[i]);
        if (p && (size_t)(p - h) < at) { at = (size_t)(p - h); m->which = i; }
    }
    if (at < n) {
        sb_append(out, h, at);
        sb_reset(&m->held);
        m->matched = true;
        return true;
    }
    size_t keep = partial_suffix(m, h, n);
    sb_append(out, h, n - keep);
    memmove(m->held.data, h + n - keep, keep);
    m->held.len = keep;
    m->held.data[keep] = 0;
    return false;
}

void stop_flush(stop_matcher *m, strbuf *out)
{
    if (!m->matched) sb_append(out, m->held.data ? m->held.data : "", m->held.len);
    sb_reset(&m->held);
}
