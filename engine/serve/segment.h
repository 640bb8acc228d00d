/* The engine's side of the shared-memory segment: create /llm-<name>-<hash>
 * (replacing a stale one only when its engine is dead), publish state,
 * and remove it at exit.  Also reads a segment's header without mapping
 * it, for the janitor. */
#ifndef LLM_SEGMENT_H
#define LLM_SEGMENT_H

#include <stddef.h>
#include <stdint.h>

#include "ipc/llm_ipc.h"
#include "strbuf.h"

typedef struct {
    const char *name;
    const char *run_dir;        /* with name, gives the shm name */
    const char *const *models;
    int         n_models;
    uint32_t    n_slots;
    uint32_t    ring_bytes;
    uint64_t    max_request_bytes;
    uint32_t    max_model_len, max_num_seqs, max_num_batched_tokens;
} segment_params;

typedef struct {
    llm_ipc_header *hdr;
    size_t          bytes;
    int             fd;
    char            shm_name[LLM_IPC_SHM_NAME_MAX];   /* llm_ipc_shm_name() */
} segment;

/* Create and fill the segment in state STARTING.  0, or -1 with a reason. */
int segment_create(segment *seg, const segment_params *p, strbuf *err);
/* Publish a lifecycle state; msg (may be NULL) goes to state_msg first. */
void segment_set_state(segment *seg, enum llm_ipc_state st, const char *msg);
/* Unmap; remove the name too when unlink_it. */
void segment_close(segment *seg, int unlink_it);

/* Copy the header of /dev/shm/<file>.  0 when it is a segment of this
 * protocol, -1 otherwise (too short, other magic or version). */
int segment_peek(const char *file, llm_ipc_header *out);

#endif
