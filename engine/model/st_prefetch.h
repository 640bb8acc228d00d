/* Reading a checkpoint's files into memory ahead of the weight upload:
 * worker threads fault in the mapped files 64 MiB at a time
 * (MADV_POPULATE_READ, else a read per page), so a cold checkpoint is
 * read with many requests in flight and the upload, which copies from
 * the mapping tensor by tensor, finds its pages resident and mapped.  A
 * reporter line every 2 s says how far it got: bytes, GB/s, ETA. */
#ifndef LLM_ST_PREFETCH_H
#define LLM_ST_PREFETCH_H

#include "safetensors.h"

/* Called with one line (no newline) of progress. */
typedef void (*st_log_fn)(void *user, const char *line);

typedef struct st_prefetch st_prefetch;

/* Start `threads` readers over every file of st (NULL when nothing can be
 * started: the upload then reads by faulting as before). */
st_prefetch *st_prefetch_start(const safetensors *st, int threads, st_log_fn log, void *user);
/* Wait for the readers, log the total (bytes, seconds, GB/s) and free. */
void st_prefetch_finish(st_prefetch *p);

#endif
