/* Client side of the engine protocol: what an nginx worker (or the
 * `llm-engine client` command) uses to talk to one engine.
 *
 * Nothing here blocks or allocates: the caller owns the llm_ipc_client and
 * every buffer; the doorbell socket is non-blocking and meant to sit in the
 * caller's event loop.  Attach in the process that will use it (an nginx
 * worker, not the master): slots are owned by the pid that claimed them.
 *
 * A request's life:
 *
 *   llm_ipc_claim(c, &h)                       FREE → CLAIMED
 *   llm_ipc_write_request(c, &h, body, len)    (or llm_ipc_request_area + write)
 *   llm_ipc_submit(c, &h, LLM_KIND_CHAT, len)  CLAIMED → SUBMITTED, doorbell
 *   ...doorbell fd readable → llm_ipc_recv() → LLM_MSG_EVENTS for h.slot...
 *   llm_ipc_read_events(c, &h, buf, cap) + llm_ipc_event_next() until finish
 *   llm_ipc_release(c, &h)                     back to FREE
 *
 * Releasing before finish abandons the request: the engine cancels it
 * within one step and frees the slot itself.
 *
 * If the engine dies, llm_ipc_recv() returns LLM_IPC_EDEAD at once (the
 * socket closes).  Events already in a ring can still be read: drain them
 * before failing the request.  Then detach and attach again; handles from
 * the old engine answer LLM_IPC_ESTALE. */
#ifndef LLM_IPC_CLIENT_H
#define LLM_IPC_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "llm_ipc.h"

/* Return codes: 0 or a count on success, negative on failure. */
enum {
    LLM_IPC_OK        = 0,
    LLM_IPC_EAGAIN    = -1,   /* doorbell socket full; try again later */
    LLM_IPC_EFULL     = -2,   /* no free slot */
    LLM_IPC_ESTALE    = -3,   /* handle from another engine epoch or generation */
    LLM_IPC_EDEAD     = -4,   /* engine gone: socket closed or epoch changed */
    LLM_IPC_EINVAL    = -5,   /* bad argument or wrong slot state for the call */
    LLM_IPC_ETOOBIG   = -6,   /* request over max_request_bytes */
    LLM_IPC_ENOSPC    = -7,   /* no shared memory left for the request */
    LLM_IPC_ENOTREADY = -8,   /* engine not READY (starting, loading, draining) */
    LLM_IPC_EPROTO    = -9,   /* corrupt ring or protocol mismatch */
    LLM_IPC_ESYS      = -10,  /* system call failed; errno says why */
};

typedef struct {
    llm_ipc_header *hdr;        /* the mapped segment */
    size_t   map_bytes;
    int      shm_fd;
    int      sock_fd;           /* -1 until llm_ipc_connect */
    int      readonly;
    int      dead;              /* socket closed or epoch mismatch seen */
    uint64_t epoch;             /* engine epoch at attach */
    int32_t  pid;               /* this process, recorded at attach */
    uint32_t next_slot;         /* where the next claim starts looking */
    uint32_t in_n, in_off;      /* doorbell messages received, not yet returned */
    llm_ipc_msg in[LLM_IPC_MSGS_PER_PACKET];
    char     shm_name[LLM_IPC_SHM_NAME_MAX];
    char     sock_path[108];
} llm_ipc_client;

typedef struct {
    uint32_t slot;
    uint32_t gen;
    uint64_t epoch;
} llm_ipc_handle;

/* Map the engine's segment (llm_ipc_shm_name of run_dir and name;
 * read-only when readonly != 0, e.g. for status) and check magic, version
 * and size.  run_dir also locates <name>.sock for llm_ipc_connect.  On failure returns a
 * negative code and writes a reason to err. */
int  llm_ipc_attach(llm_ipc_client *c, const char *run_dir, const char *name,
                    int readonly, char *err, size_t errlen);
/* Close the socket and unmap.  Slots still held are reclaimed by the
 * engine when it sees the socket close. */
void llm_ipc_detach(llm_ipc_client *c);

/* Connect the doorbell socket (non-blocking) and say hello.  Returns the
 * fd to watch for reading, or a negative code with a reason in err. */
int  llm_ipc_connect(llm_ipc_client *c, char *err, size_t errlen);
/* Drain doorbell messages: fills up to max with LLM_MSG_EVENTS (slot, arg
 * = generation) and LLM_MSG_STATE (slot = new state) messages.  Returns
 * the count (0: nothing now) or LLM_IPC_EDEAD when the engine is gone. */
int  llm_ipc_recv(llm_ipc_client *c, llm_ipc_msg *msgs, int max);

/* Engine state (enum llm_ipc_state) and heartbeat age in ms. */
uint32_t llm_ipc_engine_state(const llm_ipc_client *c);
int64_t  llm_ipc_heartbeat_age_ms(const llm_ipc_client *c);
/* Age in ms of the scheduler loop's last turn (header.progress_ns). */
int64_t  llm_ipc_progress_age_ms(const llm_ipc_client *c);
/* Snapshot of the live counters: out[LLM_CTR_N]. */
void llm_ipc_counters(const llm_ipc_client *c, uint64_t *out);

/* Claim a free slot for this process.  LLM_IPC_EFULL when none is free,
 * LLM_IPC_ENOTREADY unless the engine is READY. */
int  llm_ipc_claim(llm_ipc_client *c, llm_ipc_handle *h);
/* The slot's request area with room for len bytes (backing memory is
 * reserved here for large requests; LLM_IPC_ENOSPC if /dev/shm is full).
 * Returns NULL and stores the code in *rc on failure. */
char *llm_ipc_request_area(llm_ipc_client *c, const llm_ipc_handle *h, size_t len, int *rc);
/* Copy a request body (canonical JSON) into the slot. */
int  llm_ipc_write_request(llm_ipc_client *c, const llm_ipc_handle *h,
                           const void *body, size_t len);
/* Hand the len-byte request to the engine and ring its doorbell. */
int  llm_ipc_submit(llm_ipc_client *c, const llm_ipc_handle *h,
                    enum llm_ipc_kind kind, size_t len);
/* Copy whole event records (at most cap bytes; cap ≥ LLM_IPC_EVENT_MAX)
 * into buf.  Returns the bytes copied; 0 when none are there now (a
 * doorbell will come when there are).  Decode with llm_ipc_event_next(). */
long llm_ipc_read_events(llm_ipc_client *c, const llm_ipc_handle *h, void *buf, size_t cap);
/* Ask the engine to stop generating: it ends the stream with
 * finish{cancelled} (after usage) within one step.  Keep reading. */
int  llm_ipc_cancel(llm_ipc_client *c, const llm_ipc_handle *h);
/* Give the slot back.  After finish this frees it; before finish it
 * abandons the request and the engine frees it.  The handle is dead after. */
int  llm_ipc_release(llm_ipc_client *c, const llm_ipc_handle *h);
/* The slot's state (enum llm_slot_state) or LLM_IPC_ESTALE. */
int  llm_ipc_slot_state(const llm_ipc_client *c, const llm_ipc_handle *h);

const char *llm_ipc_strerror(int rc);

#endif
