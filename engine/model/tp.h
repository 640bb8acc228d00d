/* Tensor parallelism on threads: one thread per rank (rank 0 is the
 * caller), a barrier, and the collectives the model needs.  All-reduce
 * sums the ranks' partials in rank order on every rank, so replicated
 * state (residual streams, routing, indexer choices) stays bit-identical
 * across ranks. */
#ifndef LLM_TP_H
#define LLM_TP_H

#include <stddef.h>

typedef struct tp_group tp_group;
typedef void (*tp_fn)(void *ctx, int rank);

tp_group *tp_group_new(int nranks);
void tp_group_free(tp_group *g);
/* Run fn(ctx, rank) on every rank; returns when all have finished. */
void tp_run(tp_group *g, tp_fn fn, void *ctx);
/* Make room for all-reduces of up to n floats (call outside tp_run).
 * 0, or -1 when out of memory (the old room stays). */
int tp_reserve(tp_group *g, size_t n);

/* Inside tp_run, called by every rank (the all-reduce with the same n). */
void tp_barrier(tp_group *g);
void tp_allreduce_sum(tp_group *g, int rank, float *buf, size_t n);

#endif
