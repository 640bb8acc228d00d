#include "prefix_cache.h"

#include <stdlib.h>
#include <string.h>

#include "sha256.h"

uint64_t pc_chain(uint64_t parent, const int32_t *tokens, int n)
{
    sha256_ctx c;
    uint8_t d[32], b[8];
    sha256_init(&c);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(parent >> (8 * i));
    sha256_update(&c, b, 8);
    for (int t = 0; t < n; t++) {
        uint32_t v = (uint32_t)tokens[t];
        uint8_t w[4] = { (uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24) };
        sha256_update(&c, w, 4);
    }
    sha256_final(&c, d);
    uint64_t h = 0;
    for (int i = 0; i < 8; i++) h |= (uint64_t)d[i] << (8 * i);
    return h;
}

void pc_init(prefix_cache *pc, bool on, int64_t nblocks, int block_tokens, int snap_blocks,
             int snap_every, uint64_t seed)
{
    memset(pc, 0, sizeof *pc);
    pc->on = on && nblocks > 0 && snap_blocks > 0 && nblocks <= INT32_MAX;
    pc->seed = seed;
    pc->block_tokens = block_tokens;
    pc->snap_blocks = snap_blocks;
    pc->snap_every = snap_every > 0 ? snap_every : 1;
    pc->free_head = pc->lru_head = pc->lru_tail = -1;
    if (!pc->on) return;
    pc->cap = (int32_t)nblocks;
    pc->e = calloc((size_t)pc->cap, sizeof *pc->e);
    for (int32_t i = pc->cap - 1; i >= 0; i--) {
        pc->e[i].next = pc->free_head;
        pc->e[i].block = -1;
        pc->free_head = i;
    }
    pc->nbucket = 1;
    while (pc->nbucket < pc->cap && pc->nbucket < (1 << 30)) pc->nbucket *= 2;
    pc->bucket = malloc((size_t)pc->nbucket * sizeof *pc->bucket);
    for (int32_t i = 0; i < pc->nbucket; i++) pc->bucket[i] = -1;
    pc->entry_of = malloc((size_t)nblocks * sizeof *pc->entry_of);
    for (int64_t i = 0; i < nblocks; i++) pc->entry_of[i] = -1;
}

void pc_free(prefix_cache *pc)
{
    for (int32_t i = 0; pc->e && i < pc->cap; i++) {
        free(pc->e[i].tokens);
        free(pc->e[i].snap);
    }
    free(pc->e);
    free(pc->bucket);
    free(pc->entry_of);
    free(pc->range_off);
    free(pc->range_len);
    memset(pc, 0, sizeof *pc);
}

static int32_t *bucket_of(const prefix_cache *pc, uint64_t h)
{
    return &pc->bucket[(h ^ (h >> 32)) & (uint64_t)(pc->nbucket - 1)];
}

int32_t pc_find(const prefix_cache *pc, uint64_t parent, const int32_t *tokens)
{
    if (!pc->on) return -1;
    uint64_t h = pc_chain(parent, tokens, pc->block_tokens);
    for (int32_t i = *bucket_of(pc, h); i >= 0; i = pc->e[i].next) {
        const pc_entry *e = &pc->e[i];
        if (e->hash == h && e->parent == parent
            && !memcmp(e->tokens, tokens, (size_t)pc->block_tokens * sizeof *tokens))
            return i;
    }
    return -1;
}

static void lru_unlink(prefix_cache *pc, int32_t i)
{
    pc_entry *e = &pc->e[i];
    if (e->lru_prev >= 0) pc->e[e->lru_prev].lru_next = e->lru_next;
    else pc->lru_head = e->lru_next;
    if (e->lru_next >= 0) pc->e[e->lru_next].lru_prev = e->lru_prev;
    else pc->lru_tail = e->lru_prev;
}

static void lru_append(prefix_cache *pc, int32_t i)
{
    pc_entry *e = &pc->e[i];
    e->lru_prev = pc->lru_tail;
    e->lru_next = -1;
    if (pc->lru_tail >= 0) pc->e[pc->lru_tail].lru_next = i;
    else pc->lru_head = i;
    pc->lru_tail = i;
}

void pc_touch(prefix_cache *pc, int32_t i)
{
    if (!pc->on || i < 0) return;
    lru_unlink(pc, i);
    lru_append(pc, i);
}

int32_t pc_insert(prefix_cache *pc, block_pool *p, uint64_t parent, const int32_t *tokens,
                  int32_t block)
{
    if (!pc->on || pc->free_head < 0 || pc_find(pc, parent, tokens) >= 0
        || pc->entry_of[block] >= 0)
        return -1;
    int32_t i = pc->free_head;
    pc_entry *e = &pc->e[i];
    pc->free_head = e->next;
    e->hash = pc_chain(parent, tokens, pc->block_tokens);
    e->parent = parent;
    e->block = block;
    e->snap = NULL;
    e->tokens = malloc((size_t)pc->block_tokens * sizeof *tokens);
    memcpy(e->tokens, tokens, (size_t)pc->block_tokens * sizeof *tokens);
    int32_t *b = bucket_of(pc, e->hash);
    e->next = *b;
    *b = i;
    lru_append(pc, i);
    block_ref(p, block);
    pc->entry_of[block] = i;
    pc->n++;
    return i;
}

static void drop_snap(prefix_cache *pc, block_pool *p, pc_entry *e)
{
    if (!e->snap) return;
    pc->evicted += (uint64_t)pc->snap_blocks;
    for (int k = 0; k < pc->snap_blocks; k++) block_unref(p, e->snap[k]);
    free(e->snap);
    e->snap = NULL;
    pc->snaps--;
}

static void evict(prefix_cache *pc, block_pool *p, int32_t i)
{
    pc_entry *e = &pc->e[i];
    drop_snap(pc, p, e);
    for (int32_t *pp = bucket_of(pc, e->hash); *pp >= 0; pp = &pc->e[*pp].next)
        if (*pp == i) { *pp = e->next; break; }
    lru_unlink(pc, i);
    pc->entry_of[e->block] = -1;
    block_unref(p, e->block);
    free(e->tokens);
    e->tokens = NULL;
    e->block = -1;
    e->next = pc->free_head;
    pc->free_head = i;
    pc->n--;
    pc->evicted++;
}

bool pc_make_room(prefix_cache *pc, block_pool *p, int64_t need, int32_t keep)
{
    for (int32_t i = pc->on ? pc->lru_head : -1, next; i >= 0 && p->nfree < need; i = next) {
        next = pc->e[i].lru_next;
        if (i == keep) continue;
        if (p->ref[pc->e[i].block] == 1) evict(pc, p, i);
        else drop_snap(pc, p, &pc->e[i]);   /* in use: only its snapshot can go */
    }
    return p->nfree >= need;
}

int pc_snap_alloc(prefix_cache *pc, block_pool *p, int32_t i)
{
    if (!pc->on || pc->e[i].snap) return -1;
    if (!pc_make_room(pc, p, pc->snap_blocks, i)) return -1;
    int32_t *s = malloc((size_t)pc->snap_blocks * sizeof *s);
    for (int k = 0; k < pc->snap_blocks; k++) s[k] = block_take(p);
    pc->e[i].snap = s;
    pc->snaps++;
    return 0;
}

int64_t pc_reclaimable(const prefix_cache *pc, const block_pool *p)
{
    int64_t n = 0;
    for (int32_t i = pc->on ? pc->lru_head : -1; i >= 0; i = pc->e[i].lru_next)
        n += (p->ref[pc->e[i].block] == 1) + (pc->e[i].snap ? pc->snap_blocks : 0);
    return n;
}

int64_t pc_blocks_held(const prefix_cache *pc)
{
    return pc->n + pc->snaps * pc->snap_blocks;
}

void pc_clear(prefix_cache *pc, block_pool *p)
{
    uint64_t evicted = pc->evicted;
    while (pc->on && pc->lru_head >= 0) evict(pc, p, pc->lru_head);
    pc->evicted = evicted;      /* counts what room-making gave back */
}
