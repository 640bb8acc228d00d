/* The scheduler: takes submitted slots into a FIFO waiting queue, runs at
 * most max_num_seqs of them in a batch through the runner (health probes
 * go first, in LLM_IPC_PROBE_SEATS of their own), moves their
 * events into the slot rings (with overflow and pausing for slow readers),
 * and returns slots when they finish, are cancelled, or their owner is
 * gone.  It knows nothing about sockets: the server feeds it doorbells
 * and owner deaths, and it calls notify() to ring an owner's doorbell.
 * Every call comes from one thread. */
#ifndef LLM_SCHEDULER_H
#define LLM_SCHEDULER_H

#include <stdbool.h>
#include <stdint.h>

#include "ipc/llm_ipc.h"
#include "runner.h"
#include "strbuf.h"

typedef struct sched sched;

typedef struct {
    llm_ipc_header   *hdr;            /* the engine's mapped segment */
    int               shm_fd;         /* to release large request pages; -1: don't */
    const runner_ops *ops;
    void             *runner;
    int               max_num_seqs;
    /* Ring the owner of slot (generation gen) held by pid. */
    void            (*notify)(void *ctx, uint32_t slot, uint32_t gen, int32_t pid);
    void             *notify_ctx;
} sched_config;

enum sched_status {
    STEP_IDLE,      /* nothing to run: wait for doorbells */
    STEP_BUSY,      /* a batch is ready: step again now */
    STEP_BLOCKED,   /* only output waiting for slow readers: look again soon */
};

sched *sched_create(const sched_config *cfg);
void sched_destroy(sched *S);

/* Slot k changed (a doorbell named it): take a submission, act on a
 * cancel or an abandoned slot. */
void sched_poke(sched *S, uint32_t k);
/* Look at every slot (covers doorbells that were never sent). */
void sched_scan(sched *S);
/* Everything pid held is abandoned: its sequences stop, its slots free. */
void sched_owner_gone(sched *S, int32_t pid);
/* sched_owner_gone for every owner pid that no longer exists. */
void sched_reap_dead_owners(sched *S);
/* Drain: waiting and new submissions get 503 engine_draining; running
 * sequences go on to their end. */
void sched_drain(sched *S, const char *why);
/* End every sequence now with error(status, code, why) + finish{error}. */
void sched_abort_all(sched *S, uint32_t status, const char *code, const char *why);

/* Deliver output, admit from the queue, run one step.  Returns a
 * sched_status, or -1 when the runner failed fatally (reason in err). */
int sched_step(sched *S, strbuf *err);
/* No sequence left (waiting, running or finishing). */
bool sched_idle(const sched *S);

#endif
