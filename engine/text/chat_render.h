/* DeepSeek V4-0731 prompt rendering (shared/design/CHAT_FORMAT.md).
 *
 * Two entry points:
 *  - chat_render(): the encoder itself, taking the same arguments as
 *    DeepSeek's encode_messages (messages with roles system, user,
 *    assistant, tool, developer, latest_reminder; per-message tools,
 *    response_format, task, wo_eos; thinking or chat mode; reasoning effort;
 *    drop_thinking).
 *  - chat_render_request(): an OpenAI chat-completions request mapped onto
 *    those arguments the way vLLM does it, with recipe defaults for what the
 *    request leaves out.
 *
 * The result carries the prompt text and spans that say where special
 * tokens may be recognized when tokenizing it (see chat_prompt). */
#ifndef LLM_CHAT_RENDER_H
#define LLM_CHAT_RENDER_H

#include <stdbool.h>
#include <stddef.h>
#include <yajl/yajl_tree.h>

#include "strbuf.h"

/* Hard limit on a rendered prompt (and so on any one message): far above
 * any context the model takes, low enough to refuse absurd input early. */
#define CHAT_MAX_PROMPT_BYTES ((size_t)64 << 20)

enum chat_role {
    CHAT_SYSTEM, CHAT_USER, CHAT_ASSISTANT, CHAT_TOOL, CHAT_DEVELOPER,
    CHAT_LATEST_REMINDER,
};

/* DeepSeek's internal quick-instruction tasks (official case 4). */
enum chat_task {
    CHAT_TASK_NONE, CHAT_TASK_ACTION, CHAT_TASK_QUERY, CHAT_TASK_AUTHORITY,
    CHAT_TASK_DOMAIN, CHAT_TASK_TITLE, CHAT_TASK_READ_URL,
};

/* The three tiers of the 0731 checkpoint; low adds nothing to the prompt. */
enum chat_effort { CHAT_EFFORT_LOW, CHAT_EFFORT_HIGH, CHAT_EFFORT_MAX };

typedef struct {
    char    *id;            /* NULL when the call has none */
    char    *name;
    yajl_val args;          /* a JSON object */
} chat_tool_call;

/* One message as the encoder sees it.  Strings are owned (NUL-free UTF-8);
 * yajl values point into trees owned by the chat_conversation. */
typedef struct {
    enum chat_role role;
    char    *content;       /* text parts joined by "\n\n"; "" when absent */
    char    *reasoning;     /* assistant reasoning_content, NULL when none */
    chat_tool_call *calls;  /* assistant tool_calls */
    size_t   n_calls;
    char    *tool_call_id;  /* tool: the call answered, NULL when none */
    yajl_val tools;         /* OpenAI tool objects; rendered on system and
                               developer messages; NULL when none */
    yajl_val response_format;  /* rendered on system/developer; NULL: none */
    enum chat_task task;
    bool     wo_eos;        /* assistant: leave the turn open (no EOS) */
} chat_message;

typedef struct {
    chat_message *msgs;
    size_t   n, cap;
    yajl_val *trees;        /* parsed argument strings, freed with us */
    size_t   n_trees, cap_trees;
} chat_conversation;

typedef struct {
    bool thinking;          /* thinking mode (else chat mode) */
    enum chat_effort effort;   /* thinking mode only */
    bool drop_thinking;     /* drop reasoning of turns before the last user turn */
} chat_options;

/* A span of the rendered prompt. */
typedef struct {
    size_t off, len;
    bool   special_ok;
} chat_span;

/* The rendered prompt.
 *  - origin: where each byte came from: special_ok spans were written by the
 *    template, the others hold request text (message content, reasoning,
 *    tool names, arguments, schemas), which must never become special tokens.
 *  - spans: the same bytes cut for tokenization, one tok_encode call each
 *    with allow_special = special_ok.  special_ok spans hold only special
 *    token strings written by the template; everything else, template text
 *    included, is merged into ordinary-text spans, so the ids equal those of
 *    tokenizing the whole string at once (as the reference does) whenever
 *    the request text spells no special token.  Both lists cover the text
 *    contiguously, in order. */
typedef struct {
    strbuf     text;
    chat_span *origin;
    size_t     n_origin, cap_origin;
    chat_span *spans;
    size_t     n_spans, cap_spans;
} chat_prompt;

/* Where a request went wrong: param names the field ("messages[2].role"),
 * message is one line for a person, starting with the param. */
typedef struct {
    char param[128];
    char message[512];
} chat_error;

/* Fill err: param, and message "PARAM: <formatted text>". */
void chat_fail(chat_error *err, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A request value fit for an error message: at most 40 bytes (cut at a
 * character boundary, "..." appended), control characters as '?'. */
const char *chat_quote(char buf[64], const char *s);

/* The special token strings the template writes (BOS, EOS, role markers,
 * <think>, </think>, task markers). */
extern const char *const chat_special_strings[];
extern const size_t chat_n_special_strings;

void chat_prompt_init(chat_prompt *p);
void chat_prompt_free(chat_prompt *p);
/* Recompute p->spans from p->origin, recognizing the given special strings
 * inside template text.  chat_render uses chat_special_strings; a tokenizer
 * with more added tokens can re-cut with its own list. */
void chat_prompt_segment(chat_prompt *p, const char *const *specials, size_t n);

/* Load encoder-style messages (a JSON array of message objects, the shape
 * of DeepSeek's test_input files and of OpenAI's messages).  Content may be
 * a string or an array of text parts.  Returns 0, or -1 with err set.  On
 * success free with chat_conversation_free(). */
int chat_conversation_from_json(chat_conversation *c, yajl_val messages,
                                chat_error *err);
void chat_conversation_free(chat_conversation *c);
/* tools: absent, null, or an array of {"type": "function", "function":
 * {"name": ..., ...}}.  False with err set (naming path) otherwise. */
bool chat_tools_valid(yajl_val tools, const char *path, chat_error *err);
/* Insert a message before position at; returns it, zeroed but for role and
 * content "". */
chat_message *chat_conversation_insert(chat_conversation *c, size_t at,
                                       enum chat_role role);

/* Render a conversation with the encoder's arguments.  Returns 0, or -1
 * with err set (the prompt would exceed CHAT_MAX_PROMPT_BYTES).  p must be
 * initialized; its previous contents are replaced. */
int chat_render(const chat_conversation *c, const chat_options *o,
                chat_prompt *p, chat_error *err);

/* The OpenAI mapping: the request's thinking / enable_thinking /
 * reasoning_effort / drop_thinking override defaults; tools and
 * response_format go onto the first message when it is a system message,
 * else onto a new empty system message put first. */
int chat_render_request(yajl_val request, const chat_options *defaults,
                        chat_prompt *p, chat_error *err);

/* reasoning_effort names: minimal/low -> low, medium/high -> high,
 * xhigh/max -> max, anything else -> low.  Returns false for "none", which
 * means chat mode. */
bool chat_effort_from_name(const char *name, enum chat_effort *out);

#endif
