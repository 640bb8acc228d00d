/* One protocol event as a compact JSON object with a "type" field: what
 * `llm-engine client` prints, one per line. */
#ifndef LLM_EVENT_JSON_H
#define LLM_EVENT_JSON_H

#include "ipc/llm_ipc.h"
#include "strbuf.h"

void event_to_json(strbuf *sb, const llm_ipc_event *ev);

#endif
