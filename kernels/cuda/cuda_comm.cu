// Collectives: the all-reduce op (one-shot over peer memory, else NCCL)
// and the group's setup (NCCL communicators, peer access).
#include "backend_cuda.cuh"

void cu_allreduce(backend *b, float *buf, size_t n)
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

extern "C" int backend_cuda_new_group(int tp, backend **out, char *err, size_t errlen)
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
        out[r] = cu_new(r, r, tp, err, errlen);
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
