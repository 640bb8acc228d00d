/* The runner seam: what the scheduler (scheduler.c) asks of whatever turns
 * requests into tokens.  The real runner (chat renderer + tokenizer +
 * model + sampler + output parser) implements runner_ops; the scripted
 * test runner (tests/engine_test/runner_scripted.c) implements it without
 * a model so the protocol, scheduling and fault handling can be tested.
 *
 * Threading: every call comes from the engine's main thread, one at a
 * time.  A runner may use its own threads inside step().
 *
 * A request's life, as the scheduler drives it:
 *
 *   prepare(s)        once, when the submission is taken (the request may
 *                     wait in the FIFO queue afterwards; the runner may
 *                     finish preparing it in the background, in poll())
 *   admit(s)          when s reaches the head of the queue and the batch
 *                     has room; until it says yes s keeps waiting
 *   step(batch)       repeatedly while s runs: advance every sequence in
 *                     the batch by one step, emitting its events; a
 *                     sequence is over once req_emit_finish() was called
 *                     for it.  A sequence held back by a slow reader is
 *                     left out of some steps.
 *   cancel(s)         the owner asked to stop: emit usage and
 *                     finish(LLM_FINISH_CANCELLED) now
 *   release(s)        always last (after finish, after cancel, or when the
 *                     owner vanished): free everything s holds
 *
 * An admin request (LLM_KIND_ADMIN) gets admin(s) instead, once: it is
 * answered there and never prepared, admitted or stepped.
 */
#ifndef LLM_RUNNER_H
#define LLM_RUNNER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ipc/llm_ipc.h"
#include "recipe.h"
#include "strbuf.h"

struct req_out;

/* Health probes run in LLM_IPC_PROBE_SEATS seats of their own: a runner
 * sizes its batch for max_num_seqs + LLM_IPC_PROBE_SEATS sequences and
 * keeps cache room for a probe. */

/* Names by layer: llm_request is a request as the runner seam sees it
 * (serve); the scheduler keeps a sched_req per slot around it, the model
 * runner a model_req (its state); v4_seq and seq_cache are the model's
 * sequence (cache state) a running request holds. */
typedef struct llm_request {
    uint32_t    slot;           /* slot index: a stable id while s lives */
    enum llm_ipc_kind kind;     /* endpoint */
    const char *request;        /* canonical request JSON, NUL-terminated engine copy */
    size_t      request_len;
    int         prompt_tokens;  /* set by prepare */
    void       *state;          /* the runner's per-sequence state */
    bool        done;           /* set by req_emit_finish */
    uint16_t    choice;         /* n > 1: the choice the next events belong to */
    uint32_t    stop;           /* for the next finish: 1 + the stop string that
                                 * ended the choice, 0 none */
    int         width;          /* batch rows it takes (its n); 0 counts as 1 */
    struct req_out *out;        /* the scheduler's output path (req_emit_*) */
} llm_request;

typedef struct {
    int64_t kv_capacity_tokens;   /* tokens the KV cache holds */
    int64_t kv_capacity_bytes;
    int64_t kv_blocks_total;
    char    fingerprint[LLM_IPC_FINGERPRINT];  /* system_fingerprint */
} runner_capacity;

typedef struct {
    int64_t kv_blocks_used;
    int64_t kv_blocks_free;       /* a user request may still reserve (probes' room excluded) */
    int64_t prefix_cache_hits;    /* cumulative prompt tokens served from cache */
    int64_t prefix_cache_queries, prefix_cache_query_tokens, prefix_cache_hit_queries;
    int64_t prefix_cache_blocks;  /* blocks the cache holds now */
    int64_t prefix_cache_host_bytes, prefix_cache_host_copies;
} runner_stats;

typedef struct runner_ops {
    const char *name;
    /* Load what the recipe names.  0 with *self and *cap filled, or -1
     * with a one-line reason in err (the engine goes FAILED with it). */
    int  (*load)(void **self, const recipe *rc, runner_capacity *cap, strbuf *err);
    /* Parse the request, render and tokenize it.  0: s->prompt_tokens is
     * set and s may run.  -1: refused; the runner has emitted error and
     * finish (e.g. 400 context_length_exceeded with the numbers). */
    int  (*prepare)(void *self, llm_request *s);
    /* Called at the start of every scheduler step: a runner that prepares
     * in the background finishes such sequences here (and may end them
     * with error + finish).  May be NULL. */
    void (*poll)(void *self);
    /* A file descriptor that becomes readable (an eventfd: the server
     * reads 8 bytes) when poll() has work, so the engine wakes at once
     * instead of at its next idle tick.  May be NULL. */
    int  (*wake_fd)(void *self);
    /* 1 if s can start now (KV blocks reserved), 0 to keep waiting.
     * May be NULL: always 1. */
    int  (*admit)(void *self, llm_request *s);
    /* One step over the batch.  Returns the tokens generated, or -1 on a
     * fatal error with the reason in err (the engine fails every sequence
     * and exits). */
    int  (*step)(void *self, llm_request **batch, int n, strbuf *err);
    void (*cancel)(void *self, llm_request *s);
    void (*release)(void *self, llm_request *s);
    /* An admin request (LLM_KIND_ADMIN, {"op": NAME}), answered at once
     * between steps: one content_delta holding a JSON object, then finish;
     * or error + finish (400 naming `op` for an operation it lacks).  May
     * be NULL: the scheduler answers that there are none. */
    void (*admin)(void *self, llm_request *s);
    /* Live KV and prefix-cache numbers, read after every step.  May be NULL. */
    void (*stats)(void *self, runner_stats *st);
    void (*unload)(void *self);
} runner_ops;

/* Runners of this binary, by name; NULL if absent.  The serving runner
 * is "model"; test runners are only those the test binary registered
 * (runner_register_test, before serving). */
const runner_ops *runner_lookup(const char *name);
void runner_register_test(const runner_ops *ops);
int  runner_have_test_runners(void);

/* ---- events: what runners emit (req_output.c) ------------------------- */

/* Text must be whole UTF-8 code points; long text is split into several
 * records at code point boundaries. */
void req_emit_text(llm_request *s, enum llm_ev_type type, const char *text, size_t len);
void req_emit_tool_begin(llm_request *s, uint32_t index, const char *id, const char *name);
void req_emit_tool_args(llm_request *s, uint32_t index, const char *text, size_t len);
void req_emit_tool_end(llm_request *s, uint32_t index);
void req_emit_tokens(llm_request *s, const uint32_t *ids, size_t n);
void req_emit_prompt_info(llm_request *s, uint32_t prompt_tokens, uint32_t cached_tokens,
                          uint64_t fingerprint);
void req_emit_logprob(llm_request *s, uint32_t token_id, float logprob, const char *bytes,
                      size_t bytes_len, uint32_t n_top, const float *top_lp,
                      const char *const *top_bytes, const size_t *top_len);
void req_emit_usage(llm_request *s, const llm_ipc_usage *u);
/* status: the HTTP status the module should answer with (400, 503, 500);
 * code/param: OpenAI error code and parameter (may be NULL). */
void req_emit_error(llm_request *s, uint32_t status, const char *code, const char *param,
                    const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* The last event of a request; sets s->done. */
void req_emit_finish(llm_request *s, enum llm_finish_reason reason);
/* n > 1: the end of choice s->choice (the request goes on). */
void req_emit_choice_finish(llm_request *s, enum llm_finish_reason reason);

#endif
