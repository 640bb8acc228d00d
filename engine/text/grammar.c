#include "grammar.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Elements in the flat array: >= 0 a byte class index, E_END ends an
 * alternative, < E_END a rule reference (E_END - 1 - rule). */
#define E_END (-1)
#define IS_REF(e) ((e) < E_END)
#define REF_RULE(e) (E_END - 1 - (e))

typedef struct {
    int32_t *alt;            /* start positions */
    int n, cap;
} grule;

struct grammar {
    grule   *rules;
    int      n_rules, cap_rules;
    int32_t *elems;          /* flat alternatives */
    int32_t  n_elems, cap_elems;
    uint64_t (*cls)[4];      /* byte classes, deduplicated */
    int      n_cls, cap_cls;
    int32_t *rule_min;       /* fewest bytes per rule */
    int32_t *suffix;         /* least cost from each position to its END */
    int32_t *cost;           /* per class element (grammar_finish) */
    int      start;
};

#define GROW(p, n, cap, init)                                              \
    do {                                                                   \
        if ((n) == (cap)) {                                                \
            (cap) = (cap) ? 2 * (cap) : (init);                            \
            void *np_ = realloc((p), (size_t)(cap) * sizeof *(p));         \
            if (!np_) abort();                                             \
            (p) = np_;                                                     \
        }                                                                  \
    } while (0)

grammar *grammar_new(void)
{
    grammar *g = calloc(1, sizeof *g);
    if (!g) abort();
    g->start = -1;
    return g;
}

void grammar_free(grammar *g)
{
    if (!g) return;
    for (int i = 0; i < g->n_rules; i++) free(g->rules[i].alt);
    free(g->rules);
    free(g->elems);
    free(g->cls);
    free(g->rule_min);
    free(g->suffix);
    free(g->cost);
    free(g);
}

int grammar_rule(grammar *g)
{
    GROW(g->rules, g->n_rules, g->cap_rules, 16);
    memset(&g->rules[g->n_rules], 0, sizeof g->rules[0]);
    return g->n_rules++;
}

static void push_elem(grammar *g, int32_t e)
{
    GROW(g->elems, g->n_elems, g->cap_elems, 256);
    g->elems[g->n_elems++] = e;
}

void grammar_add_alt(grammar *g, int rule, galt *a)
{
    grule *r = &g->rules[rule];
    GROW(r->alt, r->n, r->cap, 2);
    r->alt[r->n++] = g->n_elems;
    for (int i = 0; i < a->n; i++) push_elem(g, a->e[i]);
    push_elem(g, E_END);
    a->n = 0;
}

int grammar_seq(grammar *g, galt *a)
{
    int r = grammar_rule(g);
    grammar_add_alt(g, r, a);
    return r;
}

static void galt_push(galt *a, int32_t e)
{
    GROW(a->e, a->n, a->cap, 8);
    a->e[a->n++] = e;
}

void galt_free(galt *a)
{
    free(a->e);
    memset(a, 0, sizeof *a);
}

void galt_set(grammar *g, galt *a, const uint64_t set[4])
{
    int i;
    for (i = 0; i < g->n_cls; i++)
        if (!memcmp(g->cls[i], set, sizeof g->cls[i])) break;
    if (i == g->n_cls) {
        GROW(g->cls, g->n_cls, g->cap_cls, 32);
        memcpy(g->cls[g->n_cls++], set, sizeof g->cls[0]);
    }
    galt_push(a, i);
}

void galt_range(grammar *g, galt *a, unsigned lo, unsigned hi)
{
    uint64_t s[4] = { 0 };
    for (unsigned c = lo; c <= hi && c < 256; c++) s[c >> 6] |= 1ULL << (c & 63);
    galt_set(g, a, s);
}

void galt_lit(grammar *g, galt *a, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) galt_range(g, a, (uint8_t)s[i], (uint8_t)s[i]);
}

void galt_str(grammar *g, galt *a, const char *s) { galt_lit(g, a, s, strlen(s)); }

void galt_ref(galt *a, int rule) { galt_push(a, E_END - 1 - rule); }

int grammar_min_len(const grammar *g) { return g->rule_min[g->start]; }

/* Sum of element minima from pos to END, INT32_MAX when some rule is not
 * (yet) known to be productive. */
static int32_t seq_min(const grammar *g, int32_t pos)
{
    int64_t sum = 0;
    for (int32_t p = pos; g->elems[p] != E_END; p++) {
        int32_t e = g->elems[p];
        int32_t m = IS_REF(e) ? g->rule_min[REF_RULE(e)] : g->cost[p];
        if (m == INT32_MAX) return INT32_MAX;
        sum += m;
        if (sum >= INT32_MAX / 2) return INT32_MAX / 2;
    }
    return (int32_t)sum;
}

static bool single_byte(const grammar *g, int32_t e, uint8_t *b)
{
    if (e < 0) return false;
    int n = 0;
    for (int w = 0; w < 4; w++) {
        uint64_t x = g->cls[e][w];
        if (!x) continue;
        n += __builtin_popcountll(x);
        *b = (uint8_t)(w * 64 + __builtin_ctzll(x));
    }
    return n == 1;
}

/* Element costs: 1, or literal runs priced by lit_cost. */
static void set_costs(grammar *g, grammar_lit_cost lit_cost, void *ctx)
{
    g->cost = malloc((size_t)(g->n_elems + 1) * sizeof *g->cost);
    uint8_t *lit = malloc((size_t)g->n_elems + 1);
    int32_t *suf = malloc((size_t)(g->n_elems + 2) * sizeof *suf);
    if (!g->cost || !lit || !suf) abort();
    for (int32_t p = 0; p < g->n_elems; p++) g->cost[p] = 1;
    for (int32_t p = 0; lit_cost && p < g->n_elems;) {
        int32_t q = p;
        while (q < g->n_elems && single_byte(g, g->elems[q], &lit[q - p])) q++;
        if (q - p > 1) {
            lit_cost(ctx, lit, (size_t)(q - p), suf);
            for (int32_t i = p; i < q; i++) g->cost[i] = suf[i - p] - suf[i - p + 1];
        }
        p = q > p ? q : p + 1;
    }
    free(lit);
    free(suf);
}

int grammar_finish(grammar *g, int start, grammar_lit_cost lit_cost, void *ctx,
                   char *err, size_t errlen)
{
    g->start = start;
    set_costs(g, lit_cost, ctx);
    g->rule_min = malloc((size_t)(g->n_rules + 1) * sizeof *g->rule_min);
    g->suffix = malloc((size_t)(g->n_elems + 1) * sizeof *g->suffix);
    if (!g->rule_min || !g->suffix) abort();
    for (int i = 0; i < g->n_rules; i++) g->rule_min[i] = INT32_MAX;
    /* Bellman-Ford style: minima only decrease, each pass fixes at least
     * one more rule, so n_rules + 1 passes suffice. */
    for (int pass = 0, changed = 1; changed && pass <= g->n_rules + 1; pass++) {
        changed = 0;
        for (int r = 0; r < g->n_rules; r++)
            for (int k = 0; k < g->rules[r].n; k++) {
                int32_t m = seq_min(g, g->rules[r].alt[k]);
                if (m < g->rule_min[r]) { g->rule_min[r] = m; changed = 1; }
            }
    }
    for (int r = 0; r < g->n_rules; r++)
        if (g->rule_min[r] == INT32_MAX) {
            snprintf(err, errlen, "the grammar's rule %d produces no finite string", r);
            return -1;
        }
    for (int32_t p = 0; p < g->n_elems; p++)
        g->suffix[p] = g->elems[p] == E_END ? 0 : seq_min(g, p);
    return 0;
}

/* ---- matcher ---- */

void gmatch_init(gmatch *m, const grammar *g)
{
    memset(m, 0, sizeof *m);
    m->g = g;
    m->cap_nodes = 1024;
    m->nodes = malloc((size_t)m->cap_nodes * sizeof *m->nodes);
    if (!m->nodes) abort();
    m->nodes[GM_BOTTOM] = (gnode){ .pos = -1, .parent = GM_ROOT, .min = 0 };
    m->n_nodes = 1;
}

void gmatch_free(gmatch *m)
{
    free(m->nodes);
    memset(m, 0, sizeof *m);
}

int32_t gmatch_node(gmatch *m, int32_t pos, int32_t parent)
{
    GROW(m->nodes, m->n_nodes, m->cap_nodes, 1024);
    int32_t below = parent >= 0 ? m->nodes[parent].min : 0;
    m->nodes[m->n_nodes] = (gnode){ pos, parent, m->g->suffix[pos] + below };
    return m->n_nodes++;
}

static void set_push(gset *s, int32_t node)
{
    GROW(s->top, s->n, s->cap, 8);
    s->top[s->n++] = node;
}

/* Add the stacks of frame (pos, parent), expanded until each top is at a
 * byte class.  Equal stacks are kept once. */
static void expand(gmatch *m, int32_t pos, int32_t parent, gset *out)
{
    const grammar *g = m->g;
    for (;;) {
        int32_t e = g->elems[pos];
        if (e == E_END) {
            if (parent == GM_ROOT) { out->accept = true; return; }
            if (parent == GM_BOTTOM) { out->popped = true; return; }
            pos = m->nodes[parent].pos;
            parent = m->nodes[parent].parent;
            continue;
        }
        if (!IS_REF(e)) {
            for (int i = 0; i < out->n; i++) {
                const gnode *n = &m->nodes[out->top[i]];
                if (n->pos == pos && n->parent == parent) return;
            }
            set_push(out, gmatch_node(m, pos, parent));
            return;
        }
        const grule *r = &g->rules[REF_RULE(e)];
        int32_t ret = g->elems[pos + 1] == E_END ? parent : gmatch_node(m, pos + 1, parent);
        for (int k = 0; k < r->n; k++) expand(m, r->alt[k], ret, out);
        return;
    }
}

void gmatch_start(gmatch *m, gset *out)
{
    const grule *r = &m->g->rules[m->g->start];
    out->n = 0;
    out->accept = out->popped = false;
    for (int k = 0; k < r->n; k++) expand(m, r->alt[k], GM_ROOT, out);
}

void gmatch_from(gmatch *m, int32_t pos, int32_t parent, gset *out)
{
    out->n = 0;
    out->accept = out->popped = false;
    expand(m, pos, parent, out);
}

void gmatch_byte(gmatch *m, const gset *in, uint8_t c, gset *out)
{
    out->n = 0;
    out->accept = false;
    out->popped = false;
    for (int i = 0; i < in->n; i++) {
        gnode n = m->nodes[in->top[i]];
        const uint64_t *cl = m->g->cls[m->g->elems[n.pos]];
        if (cl[c >> 6] >> (c & 63) & 1) expand(m, n.pos + 1, n.parent, out);
    }
}

int32_t gset_min(const gmatch *m, const gset *s)
{
    if (s->accept) return 0;
    int32_t best = INT32_MAX;
    for (int i = 0; i < s->n; i++)
        if (m->nodes[s->top[i]].min < best) best = m->nodes[s->top[i]].min;
    return best;
}

bool gset_dead(const gset *s) { return !s->n && !s->accept; }

void gset_copy(gset *dst, const gset *src)
{
    dst->n = 0;
    for (int i = 0; i < src->n; i++) set_push(dst, src->top[i]);
    dst->accept = src->accept;
    dst->popped = src->popped;
}

void gset_free(gset *s)
{
    free(s->top);
    memset(s, 0, sizeof *s);
}
