// The keys one query token of an attention op attends to (attention.cu,
// attention_mma.cu).
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
