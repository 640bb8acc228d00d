#include "kv_cache.h"

#include <stdlib.h>

size_t comp_state_floats(int ratio, int coff, int d)
{
    size_t win = (size_t)ratio * 2 * coff * d;          /* kv | gate per token */
    size_t ovl = coff == 2 ? (size_t)ratio * 2 * d : 0; /* Ca | Ga of the last window */
    return win + ovl;
}

static int gcd(int a, int b) { return b ? gcd(b, a % b) : a; }

static size_t floats_bytes(size_t n) { return (n * sizeof(float) + 15) / 16 * 16; }

void cache_layout_init(cache_layout *L, const v4_config *c, enum kv_dtype t)
{
    int n = c->n_layers;
    L->dtype = t;
    L->n_layers = n;
    L->ring_off = calloc(n, sizeof(size_t));
    L->comp_off = calloc(n, sizeof(size_t));
    L->icomp_off = calloc(n, sizeof(size_t));
    L->entry_off = calloc(n, sizeof(size_t));
    L->ikey_off = calloc(n, sizeof(size_t));
    int lcm = 1;
    for (int l = 0; l < n; l++) {
        int r = v4_layer_ratio(c, l);
        if (r) lcm = lcm / gcd(lcm, r) * r;
    }
    L->block_tokens = lcm * ((64 + lcm - 1) / lcm);
    size_t st = 0, blk = 0;
    for (int l = 0; l < n; l++) {
        int r = v4_layer_ratio(c, l);
        L->ring_off[l] = st;
        st += kv_region_bytes(t, c->sliding_window, c->head_dim);
        if (!r) continue;
        bool csa = c->attn[l] == V4_ATTN_CSA;
        int rows = L->block_tokens / r;
        L->comp_off[l] = st;
        st += floats_bytes(comp_state_floats(r, csa ? 2 : 1, c->head_dim));
        L->entry_off[l] = blk;
        blk += kv_region_bytes(t, rows, c->head_dim);
        if (csa) {
            L->icomp_off[l] = st;
            st += floats_bytes(comp_state_floats(r, 2, c->index_head_dim));
            L->ikey_off[l] = blk;
            blk += kv_region_bytes(t, rows, c->index_head_dim);
        }
    }
    L->state_bytes = st;
    L->block_bytes = blk;
}

int cache_live_ranges(const cache_layout *L, const v4_config *c, size_t *off, size_t *len)
{
    int n = 0;
    for (int l = 0; l < L->n_layers; l++) {
        off[n] = L->ring_off[l];
        len[n++] = kv_region_bytes(L->dtype, c->sliding_window, c->head_dim);
        if (c->attn[l] != V4_ATTN_CSA) continue;
        int r = v4_layer_ratio(c, l);
        /* the overlap follows the window rows (comp_state_floats) */
        off[n] = L->comp_off[l] + (size_t)r * 2 * 2 * c->head_dim * sizeof(float);
        len[n++] = (size_t)r * 2 * c->head_dim * sizeof(float);
        off[n] = L->icomp_off[l] + (size_t)r * 2 * 2 * c->index_head_dim * sizeof(float);
        len[n++] = (size_t)r * 2 * c->index_head_dim * sizeof(float);
    }
    return n;
}

void cache_layout_free(cache_layout *L)
{
    free(L->ring_off);
    free(L->comp_off);
    free(L->icomp_off);
    free(L->entry_off);
    free(L->ikey_off);
}

void block_pool_init(block_pool *p, int nslots, int64_t nblocks)
{
    p->nblocks = p->nfree = nblocks;
    p->free_blocks = malloc((nblocks ? nblocks : 1) * sizeof *p->free_blocks);
    /* Pop order 0, 1, 2, ... from the top of the stack. */
    for (int64_t i = 0; i < nblocks; i++) p->free_blocks[i] = (int32_t)(nblocks - 1 - i);
    p->ref = calloc(nblocks ? nblocks : 1, sizeof *p->ref);
    p->nslots = p->nfree_slots = nslots;
    p->free_slots = malloc((nslots ? nslots : 1) * sizeof *p->free_slots);
    for (int i = 0; i < nslots; i++) p->free_slots[i] = nslots - 1 - i;
}

void block_pool_free(block_pool *p)
{
    free(p->free_blocks);
    free(p->ref);
    free(p->free_slots);
}

int32_t block_take(block_pool *p)
{
    if (!p->nfree) return -1;
    int32_t b = p->free_blocks[--p->nfree];
    p->ref[b] = 1;
    return b;
}

void block_ref(block_pool *p, int32_t b) { p->ref[b]++; }

void block_unref(block_pool *p, int32_t b)
{
    if (--p->ref[b] == 0) p->free_blocks[p->nfree++] = b;
}

int64_t cache_blocks_for(const cache_layout *L, int64_t n)
{
    if (!L->block_bytes || n <= 0) return 0;
    return (n + L->block_tokens - 1) / L->block_tokens;
}

int64_t cache_blocks_in(const cache_layout *L, size_t bytes, int nslots)
{
    size_t fixed = (size_t)nslots * L->state_bytes;
    if (bytes < fixed) return -1;
    return L->block_bytes ? (int64_t)((bytes - fixed) / L->block_bytes) : 0;
}

int seq_cache_open(block_pool *p, seq_cache *s)
{
    if (!p->nfree_slots) return -1;
    *s = (seq_cache){ .slot = p->free_slots[--p->nfree_slots] };
    return 0;
}

void seq_cache_close(block_pool *p, seq_cache *s)
{
    for (int64_t i = 0; i < s->nblocks; i++) block_unref(p, s->blocks[i]);
    p->free_slots[p->nfree_slots++] = s->slot;
    free(s->blocks);
    *s = (seq_cache){ .slot = -1 };
}

int seq_cache_reserve(block_pool *p, const cache_layout *L, seq_cache *s, int64_t n)
{
    int64_t need = cache_blocks_for(L, n) - s->nblocks;
    if (need <= 0) return 0;
    if (need > p->nfree) return -1;
    if (s->nblocks + need > s->cap) {
        s->cap = (s->nblocks + need) * 2;
        s->blocks = realloc(s->blocks, s->cap * sizeof *s->blocks);
    }
    while (need--) s->blocks[s->nblocks++] = block_take(p);
    return 0;
}

void seq_cache_trim(block_pool *p, seq_cache *s, int64_t keep)
{
    while (s->nblocks > keep) block_unref(p, s->blocks[--s->nblocks]);
}
