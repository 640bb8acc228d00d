/* Prefix caching in the model: what the cache's entries (prefix_cache.c)
 * mean in cache bytes.  A block is entered once a sequence has fed all its
 * positions (its compressed entries and indexer keys are final then and
 * never written again: later windows start in later blocks); a snapshot
 * copies what of the sequence's state slot a continuation from a block
 * boundary reads (the rings and the CSA overlaps: cache_live_ranges); a
 * new sequence shares the blocks and copies the snapshot back.  docs/MODEL.md, "Prefix caching". */
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"
#include "sha256.h"
#include "version.h"

/* The seed of every chain hash: what makes a cache's bytes what they are
 * besides the tokens (the checkpoint's config and path, the cache dtype,
 * the backend and its GEMM/MoE modes, the TP split, the engine version). */
static uint64_t prefix_seed(const v4_model *m, const v4_options *o, const char *dir)
{
    sha256_ctx c;
    sha256_init(&c);
    strbuf sb;
    sb_init(&sb);
    if (o->synthetic) sb_puts(&sb, dir);
    else sb_printf(&sb, "%s/config.json", dir);
    strbuf cfg;
    sb_init(&cfg);
    if (sb_read_file(&cfg, sb.data) == 0) sha256_update(&c, cfg.data, cfg.len);
    sb_free(&cfg);
    const char *gemm = getenv("LLM_CUDA_GEMM"), *moe = getenv("LLM_CUDA_MOE");
    bool cuda = o->backend && !strcmp(o->backend, "cuda");
    sb_printf(&sb, "|prefix-v1|%s|%s|%s|tp%d|%s|%s|%s", LLM_ENGINE_VERSION,
              v4_kv_dtype_name(m->layout.dtype), cuda ? "cuda" : "cpu", m->tp,
              o->synthetic ? "synthetic" : "weights", cuda && gemm ? gemm : "",
              cuda && moe ? moe : "");
    sha256_update(&c, sb.data, sb.len);
    sb_free(&sb);
    uint8_t d[32];
    sha256_final(&c, d);
    uint64_t h = 0;
    for (int i = 0; i < 8; i++) h |= (uint64_t)d[i] << (8 * i);
    return h;
}

/* An entry's pool blocks (its block, then its snapshot's) and its host
 * units, rank r's block at offset r * block_bytes of a unit, one direction
 * or the other: on a backend with asynchronous copies queued on its copy
 * stream (prefix_fence orders them before later ops), else synchronous. */
static void host_copy(v4_model *m, const pc_entry *e, bool to_host)
{
    size_t bb = m->layout.block_bytes, nb = 1 + (e->snap ? (size_t)m->pc.snap_blocks : 0);
    for (int r = 0; r < m->tp; r++) {
        backend *be = m->ranks[r].be;
        for (size_t k = 0; k < nb; k++) {
            char *host = pc_host_at(&m->pc, e, (int)k) + (size_t)r * bb;
            char *dev = m->ranks[r].block_mem + (size_t)(k ? e->snap[k - 1] : e->block) * bb;
            if (be->copy_async) be->copy_async(be, to_host ? host : dev, to_host ? dev : host,
                                               bb, to_host);
            else if (to_host) be->read(be, host, dev, bb);
            else be->write(be, dev, host, bb);
        }
        m->copies_pending |= be->copy_async != NULL;
    }
}

/* Ops issued from here on wait for the host-tier copies issued so far: a
 * spilled block is reused, a filled one read, only after its copy.  The
 * host does not wait. */
static void prefix_fence(v4_model *m)
{
    if (!m->copies_pending) return;
    for (int r = 0; r < m->tp; r++) m->ranks[r].be->copy_fence(m->ranks[r].be, false);
    m->copies_pending = false;
}

/* The host waits for every rank's host-tier copies (before it reads or
 * frees host memory). */
static void copies_wait(v4_model *m)
{
    for (int r = 0; r < m->tp; r++)
        if (m->ranks[r].be->copy_fence) m->ranks[r].be->copy_fence(m->ranks[r].be, true);
    m->copies_pending = false;
}

/* A host-tier entry to its file (pd_write; an entry on disk already is
 * left alone). */
static void disk_write(v4_model *m, const pc_entry *e)
{
    const prefix_cache *pc = &m->pc;
    int n = 1 + (e->host_snap ? pc->snap_blocks : 0);
    char **units = pd_has(&m->disk, e->hash) ? NULL : malloc((size_t)n * sizeof *units);
    if (!units) return;
    for (int k = 0; k < n; k++) units[k] = pc_host_at(pc, e, k);
    pd_write(&m->disk, e->hash, e->parent, e->tokens, pc->block_tokens, units, n, pc->host_unit);
    free(units);
}

static void disk_retire(void *ctx, prefix_cache *pc, int32_t e)
{
    v4_model *m = ctx;
    copies_wait(m);     /* its spill may still be on its way */
    disk_write(m, &pc->e[e]);
}

/* The entry for the block of `tokens` after parent, read back from the
 * disk tier into the host tier; -1 when there is none (or none that
 * passes its checks, or no room).  The host tier is where a file lands:
 * when it is full of the chain found so far (chain[0..found), pinned),
 * those entries move on to the pool first. */
static int32_t disk_fetch(v4_model *m, uint64_t parent, const int32_t *tokens,
                          const int32_t *chain, int64_t found)
{
    prefix_cache *pc = &m->pc;
    uint64_t h = pc_chain(parent, tokens, pc->block_tokens);
    char *data;
    int n;
    if (!pd_has(&m->disk, h)
        || pd_read(&m->disk, h, parent, tokens, pc->block_tokens, pc->host_unit,
                   pc->snap_blocks, &data, &n))
        return -1;
    int32_t e = pc_insert_host(pc, &m->pool, parent, tokens, n > 1);
    if (e < 0 && pc_find(pc, parent, tokens) < 0) {
        for (int64_t k = 0; k < found; k++) pc_fill(pc, &m->pool, chain[k]);
        e = pc_insert_host(pc, &m->pool, parent, tokens, n > 1);
    }
    copies_wait(m);     /* its units' last copies (a fill reading them) have landed */
    for (int k = 0; e >= 0 && k < n; k++)
        memcpy(pc_host_at(pc, &pc->e[e], k), data + (size_t)k * pc->host_unit, pc->host_unit);
    free(data);
    return e;
}

static void host_spill(void *ctx, prefix_cache *pc, int32_t e)
{
    host_copy(ctx, &pc->e[e], true);
}

static void host_fill(void *ctx, prefix_cache *pc, int32_t e)
{
    host_copy(ctx, &pc->e[e], false);
}

int prefix_init(v4_model *m, const v4_options *o, const char *dir, strbuf *err)
{
    const cache_layout *L = &m->layout;
    size_t *off = malloc(3 * (size_t)L->n_layers * sizeof *off);
    size_t *len = malloc(3 * (size_t)L->n_layers * sizeof *len), bytes = 0;
    int nr = cache_live_ranges(L, &m->cfg, off, len);
    for (int i = 0; i < nr; i++) bytes += len[i];
    int snap = L->block_bytes ? (int)((bytes + L->block_bytes - 1) / L->block_bytes) : 0;
    int every = o->prefix_snapshot_every > 0 ? o->prefix_snapshot_every
                : 4 * snap > 16 ? 4 * snap : 16;
    pc_init(&m->pc, o->prefix_cache && L->block_bytes / 4 <= INT32_MAX, m->pool.nblocks,
            L->block_tokens, snap, every, prefix_seed(m, o, dir));
    m->pc.mark_min = o->prefix_mark_min_tokens > 0 ? o->prefix_mark_min_tokens : 0;
    m->pc.nrange = nr;
    m->pc.range_off = off;
    m->pc.range_len = len;
    m->pc.ctx = m;
    m->pc.spill = host_spill;
    m->pc.fill = host_fill;
    /* the host tier: all of it at once, pinned where the backend can */
    size_t unit = (size_t)m->tp * L->block_bytes;
    size_t units = m->pc.on && unit ? o->prefix_host_bytes / unit : 0;
    if (units > INT32_MAX / 2) units = INT32_MAX / 2;
    size_t hbytes = units * unit;
    backend *be = m->ranks[0].be;
    char *mem = !hbytes ? NULL : be->host_alloc ? be->host_alloc(be, hbytes) : malloc(hbytes);
    if (hbytes && !mem) {
        sb_printf(err, "kv_offloading_size: cannot allocate %.2f GiB of %shost memory for the "
                  "prefix cache's host tier\n", (double)hbytes / 1073741824.0,
                  be->host_alloc ? "pinned " : "");
        return -1;
    }
    pc_host_init(&m->pc, hbytes, unit, mem);
    if (o->prefix_disk_dir && m->pc.on) {
        if (!m->pc.host_budget) {
            sb_puts(err, "kv_offloading_filesystem: the disk tier needs a host tier "
                    "(kv_offloading_size of at least one block on every rank)\n");
            return -1;
        }
        if (pd_open(&m->disk, o->prefix_disk_dir, m->pc.seed, o->prefix_disk_bytes, o->log,
                    o->log_user, err))
            return -1;
        m->pc.retire = disk_retire;
    }
    return 0;
}

void prefix_free(v4_model *m)
{
    if (m->pc.host_mem) {
        backend *be = m->ranks[0].be;
        if (m->disk.dir) {  /* what the cache holds outlives the process */
            uint64_t w = m->disk.writes;
            pc_offload(&m->pc, &m->pool);   /* the pool's entries through the host tier */
            copies_wait(m);
            for (int32_t i = m->pc.host_head; i >= 0; i = m->pc.e[i].lru_next)
                disk_write(m, &m->pc.e[i]);
            if (m->disk.writes > w && m->disk.log) {
                char line[160];
                snprintf(line, sizeof line, "prefix cache: %llu entries written to the disk "
                         "tier at exit", (unsigned long long)(m->disk.writes - w));
                m->disk.log(m->disk.log_user, line);
            }
        }
        copies_wait(m);     /* no copy of any rank in flight */
        if (be->host_free) be->host_free(be, m->pc.host_mem);
        else free(m->pc.host_mem);
    }
    pd_close(&m->disk);
    pc_free(&m->pc);
}

/* The live ranges of s's state slot (cache_live_ranges), packed one after
 * another into a snapshot's blocks, or back, on every rank (stream-ordered
 * before the next step). */
static void snap_copy(v4_model *m, const v4_seq *s, const int32_t *snap, bool save)
{
    const cache_layout *L = &m->layout;
    const prefix_cache *pc = &m->pc;
    for (int r = 0; r < m->tp; r++) {
        v4_rank *R = &m->ranks[r];
        char *slot = R->state_mem + (size_t)s->c.slot * L->state_bytes;
        size_t at = 0;      /* in the packed stream */
        for (int i = 0; i < pc->nrange; i++)
            for (size_t done = 0, n; done < pc->range_len[i]; done += n, at += n) {
                size_t k = at / L->block_bytes, in = at % L->block_bytes;
                n = pc->range_len[i] - done < L->block_bytes - in ? pc->range_len[i] - done
                                                                  : L->block_bytes - in;
                char *blk = R->block_mem + (size_t)snap[k] * L->block_bytes + in;
                char *st = slot + pc->range_off[i] + done;
                if (save) copy_bytes(R->be, blk, st, n);
                else copy_bytes(R->be, st, blk, n);
            }
    }
}

void prefix_seq_open(v4_model *m, v4_seq *s)
{
    if (!m->pc.on) return;
    s->p = (seq_prefix){ .hash = m->pc.seed,
                         .part = malloc((size_t)m->pc.block_tokens * sizeof *s->p.part) };
}

void prefix_seq_fork(v4_model *m, v4_seq *dst, const v4_seq *src)
{
    if (!dst->p.part || !src->p.part) return;
    dst->p.hash = src->p.hash;
    dst->p.npart = src->p.npart;
    memcpy(dst->p.part, src->p.part, (size_t)m->pc.block_tokens * sizeof *dst->p.part);
}

void prefix_seq_close(v4_model *m, v4_seq *s)
{
    if (!s->p.part) return;
    /* last to first: the head of its chain outlives the tail */
    pc_seq_release(&m->pc, &m->pool, s->c.blocks, s->c.nblocks);
    free(s->p.part);
    s->p = (seq_prefix){ 0 };
}

bool prefix_make_room(v4_model *m, int64_t need)
{
    bool room = pc_make_room(&m->pc, &m->pool, need);
    prefix_fence(m);
    return room;
}

static bool snapshot_at(const prefix_cache *pc, const seq_prefix *sp, int64_t len)
{
    return len > 0 && len % pc->block_tokens == 0
           && (len / pc->block_tokens % pc->snap_every == 0 || len == sp->mark);
}

void prefix_after_step(v4_model *m, const v4_step_item *items, int n)
{
    prefix_cache *pc = &m->pc;
    int B = pc->block_tokens;
    for (int i = 0; i < n && pc->on; i++) {
        v4_seq *s = items[i].seq;
        seq_prefix *sp = &s->p;
        if (!sp->part) continue;
        int64_t pos = s->c.len - items[i].n_tokens;
        for (int t = 0; t < items[i].n_tokens; t++) {
            sp->part[sp->npart++] = items[i].tokens[t];
            pos++;
            if (sp->npart < B) continue;
            sp->npart = 0;
            int32_t e = pc_find(pc, sp->hash, sp->part), blk = s->c.blocks[pos / B - 1];
            if (e < 0) e = pc_insert(pc, &m->pool, sp->hash, sp->part, blk);
            else if (pc->e[e].block < 0) pc_adopt(pc, &m->pool, e, blk);
            sp->hash = pc_chain(sp->hash, sp->part, B);
            if (e < 0) continue;
            pc_touch(pc, e);
            if (pos == s->c.len && snapshot_at(pc, sp, pos) && !pc->e[e].snap
                && pc->e[e].block >= 0
                && pc_snap_alloc(pc, &m->pool, e) == 0) {
                prefix_fence(m);    /* its blocks may have been spilled just now */
                snap_copy(m, s, pc->e[e].snap, true);
            }
        }
    }
}

int64_t v4_seq_prefix_attach(v4_model *m, v4_seq *s, const int32_t *prompt, int64_t n)
{
    prefix_cache *pc = &m->pc;
    pthread_mutex_lock(&m->mu);
    if (!s->p.part || s->c.len || s->c.nblocks || n < 2) {
        pthread_mutex_unlock(&m->mu);
        return 0;
    }
    int B = pc->block_tokens;
    int64_t nb = (n - 1) / B;       /* full blocks that leave a token to feed */
    s->p.mark = nb * B;
    pc->queries++;
    pc->query_tokens += (uint64_t)n;
    int32_t *chain = malloc((size_t)(nb ? nb : 1) * sizeof *chain);
    int64_t best = -1;
    uint64_t h = pc->seed;
    /* the chain's entries are pinned as they are found, so bringing one
     * in from disk or back to the pool never evicts another of it */
    int64_t found = 0;
    for (; found < nb; found++) {
        int32_t e = pc_find(pc, h, prompt + found * B);
        if (e < 0 && m->disk.dir) e = disk_fetch(m, h, prompt + found * B, chain, found);
        if (e < 0) break;
        chain[found] = e;
        pc->e[e].pins++;
        h = pc->e[e].hash;
        if (pc->e[e].snap || pc->e[e].host_snap) best = found;
    }
    /* entries in the host tier come back first */
    bool filled = true;
    for (int64_t k = 0; k <= best && filled; k++) filled = pc_fill(pc, &m->pool, chain[k]) == 0;
    for (int64_t k = 0; k < found; k++) pc->e[chain[k]].pins--;
    prefix_fence(m);    /* every copy issued here, whether the chain came back or not */
    if (!filled) best = -1;
    int64_t got = 0;
    if (best >= 0) {
        seq_cache *c = &s->c;
        c->cap = best + 1;
        c->blocks = realloc(c->blocks, (size_t)c->cap * sizeof *c->blocks);
        for (int64_t k = 0; k <= best; k++) {
            c->blocks[k] = pc->e[chain[k]].block;
            pc_seq_ref(pc, &m->pool, c->blocks[k]);
        }
        c->nblocks = best + 1;
        snap_copy(m, s, pc->e[chain[best]].snap, false);
        got = c->len = (best + 1) * B;
        s->p.hash = pc->e[chain[best]].hash;
        s->p.npart = 0;
        for (int64_t k = best; k >= 0; k--) pc_touch(pc, chain[k]);
        pc->hits++;
        pc->hit_tokens += (uint64_t)got;
    }
    /* The mark splits the prefill (the rest a step of its own) and saves
     * a later prompt the positions since the snapshot before it: taken
     * only when those are mark_min or more. */
    int64_t every = (int64_t)pc->snap_every * B, before = s->p.mark / every * every;
    if (got > before) before = got;
    if (s->p.mark - before < pc->mark_min) s->p.mark = 0;
    free(chain);
    pthread_mutex_unlock(&m->mu);
    return got;
}

int v4_seq_prefix_chunk(v4_model *m, const v4_seq *s, int n)
{
    const prefix_cache *pc = &m->pc;
    if (!s->p.part || n <= 0) return n;
    int64_t len = s->c.len, every = (int64_t)pc->snap_every * pc->block_tokens;
    int64_t next = (len / every + 1) * every;
    if (s->p.mark > len && s->p.mark < next) next = s->p.mark;
    return next < len + n ? (int)(next - len) : n;
}

void v4_prefix_stats_get(v4_model *m, v4_prefix_stats *st)
{
    pthread_mutex_lock(&m->mu);
    const prefix_cache *pc = &m->pc;
    *st = (v4_prefix_stats){
        .on = pc->on, .seed = pc->seed, .block_tokens = pc->block_tokens,
        .snapshot_every = pc->snap_every, .entries = pc->n, .snapshots = pc->snaps,
        .blocks_held = pc_blocks_held(pc), .queries = pc->queries,
        .query_tokens = pc->query_tokens, .hits = pc->hits, .hit_tokens = pc->hit_tokens,
        .evicted = pc->evicted, .host_entries = pc->nhost, .host_bytes = pc->host_used,
        .host_budget = pc->host_budget, .spills = pc->spills, .fills = pc->fills,
        .disk_files = (int64_t)m->disk.n, .disk_bytes = m->disk.used,
        .disk_writes = m->disk.writes, .disk_reads = m->disk.reads,
        .disk_rejected = m->disk.rejected,
    };
    pthread_mutex_unlock(&m->mu);
}

int64_t v4_prefix_offload(v4_model *m)
{
    pthread_mutex_lock(&m->mu);
    int64_t n = pc_offload(&m->pc, &m->pool);
    prefix_fence(m);
    pthread_mutex_unlock(&m->mu);
    return n;
}

void v4_prefix_clear(v4_model *m, v4_prefix_cleared *out)
{
    pthread_mutex_lock(&m->mu);
    prefix_cache *pc = &m->pc;
    v4_prefix_cleared c = { .entries = pc->n - pc->nhost, .host_entries = pc->nhost,
                            .host_bytes = pc->host_used, .blocks = -m->pool.nfree };
    pc_clear(pc, &m->pool);
    c.blocks += m->pool.nfree;
    c.disk_files = (int64_t)m->disk.n;
    c.disk_bytes = pd_clear(&m->disk);
    pthread_mutex_unlock(&m->mu);
    if (out) *out = c;
}
