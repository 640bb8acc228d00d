// One-shot all-reduce over peer memory (NVLink) for the small sums of
// decode: each rank writes its buffer into every peer's inbox, raises a
// flag there, waits for the peers' flags in its own memory and adds the
// inboxes up.  One kernel, no host involvement, so it is captured in
// decode graphs like any other op.  NCCL's ring all-reduce needs several
// round trips and costs ~10 us at 8-16 KB; this needs one.
//
// Every block owns a slice of the buffer and its own flags and epoch
// counter: a block's launch number is its epoch, the same on every rank
// because every rank runs the same all-reduces in the same order.  Inboxes
// are double-buffered by the epoch's parity: a peer can be at most one
// all-reduce ahead (it needs this rank's flag for the next one, raised
// only after this rank has read the current inbox).
#include "kernels.cuh"

__device__ __forceinline__ void flag_release(unsigned *p, unsigned v)
{
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ unsigned flag_acquire(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ unsigned long long global_ns()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Inbox of rank `to` for the data of rank `from`, parity `par`.
__device__ __forceinline__ float *inbox(const ar_peers &P, int to, int par, int from)
{
    return P.inbox[to] + ((size_t)par * P.tp + from) * P.cap;
}

__device__ __forceinline__ unsigned *flag(const ar_peers &P, int to, int par, int block, int from)
{
    return P.flags[to] + ((size_t)par * AR_MAX_BLOCKS + block) * AR_MAX_RANKS + from;
}

__global__ void __launch_bounds__(512) oneshot_allreduce_kernel(float *buf, long long n, ar_peers P)
{
    __shared__ unsigned ep;
    const int me = P.rank, b = blockIdx.x;
    if (threadIdx.x == 0) ep = ++P.epoch[b];
    __syncthreads();
    const int par = ep & 1;
    // This block's slice, in whole float4s (n is a multiple of 4 here).
    long long per = (n / 4 + gridDim.x - 1) / gridDim.x * 4;
    long long lo = b * per, hi = lo + per < n ? lo + per : n;
    for (int to = 0; to < P.tp; to++) {
        if (to == me) continue;
        float4 *dst = (float4 *)inbox(P, to, par, me);
        for (long long i = lo / 4 + threadIdx.x; i < hi / 4; i += blockDim.x)
            dst[i] = ((const float4 *)buf)[i];
    }
    __syncthreads();
    int peer = threadIdx.x;
    if (peer < P.tp && peer != me) {
        flag_release(flag(P, peer, par, b, me), ep);
        const unsigned *f = flag(P, me, par, b, peer);
        unsigned long long t0 = global_ns();
        // A peer that never comes (its process failed mid-step) must not
        // hang this GPU forever: give up after 60 s with a kernel error.
        while (flag_acquire(f) != ep)
            if (global_ns() - t0 > 60000000000ull) __trap();
    }
    __syncthreads();
    // Sum in rank order, so that every rank gets the same bits.
    for (long long i = lo / 4 + threadIdx.x; i < hi / 4; i += blockDim.x) {
        float4 s = me == 0 ? ((const float4 *)buf)[i] : ((const float4 *)inbox(P, me, par, 0))[i];
        for (int r = 1; r < P.tp; r++) {
            float4 v = r == me ? ((const float4 *)buf)[i] : ((const float4 *)inbox(P, me, par, r))[i];
            s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
        }
        ((float4 *)buf)[i] = s;
    }
}

void cu_allreduce_oneshot(cudaStream_t st, float *buf, size_t n, const ar_peers &P)
{
    if (!n) return;
    // About 4 KB per block: enough blocks to spread NVLink traffic, few
    // enough that the flag round trips stay cheap.
    int blocks = (int)((n + 1023) / 1024);
    if (blocks > AR_MAX_BLOCKS) blocks = AR_MAX_BLOCKS;
    oneshot_allreduce_kernel<<<blocks, 512, 0, st>>>(buf, (long long)n, P);
}
