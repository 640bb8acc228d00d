/* The fixed requests the functional and quality gates send: one function
 * tool with a small schema, and helpers to judge what came back. */
#ifndef QUALIFY_PROMPTS_H
#define QUALIFY_PROMPTS_H

#include <stdbool.h>

#include "chat.h"

/* [{"type":"function","function":{"name":"get_weather",...}}] */
extern const char weather_tools[];
/* {"type":"function","function":{"name":"get_weather"}} */
extern const char weather_choice[];

/* The call is get_weather with arguments that are a JSON object valid
 * against its schema; when city is non-NULL the city must contain it
 * (case-insensitive).  0, or -1 with the reason. */
int check_weather_call(const chat_tool_call *c, const char *city, strbuf *why);

/* A check about model output: pass when good; when not, fail, or
 * not_meaningful with --model-is-random (a random model cannot pass it). */
void output_check(qctx *q, gate *g, bool good, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* The completion budget for a gate request: --max-tokens, but never more
 * than half of max_model_len (the prompts here are short). */
long gen_budget(qctx *q);

/* Case-insensitive substring test. */
bool contains_ci(const char *hay, const char *needle);

#endif
