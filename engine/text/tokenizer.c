/* Encoding, step for step as HF tokenizers does it:
 *   1. added tokens are cut out of the text (leftmost-longest, tokens with
 *      normalized=false first, then normalized=true in the remaining gaps)
 *   2. each remaining piece goes through the Split pre-tokenizers
 *   3. ByteLevel: optional prefix space and GPT-2 split, bytes -> chars
 *   4. BPE: lowest-rank merge first (leftmost on ties), as HF's Word does */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_impl.h"

void tok_ids_push(tok_ids *v, int32_t id)
{
    if (v->len == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 256;
        v->data = realloc(v->data, v->cap * sizeof *v->data);
        if (!v->data) abort();
    }
    v->data[v->len++] = id;
}

void tok_ids_free(tok_ids *v)
{
    free(v->data);
    v->data = NULL;
    v->len = v->cap = 0;
}

/* ---- ByteLevel character map (GPT-2's bytes_to_unicode) ---- */

static bool printable_byte(int b)
{
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
}

uint32_t byte_level_char(unsigned char b)
{
    if (printable_byte(b)) return b;
    int n = 0;                  /* rank among the remapped bytes */
    for (int i = 0; i < b; i++)
        if (!printable_byte(i)) n++;
    return 256u + (uint32_t)n;
}

int byte_level_byte(uint32_t cp)
{
    if (cp < 256) return printable_byte((int)cp) ? (int)cp : -1;
    int n = (int)(cp - 256);
    for (int b = 0; b < 256; b++)
        if (!printable_byte(b) && n-- == 0) return b;
    return -1;
}

/* ---- lookups ---- */

int32_t tok_vocab_size(const tokenizer *t) { return t->n_ids; }
int32_t tok_bos_id(const tokenizer *t) { return t->bos_id; }
int32_t tok_eos_id(const tokenizer *t) { return t->eos_id; }

const char *tok_id_to_token(const tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->n_ids || !t->tok_str[id]) return NULL;
    if (len) *len = t->tok_len[id];
    return t->tok_str[id];
}

int32_t tok_token_to_id(const tokenizer *t, const char *s, size_t len)
{
    int32_t i;
    if (strmap_get(&t->added_map, s, len, &i)) return t->added[i].id;
    if (strmap_get(&t->vocab, s, len, &i)) return i;
    return -1;
}

int32_t tok_added_token_id(const tokenizer *t, const char *s)
{
    int32_t i;
    return strmap_get(&t->added_map, s, strlen(s), &i) ? t->added[i].id : -1;
}

size_t tok_n_added(const tokenizer *t) { return (size_t)t->n_added; }

const char *tok_added_content(const tokenizer *t, size_t i, size_t *len, int32_t *id)
{
    if (i >= (size_t)t->n_added) return NULL;
    *len = t->added[i].len;
    *id = t->added[i].id;
    return t->added[i].content;
}

bool tok_is_special(const tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_ids && t->special[id];
}

const char *tok_strerror(int code)
{
    switch (code) {
    case TOK_OK: return "ok";
    case TOK_EUTF8: return "text is not valid UTF-8";
    case TOK_EREGEX: return "pre-tokenizer regex failed (match limit)";
    case TOK_EMARK: return "a marked offset does not hold its added token";
    }
    return "unknown tokenizer error";
}

/* ---- per-call state ---- */

typedef struct {
    size_t start, end;
    int32_t added;          /* index in added[], or -1 for text */
} piece;

typedef struct {
    piece *v;
    size_t n, cap;
} pieces;

static void pieces_push(pieces *p, size_t start, size_t end, int32_t added)
{
    if (p->n == p->cap) {
        p->cap = p->cap ? p->cap * 2 : 64;
        p->v = realloc(p->v, p->cap * sizeof *p->v);
        if (!p->v) abort();
    }
    p->v[p->n++] = (piece){ start, end, added };
}

typedef struct {
    int32_t id;
    int32_t prev, next;     /* -1 at the ends */
    uint32_t len;           /* bytes; 0 once merged into its left neighbour */
} symbol;

typedef struct {
    uint32_t rank;
    int32_t pos;
    int32_t new_id;
} merge;

/* Words already encoded in this call: text repeats words a lot.  Every
 * length is cached (HF caches words under 256 bytes), since DeepSeek's CJK
 * split makes whole Chinese sentences into one word. */
typedef struct {
    uint64_t hash;
    uint32_t key_off, key_len;      /* in keys */
    uint32_t ids_off, ids_len;      /* in ids; key_len 0: empty slot */
} cache_slot;

typedef struct {
    cache_slot *slots;
    size_t cap, n;
    strbuf keys;
    tok_ids ids;
} word_cache;

typedef struct {
    const tokenizer *t;
    tok_ids *out;
    onig_scratch *sc;
    onig_spans spans;
    pieces split[2];        /* pre-tokenizer pieces, double-buffered */
    pieces added;           /* pass one of the added-token split */
    pieces added2;          /* pass two, inside one piece of pass one */
    pieces segs;            /* regex matches and gaps of one piece */
    strbuf prefixed;        /* a piece with ByteLevel's prefix space */
    strbuf word;            /* a word in ByteLevel characters (ignore_merges) */
    symbol *sym;
    size_t sym_cap;
    merge *heap;
    size_t heap_n, heap_cap;
    word_cache cache;
} encoder;

static cache_slot *cache_find(word_cache *c, const char *w, size_t n, uint64_t h)
{
    for (size_t i = h & (c->cap - 1);; i = (i + 1) & (c->cap - 1)) {
        cache_slot *s = &c->slots[i];
        if (!s->key_len || (s->hash == h && s->key_len == n && !memcmp(c->keys.data + s->key_off, w, n)))
            return s;
    }
}

static void cache_put(word_cache *c, const char *w, size_t n, uint64_t h, const int32_t *ids, size_t nids)
{
    if ((c->n + 1) * 2 > c->cap) {
        word_cache old = *c;
        c->cap = old.cap ? old.cap * 2 : 256;
        c->slots = calloc(c->cap, sizeof *c->slots);
        if (!c->slots) abort();
        for (size_t i = 0; i < old.cap; i++)
            if (old.slots[i].key_len) *cache_find(c, old.keys.data + old.slots[i].key_off,
                                                  old.slots[i].key_len, old.slots[i].hash) = old.slots[i];
        free(old.slots);
    }
    cache_slot *s = cache_find(c, w, n, h);
    *s = (cache_slot){ .hash = h, .key_off = (uint32_t)c->keys.len, .key_len = (uint32_t)n,
                       .ids_off = (uint32_t)c->ids.len, .ids_len = (uint32_t)nids };
    sb_append(&c->keys, w, n);
    for (size_t i = 0; i < nids; i++) tok_ids_push(&c->ids, ids[i]);
    c->n++;
}

/* ---- BPE ---- */

static bool merge_before(merge a, merge b)
{
    return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos;
}

static void heap_push(encoder *e, merge m)
{
    if (e->heap_n == e->heap_cap) {
        e->heap_cap = e->heap_cap ? e->heap_cap * 2 : 64;
        e->heap = realloc(e->heap, e->heap_cap * sizeof *e->heap);
        if (!e->heap) abort();
    }
    size_t i = e->heap_n++;
    while (i > 0 && merge_before(m, e->heap[(i - 1) / 2])) {
        e->heap[i] = e->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    e->heap[i] = m;
}

static merge heap_pop(encoder *e)
{
    merge top = e->heap[0], last = e->heap[--e->heap_n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= e->heap_n) break;
        if (c + 1 < e->heap_n && merge_before(e->heap[c + 1], e->heap[c])) c++;
        if (!merge_before(e->heap[c], last)) break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (e->heap_n) e->heap[i] = last;
    return top;
}

static bool lookup_merge(const tokenizer *t, int32_t a, int32_t b, uint32_t *rank, int32_t *new_id)
{
    uint64_t v;
    if (!u64map_get(&t->merges, (uint64_t)a << 32 | (uint32_t)b, &v)) return false;
    *rank = (uint32_t)(v >> 32);
    *new_id = (int32_t)(uint32_t)v;
    return true;
}

static void push_pair(encoder *e, int32_t pos)
{
    int32_t next = e->sym[pos].next;
    if (next < 0) return;
    merge m = { .pos = pos };
    if (lookup_merge(e->t, e->sym[pos].id, e->sym[next].id, &m.rank, &m.new_id)) heap_push(e, m);
}

/* HF's Word::merge_all. */
static void merge_all(encoder *e, int32_t n)
{
    const tokenizer *t = e->t;
    e->heap_n = 0;
    for (int32_t i = 0; i + 1 < n; i++) push_pair(e, i);
    while (e->heap_n) {
        merge m = heap_pop(e);
        symbol *s = &e->sym[m.pos];
        if (s->len == 0 || s->next < 0) continue;
        symbol *r = &e->sym[s->next];
        uint32_t rank;
        int32_t id;
        if (!lookup_merge(t, s->id, r->id, &rank, &id) || id != m.new_id) continue;   /* stale */
        s->id = m.new_id;
        s->len += r->len;
        r->len = 0;
        s->next = r->next;
        if (s->next >= 0) e->sym[s->next].prev = m.pos;
        if (s->prev >= 0) push_pair(e, s->prev);
        push_pair(e, m.pos);
    }
}

static void add_symbol(encoder *e, int32_t *n, int32_t id, uint32_t len)
{
    if ((size_t)*n == e->sym_cap) {
        e->sym_cap = e->sym_cap ? e->sym_cap * 2 : 256;
        e->sym = realloc(e->sym, e->sym_cap * sizeof *e->sym);
        if (!e->sym) abort();
    }
    e->sym[*n] = (symbol){ .id = id, .prev = *n - 1, .next = -1, .len = len };
    if (*n > 0) e->sym[*n - 1].next = *n;
    (*n)++;
}

/* One character of the word (ch[0..len), spanning `bytes` bytes of the
 * original text) that may be missing from the vocab: byte fallback, then
 * unk (fused or not), else dropped, exactly in HF's BPE::merge_word order. */
typedef struct {
    int32_t id;             /* pending unk id, -1 when none */
    uint32_t len;
} pending_unk;

static void add_char(encoder *e, int32_t *n, pending_unk *unk, int32_t id,
                     const char *ch, size_t len, uint32_t bytes)
{
    const tokenizer *t = e->t;
    if (id >= 0) {
        if (unk->id >= 0) add_symbol(e, n, unk->id, unk->len);
        unk->id = -1;
        add_symbol(e, n, id, bytes);
        return;
    }
    if (t->byte_fallback) {
        size_t k = 0;
        while (k < len && t->fallback_id[(unsigned char)ch[k]] >= 0) k++;
        if (k == len) {
            for (k = 0; k < len; k++) add_symbol(e, n, t->fallback_id[(unsigned char)ch[k]], 1);
            return;
        }
    }
    if (t->unk_id < 0) return;
    if (unk->id >= 0 && t->fuse_unk) {
        unk->len += bytes;
        return;
    }
    if (unk->id >= 0) add_symbol(e, n, unk->id, unk->len);
    unk->id = t->unk_id;
    unk->len = bytes;
}

/* BPE over one pre-token w[0..n) (original bytes, not yet ByteLevel
 * mapped). */
static void bpe_word_uncached(encoder *e, const char *w, size_t n);

static void bpe_word(encoder *e, const char *w, size_t n)
{
    if (n == 0) return;
    word_cache *c = &e->cache;
    uint64_t h = hash_bytes(w, n);
    cache_slot *s = c->cap ? cache_find(c, w, n, h) : NULL;
    if (s && s->key_len) {
        for (uint32_t i = 0; i < s->ids_len; i++) tok_ids_push(e->out, c->ids.data[s->ids_off + i]);
        return;
    }
    size_t mark = e->out->len;
    bpe_word_uncached(e, w, n);
    cache_put(c, w, n, h, e->out->data + mark, e->out->len - mark);
}

static void bpe_word_uncached(encoder *e, const char *w, size_t n)
{
    const tokenizer *t = e->t;
    if (t->ignore_merges) {
        sb_reset(&e->word);
        if (t->byte_level) {
            for (size_t i = 0; i < n; i++) {
                char c[4];
                sb_append(&e->word, c, (size_t)utf8_encode(byte_level_char((unsigned char)w[i]), c));
            }
        } else {
            sb_append(&e->word, w, n);
        }
        int32_t id;
        if (strmap_get(&t->vocab, e->word.data, e->word.len, &id)) {
            tok_ids_push(e->out, id);
            return;
        }
    }
    int32_t ns = 0;
    pending_unk unk = { -1, 0 };
    if (t->byte_level) {
        for (size_t i = 0; i < n; i++) {
            unsigned char b = (unsigned char)w[i];
            char c[4];
            int clen = t->byte_id[b] >= 0 ? 0 : utf8_encode(byte_level_char(b), c);
            add_char(e, &ns, &unk, t->byte_id[b], c, (size_t)clen, 1);
        }
    } else {
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            int clen = utf8_decode((const unsigned char *)w + i, n - i, &cp);
            int32_t id;
            if (!strmap_get(&t->vocab, w + i, (size_t)clen, &id)) id = -1;
            add_char(e, &ns, &unk, id, w + i, (size_t)clen, (uint32_t)clen);
            i += (size_t)clen;
        }
    }
    if (unk.id >= 0) add_symbol(e, &ns, unk.id, unk.len);
    merge_all(e, ns);
    for (int32_t i = 0; i < ns; i++)
        if (e->sym[i].len) tok_ids_push(e->out, e->sym[i].id);
}

/* ---- pre-tokenizers ---- */

/* Split s[p.start..p.end) by re with HF's SplitDelimiterBehavior, appending
 * the non-empty results to out. */
static int split_piece(encoder *e, const split_step *st, const char *s, piece p, pieces *out)
{
    e->spans.n = 0;
    if (onig_regex_find_all(st->re, e->sc, s + p.start, p.end - p.start, &e->spans)) return TOK_EREGEX;
    /* (range, is_match) segments covering the piece, as Pattern::find_matches
     * gives them; .added holds is_match. */
    pieces *seg = &e->segs;
    seg->n = 0;
    size_t prev = p.start;
    for (size_t k = 0; k < e->spans.n; k++) {
        size_t ms = p.start + e->spans.v[k].start, me = p.start + e->spans.v[k].end;
        if (prev != ms) pieces_push(seg, prev, ms, st->invert);
        pieces_push(seg, ms, me, !st->invert);
        prev = me;
    }
    if (prev != p.end) pieces_push(seg, prev, p.end, st->invert);

    size_t first = out->n;
    bool prev_match = false;
    switch (st->behavior) {
    case SPLIT_ISOLATED:
    case SPLIT_REMOVED:
        for (size_t k = 0; k < seg->n; k++)
            if (st->behavior == SPLIT_ISOLATED || !seg->v[k].added)
                pieces_push(out, seg->v[k].start, seg->v[k].end, -1);
        break;
    case SPLIT_CONTIGUOUS:
    case SPLIT_MERGED_WITH_PREVIOUS:
        for (size_t k = 0; k < seg->n; k++) {
            bool m = seg->v[k].added;
            bool join = st->behavior == SPLIT_CONTIGUOUS ? m == prev_match : m && !prev_match;
            if (join && out->n > first) out->v[out->n - 1].end = seg->v[k].end;
            else pieces_push(out, seg->v[k].start, seg->v[k].end, -1);
            prev_match = m;
        }
        break;
    case SPLIT_MERGED_WITH_NEXT:
        /* HF folds from the end: a match absorbs what follows it.  Build the
         * result backwards in seg itself (never ahead of the read index). */
        {
            size_t w = seg->n;
            for (size_t k = seg->n; k-- > 0;) {
                piece cur = seg->v[k];
                bool m = cur.added;
                if (m && !prev_match && w < seg->n) seg->v[w].start = cur.start;
                else seg->v[--w] = cur;
                prev_match = m;
            }
            for (size_t k = w; k < seg->n; k++) pieces_push(out, seg->v[k].start, seg->v[k].end, -1);
        }
        break;
    }
    /* Empty results are dropped, as PreTokenizedString::split does. */
    size_t w = first;
    for (size_t r = first; r < out->n; r++)
        if (out->v[r].end > out->v[r].start) out->v[w++] = out->v[r];
    out->n = w;
    return 0;
}

/* ByteLevel step and BPE for one pre-tokenized piece. */
static int byte_level_piece(encoder *e, const char *s, size_t n)
{
    const tokenizer *t = e->t;
    if (t->byte_level && t->add_prefix_space && s[0] != ' ') {
        sb_reset(&e->prefixed);
        sb_putc(&e->prefixed, ' ');
        sb_append(&e->prefixed, s, n);
        s = e->prefixed.data;
        n = e->prefixed.len;
    }
    if (!t->byte_level_re) {
        bpe_word(e, s, n);
        return 0;
    }
    /* use_regex: the GPT-2 pattern splits once more (Isolated). */
    e->spans.n = 0;
    if (onig_regex_find_all(t->byte_level_re, e->sc, s, n, &e->spans)) return TOK_EREGEX;
    size_t prev = 0;
    for (size_t k = 0; k <= e->spans.n; k++) {
        size_t ms = k < e->spans.n ? e->spans.v[k].start : n;
        size_t me = k < e->spans.n ? e->spans.v[k].end : n;
        if (ms > prev) bpe_word(e, s + prev, ms - prev);
        if (me > ms) bpe_word(e, s + ms, me - ms);
        prev = me;
    }
    return 0;
}

/* Pre-tokenize and encode s[0..n), text without added tokens. */
static int encode_text(encoder *e, const char *s, size_t n)
{
    const tokenizer *t = e->t;
    if (n == 0) return 0;
    pieces *cur = &e->split[0], *nxt = &e->split[1];
    cur->n = 0;
    pieces_push(cur, 0, n, -1);
    for (int i = 0; i < t->n_splits; i++) {
        nxt->n = 0;
        for (size_t k = 0; k < cur->n; k++)
            if (split_piece(e, &t->splits[i], s, cur->v[k], nxt)) return TOK_EREGEX;
        pieces *tmp = cur;
        cur = nxt;
        nxt = tmp;
    }
    for (size_t k = 0; k < cur->n; k++) {
        int rc = byte_level_piece(e, s + cur->v[k].start, cur->v[k].end - cur->v[k].start);
        if (rc) return rc;
    }
    return 0;
}

/* ---- added tokens ---- */

/* Rust's char::is_whitespace (Unicode White_Space), which HF's lstrip and
 * rstrip use. */
static bool white_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680
        || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F
        || c == 0x205F || c == 0x3000;
}

static size_t char_start_before(const char *s, size_t i)
{
    do i--; while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80);
    return i;
}

/* Start of the white space that ends s[0..n). */
static size_t trailing_space_start(const char *s, size_t n)
{
    while (n > 0) {
        size_t k = char_start_before(s, n);
        uint32_t cp;
        utf8_decode((const unsigned char *)s + k, n - k, &cp);
        if (!white_space(cp)) break;
        n = k;
    }
    return n;
}

static size_t leading_space_len(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        int len = utf8_decode((const unsigned char *)s + i, n - i, &cp);
        if (!white_space(cp)) break;
        i += (size_t)len;
    }
    return i;
}

/* HF's AddedVocabulary::find_matches over s[0..n): leftmost-longest
 * matches of the trie, filtered by single_word and widened by lstrip and
 * rstrip; appends pieces (offsets relative to base) covering s. */
static void find_added(encoder *e, const token_trie *tr, const char *s, size_t n,
                       size_t base, pieces *out)
{
    const tokenizer *t = e->t;
    size_t done = 0;        /* end of the previous accepted match */
    size_t i = 0;
    while (i < n) {
        if (!tr->first[(unsigned char)s[i]]) { i++; continue; }
        uint64_t node = 0;
        int32_t best = -1;
        size_t best_end = 0;
        for (size_t j = i; j < n; j++) {
            if (!u64map_get(&tr->child, node << 8 | (unsigned char)s[j], &node)) break;
            if (tr->term[node] >= 0) { best = tr->term[node]; best_end = j + 1; }
        }
        if (best < 0) { i++; continue; }
        size_t start = i, stop = best_end;
        i = best_end;       /* matching resumes here whether or not it is kept */
        const added_token *a = &t->added[best];
        if (a->single_word) {
            bool word_before = start > 0 && onig_regex_match_here(t->word_re, e->sc,
                s + char_start_before(s, start), start - char_start_before(s, start));
            bool word_after = stop < n && onig_regex_match_here(t->word_re, e->sc, s + stop, n - stop);
            if (word_before || word_after) continue;
        }
        if (a->lstrip) {
            size_t ls = trailing_space_start(s, start);
            start = ls > done ? ls : done;
        }
        if (a->rstrip) stop += leading_space_len(s + stop, n - stop);
        if (done < start) pieces_push(out, base + done, base + start, -1);
        pieces_push(out, base + start, base + stop, best);
        done = stop;
    }
    if (done < n) pieces_push(out, base + done, base + n, -1);
}

static int encode_with_added(encoder *e, const char *s, size_t n)
{
    e->added.n = 0;
    find_added(e, &e->t->trie_raw, s, n, 0, &e->added);
    for (size_t k = 0; k < e->added.n; k++) {
        piece p = e->added.v[k];
        if (p.added >= 0) {
            tok_ids_push(e->out, e->t->added[p.added].id);
            continue;
        }
        e->added2.n = 0;
        find_added(e, &e->t->trie_norm, s + p.start, p.end - p.start, p.start, &e->added2);
        for (size_t j = 0; j < e->added2.n; j++) {
            piece q = e->added2.v[j];
            if (q.added >= 0) {
                tok_ids_push(e->out, e->t->added[q.added].id);
                continue;
            }
            int rc = encode_text(e, s + q.start, q.end - q.start);
            if (rc) return rc;
        }
    }
    return 0;
}

static int encode_marked(encoder *e, const char *s, size_t n, const tok_mark *marks, size_t n_marks)
{
    const tokenizer *t = e->t;
    size_t done = 0;        /* start of the ordinary text not yet encoded */
    for (size_t i = 0; i < n_marks; i++) {
        size_t start = marks[i].offset, len;
        const char *str = tok_id_to_token(t, marks[i].id, &len);
        int32_t a;
        if (!str || !strmap_get(&t->added_map, str, len, &a) || start < done || start > n
            || len > n - start || memcmp(s + start, str, len))
            return TOK_EMARK;
        size_t stop = start + len;
        /* lstrip/rstrip take adjacent white space, as in HF's split. */
        if (t->added[a].lstrip) start = done + trailing_space_start(s + done, start - done);
        if (t->added[a].rstrip) stop += leading_space_len(s + stop, n - stop);
    int rc = encode_text(e, s + done, start - done);
        if (rc) return rc;
        tok_ids_push(e->out, t->added[a].id);
        done = stop;
    }
    return encode_text(e, s + done, n - done);
}

enum encode_mode { PLAIN_TEXT, ADDED_TOKENS, MARKED_TOKENS };

/* Per-call state around one of the three ways in. */
static int encode(const tokenizer *t, const char *text, size_t len, enum encode_mode mode,
                  const tok_mark *marks, size_t n_marks, tok_ids *out)
{
    if (utf8_valid_prefix(text, len) != len) return TOK_EUTF8;
    encoder e = { .t = t, .out = out, .sc = onig_scratch_new() };
    sb_init(&e.cache.keys);
    sb_init(&e.prefixed);
    sb_init(&e.word);
    size_t mark = out->len;
    int rc = mode == MARKED_TOKENS ? encode_marked(&e, text, len, marks, n_marks)
           : mode == ADDED_TOKENS && t->n_added ? encode_with_added(&e, text, len)
           : encode_text(&e, text, len);
    if (rc) out->len = mark;
    onig_scratch_free(e.sc);
    onig_spans_free(&e.spans);
    free(e.split[0].v);
    free(e.split[1].v);
    free(e.added.v);
    free(e.added2.v);
    free(e.segs.v);
    sb_free(&e.prefixed);
    sb_free(&e.word);
    free(e.cache.slots);
    sb_free(&e.cache.keys);
    tok_ids_free(&e.cache.ids);
    free(e.sym);
    free(e.heap);
    return rc;
}

int tok_encode(const tokenizer *t, const char *text, size_t len, bool allow_special, tok_ids *out)
{
    return encode(t, text, len, allow_special ? ADDED_TOKENS : PLAIN_TEXT, NULL, 0, out);
}

int tok_encode_marked(const tokenizer *t, const char *text, size_t len, const tok_mark *marks,
                      size_t n_marks, tok_ids *out)
{
    return encode(t, text, len, MARKED_TOKENS, marks, n_marks, out);
}
