// Row and element ops: embedding, RMSNorm, RoPE, scaling, the
// hyper-connection mix (mHC with Sinkhorn), the ring of the sliding
// window, and the MoE router, grouping and combination.  Orders of
// operations follow kernels/cpu/ops.c and kernels/cpu/backend_cpu.c.
#include "backend.h"
#include "kernels.cuh"
#include "moe_decode.cuh"
#include "smm.cuh"

#define HC_MAX BACKEND_HC_MAX

static unsigned blocks_for(long long n, int threads) { return (unsigned)((n + threads - 1) / threads); }

template <int QT>
__global__ void embed_kernel(dqw w, const int *ids, int copies, float *out)
{
    pdl_wait();
    int t = blockIdx.x;
    long long r = w.r0 + ids[t];
    float *o = out + (long long)t * copies * w.cols;
    for (int c = threadIdx.x; c < w.cols; c += blockDim.x) {
        float v = qw_at<QT>(w, w.data, w.scale, r, w.c0 + c);
        for (int k = 0; k < copies; k++) o[(long long)k * w.cols + c] = v;
    }
}

void cu_embed(cudaStream_t st, const dqw &w, const int *ids, int T, int copies, float *out)
{
    if (T <= 0) return;
    switch (w.type) {
    case QT_F32: cu_launch(embed_kernel<QT_F32>, T, 256, 0, st, w, ids, copies, out); break;
    case QT_BF16: cu_launch(embed_kernel<QT_BF16>, T, 256, 0, st, w, ids, copies, out); break;
    case QT_FP8: cu_launch(embed_kernel<QT_FP8>, T, 256, 0, st, w, ids, copies, out); break;
    default: cu_launch(embed_kernel<QT_MXFP4>, T, 256, 0, st, w, ids, copies, out); break;
    }
}

__global__ void rmsnorm_kernel(const float *x, int ldx, int n, const float *w, float eps,
                               float *out, int ldo)
{
    pdl_wait();
    __shared__ double sh[32];
    const float *xr = x + (long long)blockIdx.x * ldx;
    float *o = out + (long long)blockIdx.x * ldo;
    double ss = 0;
#pragma unroll 4
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += (double)xr[i] * xr[i];
    ss = block_sum(ss, sh);
    float r = 1.0f / sqrtf((float)(ss / n) + eps);
#pragma unroll 4
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        o[i] = w ? w[i] * (xr[i] * r) : xr[i] * r;
}

void cu_rmsnorm(cudaStream_t st, const float *x, int ldx, int T, int n, const float *weight,
                float eps, float *out, int ldo)
{
    if (T <= 0 || n <= 0) return;
    cu_launch(rmsnorm_kernel, T, n >= 1024 ? 512 : 128, 0, st, x, ldx, n, weight, eps, out, ldo);
}

// Blocks (pair chunk, token; tokens past 65,535 in turn): the token's
// cosines and sines once a block (every head shares them), then a pair of
// the token's heads a thread.  (A thread per pair, each with its own
// double-precision sin and cos and 64-bit divisions: 103 us for the 8,192
// x 32 heads of a prefill step.  One block a token put a decode step's
// pairs on one SM: 1.22 against 1.19-1.20 ms at 131K, run Q4.)
__global__ void rope_kernel(float *x, int ld, int T, int nheads, int hd, drope rt, const int *pos,
                            int inverse)
{
    pdl_wait();
    __shared__ float cs[2][ROPE_MAX_PAIRS];
    int np = rt.npairs, j = blockIdx.x * blockDim.x + threadIdx.x;
    for (int t = blockIdx.y; t < T; t += gridDim.y) {
        __syncthreads();    // the previous token's table read
        for (int i = threadIdx.x; i < np; i += blockDim.x) {
            rope_cs(rt, i, pos[t], cs[0][i], cs[1][i]);
            if (inverse) cs[1][i] = -cs[1][i];
        }
        __syncthreads();
        if (j < nheads * np) {
            int h = j / np, i = j - h * np;
            rope_rot(x + (long long)t * ld + (long long)h * hd + hd - 2 * np, i, cs[0][i],
                     cs[1][i]);
        }
    }
}

void cu_rope(cudaStream_t st, float *x, int ld, int T, int nheads, int head_dim, const drope &rt,
             const int *pos, bool inverse)
{
    if (T <= 0 || nheads <= 0 || rt.npairs <= 0) return;
    dim3 grid((unsigned)((nheads * rt.npairs + 255) / 256), grid_rows(T));
    cu_launch(rope_kernel, grid, 256, 0, st, x, ld, T, nheads, head_dim, rt, pos, inverse);
}

__global__ void scale_kernel(float *x, int ld, int T, int n, float s)
{
    pdl_wait();
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)T * n) return;
    x[(idx / n) * ld + idx % n] *= s;
}

void cu_scale(cudaStream_t st, float *x, int ld, int T, int n, float s)
{
    long long m = (long long)T * n;
    if (m <= 0) return;
    cu_launch(scale_kernel, blocks_for(m, 256), 256, 0, st, x, ld, T, n, s);
}

// ---- hyper-connections ----

__device__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

// The mix logits m[t][j] = rsqrt(mean(h[t]^2) + eps) * (h[t] . fn[j]) in
// one pass, one block per (j, t) so that a single token still fills the
// GPU (consecutive blocks share the token's streams in L2); 16-byte loads
// when rows allow, so a block has its whole row in flight at once.  The
// CPU scales before the dot product; the difference is rounding.
__global__ void __launch_bounds__(512) hc_logits_kernel(const float *h, int n, const float *fn,
                                                        float norm_eps, float *m)
{
    pdl_wait();
    __shared__ double shd[32];
    __shared__ float shf[32];
    int j = blockIdx.x, t = blockIdx.y, nmix = gridDim.x;
    const float *ht = h + (long long)t * n, *f = fn + (long long)j * n;
    double ss = 0;
    float a = 0;
    int n4 = (n % 4 == 0 && (uintptr_t)h % 16 == 0 && (uintptr_t)fn % 16 == 0) ? n / 4 : 0;
#pragma unroll 4
    for (int i = threadIdx.x; i < n4; i += blockDim.x) {
        float4 hv = ((const float4 *)ht)[i], fv = ((const float4 *)f)[i];
        ss += (double)hv.x * hv.x + (double)hv.y * hv.y + (double)hv.z * hv.z +
              (double)hv.w * hv.w;
        a += hv.x * fv.x + hv.y * fv.y + hv.z * fv.z + hv.w * fv.w;
    }
    for (int i = 4 * n4 + threadIdx.x; i < n; i += blockDim.x) {
        float hv = ht[i];
        ss += (double)hv * hv;
        a += hv * f[i];
    }
    ss = block_sum(ss, shd);
    a = block_sum(a, shf);
    if (threadIdx.x == 0) m[(long long)t * nmix + j] = a * (1.0f / sqrtf((float)(ss / n) + norm_eps));
}

void cu_hc_logits(cudaStream_t st, const float *h, int T, int n, const float *fn, int nmix,
                  float norm_eps, float *m)
{
    if (T > 0) cu_launch(hc_logits_kernel, dim3(nmix, T), 512, 0, st, h, n, fn, norm_eps, m);
}

// The 8 warps' sums of a lane's token, added in warp order (the many-
// token logits' fixed order): red[lane][j] for the NMP logits, rss[lane]
// for the sum of squares.  Every warp's sums are in when it returns.
template <int NMP>
__device__ __forceinline__ void hc_sum_warps(float (*red)[NMP + 1], double *rss, const float *acc,
                                             double ss, int warp, int lane)
{
    for (int w = 0; w < 8; w++) {
        if (warp == w) {
#pragma unroll
            for (int j = 0; j < NMP; j++) red[lane][j] = w ? red[lane][j] + acc[j] : acc[j];
            rss[lane] = w ? rss[lane] + ss : ss;
        }
        __syncthreads();
    }
}

// The many-token logits kernels over few token groups (decode batches,
// short prefill steps): the columns in S slices (grid y) so that the GPU
// fills.  Each block stores its sums into part (pss [S][T] doubles, then
// pa [S][T][nmix]); the block of a token group that finishes last
// (count[blockIdx.x] says, and it resets it) adds the slices in slice
// order: the same logits whatever the timing.  count NULL: the slices
// are left for the kernel after (hc_slice_logits: the same sums, a block
// a token).  S = 1: the block's sums are the logits.
template <int NMP>
__device__ __forceinline__ void hc_store_logits(float (*red)[NMP + 1], const double *rss,
                                                int nmix, int T, int t0, int tn, long long n,
                                                float norm_eps, float *m, int S, void *part,
                                                int *count)
{
    __shared__ bool last;
    int tid = threadIdx.x;
    if (S == 1) {
        for (int i = tid; i < tn * nmix; i += blockDim.x) {
            int tt = i / nmix, j = i % nmix;
            if (t0 + tt < T)
                m[(long long)(t0 + tt) * nmix + j] =
                    red[tt][j] * (1.0f / sqrtf((float)(rss[tt] / n) + norm_eps));
        }
        return;
    }
    double *pss = (double *)part;
    float *pa = (float *)(pss + (long long)S * T);
    long long s = blockIdx.y;
    for (int i = tid; i < tn * nmix; i += blockDim.x) {
        int tt = i / nmix, j = i % nmix;
        if (t0 + tt < T) pa[(s * T + t0 + tt) * nmix + j] = red[tt][j];
    }
    for (int tt = tid; tt < tn; tt += blockDim.x)
        if (t0 + tt < T) pss[s * T + t0 + tt] = rss[tt];
    if (!count) return;     // the kernel after adds the slices (hc_slice_logits)
    __threadfence();
    __syncthreads();
    if (tid == 0) last = atomicAdd(&count[blockIdx.x], 1) == S - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (tid == 0) count[blockIdx.x] = 0;
    for (int i = tid; i < tn * nmix; i += blockDim.x) {
        int tt = i / nmix, j = i % nmix, t = t0 + tt;
        if (t >= T) continue;
        float a = 0;
        double ss = 0;
        for (int k = 0; k < S; k++) {
            a += __ldcg(pa + ((long long)k * T + t) * nmix + j);
            ss += __ldcg(pss + (long long)k * T + t);
        }
        m[(long long)t * nmix + j] = a * (1.0f / sqrtf((float)(ss / n) + norm_eps));
    }
}

// Slices for `groups` token groups over `chunks` column chunks: none when
// the groups fill the SMs (or outnumber the counters), else enough for
// about two blocks an SM, at least `per` chunks a slice.  (4 before: a B
// = 64 step's hc_post_logits as 64 blocks of 4 chunks; runs G2-G4 on an
// H100, 2: B = 64 4.77 -> 4.72-4.74 ms, B = 32 3.65 -> 3.61; 1 no faster
// while one block added every slice; hc_post_logits takes 1 since its
// slices are added by the collapse's blocks: run A3.)
static int hc_slices(int groups, int chunks, int per = 2)
{
    int sm = cu_sm_count();
    if (groups >= sm || groups > HC_COUNT_MAX) return 1;
    int S = (2 * sm + groups - 1) / groups, most = chunks / per;
    return S <= most ? S : most > 1 ? most : 1;
}

static size_t hc_part_bytes(int S, int T, int nmix)
{
    return S > 1 ? (size_t)S * T * (sizeof(double) + nmix * sizeof(float)) : 0;
}

// Many tokens: the same logits for HCL_T tokens per block, all nmix of
// them, so fn is read once per HCL_T tokens (from L2) instead of once per
// token.  K runs in chunks of HCL_K columns staged in shared memory (h
// transposed, a lane per token; fn as [k][j] so a warp reads fn[k][0..NMP)
// as broadcast float4s); warp w takes columns w, w + 8, ... of a chunk,
// with NMP sums and the sum of squares (double) per lane, and the 8 warps'
// partial sums are added in warp order at the end.  The next chunk's
// loads are in flight while a chunk is multiplied.
#define HCL_T 32
#define HCL_K 64
template <int NMP>
__global__ void __launch_bounds__(256) hc_logits_tile_kernel(const float *h, int T, int n,
                                                             const float *fn, int nmix,
                                                             float norm_eps, float *m, int S,
                                                             void *part, int *count)
{
    __shared__ float hs[HCL_K][HCL_T + 1];
    __shared__ __align__(16) float fs[HCL_K][NMP];
    __shared__ float red[HCL_T][NMP + 1];
    __shared__ double rss[HCL_T];
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, t0 = blockIdx.x * HCL_T;
    constexpr int HQ = HCL_T * HCL_K / 4 / 256, FQ = (NMP * HCL_K / 4 + 255) / 256;
    float4 hv[HQ], fv[FQ];
    auto load = [&](int k0) {
#pragma unroll
        for (int i = 0; i < HQ; i++) {
            int q = tid + 256 * i, t = q / (HCL_K / 4), kq = q % (HCL_K / 4);
            hv[i] = t0 + t < T ? *(const float4 *)(h + (long long)(t0 + t) * n + k0 + 4 * kq)
                               : make_float4(0, 0, 0, 0);
        }
#pragma unroll
        for (int i = 0; i < FQ; i++) {
            int q = tid + 256 * i, j = q / (HCL_K / 4), kq = q % (HCL_K / 4);
            fv[i] = j < nmix ? *(const float4 *)(fn + (long long)j * n + k0 + 4 * kq)
                             : make_float4(0, 0, 0, 0);
        }
    };
    float acc[NMP];
#pragma unroll
    for (int j = 0; j < NMP; j++) acc[j] = 0;
    double ss = 0;
    // slice blockIdx.y of S: chunks [kb, ke) of HCL_K columns
    int nch = n / HCL_K, kb = (int)((long long)nch * blockIdx.y / S) * HCL_K,
        ke = (int)((long long)nch * (blockIdx.y + 1) / S) * HCL_K;
    load(kb);
    for (int k0 = kb; k0 < ke; k0 += HCL_K) {
        __syncthreads();
#pragma unroll
        for (int i = 0; i < HQ; i++) {
            int q = tid + 256 * i, t = q / (HCL_K / 4), k = 4 * (q % (HCL_K / 4));
            hs[k][t] = hv[i].x, hs[k + 1][t] = hv[i].y, hs[k + 2][t] = hv[i].z, hs[k + 3][t] = hv[i].w;
        }
#pragma unroll
        for (int i = 0; i < FQ; i++) {
            int q = tid + 256 * i, j = q / (HCL_K / 4), k = 4 * (q % (HCL_K / 4));
            if (j < NMP)
                fs[k][j] = fv[i].x, fs[k + 1][j] = fv[i].y, fs[k + 2][j] = fv[i].z, fs[k + 3][j] = fv[i].w;
        }
        __syncthreads();
        if (k0 + HCL_K < ke) load(k0 + HCL_K);
#pragma unroll
        for (int kk = 0; kk < HCL_K / 8; kk++) {
            int k = warp + 8 * kk;
            float x = hs[k][lane];
            ss += (double)x * x;
#pragma unroll
            for (int j = 0; j < NMP; j += 4) {
                float4 f = *(const float4 *)&fs[k][j];
                acc[j] += x * f.x, acc[j + 1] += x * f.y, acc[j + 2] += x * f.z, acc[j + 3] += x * f.w;
            }
        }
    }
    hc_sum_warps<NMP>(red, rss, acc, ss, warp, lane);
    hc_store_logits<NMP>(red, rss, nmix, T, t0, HCL_T, n, norm_eps, m, S, part, count);
}

size_t cu_hc_logits_many_part(int T, int n, int nmix)
{
    return n % HCL_K ? 0 : hc_part_bytes(hc_slices((T + HCL_T - 1) / HCL_T, n / HCL_K), T, nmix);
}

bool cu_hc_logits_many(cudaStream_t st, const float *h, int T, int n, const float *fn, int nmix,
                       float norm_eps, float *m, void *part, int *count)
{
    if (n % HCL_K || (uintptr_t)h % 16 || (uintptr_t)fn % 16 || nmix > 32) return false;
    if (T <= 0) return true;
    int groups = (T + HCL_T - 1) / HCL_T, S = part ? hc_slices(groups, n / HCL_K) : 1;
    dim3 grid(groups, S);
    if (nmix <= 8)
        hc_logits_tile_kernel<8><<<grid, 256, 0, st>>>(h, T, n, fn, nmix, norm_eps, m, S, part, count);
    else if (nmix <= 24)
        hc_logits_tile_kernel<24><<<grid, 256, 0, st>>>(h, T, n, fn, nmix, norm_eps, m, S, part, count);
    else
        hc_logits_tile_kernel<32><<<grid, 256, 0, st>>>(h, T, n, fn, nmix, norm_eps, m, S, part, count);
    return true;
}

// r[t] = rsqrt(mean(h[t]^2) + eps), one block per token.
__global__ void hc_rms_kernel(const float *h, int n, float norm_eps, float *r)
{
    pdl_wait();
    __shared__ double shd[32];
    const float *ht = h + (long long)blockIdx.x * n;
    double ss = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += (double)ht[i] * ht[i];
    ss = block_sum(ss, shd);
    if (threadIdx.x == 0) r[blockIdx.x] = 1.0f / sqrtf((float)(ss / n) + norm_eps);
}

void cu_hc_rms(cudaStream_t st, const float *h, int T, int n, float norm_eps, float *r)
{
    if (T > 0) cu_launch(hc_rms_kernel, T, 256, 0, st, h, n, norm_eps, r);
}

// Blocks (token, slice of H): the mix (cpu_hc_mix's operations in its
// order), every block of a token computing the same and block 0 writing
// post and comb, then the collapse of the block's columns, sum_k pre[k]
// h[k].  The Sinkhorn matrix has an element per thread (hc * hc <=
// blockDim), shared between the steps, so each step's hc * hc divisions
// run at once and each element's sums are taken in the CPU's order.  (In
// one thread, or a row per lane, the 20 rounds' dependent IEEE divisions
// made this a 28-30 us kernel; 12.6 us now: ncu, runs D5-D6 of
// docs/GPU_NOTES.md.)  r: NULL, or m holds unnormalized dot products to
// be multiplied by r[t].
__global__ void hc_collapse_kernel(const float *h, int hc, int H, const float *m, const float *r,
                                   const float *base, const float *scale, int iters,
                                   float hc_eps, float *post, float *comb, float *out, int head)
{
    pdl_wait();
    __shared__ float pre[HC_MAX], cm[HC_MAX * HC_MAX];
    int t = blockIdx.x, e = threadIdx.x, nmix = head ? hc : (2 + hc) * hc;
    bool first = blockIdx.y == 0 && !head, own = !head && e < hc * hc;
    int i = own ? e / hc : 0, j = own ? e % hc : 0;
    const float *mt = m + (long long)t * nmix, *ht = h + (long long)t * hc * H;
    float rt = r ? r[t] : 1.0f;
    if (e < hc) {
        float m0 = r ? mt[e] * rt : mt[e];
        pre[e] = sigmoidf_(m0 * scale[0] + base[e]) + hc_eps;
        if (first) {
            float m1 = r ? mt[hc + e] * rt : mt[hc + e];
            post[(long long)t * hc + e] = 2.0f * sigmoidf_(m1 * scale[1] + base[hc + e]);
        }
    }
    if (!head) {
        // Row i's softmax, then rounds of row and column normalization.
        float v = 0;
        if (own) {
            float mv = r ? mt[2 * hc + e] * rt : mt[2 * hc + e];
            v = mv * scale[2] + base[2 * hc + e];
            cm[e] = v;
        }
        __syncthreads();
        if (own) {
            float mx = -INFINITY;
            for (int k = 0; k < hc; k++)
                if (cm[i * hc + k] > mx) mx = cm[i * hc + k];
            v = expf(v - mx);
        }
        __syncthreads();
        if (own) cm[e] = v;
        __syncthreads();
        if (own) {
            float sum = 0;
            for (int k = 0; k < hc; k++) sum += cm[i * hc + k];
            v = v / sum + hc_eps;
        }
        for (int it = 0; it < iters; it++) {
            for (int col = it > 0 ? 0 : 1; col < 2; col++) {
                __syncthreads();
                if (own) cm[e] = v;
                __syncthreads();
                if (own) {
                    float sum = 0;
                    for (int k = 0; k < hc; k++) sum += col ? cm[k * hc + j] : cm[i * hc + k];
                    v /= sum + hc_eps;
                }
            }
        }
        if (first && own) comb[(long long)t * hc * hc + e] = v;
    }
    __syncthreads();
    for (int d = blockIdx.y * blockDim.x + threadIdx.x; d < H; d += gridDim.y * blockDim.x) {
        float s = 0;
        for (int k = 0; k < hc; k++) s += pre[k] * ht[(long long)k * H + d];
        out[(long long)t * H + d] = s;
    }
}

void cu_hc_collapse(cudaStream_t st, const float *h, int T, int hc, int H, const float *m,
                    const float *r, const float *base, const float *scale, int iters,
                    float hc_eps, float *post, float *comb, float *collapsed, bool head)
{
    // A few tokens: a block per 256 columns (the mix is short beside the
    // collapse's memory latency); many: a block per token.
    dim3 grid(T, T < 64 ? blocks_for(H, 256) : 1);
    if (T > 0)
        cu_launch(hc_collapse_kernel, grid, 256, 0, st, h, hc, H, m, r, base, scale, iters, hc_eps,
                  post, comb, collapsed, head);
}

// Stream k of a column after hc_post (its operations in its order, the
// multiply-adds fused explicitly so that every caller gets the same bits).
__device__ __forceinline__ float hc_mixed(const float *o, int k, int hc, float y, const float *pp,
                                          const float *cc)
{
    float sv = 0;
#pragma unroll
    for (int jj = 0; jj < HC_FUSED_MAX; jj++)
        if (jj < hc) sv = __fmaf_rn(cc[jj * hc + k], o[jj], sv);
    return __fmaf_rn(pp[k], y, sv);
}

// Columns [W q, W q + W) of a token's hc streams ht [hc][H] into o, and
// of y (yt, when not NULL) into yv.
template <int W>
__device__ __forceinline__ void hc_load_cols(const float *ht, int hc, int H, int q,
                                             const float *yt, float (&o)[HC_FUSED_MAX][W],
                                             float (&yv)[W])
{
#pragma unroll
    for (int k = 0; k < HC_FUSED_MAX; k++) {
        if (k >= hc) break;
        if (W == 4) *(float4 *)o[k] = ((const float4 *)(ht + (long long)k * H))[q];
        else o[k][0] = ht[(long long)k * H + q];
    }
    if (yt) {
        if (W == 4) *(float4 *)yv = ((const float4 *)yt)[q];
        else yv[0] = yt[q];
    }
}

// Columns [Wq, Wq + W) of the hc rows of f [hc][H] into fv.
template <int W>
__device__ __forceinline__ void hc_load_f(const float *f, int hc, int H, int q,
                                          float (&fv)[HC_FUSED_MAX][W])
{
#pragma unroll
    for (int k = 0; k < HC_FUSED_MAX; k++) {
        if (k >= hc) break;
        if (W == 4) *(float4 *)fv[k] = ((const float4 *)(f + (long long)k * H))[q];
        else fv[k][0] = f[(long long)k * H + q];
    }
}

// Columns [Wq, Wq + W) of a token's streams for hc_pre_norm_kernel,
// loaded (o: the hc streams, yv: y's columns; after hc_post when yt is not
// NULL), added into the logit's dot product with f's columns fv and the
// sum of squares.
template <int W>
__device__ __forceinline__ void hc_cols_loaded(int hc, const float *yt, const float *pp,
                                               const float *cc,
                                               const float (&o)[HC_FUSED_MAX][W],
                                               const float (&yv)[W],
                                               const float (&fv)[HC_FUSED_MAX][W], float &a,
                                               double &ss)
{
    constexpr int HCF = HC_FUSED_MAX;
#pragma unroll
    for (int k = 0; k < HCF; k++) {
        if (k >= hc) break;
        float v[W];
#pragma unroll
        for (int c = 0; c < W; c++) {
            float oc[HCF];
#pragma unroll
            for (int jj = 0; jj < HCF; jj++) oc[jj] = o[jj][c];
            v[c] = yt ? hc_mixed(oc, k, hc, yv[c], pp, cc) : o[k][c];
            ss += (double)v[c] * v[c];
            a += v[c] * fv[k][c];
        }
    }
}

// The same, loading the columns.
template <int W>
__device__ __forceinline__ void hc_cols(const float *ht, int hc, int H, int q, const float *yt,
                                        const float *pp, const float *cc,
                                        const float (&fv)[HC_FUSED_MAX][W], float &a, double &ss)
{
    float o[HC_FUSED_MAX][W], yv[W];
    hc_load_cols<W>(ht, hc, H, q, yt, o, yv);
    hc_cols_loaded<W>(hc, yt, pp, cc, o, yv, fv, a, ss);
}

// Columns [Wq, Wq + W) of a token's streams in hc_pre_norm_kernel's last
// block, loaded (o: the hc streams, yv: y's columns): after hc_post (yt
// not NULL; stored), collapsed with the pre weights into col (global; ct
// NULL: not stored) and sv, their sum of squares back.
template <int W>
__device__ __forceinline__ double hc_collapse_loaded(float *ht, int hc, int H, int q,
                                                     const float *yt, const float *pp,
                                                     const float *cc, const float *pre,
                                                     const float (&o)[HC_FUSED_MAX][W],
                                                     const float (&yv)[W], float *ct,
                                                     float (&sv)[W])
{
    constexpr int HCF = HC_FUSED_MAX;
#pragma unroll
    for (int c = 0; c < W; c++) sv[c] = 0;
#pragma unroll
    for (int k = 0; k < HCF; k++) {
        if (k >= hc) break;
        float v[W];
#pragma unroll
        for (int c = 0; c < W; c++) {
            float oc[HCF];
#pragma unroll
            for (int jj = 0; jj < HCF; jj++) oc[jj] = o[jj][c];
            v[c] = yt ? hc_mixed(oc, k, hc, yv[c], pp, cc) : o[k][c];
            sv[c] += pre[k] * v[c];
        }
        if (yt) {
            if (W == 4) ((float4 *)(ht + (long long)k * H))[q] = *(float4 *)v;
            else ht[(long long)k * H + q] = v[0];
        }
    }
    double s2 = 0;
#pragma unroll
    for (int c = 0; c < W; c++) s2 += (double)sv[c] * sv[c];
    if (ct && W == 4) ((float4 *)ct)[q] = *(float4 *)sv;
    else if (ct) ct[q] = sv[0];
    return s2;
}

// The same, loading the columns, the collapsed ones also into cs (shared).
template <int W>
__device__ __forceinline__ double hc_collapse_cols(float *ht, int hc, int H, int q,
                                                   const float *yt, const float *pp,
                                                   const float *cc, const float *pre,
                                                   float *ct, float *cs)
{
    float o[HC_FUSED_MAX][W], yv[W], sv[W];
    hc_load_cols<W>(ht, hc, H, q, yt, o, yv);
    double s2 = hc_collapse_loaded<W>(ht, hc, H, q, yt, pp, cc, pre, o, yv, ct, sv);
#pragma unroll
    for (int c = 0; c < W; c++) cs[W * q + c] = sv[c];
    return s2;
}

// hc_pre's Sinkhorn on one warp (an element per lane, sums through
// shuffles in hc_collapse_kernel's order) from the logits mt: comb into
// combt.  Lanes past hc * hc compute on zeros and store nothing.
__device__ __forceinline__ void hc_sinkhorn_warp(const float *mt, const float *base,
                                                 const float *scale, int hc, int iters,
                                                 float hc_eps, float *combt)
{
    int e = threadIdx.x & 31;
    // Row i's softmax, then rounds of row and column normalization.
    bool own = e < hc * hc;
    int i = own ? e / hc : 0, jj = own ? e % hc : 0;
    float v = own ? mt[2 * hc + e] * scale[2] + base[2 * hc + e] : 0.0f;
    // (Loops unrolled to HC_FUSED_MAX, hc uniform over the warp: a
    // round's shuffles issue together.)
    float mx = -INFINITY;
#pragma unroll
    for (int k = 0; k < HC_FUSED_MAX; k++) {
        if (k >= hc) break;
        float o = __shfl_sync(0xffffffffu, v, i * hc + k);
        if (o > mx) mx = o;
    }
    v = expf(v - mx);
    float sum = 0;
#pragma unroll
    for (int k = 0; k < HC_FUSED_MAX; k++) {
        if (k >= hc) break;
        sum += __shfl_sync(0xffffffffu, v, i * hc + k);
    }
    v = v / sum + hc_eps;
    for (int it = 0; it < iters; it++) {
        for (int c = it > 0 ? 0 : 1; c < 2; c++) {
            float o[HC_FUSED_MAX];
#pragma unroll
            for (int k = 0; k < HC_FUSED_MAX; k++)
                o[k] = __shfl_sync(0xffffffffu, v, (c ? k * hc + jj : i * hc + k) & 31);
            sum = 0;
#pragma unroll
            for (int k = 0; k < HC_FUSED_MAX; k++)
                if (k < hc) sum += o[k];
            v /= sum + hc_eps;
        }
    }
    if (own) combt[e] = v;
}

// pre (shared) and post (postt) of one token from its logits mt.
__device__ __forceinline__ void hc_pre_post(const float *mt, const float *base,
                                            const float *scale, int hc, float hc_eps, float *pre,
                                            float *postt)
{
    int e = threadIdx.x;
    if (e < hc) {
        pre[e] = sigmoidf_(mt[e] * scale[0] + base[e]) + hc_eps;
        float m1 = mt[hc + e];
        postt[e] = 2.0f * sigmoidf_(m1 * scale[1] + base[hc + e]);
    }
}

// The end of hc_pre and its RMSNorm for one token once its logits mt
// (shared memory) are known, by a block of 64+ threads: pre and post
// (postt), then the Sinkhorn (combt) on the first warp while the other
// warps collapse the streams ht into ct (NULL: not stored) and cs [H]
// (after hc_post when yt is not NULL: the new streams stored; 16-byte
// accesses when v4), then,
// ot not NULL, the RMSNorm of the collapsed row kept in cs
// (rmsnorm_kernel's operations) into ot.  The Sinkhorn's chain of
// divisions overlaps the collapse.  pre: shared, [HC_MAX].
__device__ __forceinline__ void hc_mix_collapse_norm(float *ht, const float *yt, int hc, int H,
                                                     bool v4, const float *mt,
                                                     const float *base, const float *scale,
                                                     int iters, float hc_eps, float norm_eps,
                                                     const float *nw, const float *pp,
                                                     const float *cc, float *pre, double *shd,
                                                     float *postt, float *combt, float *ct,
                                                     float *cs, float *ot)
{
    int e = threadIdx.x;
    hc_pre_post(mt, base, scale, hc, hc_eps, pre, postt);
    __syncthreads();
    double s2 = 0;
    if (e < 32) {
        hc_sinkhorn_warp(mt, base, scale, hc, iters, hc_eps, combt);
    } else {
        if (v4) {
            for (int q = e - 32; q < H / 4; q += blockDim.x - 32)
                s2 += hc_collapse_cols<4>(ht, hc, H, q, yt, pp, cc, pre, ct, cs);
        } else {
            for (int q = e - 32; q < H; q += blockDim.x - 32)
                s2 += hc_collapse_cols<1>(ht, hc, H, q, yt, pp, cc, pre, ct, cs);
        }
    }
    if (!ot) return;
    s2 = block_sum(s2, shd);
    float r = 1.0f / sqrtf((float)(s2 / H) + norm_eps);
    for (int d = e - 32; e >= 32 && d < H; d += blockDim.x - 32)
        ot[d] = nw ? nw[d] * (cs[d] * r) : cs[d] * r;
}

// float4 columns of the streams per thread of hc_tail (each pass's loads
// issued together): with 480 threads, H up to 5,760.
#define HC_TAIL_Q 3

// hc_tail's loads for a collapsing thread (threadIdx.x >= 32): its norm
// weights (wv; ones when none are used) and its columns' old streams and
// y, HC_TAIL_Q float4 columns apart by the collapsing threads' count.
__device__ __forceinline__ void hc_tail_load(const float *ht, const float *yt, int hc, int H,
                                             const float *nw, float4 (&wv)[HC_TAIL_Q],
                                             float (&o)[HC_TAIL_Q][HC_FUSED_MAX][4],
                                             float (&yv)[HC_TAIL_Q][4])
{
    int u = threadIdx.x - 32, nt = blockDim.x - 32, nq = H / 4;
#pragma unroll
    for (int b = 0; b < HC_TAIL_Q; b++) {
        int q = u + b * nt;
        wv[b] = nw && q < nq ? ((const float4 *)nw)[q] : make_float4(1, 1, 1, 1);
        if (q < nq) hc_load_cols<4>(ht, hc, H, q, yt, o[b], yv[b]);
    }
}

// hc_mix_collapse_norm laid out for latency (16-byte columns, H <=
// HC_TAIL_Q * 4 * (blockDim.x - 32); ot 16-byte aligned; the same
// operations in the same order, so the same bits): warp 0 runs the
// Sinkhorn and leaves; every other thread, its loads issued together
// beforehand (hc_tail_load: wv, o, yv), collapses its columns, keeps the
// collapsed row in registers, adds the sums of squares with the other
// collapsing warps alone (block_sum's order, warp 0's part a zero; named
// barrier 1), and writes its columns' RMSNorm, so the norm no longer
// waits for the Sinkhorn nor loads its weights one at a time.
__device__ __forceinline__ void hc_tail(float *ht, const float *yt, int hc, int H,
                                        const float *mt, const float *base, const float *scale,
                                        int iters, float hc_eps, float norm_eps, const float *nw,
                                        const float *pp, const float *cc, float *pre, double *shd,
                                        float *postt, float *combt, float *ct, float *ot,
                                        const float4 (&wv)[HC_TAIL_Q],
                                        const float (&o)[HC_TAIL_Q][HC_FUSED_MAX][4],
                                        const float (&yv)[HC_TAIL_Q][4])
{
    int e = threadIdx.x;
    hc_pre_post(mt, base, scale, hc, hc_eps, pre, postt);
    __syncthreads();
    if (e < 32) {
        hc_sinkhorn_warp(mt, base, scale, hc, iters, hc_eps, combt);
        return;
    }
    int u = e - 32, nt = blockDim.x - 32, nq = H / 4;
    float sv[HC_TAIL_Q][4];
    double s2 = 0;
#pragma unroll
    for (int b = 0; b < HC_TAIL_Q; b++) {
        int q = u + b * nt;
        if (q < nq) s2 += hc_collapse_loaded<4>(ht, hc, H, q, yt, pp, cc, pre, o[b], yv[b], ct, sv[b]);
    }
    for (int k = 16; k; k >>= 1) s2 += __shfl_xor_sync(0xffffffffu, s2, k);
    if ((e & 31) == 0) shd[e >> 5] = s2;
    if (e == 32) shd[0] = 0;
    asm volatile("bar.sync 1, %0;" ::"r"(nt) : "memory");
    s2 = (e & 31) < (int)(blockDim.x >> 5) ? shd[e & 31] : 0.0;
    for (int k = 16; k; k >>= 1) s2 += __shfl_xor_sync(0xffffffffu, s2, k);
    float r = 1.0f / sqrtf((float)(s2 / H) + norm_eps);
#pragma unroll
    for (int b = 0; b < HC_TAIL_Q; b++) {
        int q = u + b * nt;
        if (q >= nq) break;
        float w[4] = { wv[b].x, wv[b].y, wv[b].z, wv[b].w }, y[4];
#pragma unroll
        for (int c = 0; c < 4; c++) y[c] = nw ? w[c] * (sv[b][c] * r) : sv[b][c] * r;
        ((float4 *)ot)[q] = make_float4(y[0], y[1], y[2], y[3]);
    }
}

// hc_pre and the RMSNorm of its collapsed row in one launch, for a few
// tokens and hc <= HC_FUSED_MAX; with y, the previous sublayer's hc_post
// first.  Blocks (j + nmix * split, t) compute logit j of token t over one
// of S slices of the columns (S > 1 when few tokens leave SMs idle), as
// hc_logits_kernel does (with y: on the streams after hc_post, computed
// from the old ones in registers; only the last block stores them); the
// block of token t that finishes last (count[t] says, and that block
// resets it for the next launch) adds the slices in order and finishes
// (hc_mix_collapse_norm: one block's latency-bound pass over the
// streams).  One launch instead of three or four.  TAIL (where hc_tail
// takes the shape): each block loads its first columns of fn and has a
// slice of nw brought into L2 before waiting for the kernel before it
// (weights: nothing earlier writes them), and the last block ends with
// hc_tail; the same operations either way.
template <bool TAIL>
__global__ void __launch_bounds__(512) hc_pre_norm_kernel(float *h, const float *y, int hc, int H,
                                                          const float *fn, const float *base,
                                                          const float *scale, int iters,
                                                          float hc_eps, float norm_eps,
                                                          const float *nw, int nmix, int S,
                                                          float *pa, double *pss, int *count,
                                                          float *post, float *comb,
                                                          float *col, float *out)
{
    __shared__ double shd[32];
    __shared__ float shf[32];
    __shared__ float pre[HC_MAX], pp[HC_FUSED_MAX], cc[HC_FUSED_MAX * HC_FUSED_MAX];
    __shared__ float mt[(2 + HC_FUSED_MAX) * HC_FUSED_MAX];
    __shared__ bool last;
    extern __shared__ float cs[];       // [H] the collapsed row (last block)
    int j = blockIdx.x % nmix, sp = blockIdx.x / nmix, t = blockIdx.y, n = hc * H;
    int e = threadIdx.x;
    float *ht = h + (long long)t * n;   // old streams until the last block stores
    const float *f = fn + (long long)j * n, *yt = y ? y + (long long)t * H : NULL;
    bool v4 = H % 4 == 0 && (uintptr_t)h % 16 == 0 && (uintptr_t)fn % 16 == 0 &&
              (uintptr_t)y % 16 == 0 && (uintptr_t)col % 16 == 0;
    // This block's share of the columns: split sp of S.
    int Q = v4 ? H / 4 : H;
    int q0 = (int)((long long)Q * sp / S), q1 = (int)((long long)Q * (sp + 1) / S);
    // TAIL: the thread's first columns of fn loaded before the wait, of
    // the streams and y with post and comb (one round trip, not two).
    float f4[HC_FUSED_MAX][4], o4[HC_FUSED_MAX][4], y4[4];
    bool first = TAIL && q0 + e < q1;
    if (first) hc_load_f<4>(f, hc, H, q0 + e, f4);
    if (TAIL) {
        int lines = (H + 31) / 32, b = blockIdx.y * gridDim.x + blockIdx.x;
        for (int l = b + e * gridDim.x * gridDim.y; nw && l < lines; l += 512 * gridDim.x * gridDim.y)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(nw + 32 * l));
    }
    pdl_wait();
    if (first) hc_load_cols<4>(ht, hc, H, q0 + e, yt, o4, y4);
    if (y && e < hc) pp[e] = post[(long long)t * hc + e];
    if (y && e < hc * hc) cc[e] = comb[(long long)t * hc * hc + e];
    __syncthreads();
    double ss = 0;
    float a = 0;
    if (TAIL) {
        for (int q = q0 + e; q < q1; q += blockDim.x) {
            if (q > q0 + e) {
                hc_load_f<4>(f, hc, H, q, f4);
                hc_load_cols<4>(ht, hc, H, q, yt, o4, y4);
            }
            hc_cols_loaded<4>(hc, yt, pp, cc, o4, y4, f4, a, ss);
        }
    } else if (v4) {
        for (int q = q0 + e; q < q1; q += blockDim.x) {
            hc_load_f<4>(f, hc, H, q, f4);
            hc_cols<4>(ht, hc, H, q, yt, pp, cc, f4, a, ss);
        }
    } else {
        for (int q = q0 + e; q < q1; q += blockDim.x) {
            float f1[HC_FUSED_MAX][1];
            hc_load_f<1>(f, hc, H, q, f1);
            hc_cols<1>(ht, hc, H, q, yt, pp, cc, f1, a, ss);
        }
    }
    if (TAIL) {
        block_sum2(ss, a, shd, shf);
    } else {
        ss = block_sum(ss, shd);
        a = block_sum(a, shf);
    }
    if (e == 0) {
        pa[((long long)t * nmix + j) * S + sp] = a;
        if (j == 0) pss[(long long)t * S + sp] = ss;
        __threadfence();
        last = atomicAdd(&count[t], 1) == nmix * S - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    // TAIL: the collapsing warps' loads go out with the logits' parts.
    float4 wv[HC_TAIL_Q];
    float ot4[HC_TAIL_Q][HC_FUSED_MAX][4], yv4[HC_TAIL_Q][4];
    if (TAIL && e >= 32) hc_tail_load(ht, yt, hc, H, nw, wv, ot4, yv4);
    if (e == 0) count[t] = 0;
    // The logits: the splits' parts added in split order.
    if (e < nmix) {
        double s2 = 0;
        float aj = 0;
        for (int k = 0; k < S; k++) {
            s2 += __ldcg(pss + (long long)t * S + k);
            aj += __ldcg(pa + ((long long)t * nmix + e) * S + k);
        }
        mt[e] = aj * (1.0f / sqrtf((float)(s2 / n) + norm_eps));
    }
    __syncthreads();
    // Every other block has read the old streams: this one stores the new.
    if (TAIL)
        hc_tail(ht, yt, hc, H, mt, base, scale, iters, hc_eps, norm_eps, nw, pp, cc, pre, shd,
                post + (long long)t * hc, comb + (long long)t * hc * hc, col + (long long)t * H,
                out + (long long)t * H, wv, ot4, yv4);
    else
        hc_mix_collapse_norm(ht, yt, hc, H, v4, mt, base, scale, iters, hc_eps, norm_eps, nw, pp,
                             cc, pre, shd, post + (long long)t * hc,
                             comb + (long long)t * hc * hc, col + (long long)t * H, cs,
                             out + (long long)t * H);
}

// hc_pre_norm of a few tokens for hc = HC, a cluster of HCC blocks a
// token (grid (T, HCC), clusters (1, HCC, 1)): block r owns the float4
// columns [Q r / HCC, Q (r + 1) / HCC) of every stream (Q = H / 4), so no
// block reads what another writes and no last block waits for the rest.
// Thread (column qi, group jg) multiplies its columns' streams (after
// hc_post with y) with the fn rows of logits jg, jg + NJ, ... (its first
// columns of fn, the norm weights, base and scale loaded before the
// wait: weights); group 0 also stores the new streams, keeps them in
// shared memory and adds their squares.  A block's NMIX logit parts and
// sum of squares go to every block of the cluster (distributed shared
// memory), and each adds them in rank order, so all blocks hold the same
// logits.  Then each collapses its own columns with pre, the sums of
// squares of the collapsed row meet the same way, and each writes its
// columns' RMSNorm; rank 0 stores post, and one warp of rank 1 runs the
// Sinkhorn between its arrival at the last barrier and its wait there.
// Three cluster barriers (four with the router, ROUTE: below) instead of
// the one-launch kernel's counter, fences and single last block (ops of
// the same results within rounding: sums in another order).
#define HCC 16
#define HCC_QT 64
#define HCC_QB ((12 * 1024 / 4 + HCC - 1) / HCC)
// Tokens with the router: 1 or 2, where the MoE is cu_moe_decode's (runs
// U3-U5, rank6 at 8K, router here / in its own launches: batch 1
// 0.98-1.02 / 0.99-1.05 ms, 2 1.26-1.30 / 1.29-1.31; 4 1.84-1.90 /
// 1.85-1.86, 8 2.73-2.82 / 2.74-2.76: from 3 tokens the expert tiles'
// router runs beside the shared expert, and every cluster stages the
// whole gate).
#define HCC_MAX_T 2
// With the router: shared memory for E gate rows of nc columns (a block's
// share of H), the rank-0 parts [HCC][E], the normed columns and the
// router's state.
#define HCR_E_MAX 256
#define HCR_NC_MAX 256
#define HCR_SURV (16 * TOPK_MAX)  // the top-k's survivors: at most K a warp
#define HCR_SMEM(E, nc)                                                                    \
    ((size_t)(E) * ((nc) + 8) * 2 +                                                        \
     ((size_t)HCC * (E) + (nc) + 2 * (size_t)(E) + 2 * HCR_SURV + TOPK_MAX + 16) * 4)
#define HCR_SMEM_MAX HCR_SMEM(HCR_E_MAX, HCR_NC_MAX)

__device__ __forceinline__ void cluster_arrive()
{
    asm volatile("barrier.cluster.arrive.release;" ::: "memory");
}

__device__ __forceinline__ void cluster_wait()
{
    asm volatile("barrier.cluster.wait.acquire;" ::: "memory");
}

template <int HC, bool ROUTE, bool HEAD = false>
__global__ void __launch_bounds__(512) hc_pre_cluster_kernel(float *h, const float *y, int H,
                                                             const float *fn, const float *base,
                                                             const float *scale, int iters,
                                                             float hc_eps, float norm_eps,
                                                             const float *nw, float *post,
                                                             float *comb, float *col, float *out,
                                                             cu_hc_route R)
{
    // HEAD: the model's last collapse (hc_head: HC logits, pre weights
    // only; post and comb are read for hc_post, not written).
    constexpr int NMIX = HEAD ? HC : (2 + HC) * HC, NJ = 512 / HCC_QT, JPT = (NMIX + NJ - 1) / NJ;
    static_assert(HCC * (NMIX + 1) <= 512 && HC <= HC_FUSED_MAX, "a thread a pushed part");
    __shared__ float4 vs[HCC_QB * HC];          // the block's columns of the new streams
    __shared__ float red[NJ][2][JPT], pa[HCC][NMIX], mt[NMIX], sb[NMIX], ssc[3];
    __shared__ float pre[HC], pp[HC_FUSED_MAX], cc[HC_FUSED_MAX * HC_FUSED_MAX];
    __shared__ double redss[2], s2w[2], pss[HCC], ps2[HCC];
    cg::cluster_group cl = cg::this_cluster();
    int t = blockIdx.x, rank = (int)cl.block_rank(), e = threadIdx.x, lane = e & 31, w = e >> 5;
    int qi = e % HCC_QT, jg = e / HCC_QT, n = HC * H, Q = H / 4;
    int q0 = (int)((long long)Q * rank / HCC), q1 = (int)((long long)Q * (rank + 1) / HCC);
    float *ht = h + (long long)t * n;
    const float *yt = y ? y + (long long)t * H : NULL;
    float4 f[JPT][HC], wv = make_float4(1, 1, 1, 1);
    auto load_f = [&](int q) {
#pragma unroll
        for (int i = 0; i < JPT; i++)
#pragma unroll
            for (int k = 0; k < HC; k++)
                if (jg + NJ * i < NMIX)
                    f[i][k] = ((const float4 *)(fn + (long long)(jg + NJ * i) * n + (long long)k * H))[q];
    };
    // Every block of the cluster has started before any writes to another's
    // shared memory (the wait comes before the first push).
    cluster_arrive();
    bool first = q0 + qi < q1;
    if (first) load_f(q0 + qi);
    if (nw && e < HCC_QT && first) wv = ((const float4 *)nw)[q0 + e];
    if (e < NMIX) sb[e] = base[e];
    if (e < (HEAD ? 1 : 3)) ssc[e] = scale[e];
    // ROUTE: the gate's columns of this block on their way into shared
    // memory (gs [E][nc]), rank 0's biases in registers.
    extern __shared__ __align__(16) unsigned char hcr_sm[];
    const int nc = 4 * (q1 - q0);
    uint16_t *gs = (uint16_t *)hcr_sm;
    const int gst = nc + 8;     // a row's bf16s: padded, 16-byte reads of 16 rows conflict-free
    float *pg = (float *)(gs + (ROUTE ? (size_t)R.E * gst : 0));  // [HCC][E] (rank 0)
    float *xs = pg + HCC * R.E, *ract = xs + nc, *rval = ract + R.E, *sv = rval + R.E;
    int *rsel = (int *)(sv + HCR_SURV), *se = rsel + TOPK_MAX, *cnt = se + HCR_SURV;
    float rb = 0;
    if (ROUTE) {
        for (int i = e; i < R.E * (nc / 8); i += 512) {
            int j = i / (nc / 8), c8 = i % (nc / 8);
            cp_async16(gs + (size_t)j * gst + 8 * c8, R.gate + (j * R.ld + 4 * q0 + 8 * c8) * 2,
                       16);
        }
        cp_async_commit();
        if (rank == 0 && e < R.E && R.bias) rb = R.bias[e];
    }
    pdl_wait();
    float4 o[HC], yv;
    if (first) {
#pragma unroll
        for (int k = 0; k < HC; k++) o[k] = ((const float4 *)(ht + (long long)k * H))[q0 + qi];
        if (yt) yv = ((const float4 *)yt)[q0 + qi];
    }
    if (yt && e < HC) pp[e] = post[(long long)t * HC + e];
    if (yt && e < HC * HC) cc[e] = comb[(long long)t * HC * HC + e];
    __syncthreads();
    float a[JPT] = {};
    double ss = 0;
    for (int q = q0 + qi; q < q1; q += HCC_QT) {
        if (q != q0 + qi) {
            load_f(q);
#pragma unroll
            for (int k = 0; k < HC; k++) o[k] = ((const float4 *)(ht + (long long)k * H))[q];
            if (yt) yv = ((const float4 *)yt)[q];
        }
        float v[HC][4];
#pragma unroll
        for (int c = 0; c < 4; c++) {
            float oc[HC_FUSED_MAX] = {};
#pragma unroll
            for (int k = 0; k < HC; k++) oc[k] = ((const float *)&o[k])[c];
#pragma unroll
            for (int k = 0; k < HC; k++)
                v[k][c] = yt ? hc_mixed(oc, k, HC, ((const float *)&yv)[c], pp, cc) : oc[k];
        }
        if (jg == 0) {
#pragma unroll
            for (int k = 0; k < HC; k++) {
                float4 v4 = make_float4(v[k][0], v[k][1], v[k][2], v[k][3]);
                vs[(q - q0) * HC + k] = v4;
                if (yt) ((float4 *)(ht + (long long)k * H))[q] = v4;
#pragma unroll
                for (int c = 0; c < 4; c++) ss += (double)v[k][c] * v[k][c];
            }
        }
#pragma unroll
        for (int i = 0; i < JPT; i++)
#pragma unroll
            for (int k = 0; k < HC; k++) {
                const float *fk = (const float *)&f[i][k];
#pragma unroll
                for (int c = 0; c < 4; c++) a[i] += v[k][c] * fk[c];
            }
    }
#pragma unroll
    for (int i = 0; i < JPT; i++) a[i] = warp_sum(a[i]);
    if (jg == 0) ss = warp_sum_d(ss);
    if (lane == 0) {
#pragma unroll
        for (int i = 0; i < JPT; i++) red[jg][w & 1][i] = a[i];
        if (jg == 0) redss[w] = ss;
    }
    __syncthreads();
    cluster_wait();
    // This block's parts to every block's pa [rank] and pss [rank].
    if (e < HCC * (NMIX + 1)) {
        int dst = e / (NMIX + 1), j = e % (NMIX + 1);
        if (j < NMIX)
            *cl.map_shared_rank(&pa[rank][j], dst) = red[j % NJ][0][j / NJ] + red[j % NJ][1][j / NJ];
        else
            *cl.map_shared_rank(&pss[rank], dst) = redss[0] + redss[1];
    }
    cluster_arrive();
    cluster_wait();
    if (e < NMIX) {
        double s = 0;
        float aj = 0;
        for (int r = 0; r < HCC; r++) s += pss[r], aj += pa[r][e];
        mt[e] = aj * (1.0f / sqrtf((float)(s / n) + norm_eps));
    }
    __syncthreads();
    if (e < HC) {
        pre[e] = sigmoidf_(mt[e] * ssc[0] + sb[e]) + hc_eps;
        if (!HEAD && rank == 0)
            post[(long long)t * HC + e] = 2.0f * sigmoidf_(mt[HC + e] * ssc[1] + sb[HC + e]);
    }
    __syncthreads();
    // The collapsed row: column q's value sv from the kept streams.
    auto collapse = [&](int q, float (&sv)[4]) {
#pragma unroll
        for (int c = 0; c < 4; c++) sv[c] = 0;
#pragma unroll
        for (int k = 0; k < HC; k++) {
            float4 v4 = vs[(q - q0) * HC + k];
            const float *vk = (const float *)&v4;
#pragma unroll
            for (int c = 0; c < 4; c++) sv[c] += pre[k] * vk[c];
        }
    };
    if (e < HCC_QT) {
        double s2 = 0;
        for (int q = q0 + e; q < q1; q += HCC_QT) {
            float sv[4];
            collapse(q, sv);
            ((float4 *)(col + (long long)t * H))[q] = make_float4(sv[0], sv[1], sv[2], sv[3]);
#pragma unroll
            for (int c = 0; c < 4; c++) s2 += (double)sv[c] * sv[c];
        }
        s2 = warp_sum_d(s2);
        if (lane == 0) s2w[w] = s2;
        asm volatile("bar.sync 1, %0;" ::"n"(HCC_QT) : "memory");
        if (e < HCC) *cl.map_shared_rank(&ps2[rank], e) = s2w[0] + s2w[1];
    }
    bool sinkhorn = rank == (HCC > 1) && w == HCC_QT / 32;
    cluster_arrive();
    if (!ROUTE && !HEAD && sinkhorn)
        hc_sinkhorn_warp(mt, sb, ssc, HC, iters, hc_eps, comb + (long long)t * HC * HC);
    cluster_wait();
    if (!ROUTE && e >= HCC_QT) return;
    if (e < HCC_QT) {
        double s2 = 0;
        for (int r = 0; r < HCC; r++) s2 += ps2[r];
        float rn = 1.0f / sqrtf((float)(s2 / H) + norm_eps);
        for (int q = q0 + e; q < q1; q += HCC_QT) {
            float sv[4], yo[4];
            collapse(q, sv);
            if (nw && q != q0 + e) wv = ((const float4 *)nw)[q];
            const float *wf = (const float *)&wv;
#pragma unroll
            for (int c = 0; c < 4; c++) yo[c] = nw ? wf[c] * (sv[c] * rn) : sv[c] * rn;
            ((float4 *)(out + (long long)t * H))[q] = make_float4(yo[0], yo[1], yo[2], yo[3]);
            if (ROUTE) *(float4 *)(xs + 4 * (q - q0)) = make_float4(yo[0], yo[1], yo[2], yo[3]);
        }
    }
    if (!ROUTE) return;
    // The router: this block's part of every gate row's dot product with
    // the normed row (two threads a row, over alternate 8-column chunks,
    // then added) to rank 0, which adds the parts in rank order.
    cp_async_wait<0>();
    __syncthreads();
    {
        int j = e >> 1, hh = e & 1;
        float sj = 0;
        if (j < R.E)
            for (int c8 = hh; c8 < nc / 8; c8 += 2) {
                uint4 g4 = *(const uint4 *)(gs + (size_t)j * gst + 8 * c8);
                float4 xa = *(const float4 *)(xs + 8 * c8), xb = *(const float4 *)(xs + 8 * c8 + 4);
                const float xv[8] = { xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w };
                const uint32_t gw[4] = { g4.x, g4.y, g4.z, g4.w };
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    sj = fmaf(bf16f((uint16_t)gw[c]), xv[2 * c], sj);
                    sj = fmaf(bf16f((uint16_t)(gw[c] >> 16)), xv[2 * c + 1], sj);
                }
            }
        sj += __shfl_xor_sync(0xffffffffu, sj, 1);
        if (j < R.E && !hh) *cl.map_shared_rank(&pg[rank * R.E + j], 0) = sj;
    }
    cluster_arrive();
    if (sinkhorn) hc_sinkhorn_warp(mt, sb, ssc, HC, iters, hc_eps, comb + (long long)t * HC * HC);
    cluster_wait();
    if (rank != 0) return;
    // Choice k: the expert whose biased score has k better ones (larger,
    // or equal from a lower expert: route_warp_regs' order, so the same
    // choices).  A candidate with K better ones in its own warp of 32 is
    // out; among the at most K a warp left, a better candidate anywhere
    // has one of them (or its warp's K better ones) above it, so counting
    // the survivors alone gives the rank.  rsel starts valid (NaNs).
    bool cand = e < R.E;
    float v = -INFINITY;
    if (cand) {
        float sj = 0;
        for (int r = 0; r < HCC; r++) sj += pg[r * R.E + e];
        R.sc[(long long)t * R.E + e] = sj;
        ract[e] = route_act(sj, R.sigmoid);
        rval[e] = v = ract[e] + rb;
    }
    if (e < R.K) rsel[e] = e;
    int better = 0;
#pragma unroll 8
    for (int l = 0; l < 32; l++) {
        float u = __shfl_sync(0xffffffffu, v, l);
        int el = (e & ~31) + l;
        better += el < R.E && (u > v || (u == v && el < e));
    }
    bool surv = cand && better < R.K;
    unsigned m = __ballot_sync(0xffffffffu, surv);
    if (lane == 0) cnt[w] = __popc(m);
    __syncthreads();
    int off = 0, ns = 0;
    for (int k = 0; k < 16; k++) off += k < w ? cnt[k] : 0, ns += cnt[k];
    if (surv) {
        int pos = off + __popc(m & ((1u << lane) - 1));
        sv[pos] = v, se[pos] = e;
    }
    __syncthreads();
    if (surv) {
        int rk = 0;
        for (int i = 0; i < ns; i++) rk += sv[i] > v || (sv[i] == v && se[i] < e);
        if (rk < R.K) rsel[rk] = e;
    }
    __syncthreads();
    if (w) return;
    int sel[TOPK_MAX];
    float acts[TOPK_MAX], wt[TOPK_MAX] = {};
#pragma unroll
    for (int k = 0; k < TOPK_MAX; k++) {
        sel[k] = k < R.K ? rsel[k] : 0;
        acts[k] = k < R.K ? ract[sel[k]] : 0.0f;
    }
    if (lane == 0) route_weights(acts, R.K, R.rscale, wt);
    route_store(sel, wt, R.K, R.idx + (long long)t * R.K, R.wt + (long long)t * R.K,
                R.order + (long long)t * R.K);
}

bool cu_hc_pre_cluster_init(bool *route)
{
    bool ok = cu_cluster_runs(hc_pre_cluster_kernel<4, false>, dim3(1, HCC), 512, 0) &&
              cu_cluster_runs(hc_pre_cluster_kernel<4, false, true>, dim3(1, HCC), 512, 0);
    // with the router: the largest shared memory it takes
    *route = ok && cu_cluster_runs(hc_pre_cluster_kernel<4, true>, dim3(1, HCC), 512,
                                   HCR_SMEM_MAX);
    return ok;
}

// The clusters' rows: 16-byte aligned (float4 accesses), out given.
static bool hcc_rows(const float *h, const float *y, const float *fn, const float *nw,
                     const float *collapsed, const float *out)
{
    return out && (uintptr_t)h % 16 == 0 && (uintptr_t)fn % 16 == 0 && (uintptr_t)y % 16 == 0 &&
           (uintptr_t)collapsed % 16 == 0 && (uintptr_t)out % 16 == 0 && (uintptr_t)nw % 16 == 0;
}

bool cu_hc_pre_norm(cudaStream_t st, float *h, const float *y, int T, int hc, int H,
                    const float *fn, const float *base, const float *scale, int iters,
                    float hc_eps, float norm_eps, const float *nw, void *m, int *count,
                    float *post, float *comb, float *collapsed, float *out, bool tail,
                    bool cluster)
{
    if (hc > HC_FUSED_MAX || T > HC_FUSED_MAX_T || H > 12 * 1024) return false;
    if (cluster && hc == 4 && H % 4 == 0 && hcc_rows(h, y, fn, nw, collapsed, out)) {
        if (T > 0)
            cu_launch_cluster(hc_pre_cluster_kernel<4, false>, dim3(T, HCC), 512, 0, st,
                              dim3(1, HCC), h, y, H, fn, base, scale, iters, hc_eps, norm_eps,
                              nw, post, comb, collapsed, out, cu_hc_route{});
        return true;
    }
    int nmix = (2 + hc) * hc, S = HC_SPLITS(nmix, T);
    double *pss = (double *)m;
    float *pa = (float *)(pss + (long long)T * S);
    // hc_tail's shape: 16-byte columns (the kernel's v4) and outputs.
    tail = tail && out && H % 4 == 0 && H / 4 <= HC_TAIL_Q * (512 - 32) && (uintptr_t)h % 16 == 0 &&
           (uintptr_t)fn % 16 == 0 && (uintptr_t)y % 16 == 0 && (uintptr_t)collapsed % 16 == 0 &&
           (uintptr_t)out % 16 == 0 && (uintptr_t)nw % 16 == 0;
    if (T > 0 && tail)
        cu_launch(hc_pre_norm_kernel<true>, dim3(nmix * S, T), 512, 0, st, h, y, hc, H, fn, base,
                  scale, iters, hc_eps, norm_eps, nw, nmix, S, pa, pss, count, post, comb,
                  collapsed, out);
    else if (T > 0)
        cu_launch(hc_pre_norm_kernel<false>, dim3(nmix * S, T), 512, (size_t)H * sizeof(float),
                  st, h, y, hc, H, fn, base, scale, iters, hc_eps, norm_eps, nw, nmix, S, pa, pss,
                  count, post, comb, collapsed, out);
    return true;
}

bool cu_hc_head_norm(cudaStream_t st, float *h, const float *y, int T, int hc, int H,
                     const float *fn, const float *base, const float *scale, float hc_eps,
                     float norm_eps, const float *nw, const float *post, const float *comb,
                     float *collapsed, float *out)
{
    if (hc != 4 || T > HC_FUSED_MAX_T || H % 4 || H > 12 * 1024 || !nw ||
        !hcc_rows(h, y, fn, nw, collapsed, out))
        return false;
    if (T > 0)
        cu_launch_cluster(hc_pre_cluster_kernel<4, false, true>, dim3(T, HCC), 512, 0, st,
                          dim3(1, HCC), h, y, H, fn, base, scale, 0, hc_eps, norm_eps, nw,
                          (float *)post, (float *)comb, collapsed, out, cu_hc_route{});
    return true;
}

bool cu_hc_route_fits(int T, int H, const cu_hc_route &r)
{
    return T >= 1 && T <= HCC_MAX_T && H % (8 * HCC) == 0 && H / HCC <= HCR_NC_MAX &&
           r.E >= r.K && r.E <= HCR_E_MAX && r.K >= 1 && r.K <= TOPK_MAX && r.ld % 8 == 0 &&
           (uintptr_t)r.gate % 16 == 0;
}

bool cu_hc_pre_norm_route(cudaStream_t st, float *h, const float *y, int T, int H,
                          const float *fn, const float *base, const float *scale, int iters,
                          float hc_eps, float norm_eps, const float *nw, float *post,
                          float *comb, float *collapsed, float *out, const cu_hc_route &r)
{
    int nc = H / HCC;
    if (!cu_hc_route_fits(T, H, r) || !hcc_rows(h, y, fn, nw, collapsed, out)) return false;
    cu_launch_cluster(hc_pre_cluster_kernel<4, true>, dim3(T, HCC), 512, HCR_SMEM(r.E, nc), st,
                      dim3(1, HCC), h, y, H, fn, base, scale, iters, hc_eps, norm_eps, nw, post,
                      comb, collapsed, out, r);
    return true;
}


// hc_pre_norm of many tokens, first launch (hc = HC): for HCM_T tokens a
// block, the previous sublayer's hc_post (y not NULL: hc_mixed, the new
// streams stored) and the nmix logits of the new streams with their rms
// (y NULL: of h as it is), in one pass over the columns in chunks of
// HCM_C.  A thread per (token, 4 columns) loads the chunk's hc old
// streams and y (the next chunk's loads in flight while a chunk is
// multiplied), mixes and stores them, and stages them in shared memory as
// rows (stream, column) of a lane per token.  fn's matching columns come
// as [row][j] through cp.async, a chunk ahead into the other of two
// buffers (a warp reads 32-byte runs of 4 logits' rows; rows FS = NMP + 4
// floats apart, so the 8 rows x 4 logits of a warp's writes fall in
// distinct banks).  Then as in hc_logits_tile_kernel: warp w takes rows w, w + 8,
// ... with NMP sums and the sum of squares (double) per lane, and the
// warps' partial sums are added in warp order at the end: m [T][nmix] as
// cu_hc_logits_many leaves it.  Columns past H and tokens past T load as
// zeros and store nothing.
#define HCM_T 32
#define HCM_C 32
template <int HC>
__global__ void __launch_bounds__(256, 2) hc_post_logits_kernel(float *h, const float *y, int T,
                                                                int H, const float *fn,
                                                                const float *post,
                                                                const float *comb,
                                                                float norm_eps, float *m, int S,
                                                                void *part, int *count)
{
    constexpr int NMIX = (2 + HC) * HC, NMP = (NMIX + 3) / 4 * 4, FS = NMP + 4, R = HC * HCM_C;
    constexpr int FQ = NMP * R / 256;
    static_assert(HCM_T * HCM_C / 4 == 256 && HCM_C == 32 && 2 * FQ == HC * NMP / 4,
                  "a thread per (token, column quad); fn's copies even over the threads");
    static_assert(HCM_T * (NMP + 1) <= R * (HCM_T + 1), "the warps' sums in hs");
    __shared__ float hs[R][HCM_T + 1];
    __shared__ __align__(16) float fs[2][R][FS];
    __shared__ double rss[HCM_T];
    __shared__ float pps[HCM_T][HC], ccs[HCM_T][HC * HC];   // (in registers they spill)
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int lt = tid / (HCM_C / 4), q = tid % (HCM_C / 4), t = blockIdx.x * HCM_T + lt;
    long long n = (long long)HC * H;
    bool live = t < T;
    float *ht = h + (live ? t : 0) * n;
    const float *yt = y ? y + (long long)(live ? t : 0) * H : NULL;
    const float *pp = pps[lt], *cc = ccs[lt];
    float4 o[HC], yv = make_float4(0, 0, 0, 0);
    auto load = [&](int c0) {
        bool in = live && c0 + 4 * q < H;
#pragma unroll
        for (int k = 0; k < HC; k++)
            o[k] = in ? *(const float4 *)(ht + (long long)k * H + c0 + 4 * q) : make_float4(0, 0, 0, 0);
        if (y) yv = in ? *(const float4 *)(yt + c0 + 4 * q) : make_float4(0, 0, 0, 0);
    };
    // fn's columns [c0, c0 + HCM_C) into fs[b]: a warp's copies are 4
    // logits (lane / 8) x 8 columns (lane % 8) of one stream, the warp's
    // 8-column group fixed, the stream and logit quad stepping with i (a
    // loop: unrolled, its addresses would be kept in registers).
    int fu = lane / 8, fc = warp % 4 * 8 + lane % 8, w4 = warp / 4;
    // (HC = 4, V4's: copy i = 2 i2 + h is logit 4 i2 + fu of stream w4 +
    // 2 h, so its source and destination are two base pointers plus
    // constants; the general form's index arithmetic per copy was 37% of
    // the kernel's instructions, ncu run T13.)
    const float *fbase = fn + (long long)fu * n + (long long)w4 * H + fc;
    auto fetch = [&](int c0, int b) {
        if constexpr (HC == 4) {
            bool col = c0 + fc < H;
            float *dst = &fs[b][w4 * HCM_C + fc][fu];
#pragma unroll
            for (int i2 = 0; i2 < FQ / 2; i2++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    bool ok = col && 4 * i2 + fu < NMIX;
                    cp_async4(dst + h * 2 * HCM_C * FS + 4 * i2,
                              ok ? fbase + c0 + 4LL * i2 * n + 2LL * h * H : fn, ok);
                }
        } else {
#pragma unroll 1
            for (int i = 0; i < FQ; i++) {
                int g = w4 + 2 * i, k = g % HC, j = g / HC * 4 + fu;
                bool ok = j < NMIX && c0 + fc < H;
                cp_async4(&fs[b][k * HCM_C + fc][j],
                          ok ? fn + j * n + (long long)k * H + c0 + fc : fn, ok);
            }
        }
        cp_async_commit();
    };
    float acc[NMP];
#pragma unroll
    for (int j = 0; j < NMP; j++) acc[j] = 0;
    double ss = 0;
    // slice blockIdx.y of S: chunks [cb, ce) of HCM_C columns
    int nch = (H + HCM_C - 1) / HCM_C, cb = (int)((long long)nch * blockIdx.y / S) * HCM_C,
        ce = min(H, (int)((long long)nch * (blockIdx.y + 1) / S) * HCM_C);
    // fn's first chunk (weights: nothing earlier writes them) on its way
    // while the kernel before finishes
    fetch(cb, 0);
    pdl_wait();
    for (int i = tid; i < HCM_T * HC * HC; i += 256) {
        int tt = i / (HC * HC), tg = blockIdx.x * HCM_T + tt;
        ccs[tt][i % (HC * HC)] = y && tg < T ? comb[(long long)tg * HC * HC + i % (HC * HC)] : 0.0f;
        if (i < HCM_T * HC) {
            tt = i / HC, tg = blockIdx.x * HCM_T + tt;
            pps[tt][i % HC] = y && tg < T ? post[(long long)tg * HC + i % HC] : 0.0f;
        }
    }
    load(cb);
    for (int c0 = cb, b = 0; c0 < ce; c0 += HCM_C, b ^= 1) {
        // Every warp is done with hs and with fs[b ^ 1] (the chunk before).
        __syncthreads();
        if (c0 + HCM_C < ce) fetch(c0 + HCM_C, b ^ 1);
        else cp_async_commit();     // (an empty group: wait1 then means this chunk's)
        bool in = live && c0 + 4 * q < H;
#pragma unroll
        for (int k = 0; k < HC; k++) {
            float v[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float oc[HC_FUSED_MAX] = {};
#pragma unroll
                for (int jj = 0; jj < HC; jj++) oc[jj] = ((const float *)&o[jj])[i];
                v[i] = y ? hc_mixed(oc, k, HC, ((const float *)&yv)[i], pp, cc) : oc[k];
                hs[k * HCM_C + 4 * q + i][lt] = v[i];
            }
            if (y && in) *(float4 *)(ht + (long long)k * H + c0 + 4 * q) = *(float4 *)v;
        }
        cp_async_wait<1>();
        __syncthreads();
        if (c0 + HCM_C < ce) load(c0 + HCM_C);
#pragma unroll 4
        for (int kk = 0; kk < R / 8; kk++) {
            int r = warp + 8 * kk;
            float x = hs[r][lane];
            ss += (double)x * x;
#pragma unroll
            for (int j = 0; j < NMP; j += 4) {
                float4 f = *(const float4 *)&fs[b][r][j];
                acc[j] += x * f.x, acc[j + 1] += x * f.y, acc[j + 2] += x * f.z, acc[j + 3] += x * f.w;
            }
        }
    }
    float (*red)[NMP + 1] = (float (*)[NMP + 1])&hs[0][0];
    __syncthreads();
    hc_sum_warps<NMP>(red, rss, acc, ss, warp, lane);
    hc_store_logits<NMP>(red, rss, NMIX, T, blockIdx.x * HCM_T, HCM_T, n, norm_eps, m, S, part,
                         count);
}

int cu_hc_post_logits_slices(int T, int H, int per)
{
    return hc_slices((T + HCM_T - 1) / HCM_T, (H + HCM_C - 1) / HCM_C, per);
}

size_t cu_hc_post_logits_part(int T, int hc, int S)
{
    return hc_part_bytes(S, T, (2 + hc) * hc);
}

bool cu_hc_post_logits(cudaStream_t st, float *h, const float *y, int T, int hc, int H,
                       const float *fn, const float *post, const float *comb, float norm_eps,
                       float *m, void *part, int S, int *count)
{
    if (hc < 2 || hc > 4 || H % 4 || H > 12 * 1024 || (uintptr_t)h % 16 || (uintptr_t)y % 16)
        return false;
    if (T <= 0) return true;
    if (!part) S = 1;
    dim3 grid((T + HCM_T - 1) / HCM_T, S);
    if (hc == 2)
        cu_launch(hc_post_logits_kernel<2>, grid, 256, 0, st, h, y, T, H, fn, post, comb, norm_eps,
                  m, S, part, count);
    else if (hc == 3)
        cu_launch(hc_post_logits_kernel<3>, grid, 256, 0, st, h, y, T, H, fn, post, comb, norm_eps,
                  m, S, part, count);
    else
        cu_launch(hc_post_logits_kernel<4>, grid, 256, 0, st, h, y, T, H, fn, post, comb, norm_eps,
                  m, S, part, count);
    return true;
}

// hc_pre_norm of many tokens, second launch: a block per token finishes
// from its logits (hc_post_logits_kernel's) as hc_pre_norm_kernel's last
// block does.  TAIL (decode batches, up to HC_CN_TAIL_MAX_T tokens, with
// the RMSNorm, where the shape allows): hc_tail, its loads issued before
// the logits are read and the Sinkhorn's warp apart from the norm (the
// same bits); else hc_mix_collapse_norm over the streams as stored, each
// column's loads a round trip after the last, the norm waiting for the
// Sinkhorn (256-thread blocks of 46 registers, several an SM, which hide
// that at prefill sizes: ~0.23 ms an 8,192-token step on the H100, ~2.8
// TB/s; run F10's 0.51 ms included its PDL wait beside hc_post_logits,
// and a form that issued every load at once was no faster end to end:
// run I1).  Run F11 (H100), the tail form for
// every size in one kernel of 102 registers: B = 64 4.93, 4.99 -> 4.86,
// 4.87 ms a step, fp8 prefill 32K 131.6K -> 129.6K tok/s (one 480-thread
// block an SM).
#define HC_CN_THREADS 480
#define HC_CN_TAIL_MAX_T 64

// Token t's logits from hc_post_logits' S slices (part, left there when
// its count was NULL): hc_store_logits' last block's sums, in slice
// order (the same bits), a block a token, so that no block of
// hc_post_logits waits to add them all (at B = 32: 768 sums of 64 slices
// over one block's 256 threads, after a fence and an atomic).  The block
// stages the token's slices in sh (S doubles, then S x nmix floats: one
// round trip), then thread j < nmix adds logit j's into mt[j].  Every
// thread of the block calls it.
__device__ void hc_slice_logits(const void *part, int S, int T, int t, int nmix, long long n,
                                float norm_eps, float *sh, float *mt)
{
    const double *pss = (const double *)part;
    const float *pa = (const float *)(pss + (long long)S * T);
    double *sd = (double *)sh;
    float *sa = (float *)(sd + S);
    int e = threadIdx.x, nb = blockDim.x;
    for (int k = e; k < S; k += nb) sd[k] = __ldcg(pss + (long long)k * T + t);
#pragma unroll 4
    for (int i = e; i < S * nmix; i += nb)
        sa[i] = __ldcg(pa + ((long long)(i / nmix) * T + t) * nmix + i % nmix);
    __syncthreads();
    if (e >= nmix) return;
    float a = 0;
    double ss = 0;
    for (int k = 0; k < S; k++) {
        a += sa[k * nmix + e];
        ss += sd[k];
    }
    mt[e] = a * (1.0f / sqrtf((float)(ss / n) + norm_eps));
}

// The dynamic shared memory of hc_collapse_norm_kernel: the collapsed row
// (hc_mix_collapse_norm), or before it token t's slices.
static size_t hc_cn_smem(int H, int S, int nmix)
{
    size_t row = (size_t)H * sizeof(float);
    size_t sl = (size_t)S * (sizeof(double) + nmix * sizeof(float));
    return S > 1 && sl > row ? sl : row;
}

template <bool TAIL>
__global__ void __launch_bounds__(TAIL ? HC_CN_THREADS : 256) hc_collapse_norm_kernel(
    const float *h, int hc, int H, const float *m, const void *part, int S, int T,
    const float *base, const float *scale, int iters, float hc_eps, float norm_eps,
    const float *nw, float *post, float *comb, float *col, float *out)
{
    __shared__ double shd[32];
    __shared__ float pre[HC_MAX], mt[(2 + HC_FUSED_MAX) * HC_FUSED_MAX];
    extern __shared__ __align__(16) float cs[];     // hc_cn_smem
    int t = blockIdx.x, e = threadIdx.x, nmix = (2 + hc) * hc;
    float *ht = (float *)h + (long long)t * hc * H;
    bool v4 = H % 4 == 0 && (uintptr_t)h % 16 == 0 && (uintptr_t)col % 16 == 0;
    bool tail = TAIL && out && v4 && (uintptr_t)out % 16 == 0 &&
                (!nw || (uintptr_t)nw % 16 == 0) && hc <= HC_FUSED_MAX &&
                H <= HC_TAIL_Q * 4 * ((int)blockDim.x - 32);
    float4 wv[HC_TAIL_Q];
    float o[HC_TAIL_Q][HC_FUSED_MAX][4], yv[HC_TAIL_Q][4];
    pdl_wait();
    if (tail && e >= 32) hc_tail_load(ht, NULL, hc, H, nw, wv, o, yv);
    if (part) hc_slice_logits(part, S, T, t, nmix, (long long)hc * H, norm_eps, cs, mt);
    else if (e < nmix) mt[e] = m[(long long)t * nmix + e];
    __syncthreads();
    float *ct = col ? col + (long long)t * H : NULL;
    if (tail)
        hc_tail(ht, NULL, hc, H, mt, base, scale, iters, hc_eps, norm_eps, nw, NULL, NULL, pre,
                shd, post + (long long)t * hc, comb + (long long)t * hc * hc, ct,
                out + (long long)t * H, wv, o, yv);
    else
        hc_mix_collapse_norm(ht, NULL, hc, H, v4, mt, base, scale, iters, hc_eps, norm_eps, nw,
                             NULL, NULL, pre, shd, post + (long long)t * hc,
                             comb + (long long)t * hc * hc, ct, cs,
                             out ? out + (long long)t * H : NULL);
}

bool cu_hc_slices_later(int S, int hc, int H)
{
    return S > 1 && hc_cn_smem(H, S, (2 + hc) * hc) <= 48 * 1024;
}

void cu_hc_collapse_norm(cudaStream_t st, const float *h, int T, int hc, int H, const float *m,
                         const void *part, int S, const float *base, const float *scale,
                         int iters, float hc_eps, float norm_eps, const float *nw, float *post,
                         float *comb, float *collapsed, float *out, bool tail)
{
    if (T <= 0) return;
    if (!part) S = 1;
    size_t smem = hc_cn_smem(H, S, (2 + hc) * hc);
    if (tail && T <= HC_CN_TAIL_MAX_T)
        cu_launch(hc_collapse_norm_kernel<true>, T, HC_CN_THREADS, smem, st, h, hc, H, m, part, S,
                  T, base, scale, iters, hc_eps, norm_eps, nw, post, comb, collapsed, out);
    else
        cu_launch(hc_collapse_norm_kernel<false>, T, 256, smem, st, h, hc, H, m, part, S, T, base,
                  scale, iters, hc_eps, norm_eps, nw, post, comb, collapsed, out);
}

// The queries and key of an attention layer (qk_args, backend.h) of
// token blockIdx.y.  Block 0: kv, by the whole block (RMSNorm with its
// weight, RoPE, stored rounded as the ring holds it: kv_put_row), and the
// indexer weights scaled.  Blocks 1..: QK_ROWS rows of [q heads, then qi
// heads], a warp each: the row staged in the warp's shared memory, its
// RMSNorm (rmsnorm_kernel's operations; the sum of squares in double, in
// the warp's order), RoPE with cosines and sines the block computes once
// for its rows (they share the token's position).  (A block of 128
// threads per row took 0.7 ms a layer for an 8,192-token step: 97 rows a
// token, each with its barriers and 32 double-precision sin/cos pairs.)
#define QK_ROWS 8
__global__ void __launch_bounds__(32 * QK_ROWS) qk_prep_kernel(float *q, int nh, int hd, float *kv,
                                                             const float *kv_norm, float eps,
                                                             drope rt, int dtype, float *qi,
                                                             int inh, int ihd, drope irt,
                                                             float *iw, float iw_scale,
                                                             const int *pos)
{
    pdl_wait();
    extern __shared__ float xs[];       // [QK_ROWS][max(hd, ihd)]
    __shared__ double sh[32];
    __shared__ float cs[2][2][ROPE_MAX_PAIRS];      // [rt, irt][cos, sin]
    int t = blockIdx.y, p = pos[t], e = threadIdx.x;
    if (blockIdx.x == 0) {
        float *row = kv + (long long)t * hd;
        for (int i = e; i < hd; i += blockDim.x) xs[i] = row[i];
        double ss = 0;
        for (int i = e; i < hd; i += blockDim.x) ss += (double)xs[i] * xs[i];
        ss = block_sum(ss, sh);
        float rs = 1.0f / sqrtf((float)(ss / hd) + eps);
        for (int i = e; i < hd; i += blockDim.x)
            xs[i] = kv_norm ? kv_norm[i] * (xs[i] * rs) : xs[i] * rs;
        __syncthreads();
        for (int i = e; i < rt.npairs; i += blockDim.x)
            rope_pair(xs + hd - 2 * rt.npairs, i, rt, p, false);
        __syncthreads();
        if (dtype != KV_F32) {
            kv_put_row(dtype, xs, hd, NULL, 0, 0, row);
        } else {
            for (int i = e; i < hd; i += blockDim.x) row[i] = xs[i];
        }
        if (qi)
            for (int i = e; i < inh; i += blockDim.x) iw[(long long)t * inh + i] *= iw_scale;
        return;
    }
    int r0 = (blockIdx.x - 1) * QK_ROWS, nr = nh + (qi ? inh : 0);
    // the tables this block's rows use (a block-uniform choice)
    bool uq = r0 < nh, ui = r0 + QK_ROWS > nh && r0 < nr;
    for (int i = e; i < ROPE_MAX_PAIRS; i += blockDim.x) {
        if (uq && i < rt.npairs) rope_cs(rt, i, p, cs[0][0][i], cs[0][1][i]);
        if (ui && i < irt.npairs) rope_cs(irt, i, p, cs[1][0][i], cs[1][1][i]);
    }
    __syncthreads();
    int warp = e >> 5, lane = e & 31, r = r0 + warp;
    if (r >= nr) return;
    bool isq = r < nh;
    int n = isq ? hd : ihd, np = isq ? rt.npairs : irt.npairs;
    float *row = isq ? q + ((long long)t * nh + r) * hd : qi + ((long long)t * inh + r - nh) * ihd;
    float *x = xs + warp * (hd > ihd ? hd : ihd);
    double ss = 0;
    for (int i = lane; i < n; i += 32) {
        float v = row[i];
        x[i] = v;
        if (isq) ss += (double)v * v;   // the indexer's queries are not normalized
    }
    if (isq) {
        float rs = 1.0f / sqrtf((float)(warp_sum_d(ss) / n) + eps);
        for (int i = lane; i < n; i += 32) x[i] *= rs;
    }
    __syncwarp();
    const float(*tc)[ROPE_MAX_PAIRS] = cs[isq ? 0 : 1];
    for (int i = lane; i < np; i += 32) rope_rot(x + n - 2 * np, i, tc[0][i], tc[1][i]);
    __syncwarp();
    for (int i = lane; i < n; i += 32) row[i] = x[i];
}

void cu_qk_prep(cudaStream_t st, int T, float *q, int nh, int hd, float *kv, const float *kv_norm,
                float eps, const drope &rt, int dtype, float *qi, int inh, int ihd,
                const drope &irt, float *iw, float iw_scale, const int *pos)
{
    if (T <= 0) return;
    int n = qi && ihd > hd ? ihd : hd, rows = nh + (qi ? inh : 0);
    dim3 grid(1 + (rows + QK_ROWS - 1) / QK_ROWS, T);
    cu_launch(qk_prep_kernel, grid, 32 * QK_ROWS, (size_t)QK_ROWS * n * sizeof(float), st, q, nh,
              hd, kv, kv_norm, eps, rt, dtype, qi, inh, ihd, irt, iw, iw_scale, pos);
}

__global__ void hc_post_kernel(float *h, const float *y, const float *post, const float *comb,
                               int T, int hc, int H)
{
    pdl_wait();
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)T * H) return;
    int t = idx / H, d = idx % H;
    float *ht = h + (long long)t * hc * H;
    const float *pt = post + (long long)t * hc, *ct = comb + (long long)t * hc * hc;
    float old[HC_MAX];
    for (int j = 0; j < hc; j++) old[j] = ht[(long long)j * H + d];
    for (int k = 0; k < hc; k++) {
        float s = 0;
        for (int j = 0; j < hc; j++) s += ct[j * hc + k] * old[j];
        ht[(long long)k * H + d] = pt[k] * y[(long long)t * H + d] + s;
    }
}

void cu_hc_post(cudaStream_t st, float *h, const float *y, const float *post, const float *comb,
                int T, int hc, int H)
{
    long long n = (long long)T * H;
    if (n <= 0) return;
    cu_launch(hc_post_kernel, blocks_for(n, 256), 256, 0, st, h, y, post, comb, T, hc, H);
}

// The chunk's last `count` keys (positions pos0 + n - count ...).
// Block b: ring row of the chunk's position pos0 + n - count + b.
__global__ void ring_store_kernel(char *ring, int t, int window, int hd, const float *kv, int n,
                                  int pos0, int count, const dstep *dyn, const dring *segs)
{
    pdl_wait();
    if (segs) {     // sequence blockIdx.y of a batch (n = count = 1)
        const dring &r = segs[blockIdx.y];
        ring = r.ring, kv = r.kv, pos0 = r.pos0, dyn = r.dyn;
    }
    if (dyn) pos0 = dyn->pos0, ring = (char *)dyn->ptr;
    int j = pos0 + n - count + blockIdx.x;
    kv_put_row(t, kv + (long long)(j - pos0) * hd, hd, ring, window, j % window, NULL);
}

void cu_ring_store(cudaStream_t st, char *ring, int t, int window, int head_dim, const float *kv,
                   int n, int pos0, const dstep *dyn)
{
    int count = n < window ? n : window;
    if (count <= 0) return;
    cu_launch(ring_store_kernel, count, 256, 0, st, ring, t, window, head_dim, kv, n, pos0, count,
              dyn, (const dring *)NULL);
}

void cu_ring_store_batch(cudaStream_t st, const dring *segs, int nseg, int t, int window,
                         int head_dim)
{
    if (nseg <= 0 || window <= 0) return;
    cu_launch(ring_store_kernel, dim3(1, nseg), 256, 0, st, (char *)NULL, t, window, head_dim,
              (const float *)NULL, 1, 0, 1, (const dstep *)NULL, segs);
}

__global__ void kv_round_kernel(float *x, int ld, int n, int t)
{
    pdl_wait();
    float *row = x + (long long)blockIdx.x * ld;
    kv_put_row(t, row, n, NULL, 0, 0, row);
}

void cu_kv_round(cudaStream_t st, float *x, int ld, int T, int n, int t)
{
    if (T <= 0 || t == KV_F32) return;
    cu_launch(kv_round_kernel, T, 256, 0, st, x, ld, n, t);
}

// ---- mixture of experts ----

__global__ void swiglu_kernel(float *g, const float *u, long long n, float limit)
{
    pdl_wait();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    g[i] = swiglu1(g[i], u[i], limit);
}

void cu_swiglu(cudaStream_t st, float *g, const float *u, long long n, float limit)
{
    if (n <= 0) return;
    cu_launch(swiglu_kernel, blocks_for(n, 256), 256, 0, st, g, u, n, limit);
}

// A block (one warp) per token: route_warp_regs where it applies (regs,
// the default; LLM_CUDA_ROUTE_REGS=0 compares), whose lanes store their
// own choices, else route_warp and route_store; either way the outputs
// stored by the lanes side by side, the k's in the CPU's summation order
// for moe_combine_kernel from each choice's rank (the stable order of an
// insertion sort, without its local memory).  (Eight tokens a block put
// a 64-token step on 8 SMs: 14.5 us in run J5.)
__global__ void route_kernel(const float *scores, int T, int E, int K, int sigmoid,
                             const float *bias, const void *tid2eid, int tid_i64, const int *ids,
                             float rscale, int *idx, float *wt, int *order, int regs)
{
    pdl_wait();
    extern __shared__ float rsh[];      // [E] activations, [E] scores, then [E] taken flags
    int t = blockIdx.x;
    if (regs && !tid2eid && E <= 32 * ROUTE_U) {
        route_warp_regs(scores + (long long)t * E, E, K, sigmoid, bias, rscale,
                        idx + (long long)t * K, wt + (long long)t * K, order + (long long)t * K);
        return;
    }
    int sel[TOPK_MAX];
    float w[TOPK_MAX];
    route_warp(scores + (long long)t * E, E, K, sigmoid, bias, tid2eid, tid_i64,
               tid2eid ? ids[t] : 0, rscale, rsh, rsh + E, (unsigned char *)(rsh + 2 * E), sel,
               true, w);
    route_store(sel, w, K, idx + (long long)t * K, wt + (long long)t * K, order + (long long)t * K);
}

void cu_moe_route(cudaStream_t st, const float *scores, int T, int E, int K, bool sigmoid,
                  const float *bias, const void *tid2eid, bool tid_i64, const int *ids,
                  float routed_scale, int *idx, float *wt, int *order, bool regs)
{
    if (T <= 0) return;
    size_t smem = tid2eid ? 0 : (size_t)E * (2 * sizeof(float) + 1);
    if (smem > 48 * 1024)
        cudaFuncSetAttribute(route_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    cu_launch(route_kernel, T, 32, smem, st, scores, T, E, K, sigmoid, bias, tid2eid, tid_i64,
              ids, routed_scale, idx, wt, order, (int)regs);
}

// One block: count slots per expert, lay out the tiles, scatter the slots;
// offs[0..E] gets each expert's first position in perm.  The slot and
// tile offsets are block scans over the experts, blockDim at a time (one
// thread walking 256 experts took 21 us of a 64-token step: run J5).
__global__ void moe_sort_kernel(const int *idx, int nslots, int E, int *perm, int4 *tiles,
                                int *ntiles, int *offs, int tm, int4 *tiles2, int *ntiles2,
                                int tm2)
{
    pdl_wait();
    extern __shared__ int sh[];
    int *cnt = sh, *off = sh + E, *scan = sh + 2 * E;  // scan: 32 ints (block_scan)
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int s = threadIdx.x; s < nslots; s += blockDim.x) atomicAdd(&cnt[idx[s]], 1);
    __syncthreads();
    int o = 0, nt = 0, nt2 = 0;     // slots and tiles of the experts before this chunk
    for (int e0 = 0; e0 < E; e0 += blockDim.x) {
        int e = e0 + threadIdx.x, n = e < E ? cnt[e] : 0, to;
        int eo = o + block_scan(n, scan, &to);
        if (e < E) off[e] = offs[e] = eo;
        // expert e's tiles of m slots into tl after the nall so far
        auto lay = [&](int m, int4 *tl, int &nall) {
            int tt, et = nall + block_scan((n + m - 1) / m, scan, &tt);
            for (int s = 0; e < E && s < n; s += m)
                tl[et++] = make_int4(e, eo + s, min(m, n - s), 0);
            nall += tt;
        };
        lay(tm, tiles, nt);
        if (tm2) lay(tm2, tiles2, nt2);
        o += to;
    }
    if (threadIdx.x == 0) {
        *ntiles = nt, offs[E] = o;
        if (tm2) *ntiles2 = nt2;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int s = threadIdx.x; s < nslots; s += blockDim.x) {
        int e = idx[s];
        perm[off[e] + atomicAdd(&cnt[e], 1)] = s;
    }
}

void cu_moe_sort(cudaStream_t st, const int *idx, int nslots, int E, int *perm, int4 *tiles,
                 int *ntiles, int *offs, int tile_m, int4 *tiles2, int *ntiles2, int tile_m2)
{
    cu_launch(moe_sort_kernel, 1, 1024, (2 * E + 32) * sizeof(int), st, idx, nslots, E, perm,
              tiles, ntiles, offs, tile_m, tiles2, ntiles2, tiles2 ? tile_m2 : 0);
}

__global__ void rows_kernel(const float *src, float *dst, int n, int H, const int *map, int div,
                            int scatter)
{
    pdl_wait();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)n * H) return;
    int r = i / H, d = i % H;
    if (scatter) dst[(long long)map[r] * H + d] = src[i];
    else dst[i] = src[(long long)(map[r] / div) * H + d];
}

void cu_rows_gather(cudaStream_t st, const float *src, int H, const int *map, int div, int n,
                    float *dst)
{
    if (n <= 0) return;
    cu_launch(rows_kernel, blocks_for((long long)n * H, 256), 256, 0, st, src, dst, n, H, map, div,
              0);
}

void cu_rows_scatter(cudaStream_t st, const float *src, int H, const int *map, int n, float *dst)
{
    if (n <= 0) return;
    cu_launch(rows_kernel, blocks_for((long long)n * H, 256), 256, 0, st, src, dst, n, H, map, 1,
              1);
}

// Each row over `slices` blocks (a whole row in one block scanned 64,640
// floats at memory latency: a B = 1 step 0.15 ms slower, run H6): a
// thread's strided columns in ascending order, the block's best as one
// 64-bit key (the value's bits in an order that sorts as the floats do,
// ~column; 0, below every value's key: nothing above -inf), stored as
// out[row][slice], where the host reads them (pinned memory: no memset
// and no copy around the kernel, in a decode graph three nodes less) and
// takes each row's largest: the larger value, on ties the lower column.
__device__ __forceinline__ unsigned long long argmax_key(float v, int j)
{
    uint32_t u = __float_as_uint(v);
    u = u & 0x80000000u ? ~u : u | 0x80000000u;
    return (unsigned long long)u << 32 | (0xffffffffu - (uint32_t)j);
}

__global__ void row_argmax_kernel(const float *part, int nv, int per, unsigned long long *out)
{
    pdl_wait();
    __shared__ unsigned long long sk[32];
    const float *x = part + (size_t)blockIdx.x * nv;
    int j0 = blockIdx.y * per, j1 = min(nv, j0 + per);
    float best = -INFINITY;
    int at = 0;
    for (int j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
        float v = x[j];
        if (v > best) best = v, at = j;
    }
    // (+ 0: -0 as +0, which compare equal, so ties between them go by column)
    unsigned long long k = best > -INFINITY ? argmax_key(best + 0.0f, at) : 0;
    for (int o = 16; o; o >>= 1) {
        unsigned long long q = __shfl_xor_sync(0xffffffffu, k, o);
        k = q > k ? q : k;
    }
    if ((threadIdx.x & 31) == 0) sk[threadIdx.x >> 5] = k;
    __syncthreads();
    if (threadIdx.x) return;
    for (int w = 1; w < (int)(blockDim.x >> 5); w++) k = sk[w] > k ? sk[w] : k;
    out[(size_t)blockIdx.x * gridDim.y + blockIdx.y] = k;
}

int cu_row_argmax_slices(int rows, int nv)
{
    // about two blocks an SM over the rows, at least 2048 columns a block
    int want = (2 * cu_sm_count() + rows - 1) / rows, most = (nv + 2047) / 2048;
    int slices = want < most ? want : most;
    return slices < 1 ? 1 : slices;
}

void cu_row_argmax(cudaStream_t st, const float *part, int rows, int nv,
                   unsigned long long *keys)
{
    if (rows <= 0) return;
    int slices = cu_row_argmax_slices(rows, nv), per = (nv + slices - 1) / slices;
    cu_launch(row_argmax_kernel, dim3(rows, slices), 256, 0, st, part, nv, per, keys);
}

// A block per (1,024 columns, token; tokens past 65,535 in turn), 4
// consecutive columns a thread (float4s where the rows allow: v4), the
// token's slots in the CPU's order and their weights loaded once a block,
// every slot's loads issued before the sums (the same operations in the
// same order).  (A thread per element with a 64-bit division for its
// token, its K loads one after another: 464 us for 8,192 x 4,096 x 6.)
__global__ void moe_combine_kernel(const float *ys, const float *wt, const int *order, int T,
                                   int K, int H, const float *shared, float *out, bool v4)
{
    pdl_wait();
    __shared__ long long slot[TOPK_MAX];
    __shared__ float w[TOPK_MAX];
    int d = (blockIdx.x * blockDim.x + threadIdx.x) * 4, m = H - d < 4 ? H - d : 4;
    for (int t = blockIdx.y; t < T; t += gridDim.y) {
        __syncthreads();    // the previous token's slots read
        if (threadIdx.x < K) {
            long long s = (long long)t * K + order[(long long)t * K + threadIdx.x];
            slot[threadIdx.x] = s;
            w[threadIdx.x] = wt[s];
        }
        __syncthreads();
        if (d >= H) continue;
        float v[TOPK_MAX][4];
#pragma unroll
        for (int j = 0; j < TOPK_MAX; j++) {
            if (j >= K) break;
            const float *r = ys + slot[j] * H + d;
            if (v4) {
                *(float4 *)v[j] = *(const float4 *)r;
            } else {
#pragma unroll
                for (int c = 0; c < 4; c++) v[j][c] = c < m ? r[c] : 0.0f;
            }
        }
        float acc[4] = { 0, 0, 0, 0 };
#pragma unroll
        for (int j = 0; j < TOPK_MAX; j++) {
            if (j >= K) break;
#pragma unroll
            for (int c = 0; c < 4; c++) acc[c] = __fadd_rn(acc[c], __fmul_rn(v[j][c], w[j]));
        }
        long long o = (long long)t * H + d;
        if (v4) {
            float4 sh = *(const float4 *)(shared + o);
            *(float4 *)(out + o) = make_float4(acc[0] + sh.x, acc[1] + sh.y, acc[2] + sh.z,
                                               acc[3] + sh.w);
        } else {
            for (int c = 0; c < m; c++) out[o + c] = acc[c] + shared[o + c];
        }
    }
}

void cu_moe_combine(cudaStream_t st, const float *ys, const float *wt, const int *order, int T,
                    int K, int H, const float *shared, float *out)
{
    if (T <= 0 || H <= 0) return;
    bool v4 = H % 4 == 0 && (uintptr_t)ys % 16 == 0 && (uintptr_t)shared % 16 == 0 &&
              (uintptr_t)out % 16 == 0;
    dim3 grid((unsigned)((H + 1023) / 1024), grid_rows(T));
    cu_launch(moe_combine_kernel, grid, 256, 0, st, ys, wt, order, T, K, H, shared, out, v4);
}

// ---- synthetic weights (benchmarks) ----

__device__ __forceinline__ unsigned long long mix64(unsigned long long x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// One 32-bit word per thread.  FP8: exponents 4..8 (0.125 to 3.75, no
// NaN codes); bytes: all E2M1 codes; BF16 / F32: uniform in +-amp.
__global__ void fill_kernel(uint32_t *p, long long nwords, int kind, float amp, uint32_t byte,
                            unsigned long long seed)
{
    pdl_wait();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nwords) return;
    unsigned long long r = mix64(seed ^ (unsigned long long)i * 0xD6E8FEB86659FD93ull);
    uint32_t w = 0;
    if (kind == FILL_FP8) {
        for (int k = 0; k < 4; k++) {
            uint32_t x = (uint32_t)(r >> (16 * k)) & 0xffff;
            w |= ((x & 0x80) | ((4 + (x >> 8) % 5) << 3) | (x & 7)) << (8 * k);
        }
    } else if (kind == FILL_BYTES) {
        w = (uint32_t)r;
    } else if (kind == FILL_CONST) {
        w = byte * 0x01010101u;
    } else if (kind == FILL_BF16) {
        for (int k = 0; k < 2; k++) {
            float u = (float)((r >> (32 * k)) & 0xffffffffu) * (2.0f / 4294967296.0f) - 1.0f;
            w |= (__float_as_uint(amp * u) >> 16) << (16 * k);
        }
    } else {
        w = __float_as_uint(amp * ((float)(r >> 40) * (2.0f / 16777216.0f) - 1.0f));
    }
    p[i] = w;
}

void cu_fill(cudaStream_t st, void *p, size_t bytes, int kind, float amp, uint32_t byte,
             unsigned long long seed)
{
    long long nw = (long long)(bytes / 4);
    if (nw <= 0) return;
    cu_launch(fill_kernel, blocks_for(nw, 256), 256, 0, st, (uint32_t *)p, nw, kind, amp, byte,
              seed);
}
