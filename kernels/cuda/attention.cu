// The attention side of DeepSeek V4 on the GPU: the compressor (windowed
// softmax pooling, CSA's overlapping halves), the lightning indexer
// (scores, then the exact top-k of indexer_topk.cu),
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

    // This block's sequence (blockIdx.y of a batch's segs) and its values.
    __device__ void resolve(const dcomp *segs)
    {
        if (segs) a = segs[blockIdx.y];
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

// Channel c of entry w's softmax pooling (CSA: the window before's
// overlap half, rows j < m at channel c, then this window's, at half + c):
// the max, the sum and the weighted sum of the rows, each in that order.
// ROWS: windows of up to ROWS rows with every row's value and gate loaded
// first, all loads in flight at once (CSA's m = 4: 8 loads, where the
// loop below waits on each pass's loads in turn: 50-66 us an entry in a
// block of 128 threads at d = 512, run F3); ROWS = 0: that loop, for any m.
template <int ROWS>
__device__ __forceinline__ float comp_pool(const comp_src &S, int w, int c, bool ov, int half)
{
    int m = S.m;
    float mx = -INFINITY, sum = 0, acc = 0;
    if constexpr (ROWS > 0) {
        // rows k < ROWS: the overlap half's, then this window's
        float v[2 * ROWS], g[2 * ROWS];
        bool on[2 * ROWS];
#pragma unroll
        for (int j = 0; j < ROWS; j++) {
            on[j] = ov && j < m, on[ROWS + j] = j < m;
            v[j] = v[ROWS + j] = g[j] = g[ROWS + j] = 0;
            if (on[j]) S.at(w - 1, j, c, v[j], g[j]);
            if (on[ROWS + j]) S.at(w, j, half + c, v[ROWS + j], g[ROWS + j]);
        }
#pragma unroll
        for (int k = 0; k < 2 * ROWS; k++)
            if (on[k]) mx = g[k] > mx ? g[k] : mx;
#pragma unroll
        for (int k = 0; k < 2 * ROWS; k++)
            if (on[k]) sum += expf(g[k] - mx);
#pragma unroll
        for (int k = 0; k < 2 * ROWS; k++)
            if (on[k]) acc += v[k] * (expf(g[k] - mx) / sum);
        return acc;
    }
    float v, g;
    if (ov)
        for (int j = 0; j < m; j++) { S.at(w - 1, j, c, v, g); mx = g > mx ? g : mx; }
    for (int j = 0; j < m; j++) { S.at(w, j, half + c, v, g); mx = g > mx ? g : mx; }
    if (ov)
        for (int j = 0; j < m; j++) { S.at(w - 1, j, c, v, g); sum += expf(g - mx); }
    for (int j = 0; j < m; j++) { S.at(w, j, half + c, v, g); sum += expf(g - mx); }
    if (ov)
        for (int j = 0; j < m; j++) { S.at(w - 1, j, c, v, g); acc += v * (expf(g - mx) / sum); }
    for (int j = 0; j < m; j++) { S.at(w, j, half + c, v, g); acc += v * (expf(g - mx) / sum); }
    return acc;
}

#define COMP_REG_ROWS 8     // comp_pool's register form: windows of up to 8 rows

// Entry w (a window the chunk completes): the softmax pooling over its
// rows (CSA: with the window before's overlap half), RMSNorm, RoPE on its
// last channels, stored in the cache.  entry: d floats of shared memory.
__device__ void comp_entry(const comp_src &S, const drope &rt, int w, float *entry, double *shd)
{
    const dcomp &a = S.a;
    int d = S.d;
    bool ov = a.overlap && w > 0;
    int half = a.overlap ? d : 0;       // CSA: this window's Cb half
    for (int c = threadIdx.x; c < d; c += blockDim.x)
        entry[c] = S.m <= COMP_REG_ROWS ? comp_pool<COMP_REG_ROWS>(S, w, c, ov, half)
                                        : comp_pool<0>(S, w, c, ov, half);
    double ss = 0;
    for (int c = threadIdx.x; c < d; c += blockDim.x) ss += (double)entry[c] * entry[c];
    ss = block_sum(ss, shd);
    float r = 1.0f / sqrtf((float)(ss / d) + a.eps);
    for (int c = threadIdx.x; c < d; c += blockDim.x) entry[c] = a.norm[c] * (entry[c] * r);
    __syncthreads();
    for (int i = threadIdx.x; i < rt.npairs; i += blockDim.x)
        rope_pair(entry + d - 2 * rt.npairs, i, rt, w * S.m, false);
    __syncthreads();
    kv_put_row(a.out.dtype, entry, d, dpaged_region(a.out, w), a.out.per_block,
               w % a.out.per_block, NULL);
}

// Element idx of ovl = [Ca | Ga] rows of the last window the chunk
// completes (idx < m d).
__device__ __forceinline__ void comp_ovl_at(const comp_src &S, long long idx)
{
    int j = idx / S.d, c = idx % S.d, W = S.wlast;
    float v, g;
    S.at(W, j, c, v, g);
    float *row = (float *)S.ovl + (long long)j * 2 * S.d;
    row[c] = v;
    row[S.d + c] = g;
}

// Element idx of the win rows of the chunk's last `count` positions
// (idx < count wd).
__device__ __forceinline__ void comp_win_at(const comp_src &S, int count, long long idx)
{
    const dcomp &a = S.a;
    int p = a.pos0 + a.n - count + idx / S.wd, cc = idx % S.wd, s = p % S.m;
    long long o = (long long)(p - a.pos0) * a.ld + cc;
    float *row = (float *)S.win + (long long)s * 2 * S.wd;
    row[cc] = a.kv[o];
    row[S.wd + cc] = a.gate[o] + a.ape[(long long)s * S.wd + cc];
}

// Block i: window wfirst + i, if the chunk completes it (of sequence
// blockIdx.y under segs: cu_compress).
__global__ void compress_entry_kernel(comp_src S, drope rt, const dcomp *segs)
{
    pdl_wait();
    extern __shared__ float entry[];
    __shared__ double shd[32];
    S.resolve(segs);
    int w = S.wfirst + blockIdx.x;
    if (w > S.wlast) return;
    comp_entry(S, rt, w, entry, shd);
}

// ovl = [Ca | Ga] rows of the last window the chunk completes, if any.
__global__ void compress_ovl_kernel(comp_src S, const dcomp *segs)
{
    pdl_wait();
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    S.resolve(segs);
    if (idx >= (long long)S.m * S.d || S.wlast < S.wfirst) return;
    comp_ovl_at(S, idx);
}

// win rows of the chunk's last `count` positions.
__global__ void compress_win_kernel(comp_src S, int count, const dcomp *segs)
{
    pdl_wait();
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)count * S.wd) return;
    S.resolve(segs);
    comp_win_at(S, count, idx);
}

// A decode step's compressor, one token a sequence, in one launch: block
// blockIdx.y takes its sequence's entry (if the token completes a window),
// then the overlap half (CSA) and the token's win row, the three kernels'
// work in their order.  The entry reads ovl before the block rewrites it;
// the win row it writes (the token's, position % m) is one the entry and
// ovl take from the chunk, not from win.
__global__ void compress_step_kernel(comp_src S, drope rt, const dcomp *segs)
{
    pdl_wait();
    extern __shared__ float entry[];
    __shared__ double shd[32];
    S.resolve(segs);
    if (S.wlast >= S.wfirst) {
        comp_entry(S, rt, S.wfirst, entry, shd);
        __syncthreads();
        if (S.a.overlap)
            for (long long i = threadIdx.x; i < (long long)S.m * S.d; i += blockDim.x)
                comp_ovl_at(S, i);
    }
    for (long long i = threadIdx.x; i < S.wd; i += blockDim.x) comp_win_at(S, 1, i);
}

void cu_compress(cudaStream_t st, const dcomp &a, const drope &rt, const dcomp *segs, bool fuse)
{
    if (a.n <= 0) return;
    comp_src S = {};
    S.a = a;
    S.m = a.ratio;
    S.d = a.d;
    S.wd = (a.overlap ? 2 : 1) * a.d;
    // Batched: one token of each of a.n sequences (block rows).
    int n = segs ? 1 : a.n, ny = segs ? a.n : 1;
    // An entry's block: a thread a channel (up to 1,024; at least 128).
    int th = a.d <= 128 ? 128 : a.d >= 1024 ? 1024 : (a.d + 31) / 32 * 32;
    if (fuse && n == 1) {
        cu_launch(compress_step_kernel, dim3(1, ny), th, a.d * sizeof(float), st, S, rt, segs);
        return;
    }
    // A chunk of n completes at most ceil(n / ratio) windows.
    cu_launch(compress_entry_kernel, dim3((n + a.ratio - 1) / a.ratio, ny), th,
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

// The same scores computed as the CPU computes them, bit for bit
// (kernels/cpu: cpu_dot's eight strided partial sums of products, each
// product and sum rounded on its own, then the partial sums in order;
// ReLU, times d^-0.5, times the head's weight, added over the heads in
// head order), so the top-k equals the CPU's whatever the near-ties; laid
// out for many entries at once (decode, and prefill under `f32`).  Keys
// in tiles of E entries staged as stored (stage_keys: 16-byte loads, all
// in flight, rows padded by 4 floats so that a warp's lanes, 32 entries,
// read them without bank conflicts), queries staged once per block (a
// warp's lanes share a head: broadcasts), 8 heads at a time in registers
// (8 x 8 partial sums).  SPLIT (short contexts: more blocks): a thread
// per (entry, 8 heads), G = heads / 8 threads an entry, the heads' terms
// through shared memory and one thread an entry adding them; else a
// thread an entry, all heads in passes of 8.  Block (x, token) takes
// tiles x, x + gridDim.x, ... of its token's visible entries.
#define IDXT_THREADS 256
#define IDXT_HP 8           // heads a pass
#define IDXT_U 4            // key loads in flight per thread while staging

template <bool SPLIT>
__global__ void __launch_bounds__(IDXT_THREADS, SPLIT ? 2 : 1)
    indexer_scores_cpu_kernel(dindexer a, int t0, float smul, float *scores, long long ldsc,
                              const dindexer *segs)
{
    pdl_wait();
    extern __shared__ __align__(16) float sm[];
    int i = t0 + blockIdx.y;
    if (segs) a = segs[blockIdx.y], i = 0;     // sequence t0 + blockIdx.y of a batch
    int p = (a.dyn ? a.dyn->pos0 : a.pos0) + i, nvis = (p + 1) / a.ratio;
    const int d = a.d, nh = a.nheads, ld = d + 4, G = SPLIT ? nh / IDXT_HP : 1;
    const int E = IDXT_THREADS / G, ntiles = (nvis + E - 1) / E;
    if (nvis <= a.topk || (int)blockIdx.x >= ntiles) return;
    const int tid = threadIdx.x, warp = tid >> 5, g = SPLIT ? warp % G : 0;
    const int slot = SPLIT ? (warp / G) * 32 + (tid & 31) : tid;
    const int h0 = g * IDXT_HP, passes = SPLIT ? 1 : nh / IDXT_HP;
    float *qs = sm, *ks = qs + nh * ld, *terms = ks + E * ld;     // terms [nh][E] (SPLIT)
    const float *q = a.q + (long long)i * nh * d, *w = a.w + (long long)i * nh;
    if (((uintptr_t)q & 15) == 0) {
        const float4 *q4 = (const float4 *)q;
        int d4 = d / 4;
        for (int x0 = tid; x0 < nh * d4; x0 += 8 * IDXT_THREADS) {
            float4 v[8];
#pragma unroll
            for (int u = 0; u < 8; u++)
                if (x0 + u * IDXT_THREADS < nh * d4) v[u] = q4[x0 + u * IDXT_THREADS];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                int x = x0 + u * IDXT_THREADS;
                if (x < nh * d4) *(float4 *)(qs + (x / d4) * ld + x % d4 * 4) = v[u];
            }
        }
    } else {
        batched<8>(tid, nh * d, IDXT_THREADS, [&](int x) { return q[x]; },
                   [&](int x, float v) { qs[(x / d) * ld + x % d] = v; });
    }
    for (int tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
        int s0 = tile * E, tn = min(E, nvis - s0);
        __syncthreads();    // the queries staged; the last tile's keys and terms read
        stage_keys<IDXT_U, IDXT_THREADS>([&](int j) { return dpaged_ref(a.keys, s0 + j); },
                                         a.keys.dtype, tn, d, ld, ks);
        __syncthreads();
        const float *kr = ks + slot * ld;
        float total = 0;
        for (int ps = 0; ps < passes; ps++) {
            int hb = h0 + ps * IDXT_HP;
            const float *qh = qs + hb * ld;
            float acc[IDXT_HP][8];
#pragma unroll
            for (int hh = 0; hh < IDXT_HP; hh++)
#pragma unroll
                for (int j = 0; j < 8; j++) acc[hh][j] = 0;
            for (int c = 0; c < d; c += 8) {
                float4 k0 = *(const float4 *)(kr + c), k1 = *(const float4 *)(kr + c + 4);
                float kv[8] = { k0.x, k0.y, k0.z, k0.w, k1.x, k1.y, k1.z, k1.w };
#pragma unroll
                for (int hh = 0; hh < IDXT_HP; hh++) {
                    float4 q0 = *(const float4 *)(qh + hh * ld + c);
                    float4 q1 = *(const float4 *)(qh + hh * ld + c + 4);
                    float qv[8] = { q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w };
#pragma unroll
                    for (int j = 0; j < 8; j++)
                        acc[hh][j] = __fadd_rn(acc[hh][j], __fmul_rn(qv[j], kv[j]));
                }
            }
#pragma unroll
            for (int hh = 0; hh < IDXT_HP; hh++) {
                float dot = 0;
#pragma unroll
                for (int j = 0; j < 8; j++) dot = __fadd_rn(dot, acc[hh][j]);
                float t = __fmul_rn(__fmul_rn(dot > 0 ? dot : 0, smul), w[hb + hh]);
                if (SPLIT) terms[(hb + hh) * E + slot] = t;
                else total = __fadd_rn(total, t);
            }
        }
        if (SPLIT) {
            __syncthreads();
            if (tid < tn) {
                for (int h = 0; h < nh; h++) total = __fadd_rn(total, terms[h * E + tid]);
                scores[blockIdx.y * ldsc + s0 + tid] = total;
            }
        } else if (slot < tn) {
            scores[blockIdx.y * ldsc + s0 + slot] = total;
        }
    }
}

// Shared memory of indexer_scores_cpu_kernel: queries, a tile of keys, the terms.
static size_t idxt_smem(const dindexer &a, bool split)
{
    size_t G = split ? a.nheads / IDXT_HP : 1, E = IDXT_THREADS / G, ld = a.d + 4;
    return ((a.nheads + E) * ld + (split ? a.nheads * E : 0)) * sizeof(float);
}

// Whether indexer_scores_cpu_kernel takes a's shape (heads in passes of 8,
// SPLIT: at most 8 groups, each of a whole warp; key rows of 16-byte units).
static bool idxt_fits(const dindexer &a, bool split)
{
    int G = a.nheads / IDXT_HP;
    return a.d % 16 == 0 && a.nheads % IDXT_HP == 0 && (!split || (G <= 8 && 8 % G == 0)) &&
           idxt_smem(a, split) <= 200 * 1024;
}

template <bool SPLIT>
static void idxt_launch(cudaStream_t st, const dindexer &a, int t0, int nt, float smul,
                        float *scores, long long ldsc, const dindexer *segs)
{
    size_t smem = idxt_smem(a, SPLIT);
    smem_attr<SPLIT ? 3 : 2>(indexer_scores_cpu_kernel<SPLIT>, smem);
    int E = IDXT_THREADS / (SPLIT ? a.nheads / IDXT_HP : 1);
    int tiles = (a.pos_end / a.ratio + E - 1) / E, dev = 0, sms = 132, per_sm = 1;
    if (cudaGetDevice(&dev) == cudaSuccess)
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, indexer_scores_cpu_kernel<SPLIT>,
                                                  IDXT_THREADS, smem);
    int target = sms * (per_sm > 0 ? per_sm : 1), per_tok = target / nt > 1 ? target / nt : 1;
    dim3 grid(tiles < per_tok ? tiles : per_tok, nt);
    cu_launch(indexer_scores_cpu_kernel<SPLIT>, grid, IDXT_THREADS, smem, st, a, t0, smul, scores,
              ldsc, segs);
}

// indexer_scores_cpu_kernel where it takes the shape: SPLIT while its
// tiles (of 256 / (heads / 8) entries) number at most two per SM, else a
// thread an entry.  false: indexer_scores_kernel.
static bool idxt_scores(cudaStream_t st, const dindexer &a, int t0, int nt, float smul,
                        float *scores, long long ldsc, const dindexer *segs)
{
    int E = a.nheads >= IDXT_HP ? IDXT_THREADS / (a.nheads / IDXT_HP) : 1;
    long long tiles = (long long)nt * ((a.pos_end / a.ratio + E - 1) / E);
    bool split = idxt_fits(a, true) && (tiles <= 264 || !idxt_fits(a, false));
    if (split) idxt_launch<true>(st, a, t0, nt, smul, scores, ldsc, segs);
    else if (idxt_fits(a, false)) idxt_launch<false>(st, a, t0, nt, smul, scores, ldsc, segs);
    else return false;
    return true;
}

// Tokens (rows of scores, ldsc apart) at a time.
static int indexer_chunk(const dindexer &a, size_t scores_cap, long long *ldsc)
{
    int maxvis = a.pos_end / a.ratio;
    *ldsc = maxvis > 0 ? maxvis : 1;
    long long chunk = (long long)(scores_cap / *ldsc);
    if (chunk > a.n) chunk = a.n;
    if (chunk < 1) chunk = 1;
    if (chunk > 65535) chunk = 65535;   // grid.y of the score kernel
    return (int)chunk;
}

size_t cu_indexer_cand_bytes(const dindexer &a, size_t scores_cap)
{
    long long ldsc;
    int chunk = a.n > 0 ? indexer_chunk(a, scores_cap, &ldsc) : 0;
    return (size_t)chunk * cu_indexer_topk_ld(a.pos_end / a.ratio, a.topk, chunk) *
           sizeof(unsigned);
}

void cu_indexer(cudaStream_t st, const dindexer &a, float *scores, size_t scores_cap,
                unsigned *cand, uint16_t *keys, bool tiled, enum cuda_indexer_kernel mma,
                bool dec, int topk_cluster, const dindexer *segs, const cu_mark *mark)
{
    if (a.n <= 0) return;
    int maxvis = a.pos_end / a.ratio;
    long long ldsc;
    int chunk = indexer_chunk(a, scores_cap, &ldsc);
    long long ldc = cand ? cu_indexer_topk_ld(maxvis, a.topk, chunk) : 0;
    bool v4 = a.d % 4 == 0;
    size_t smem = ((size_t)a.nheads * (a.d + (v4 ? 4 : 1)) + 8 * (size_t)a.d) * sizeof(float);
    smem_attr<1>(indexer_scores_kernel<true>, smem);
    smem_attr<0>(indexer_scores_kernel<false>, smem);
    float smul = (float)pow(a.d, -0.5);
    for (int t0 = 0; t0 < a.n; t0 += chunk) {
        int nt = a.n - t0 < chunk ? a.n - t0 : chunk;
        const dindexer *sg = segs ? segs + t0 : NULL;
        if (maxvis > a.topk && keys && !segs) {
            cu_indexer_mma(st, a, t0, nt, scores, ldsc, keys, CU_INDEXER_KTILE, mma);
        } else if (maxvis > a.topk && dec) {
            cu_indexer_dec(st, a, t0, nt, scores, ldsc, sg);
        } else if (maxvis > a.topk &&
                   !(tiled && idxt_scores(st, a, t0, nt, smul, scores, ldsc, sg))) {
            dim3 grid(blocks_for(maxvis, IDX_ENTRIES), nt);
            if (v4) cu_launch(indexer_scores_kernel<true>, grid, 256, smem, st, a, t0, smul, scores,
                              ldsc, sg);
            else cu_launch(indexer_scores_kernel<false>, grid, 256, smem, st, a, t0, smul, scores,
                           ldsc, sg);
        }
        if (mark) mark->fn(mark->ctx, "indexer scores");
        cu_indexer_topk(st, a, t0, nt, scores, ldsc, ldc ? cand : NULL, ldc, sg, topk_cluster);
        if (mark) mark->fn(mark->ctx, "indexer top-k");
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
