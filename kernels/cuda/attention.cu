// The attention side of DeepSeek V4 on the GPU: the compressor (windowed
// softmax pooling, CSA's overlapping halves), the lightning indexer
// (scores, then an exact top-k by radix select with the CPU's tie rule),
// and attention over the sliding window plus compressed entries with
// per-head sinks.  kernels/cpu/backend_cpu.c is the reference.
#include "attention_keys.cuh"

static unsigned blocks_for(long long n, int threads) { return (unsigned)((n + threads - 1) / threads); }

// ---- compressor ----
//
// The state (kv_cache.c) holds the window being filled (`win`, rows by
// position % ratio: [kv | gate + ape], each coff*d wide) and, for CSA, the
// last completed window's [Ca | Ga] halves (`ovl`).  A chunk of n new
// tokens completes windows wfirst..wlast; each is pooled from rows that
// are in the chunk, or in `win` (the window in progress when the chunk
// began), or in `ovl` (the window before that).  Then ovl and win are
// brought up to date, in that order.  The launches depend on n and the
// ratio only (graph replay): each kernel works out pos0, the state and the
// windows completed (wfirst..wlast) when it starts.

struct comp_src {
    dcomp a;
    int m, d, wd, cur;      // ratio, entry width, row width, window in progress at pos0
    const float *win, *ovl;
    int wfirst, wlast;

    __device__ void resolve()
    {
        if (a.dyn) a.pos0 = a.dyn->pos0, a.state = (float *)a.dyn->ptr;
        cur = a.pos0 / m;
        win = a.state;
        ovl = a.state + (long long)m * 2 * wd;
        wfirst = cur;
        wlast = (a.pos0 + a.n) / m - 1;
    }

    // Value and gate logit of row j of window ww, channel `col` of the row.
    __device__ void at(int ww, int j, int col, float &val, float &lg) const
    {
        int p = ww * m + j;
        if (p >= a.pos0) {
            long long o = (long long)(p - a.pos0) * a.ld + col;
            val = a.kv[o];
            lg = a.gate[o] + a.ape[(long long)j * wd + col];
        } else if (ww == cur) {
            const float *row = win + (long long)j * 2 * wd;
            val = row[col];
            lg = row[wd + col];
        } else {    // the overlap half (col < d) of the window before `cur`
            const float *row = ovl + (long long)j * 2 * d;
            val = row[col];
            lg = row[d + col];
        }
    }
};

// Block i: window wfirst + i, if the chunk completes it (of sequence
// blockIdx.y under segs: cu_compress).
__global__ void compress_entry_kernel(comp_src S, drope rt, const dcomp *segs)
{
    pdl_wait();
    extern __shared__ float entry[];
    __shared__ double shd[32];
    if (segs) S.a = segs[blockIdx.y];
    S.resolve();
    const dcomp &a = S.a;
    int w = S.wfirst + blockIdx.x, m = S.m, d = S.d;
    if (w > S.wlast) return;
    bool ov = a.overlap && w > 0;
    int half = a.overlap ? d : 0;       // CSA: this window's Cb half
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float v, g, mx = -INFINITY, sum = 0, acc = 0;
        if (ov)
            for (int j = 0; j < m; j++) { S.at(w - 1, j, c, v, g); mx = g > mx ? g : mx; }
        for (int j = 0; j < m; j++) { S.at(w, j, half + c, v, g); mx = g > mx ? g : mx; }
        if (ov)
            for (int j = 0; j < m; j++) { S.at(w - 1, j, c, v, g); sum += expf(g - mx); }
        for (int j = 0; j < m; j++) { S.at(w, j, half + c, v, g); sum += expf(g - mx); }
        if (ov)
            for (int j = 0; j < m; j++) { S.at(w - 1, j, c, v, g); acc += v * (expf(g - mx) / sum); }
        for (int j = 0; j < m; j++) { S.at(w, j, half + c, v, g); acc += v * (expf(g - mx) / sum); }
        entry[c] = acc;
    }
    double ss = 0;
    for (int c = threadIdx.x; c < d; c += blockDim.x) ss += (double)entry[c] * entry[c];
    ss = block_sum(ss, shd);
    float r = 1.0f / sqrtf((float)(ss / d) + a.eps);
    for (int c = threadIdx.x; c < d; c += blockDim.x) entry[c] = a.norm[c] * (entry[c] * r);
    __syncthreads();
    for (int i = threadIdx.x; i < rt.npairs; i += blockDim.x)
        rope_pair(entry + d - 2 * rt.npairs, i, rt, w * m, false);
    __syncthreads();
    kv_put_row(a.out.dtype, entry, d, dpaged_region(a.out, w), a.out.per_block,
               w % a.out.per_block, NULL);
}

// ovl = [Ca | Ga] rows of the last window the chunk completes, if any.
__global__ void compress_ovl_kernel(comp_src S, const dcomp *segs)
{
    pdl_wait();
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (segs) S.a = segs[blockIdx.y];
    S.resolve();
    if (idx >= (long long)S.m * S.d || S.wlast < S.wfirst) return;
    int j = idx / S.d, c = idx % S.d, W = S.wlast;
    float v, g;
    S.at(W, j, c, v, g);
    float *row = (float *)S.ovl + (long long)j * 2 * S.d;
    row[c] = v;
    row[S.d + c] = g;
}

// win rows of the chunk's last `count` positions.
__global__ void compress_win_kernel(comp_src S, int count, const dcomp *segs)
{
    pdl_wait();
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)count * S.wd) return;
    if (segs) S.a = segs[blockIdx.y];
    S.resolve();
    int p = S.a.pos0 + S.a.n - count + idx / S.wd, cc = idx % S.wd, s = p % S.m;
    const dcomp &a = S.a;
    long long o = (long long)(p - a.pos0) * a.ld + cc;
    float *row = (float *)S.win + (long long)s * 2 * S.wd;
    row[cc] = a.kv[o];
    row[S.wd + cc] = a.gate[o] + a.ape[(long long)s * S.wd + cc];
}

void cu_compress(cudaStream_t st, const dcomp &a, const drope &rt, const dcomp *segs)
{
    if (a.n <= 0) return;
    comp_src S = {};
    S.a = a;
    S.m = a.ratio;
    S.d = a.d;
    S.wd = (a.overlap ? 2 : 1) * a.d;
    // Batched: one token of each of a.n sequences (block rows).
    int n = segs ? 1 : a.n, ny = segs ? a.n : 1;
    // A chunk of n completes at most ceil(n / ratio) windows.
    cu_launch(compress_entry_kernel, dim3((n + a.ratio - 1) / a.ratio, ny), 128,
              a.d * sizeof(float), st, S, rt, segs);
    if (a.overlap)
        cu_launch(compress_ovl_kernel, dim3(blocks_for((long long)S.m * S.d, 256), ny), 256, 0, st,
                  S, segs);
    int count = n < a.ratio ? n : a.ratio;
    cu_launch(compress_win_kernel, dim3(blocks_for((long long)count * S.wd, 256), ny), 256, 0, st,
              S, count, segs);
}

// ---- lightning indexer ----

#define IDX_ENTRIES 64      // entries per block of the score kernel

// Scores of entries s < nvis for token t0 + blockIdx.y (only tokens that
// see more than topk entries): q in shared memory (rows padded to spread
// banks), one warp per entry with the key in shared memory, lanes over
// heads; V4: 16-byte shared loads (d a multiple of 4).
template <bool V4>
__global__ void indexer_scores_kernel(dindexer a, int t0, float smul, float *scores, long long ldsc,
                                      const dindexer *segs)
{
    pdl_wait();
    extern __shared__ __align__(16) float sm[];
    int i = t0 + blockIdx.y;
    if (segs) a = segs[blockIdx.y], i = 0;     // sequence t0 + blockIdx.y of a batch
    int p = (a.dyn ? a.dyn->pos0 : a.pos0) + i, nvis = (p + 1) / a.ratio;
    int s0 = blockIdx.x * IDX_ENTRIES;
    if (nvis <= a.topk || s0 >= nvis) return;
    int d = a.d, nh = a.nheads, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int qst = V4 ? d + 4 : d + 1;
    float *qs = sm, *kw = sm + nh * qst + warp * d;
    const float *q = a.q + (long long)i * nh * d;
    batched<8>(threadIdx.x, nh * d, blockDim.x, [&](int x) { return q[x]; },
               [&](int x, float v) { qs[(x / d) * qst + x % d] = v; });
    __syncthreads();
    const float *wt = a.w + (long long)i * nh;
    int s1 = min(s0 + IDX_ENTRIES, nvis);
    for (int s = s0 + warp; s < s1; s += blockDim.x >> 5) {
        kref k = dpaged_ref(a.keys, s);
        batched<4>(lane, d, 32, [&](int c) { return kref_at(k, c); },
                   [&](int c, float v) { kw[c] = v; });
        __syncwarp();
        float acc = 0;
        for (int h = lane; h < nh; h += 32) {
            const float *qh = qs + h * qst;
            float dot = 0;
            if (V4) {
                for (int c = 0; c < d; c += 4) {
                    float4 x = *(const float4 *)(qh + c), y = *(const float4 *)(kw + c);
                    dot += x.x * y.x + x.y * y.y + x.z * y.z + x.w * y.w;
                }
            } else {
                for (int c = 0; c < d; c++) dot += qh[c] * kw[c];
            }
            acc += (dot > 0 ? dot : 0) * smul * wt[h];
        }
        acc = warp_sum(acc);
        if (lane == 0) scores[blockIdx.y * ldsc + s] = acc;
        __syncwarp();
    }
}

// Orderable key of a float (larger float, larger key; -0 is 0).
__device__ __forceinline__ unsigned fkey(float f)
{
    unsigned u = __float_as_uint(f);
    if (u == 0x80000000u) u = 0;
    return u & 0x80000000u ? ~u : u | 0x80000000u;
}

// One block per token: the k-th largest key by 4 rounds of 8-bit radix
// select, then every larger entry and the lowest-indexed equal ones, in
// ascending index order.
__global__ void indexer_topk_kernel(dindexer a, int t0, const float *scores, long long ldsc,
                                    const dindexer *segs)
{
    pdl_wait();
    __shared__ int hist[256], scan_sh[32];
    __shared__ unsigned s_prefix;
    __shared__ int s_krem;
    int i = t0 + blockIdx.x;
    if (segs) a = segs[blockIdx.x], i = 0;
    int p = (a.dyn ? a.dyn->pos0 : a.pos0) + i, nvis = (p + 1) / a.ratio;
    int k = a.topk;
    int *out = a.sel + (long long)i * k;
    if (nvis <= k) {
        for (int s = threadIdx.x; s < nvis; s += blockDim.x) out[s] = s;
        if (threadIdx.x == 0) a.nsel[i] = nvis;
        return;
    }
    const float *sc = scores + blockIdx.x * ldsc;
    unsigned prefix = 0, mask = 0;
    int krem = k;
    for (int pass = 0; pass < 4; pass++) {
        int shift = 24 - 8 * pass;
        for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
        __syncthreads();
        for (int s = threadIdx.x; s < nvis; s += blockDim.x) {
            unsigned u = fkey(sc[s]);
            if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 255], 1);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int cum = 0;
            for (int b = 255; b >= 0; b--) {
                if (cum + hist[b] >= krem) {
                    s_prefix = prefix | ((unsigned)b << shift);
                    s_krem = krem - cum;
                    break;
                }
                cum += hist[b];
            }
        }
        __syncthreads();
        prefix = s_prefix;
        krem = s_krem;
        mask |= 255u << shift;
        __syncthreads();
    }
    int base = 0, eqbase = 0;
    for (int c0 = 0; c0 < nvis; c0 += blockDim.x) {
        int s = c0 + threadIdx.x;
        unsigned u = s < nvis ? fkey(sc[s]) : 0;
        int gt = s < nvis && u > prefix, eq = s < nvis && u == prefix;
        int eqtot, tot;
        int eqr = block_scan(eq, scan_sh, &eqtot);
        int take = gt || (eq && eqbase + eqr < krem);
        int r = block_scan(take, scan_sh, &tot);
        if (take) out[base + r] = s;
        base += tot;
        eqbase += eqtot;
    }
    if (threadIdx.x == 0) a.nsel[i] = k;
}

void cu_indexer(cudaStream_t st, const dindexer &a, float *scores, size_t scores_cap,
                uint16_t *keys, const dindexer *segs)
{
    if (a.n <= 0) return;
    int maxvis = a.pos_end / a.ratio;
    long long ldsc = maxvis > 0 ? maxvis : 1;
    int chunk = (int)(scores_cap / ldsc);
    if (chunk > a.n) chunk = a.n;
    if (chunk < 1) chunk = 1;
    if (chunk > 65535) chunk = 65535;   // grid.y of the score kernel
    bool v4 = a.d % 4 == 0;
    size_t smem = ((size_t)a.nheads * (a.d + (v4 ? 4 : 1)) + 8 * (size_t)a.d) * sizeof(float);
    smem_attr<1>(indexer_scores_kernel<true>, smem);
    smem_attr<0>(indexer_scores_kernel<false>, smem);
    float smul = (float)pow(a.d, -0.5);
    for (int t0 = 0; t0 < a.n; t0 += chunk) {
        int nt = a.n - t0 < chunk ? a.n - t0 : chunk;
        const dindexer *sg = segs ? segs + t0 : NULL;
        if (maxvis > a.topk && keys && !segs) {
            cu_indexer_mma(st, a, t0, nt, scores, ldsc, keys, CU_INDEXER_KTILE);
        } else if (maxvis > a.topk) {
            dim3 grid(blocks_for(maxvis, IDX_ENTRIES), nt);
            if (v4) cu_launch(indexer_scores_kernel<true>, grid, 256, smem, st, a, t0, smul, scores,
                              ldsc, sg);
            else cu_launch(indexer_scores_kernel<false>, grid, 256, smem, st, a, t0, smul, scores,
                           ldsc, sg);
        }
        cu_launch(indexer_topk_kernel, nt, 512, 0, st, a, t0, scores, ldsc, sg);
    }
}

// ---- attention ----

#define ATT_TILE 32         // keys decoded into shared memory at a time
#define ATT_MAXC 4          // channels per thread: head_dim <= 4 * 256

// One block per (token, group of HPB heads, split), 8 warps, over the
// split's keys [z * chunk, (z + 1) * chunk) of [0, nk) in tiles of
// ATT_TILE: the tile's keys decoded to float32 in shared memory (each
// read once for all HPB heads), the logits (a warp per key), an online
// softmax (a warp per head: running max and sum, the accumulators
// rescaled when the max grows), the weighted sum of keys (threads over
// channels).  One split: the sink joins the softmax and the output is
// normalized here.  Several (flash-decoding): each writes its partial
// (max, sum, unnormalized output) to part[token][head][split] for
// attention_combine_kernel; a split past nk writes max -inf, sum 0.
template <int HPB>
__global__ void __launch_bounds__(256) attention_kernel(dattn a, int chunk, float *part,
                                                        const dattn *segs)
{
    pdl_wait();
    extern __shared__ __align__(16) unsigned char smem[];
    int i = blockIdx.x;
    if (segs) a = segs[blockIdx.x], i = 0;     // the one token of sequence blockIdx.x
    if (a.dyn) a.pos0 = a.dyn->pos0, a.ring = (const char *)a.dyn->ptr;
    int h0 = blockIdx.y * HPB, hd = a.hd;
    int nh = min(HPB, a.nheads - h0);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int nk;
    attn_keys K = attn_keys_of(a, i, &nk);
    kref *kr = (kref *)smem;
    float *qs = (float *)(kr + ATT_TILE), *kt = qs + HPB * hd, *lg = kt + ATT_TILE * hd;
    float *mrun = lg + HPB * ATT_TILE, *lrun = mrun + HPB, *resc = lrun + HPB;
    const float *q = a.q + ((long long)i * a.nheads + h0) * hd;
    batched<8>(threadIdx.x, HPB * hd, blockDim.x, [&](int x) { return x / hd < nh ? q[x] : 0.0f; },
               [&](int x, float v) { qs[x] = v; });
    if (threadIdx.x < HPB) mrun[threadIdx.x] = -INFINITY, lrun[threadIdx.x] = 0;
    float acc[HPB][ATT_MAXC];
#pragma unroll
    for (int hh = 0; hh < HPB; hh++)
#pragma unroll
        for (int k = 0; k < ATT_MAXC; k++) acc[hh][k] = 0;
    int j1 = min(nk, (blockIdx.z + 1) * chunk);
    for (int t0 = blockIdx.z * chunk; t0 < j1; t0 += ATT_TILE) {
        int tn = min(ATT_TILE, j1 - t0);
        if (threadIdx.x < tn) kr[threadIdx.x] = K.key(t0 + threadIdx.x);
        __syncthreads();
        batched<8>(threadIdx.x, tn * hd, blockDim.x,
                   [&](int x) { return kref_at(kr[x / hd], x % hd); },
                   [&](int x, float v) { kt[x] = v; });
        __syncthreads();
        for (int j = warp; j < tn; j += nw) {
            const float *k = kt + j * hd;
            float dot[HPB];
#pragma unroll
            for (int hh = 0; hh < HPB; hh++) dot[hh] = 0;
            for (int c = lane; c < hd; c += 32) {
                float kc = k[c];
#pragma unroll
                for (int hh = 0; hh < HPB; hh++) dot[hh] += qs[hh * hd + c] * kc;
            }
#pragma unroll
            for (int hh = 0; hh < HPB; hh++) {
                float v = warp_sum(dot[hh]);
                if (lane == 0) lg[hh * ATT_TILE + j] = v * a.scale;
            }
        }
        __syncthreads();
        for (int hh = warp; hh < HPB; hh += nw) {
            float *l = lg + hh * ATT_TILE;
            float mx = -INFINITY;
            for (int j = lane; j < tn; j += 32) mx = fmaxf(mx, l[j]);
            float mold = mrun[hh], mnew = fmaxf(mold, warp_max(mx)), sum = 0;
            for (int j = lane; j < tn; j += 32) {
                l[j] = expf(l[j] - mnew);
                sum += l[j];
            }
            sum = warp_sum(sum);
            if (lane == 0)
                softmax_state_update(&lrun[hh], &mrun[hh], &resc[hh], mold, mnew, sum);
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < ATT_MAXC; k++) {
            int c = threadIdx.x + k * blockDim.x;
            if (c >= hd) break;
#pragma unroll
            for (int hh = 0; hh < HPB; hh++) acc[hh][k] *= resc[hh];
            for (int j = 0; j < tn; j++) {
                float kc = kt[j * hd + c];
#pragma unroll
                for (int hh = 0; hh < HPB; hh++) acc[hh][k] += lg[hh * ATT_TILE + j] * kc;
            }
        }
        __syncthreads();
    }
    if (gridDim.z > 1) {
        long long ps = hd + 2;
#pragma unroll
        for (int hh = 0; hh < HPB; hh++) {
            if (hh >= nh) break;
            float *pp =
                part + (((long long)blockIdx.x * a.nheads + h0 + hh) * gridDim.z + blockIdx.z) * ps;
            if (threadIdx.x == 0) pp[0] = mrun[hh], pp[1] = lrun[hh];
#pragma unroll
            for (int k = 0; k < ATT_MAXC; k++) {
                int c = threadIdx.x + k * blockDim.x;
                if (c < hd) pp[2 + c] = acc[hh][k];
            }
        }
        return;
    }
    float *o = a.out + ((long long)i * a.nheads + h0) * hd;
#pragma unroll
    for (int hh = 0; hh < HPB; hh++) {
        if (hh >= nh) break;
        float sink = a.sinks[h0 + hh], m = fmaxf(mrun[hh], sink);
        float f = expf(mrun[hh] - m) / (lrun[hh] * expf(mrun[hh] - m) + expf(sink - m));
#pragma unroll
        for (int k = 0; k < ATT_MAXC; k++) {
            int c = threadIdx.x + k * blockDim.x;
            if (c < hd) o[(long long)hh * hd + c] = acc[hh][k] * f;
        }
    }
}

template <int HPB>
static size_t attention_smem(int hd)
{
    return ATT_TILE * sizeof(kref) + (size_t)(HPB + ATT_TILE) * hd * sizeof(float) +
           (size_t)HPB * (ATT_TILE + 3) * sizeof(float);
}

// Block (token, head): the splits' partials merged with the sink.
__global__ void attention_combine_kernel(dattn a, int splits, const float *part, const dattn *segs)
{
    pdl_wait();
    int i = blockIdx.x, h = blockIdx.y, hd = a.hd;
    if (segs) a = segs[blockIdx.x], i = 0;
    long long ps = hd + 2;
    const float *pp = part + ((long long)blockIdx.x * a.nheads + h) * splits * ps;
    float sink = a.sinks[h], m = sink;
    for (int s = 0; s < splits; s++) m = fmaxf(m, pp[s * ps]);
    float sum = expf(sink - m);
    for (int s = 0; s < splits; s++) sum += pp[s * ps + 1] * expf(pp[s * ps] - m);
    float *o = a.out + ((long long)i * a.nheads + h) * hd;
    for (int c = threadIdx.x; c < hd; c += blockDim.x) {
        float acc = 0;
        for (int s = 0; s < splits; s++) acc += pp[s * ps + 2 + c] * expf(pp[s * ps] - m);
        o[c] = acc / sum;
    }
}

template <int HPB>
static bool attention_launch(cudaStream_t st, const dattn &a, int splits, int chunk, float *part,
                             const dattn *segs)
{
    size_t smem = attention_smem<HPB>(a.hd);
    if (smem > 200 * 1024 || a.hd > ATT_MAXC * 256) return false;
    smem_attr<HPB>(attention_kernel<HPB>, smem);
    dim3 grid(a.n, (a.nheads + HPB - 1) / HPB, splits);
    cu_launch(attention_kernel<HPB>, grid, 256, smem, st, a, chunk, part, segs);
    if (splits > 1) cu_launch(attention_combine_kernel, dim3(a.n, a.nheads), 128, 0, st, a, splits,
                              part, segs);
    return true;
}

// (Decode steps of up to CU_ATTD_MAX_T tokens run attention_decode.cu
// instead, unless LLM_CUDA_ATTN_DECODE=0 or head_dim rules it out.)
// Many tokens (prefill): the most heads per block that leaves at least
// 128 blocks, one split.  Few (decode): the keys are split too
// (flash-decoding), at least a tile per split and at most 1024 blocks,
// with the most heads per block that still gives 128 blocks.  Every
// choice depends on n, the heads and the key bound (pos_end) only, so
// graph replays repeat it.
void cu_attention_plan(const dattn &a, int *hpb, int *splits, int *chunk)
{
    int ncomp_max = a.ratio ? (a.sel ? a.sel_ld : a.pos_end / a.ratio) : 0;
    int nk_max = a.window + ncomp_max, tiles = (nk_max + ATT_TILE - 1) / ATT_TILE;
    for (int h = 8;; h /= 2) {
        long long base = (long long)a.n * ((a.nheads + h - 1) / h);
        int s = base >= 128 ? 1 : (int)min((long long)tiles, max(1LL, 1024 / base));
        if ((a.nheads >= h && base * s >= 128) || h == 1) {
            int per = (tiles + s - 1) / s;
            *hpb = h;
            *chunk = per * ATT_TILE;
            *splits = (tiles + per - 1) / per;
            return;
        }
    }
}

bool cu_attention(cudaStream_t st, const dattn &a, float *part, const dattn *segs)
{
    if (a.n <= 0 || a.nheads <= 0) return true;
    int hpb, splits, chunk;
    cu_attention_plan(a, &hpb, &splits, &chunk);
    if (hpb == 8) return attention_launch<8>(st, a, splits, chunk, part, segs);
    if (hpb == 4) return attention_launch<4>(st, a, splits, chunk, part, segs);
    if (hpb == 2) return attention_launch<2>(st, a, splits, chunk, part, segs);
    return attention_launch<1>(st, a, splits, chunk, part, segs);
}
