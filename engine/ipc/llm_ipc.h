/* The shared-memory protocol between nginx workers and an llm-engine
 * (ARCHITECTURE.md §2).  This header is the only code both sides include:
 * plain C11 + POSIX, no engine headers.  README.md beside it explains the
 * layout, the slot state machine and the event encoding.
 *
 * One segment /llm-<name>-<run_dir hash> per engine, laid out as
 *
 *   [llm_ipc_header][slot descriptors][event rings][request areas]
 *
 * Everything is native-endian (both sides run on one machine).  All offsets
 * are from the start of the segment and are published in the header, so a
 * client never computes the layout itself. */
#ifndef LLM_IPC_H
#define LLM_IPC_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define LLM_IPC_MAGIC        0x3143504949504c4cULL   /* "LLPIIPC1" */
#define LLM_IPC_VERSION      2u

#define LLM_IPC_NAME_MAX     64     /* engine name incl. NUL */
#define LLM_IPC_SHM_NAME_MAX (LLM_IPC_NAME_MAX + 24)  /* "/llm-NAME-HASH" */
#define LLM_IPC_MODEL_MAX    128    /* one served model name incl. NUL */
#define LLM_IPC_MODELS_MAX   8
#define LLM_IPC_STATE_MSG    512    /* FAILED / DRAINING reason incl. NUL */
#define LLM_IPC_FINGERPRINT  64     /* system_fingerprint incl. NUL */
#define LLM_IPC_BUILD        128    /* engine version and build incl. NUL */

/* Event records: 8-byte header + payload, padded to 8 bytes.  No record is
 * larger than LLM_IPC_EVENT_MAX; a caller's read buffer must hold one. */
#define LLM_IPC_EVENT_MAX    8192
#define LLM_IPC_TEXT_MAX     4096   /* text bytes per delta record */
#define LLM_IPC_ID_MAX       256    /* tool call id / name bytes */
#define LLM_IPC_CODE_MAX     64     /* error code / param bytes */
#define LLM_IPC_ERRMSG_MAX   2048   /* error message bytes */
#define LLM_IPC_TOKENS_MAX   1024   /* token ids per tokens record */
#define LLM_IPC_TOP_MAX      20     /* top_logprobs entries per record */

#define LLM_IPC_RING_MIN     (4 * LLM_IPC_EVENT_MAX)
#define LLM_IPC_RING_DEFAULT (64 * 1024)
/* Bytes of every request area the engine backs with memory at start;
 * a longer request reserves the rest when written (llm_ipc_request_area). */
#define LLM_IPC_REQ_RESERVED (64 * 1024)
#define LLM_IPC_REQ_MIN      4096

/* Heartbeat period; a reader calls an engine stale well after this. */
#define LLM_IPC_HEARTBEAT_MS 50

/* ---- engine lifecycle ------------------------------------------------ */

enum llm_ipc_state {
    LLM_STATE_STARTING = 1,  /* segment exists, header being filled */
    LLM_STATE_LOADING  = 2,  /* runner loading weights */
    LLM_STATE_READY    = 3,  /* accepting submissions */
    LLM_STATE_DRAINING = 4,  /* finishing running sequences, refusing new */
    LLM_STATE_STOPPED  = 5,  /* clean exit */
    LLM_STATE_FAILED   = 6,  /* state_msg says why */
};

/* Live counters: header.counters[LLM_CTR_*], written by the engine with
 * relaxed stores; llm_ipc_counter_name() gives each its metric name. */
enum llm_ipc_counter {
    LLM_CTR_RUNNING,            /* sequences in the batch */
    LLM_CTR_WAITING,            /* submitted, not yet running */
    LLM_CTR_PAUSED,             /* running but held back by a full ring */
    LLM_CTR_TOKENS_IN,          /* prompt tokens admitted */
    LLM_CTR_TOKENS_OUT,         /* tokens generated */
    LLM_CTR_KV_BLOCKS_USED,
    LLM_CTR_KV_BLOCKS_TOTAL,
    LLM_CTR_KV_CAPACITY_TOKENS,
    LLM_CTR_KV_CAPACITY_BYTES,
    LLM_CTR_PREFIX_CACHE_HITS,  /* prompt tokens served from the prefix cache */
    LLM_CTR_REQUESTS_FINISHED,  /* ended with stop, length or tool_calls */
    LLM_CTR_REQUESTS_FAILED,    /* ended with an error event */
    LLM_CTR_REQUESTS_CANCELLED, /* cancelled by the owner or owner gone */
    LLM_CTR_STEPS,              /* scheduler steps that ran a batch */
    LLM_CTR_STEP_OVERHEAD_NS,   /* last step: scheduler time outside the runner */
    LLM_CTR_CONNECTIONS,        /* doorbell connections open */
    /* Admission (the engine is its authority; the module's queue admits
     * against these): seats max_num_seqs has left after running and
     * waiting user requests, and cache blocks a user request may still
     * reserve.  Published before a finished request's events are
     * visible, so a client that saw one end sees its seat free. */
    LLM_CTR_SEQS_FREE,
    LLM_CTR_KV_BLOCKS_FREE,
    LLM_CTR_PREFIX_CACHE_QUERIES,       /* admitted prompts looked up in the cache */
    LLM_CTR_PREFIX_CACHE_QUERY_TOKENS,  /* their prompt tokens */
    LLM_CTR_PREFIX_CACHE_HIT_QUERIES,   /* lookups that reused a prefix */
    LLM_CTR_PREFIX_CACHE_BLOCKS,        /* pool blocks the cache holds now */
    LLM_CTR_PREFIX_CACHE_HOST_BYTES,    /* bytes in its host-memory tier now */
    LLM_CTR_PREFIX_CACHE_HOST_COPIES,   /* entries copied to or from that tier */
    LLM_CTR_N
};
#define LLM_IPC_COUNTERS_MAX 32  /* room to add counters without a new version */

typedef struct {
    uint64_t magic;
    uint32_t version;
    uint32_t header_bytes;             /* sizeof(llm_ipc_header) */
    uint64_t segment_bytes;
    uint64_t epoch;                    /* random per engine start, never 0 */
    int32_t  pid;                      /* engine process */
    uint32_t n_slots;
    _Atomic uint32_t state;            /* enum llm_ipc_state */
    uint32_t n_models;
    _Atomic uint64_t heartbeat_ns;     /* CLOCK_MONOTONIC, every 50 ms */
    uint64_t start_unix_ns;            /* CLOCK_REALTIME at start */

    /* limits */
    uint32_t max_model_len;
    uint32_t max_num_seqs;
    uint32_t max_num_batched_tokens;
    uint32_t ring_bytes;               /* per slot, power of two */
    uint64_t max_request_bytes;        /* per slot */

    /* layout */
    uint64_t slots_off;                /* n_slots × llm_ipc_slot */
    uint64_t rings_off;                /* n_slots × ring_bytes */
    uint64_t requests_off;             /* n_slots × request_stride */
    uint64_t request_stride;           /* max_request_bytes rounded to pages */

    char name[LLM_IPC_NAME_MAX];
    char models[LLM_IPC_MODELS_MAX][LLM_IPC_MODEL_MAX];
    char fingerprint[LLM_IPC_FINGERPRINT];
    char engine_build[LLM_IPC_BUILD];  /* "0.1.0 (git …, gcc …, cuda)", set at start */
    /* Why the engine is FAILED or DRAINING; written before state is stored
     * (release), so a reader that loads state (acquire) sees it whole. */
    char state_msg[LLM_IPC_STATE_MSG];

    _Atomic uint64_t counters[LLM_IPC_COUNTERS_MAX];
    /* CLOCK_MONOTONIC when the scheduler loop last came round (every step,
     * and at least every 50 ms when idle).  The heartbeat only says the
     * process lives; this says it works: a reader calls the engine stalled
     * when it is older than the longest step it allows. */
    _Atomic uint64_t progress_ns;
} llm_ipc_header;

_Static_assert(LLM_CTR_N <= LLM_IPC_COUNTERS_MAX, "counter array too small");

/* ---- slots ----------------------------------------------------------- */

/* A slot's state word packs (generation << 32) | (owner pid << 8) | state,
 * so claiming sets the owner and a new generation in one CAS.  Linux pids
 * fit in 22 bits. */
enum llm_slot_state {
    LLM_SLOT_FREE      = 0,
    LLM_SLOT_CLAIMED   = 1,  /* owner writing the request */
    LLM_SLOT_SUBMITTED = 2,  /* engine queued (waiting) */
    LLM_SLOT_RUNNING   = 3,  /* in the batch */
    LLM_SLOT_FINISHED  = 4,  /* finish event written; owner releases */
    LLM_SLOT_CANCELLED = 5,  /* owner gave up; engine frees */
};

#define LLM_SLOT_STATE(w) ((uint32_t)((w) & 0xff))
#define LLM_SLOT_PID(w)   ((int32_t)(((w) >> 8) & 0xffffff))
#define LLM_SLOT_GEN(w)   ((uint32_t)((w) >> 32))
#define LLM_SLOT_WORD(gen, pid, st) \
    (((uint64_t)(gen) << 32) | ((uint64_t)((uint32_t)(pid) & 0xffffff) << 8) | (uint64_t)(st))

enum llm_ipc_kind {
    LLM_KIND_CHAT        = 1,  /* /v1/chat/completions */
    LLM_KIND_COMPLETIONS = 2,  /* /v1/completions */
    LLM_KIND_RESPONSES   = 3,  /* /v1/responses */
    LLM_KIND_TOKENIZE    = 4,  /* /tokenize: answers with tokens events */
    LLM_KIND_DETOKENIZE  = 5,  /* /detokenize: answers with content_delta */
    LLM_KIND_PROBE       = 6,  /* health probe: one-token generation */
    LLM_KIND_ADMIN       = 7,  /* /admin operation {"op": NAME}: answers with one
                                * content_delta holding a JSON object */
};

/* Probes run in seats of their own beyond max_num_seqs, ahead of the
 * queue, so readmitting an engine never waits for user work; a recipe
 * has at least max_num_seqs + LLM_IPC_PROBE_SEATS slots. */
#define LLM_IPC_PROBE_SEATS 1

typedef struct {
    /* line 0: ownership, written by the owner while CLAIMED */
    _Atomic uint64_t word;
    uint64_t epoch;                    /* engine epoch the owner saw */
    uint64_t request_len;
    uint64_t submit_ns;                /* CLOCK_MONOTONIC at submit */
    uint32_t kind;                     /* enum llm_ipc_kind */
    _Atomic uint32_t cancel_req;       /* owner asks for finish{cancelled} */
    uint8_t  pad0[24];
    /* line 1: producer (engine) */
    _Atomic uint64_t head;             /* bytes ever written */
    uint8_t  pad1[56];
    /* line 2: consumer (owner) */
    _Atomic uint64_t tail;             /* bytes ever consumed */
    _Atomic uint32_t armed;            /* consumer found the ring empty: ring me */
    uint8_t  pad2[52];
} llm_ipc_slot;

_Static_assert(sizeof(llm_ipc_slot) == 192, "slot descriptor is three cache lines");
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "64-bit atomics must be lock-free in shared memory");

/* ---- doorbells ------------------------------------------------------- */

/* Fixed 16-byte messages over the SOCK_SEQPACKET socket <run_dir>/<name>.sock.
 * One packet carries 1..LLM_IPC_MSGS_PER_PACKET of them back to back: the
 * engine sends each worker one packet per step, however many of its slots
 * got events. */
#define LLM_IPC_MSGS_PER_PACKET 256
enum llm_ipc_msg_type {
    LLM_MSG_HELLO   = 1,  /* worker→engine: arg = pid */
    LLM_MSG_SUBMIT  = 2,  /* worker→engine: slot submitted, arg = generation */
    LLM_MSG_CANCEL  = 3,  /* worker→engine: look at slot now, arg = generation */
    LLM_MSG_WELCOME = 4,  /* engine→worker: arg = epoch */
    LLM_MSG_EVENTS  = 5,  /* engine→worker: slot has events, arg = generation */
    LLM_MSG_STATE   = 6,  /* engine→worker: slot field = new engine state, arg = epoch */
};

typedef struct {
    uint16_t type;
    uint16_t version;
    uint32_t slot;
    uint64_t arg;
} llm_ipc_msg;

_Static_assert(sizeof(llm_ipc_msg) == 16, "doorbell message is 16 bytes");

/* ---- events ---------------------------------------------------------- */

enum llm_ev_type {
    LLM_EV_PAD             = 0,   /* ring filler before wraparound, never returned */
    LLM_EV_REASONING_DELTA = 1,   /* text */
    LLM_EV_CONTENT_DELTA   = 2,   /* text */
    LLM_EV_TOOL_CALL_BEGIN = 3,   /* u32 index, u16 id_len, u16 name_len, id, name */
    LLM_EV_TOOL_CALL_ARGS  = 4,   /* u32 index, text */
    LLM_EV_TOOL_CALL_END   = 5,   /* u32 index */
    LLM_EV_FINISH          = 6,   /* u32 reason, u32 stop; always the last event */
    LLM_EV_USAGE           = 7,   /* u32 prompt, completion, reasoning, cached */
    LLM_EV_ERROR           = 8,   /* u32 status, u16 code_len, u16 param_len, code, param, message */
    LLM_EV_LOGPROB         = 9,   /* u32 token_id, f32 logprob, u16 bytes_len, u16 n_top,
                                   * bytes, n_top × {f32 logprob, u16 len, bytes} */
    LLM_EV_PROMPT_INFO     = 10,  /* u32 prompt_tokens, u32 cached_tokens, u64 fingerprint */
    LLM_EV_TOKENS          = 11,  /* u32 ids[] (tokenize answers) */
    LLM_EV_TYPE_END
};

enum llm_finish_reason {
    LLM_FINISH_STOP       = 1,
    LLM_FINISH_LENGTH     = 2,
    LLM_FINISH_TOOL_CALLS = 3,
    LLM_FINISH_CANCELLED  = 4,
    LLM_FINISH_ERROR      = 5,
};

typedef struct {
    uint16_t type;
    uint16_t flags;      /* choice index (n > 1), | LLM_EV_CHOICE_END */
    uint32_t len;        /* payload bytes (record is 8 + len rounded up to 8) */
} llm_ev_hdr;

/* A request with n > 1 choices: each record's flags carry the choice it
 * belongs to (0 .. n-1); a choice ends with a finish record flagged
 * LLM_EV_CHOICE_END | index, and the stream with the usual unflagged
 * usage (totals) and finish.  With n = 1 flags are 0. */
#define LLM_EV_CHOICE_END    0x8000u
#define LLM_EV_CHOICE_MASK   0x7fffu
#define LLM_IPC_MAX_CHOICES  16     /* most choices (n) one request may ask */

typedef struct {
    uint32_t prompt_tokens;
    uint32_t completion_tokens;
    uint32_t reasoning_tokens;
    uint32_t cached_tokens;
} llm_ipc_usage;

/* A decoded event.  Pointers point into the buffer the record was decoded
 * from and are not NUL-terminated. */
typedef struct {
    uint16_t type;                     /* enum llm_ev_type */
    uint16_t choice;                   /* choice index (flags & LLM_EV_CHOICE_MASK) */
    uint8_t  choice_end;               /* finish: the end of one choice of n */
    const char *text;                  /* deltas, tool args, error message, logprob token bytes */
    size_t text_len;
    uint32_t index;                    /* tool call index */
    const char *id, *name;             /* tool_call_begin */
    size_t id_len, name_len;
    uint32_t reason;                   /* finish: enum llm_finish_reason */
    uint32_t stop;                     /* finish: 1 + the index of the stop string
                                        * that ended it (the request's "stop"), or 0 */
    llm_ipc_usage usage;               /* usage */
    uint32_t status;                   /* error: HTTP status hint (400, 503, 500) */
    const char *code, *param;          /* error: OpenAI code and param ("" if none) */
    size_t code_len, param_len;
    uint32_t prompt_tokens, cached_tokens;  /* prompt_info */
    uint64_t fingerprint;              /* prompt_info */
    uint32_t token_id;                 /* logprob */
    float    logprob;                  /* logprob */
    uint32_t n_items;                  /* tokens: ids; logprob: top entries */
    const unsigned char *items;        /* raw items; use the accessors below */
    size_t items_len;
} llm_ipc_event;

/* ---- event encoding (both sides) -------------------------------------- */

/* Encoders write one record into buf (cap ≥ LLM_IPC_EVENT_MAX always
 * suffices) and return its size, or 0 when an argument is over its limit
 * (text over LLM_IPC_TEXT_MAX, ids over LLM_IPC_ID_MAX, ...). */
size_t llm_ipc_enc_text(void *buf, size_t cap, enum llm_ev_type type,
                        const char *text, size_t len);
size_t llm_ipc_enc_tool_begin(void *buf, size_t cap, uint32_t index,
                              const char *id, size_t id_len,
                              const char *name, size_t name_len);
size_t llm_ipc_enc_tool_args(void *buf, size_t cap, uint32_t index,
                             const char *text, size_t len);
size_t llm_ipc_enc_tool_end(void *buf, size_t cap, uint32_t index);
/* stop: 1 + the index of the request's stop string that ended it, or 0 */
size_t llm_ipc_enc_finish(void *buf, size_t cap, enum llm_finish_reason reason,
                          uint32_t stop);
size_t llm_ipc_enc_usage(void *buf, size_t cap, const llm_ipc_usage *u);
size_t llm_ipc_enc_error(void *buf, size_t cap, uint32_t status, const char *code,
                         const char *param, const char *msg, size_t msg_len);
size_t llm_ipc_enc_prompt_info(void *buf, size_t cap, uint32_t prompt_tokens,
                               uint32_t cached_tokens, uint64_t fingerprint);
size_t llm_ipc_enc_tokens(void *buf, size_t cap, const uint32_t *ids, size_t n);
/* A logprob record: the chosen token and up to LLM_IPC_TOP_MAX
 * alternatives (top_bytes[i] of top_len[i] bytes each). */
size_t llm_ipc_enc_logprob(void *buf, size_t cap, uint32_t token_id, float logprob,
                           const char *bytes, size_t bytes_len, uint32_t n_top,
                           const float *top_lp, const char *const *top_bytes,
                           const size_t *top_len);

/* Decode the record at buf[*off] (records as llm_ipc_read_events returns
 * them) and advance *off past it.  Returns 1 with *ev filled, 0 at the end
 * of the buffer, -1 for a malformed record. */
int llm_ipc_event_next(const void *buf, size_t len, size_t *off, llm_ipc_event *ev);
/* tokens event: the i-th id. */
uint32_t llm_ipc_event_token(const llm_ipc_event *ev, uint32_t i);
/* logprob event: walk the top alternatives; *pos starts at 0.  Returns 1
 * with the entry, 0 after the last. */
int llm_ipc_event_top(const llm_ipc_event *ev, size_t *pos, float *logprob,
                      const char **bytes, size_t *len);

const char *llm_ipc_event_name(uint32_t type);       /* "content_delta", ... */
const char *llm_ipc_finish_name(uint32_t reason);    /* "stop", ... */
const char *llm_ipc_state_name(uint32_t state);      /* "ready", ... */
const char *llm_ipc_slot_state_name(uint32_t state); /* "running", ... */
const char *llm_ipc_counter_name(uint32_t i);        /* "running", ... */
int llm_ipc_kind_from_name(const char *name);        /* 0 if unknown */

/* ---- layout and rings (both sides) ------------------------------------ */

/* Segment layout for the given limits; returns the total size.  The engine
 * creates it; clients read the offsets from the header instead. */
uint64_t llm_ipc_layout(uint32_t n_slots, uint32_t ring_bytes, uint64_t max_request_bytes,
                        uint64_t *slots_off, uint64_t *rings_off,
                        uint64_t *requests_off, uint64_t *request_stride);

/* An engine name: 1 to LLM_IPC_NAME_MAX - 1 bytes of [A-Za-z0-9._-] (it
 * becomes part of file names).  The one check for the recipe, the CLI,
 * the client library and nginx's llm_engine. */
int llm_ipc_valid_name(const char *name, size_t len);
#define LLM_IPC_NAME_RULE "1 to 63 letters, digits, '-', '_' and '.'"

/* The segment's POSIX shm name, "/llm-<name>-<16 hex digits>": the hex is
 * a hash of the canonical run_dir (realpath, else as given), so two stacks
 * with one engine name in different run directories have two segments.
 * out holds LLM_IPC_SHM_NAME_MAX bytes.  0, or -1 when name is too long. */
int llm_ipc_shm_name(char *out, const char *run_dir, const char *name);

static inline llm_ipc_slot *llm_ipc_slot_at(llm_ipc_header *h, uint32_t k)
{
    return (llm_ipc_slot *)((char *)h + h->slots_off) + k;
}
static inline unsigned char *llm_ipc_ring_at(llm_ipc_header *h, uint32_t k)
{
    return (unsigned char *)h + h->rings_off + (uint64_t)k * h->ring_bytes;
}
static inline char *llm_ipc_request_at(llm_ipc_header *h, uint32_t k)
{
    return (char *)h + h->requests_off + (uint64_t)k * h->request_stride;
}

/* Producer: append one encoded record (rec, len as an encoder returned).
 * Returns 1 when written, 0 when the ring lacks room now (nothing written).
 * The caller rings the consumer when llm_ipc_ring_wake() says so. */
int llm_ipc_ring_put(llm_ipc_slot *s, unsigned char *ring, uint32_t ring_bytes,
                     const void *rec, size_t len);
/* After one or more puts: returns 1 if the consumer armed the doorbell
 * (found the ring empty) and must be rung now; disarms it. */
int llm_ipc_ring_wake(llm_ipc_slot *s);

/* Consumer: copy whole records into buf (up to cap bytes) and consume
 * them.  Returns bytes copied; 0 when the ring is empty, in which case the
 * doorbell is armed so the producer rings on its next put; -1 when the
 * ring is corrupt. */
long llm_ipc_ring_get(llm_ipc_slot *s, const unsigned char *ring, uint32_t ring_bytes,
                      void *buf, size_t cap);

/* CLOCK_MONOTONIC in ns. */
uint64_t llm_ipc_now_ns(void);

#endif
