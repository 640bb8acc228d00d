#include "token_mask.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

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

/* Chains accepting at most this many tokens keep only the list (setting
 * the bits one by one beats ORing a vocabulary-wide bitset). */
#define SMALL_ACC 256

/* Uncertain tokens: after off bytes some path ran off the chain, so the
 * rest of the token (its suffix from off) is checked against the real
 * stack below the chain.  Sorted by suffix; lcp[i] = bytes the suffix of i
 * shares with that of i - 1, so a check reuses the states of the shared
 * prefix and skips every suffix that starts with a refused one. */
typedef struct {
    int32_t off, n;
    int32_t *tok;            /* indices into the sorted tokens */
    int32_t *lcp;
} unc_group;

typedef struct {
    int32_t key[CHAIN];
    int8_t n;
    bool root;               /* the chain is the whole stack */
    bool done;               /* built; immutable from then on */
    uint64_t *acc;           /* context-independent accepted tokens; NULL
                                when there are few (see accd) */
    tok_delta *accd;         /* the same with their cost change, delta descending */
    int32_t n_accd, max_delta;
    unc_group *unc;          /* by offset */
    int32_t n_unc;           /* groups */
} pos_cache;

/* Scratch of one thread that sorts tokens. */
typedef struct {
    gset *st;
    int32_t *mark;
    uint8_t *pop;
    int depth;
} sort_scratch;

struct mask_cache {
    const token_trie *tt;
    grammar *g;
    pthread_mutex_t mu;      /* the table; entries are immutable once done */
    int refs;
    pos_cache **pc;          /* open addressing by chain; entries never move */
    size_t n_pc, cap_pc;
};

struct token_matcher {
    mask_cache *c;
    const token_trie *tt;
    gmatch m;
    gset cur, tmp[2];
    int32_t eos;
    bool ended;              /* EOS taken */
    size_t n_built;          /* chains this matcher sorted (bench-mask) */
    sort_scratch ss;
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

/* ---- shared caches ---- */

static void scratch_init(sort_scratch *ss, const token_trie *tt)
{
    ss->depth = tt->max_depth + 2;
    ss->st = calloc((size_t)ss->depth, sizeof *ss->st);
    ss->mark = calloc((size_t)ss->depth, sizeof *ss->mark);
    ss->pop = calloc((size_t)ss->depth, 1);
    if (!ss->st || !ss->mark || !ss->pop) abort();
}

static void scratch_free(sort_scratch *ss)
{
    for (int i = 0; i < ss->depth; i++) gset_free(&ss->st[i]);
    free(ss->st);
    free(ss->mark);
    free(ss->pop);
}

mask_cache *mask_cache_new(const token_trie *tt, grammar *g)
{
    mask_cache *c = calloc(1, sizeof *c);
    if (!c) abort();
    c->tt = tt;
    c->g = g;
    c->refs = 1;
    pthread_mutex_init(&c->mu, NULL);
    c->cap_pc = 64;
    c->pc = calloc(c->cap_pc, sizeof *c->pc);
    if (!c->pc) abort();
    return c;
}

mask_cache *mask_cache_ref(mask_cache *c)
{
    __atomic_add_fetch(&c->refs, 1, __ATOMIC_RELAXED);
    return c;
}

void mask_cache_unref(mask_cache *c)
{
    if (!c || __atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL)) return;
    for (size_t i = 0; i < c->cap_pc; i++) {
        pos_cache *p = c->pc[i];
        if (!p) continue;
        for (int32_t g = 0; g < p->n_unc; g++) { free(p->unc[g].tok); free(p->unc[g].lcp); }
        free(p->acc); free(p->accd); free(p->unc);
        free(p);
    }
    free(c->pc);
    pthread_mutex_destroy(&c->mu);
    grammar_free(c->g);
    free(c);
}

const grammar *mask_cache_grammar(const mask_cache *c) { return c->g; }

size_t mask_cache_size(mask_cache *c)
{
    pthread_mutex_lock(&c->mu);
    size_t n = c->n_pc;
    pthread_mutex_unlock(&c->mu);
    return n;
}

size_t mask_cache_bytes(mask_cache *c)
{
    pthread_mutex_lock(&c->mu);
    size_t n = c->cap_pc * sizeof *c->pc;
    for (size_t i = 0; i < c->cap_pc; i++) {
        const pos_cache *p = c->pc[i];
        if (!p) continue;
        n += sizeof *p + (p->acc ? c->tt->words * sizeof *p->acc : 0)
             + (size_t)p->n_accd * sizeof *p->accd;
        for (int32_t g = 0; g < p->n_unc; g++)
            n += sizeof p->unc[g] + (size_t)p->unc[g].n * 2 * sizeof(int32_t);
    }
    pthread_mutex_unlock(&c->mu);
    return n;
}

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

/* The entry for the chain under top, made if new (not built).  Caller
 * holds c->mu. */
static pos_cache *find_entry(mask_cache *c, const gmatch *gm, int32_t top)
{
    int32_t key[CHAIN];
    int n = 0;
    int32_t x = top;
    while (n < CHAIN && x != GM_ROOT) {
        key[n++] = gm->nodes[x].pos;
        x = gm->nodes[x].parent;
    }
    bool root = x == GM_ROOT;
    if (2 * (c->n_pc + 1) > c->cap_pc) {   /* grow */
        pos_cache **old = c->pc;
        size_t oc = c->cap_pc;
        c->cap_pc *= 2;
        c->pc = calloc(c->cap_pc, sizeof *c->pc);
        if (!c->pc) abort();
        for (size_t i = 0; i < oc; i++) {
            if (!old[i]) continue;
            size_t j = chain_hash(old[i]->key, old[i]->n, old[i]->root) & (c->cap_pc - 1);
            while (c->pc[j]) j = (j + 1) & (c->cap_pc - 1);
            c->pc[j] = old[i];
        }
        free(old);
    }
    size_t j = chain_hash(key, n, root) & (c->cap_pc - 1);
    for (;; j = (j + 1) & (c->cap_pc - 1)) {
        pos_cache *p = c->pc[j];
        if (!p) {
            p = calloc(1, sizeof *p);
            if (!p) abort();
            p->n = (int8_t)n;
            p->root = root;
            memcpy(p->key, key, (size_t)n * sizeof *key);
            c->pc[j] = p;
            c->n_pc++;
            return p;
        }
        if (p->n == n && p->root == root && !memcmp(p->key, key, (size_t)n * sizeof *key))
            return p;
    }
}

static const token_trie *sort_suffix_tt;
static int by_off_suffix(const void *a, const void *b)
{
    const int32_t *x = a, *y = b;
    if (x[0] != y[0]) return x[0] - y[0];
    const token_trie *tt = sort_suffix_tt;
    size_t lx = tt->len[x[1]] - (size_t)x[0], ly = tt->len[y[1]] - (size_t)y[0];
    int c = memcmp(tt->bytes[x[1]] + x[0], tt->bytes[y[1]] + y[0], lx < ly ? lx : ly);
    if (c) return c;
    return lx != ly ? (lx < ly ? -1 : 1) : x[1] - y[1];
}

static pthread_mutex_t sort_mu = PTHREAD_MUTEX_INITIALIZER;   /* sort_suffix_tt */

/* The (offset, token) pairs into groups by offset, sorted by suffix. */
static void group_uncertain(const token_trie *tt, pos_cache *pc, int32_t (*u)[2], size_t n)
{
    pthread_mutex_lock(&sort_mu);
    sort_suffix_tt = tt;
    qsort(u, n, sizeof *u, by_off_suffix);
    pthread_mutex_unlock(&sort_mu);
    pc->unc = calloc(n + 1, sizeof *pc->unc);
    if (!pc->unc) abort();
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && u[j][0] == u[i][0]) j++;
        unc_group *g = &pc->unc[pc->n_unc++];
        g->off = u[i][0];
        g->n = (int32_t)(j - i);
        g->tok = malloc((j - i) * sizeof *g->tok);
        g->lcp = malloc((j - i) * sizeof *g->lcp);
        if (!g->tok || !g->lcp) abort();
        for (size_t k = i; k < j; k++) {
            g->tok[k - i] = u[k][1];
            int32_t l = 0;
            if (k > i) {
                const char *a = tt->bytes[u[k - 1][1]] + g->off, *b = tt->bytes[u[k][1]] + g->off;
                size_t la = tt->len[u[k - 1][1]] - (size_t)g->off, lb = tt->len[u[k][1]] - (size_t)g->off;
                while ((size_t)l < la && (size_t)l < lb && a[l] == b[l]) l++;
            }
            g->lcp[k - i] = l;
        }
        i = j;
    }
}

/* Sort every token for stacks with this chain on top (see the header);
 * gm is scratch over the same grammar (nodes rewound after). */
static void build_entry(const token_trie *tt, gmatch *gm, sort_scratch *ss, pos_cache *pc)
{
    int32_t base = gm->n_nodes;
    int32_t top = pc->root ? GM_ROOT : GM_BOTTOM;
    for (int i = pc->n - 1; i >= 0; i--) top = gmatch_node(gm, pc->key[i], top);
    int32_t before = gm->nodes[top].min;
    size_t cap_d = 256, cap_u = 64, n_u = 0;
    pc->acc = calloc(tt->words, sizeof *pc->acc);
    pc->accd = malloc(cap_d * sizeof *pc->accd);
    int32_t (*u)[2] = malloc(cap_u * sizeof *u);   /* (offset, token index) */
    if (!pc->acc || !pc->accd || !u) abort();
    pc->max_delta = INT32_MIN;
    gset one = { .top = &top, .n = 1, .cap = 1 };
    gset_copy(&ss->st[0], &one);
    ss->pop[0] = 0;
    ss->mark[0] = gm->n_nodes;
    for (int32_t i = 0; i < tt->n_nodes;) {
        int32_t d = tt->depth[i];
        gm->n_nodes = ss->mark[d - 1];
        gmatch_byte(gm, &ss->st[d - 1], tt->byte[i], &ss->st[d]);
        ss->pop[d] = ss->pop[d - 1] || ss->st[d].popped;
        ss->mark[d] = gm->n_nodes;
        if (gset_dead(&ss->st[d])) {
            if (ss->pop[d])
                for (int32_t o = 1; o <= d; o++) {
                    if (!ss->st[o].popped) continue;
                    for (int32_t k = tt->first[i]; k < tt->first[tt->skip[i]]; k++) {
                        if (n_u == cap_u) {
                            cap_u *= 2;
                            u = realloc(u, cap_u * sizeof *u);
                            if (!u) abort();
                        }
                        u[n_u][0] = o;
                        u[n_u++][1] = k;
                    }
                }
            i = tt->skip[i];
            continue;
        }
        if (tt->n_end[i]) {
            int32_t delta = gset_min(gm, &ss->st[d]) - before;
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
    if (pc->n_accd <= SMALL_ACC) {   /* set from the list: no bitset */
        free(pc->acc);
        pc->acc = NULL;
    }
    group_uncertain(tt, pc, u, n_u);
    free(u);
    gm->n_nodes = base;
}

/* The built entry for top's chain (sorting it now when new).  Returns
 * whether this call built it. */
static const pos_cache *get_entry(mask_cache *c, gmatch *gm, sort_scratch *ss, int32_t top,
                                  bool *built)
{
    pthread_mutex_lock(&c->mu);
    pos_cache *p = find_entry(c, gm, top);
    *built = !p->done;
    if (!p->done) {   /* under the lock: another thread may want it too */
        build_entry(c->tt, gm, ss, p);
        p->done = true;
    }
    pthread_mutex_unlock(&c->mu);
    return p;
}

/* A 64-bit digest of a state's chains, for the prewarm's visited set. */
static uint64_t state_key(mask_cache *c, const gmatch *gm, const gset *s)
{
    uint64_t h = s->accept ? 0x51ed27 : 0;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < s->n; i++)
        h += (uint64_t)(uintptr_t)find_entry(c, gm, s->top[i]) * 0x9e3779b97f4a7c15ULL;
    pthread_mutex_unlock(&c->mu);
    return h ^ (h >> 31);
}

void mask_cache_prewarm(mask_cache *c, int max_states)
{
    gmatch gm;
    gmatch_init(&gm, c->g);
    sort_scratch ss;
    scratch_init(&ss, c->tt);
    gset *queue = calloc((size_t)max_states + 1, sizeof *queue);
    size_t cap = 4096, n_seen = 0;
    uint64_t *seen = calloc(cap, sizeof *seen);   /* open addressing, 0 = empty */
    if (!queue || !seen) abort();
    int head = 0, tail = 0;
    gmatch_start(&gm, &queue[tail++]);
    gset next = { 0 };
    while (head < tail) {
        gset *s = &queue[head++];
        for (int i = 0; i < s->n; i++) {
            bool built;
            get_entry(c, &gm, &ss, s->top[i], &built);
        }
        for (int b = 0; b < 256 && tail < max_states; b++) {
            int32_t mark = gm.n_nodes;
            gmatch_byte(&gm, s, (uint8_t)b, &next);
            if (gset_dead(&next) || !next.n) { gm.n_nodes = mark; continue; }
            uint64_t k = state_key(c, &gm, &next) | 1;
            size_t j = k & (cap - 1);
            while (seen[j] && seen[j] != k) j = (j + 1) & (cap - 1);
            if (seen[j]) { gm.n_nodes = mark; continue; }
            seen[j] = k;
            if (2 * ++n_seen > cap) {   /* grow the visited set */
                uint64_t *old = seen;
                size_t oc = cap;
                cap *= 2;
                seen = calloc(cap, sizeof *seen);
                if (!seen) abort();
                for (size_t x = 0; x < oc; x++) {
                    if (!old[x]) continue;
                    size_t y = old[x] & (cap - 1);
                    while (seen[y]) y = (y + 1) & (cap - 1);
                    seen[y] = old[x];
                }
                free(old);
            }
            gset_copy(&queue[tail++], &next);
        }
    }
    for (int i = 0; i < tail; i++) gset_free(&queue[i]);
    free(queue);
    free(seen);
    gset_free(&next);
    scratch_free(&ss);
    gmatch_free(&gm);
}

/* ---- matcher ---- */

token_matcher *token_matcher_shared(mask_cache *c, int32_t eos)
{
    token_matcher *m = calloc(1, sizeof *m);
    if (!m) abort();
    m->c = mask_cache_ref(c);
    m->tt = c->tt;
    m->eos = eos;
    gmatch_init(&m->m, c->g);
    gmatch_start(&m->m, &m->cur);
    scratch_init(&m->ss, c->tt);
    m->scratch = malloc(c->tt->words * sizeof *m->scratch);
    if (!m->scratch) abort();
    return m;
}

token_matcher *token_matcher_new(const token_trie *tt, grammar *g, int32_t eos)
{
    mask_cache *c = mask_cache_new(tt, g);
    token_matcher *m = token_matcher_shared(c, eos);
    mask_cache_unref(c);
    return m;
}

void token_matcher_free(token_matcher *m)
{
    if (!m) return;
    scratch_free(&m->ss);
    free(m->scratch);
    gset_free(&m->cur); gset_free(&m->tmp[0]); gset_free(&m->tmp[1]);
    gmatch_free(&m->m);
    mask_cache_unref(m->c);
    free(m);
}

int token_matcher_min(const token_matcher *m)
{
    return m->ended ? 0 : gset_min(&m->m, &m->cur);
}

size_t token_matcher_n_caches(const token_matcher *m) { return m->n_built; }

bool token_matcher_accepting(const token_matcher *m) { return m->ended || m->cur.accept; }
bool token_matcher_done(const token_matcher *m) { return m->ended || (m->cur.accept && !m->cur.n); }

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

/* The uncertain tokens of top's chain, against the real stack below it. */
static void check_uncertain(token_matcher *m, const pos_cache *pc, int32_t top, int32_t limit,
                            uint64_t *mask)
{
    const token_trie *tt = m->tt;
    gmatch *gm = &m->m;
    sort_scratch *ss = &m->ss;
    int32_t below = top;
    for (int i = 0; i < pc->n; i++) below = gm->nodes[below].parent;
    int32_t base = gm->n_nodes;
    for (int32_t gi = 0; gi < pc->n_unc; gi++) {
        const unc_group *g = &pc->unc[gi];
        gm->n_nodes = base;
        gmatch_from(gm, gm->nodes[below].pos, gm->nodes[below].parent, &ss->st[0]);
        ss->mark[0] = gm->n_nodes;
        int32_t dead = INT32_MAX;   /* a refused prefix's length */
        for (int32_t i = 0; i < g->n; i++) {
            int32_t k = g->tok[i], l = g->lcp[i];
            if (l >= dead) continue;
            dead = INT32_MAX;
            const char *b = tt->bytes[k] + g->off;
            int32_t len = (int32_t)tt->len[k] - g->off, d;
            for (d = l + 1; d <= len; d++) {
                gm->n_nodes = ss->mark[d - 1];
                gmatch_byte(gm, &ss->st[d - 1], (uint8_t)b[d - 1], &ss->st[d]);
                ss->mark[d] = gm->n_nodes;
                if (gset_dead(&ss->st[d])) break;
            }
            if (d <= len) { dead = d; continue; }
            if (gset_min(gm, &ss->st[len]) <= limit) {
                int32_t t = tt->tok[k];
                mask[t >> 6] |= 1ULL << (t & 63);
            }
        }
    }
    gm->n_nodes = base;
}

void token_matcher_mask(token_matcher *m, int remaining, uint64_t *mask)
{
    const token_trie *tt = m->tt;
    gmatch *gm = &m->m;
    memset(mask, 0, tt->words * sizeof *mask);
    if (m->ended) return;
    if (m->cur.accept && m->eos >= 0) mask[m->eos >> 6] |= 1ULL << (m->eos & 63);
    int32_t limit = remaining - 2;   /* the most cost allowed after the token */
    for (int s = 0; s < m->cur.n; s++) {
        int32_t top = m->cur.top[s];
        bool built;
        const pos_cache *pc = get_entry(m->c, gm, &m->ss, top, &built);
        m->n_built += built;
        int32_t slack = limit - gm->nodes[top].min;
        if (pc->n_accd && slack >= pc->max_delta && pc->acc) {
            for (size_t w = 0; w < tt->words; w++) mask[w] |= pc->acc[w];
        } else if (pc->n_accd) {
            /* near the budget: the tokens whose cost change fits, from
             * whichever side of the boundary is shorter */
            int32_t lo = 0, hi = pc->n_accd;   /* first index with delta <= slack */
            while (lo < hi) {
                int32_t mid = lo + (hi - lo) / 2;
                if (pc->accd[mid].delta > slack) lo = mid + 1;
                else hi = mid;
            }
            if (pc->acc && lo < pc->n_accd - lo) {
                memcpy(m->scratch, pc->acc, tt->words * sizeof *m->scratch);
                for (int32_t k = 0; k < lo; k++) {
                    int32_t t = pc->accd[k].token;
                    m->scratch[t >> 6] &= ~(1ULL << (t & 63));
                }
                for (size_t w = 0; w < tt->words; w++) mask[w] |= m->scratch[w];
            } else {
                for (int32_t k = lo; k < pc->n_accd; k++) {
                    int32_t t = pc->accd[k].token;
                    mask[t >> 6] |= 1ULL << (t & 63);
                }
            }
        }
        if (pc->n_unc) check_uncertain(m, pc, top, limit, mask);
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
