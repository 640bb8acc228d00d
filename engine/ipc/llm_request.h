/* The canonical engine request: the JSON object nginx's module writes into
 * a slot's request area after validating the client's body (docs/NGINX.md,
 * "The canonical engine request").  Its names and limits are defined here
 * once: the module validates against them, and the engine, which trusts
 * the form, still refuses a value outside them with a 400 error event
 * naming the field (a request may come from another client of the
 * library, e.g. llm-engine client).  Header only: no code, no allocation. */
#ifndef LLM_REQUEST_H
#define LLM_REQUEST_H

#include "llm_ipc.h"

/* Sampling fields: X(name, integer, min_open, min, max); min_open: the
 * minimum itself is excluded.  JSON null counts as absent. */
#define LLM_REQ_SAMPLING(X)                          \
    X(temperature,        0, 0,  0.0, 2.0)           \
    X(top_p,              0, 1,  0.0, 1.0)           \
    X(top_k,              1, 0, -1.0, 2147483647.0)  \
    X(min_p,              0, 0,  0.0, 1.0)           \
    X(presence_penalty,   0, 0, -2.0, 2.0)           \
    X(frequency_penalty,  0, 0, -2.0, 2.0)           \
    X(repetition_penalty, 0, 1,  0.0, 2.0)

/* reasoning_effort values, in order; "none" means chat mode */
#define LLM_REQ_EFFORTS \
    "none", "minimal", "low", "medium", "high", "xhigh", "max"
#define LLM_REQ_EFFORTS_TEXT "none, minimal, low, medium, high, xhigh, max"

/* top_logprobs (chat) up to the alternatives one logprob event carries;
 * logprobs (completions) as OpenAI limits it */
#define LLM_REQ_TOP_LOGPROBS_MAX         LLM_IPC_TOP_MAX
#define LLM_REQ_COMPLETION_LOGPROBS_MAX  5

/* stop strings per request (the engine matches each across tokens) */
#define LLM_REQ_STOP_MAX  16

/* tool and schema names: [A-Za-z0-9_-]{1,64}, safe inside DSML markup */
#define LLM_REQ_TOOL_NAME_MAX  64

#endif
