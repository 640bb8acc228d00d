/* The serving runner ("model"): what turns a canonical request into events.
 *
 *   prepare   queue the request for the prep thread, which parses it,
 *             renders the chat prompt (chat_render) and encodes it with
 *             special tokens only where the template wrote them
 *             (tok_encode_marked); poll then checks the context limit and
 *             sets sampling on the main thread
 *   admit     reserve the sequence's cache blocks (prompt + budget)
 *   step      one v4_step over the batch: decoding sequences feed their last
 *             token, prefilling ones a chunk (max_num_batched_tokens in all);
 *             then sample, detokenize, match stop strings, parse (reasoning,
 *             content, DSML tool calls) and emit events
 *
 * Kinds: chat and responses (nginx converts Responses input to chat
 * messages) go through the chat format and output parser; completions take
 * a prompt string or ids and emit raw text; tokenize and detokenize answer
 * as soon as the prep thread has their result (nothing is generated); a
 * probe is a one-token greedy chat generation. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

#include "chat_encode.h"
#include "chat_render.h"
#include "constraint.h"
#include "fingerprint.h"
#include "ipc/llm_request.h"
#include "json.h"
#include "model.h"
#include "output_parser.h"
#include "runner.h"
#include "sampler.h"
#include "stop_match.h"
#include "token_mask.h"
#include "threadpool.h"
#include "tokenizer.h"

/* Cache room kept for probes (LLM_IPC_PROBE_SEATS): a probe is a short
 * chat prompt and one token; user sequences never take the last of it. */
#define PROBE_RESERVE_TOKENS 256

/* On a GPU a prefill step of a few hundred tokens costs about a read of
 * every weight (the experts' union is nearly all of them), so splitting a
 * prompt at its last block boundary for a prefix snapshot adds about a
 * step to its TTFT (run D2: TTFT p50 95 ms at c = 1 where a step takes
 * 42-46), while resuming there saves a later prompt only the positions
 * since the snapshot before it, about 15-25 us each on one H200: the mark
 * is taken only when they are at least this many (about a step's fixed
 * cost; run E2: TTFT p50 86.5 -> 71.3 ms at c = 1, the same as without
 * prefix caching).  The CPU, whose steps cost by the token, always takes
 * it.  LLM_PREFIX_MARK_MIN overrides it (comparisons). */
#define PREFIX_MARK_MIN_CUDA 2048

struct model_runner {
    const recipe *rc;
    v4_model     *model;
    tokenizer    *tok;
    int           vocab;          /* the model's (>= the tokenizer's) */
    int32_t       bos, eos;
    chat_options  chat_defaults;
    int64_t       blocks_total;
    int64_t       probe_blocks;   /* user sequences leave these free */
    int           max_batch;      /* max_num_seqs + LLM_IPC_PROBE_SEATS */
    int64_t       pc_queries, pc_query_tokens, pc_hits, pc_hit_tokens;  /* admitted */
    float        *logits;         /* [max_batch][vocab] (v4_logits_alloc) */
    bool          logits_pinned;
    float        *forked;         /* [2][vocab]: a prefill's logits, and a
                                   * copy a forked choice samples from */
    v4_step_item *items;
    /* sampling in parallel across a step's choices (sample_all) */
    threadpool   *pool;
    struct mchoice **owner;       /* [max_batch]: the step's items' choices */
    sample_result *sampled;       /* [max_batch] */
    bool         *presampled;     /* [max_batch]: sampled[i] holds item i's token */
    int32_t      *greedy;         /* [max_batch]: the step's argmax of items that take only it */
    uint64_t      rng;            /* tool call ids */
    token_trie   *trie;           /* constrained decoding; NULL: trie_err */
    char          trie_err[200];
    int32_t       think_end;      /* </think>, or -1 */
    /* compiled constraints by constraint_key, most recent first (prep
     * thread only; the caches themselves are shared and thread-safe) */
    struct cached_constraint { char *key; mask_cache *mc; } lru[8];
    /* background preparation */
    pthread_t       prep_tid;
    bool            prep_started, prep_stop;
    pthread_mutex_t prep_mu;
    pthread_cond_t  prep_cv;
    struct model_req    *prep_head;    /* jobs not yet taken */
    struct model_req    *pending;      /* sequences prepare() took, not yet finished */
    int             wake;         /* eventfd: a job is done */
    /* serving statistics (stats_step): the current window */
    struct step_stats {
        uint64_t  t0, last_end;         /* window start; end of the last step */
        long long steps, mixed, seqs;   /* steps, those with a prefill chunk, items */
        long long prompt, generated;    /* prompt tokens fed, tokens sampled */
        uint64_t  model_ns, mixed_ns, host_ns, gap_ns, gaps;
        long long captures, replays;    /* the model's graph counts at t0 */
    } st;
};

enum prep_state { PREP_QUEUED, PREP_RUNNING, PREP_DONE };

struct model_req {
    /* preparation (prep thread until prep == PREP_DONE) */
    llm_request      *seq;
    const char   *request;
    size_t        request_len;
    enum llm_ipc_kind kind;
    enum prep_state prep;
    struct model_req  *prep_next;      /* job queue */
    struct model_req  *pending_next;   /* prepared or not, not yet finished */
    yajl_val      req;
    uint32_t      err_status;     /* 0: 400 */
    char          err_param[128], err_msg[600];
    bool          ready;          /* prep_finish succeeded */
    strbuf        text;           /* detokenize: the answer */
    /* generation */
    tok_ids       prompt;
    bool          thinking;
    int           budget, min_tokens;
    bool          ignore_eos;
    int           top_logprobs;   /* -1: none */
    int           cached;         /* prompt tokens reused from the prefix cache */
    int           n;              /* choices */
    int           left;           /* choices still generating */
    struct mchoice *ch;           /* [n] */
    mask_cache   *mc;             /* constrained decoding: the grammar's shared
                                   * cache (prep thread); NULL: unconstrained */
    int32_t      *bias_id;        /* logit_bias, shared by the choices */
    float        *bias;
};

/* One of a request's n choices: its own cache, seed stream, stop matcher,
 * detokenizer and parser.  Choice 0 prefills the prompt; the others wait
 * and then copy its cache (v4_seq_fork) and sample their first token from
 * the same logits, so the prompt is computed once. */
struct mchoice {
    llm_request      *seq;
    struct model_req  *q;
    uint16_t      index;
    bool          done;
    int           fed;            /* prompt tokens already in the cache */
    int32_t       next;           /* sampled, not yet fed */
    bool          has_next;
    v4_seq       *vs;
    sampler      *smp;
    stop_matcher  stop;
    tok_stream    detok;
    output_parser *parser;        /* NULL for completions: raw text */
    bool          in_reasoning;
    int           generated, reasoning_tokens;
    enum llm_finish_reason parsed_finish;
    /* constrained decoding (constraint.h): the matcher over the request's
     * grammar (prep_finish); in thinking mode it starts after </think> */
    token_matcher *tm;
    uint64_t     *mask;
    bool          tm_wait;
    char          tail[8];        /* last bytes of reasoning, for </think> */
    strbuf        text;           /* scratch: decoded text of one token */
    strbuf        kept;           /* scratch: text past the stop matcher */
};

/* Threads sampling a step's choices (the caller included). */
#define SAMPLE_THREADS 8

/* Most choices one request may ask for (n); also at most max_num_seqs. */
#define MR_MAX_N LLM_IPC_MAX_CHOICES

/* ---- small helpers ----------------------------------------------------- */

static uint64_t next_rand(void *ctx)
{
    uint64_t *x = ctx;   /* xorshift64* */
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    return *x * 0x2545F4914F6CDD1DULL;
}

static void fail(llm_request *s, uint32_t status, const char *code, const char *param,
                 const char *msg)
{
    req_emit_error(s, status, code, param, "%s", msg);
    req_emit_finish(s, LLM_FINISH_ERROR);
}

static bool get_number(yajl_val req, const char *key, double *out)
{
    return json_number(json_get(req, key), out);
}

static bool get_int(yajl_val req, const char *key, long long *out)
{
    return json_int(json_get(req, key), out);
}

static void free_model_req(struct model_req *q)
{
    if (!q) return;
    yajl_tree_free(q->req);
    tok_ids_free(&q->prompt);
    sb_free(&q->text);
    for (int i = 0; q->ch && i < q->n; i++) {
        struct mchoice *c = &q->ch[i];
        sampler_free(c->smp);
        stop_free(&c->stop);
        if (c->parser) output_parser_free(c->parser);
        token_matcher_free(c->tm);
        free(c->mask);
        sb_free(&c->text);
        sb_free(&c->kept);
    }
    free(q->ch);
    mask_cache_unref(q->mc);   /* after the matchers over it */
    free(q->bias_id);
    free(q->bias);
    free(q);
}

/* ---- load -------------------------------------------------------------- */

static void mr_unload(void *self);
static void *prep_thread(void *arg);
static void stats_log(struct model_runner *R, uint64_t end);

/* Load progress, in the server log's form. */
static void load_log(void *user, const char *line)
{
    fprintf(stderr, "llm-engine[%s]: %s\n", (const char *)user, line);
}

/* An integer setting from the environment, for tests and comparisons
 * (unset: *v stays) */
static int env_count(const char *name, long lo, long hi, int *v, strbuf *err)
{
    const char *s = getenv(name);
    if (!s) return 0;
    char *end;
    long n = strtol(s, &end, 10);
    if (end == s || *end || n < lo || n > hi) {
        sb_printf(err, "%s=%s: expected %ld to %ld", name, s, lo, hi);
        return -1;
    }
    *v = (int)n;
    return 0;
}

static int mr_load(void **self, const recipe *rc, runner_capacity *cap, strbuf *err)
{
    struct model_runner *R = calloc(1, sizeof *R);
    if (!R) { sb_puts(err, "out of memory"); return -1; }
    R->rc = rc;
    R->max_batch = rc->max_num_seqs + LLM_IPC_PROBE_SEATS;
    pthread_mutex_init(&R->prep_mu, NULL);
    pthread_cond_init(&R->prep_cv, NULL);
    R->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (R->wake < 0) {
        sb_puts(err, "eventfd failed");
        mr_unload(R);
        return -1;
    }
    char terr[1024];
    R->tok = tok_load(rc->tokenizer_path, terr, sizeof terr);
    if (!R->tok) {
        sb_printf(err, "tokenizer: %s", terr);
        mr_unload(R);
        return -1;
    }
    int mark_min = rc->backend == BACKEND_CUDA ? PREFIX_MARK_MIN_CUDA : 0;
    if (env_count("LLM_PREFIX_MARK_MIN", 0, 1 << 30, &mark_min, err)) {
        mr_unload(R);
        return -1;
    }
    v4_options opt = {
        .tp = rc->tensor_parallel_size,
        .threads_per_rank = rc->cpu_threads,
        .max_seqs = R->max_batch,
        .cache_bytes = (size_t)rc->kv_cache_memory_bytes,
        .gpu_memory_utilization = rc->gpu_memory_utilization,
        .max_step_tokens = rc->max_num_batched_tokens,
        .cache_tokens = rc->kv_cache_memory_bytes ? 0
                        : (int64_t)rc->max_num_seqs * rc->max_model_len
                          + LLM_IPC_PROBE_SEATS * PROBE_RESERVE_TOKENS,
        .backend = backend_name(rc->backend),
        .kv_dtype = rc->kv_cache_dtype == KV_DTYPE_FP8 ? KV_FP8
                    : rc->kv_cache_dtype == KV_DTYPE_BF16 ? KV_BF16 : KV_F32,
        .modes = rc->modes,
        .log = load_log,
        .log_user = (void *)rc->name,
        .prefix_cache = rc->enable_prefix_caching,
        .prefix_mark_min_tokens = mark_min,
        .prefix_host_bytes = (size_t)(rc->kv_offloading_size * 1073741824.0),
        .prefix_disk_dir = rc->kv_offloading_filesystem ? rc->kv_offloading_path : NULL,
        .prefix_disk_bytes = (uint64_t)(rc->kv_offloading_filesystem_size * 1073741824.0),
    };
    strbuf merr;
    sb_init(&merr);
    if (v4_model_load(&R->model, rc->model_path, &opt, &merr)) {
        while (merr.len && merr.data[merr.len - 1] == '\n') merr.data[--merr.len] = 0;
        sb_printf(err, "model: %s", merr.data ? merr.data : "load failed");
        sb_free(&merr);
        mr_unload(R);
        return -1;
    }
    sb_free(&merr);
    const v4_config *cfg = v4_model_config(R->model);
    R->vocab = cfg->vocab_size;
    if (tok_vocab_size(R->tok) > R->vocab) {
        sb_printf(err, "tokenizer %s has %d ids but the model's vocab_size is %d",
                  rc->tokenizer_path, tok_vocab_size(R->tok), R->vocab);
        mr_unload(R);
        return -1;
    }
    R->bos = tok_bos_id(R->tok) >= 0 ? tok_bos_id(R->tok) : cfg->bos_id;
    R->eos = tok_eos_id(R->tok) >= 0 ? tok_eos_id(R->tok) : cfg->eos_id;
    recipe_chat_options(rc, &R->chat_defaults);
    R->logits = v4_logits_alloc(R->model, (size_t)R->max_batch * (size_t)R->vocab,
                                &R->logits_pinned);
    R->items = calloc((size_t)R->max_batch, sizeof *R->items);
    R->forked = malloc(2 * (size_t)R->vocab * sizeof *R->forked);
    R->owner = calloc((size_t)R->max_batch, sizeof *R->owner);
    R->sampled = calloc((size_t)R->max_batch, sizeof *R->sampled);
    R->presampled = calloc((size_t)R->max_batch, sizeof *R->presampled);
    R->greedy = calloc((size_t)R->max_batch, sizeof *R->greedy);
    /* A 64-sequence batch over a 129,280-token vocabulary is ~10 ms of
     * sampling a step on one core (issue 15's served TPOT); the batch's
     * choices sample in parallel, up to SAMPLE_THREADS at once, while the
     * GPU idles.  On the CPU backend the cores are the model's: its pool
     * spins between runs, and so would this one's. */
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int nsample = rc->backend != BACKEND_CUDA || ncpu < 1 ? 1
                  : ncpu < SAMPLE_THREADS ? (int)ncpu : SAMPLE_THREADS;
    if (env_count("LLM_SAMPLE_THREADS", 1, 64, &nsample, err)) {
        mr_unload(R);
        return -1;
    }
    R->pool = threadpool_new(nsample);
    if (!R->logits || !R->items || !R->forked || !R->owner || !R->sampled || !R->presampled || !R->greedy
        || !R->pool) {
        sb_puts(err, "out of memory");
        mr_unload(R);
        return -1;
    }
    if (getrandom(&R->rng, sizeof R->rng, 0) != sizeof R->rng || !R->rng) R->rng = 0x9e3779b97f4a7c15ULL;
    R->trie = token_trie_new(R->tok, R->vocab, R->trie_err, sizeof R->trie_err);
    R->think_end = tok_added_token_id(R->tok, "</think>");

    v4_cache_info ci;
    v4_cache_info_get(R->model, &ci);
    R->blocks_total = ci.blocks_total;
    R->probe_blocks = LLM_IPC_PROBE_SEATS * v4_blocks_for_tokens(R->model, PROBE_RESERVE_TOKENS);
    int tp = v4_model_tp(R->model);
    cap->kv_blocks_total = ci.blocks_total;
    cap->kv_capacity_tokens = ci.blocks_total * ci.block_tokens;
    cap->kv_capacity_bytes = (int64_t)tp * (ci.blocks_total * (int64_t)ci.block_bytes
                                            + (int64_t)ci.seqs_total * (int64_t)ci.state_bytes);
    backend_modes modes = v4_model_modes(R->model);
    recipe_fingerprint(rc, &modes, cap->fingerprint, sizeof cap->fingerprint);
    if (pthread_create(&R->prep_tid, NULL, prep_thread, R)) {
        sb_puts(err, "cannot start the tokenizer thread");
        mr_unload(R);
        return -1;
    }
    R->prep_started = true;
    *self = R;
    return 0;
}

static void mr_unload(void *self)
{
    struct model_runner *R = self;
    if (!R) return;
    if (R->prep_started) {
        pthread_mutex_lock(&R->prep_mu);
        R->prep_stop = true;
        pthread_cond_broadcast(&R->prep_cv);
        pthread_mutex_unlock(&R->prep_mu);
        pthread_join(R->prep_tid, NULL);
    }
    pthread_mutex_destroy(&R->prep_mu);
    pthread_cond_destroy(&R->prep_cv);
    if (R->wake > 0) close(R->wake);
    if (R->model && R->rc->log_stats_interval > 0)
        stats_log(R, llm_ipc_now_ns());     /* the last window */
    if (R->logits) v4_logits_free(R->model, R->logits, R->logits_pinned);
    if (R->model) v4_model_free(R->model);
    if (R->tok) tok_free(R->tok);
    for (size_t i = 0; i < sizeof R->lru / sizeof R->lru[0]; i++) {
        free(R->lru[i].key);
        mask_cache_unref(R->lru[i].mc);
    }
    token_trie_free(R->trie);
    free(R->items);
    free(R->forked);
    free(R->owner);
    free(R->sampled);
    free(R->presampled);
    free(R->greedy);
    threadpool_free(R->pool);
    free(R);
}

/* ---- prompts ----------------------------------------------------------- */

/* A completions/tokenize prompt: a string (BOS + text, added tokens
 * recognized, as HF's encode with add_special_tokens does for DeepSeek) or
 * an array of ids.  Returns NULL or an error message. */
static const char *encode_prompt(struct model_runner *R, yajl_val req, tok_ids *out,
                                 const char **param)
{
    yajl_val p = json_get(req, "prompt");
    *param = "prompt";
    bool add_special = true;
    json_bool(json_get(req, "add_special_tokens"), &add_special);
    if (p && YAJL_IS_STRING(p)) {
        if (add_special && R->bos >= 0) tok_ids_push(out, R->bos);
        int rc = tok_encode(R->tok, p->u.string, strlen(p->u.string), true, out);
        return rc == TOK_OK ? NULL : tok_strerror(rc);
    }
    if (p && YAJL_IS_ARRAY(p)) {
        for (size_t i = 0; i < p->u.array.len; i++) {
            long long id;
            if (!json_int(p->u.array.values[i], &id) || id < 0 || id >= R->vocab)
                return "prompt: token ids must be integers in [0, vocab_size)";
            tok_ids_push(out, (int32_t)id);
        }
        return NULL;
    }
    return "prompt: expected a string or an array of token ids";
}

/* Render and encode a chat request (messages + chat fields). */
static int chat_tokens(struct model_runner *R, yajl_val req, tok_ids *out, bool *thinking,
                       chat_error *cerr)
{
    chat_prompt p;
    chat_prompt_init(&p);
    if (chat_render_request(req, &R->chat_defaults, &p, cerr)) {
        chat_prompt_free(&p);
        return -1;
    }
    static const char open[] = "<think>";
    *thinking = p.text.len >= sizeof open - 1
                && !memcmp(p.text.data + p.text.len - (sizeof open - 1), open, sizeof open - 1);
    int rc = chat_prompt_encode(R->tok, &p, out);
    chat_prompt_free(&p);
    if (rc != TOK_OK) {
        chat_fail(cerr, "messages", "cannot tokenize the prompt: %s", tok_strerror(rc));
        return -1;
    }
    return 0;
}

/* The prompt fingerprint's first 8 bytes (the protocol's prompt_info
 * carries 64 bits; the full SHA-256 hex is prompt_fingerprint_ids of the
 * same ids, which /tokenize returns). */
static uint64_t fingerprint64(const tok_ids *ids)
{
    prompt_fingerprint fp;
    prompt_fingerprint_ids(ids->data, ids->len, &fp);
    char head[17];
    memcpy(head, fp.hex, 16);
    head[16] = 0;
    return strtoull(head, NULL, 16);
}

/* tokenize / detokenize, on the prep thread: the answer (ids in
 * q->prompt, or text in q->text) or the error in q->err_*. */
static void answer_job(struct model_runner *R, struct model_req *q)
{
    yajl_val req = q->req;
    if (q->kind == LLM_KIND_DETOKENIZE) {
        snprintf(q->err_param, sizeof q->err_param, "tokens");
        yajl_val t = json_get(req, "tokens");
        if (!t || !YAJL_IS_ARRAY(t)) {
            snprintf(q->err_msg, sizeof q->err_msg, "tokens: expected an array of ids");
            return;
        }
        int32_t *ids = malloc((t->u.array.len + 1) * sizeof *ids);
        if (!ids) {
            q->err_status = 503;
            snprintf(q->err_msg, sizeof q->err_msg, "engine out of memory");
            return;
        }
        for (size_t i = 0; i < t->u.array.len; i++) {
            long long v;
            if (!json_int(t->u.array.values[i], &v) || v < 0 || v > INT32_MAX) v = -1;
            ids[i] = (int32_t)v;
        }
        size_t bad = 0;
        if (tok_decode(R->tok, ids, t->u.array.len, false, &q->text, &bad))
            snprintf(q->err_msg, sizeof q->err_msg, "tokens[%zu]: not a token id of this model",
                     bad);
        free(ids);
        return;
    }
    if (json_get(req, "messages")) {
        chat_error cerr;
        bool thinking;
        if (chat_tokens(R, req, &q->prompt, &thinking, &cerr)) {
            snprintf(q->err_param, sizeof q->err_param, "%s", cerr.param);
            snprintf(q->err_msg, sizeof q->err_msg, "%s", cerr.message);
        }
        return;
    }
    const char *param, *e = encode_prompt(R, req, &q->prompt, &param);
    snprintf(q->err_param, sizeof q->err_param, "%s", param);
    if (e) snprintf(q->err_msg, sizeof q->err_msg, "%s", e);
}

/* tokenize / detokenize, on the main thread: emit what answer_job made. */
static void answer_emit(llm_request *s)
{
    struct model_req *q = s->state;
    if (s->kind == LLM_KIND_DETOKENIZE) {
        req_emit_text(s, LLM_EV_CONTENT_DELTA, q->text.data ? q->text.data : "", q->text.len);
        req_emit_finish(s, LLM_FINISH_STOP);
        return;
    }
    s->prompt_tokens = (int)q->prompt.len;
    req_emit_prompt_info(s, (uint32_t)q->prompt.len, 0, fingerprint64(&q->prompt));
    /* token ids are non-negative int32: the same bits as uint32 */
    req_emit_tokens(s, (const uint32_t *)q->prompt.data, q->prompt.len);
    req_emit_finish(s, LLM_FINISH_STOP);
}

/* Sampling fields: recipe defaults (override_generation_config), then the
 * request's. */
static void sampling_from(const recipe *rc, yajl_val req, sampling_params *p)
{
    sampling_params_default(p);
    p->temperature = (float)rc->temperature;
    p->top_p = (float)rc->top_p;
    p->top_k = rc->top_k;
    p->min_p = (float)rc->min_p;
    p->presence_penalty = (float)rc->presence_penalty;
    p->frequency_penalty = (float)rc->frequency_penalty;
    p->repetition_penalty = (float)rc->repetition_penalty;
    double d;
    long long v;
    if (get_number(req, "temperature", &d)) p->temperature = (float)d;
    if (get_number(req, "top_p", &d)) p->top_p = (float)d;
    if (get_int(req, "top_k", &v)) p->top_k = (int)v;
    if (get_number(req, "min_p", &d)) p->min_p = (float)d;
    if (get_number(req, "presence_penalty", &d)) p->presence_penalty = (float)d;
    if (get_number(req, "frequency_penalty", &d)) p->frequency_penalty = (float)d;
    if (get_number(req, "repetition_penalty", &d)) p->repetition_penalty = (float)d;
    if (get_int(req, "seed", &v)) { p->has_seed = true; p->seed = (uint64_t)v; }
    bool lp = false;
    if (json_bool(json_get(req, "logprobs"), &lp) && lp) p->top_logprobs = 0;
    if (get_int(req, "logprobs", &v) && v >= 0) p->top_logprobs = (int)v;  /* completions */
    if (get_int(req, "top_logprobs", &v) && v >= 0 && p->top_logprobs >= 0) p->top_logprobs = (int)v;
    if (p->top_logprobs > LLM_REQ_TOP_LOGPROBS_MAX) p->top_logprobs = LLM_REQ_TOP_LOGPROBS_MAX;
}

/* The canonical request is nginx's validated form (llm_request.h); one
 * from another client outside its limits is refused: the field, or NULL. */
static const char *limits_bad(yajl_val req)
{
    static const struct { const char *name; bool integer, min_open; double min, max; } f[] = {
#define ROW(name, integer, min_open, min, max) { #name, integer, min_open, min, max },
        LLM_REQ_SAMPLING(ROW)
#undef ROW
    };
    double d;
    long long n;
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        yajl_val v = json_get(req, f[i].name);
        if (!v || YAJL_IS_NULL(v)) continue;
        bool num = f[i].integer ? json_int(v, &n) && (d = (double)n, true) : json_number(v, &d);
        if (!num || d < f[i].min || d > f[i].max || (f[i].min_open && d == f[i].min))
            return f[i].name;
    }
    yajl_val top = json_get(req, "top_logprobs");
    if (top && !YAJL_IS_NULL(top)
        && (!json_int(top, &n) || n < 0 || n > LLM_REQ_TOP_LOGPROBS_MAX))
        return "top_logprobs";
    yajl_val lp = json_get(req, "logprobs");                /* completions: a count */
    if (lp && YAJL_IS_NUMBER(lp)
        && (!json_int(lp, &n) || n < 0 || n > LLM_REQ_COMPLETION_LOGPROBS_MAX))
        return "logprobs";
    yajl_val st = json_get(req, "stop");
    if (st && YAJL_IS_ARRAY(st) && st->u.array.len > LLM_REQ_STOP_MAX) return "stop";
    return NULL;
}

static void parser_event(void *ctx, const parse_event *ev);

/* The compiled constraint of a request (prep thread): from the cache of
 * recent ones, else compiled, its token masks prewarmed, and cached.
 * Returns -1 with err set for a schema the grammar compiler refuses. */
static int constrain(struct model_runner *R, struct model_req *q, schema_error *err)
{
    char *key = constraint_key(q->req);
    if (!key) return 0;
    size_t n = sizeof R->lru / sizeof R->lru[0], i = 0;
    while (i < n && !(R->lru[i].key && !strcmp(R->lru[i].key, key))) i++;
    if (i == n) {
        grammar *g;
        if (constraint_from_request(q->req, R->trie, &g, err)) {
            free(key);
            return -1;
        }
        i = n - 1;   /* evict the oldest */
        free(R->lru[i].key);
        mask_cache_unref(R->lru[i].mc);
        R->lru[i].key = key;
        R->lru[i].mc = mask_cache_new(R->trie, g);
        mask_cache_prewarm(R->lru[i].mc, 4096);
    } else {
        free(key);
    }
    struct cached_constraint hit = R->lru[i];   /* move to the front */
    memmove(&R->lru[1], &R->lru[0], i * sizeof R->lru[0]);
    R->lru[0] = hit;
    q->mc = mask_cache_ref(hit.mc);
    return 0;
}

/* Background half of preparation (the prep thread): parse, render and
 * tokenize.  Touches only the request, the tokenizer (read-only) and q. */
static void prep_job(struct model_runner *R, struct model_req *q)
{
    char perr[256];
    q->req = json_parse(q->request, q->request_len, perr, sizeof perr);
    if (!q->req || !YAJL_IS_OBJECT(q->req)) {
        /* nginx writes only valid objects: this came from another client */
        snprintf(q->err_msg, sizeof q->err_msg,
                 "the canonical request is not a JSON object of valid UTF-8: %s",
                 q->req ? "another JSON value" : perr);
        q->err_param[0] = 0;
        return;
    }
    if (q->kind == LLM_KIND_TOKENIZE || q->kind == LLM_KIND_DETOKENIZE) {
        answer_job(R, q);
        return;
    }
    snprintf(q->err_param, sizeof q->err_param, "messages");
    if (q->kind == LLM_KIND_COMPLETIONS) {
        const char *param, *e = encode_prompt(R, q->req, &q->prompt, &param);
        snprintf(q->err_param, sizeof q->err_param, "%s", param);
        if (e) snprintf(q->err_msg, sizeof q->err_msg, "%s", e);
        return;
    }
    chat_error cerr;
    yajl_val probe = NULL, use = q->req;
    if (q->kind == LLM_KIND_PROBE && !json_get(q->req, "messages")) {
        char e2[64];
        static const char ping[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"ping\"}]}";
        probe = json_parse(ping, sizeof ping - 1, e2, sizeof e2);
        use = probe;
    }
    schema_error serr;
    if (chat_tokens(R, use, &q->prompt, &q->thinking, &cerr)) {
        snprintf(q->err_param, sizeof q->err_param, "%s", cerr.param);
        snprintf(q->err_msg, sizeof q->err_msg, "%s", cerr.message);
    } else if (!probe && R->trie && constrain(R, q, &serr)) {
        snprintf(q->err_param, sizeof q->err_param, "%.127s", serr.path);
        snprintf(q->err_msg, sizeof q->err_msg, "%s", serr.message);
    }
    yajl_tree_free(probe);
}

static void *prep_thread(void *arg)
{
    struct model_runner *R = arg;
    pthread_mutex_lock(&R->prep_mu);
    for (;;) {
        while (!R->prep_head && !R->prep_stop) pthread_cond_wait(&R->prep_cv, &R->prep_mu);
        if (R->prep_stop) break;
        struct model_req *q = R->prep_head;
        R->prep_head = q->prep_next;
        q->prep = PREP_RUNNING;
        pthread_mutex_unlock(&R->prep_mu);
        prep_job(R, q);
        pthread_mutex_lock(&R->prep_mu);
        q->prep = PREP_DONE;
        pthread_cond_broadcast(&R->prep_cv);
        uint64_t one = 1;
        if (write(R->wake, &one, sizeof one) < 0) { /* counter full: already readable */ }
    }
    pthread_mutex_unlock(&R->prep_mu);
    return NULL;
}

/* logit_bias: {"id": bias}, ids of this vocabulary, biases in [-100, 100]
 * (the module checked the shape).  Emits the error and returns -1. */
static int load_logit_bias(struct model_runner *R, llm_request *s, yajl_val req,
                           sampling_params *sp)
{
    struct model_req *q = s->state;
    yajl_val lb = json_get(req, "logit_bias");
    if (!lb || !YAJL_IS_OBJECT(lb) || !lb->u.object.len) return 0;
    size_t n = lb->u.object.len, m = 0;
    q->bias_id = malloc(n * sizeof *q->bias_id);
    q->bias = malloc(n * sizeof *q->bias);
    if (!q->bias_id || !q->bias) {
        fail(s, 503, "engine_out_of_memory", NULL, "engine out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        const char *k = lb->u.object.keys[i];
        char *end, msg[200];
        long long id = strtoll(k, &end, 10);
        double b;
        size_t len;
        if (!*k || *end || id < 0 || id >= R->vocab || !tok_id_bytes(R->tok, (int32_t)id, &len)) {
            snprintf(msg, sizeof msg, "logit_bias: token id '%.40s' is not in the vocabulary "
                     "(ids 0 to %d)", k, tok_vocab_size(R->tok) - 1);
            fail(s, 400, "invalid_request_error", "logit_bias", msg);
            return -1;
        }
        if (!json_number(lb->u.object.values[i], &b) || !(b >= -100 && b <= 100)) {
            snprintf(msg, sizeof msg, "logit_bias: the bias of token %lld must be a number "
                     "from -100 to 100", id);
            fail(s, 400, "invalid_request_error", "logit_bias", msg);
            return -1;
        }
        size_t j = 0;   /* a repeated id: the last bias wins */
        while (j < m && q->bias_id[j] != (int32_t)id) j++;
        q->bias_id[j] = (int32_t)id;
        q->bias[j] = (float)b;
        if (j == m) m++;
    }
    sp->bias_id = q->bias_id;
    sp->bias = q->bias;
    sp->n_bias = (int)m;
    return 0;
}

/* The matchers of a constrained request (one per choice), once the budget
 * and the choices are known: the budget must hold the shortest complete
 * reply (and </think> in thinking mode), so the reply is never cut.
 * Emits the error and returns -1. */
static int start_constraint(struct model_runner *R, llm_request *s)
{
    struct model_req *q = s->state;
    if (!q->mc) {
        char *key = R->trie || !q->req ? NULL : constraint_key(q->req);
        if (key) {
            char msg[300];
            snprintf(msg, sizeof msg, "constrained decoding is unavailable: %s", R->trie_err);
            fail(s, 400, "invalid_request_error", "response_format", msg);
            free(key);
            return -1;
        }
        return 0;
    }
    bool wait = q->thinking && R->think_end >= 0;
    int need = grammar_min_len(mask_cache_grammar(q->mc)) + 1 + (wait ? 1 : 0);
    if (q->budget < need) {
        char msg[300];
        snprintf(msg, sizeof msg, "max_tokens: %d tokens cannot hold the shortest reply the "
                 "requested format allows; allow at least %d", q->budget, need);
        fail(s, 400, "invalid_request_error", "max_tokens", msg);
        return -1;
    }
    for (int i = 0; i < q->n; i++) {
        struct mchoice *c = &q->ch[i];
        c->tm_wait = wait;
        c->tm = token_matcher_shared(q->mc, R->eos);
        c->mask = malloc(token_mask_words(R->trie) * sizeof *c->mask);
        if (!c->tm || !c->mask) {
            fail(s, 503, "engine_out_of_memory", NULL, "engine out of memory");
            return -1;
        }
    }
    return 0;
}

/* The allowed tokens of this step, or NULL when unconstrained.  While
 * reasoning, everything, unless the budget has just room for </think> and
 * the shortest reply. */
static const uint64_t *step_mask(struct model_runner *R, struct mchoice *q)
{
    if (!q->tm) return NULL;
    int left = q->q->budget - q->generated;
    if (!q->tm_wait) {
        token_matcher_mask(q->tm, left, q->mask);
        return q->mask;
    }
    if (left > token_matcher_min(q->tm) + 2) return NULL;
    memset(q->mask, 0, token_mask_words(R->trie) * sizeof *q->mask);
    q->mask[R->think_end >> 6] |= 1ULL << (R->think_end & 63);
    return q->mask;
}

/* Advance the matcher by the sampled token; -1 when it was not allowed
 * (only possible when every logit was -inf or NaN). */
static int step_accept(struct model_runner *R, struct mchoice *q, int32_t token)
{
    if (!q->tm) return 0;
    if (!q->tm_wait) return token_matcher_accept(q->tm, token);
    size_t len, k = sizeof q->tail;
    const char *b = tok_id_bytes(R->tok, token, &len);
    for (size_t i = 0; b && i < len; i++) {   /* shift the bytes in */
        memmove(q->tail, q->tail + 1, k - 1);
        q->tail[k - 1] = b[i];
    }
    if (!memcmp(q->tail, "</think>", 8)) q->tm_wait = false;
    return 0;
}

/* Main-thread half, once the job is done: limits, sampling, output path.
 * Emits error + finish and returns -1 when the request cannot run. */
static int prep_finish(struct model_runner *R, llm_request *s)
{
    const recipe *rc = R->rc;
    struct model_req *q = s->state;
    yajl_val req = q->req;
    const char *param = q->err_param[0] ? q->err_param : NULL;
    if (q->err_msg[0]) {
        if (q->err_status) fail(s, q->err_status, "engine_out_of_memory", NULL, q->err_msg);
        else fail(s, 400, "invalid_request_error", param, q->err_msg);
        return -1;
    }
    if (s->kind == LLM_KIND_TOKENIZE || s->kind == LLM_KIND_DETOKENIZE) {
        answer_emit(s);
        return 0;
    }
    if (q->prompt.len == 0) {
        fail(s, 400, "invalid_request_error", param, "the prompt is empty");
        return -1;
    }
    int prompt = (int)q->prompt.len;
    s->prompt_tokens = prompt;

    /* completion budget and the context limit */
    long long max_tokens = -1, v;
    if (!get_int(req, "max_completion_tokens", &max_tokens)
        && !get_int(req, "max_tokens", &max_tokens))
        get_int(req, "max_output_tokens", &max_tokens);
    if (s->kind == LLM_KIND_PROBE) max_tokens = 1;
    long long n = 1;
    get_int(req, "n", &n);
    if (n < 1 || n > MR_MAX_N || n > rc->max_num_seqs) {
        char msg[160];
        snprintf(msg, sizeof msg, "n: must be 1 to %d (this engine runs at most %d "
                 "sequences at once)", MR_MAX_N < rc->max_num_seqs ? MR_MAX_N : rc->max_num_seqs,
                 rc->max_num_seqs);
        fail(s, 400, "invalid_request_error", "n", msg);
        return -1;
    }
    const char *what = s->kind == LLM_KIND_COMPLETIONS ? "prompt" : "messages";
    if (prompt >= rc->max_model_len || (max_tokens > 0 && prompt + max_tokens > rc->max_model_len)) {
        long long want = max_tokens > 0 ? max_tokens : 0;
        req_emit_error(s, 400, "context_length_exceeded", param,
                       "This model's maximum context length is %d tokens. However, you "
                       "requested %lld tokens (%d in the %s, %lld in the completion). "
                       "Please reduce the length of the %s or completion.",
                       rc->max_model_len, prompt + want, prompt, what, want, what);
        req_emit_finish(s, LLM_FINISH_ERROR);
        return -1;
    }
    int room = rc->max_model_len - prompt;
    q->budget = max_tokens > 0 ? (int)max_tokens : (rc->max_tokens < room ? rc->max_tokens : room);
    int64_t usable = R->blocks_total - (s->kind == LLM_KIND_PROBE ? 0 : R->probe_blocks);
    if (n * v4_blocks_for_tokens(R->model, prompt + q->budget) > usable) {
        req_emit_error(s, 400, "context_length_exceeded", param,
                       "The KV cache holds %lld blocks for requests; this request needs %lld "
                       "(%lld x (%d prompt + %d completion tokens)).  Reduce the prompt, "
                       "max_tokens or n.",
                       (long long)usable,
                       (long long)(n * v4_blocks_for_tokens(R->model, prompt + q->budget)),
                       n, prompt, q->budget);
        req_emit_finish(s, LLM_FINISH_ERROR);
        return -1;
    }

    const char *bad = limits_bad(req);
    if (bad) {
        req_emit_error(s, 400, "invalid_request_error", bad,
                       "%s is outside the limits of the canonical request", bad);
        req_emit_finish(s, LLM_FINISH_ERROR);
        return -1;
    }
    sampling_params sp;
    sampling_from(rc, req, &sp);
    if (s->kind == LLM_KIND_PROBE) { sp.temperature = 0; sp.top_logprobs = -1; }
    if (load_logit_bias(R, s, req, &sp)) return -1;
    q->top_logprobs = sp.top_logprobs;
    if (get_int(req, "min_tokens", &v) && v > 0) q->min_tokens = (int)v;
    json_bool(json_get(req, "ignore_eos"), &q->ignore_eos);
    q->ch = calloc((size_t)n, sizeof *q->ch);
    if (!q->ch) {
        fail(s, 503, "engine_out_of_memory", NULL, "engine out of memory");
        return -1;
    }
    q->n = q->left = (int)n;
    s->width = (int)n;

    /* stop strings */
    const char *stops[LLM_REQ_STOP_MAX];
    int n_stops = 0;
    yajl_val st = json_get(req, "stop");
    if (st && YAJL_IS_STRING(st) && *st->u.string) stops[n_stops++] = st->u.string;
    for (size_t i = 0; st && YAJL_IS_ARRAY(st) && i < st->u.array.len && n_stops < LLM_REQ_STOP_MAX; i++) {
        const char *x = json_string(st->u.array.values[i]);
        if (x && *x) stops[n_stops++] = x;
    }

    /* vLLM's default: special tokens (BOS, EOS, ...) are not output text.
     * DeepSeek's </think> and DSML markers are added but not special, so
     * the output parser still sees them. */
    bool skip_special = true;
    json_bool(json_get(req, "skip_special_tokens"), &skip_special);

    /* each choice its own seed stream: seed + i with a seed, else random */
    for (int i = 0; i < q->n; i++) {
        struct mchoice *c = &q->ch[i];
        c->seq = s;
        c->q = q;
        c->index = (uint16_t)i;
        sb_init(&c->text);
        sb_init(&c->kept);
        sampling_params cp = sp;
        cp.seed = sp.seed + (uint64_t)i;
        c->smp = sampler_new(&cp, R->vocab, q->prompt.data, prompt);
        stop_init(&c->stop, stops, n_stops);
        tok_stream_init(&c->detok, R->tok, skip_special);
        if (s->kind != LLM_KIND_COMPLETIONS) {
            c->parser = output_parser_new(q->thinking, parser_event, c, next_rand, &R->rng);
            c->in_reasoning = q->thinking;
        }
        if (!c->smp || (s->kind != LLM_KIND_COMPLETIONS && !c->parser)) {
            fail(s, 503, "engine_out_of_memory", NULL, "engine out of memory");
            return -1;
        }
    }
    if (start_constraint(R, s)) return -1;
    yajl_tree_free(q->req);
    q->req = NULL;
    req_emit_prompt_info(s, (uint32_t)prompt, 0, fingerprint64(&q->prompt));
    q->ready = true;
    return 0;
}

/* Every request is parsed, rendered and tokenized on the prep thread, so
 * a long prompt never stalls the decode steps of running sequences; poll()
 * finishes it on the main thread (tokenize and detokenize answer there). */
static int mr_prepare(void *self, llm_request *s)
{
    struct model_runner *R = self;
    struct model_req *q = calloc(1, sizeof *q);
    if (!q) {
        fail(s, 503, "engine_out_of_memory", NULL, "engine out of memory");
        return -1;
    }
    q->request = s->request;
    q->request_len = s->request_len;
    q->kind = s->kind;
    q->seq = s;
    s->state = q;
    pthread_mutex_lock(&R->prep_mu);
    struct model_req **tail = &R->prep_head;
    while (*tail) tail = &(*tail)->prep_next;
    *tail = q;
    q->pending_next = R->pending;
    R->pending = q;
    pthread_cond_broadcast(&R->prep_cv);
    pthread_mutex_unlock(&R->prep_mu);
    return 0;
}

static int mr_wake_fd(void *self) { return ((struct model_runner *)self)->wake; }

/* Finish the sequences whose background preparation is done. */
static void mr_poll(void *self)
{
    struct model_runner *R = self;
    pthread_mutex_lock(&R->prep_mu);
    struct model_req *done = NULL;
    for (struct model_req **pp = &R->pending; *pp;) {
        struct model_req *q = *pp;
        if (q->prep == PREP_DONE) {
            *pp = q->pending_next;
            q->pending_next = done;
            done = q;
        } else {
            pp = &q->pending_next;
        }
    }
    pthread_mutex_unlock(&R->prep_mu);
    for (struct model_req *q = done, *next; q; q = next) {
        next = q->pending_next;
        q->pending_next = NULL;
        if (!q->seq->done) prep_finish(R, q->seq);
    }
}

static int mr_admit(void *self, llm_request *s)
{
    struct model_runner *R = self;
    struct model_req *q = s->state;
    if (!q || !q->ready) return 0;       /* still being tokenized */
    if (q->ch[0].vs) return 1;
    int64_t need = q->n * v4_blocks_for_tokens(R->model, s->prompt_tokens + q->budget);
    if (s->kind != LLM_KIND_PROBE) {
        v4_cache_info ci;
        v4_cache_info_get(R->model, &ci);
        if (ci.blocks_total - ci.blocks_used - need < R->probe_blocks) return 0;
    }
    strbuf err;
    sb_init(&err);
    int i;
    for (i = 0; i < q->n; i++) {
        v4_seq *vs = v4_seq_new(R->model, &err);
        /* choice 0 starts from the longest cached prefix (the others fork) */
        int64_t cached = vs && i == 0 ? v4_seq_prefix_attach(R->model, vs, q->prompt.data,
                                                             (int64_t)q->prompt.len) : 0;
        q->ch[i].fed = (int)cached;
        if (vs && v4_seq_reserve(R->model, vs, s->prompt_tokens + q->budget, &err)) {
            v4_seq_free(R->model, vs);
            vs = NULL;
        }
        if (!vs) break;
        q->ch[i].vs = vs;
    }
    sb_free(&err);
    if (i == q->n) {
        q->cached = q->ch[0].fed;
        R->pc_queries++;
        R->pc_query_tokens += (int64_t)q->prompt.len;
        R->pc_hits += q->cached > 0;
        R->pc_hit_tokens += q->cached;
        return 1;
    }
    /* wait until a running sequence gives blocks back: all or none */
    while (i-- > 0) {
        v4_seq_free(R->model, q->ch[i].vs);
        q->ch[i].vs = NULL;
    }
    return 0;
}

/* ---- output ------------------------------------------------------------ */

static void parser_event(void *ctx, const parse_event *ev)
{
    struct mchoice *q = ctx;
    llm_request *s = q->seq;
    s->choice = q->index;
    switch (ev->kind) {
    case PARSE_REASONING:
        req_emit_text(s, LLM_EV_REASONING_DELTA, ev->text, ev->len);
        break;
    case PARSE_CONTENT:
        q->in_reasoning = false;
        req_emit_text(s, LLM_EV_CONTENT_DELTA, ev->text, ev->len);
        break;
    case PARSE_TOOL_BEGIN:
        q->in_reasoning = false;
        req_emit_tool_begin(s, (uint32_t)ev->index, ev->id, ev->name);
        break;
    case PARSE_TOOL_ARGS:
        req_emit_tool_args(s, (uint32_t)ev->index, ev->text, ev->len);
        break;
    case PARSE_TOOL_END:
        req_emit_tool_end(s, (uint32_t)ev->index);
        break;
    case PARSE_FINISH:
        q->parsed_finish = ev->finish == FINISH_LENGTH ? LLM_FINISH_LENGTH
                         : ev->finish == FINISH_TOOL_CALLS ? LLM_FINISH_TOOL_CALLS
                         : LLM_FINISH_STOP;
        break;
    }
}

static void emit_text(struct mchoice *q, const char *text, size_t len)
{
    if (!len) return;
    q->seq->choice = q->index;
    if (q->parser) output_parser_feed(q->parser, text, len);
    else req_emit_text(q->seq, LLM_EV_CONTENT_DELTA, text, len);
}

/* Usage of the whole request: the prompt once, every choice's tokens. */
static void emit_usage(llm_request *s)
{
    struct model_req *q = s->state;
    llm_ipc_usage u = {
        .prompt_tokens = (uint32_t)s->prompt_tokens,
        .completion_tokens = 0,
        .reasoning_tokens = 0,
        .cached_tokens = q ? (uint32_t)q->cached : 0,
    };
    for (int i = 0; q && q->ch && i < q->n; i++) {
        u.completion_tokens += (uint32_t)q->ch[i].generated;
        u.reasoning_tokens += (uint32_t)q->ch[i].reasoning_tokens;
    }
    s->choice = 0;
    req_emit_usage(s, &u);
}

/* The end of a choice: release held text, close the parser; with n = 1
 * usage and finish, else the choice's own finish, and usage and the final
 * finish after the last one. */
static void finish(struct model_runner *R, struct mchoice *q, enum gen_stop why)
{
    llm_request *s = q->seq;
    sb_reset(&q->kept);
    if (!q->stop.matched) {
        sb_reset(&q->text);
        tok_stream_finish(&q->detok, &q->text);
        stop_feed(&q->stop, q->text.data ? q->text.data : "", q->text.len, &q->kept);
        stop_flush(&q->stop, &q->kept);
    }
    emit_text(q, q->kept.data, q->kept.len);
    enum llm_finish_reason r = why == GEN_LENGTH ? LLM_FINISH_LENGTH : LLM_FINISH_STOP;
    if (q->parser) {
        s->choice = q->index;
        output_parser_finish(q->parser, why);
        r = q->parsed_finish;
    }
    q->done = true;
    struct model_req *m = q->q;
    s->stop = q->stop.matched ? (uint32_t)q->stop.which + 1 : 0;
    if (m->n > 1) {
        s->choice = q->index;
        req_emit_choice_finish(s, r);
        v4_seq_free(R->model, q->vs);     /* its blocks serve others now */
        q->vs = NULL;
        r = LLM_FINISH_STOP;
        s->stop = 0;
    }
    if (--m->left > 0) return;
    emit_usage(s);
    req_emit_finish(s, r);
}

static void emit_logprob(struct model_runner *R, struct mchoice *q, const sample_result *sr)
{
    llm_request *s = q->seq;
    s->choice = q->index;
    size_t blen;
    const char *b = tok_id_bytes(R->tok, sr->token, &blen);
    const char *tb[LLM_REQ_TOP_LOGPROBS_MAX];
    size_t tl[LLM_REQ_TOP_LOGPROBS_MAX];
    for (int i = 0; i < sr->n_top; i++) {
        tb[i] = tok_id_bytes(R->tok, sr->top_token[i], &tl[i]);
        if (!tb[i]) { tb[i] = ""; tl[i] = 0; }
    }
    req_emit_logprob(s, (uint32_t)sr->token, sr->logprob, b ? b : "", b ? blen : 0,
                     (uint32_t)sr->n_top, sr->top_logprob, tb, tl);
}

/* The choice's next token from its logits (which it changes): the part of
 * taking a token that touches only the choice, so a batch samples in
 * parallel (sample_all). */
static void sample_token(struct model_runner *R, struct mchoice *q, float *logits,
                         sample_result *sr)
{
    struct model_req *m = q->q;
    const uint64_t *allow = step_mask(R, q);
    /* a complete constrained reply ends, whatever min_tokens says; one
     * still reasoning must go on to its reply */
    if (R->eos >= 0 && (((m->ignore_eos || q->generated < m->min_tokens)
                         && !(allow && q->tm && !q->tm_wait && token_matcher_done(q->tm)))
                        || (q->tm && q->tm_wait)))
        sampler_ban(logits, R->eos);
    sampler_sample_masked(q->smp, logits, allow, sr);
}

/* A decoding choice whose next token is the plain argmax of its logits
 * (greedy, no penalties, bias or logprobs, no constraint mask, EOS not
 * banned: sample_token would change nothing before choosing): the model
 * finds it where the logits are and copies no logits (v4_step_item's
 * argmax). */
static bool greedy_only(struct model_runner *R, struct mchoice *q)
{
    struct model_req *m = q->q;
    return sampler_greedy_only(q->smp) && !q->tm &&
           !(R->eos >= 0 && (m->ignore_eos || q->generated < m->min_tokens));
}

/* The sampled token into the choice: matcher, counts, detokenizer, stop
 * strings, events (in batch order, on the main thread). */
static void take_sampled(struct model_runner *R, struct mchoice *q, const sample_result *sr)
{
    struct model_req *m = q->q;
    if (step_accept(R, q, sr->token)) {
        for (int j = 0; j < m->n; j++) m->ch[j].done = true;
        fail(q->seq, 500, "internal_error", NULL, "constrained decoding: no token was "
             "allowed (the logits are not finite)");
        return;
    }
    q->generated++;
    if (q->in_reasoning) q->reasoning_tokens++;
    if (m->top_logprobs >= 0) emit_logprob(R, q, sr);
    if (sr->token == R->eos) { finish(R, q, GEN_STOP); return; }

    sb_reset(&q->text);
    sb_reset(&q->kept);
    tok_stream_push(&q->detok, sr->token, &q->text);
    bool stopped = stop_feed(&q->stop, q->text.data ? q->text.data : "", q->text.len, &q->kept);
    emit_text(q, q->kept.data, q->kept.len);
    sb_reset(&q->kept);
    if (stopped) { finish(R, q, GEN_STOP); return; }
    if (q->generated >= m->budget) { finish(R, q, GEN_LENGTH); return; }
    q->next = sr->token;
    q->has_next = true;
}

/* Sample the next token from logits and push it through detokenizer, stop
 * matcher and parser; ends the sequence when it should. */
static void take_token(struct model_runner *R, struct mchoice *q, float *logits)
{
    sample_result sr;
    sample_token(R, q, logits, &sr);
    take_sampled(R, q, &sr);
}

/* ---- serving statistics ------------------------------------------------ */

/* One line on the window's steps: where a step's time went.  The gaps
 * between steps are the server loop's (requests, connections, admission);
 * a pause of 50 ms or more is idle time and not counted. */
static void stats_log(struct model_runner *R, uint64_t end)
{
    struct step_stats *w = &R->st;
    if (!w->steps) return;
    long long cap = 0, rep = 0;
    v4_model_graph_counts(R->model, &cap, &rep);
    double s = (double)(end - w->t0) * 1e-9, ms = 1e-6;
    long long dec = w->steps - w->mixed;
    fprintf(stderr, "llm-engine[%s]: stats over %.1f s: %lld steps, %.1f sequences a step, "
            "%lld with a prefill chunk; prompt %.0f tok/s (%lld), generated %.0f tok/s (%lld); "
            "a step: model %.2f ms (decode only %.2f, with prefill %.2f), sampling and output "
            "%.2f ms, between steps %.2f ms; CUDA graphs %lld replays, %lld captures\n",
            R->rc->name, s, w->steps, (double)w->seqs / (double)w->steps, w->mixed,
            (double)w->prompt / s, w->prompt, (double)w->generated / s, w->generated,
            (double)w->model_ns * ms / (double)w->steps,
            dec ? (double)(w->model_ns - w->mixed_ns) * ms / (double)dec : 0.0,
            w->mixed ? (double)w->mixed_ns * ms / (double)w->mixed : 0.0,
            (double)w->host_ns * ms / (double)w->steps,
            w->gaps ? (double)w->gap_ns * ms / (double)w->gaps : 0.0,
            rep - w->replays, cap - w->captures);
    *w = (struct step_stats){ .last_end = w->last_end };
}

/* A step from t_start: items built until t_model, the forward pass until
 * t_host, sampling and output until now. */
static void stats_step(struct model_runner *R, uint64_t t_start, uint64_t t_model,
                       uint64_t t_host, int items, int prompt, int generated)
{
    struct step_stats *w = &R->st;
    uint64_t end = llm_ipc_now_ns();
    if (!w->steps) {
        w->t0 = t_start;
        v4_model_graph_counts(R->model, &w->captures, &w->replays);
    }
    if (w->last_end && t_start - w->last_end < 50000000ULL) {
        w->gap_ns += t_start - w->last_end;
        w->gaps++;
    }
    w->last_end = end;
    w->steps++;
    w->seqs += items;
    w->prompt += prompt;
    w->generated += generated;
    w->model_ns += t_host - t_model;
    if (prompt) {
        w->mixed++;
        w->mixed_ns += t_host - t_model;
    }
    w->host_ns += (t_model - t_start) + (end - t_host);
    double every = R->rc->log_stats_interval;
    if (every > 0 && (double)(end - w->t0) >= every * 1e9) stats_log(R, end);
}

static void sample_task(void *ctx, int i)
{
    struct model_runner *R = ctx;
    if (!R->presampled[i]) return;
    if (R->items[i].argmax) {   /* chosen where the logits are (greedy_only) */
        memset(&R->sampled[i], 0, sizeof R->sampled[i]);
        R->sampled[i].token = *R->items[i].argmax;
        sampler_record(R->owner[i]->smp, R->sampled[i].token);
        return;
    }
    sample_token(R, R->owner[i], R->items[i].logits, &R->sampled[i]);
}

/* Sample the token of every item whose choice takes one this step, in
 * parallel; not those whose prompt ends here with n > 1 (their logits are
 * copied for the other choices before choice 0 samples from them). */
static void sample_all(struct model_runner *R, int n_items)
{
    int k = 0;
    for (int i = 0; i < n_items; i++) {
        struct mchoice *q = R->owner[i];
        int len = (int)q->q->prompt.len;
        bool ends = q->fed == len || (q->fed + R->items[i].n_tokens >= len && q->q->n == 1);
        R->presampled[i] = ends;
        k += ends;
    }
    if (k) threadpool_run(R->pool, sample_task, R, n_items);
}

static int mr_step(void *self, llm_request **batch, int n, strbuf *err)
{
    struct model_runner *R = self;
    int budget = R->rc->max_num_batched_tokens, n_items = 0, prompt = 0;
    struct mchoice **owner = R->owner;
    uint64_t t_start = llm_ipc_now_ns();

    /* decoding choices first (one token each), then prefill chunks (choice
     * 0's: the others fork from it); the scheduler admits at most
     * max_num_seqs choices in all */
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < n; i++) {
            struct model_req *m = batch[i]->state;
            for (int j = 0; j < m->n && n_items < R->max_batch; j++) {
                struct mchoice *q = &m->ch[j];
                bool decoding = q->fed == (int)m->prompt.len;
                if (q->done || decoding != (pass == 0) || budget <= 0 || (j && !decoding))
                    continue;
                v4_step_item *it = &R->items[n_items];
                it->argmax = NULL;
                if (decoding) {
                    it->tokens = &q->next;
                    it->n_tokens = 1;
                    if (greedy_only(R, q)) it->argmax = &R->greedy[n_items];
                } else {
                    int left = (int)m->prompt.len - q->fed;
                    it->tokens = m->prompt.data + q->fed;
                    it->n_tokens = v4_seq_prefix_chunk(R->model, q->vs,
                                                       left < budget ? left : budget);
                    prompt += it->n_tokens;
                }
                budget -= it->n_tokens;
                it->seq = q->vs;
                it->logits = it->argmax ? NULL : R->logits + (size_t)n_items * (size_t)R->vocab;
                it->all_logits = false;
                owner[n_items++] = q;
            }
        }
    }
    if (!n_items) return 0;
    strbuf serr;
    sb_init(&serr);
    uint64_t t_model = llm_ipc_now_ns();
    int rc = v4_step(R->model, R->items, n_items, &serr);
    uint64_t t_host = llm_ipc_now_ns();
    if (rc) {
        while (serr.len && serr.data[serr.len - 1] == '\n') serr.data[--serr.len] = 0;
        if (rc != V4_STEP_NOMEM) {
            sb_puts(err, serr.data ? serr.data : "step failed");
            sb_free(&serr);
            return -1;
        }
        /* Out of memory for this step: its requests fail (their cache
         * state is undefined now), the engine and other requests go on. */
        for (int i = 0; i < n_items; i++)
            if (!owner[i]->seq->done)
                fail(owner[i]->seq, 503, "engine_out_of_memory", NULL, serr.data);
        sb_free(&serr);
        return 0;
    }
    sb_free(&serr);
    sample_all(R, n_items);

    int made = 0;
    for (int i = 0; i < n_items; i++) {
        struct mchoice *q = owner[i];
        struct model_req *m = q->q;
        int len = (int)m->prompt.len;
        bool prefilled = false;
        if (q->fed < len) {
            q->fed += R->items[i].n_tokens;
            if (q->fed < len) continue;   /* more prompt to go */
            prefilled = m->n > 1;
        }
        /* the prompt is in choice 0's cache: the others copy it before
         * choice 0 moves on (or ends and frees it) */
        for (int j = 1; prefilled && j < m->n; j++) {
            if (v4_seq_fork(R->model, m->ch[j].vs, q->vs, err)) return -1;
            m->ch[j].fed = len;
        }
        if (prefilled)
            memcpy(R->forked, R->items[i].logits, (size_t)R->vocab * sizeof *R->forked);
        q->has_next = false;
        if (R->presampled[i]) take_sampled(R, q, &R->sampled[i]);
        else take_token(R, q, R->items[i].logits);
        made++;
        for (int j = 1; prefilled && j < m->n; j++) {
            float *copy = R->forked + R->vocab;
            memcpy(copy, R->forked, (size_t)R->vocab * sizeof *copy);
            take_token(R, &m->ch[j], copy);
            made++;
        }
    }
    stats_step(R, t_start, t_model, t_host, n_items, prompt, made);
    return made;
}

static void mr_cancel(void *self, llm_request *s)
{
    (void)self;
    if (s->done) return;
    emit_usage(s);
    req_emit_finish(s, LLM_FINISH_CANCELLED);
}

static void mr_release(void *self, llm_request *s)
{
    struct model_runner *R = self;
    struct model_req *q = s->state;
    if (q) {
        /* take it off the job queue and the pending list; a job in
         * progress is waited for (it reads the request) */
        pthread_mutex_lock(&R->prep_mu);
        for (struct model_req **pp = &R->prep_head; *pp; pp = &(*pp)->prep_next)
            if (*pp == q) { *pp = q->prep_next; q->prep = PREP_DONE; break; }
        while (q->prep == PREP_RUNNING) pthread_cond_wait(&R->prep_cv, &R->prep_mu);
        for (struct model_req **pp = &R->pending; *pp; pp = &(*pp)->pending_next)
            if (*pp == q) { *pp = q->pending_next; break; }
        pthread_mutex_unlock(&R->prep_mu);
    }
    for (int i = 0; q && q->ch && i < q->n; i++)
        if (q->ch[i].vs) v4_seq_free(R->model, q->ch[i].vs);
    free_model_req(q);
    s->state = NULL;
}

/* /admin/reset_prefix_cache: forget every cached prefix, say what went. */
static void mr_admin(void *self, llm_request *s)
{
    struct model_runner *R = self;
    char perr[128];
    yajl_val req = json_parse(s->request, s->request_len, perr, sizeof perr);
    const char *op = json_string(json_get(req, "op"));
    if (!op || strcmp(op, "reset_prefix_cache")) {
        char msg[160];
        snprintf(msg, sizeof msg, "unknown admin operation%s%.64s%s: the engine has "
                 "reset_prefix_cache", op ? " '" : "", op ? op : "", op ? "'" : "");
        fail(s, 400, "invalid_request_error", "op", msg);
    } else {
        v4_prefix_cleared c;
        v4_prefix_clear(R->model, &c);
        strbuf sb;
        sb_init(&sb);
        sb_printf(&sb, "{\"entries\":%lld,\"blocks\":%lld,\"host_entries\":%lld,"
                  "\"host_bytes\":%zu,\"disk_files\":%lld,\"disk_bytes\":%llu}",
                  (long long)c.entries, (long long)c.blocks, (long long)c.host_entries,
                  c.host_bytes, (long long)c.disk_files, (unsigned long long)c.disk_bytes);
        req_emit_text(s, LLM_EV_CONTENT_DELTA, sb.data, sb.len);
        req_emit_finish(s, LLM_FINISH_STOP);
        sb_free(&sb);
    }
    yajl_tree_free(req);
}

static void mr_stats(void *self, runner_stats *st)
{
    struct model_runner *R = self;
    v4_cache_info ci;
    v4_cache_info_get(R->model, &ci);
    st->kv_blocks_used = ci.blocks_used;
    int64_t left = ci.blocks_total - ci.blocks_used - R->probe_blocks;
    st->kv_blocks_free = left > 0 ? left : 0;
    st->prefix_cache_hits = R->pc_hit_tokens;
    st->prefix_cache_queries = R->pc_queries;
    st->prefix_cache_query_tokens = R->pc_query_tokens;
    st->prefix_cache_hit_queries = R->pc_hits;
    st->prefix_cache_blocks = ci.blocks_cached;
    v4_prefix_stats ps;
    v4_prefix_stats_get(R->model, &ps);
    st->prefix_cache_host_bytes = (int64_t)ps.host_bytes;
    st->prefix_cache_host_copies = (int64_t)(ps.spills + ps.fills);
}

const runner_ops runner_model = {
    .name = "model",
    .load = mr_load,
    .prepare = mr_prepare,
    .poll = mr_poll,
    .wake_fd = mr_wake_fd,
    .admit = mr_admit,
    .step = mr_step,
    .cancel = mr_cancel,
    .release = mr_release,
    .admin = mr_admin,
    .stats = mr_stats,
    .unload = mr_unload,
};
