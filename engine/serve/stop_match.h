/* Stop strings matched on generated text across token boundaries (OpenAI
 * `stop`): text that might be the start of a stop string is held back
 * until it is known not to be; a match ends the output before it. */
#ifndef LLM_STOP_MATCH_H
#define LLM_STOP_MATCH_H

#include <stdbool.h>
#include <stddef.h>

#include "ipc/llm_request.h"   /* LLM_REQ_STOP_MAX */
#include "strbuf.h"

typedef struct {
    char  *stop[LLM_REQ_STOP_MAX];
    size_t len[LLM_REQ_STOP_MAX];
    int    n;
    strbuf held;        /* text not yet released */
    bool   matched;
    int    which;       /* index of the stop string that matched */
} stop_matcher;

/* Stops must be non-empty; at most LLM_REQ_STOP_MAX (callers validate). */
void stop_init(stop_matcher *m, const char *const *stops, int n);
void stop_free(stop_matcher *m);

/* Feed generated text; append what may be emitted to out.  Returns true
 * once a stop string matched: out then ends right before it and later
 * calls emit nothing. */
bool stop_feed(stop_matcher *m, const char *text, size_t len, strbuf *out);

/* End of generation without a match: release held text. */
void stop_flush(stop_matcher *m, strbuf *out);

#endif
