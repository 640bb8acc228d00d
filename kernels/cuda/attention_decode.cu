// Attention of decode steps (a few query tokens, or a batch of one-token
// sequences) in one launch: float32 math as attention.cu's kernel (the
// same products and the sink in the denominator; sums in another order),
// laid out for latency.  kernels/cpu/backend_cpu.c is the reference.
//
// Block (split z, group of ATTD_HPB heads, token): the split's keys in
// tiles of ATTD_KT, each tile's loads issued together (16 bytes a load;
// the key references resolved by the loading threads themselves),
// decoded once into shared
// memory for the group's heads; the queries in registers (a warp per key,
// lanes over channels), an online softmax (a warp per head), P.K with the
// four heads' probabilities as one float4 (threads over channel quads and
// key parities, added in parity order at the end).  With several splits
// each block writes its partial (max, sum, unnormalized output) and the
// block of a (token, group) that finishes last (counter in `count`, reset
// by that block for the next launch) merges them with the sink: one
// launch per op instead of attention + combine.
#include "attention_keys.cuh"

#define ATTD_HPB 4          // heads per block (the float4 of probabilities)
#define ATTD_KT 32          // keys per tile (a lane per key in the softmax)
#define ATTD_QV 4           // float4s of a head's query per lane: head_dim <= 512
#define ATTD_U 4            // loads in flight per thread while staging a tile
#define ATTD_THREADS 256

static_assert(ATTD_HPB == 4, "probabilities and accumulators are float4s over the group's heads");

__device__ __forceinline__ float4 f4_fma(float s, float4 k, float4 a)
{
    return make_float4(fmaf(s, k.x, a.x), fmaf(s, k.y, a.y), fmaf(s, k.z, a.z), fmaf(s, k.w, a.w));
}

__device__ __forceinline__ float4 ld4(const float *p)
{
    if (((uintptr_t)p & 15) == 0) return *(const float4 *)p;
    return make_float4(p[0], p[1], p[2], p[3]);
}

__device__ __forceinline__ void st4(float *p, float4 v)
{
    if (((uintptr_t)p & 15) == 0) *(float4 *)p = v;
    else p[0] = v.x, p[1] = v.y, p[2] = v.z, p[3] = v.w;
}

// Shared memory before the logits: a tile of keys, later the parities'
// accumulators.
__host__ __device__ __forceinline__ int attd_scratch_floats(int hd)
{
    return ATTD_KT * hd > 4 * ATTD_HPB * ATTD_THREADS ? ATTD_KT * hd : 4 * ATTD_HPB * ATTD_THREADS;
}

__global__ void __launch_bounds__(ATTD_THREADS, 2) attention_decode_kernel(dattn a, int chunk,
                                                                        float *part, int *count,
                                                                        const dattn *segs)
{
    pdl_wait();
    extern __shared__ __align__(16) float sm[];
    __shared__ float mrun[ATTD_HPB], lrun[ATTD_HPB], resc[ATTD_HPB], msum[ATTD_HPB];
    __shared__ float wts[ATTD_HPB][ATTN_MAX_SPLITS];
    int tok = blockIdx.z, i = tok;
    if (segs) a = segs[tok], i = 0;     // the one token of sequence tok
    if (a.dyn) a.pos0 = a.dyn->pos0, a.ring = (const char *)a.dyn->ptr;
    const int hd = a.hd, nq = hd / 4, h0 = blockIdx.y * ATTD_HPB;
    const int nh = min(ATTD_HPB, a.nheads - h0), splits = gridDim.x;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = ATTD_THREADS / 32;
    float *kt = sm;
    float4 *lg = (float4 *)(sm + attd_scratch_floats(hd));     // [ATTD_KT] heads' logits
    int nk;
    attn_keys K = attn_keys_of(a, i, &nk);

    // The group's queries, lane's channels (v * 32 + lane) * 4.
    float4 qr[ATTD_HPB][ATTD_QV];
    const float *q = a.q + ((long long)i * a.nheads + h0) * hd;
#pragma unroll
    for (int hh = 0; hh < ATTD_HPB; hh++)
#pragma unroll
        for (int v = 0; v < ATTD_QV; v++) {
            int c = (v * 32 + lane) * 4;
            qr[hh][v] = hh < nh && c < hd ? ld4(q + (long long)hh * hd + c)
                                          : make_float4(0, 0, 0, 0);
        }
    if (tid < ATTD_HPB) mrun[tid] = -INFINITY, lrun[tid] = 0;

    // P.K: thread (parity kp, channel quad cq).
    const int kpar = ATTD_THREADS / nq, kp = tid / nq, cq = tid % nq;
    float4 acc[ATTD_HPB];
#pragma unroll
    for (int hh = 0; hh < ATTD_HPB; hh++) acc[hh] = make_float4(0, 0, 0, 0);

    int j1 = min(nk, (int)(blockIdx.x + 1) * chunk);
    for (int t0 = blockIdx.x * chunk; t0 < j1; t0 += ATTD_KT) {
        int tn = min(ATTD_KT, j1 - t0);
        stage_keys<ATTD_U, ATTD_THREADS>([&](int j) { return K.key(t0 + j); }, a.ring_t, tn, hd,
                                         hd, kt);
        __syncthreads();
        for (int j = warp; j < tn; j += nw) {
            const float *k = kt + (long long)j * hd;
            float d[ATTD_HPB] = {};
#pragma unroll
            for (int v = 0; v < ATTD_QV; v++) {
                int c = (v * 32 + lane) * 4;
                if (c >= hd) break;
                float4 kc = *(const float4 *)(k + c);
#pragma unroll
                for (int hh = 0; hh < ATTD_HPB; hh++)
                    d[hh] += qr[hh][v].x * kc.x + qr[hh][v].y * kc.y + qr[hh][v].z * kc.z +
                             qr[hh][v].w * kc.w;
            }
#pragma unroll
            for (int hh = 0; hh < ATTD_HPB; hh++) d[hh] = warp_sum(d[hh]) * a.scale;
            if (lane == 0) lg[j] = make_float4(d[0], d[1], d[2], d[3]);
        }
        __syncthreads();
        if (warp < ATTD_HPB) {
            float *l = (float *)lg + warp;
            float x = lane < tn ? l[lane * ATTD_HPB] : -INFINITY;
            float mold = mrun[warp], mnew = fmaxf(mold, warp_max(x));
            float p = lane < tn ? expf(x - mnew) : 0.0f;
            if (lane < tn) l[lane * ATTD_HPB] = p;
            float sum = warp_sum(p);
            if (lane == 0)
                softmax_state_update(&lrun[warp], &mrun[warp], &resc[warp], mold, mnew, sum);
        }
        __syncthreads();
        if (kp < kpar) {
#pragma unroll
            for (int hh = 0; hh < ATTD_HPB; hh++) {
                float r = resc[hh];
                acc[hh] = make_float4(acc[hh].x * r, acc[hh].y * r, acc[hh].z * r, acc[hh].w * r);
            }
            for (int j = kp; j < tn; j += kpar) {
                float4 kc = *(const float4 *)(kt + (long long)j * hd + cq * 4), p = lg[j];
                acc[0] = f4_fma(p.x, kc, acc[0]);
                acc[1] = f4_fma(p.y, kc, acc[1]);
                acc[2] = f4_fma(p.z, kc, acc[2]);
                acc[3] = f4_fma(p.w, kc, acc[3]);
            }
        }
        __syncthreads();
    }

    if (a.store_ring && blockIdx.x == 0 && blockIdx.y == 0) attn_store_ring(a, i);

    // The parities' accumulators added in parity order: kt[kp][hh][hd].
    float4 *red = (float4 *)kt;
    if (kp < kpar)
#pragma unroll
        for (int hh = 0; hh < ATTD_HPB; hh++) red[((long long)kp * ATTD_HPB + hh) * nq + cq] = acc[hh];
    __syncthreads();
    float4 o[2];        // units x = tid, tid + 256 of [ATTD_HPB][nq] (nq <= 128)
#pragma unroll
    for (int u = 0; u < 2; u++) {
        int x = tid + u * ATTD_THREADS;
        o[u] = make_float4(0, 0, 0, 0);
        if (x >= ATTD_HPB * nq) continue;
        for (int p = 0; p < kpar; p++) {
            float4 v = red[(long long)p * ATTD_HPB * nq + x];
            o[u].x += v.x, o[u].y += v.y, o[u].z += v.z, o[u].w += v.w;
        }
    }

    float *out = a.out + ((long long)i * a.nheads + h0) * hd;
    if (splits == 1) {
#pragma unroll
        for (int u = 0; u < 2; u++) {
            int x = tid + u * ATTD_THREADS, hh = x / nq;
            if (x >= ATTD_HPB * nq || hh >= nh) continue;
            float sink = a.sinks[h0 + hh], mr = mrun[hh], m = fmaxf(mr, sink);
            float f = expf(mr - m) / (lrun[hh] * expf(mr - m) + expf(sink - m));
            st4(out + (long long)hh * hd + x % nq * 4,
                attn_rope4(a.orope, hd, a.pos0 + i, x % nq * 4,
                           make_float4(o[u].x * f, o[u].y * f, o[u].z * f, o[u].w * f)));
        }
        return;
    }

    // Partials: outputs [token][head][split][hd], then (max, sum) pairs
    // [token][head][split][2].
    long long rows = (long long)gridDim.z * a.nheads * splits;
    float *pml = part + rows * hd;
    long long row0 = ((long long)tok * a.nheads + h0) * splits + blockIdx.x;
#pragma unroll
    for (int u = 0; u < 2; u++) {
        int x = tid + u * ATTD_THREADS, hh = x / nq;
        if (x >= ATTD_HPB * nq || hh >= nh) continue;
        *(float4 *)(part + (row0 + (long long)hh * splits) * hd + x % nq * 4) = o[u];
    }
    if (tid < nh) {
        pml[(row0 + (long long)tid * splits) * 2] = mrun[tid];
        pml[(row0 + (long long)tid * splits) * 2 + 1] = lrun[tid];
    }
    if (!attn_last_split(count + (long long)tok * gridDim.y + blockIdx.y, splits)) return;

    // The merge (attention_combine_kernel's operations).
    attn_merge_splits<ATTD_THREADS>(part, pml, ((long long)tok * a.nheads + h0) * splits, nh,
                                    splits, hd, hd, a.sinks + h0, out, &wts[0][0], msum, a.orope,
                                    a.pos0 + i, 0);
}

bool cu_attention_decode_fits(const dattn &a)
{
    return a.n >= 1 && a.n <= CU_ATTD_MAX_T && a.hd >= 16 && a.hd % 16 == 0 &&
           a.hd <= 4 * 32 * ATTD_QV && a.nheads >= 1 &&
           (a.nheads + ATTD_HPB - 1) / ATTD_HPB <= CU_ATTD_MAX_GROUPS;
}

void cu_attention_decode_plan(const dattn &a, int target, int *splits, int *chunk)
{
    attn_split_plan(a, ATTD_HPB, ATTD_KT, splits, chunk, target);
}

void cu_attention_decode(cudaStream_t st, const dattn &a, int target, float *part, int *count,
                         const dattn *segs)
{
    if (a.n <= 0 || a.nheads <= 0) return;
    int splits, chunk;
    cu_attention_decode_plan(a, target, &splits, &chunk);
    size_t smem = ((size_t)attd_scratch_floats(a.hd) + ATTD_KT * ATTD_HPB) * sizeof(float);
    smem_attr<0>(attention_decode_kernel, smem);
    dim3 grid(splits, (a.nheads + ATTD_HPB - 1) / ATTD_HPB, a.n);
    cu_launch(attention_decode_kernel, grid, ATTD_THREADS, smem, st, a, chunk, part, count, segs);
}
