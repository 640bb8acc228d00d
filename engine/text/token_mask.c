#include "token_mask.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct token_trie {
    int vocab;
    size_t words;
    /* tokens sorted by bytes */
    int32_t *tok;            /* ids */
    const char **bytes;
    size_t *len;
    int32_t n_tok;
    int32_t *index_of;       /* id -> sorted index, -1 for excluded ids */
    /* preorder nodes; node n_nodes is a sentinel */
    uint8_t *byte;
    int32_t *depth, *skip, *first, *n_end;
    int32_t n_nodes, max_depth;
};

typedef struct {
    int32_t token, delta;
} tok_delta;

/* Tokens are sorted per stack top and up to CHAIN frames under it (more
 * context, fewer uncertain tokens: a string's characters are one rule, so
 * the top frame alone would leave every multi-character token uncertain). */
#define CHAIN 4

typedef struct {
    int32_t key[CHAIN];
    int8_t n;
    bool root;               /* the chain is the whole stack */
    bool used, done;
    uint64_t *acc;           /* context-independent accepted tokens */
    tok_delta *accd;         /* the same with their min-length change, delta descending */
    int32_t n_accd, max_delta;
    int32_t *unc;            /* uncertain, as indices into the sorted tokens */
    int32_t n_unc;
} pos_cache;

struct token_matcher {
    const token_trie *tt;
    grammar *g;
    gmatch m;
    gset cur, tmp[2];
    int32_t eos;
    bool ended;              /* EOS taken */
    pos_cache *pc;           /* hash table by chain */
    size_t n_pc, cap_pc;
    /* walk scratch */
    gset *st;
    int32_t *mark;
    uint8_t *pop;
    uint64_t *scratch;
};

/* ---- trie ---- */

static const token_trie *sort_tt;
static int by_bytes(const void *a, const void *b)
{
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    size_t li = sort_tt->len[i], lj = sort_tt->len[j];
    int c = memcmp(sort_tt->bytes[i], sort_tt->bytes[j], li < lj ? li : lj);
    if (c) return c;
    if (li != lj) return li < lj ? -1 : 1;
    return sort_tt->tok[i] - sort_tt->tok[j];
}

token_trie *token_trie_new(const tokenizer *t, int vocab, char *err, size_t errlen)
{
    token_trie *tt = calloc(1, sizeof *tt);
    if (!tt) abort();
    int32_t nv = tok_vocab_size(t);
    tt->vocab = vocab > nv ? vocab : nv;
    tt->words = ((size_t)tt->vocab + 63) / 64;
    int32_t *id = malloc((size_t)nv * sizeof *id);
    const char **by = malloc((size_t)nv * sizeof *by);
    size_t *ln = malloc((size_t)nv * sizeof *ln);
    int32_t *order = malloc((size_t)nv * sizeof *order);
    if (!id || !by || !ln || !order) abort();
    int32_t n = 0;
    bool single[256] = { 0 };
    for (int32_t i = 0; i < nv; i++) {
        size_t l;
        const char *b = tok_id_bytes(t, i, &l);
        if (!b || !l || tok_is_special(t, i)) continue;
        id[n] = i; by[n] = b; ln[n] = l;
        if (l == 1) single[(uint8_t)b[0]] = true;
        n++;
    }
    for (int c = 0; c < 256; c++)
        if (!single[c]) {
            snprintf(err, errlen, "the tokenizer has no token for the single byte 0x%02x, "
                     "which constrained decoding needs", c);
            free(id); free(by); free(ln); free(order); free(tt);
            return NULL;
        }
    tt->tok = id; tt->bytes = by; tt->len = ln;
    for (int32_t i = 0; i < n; i++) order[i] = i;
    sort_tt = tt;
    qsort(order, (size_t)n, sizeof *order, by_bytes);
    /* permute into sorted order */
    int32_t *id2 = malloc((size_t)n * sizeof *id2 + 1);
    const char **by2 = malloc((size_t)n * sizeof *by2 + 1);
    size_t *ln2 = malloc((size_t)n * sizeof *ln2 + 1);
    if (!id2 || !by2 || !ln2) abort();
    for (int32_t i = 0; i < n; i++) { id2[i] = id[order[i]]; by2[i] = by[order[i]]; ln2[i] = ln[order[i]]; }
    free(id); free(by); free(ln); free(order);
    tt->tok = id2; tt->bytes = by2; tt->len = ln2; tt->n_tok = n;
    tt->index_of = malloc((size_t)tt->vocab * sizeof *tt->index_of);
    if (!tt->index_of) abort();
    for (int32_t i = 0; i < tt->vocab; i++) tt->index_of[i] = -1;
    for (int32_t i = 0; i < n; i++) tt->index_of[id2[i]] = i;

    /* preorder nodes: sorted insertion creates them in preorder */
    size_t cap = 1024;
    tt->byte = malloc(cap); tt->depth = malloc(cap * 4); tt->skip = malloc(cap * 4);
    tt->first = malloc(cap * 4); tt->n_end = malloc(cap * 4);
    int32_t path[4096];   /* node per depth-1 of the current string */
    int32_t plen = 0;
    for (int32_t i = 0; i < n; i++) {
        size_t l = ln2[i] < 4096 ? ln2[i] : 4096;
        /* common prefix with the current path */
        int32_t k = 0;
        while (k < plen && (size_t)k < l && tt->byte[path[k]] == (uint8_t)by2[i][k]) k++;
        for (int32_t d = plen - 1; d >= k; d--) tt->skip[path[d]] = tt->n_nodes;
        plen = k;
        for (; (size_t)plen < l; plen++) {
            if ((size_t)tt->n_nodes + 1 >= cap) {
                cap *= 2;
                tt->byte = realloc(tt->byte, cap); tt->depth = realloc(tt->depth, cap * 4);
                tt->skip = realloc(tt->skip, cap * 4); tt->first = realloc(tt->first, cap * 4);
                tt->n_end = realloc(tt->n_end, cap * 4);
                if (!tt->byte || !tt->depth || !tt->skip || !tt->first || !tt->n_end) abort();
            }
            int32_t x = tt->n_nodes++;
            tt->byte[x] = (uint8_t)by2[i][plen];
            tt->depth[x] = plen + 1;
            tt->first[x] = i;
            tt->n_end[x] = 0;
            path[plen] = x;
            if (plen + 1 > tt->max_depth) tt->max_depth = plen + 1;
        }
        tt->n_end[path[l - 1]]++;
    }
    for (int32_t d = plen - 1; d >= 0; d--) tt->skip[path[d]] = tt->n_nodes;
    tt->first[tt->n_nodes] = n;   /* sentinel */
    return tt;
}

void token_trie_free(token_trie *tt)
{
    if (!tt) return;
    free(tt->tok); free(tt->bytes); free(tt->len); free(tt->index_of);
    free(tt->byte); free(tt->depth); free(tt->skip); free(tt->first); free(tt->n_end);
    free(tt);
}

int token_trie_vocab(const token_trie *tt) { return tt->vocab; }
size_t token_mask_words(const token_trie *tt) { return tt->words; }

void token_trie_lit_cost(void *trie, const uint8_t *lit, size_t n, int32_t *suffix)
{
    const token_trie *tt = trie;
    suffix[n] = 0;
    for (size_t i = n; i-- > 0;) {
        int32_t best = suffix[i + 1] + 1;   /* the single-byte token */
        /* the children of node x are x + 1, then each one's skip */
        int32_t x = -1, end = tt->n_nodes;
        for (size_t k = i; k < n; k++) {
            int32_t c = x + 1;
            while (c < end && tt->byte[c] != lit[k]) c = tt->skip[c];
            if (c >= end) break;
            end = tt->skip[c];
            x = c;
            if (tt->n_end[x] && suffix[k + 1] + 1 < best) best = suffix[k + 1] + 1;
        }
        suffix[i] = best;
    }
}

/* ---- matcher ---- */

token_matcher *token_matcher_new(const token_trie *tt, grammar *g, int32_t eos)
{
    token_matcher *m = calloc(1, sizeof *m);
    if (!m) abort();
    m->tt = tt;
    m->g = g;
    m->eos = eos;
    gmatch_init(&m->m, g);
    gmatch_start(&m->m, &m->cur);
    m->cap_pc = 64;
    m->pc = calloc(m->cap_pc, sizeof *m->pc);
    m->st = calloc((size_t)tt->max_depth + 2, sizeof *m->st);
    m->mark = calloc((size_t)tt->max_depth + 2, sizeof *m->mark);
    m->pop = calloc((size_t)tt->max_depth + 2, 1);
    m->scratch = malloc(tt->words * sizeof *m->scratch);
    if (!m->pc || !m->st || !m->mark || !m->pop || !m->scratch) abort();
    return m;
}

void token_matcher_free(token_matcher *m)
{
    if (!m) return;
    for (size_t i = 0; i < m->cap_pc; i++) {
        free(m->pc[i].acc); free(m->pc[i].accd); free(m->pc[i].unc);
    }
    free(m->pc);
    for (int i = 0; i < m->tt->max_depth + 2; i++) gset_free(&m->st[i]);
    free(m->st); free(m->mark); free(m->pop); free(m->scratch);
    gset_free(&m->cur); gset_free(&m->tmp[0]); gset_free(&m->tmp[1]);
    gmatch_free(&m->m);
    grammar_free(m->g);
    free(m);
}

int token_matcher_min(const token_matcher *m)
{
    return m->ended ? 0 : gset_min(&m->m, &m->cur);
}

size_t token_matcher_n_caches(const token_matcher *m) { return m->n_pc; }

bool token_matcher_accepting(const token_matcher *m) { return m->ended || m->cur.accept; }
bool token_matcher_done(const token_matcher *m) { return m->ended || (m->cur.accept && !m->cur.n); }

static int by_delta_desc(const void *a, const void *b)
{
    const tok_delta *x = a, *y = b;
    return x->delta != y->delta ? (x->delta < y->delta ? 1 : -1) : x->token - y->token;
}

static uint64_t chain_hash(const int32_t *key, int n, bool root)
{
    uint64_t h = root ? 0x9e3779b97f4a7c15ULL : 0x12345;
    for (int i = 0; i < n; i++) h = (h ^ (uint32_t)key[i]) * 0x100000001b3ULL;
    return h ^ (h >> 29);
}

/* The cache slot for the chain under top (empty slot: not built yet). */
static pos_cache *find_cache(token_matcher *m, int32_t top)
{
    int32_t key[CHAIN];
    int n = 0;
    int32_t x = top;
    while (n < CHAIN && x != GM_ROOT) {
        key[n++] = m->m.nodes[x].pos;
        x = m->m.nodes[x].parent;
    }
    bool root = x == GM_ROOT;
    if (2 * (m->n_pc + 1) > m->cap_pc) {   /* grow */
        pos_cache *old = m->pc;
        size_t oc = m->cap_pc;
        m->cap_pc *= 2;
        m->pc = calloc(m->cap_pc, sizeof *m->pc);
        if (!m->pc) abort();
        for (size_t i = 0; i < oc; i++) {
            if (!old[i].used) continue;
            size_t j = chain_hash(old[i].key, old[i].n, old[i].root) & (m->cap_pc - 1);
            while (m->pc[j].used) j = (j + 1) & (m->cap_pc - 1);
            m->pc[j] = old[i];
        }
        free(old);
    }
    size_t j = chain_hash(key, n, root) & (m->cap_pc - 1);
    for (;; j = (j + 1) & (m->cap_pc - 1)) {
        pos_cache *c = &m->pc[j];
        if (!c->used) {
            c->used = true;
            c->n = (int8_t)n;
            c->root = root;
            memcpy(c->key, key, (size_t)n * sizeof *key);
            m->n_pc++;
            return c;
        }
        if (c->n == n && c->root == root && !memcmp(c->key, key, (size_t)n * sizeof *key))
            return c;
    }
}

/* Sort every token for stacks with this chain on top (see the header). */
static void build_cache(token_matcher *m, pos_cache *pc)
{
    const token_trie *tt = m->tt;
    gmatch *gm = &m->m;
    int32_t base = gm->n_nodes;
    int32_t top = pc->root ? GM_ROOT : GM_BOTTOM;
    for (int i = pc->n - 1; i >= 0; i--) top = gmatch_node(gm, pc->key[i], top);
    int32_t before = gm->nodes[top].min;
    size_t cap_d = 256, cap_u = 64;
    pc->acc = calloc(tt->words, sizeof *pc->acc);
    pc->accd = malloc(cap_d * sizeof *pc->accd);
    pc->unc = malloc(cap_u * sizeof *pc->unc);
    if (!pc->acc || !pc->accd || !pc->unc) abort();
    pc->max_delta = INT32_MIN;
    m->st[0].n = 0;
    m->st[0].accept = m->st[0].popped = false;
    gset one = { .top = &top, .n = 1, .cap = 1 };
    gset_copy(&m->st[0], &one);
    m->pop[0] = 0;
    m->mark[0] = gm->n_nodes;
    for (int32_t i = 0; i < tt->n_nodes;) {
        int32_t d = tt->depth[i];
        gm->n_nodes = m->mark[d - 1];
        gmatch_byte(gm, &m->st[d - 1], tt->byte[i], &m->st[d]);
        m->pop[d] = m->pop[d - 1] || m->st[d].popped;
        m->mark[d] = gm->n_nodes;
        if (gset_dead(&m->st[d])) {
            if (m->pop[d])
                for (int32_t k = tt->first[i]; k < tt->first[tt->skip[i]]; k++) {
                    if ((size_t)pc->n_unc == cap_u) {
                        cap_u *= 2;
                        pc->unc = realloc(pc->unc, cap_u * sizeof *pc->unc);
                        if (!pc->unc) abort();
                    }
                    pc->unc[pc->n_unc++] = k;
                }
            i = tt->skip[i];
            continue;
        }
        if (tt->n_end[i]) {
            int32_t delta = gset_min(gm, &m->st[d]) - before;
            if (delta > pc->max_delta) pc->max_delta = delta;
            for (int32_t k = tt->first[i]; k < tt->first[i] + tt->n_end[i]; k++) {
                int32_t t = tt->tok[k];
                pc->acc[t >> 6] |= 1ULL << (t & 63);
                if ((size_t)pc->n_accd == cap_d) {
                    cap_d *= 2;
                    pc->accd = realloc(pc->accd, cap_d * sizeof *pc->accd);
                    if (!pc->accd) abort();
                }
                pc->accd[pc->n_accd++] = (tok_delta){ t, delta };
            }
        }
        i++;
    }
    qsort(pc->accd, (size_t)pc->n_accd, sizeof *pc->accd, by_delta_desc);
    gm->n_nodes = base;
    pc->done = true;
}

/* Advance set `from` by s[0..n) into m->tmp; returns the result or NULL
 * when a byte is refused. */
static gset *walk(token_matcher *m, const gset *from, const char *s, size_t n)
{
    const gset *in = from;
    gset *out = NULL;
    for (size_t i = 0; i < n; i++) {
        out = &m->tmp[i & 1];
        gmatch_byte(&m->m, in, (uint8_t)s[i], out);
        if (gset_dead(out)) return NULL;
        in = out;
    }
    return out;
}

void token_matcher_mask(token_matcher *m, int remaining, uint64_t *mask)
{
    const token_trie *tt = m->tt;
    gmatch *gm = &m->m;
    memset(mask, 0, tt->words * sizeof *mask);
    if (m->ended) return;
    if (m->cur.accept && m->eos >= 0) mask[m->eos >> 6] |= 1ULL << (m->eos & 63);
    int32_t limit = remaining - 2;   /* fewest bytes allowed after the token */
    for (int s = 0; s < m->cur.n; s++) {
        int32_t top = m->cur.top[s];
        pos_cache *pc = find_cache(m, top);
        if (!pc->done) build_cache(m, pc);
        int32_t slack = limit - gm->nodes[top].min;
        if (pc->n_accd && slack >= pc->max_delta) {
            for (size_t w = 0; w < tt->words; w++) mask[w] |= pc->acc[w];
        } else if (pc->n_accd) {
            memcpy(m->scratch, pc->acc, tt->words * sizeof *m->scratch);
            for (int32_t k = 0; k < pc->n_accd && pc->accd[k].delta > slack; k++) {
                int32_t t = pc->accd[k].token;
                m->scratch[t >> 6] &= ~(1ULL << (t & 63));
            }
            for (size_t w = 0; w < tt->words; w++) mask[w] |= m->scratch[w];
        }
        if (!pc->n_unc) continue;
        gset one = { .top = &top, .n = 1, .cap = 1 };
        int32_t base = gm->n_nodes;
        for (int32_t k = 0; k < pc->n_unc; k++) {
            int32_t i = pc->unc[k], t = tt->tok[i];
            if (token_mask_has(mask, t)) continue;
            gset *r = walk(m, &one, tt->bytes[i], tt->len[i]);
            if (r && gset_min(gm, r) <= limit) mask[t >> 6] |= 1ULL << (t & 63);
            gm->n_nodes = base;
        }
    }
}

int token_matcher_bytes(token_matcher *m, const char *s, size_t n)
{
    if (m->ended) return n ? -1 : 0;
    int32_t base = m->m.n_nodes;
    gset *r = walk(m, &m->cur, s, n);
    if (!n) return 0;
    if (!r) { m->m.n_nodes = base; return -1; }
    gset_copy(&m->cur, r);
    return 0;
}

int token_matcher_accept(token_matcher *m, int32_t token)
{
    const token_trie *tt = m->tt;
    if (m->ended) return -1;
    if (token == m->eos) {
        if (!m->cur.accept) return -1;
        m->ended = true;
        return 0;
    }
    if (token < 0 || token >= tt->vocab || tt->index_of[token] < 0) return -1;
    int32_t i = tt->index_of[token];
    return token_matcher_bytes(m, tt->bytes[i], tt->len[i]);
}
