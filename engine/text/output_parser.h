/* Incremental parser of DeepSeek V4 completions (CHAT_FORMAT.md, "Parsing
 * the completion"): completion text goes in, in chunks of any size; events
 * come out through a callback as soon as the text allows.
 *
 *   reasoning   text before </think> (thinking mode)
 *   content     the answer
 *   tool calls  DSML blocks "\n\n<｜DSML｜tool_calls>..." become calls with
 *               OpenAI-style arguments (a JSON object string)
 *
 * Only bytes that may still begin a marker (</think>, the DSML opener, the
 * EOS text) or an unfinished UTF-8 character are held back; all other text
 * is emitted at once.  Ill-formed UTF-8 and NUL bytes become U+FFFD.  Each tool call is
 * emitted when its invoke is complete (begin, one arguments delta, end): a
 * truncated or malformed invoke cannot be taken back once streamed, and the
 * contract is that it degrades to content.  Never fails; the lenient rules
 * are listed in docs/CHAT_FORMAT_NOTES.md.  Feeding the same text in any
 * split gives the same events' concatenation. */
#ifndef LLM_OUTPUT_PARSER_H
#define LLM_OUTPUT_PARSER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strbuf.h"

/* Why generation ended, as the caller knows it. */
enum gen_stop {
    GEN_STOP,       /* EOS or a stop condition */
    GEN_LENGTH,     /* token limit */
};

enum finish_reason { FINISH_STOP, FINISH_LENGTH, FINISH_TOOL_CALLS };

enum parse_event_kind {
    PARSE_REASONING,    /* text, len: reasoning delta */
    PARSE_CONTENT,      /* text, len: content delta */
    PARSE_TOOL_BEGIN,   /* index, id, name */
    PARSE_TOOL_ARGS,    /* index, text, len: arguments delta */
    PARSE_TOOL_END,     /* index */
    PARSE_FINISH,       /* finish; always the last event */
};

/* Pointers are valid during the callback only. */
typedef struct {
    enum parse_event_kind kind;
    const char *text;
    size_t      len;
    int         index;          /* tool call position in this response, from 0 */
    const char *id;             /* "call_" + 24 random [A-Za-z0-9] */
    const char *name;
    enum finish_reason finish;
} parse_event;

typedef void (*parse_event_fn)(void *ctx, const parse_event *ev);
/* Randomness for tool call ids (tests pass a seeded generator). */
typedef uint64_t (*parse_rand_fn)(void *ctx);

typedef struct output_parser output_parser;

/* thinking: the prompt ended in <think>, so the completion starts with
 * reasoning. */
output_parser *output_parser_new(bool thinking, parse_event_fn on_event, void *ctx,
                                 parse_rand_fn rand, void *rand_ctx);
void output_parser_feed(output_parser *p, const char *text, size_t len);
/* End of the completion: flushes what was held back and emits FINISH
 * (stop, length, or tool_calls when a call was emitted and generation
 * stopped).  Text after an EOS was ignored, and an EOS means GEN_STOP.
 * Later feeds and finishes are ignored. */
void output_parser_finish(output_parser *p, enum gen_stop why);
void output_parser_free(output_parser *p);

/* The final message, collected from events (parsed_message_on_event is a
 * parse_event_fn; pass the parsed_message as ctx). */
typedef struct {
    char  *id, *name;
    strbuf args;
} parsed_call;

typedef struct {
    strbuf content, reasoning;
    parsed_call *calls;
    size_t n_calls, cap_calls;
    enum finish_reason finish;
    bool finished;
} parsed_message;

void parsed_message_init(parsed_message *m);
void parsed_message_free(parsed_message *m);
void parsed_message_on_event(void *ctx, const parse_event *ev);
/* {"role": "assistant", "content": ..., "reasoning_content": ...,
 * "tool_calls": [{"id", "type": "function", "function": {"name",
 * "arguments"}}]}, the reference parser's shape: content and
 * reasoning_content are "" when empty. */
void parsed_message_json(const parsed_message *m, strbuf *out);

const char *finish_reason_name(enum finish_reason r);

#endif
