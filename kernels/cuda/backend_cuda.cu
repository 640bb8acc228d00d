// The CUDA backend (engine/model/backend.h): one instance per tensor-parallel
// rank, rank r on device r with its own stream and an NCCL communicator
// over the group.  Activations and the cache are device memory (float32);
// weights are uploaded once, as the rank's shard in stored precision.
// Host-side inputs of an op (positions, token ids, block addresses) are
// staged through a small cache of pinned buffers keyed by content, so the
// same array used by many ops of a step is copied once.
//
// Decode steps are replayed as CUDA graphs (graph_begin/graph_end,
// backend.h): one graph per step shape holds every launch of the step,
// the all-reduces included.  Under a graph, an op's host inputs and its
// per-step values (dstep: pos0, the sequence's state or ring) go to an
// arena at offsets that repeat from step to step; replaying a step is the
// ops writing the arena, one copy of it to the device, one graph launch.
// Graphs hold raw device addresses: any release or reallocation of device
// memory (gen) retires them.
#include <math.h>
#include <cublasLt.h>
#include <nccl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

extern "C" {
#include "backend.h"
}
#include "kernels.cuh"

// Where a weight view's device copy is (qweight.dev).
struct cuda_qw {
    const uint8_t *data, *scale;
    long long ld, sld, estride, sestride;
    int row0, col0;             // copy origin in the stored tensor
};

#define NSTAGE 32
#define NGRAPH 16       // step shapes kept as graphs per rank
#define NPUT 64         // host arrays deduplicated in the arena per step
#define ARENA_BYTES ((size_t)4 << 20)

// Graph modes of a step under graph_begin.
enum { G_OFF, G_WARM, G_CAPTURE, G_RECORD };

struct graph_ent {
    uint64_t key;
    cudaGraphExec_t exec;
    unsigned long long gen;     // memory generation the graph was captured in
    unsigned long long warm_gen;
    bool warm;                  // ran once as usual at warm_gen
    size_t arena_len;
    unsigned long long used;
};

struct arena_put_ent {
    const void *host;
    size_t bytes, reserve, off;
};

struct stage_ent {
    void *host, *dev;           // pinned copy of the content, device copy
    size_t bytes, cap;
    unsigned long long used;
    cudaEvent_t ev;             // the copy out of `host` is done
};

// Device scratch that grows on demand (stream-ordered allocations).
struct grow_buf {
    void *p;
    size_t cap;
};

// LLM_CUDA_PROFILE=1: every op (and the phases of the larger ones) is a
// span between two events recorded in the stream, read when the stream is
// waited for anyway (gather_cols) or the spans run out, so the ops still
// run back to back (graphs are off: each op is launched on its own).
// Totals per op are printed when the backend is destroyed.
#define NPROF 32
#define NSPAN 2048
struct prof_ent {
    const char *op;
    long long calls;
    double ms;
};

// cuBLASLt's algorithm for a GEMM shape, the token count rounded up to a
// power of two (MoE experts see every count): choosing one costs more
// host time than launching it.
#define NALGO 128
#define ALGO_KEY 10
struct lt_algo {
    int key[ALGO_KEY];
    cublasLtMatmulAlgo_t algo;
};

struct cu_impl {
    int dev, rank, nranks;
    bool profile;
    cudaEvent_t *spans;         // [2 * NSPAN]: start and end of each span
    const char *span_op[NSPAN];
    int nspan;
    prof_ent prof[NPROF];
    cudaStream_t st;
    ncclComm_t comm;
    ar_peers ar;                // one-shot all-reduce (ar.tp > 1: ready)
    void *ar_mem;
    char err[512];
    bool failed;
    void **owned;               // uploads, freed at destroy
    size_t nowned, capowned;
    cuda_qw **descs;
    size_t ndescs, capdescs;
    stage_ent stage[NSTAGE];
    unsigned long long tick, fills;
    grow_buf sc, idx, wt, ord, perm, tiles, ntiles, offs, xs, yss, g, u, ys, sg, su, sy,
        iscores, ikeys, wdeq, hcm, xbf, apart;
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t lt_op;
    void *lt_ws;
    int gemm;                   // gemm_mode: enum backend_gemm (backend_modes.h)
    int attn_tokens;            // attn_tokens: query tokens per tensor-core attention block
    lt_algo algos[NALGO];
    int nalgos;                 // ever chosen (the cache is a ring)
    double expert_host_ms;      // profiling: host time queuing the expert GEMMs
    bool moe_lt;                // moe_kernel cublaslt: experts through cuBLASLt in every mode
    // graph replay
    bool graphs;                // LLM_CUDA_GRAPHS is not 0 and not profiling
    int gmode;
    bool gbad;                  // this capture cannot be used (ran short of something)
    unsigned long long gen, gtick;
    graph_ent graph[NGRAPH], *gcur;
    long long ncaptures, nreplays;
    char *arena_h, *arena_d;    // pinned host / device, same layout
    size_t arena_cap, arena_len;
    arena_put_ent put[NPUT];
    int nput;
};

#define LT_WS_BYTES (32u << 20)
#define LT_MIN_T 64     // prefill matmuls of at least this many tokens go to cuBLASLt
#define WCHUNK_BYTES ((size_t)512 << 20)    // experts' weights dequantized at a time

// Prefill GEMM operands.  Weights are exact in bf16 (FP8, E2M1, BF16
// values times powers of two); activations are not: bf16x2 splits each
// into hi = bf16(x) and lo = bf16(x - hi) (x - hi - lo within 2^-16 |x|)
// and accumulates W hi + W lo, bf16 rounds x once (2^-8), f32 keeps
// float32 operands (no tensor cores).  The modes and their names are
// backend_modes.h's (recipe key gemm_mode).
#define IDX_MMA_MIN_T 64    // indexer steps of at least this many tokens score on tensor cores
#define ATT_MMA_MIN_T 64    // attention of steps of at least this many tokens on tensor cores

static cu_impl *impl(backend *b) { return (cu_impl *)b->impl; }

// Attention and the indexer of prefill steps on tensor cores, which take
// keys as bf16: always under bf16; under bf16x2 only when the cache holds
// them exactly in bf16 (BF16, FP8), so that on a float32 cache the default
// mode stays within its 2^-16 of the float32 reference.
static bool tensor_core_keys(cu_impl *c, enum kv_dtype t)
{
    return c->gemm == BACKEND_GEMM_BF16 || (c->gemm == BACKEND_GEMM_BF16X2 && t != KV_F32);
}
static size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

static void fail(cu_impl *c, const char *fmt, ...)
{
    if (c->failed) return;
    c->failed = true;
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(c->err, sizeof c->err, "device %d: ", c->dev);
    vsnprintf(c->err + n, sizeof c->err - n, fmt, ap);
    va_end(ap);
}

#define CK(c, call)                                                                              \
    do {                                                                                         \
        cudaError_t e_ = (call);                                                                 \
        if (e_ != cudaSuccess) fail(c, "%s:%d: %s: %s", __FILE__, __LINE__, #call,               \
                                    cudaGetErrorString(e_));                                     \
    } while (0)

// Every op starts here: this thread works on the rank's device.
static cu_impl *enter(backend *b)
{
    cu_impl *c = impl(b);
    CK(c, cudaSetDevice(c->dev));
    if (c->profile) CK(c, cudaEventRecord(c->spans[2 * c->nspan], c->st));
    return c;
}

// Add the finished spans to the totals.
static void prof_flush(cu_impl *c)
{
    if (!c->nspan) return;
    CK(c, cudaEventSynchronize(c->spans[2 * c->nspan - 1]));
    for (int k = 0; k < c->nspan; k++) {
        float ms = 0;
        CK(c, cudaEventElapsedTime(&ms, c->spans[2 * k], c->spans[2 * k + 1]));
        int i = 0;
        while (i < NPROF - 1 && c->prof[i].op && strcmp(c->prof[i].op, c->span_op[k])) i++;
        c->prof[i].op = c->span_op[k];
        c->prof[i].calls++;
        c->prof[i].ms += ms;
    }
    c->nspan = 0;
}

// After the launches of an op.
static void launched(cu_impl *c, const char *op)
{
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) fail(c, "%s: %s", op, cudaGetErrorString(e));
    if (!c->profile) return;
    CK(c, cudaEventRecord(c->spans[2 * c->nspan + 1], c->st));
    c->span_op[c->nspan] = op;
    if (++c->nspan == NSPAN) prof_flush(c);
}

// Profiles: the launches so far are phase `op` of the op; a new span starts.
static void phase(cu_impl *c, const char *op)
{
    launched(c, op);
    if (c->profile) CK(c, cudaEventRecord(c->spans[2 * c->nspan], c->st));
}

static void print_profile(cu_impl *c)
{
    double total = 0;
    for (int i = 0; i < NPROF && c->prof[i].op; i++) total += c->prof[i].ms;
    fprintf(stderr, "cuda profile, device %d (%s prefill GEMMs): %.1f ms in ops\n", c->dev,
            backend_gemm_names[c->gemm], total);
    for (int i = 0; i < NPROF && c->prof[i].op; i++)
        fprintf(stderr, "  %-18s %8lld calls %10.1f ms %5.1f%%\n", c->prof[i].op,
                c->prof[i].calls, c->prof[i].ms, 100 * c->prof[i].ms / (total > 0 ? total : 1));
    fprintf(stderr, "  host time queuing the expert GEMMs: %.1f ms\n", c->expert_host_ms);
}

static bool in_graph(cu_impl *c) { return c->gmode == G_CAPTURE || c->gmode == G_RECORD; }
// Replaying: an op only records its changing values, launches nothing.
static bool recording(cu_impl *c) { return c->gmode == G_RECORD; }

static void *grow(cu_impl *c, grow_buf *g, size_t bytes)
{
    if (bytes > g->cap) {
        if (c->gmode == G_CAPTURE) {    // no allocation in a capture: the step runs as usual
            c->gbad = true;
            return g->p;
        }
        c->gen++;
        if (g->p) CK(c, cudaFreeAsync(g->p, c->st));
        g->p = NULL;
        g->cap = 0;
        size_t cap = bytes < 4096 ? 4096 : bytes + bytes / 4;
        CK(c, cudaMallocAsync(&g->p, cap, c->st));
        if (g->p) g->cap = cap;
    }
    return g->p;
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
static const void *arena_put(cu_impl *c, const void *host, size_t bytes, size_t reserve)
{
    arena_put_ent *e = NULL;
    for (int i = 0; i < c->nput && !e; i++)
        if (c->put[i].host == host && c->put[i].reserve == reserve) e = &c->put[i];
    if (!e) {
        char *h = arena_alloc(c, reserve);
        if (!h) return c->arena_d;
        if (c->nput == NPUT) {
            memcpy(h, host, bytes);
            return arena_dev(c, h);
        }
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
static const dstep *step_values(cu_impl *c, int pos0, const void *ptr)
{
    if (!in_graph(c)) return NULL;
    dstep *h = (dstep *)arena_alloc(c, sizeof(dstep));
    if (h) *h = dstep{ pos0, (void *)ptr };
    return (const dstep *)arena_dev(c, (const char *)h);
}

// The bound on pos0 + n that sizes launches: exact, or under a graph the
// key's (graph_pos_cap), so the launches repeat while positions move.
static int pos_end(cu_impl *c, int pos0, int n)
{
    return c->gmode == G_OFF ? pos0 + n : graph_pos_cap(pos0 + n);
}

// A device copy of host array `host` (bytes), valid for launches queued
// on the stream from now until `host`'s content is staged NSTAGE more
// times (under a graph: in the arena, for this step).
static const void *stage(cu_impl *c, const void *host, size_t bytes)
{
    if (!bytes) return NULL;
    if (in_graph(c)) return arena_put(c, host, bytes, bytes);
    stage_ent *lru = &c->stage[0];
    for (int i = 0; i < NSTAGE; i++) {
        stage_ent *e = &c->stage[i];
        if (e->bytes == bytes && !memcmp(e->host, host, bytes)) {
            e->used = ++c->tick;
            return e->dev;
        }
        if (e->used < lru->used) lru = e;
    }
    stage_ent *e = lru;
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
    memcpy(e->host, host, bytes);
    e->bytes = bytes;
    e->used = ++c->tick;
    CK(c, cudaMemcpyAsync(e->dev, e->host, bytes, cudaMemcpyHostToDevice, c->st));
    CK(c, cudaEventRecord(e->ev, c->st));
    return e->dev;
}

static bool to_dqw(cu_impl *c, const qweight *w, dqw *q)
{
    const cuda_qw *d = (const cuda_qw *)w->dev;
    if (!d) {
        fail(c, "a %dx%d weight was never uploaded", w->rows, w->cols);
        return false;
    }
    *q = dqw{ (int)w->type, w->rows, w->cols, d->data, d->scale, d->ld, d->sld,
              w->row0 - d->row0, w->col0 - d->col0, d->estride, d->sestride };
    return true;
}

static bool to_rope(cu_impl *c, const rope_table *rt, drope *r)
{
    if (rt->npairs > ROPE_MAX_PAIRS) {
        fail(c, "RoPE with %d channel pairs (at most %d)", rt->npairs, ROPE_MAX_PAIRS);
        return false;
    }
    r->npairs = rt->npairs;
    r->attn_factor = rt->attn_factor;
    memcpy(r->inv_freq, rt->inv_freq, rt->npairs * sizeof(float));
    return true;
}

// Device block addresses for rows [0, nrows) of p (under a graph, in
// room for rows [0, nrows_cap)).
static bool to_paged(cu_impl *c, const paged_rows *p, int nrows, int nrows_cap, dpaged *d)
{
    int nblk = nrows > 0 ? (nrows + p->per_block - 1) / p->per_block : 0;
    int ncap = nrows_cap > 0 ? (nrows_cap + p->per_block - 1) / p->per_block : 0;
    d->blocks = (char *const *)(in_graph(c) ? arena_put(c, p->blocks, nblk * sizeof(char *),
                                                        ncap * sizeof(char *))
                                            : stage(c, p->blocks, nblk * sizeof(char *)));
    d->off = (long long)p->off;
    d->per_block = p->per_block;
    d->row_len = p->row_len;
    d->dtype = (int)p->dtype;
    return !c->failed;
}

// ---- memory ----

static void *cu_alloc(backend *b, size_t bytes)
{
    cu_impl *c = enter(b);
    void *p = NULL;
    cudaError_t e = cudaMallocAsync(&p, bytes ? bytes : 256, c->st);
    if (e != cudaSuccess) {
        cudaGetLastError();
        fail(c, "out of device memory allocating %zu bytes", bytes);
        return NULL;
    }
    CK(c, cudaMemsetAsync(p, 0, bytes, c->st));
    return p;
}

static void cu_release(backend *b, void *p)
{
    if (!p) return;
    cu_impl *c = enter(b);
    c->gen++;
    CK(c, cudaFreeAsync(p, c->st));
}

static void cu_copy_rows(backend *b, float *dst, int ldd, const float *src, int lds, int rows,
                         int n)
{
    cu_impl *c = enter(b);
    if (rows <= 0 || n <= 0 || recording(c)) return;
    CK(c, cudaMemcpy2DAsync(dst, ldd * sizeof(float), src, lds * sizeof(float), n * sizeof(float),
                            rows, cudaMemcpyDeviceToDevice, c->st));
    launched(c, "copy_rows");
}

static void cu_write(backend *b, void *dst, const void *src, size_t bytes)
{
    cu_impl *c = enter(b);
    CK(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->st));
    CK(c, cudaStreamSynchronize(c->st));
}

static void cu_read(backend *b, void *dst, const void *src, size_t bytes)
{
    cu_impl *c = enter(b);
    CK(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->st));
    CK(c, cudaStreamSynchronize(c->st));
}

static void own(cu_impl *c, void *p)
{
    if (c->nowned == c->capowned) {
        c->capowned = c->capowned ? 2 * c->capowned : 256;
        c->owned = (void **)realloc(c->owned, c->capowned * sizeof *c->owned);
    }
    c->owned[c->nowned++] = p;
}

static void *dev_alloc(cu_impl *c, size_t bytes)
{
    void *p = NULL;
    if (bytes < 256) bytes = 256;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
        cudaGetLastError();
        fail(c, "out of device memory uploading %zu bytes", bytes);
        return NULL;
    }
    own(c, p);
    CK(c, cudaMemsetAsync(p, 0, bytes, c->st));
    return p;
}

static void *cu_upload(backend *b, const void *host, size_t bytes)
{
    cu_impl *c = enter(b);
    void *p = dev_alloc(c, bytes);
    if (!p) return NULL;
    CK(c, cudaMemcpyAsync(p, host, bytes, cudaMemcpyHostToDevice, c->st));
    CK(c, cudaStreamSynchronize(c->st));
    return c->failed ? NULL : p;
}

// The rectangle of stored rows/columns covering the view, its origin
// aligned to the scale blocks (FP8 128x128, MXFP4 1x32) and to 16 bytes,
// each row padded to 16 bytes; n views packed one after another.
static int cu_upload_weights(backend *b, qweight *w, int n)
{
    cu_impl *c = enter(b);
    const qweight *q = &w[0];
    int ra = 1, ca, es;         // row / column alignment, bits per element
    switch (q->type) {
    case QT_F32: ca = 4; es = 32; break;
    case QT_BF16: ca = 8; es = 16; break;
    case QT_FP8: ra = 128; ca = 128; es = 8; break;
    default: ca = 32; es = 4; break;
    }
    int pad = 128 / es;         // elements per 16 bytes
    int R0 = q->row0 / ra * ra, C0 = q->col0 / ca * ca;
    long long nr = q->row0 + q->rows - R0, nc = q->col0 + q->cols - C0;
    long long ld = round_up(nc, pad);
    size_t row_bytes = ld * es / 8, src_pitch = q->ld * es / 8, width = (nc * es + 7) / 8;
    size_t data_bytes = round_up(nr * row_bytes, 256);
    long long srows = 0, scols = 0, sr0 = 0, sc0 = 0;
    if (q->type == QT_FP8) {
        srows = (nr + 127) / 128, scols = (nc + 127) / 128, sr0 = R0 / 128, sc0 = C0 / 128;
    } else if (q->type == QT_MXFP4) {
        srows = nr, scols = (nc + 31) / 32, sr0 = R0, sc0 = C0 / 32;
    }
    size_t scale_bytes = round_up(srows * scols, 256);
    uint8_t *data = (uint8_t *)dev_alloc(c, (size_t)n * data_bytes);
    uint8_t *scale = scale_bytes ? (uint8_t *)dev_alloc(c, (size_t)n * scale_bytes) : NULL;
    if (!data || (scale_bytes && !scale)) return -1;
    if (!q->data) {     // synthetic: values of the format, std about 1/sqrt(cols)
        static const int kinds[] = { FILL_F32, FILL_BF16, FILL_FP8, FILL_BYTES };
        float amp = sqrtf(3.0f / (q->cols > 0 ? q->cols : 1));
        cu_fill(c->st, data, (size_t)n * data_bytes, kinds[q->type], amp, 0,
                ((unsigned long long)c->rank << 48) ^ ++c->fills);
        // FP8 codes average about 1, E2M1 about 2: scales 2^-6 and 2^-7.
        if (scale) cu_fill(c->st, scale, (size_t)n * scale_bytes, FILL_CONST, 0,
                           q->type == QT_FP8 ? 121 : 120, 0);
        launched(c, "synthetic weights");
    }
    for (int i = 0; i < n; i++) {
        const uint8_t *src = (const uint8_t *)w[i].data + (size_t)R0 * src_pitch + C0 * es / 8;
        if (q->data && nr > 0 && width > 0)
            CK(c, cudaMemcpy2DAsync(data + i * data_bytes, row_bytes, src, src_pitch, width, nr,
                                    cudaMemcpyHostToDevice, c->st));
        if (q->data && scale_bytes)
            CK(c, cudaMemcpy2DAsync(scale + i * scale_bytes, scols,
                                    w[i].scale + sr0 * w[i].scale_ld + sc0, w[i].scale_ld, scols,
                                    srows, cudaMemcpyHostToDevice, c->st));
        cuda_qw *d = (cuda_qw *)calloc(1, sizeof *d);
        *d = cuda_qw{ data + i * data_bytes, scale ? scale + i * scale_bytes : NULL, ld, scols,
                      (long long)data_bytes, (long long)scale_bytes, R0, C0 };
        if (c->ndescs == c->capdescs) {
            c->capdescs = c->capdescs ? 2 * c->capdescs : 256;
            c->descs = (cuda_qw **)realloc(c->descs, c->capdescs * sizeof *c->descs);
        }
        c->descs[c->ndescs++] = d;
        w[i].dev = d;
    }
    CK(c, cudaStreamSynchronize(c->st));
    return c->failed ? -1 : 0;
}

static void cu_mem_info(backend *b, size_t *free_bytes, size_t *total_bytes)
{
    cu_impl *c = enter(b);
    CK(c, cudaStreamSynchronize(c->st));
    // Memory released to the stream-ordered pool counts as free.
    cudaMemPool_t pool;
    if (cudaDeviceGetDefaultMemPool(&pool, c->dev) == cudaSuccess) cudaMemPoolTrimTo(pool, 0);
    CK(c, cudaMemGetInfo(free_bytes, total_bytes));
}

static const char *cu_error(backend *b)
{
    cu_impl *c = impl(b);
    return c->failed ? c->err : NULL;
}

// ---- compute ----

static unsigned align_of(const void *p)
{
    unsigned a = 256;
    while (a > 2 && (uintptr_t)p % a) a /= 2;
    return a;
}

#define LTK(call)                                                                                \
    do {                                                                                         \
        cublasStatus_t s_ = (call);                                                              \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                       \
            fail(c, "%s:%d: %s: cuBLASLt status %d", __FILE__, __LINE__, #call, (int)s_);        \
            ok = false;                                                                          \
        }                                                                                        \
    } while (0)

// A GEMM operand: float32 or bf16 elements, rows ld elements apart;
// stride: bytes between packed experts; lo: activations split in two,
// the low parts lo elements after the high ones.
struct gemm_op {
    const void *p;
    long long ld;
    bool bf16;
    long long stride;
    int lo;
};

static const void *byte_off(const void *p, long long bytes) { return (const char *)p + bytes; }

// The prefill GEMMs of weight q run in bf16 unless LLM_CUDA_GEMM=f32 or
// the weight is float32 (not exact in bf16).
static bool use_bf16(cu_impl *c, const dqw &q) { return c->gemm != BACKEND_GEMM_F32 && q.type != QT_F32; }

static bool lt_heuristic(cu_impl *c, cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                         cublasLtMatrixLayout_t C, const uint32_t *align,
                         cublasLtMatmulAlgo_t *algo)
{
    bool ok = true;
    uint64_t ws = LT_WS_BYTES;
    cublasLtMatmulPreference_t pref = NULL;
    LTK(cublasLtMatmulPreferenceCreate(&pref));
    LTK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                             sizeof ws));
    cublasLtMatmulPreferenceAttributes_t which[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES
    };
    for (int i = 0; i < 4; i++)
        LTK(cublasLtMatmulPreferenceSetAttribute(pref, which[i], &align[i < 3 ? i : 2],
                                                 sizeof align[0]));
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    if (ok) LTK(cublasLtMatmulAlgoGetHeuristic(c->lt, c->lt_op, A, B, C, C, pref, 1, &res, &nres));
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (ok && nres < 1) return false;
    if (ok) *algo = res.algo;
    return ok;
}

// y[T][N] = x[T][K] . W[N][K]^T, float32 accumulation and output (no
// TF32): column-major, that is Y'[N][T] = W'^T X' with W' = W as K x N.
// The pointers' actual alignments go into the algorithm's choice
// (activation views are offset).
static void lt_gemm(cu_impl *c, gemm_op w, int N, int K, gemm_op x, int T, float *y, int ldy)
{
    bool ok = true;
    cudaDataType_t dt = w.bf16 ? CUDA_R_16BF : CUDA_R_32F;
    int tb = 16;
    while (tb < T) tb *= 2;
    const void *xlo = byte_off(x.p, (long long)x.lo * 2);
    uint32_t align[3] = { align_of(w.p), align_of(x.p), align_of(y) };
    if (x.lo && align_of(xlo) < align[1]) align[1] = align_of(xlo);
    int key[ALGO_KEY] = { w.bf16, N, K, (int)w.ld, (int)x.ld, ldy, tb, (int)align[0],
                          (int)align[1], (int)align[2] };
    cublasLtMatrixLayout_t A = NULL, B = NULL, C = NULL;
    LTK(cublasLtMatrixLayoutCreate(&A, dt, K, N, w.ld));
    LTK(cublasLtMatrixLayoutCreate(&B, dt, K, T, x.ld));
    LTK(cublasLtMatrixLayoutCreate(&C, CUDA_R_32F, N, T, ldy));
    lt_algo *a = NULL;
    for (int i = 0; i < c->nalgos && i < NALGO && !a; i++)
        if (!memcmp(c->algos[i].key, key, sizeof key)) a = &c->algos[i];
    if (ok && !a) {     // chosen for the bucket's largest count
        cublasLtMatrixLayout_t Bb = NULL, Cb = NULL;
        LTK(cublasLtMatrixLayoutCreate(&Bb, dt, K, tb, x.ld));
        LTK(cublasLtMatrixLayoutCreate(&Cb, CUDA_R_32F, N, tb, ldy));
        cublasLtMatmulAlgo_t algo;
        if (ok && lt_heuristic(c, A, Bb, Cb, align, &algo)) {
            a = &c->algos[c->nalgos++ % NALGO];
            memcpy(a->key, key, sizeof key);
            a->algo = algo;
        }
        if (Cb) cublasLtMatrixLayoutDestroy(Cb);
        if (Bb) cublasLtMatrixLayoutDestroy(Bb);
    }
    cublasLtMatmulAlgo_t exact;
    for (int part = 0; part < (x.lo ? 2 : 1) && ok; part++) {
        float alpha = 1, beta = part;   // the low parts add to the high parts' product
        const void *xp = part ? xlo : x.p;
        cublasStatus_t st = CUBLAS_STATUS_NOT_SUPPORTED;
        if (a)
            st = cublasLtMatmul(c->lt, c->lt_op, &alpha, w.p, A, xp, B, &beta, y, C, y, C,
                                &a->algo, c->lt_ws, LT_WS_BYTES, c->st);
        if (st == CUBLAS_STATUS_SUCCESS) continue;
        // Not for this count: choose for it.
        if (lt_heuristic(c, A, B, C, align, &exact)) {
            a = NULL;
            LTK(cublasLtMatmul(c->lt, c->lt_op, &alpha, w.p, A, xp, B, &beta, y, C, y, C, &exact,
                               c->lt_ws, LT_WS_BYTES, c->st));
        } else {
            fail(c, "cuBLASLt: no %s algorithm for %dx%d by %d tokens",
                 w.bf16 ? "bf16" : "float32", N, K, T);
            ok = false;
        }
    }
    if (C) cublasLtMatrixLayoutDestroy(C);
    if (B) cublasLtMatrixLayoutDestroy(B);
    if (A) cublasLtMatrixLayoutDestroy(A);
}

// Weights of nexp packed experts from q on as a GEMM operand: in stored
// form when that is the GEMM's type, else dequantized (exactly) into
// scratch.
static gemm_op gemm_weights(cu_impl *c, bool bf16, const dqw &q, int nexp)
{
    int es = bf16 ? 2 : 4;
    if (q.type == (bf16 ? QT_BF16 : QT_F32))
        return gemm_op{ byte_off(q.data, ((long long)q.r0 * q.ld + q.c0) * es), q.ld, bf16,
                        q.estride, 0 };
    long long ld = round_up(q.cols, 8), stride = q.rows * ld * es;
    void *p = grow(c, &c->wdeq, (size_t)nexp * stride);
    if (!c->failed) cu_dequant(c->st, q, nexp, bf16, p, ld);
    return gemm_op{ p, ld, bf16, stride, 0 };
}

// Activations x[T][K] (rows rows[t] / div of x when rows is set, then
// ldx == K) as a GEMM operand: bf16 in scratch (split in two under
// bf16x2: each row's high parts, then its low parts), or float32
// (gathered into scratch when rows is set).
static gemm_op gemm_input(cu_impl *c, bool bf16, const float *x, int ldx, const int *rows,
                          int div, int T, int K)
{
    if (bf16) {
        int ld = round_up(K, 8), lo = c->gemm == BACKEND_GEMM_BF16X2 ? ld : 0;
        uint16_t *p = (uint16_t *)grow(c, &c->xbf, (size_t)T * (ld + lo) * 2);
        if (!c->failed) cu_round_bf16(c->st, x, ldx, rows, div, T, K, p, ld + lo, lo);
        return gemm_op{ p, ld + lo, true, 0, lo };
    }
    if (!rows) return gemm_op{ x, ldx, false, 0, 0 };
    float *p = (float *)grow(c, &c->xs, (size_t)T * K * sizeof(float));
    if (!c->failed) cu_rows_gather(c->st, x, K, rows, div, T, p);
    return gemm_op{ p, K, false, 0, 0 };
}

// Prefill matmul: y = x W^T through cuBLASLt (bf16 or float32 operands).
static void dense_matmul(cu_impl *c, const dqw &q, const float *x, int ldx, int T, float *y,
                         int ldy)
{
    if (q.rows <= 0 || T <= 0) return;
    if (q.cols <= 0) {      // an empty slice (more ranks than units) adds nothing
        CK(c, cudaMemset2DAsync(y, ldy * sizeof(float), 0, q.rows * sizeof(float), T, c->st));
        return;
    }
    bool bf = use_bf16(c, q);
    gemm_op w = gemm_weights(c, bf, q, 1);
    gemm_op in = gemm_input(c, bf, x, ldx, NULL, 1, T, q.cols);
    if (!c->failed) lt_gemm(c, w, q.rows, q.cols, in, T, y, ldy);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

// MoE rows sorted by expert (expert e's: ho[e] .. ho[e + 1], host memory):
// y of each = its x . W_e^T, a cuBLASLt GEMM per expert, the weights
// dequantized a chunk of experts at a time.  x: gemm_input's, same type.
static void expert_gemms(cu_impl *c, const dqw &w, int E, const int *ho, gemm_op x, float *y,
                         int ldy)
{
    int ns = ho[E];
    if (w.rows <= 0 || ns <= 0) return;
    if (w.cols <= 0) {
        CK(c, cudaMemset2DAsync(y, ldy * sizeof(float), 0, w.rows * sizeof(float), ns, c->st));
        return;
    }
    double t0 = c->profile ? now_ms() : 0;
    size_t per = (size_t)w.rows * round_up(w.cols, 8) * (x.bf16 ? 2 : 4);
    int chunk = (int)(WCHUNK_BYTES / per);
    chunk = chunk < 1 ? 1 : chunk > E ? E : chunk;
    for (int e0 = 0; e0 < E && !c->failed; e0 += chunk) {
        int n = E - e0 < chunk ? E - e0 : chunk;
        if (ho[e0 + n] == ho[e0]) continue;
        dqw q = w;
        q.data += e0 * w.estride;
        if (q.scale) q.scale += e0 * w.sestride;
        gemm_op wc = gemm_weights(c, x.bf16, q, n);
        for (int e = e0; e < e0 + n && !c->failed; e++) {
            int o = ho[e], m = ho[e + 1] - o;
            if (!m) continue;
            gemm_op we = { byte_off(wc.p, (e - e0) * wc.stride), wc.ld, x.bf16, 0, 0 };
            gemm_op xe = { byte_off(x.p, o * x.ld * (x.bf16 ? 2 : 4)), x.ld, x.bf16, 0, x.lo };
            lt_gemm(c, we, w.rows, w.cols, xe, m, y + (size_t)o * ldy, ldy);
        }
    }
    if (c->profile) c->expert_host_ms += now_ms() - t0;
}

// Few tokens: our kernels read the weights in stored precision.  Many:
// the view dequantized once into float32, then cuBLASLt's float32 GEMM.
static void cu_matmul_op(backend *b, const qweight *w, const float *x, int ldx, int T, float *y,
                         int ldy)
{
    cu_impl *c = enter(b);
    dqw q;
    if (recording(c) || !to_dqw(c, w, &q)) return;
    if (T >= LT_MIN_T) dense_matmul(c, q, x, ldx, T, y, ldy);
    else cu_matmul(c->st, q, x, ldx, T, y, ldy);
    launched(c, "matmul");
}

static void cu_embed_op(backend *b, const qweight *w, const int32_t *ids, int T, float *out)
{
    cu_impl *c = enter(b);
    dqw q;
    if (!to_dqw(c, w, &q)) return;
    const int *d = (const int *)stage(c, ids, T * sizeof *ids);
    if (c->failed || recording(c)) return;
    cu_embed(c->st, q, d, T, out);
    launched(c, "embed");
}

static void cu_rmsnorm_op(backend *b, const float *x, int ldx, int T, int n, const float *weight,
                          float eps, float *out, int ldo)
{
    cu_impl *c = enter(b);
    if (recording(c)) return;
    cu_rmsnorm(c->st, x, ldx, T, n, weight, eps, out, ldo);
    launched(c, "rmsnorm");
}

static void cu_rope_op(backend *b, float *x, int ld, int T, int nheads, int head_dim,
                       const rope_table *rt, const int32_t *pos, bool inverse)
{
    cu_impl *c = enter(b);
    drope r;
    if (!to_rope(c, rt, &r)) return;
    const int *d = (const int *)stage(c, pos, T * sizeof *pos);
    if (c->failed || recording(c)) return;
    cu_rope(c->st, x, ld, T, nheads, head_dim, r, d, inverse);
    launched(c, "rope");
}

static void cu_scale_op(backend *b, float *x, int ld, int T, int n, float s)
{
    cu_impl *c = enter(b);
    if (recording(c)) return;
    cu_scale(c->st, x, ld, T, n, s);
    launched(c, "scale");
}

static bool hc_ok(cu_impl *c, int hc)
{
    if (hc > BACKEND_HC_MAX) fail(c, "hc_mult %d (at most %d)", hc, BACKEND_HC_MAX);
    return hc <= BACKEND_HC_MAX;
}

// Few tokens: a block per (logit, token).  Many: the logits as a GEMM
// over the raw streams, scaled per token by the rms factor.
static void hc_pre(cu_impl *c, const float *h, int T, int hc, int H, const float *fn,
                   const float *base, const float *scale, int iters, float hc_eps,
                   float norm_eps, float *post, float *comb, float *collapsed, bool head)
{
    if (!hc_ok(c, hc) || T <= 0) return;
    int nmix = head ? hc : (2 + hc) * hc, n = hc * H;
    float *m = (float *)grow(c, &c->hcm, (size_t)T * (nmix + 1) * sizeof(float));
    if (c->failed) return;
    float *r = NULL;
    if (T >= LT_MIN_T) {
        r = m + (size_t)T * nmix;
        cu_hc_rms(c->st, h, T, n, norm_eps, r);
        lt_gemm(c, gemm_op{ fn, n, false, 0, 0 }, nmix, n, gemm_op{ h, n, false, 0, 0 }, T, m,
                nmix);
    } else {
        cu_hc_logits(c->st, h, T, n, fn, nmix, norm_eps, m);
    }
    phase(c, head ? "hc_head logits" : "hc_pre logits");
    cu_hc_collapse(c->st, h, T, hc, H, m, r, base, scale, iters, hc_eps, post, comb, collapsed,
                   head);
}

static void cu_hc_pre_op(backend *b, const float *h, int T, int hc, int H, const float *fn,
                         const float *base, const float *scale, int iters, float hc_eps,
                         float norm_eps, float *post, float *comb, float *collapsed)
{
    cu_impl *c = enter(b);
    if (recording(c)) return;
    hc_pre(c, h, T, hc, H, fn, base, scale, iters, hc_eps, norm_eps, post, comb, collapsed, false);
    launched(c, "hc_pre");
}

static void cu_hc_head_op(backend *b, const float *h, int T, int hc, int H, const float *fn,
                          const float *base, const float *scale, float hc_eps, float norm_eps,
                          float *out)
{
    cu_impl *c = enter(b);
    if (recording(c)) return;
    hc_pre(c, h, T, hc, H, fn, base, scale, 0, hc_eps, norm_eps, NULL, NULL, out, true);
    launched(c, "hc_head");
}

static void cu_hc_post_op(backend *b, float *h, const float *y, const float *post,
                          const float *comb, int T, int hc, int H)
{
    cu_impl *c = enter(b);
    if (recording(c) || !hc_ok(c, hc)) return;
    cu_hc_post(c->st, h, y, post, comb, T, hc, H);
    launched(c, "hc_post");
}

static void cu_compress_op(backend *b, const compress_args *a)
{
    cu_impl *c = enter(b);
    drope r;
    dcomp d = { a->n, a->pos0, a->ratio, a->d, a->overlap, a->ld, a->kv, a->gate, a->ape,
                a->norm, a->eps, a->state, {}, step_values(c, a->pos0, a->state) };
    if (!to_rope(c, a->rope, &r) ||
        !to_paged(c, &a->out, (a->pos0 + a->n) / a->ratio,
                  pos_end(c, a->pos0, a->n) / a->ratio, &d.out) ||
        recording(c))
        return;
    cu_compress(c->st, d, r);
    launched(c, "compress");
}

static void cu_indexer_op(backend *b, const indexer_args *a)
{
    cu_impl *c = enter(b);
    int end = pos_end(c, a->pos0, a->n), maxvis = end / a->ratio;
    dindexer d = { a->n, a->pos0, a->ratio, a->nheads, a->d, a->topk, a->q, a->w, {}, a->sel,
                   a->nsel, end, step_values(c, a->pos0, NULL) };
    if (!to_paged(c, &a->keys, (a->pos0 + a->n) / a->ratio, maxvis, &d.keys) || recording(c))
        return;
    // Scores of up to 64M entries at once (token chunks beyond that).
    size_t want = (size_t)a->n * (maxvis > 0 ? maxvis : 1);
    size_t cap = want < ((size_t)64 << 20) ? want : ((size_t)64 << 20);
    if (cap < (size_t)maxvis) cap = maxvis;
    float *sc = (float *)grow(c, &c->iscores, cap * sizeof(float));
    // Many tokens: tensor-core scores over keys gathered as bf16, in
    // scratch of a fixed size (the profile step at load allocates it).
    uint16_t *keys = NULL;
    if (!in_graph(c) && a->n >= IDX_MMA_MIN_T && cu_indexer_mma_fits(a->nheads, a->d) &&
        tensor_core_keys(c, a->keys.dtype))
        keys = (uint16_t *)grow(c, &c->ikeys, (size_t)CU_INDEXER_KTILE * a->d * sizeof(uint16_t));
    if (c->failed) return;
    cu_indexer(c->st, d, sc, cap, keys);
    launched(c, "indexer");
}

static void cu_attention_op(backend *b, const attention_args *a)
{
    cu_impl *c = enter(b);
    int end = pos_end(c, a->pos0, a->n);
    dattn d = { a->n, a->pos0, a->nheads, a->head_dim, a->window, a->scale, a->q, a->kv,
                (const char *)a->ring, (int)a->dtype, a->sinks, a->ratio, {}, a->sel, a->nsel,
                a->sel_ld, a->out, end, step_values(c, a->pos0, a->ring) };
    if (a->ratio &&
        !to_paged(c, &a->comp, (a->pos0 + a->n) / a->ratio, end / a->ratio, &d.comp))
        return;
    if (recording(c)) return;
    if (!in_graph(c) && a->n >= ATT_MMA_MIN_T && tensor_core_keys(c, a->dtype) &&
        cu_attention_mma(c->st, d, c->gemm == BACKEND_GEMM_BF16X2, c->attn_tokens)) {
        launched(c, "attention");
        return;
    }
    int hpb, splits, chunk;
    cu_attention_plan(d, &hpb, &splits, &chunk);
    float *part = NULL;
    if (splits > 1) {
        part = (float *)grow(c, &c->apart,
                             (size_t)a->n * a->nheads * splits * (a->head_dim + 2) * sizeof(float));
        if (c->failed) return;
    }
    if (!cu_attention(c->st, d, part)) {
        fail(c, "attention: head_dim %d is too large for the kernel", a->head_dim);
        return;
    }
    launched(c, "attention");
}

static void cu_ring_store_op(backend *b, void *ring, enum kv_dtype t, int window, int head_dim,
                             const float *kv, int n, int pos0)
{
    cu_impl *c = enter(b);
    const dstep *dyn = step_values(c, pos0, ring);
    if (recording(c)) return;
    cu_ring_store(c->st, (char *)ring, (int)t, window, head_dim, kv, n, pos0, dyn);
    launched(c, "ring_store");
}

static void cu_kv_round_op(backend *b, float *x, int ld, int T, int n, enum kv_dtype t)
{
    cu_impl *c = enter(b);
    if (recording(c)) return;
    cu_kv_round(c->st, x, ld, T, n, (int)t);
    launched(c, "kv_round");
}

// Router, then the routed experts (one row per token and choice: slot
// t*K + k) and the shared expert, then the weighted sum.  A few tokens:
// fused matrix-vector products per slot reading its expert's weights;
// more: slots grouped by expert into tiles.
static void cu_moe_op(backend *b, const moe_args *a)
{
    cu_impl *c = enter(b);
    int T = a->T, H = a->H, E = a->n_experts, K = a->topk, I = a->w1[0].rows, ns = T * K;
    if (K > 16) {
        fail(c, "moe: %d experts per token (at most 16)", K);
        return;
    }
    const int *ids = a->tid2eid ? (const int *)stage(c, a->ids, T * sizeof(int32_t)) : NULL;
    if (recording(c)) return;
    dqw gate, w1, w2, w3, s1, s2, s3;
    if (!to_dqw(c, a->gate, &gate) || !to_dqw(c, &a->w1[0], &w1) || !to_dqw(c, &a->w2[0], &w2) ||
        !to_dqw(c, &a->w3[0], &w3) || !to_dqw(c, a->sw1, &s1) || !to_dqw(c, a->sw2, &s2) ||
        !to_dqw(c, a->sw3, &s3))
        return;
    float *sc = (float *)grow(c, &c->sc, (size_t)T * E * sizeof(float));
    int *idx = (int *)grow(c, &c->idx, ns * sizeof(int));
    float *wt = (float *)grow(c, &c->wt, ns * sizeof(float));
    int *ord = (int *)grow(c, &c->ord, ns * sizeof(int));
    float *g = (float *)grow(c, &c->g, (size_t)ns * I * sizeof(float) + 4);
    float *u = (float *)grow(c, &c->u, (size_t)ns * I * sizeof(float) + 4);
    float *ys = (float *)grow(c, &c->ys, (size_t)ns * H * sizeof(float));
    float *sg = (float *)grow(c, &c->sg, (size_t)T * I * sizeof(float) + 4);
    float *su = (float *)grow(c, &c->su, (size_t)T * I * sizeof(float) + 4);
    float *sy = (float *)grow(c, &c->sy, (size_t)T * H * sizeof(float));
    if (c->failed) return;

    cu_matmul(c->st, gate, a->x, H, T, sc, E);
    cu_moe_route(c->st, sc, T, E, K, a->sigmoid_scores, a->bias, a->tid2eid, a->tid_i64, ids,
                 a->routed_scale, idx, wt, ord);
    phase(c, "moe router");
    if (T <= 8) {
        // Four launches: the shared expert (w1 and w3 with SwiGLU, w2),
        // the chosen experts' w1 and w3 with SwiGLU, then their w2 with
        // the routing weights, summed over the experts and added to the
        // shared expert's output.
        if (!cu_gemv_swiglu(c->st, s1, s3, NULL, a->x, H, 1, T, a->limit, sg, I))
            fail(c, "moe: the shared expert's w1 and w3 differ in layout");
        cu_matmul(c->st, s2, sg, I, T, sy, H);
        phase(c, "moe shared");
        if (!cu_gemv_swiglu(c->st, w1, w3, idx, a->x, H, K, ns, a->limit, g, I))
            fail(c, "moe: the experts' w1 and w3 differ in layout");
        cu_gemv_combine(c->st, w2, idx, K, wt, g, I, T, sy, a->out, H);
        launched(c, "moe experts");
        return;
    } else {
        int max_tiles = ns / CU_TILE_M + E;
        int *perm = (int *)grow(c, &c->perm, ns * sizeof(int));
        int4 *tiles = (int4 *)grow(c, &c->tiles, max_tiles * sizeof(int4));
        int *ntiles = (int *)grow(c, &c->ntiles, sizeof(int));
        int *offs = (int *)grow(c, &c->offs, (E + 1) * sizeof(int));
        if (c->failed) return;
        cu_moe_sort(c->st, idx, ns, E, perm, tiles, ntiles, offs);
        // Tensor cores: w1 and w3 with SwiGLU into g (slots sorted by
        // expert), then w2 scattered back to slot order.
        dmoe_gemm m13 = { w1, w3, true, a->limit, tiles, ntiles, perm, a->x, H, K, g, I,
                          false, false, false };
        dmoe_gemm m2 = { w2, {}, false, 0, tiles, ntiles, perm, g, I, 0, ys, H, true, false,
                         false };
        bool split = c->gemm == BACKEND_GEMM_BF16X2;
        if (ns < 32 * E) {  // few rows per expert: tiles read each expert once
            cu_matmul_tiles(c->st, w1, tiles, ntiles, max_tiles, perm, a->x, H, K, g, I);
            cu_matmul_tiles(c->st, w3, tiles, ntiles, max_tiles, perm, a->x, H, K, u, I);
            cu_swiglu(c->st, g, u, (long long)ns * I, a->limit);
            cu_matmul_tiles(c->st, w2, tiles, ntiles, max_tiles, perm, g, I, 1, ys, H);
        } else if (c->gemm != BACKEND_GEMM_F32 && !c->moe_lt && w2.type == QT_MXFP4 &&
                   cu_moe_gemm(c->st, m13, max_tiles, split)) {
            phase(c, "moe w1 w3");
            cu_moe_gemm(c->st, m2, max_tiles, split);
            phase(c, "moe w2");
        } else {
            // Float32 operands (or LLM_CUDA_MOE=cublaslt, or weights not in
            // MXFP4): rows sorted by expert, each expert's block through
            // cuBLASLt (the host needs the counts: one wait per MoE layer).
            float *yss = (float *)grow(c, &c->yss, (size_t)ns * H * sizeof(float));
            int *ho = (int *)malloc((E + 1) * sizeof(int));
            CK(c, cudaMemcpyAsync(ho, offs, (E + 1) * sizeof(int), cudaMemcpyDeviceToHost,
                                  c->st));
            CK(c, cudaStreamSynchronize(c->st));
            phase(c, "moe sort");
            gemm_op xs = gemm_input(c, use_bf16(c, w1), a->x, H, perm, K, ns, H);
            expert_gemms(c, w1, E, ho, xs, g, I);
            expert_gemms(c, w3, E, ho, xs, u, I);
            phase(c, "moe w1 w3");
            cu_swiglu(c->st, g, u, (long long)ns * I, a->limit);
            expert_gemms(c, w2, E, ho, gemm_input(c, use_bf16(c, w2), g, I, NULL, 1, ns, I), yss,
                         H);
            phase(c, "moe w2");
            cu_rows_scatter(c->st, yss, H, perm, ns, ys);
            free(ho);
        }
    }
    phase(c, "moe experts");
    if (T >= LT_MIN_T) {
        dense_matmul(c, s1, a->x, H, T, sg, I);
        dense_matmul(c, s3, a->x, H, T, su, I);
    } else {
        cu_matmul(c->st, s1, a->x, H, T, sg, I);
        cu_matmul(c->st, s3, a->x, H, T, su, I);
    }
    cu_swiglu(c->st, sg, su, (long long)T * I, a->limit);
    if (T >= LT_MIN_T) dense_matmul(c, s2, sg, I, T, sy, H);
    else cu_matmul(c->st, s2, sg, I, T, sy, H);
    cu_moe_combine(c->st, ys, wt, ord, T, K, H, sy, a->out);
    launched(c, "moe shared");
}

// ---- collectives ----

static void cu_allreduce(backend *b, float *buf, size_t n)
{
    cu_impl *c = enter(b);
    if (c->nranks == 1 || !n || recording(c)) return;
    if (c->ar.tp > 1 && n <= c->ar.cap && n % 4 == 0 && !((uintptr_t)buf & 15)) {
        cu_allreduce_oneshot(c->st, buf, n, c->ar);
    } else {
        ncclResult_t r = ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, c->comm, c->st);
        if (r != ncclSuccess) fail(c, "ncclAllReduce: %s", ncclGetErrorString(r));
    }
    launched(c, "allreduce");
}

static void cu_gather_cols(backend *b, const float *part, int rows, int nv, float *out, int ldo,
                           int v0)
{
    cu_impl *c = enter(b);
    if (rows > 0 && nv > 0)
        CK(c, cudaMemcpy2DAsync(out + v0, ldo * sizeof(float), part, nv * sizeof(float),
                                nv * sizeof(float), rows, cudaMemcpyDeviceToHost, c->st));
    CK(c, cudaStreamSynchronize(c->st));
    launched(c, "gather_cols");
    if (c->profile) prof_flush(c);
}

// ---- graph replay ----

static void graph_drop(graph_ent *e)
{
    if (e->exec) cudaGraphExecDestroy(e->exec);
    *e = graph_ent{};
}

static void arena_free(cu_impl *c)
{
    if (c->arena_h) cudaFreeHost(c->arena_h);
    if (c->arena_d) cudaFree(c->arena_d);
    c->arena_h = c->arena_d = NULL;
    c->arena_cap = 0;
}

// Outside any capture; every graph holds the old arena's address.
static void arena_grow(cu_impl *c, size_t bytes)
{
    CK(c, cudaStreamSynchronize(c->st));
    arena_free(c);
    c->gen++;
    CK(c, cudaMallocHost(&c->arena_h, bytes));
    CK(c, cudaMalloc(&c->arena_d, bytes));
    if (!c->failed) c->arena_cap = bytes;
}

static void cu_graph_begin(backend *b, uint64_t key)
{
    cu_impl *c = enter(b);
    c->gmode = G_OFF;
    if (!c->graphs || c->failed) return;
    graph_ent *e = NULL, *lru = &c->graph[0];
    for (int i = 0; i < NGRAPH && !e; i++) {
        if (c->graph[i].used && c->graph[i].key == key) e = &c->graph[i];
        else if (c->graph[i].used < lru->used) lru = &c->graph[i];
    }
    if (!e) {
        e = lru;
        graph_drop(e);
        e->key = key;
    }
    e->used = ++c->gtick;
    if (e->exec && e->gen != c->gen) {
        cudaGraphExecDestroy(e->exec);
        e->exec = NULL;
    }
    c->gcur = e;
    c->nput = 0;
    c->arena_len = 0;
    c->gbad = false;
    if (e->exec) {
        c->gmode = G_RECORD;
    } else if (e->warm && e->warm_gen == c->gen) {
        CK(c, cudaStreamBeginCapture(c->st, cudaStreamCaptureModeThreadLocal));
        c->gmode = c->failed ? G_OFF : G_CAPTURE;
    } else {
        c->gmode = G_WARM;
    }
}

static void graph_launch(cu_impl *c, graph_ent *e)
{
    CK(c, cudaMemcpyAsync(c->arena_d, c->arena_h, c->arena_len, cudaMemcpyHostToDevice, c->st));
    CK(c, cudaGraphLaunch(e->exec, c->st));
}

static bool cu_graph_end(backend *b)
{
    cu_impl *c = enter(b);
    graph_ent *e = c->gcur;
    int mode = c->gmode;
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

static void cu_graph_counts(backend *b, long long *captures, long long *replays)
{
    cu_impl *c = impl(b);
    *captures = c->ncaptures;
    *replays = c->nreplays;
}

static void cu_destroy(backend *b)
{
    cu_impl *c = enter(b);
    cudaStreamSynchronize(c->st);
    if (c->profile) {
        prof_flush(c);
        print_profile(c);
        for (int i = 0; i < 2 * NSPAN; i++) cudaEventDestroy(c->spans[i]);
        free(c->spans);
    }
    for (int i = 0; i < NGRAPH; i++) graph_drop(&c->graph[i]);
    arena_free(c);
    grow_buf *bufs[] = { &c->sc, &c->idx, &c->wt, &c->ord, &c->perm, &c->tiles, &c->ntiles,
                         &c->g, &c->u, &c->ys, &c->sg, &c->su, &c->sy, &c->iscores, &c->ikeys, &c->wdeq, &c->hcm,
                         &c->apart, &c->offs, &c->xs, &c->yss, &c->xbf };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]->p) cudaFreeAsync(bufs[i]->p, c->st);
    for (int i = 0; i < NSTAGE; i++) {
        if (c->stage[i].host) cudaFreeHost(c->stage[i].host);
        if (c->stage[i].dev) cudaFreeAsync(c->stage[i].dev, c->st);
        cudaEventDestroy(c->stage[i].ev);
    }
    cudaStreamSynchronize(c->st);
    if (c->lt_ws) cudaFree(c->lt_ws);
    if (c->lt_op) cublasLtMatmulDescDestroy(c->lt_op);
    if (c->lt) cublasLtDestroy(c->lt);
    for (size_t i = 0; i < c->nowned; i++) cudaFree(c->owned[i]);
    for (size_t i = 0; i < c->ndescs; i++) free(c->descs[i]);
    free(c->owned);
    free(c->descs);
    if (c->comm) ncclCommDestroy(c->comm);
    if (c->ar_mem) cudaFree(c->ar_mem);
    cudaStreamDestroy(c->st);
    free(c);
    free(b);
}

// Every GEMM: float32 accumulation (no TF32 for float32 operands),
// W' transposed (lt_gemm).
static bool lt_op_new(cu_impl *c)
{
    bool ok = true;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    LTK(cublasLtMatmulDescCreate(&c->lt_op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LTK(cublasLtMatmulDescSetAttribute(c->lt_op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LTK(cublasLtMatmulDescSetAttribute(c->lt_op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    return ok;
}

static backend *cu_new(int dev, int rank, int nranks, const backend_modes *modes, char *err,
                       size_t errlen)
{
    if (cudaSetDevice(dev) != cudaSuccess) {
        snprintf(err, errlen, "cannot use CUDA device %d: %s", dev,
                 cudaGetErrorString(cudaGetLastError()));
        return NULL;
    }
    cu_impl *c = (cu_impl *)calloc(1, sizeof *c);
    c->dev = dev;
    c->rank = rank;
    c->nranks = nranks;
    CK(c, cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking));
    for (int i = 0; i < NSTAGE; i++)
        CK(c, cudaEventCreateWithFlags(&c->stage[i].ev, cudaEventDisableTiming));
    if (cublasLtCreate(&c->lt) != CUBLAS_STATUS_SUCCESS) fail(c, "cuBLASLt: cannot create a handle");
    CK(c, cudaMalloc(&c->lt_ws, LT_WS_BYTES));
    lt_op_new(c);
    // Output-changing modes come from the recipe (and its LLM_CUDA_*
    // overrides, applied by the model loader): they are in the fingerprint.
    c->gemm = modes->gemm;
    c->moe_lt = modes->moe == BACKEND_MOE_CUBLASLT;
    c->attn_tokens = modes->attn_tokens;
    if (c->gemm < 0 || c->gemm >= BACKEND_GEMM_N)
        fail(c, "gemm_mode %d: unknown", c->gemm);
    if (c->attn_tokens < 1 || c->attn_tokens > BACKEND_ATTN_TOKENS_MAX)
        fail(c, "attn_tokens %d: expected 1 to %d", c->attn_tokens, BACKEND_ATTN_TOKENS_MAX);
    const char *pe = getenv("LLM_CUDA_PROFILE"), *ge = getenv("LLM_CUDA_GRAPHS");
    c->profile = pe && *pe && strcmp(pe, "0");
    if (c->profile) {
        c->spans = (cudaEvent_t *)calloc(2 * NSPAN, sizeof *c->spans);
        for (int i = 0; i < 2 * NSPAN; i++) CK(c, cudaEventCreate(&c->spans[i]));
    }
    // Profiling waits for every op: no graphs then.
    c->graphs = !c->profile && !(ge && !strcmp(ge, "0"));
    if (c->graphs) arena_grow(c, ARENA_BYTES);
    if (c->failed) {
        snprintf(err, errlen, "%s", c->err);
        free(c);
        return NULL;
    }
    backend *b = (backend *)calloc(1, sizeof *b);
    b->name = "cuda";
    b->impl = c;
    b->alloc = cu_alloc;
    b->release = cu_release;
    b->copy_rows = cu_copy_rows;
    b->write = cu_write;
    b->read = cu_read;
    b->upload_weights = cu_upload_weights;
    b->upload = cu_upload;
    b->error = cu_error;
    b->mem_info = cu_mem_info;
    b->matmul = cu_matmul_op;
    b->embed = cu_embed_op;
    b->rmsnorm = cu_rmsnorm_op;
    b->rope = cu_rope_op;
    b->scale = cu_scale_op;
    b->hc_pre = cu_hc_pre_op;
    b->hc_post = cu_hc_post_op;
    b->hc_head = cu_hc_head_op;
    b->compress = cu_compress_op;
    b->indexer = cu_indexer_op;
    b->attention = cu_attention_op;
    b->ring_store = cu_ring_store_op;
    b->kv_round = cu_kv_round_op;
    b->moe = cu_moe_op;
    b->allreduce = cu_allreduce;
    b->gather_cols = cu_gather_cols;
    b->graph_begin = cu_graph_begin;
    b->graph_end = cu_graph_end;
    b->graph_counts = cu_graph_counts;
    b->destroy = cu_destroy;
    return b;
}

// Sums of up to AR_CAP floats (decode; batches up to 64 tokens) go
// through the one-shot all-reduce when every pair of devices has peer
// access; larger ones, or without peer access, through NCCL.
#define AR_CAP (256u << 10)

static void oneshot_setup(backend **out, int tp)
{
    size_t inbox = 2ull * tp * AR_CAP * sizeof(float);
    size_t flags = 2ull * AR_MAX_BLOCKS * AR_MAX_RANKS * sizeof(unsigned);
    size_t bytes = inbox + flags + AR_MAX_BLOCKS * sizeof(unsigned);
    for (int r = 0; r < tp; r++) {
        cudaSetDevice(r);
        for (int p = 0; p < tp; p++) {
            int can = 0;
            if (p == r) continue;
            if (cudaDeviceCanAccessPeer(&can, r, p) != cudaSuccess || !can) goto nopeer;
            cudaError_t e = cudaDeviceEnablePeerAccess(p, 0);
            if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
            else if (e != cudaSuccess) goto nopeer;
        }
        cu_impl *c = impl(out[r]);
        if (cudaMalloc(&c->ar_mem, bytes) != cudaSuccess ||
            cudaMemset(c->ar_mem, 0, bytes) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess)
            goto nopeer;
    }
    for (int r = 0; r < tp; r++) {
        cu_impl *c = impl(out[r]);
        c->ar.rank = r;
        c->ar.cap = AR_CAP;
        for (int p = 0; p < tp; p++) {
            char *m = (char *)impl(out[p])->ar_mem;
            c->ar.inbox[p] = (float *)m;
            c->ar.flags[p] = (unsigned *)(m + inbox);
        }
        c->ar.epoch = (unsigned *)((char *)c->ar_mem + inbox + flags);
    }
    for (int r = 0; r < tp; r++) impl(out[r])->ar.tp = tp;    // ready
    return;
nopeer:
    cudaGetLastError();
    fprintf(stderr, "llm-engine: no peer access between the CUDA devices: all-reduces go "
            "through NCCL only\n");
}

extern "C" int backend_cuda_new_group(int tp, const backend_modes *modes, backend **out, char *err,
                                      size_t errlen)
{
    // Never NVLink multicast (NVLS): it can take a shared host's GPUs down.
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    // All-reduces captured in graphs use NCCL's own buffers, as eager
    // ones do (no registration of the stream-ordered scratch).
    setenv("NCCL_GRAPH_REGISTER", "0", 0);
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        cudaGetLastError();
        snprintf(err, errlen, "no CUDA device visible");
        return -1;
    }
    if (tp > ndev) {
        snprintf(err, errlen, "--tp %d needs %d CUDA devices, %d visible", tp, tp, ndev);
        return -1;
    }
    for (int r = 0; r < tp; r++) {
        out[r] = cu_new(r, r, tp, modes, err, errlen);
        if (!out[r]) {
            for (int j = 0; j < r; j++) out[j]->destroy(out[j]);
            return -1;
        }
    }
    if (tp > 1) {
        ncclComm_t comms[64];
        int devs[64];
        for (int r = 0; r < tp; r++) devs[r] = r;
        ncclResult_t rc = ncclCommInitAll(comms, tp, devs);
        if (rc != ncclSuccess) {
            snprintf(err, errlen, "NCCL init over %d devices: %s", tp, ncclGetErrorString(rc));
            for (int r = 0; r < tp; r++) out[r]->destroy(out[r]);
            return -1;
        }
        for (int r = 0; r < tp; r++) impl(out[r])->comm = comms[r];
        const char *ae = getenv("LLM_CUDA_ALLREDUCE");
        if (!(ae && !strcmp(ae, "nccl")) && tp <= AR_MAX_RANKS) oneshot_setup(out, tp);
    }
    return 0;
}
