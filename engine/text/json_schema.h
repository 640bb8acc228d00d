/* JSON Schema (the subset OpenAI's strict mode accepts) and plain JSON
 * compiled to grammar.h rules, and the DSML tool-call envelope of V4
 * (CHAT_FORMAT.md) with each tool's arguments constrained by its
 * parameters schema.
 *
 * Output form: compact JSON, with at most one space after ':' and ',';
 * object members in the schema's property order, required ones always,
 * optional ones may be left out; properties a schema does not declare are
 * never produced (so the output validates whatever additionalProperties
 * says).  Supported: type (one or a list), object (properties, required,
 * additionalProperties false/true/a schema), array (items, minItems,
 * maxItems), string (enum, const, minLength, maxLength, format date,
 * time, date-time, uuid), number, integer, boolean, null, enum, const,
 * anyOf, $ref to #, #/$defs/NAME and #/definitions/NAME (recursion
 * allowed).  Annotations (title, description, default, examples, $schema,
 * $id, $comment, strict) are ignored.  Any other keyword is an error
 * naming it, never ignored. */
#ifndef LLM_JSON_SCHEMA_H
#define LLM_JSON_SCHEMA_H

#include <stdbool.h>
#include <yajl/yajl_tree.h>

#include "grammar.h"

/* Errors: path names where in the schema ("schema.properties.a.pattern"),
 * message a sentence. */
typedef struct {
    char path[160];
    char message[400];
} schema_error;

/* A rule producing JSON values valid under schema; -1 with err set.
 * path prefixes error paths (e.g. "response_format.json_schema.schema"). */
int json_schema_rule(grammar *g, yajl_val schema, const char *path, schema_error *err);
/* A rule producing any JSON object (response_format json_object). */
int json_object_rule(grammar *g);

/* The DSML tool-call block for tools (an OpenAI tools array): one call
 * (or, with parallel, one or more) to any of them, or only to the named
 * one when only_name is not NULL.  The block starts with "\n\n" (without
 * opener: after "\n\n<｜DSML｜tool_calls", at ">\n") and ends with the
 * closing tool_calls tag. */
int dsml_tools_rule(grammar *g, yajl_val tools, const char *only_name, bool parallel,
                    bool opener, const char *path, schema_error *err);
/* Free text (any bytes) that may end anywhere, in which the DSML block
 * opener "\n\n<｜DSML｜tool_calls" can only go on with `rest` (a block
 * from dsml_tools_rule without opener) and nothing follows the block:
 * tool_choice auto with at most one call. */
int dsml_text_then_block_rule(grammar *g, int block);

#endif
