/* Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json, with
 * the encoding and decoding of HF `tokenizers` (checked against 0.23.2).
 *
 * Supported tokenizer.json (anything else is a load error naming the key):
 *   normalizer     null (or a Sequence of nothing, as in DeepSeek's file)
 *   pre_tokenizer  null, Split (Regex or String pattern; Removed, Isolated,
 *                  MergedWithPrevious, MergedWithNext, Contiguous; invert),
 *                  ByteLevel (add_prefix_space, use_regex; must come last),
 *                  Sequence of these (DeepSeek V3/V4: three Splits, then
 *                  ByteLevel without regex)
 *   model          BPE: vocab, merges ("a b" or ["a", "b"]), ignore_merges,
 *                  byte_fallback, unk_token, fuse_unk; no dropout, no
 *                  subword prefix/suffix
 *   added_tokens   special or not, lstrip, rstrip, single_word, normalized;
 *                  ids assigned as HF assigns them (not the file's "id")
 *   decoder        ByteLevel
 * post_processor, truncation and padding are ignored: tok_encode is HF's
 * encode(text, add_special_tokens=False), which is how the engine uses it
 * (the chat renderer writes BOS into the prompt text itself).
 *
 * A loaded tokenizer is read-only; any number of threads may use it. */
#ifndef LLM_TOKENIZER_H
#define LLM_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strbuf.h"
#include "utf8.h"

typedef struct tokenizer tokenizer;

typedef struct {
    int32_t *data;
    size_t len, cap;
} tok_ids;

void tok_ids_push(tok_ids *v, int32_t id);
void tok_ids_free(tok_ids *v);

/* Load path.  NULL with a one-line reason in err ("FILE: model.merges[3]:
 * ...") on failure. */
tokenizer *tok_load(const char *path, char *err, size_t errlen);
void tok_free(tokenizer *t);

enum {
    TOK_OK = 0,
    TOK_EUTF8 = -1,     /* text is not valid UTF-8 (utf8_valid_prefix says where) */
    TOK_EREGEX = -2,    /* the regex engine gave up (match or memory limit) */
    TOK_EMARK = -3,     /* tok_encode_marked: a mark is not its token */
};

/* Append the ids of text[0..len) to out.  allow_special: added tokens
 * (BOS, <｜User｜>, </think>, ...) spelled in the text become their ids, as
 * HF does; when false all text is ordinary text, so user content that
 * spells a special token cannot inject one.  Returns TOK_OK or an error
 * code, leaving out as it was on error. */
int tok_encode(const tokenizer *t, const char *text, size_t len, bool allow_special,
               tok_ids *out);
const char *tok_strerror(int code);

/* Encode a whole prompt in which exactly the marked added tokens are
 * tokens; all other text, including text that spells an added token, is
 * ordinary.  Ordinary text between two marks is pre-tokenized as one
 * piece, as HF does, so a prompt whose ordinary text spells no added token
 * gets exactly HF's ids for the whole string, while encoding template and
 * user spans separately can differ at span edges ("hi  " + "\n\n" is not
 * "hi  \n\n").  This is the chat renderer's entry point.  Marks are in
 * ascending offset order.  Returns TOK_OK, TOK_EUTF8, TOK_EREGEX or
 * TOK_EMARK (a mark's id is not an added token spelled at its offset, or
 * marks overlap). */
typedef struct {
    size_t offset;          /* byte offset of the token's text */
    int32_t id;             /* an added token's id (tok_added_token_id) */
} tok_mark;

int tok_encode_marked(const tokenizer *t, const char *text, size_t len, const tok_mark *marks,
                      size_t n_marks, tok_ids *out);

/* Number of ids: 1 + the largest id of any model or added token. */
int32_t tok_vocab_size(const tokenizer *t);
/* Token string of id as tokenizer.json spells it ("Ġthe", "<think>"), with
 * its length in *len; NULL for ids no token has. */
const char *tok_id_to_token(const tokenizer *t, int32_t id, size_t *len);
/* Id of a token string: added tokens first, then the model vocab; -1. */
int32_t tok_token_to_id(const tokenizer *t, const char *s, size_t len);
/* Id of the added token whose content is s; -1 when there is none. */
int32_t tok_added_token_id(const tokenizer *t, const char *s);
/* The added tokens, i in [0, tok_n_added): content (len bytes) and id. */
size_t tok_n_added(const tokenizer *t);
const char *tok_added_content(const tokenizer *t, size_t i, size_t *len, int32_t *id);
/* <｜begin▁of▁sentence｜> and <｜end▁of▁sentence｜>, or -1. */
int32_t tok_bos_id(const tokenizer *t);
int32_t tok_eos_id(const tokenizer *t);
/* Whether id is an added token marked special (what skip_special drops). */
bool tok_is_special(const tokenizer *t, int32_t id);
/* The bytes id contributes to decoded text (ByteLevel decoder applied to
 * the one token), before UTF-8 repair; NULL for an unknown id. */
const char *tok_id_bytes(const tokenizer *t, int32_t id, size_t *len);

/* Decoding.  The result is exactly HF's decode(ids, skip_special_tokens):
 * token bytes concatenated, then invalid UTF-8 replaced by U+FFFD.  The
 * engine decodes with skip_special false, so that </think>, DSML markers
 * and every other added token appear in the text for the output parser. */
typedef struct {
    const tokenizer *tok;
    bool skip_special;
    utf8_stream repair;
} tok_stream;

void tok_stream_init(tok_stream *s, const tokenizer *t, bool skip_special);
/* Feed one id; append to out the text that is now complete: valid UTF-8
 * only, never part of a code point.  Returns 0, or -1 for an id no token
 * has (nothing is appended). */
int tok_stream_push(tok_stream *s, int32_t id, strbuf *out);
/* End of the sequence: an incomplete tail becomes U+FFFD, as HF does. */
void tok_stream_finish(tok_stream *s, strbuf *out);

/* Whole-sequence decode.  Returns 0, or -1 with *bad set to the index of
 * the first unknown id (out then holds the text before it). */
int tok_decode(const tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
               strbuf *out, size_t *bad);

#endif
