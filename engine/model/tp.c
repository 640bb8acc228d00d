#include "tp.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct tp_group {
    int n;
    pthread_t *th;
    pthread_barrier_t bar;
    pthread_mutex_t mu;
    pthread_cond_t start, done;
    unsigned gen;
    int busy;
    bool stop;
    tp_fn fn;
    void *ctx;
    float **parts;          /* each rank's buffer during an all-reduce */
    float *sum;             /* reduced result */
    size_t cap;
};

typedef struct { tp_group *g; int rank; } rank_arg;

static void *rank_main(void *arg)
{
    rank_arg ra = *(rank_arg *)arg;
    free(arg);
    tp_group *g = ra.g;
    unsigned seen = 0;
    for (;;) {
        pthread_mutex_lock(&g->mu);
        while (g->gen == seen && !g->stop) pthread_cond_wait(&g->start, &g->mu);
        if (g->stop) { pthread_mutex_unlock(&g->mu); return NULL; }
        seen = g->gen;
        pthread_mutex_unlock(&g->mu);
        g->fn(g->ctx, ra.rank);
        pthread_mutex_lock(&g->mu);
        if (--g->busy == 0) pthread_cond_signal(&g->done);
        pthread_mutex_unlock(&g->mu);
    }
}

tp_group *tp_group_new(int nranks)
{
    tp_group *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    int n = nranks < 1 ? 1 : nranks;
    g->n = 1;              /* rank threads running; tp_group_free joins them */
    pthread_barrier_init(&g->bar, NULL, (unsigned)n);
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->start, NULL);
    pthread_cond_init(&g->done, NULL);
    g->parts = calloc((size_t)n, sizeof *g->parts);
    g->th = calloc((size_t)n, sizeof *g->th);
    if (!g->parts || !g->th) {
        tp_group_free(g);
        return NULL;
    }
    for (; g->n < n; g->n++) {
        rank_arg *ra = malloc(sizeof *ra);
        if (!ra) break;
        *ra = (rank_arg){ g, g->n };
        if (pthread_create(&g->th[g->n], NULL, rank_main, ra)) {
            free(ra);
            break;
        }
    }
    if (g->n < n) {        /* every rank needs its thread */
        tp_group_free(g);
        return NULL;
    }
    return g;
}

void tp_group_free(tp_group *g)
{
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    g->stop = true;
    pthread_cond_broadcast(&g->start);
    pthread_mutex_unlock(&g->mu);
    for (int r = 1; r < g->n; r++) pthread_join(g->th[r], NULL);
    pthread_barrier_destroy(&g->bar);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->start);
    pthread_cond_destroy(&g->done);
    free(g->parts);
    free(g->sum);
    free(g->th);
    free(g);
}

void tp_run(tp_group *g, tp_fn fn, void *ctx)
{
    if (g->n == 1) { fn(ctx, 0); return; }
    pthread_mutex_lock(&g->mu);
    g->fn = fn;
    g->ctx = ctx;
    g->busy = g->n - 1;
    g->gen++;
    pthread_cond_broadcast(&g->start);
    pthread_mutex_unlock(&g->mu);
    fn(ctx, 0);
    pthread_mutex_lock(&g->mu);
    while (g->busy) pthread_cond_wait(&g->done, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

int tp_reserve(tp_group *g, size_t n)
{
    if (n <= g->cap) return 0;
    float *sum = malloc(n * sizeof *sum);
    if (!sum) return -1;
    free(g->sum);
    g->sum = sum;
    g->cap = n;
    return 0;
}

void tp_barrier(tp_group *g)
{
    if (g->n > 1) pthread_barrier_wait(&g->bar);
}

void tp_allreduce_sum(tp_group *g, int rank, float *buf, size_t n)
{
    if (g->n == 1) return;
    g->parts[rank] = buf;
    pthread_barrier_wait(&g->bar);
    /* Each rank reduces its slice of the vector, in rank order. */
    size_t per = (n + g->n - 1) / g->n, i0 = rank * per, i1 = i0 + per < n ? i0 + per : n;
    for (size_t i = i0; i < i1; i++) {
        float s = g->parts[0][i];
        for (int r = 1; r < g->n; r++) s += g->parts[r][i];
        g->sum[i] = s;
    }
    pthread_barrier_wait(&g->bar);
    memcpy(buf, g->sum, n * sizeof *buf);
    /* The next all-reduce's first barrier keeps `sum` stable until every
     * rank has copied it. */
}
