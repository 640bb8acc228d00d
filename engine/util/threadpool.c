#include "threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

struct threadpool {
    int n;
    pthread_t *th;
    pthread_mutex_t mu;
    pthread_cond_t start, done;
    atomic_uint gen;        /* bumped per run; workers wait for a change */
    int busy;               /* workers still inside the current run */
    bool stop;
    task_fn fn;
    void *ctx;
    int ntasks;
    atomic_int next;
};

static void drain(threadpool *p)
{
    int i;
    while ((i = atomic_fetch_add(&p->next, 1)) < p->ntasks) p->fn(p->ctx, i);
}

/* Runs come in quick succession during a forward pass: poll briefly
 * before sleeping, so a run does not pay a wake-up for every worker. */
#define SPIN 20000

static void *worker(void *arg)
{
    threadpool *p = arg;
    unsigned seen = 0;
    for (;;) {
        for (int i = 0; i < SPIN && atomic_load(&p->gen) == seen; i++) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        }
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->gen) == seen && !p->stop) pthread_cond_wait(&p->start, &p->mu);
        if (p->stop) { pthread_mutex_unlock(&p->mu); return NULL; }
        seen = atomic_load(&p->gen);
        pthread_mutex_unlock(&p->mu);
        drain(p);
        pthread_mutex_lock(&p->mu);
        if (--p->busy == 0) pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->mu);
    }
}

threadpool *threadpool_new(int nthreads)
{
    threadpool *p = calloc(1, sizeof *p);
    int n = nthreads < 1 ? 1 : nthreads;
    pthread_t *th = p ? calloc((size_t)n, sizeof *th) : NULL;
    if (!th) {
        free(p);
        return NULL;
    }
    p->th = th;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->start, NULL);
    pthread_cond_init(&p->done, NULL);
    /* A thread that cannot start leaves a smaller pool, not a broken one. */
    for (p->n = 1; p->n < n; p->n++)
        if (pthread_create(&p->th[p->n], NULL, worker, p)) break;
    return p;
}

void threadpool_free(threadpool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->th[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->start);
    pthread_cond_destroy(&p->done);
    free(p->th);
    free(p);
}

int threadpool_size(const threadpool *p) { return p->n; }

void threadpool_run(threadpool *p, task_fn fn, void *ctx, int ntasks)
{
    if (p->n == 1 || ntasks <= 1) {
        for (int i = 0; i < ntasks; i++) fn(ctx, i);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->ntasks = ntasks;
    atomic_store(&p->next, 0);
    p->busy = p->n - 1;
    atomic_fetch_add(&p->gen, 1);
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    drain(p);
    pthread_mutex_lock(&p->mu);
    while (p->busy) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
