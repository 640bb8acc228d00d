// The lightning indexer's top-k: of a token's nvis scores (attention.cu,
// indexer_mma.cu), the k best under the CPU's strict order (larger score
// first, then the lower index: kernels/cpu/ops.c cpu_topk), written in
// ascending index order.  One block of a token finds the k-th largest key
// by radix select and emits every larger entry and the lowest-indexed
// equal ones (block_topk).  A long context on few rows spreads a token
// over G blocks: each selects the top k of its range of entries, which
// holds every entry of the token's top k that lies in the range (fewer
// than k entries of the range, all of them in the token, precede such an
// entry), and one block then selects among the G·k candidates; or (the
// default where the device runs them) a cluster of C blocks splits the
// token's entries and selects its top k in one launch: each radix pass's
// histograms meet through distributed shared memory, so every block finds
// the same k-th key, and the counts of the blocks before it place its
// entries.  A block whose entries fit its shared memory (staged_topk)
// bins them below the token's largest key, marks the entries above the
// k-th key's bin and keeps the few in it, and the rest of the select runs
// over those.
#include <cooperative_groups.h>

#include "kernels.cuh"

namespace cg = cooperative_groups;

#define TOPK_THREADS 512
#define TOPK_LOADS 8        // keys a thread loads before counting them (radix passes)
#define TOPK_ITEMS 8        // consecutive entries a thread emits per tile
#define TOPK_STAGE 16384    // most keys a block stages in shared memory (64 KB)
#define TOPK_CL_KEYS 4096   // entries a cluster's block takes at least (fewer blocks)
#define TOPK_CL_MAX 16      // its most blocks (non-portable above 8)
#define TOPK_BINS 2048      // a staged block's bins below the token's largest key
#define TOPK_FINE 16        // of 2^16 keys each: 1/128 of a binade, 16 binades
#define TOPK_CAND 512       // most entries of the k-th key's bin a block keeps
// Shared memory a staged block has past its keys: the bins' counts, then
// the above/equal bitmaps of its entries and its kept entries (keys,
// indices).  64 + 8 KB (and 16 bytes: staged_topk's alignment) and
// topk_smem's 2.5: three blocks an SM fit the 228 KB, as the kernels'
// launch bounds ask (40 registers).
#define TOPK_AUX (4 * TOPK_BINS)
static_assert(TOPK_STAGE / 32 == TOPK_THREADS && TOPK_BINS / 32 <= TOPK_THREADS,
              "a thread a bitmap word, a group of bins");
static_assert(2 * TOPK_STAGE / 32 * 4 + TOPK_CAND * 6 <= TOPK_AUX, "aux room");

// hist: two, so that a cluster's blocks read pass p's while the next pass
// fills the other (one cluster barrier a pass).
struct topk_smem {
    int hist[2][256], scan[32], cnt[2], before[2];
    unsigned prefix, top;
    int krem, ncand, bin, gsum[TOPK_BINS / 32];
    bool big;
};

// block_topk's part of the token's entries: all of them (one block), or
// in a cluster the range of this block.  sync: every block's histogram of
// the pass complete; count: bin b's count over the token; bases: the
// entries the blocks before this one emit, and their equal entries.
struct topk_whole {
    static constexpr bool split = false;
    __device__ void sync() const {}
    __device__ int count(const int *hist, int b) const { return hist[b]; }
    __device__ int most(const int *hist, int b) const { return hist[b]; }
    __device__ unsigned keymax(const unsigned *v) const { return *v; }
    __device__ void bases(int, int, int, topk_smem &, int *base, int *eqbase) const
    {
        *base = *eqbase = 0;
    }
    __device__ void done() const {}
};

struct topk_cluster {
    static constexpr bool split = true;
    cg::cluster_group cl;
    __device__ void sync() const
    {
        asm volatile("barrier.cluster.arrive.release;" ::: "memory");
        asm volatile("barrier.cluster.wait.acquire;" ::: "memory");
    }
    __device__ int count(const int *hist, int b) const
    {
        int n = (int)cl.num_blocks(), v[16], h = 0;
#pragma unroll
        for (int r = 0; r < 16; r++) v[r] = r < n ? *cl.map_shared_rank(hist + b, r) : 0;
#pragma unroll
        for (int r = 0; r < 16; r++) h += v[r];
        return h;
    }
    // the largest of the blocks' counts of bin b
    __device__ int most(const int *hist, int b) const
    {
        int n = (int)cl.num_blocks(), h = 0;
        for (int r = 0; r < n; r++) h = max(h, *cl.map_shared_rank(hist + b, r));
        return h;
    }
    // the largest of the blocks' *v (a lane a block)
    __device__ unsigned keymax(const unsigned *v) const
    {
        unsigned lane = threadIdx.x & 31;
        return __reduce_max_sync(0xffffffffu,
                                 lane < cl.num_blocks() ? *cl.map_shared_rank(v, lane) : 0);
    }
    // gt / eq: this block's entries above / at the k-th key (thread sums);
    // a lane a block before this one reads that block's counts.
    __device__ void bases(int gt, int eq, int krem, topk_smem &sm, int *base, int *eqbase) const
    {
        int lane = threadIdx.x & 31;
        for (int o = 16; o; o >>= 1)
            gt += __shfl_xor_sync(0xffffffffu, gt, o), eq += __shfl_xor_sync(0xffffffffu, eq, o);
        if (lane == 0 && gt) atomicAdd(&sm.cnt[0], gt);
        if (lane == 0 && eq) atomicAdd(&sm.cnt[1], eq);
        __syncthreads();
        sync();
        if (threadIdx.x < 32) {
            int g = 0, e = 0;
            if (lane < (int)cl.block_rank())
                g = *cl.map_shared_rank(&sm.cnt[0], lane), e = *cl.map_shared_rank(&sm.cnt[1], lane);
            for (int o = 16; o; o >>= 1)
                g += __shfl_xor_sync(0xffffffffu, g, o), e += __shfl_xor_sync(0xffffffffu, e, o);
            if (lane == 0) sm.before[0] = g, sm.before[1] = e;
        }
        // done() waits: no block leaves while another reads its counts
        asm volatile("barrier.cluster.arrive.release;" ::: "memory");
        __syncthreads();
        *base = sm.before[0] + min(sm.before[1], krem);
        *eqbase = sm.before[1];
    }
    __device__ void done() const { asm volatile("barrier.cluster.wait.acquire;" ::: "memory"); }
};

// Orderable key of a float (larger float, larger key; -0 is 0).
__device__ __forceinline__ unsigned fkey(float f)
{
    unsigned u = __float_as_uint(f);
    if (u == 0x80000000u) u = 0;
    return u & 0x80000000u ? ~u : u | 0x80000000u;
}

// The keys of a row of scores: key(s) = fkey(row[s]).  staged_topk
// copies such a row 16 bytes a load.
struct score_keys {
    const float *row;
    __device__ unsigned operator()(int s) const { return fkey(row[s]); }
};

// Keys c0 + j blockDim.x + threadIdx.x (j < TOPK_LOADS) of n into u (0
// past n), every load issued before any is used.
template <class Key>
__device__ __forceinline__ void topk_loads(int c0, int n, Key key, unsigned (&u)[TOPK_LOADS])
{
#pragma unroll
    for (int j = 0; j < TOPK_LOADS; j++) {
        int s = c0 + j * blockDim.x + threadIdx.x;
        u[j] = s < n ? key(s) : 0;
    }
}

// 8-bit radix passes over bits top-1..0 of the keys key(s) (s < n) that
// match prefix under mask (the bits above top): prefix and mask become
// the k-th largest key of the token, krem how many entries of that key
// it still takes (lanes of a warp that count the same bin add once).
// In a cluster (part topk_cluster) the counts are the token's.
template <class Key, class Part>
__device__ void radix_select(int n, Key key, unsigned &prefix, unsigned &mask, int &krem, int top,
                             topk_smem &sm, const Part &part)
{
    int lane = threadIdx.x & 31;
    for (int p = 0; top > 0; p++) {
        int shift = max(top - 8, 0);
        unsigned bins = (1u << (top - shift)) - 1;
        int *hist = sm.hist[p & 1];
        for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
        __syncthreads();
        for (int c0 = 0; c0 < n; c0 += TOPK_LOADS * blockDim.x) {
            unsigned u[TOPK_LOADS];
            topk_loads(c0, n, key, u);
#pragma unroll
            for (int j = 0; j < TOPK_LOADS; j++) {
                bool in = c0 + j * (int)blockDim.x + (int)threadIdx.x < n && (u[j] & mask) == prefix;
                unsigned act = __ballot_sync(0xffffffffu, in);
                if (in) {
                    unsigned bin = u[j] >> shift & bins, peers = __match_any_sync(act, bin);
                    if (lane == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
                }
            }
        }
        __syncthreads();
        part.sync();
        // Bins from the top down over threads 0..255: the one where the
        // count from the top reaches krem.
        int b = 255 - (int)threadIdx.x, h = b >= 0 ? part.count(hist, b) : 0, tot;
        int above = block_scan(h, sm.scan, &tot);
        if (b >= 0 && above < krem && above + h >= krem) {
            sm.prefix = prefix | (unsigned)b << shift;
            sm.krem = krem - above;
        }
        __syncthreads();
        prefix = sm.prefix;
        krem = sm.krem;
        mask |= bins << shift;
        top = shift;
    }
}

// The top k (0 < k <= n) of entries 0..n-1 with keys key(s), larger key
// first, then lower s: emit(r, s, key) for each, r its place among them
// in ascending s (0..k-1).  Every thread of the block (whole warps, at
// least 256 threads: one a histogram bin) calls it.  In a cluster (part
// topk_cluster) n, the entries and r are the block's share of the token's
// (k of the token, r from the blocks before it), and every block calls it.
// The k-th largest key by 4 rounds of 8-bit radix select, then tiles of
// TOPK_ITEMS consecutive entries per thread, one block scan per tile
// counting the larger (low 16 bits) and equal (high bits) entries before
// each thread; the entries equal to the k-th key are taken while fewer
// than krem of them have been.  Stops once k entries are out.
template <class Key, class Emit, class Part>
__device__ void block_topk(int n, int k, Key key, Emit emit, topk_smem &sm, const Part &part)
{
    unsigned prefix = 0, mask = 0;
    int krem = k;       // entries with the key bits so far still to take
    radix_select(n, key, prefix, mask, krem, 32, sm, part);
    int base, eqbase;   // entries emitted, equal entries seen before the tile
    {
        int gt = 0, eq = 0;
        if (Part::split)
            for (int s = threadIdx.x; s < n; s += blockDim.x) {
                unsigned u = key(s);
                gt += u > prefix, eq += u == prefix;
            }
        part.bases(gt, eq, krem, sm, &base, &eqbase);
    }
    for (int c0 = 0; c0 < n && base < k; c0 += TOPK_ITEMS * blockDim.x) {
        int s0 = c0 + threadIdx.x * TOPK_ITEMS;
        unsigned u[TOPK_ITEMS], gt = 0, eq = 0;     // bit j: entry s0 + j
#pragma unroll
        for (int j = 0; j < TOPK_ITEMS; j++) {
            u[j] = s0 + j < n ? key(s0 + j) : 0;
            gt |= (unsigned)(s0 + j < n && u[j] > prefix) << j;
            eq |= (unsigned)(s0 + j < n && u[j] == prefix) << j;
        }
        int tot, before = block_scan(__popc(gt) | __popc(eq) << 16, sm.scan, &tot);
        int eqfree = max(krem - eqbase, 0);         // equal entries still to take
        int eqr = eqbase + (before >> 16);          // rank of this thread's first equal entry
        int r = base + (before & 0xffff) + min(before >> 16, eqfree);
#pragma unroll
        for (int j = 0; j < TOPK_ITEMS; j++) {
            bool take = gt >> j & 1;
            if (eq >> j & 1) take = eqr++ < krem;
            if (take) emit(r++, s0 + j, u[j]);
        }
        base += (tot & 0xffff) + min(tot >> 16, eqfree);
        eqbase += tot >> 16;
    }
    part.done();
}

// The bin of the token's k-th key in hist (bins 1..TOPK_BINS-1 of
// staged_topk's fine bins; bin 0 holds the keys below them and is not
// counted): into sm.bin, with sm.krem the entries of the bin the top k
// takes and sm.big whether the bin is missing (the k-th key lies below
// the bins) or a block holds more than TOPK_CAND of it (the same answer
// in every block of a cluster).  First the group of 32 bins, then the bin
// in it: a cluster's blocks read 96 of each other's counts, not 2,048.
template <class Part>
__device__ void fine_bin(const int *hist, int krem, topk_smem &sm, const Part &part)
{
    int lane = threadIdx.x & 31, t = threadIdx.x, tot;
    for (int g = threadIdx.x >> 5; g < TOPK_BINS / 32; g += blockDim.x >> 5) {
        int v = __reduce_add_sync(0xffffffffu, hist[32 * g + lane]);
        if (lane == 0) sm.gsum[g] = v;
    }
    if (t == 0) sm.bin = -1, sm.big = true;
    __syncthreads();
    part.sync();
    int g = TOPK_BINS / 32 - 1 - t, h = g >= 0 ? part.count(sm.gsum, g) : 0;
    int above = block_scan(h, sm.scan, &tot);
    if (g >= 0 && above < krem && above + h >= krem) sm.bin = g, sm.krem = krem - above;
    __syncthreads();
    g = sm.bin, krem = sm.krem;
    if (g < 0) return;
    int b = 32 * g + 31 - t;
    h = t < 32 ? part.count(hist, b) : 0;
    above = block_scan(h, sm.scan, &tot);
    if (t < 32 && above < krem && above + h >= krem) {
        sm.bin = b;
        sm.krem = krem - above;
        sm.big = part.most(hist, b) > TOPK_CAND;
    }
    __syncthreads();
}

// block_topk (same contract) over keys staged in shared memory (ks, room
// for kcap, and TOPK_AUX bytes past it) when n <= kcap, in two passes
// over the keys, not five.  The copy finds the token's largest key; the
// second pass counts the keys in TOPK_BINS bins of 2^TOPK_FINE keys each
// below it (fine enough that a warp's keys seldom share one); one over
// all keys then marks, a warp a word of 32 entries, those in bins above
// the k-th key's and keeps the ones in its bin (at most TOPK_CAND a
// block, else block_topk's passes); 8-bit passes over the kept ones find
// the k-th key and mark them, and the marks give each thread's word its
// place by one block scan.  (Run V3: staging took a 2,048-entry block
// from 10.1 to 8.9 us.)  All of a thread's loads are in flight before it
// stores any; a row of scores (score_keys) 16 bytes a load, the keys
// staged from ks + (the row's word offset in 16 bytes) so that both sides
// of each copy are aligned.
template <class Key, class Emit, class Part = topk_whole>
__device__ void staged_topk(int n, int k, Key key, Emit emit, topk_smem &sm, unsigned *ks,
                            int kcap, const Part &part = Part())
{
    if (n > kcap) {
        block_topk(n, k, key, emit, sm, part);
        return;
    }
    int *hist = (int *)(ks + kcap + 4), lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nw = blockDim.x >> 5, W = (n + 31) >> 5;
    for (int b = threadIdx.x; b < TOPK_BINS; b += blockDim.x) hist[b] = 0;
    if (threadIdx.x == 0) sm.ncand = 0, sm.top = 0;
    __syncthreads();
    unsigned top = 0;
    if constexpr (std::is_same<Key, score_keys>::value) {
        // entries s0.. in 16-byte groups, the few before and after alone
        const float *row = key.row;
        int a = (int)((uintptr_t)row >> 2 & 3), s0 = min(n, (4 - a) & 3), nv = (n - s0) >> 2;
        int tail = s0 + 4 * nv, t = threadIdx.x;     // threads 0-3 the head, 4-7 the tail
        ks += a;
        if (t < s0 || (t >= 4 && t - 4 < n - tail)) {
            int e = t < 4 ? t : tail + t - 4;
            ks[e] = top = fkey(row[e]);
        }
        const float4 *v = (const float4 *)(row + s0);
        for (int i0 = 0; i0 < nv; i0 += 4 * blockDim.x) {
            float4 x[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int i = i0 + j * blockDim.x + threadIdx.x;
                if (i < nv) x[j] = v[i];
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int i = i0 + j * blockDim.x + threadIdx.x;
                if (i >= nv) break;
                uint4 u = make_uint4(fkey(x[j].x), fkey(x[j].y), fkey(x[j].z), fkey(x[j].w));
                *(uint4 *)(ks + s0 + 4 * i) = u;
                top = max(top, max(max(u.x, u.y), max(u.z, u.w)));
            }
        }
    } else {
        for (int c0 = 0; c0 < n; c0 += TOPK_LOADS * blockDim.x) {
            unsigned u[TOPK_LOADS];
            topk_loads(c0, n, key, u);
#pragma unroll
            for (int j = 0; j < TOPK_LOADS; j++) {
                int s = c0 + j * blockDim.x + threadIdx.x;
                if (s < n) ks[s] = u[j], top = max(top, u[j]);
            }
        }
    }
    top = __reduce_max_sync(0xffffffffu, top);
    if (lane == 0) atomicMax(&sm.top, top);
    __syncthreads();
    part.sync();
    // bin of key u: (u >> TOPK_FINE) - base, the largest key's TOPK_BINS - 1
    int base = (int)(part.keymax(&sm.top) >> TOPK_FINE) - (TOPK_BINS - 1);
    for (int s = threadIdx.x; s < n; s += blockDim.x) {
        int b = (int)(ks[s] >> TOPK_FINE) - base;
        if (b > 0) atomicAdd(&hist[b], 1);
    }
    __syncthreads();
    fine_bin(hist, k, sm, part);
    part.sync();    // no block reads hist any more
    if (sm.big) {
        block_topk(n, k, [&](int s) { return ks[s]; }, emit, sm, part);
        return;
    }
    int B = sm.bin, krem = sm.krem;
    // hist's room: bitmaps gtw / eqw of the entries above / equal to the
    // k-th key, then the kept entries' keys cu and indices cs
    unsigned *gtw = (unsigned *)hist, *eqw = gtw + TOPK_STAGE / 32, *cu = eqw + TOPK_STAGE / 32;
    unsigned short *cs = (unsigned short *)(cu + TOPK_CAND);
    for (int w = warp; w < W; w += nw) {
        int s = w * 32 + lane, b = s < n ? (int)(ks[s] >> TOPK_FINE) - base : 0;
        unsigned g = __ballot_sync(0xffffffffu, b > B), e = __ballot_sync(0xffffffffu, b == B);
        if (lane == 0) gtw[w] = g, eqw[w] = 0;
        if (e) {
            int at = 0;
            if (lane == 0) at = atomicAdd(&sm.ncand, __popc(e));
            at = __shfl_sync(0xffffffffu, at, 0) + __popc(e & ((1u << lane) - 1));
            if (b == B) cu[at] = ks[s], cs[at] = (unsigned short)s;
        }
    }
    __syncthreads();
    // the kept keys share their bits from TOPK_FINE up
    int nc = sm.ncand;
    unsigned prefix = (unsigned)(B + base) << TOPK_FINE, mask = ~0u << TOPK_FINE;
    radix_select(nc, [&](int i) { return cu[i]; }, prefix, mask, krem, TOPK_FINE, sm, part);
    for (int i = threadIdx.x; i < nc; i += blockDim.x) {
        unsigned u = cu[i], s = cs[i];
        if (u >= prefix) atomicOr(&(u > prefix ? gtw : eqw)[s >> 5], 1u << (s & 31));
    }
    __syncthreads();
    unsigned g = (int)threadIdx.x < W ? gtw[threadIdx.x] : 0;
    unsigned e = (int)threadIdx.x < W ? eqw[threadIdx.x] : 0;
    int before0, eqbase, tot;
    part.bases(__popc(g), __popc(e), krem, sm, &before0, &eqbase);
    int before = block_scan(__popc(g) | __popc(e) << 16, sm.scan, &tot);
    int eqr = eqbase + (before >> 16);
    int r = before0 + (before & 0xffff) + min(before >> 16, max(krem - eqbase, 0));
    for (unsigned all = g | e; all; all &= all - 1) {
        int j = __ffs(all) - 1, s = threadIdx.x * 32 + j;
        bool take = g >> j & 1;
        if (e >> j & 1) take = eqr++ < krem;
        if (take) emit(r++, s, ks[s]);
    }
    part.done();
}

// Blocks per token: 1 under IDX_TOPK_MULTI_MIN entries, else
// floor(sqrt(nvis / k)), which makes a block's range (about sqrt(nvis k)
// entries, at least k) as long as the G·k candidates.  Grows with nvis,
// so the plan's maxvis bounds every token's.
__host__ __device__ static int topk_blocks(int nvis, int k)
{
    if (nvis < IDX_TOPK_MULTI_MIN || k <= 0) return 1;
    int q = nvis / k, g = (int)sqrtf((float)q);
    while (g * g > q) g--;
    while ((g + 1) * (g + 1) <= q) g++;
    return g;
}

__device__ __forceinline__ int visible(const dindexer &a, int i)
{
    return ((a.dyn ? a.dyn->pos0 : a.pos0) + i + 1) / a.ratio;
}

// Block (b, row) of a token that spreads over G >= 2 blocks: the top k
// of its range [b nvis / G, (b + 1) nvis / G) of entries into the row's
// candidates (ldc apart): keys at b·k.., entry indices at G·k + b·k..,
// in ascending entry order.  Rows are tokens t0.. of the step, or with
// segs sequences (a block row each).
__global__ void __launch_bounds__(TOPK_THREADS, 3)
    indexer_topk_part_kernel(dindexer a, int t0, const float *scores, long long ldsc,
                             unsigned *cand, long long ldc, const dindexer *segs, int kcap)
{
    pdl_wait();
    __shared__ topk_smem sm;
    extern __shared__ __align__(16) unsigned ks[];
    int i = t0 + blockIdx.y;
    if (segs) a = segs[blockIdx.y], i = 0;
    int nvis = visible(a, i), k = a.topk, G = topk_blocks(nvis, k), b = blockIdx.x;
    if (G < 2 || b >= G) return;
    int lo = (int)((long long)b * nvis / G), hi = (int)((long long)(b + 1) * nvis / G);
    const float *sc = scores + blockIdx.y * ldsc + lo;
    unsigned *ck = cand + blockIdx.y * ldc + (long long)b * k, *ci = ck + (long long)G * k;
    staged_topk(hi - lo, k, score_keys{ sc },
                [&](int r, int s, unsigned u) { ck[r] = u, ci[r] = lo + s; }, sm, ks, kcap);
}

// A block per row: the token's chosen entries into a.sel (k of them, or
// all nvis when nvis <= k) and their count into a.nsel; from the scores,
// or with cand, for a token of G >= 2 blocks, from its G·k candidates
// (in ascending entry order: the lower candidate is the lower entry).
__global__ void __launch_bounds__(TOPK_THREADS, 3)
    indexer_topk_kernel(dindexer a, int t0, const float *scores, long long ldsc,
                        const unsigned *cand, long long ldc, const dindexer *segs, int kcap)
{
    pdl_wait();
    __shared__ topk_smem sm;
    extern __shared__ __align__(16) unsigned ks[];
    int i = t0 + blockIdx.x;
    if (segs) a = segs[blockIdx.x], i = 0;
    int nvis = visible(a, i), k = a.topk;
    int *out = a.sel + (long long)i * k;
    if (nvis <= k || k <= 0) {
        int m = k <= 0 ? 0 : nvis;
        for (int s = threadIdx.x; s < m; s += blockDim.x) out[s] = s;
        if (threadIdx.x == 0) a.nsel[i] = m;
        return;
    }
    int G = cand ? topk_blocks(nvis, k) : 1;
    if (G > 1) {
        const unsigned *ck = cand + blockIdx.x * ldc, *ci = ck + (long long)G * k;
        staged_topk(G * k, k, [&](int j) { return ck[j]; },
                    [&](int r, int j, unsigned) { out[r] = (int)ci[j]; }, sm, ks, kcap);
    } else {
        const float *sc = scores + blockIdx.x * ldsc;
        staged_topk(nvis, k, score_keys{ sc }, [&](int r, int s, unsigned) { out[r] = s; }, sm,
                    ks, kcap);
    }
    if (threadIdx.x == 0) a.nsel[i] = k;
}

// A cluster of C blocks (blockIdx.x its rank) a row: block b takes the
// token's entries [b nvis / C, (b + 1) nvis / C), staged in shared memory
// where they fit kcap, and writes its share of the chosen entries.
__global__ void __launch_bounds__(TOPK_THREADS, 3)
    indexer_topk_cluster_kernel(dindexer a, int t0, const float *scores, long long ldsc,
                                const dindexer *segs, int kcap)
{
    pdl_wait();
    __shared__ topk_smem sm;
    extern __shared__ __align__(16) unsigned ks[];
    topk_cluster part = { cg::this_cluster() };
    int C = (int)part.cl.num_blocks(), b = (int)part.cl.block_rank();
    int i = t0 + blockIdx.y;
    if (segs) a = segs[blockIdx.y], i = 0;
    int nvis = visible(a, i), k = a.topk;
    int *out = a.sel + (long long)i * k;
    if (nvis <= k || k <= 0) {     // the whole cluster leaves here
        int m = k <= 0 ? 0 : nvis;
        if (b == 0)
            for (int s = threadIdx.x; s < m; s += blockDim.x) out[s] = s;
        if (b == 0 && threadIdx.x == 0) a.nsel[i] = m;
        return;
    }
    if (threadIdx.x < 2) sm.cnt[threadIdx.x] = 0;
    int lo = (int)((long long)b * nvis / C), hi = (int)((long long)(b + 1) * nvis / C);
    const float *sc = scores + blockIdx.y * ldsc + lo;
    staged_topk(hi - lo, k, score_keys{ sc }, [&](int r, int s, unsigned) { out[r] = lo + s; },
                sm, ks, kcap, part);
    if (b == 0 && threadIdx.x == 0) a.nsel[i] = k;
}

// Dynamic shared memory of a launch that stages kcap keys a block.
static size_t topk_smem_bytes(int kcap)
{
    return kcap ? (kcap + 4) * sizeof(unsigned) + TOPK_AUX : 0;
}

long long cu_indexer_topk_ld(int maxvis, int topk, int rows)
{
    int G = topk_blocks(maxvis, topk);
    return rows <= IDX_TOPK_MULTI_MAX_T && G > 1 ? 2LL * G * topk : 0;
}

int cu_indexer_topk_cluster_max()
{
    for (int C = TOPK_CL_MAX; C >= 2; C /= 2)
        if (cu_cluster_runs(indexer_topk_cluster_kernel, dim3(C), TOPK_THREADS,
                            topk_smem_bytes(TOPK_STAGE)))
            return C;
    return 0;
}

// The launches stage keys where a row's count fits TOPK_STAGE: the part
// kernel (few rows) always has room for that many, the last kernel for
// the most its rows can have, or that many for few rows (the rows of a
// many-row prefill launch over longer contexts read global memory at
// full occupancy instead, where no cluster stages them).  A cluster takes
// a block per TOPK_CL_KEYS entries of the longest row for few rows, a
// block per TOPK_STAGE for many, at most `cluster` blocks.
void cu_indexer_topk(cudaStream_t st, const dindexer &a, int t0, int nt, const float *scores,
                     long long ldsc, unsigned *cand, long long ldc, const dindexer *segs,
                     int cluster)
{
    int maxvis = a.pos_end / a.ratio, G = topk_blocks(maxvis, a.topk);
    // Decode rows: blocks of TOPK_CL_KEYS+ entries (more blocks at work).
    // Many rows (prefill) fill the GPU either way: a cluster only where a
    // row outgrows one block's staging, as few blocks as stage it all (one
    // read of the scores instead of five).
    bool few = G > 1 && nt <= IDX_TOPK_MULTI_MAX_T;
    int cmax = 1;
    while (cmax < cluster && (long long)cmax * TOPK_STAGE < maxvis) cmax *= 2;
    if (cluster > 1 && (few || (maxvis > TOPK_STAGE && (long long)cmax * TOPK_STAGE >= maxvis))) {
        int C = 2;
        while (C < cluster && (long long)C * (few ? TOPK_CL_KEYS : TOPK_STAGE) < maxvis) C *= 2;
        int per = (maxvis + C - 1) / C, kcap = per <= TOPK_STAGE ? per : 0;
        cu_launch_cluster(indexer_topk_cluster_kernel, dim3(C, nt), TOPK_THREADS,
                          topk_smem_bytes(kcap), st, dim3(C, 1, 1), a, t0, scores, ldsc, segs,
                          kcap);
        return;
    }
    smem_attr<0>(indexer_topk_part_kernel, topk_smem_bytes(TOPK_STAGE));
    smem_attr<1>(indexer_topk_kernel, topk_smem_bytes(TOPK_STAGE));
    if (cand)
        cu_launch(indexer_topk_part_kernel, dim3(G, nt), TOPK_THREADS,
                  topk_smem_bytes(TOPK_STAGE), st, a, t0, scores, ldsc, cand, ldc, segs,
                  TOPK_STAGE);
    long long most = maxvis;
    if (cand && G > 1)
        most = max((long long)G * a.topk, (long long)min(maxvis, IDX_TOPK_MULTI_MIN - 1));
    int kcap = most <= TOPK_STAGE ? (int)most : nt <= IDX_TOPK_MULTI_MAX_T ? TOPK_STAGE : 0;
    cu_launch(indexer_topk_kernel, nt, TOPK_THREADS, topk_smem_bytes(kcap), st, a, t0, scores,
              ldsc, cand, ldc, segs, kcap);
}
