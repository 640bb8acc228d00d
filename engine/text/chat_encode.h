/* Token ids of a rendered chat prompt (chat_render.h) with special tokens
 * only where the template wrote them: an added token of the tokenizer
 * (BOS, role markers, <think>, DSML markers, ...) spelled inside a
 * template span becomes its id; the same spelling in request text (user
 * content, tool results, history) stays ordinary text.  The whole prompt is
 * encoded at once (tok_encode_marked), so a prompt whose request text
 * spells no added token gets exactly the ids HF gives the whole string. */
#ifndef LLM_CHAT_ENCODE_H
#define LLM_CHAT_ENCODE_H

#include "chat_render.h"
#include "tokenizer.h"

/* Returns TOK_OK or a tokenizer error code (tok_strerror). */
int chat_prompt_encode(const tokenizer *t, const chat_prompt *p, tok_ids *out);

#endif
