/* Prefix caching (engine/model/prefix_cache.c, model_prefix.c): a sequence
 * that starts from a cached prefix gives the same logits, bit for bit, as
 * a cold engine that prefills the whole prompt, on the demo model
 * (sliding window 128, CSA ratio 4 and HCA ratio 128 layers, blocks of
 * 128 positions) at TP 1 and TP 2, in float32 and fp8:
 *
 *   - shared prefixes ending exactly at a block boundary, inside a CSA
 *     window, inside the sliding window past a boundary, and the whole
 *     prompt repeated (the resume point leaves one token to feed);
 *   - with the default snapshot spacing, a prompt that extends an earlier
 *     one (the next turn of a conversation) resumes at its last boundary;
 *   - with a minimum for the mark (the GPU runner's), a short prompt is
 *     fed in one chunk and leaves no snapshot at its last boundary, a
 *     longer one still does;
 *   - two sequences share a prefix's blocks while a third, in a small
 *     pool, evicts everything else: the shared blocks survive;
 *   - the warm sequence's state slot is poisoned (NaN) before it starts:
 *     the snapshot restores all a continuation reads;
 *   - with a host tier, entries evicted from the pool come back from host
 *     memory and still match bit for bit; the round trip through it keeps
 *     every byte, and a warm start from it equals one from the pool bit
 *     for bit on every backend (CUDA: pinned memory, asynchronous copies);
 *   - the bookkeeping: a chain under another seed (another kv dtype,
 *     another model) or with another parent never matches, tails are
 *     evicted before heads.
 *
 * The backend is $LLM_TEST_BACKEND (default cpu; make test-gpu runs it
 * with cuda), at most $LLM_TEST_MAX_TP ranks.  On CUDA, where kernels
 * differ by chunk size, the continuation's logits are compared within
 * the bound test_model_kv_dtype uses for incremental vs full (rel L2
 * CUDA_REL), not bit for bit. */
#include <dirent.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model_internal.h"
#include "tap.h"

#define DEMO "tests/fixtures/demo"
#define DECODE 4
#define CUDA_REL 0.05

static int vocab, max_tp = 2;
static bool cpu = true;
static const char *test_backend;

static size_t host_bytes;      /* the next load's host tier */
static int mark_min;           /* ... and its prefix_mark_min_tokens */
static const char *disk_dir;   /* ... and disk tier */
static char logged[8192];      /* what the models logged */

static void capture_log(void *user, const char *line)
{
    (void)user;
    size_t n = strlen(logged);
    snprintf(logged + n, sizeof logged - n, "%s\n", line);
}
static bool reclaimable_ok(v4_model *m);

static v4_model *load(int tp, const char *dtype, bool cache, int every, int64_t tokens)
{
    v4_model *m = NULL;
    strbuf err;
    sb_init(&err);
    v4_options o = { .tp = tp, .max_seqs = 4, .kv_dtype = v4_kv_dtype_parse(dtype),
                     .backend = test_backend,
                     .prefix_cache = cache, .prefix_snapshot_every = every,
                     .cache_tokens = tokens, .prefix_host_bytes = host_bytes,
                     .prefix_disk_dir = disk_dir, .prefix_disk_bytes = 1 << 30,
                     .prefix_mark_min_tokens = mark_min,
                     .log = disk_dir ? capture_log : NULL };
    if (v4_model_load(&m, DEMO, &o, &err)) {
        ok(0, "load the demo model (tp %d, %s): %s", tp, dtype, err.data);
        m = NULL;
    }
    sb_free(&err);
    if (m) vocab = v4_model_config(m)->vocab_size;
    return m;
}

/* Feed prompt[from..n) in chunks that end where the cache snapshots (as
 * the serving runner does), at most `chunk` at a time; logits of the last. */
static int feed(v4_model *m, v4_seq *s, const int32_t *prompt, int from, int n, int chunk,
                float *logits)
{
    strbuf err;
    sb_init(&err);
    int rc = 0;
    for (int at = from; at < n && !rc;) {
        int k = v4_seq_prefix_chunk(m, s, n - at < chunk ? n - at : chunk);
        v4_step_item it = { s, prompt + at, k, logits, false, NULL };
        rc = v4_step(m, &it, 1, &err);
        if (rc) diag("step: %s", err.data);
        at += k;
    }
    sb_free(&err);
    return rc;
}

/* All 0xff (NaN in float32, fp8 and bf16) in s's state slot on every
 * rank: a warm start restores only what a continuation reads, so nothing
 * else of the slot may matter. */
static void poison_slot(v4_model *m, v4_seq *s)
{
    size_t n = m->layout.state_bytes;
    char *junk = malloc(n);
    memset(junk, 0xff, n);
    for (int r = 0; r < m->tp; r++) {
        backend *be = m->ranks[r].be;
        be->write(be, m->ranks[r].state_mem + (size_t)s->c.slot * n, junk, n);
    }
    free(junk);
}

/* Logits of the prompt's last position and of DECODE greedy steps after
 * it: [DECODE + 1][vocab].  With `attach`, the sequence starts from the
 * cache; *cached gets the positions it reused. */
static float *run(v4_model *m, const int32_t *prompt, int n, bool attach, int64_t *cached,
                  v4_seq **keep)
{
    strbuf err;
    sb_init(&err);
    float *out = calloc((size_t)(DECODE + 1) * vocab, sizeof *out);
    v4_seq *s = v4_seq_new(m, &err);
    if (s && attach) poison_slot(m, s);
    int64_t got = s && attach ? v4_seq_prefix_attach(m, s, prompt, n) : 0;
    if (cached) *cached = got;
    if (!s || v4_seq_reserve(m, s, n + DECODE, &err) || feed(m, s, prompt, (int)got, n, 100, out)) {
        diag("run: %s", err.data ? err.data : "step failed");
        free(out);
        out = NULL;
    }
    for (int t = 0; out && t < DECODE; t++) {
        float *prev = out + (size_t)t * vocab;
        int32_t next = 0;
        for (int i = 1; i < vocab; i++) if (prev[i] > prev[next]) next = i;
        v4_step_item it = { s, &next, 1, prev + vocab, false, NULL };
        if (v4_step(m, &it, 1, &err)) { free(out); out = NULL; }
    }
    if (keep) *keep = s;
    else v4_seq_free(m, s);
    sb_free(&err);
    return out;
}

/* CPU: every row bit for bit.  CUDA: the continuation's row within
 * CUDA_REL (greedy decode may part on a near tie). */
static bool same_rows(const float *a, const float *b, int rows)
{
    if (!a || !b) return false;
    if (cpu) return !memcmp(a, b, sizeof(float) * (size_t)rows * vocab);
    double d = 0, z = 0;
    for (int i = 0; i < vocab; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        z += (double)b[i] * b[i];
    }
    if (sqrt(d / z) > CUDA_REL) diag("rel L2 %.3g", sqrt(d / z));
    return sqrt(d / z) <= CUDA_REL;
}

static bool same(const float *a, const float *b) { return same_rows(a, b, DECODE + 1); }

static void random_ids(int32_t *ids, int n, unsigned seed)
{
    srand(seed);
    for (int i = 0; i < n; i++) ids[i] = 2 + rand() % (vocab - 2);
}

/* A first prompt X fills the cache (a snapshot at every boundary); then Y,
 * sharing `shared` tokens with X, runs warm and cold. */
static void shared_prefix(int tp, const char *dtype, v4_model *cold, int shared, int ny,
                          int64_t want, const char *what)
{
    v4_model *m = load(tp, dtype, true, 1, 0);
    if (!m) return;
    int32_t x[600], y[600];
    random_ids(x, 400, 11);
    memcpy(y, x, sizeof(int32_t) * (size_t)shared);
    random_ids(y + shared, ny - shared, 12);
    int64_t cached = -1;
    free(run(m, x, 400, true, NULL, NULL));
    float *warm = run(m, y, ny, true, &cached, NULL), *ref = run(cold, y, ny, false, NULL, NULL);
    ok(cached == want && same(warm, ref),
       "tp %d %s: %s: resumes at %lld (want %lld), logits and %d decode steps bit for bit",
       tp, dtype, what, (long long)cached, (long long)want, DECODE);
    free(warm);
    free(ref);
    v4_model_free(m);
}

static void cases(int tp, const char *dtype)
{
    v4_model *cold = load(tp, dtype, false, 0, 0);
    if (!cold) return;
    shared_prefix(tp, dtype, cold, 256, 350, 256, "prefix ends exactly at a block boundary");
    shared_prefix(tp, dtype, cold, 258, 350, 256, "prefix ends inside a CSA window");
    shared_prefix(tp, dtype, cold, 200, 350, 128, "prefix ends inside the sliding window");
    shared_prefix(tp, dtype, cold, 400, 400, 384, "the whole prompt again");
    shared_prefix(tp, dtype, cold, 100, 350, 0, "a prefix shorter than a block: no reuse");

    /* default spacing: only each prompt's last boundary is snapshotted */
    v4_model *m = load(tp, dtype, true, 0, 0);
    if (m) {
        int32_t x[600];
        random_ids(x, 600, 21);
        int64_t c1 = -1, c2 = -1;
        free(run(m, x, 300, true, &c1, NULL));
        float *warm = run(m, x, 530, true, &c2, NULL), *ref = run(cold, x, 530, false, NULL, NULL);
        ok(c1 == 0 && c2 == 256 && same(warm, ref),
           "tp %d %s: the next turn (530 tokens after 300) resumes at the first prompt's last "
           "boundary (%lld) and matches a cold engine bit for bit", tp, dtype, (long long)c2);
        free(warm);
        free(ref);
        v4_prefix_stats st;
        v4_prefix_stats_get(m, &st);
        ok(st.on && st.queries == 2 && st.hits == 1 && st.hit_tokens == 256
           && st.query_tokens == 830, "tp %d %s: stats count 2 queries, 1 hit of 256 tokens",
           tp, dtype);
        v4_cache_info c0, ci;
        v4_cache_info_get(m, &c0);
        v4_prefix_cleared cl;
        v4_prefix_clear(m, &cl);
        v4_cache_info_get(m, &ci);
        int64_t c3 = -1;
        free(run(m, x, 530, true, &c3, NULL));
        ok(c3 == 0 && ci.blocks_cached == 0 && ci.blocks_used == 0,
           "tp %d %s: after a clear nothing is cached or reused", tp, dtype);
        ok(cl.entries == st.entries && cl.blocks == c0.blocks_cached && cl.blocks > 0
           && cl.host_entries == 0 && cl.host_bytes == 0,
           "tp %d %s: the clear reports what it freed (%lld entries, %lld blocks)", tp, dtype,
           (long long)cl.entries, (long long)cl.blocks);
        v4_model_free(m);
    }
    v4_model_free(cold);
}

/* A minimum for the mark (prefix_mark_min_tokens, the GPU runner's
 * rule): a prompt whose last boundary lies fewer positions past the
 * snapshot before it is fed in one chunk and leaves no snapshot there; a
 * longer one is split and resumed from as before, bit for bit. */
static void mark_min_cases(int tp)
{
    v4_model *cold = load(tp, "auto", false, 0, 0);
    mark_min = 300;
    v4_model *m = load(tp, "auto", true, 0, 0);
    mark_min = 0;
    if (!cold || !m) { v4_model_free(cold); v4_model_free(m); return; }
    int32_t x[600];
    random_ids(x, 600, 41);
    strbuf err;
    sb_init(&err);
    int chunk[2] = { -1, -1 };
    int lens[2] = { 200, 500 };
    for (int i = 0; i < 2; i++) {
        v4_seq *s = v4_seq_new(m, &err);
        if (!s) break;
        v4_seq_prefix_attach(m, s, x, lens[i]);
        chunk[i] = v4_seq_prefix_chunk(m, s, lens[i]);
        v4_seq_free(m, s);
    }
    ok(chunk[0] == 200 && chunk[1] == 384,
       "tp %d: minimum 300: a 200-token prompt (mark 128) in one chunk (%d), a 500-token "
       "one split at its mark 384 (%d)", tp, chunk[0], chunk[1]);
    int64_t c1 = -1, c2 = -1, c3 = -1;
    free(run(m, x, 200, true, NULL, NULL));
    free(run(m, x, 200, true, &c1, NULL));
    free(run(m, x + 100, 500, true, NULL, NULL));
    float *warm = run(m, x + 100, 500, true, &c2, NULL);
    float *ref = run(cold, x + 100, 500, false, NULL, NULL);
    ok(c1 == 0 && c2 == 384 && same(warm, ref),
       "tp %d: the short prompt again resumes nowhere (%lld), the long one at its mark (%lld) "
       "and matches a cold engine", tp, (long long)c1, (long long)c2);
    free(warm);
    free(ref);
    mark_min = 2048;    /* every mark under it (the demo's snapshots: every 2,048+) */
    v4_model *m2 = load(tp, "auto", true, 0, 0);
    mark_min = 0;
    if (m2) {
        free(run(m2, x, 530, true, NULL, NULL));
        free(run(m2, x, 530, true, &c3, NULL));
        ok(c3 == 0, "tp %d: minimum 2048: a 530-token prompt leaves nothing to resume from "
           "(%lld)", tp, (long long)c3);
        v4_model_free(m2);
    }
    sb_free(&err);
    v4_model_free(m);
    v4_model_free(cold);
}

/* B and C share X's cached blocks while D, in a pool too small for
 * everything, evicts what nobody holds. */
static void sharing_under_eviction(int tp)
{
    v4_model *cold = load(tp, "auto", false, 0, 0);
    v4_model *m = load(tp, "auto", true, 1, 1500);
    if (!cold || !m) { v4_model_free(cold); v4_model_free(m); return; }
    int32_t x[600], d[1200];
    random_ids(x, 500, 31);
    random_ids(d, 1200, 32);
    free(run(m, x, 500, true, NULL, NULL));
    v4_seq *b = NULL, *c = NULL;
    int64_t cb = -1, cc = -1;
    float *wb = run(m, x, 420, true, &cb, &b), *wc = run(m, x, 450, true, &cc, &c);
    v4_cache_info before;
    v4_cache_info_get(m, &before);
    v4_prefix_stats s0, s1;
    v4_prefix_stats_get(m, &s0);
    float *wd = run(m, d, 1000, true, NULL, NULL);
    v4_prefix_stats_get(m, &s1);
    ok(wd && s1.evicted > s0.evicted && reclaimable_ok(m),
       "tp %d: a third sequence evicts cached blocks (%llu)", tp,
       (unsigned long long)(s1.evicted - s0.evicted));
    /* B and C continue: a step over the shared blocks after the eviction */
    strbuf err;
    sb_init(&err);
    float *lb = malloc(sizeof(float) * (size_t)vocab), *lc = malloc(sizeof(float) * (size_t)vocab);
    int32_t t = 7;
    v4_step_item it[2] = { { b, &t, 1, lb, false, NULL }, { c, &t, 1, lc, false, NULL } };
    bool stepped = b && c && v4_step(m, it, 2, &err) == 0;
    /* the cold engine: the same prompts, decode tokens and the extra one */
    bool match = stepped && wb && wc;
    int32_t *pb = malloc(sizeof(int32_t) * 600), *pc = malloc(sizeof(int32_t) * 600);
    for (int k = 0; match && k < 2; k++) {
        const float *w = k ? wc : wb, *last = k ? lc : lb;
        int n = k ? 450 : 420;
        int32_t *p = k ? pc : pb;
        memcpy(p, x, sizeof(int32_t) * (size_t)n);
        for (int s = 0; s < DECODE; s++) {
            const float *row = w + (size_t)s * vocab;
            int32_t nx = 0;
            for (int i = 1; i < vocab; i++) if (row[i] > row[nx]) nx = i;
            p[n + s] = nx;
        }
        p[n + DECODE] = t;
        float *ref = run(cold, p, n + DECODE + 1, false, NULL, NULL);
        match = same_rows(ref, last, 1);
        free(ref);
    }
    ok(cb == 384 && cc == 384 && match,
       "tp %d: two sequences sharing 384 cached positions still match a cold engine bit for "
       "bit after the eviction", tp);
    v4_seq_free(m, b);
    v4_seq_free(m, c);
    v4_cache_info after;
    v4_cache_info_get(m, &after);
    ok(after.blocks_used == 0 && after.blocks_cached > 0 && after.blocks_cached <= after.blocks_total
       && reclaimable_ok(m),
       "tp %d: when they end their blocks stay cached, none held by sequences", tp);
    free(pb);
    free(pc);
    free(lb);
    free(lc);
    free(wb);
    free(wc);
    free(wd);
    sb_free(&err);
    v4_model_free(m);
    v4_model_free(cold);
}

/* A pool too small for two prompts and a host tier: X's entries move to
 * host memory when D needs the pool, and come back for Y, which shares
 * X's prefix, bit for bit.  With a host tier too small for an entry they
 * are dropped and Y starts cold. */
static void host_tier(int tp, size_t budget, bool fits)
{
    host_bytes = budget;
    v4_model *cold = load(tp, "auto", false, 0, 0), *m = load(tp, "auto", true, 1, 1000);
    host_bytes = 0;
    if (!cold || !m) { v4_model_free(cold); v4_model_free(m); return; }
    int32_t x[600], d[1200];
    random_ids(x, 500, 41);
    random_ids(d, 1000, 42);
    free(run(m, x, 500, true, NULL, NULL));
    free(run(m, d, 900, true, NULL, NULL));
    v4_prefix_stats s1, s2;
    v4_prefix_stats_get(m, &s1);
    int64_t got = -1;
    float *warm = run(m, x, 450, true, &got, NULL), *ref = run(cold, x, 450, false, NULL, NULL);
    v4_prefix_stats_get(m, &s2);
    ok(reclaimable_ok(m), "tp %d: evictable blocks are counted right with a host tier", tp);
    if (fits)
        ok(s1.spills > 0 && s1.host_entries > 0 && s1.host_bytes <= budget && got == 384
           && s2.fills >= 3 && same(warm, ref),
           "tp %d: the host tier takes %lld evicted entries (%zu bytes) and gives back %llu: "
           "a warm start from it matches a cold engine bit for bit", tp,
           (long long)s1.host_entries, s1.host_bytes, (unsigned long long)(s2.fills - s1.fills));
    else
        ok(s1.spills == 0 && s1.host_entries == 0 && got == 0 && same(warm, ref),
           "tp %d: a host tier smaller than an entry keeps nothing; the prompt runs cold", tp);
    free(warm);
    free(ref);
    v4_model_free(m);
    v4_model_free(cold);
}

/* Every rank's bytes of an entry's pool blocks (its block, then its
 * snapshot's), one after another. */
static char *entry_bytes(v4_model *m, const pc_entry *e, size_t *len)
{
    size_t bb = m->layout.block_bytes;
    int nb = 1 + (e->snap ? m->pc.snap_blocks : 0);
    *len = (size_t)m->tp * (size_t)nb * bb;
    char *out = malloc(*len), *at = out;
    for (int r = 0; r < m->tp; r++)
        for (int k = 0; k < nb; k++, at += bb) {
            backend *be = m->ranks[r].be;
            be->read(be, at, m->ranks[r].block_mem + (size_t)(k ? e->snap[k - 1] : e->block) * bb,
                     bb);
        }
    return out;
}

/* The round trip through the host tier is exact on every backend: a
 * prompt's entries (blocks and snapshots), all spilled to host memory at
 * once (v4_prefix_offload) and filled back after every free pool block was poisoned, hold the
 * same bytes as before, and a warm start from them gives the logits of a
 * warm start from the pool bit for bit (the same ops on the same bytes).
 * On CUDA the copies are asynchronous, from pinned memory, on a copy
 * stream: the poison is written by the compute stream after the spill's
 * fence, so a copy that was not ordered before it would carry poison. */
static void host_roundtrip(int tp)
{
    enum { NB = 3 };
    host_bytes = 64 << 20;
    v4_model *m = load(tp, "auto", true, 1, 0);     /* room for every snapshot */
    host_bytes = 0;
    if (!m) return;
    int32_t x[500];
    random_ids(x, 500, 51);
    free(run(m, x, 500, true, NULL, NULL));
    int32_t ch[NB];
    char *before[NB] = { 0 };
    size_t len[NB];
    bool found = true;
    uint64_t h = m->pc.seed;
    for (int k = 0; k < NB && found; k++) {
        ch[k] = pc_find(&m->pc, h, x + k * m->pc.block_tokens);
        found = ch[k] >= 0 && m->pc.e[ch[k]].block >= 0 && m->pc.e[ch[k]].snap;
        if (found) {
            h = m->pc.e[ch[k]].hash;
            before[k] = entry_bytes(m, &m->pc.e[ch[k]], &len[k]);
        }
    }
    int64_t g1 = -1, g2 = -1;
    float *w1 = run(m, x, 450, true, &g1, NULL);
    v4_prefix_stats s0, s1, s2;
    v4_prefix_stats_get(m, &s0);
    int64_t moved = v4_prefix_offload(m);
    bool emptied = m->pool.nfree == m->pool.nblocks;
    size_t bb = m->layout.block_bytes;
    char *junk = malloc(bb);
    memset(junk, 0xff, bb);
    for (int64_t i = 0; i < m->pool.nfree; i++)
        for (int r = 0; r < m->tp; r++)
            m->ranks[r].be->write(m->ranks[r].be,
                                  m->ranks[r].block_mem + (size_t)m->pool.free_blocks[i] * bb,
                                  junk, bb);
    free(junk);
    v4_prefix_stats_get(m, &s1);
    float *w2 = run(m, x, 450, true, &g2, NULL);
    v4_prefix_stats_get(m, &s2);
    bool same_bytes = found;
    for (int k = 0; k < NB && same_bytes; k++) {
        size_t n;
        const pc_entry *e = &m->pc.e[ch[k]];
        char *after = e->block >= 0 && e->snap ? entry_bytes(m, e, &n) : NULL;
        same_bytes = after && n == len[k] && !memcmp(after, before[k], n);
        free(after);
    }
    ok(found && emptied && moved == s0.entries && s1.blocks_held == 0
       && s1.host_entries == s0.entries && s1.spills - s0.spills == (uint64_t)s0.entries,
       "tp %d: all %lld entries (blocks and snapshots) spill to the host tier at once", tp,
       (long long)s0.entries);
    ok(same_bytes && s2.fills - s1.fills == NB,
       "tp %d: filled back into poisoned pool blocks they hold the same bytes", tp);
    ok(g1 == 384 && g2 == 384 && w1 && w2
       && !memcmp(w1, w2, sizeof(float) * (size_t)(DECODE + 1) * vocab),
       "tp %d: a warm start from the host tier gives a warm start from the pool's logits and "
       "%d decode steps bit for bit", tp, DECODE);
    for (int k = 0; k < NB; k++) free(before[k]);
    free(w1);
    free(w2);
    v4_model_free(m);
}

/* The disk tier's file of the k-th block of ids (chain from the seed). */
static void block_file(const char *dir, uint64_t seed, const int32_t *ids, int k, int B,
                       char *out, size_t cap)
{
    uint64_t h = seed;
    for (int i = 0; i <= k; i++) h = pc_chain(h, ids + i * B, B);
    snprintf(out, cap, "%s/%016" PRIx64 "/%016" PRIx64 ".kv", dir, seed, h);
}

/* Change `n` bytes at `off` of a file (from its end when off < 0). */
static bool patch(const char *path, long off, const void *bytes, size_t n)
{
    FILE *f = fopen(path, "r+b");
    bool done = f && !fseek(f, off, off < 0 ? SEEK_END : SEEK_SET) && fwrite(bytes, 1, n, f) == n;
    if (f) fclose(f);
    return done;
}

/* A warm start from model m (prompt x's first 450 tokens) against the cold
 * engine: positions reused, and whether the logits match bit for bit. */
static bool warm_matches(v4_model *m, v4_model *cold, const int32_t *x, int64_t *got)
{
    float *w = run(m, x, 450, true, got, NULL), *ref = run(cold, x, 450, false, NULL, NULL);
    bool same_logits = w && ref && same(w, ref);
    free(w);
    free(ref);
    return same_logits;
}

/* The disk tier (kv_offloading_filesystem): a host tier of one entry
 * overflows to files, which outlive the model (the host tier's last entry
 * is written when it is freed); a restarted model (same settings, same
 * directory) finds them and resumes from them, matching a cold engine bit
 * for bit; a corrupt file and a foreign one (another seed in its header)
 * are ignored with a log line, the chain stopping before them; a clear
 * deletes the files. */
static void disk_tier(int tp)
{
    v4_model *cold = load(tp, "auto", false, 0, 0), *probe = load(tp, "auto", true, 1, 0);
    char tmpl[] = "/tmp/llm-prefix-disk-XXXXXX";
    if (!cold || !probe || !mkdtemp(tmpl)) {
        ok(0, "tp %d: disk tier set-up", tp);
        v4_model_free(cold);
        v4_model_free(probe);
        return;
    }
    int B = probe->pc.block_tokens;
    host_bytes = (size_t)tp * probe->layout.block_bytes * (1 + (size_t)probe->pc.snap_blocks);
    v4_model_free(probe);
    disk_dir = tmpl;
    logged[0] = 0;
    int32_t x[500];
    random_ids(x, 500, 61);
    v4_prefix_stats st;

    v4_model *m = load(tp, "auto", true, 1, 0);
    uint64_t seed = m ? m->pc.seed : 0;
    free(run(m, x, 500, true, NULL, NULL));
    v4_prefix_offload(m);
    v4_prefix_stats_get(m, &st);
    ok(st.host_entries == 1 && st.disk_writes == 2 && st.disk_files == 2,
       "tp %d: a host tier of one entry sends the 2 older ones to disk (%llu written)", tp,
       (unsigned long long)st.disk_writes);
    v4_model_free(m);

    m = load(tp, "auto", true, 1, 0);       /* a restart */
    v4_prefix_stats_get(m, &st);
    int64_t got = -1;
    bool match = warm_matches(m, cold, x, &got);
    v4_prefix_stats s2;
    v4_prefix_stats_get(m, &s2);
    ok(st.disk_files == 3 && got == 3 * B && s2.disk_reads == 3 && match,
       "tp %d: after a restart all 3 blocks come back from disk (%lld files): resumes at %lld, "
       "logits bit for bit", tp, (long long)st.disk_files, (long long)got);
    v4_model_free(m);

    char path[512];
    block_file(tmpl, seed, x, 1, B, path, sizeof path);
    unsigned char junk = 0x5a;
    bool patched = patch(path, -100, &junk, 1);
    m = load(tp, "auto", true, 1, 0);
    match = warm_matches(m, cold, x, &got);
    v4_prefix_stats_get(m, &st);
    ok(patched && got == B && st.disk_rejected == 1 && match && strstr(logged, "checksum"),
       "tp %d: a corrupt file is ignored with a log line; the chain resumes before it (%lld), "
       "bit for bit", tp, (long long)got);
    v4_model_free(m);

    block_file(tmpl, seed, x, 0, B, path, sizeof path);
    uint64_t other = seed ^ 1;
    patched = patch(path, 8, &other, sizeof other);
    logged[0] = 0;
    m = load(tp, "auto", true, 1, 0);
    match = warm_matches(m, cold, x, &got);
    v4_prefix_stats_get(m, &st);
    ok(patched && got == 0 && st.disk_rejected == 1 && match
       && strstr(logged, "another model or settings"),
       "tp %d: a foreign file (another seed in its header) is ignored with a log line", tp);
    v4_model_free(m);

    m = load(tp, "auto", true, 1, 0);
    v4_prefix_cleared cl;
    v4_prefix_clear(m, &cl);
    snprintf(path, sizeof path, "%s/%016" PRIx64, tmpl, seed);
    int left = 0;
    DIR *d = opendir(path);
    for (struct dirent *de; d && (de = readdir(d));) left += de->d_name[0] != '.';
    if (d) closedir(d);
    ok(cl.disk_files == 3 && cl.disk_bytes > 0 && left == 0,
       "tp %d: a clear deletes the disk tier's %lld files", tp, (long long)cl.disk_files);
    v4_model_free(m);
    rmdir(path);
    rmdir(tmpl);
    disk_dir = NULL;
    host_bytes = 0;
    v4_model_free(cold);
}

/* pc_reclaimable (kept by counting) against a walk over the entries. */
static bool reclaimable_ok(v4_model *m)
{
    const prefix_cache *pc = &m->pc;
    int64_t n = 0;
    for (int32_t i = pc->lru_head; i >= 0; i = pc->e[i].lru_next)
        n += (m->pool.ref[pc->e[i].block] == 1) + (pc->e[i].snap ? pc->snap_blocks : 0);
    if (n != pc_reclaimable(pc)) diag("reclaimable %lld, counted %lld", (long long)n,
                                      (long long)pc_reclaimable(pc));
    return n == pc_reclaimable(pc);
}

static void seeds(void)
{
    v4_model *a = load(1, "auto", true, 0, 0), *b = load(1, "bf16", true, 0, 0);
    v4_model *a2 = load(1, "auto", true, 0, 0);
    v4_model *t2 = max_tp >= 2 ? load(2, "auto", true, 0, 0) : NULL;
    if (a && b && a2) {
        v4_prefix_stats sa, sb, sa2, st2 = { 0 };
        v4_prefix_stats_get(a, &sa);
        v4_prefix_stats_get(b, &sb);
        v4_prefix_stats_get(a2, &sa2);
        if (t2) v4_prefix_stats_get(t2, &st2);
        ok(sa.seed == sa2.seed && sa.seed != sb.seed && (!t2 || sa.seed != st2.seed),
           "the chain seed is the same for the same model and settings, and differs for "
           "another kv dtype%s", t2 ? " or TP split" : "");
    }
    v4_model_free(a);
    v4_model_free(b);
    v4_model_free(a2);
    v4_model_free(t2);
}

/* The bookkeeping on its own, over a pool of 8 blocks (blocks of 4). */
static void bookkeeping(void)
{
    block_pool p;
    block_pool_init(&p, 1, 8);
    prefix_cache pc;
    pc_init(&pc, true, 8, 4, 1, 1, 0x1234);
    int32_t t0[4] = { 1, 2, 3, 4 }, t1[4] = { 5, 6, 7, 8 };
    int32_t b0 = block_take(&p), b1 = block_take(&p);
    int32_t e0 = pc_insert(&pc, &p, pc.seed, t0, b0);
    uint64_t h0 = pc_chain(pc.seed, t0, 4);
    int32_t e1 = pc_insert(&pc, &p, h0, t1, b1);
    ok(e0 >= 0 && e1 >= 0 && p.ref[b0] == 2 && pc_find(&pc, pc.seed, t0) == e0
       && pc_find(&pc, h0, t1) == e1, "entries are found by chain and hold a reference");
    ok(pc_find(&pc, 0x4321, t0) < 0 && pc_find(&pc, pc.seed, t1) < 0
       && pc_insert(&pc, &p, pc.seed, t0, b1) < 0,
       "another seed, another parent or a second copy never matches");
    int32_t held[2] = { b0, b1 };
    pc_seq_release(&pc, &p, held, 2);   /* the sequence ends: the tail is older */
    block_unref(&p, b0);
    block_unref(&p, b1);
    int64_t free0 = p.nfree;
    ok(pc_reclaimable(&pc) == 2 && pc_make_room(&pc, &p, free0 + 1)
       && pc_find(&pc, h0, t1) < 0 && pc_find(&pc, pc.seed, t0) == e0,
       "eviction takes the tail of a chain before its head");
    ok(pc_snap_alloc(&pc, &p, e0) == 0 && pc_blocks_held(&pc) == 2, "a snapshot takes its blocks");
    pc_seq_ref(&pc, &p, b0);    /* a sequence holds the head: only its snapshot can go */
    ok(pc_reclaimable(&pc) == 1 && pc_make_room(&pc, &p, 8) == false && pc.e[e0].snap == NULL
       && pc_find(&pc, pc.seed, t0) == e0 && pc_reclaimable(&pc) == 0,
       "an entry in use keeps its block, loses its snapshot");
    pc_seq_release(&pc, &p, &b0, 1);
    block_unref(&p, b0);
    pc_clear(&pc, &p);
    ok(p.nfree == 8 && pc.n == 0, "clear gives every block back");
    pc_free(&pc);
    block_pool_free(&p);
}

static int spilled, filled;
static void fake_spill(void *ctx, prefix_cache *pc, int32_t e)
{
    (void)ctx;
    memset(pc_host_at(pc, &pc->e[e], 0), pc->e[e].block, pc->host_unit);
    spilled++;
}
static void fake_fill(void *ctx, prefix_cache *pc, int32_t e)
{
    (void)ctx;
    (void)pc;
    (void)e;
    filled++;
}

/* The host tier's own units and order, over a pool of 8 blocks. */
static void host_bookkeeping(void)
{
    block_pool p;
    block_pool_init(&p, 1, 8);
    prefix_cache pc;
    char mem[25];
    pc_init(&pc, true, 8, 4, 2, 1, 0x77);
    pc_host_init(&pc, 25, 10, mem);     /* two units: two entries without snapshots */
    pc.spill = fake_spill;
    pc.fill = fake_fill;
    int32_t t[3][4] = { { 1, 2, 3, 4 }, { 5, 6, 7, 8 }, { 9, 10, 11, 12 } }, b[3], e[3];
    uint64_t parent[3];
    for (int k = 0; k < 3; k++) {
        parent[k] = k ? pc_chain(parent[k - 1], t[k - 1], 4) : pc.seed;
        b[k] = block_take(&p);
        e[k] = pc_insert(&pc, &p, parent[k], t[k], b[k]);
    }
    pc_seq_release(&pc, &p, b, 3);
    for (int k = 0; k < 3; k++) block_unref(&p, b[k]);
    bool room = pc_make_room(&pc, &p, 8);
    ok(room && spilled == 3 && pc.nhost == 2 && pc.host_used == 20 && pc.host_budget == 20
       && pc_find(&pc, parent[2], t[2]) < 0 && pc.e[pc_find(&pc, parent[0], t[0])].block < 0
       && *pc_host_at(&pc, &pc.e[e[0]], 0) == (char)b[0],
       "evicted entries go to the host tier; when it is full its oldest goes (the chain's tail)");
    ok(pc_fill(&pc, &p, e[0]) == 0 && filled == 1 && pc.e[e[0]].block >= 0 && pc.nhost == 1
       && pc.host_used == 10 && pc_blocks_held(&pc) == 1, "a fill brings an entry back");
    ok(pc_snap_alloc(&pc, &p, e[0]) == 0 && pc_make_room(&pc, &p, 8) && spilled == 3
       && pc.nhost == 1 && pc_find(&pc, parent[0], t[0]) < 0 && pc_find(&pc, parent[1], t[1]) == e[1],
       "an entry larger than the host tier (a block and a 2-block snapshot: 3 units) is dropped "
       "without touching the tier");
    pc_clear(&pc, &p);
    ok(pc.n == 0 && pc.nhost == 0 && pc.host_used == 0 && p.nfree == 8, "clear empties both tiers");
    pc_free(&pc);
    block_pool_free(&p);
}

int main(void)
{
    test_backend = getenv("LLM_TEST_BACKEND");
    cpu = !test_backend || !strcmp(test_backend, "cpu");
    if (getenv("LLM_TEST_MAX_TP")) max_tp = atoi(getenv("LLM_TEST_MAX_TP"));
    int tp2 = max_tp >= 2 ? 2 : 1;      /* one GPU: the TP=2 cases run at TP=1 */
    bookkeeping();
    host_bookkeeping();
    seeds();
    cases(1, "auto");
    cases(tp2, "auto");
    cases(tp2, "fp8");
    sharing_under_eviction(1);
    sharing_under_eviction(tp2);
    mark_min_cases(1);
    host_tier(1, 64 << 20, true);
    host_tier(tp2, 64 << 20, true);
    host_tier(1, 1000, false);
    host_roundtrip(1);
    host_roundtrip(tp2);
    disk_tier(1);
    disk_tier(tp2);
    return exit_status();
}
