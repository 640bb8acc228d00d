// Weights into L2 ahead of the kernels that read them (backend.h
// prefetch).  A decode step alternates kernels that stream weights at
// memory speed with latency-bound ones (the mHC, qk_prep, the
// compressors, the indexer, attention) that leave HBM nearly idle; the
// weights depend on nothing, so a second stream brings the next matmuls'
// bytes into L2 while those run (cp.async.bulk.prefetch.L2: fire and
// forget; nothing waits for it, no result depends on it).  Also
// side_scope (backend_cuda.cuh): ops of an op on a second stream beside
// the main one, joined before the op ends.
#include "backend_cuda.cuh"

#define PF_MAX 32               // byte ranges a prefetch launch takes
#define PF_CHUNK 16384u         // bytes a bulk prefetch instruction asks for
#define PF_BLOCKS 64            // one warp each: spread over SMs' copy engines

struct pf_list {
    const char *p[PF_MAX];
    unsigned long long n[PF_MAX];
    int k;
};

__global__ void prefetch_kernel(const __grid_constant__ pf_list r)
{
    unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x, stride = gridDim.x * blockDim.x;
    for (int m = 0; m < r.k; m++) {
        unsigned long long chunks = (r.n[m] + PF_CHUNK - 1) / PF_CHUNK;
        for (unsigned long long j = i; j < chunks; j += stride) {
            unsigned long long o = j * PF_CHUNK, left = r.n[m] - o;
            unsigned len = left < PF_CHUNK ? (unsigned)left : PF_CHUNK;
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(r.p[m] + o), "r"(len)
                         : "memory");
        }
    }
}

// [p, p + n) as whole 16-byte units inside it (the instruction's unit).
static void pf_add(pf_list *l, const uint8_t *p, unsigned long long n)
{
    uintptr_t a = ((uintptr_t)p + 15) & ~(uintptr_t)15, e = ((uintptr_t)p + n) & ~(uintptr_t)15;
    if (e <= a || l->k == PF_MAX) return;
    l->p[l->k] = (const char *)a;
    l->n[l->k++] = e - a;
}

// The bytes a view's rows occupy in its device copy: data rows [r0, r0 +
// rows) whole (columns outside a column view too), and their scales.
static void pf_view(pf_list *l, const dqw &q)
{
    int bits = q.type == QT_F32 ? 32 : q.type == QT_BF16 ? 16 : q.type == QT_FP8 ? 8 : 4;
    unsigned long long row = (unsigned long long)q.ld * bits / 8;
    pf_add(l, q.data + (unsigned long long)q.r0 * row, (unsigned long long)q.rows * row);
    if (q.type == QT_FP8 && q.scale) {
        int b0 = q.r0 / 128, b1 = (q.r0 + q.rows + 127) / 128;
        pf_add(l, q.scale + (unsigned long long)b0 * q.sld, (unsigned long long)(b1 - b0) * q.sld);
    } else if (q.type == QT_MXFP4 && q.scale) {
        pf_add(l, q.scale + (unsigned long long)q.r0 * q.sld, (unsigned long long)q.rows * q.sld);
    }
}

void cu_prefetch_op(backend *b, const qweight *const *w, int n)
{
    cu_impl *c = enter(b);
    if (!c->prefetch || c->failed || recording(c)) {
        launched(c, "prefetch");
        return;
    }
    pf_list l = {};
    for (int i = 0; i < n; i++) {
        dqw q;
        if (w[i]->dev && w[i]->rows > 0 && to_dqw(c, w[i], &q)) pf_view(&l, q);
    }
    // After the ops issued so far (so the bytes arrive as the next ones
    // run, not a whole step early), beside the ones issued next.
    if (!fork_from(c, c->pf)) return;
    prefetch_kernel<<<PF_BLOCKS, 32, 0, c->pf.s>>>(l);
    CK(c, cudaGetLastError());
    c->pf_pending = true;
    launched(c, "prefetch");
}

// The prefetch stream back into the compute stream: a graph capture ends
// only with every stream it forked joined.
void cu_prefetch_join(cu_impl *c)
{
    if (!c->pf_pending) return;
    fork_end(c, c->pf);
    fork_wait(c, c->pf);
    c->pf_pending = false;
}

bool fork_from(cu_impl *c, cu_fork &f)
{
    if (!f.s) {
        CK(c, cudaStreamCreateWithFlags(&f.s, cudaStreamNonBlocking));
        CK(c, cudaEventCreateWithFlags(&f.ev[0], cudaEventDisableTiming));
        CK(c, cudaEventCreateWithFlags(&f.ev[1], cudaEventDisableTiming));
        if (c->failed) return false;
    }
    CK(c, cudaEventRecord(f.ev[0], c->st));
    CK(c, cudaStreamWaitEvent(f.s, f.ev[0], 0));
    return !c->failed;
}

void fork_end(cu_impl *c, cu_fork &f) { CK(c, cudaEventRecord(f.ev[1], f.s)); }

void fork_wait(cu_impl *c, cu_fork &f) { CK(c, cudaStreamWaitEvent(c->st, f.ev[1], 0)); }

void fork_free(cu_fork &f)
{
    if (!f.s) return;
    cudaStreamSynchronize(f.s);
    cudaStreamDestroy(f.s);
    cudaEventDestroy(f.ev[0]);
    cudaEventDestroy(f.ev[1]);
}

// c->st onto the side stream, forked after the ops issued so far; *main:
// the stream side_back returns to.
static bool side_fork(cu_impl *c, cudaStream_t *main)
{
    if (!fork_from(c, c->side)) return false;
    *main = c->st;
    c->st = c->side.s;
    return true;
}

static void side_back(cu_impl *c, cudaStream_t main)
{
    fork_end(c, c->side);
    c->st = main;
}

side_scope::side_scope(cu_impl *c_, bool want) : c(c_), on(false)
{
    on = want && !c->failed && side_fork(c, &main);
}

void side_scope::end()
{
    if (!on || ended) return;
    side_back(c, main);
    ended = true;
}

void side_scope::join()
{
    if (!on || joined) return;
    end();
    fork_wait(c, c->side);
    joined = true;
}

// backend.h side_begin: only in graphs (captured, or replayed: the same
// op order both ways) and for decode steps of up to SIDE_MAX_T tokens,
// whose matmuls are GEMVs with no scratch (eager steps also reuse the
// staging buffers, ordered on one stream only); recording a replay
// launches nothing, so it forks nothing.
#define SIDE_MAX_T 8
bool cu_side_begin(backend *b, int T)
{
    cu_impl *c = enter(b);
    if (!c->attn_side || c->failed || c->profile || !in_graph(c) || T > SIDE_MAX_T || c->side_on)
        return false;
    if (!recording(c) && !side_fork(c, &c->side_main)) return false;
    c->side_on = true;
    return true;
}

void cu_side_end(backend *b)
{
    cu_impl *c = enter(b);
    if (!c->side_on) return;
    if (!recording(c)) side_back(c, c->side_main);
    c->side_on = false;
}

void cu_side_join(backend *b)
{
    cu_impl *c = enter(b);
    if (!recording(c)) fork_wait(c, c->side);
}
