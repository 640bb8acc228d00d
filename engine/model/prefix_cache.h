/* Automatic prefix caching: the bookkeeping (docs/MODEL.md, "Prefix
 * caching" says what a cached prefix holds and why it is exact).
 *
 * An entry stands for one full block of positions [k*B, (k+1)*B) of some
 * token sequence: its chain hash (SHA-256 over the previous block's hash
 * and this block's token ids, truncated to 64 bits; the first block's
 * "previous hash" is the seed, which covers everything that changes the
 * cache bytes), its tokens and parent hash (compared on lookup, so a hash
 * collision never matches), the pool block holding the block's compressed
 * entries and indexer keys (shared read-only: the entry holds one
 * reference, each sequence that starts from it another), and optionally a
 * snapshot of a sequence's state at the block's end, in `snap_blocks`
 * pool blocks of its own, which a new sequence copies to resume there.
 *
 * Entries are kept in least-recently-used order; eviction takes entries
 * nobody else holds (block and snapshot), and the snapshots of entries in
 * use.  A sequence's blocks are touched last to first when it ends, so the
 * tail of a chain goes before its head.  With a host tier (host_budget >
 * 0) an evicted entry's bytes are first copied to host memory (spill) and
 * the entry stays findable; using it copies them back (fill).  The host
 * tier has its own LRU order and a pool of its own: units of one pool
 * block (all ranks), an entry taking one per block it copies.  Pinned entries are never
 * evicted nor lose their snapshot.  The bytes themselves are copied by the
 * model (model_prefix.c) through the spill/fill callbacks. */
#ifndef LLM_PREFIX_CACHE_H
#define LLM_PREFIX_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv_cache.h"

typedef struct {
    uint64_t hash, parent;  /* chain hash through this block, and before it */
    int32_t block;          /* pool block; -1: the entry is in host memory */
    int32_t *snap;          /* [snap_blocks] state at the block's end, or NULL */
    int32_t *host;          /* host tier units holding the block, then its
                             * snapshot's blocks (pc_host_at); NULL: none */
    bool host_snap;         /* the host copy carries a snapshot */
    int32_t pins;
    int32_t *tokens;        /* [block_tokens]; NULL: a free entry */
    int32_t next;           /* hash bucket chain; free list */
    int32_t lru_prev, lru_next;
} pc_entry;

typedef struct prefix_cache prefix_cache;
struct prefix_cache {
    bool on;
    uint64_t seed;
    int block_tokens;
    int snap_blocks;        /* pool blocks per state snapshot */
    int snap_every;         /* snapshot every this many blocks (and at marks) */
    int64_t mark_min;       /* a prompt's mark only this many positions past
                             * the snapshot before it (model_prefix.c) */
    int32_t cap, n;
    pc_entry *e;
    int32_t *bucket, nbucket;
    int32_t free_head;
    int32_t lru_head, lru_tail;     /* pool entries; head: least recently used */
    int32_t host_head, host_tail;   /* host tier entries */
    int32_t *entry_of;      /* [nblocks] entry holding a block, or -1 */
    int64_t snaps;          /* pool entries with a snapshot */
    int64_t inuse;          /* pool entries a sequence holds too (ref > 1) */
    int nrange;             /* the state slot's bytes a snapshot packs */
    size_t *range_off, *range_len;     /* (the model sets them; freed here) */
    /* host tier (pc_host_init): units of host_unit bytes, each one pool
     * block of every rank, at host_mem (the model's memory) */
    size_t host_budget;     /* bytes of all units; 0: no host tier */
    size_t host_unit;
    size_t host_used;
    char *host_mem;
    block_pool hpool;       /* the units, as blocks of a pool */
    int64_t nhost;
    void *ctx;
    void (*spill)(void *ctx, prefix_cache *pc, int32_t e);  /* pool -> e->host */
    void (*fill)(void *ctx, prefix_cache *pc, int32_t e);   /* e->host -> pool */
    /* a host-tier entry leaves for good to make room (NULL: nothing to do;
     * the model writes it to its disk tier) */
    void (*retire)(void *ctx, prefix_cache *pc, int32_t e);
    /* cumulative */
    uint64_t queries, query_tokens, hits, hit_tokens;
    uint64_t evicted;       /* pool blocks given back to make room */
    uint64_t spills, fills; /* entries copied to and from the host tier */
};

/* Per-sequence chain state (inside v4_seq). */
typedef struct {
    uint64_t hash;          /* chain hash through the last full block */
    int32_t *part;          /* tokens of the block being filled; NULL: not tracked */
    int npart;
    int64_t mark;           /* a position to snapshot at (a prompt's last boundary) */
} seq_prefix;

uint64_t pc_chain(uint64_t parent, const int32_t *tokens, int n);

/* Off (all calls no-ops, lookups miss) when nblocks or snap_blocks is 0. */
void pc_init(prefix_cache *pc, bool on, int64_t nblocks, int block_tokens, int snap_blocks,
             int snap_every, uint64_t seed);
void pc_free(prefix_cache *pc);
/* A host tier of budget / unit units of `unit` bytes at mem (the caller's,
 * at least that many units long). */
void pc_host_init(prefix_cache *pc, size_t budget, size_t unit, char *mem);
/* Unit k (0: the block, 1..: its snapshot's blocks) of an entry's host copy. */
char *pc_host_at(const prefix_cache *pc, const pc_entry *e, int k);
/* The entry for the block of `tokens` after the chain hash parent (in the
 * pool or the host tier), or -1. */
int32_t pc_find(const prefix_cache *pc, uint64_t parent, const int32_t *tokens);
/* Enter a full block a sequence holds (one reference more on it); -1 when
 * an entry for it exists already. */
int32_t pc_insert(prefix_cache *pc, block_pool *p, uint64_t parent, const int32_t *tokens,
                  int32_t block);
/* Enter a block straight into the host tier (read back from disk): its
 * units (1, or 1 + snap_blocks with a snapshot) for the caller to fill;
 * -1 when an entry exists already or the tier has no room. */
int32_t pc_insert_host(prefix_cache *pc, block_pool *p, uint64_t parent, const int32_t *tokens,
                       bool snap);
/* A host-tier entry takes a sequence's pool block with the same contents
 * instead (its host copy is dropped). */
void pc_adopt(prefix_cache *pc, block_pool *p, int32_t e, int32_t block);
/* Bring a host-tier entry back into the pool; -1 when the blocks cannot
 * be had (it stays in the host tier). */
int pc_fill(prefix_cache *pc, block_pool *p, int32_t e);
/* A sequence takes a reference on a block, and gives back all of its
 * blocks (touching their entries last to first); these keep the count
 * of entries in use, which makes pc_reclaimable O(1). */
void pc_seq_ref(prefix_cache *pc, block_pool *p, int32_t block);
void pc_seq_release(prefix_cache *pc, const block_pool *p, const int32_t *blocks, int64_t n);
/* Most recently used now (in its tier). */
void pc_touch(prefix_cache *pc, int32_t e);
/* Give `snap_blocks` free blocks to pool entry e's snapshot (evicting
 * others first if needed); -1 and nothing taken when they cannot be had. */
int pc_snap_alloc(prefix_cache *pc, block_pool *p, int32_t e);
/* Evict in LRU order until `need` blocks are free or nothing more can go;
 * whether they are. */
bool pc_make_room(prefix_cache *pc, block_pool *p, int64_t need);
/* Evict every pool entry nobody else holds (to the host tier when there
 * is one, as pc_make_room would); the entries that went there. */
int64_t pc_offload(prefix_cache *pc, block_pool *p);
/* Blocks eviction could free now. */
int64_t pc_reclaimable(const prefix_cache *pc);
/* Pool blocks the cache holds (entries' blocks and snapshots). */
int64_t pc_blocks_held(const prefix_cache *pc);
/* Drop every entry, host tier included (sequences keep their blocks). */
void pc_clear(prefix_cache *pc, block_pool *p);

#endif
