/* A request's output path: events go straight into its slot's ring, or,
 * when the ring is full because the reader is slow, into a per-sequence
 * overflow buffer that is moved into the ring, in order, as room appears.
 * Nothing is ever dropped or reordered; the scheduler pauses a sequence
 * whose overflow passes overflow_max (backpressure). */
#ifndef LLM_REQ_OUTPUT_H
#define LLM_REQ_OUTPUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ipc/llm_ipc.h"
#include "strbuf.h"

struct req_out {
    llm_ipc_slot  *slot;
    unsigned char *ring;
    uint32_t       ring_bytes;
    strbuf         overflow;      /* encoded records not yet in the ring */
    size_t         overflow_off;  /* bytes of overflow already moved */
    size_t         overflow_max;
    bool           wrote;         /* ring written since the last wake check */
    uint32_t       finish;        /* enum llm_finish_reason once emitted */
};

void req_out_init(struct req_out *o, llm_ipc_slot *slot, unsigned char *ring,
                  uint32_t ring_bytes, size_t overflow_max);
void req_out_free(struct req_out *o);
/* Move overflow records into the ring while they fit. */
void req_out_flush(struct req_out *o);
/* Bytes still waiting in overflow. */
size_t req_out_pending(const struct req_out *o);
static inline bool req_out_paused(const struct req_out *o)
{
    return req_out_pending(o) > o->overflow_max;
}

#endif
