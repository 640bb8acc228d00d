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

static int32_t *bucket_of(const prefix_cache *pc, uint64_t h)
{
    return &pc->bucket[(h ^ (h >> 32)) & (uint64_t)(pc->nbucket - 1)];
}

/* Entries [from, to) onto the free list. */
static void free_range(prefix_cache *pc, int32_t from, int32_t to)
{
    for (int32_t i = to - 1; i >= from; i--) {
        pc->e[i] = (pc_entry){ .block = -1, .next = pc->free_head };
        pc->free_head = i;
    }
}

/* Twice the entries and buckets (the host tier holds more entries than
 * the pool has blocks). */
static bool grow(prefix_cache *pc)
{
    if (pc->cap > INT32_MAX / 2) return false;
    pc_entry *e = realloc(pc->e, 2 * (size_t)pc->cap * sizeof *e);
    int32_t *b = realloc(pc->bucket, 2 * (size_t)pc->nbucket * sizeof *b);
    if (!e || !b) {
        if (e) pc->e = e;
        if (b) pc->bucket = b;
        return false;
    }
    pc->e = e;
    pc->bucket = b;
    free_range(pc, pc->cap, 2 * pc->cap);
    pc->cap *= 2;
    pc->nbucket *= 2;
    for (int32_t i = 0; i < pc->nbucket; i++) pc->bucket[i] = -1;
    for (int32_t i = 0; i < pc->cap; i++)
        if (pc->e[i].tokens) {
            int32_t *h = bucket_of(pc, pc->e[i].hash);
            pc->e[i].next = *h;
            *h = i;
        }
    return true;
}

void pc_init(prefix_cache *pc, bool on, int64_t nblocks, int block_tokens, int snap_blocks,
             int snap_every, uint64_t seed)
{
    memset(pc, 0, sizeof *pc);
    pc->on = on && nblocks > 0 && snap_blocks > 0 && nblocks <= INT32_MAX / 2;
    pc->seed = seed;
    pc->block_tokens = block_tokens;
    pc->snap_blocks = snap_blocks;
    pc->snap_every = snap_every > 0 ? snap_every : 1;
    pc->free_head = pc->lru_head = pc->lru_tail = pc->host_head = pc->host_tail = -1;
    if (!pc->on) return;
    pc->cap = (int32_t)nblocks;
    pc->e = malloc((size_t)pc->cap * sizeof *pc->e);
    free_range(pc, 0, pc->cap);
    pc->nbucket = 1;
    while (pc->nbucket < pc->cap) pc->nbucket *= 2;
    pc->bucket = malloc((size_t)pc->nbucket * sizeof *pc->bucket);
    for (int32_t i = 0; i < pc->nbucket; i++) pc->bucket[i] = -1;
    pc->entry_of = malloc((size_t)nblocks * sizeof *pc->entry_of);
    for (int64_t i = 0; i < nblocks; i++) pc->entry_of[i] = -1;
}

void pc_host_init(prefix_cache *pc, size_t budget, size_t unit, char *mem)
{
    size_t units = pc->on && unit ? budget / unit : 0;
    block_pool_init(&pc->hpool, 0, (int64_t)units);
    pc->host_unit = unit;
    pc->host_budget = units * unit;
    pc->host_mem = units ? mem : NULL;
}

char *pc_host_at(const prefix_cache *pc, const pc_entry *e, int k)
{
    return pc->host_mem + (size_t)e->host[k] * pc->host_unit;
}

void pc_free(prefix_cache *pc)
{
    block_pool_free(&pc->hpool);
    for (int32_t i = 0; pc->e && i < pc->cap; i++) {
        free(pc->e[i].tokens);
        free(pc->e[i].snap);
        free(pc->e[i].host);
    }
    free(pc->e);
    free(pc->bucket);
    free(pc->entry_of);
    free(pc->range_off);
    free(pc->range_len);
    memset(pc, 0, sizeof *pc);
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

/* The LRU list of an entry's tier. */
static int32_t *list_head(prefix_cache *pc, const pc_entry *e)
{
    return e->block >= 0 ? &pc->lru_head : &pc->host_head;
}

static int32_t *list_tail(prefix_cache *pc, const pc_entry *e)
{
    return e->block >= 0 ? &pc->lru_tail : &pc->host_tail;
}

static void lru_unlink(prefix_cache *pc, int32_t i)
{
    pc_entry *e = &pc->e[i];
    if (e->lru_prev >= 0) pc->e[e->lru_prev].lru_next = e->lru_next;
    else *list_head(pc, e) = e->lru_next;
    if (e->lru_next >= 0) pc->e[e->lru_next].lru_prev = e->lru_prev;
    else *list_tail(pc, e) = e->lru_prev;
}

static void lru_append(prefix_cache *pc, int32_t i)
{
    pc_entry *e = &pc->e[i];
    int32_t *tail = list_tail(pc, e);
    e->lru_prev = *tail;
    e->lru_next = -1;
    if (*tail >= 0) pc->e[*tail].lru_next = i;
    else *list_head(pc, e) = i;
    *tail = i;
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
    if (!pc->on || pc_find(pc, parent, tokens) >= 0 || pc->entry_of[block] >= 0
        || (pc->free_head < 0 && !grow(pc)))
        return -1;
    int32_t i = pc->free_head;
    pc_entry *e = &pc->e[i];
    pc->free_head = e->next;
    *e = (pc_entry){ .hash = pc_chain(parent, tokens, pc->block_tokens), .parent = parent,
                     .block = block, .tokens = malloc((size_t)pc->block_tokens * sizeof *tokens) };
    memcpy(e->tokens, tokens, (size_t)pc->block_tokens * sizeof *tokens);
    int32_t *b = bucket_of(pc, e->hash);
    e->next = *b;
    *b = i;
    lru_append(pc, i);
    block_ref(p, block);
    pc->inuse += p->ref[block] > 1;
    pc->entry_of[block] = i;
    pc->n++;
    return i;
}

static size_t host_bytes(const prefix_cache *pc, const pc_entry *e)
{
    return pc->host_unit * (1 + (e->host_snap ? (size_t)pc->snap_blocks : 0));
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

/* An entry's host copy gives its units back (it has left the host list). */
static void free_host(prefix_cache *pc, pc_entry *e)
{
    int n = 1 + (e->host_snap ? pc->snap_blocks : 0);
    for (int k = 0; k < n; k++) block_unref(&pc->hpool, e->host[k]);
    pc->host_used -= host_bytes(pc, e);
    pc->nhost--;
    free(e->host);
    e->host = NULL;
    e->host_snap = false;
}

/* A host-tier entry's copy goes (it leaves the host list). */
static void drop_host(prefix_cache *pc, int32_t i)
{
    lru_unlink(pc, i);
    free_host(pc, &pc->e[i]);
}

/* The entry is forgotten, in whichever tier it is. */
static void forget(prefix_cache *pc, block_pool *p, int32_t i)
{
    pc_entry *e = &pc->e[i];
    for (int32_t *pp = bucket_of(pc, e->hash); *pp >= 0; pp = &pc->e[*pp].next)
        if (*pp == i) { *pp = e->next; break; }
    if (e->block >= 0) {
        drop_snap(pc, p, e);
        lru_unlink(pc, i);
        pc->entry_of[e->block] = -1;
        pc->inuse -= p->ref[e->block] > 1;
        block_unref(p, e->block);
        pc->evicted++;
    } else {
        drop_host(pc, i);
    }
    free(e->tokens);
    *e = (pc_entry){ .block = -1, .next = pc->free_head };
    pc->free_head = i;
    pc->n--;
}

/* Free host units until `units` are (older unpinned host entries go, to
 * the disk tier first); whether they are. */
static bool host_room(prefix_cache *pc, block_pool *p, int units)
{
    block_pool *hp = &pc->hpool;
    for (int32_t h = pc->host_head, next; units <= hp->nblocks && h >= 0 && hp->nfree < units;
         h = next) {
        next = pc->e[h].lru_next;
        if (pc->e[h].pins) continue;
        if (pc->retire) pc->retire(pc->ctx, pc, h);
        forget(pc, p, h);
    }
    return hp->nfree >= units;
}

/* A pool entry nobody else holds leaves the pool: to the host tier when it
 * fits there (older host entries go first), else for good. */
static void evict(prefix_cache *pc, block_pool *p, int32_t i)
{
    pc_entry *e = &pc->e[i];
    int units = 1 + (e->snap ? pc->snap_blocks : 0);
    block_pool *hp = &pc->hpool;
    int32_t *copy = host_room(pc, p, units) ? malloc((size_t)units * sizeof *copy) : NULL;
    if (!copy) {
        forget(pc, p, i);
        return;
    }
    for (int k = 0; k < units; k++) copy[k] = block_take(hp);
    e->host = copy;
    e->host_snap = e->snap != NULL;
    pc->spill(pc->ctx, pc, i);
    lru_unlink(pc, i);
    drop_snap(pc, p, e);
    pc->entry_of[e->block] = -1;
    block_unref(p, e->block);
    pc->evicted++;
    e->block = -1;
    lru_append(pc, i);
    pc->host_used += (size_t)units * pc->host_unit;
    pc->nhost++;
    pc->spills++;
}

bool pc_make_room(prefix_cache *pc, block_pool *p, int64_t need)
{
    for (int32_t i = pc->on ? pc->lru_head : -1, next; i >= 0 && p->nfree < need; i = next) {
        next = pc->e[i].lru_next;
        if (pc->e[i].pins) continue;
        if (p->ref[pc->e[i].block] == 1) evict(pc, p, i);
        else drop_snap(pc, p, &pc->e[i]);   /* in use: only its snapshot can go */
    }
    return p->nfree >= need;
}

int32_t pc_insert_host(prefix_cache *pc, block_pool *p, uint64_t parent, const int32_t *tokens,
                       bool snap)
{
    int units = 1 + (snap ? pc->snap_blocks : 0);
    if (!pc->on || pc_find(pc, parent, tokens) >= 0 || !host_room(pc, p, units)
        || (pc->free_head < 0 && !grow(pc)))
        return -1;
    int32_t i = pc->free_head;
    pc_entry *e = &pc->e[i];
    pc->free_head = e->next;
    *e = (pc_entry){ .hash = pc_chain(parent, tokens, pc->block_tokens), .parent = parent,
                     .block = -1, .host_snap = snap,
                     .tokens = malloc((size_t)pc->block_tokens * sizeof *tokens),
                     .host = malloc((size_t)units * sizeof *e->host) };
    memcpy(e->tokens, tokens, (size_t)pc->block_tokens * sizeof *tokens);
    for (int k = 0; k < units; k++) e->host[k] = block_take(&pc->hpool);
    int32_t *b = bucket_of(pc, e->hash);
    e->next = *b;
    *b = i;
    lru_append(pc, i);
    pc->host_used += (size_t)units * pc->host_unit;
    pc->nhost++;
    pc->n++;
    return i;
}

int64_t pc_offload(prefix_cache *pc, block_pool *p)
{
    uint64_t spills = pc->spills;
    for (int32_t i = pc->on ? pc->lru_head : -1, next; i >= 0; i = next) {
        next = pc->e[i].lru_next;      /* eviction touches only the host list besides i */
        if (!pc->e[i].pins && p->ref[pc->e[i].block] == 1) evict(pc, p, i);
    }
    return (int64_t)(pc->spills - spills);
}

int pc_snap_alloc(prefix_cache *pc, block_pool *p, int32_t i)
{
    if (!pc->on || pc->e[i].snap || pc->e[i].block < 0) return -1;
    pc->e[i].pins++;
    bool room = pc_make_room(pc, p, pc->snap_blocks);
    pc->e[i].pins--;
    if (!room) return -1;
    int32_t *s = malloc((size_t)pc->snap_blocks * sizeof *s);
    for (int k = 0; k < pc->snap_blocks; k++) s[k] = block_take(p);
    pc->e[i].snap = s;
    pc->snaps++;
    return 0;
}

void pc_adopt(prefix_cache *pc, block_pool *p, int32_t i, int32_t block)
{
    pc_entry *e = &pc->e[i];
    if (e->block >= 0 || pc->entry_of[block] >= 0) return;
    drop_host(pc, i);
    e->block = block;
    block_ref(p, block);
    pc->inuse += p->ref[block] > 1;
    pc->entry_of[block] = i;
    lru_append(pc, i);
}

void pc_seq_ref(prefix_cache *pc, block_pool *p, int32_t block)
{
    block_ref(p, block);
    if (pc->on && pc->entry_of[block] >= 0 && p->ref[block] == 2) pc->inuse++;
}

void pc_seq_release(prefix_cache *pc, const block_pool *p, const int32_t *blocks, int64_t n)
{
    for (int64_t b = n - 1; pc->on && b >= 0; b--) {
        int32_t e = pc->entry_of[blocks[b]];
        if (e < 0) continue;
        pc->inuse -= p->ref[blocks[b]] == 2;
        pc_touch(pc, e);
    }
}

int pc_fill(prefix_cache *pc, block_pool *p, int32_t i)
{
    pc_entry *e = &pc->e[i];
    if (e->block >= 0) return 0;
    int64_t need = 1 + (e->host_snap ? pc->snap_blocks : 0);
    e->pins++;
    bool room = pc_make_room(pc, p, need);
    e->pins--;
    if (!room) return -1;
    int32_t b = block_take(p);
    int32_t *s = NULL;
    if (e->host_snap) {
        s = malloc((size_t)pc->snap_blocks * sizeof *s);
        for (int k = 0; k < pc->snap_blocks; k++) s[k] = block_take(p);
    }
    lru_unlink(pc, i);
    e->block = b;
    e->snap = s;
    pc->fill(pc->ctx, pc, i);
    /* the units go back now: a later spill into them is a copy queued
     * after this one's (the model's copies keep their order) */
    free_host(pc, e);
    pc->snaps += s != NULL;
    pc->entry_of[b] = i;
    lru_append(pc, i);
    pc->fills++;
    return 0;
}

int64_t pc_reclaimable(const prefix_cache *pc)
{
    return pc->n - pc->nhost - pc->inuse + pc->snaps * pc->snap_blocks;
}

int64_t pc_blocks_held(const prefix_cache *pc)
{
    return pc->n - pc->nhost + pc->snaps * pc->snap_blocks;
}

void pc_clear(prefix_cache *pc, block_pool *p)
{
    uint64_t evicted = pc->evicted;
    while (pc->on && pc->lru_head >= 0) forget(pc, p, pc->lru_head);
    while (pc->on && pc->host_head >= 0) forget(pc, p, pc->host_head);
    pc->evicted = evicted;      /* counts what room-making gave back */
}
