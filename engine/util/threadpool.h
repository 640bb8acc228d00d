/* A small persistent thread pool.  threadpool_run() hands out task indices
 * 0..ntasks-1 to the workers and the calling thread, and returns when all
 * are done.  One run at a time per pool (each TP rank owns its pool). */
#ifndef LLM_UTIL_THREADPOOL_H
#define LLM_UTIL_THREADPOOL_H

typedef struct threadpool threadpool;
typedef void (*task_fn)(void *ctx, int task);

/* nthreads counts the caller: 1 means no extra threads. */
threadpool *threadpool_new(int nthreads);
void threadpool_free(threadpool *p);
int threadpool_size(const threadpool *p);
void threadpool_run(threadpool *p, task_fn fn, void *ctx, int ntasks);

#endif
