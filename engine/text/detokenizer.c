/* Decoding: each token's bytes (precomputed by the ByteLevel decoder at
 * load), concatenated and repaired to valid UTF-8.  Streaming and whole
 * decoding share one path, so a stream's chunks always add up to
 * tok_decode's text. */
#include "tokenizer_impl.h"

const char *tok_id_bytes(const tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->n_ids || !t->tok_str[id]) return NULL;
    *len = t->dec_len[id];
    return t->dec + t->dec_off[id];
}

void tok_stream_init(tok_stream *s, const tokenizer *t, bool skip_special)
{
    s->tok = t;
    s->skip_special = skip_special;
    utf8_stream_init(&s->repair);
}

int tok_stream_push(tok_stream *s, int32_t id, strbuf *out)
{
    size_t len;
    const char *bytes = tok_id_bytes(s->tok, id, &len);
    if (!bytes) return -1;
    if (s->skip_special && s->tok->special[id]) return 0;
    utf8_stream_feed(&s->repair, bytes, len, out);
    return 0;
}

void tok_stream_finish(tok_stream *s, strbuf *out)
{
    utf8_stream_finish(&s->repair, out);
}

int tok_decode(const tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
               strbuf *out, size_t *bad)
{
    tok_stream s;
    tok_stream_init(&s, t, skip_special);
    for (size_t i = 0; i < n; i++) {
        if (tok_stream_push(&s, ids[i], out)) {
            *bad = i;
            return -1;
        }
    }
    tok_stream_finish(&s, out);
    return 0;
}
