// Weights into L2 ahead of the kernels that read them (backend.h
// prefetch).  A decode step alternates kernels that stream weights at
// memory speed with latency-bound ones (the mHC, qk_prep, the
// compressors, the indexer, attention) that leave HBM nearly idle; the
// weights depend on nothing, so a second stream brings the next matmuls'
// bytes into L2 while those run (cp.async.bulk.prefetch.L2: fire and
// forget; nothing waits for it, no result depends on it).
#include "backend_cuda.cuh"

#define PF_MAX 32               // byte ranges a prefetch launch takes
#define PF_BLOCKS 64            // one warp each: spread over SMs' copy engines

struct pf_list {
    const uint8_t *p[PF_MAX];
    unsigned long long n[PF_MAX];
    int k;
};

__global__ void prefetch_kernel(const __grid_constant__ pf_list r)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x, k = gridDim.x * blockDim.x;
    for (int m = 0; m < r.k; m++) l2_prefetch(r.p[m], r.n[m], i, k);
}

// [p, p + n) (l2_prefetch takes the whole 16-byte units inside it).
static void pf_add(pf_list *l, const uint8_t *p, unsigned long long n)
{
    if (!n || l->k == PF_MAX) return;
    l->p[l->k] = p;
    l->n[l->k++] = n;
}

// The bytes a view's rows occupy in its device copy, and their scales.
static void pf_view(pf_list *l, const dqw &q)
{
    const uint8_t *d, *s;
    unsigned long long dn, sn;
    dqw_row_bytes(q, 0, 0, q.rows, &d, &dn, &s, &sn);
    pf_add(l, d, dn);
    if (sn) pf_add(l, s, sn);
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
    if (!c->pst) {
        CK(c, cudaStreamCreateWithFlags(&c->pst, cudaStreamNonBlocking));
        CK(c, cudaEventCreateWithFlags(&c->pf_ev[0], cudaEventDisableTiming));
        CK(c, cudaEventCreateWithFlags(&c->pf_ev[1], cudaEventDisableTiming));
        if (c->failed) return;
    }
    // After the ops issued so far (so the bytes arrive as the next ones
    // run, not a whole step early), beside the ones issued next.
    CK(c, cudaEventRecord(c->pf_ev[0], c->st));
    CK(c, cudaStreamWaitEvent(c->pst, c->pf_ev[0], 0));
    prefetch_kernel<<<PF_BLOCKS, 32, 0, c->pst>>>(l);
    CK(c, cudaGetLastError());
    c->pf_pending = true;
    launched(c, "prefetch");
}

// The prefetch stream back into the compute stream: a graph capture ends
// only with every stream it forked joined.
void cu_prefetch_join(cu_impl *c)
{
    if (!c->pf_pending) return;
    CK(c, cudaEventRecord(c->pf_ev[1], c->pst));
    CK(c, cudaStreamWaitEvent(c->st, c->pf_ev[1], 0));
    c->pf_pending = false;
}
