/* Where the GPU's time goes, kernel by kernel, as it ran: a CUPTI
 * injection library (the driver loads it when CUDA_INJECTION64_PATH
 * names it) that records every kernel's start and end and, at exit,
 * writes the kernels outside graphs (prefill chunks, warm-up steps) as
 * one table over the run, then per graph (decode steps are graph
 * replays) the replays' span, the time no kernel ran, the gap between
 * replays, per kernel name its launches, time and exclusive time (each
 * instant's time shared among the kernels running then; a kernel counts
 * as running from the end of the one before it on its stream, not while
 * it waits on it under PDL: own_starts), the host's part before the
 * last replay and that replay's timeline.  ncu times kernels serialized
 * one by one and LLM_CUDA_PROFILE times ops outside graphs; this sees the
 * GPU as it runs, concurrency and PDL overlap included (CUPTI's own
 * bookkeeping adds a little to each launch).
 *
 *   make CUDA=1 build/lib/libkernel_trace.so
 *   CUDA_INJECTION64_PATH=$PWD/build/lib/libkernel_trace.so \
 *   KTRACE_OUT=trace.txt [KTRACE_SKIP=2] llm-engine bench ...
 *
 * KTRACE_SKIP: each graph's first replays left out (warm-up; default 2).
 * KTRACE_API=1: the CUDA calls too (the host's gap before the last
 * replay: what it called; more overhead a launch).
 * Needs libcupti.so (CUDA's lib directory; tools/gpu_pack.sh packs it). */
#define _GNU_SOURCE
#include <cupti.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *__cxa_demangle(const char *mangled, char *buf, size_t *len, int *status);

typedef struct {
    uint64_t start, end;
    uint32_t graph, corr, stream;
    int name;           /* index into names */
} krec;

static krec *recs;
static size_t nrec, caprec;

/* CUDA API calls (runtime and driver), for the host's part between
 * replays */
typedef struct {
    uint64_t start, end;
    uint32_t cbid, thread;
    int driver;
} arec;

static arec *apis;
static size_t napi, capapi;
static char **names;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;     /* CUPTI delivers on its thread */
static int nnames, capnames;

/* Interned names, demangled and shortened to "kernel<args>". */
static int intern(const char *mangled)
{
    for (int i = nnames - 1; i >= 0; i--)
        if (!strcmp(names[2 * i], mangled)) return i;
    if (nnames == capnames) {
        capnames = capnames ? 2 * capnames : 256;
        names = realloc(names, sizeof(char *) * 2 * (size_t)capnames);
        if (!names) abort();
    }
    int st = 0;
    char *d = __cxa_demangle(mangled, NULL, NULL, &st);
    char *s = strdup(st == 0 && d ? d : mangled);
    free(d);
    char *p = strncmp(s, "void ", 5) ? s : s + 5;
    int depth = 0;      /* drop the parameter list: the '(' outside <> */
    for (char *q = p; *q; q++) {
        if (*q == '<') depth++;
        else if (*q == '>') depth--;
        else if (*q == '(' && depth == 0 && q != p) { *q = 0; break; }
    }
    names[2 * nnames] = strdup(mangled);
    names[2 * nnames + 1] = strdup(p);
    free(s);
    return nnames++;
}

static void CUPTIAPI buf_requested(uint8_t **buf, size_t *size, size_t *maxrec)
{
    *size = 8u << 20;
    *buf = aligned_alloc(8, *size);
    *maxrec = 0;
}

static void CUPTIAPI buf_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size,
                                   size_t valid)
{
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *r = NULL;
    pthread_mutex_lock(&lock);
    while (cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind == CUPTI_ACTIVITY_KIND_RUNTIME || r->kind == CUPTI_ACTIVITY_KIND_DRIVER) {
            const CUpti_ActivityAPI *c = (const CUpti_ActivityAPI *)r;
            if (napi == capapi) {
                capapi = capapi ? 2 * capapi : 1 << 16;
                apis = realloc(apis, sizeof(arec) * capapi);
                if (!apis) abort();
            }
            apis[napi++] = (arec){ c->start, c->end, c->cbid, c->threadId,
                                   r->kind == CUPTI_ACTIVITY_KIND_DRIVER };
            continue;
        }
        if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && r->kind != CUPTI_ACTIVITY_KIND_KERNEL)
            continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
        if (!k->start || k->end < k->start) continue;
        if (nrec == caprec) {
            caprec = caprec ? 2 * caprec : 1 << 16;
            recs = realloc(recs, sizeof(krec) * caprec);
            if (!recs) abort();
        }
        recs[nrec++] = (krec){ k->start, k->end, k->graphId, k->correlationId, k->streamId,
                               intern(k->name ? k->name : "?") };
    }
    pthread_mutex_unlock(&lock);
    free(buf);
}

static int by_time(const void *a, const void *b)
{
    const krec *x = a, *y = b;
    if (x->graph != y->graph) return x->graph < y->graph ? -1 : 1;
    if (x->corr != y->corr) return x->corr < y->corr ? -1 : 1;
    return x->start < y->start ? -1 : x->start > y->start;
}

typedef struct {
    double n, us, excl;
} agg;

static int by_start(const void *a, const void *b)
{
    const arec *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

/* The host's part before the replay at r[n] (r: the graph's records from
 * its first replay, sorted): the time from the previous replay's last
 * kernel to this one's first, and the CUDA API calls in that window. */
static void host_gap(FILE *f, const krec *r, size_t n)
{
    if (!n) return;
    size_t p = n - 1;
    while (p > 0 && r[p - 1].corr == r[n - 1].corr) p--;
    uint64_t end = 0, start = r[n].start;
    for (size_t i = p; i < n; i++) end = r[i].end > end ? r[i].end : end;
    if (start <= end) return;
    fprintf(f, "  before the last replay: %.1f us from the previous replay's last kernel "
               "to its first; CUDA calls then (us from the gap's start, duration):\n",
            (start - end) / 1e3);
    qsort(apis, napi, sizeof(arec), by_start);
    int shown = 0;
    for (size_t i = 0; i < napi && shown < 80; i++) {
        if (apis[i].end < end || apis[i].start > start) continue;
        const char *name = "?";
        cuptiGetCallbackName(apis[i].driver ? CUPTI_CB_DOMAIN_DRIVER_API
                                            : CUPTI_CB_DOMAIN_RUNTIME_API,
                             apis[i].cbid, &name);
        fprintf(f, "    %9.2f %8.2f  %s%s (thread %u)\n",
                ((double)apis[i].start - (double)end) / 1e3, (apis[i].end - apis[i].start) / 1e3,
                apis[i].driver ? "driver " : "", name, apis[i].thread);
        shown++;
    }
}

static int by_excl(const void *x, const void *y, void *ctx)
{
    const agg *a = ctx;
    double d = a[*(const int *)y].excl - a[*(const int *)x].excl;
    return (d > 0) - (d < 0);
}

/* A kernel's start (i > 0: kernel i - 1) or end (i < 0: kernel -i - 1). */
typedef struct {
    uint64_t t;
    long long i;
} kev;

/* By time, starts before ends at the same instant (a kernel that does
 * no work of its own, own_starts, starts and ends there). */
static int by_t(const void *x, const void *y)
{
    const kev *a = x, *b = y;
    if (a->t != b->t) return a->t < b->t ? -1 : 1;
    return (a->i < 0) - (b->i < 0);
}

/* When each kernel of r[0..n) (each stream's in its order) can start
 * work of its own, into s: not before the kernels before it on its
 * stream have ended.  Under PDL a kernel starts earlier and its blocks
 * wait (griddepcontrol.wait) beside its predecessor: run I1's trace
 * counted half of hc_post_logits' time to the collapse waiting on it.
 * What a kernel does before that wait (the GEMVs' first weight loads)
 * is counted to the kernel before.  A graph replay's kernels carry
 * stream ids on which its main chain moves from one id to another (run
 * I1's batch-1 step: 13, 16 to 19); a kernel first on its id there is
 * counted from its start. */
#define OWN_STREAMS 64
static void own_starts(const krec *r, size_t n, uint64_t *s)
{
    uint32_t st[OWN_STREAMS];
    uint64_t last[OWN_STREAMS];
    int ns = 0;
    for (size_t i = 0; i < n; i++) {
        int j = 0;
        while (j < ns && st[j] != r[i].stream) j++;
        if (j == ns && ns < OWN_STREAMS) st[ns] = r[i].stream, last[ns++] = 0;
        uint64_t b = j < ns && last[j] > r[i].start ? last[j] : r[i].start;
        s[i] = b < r[i].end ? b : r[i].end;
        if (j < ns && r[i].end > last[j]) last[j] = r[i].end;
    }
}

/* Kernels r[0..n): their launches, time and exclusive time (each
 * instant's time shared among the kernels running then, each from
 * own_starts' start) added to a[name]; the span from the first start to
 * the last end and the time some kernel ran, in us. */
static void sweep(const krec *r, size_t n, agg *a, double *span, double *busy)
{
    kev *e = malloc(sizeof(kev) * 2 * n);
    size_t *act = malloc(sizeof(size_t) * n), nact = 0;
    uint64_t *s = malloc(sizeof(uint64_t) * n);
    if (!e || !act || !s) abort();
    own_starts(r, n, s);
    for (size_t i = 0; i < n; i++) {
        e[2 * i] = (kev){ s[i], (long long)i + 1 };
        e[2 * i + 1] = (kev){ r[i].end, -(long long)i - 1 };
        a[r[i].name].n++, a[r[i].name].us += (r[i].end - r[i].start) / 1e3;
    }
    qsort(e, 2 * n, sizeof(kev), by_t);
    *busy = 0;
    for (size_t j = 0; j + 1 < 2 * n; j++) {
        if (e[j].i > 0) act[nact++] = (size_t)e[j].i - 1;
        else
            for (size_t k = 0; k < nact; k++)
                if (act[k] == (size_t)(-e[j].i - 1)) { act[k] = act[--nact]; break; }
        double dt = (e[j + 1].t - e[j].t) / 1e3;
        if (!nact || dt <= 0) continue;
        *busy += dt;
        for (size_t k = 0; k < nact; k++) a[r[act[k]].name].excl += dt / nact;
    }
    *span = n ? (e[2 * n - 1].t - e[0].t) / 1e3 : 0;
    free(e);
    free(act);
    free(s);
}

/* The names a[] counted, by exclusive time, into ord; their number. */
static int ranked(agg *a, int *ord)
{
    int k = 0;
    for (int i = 0; i < nnames; i++)
        if (a[i].n) ord[k++] = i;
    qsort_r(ord, (size_t)k, sizeof(int), by_excl, a);
    return k;
}

/* The kernels outside graphs (prefill, warm-up steps): r[0..n).  Their
 * span, the time some kernel ran, and per name the launches, time and
 * exclusive time. */
static void outside(FILE *f, const krec *r, size_t n, agg *a, int *ord)
{
    if (!n) return;
    memset(a, 0, sizeof(agg) * (size_t)nnames);
    double span, busy;
    sweep(r, n, a, &span, &busy);
    fprintf(f, "outside graphs (prefill, warm-up steps): %zu kernels; %.1f ms from the first to "
               "the last, some kernel running %.1f ms\n", n, span / 1e3, busy / 1e3);
    int k = ranked(a, ord);
    fprintf(f, "  %8s %10s %10s %6s  kernel (in all)\n", "launches", "ms", "excl ms", "excl%");
    for (int i = 0; i < k && i < 60; i++) {
        const agg *x = &a[ord[i]];
        fprintf(f, "  %8.0f %10.2f %10.2f %5.1f%%  %s\n", x->n, x->us / 1e3, x->excl / 1e3,
                100 * x->excl / (busy > 0 ? busy : 1), names[2 * ord[i] + 1]);
    }
}

static void report(void)
{
    cuptiActivityFlushAll(1);
    pthread_mutex_lock(&lock);
    const char *path = getenv("KTRACE_OUT");
    FILE *f = path ? fopen(path, "w") : stderr;
    if (!f) f = stderr;
    int skip = getenv("KTRACE_SKIP") ? atoi(getenv("KTRACE_SKIP")) : 2;
    qsort(recs, nrec, sizeof(krec), by_time);
    agg *a = calloc((size_t)nnames + 1, sizeof(agg));
    int *ord = malloc(sizeof(int) * ((size_t)nnames + 1));
    if (!a || !ord) abort();
    size_t n0 = 0;
    while (n0 < nrec && !recs[n0].graph) n0++;
    outside(f, recs, n0, a, ord);
    for (size_t g0 = n0, g1; g0 < nrec; g0 = g1) {
        for (g1 = g0; g1 < nrec && recs[g1].graph == recs[g0].graph; g1++) {}
        memset(a, 0, sizeof(agg) * (size_t)nnames);
        int nrep = 0, seen = 0;
        double span = 0, idle = 0, gap = 0;
        int ngap = 0;
        uint64_t prev_end = 0;
        size_t last = g0, kern = 0;
        for (size_t r0 = g0, r1; r0 < g1; r0 = r1) {
            for (r1 = r0; r1 < g1 && recs[r1].corr == recs[r0].corr; r1++) {}
            uint64_t e = 0;
            for (size_t i = r0; i < r1; i++) e = recs[i].end > e ? recs[i].end : e;
            if (seen++ < skip) {
                prev_end = e;
                continue;
            }
            if (prev_end && recs[r0].start > prev_end) gap += (recs[r0].start - prev_end) / 1e3, ngap++;
            prev_end = e;
            double s, b;
            sweep(recs + r0, r1 - r0, a, &s, &b);
            span += s, idle += s - b, nrep++, last = r0, kern = r1 - r0;
        }
        if (!nrep) continue;
        fprintf(f, "graph %u: %d replays timed (of %d), %zu kernels each; span %.1f us, "
                   "no kernel running %.1f us (%.1f%%); between replays %.1f us\n",
                recs[g0].graph, nrep, seen, kern, span / nrep, idle / nrep,
                100 * idle / (span > 0 ? span : 1), ngap ? gap / ngap : 0.0);
        int k = ranked(a, ord);
        fprintf(f, "  %8s %10s %10s %6s  kernel (per replay)\n", "launches", "us", "excl us",
                "excl%");
        for (int i = 0; i < k; i++) {
            const agg *x = &a[ord[i]];
            fprintf(f, "  %8.1f %10.1f %10.1f %5.1f%%  %s\n", x->n / nrep, x->us / nrep,
                    x->excl / nrep, 100 * x->excl / (span > 0 ? span : 1), names[2 * ord[i] + 1]);
        }
        host_gap(f, recs + g0, last - g0);
        fprintf(f, "  timeline of the last replay (us from its start, duration, stream):\n");
        for (size_t i = last; i < g1 && recs[i].corr == recs[last].corr; i++)
            fprintf(f, "    %9.2f %8.2f %4u  %s\n", (recs[i].start - recs[last].start) / 1e3,
                    (recs[i].end - recs[i].start) / 1e3, recs[i].stream, names[2 * recs[i].name + 1]);
    }
    if (f != stderr) fclose(f);
    free(a);
    free(ord);
    pthread_mutex_unlock(&lock);
}

int InitializeInjection(void)
{
    if (cuptiActivityRegisterCallbacks(buf_requested, buf_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS ||
        (getenv("KTRACE_API") &&
         (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME) != CUPTI_SUCCESS ||
          cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER) != CUPTI_SUCCESS))) {
        fprintf(stderr, "kernel_trace: CUPTI activity tracing unavailable\n");
        return 0;
    }
    atexit(report);
    return 1;
}
