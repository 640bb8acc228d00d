/* Per-step allowed-token masks for a grammar (grammar.h) over a
 * tokenizer's vocabulary.
 *
 * token_trie: every token that is not special, by its decoded bytes, in a
 * trie laid out in preorder (a rejected prefix skips its subtree).  Built
 * once per tokenizer; read-only after.
 *
 * token_matcher: one request's grammar and matcher state.  As xgrammar
 * does, tokens are sorted per stack-top position, once, lazily: walked
 * from a frame over an unknown rest-of-stack, a token is accepted when
 * some path consumes it inside the frame (so in any context), rejected when
 * no path consumes it and none leaves the frame, uncertain otherwise.  A
 * step's mask is then the accepted sets of its stack tops plus the
 * uncertain tokens checked against the real stacks.
 *
 * Never truncated: the grammar's costs bound tokens (every byte is a token
 * of a byte-level BPE, checked at construction; literals are priced by
 * token_trie_lit_cost), so with R tokens left a token is allowed only if
 * the least cost that finishes the grammar after it plus the EOS fits in
 * R - 1.  The caller starts with a budget of at least
 * token_matcher_min() + 1 tokens; then some token is always allowed. */
#ifndef LLM_TOKEN_MASK_H
#define LLM_TOKEN_MASK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grammar.h"
#include "tokenizer.h"

typedef struct token_trie token_trie;
typedef struct token_matcher token_matcher;

/* vocab: the mask width (the model's vocab, >= the tokenizer's).  NULL with
 * err set when some byte has no single-byte token. */
token_trie *token_trie_new(const tokenizer *t, int vocab, char *err, size_t errlen);
void token_trie_free(token_trie *tt);
int token_trie_vocab(const token_trie *tt);
/* Words of a mask (64 tokens each). */
size_t token_mask_words(const token_trie *tt);

/* grammar_lit_cost over the trie's tokens (ctx: the token_trie): the
 * fewest tokens that spell each suffix of a literal. */
void token_trie_lit_cost(void *trie, const uint8_t *lit, size_t n, int32_t *suffix);

/* mask_cache: a grammar and its sorted tokens, shared by the requests
 * that use the same grammar (thread-safe; reference counted).  Takes
 * ownership of g (finished). */
typedef struct mask_cache mask_cache;
mask_cache *mask_cache_new(const token_trie *tt, grammar *g);
mask_cache *mask_cache_ref(mask_cache *c);
void mask_cache_unref(mask_cache *c);
const grammar *mask_cache_grammar(const mask_cache *c);
/* Chains (stack tops with their frames) sorted so far, and the bytes they
 * take. */
size_t mask_cache_size(mask_cache *c);
size_t mask_cache_bytes(mask_cache *c);
/* Sort the tokens of every chain reachable from the start, exploring the
 * grammar byte by byte up to max_states distinct states (in the
 * background, so decoding steps rarely sort). */
void mask_cache_prewarm(mask_cache *c, int max_states);

/* A matcher at the start of c's grammar (holds a reference).  eos: the id
 * allowed when the grammar is complete. */
token_matcher *token_matcher_shared(mask_cache *c, int32_t eos);
/* The same over a private cache; takes ownership of g (finished). */
token_matcher *token_matcher_new(const token_trie *tt, grammar *g, int32_t eos);
void token_matcher_free(token_matcher *m);
/* Least cost (at most this many tokens) that finishes the grammar from
 * the current state; 0 when it may end now. */
int token_matcher_min(const token_matcher *m);
/* The allowed tokens, with remaining tokens of budget (this one
 * included), into mask[token_mask_words]. */
void token_matcher_mask(token_matcher *m, int remaining, uint64_t *mask);
/* Advance by token (EOS ends the match).  Returns 0, or -1 when the token
 * is not allowed (state unchanged). */
int token_matcher_accept(token_matcher *m, int32_t token);
/* The grammar accepts here and nothing can follow. */
bool token_matcher_done(const token_matcher *m);
/* Advance by bytes (tests: check strings).  Same result as accept. */
int token_matcher_bytes(token_matcher *m, const char *s, size_t n);
bool token_matcher_accepting(const token_matcher *m);
/* Chains this matcher had to sort itself (bench-mask). */
size_t token_matcher_n_caches(const token_matcher *m);

static inline bool token_mask_has(const uint64_t *mask, int32_t t)
{
    return mask[t >> 6] >> (t & 63) & 1;
}

#endif
