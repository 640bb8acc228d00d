/* Model loading, the cache pool and the step driver (model.h). */
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "model_internal.h"
#include "st_prefetch.h"

const v4_config *v4_model_config(const v4_model *m) { return &m->cfg; }
int v4_model_tp(const v4_model *m) { return m->tp; }

static int default_threads(int tp)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    int t = (int)(n > 0 ? n : 1) / tp;
    return t < 1 ? 1 : t;
}

double model_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Each rank copies its shard to its backend, all at once. */
typedef struct {
    v4_model *m;
    strbuf err[64];
    int rc[64];
} upload_job;

static void upload_rank(void *ctx, int r)
{
    upload_job *J = ctx;
    v4_rank *R = &J->m->ranks[r];
    J->rc[r] = v4_weights_upload(&R->w, &J->m->cfg, &R->shard, R->be, &J->err[r]);
}

static int upload_all(v4_model *m, strbuf *err)
{
    upload_job *J = calloc(1, sizeof *J);
    if (!J) {
        sb_printf(err, "out of memory\n");
        return -1;
    }
    J->m = m;
    for (int r = 0; r < m->tp; r++) sb_init(&J->err[r]);
    tp_run(m->group, upload_rank, J);
    int rc = 0;
    for (int r = 0; r < m->tp; r++) {
        if (J->rc[r] && !rc) {
            sb_printf(err, "rank %d: %s", r, J->err[r].data);
            rc = -1;
        }
        sb_free(&J->err[r]);
    }
    free(J);
    return rc;
}

/* Each rank's cache memory: nslots state slots and nblocks blocks (the
 * previous pool, if any, given back first). */
static int alloc_pool(v4_model *m, int nslots, int64_t nblocks, strbuf *err)
{
    block_pool_free(&m->pool);
    block_pool_init(&m->pool, nslots, nblocks);
    for (int r = 0; r < m->tp; r++) {
        v4_rank *R = &m->ranks[r];
        R->be->release(R->be, R->state_mem);
        R->be->release(R->be, R->block_mem);
        R->state_mem = R->be->alloc(R->be, (size_t)nslots * m->layout.state_bytes);
        R->block_mem = R->be->alloc(R->be, (size_t)nblocks * m->layout.block_bytes);
        if (!R->state_mem || !R->block_mem) {
            sb_printf(err, "rank %d: cannot allocate the cache pool (%d sequences, %lld blocks "
                      "of %zu bytes)\n", r, nslots, (long long)nblocks, m->layout.block_bytes);
            return -1;
        }
    }
    return 0;
}

/* What a profile step at load does not reach: the indexer's score
 * scratch of long contexts (up to 320 MiB), CUDA graphs of decode steps. */
#define POOL_HEADROOM ((size_t)512 << 20)

/* vLLM's rule: one step of max_step_tokens brings the step's scratch to
 * its size (with a pool just large enough), then the pool gets
 * gpu_memory_utilization x total memory - what is in use, per rank; the
 * smallest rank decides. */
static int pool_from_memory(v4_model *m, const v4_options *o, int max_seqs, strbuf *err)
{
    int T = o->max_step_tokens > 0 ? o->max_step_tokens : 8192, V = m->cfg.vocab_size;
    if (alloc_pool(m, 1, cache_blocks_for(&m->layout, T), err)) return -1;
    int32_t *ids = malloc((size_t)T * sizeof *ids);
    float *logits = malloc((size_t)V * sizeof *logits);
    if (!ids || !logits) {
        free(ids);
        free(logits);
        sb_printf(err, "out of memory for the profile step of %d tokens\n", T);
        return -1;
    }
    for (int i = 0; i < T; i++) ids[i] = i % V;
    v4_seq *s = v4_seq_new(m, err);
    v4_step_item it = { s, ids, T, logits, false, NULL };
    int rc = s ? v4_step(m, &it, 1, err) : -1;
    v4_seq_free(m, s);
    free(ids);
    free(logits);
    if (rc || alloc_pool(m, 0, 0, err)) return -1;
    double budget = 0;
    int worst = 0;
    size_t wfree = 0, wtotal = 0;
    for (int r = 0; r < m->tp; r++) {
        size_t f = 0, t = 0;
        m->ranks[r].be->mem_info(m->ranks[r].be, &f, &t);
        double b = o->gpu_memory_utilization * t - (double)(t - f) - POOL_HEADROOM;
        if (r == 0 || b < budget) budget = b, worst = r, wfree = f, wtotal = t;
    }
    int64_t nblocks = budget > 0 ? cache_blocks_in(&m->layout, (size_t)budget, max_seqs) : -1;
    if (nblocks < 0) {
        sb_printf(err, "gpu_memory_utilization %.3g leaves %.2f GiB for the cache on rank %d "
                  "(%.1f GiB in use of %.1f after loading and a %d-token step, %.1f GiB kept "
                  "free), less than the %.1f MiB of state for %d sequences: raise it, lower "
                  "max_num_seqs, or set kv_cache_memory_bytes\n", o->gpu_memory_utilization,
                  budget / 1073741824.0, worst, (wtotal - wfree) / 1073741824.0,
                  wtotal / 1073741824.0, T, POOL_HEADROOM / 1073741824.0,
                  (double)max_seqs * m->layout.state_bytes / 1048576.0, max_seqs);
        return -1;
    }
    if (nblocks > INT32_MAX) nblocks = INT32_MAX;   /* block numbers are int32 */
    return alloc_pool(m, max_seqs, nblocks, err);
}

/* The pool: max_seqs state slots and as many blocks as the options give. */
static int pool_init(v4_model *m, const v4_options *o, bool cuda, int max_seqs, strbuf *err)
{
    if (cuda && !o->cache_bytes && o->gpu_memory_utilization > 0)
        return pool_from_memory(m, o, max_seqs, err);
    int64_t nblocks;
    if (o->cache_bytes) {
        nblocks = cache_blocks_in(&m->layout, o->cache_bytes, max_seqs);
        if (nblocks < 0) {
            sb_printf(err, "cache memory %zu bytes is less than the %zu bytes of state for "
                      "%d sequences\n", o->cache_bytes,
                      (size_t)max_seqs * m->layout.state_bytes, max_seqs);
            return -1;
        }
    } else {
        int64_t tokens = o->cache_tokens > 0 ? o->cache_tokens : 4096 * (int64_t)max_seqs;
        nblocks = cache_blocks_for(&m->layout, tokens) + (m->layout.block_bytes ? max_seqs : 0);
    }
    return alloc_pool(m, max_seqs, nblocks, err);
}

int v4_model_load(v4_model **out, const char *dir, const v4_options *opt, strbuf *err)
{
    v4_options o = opt ? *opt : (v4_options){ 0 };
    *out = NULL;
    bool cuda = o.backend && !strcmp(o.backend, "cuda");
    if (o.backend && strcmp(o.backend, "cpu") && !cuda) {
        sb_printf(err, "backend %s: unknown (cpu or cuda)\n", o.backend);
        return -1;
    }
#ifndef LLM_HAVE_CUDA
    if (cuda) {
        sb_printf(err, "backend cuda: not available in this build (built with CUDA=0)\n");
        return -1;
    }
#endif
    backend_modes modes = o.modes;
    if (!modes.attn_tokens) modes.attn_tokens = 1;
    char merr[256];
    if (cuda && backend_modes_env(&modes, merr, sizeof merr)) {
        sb_printf(err, "backend cuda: %s\n", merr);
        return -1;
    }
    int tp = o.tp > 0 ? o.tp : 1;
    int threads = o.threads_per_rank > 0 ? o.threads_per_rank : default_threads(tp);
    int max_seqs = o.max_seqs > 0 ? o.max_seqs : 1;
    if (tp > 64) {
        sb_printf(err, "--tp %d: at most 64 ranks\n", tp);
        return -1;
    }
    if (o.kv_dtype != KV_F32 && o.kv_dtype != KV_BF16 && o.kv_dtype != KV_FP8) {
        sb_printf(err, "kv cache dtype %d: unknown\n", (int)o.kv_dtype);
        return -1;
    }

    if (o.synthetic && !cuda) {
        sb_printf(err, "synthetic weights are made on the device: they need --backend cuda\n");
        return -1;
    }
    v4_model *m = calloc(1, sizeof *m);
    if (!m) {
        sb_printf(err, "out of memory\n");
        return -1;
    }
    m->modes = modes;
    strbuf p;
    sb_init(&p);
    if (o.synthetic) sb_puts(&p, dir);
    else sb_printf(&p, "%s/config.json", dir);
    int rc = v4_config_load(&m->cfg, p.data, err);
    sb_free(&p);
    if (rc) { free(m); return -1; }
    const v4_config *c = &m->cfg;
    v4_shard sh[64];
    for (int r = 0; r < tp; r++)
        if (v4_shard_plan(c, tp, r, &sh[r], err)) {
            v4_config_free(&m->cfg);
            free(m);
            return -1;
        }
    if (!o.synthetic && st_open_dir(&m->st, dir, err)) {
        v4_config_free(&m->cfg);
        free(m);
        return -1;
    }
    if (o.synthetic ? v4_weights_synthetic(&m->w, c, 0x5eed, err)
                    : v4_weights_load(&m->w, c, &m->st, dir, err)) {
        st_close(&m->st);
        v4_config_free(&m->cfg);
        free(m);
        return -1;
    }
    double t_load = model_now_s();
    st_prefetch *pf = o.synthetic ? NULL
                      : st_prefetch_start(&m->st, o.read_threads > 0 ? o.read_threads : 8,
                                          o.log, o.log_user);

    int np = c->rope_dim / 2;
    m->inv_main = malloc(np * sizeof(float));
    m->inv_comp = malloc(np * sizeof(float));
    m->tp = tp;
    m->group = tp_group_new(tp);
    m->ranks = calloc(tp, sizeof *m->ranks);
    pthread_mutex_init(&m->mu, NULL);
    if (!m->inv_main || !m->inv_comp || !m->group || !m->ranks) {
        sb_printf(err, "out of memory (or no threads) for %d ranks\n", tp);
        v4_model_free(m);
        return -1;
    }
    v4_rope_inv_freq(&c->rope_main, c->rope_dim, m->inv_main);
    v4_rope_inv_freq(&c->rope_compress, c->rope_dim, m->inv_comp);
    m->rope_main = (rope_table){ np, m->inv_main, (float)c->rope_main.attention_factor };
    m->rope_comp = (rope_table){ np, m->inv_comp, (float)c->rope_compress.attention_factor };

    cache_layout_init(&m->layout, c, o.kv_dtype);
    m->threads = threads;
    backend *bes[64] = { 0 };
#ifdef LLM_HAVE_CUDA
    char berr[256];
    if (cuda && backend_cuda_new_group(tp, &m->modes, bes, berr, sizeof berr)) {
        sb_printf(err, "backend cuda: %s\n", berr);
        v4_model_free(m);
        return -1;
    }
#endif
    for (int r = 0; r < tp; r++) {
        v4_rank *R = &m->ranks[r];
        R->rank = r;
        R->shard = sh[r];
        v4_weights_shard(&m->w, c, &sh[r], &R->w);
        R->be = cuda ? bes[r] : backend_cpu_new(threads, m->group, r);
        if (!R->be) {
            sb_printf(err, "backend cpu: out of memory (or no threads) for rank %d\n", r);
            v4_model_free(m);
            return -1;
        }
        if (!cuda && m->modes.gemm == BACKEND_GEMM_FP8) backend_cpu_set_fp8(R->be, true);
    }
    if (m->ranks[0].be->upload_weights && upload_all(m, err)) {
        st_prefetch_finish(pf);
        v4_model_free(m);
        return -1;
    }
    st_prefetch_finish(pf);
    if (o.log && m->ranks[0].be->upload_weights) {
        char line[160];
        snprintf(line, sizeof line, "weights: on %d %s device%s %.1f s after the headers were read",
                 tp, o.backend, tp > 1 ? "s" : "", model_now_s() - t_load);
        o.log(o.log_user, line);
    }

    if (pool_init(m, &o, cuda, max_seqs, err)) {
        v4_model_free(m);
        return -1;
    }
    if (prefix_init(m, &o, dir, err)) {
        v4_model_free(m);
        return -1;
    }
    *out = m;
    return 0;
}

void v4_model_free(v4_model *m)
{
    if (!m) return;
    prefix_free(m);     /* the host tier's memory is the backends' */
    for (int r = 0; m->ranks && r < m->tp; r++) {
        v4_rank *R = &m->ranks[r];
        backend *be = R->be;
        v4_scratch *s = &R->s;
        if (!be) continue;
        void *bufs[] = { s->h, s->x, s->col, s->y, s->post, s->comb, s->qr, s->q, s->kv,
                         s->attn, s->oa, s->ckv, s->cg, s->ikv, s->ig, s->qi, s->iw, s->sel,
                         s->nsel, s->head_in, s->logits, R->state_mem, R->block_mem };
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->release(be, bufs[i]);
        be->destroy(be);
        free(R->blockptr);
        free(R->amax_val);
        free(R->amax_idx);
        free(R->cargs);
        free(R->iargs);
        free(R->aargs);
        free(R->rargs);
        free(R->pseg);
        free(R->pids);
        free(R->ppos);
        free(R->pslot);
        free(R->pblk);
        v4_weights_free(&R->w);
    }
    if (m->tp) pthread_mutex_destroy(&m->mu);
    free(m->ranks);
    tp_group_free(m->group);
    block_pool_free(&m->pool);
    cache_layout_free(&m->layout);
    free(m->inv_main);
    free(m->inv_comp);
    v4_weights_free(&m->w);
    st_close(&m->st);
    v4_config_free(&m->cfg);
    free(m);
}

void v4_model_mem(v4_model *m, size_t *free_bytes, size_t *total_bytes)
{
    *free_bytes = *total_bytes = 0;
    for (int r = 0; r < m->tp; r++) {
        backend *be = m->ranks[r].be;
        size_t f = 0, t = 0;
        if (be->mem_info) be->mem_info(be, &f, &t);
        if (r == 0 || f < *free_bytes) *free_bytes = f, *total_bytes = t;
    }
}

void v4_model_graph_counts(v4_model *m, long long *captures, long long *replays)
{
    *captures = *replays = 0;
    for (int r = 0; r < m->tp; r++) {
        backend *be = m->ranks[r].be;
        long long c = 0, n = 0;
        if (be->graph_counts) be->graph_counts(be, &c, &n);
        *captures += c;
        *replays += n;
    }
}

float *v4_logits_alloc(v4_model *m, size_t n, bool *pinned)
{
    backend *be = m->ranks[0].be;
    float *p = be->host_alloc ? be->host_alloc(be, n * sizeof *p) : NULL;
    *pinned = p != NULL;
    return p ? p : malloc(n * sizeof *p);
}

void v4_logits_free(v4_model *m, float *p, bool pinned)
{
    backend *be = m->ranks[0].be;
    if (pinned) be->host_free(be, p);
    else free(p);
}

long long v4_model_graph_kernels(v4_model *m)
{
    backend *be = m->ranks[0].be;
    return be->graph_kernels ? be->graph_kernels(be) : 0;
}

bool v4_model_graph_time(v4_model *m, long long *replays, double *ms)
{
    backend *be = m->ranks[0].be;
    *replays = 0, *ms = 0;
    return be->graph_time && be->graph_time(be, replays, ms);
}

void v4_model_host_time(v4_model *m, v4_host_time *t)
{
    const v4_rank *R = &m->ranks[0];
    *t = (v4_host_time){ R->host_steps, R->host_walk_ms, R->host_launch_ms, R->ahead_steps,
                         R->ahead_walks, R->ahead_ms };
}

backend_modes v4_model_modes(const v4_model *m) { return m->modes; }

void v4_cache_info_get(v4_model *m, v4_cache_info *ci)
{
    pthread_mutex_lock(&m->mu);
    *ci = (v4_cache_info){
        .dtype = m->layout.dtype, .block_tokens = m->layout.block_tokens, .block_bytes = m->layout.block_bytes,
        .state_bytes = m->layout.state_bytes, .blocks_total = m->pool.nblocks,
        .blocks_used = m->pool.nblocks - m->pool.nfree - pc_reclaimable(&m->pc),
        .blocks_cached = pc_blocks_held(&m->pc), .seqs_total = m->pool.nslots,
        .seqs_used = m->pool.nslots - m->pool.nfree_slots,
    };
    pthread_mutex_unlock(&m->mu);
}

int64_t v4_blocks_for_tokens(const v4_model *m, int64_t n)
{
    return cache_blocks_for(&m->layout, n);
}

int v4_kv_dtype_parse(const char *name)
{
    return !strcmp(name, "auto") ? KV_F32 : !strcmp(name, "bf16") ? KV_BF16
           : !strcmp(name, "fp8") ? KV_FP8 : -1;
}

const char *v4_kv_dtype_name(enum kv_dtype t)
{
    return t == KV_BF16 ? "bf16" : t == KV_FP8 ? "fp8" : "float32";
}

double v4_cache_bytes_per_token(const v4_model *m)
{
    return (double)m->layout.block_bytes / m->layout.block_tokens;
}

bool v4_can_admit(v4_model *m, int64_t n)
{
    pthread_mutex_lock(&m->mu);
    bool ok = m->pool.nfree_slots > 0
              && cache_blocks_for(&m->layout, n) <= m->pool.nfree + pc_reclaimable(&m->pc);
    pthread_mutex_unlock(&m->mu);
    return ok;
}

v4_seq *v4_seq_new(v4_model *m, strbuf *err)
{
    v4_seq *s = calloc(1, sizeof *s);
    pthread_mutex_lock(&m->mu);
    int rc = seq_cache_open(&m->pool, &s->c);
    if (!rc) prefix_seq_open(m, s);
    pthread_mutex_unlock(&m->mu);
    if (rc) {
        sb_printf(err, "no free sequence slot (max_seqs %d)\n", m->pool.nslots);
        free(s);
        return NULL;
    }
    return s;
}

int v4_seq_reserve(v4_model *m, v4_seq *s, int64_t n, strbuf *err)
{
    pthread_mutex_lock(&m->mu);
    prefix_make_room(m, cache_blocks_for(&m->layout, n) - s->c.nblocks);
    int rc = seq_cache_reserve(&m->pool, &m->layout, &s->c, n);
    if (rc)
        sb_printf(err, "cache pool: %lld blocks needed for %lld positions, %lld free\n",
                  (long long)(cache_blocks_for(&m->layout, n) - s->c.nblocks), (long long)n,
                  (long long)m->pool.nfree);
    pthread_mutex_unlock(&m->mu);
    return rc;
}

void v4_seq_free(v4_model *m, v4_seq *s)
{
    if (!s) return;
    pthread_mutex_lock(&m->mu);
    prefix_seq_close(m, s);
    seq_cache_close(&m->pool, &s->c);
    pthread_mutex_unlock(&m->mu);
    free(s);
}

int64_t v4_seq_len(const v4_seq *s) { return s->c.len; }

/* n bytes (a multiple of 4: pieces are 16-byte aligned) as one row */
void copy_bytes(backend *be, char *dst, const char *src, size_t n)
{
    be->copy_rows(be, (float *)dst, (int)(n / 4), (const float *)src, (int)(n / 4), 1,
                  (int)(n / 4));
}

int v4_seq_fork(v4_model *m, v4_seq *dst, const v4_seq *src, strbuf *err)
{
    const cache_layout *L = &m->layout;
    int64_t nb = cache_blocks_for(L, src->c.len);
    if (dst->c.len != 0 || dst->c.nblocks < nb || L->state_bytes / 4 > INT32_MAX
        || L->block_bytes / 4 > INT32_MAX) {
        sb_printf(err, "fork: the target has %lld positions and %lld of the %lld blocks "
                  "needed\n", (long long)dst->c.len, (long long)dst->c.nblocks, (long long)nb);
        return -1;
    }
    for (int r = 0; r < m->tp; r++) {
        v4_rank *R = &m->ranks[r];
        copy_bytes(R->be, R->state_mem + (size_t)dst->c.slot * L->state_bytes,
                   R->state_mem + (size_t)src->c.slot * L->state_bytes, L->state_bytes);
        for (int64_t b = 0; b < nb && L->block_bytes; b++)
            copy_bytes(R->be, R->block_mem + (size_t)dst->c.blocks[b] * L->block_bytes,
                       R->block_mem + (size_t)src->c.blocks[b] * L->block_bytes,
                       L->block_bytes);
        const char *e = R->be->error(R->be);
        if (e) {
            sb_printf(err, "fork on rank %d: %s\n", r, e);
            return -1;
        }
    }
    dst->c.len = src->c.len;
    pthread_mutex_lock(&m->mu);
    prefix_seq_fork(m, dst, src);
    pthread_mutex_unlock(&m->mu);
    return 0;
}

static int check_items(v4_model *m, v4_step_item *items, int n, strbuf *err)
{
    if (n <= 0) { sb_printf(err, "step: no sequences\n"); return -1; }
    for (int i = 0; i < n; i++) {
        v4_step_item *it = &items[i];
        if (!it->seq || it->n_tokens <= 0 || !it->tokens || (!it->logits && !it->argmax)) {
            sb_printf(err, "step: item %d needs a sequence, tokens and a logits buffer or an "
                      "argmax slot\n", i);
            return -1;
        }
        if (it->argmax && it->all_logits) {
            sb_printf(err, "step: item %d asks for every row's logits and for the argmax only\n",
                      i);
            return -1;
        }
        if (it->seq->c.len + it->n_tokens > 0x7fffffff - 1) {
            sb_printf(err, "step: item %d: sequence too long\n", i);
            return -1;
        }
        for (int j = 0; j < i; j++)
            if (items[j].seq == it->seq) {
                sb_printf(err, "step: sequence given twice (items %d and %d)\n", j, i);
                return -1;
            }
        for (int t = 0; t < it->n_tokens; t++)
            if (it->tokens[t] < 0 || it->tokens[t] >= m->cfg.vocab_size) {
                sb_printf(err, "step: item %d: token %d is outside the vocabulary [0, %d)\n", i,
                          it->tokens[t], m->cfg.vocab_size);
                return -1;
            }
    }
    return 0;
}

static int step_locked(v4_model *m, v4_step_item *items, int n, strbuf *err)
{
    if (check_items(m, items, n, err)) return -1;
    /* Take every sequence's blocks first: all or nothing. */
    int64_t *had = malloc(n * sizeof *had), need = 0;
    if (!had) {
        sb_printf(err, "step: out of memory for %d sequences\n", n);
        return V4_STEP_NOMEM;
    }
    for (int i = 0; i < n; i++) {
        had[i] = items[i].seq->c.nblocks;
        need += cache_blocks_for(&m->layout, items[i].seq->c.len + items[i].n_tokens) - had[i];
    }
    prefix_make_room(m, need);
    for (int i = 0; i < n; i++) {
        seq_cache *sc = &items[i].seq->c;
        if (seq_cache_reserve(&m->pool, &m->layout, sc, sc->len + items[i].n_tokens)) {
            for (int j = 0; j <= i; j++) seq_cache_trim(&m->pool, &items[j].seq->c, had[j]);
            sb_printf(err, "step: cache pool exhausted (%lld of %lld blocks free)\n",
                      (long long)m->pool.nfree, (long long)m->pool.nblocks);
            free(had);
            return -1;
        }
    }
    free(had);
    int T = 0, nout = 0;
    for (int i = 0; i < n; i++) {
        T += items[i].n_tokens;
        nout += items[i].all_logits ? items[i].n_tokens : 1;
    }
    v4_segment *segs = calloc(n, sizeof *segs);
    int32_t *ids = malloc(T * sizeof *ids), *pos = malloc(T * sizeof *pos);
    int32_t *out_tok = malloc(nout * sizeof *out_tok);
    int rc = 0, t = 0, o = 0;
    if (!segs || !ids || !pos || !out_tok) {
        sb_printf(err, "step: out of memory for a step of %d tokens (%d logits rows)\n", T,
                  nout);
        rc = V4_STEP_NOMEM;
        goto out;
    }
    int64_t blk = 0;
    for (int i = 0; i < n; i++) {
        v4_step_item *it = &items[i];
        segs[i] = (v4_segment){ it->seq, it->n_tokens, (int)it->seq->c.len, t, blk };
        blk += it->seq->c.nblocks;
        for (int j = 0; j < it->n_tokens; j++, t++) {
            ids[t] = it->tokens[j];
            pos[t] = (int32_t)(it->seq->c.len + j);
            if (it->all_logits || j == it->n_tokens - 1) out_tok[o++] = t;
        }
    }
    v4_batch B = { m, n, T, segs, ids, pos, nout, out_tok, items };
    if (tp_reserve(m->group, (size_t)T * m->cfg.hidden_size)) {
        sb_printf(err, "step: out of memory for the all-reduce of %d tokens\n", T);
        rc = V4_STEP_NOMEM;
        goto out;
    }
    tp_run(m->group, v4_forward_rank, &B);
    for (int r = 0; r < m->tp && !rc; r++) {
        v4_rank *R = &m->ranks[r];
        const char *e = R->be->error(R->be);
        if (R->short_of_memory) {
            sb_printf(err, "step: rank %d: out of memory for the buffers of a step of %d "
                      "tokens\n", r, T);
            rc = V4_STEP_NOMEM;
        } else if (e) {
            sb_printf(err, "step: rank %d (%s backend): %s\n", r, R->be->name, e);
            rc = -1;
        }
    }
    if (rc == V4_STEP_NOMEM || rc == -1) {
        /* every rank forgets a shortage, or the model is unusable */
        bool recovered = true;
        for (int r = 0; r < m->tp; r++) {
            backend *be = m->ranks[r].be;
            if (be->error(be) && !(be->recover && be->recover(be))) recovered = false;
        }
        rc = recovered ? V4_STEP_NOMEM : -1;
        goto out;
    }

    /* Greedy choices: the ranks' column slices in rank order, so the
     * first of equal maxima is the lowest id; 0 when no logit is above
     * -inf (the sampler's greedy rule). */
    for (int i = 0, o = 0; i < n; o += items[i].all_logits ? items[i].n_tokens : 1, i++) {
        if (!items[i].argmax) continue;
        float best = -INFINITY;
        int32_t tok = 0;
        for (int r = 0; r < m->tp; r++) {
            const v4_rank *R = &m->ranks[r];
            if (R->amax_val[o] > best) best = R->amax_val[o], tok = R->amax_idx[o];
        }
        *items[i].argmax = tok;
    }
    for (int i = 0; i < n; i++) items[i].seq->c.len += items[i].n_tokens;
    prefix_after_step(m, items, n);
out:
    free(segs);
    free(ids);
    free(pos);
    free(out_tok);
    return rc;
}

int v4_step(v4_model *m, v4_step_item *items, int n_items, strbuf *err)
{
    pthread_mutex_lock(&m->mu);
    int rc = step_locked(m, items, n_items, err);
    pthread_mutex_unlock(&m->mu);
    return rc;
}
