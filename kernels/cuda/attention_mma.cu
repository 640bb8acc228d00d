// Attention of prefill chunks on tensor cores.
//
// DeepSeek V4 has one key/value head shared by every query head, so for a
// few query tokens the logits of all their heads against a tile of keys
// are one small GEMM with (token, head) as rows: S[rows][keys] = Q . K^T,
// then O[rows][hd] += P . K (values = keys).  One block per TQ
// consecutive tokens and 32 heads (M = 32 TQ rows): Q and a tile of 32
// keys in shared memory as BF16, mma.sync m16n8k16 with float32
// accumulation, an online softmax over the tiles (running max and sum per
// row) and the sink added to the denominator at the end.  The block walks
// the union of its tokens' keys (attention_keys.cuh, attn_span_keys), so a
// key is loaded and converted once for TQ tokens; a row's logit is -inf
// for the keys its token does not see, and the MMAs of a token's rows are
// skipped over tiles it sees nothing of (CSA: each token's chosen entries
// in turn).  TQ = 1 is the default (LLM_CUDA_ATTN_TOKENS): on 2 x H200
// the 64-row blocks of TQ = 2 were slower except for HCA keys at long
// context (docs/PERFORMANCE.md).  Keys go into the tensor cores as BF16
// (exact for BF16 and FP8 caches).  With NP = 1 (LLM_CUDA_GEMM=bf16, and
// fp8's prefill chunks) queries and probabilities round to BF16; with NP
// = 2 (bf16x2, the default) each is split into hi = bf16(x) and lo =
// bf16(x - hi) and both parts multiply (relative error 2^-16 instead of
// 2^-8, twice the MMAs).  Sums are float32.  The
// float32 kernels (attention.cu, attention_decode.cu) stay for LLM_CUDA_GEMM=f32
// and for decode steps of few tokens.
//
// Decode batches (and decode steps of several tokens) of at least
// LLM_CUDA_ATTN_MMA_MIN_T tokens run here too, one token a block (TQ = 1:
// a sequence's 32 heads share each decoded key tile, where the float32
// kernel decodes it once per 4 heads): blocks over the sequences of a
// batch (segs) and over splits of the keys (flash-decoding, blockIdx.z),
// each split's partial merged by the block of its token that finishes
// last (attn_merge_splits), as attention_decode.cu does, or with
// LLM_CUDA_ATTN_CLUSTER in clusters of splits (am_cluster_merge).
#include <cooperative_groups.h>

#include "attention_keys.cuh"
#include "mma.cuh"

namespace cg = cooperative_groups;

#define AM_HEADS 32     // query heads per token in a block (two m16 tiles)
#define AM_KEYS 32      // keys per tile (four n8 tiles)
#define AM_PAD 8        // bf16 elements of padding per shared row (banks)
#define AM_KSPLIT 2     // the logits' channels in this many halves, a warp each

// attention_mma_kernel's DEC: a prefill launch, or a decode launch whose
// key splits the last block merges, or whose splits merge in clusters
enum { AM_PREFILL, AM_DEC, AM_DEC_CLUSTER };

// N 8x8 bf16 matrices (4, or 2 transposed) at the rows the lanes point
// to (lanes 8m..8m+7: the rows of matrix m), as mma fragments.
template <int N, bool TRANS>
__device__ __forceinline__ void am_ldm(uint32_t *r, const __nv_bfloat16 *p)
{
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    if constexpr (N == 2)
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];"
                     : "=r"(r[0]), "=r"(r[1]) : "r"(a));
    else if constexpr (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

// A key's 16-byte unit as stored (T: 4 float32, 8 bf16 or 16 FP8 channels
// with their group's scale byte sc) as bf16 at d (32-byte aligned for FP8,
// 16 for BF16, 8 for float32): BF16 and FP8 exactly.
template <int T>
__device__ __forceinline__ void am_unit_bf16(const uint4 &v, unsigned sc, __nv_bfloat16 *d)
{
    if (T == KV_BF16) {
        *(uint4 *)d = v;
    } else if (T == KV_F32) {
        *(uint2 *)d = make_uint2(pack_bf16x2(__uint_as_float(v.x), __uint_as_float(v.y)),
                                 pack_bf16x2(__uint_as_float(v.z), __uint_as_float(v.w)));
    } else {
        float s = pow2i((int)sc - 127);
        uint32_t w[4] = { v.x, v.y, v.z, v.w }, o[8];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float4 f = fp8x4f(w[k], s);
            o[2 * k] = pack_bf16x2(f.x, f.y), o[2 * k + 1] = pack_bf16x2(f.z, f.w);
        }
        *(uint4 *)d = make_uint4(o[0], o[1], o[2], o[3]);
        *(uint4 *)(d + 8) = make_uint4(o[4], o[5], o[6], o[7]);
    }
}

// The KPW keys rows[0..KPW) of a warp, all stored as T, into their bf16
// rows of ks (row r at ks + rows[u] * LD): the keys' 16-byte units in
// order over the lanes (an FP8 key of 512 channels: one load a lane), up
// to 8 loads a lane in flight before any is converted.  (Loads of 4 bytes
// a thread, each with its key's type switch and address, were half of the
// kernel's instructions: ncu, run T1.)
template <int HD, int T, int KPW>
__device__ __forceinline__ void am_stage_as(const kref *kr, const int *rows, __nv_bfloat16 *ks)
{
    constexpr int W = T == KV_F32 ? 4 : T == KV_BF16 ? 8 : 16;    // channels a unit
    constexpr int UPK = HD / W, N = UPK * KPW, UPL = (N + 31) / 32, B = UPL < 8 ? UPL : 8;
    constexpr int LD = HD + AM_PAD;
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int j0 = 0; j0 < UPL; j0 += B) {
        uint4 v[B];
        unsigned sc[B];
#pragma unroll
        for (int j = 0; j < B; j++) {
            int i = lane + 32 * (j0 + j), c = i % UPK * W;
            if (N % 32 == 0 || i < N) {
                const kref &r = kr[rows[i / UPK]];
                v[j] = *(const uint4 *)(r.p + (long long)c * (16 / W));
                sc[j] = T == KV_FP8 ? r.s[c / KV_FP8_GROUP] : 0;
            }
        }
#pragma unroll
        for (int j = 0; j < B; j++) {
            int i = lane + 32 * (j0 + j);
            if (N % 32 == 0 || i < N)
                am_unit_bf16<T>(v[j], sc[j], ks + rows[i / UPK] * LD + i % UPK * W);
        }
    }
}

// The tile's keys kr[0..valid) as bf16 rows of ks, zeros past them (0 * P,
// never NaN): warp w takes keys w, w + 8, ...; a warp whose keys share a
// type and are all valid stages them together (am_stage_as), others key
// by key.  Every key row 16-byte aligned (cache rows and the step's
// float32 rows: hd a multiple of 64).
template <int HD>
__device__ __forceinline__ void am_stage_keys(const kref *kr, int valid, __nv_bfloat16 *ks)
{
    constexpr int KPW = AM_KEYS / 8, LD = HD + AM_PAD;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int rows[KPW], t0 = warp < valid ? kr[warp].t : -1;
    bool same = true;
#pragma unroll
    for (int u = 0; u < KPW; u++) {
        rows[u] = warp + 8 * u;
        same = same && rows[u] < valid && kr[rows[u]].t == t0;
    }
    if (same && t0 == KV_FP8) return am_stage_as<HD, KV_FP8, KPW>(kr, rows, ks);
    if (same && t0 == KV_F32) return am_stage_as<HD, KV_F32, KPW>(kr, rows, ks);
    if (same && t0 == KV_BF16) return am_stage_as<HD, KV_BF16, KPW>(kr, rows, ks);
#pragma unroll 1
    for (int u = 0; u < KPW; u++) {
        int t = rows[u] < valid ? kr[rows[u]].t : -1;
        if (t == KV_FP8) am_stage_as<HD, KV_FP8, 1>(kr, rows + u, ks);
        else if (t == KV_F32) am_stage_as<HD, KV_F32, 1>(kr, rows + u, ks);
        else if (t == KV_BF16) am_stage_as<HD, KV_BF16, 1>(kr, rows + u, ks);
        else
            for (int c = lane * 8; c < HD; c += 256)
                *(uint4 *)(ks + rows[u] * LD + c) = make_uint4(0, 0, 0, 0);
    }
}

template <int HD, int NP, int TQ>
constexpr size_t attention_mma_smem()
{
    constexpr int M = TQ * AM_HEADS;
    return 2 * AM_KEYS * (sizeof(kref) + 4)                     // two tiles' key rows, who sees them
           + (size_t)(NP * M + AM_KEYS) * (HD + AM_PAD) * 2     // Q parts, K tile (bf16)
           + (size_t)AM_KSPLIT * M * AM_KEYS * 4                // logits' parts
           + (size_t)NP * M * (AM_KEYS + AM_PAD) * 2            // probability parts
           + 3 * M * 4 + 16;                                    // max, sum, correction; tiles' tokens
}

// x as NP bf16 parts: x ~ hi (+ lo).
template <int NP>
__device__ __forceinline__ void am_split2(float x0, float x1, uint32_t out[NP])
{
    __nv_bfloat162 hi = __floats2bfloat162_rn(x0, x1);
    out[0] = *(uint32_t *)&hi;
    if (NP == 2) {
        float2 h = __bfloat1622float2(hi);
        out[NP - 1] = pack_bf16x2(x0 - h.x, x1 - h.y);
    }
}

// Warp 0: the rows of keys kt.. of the block (a tile), which tokens see
// each and which tokens see any (a bit mask each).
template <int TQ>
__device__ __forceinline__ void am_tile_rows(const attn_span_keys<TQ> &K, int kt, int nk, kref *kr,
                                             unsigned *kvis, unsigned *tvis)
{
    int l = threadIdx.x;
    unsigned v = 0;
    if (kt + l < nk) kr[l] = K.key(kt + l, &v);
    kvis[l] = v;
    v = __reduce_or_sync(0xffffffffu, v);
    if (l == 0) *tvis = v;
}

// Flash-decoding's merge in clusters (AM_DEC_CLUSTER; TQ = 1, the 32 rows
// a token's heads): the launch's splits (blockIdx.z) in clusters of CL
// along z.  Each block leaves its unnormalized rows o in shared memory
// where Q and K were, and block `rank` of a cluster merges channels
// [rank W, rank W + W) (W = HD / CL) of every row over the cluster's
// blocks in rank order, through distributed shared memory.  With one
// cluster the sink joins there and those channels are final; with ncl
// clusters that slice of the cluster's partial (unnormalized, with its max
// and sum) goes to part, and the block of rank `rank` that finishes last
// of the ncl merges the slice over them (attn_merge_splits; a counter per
// token, head group and rank).  So a split's 64 KB partial stays on chip
// and no one block reads every split's: the last-block merge of AM_DEC
// reads splits x 64 KB alone (V4: one-token decode 24-45 us a launch).
// Layout of part: outputs [token][head][cluster][HD], then (max, sum)
// pairs [rank][token][head][cluster][2].
template <int HD, int NP>
__device__ __forceinline__ void am_cluster_merge(const dattn &a, const float (&o)[2][HD / 64][4],
                                                 __nv_bfloat16 *qs, float *ss, const float *mrow,
                                                 const float *lrow, int i0, int h0, int nh,
                                                 float *part, int *count)
{
    constexpr int M = AM_HEADS, LD = HD + AM_PAD, LO = HD + 8;
    static_assert(M * LO * 4 <= (NP * M + AM_KEYS) * LD * 2, "the rows fit where Q and K were");
    static_assert(2 * M * (CU_ATTM_MAX_CLUSTER + 1) <= AM_KSPLIT * M * AM_KEYS,
                  "the splits' weights fit where the logits were");
    static_assert((NP * M + AM_KEYS) * LD * 2 >= (M * ATTN_MAX_SPLITS + M) * 4,
                  "the last merge's weights fit where Q and K were");
    cg::cluster_group cl = cg::this_cluster();
    const int CL = (int)cl.num_blocks(), rank = (int)cl.block_rank(), ncl = gridDim.z / CL;
    const int tok = blockIdx.x, W = HD / CL, nu = W / 4, c0 = rank * W;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    // this split's rows [M][LO] (a quarter warp's float2 stores on distinct banks)
    float *osm = (float *)qs;
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int half = 0; half < 2; half++)
#pragma unroll
            for (int n8 = 0; n8 < HD / 64; n8++)
                *(float2 *)(osm + (mt * 16 + g + half * 8) * LO + warp * (HD / 8) + n8 * 8 + 2 * t) =
                    make_float2(o[mt][n8][2 * half], o[mt][n8][2 * half + 1]);
    float *ms = ss, *ls = ms + M * CL, *mref = ls + M * CL, *lsum = mref + M;
    cl.sync();      // every split's rows, max and sum visible to the cluster
    for (int x = tid; x < M * CL; x += 256) {
        int r = x / CL, s = x % CL;
        ms[x] = *cl.map_shared_rank(mrow + r, s);
        ls[x] = *cl.map_shared_rank(lrow + r, s);
    }
    __syncthreads();
    if (tid < M) {
        // the splits' weights against the cluster's max (one cluster: and
        // the sink's); a split without keys (max -inf) weighs 0
        float m = ncl == 1 && tid < nh ? a.sinks[h0 + tid] : -INFINITY, l = 0;
        for (int s = 0; s < CL; s++) m = fmaxf(m, ms[tid * CL + s]);
        for (int s = 0; s < CL; s++) {
            float mx = ms[tid * CL + s], w = mx == -INFINITY ? 0.0f : expf(mx - m);
            l += ls[tid * CL + s] * w;
            ms[tid * CL + s] = w;
        }
        mref[tid] = m, lsum[tid] = l;
    }
    __syncthreads();
    const long long rows = (long long)gridDim.x * a.nheads * ncl;
    const long long prow = (long long)tok * a.nheads * ncl + blockIdx.z / CL;  // head h0 + r: + (h0 + r) ncl
    float *pml = part + rows * HD + rank * rows * 2;    // this slice's (max, sum) pairs
    for (int x = tid; x < M * nu; x += 256) {
        int r = x / nu, c = c0 + x % nu * 4;
        float4 v[CU_ATTM_MAX_CLUSTER], acc = make_float4(0, 0, 0, 0);
#pragma unroll
        for (int s = 0; s < CU_ATTM_MAX_CLUSTER; s++)
            if (s < CL) v[s] = *(const float4 *)cl.map_shared_rank(osm + r * LO + c, s);
#pragma unroll
        for (int s = 0; s < CU_ATTM_MAX_CLUSTER; s++)
            if (s < CL) {
                float w = ms[r * CL + s];
                acc = make_float4(fmaf(w, v[s].x, acc.x), fmaf(w, v[s].y, acc.y),
                                  fmaf(w, v[s].z, acc.z), fmaf(w, v[s].w, acc.w));
            }
        if (r >= nh) continue;
        float *y;
        if (ncl == 1) {
            float f = 1.0f / (lsum[r] + expf(a.sinks[h0 + r] - mref[r]));
            acc = attn_rope4(a.orope, HD, a.pos0 + i0, c,
                             make_float4(acc.x * f, acc.y * f, acc.z * f, acc.w * f));
            y = a.out + ((long long)i0 * a.nheads + h0 + r) * HD + c;
        } else {
            y = part + (prow + (long long)(h0 + r) * ncl) * HD + c;
        }
        *(float2 *)y = make_float2(acc.x, acc.y);
        *(float2 *)(y + 2) = make_float2(acc.z, acc.w);
    }
    if (ncl > 1 && tid < nh) {
        long long row = prow + (long long)(h0 + tid) * ncl;
        pml[row * 2] = mref[tid], pml[row * 2 + 1] = lsum[tid];
    }
    cl.sync();      // the cluster's reads of osm done: it may go (or be reused)
    if (ncl == 1 ||
        !attn_last_split(count + ((long long)tok * gridDim.y + blockIdx.y) * CL + rank, ncl))
        return;
    float *wts = (float *)qs, *msum = wts + M * ATTN_MAX_SPLITS;
    attn_merge_splits<256>(part + c0, pml, (long long)tok * a.nheads * ncl + (long long)h0 * ncl,
                           nh, ncl, HD, W, a.sinks + h0,
                           a.out + ((long long)i0 * a.nheads + h0) * HD + c0, wts, msum, a.orope,
                           a.pos0 + i0, c0);
}

// 256 threads (8 warps).  Row r of the block is head h0 + r % 32 of token
// i0 + r / 32; m16 tile mt holds rows of token mt / 2.  Logits: 8 / MT
// warps per m16 tile, each over one of AM_KSPLIT parts of the channels
// and 2 TQ of the tile's four n8 key tiles (a Q fragment loaded from
// shared memory serves 2 TQ MMAs: Q's reloads were most of the kernel's
// shared-memory reads); the softmax adds the parts.  P . K: warp w owns
// output channels [w*HD/8, (w+1)*HD/8) of every row.
// DEC (decode launches, TQ = 1): segs, key splits and their merge, by the
// last block (AM_DEC) or in clusters (AM_DEC_CLUSTER: am_cluster_merge).
template <int HD, int NP, int TQ, int DEC>
__global__ void __launch_bounds__(256, 3 - TQ) attention_mma_kernel(dattn a, const dattn *segs,
                                                                     int chunk, float *part,
                                                                     int *count)
{
    static_assert(!DEC || TQ == 1, "decode launches take a token a block");
    pdl_wait();
    constexpr int M = TQ * AM_HEADS, MT = M / 16, LD = HD + AM_PAD, LDP = AM_KEYS + AM_PAD;
    constexpr int NT = HD / 64, NB = NT > 1 ? 2 : 1, WPM = 8 / MT, WPK = WPM / AM_KSPLIT;
    constexpr int WN = AM_KEYS / 8 / WPK, KH = HD / AM_KSPLIT;
    constexpr int TPR = 256 / M, KPT = AM_KEYS / TPR;   // softmax: threads per row, keys each
    static_assert(TQ == 1 || TQ == 2, "8 warps cover 2 or 4 m16 tiles");
    static_assert(AM_KSPLIT == 2, "the softmax adds two parts");
    static_assert(WN % 2 == 0, "K's fragments two n8 tiles a load");
    static_assert(KPT % 4 == 0, "the softmax's loads of 4 keys");
    extern __shared__ __align__(16) unsigned char smem[];
    kref *krows = (kref *)smem;                                 // [2][AM_KEYS]
    unsigned *kvis2 = (unsigned *)(krows + 2 * AM_KEYS);        // [2][AM_KEYS]
    __nv_bfloat16 *qs = (__nv_bfloat16 *)(kvis2 + 2 * AM_KEYS); // [NP][M][LD]
    __nv_bfloat16 *ks = qs + NP * M * LD;
    float *ss = (float *)(ks + AM_KEYS * LD);                   // [AM_KSPLIT][M][AM_KEYS]
    __nv_bfloat16 *ps = (__nv_bfloat16 *)(ss + AM_KSPLIT * M * AM_KEYS); // [NP][M][LDP]
    float *mrow = (float *)(ps + NP * M * LDP), *lrow = mrow + M, *crow = lrow + M;
    unsigned *tvis = (unsigned *)(crow + M);                    // [2]

    if (DEC && segs) a = segs[blockIdx.x];     // the one token of sequence blockIdx.x
    if (a.dyn) a.pos0 = a.dyn->pos0, a.ring = (const char *)a.dyn->ptr;
    const int i0 = DEC && segs ? 0 : blockIdx.x * TQ, nt = min(TQ, a.n - i0);
    const int h0 = blockIdx.y * AM_HEADS, nh = min(AM_HEADS, a.nheads - h0);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    int nk;
    const attn_span_keys<TQ> K = attn_span_keys_of<TQ>(a, i0, nt, &nk);
    const int kb = DEC ? blockIdx.z * chunk : 0;    // this split's keys kb..nk-1
    if (DEC) nk = min(nk, kb + chunk);

    // Q's rows as NP bf16 parts; QU loads a thread in flight before any is
    // converted (a decode block may hold one tile of keys: Q's staging is
    // then much of its time)
    constexpr int QU = 8;
    for (int x0 = tid * 4; x0 < M * HD; x0 += 256 * 4 * QU) {
        float4 v[QU];
#pragma unroll
        for (int u = 0; u < QU; u++) {
            int x = x0 + u * 256 * 4, r = x / HD, c = x % HD, s = r / AM_HEADS, h = r % AM_HEADS;
            v[u] = x < M * HD && s < nt && h < nh
                       ? *(const float4 *)(a.q + ((long long)(i0 + s) * a.nheads + h0 + h) * HD + c)
                       : make_float4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < QU; u++) {
            int x = x0 + u * 256 * 4, r = x / HD, c = x % HD;
            if (x >= M * HD) break;
            uint32_t lo[NP], hi[NP];
            am_split2<NP>(v[u].x, v[u].y, lo);
            am_split2<NP>(v[u].z, v[u].w, hi);
#pragma unroll
            for (int k = 0; k < NP; k++)
                *(uint2 *)(qs + (k * M + r) * LD + c) = make_uint2(lo[k], hi[k]);
        }
    }
    if (tid < M) mrow[tid] = -INFINITY, lrow[tid] = 0;

    float o[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int n8 = 0; n8 < NT; n8++) o[mt][n8][0] = o[mt][n8][1] = o[mt][n8][2] = o[mt][n8][3] = 0;

    // ldmatrix addresses: lane l points at row l % 16, column 8 (l / 16)
    // of an A tile, and at key (l & 7) + 8 ((l >> 3) & 1), channel
    // 8 (l >> 4) of NB n8 tiles of values (x2: lanes 0-15 only).
    const int arow = lane & 15, acol = (lane >> 4) * 8;
    const int vkey = (lane & 7) + ((lane >> 3) & 1) * 8, vch = (lane >> 4) * 8;
    // this warp's logits: m16 tile, channels' part, first n8
    const int mq = warp / WPM, kq = warp % WPM / WPK, nq = warp % WPK * WN;

    // The rows of the next tile are found (warp 0) while the logits of
    // this one run: two buffers.
    if (warp == 0) am_tile_rows<TQ>(K, kb, nk, krows, kvis2, tvis);
    for (int kt = kb, buf = 0; kt < nk; kt += AM_KEYS, buf ^= 1) {
        const kref *kr = krows + buf * AM_KEYS;
        const unsigned *kvis = kvis2 + buf * AM_KEYS;
        __syncthreads();    // this tile's rows are known; the previous tile's K and P are consumed
        am_stage_keys<HD>(kr, nk - kt, ks);
        __syncthreads();
        const unsigned seen = tvis[buf];
        if (warp == 0 && kt + AM_KEYS < nk)
            am_tile_rows<TQ>(K, kt + AM_KEYS, nk, krows + (buf ^ 1) * AM_KEYS,
                             kvis2 + (buf ^ 1) * AM_KEYS, tvis + (buf ^ 1));

        // Logits' part kq of keys 8 (nq + j) .. +7, j < WN, for the rows of
        // m16 tile mq (none when its token sees no key of the tile).
        if (seen >> (mq * 16 / AM_HEADS) & 1) {
            float s[NP][WN][4] = {};      // a sum per part: independent MMA chains
            // K's fragments by ldmatrix, two n8 tiles a load: lane l points
            // at key 8 (nq + 2 jj + l / 16) + l % 8, channel 8 (l / 8 % 2).
            const __nv_bfloat16 *kb =
                ks + ((nq + (lane >> 4)) * 8 + (lane & 7)) * LD + ((lane >> 3) & 1) * 8;
#pragma unroll 4
            for (int k = kq * KH; k < (kq + 1) * KH; k += 16) {
                uint32_t af[NP][4];
#pragma unroll
                for (int part = 0; part < NP; part++)
                    am_ldm<4, false>(af[part], qs + (part * M + mq * 16 + arow) * LD + k + acol);
#pragma unroll
                for (int jj = 0; jj < WN / 2; jj++) {
                    uint32_t b[4];      // b0, b1 of n8 tiles 2 jj and 2 jj + 1
                    am_ldm<4, false>(b, kb + jj * 16 * LD + k);
#pragma unroll
                    for (int u = 0; u < 2; u++)
#pragma unroll
                        for (int part = 0; part < NP; part++)
                            mma_bf16_16816(s[part][2 * jj + u], af[part], b[2 * u], b[2 * u + 1]);
                }
            }
#pragma unroll
            for (int j = 0; j < WN; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int r = mq * 16 + g + (e >> 1) * 8, col = (nq + j) * 8 + 2 * t + (e & 1);
                    ss[(kq * M + r) * AM_KEYS + col] = NP == 2 ? s[0][j][e] + s[NP - 1][j][e] : s[0][j][e];
                }
        }
        __syncthreads();

        // Online softmax (the logits' two parts added): TPR threads per
        // row, KPT keys each; -inf for the keys the row's token does not
        // see (its running max stays -inf until it sees one: exponents
        // then taken against 0).
        {
            int r = tid / TPR, sub = tid % TPR, tok = r / AM_HEADS;
            const float *sr = ss + r * AM_KEYS + sub * KPT;
            const unsigned *vr = kvis + sub * KPT;
            // (16-byte loads and stores: the keys of a thread are adjacent)
            float x[KPT], mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < KPT; j += 4) {
                float4 s0 = *(const float4 *)(sr + j), s1 = *(const float4 *)(sr + M * AM_KEYS + j);
                uint4 v = *(const uint4 *)(vr + j);
                x[j] = v.x >> tok & 1 ? (s0.x + s1.x) * a.scale : -INFINITY;
                x[j + 1] = v.y >> tok & 1 ? (s0.y + s1.y) * a.scale : -INFINITY;
                x[j + 2] = v.z >> tok & 1 ? (s0.z + s1.z) * a.scale : -INFINITY;
                x[j + 3] = v.w >> tok & 1 ? (s0.w + s1.w) * a.scale : -INFINITY;
            }
#pragma unroll
            for (int j = 0; j < KPT; j++) mx = fmaxf(mx, x[j]);
            for (int o2 = 1; o2 < TPR; o2 <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o2));
            float mold = mrow[r], mnew = fmaxf(mold, mx), mref = mnew == -INFINITY ? 0 : mnew;
            float sum = 0;
#pragma unroll
            for (int j = 0; j < KPT; j += 4) {
                float e[4];
                uint32_t pp[2][NP];
#pragma unroll
                for (int i = 0; i < 4; i++) e[i] = expf(x[j + i] - mref);
                sum += e[0] + e[1];
                sum += e[2] + e[3];
                am_split2<NP>(e[0], e[1], pp[0]);
                am_split2<NP>(e[2], e[3], pp[1]);
#pragma unroll
                for (int k = 0; k < NP; k++)
                    *(uint2 *)(ps + (k * M + r) * LDP + sub * KPT + j) = make_uint2(pp[0][k], pp[1][k]);
            }
            for (int o2 = 1; o2 < TPR; o2 <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o2);
            __syncwarp();
            if (sub == 0) {
                float corr = expf(mold - mref);
                lrow[r] = lrow[r] * corr + sum;
                mrow[r] = mnew;
                crow[r] = corr;
            }
        }
        __syncthreads();

        // O = O * correction + P . K over this warp's channels (a token's
        // rows skipped when it sees no key of the tile: P = 0 there).
        // (Skipped where no row of the m16 tile changed its max: x * 1 = x.)
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            float c0 = crow[mt * 16 + g], c1 = crow[mt * 16 + g + 8];
            if (!__any_sync(0xffffffffu, c0 != 1.0f || c1 != 1.0f)) continue;
#pragma unroll
            for (int n8 = 0; n8 < NT; n8++)
                o[mt][n8][0] *= c0, o[mt][n8][1] *= c0, o[mt][n8][2] *= c1, o[mt][n8][3] *= c1;
        }
#pragma unroll
        for (int kk = 0; kk < AM_KEYS; kk += 16) {
            uint32_t af[MT][NP][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int part = 0; part < NP; part++)
                    am_ldm<4, false>(af[mt][part], ps + (part * M + mt * 16 + arow) * LDP + kk + acol);
            const __nv_bfloat16 *vb = ks + (kk + vkey) * LD + warp * (HD / 8) + vch;
#pragma unroll
            for (int n8 = 0; n8 < NT; n8 += NB) {
                uint32_t b[2 * NB];     // b0, b1 of n8 tiles n8 (and n8 + 1)
                am_ldm<2 * NB, true>(b, vb + n8 * 8);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    if (!(seen >> (mt * 16 / AM_HEADS) & 1)) continue;
#pragma unroll
                    for (int part = 0; part < NP; part++)
#pragma unroll
                        for (int u = 0; u < NB; u++)
                            mma_bf16_16816(o[mt][n8 + u], af[mt][part], b[2 * u], b[2 * u + 1]);
                }
            }
        }
    }
    __syncthreads();

    if (DEC && a.store_ring && blockIdx.z == 0 && blockIdx.y == 0) attn_store_ring(a, i0);
    const int splits = DEC ? gridDim.z : 1;
    if (DEC != AM_DEC_CLUSTER && splits == 1) {
        // the rotation back of the output's RoPE pairs: one rope_cs per
        // token and pair into the logits' room (free now), not one per
        // head (in double precision: a block's one rope warp took the
        // prefill kernel 20% longer computing its own)
        const int np = a.orope ? a.orope->npairs : 0, c0 = HD - 2 * np;
        float *rcs = ss;
        static_assert(AM_KSPLIT * M * AM_KEYS >= 2 * TQ * ROPE_MAX_PAIRS, "the table fits");
        if (np) {
            for (int x = tid; x < nt * np; x += 256)
                rope_cs(*a.orope, x % np, a.pos0 + i0 + x / np, rcs[2 * x], rcs[2 * x + 1]);
            __syncthreads();
        }
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int half = 0; half < 2; half++) {
                int r = mt * 16 + g + half * 8, s = r / AM_HEADS, h = r % AM_HEADS;
                if (s >= nt || h >= nh) continue;
                float den = lrow[r] + expf(a.sinks[h0 + h] - mrow[r]);
                long long row = ((long long)(i0 + s) * a.nheads + h0 + h) * HD;
#pragma unroll
                for (int n8 = 0; n8 < NT; n8++) {
                    int c = warp * (HD / 8) + n8 * 8 + 2 * t;
                    float x0 = o[mt][n8][2 * half] / den, x1 = o[mt][n8][2 * half + 1] / den;
                    if (c >= c0 && np) {
                        const float *cs = rcs + 2 * (s * np + (c - c0) / 2);
                        rope_rot2(x0, x1, cs[0], -cs[1]);
                    }
                    if (!DEC && a.obf) *(uint32_t *)(a.obf + row + c) = pack_bf16x2(x0, x1);
                    else *(float2 *)(a.out + row + c) = make_float2(x0, x1);
                }
            }
        return;
    }

    if constexpr (DEC == AM_DEC_CLUSTER)
        am_cluster_merge<HD, NP>(a, o, qs, ss, mrow, lrow, i0, h0, nh, part, count);
    if constexpr (DEC == AM_DEC) {
        // Split z's partial (TQ = 1: the block's token is blockIdx.x), laid
        // out as attention_decode.cu's: unnormalized outputs [token][head]
        // [split][HD], then (max, sum) pairs [token][head][split][2].
        static_assert((NP * M + AM_KEYS) * LD * 2 >= (M * ATTN_MAX_SPLITS + M) * 4,
                      "the merge's weights fit where Q and K were");
        const int tok = blockIdx.x;
        float *pml = part + (long long)gridDim.x * a.nheads * splits * HD;
        const long long row0 = ((long long)tok * a.nheads + h0) * splits;
#pragma unroll
        for (int half = 0; half < 2; half++) {
            int h = g + half * 8;
#pragma unroll
            for (int mt = 0; mt < MT; mt++, h += 16) {
                if (h >= nh) continue;
                float *pp = part + (row0 + (long long)h * splits + blockIdx.z) * HD;
#pragma unroll
                for (int n8 = 0; n8 < NT; n8++)
                    *(float2 *)(pp + warp * (HD / 8) + n8 * 8 + 2 * t) =
                        make_float2(o[mt][n8][2 * half], o[mt][n8][2 * half + 1]);
            }
        }
        if (tid < nh) {
            pml[(row0 + (long long)tid * splits + blockIdx.z) * 2] = mrow[tid];
            pml[(row0 + (long long)tid * splits + blockIdx.z) * 2 + 1] = lrow[tid];
        }
        if (!attn_last_split(count + (long long)tok * gridDim.y + blockIdx.y, splits)) return;
        float *wts = (float *)qs, *msum = wts + M * ATTN_MAX_SPLITS;
        attn_merge_splits<256>(part, pml, row0, nh, splits, HD, HD, a.sinks + h0,
                               a.out + ((long long)i0 * a.nheads + h0) * HD, wts, msum, a.orope,
                               a.pos0 + i0, 0);
    }
}

// The launch of a.n query tokens (TQ a block) or of the a.n one-token
// sequences of segs (TQ = 1), the keys in `splits` ranges of `chunk`, in
// clusters of `cluster` along them (AM_DEC_CLUSTER).
struct am_launch {
    const dattn *segs;
    int splits, chunk;
    float *part;
    int *count;
    int cluster;
};

template <int HD, int NP, int TQ, int DEC>
static void attention_mma_launch(cudaStream_t st, const dattn &a, const am_launch &l)
{
    size_t smem = attention_mma_smem<HD, NP, TQ>();
    smem_attr<HD * 16 + NP * 8 + TQ * 4 + DEC>(attention_mma_kernel<HD, NP, TQ, DEC>, smem);
    dim3 grid((a.n + TQ - 1) / TQ, (a.nheads + AM_HEADS - 1) / AM_HEADS, l.splits);
    cu_launch_cluster(attention_mma_kernel<HD, NP, TQ, DEC>, grid, 256, smem, st,
                      DEC == AM_DEC_CLUSTER ? dim3(1, 1, l.cluster) : dim3(0, 0, 0), a, l.segs,
                      l.chunk, l.part, l.count);
}

template <int NP, int TQ, int DEC = AM_PREFILL>
static bool attention_mma_hd(cudaStream_t st, const dattn &a, const am_launch &l)
{
    switch (a.hd) {
    case 64: attention_mma_launch<64, NP, TQ, DEC>(st, a, l); return true;
    case 128: attention_mma_launch<128, NP, TQ, DEC>(st, a, l); return true;
    case 256: attention_mma_launch<256, NP, TQ, DEC>(st, a, l); return true;
    case 512: attention_mma_launch<512, NP, TQ, DEC>(st, a, l); return true;
    default: return false;
    }
}

bool cu_attention_mma(cudaStream_t st, const dattn &a, bool split, int tokens)
{
    const am_launch l = { NULL, 1, 0, NULL, NULL, 1 };
    if (tokens == 1)
        return split ? attention_mma_hd<2, 1>(st, a, l) : attention_mma_hd<1, 1>(st, a, l);
    return split ? attention_mma_hd<2, 2>(st, a, l) : attention_mma_hd<1, 2>(st, a, l);
}

bool cu_attention_mma_fits(int hd)
{
    return hd == 64 || hd == 128 || hd == 256 || hd == 512;
}

bool cu_attention_mma_decode_fits(const dattn &a)
{
    return a.n >= 1 && cu_attention_mma_fits(a.hd) && a.nheads >= 1;
}

bool cu_attention_mma_cluster_runs(int cluster)
{
    return cluster >= 2 && cluster <= CU_ATTM_MAX_CLUSTER && 512 % cluster == 0 &&
           cu_cluster_runs(attention_mma_kernel<512, 2, 1, AM_DEC_CLUSTER>, dim3(1, 1, cluster),
                           256, attention_mma_smem<512, 2, 1>());
}

// The plan's splits (attn_split_plan's, up to cluster x ATTN_MAX_SPLITS of
// them with cluster > 1), in clusters of *cl: a power of two up to
// `cluster`, one cluster where the splits holding keys fit in one, then
// the splits a multiple of it (the last ones may hold no keys).
static void am_plan(const dattn &a, int target, int cluster, int *splits, int *chunk, int *cl)
{
    *cl = 1;
    attn_split_plan(a, AM_HEADS, AM_KEYS, splits, chunk, target,
                    cluster > 1 ? cluster * ATTN_MAX_SPLITS : ATTN_MAX_SPLITS);
    if (cluster <= 1 || *splits == 1) return;
    while (*cl < cluster && *cl < *splits) *cl *= 2;
    *splits = (*splits + *cl - 1) / *cl * *cl;
}

void cu_attention_mma_decode_plan(const dattn &a, int target, int cluster, int *splits,
                                  int *chunk)
{
    int cl;
    am_plan(a, target, cluster, splits, chunk, &cl);
}

bool cu_attention_mma_decode(cudaStream_t st, const dattn &a, int target, int cluster, bool split,
                             float *part, int *count, const dattn *segs)
{
    am_launch l = { segs, 1, 0, part, count, 1 };
    am_plan(a, target, cluster, &l.splits, &l.chunk, &l.cluster);
    if (l.cluster > 1)
        return split ? attention_mma_hd<2, 1, AM_DEC_CLUSTER>(st, a, l)
                     : attention_mma_hd<1, 1, AM_DEC_CLUSTER>(st, a, l);
    return split ? attention_mma_hd<2, 1, AM_DEC>(st, a, l) : attention_mma_hd<1, 1, AM_DEC>(st, a, l);
}
