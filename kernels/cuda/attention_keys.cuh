// The keys one query token of an attention op attends to, and the online
// softmax state update (attention.cu, attention_mma.cu, attention_decode.cu).
#pragma once

#include "kernels.cuh"

// Key j of query token i: the window (this chunk's float32 rows, or the
// ring), then the entries, each as stored.
struct attn_keys {
    const float *kv;
    const char *ring;
    int ring_t;
    dpaged comp;
    const int *sel;         // this token's chosen entries, or NULL: all
    int first, nwin, pos0, hd, window;

    __device__ kref key(int j) const
    {
        if (j < nwin) {
            int pj = first + j;
            if (pj >= pos0) return kref{ (const char *)(kv + (long long)(pj - pos0) * hd), NULL, KV_F32 };
            return kv_ref(ring_t, ring, window, hd, pj % window);
        }
        int s = j - nwin;
        return dpaged_ref(comp, sel ? sel[s] : s);
    }
};

// The keys of token i of op a (a.pos0 already taken from a.dyn); *nk gets
// their count: the window up to the token, then the visible or chosen
// compressed entries.
__device__ __forceinline__ attn_keys attn_keys_of(const dattn &a, int i, int *nk)
{
    int p = a.pos0 + i, first = p - a.window + 1 > 0 ? p - a.window + 1 : 0;
    int ncomp = a.ratio ? (a.sel ? a.nsel[i] : (p + 1) / a.ratio) : 0;
    attn_keys K = { a.kv, a.ring, a.ring_t, a.comp,
                    a.sel ? a.sel + (long long)i * a.sel_ld : NULL, first, p - first + 1,
                    a.pos0, a.hd, a.window };
    *nk = K.nwin + ncomp;
    return K;
}

// The keys of TQ consecutive query tokens i0.. of op a taken together
// (attention_mma.cu): the union of their windows (positions first(i0) up
// to the last token), then the entries — all those the last token sees
// (a prefix: HCA) or each token's chosen entries in turn (CSA).  key(j)
// also says which tokens see key j (bit s: token i0 + s): window position
// q is seen by tokens at q..q+window-1, entry w by those at positions
// p >= (w+1)*ratio - 1, a chosen entry by its own token only.
template <int TQ>
struct attn_span_keys {
    const float *kv;
    const char *ring;
    int ring_t;
    dpaged comp;
    const int *sel;         // token i0's chosen entries, or NULL
    int sel_ld, p0, nt, first, nwin, pos0, hd, window, ratio;
    int end[TQ];            // CSA: where token s's entries end (after the window)

    __device__ static unsigned span(int lo, int hi)     // bits lo..hi
    {
        return lo > hi ? 0u : (2u << hi) - (1u << lo);
    }

    __device__ kref key(int j, unsigned *vis) const
    {
        if (j < nwin) {
            int pj = first + j;
            *vis = span(max(pj - p0, 0), min(pj - p0 + window - 1, nt - 1));
            if (pj >= pos0) return kref{ (const char *)(kv + (long long)(pj - pos0) * hd), NULL, KV_F32 };
            return kv_ref(ring_t, ring, window, hd, pj % window);
        }
        if (!sel) {
            int w = j - nwin;
            *vis = span(max((w + 1) * ratio - 1 - p0, 0), nt - 1);
            return dpaged_ref(comp, w);
        }
        int s = 0, start = nwin;
#pragma unroll
        for (int u = 0; u + 1 < TQ; u++)
            if (j >= end[u]) s = u + 1, start = end[u];
        *vis = 1u << s;
        return dpaged_ref(comp, sel[(long long)s * sel_ld + j - start]);
    }
};

// Tokens i0..i0+nt-1 of op a (a.pos0 already taken from a.dyn); *nk gets
// the count of their keys.
template <int TQ>
__device__ __forceinline__ attn_span_keys<TQ> attn_span_keys_of(const dattn &a, int i0, int nt,
                                                                 int *nk)
{
    int p0 = a.pos0 + i0, plast = p0 + nt - 1;
    int first = p0 - a.window + 1 > 0 ? p0 - a.window + 1 : 0;
    attn_span_keys<TQ> K = { a.kv, a.ring, a.ring_t, a.comp,
                             a.sel ? a.sel + (long long)i0 * a.sel_ld : NULL, a.sel_ld, p0, nt,
                             first, plast - first + 1, a.pos0, a.hd, a.window, a.ratio, {} };
    *nk = K.nwin;
    if (a.ratio && !a.sel) *nk += (plast + 1) / a.ratio;
    for (int s = 0; s < TQ; s++) {
        if (a.sel && s < nt) *nk += a.nsel[i0 + s];
        K.end[s] = *nk;
    }
    return K;
}

// dattn.orope: channels c, c + 1 (c even) of a head's output row of hd
// at position pos rotated back when they are among its last 2 npairs
// (rope_kernel's operations, so the same bits as the model's rope op after
// the store).
__device__ __forceinline__ void attn_rope2(const drope *rt, int hd, int pos, int c, float &x0,
                                           float &x1)
{
    if (!rt) return;
    int i = (c - (hd - 2 * rt->npairs)) >> 1;
    if (i < 0) return;
    float cs, sn;
    rope_cs(*rt, i, pos, cs, sn);
    rope_rot2(x0, x1, cs, -sn);
}

__device__ __forceinline__ float4 attn_rope4(const drope *rt, int hd, int pos, int c, float4 v)
{
    attn_rope2(rt, hd, pos, c, v.x, v.y);
    attn_rope2(rt, hd, pos, c + 2, v.z, v.w);
    return v;
}

// dattn.store_ring: query token i's key row into the ring slot of its
// position (the model's ring_store; every thread of one block of the
// token).  With one query token a sequence the slot, pos % window, holds
// the key at pos - window, which no window of the op reads.
__device__ __forceinline__ void attn_store_ring(const dattn &a, int i)
{
    kv_put_row(a.ring_t, a.kv + (long long)i * a.hd, a.hd, (char *)a.ring, a.window,
               (a.pos0 + i) % a.window, NULL);
}

// Online softmax, one head's running state after a tile: the tile's
// exp-sum `sum` (taken against mnew) joins the running sum rescaled by
// exp(mold - mnew), 0 on the first tile; resc keeps that factor for the
// output's rescale.  One lane calls it (attention.cu, attention_decode.cu).
__device__ __forceinline__ void softmax_state_update(float *lrun, float *mrun, float *resc,
                                                     float mold, float mnew, float sum)
{
    float r = expf(mold - mnew);
    *lrun = *lrun * r + sum;
    *mrun = mnew;
    *resc = r;
}

// Keys key(0)..key(tn-1) decoded into kt[tn][ld] (kref_at's values), in units
// of 16 bytes as the cache stores them (t: 4 float32, 8 bf16 or 16 FP8
// channels with their group's scale; hd a multiple of 16, ld of 4): U
// loads in flight per thread (THREADS: the block's) before any is used.
// A key stored otherwise (the step's own float32 rows) or unaligned is
// read channel by channel.  (attention_decode.cu, the indexer's scores.)
template <int U, int THREADS, typename KeyOf>
__device__ __forceinline__ void stage_keys(KeyOf key, int t, int tn, int hd, int ld, float *kt)
{
    int w = t == KV_F32 ? 4 : t == KV_BF16 ? 8 : 16, esz = 16 / w;
    int nu = hd / w, n = tn * nu;
    for (int x0 = threadIdx.x; x0 < n; x0 += U * THREADS) {
        uint4 raw[U];
        uint32_t sc[U];
        bool ok[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int x = x0 + u * THREADS, c = x % nu * w;
            ok[u] = false;
            if (x < n) {
                kref r = key(x / nu);
                const char *p = r.p + (long long)c * esz;
                ok[u] = r.t == t && ((uintptr_t)p & 15) == 0;
                if (ok[u]) {
                    raw[u] = *(const uint4 *)p;
                    sc[u] = t == KV_FP8 ? r.s[c / KV_FP8_GROUP] : 0;
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int x = x0 + u * THREADS, c = x % nu * w;
            if (x >= n) break;
            float *d = kt + (long long)(x / nu) * ld + c;
            if (!ok[u]) {
                kref r = key(x / nu);
                for (int k = 0; k < w; k++) d[k] = kref_at(r, c + k);
            } else if (t == KV_F32) {
                *(uint4 *)d = raw[u];
            } else if (t == KV_BF16) {
                uint32_t v[4] = { raw[u].x, raw[u].y, raw[u].z, raw[u].w };
#pragma unroll
                for (int k = 0; k < 2; k++)
                    *(float4 *)(d + 4 * k) =
                        make_float4(bf16f(v[2 * k] & 0xffff), bf16f(v[2 * k] >> 16),
                                    bf16f(v[2 * k + 1] & 0xffff), bf16f(v[2 * k + 1] >> 16));
            } else {
                float s = pow2i((int)sc[u] - 127);
                uint32_t v[4] = { raw[u].x, raw[u].y, raw[u].z, raw[u].w };
#pragma unroll
                for (int k = 0; k < 4; k++) *(float4 *)(d + 4 * k) = fp8x4f(v[k], s);
            }
        }
    }
}

// Flash-decoding (the decode kernels of attention_decode.cu and
// attention_mma.cu): the keys of a (token, group of heads) in splits, a
// block each, whose partials the last block to finish merges.
#define ATTN_MAX_SPLITS 64          // attn_merge_splits: two a lane

// The splits of a launch of a.n tokens (or sequences) x groups of hpb
// heads, in tiles of kt keys: near `target` blocks, at most a split a
// tile and max_splits, a split's keys a whole number of tiles; one split
// past CU_ATTD_MAX_T tokens (the merge's counters).  Depends on n, the
// heads, pos_end and target only (graph replay).
static inline void attn_split_plan(const dattn &a, int hpb, int kt, int *splits, int *chunk,
                                   int target, int max_splits = ATTN_MAX_SPLITS)
{
    int ncomp_max = a.ratio ? (a.sel ? a.sel_ld : a.pos_end / a.ratio) : 0;
    int tiles = (a.window + ncomp_max + kt - 1) / kt;
    if (tiles < 1) tiles = 1;
    long long base = (long long)a.n * ((a.nheads + hpb - 1) / hpb);
    long long s = target / base;
    if (s < 1 || a.n > CU_ATTD_MAX_T) s = 1;
    if (s > tiles) s = tiles;
    if (s > max_splits) s = max_splits;
    int per = (int)((tiles + s - 1) / s);
    *chunk = per * kt;
    *splits = (tiles + per - 1) / per;
}

// After each thread of a block stored its part of the split's partial:
// whether this block finished last of the `splits` of its (token, head
// group) — counter *cnt, reset by that block for the next launch — the
// other blocks' partials then visible to it.
__device__ __forceinline__ bool attn_last_split(int *cnt, int splits)
{
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(cnt, 1) == splits - 1;
    __syncthreads();
    if (!last) return false;
    __threadfence();
    if (threadIdx.x == 0) *cnt = 0;
    return true;
}

// Flash-decoding's merge, run by the block of a (token, group of heads)
// that finished last (attention_decode.cu, attention_mma.cu): the group's
// nh heads' partials over `splits` key ranges — unnormalized outputs at
// part rows r0 + hh * splits + s (rows of hd floats, the first `width`
// merged), (max, sum) pairs at the same rows of pml — weighted by
// exp(max - m) with the sink in the denominator, into out (nh rows of hd;
// channel c of out is channel c0 + c of the head: attn_rope4 with rope
// and pos).  A warp per head over the splits
// (lanes s and s + 32: splits <= 64), then the channels' sums in split
// order.  wts: shared [nh][splits] floats, msum: shared [nh].  Partials
// are read past L1 (other blocks of the launch wrote them).
template <int THREADS>
__device__ __forceinline__ void attn_merge_splits(const float *part, const float *pml,
                                                  long long r0, int nh, int splits, int hd,
                                                  int width, const float *sinks, float *out,
                                                  float *wts, float *msum, const drope *rope,
                                                  int pos, int c0)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nq = width / 4;
    for (int hh = warp; hh < nh; hh += THREADS / 32) {
        const long long r = r0 + (long long)hh * splits;
        float sink = sinks[hh], ms[2], ls[2], m = sink;
#pragma unroll
        for (int u = 0; u < 2; u++) {
            int s = lane + 32 * u;
            ms[u] = s < splits ? __ldcg(pml + (r + s) * 2) : -INFINITY;
            ls[u] = s < splits ? __ldcg(pml + (r + s) * 2 + 1) : 0.0f;
            m = fmaxf(m, ms[u]);
        }
        m = warp_max(m);
        float sum = 0;
#pragma unroll
        for (int u = 0; u < 2; u++) {
            int s = lane + 32 * u;
            float e = s < splits ? expf(ms[u] - m) : 0.0f;
            if (s < splits) wts[hh * splits + s] = e;
            sum += ls[u] * e;
        }
        sum = warp_sum(sum) + expf(sink - m);
        if (lane == 0) msum[hh] = sum;
    }
    __syncthreads();
    for (int x = threadIdx.x; x < nh * nq; x += THREADS) {
        int hh = x / nq, c = x % nq * 4;
        const float *pp = part + (r0 + (long long)hh * splits) * hd + c;
        float4 acc = make_float4(0, 0, 0, 0);
#pragma unroll 8
        for (int s = 0; s < splits; s++) {
            float4 v = __ldcg((const float4 *)(pp + (long long)s * hd));
            float w = wts[hh * splits + s];
            acc = make_float4(fmaf(w, v.x, acc.x), fmaf(w, v.y, acc.y), fmaf(w, v.z, acc.z),
                              fmaf(w, v.w, acc.w));
        }
        float inv = msum[hh];
        float *o = out + (long long)hh * hd + c;
        float4 y = attn_rope4(rope, hd, pos, c0 + c,
                              make_float4(acc.x / inv, acc.y / inv, acc.z / inv, acc.w / inv));
        if (((uintptr_t)o & 15) == 0) *(float4 *)o = y;
        else o[0] = y.x, o[1] = y.y, o[2] = y.z, o[3] = y.w;
    }
}
