// LLM_CUDA_PROFILE: spans of ops timed by events (backend_cuda.cuh).
#include "backend_cuda.cuh"

// Every op starts here: this thread works on the rank's device.
cu_impl *enter(backend *b)
{
    cu_impl *c = impl(b);
    CK(c, cudaSetDevice(c->dev));
    if (c->profile) CK(c, cudaEventRecord(c->spans[2 * c->nspan], c->st));
    return c;
}

// Add the finished spans to the totals.
void prof_flush(cu_impl *c)
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
void launched(cu_impl *c, const char *op)
{
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) fail(c, "%s: %s", op, cudaGetErrorString(e));
    if (!c->profile) return;
    CK(c, cudaEventRecord(c->spans[2 * c->nspan + 1], c->st));
    c->span_op[c->nspan] = op;
    if (++c->nspan == NSPAN) prof_flush(c);
}

// Profiles: the launches so far are phase `op` of the op; a new span starts.
void phase(cu_impl *c, const char *op)
{
    launched(c, op);
    if (c->profile) CK(c, cudaEventRecord(c->spans[2 * c->nspan], c->st));
}

void print_profile(cu_impl *c)
{
    double total = 0;
    for (int i = 0; i < NPROF && c->prof[i].op; i++) total += c->prof[i].ms;
    fprintf(stderr, "cuda profile, device %d (%s prefill GEMMs): %.1f ms in ops\n", c->dev,
            gemm_names[c->gemm], total);
    for (int i = 0; i < NPROF && c->prof[i].op; i++)
        fprintf(stderr, "  %-18s %8lld calls %10.1f ms %5.1f%%\n", c->prof[i].op,
                c->prof[i].calls, c->prof[i].ms, 100 * c->prof[i].ms / (total > 0 ? total : 1));
    fprintf(stderr, "  host time queuing the expert GEMMs: %.1f ms\n", c->expert_host_ms);
}
