#include "st_prefetch.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define CHUNK ((size_t)64 << 20)
#define MAX_THREADS 32

typedef struct {
    char *base;                 /* page-aligned */
    size_t len;
} chunk;

struct st_prefetch {
    const safetensors *st;
    st_log_fn log;
    void *user;
    size_t total;
    chunk *chunks;              /* every file cut in CHUNK pieces, in order */
    size_t nchunks;
    atomic_size_t next;         /* next chunk to read */
    atomic_size_t done;         /* bytes read */
    atomic_int stop;
    double t0, t_done;          /* start; the last chunk read (under mu) */
    int nthreads;
    pthread_t threads[MAX_THREADS], reporter;
    bool have_reporter;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void say(st_prefetch *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(st_prefetch *p, const char *fmt, ...)
{
    if (!p->log) return;
    char line[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    p->log(p->user, line);
}

/* Fault in [base, base+n): one call when the kernel has
 * MADV_POPULATE_READ (5.14), else a read of every page. */
static void populate(char *base, size_t n)
{
#ifdef MADV_POPULATE_READ
    if (madvise(base, n, MADV_POPULATE_READ) == 0) return;
#endif
    long pg = sysconf(_SC_PAGESIZE);
    volatile const char *v = base;
    for (size_t o = 0; o < n; o += (size_t)pg) (void)v[o];
}

static void *reader(void *arg)
{
    st_prefetch *p = arg;
    for (;;) {
        size_t i = atomic_fetch_add(&p->next, 1);
        if (i >= p->nchunks || atomic_load(&p->stop)) break;
        populate(p->chunks[i].base, p->chunks[i].len);
        if (atomic_fetch_add(&p->done, p->chunks[i].len) + p->chunks[i].len == p->total) {
            pthread_mutex_lock(&p->mu);
            p->t_done = now_s();
            pthread_cond_broadcast(&p->cv);     /* the reporter stops */
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

static void *report(void *arg)
{
    st_prefetch *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!atomic_load(&p->stop)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 2;
        pthread_cond_timedwait(&p->cv, &p->mu, &ts);
        if (atomic_load(&p->stop) || p->t_done > 0) break;
        double t = now_s() - p->t0, d = (double)atomic_load(&p->done);
        double rate = d / t, left = (double)p->total - d;
        say(p, "checkpoint: %.1f of %.1f GB read, %.2f GB/s, ETA %.0f s", d / 1e9,
            p->total / 1e9, rate / 1e9, rate > 0 ? left / rate : 0);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

st_prefetch *st_prefetch_start(const safetensors *st, int threads, st_log_fn log, void *user)
{
    st_prefetch *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->st = st;
    p->log = log;
    p->user = user;
    size_t n = 0;
    for (int f = 0; f < st->nfiles; f++) n += (st->files[f].size + CHUNK - 1) / CHUNK;
    p->chunks = calloc(n ? n : 1, sizeof *p->chunks);
    if (!p->chunks) {
        free(p);
        return NULL;
    }
    for (int f = 0; f < st->nfiles; f++) {
        const st_file *F = &st->files[f];
        p->total += F->size;
        /* mappings start on a page; CHUNK is a multiple of any page size */
        for (size_t o = 0; o < F->size; o += CHUNK)
            p->chunks[p->nchunks++] = (chunk){ (char *)F->map + o,
                                               F->size - o < CHUNK ? F->size - o : CHUNK };
    }
    p->t0 = now_s();
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if ((size_t)threads > p->nchunks) threads = (int)p->nchunks;
    for (int i = 0; i < threads; i++)
        if (!pthread_create(&p->threads[p->nthreads], NULL, reader, p)) p->nthreads++;
    p->have_reporter = !pthread_create(&p->reporter, NULL, report, p);
    if (!p->nthreads) {
        st_prefetch_finish(p);
        return NULL;
    }
    say(p, "checkpoint: reading %.1f GB in %d files with %d threads", p->total / 1e9,
        st->nfiles, p->nthreads);
    return p;
}

void st_prefetch_finish(st_prefetch *p)
{
    if (!p) return;
    for (int i = 0; i < p->nthreads; i++) pthread_join(p->threads[i], NULL);
    double t = (p->t_done > 0 ? p->t_done : now_s()) - p->t0;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    if (p->have_reporter) pthread_join(p->reporter, NULL);
    if (p->nthreads)
        say(p, "checkpoint: %.1f GB read in %.1f s = %.2f GB/s",
            (double)atomic_load(&p->done) / 1e9, t,
            (double)atomic_load(&p->done) / 1e9 / (t > 0 ? t : 1e-9));
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->chunks);
    free(p);
}
