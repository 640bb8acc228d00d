/* Per-sequence attention cache of DeepSeek V4, in two kinds of fixed-size
 * pieces taken from one pool:
 *
 *   state slot (one per sequence, fixed size): per layer the sliding-window
 *     ring (sliding_window keys), and per compressor the rows of the window
 *     being filled (kv and gate) plus, for CSA, the previous window's Ca
 *     half (the overlap);
 *   token blocks (one per block_tokens positions, as the sequence grows):
 *     per compressed layer the entries emitted for windows starting in
 *     those positions, and for CSA layers the indexer keys.
 *
 * The ring, the entries and the indexer keys are stored in the layout's
 * dtype (cpu/kv_quant.h: float32, BF16, or FP8 with per-group scales
 * beside the codes); the compressors' window state is float32.  Every
 * piece starts on a 16-byte boundary.
 *
 * The allocator keeps host-side bookkeeping only; each tensor-parallel rank
 * owns its memory for the same slot and block numbers. */
#ifndef LLM_KV_CACHE_H
#define LLM_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "cpu/kv_quant.h"
#include "model_config.h"

typedef struct {
    enum kv_dtype dtype;    /* of the ring, entries and indexer keys */
    int block_tokens;       /* positions per block (multiple of every ratio) */
    size_t block_bytes;     /* per rank; 0 when no layer compresses */
    size_t state_bytes;     /* per sequence per rank */
    int n_layers;
    size_t *ring_off;       /* per layer, in the state slot */
    size_t *comp_off;       /* compressor window state, in the slot */
    size_t *icomp_off;      /* indexer compressor window state */
    size_t *entry_off;      /* compressed entries, in a block */
    size_t *ikey_off;       /* indexer keys, in a block */
} cache_layout;

void cache_layout_init(cache_layout *L, const v4_config *c, enum kv_dtype t);
void cache_layout_free(cache_layout *L);
/* The bytes of a state slot that a continuation from a position that
 * starts a window of every compressor (a block boundary) reads: each
 * layer's ring and, for CSA, the overlap rows of the compressor and the
 * indexer's compressor (the window rows are written again before they are
 * read).  Up to 3 * n_layers ranges into off/len; returns their count. */
int cache_live_ranges(const cache_layout *L, const v4_config *c, size_t *off, size_t *len);
/* Floats of a compressor's window state (ratio rows of kv and gate, plus
 * the overlap rows when coff == 2). */
size_t comp_state_floats(int ratio, int coff, int d);

/* Blocks carry reference counts: a sequence's hold is one, and the prefix
 * cache (prefix_cache.h) adds one for a block it keeps, so a cached block
 * is shared read-only by the sequences that start from it. */
typedef struct {
    int64_t nblocks, nfree;
    int32_t *free_blocks;   /* stack */
    int32_t *ref;           /* [nblocks] holders of each block, 0 when free */
    int nslots, nfree_slots;
    int *free_slots;
} block_pool;

void block_pool_init(block_pool *p, int nslots, int64_t nblocks);
void block_pool_free(block_pool *p);
/* A free block with one holder, or -1 when none is free. */
int32_t block_take(block_pool *p);
/* One holder more; one less, the block free again when none is left. */
void block_ref(block_pool *p, int32_t b);
void block_unref(block_pool *p, int32_t b);

/* Per-sequence bookkeeping. */
typedef struct {
    int slot;
    int64_t len;            /* positions already in the cache */
    int32_t *blocks;
    int64_t nblocks, cap;
} seq_cache;

/* Blocks a sequence of n positions occupies. */
int64_t cache_blocks_for(const cache_layout *L, int64_t n);
/* Blocks that fit in `bytes` per rank beside nslots state slots; -1 when
 * the slots alone do not fit. */
int64_t cache_blocks_in(const cache_layout *L, size_t bytes, int nslots);
int seq_cache_open(block_pool *p, seq_cache *s);            /* -1: no free slot */
void seq_cache_close(block_pool *p, seq_cache *s);
/* Grow to hold n positions; -1 (and nothing taken) when the pool is short. */
int seq_cache_reserve(block_pool *p, const cache_layout *L, seq_cache *s, int64_t n);
/* Give back blocks beyond the first `keep` (undoing a failed reserve). */
void seq_cache_trim(block_pool *p, seq_cache *s, int64_t keep);

#endif
