// Decode steps are replayed as CUDA graphs (graph_begin/graph_end,
// backend.h): one graph per step shape holds every launch of the step,
// the all-reduces included.  Under a graph, an op's host inputs and its
// per-step values (dstep: pos0, the sequence's state or ring) go to an
// arena at offsets that repeat from step to step; replaying a step is the
// ops writing the arena (one of two host copies, in turn), one copy of it
// to the device, one graph launch.
// Graphs hold raw device addresses: any release or reallocation of device
// memory (gen) retires them.
#include "backend_cuda.cuh"

#include <cxxabi.h>

void graph_drop(graph_ent *e)
{
    if (e->exec) cudaGraphExecDestroy(e->exec);
    *e = graph_ent{};
}

// The graph of key, NULL when none holds it.
static graph_ent *graph_find(cu_impl *c, uint64_t key)
{
    for (int i = 0; i < NGRAPH; i++)
        if (c->graph[i].used && c->graph[i].key == key) return &c->graph[i];
    return NULL;
}

// A step's values start afresh in the next host arena, for graph e.
static void step_begin(cu_impl *c, graph_ent *e)
{
    e->used = ++c->gtick;
    c->gcur = e;
    c->nput = 0;
    memset(c->puth, 0, sizeof c->puth);
    c->arena_len = 0;
    arena_next(c);
    c->gbad = false;
}

void cu_graph_begin(backend *b, uint64_t key)
{
    cu_impl *c = enter(b);
    cu_prefetch_join(c);        // a capture starts with no stream of its own forked
    c->gmode = G_OFF;
    if (!c->graphs || c->failed) return;
    graph_ent *e = graph_find(c, key), *lru = &c->graph[0];
    for (int i = 1; i < NGRAPH; i++)
        if (c->graph[i].used < lru->used) lru = &c->graph[i];
    if (!e) {
        e = lru;
        graph_drop(e);
        e->key = key;
    }
    if (e->exec && e->gen != c->gen) {
        cudaGraphExecDestroy(e->exec);
        e->exec = NULL;
    }
    step_begin(c, e);
    if (e->exec) {
        c->gmode = G_RECORD;
    } else if (e->warm && e->warm_gen == c->gen) {
        CK(c, cudaStreamBeginCapture(c->st, cudaStreamCaptureModeThreadLocal));
        c->gmode = c->failed ? G_OFF : G_CAPTURE;
    } else {
        c->gmode = G_WARM;
    }
}

// A kernel node's function, demangled without its parameter list (the
// runtime's name; cuBLASLt's kernels, launched through the driver, may
// have none): into buf.
static void kernel_name(cudaGraphNode_t node, char *buf, size_t len)
{
    cudaKernelNodeParams p;
    const char *raw = NULL;
    if (cudaGraphKernelNodeGetParams(node, &p) != cudaSuccess ||
        cudaFuncGetName(&raw, p.func) != cudaSuccess || !raw) {
        cudaGetLastError();     // (not sticky: the count goes on)
        snprintf(buf, len, "(no runtime name: a library's kernel)");
        return;
    }
    int st = 0;
    char *d = abi::__cxa_demangle(raw, NULL, NULL, &st);
    const char *s = d && !st ? d : raw;
    // "void f<...>(args)": the return type and the arguments dropped
    if (!strncmp(s, "void ", 5)) s += 5;
    size_t n = strlen(s), depth = 0, end = n;
    for (size_t i = 0; i < n; i++) {
        depth += s[i] == '<', depth -= s[i] == '>' && depth;
        if (s[i] == '(' && !depth) {
            end = i;
            break;
        }
    }
    snprintf(buf, len, "%.*s", (int)end, s);
    free(d);
}

// LLM_CUDA_GRAPH_KERNELS=1: a captured step's kernels by name, most
// launched first, on stderr (which kernels make a step's launch count).
static void kernel_table(cudaGraph_t g, const cudaGraphNode_t *nodes, size_t n)
{
    enum { MAXK = 128, NAME = 160 };
    // (on the heap: ranks capture their graphs on threads of their own)
    char (*name)[NAME] = (char (*)[NAME])malloc(MAXK * NAME);
    int count[MAXK] = { 0 }, nk = 0, other = 0, total = 0;
    if (!name) return;
    for (size_t i = 0; i < n; i++) {
        cudaGraphNodeType t;
        if (cudaGraphNodeGetType(nodes[i], &t) != cudaSuccess || t != cudaGraphNodeTypeKernel)
            continue;
        char buf[NAME];
        kernel_name(nodes[i], buf, sizeof buf);
        int j = 0;
        while (j < nk && strcmp(name[j], buf)) j++;
        if (j == nk && nk < MAXK) memcpy(name[nk++], buf, sizeof buf);
        if (j < nk) count[j]++;
        else other++;
        total++;
    }
    fprintf(stderr, "cuda: graph %p: %d kernels\n", (void *)g, total);
    for (int done = 0; done < nk; done++) {
        int b = -1;
        for (int j = 0; j < nk; j++)
            if (count[j] && (b < 0 || count[j] > count[b])) b = j;
        if (b < 0) break;
        fprintf(stderr, "cuda:   %4d  %s\n", count[b], name[b]);
        count[b] = 0;
    }
    if (other) fprintf(stderr, "cuda:   %4d  (other names past %d)\n", other, (int)MAXK);
    free(name);
}

// The launch counter: kernel nodes of a captured step.
static long long kernel_nodes(cu_impl *c, cudaGraph_t g)
{
    size_t n = 0;
    CK(c, cudaGraphGetNodes(g, NULL, &n));
    cudaGraphNode_t *nodes = (cudaGraphNode_t *)calloc(n ? n : 1, sizeof *nodes);
    long long k = 0;
    if (n) CK(c, cudaGraphGetNodes(g, nodes, &n));
    for (size_t i = 0; i < n && !c->failed; i++) {
        cudaGraphNodeType t;
        CK(c, cudaGraphNodeGetType(nodes[i], &t));
        k += t == cudaGraphNodeTypeKernel;
    }
    if (c->gnames && !c->failed) kernel_table(g, nodes, n);
    free(nodes);
    return k;
}

// The last replay's device time, where its events are done (the engine
// reads every step's tokens before the next; a bench that does not wait
// leaves some replays untimed).
static void graph_time_take(cu_impl *c)
{
    float ms;
    if (!c->gev_set || cudaEventQuery(c->gev[1]) != cudaSuccess) {
        cudaGetLastError();     // cudaErrorNotReady is not sticky
        c->gev_set = false;
        return;
    }
    c->gev_set = false;
    if (cudaEventElapsedTime(&ms, c->gev[0], c->gev[1]) == cudaSuccess)
        c->gtimed++, c->gtimed_ms += ms;
}

static void graph_launch(cu_impl *c, graph_ent *e)
{
    if (c->gev[0]) {
        graph_time_take(c);
        CK(c, cudaEventRecord(c->gev[0], c->st));
    }
    arena_copy(c);
    CK(c, cudaGraphLaunch(e->exec, c->st));
    if (c->gev[0]) {
        CK(c, cudaEventRecord(c->gev[1], c->st));
        c->gev_set = !c->failed;
    }
}

bool cu_graph_end(backend *b)
{
    cu_impl *c = enter(b);
    graph_ent *e = c->gcur;
    int mode = c->gmode;
    cu_prefetch_join(c);
    c->gmode = G_OFF;
    if (mode == G_OFF) return false;
    if (mode == G_WARM) {
        e->warm = true;
        e->warm_gen = c->gen;
        return false;
    }
    if (mode == G_CAPTURE) {
        cudaGraph_t g = NULL;
        CK(c, cudaStreamEndCapture(c->st, &g));
        if (!c->failed && !c->gbad && c->gen == e->warm_gen) {
            CK(c, cudaGraphInstantiate(&e->exec, g, 0));
            e->gen = c->gen;
            e->arena_len = c->arena_len;
            if (!c->failed) c->ncaptures++;
            if (!c->failed) c->gkernels = kernel_nodes(c, g);
        }
        if (g) cudaGraphDestroy(g);
        if (c->failed) return false;
        if (e->exec) {
            graph_launch(c, e);
            return false;
        }
    } else if (!c->gbad && c->arena_len == e->arena_len) {
        graph_launch(c, e);
        c->nreplays++;
        return false;
    }
    // The ops did not run: once more as usual, after growing what ran short.
    if (c->arena_len > c->arena_cap) arena_grow(c, 2 * c->arena_len);
    if (e->exec) cudaGraphExecDestroy(e->exec);
    e->exec = NULL;
    e->warm = false;
    c->gmode = G_WARM;
    return true;
}

// Walking the next decode step ahead (backend.h): while the step before
// runs, its ops record their values into the other host arena as for a
// replay; graph_launch_prepared later rewrites the ids there, copies that
// arena and launches the graph, unless something retired the graph or
// took an arena in between (then false: the step is walked as usual).
bool cu_graph_prepare(backend *b, uint64_t key)
{
    cu_impl *c = enter(b);
    c->prep.ok = false;
    if (!c->prewalk || c->failed || c->gmode != G_OFF || !c->arena_cap) return false;
    graph_ent *e = graph_find(c, key);
    if (!e || !e->exec || e->gen != c->gen) return false;
    // (the running step's argmax, which the walk's own issue replaces)
    c->prep.amax_part = c->amax_part;
    c->prep.amax_rows = c->amax_rows;
    step_begin(c, e);
    c->gmode = G_RECORD;
    return true;
}

bool cu_graph_prepared(backend *b, const void *ids)
{
    cu_impl *c = enter(b);
    graph_ent *e = c->gcur;
    bool ok = c->gmode == G_RECORD && e && !c->gbad && !c->failed &&
              c->arena_len == e->arena_len;
    // where the walk put the ids (once a step and reserve: each op that
    // stages them with the same room reads the same copy)
    int n = 0;
    for (int i = 0; ok && i < c->nput; i++) {
        if (c->put[i].host != ids) continue;
        if (n == 4 || (n && c->put[i].bytes != c->prep.ids_bytes)) ok = false;
        else c->prep.ids_off[n++] = c->put[i].off, c->prep.ids_bytes = c->put[i].bytes;
    }
    ok = ok && n && c->nput < NPUT;     // (past NPUT a put is not listed)
    const float *part = c->amax_part;
    int rows = c->amax_rows;
    c->amax_part = c->prep.amax_part;
    c->amax_rows = c->prep.amax_rows;
    c->gmode = G_OFF;
    if (!ok) return false;
    c->prep.e = e;
    c->prep.key = e->key;
    c->prep.gen = c->gen;
    c->prep.turn = c->arena_turns;
    c->prep.arena_i = c->arena_i;
    c->prep.len = c->arena_len;
    c->prep.nids = n;
    c->prep.amax_part = part;
    c->prep.amax_rows = rows;
    c->prep.ok = true;
    return true;
}

bool cu_graph_launch_prepared(backend *b, uint64_t key, const void *ids, size_t bytes)
{
    cu_impl *c = enter(b);
    bool ok = c->prep.ok && c->prep.key == key && c->prep.gen == c->gen &&
              c->prep.turn == c->arena_turns && c->prep.e->key == key && c->prep.e->exec &&
              c->prep.e->gen == c->gen && c->prep.ids_bytes == bytes && c->gmode == G_OFF &&
              !c->failed;
    c->prep.ok = false;
    if (!ok) return false;
    cu_prefetch_join(c);        // as graph_end before a launch
    for (int i = 0; i < c->prep.nids; i++)
        memcpy(c->arena_hb[c->prep.arena_i] + c->prep.ids_off[i], ids, bytes);
    c->arena_h = c->arena_hb[c->prep.arena_i];
    c->arena_len = c->prep.len;
    c->amax_part = c->prep.amax_part;
    c->amax_rows = c->prep.amax_rows;
    c->gcur = c->prep.e;
    graph_launch(c, c->prep.e);
    c->nreplays++;
    return !c->failed;
}

long long cu_graph_kernels(backend *b) { return impl(b)->gkernels; }

void cu_graph_counts(backend *b, long long *captures, long long *replays)
{
    cu_impl *c = impl(b);
    *captures = c->ncaptures;
    *replays = c->nreplays;
}

bool cu_graph_time(backend *b, long long *replays, double *ms)
{
    cu_impl *c = enter(b);
    if (!c->gev[0]) return false;
    graph_time_take(c);
    *replays = c->gtimed;
    *ms = c->gtimed_ms;
    return true;
}
