// Shared by the CUDA kernels: number-format decoders (equal, code by code,
// to kernels/cpu/quant.c), the device view of a weight, reductions.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/kv_quant.h"
#include "cpu/qweight.h"

// A weight view as the kernels see it (passed by value).  The device copy
// holds a rectangle of the stored tensor whose origin is aligned to the
// scale blocks, so block indices computed in copy coordinates are the
// stored ones shifted by whole blocks.
struct dqw {
    int type, rows, cols;       // enum qtype; the view's size
    const uint8_t *data;        // device copy (expert 0 when packed)
    const uint8_t *scale;
    long long ld, sld;          // elements per copy row, scale columns
    int r0, c0;                 // view origin inside the copy
    long long estride, sestride; // bytes between packed experts
    const uint8_t *bf;          // FP8 under LLM_CUDA_FP8_SHADOW: the copy in bf16 (same
    long long bstride;          // ld, r0, c0; bstride bytes between experts), else NULL
};

// Programmatic dependent launch.  Every kernel is launched by cu_launch,
// which lets it start while the kernel before it on the stream is still
// running (in graphs too: a programmatic edge); pdl_wait, at the top of
// every kernel (after the loads that depend on nothing earlier, such as
// the GEMVs' first weights), waits until that kernel has finished and its
// writes are visible, then lets the next kernel start the same way.  A
// kernel that does not wait must not run under cu_launch.  Outside such a
// launch pdl_wait returns at once.  LLM_CUDA_PDL=0: launches serialized.
__device__ __forceinline__ void pdl_wait()
{
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

inline bool cu_pdl()
{
    static const bool on = !(getenv("LLM_CUDA_PDL") && !strcmp(getenv("LLM_CUDA_PDL"), "0"));
    return on;
}

// The arguments convert to the kernel's parameter types (as with <<<>>>).
template <typename T> struct same_type { using type = T; };
// cluster: the blocks in clusters of these dimensions (distributed shared
// memory; matmul_mma.cu), none where one is 0.
template <typename... P>
cudaError_t cu_launch_cluster(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
                              cudaStream_t st, dim3 cluster, typename same_type<P>::type... args)
{
    cudaLaunchAttribute at[2];
    int n = 0;
    if (cluster.x && cluster.y && cluster.z) {
        at[n].id = cudaLaunchAttributeClusterDimension;
        at[n].val.clusterDim.x = cluster.x, at[n].val.clusterDim.y = cluster.y;
        at[n].val.clusterDim.z = cluster.z;
        n++;
    }
    if (cu_pdl()) {
        at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[n].val.programmaticStreamSerializationAllowed = 1;
        n++;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = at;
    cfg.numAttrs = n;
    return cudaLaunchKernelEx(&cfg, kernel, args...);
}

// Whether clusters of `cluster` blocks of kernel k (`threads` each, smem
// bytes of dynamic shared memory) can run on this device: at least one
// resident, sizes past 8 (non-portable) where the device allows them.
// Sets the kernel's dynamic shared memory limit to smem when given.
template <typename... P>
bool cu_cluster_runs(void (*k)(P...), dim3 cluster, int threads, size_t smem)
{
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeClusterDimension;
    at.val.clusterDim.x = cluster.x, at.val.clusterDim.y = cluster.y;
    at.val.clusterDim.z = cluster.z;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = cluster;
    cfg.blockDim = threads;
    cfg.dynamicSmemBytes = smem;
    cfg.attrs = &at;
    cfg.numAttrs = 1;
    int clusters = 0;
    bool ok = (cluster.x * cluster.y * cluster.z <= 8 ||
               cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) ==
                   cudaSuccess) &&
              (!smem || cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem) == cudaSuccess) &&
              cudaOccupancyMaxActiveClusters(&clusters, k, &cfg) == cudaSuccess && clusters > 0;
    cudaGetLastError();
    return ok;
}

template <typename... P>
void cu_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
               typename same_type<P>::type... args)
{
    cu_launch_cluster(kernel, grid, block, smem, st, dim3(0, 0, 0), args...);
}

__device__ __forceinline__ float bf16f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

// 2^(e-127); 255 is NaN; 0 is the subnormal 2^-127.
__device__ __forceinline__ float e8m0f(uint32_t e)
{
    return __uint_as_float(e == 255 ? 0x7fc00000u : e ? e << 23 : 0x00400000u);
}

// 16 bytes of weights, read once: not kept in L1.
__device__ __forceinline__ uint4 ld_weights(const uint8_t *p)
{
    uint4 u;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
        : "l"(p));
    return u;
}

// Word j of 16 loaded bytes.
__device__ __forceinline__ uint32_t word(const uint4 &u, int j)
{
    return j == 0 ? u.x : j == 1 ? u.y : j == 2 ? u.z : u.w;
}

__device__ __forceinline__ float2 half2f(uint32_t h)
{
    return __half22float2(*reinterpret_cast<const __half2 *>(&h));
}

// Two e4m3 codes (the low 16 bits) as f16x2, exactly (0x7f: NaN): the
// hardware conversion the GEMV and the small-M kernel decode FP8 with.
__device__ __forceinline__ uint32_t e4m3x2_f16x2(uint32_t b)
{
    uint32_t h;
    asm("{ .reg .b16 t; cvt.u16.u32 t, %1; cvt.rn.f16x2.e4m3x2 %0, t; }" : "=r"(h) : "r"(b));
    return h;
}

// FP8 e4m3 ("fn": no infinities, 0x7f/0xff NaN).
__device__ __forceinline__ float fp8f(uint32_t b)
{
    uint32_t e = (b >> 3) & 15, m = b & 7;
    float v = e ? __uint_as_float(((e + 120) << 23) | (m << 20)) : (float)m * 0.001953125f;
    if ((b & 0x7f) == 0x7f) v = __uint_as_float(0x7fc00000u);
    return b & 0x80 ? -v : v;
}

// The four e4m3 codes of a word (the lowest byte first) times s: fp8f's
// values (NaN for NaN), through the hardware's exact e4m3x2 -> f16x2
// conversion, about a quarter of fp8f's integer work a code (the cache's
// keys in attention: run D6 found the prefill kernel's integer pipe the
// busiest).
__device__ __forceinline__ float4 fp8x4f(uint32_t b, float s)
{
    float2 lo = half2f(e4m3x2_f16x2(b)), hi = half2f(e4m3x2_f16x2(b >> 16));
    return make_float4(lo.x * s, lo.y * s, hi.x * s, hi.y * s);
}

// E2M1: 0, .5, 1, 1.5, 2, 3, 4, 6, sign in bit 3.
__device__ __forceinline__ float fp4f(uint32_t c)
{
    uint32_t e = (c >> 1) & 3, m = c & 1;
    float v = e ? __uint_as_float(((e + 126) << 23) | (m << 22)) : 0.5f * (float)m;
    return c & 8 ? -v : v;
}

// Element (r, c) in copy coordinates of weight w (data/scale already
// offset to the expert).
template <int QT>
__device__ __forceinline__ float qw_at(const dqw &w, const uint8_t *data, const uint8_t *scale,
                                       long long r, long long c)
{
    if (QT == QT_F32) return ((const float *)data)[r * w.ld + c];
    if (QT == QT_BF16) return bf16f(((const uint16_t *)data)[r * w.ld + c]);
    if (QT == QT_FP8) return fp8f(data[r * w.ld + c]) * e8m0f(scale[(r >> 7) * w.sld + (c >> 7)]);
    uint32_t b = data[(r * w.ld + c) >> 1];
    return fp4f(c & 1 ? b >> 4 : b & 15) * e8m0f(scale[r * w.sld + (c >> 5)]);
}

// SwiGLU with the gate clamped above and the up value both ways at limit.
__device__ __forceinline__ float swiglu1(float g, float u, float limit)
{
    float gv = g > limit ? limit : g;
    float uv = u > limit ? limit : u < -limit ? -limit : u;
    return gv / (1.0f + expf(-gv)) * uv;
}

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ double warp_sum_d(double v)
{
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Block-wide reductions (blockDim a multiple of 32, at most 1024); every
// thread gets the result.  `sh` holds 32 values of scratch.
template <typename F>
__device__ __forceinline__ F block_sum(F v, F *sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : (F)0;
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Two block_sums in one pass (one pair of barriers): x and y get what
// block_sum(x, shx) and block_sum(y, shy) would give.
__device__ __forceinline__ void block_sum2(double &x, float &y, double *shx, float *shy)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o; o >>= 1) {
        x += __shfl_xor_sync(0xffffffffu, x, o);
        y += __shfl_xor_sync(0xffffffffu, y, o);
    }
    __syncthreads();
    if (lane == 0) shx[w] = x, shy[w] = y;
    __syncthreads();
    x = lane < nw ? shx[lane] : 0.0;
    y = lane < nw ? shy[lane] : 0.0f;
    for (int o = 16; o; o >>= 1) {
        x += __shfl_xor_sync(0xffffffffu, x, o);
        y += __shfl_xor_sync(0xffffffffu, y, o);
    }
}

__device__ __forceinline__ float block_max(float v, float *sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : -INFINITY;
    return warp_max(v);
}

// Exclusive prefix sum of v over the block; *total gets the sum.
__device__ __forceinline__ int block_scan(int v, int *sh, int *total)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int x = v;
    for (int o = 1; o < 32; o <<= 1) {
        int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads();
    if (lane == 31) sh[w] = x;
    __syncthreads();
    if (w == 0) {
        int s = lane < nw ? sh[lane] : 0;
        for (int o = 1; o < 32; o <<= 1) {
            int y = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += y;
        }
        sh[lane] = s;   // inclusive prefix of warp totals
    }
    __syncthreads();
    int before = (w ? sh[w - 1] : 0) + x - v;
    *total = sh[nw - 1];
    return before;
}

// ---- cache storage (cpu/kv_quant.h: the same bytes as the CPU's) ----

__device__ __forceinline__ int kv_ngroups(int n) { return (n + KV_FP8_GROUP - 1) / KV_FP8_GROUP; }

// 2^k for -126 <= k <= 127, exactly.
__device__ __forceinline__ float pow2i(int k) { return __uint_as_float((uint32_t)(127 + k) << 23); }

// UE8M0 exponent of a group: the smallest e with max(amax, 1e-4) <= 448 * 2^e.
__device__ __forceinline__ int kv_fp8_exp(float amax)
{
    if (!(amax >= 1e-4f)) amax = 1e-4f;
    uint32_t u = __float_as_uint(amax);
    return (int)((u >> 23) & 255) - 135 + ((u & 0x7fffff) > 0x600000);
}

// float -> FP8 e4m3fn, round to nearest even, saturating at +-448 (as
// f32_to_fp8_e4m3): subnormals in units of 2^-9, normals by rounding the
// float's mantissa to 3 bits (a carry moves the exponent up).
__device__ __forceinline__ uint32_t fp8_enc(float x)
{
    uint32_t s = (__float_as_uint(x) >> 24) & 0x80;
    float a = fabsf(x);
    if (a != a) return 0x7f;
    if (a >= 448.0f) return s | 0x7e;
    if (a < 0.015625f) return s | (uint32_t)__float2int_rn(a * 512.0f);
    uint32_t u = __float_as_uint(a);
    u += 0x7ffff + ((u >> 20) & 1);
    return s | (((u >> 23) - 120) << 3) | ((u >> 20) & 7);
}

// act_quant's scale of a group (cpu/quant.h, act_quant_scale):
// 2^ceil(log2(max(amax, 1e-4) * (1/448))), from the float32 product's bits.
__device__ __forceinline__ float act_scale(float amax)
{
    uint32_t u = __float_as_uint(fmaxf(amax, 1e-4f) * (1.0f / 448.0f));
    int e = (int)((u >> 23) & 255) - 127 + ((u & 0x7fffff) != 0);
    return pow2i(e);
}

// float -> BF16, round to nearest even (as f32_to_bf16).
__device__ __forceinline__ uint32_t bf16_enc(float x)
{
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffff) > 0x7f800000) return 0x7fc0;
    return (u + 0x7fff + ((u >> 16) & 1)) >> 16;
}

// One stored row: data (F32/BF16 values, FP8 codes) and the FP8 scales.
struct kref {
    const char *p;
    const uint8_t *s;
    int t;
};

// store(x, load(x)) for x = first, first + step, ... below n, U at a
// time: the batch's loads are all issued before its stores (element by
// element, a store to shared memory that the compiler cannot tell from
// the next element's sources may wait for each load).  Measured on the
// decode kernels that stage keys and queries this way (ncu, runs D5-D6
// of docs/GPU_NOTES.md): within noise for attention and the router,
// 43.5 -> 40 us for the indexer's scores.
template <int U, typename L, typename S>
__device__ __forceinline__ void batched(int first, int n, int step, L load, S store)
{
    for (int x0 = first; x0 < n; x0 += U * step) {
        float v[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int x = x0 + u * step;
            v[u] = x < n ? load(x) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int x = x0 + u * step;
            if (x < n) store(x, v[u]);
        }
    }
}

// Row `row` of a region of nrows rows of n values stored as t.
__device__ __forceinline__ kref kv_ref(int t, const char *region, int nrows, int n, int row)
{
    if (t == KV_F32) return kref{ region + (long long)row * n * 4, NULL, t };
    if (t == KV_BF16) return kref{ region + (long long)row * n * 2, NULL, t };
    const uint8_t *r = (const uint8_t *)region;
    return kref{ region + (long long)row * n,
                 r + (long long)nrows * n + (long long)row * kv_ngroups(n), t };
}

__device__ __forceinline__ float kref_at(const kref &r, int c)
{
    if (r.t == KV_F32) return ((const float *)r.p)[c];
    if (r.t == KV_BF16) return bf16f(((const uint16_t *)r.p)[c]);
    return fp8f(((const uint8_t *)r.p)[c]) * pow2i((int)r.s[c / KV_FP8_GROUP] - 127);
}

// Store x (n values, any readable memory) as row `row` of a region
// (NULL: store nothing), and put the stored values, decoded, in `back`
// (NULL: none; may be x).  The block's warps take groups of KV_FP8_GROUP
// channels (two per lane); every thread of the block calls it.
__device__ __forceinline__ void kv_put_row(int t, const float *x, int n, char *region, int nrows,
                                           int row, float *back)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    kref r = region ? kv_ref(t, region, nrows, n, row) : kref{ NULL, NULL, t };
    for (int g = warp; g < kv_ngroups(n); g += nw) {
        int c0 = g * KV_FP8_GROUP, len = min(KV_FP8_GROUP, n - c0);
        float v[2];
        for (int k = 0; k < 2; k++) v[k] = lane + 32 * k < len ? x[c0 + lane + 32 * k] : 0.0f;
        int e = 0;
        if (t == KV_FP8) {
            e = kv_fp8_exp(warp_max(fmaxf(fabsf(v[0]), fabsf(v[1]))));
            if (lane == 0 && region) ((uint8_t *)r.s)[g] = (uint8_t)(e + 127);
        }
        for (int k = 0; k < 2; k++) {
            int c = c0 + lane + 32 * k;
            if (lane + 32 * k >= len) continue;
            float y = v[k];
            if (t == KV_FP8) {
                uint32_t code = fp8_enc(v[k] * pow2i(-e));
                if (region) ((uint8_t *)r.p)[c] = (uint8_t)code;
                y = fp8f(code) * pow2i(e);
            } else if (t == KV_BF16) {
                uint32_t h = bf16_enc(v[k]);
                if (region) ((uint16_t *)r.p)[c] = (uint16_t)h;
                y = bf16f(h);
            } else if (region) {
                ((float *)r.p)[c] = v[k];
            }
            if (back) back[c] = y;
        }
    }
}

// Rows of a paged cache layer (see paged_rows in backend.h).
struct dpaged {
    char *const *blocks;        // device array of block addresses
    long long off;
    int per_block, row_len, dtype;
};

__device__ __forceinline__ char *dpaged_region(const dpaged &p, int i)
{
    return p.blocks[i / p.per_block] + p.off;
}

__device__ __forceinline__ kref dpaged_ref(const dpaged &p, int i)
{
    return kv_ref(p.dtype, dpaged_region(p, i), p.per_block, p.row_len, i % p.per_block);
}

// An op's values that change from step to step (graph replay,
// backend_cuda.cu): kernels read them from device memory when the op's
// `dyn` is set, else they use the op's by-value fields.
struct dstep {
    int pos0;               // position of the op's first new token
    void *ptr;              // the sequence's state (compress) or ring (attention)
};

// RoPE table by value (at most 128 channel pairs).
#define ROPE_MAX_PAIRS 128
struct drope {
    int npairs;
    float attn_factor;
    float inv_freq[ROPE_MAX_PAIRS];
};

// grid.y of a kernel whose blocks take rows blockIdx.y, + gridDim.y, ...
// of T (grid.y's limit is 65,535).
static inline unsigned grid_rows(int T) { return (unsigned)(T < 65535 ? T : 65535); }

// Pair i's cosine and sine at pos (cpu_rope_head's).
__device__ __forceinline__ void rope_cs(const drope &rt, int i, int pos, float &c, float &s)
{
    float ang = rt.inv_freq[i] * (float)pos;
    c = (float)cos((double)ang) * rt.attn_factor;
    s = (float)sin((double)ang) * rt.attn_factor;
}

// The pair (x0, x1) rotated by c and s (the CPU's order of operations).
__device__ __forceinline__ void rope_rot2(float &x0, float &x1, float c, float s)
{
    float y0 = __fadd_rn(__fmul_rn(x0, c), __fmul_rn(-x1, s));
    x1 = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
    x0 = y0;
}

// Pair i of r (x in any memory) rotated by c and s.
__device__ __forceinline__ void rope_rot(float *r, int i, float c, float s)
{
    float x0 = r[2 * i], x1 = r[2 * i + 1];
    rope_rot2(x0, x1, c, s);
    r[2 * i] = x0;
    r[2 * i + 1] = x1;
}

// Rotate the last 2*npairs channels of one head (x in any memory) at pos,
// the CPU's order of operations (cpu_rope_head), element by element.
__device__ __forceinline__ void rope_pair(float *r, int i, const drope &rt, int pos, bool inverse)
{
    float c, s;
    rope_cs(rt, i, pos, c, s);
    rope_rot(r, i, c, inverse ? -s : s);
}

// Let kernel k use smem bytes of dynamic shared memory on this device: set
// once per size increase, so a run that repeats a warm-up run's launches
// (graph capture) makes no such call.  TAG tells apart kernels of one
// signature (the per-device record is per TAG and signature, so ranks on
// their own threads never share one).
template <int TAG, typename K>
static void smem_attr(K *k, size_t smem)
{
    static int set[64];
    int dev = 0;
    if (smem <= 48 * 1024 || cudaGetDevice(&dev) != cudaSuccess || dev >= 64 ||
        set[dev] >= (int)smem)
        return;
    cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    set[dev] = (int)smem;
}
