/* Byte-level context-free grammars for constrained decoding, and the
 * pushdown matcher that runs them.
 *
 * A grammar is a set of rules; a rule is a list of alternatives; an
 * alternative is a sequence of elements, each a byte class (a set of
 * bytes) or a reference to a rule.  Grammars built here must not be left
 * recursive and repetition bodies must not be nullable (json_schema.c
 * builds only such grammars); grammar_finish checks productivity.
 *
 * Positions: the alternatives are stored in one flat array, each ended by
 * an END element, so a position (an index into it) names "the rest of one
 * alternative".  A stack is a chain of frames (position to resume at,
 * parent); the matcher keeps a set of stacks (the grammar may be
 * ambiguous, as anyOf is) whose tops always sit at a byte class.  Frames
 * are nodes in an arena, shared between stacks and never changed, so
 * advancing is cheap and a caller can rewind the arena to try bytes and
 * back off (the token trie walk in token_mask.c does).  A reference in
 * last position does not push a frame (tail call), so repetition written as
 * right recursion runs in constant stack depth.
 *
 * Each node also carries the least cost (grammar_finish) that completes
 * its whole stack, which is what the "never truncated" budget rule needs. */
#ifndef LLM_GRAMMAR_H
#define LLM_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct grammar grammar;

/* An alternative under construction (elements; see galt_*). */
typedef struct {
    int32_t *e;
    int n, cap;
} galt;

grammar *grammar_new(void);
void grammar_free(grammar *g);
/* A new rule without alternatives; returns its id. */
int grammar_rule(grammar *g);
/* Append alternative a to rule (a is reset for reuse). */
void grammar_add_alt(grammar *g, int rule, galt *a);
/* A rule with one alternative, made from a (reset); returns its id. */
int grammar_seq(grammar *g, galt *a);

void galt_lit(grammar *g, galt *a, const char *s, size_t n);
void galt_str(grammar *g, galt *a, const char *s);
void galt_range(grammar *g, galt *a, unsigned lo, unsigned hi);
/* The bytes in set (256 bits). */
void galt_set(grammar *g, galt *a, const uint64_t set[4]);
void galt_ref(galt *a, int rule);
void galt_free(galt *a);

/* Costs: every byte class costs one (one byte, one token: byte-level BPE
 * has a token per byte), except in runs of single-byte classes (literals),
 * which lit_cost may price in tokens: it fills suffix[i] (i in 0..n, with
 * suffix[n] = 0) with at most how many tokens spell lit[i..n).  The "fewest
 * bytes" of the matcher are then at most that many tokens. */
typedef void (*grammar_lit_cost)(void *ctx, const uint8_t *lit, size_t n, int32_t *suffix);

/* Freeze: compute the least cost of every rule (lit_cost may be NULL:
 * bytes).  start is the rule a match must produce.  Returns 0, or -1 with
 * a reason in err (a rule that produces no finite string). */
int grammar_finish(grammar *g, int start, grammar_lit_cost lit_cost, void *ctx,
                   char *err, size_t errlen);
/* Least cost of the start rule (after grammar_finish). */
int grammar_min_len(const grammar *g);

/* ---- matcher ---- */

#define GM_ROOT   (-1)    /* parent of the outermost frame */
#define GM_BOTTOM 0       /* stand-in for "whatever is below" (token_mask) */

typedef struct {
    int32_t pos, parent;
    int32_t min;          /* least cost that finishes this stack */
} gnode;

/* A set of stacks: node ids of their tops (each at a byte class), and
 * whether the whole grammar may end here. */
typedef struct {
    int32_t *top;
    int n, cap;
    bool accept;
    bool popped;          /* a stack ran off GM_BOTTOM (token_mask) */
} gset;

typedef struct {
    const grammar *g;
    gnode *nodes;
    int32_t n_nodes, cap_nodes;
} gmatch;

/* Matcher over g (finished); node GM_BOTTOM exists from the start. */
void gmatch_init(gmatch *m, const grammar *g);
void gmatch_free(gmatch *m);
/* The stacks at the start of the grammar. */
void gmatch_start(gmatch *m, gset *out);
/* A frame at pos (not END) over parent, as a new node. */
int32_t gmatch_node(gmatch *m, int32_t pos, int32_t parent);
/* The stacks of a frame at pos over parent (GM_ROOT, GM_BOTTOM or a node). */
void gmatch_from(gmatch *m, int32_t pos, int32_t parent, gset *out);
/* out = in advanced by byte c (out must not alias in).  An empty result
 * without accept means c is not allowed. */
void gmatch_byte(gmatch *m, const gset *in, uint8_t c, gset *out);
/* Least cost that finishes some stack of s (0 when it accepts), or
 * INT32_MAX for a dead set. */
int32_t gset_min(const gmatch *m, const gset *s);
bool gset_dead(const gset *s);
void gset_copy(gset *dst, const gset *src);
void gset_free(gset *s);

#endif
