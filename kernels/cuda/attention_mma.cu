// Attention of prefill chunks on tensor cores.
//
// DeepSeek V4 has one key/value head shared by every query head, so for a
// query token the logits of all its heads against a tile of keys are one
// small GEMM with the heads as rows: S[heads][keys] = Q . K^T, then
// O[heads][hd] += P . K (values = keys).  One block per (token, 32 heads):
// Q and a tile of 64 keys in shared memory as BF16, mma.sync m16n8k16 with
// float32 accumulation, an online softmax over the tiles (running max and
// sum per head) and the sink added to the denominator at the end.  Keys
// go into the tensor cores as BF16 (exact for BF16 and FP8 caches).  With
// NP = 1 (LLM_CUDA_GEMM=bf16) queries and probabilities round to BF16;
// with NP = 2 (bf16x2, the default) each is split into hi = bf16(x) and
// lo = bf16(x - hi) and both parts multiply (relative error 2^-16 instead
// of 2^-8, twice the MMAs).  Sums are float32.  The float32 kernel (attention.cu) stays for decode
// and for LLM_CUDA_GEMM=f32.
#include <cuda_bf16.h>

#include "attention_keys.cuh"

#define AM_HEADS 32     // query heads per block (two m16 tiles)
#define AM_KEYS 64      // keys per tile (eight n8 tiles, one per warp)
#define AM_PAD 8        // bf16 elements of padding per shared row (banks)

__device__ __forceinline__ uint32_t am_pack(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

__device__ __forceinline__ uint32_t am_pair(const __nv_bfloat16 *lo, const __nv_bfloat16 *hi)
{
    return (uint32_t)*(const uint16_t *)lo | (uint32_t)*(const uint16_t *)hi << 16;
}

// d += a . b for one m16n8k16 tile (BF16 in, float32 accumulate).
__device__ __forceinline__ void am_mma(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Channels c..c+3 of a stored key as four bf16 (BF16 and FP8 exactly).
__device__ __forceinline__ uint2 am_key4(const kref &r, int c)
{
    if (r.t == KV_BF16) return *(const uint2 *)((const uint16_t *)r.p + c);
    if (r.t == KV_F32) {
        float4 v = *(const float4 *)((const float *)r.p + c);
        return make_uint2(am_pack(v.x, v.y), am_pack(v.z, v.w));
    }
    uint32_t b = *(const uint32_t *)((const uint8_t *)r.p + c);
    float s = pow2i((int)r.s[c / KV_FP8_GROUP] - 127);
    return make_uint2(am_pack(fp8f(b & 255) * s, fp8f((b >> 8) & 255) * s),
                      am_pack(fp8f((b >> 16) & 255) * s, fp8f(b >> 24) * s));
}

template <int HD, int NP>
constexpr size_t attention_mma_smem()
{
    return AM_KEYS * sizeof(kref)                                   // the tile's key rows
           + (size_t)(NP * AM_HEADS + AM_KEYS) * (HD + AM_PAD) * 2  // Q parts, K tile (bf16)
           + (size_t)AM_HEADS * AM_KEYS * 4                         // logits
           + (size_t)NP * AM_HEADS * (AM_KEYS + AM_PAD) * 2         // probability parts
           + 3 * AM_HEADS * 4;                                      // max, sum, correction
}

// x as NP bf16 parts: x ~ hi (+ lo).
template <int NP>
__device__ __forceinline__ void am_split2(float x0, float x1, uint32_t out[NP])
{
    __nv_bfloat162 hi = __floats2bfloat162_rn(x0, x1);
    out[0] = *(uint32_t *)&hi;
    if (NP == 2) {
        float2 h = __bfloat1622float2(hi);
        out[NP - 1] = am_pack(x0 - h.x, x1 - h.y);
    }
}

// 256 threads (8 warps).  Warp w computes the logits of keys 8w..8w+7 of
// a tile for all 32 heads, and owns output channels [w*HD/8, (w+1)*HD/8)
// of the P . K product.
template <int HD, int NP>
__global__ void __launch_bounds__(256) attention_mma_kernel(dattn a)
{
    constexpr int LD = HD + AM_PAD, LDP = AM_KEYS + AM_PAD, NT = HD / 64;
    extern __shared__ __align__(16) unsigned char smem[];
    kref *kr = (kref *)smem;
    __nv_bfloat16 *qs = (__nv_bfloat16 *)(kr + AM_KEYS);    // [NP][AM_HEADS][LD]
    __nv_bfloat16 *ks = qs + NP * AM_HEADS * LD;
    float *ss = (float *)(ks + AM_KEYS * LD);
    __nv_bfloat16 *ps = (__nv_bfloat16 *)(ss + AM_HEADS * AM_KEYS);    // [NP][AM_HEADS][LDP]
    float *mrow = (float *)(ps + NP * AM_HEADS * LDP), *lrow = mrow + AM_HEADS;
    float *crow = lrow + AM_HEADS;

    if (a.dyn) a.pos0 = a.dyn->pos0, a.ring = (const char *)a.dyn->ptr;
    const int i = blockIdx.x, h0 = blockIdx.y * AM_HEADS, nh = min(AM_HEADS, a.nheads - h0);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    int nk;
    attn_keys K = attn_keys_of(a, i, &nk);

    const float *q = a.q + ((long long)i * a.nheads + h0) * HD;
    for (int x = tid * 4; x < AM_HEADS * HD; x += 256 * 4) {
        int r = x / HD, c = x % HD;
        float4 v = r < nh ? *(const float4 *)(q + (long long)r * HD + c) : make_float4(0, 0, 0, 0);
        uint32_t lo[NP], hi[NP];
        am_split2<NP>(v.x, v.y, lo);
        am_split2<NP>(v.z, v.w, hi);
#pragma unroll
        for (int k = 0; k < NP; k++)
            *(uint2 *)(qs + (k * AM_HEADS + r) * LD + c) = make_uint2(lo[k], hi[k]);
    }
    if (tid < AM_HEADS) mrow[tid] = -INFINITY, lrow[tid] = 0;

    float o[2][NT][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++) o[mt][nt][0] = o[mt][nt][1] = o[mt][nt][2] = o[mt][nt][3] = 0;

    for (int kt = 0; kt < nk; kt += AM_KEYS) {
        __syncthreads();    // the previous tile's K and P are consumed
        if (tid < AM_KEYS && kt + tid < nk) kr[tid] = K.key(kt + tid);
        __syncthreads();
        for (int x = tid * 4; x < AM_KEYS * HD; x += 256 * 4) {
            int r = x / HD, c = x % HD;
            // Rows past the last key are zeros: 0 * P, never NaN.
            *(uint2 *)(ks + r * LD + c) = kt + r < nk ? am_key4(kr[r], c) : make_uint2(0, 0);
        }
        __syncthreads();

        // Logits of keys 8*warp .. +7 for the 32 heads.
        float s[2][4] = { { 0, 0, 0, 0 }, { 0, 0, 0, 0 } };
        const __nv_bfloat16 *kr = ks + (warp * 8 + g) * LD + 2 * t;
#pragma unroll 4
        for (int k = 0; k < HD; k += 16) {
            uint32_t b0 = *(const uint32_t *)(kr + k), b1 = *(const uint32_t *)(kr + k + 8);
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int part = 0; part < NP; part++) {
                    const __nv_bfloat16 *qr = qs + (part * AM_HEADS + mt * 16 + g) * LD + k + 2 * t;
                    uint32_t af[4] = { *(const uint32_t *)qr, *(const uint32_t *)(qr + 8 * LD),
                                       *(const uint32_t *)(qr + 8),
                                       *(const uint32_t *)(qr + 8 * LD + 8) };
                    am_mma(s[mt], af, b0, b1);
                }
        }
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = mt * 16 + g + (e >> 1) * 8, col = warp * 8 + 2 * t + (e & 1);
                ss[r * AM_KEYS + col] = kt + col < nk ? s[mt][e] * a.scale : -INFINITY;
            }
        __syncthreads();

        // Online softmax: 8 threads per head row, 8 keys each.
        {
            int r = tid >> 3, sub = tid & 7;
            const float *sr = ss + r * AM_KEYS + sub * 8;
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < 8; j++) mx = fmaxf(mx, sr[j]);
            for (int o2 = 1; o2 < 8; o2 <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o2));
            float mold = mrow[r], mnew = fmaxf(mold, mx), sum = 0;
            // The first tile always holds the token's own key: mnew is finite.
#pragma unroll
            for (int j = 0; j < 8; j += 2) {
                float e0 = expf(sr[j] - mnew), e1 = expf(sr[j + 1] - mnew);
                sum += e0 + e1;
                uint32_t pp[NP];
                am_split2<NP>(e0, e1, pp);
#pragma unroll
                for (int k = 0; k < NP; k++)
                    *(uint32_t *)(ps + (k * AM_HEADS + r) * LDP + sub * 8 + j) = pp[k];
            }
            for (int o2 = 1; o2 < 8; o2 <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o2);
            __syncwarp();
            if (sub == 0) {
                float corr = expf(mold - mnew);
                lrow[r] = lrow[r] * corr + sum;
                mrow[r] = mnew;
                crow[r] = corr;
            }
        }
        __syncthreads();

        // O = O * correction + P . K over this warp's channels.
#pragma unroll
        for (int mt = 0; mt < 2; mt++) {
            float c0 = crow[mt * 16 + g], c1 = crow[mt * 16 + g + 8];
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
                o[mt][nt][0] *= c0, o[mt][nt][1] *= c0, o[mt][nt][2] *= c1, o[mt][nt][3] *= c1;
        }
#pragma unroll
        for (int kk = 0; kk < AM_KEYS; kk += 16) {
            uint32_t af[NP][2][4];
#pragma unroll
            for (int part = 0; part < NP; part++)
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    const __nv_bfloat16 *pr = ps + (part * AM_HEADS + mt * 16 + g) * LDP + kk + 2 * t;
                    af[part][mt][0] = *(const uint32_t *)pr;
                    af[part][mt][1] = *(const uint32_t *)(pr + 8 * LDP);
                    af[part][mt][2] = *(const uint32_t *)(pr + 8);
                    af[part][mt][3] = *(const uint32_t *)(pr + 8 * LDP + 8);
                }
            const __nv_bfloat16 *vr = ks + (kk + 2 * t) * LD + warp * (HD / 8) + g;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const __nv_bfloat16 *v = vr + nt * 8;
                uint32_t b0 = am_pair(v, v + LD), b1 = am_pair(v + 8 * LD, v + 9 * LD);
#pragma unroll
                for (int part = 0; part < NP; part++) {
                    am_mma(o[0][nt], af[part][0], b0, b1);
                    am_mma(o[1][nt], af[part][1], b0, b1);
                }
            }
        }
    }
    __syncthreads();

    float *out = a.out + ((long long)i * a.nheads + h0) * HD;
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int half = 0; half < 2; half++) {
            int r = mt * 16 + g + half * 8;
            if (r >= nh) continue;
            float den = lrow[r] + expf(a.sinks[h0 + r] - mrow[r]);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                int c = warp * (HD / 8) + nt * 8 + 2 * t;
                *(float2 *)(out + (long long)r * HD + c) =
                    make_float2(o[mt][nt][2 * half] / den, o[mt][nt][2 * half + 1] / den);
            }
        }
}

template <int HD, int NP>
static void attention_mma_launch(cudaStream_t st, const dattn &a)
{
    size_t smem = attention_mma_smem<HD, NP>();
    smem_attr<HD * 2 + NP>(attention_mma_kernel<HD, NP>, smem);
    dim3 grid(a.n, (a.nheads + AM_HEADS - 1) / AM_HEADS);
    attention_mma_kernel<HD, NP><<<grid, 256, smem, st>>>(a);
}

template <int NP>
static bool attention_mma_hd(cudaStream_t st, const dattn &a)
{
    switch (a.hd) {
    case 64: attention_mma_launch<64, NP>(st, a); return true;
    case 128: attention_mma_launch<128, NP>(st, a); return true;
    case 256: attention_mma_launch<256, NP>(st, a); return true;
    case 512: attention_mma_launch<512, NP>(st, a); return true;
    default: return false;
    }
}

bool cu_attention_mma(cudaStream_t st, const dattn &a, bool split)
{
    return split ? attention_mma_hd<2>(st, a) : attention_mma_hd<1>(st, a);
}
