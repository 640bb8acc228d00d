/* Internals shared by tokenizer_load.c (tokenizer.json -> tables),
 * tokenizer.c (encoding) and detokenizer.c (decoding). */
#ifndef LLM_TOKENIZER_IMPL_H
#define LLM_TOKENIZER_IMPL_H

#include "hashmap.h"
#include "onig_regex.h"
#include "tokenizer.h"

/* HF's SplitDelimiterBehavior. */
enum split_behavior {
    SPLIT_REMOVED,
    SPLIT_ISOLATED,
    SPLIT_MERGED_WITH_PREVIOUS,
    SPLIT_MERGED_WITH_NEXT,
    SPLIT_CONTIGUOUS,
};

typedef struct {
    onig_regex *re;
    enum split_behavior behavior;
    bool invert;
} split_step;

typedef struct {
    const char *content;
    uint32_t len;
    int32_t id;
    bool special, normalized, lstrip, rstrip, single_word;
} added_token;

/* Byte trie over added-token contents, for leftmost-longest matching. */
typedef struct {
    u64map child;           /* node << 8 | byte -> child node */
    int32_t *term;          /* node -> index in added[], or -1 */
    int32_t n_nodes;
    bool first[256];        /* bytes some token starts with */
} token_trie;

struct tokenizer {
    char *arena;                    /* every token string, NUL-separated */
    int32_t n_ids;                  /* 1 + largest id */
    const char **tok_str;           /* [n_ids] token string; NULL: no token */
    uint32_t *tok_len;
    bool *special;                  /* [n_ids] special added token */
    char *dec;                      /* decoded bytes of every token */
    uint32_t *dec_off, *dec_len;    /* [n_ids] */

    /* BPE model */
    strmap vocab;
    u64map merges;                  /* a << 32 | b -> rank << 32 | merged id */
    bool ignore_merges, byte_fallback, fuse_unk;
    int32_t unk_id;                 /* -1: none */
    int32_t fallback_id[256];       /* ids of <0xXX>, -1 when absent */

    /* pre-tokenizer: Split steps, then optionally ByteLevel */
    split_step *splits;
    int n_splits;
    bool byte_level, add_prefix_space;
    onig_regex *byte_level_re;      /* GPT-2 pattern when use_regex */
    int32_t byte_id[256];           /* id of each byte's ByteLevel char, -1 */

    /* added tokens */
    added_token *added;
    int n_added;
    strmap added_map;               /* content -> index in added[] */
    token_trie trie_raw, trie_norm; /* normalized false / true */
    onig_regex *word_re;            /* \w of Rust's regex, for single_word */

    int32_t bos_id, eos_id;
};

/* GPT-2's byte <-> printable character map used by ByteLevel. */
uint32_t byte_level_char(unsigned char b);
int byte_level_byte(uint32_t cp);   /* -1 for characters outside the map */

#endif
