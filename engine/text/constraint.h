/* What a request constrains its output to, as a grammar (json_schema.h):
 *   tool_choice "required"            a DSML tool-call block, one call or
 *                                     (parallel_tool_calls not false) more,
 *                                     to any of the tools
 *   tool_choice {"function":{name}}   exactly one call to that function
 *   response_format json_object       a JSON object
 *   response_format json_schema       JSON valid under the schema (strict
 *                                     or not: both are enforced)
 *   ... with tools and tool_choice auto (or absent): that JSON, or a block
 *                                     of calls (as parallel_tool_calls says)
 *   tools, tool_choice auto,          free text, with at most one call
 *   parallel_tool_calls false         (a block of one call ends the reply)
 * A forced tool_choice wins over response_format; tool_choice "none" (or
 * no tools) leaves tools out.  The text after the grammar is complete is
 * the EOS. */
#ifndef LLM_CONSTRAINT_H
#define LLM_CONSTRAINT_H

#include <yajl/yajl_tree.h>

#include "grammar.h"
#include "json_schema.h"
#include "token_mask.h"

/* *out: a finished grammar, or NULL when the request constrains nothing.
 * Literals are priced in trie's tokens (NULL: in bytes).  Returns 0, or -1
 * with err set (a 400 naming err->path). */
int constraint_from_request(yajl_val req, const token_trie *trie, grammar **out,
                            schema_error *err);

/* What identifies the grammar a request asks for (its tools, tool_choice,
 * parallel_tool_calls and response_format, as compact JSON): requests
 * with equal keys get equal grammars, so they can share one mask_cache.
 * NULL when the request constrains nothing.  Caller frees. */
char *constraint_key(yajl_val req);

#endif
