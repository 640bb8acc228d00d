// Device scratch, the graph arena and the staging of host inputs.
#include "backend_cuda.cuh"

// A new allocation when the buffer is short: graphs that read it retire
// (a new generation; none in a capture: the step then runs as usual),
// unless `outside` says no graph reads it.
static void *grow_buf_to(cu_impl *c, grow_buf *g, size_t bytes, bool outside)
{
    if (bytes > g->cap) {
        if (!outside && c->gmode == G_CAPTURE) {
            c->gbad = true;
            return g->p;
        }
        if (!outside) c->gen++;
        if (g->p) CK(c, cudaFreeAsync(g->p, c->st));
        g->p = NULL;
        g->cap = 0;
        size_t cap = bytes < 4096 ? 4096 : bytes + bytes / 4;
        CK(c, cudaMallocAsync(&g->p, cap, c->st));
        if (g->p) g->cap = cap;
    }
    return g->p;
}

void *grow(cu_impl *c, grow_buf *g, size_t bytes) { return grow_buf_to(c, g, bytes, false); }

void *grow_outside(cu_impl *c, grow_buf *g, size_t bytes)
{
    return grow_buf_to(c, g, bytes, true);
}

// Under a graph: `reserve` bytes of the arena at the next offset (the
// same from step to step for the same sequence of ops); NULL when the
// arena is short (the step then runs again as usual, with a larger one).
static char *arena_alloc(cu_impl *c, size_t reserve)
{
    size_t off = round_up(c->arena_len, 16);
    c->arena_len = off + reserve;
    if (c->arena_len > c->arena_cap) {
        c->gbad = true;
        return NULL;
    }
    return c->arena_h + off;
}

static const void *arena_dev(cu_impl *c, const char *h)
{
    return h ? c->arena_d + (h - c->arena_h) : c->arena_d;
}

// Under a graph: the device address where host[0..bytes) will be, in room
// for `reserve` bytes; a host array given again (same reserve) is stored
// once per step.
const void *arena_put(cu_impl *c, const void *host, size_t bytes, size_t reserve)
{
    arena_put_ent *e = NULL;
    unsigned slot = (unsigned)(((uintptr_t)host >> 3) * 0x9E3779B1u) % PUT_HASH;
    for (;; slot = (slot + 1) % PUT_HASH) {
        int i = c->puth[slot] - 1;
        if (i < 0) break;
        if (c->put[i].host == host && c->put[i].reserve == reserve) {
            e = &c->put[i];
            break;
        }
    }
    if (!e) {
        char *h = arena_alloc(c, reserve);
        if (!h) return c->arena_d;
        if (c->nput == NPUT) {
            memcpy(h, host, bytes);
            return arena_dev(c, h);
        }
        c->puth[slot] = (short)(c->nput + 1);
        e = &c->put[c->nput++];
        *e = arena_put_ent{ host, 0, reserve, (size_t)(h - c->arena_h) };
    }
    if (bytes > e->bytes) {
        memcpy(c->arena_h + e->off, host, bytes);
        e->bytes = bytes;
    }
    return c->arena_d + e->off;
}

// An op's per-step values: in the arena under a graph, else NULL (the
// kernels take the by-value fields).
const dstep *step_values(cu_impl *c, int pos0, const void *ptr)
{
    if (!in_graph(c)) return NULL;
    dstep *h = (dstep *)arena_alloc(c, sizeof(dstep));
    if (h) *h = dstep{ pos0, (void *)ptr };
    return (const dstep *)arena_dev(c, (const char *)h);
}

// The bound on pos0 + n that sizes launches: exact, or under a graph the
// key's (graph_pos_cap), so the launches repeat while positions move.
int pos_end(cu_impl *c, int pos0, int n)
{
    return c->gmode == G_OFF ? pos0 + n : graph_pos_cap(pos0 + n);
}

// A device copy of host array `host` (bytes), valid for launches queued
// on the stream from now until `host`'s content is staged NSTAGE more
// times (under a graph: in the arena, for this step).
const void *stage(cu_impl *c, const void *host, size_t bytes)
{
    if (!bytes) return NULL;
    if (in_graph(c)) return arena_put(c, host, bytes, bytes);
    for (int i = 0; i < NSTAGE; i++) {
        stage_ent *e = &c->stage[i];
        if (e->bytes == bytes && !memcmp(e->host, host, bytes)) {
            e->used = ++c->tick;
            return e->dev;
        }
    }
    // Not staged yet: into the least recently used entry.
    const char *dev;
    char *h = stage_begin(c, bytes, &dev);
    if (!h) return NULL;
    memcpy(h, host, bytes);
    stage_end(c);
    return dev;
}

char *stage_begin(cu_impl *c, size_t bytes, const char **dev)
{
    if (in_graph(c)) {
        char *h = arena_alloc(c, bytes);
        *dev = (const char *)arena_dev(c, h);
        return h;
    }
    stage_ent *e = &c->stage[0];
    for (int i = 1; i < NSTAGE; i++)
        if (c->stage[i].used < e->used) e = &c->stage[i];
    CK(c, cudaEventSynchronize(e->ev));
    if (bytes > e->cap) {
        if (e->host) CK(c, cudaFreeHost(e->host));
        if (e->dev) CK(c, cudaFreeAsync(e->dev, c->st));
        e->host = e->dev = NULL;
        e->cap = e->bytes = 0;
        size_t cap = bytes < 1024 ? 1024 : 2 * bytes;
        CK(c, cudaMallocHost(&e->host, cap));
        CK(c, cudaMallocAsync(&e->dev, cap, c->st));
        if (!e->host || !e->dev) return NULL;
        e->cap = cap;
    }
    e->bytes = bytes;
    e->used = ++c->tick;
    c->filling = e;
    *dev = (const char *)e->dev;
    return (char *)e->host;
}

void stage_end(cu_impl *c)
{
    stage_ent *e = c->filling;
    c->filling = NULL;
    if (!e || in_graph(c)) return;
    CK(c, cudaMemcpyAsync(e->dev, e->host, e->bytes, cudaMemcpyHostToDevice, c->st));
    CK(c, cudaEventRecord(e->ev, c->st));
}

void arena_free(cu_impl *c)
{
    for (int i = 0; i < 2; i++) {
        if (c->arena_hb[i]) cudaFreeHost(c->arena_hb[i]);
        if (c->arena_ev[i]) cudaEventDestroy(c->arena_ev[i]);
        c->arena_hb[i] = NULL;
        c->arena_ev[i] = NULL;
    }
    if (c->arena_d) cudaFree(c->arena_d);
    c->arena_h = c->arena_d = NULL;
    c->arena_cap = 0;
}

// Outside any capture; every graph holds the old arena's address.
void arena_grow(cu_impl *c, size_t bytes)
{
    CK(c, cudaStreamSynchronize(c->st));
    arena_free(c);
    c->gen++;
    for (int i = 0; i < 2; i++) {
        CK(c, cudaMallocHost(&c->arena_hb[i], bytes));
        CK(c, cudaEventCreateWithFlags(&c->arena_ev[i], cudaEventDisableTiming));
    }
    CK(c, cudaMalloc(&c->arena_d, bytes));
    c->arena_i = 0;
    c->arena_h = c->arena_hb[0];
    if (!c->failed) c->arena_cap = bytes;
}

// Without this a step's ops rewrote the host arena while the copy of the
// step before could still be waiting in the stream: that copy then took
// the new step's values, or structs half rewritten (bench_cuda_attention's
// batches, replayed without a host wait: illegal addresses).
void arena_next(cu_impl *c)
{
    if (!c->arena_cap) return;
    c->arena_i ^= 1;
    c->arena_turns++;
    c->arena_h = c->arena_hb[c->arena_i];
    CK(c, cudaEventSynchronize(c->arena_ev[c->arena_i]));
}

void arena_copy(cu_impl *c)
{
    CK(c, cudaMemcpyAsync(c->arena_d, c->arena_h, c->arena_len, cudaMemcpyHostToDevice, c->st));
    CK(c, cudaEventRecord(c->arena_ev[c->arena_i], c->st));
}
