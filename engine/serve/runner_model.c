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
 * at once; a probe is a one-token greedy chat generation. */
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
#include "fingerprint.h"
#include "json.h"
#include "model.h"
#include "output_parser.h"
#include "runner.h"
#include "sampler.h"
#include "sha256.h"
#include "stop_match.h"
#include "tokenizer.h"
#include "version.h"

struct model_runner {
    const recipe *rc;
    v4_model     *model;
    tokenizer    *tok;
    int           vocab;          /* the model's (>= the tokenizer's) */
    int32_t       bos, eos;
    chat_options  chat_defaults;
    int64_t       blocks_total;
    int64_t       pc_queries, pc_query_tokens, pc_hits, pc_hit_tokens;  /* admitted */
    float        *logits;         /* [max_num_seqs][vocab] */
    float        *forked;         /* [2][vocab]: a prefill's logits, and a
                                   * copy a forked choice samples from */
    v4_step_item *items;
    uint64_t      rng;            /* tool call ids */
    /* background preparation */
    pthread_t       prep_tid;
    bool            prep_started, prep_stop;
    pthread_mutex_t prep_mu;
    pthread_cond_t  prep_cv;
    struct mseq    *prep_head;    /* jobs not yet taken */
    struct mseq    *pending;      /* sequences prepare() took, not yet finished */
    int             wake;         /* eventfd: a job is done */
};

enum prep_state { PREP_QUEUED, PREP_RUNNING, PREP_DONE };

struct mseq {
    /* preparation (prep thread until prep == PREP_DONE) */
    llm_seq      *seq;
    const char   *request;
    size_t        request_len;
    enum llm_ipc_kind kind;
    enum prep_state prep;
    struct mseq  *prep_next;      /* job queue */
    struct mseq  *pending_next;   /* prepared or not, not yet finished */
    yajl_val      req;
    char          err_param[128], err_msg[600];
    bool          ready;          /* prep_finish succeeded */
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
};

/* One of a request's n choices: its own cache, seed stream, stop matcher,
 * detokenizer and parser.  Choice 0 prefills the prompt; the others wait
 * and then copy its cache (v4_seq_fork) and sample their first token from
 * the same logits, so the prompt is computed once. */
struct mchoice {
    llm_seq      *seq;
    struct mseq  *q;
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
    strbuf        text;           /* scratch: decoded text of one token */
    strbuf        kept;           /* scratch: text past the stop matcher */
};

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

static void fail(llm_seq *s, uint32_t status, const char *code, const char *param,
                 const char *msg)
{
    seq_emit_error(s, status, code, param, "%s", msg);
    seq_emit_finish(s, LLM_FINISH_ERROR);
}

static bool get_number(yajl_val req, const char *key, double *out)
{
    return json_number(json_get(req, key), out);
}

static bool get_int(yajl_val req, const char *key, long long *out)
{
    return json_int(json_get(req, key), out);
}

static void free_mseq(struct mseq *q)
{
    if (!q) return;
    yajl_tree_free(q->req);
    tok_ids_free(&q->prompt);
    for (int i = 0; q->ch && i < q->n; i++) {
        struct mchoice *c = &q->ch[i];
        sampler_free(c->smp);
        stop_free(&c->stop);
        if (c->parser) output_parser_free(c->parser);
        sb_free(&c->text);
        sb_free(&c->kept);
    }
    free(q->ch);
    free(q);
}

/* ---- load -------------------------------------------------------------- */

/* system_fingerprint: model config, tokenizer, chat format and the recipe
 * settings that change outputs. */
static void make_fingerprint(const recipe *rc, char out[LLM_IPC_FINGERPRINT])
{
    sha256_ctx h;
    sha256_init(&h);
    const char *files[2] = { NULL, rc->tokenizer_path };
    strbuf path, data;
    sb_init(&path);
    sb_init(&data);
    sb_printf(&path, "%s/config.json", rc->model_path);
    files[0] = path.data;
    for (int i = 0; i < 2; i++) {
        sb_reset(&data);
        if (sb_read_file(&data, files[i]) == 0) sha256_update(&h, data.data, data.len);
    }
    sb_reset(&data);
    sb_printf(&data, "dsv4-0731|%s|%d|%s|%s", LLM_ENGINE_VERSION, rc->max_model_len,
              kv_cache_dtype_name(rc->kv_cache_dtype), backend_name(rc->backend));
    sha256_update(&h, data.data, data.len);
    uint8_t d[32];
    sha256_final(&h, d);
    snprintf(out, LLM_IPC_FINGERPRINT, "fp_%02x%02x%02x%02x%02x", d[0], d[1], d[2], d[3], d[4]);
    sb_free(&path);
    sb_free(&data);
}

static void mr_unload(void *self);
static void *prep_thread(void *arg);

static int mr_load(void **self, const recipe *rc, runner_capacity *cap, strbuf *err)
{
    struct model_runner *R = calloc(1, sizeof *R);
    if (!R) { sb_puts(err, "out of memory"); return -1; }
    R->rc = rc;
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
    v4_options opt = {
        .tp = rc->tensor_parallel_size,
        .threads_per_rank = rc->cpu_threads,
        .max_seqs = rc->max_num_seqs,
        .cache_bytes = (size_t)rc->kv_cache_memory_bytes,
        .gpu_memory_utilization = rc->gpu_memory_utilization,
        .max_step_tokens = rc->max_num_batched_tokens,
        .cache_tokens = rc->kv_cache_memory_bytes ? 0
                        : (int64_t)rc->max_num_seqs * rc->max_model_len,
        .backend = backend_name(rc->backend),
        .kv_dtype = rc->kv_cache_dtype == KV_DTYPE_FP8 ? KV_FP8
                    : rc->kv_cache_dtype == KV_DTYPE_BF16 ? KV_BF16 : KV_F32,
        .prefix_cache = rc->enable_prefix_caching,
        .prefix_host_bytes = (size_t)(rc->kv_offloading_size * 1073741824.0),
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
    chat_options_from_recipe(&R->chat_defaults, rc);
    R->logits = malloc((size_t)rc->max_num_seqs * (size_t)R->vocab * sizeof *R->logits);
    R->items = calloc((size_t)rc->max_num_seqs, sizeof *R->items);
    R->forked = malloc(2 * (size_t)R->vocab * sizeof *R->forked);
    if (!R->logits || !R->items || !R->forked) {
        sb_puts(err, "out of memory");
        mr_unload(R);
        return -1;
    }
    if (getrandom(&R->rng, sizeof R->rng, 0) != sizeof R->rng || !R->rng) R->rng = 0x9e3779b97f4a7c15ULL;

    v4_cache_info ci;
    v4_cache_info_get(R->model, &ci);
    R->blocks_total = ci.blocks_total;
    int tp = v4_model_tp(R->model);
    cap->kv_blocks_total = ci.blocks_total;
    cap->kv_capacity_tokens = ci.blocks_total * ci.block_tokens;
    cap->kv_capacity_bytes = (int64_t)tp * (ci.blocks_total * (int64_t)ci.block_bytes
                                            + (int64_t)ci.seqs_total * (int64_t)ci.state_bytes);
    make_fingerprint(rc, cap->fingerprint);
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
    if (R->model) v4_model_free(R->model);
    if (R->tok) tok_free(R->tok);
    free(R->logits);
    free(R->items);
    free(R->forked);
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

/* tokenize / detokenize answer at prepare. */
static int answer_now(struct model_runner *R, llm_seq *s, yajl_val req)
{
    if (s->kind == LLM_KIND_DETOKENIZE) {
        yajl_val t = json_get(req, "tokens");
        if (!t || !YAJL_IS_ARRAY(t)) {
            fail(s, 400, "invalid_request_error", "tokens", "tokens: expected an array of ids");
            return -1;
        }
        int32_t *ids = malloc((t->u.array.len + 1) * sizeof *ids);
        for (size_t i = 0; i < t->u.array.len; i++) {
            long long v;
            if (!json_int(t->u.array.values[i], &v) || v < 0 || v > INT32_MAX) v = -1;
            ids[i] = (int32_t)v;
        }
        strbuf text;
        sb_init(&text);
        size_t bad = 0;
        if (tok_decode(R->tok, ids, t->u.array.len, false, &text, &bad)) {
            char msg[128];
            snprintf(msg, sizeof msg, "tokens[%zu]: not a token id of this model", bad);
            fail(s, 400, "invalid_request_error", "tokens", msg);
            free(ids);
            sb_free(&text);
            return -1;
        }
        seq_emit_text(s, LLM_EV_CONTENT_DELTA, text.data ? text.data : "", text.len);
        seq_emit_finish(s, LLM_FINISH_STOP);
        free(ids);
        sb_free(&text);
        return 0;
    }
    tok_ids ids = { 0 };
    if (json_get(req, "messages")) {
        chat_error cerr;
        bool thinking;
        if (chat_tokens(R, req, &ids, &thinking, &cerr)) {
            fail(s, 400, "invalid_request_error", cerr.param, cerr.message);
            tok_ids_free(&ids);
            return -1;
        }
    } else {
        const char *param, *e = encode_prompt(R, req, &ids, &param);
        if (e) {
            fail(s, 400, "invalid_request_error", param, e);
            tok_ids_free(&ids);
            return -1;
        }
    }
    s->prompt_tokens = (int)ids.len;
    seq_emit_prompt_info(s, (uint32_t)ids.len, 0, fingerprint64(&ids));
    uint32_t *u = malloc((ids.len + 1) * sizeof *u);
    for (size_t i = 0; i < ids.len; i++) u[i] = (uint32_t)ids.data[i];
    seq_emit_tokens(s, u, ids.len);
    seq_emit_finish(s, LLM_FINISH_STOP);
    free(u);
    tok_ids_free(&ids);
    return 0;
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
    if (p->top_logprobs > SAMPLER_MAX_TOP_LOGPROBS) p->top_logprobs = SAMPLER_MAX_TOP_LOGPROBS;
}

static void parser_event(void *ctx, const parse_event *ev);

/* Background half of preparation (the prep thread): parse, render and
 * tokenize.  Touches only the request, the tokenizer (read-only) and q. */
static void prep_job(struct model_runner *R, struct mseq *q)
{
    char perr[256];
    q->req = json_parse(q->request, q->request_len, perr, sizeof perr);
    if (!q->req || !YAJL_IS_OBJECT(q->req)) {
        snprintf(q->err_msg, sizeof q->err_msg, "request body is not a JSON object: %s",
                 q->req ? "another JSON value" : perr);
        q->err_param[0] = 0;
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
    if (chat_tokens(R, use, &q->prompt, &q->thinking, &cerr)) {
        snprintf(q->err_param, sizeof q->err_param, "%s", cerr.param);
        snprintf(q->err_msg, sizeof q->err_msg, "%s", cerr.message);
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
        struct mseq *q = R->prep_head;
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

/* Main-thread half, once the job is done: limits, sampling, output path.
 * Emits error + finish and returns -1 when the request cannot run. */
static int prep_finish(struct model_runner *R, llm_seq *s)
{
    const recipe *rc = R->rc;
    struct mseq *q = s->state;
    yajl_val req = q->req;
    const char *param = q->err_param[0] ? q->err_param : NULL;
    if (q->err_msg[0]) {
        fail(s, 400, "invalid_request_error", param, q->err_msg);
        return -1;
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
        seq_emit_error(s, 400, "context_length_exceeded", param,
                       "This model's maximum context length is %d tokens. However, you "
                       "requested %lld tokens (%d in the %s, %lld in the completion). "
                       "Please reduce the length of the %s or completion.",
                       rc->max_model_len, prompt + want, prompt, what, want, what);
        seq_emit_finish(s, LLM_FINISH_ERROR);
        return -1;
    }
    int room = rc->max_model_len - prompt;
    q->budget = max_tokens > 0 ? (int)max_tokens : (rc->max_tokens < room ? rc->max_tokens : room);
    if (n * v4_blocks_for_tokens(R->model, prompt + q->budget) > R->blocks_total) {
        seq_emit_error(s, 400, "context_length_exceeded", param,
                       "The KV cache holds %lld blocks; this request needs %lld "
                       "(%lld x (%d prompt + %d completion tokens)).  Reduce the prompt, "
                       "max_tokens or n.",
                       (long long)R->blocks_total,
                       (long long)(n * v4_blocks_for_tokens(R->model, prompt + q->budget)),
                       n, prompt, q->budget);
        seq_emit_finish(s, LLM_FINISH_ERROR);
        return -1;
    }

    sampling_params sp;
    sampling_from(rc, req, &sp);
    if (s->kind == LLM_KIND_PROBE) { sp.temperature = 0; sp.top_logprobs = -1; }
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
    const char *stops[STOP_MAX];
    int n_stops = 0;
    yajl_val st = json_get(req, "stop");
    if (st && YAJL_IS_STRING(st) && *st->u.string) stops[n_stops++] = st->u.string;
    for (size_t i = 0; st && YAJL_IS_ARRAY(st) && i < st->u.array.len && n_stops < STOP_MAX; i++) {
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
    yajl_tree_free(q->req);
    q->req = NULL;
    seq_emit_prompt_info(s, (uint32_t)prompt, 0, fingerprint64(&q->prompt));
    q->ready = true;
    return 0;
}

/* Generating requests are parsed, rendered and tokenized on the prep
 * thread, so a long prompt never stalls the decode steps of running
 * sequences; poll() finishes them on the main thread.  tokenize and
 * detokenize answer at once. */
static int mr_prepare(void *self, llm_seq *s)
{
    struct model_runner *R = self;
    if (s->kind == LLM_KIND_TOKENIZE || s->kind == LLM_KIND_DETOKENIZE) {
        char perr[256];
        yajl_val req = json_parse(s->request, s->request_len, perr, sizeof perr);
        int r;
        if (!req || !YAJL_IS_OBJECT(req)) {
            char msg[400];
            snprintf(msg, sizeof msg, "request body is not a JSON object: %s",
                     req ? "another JSON value" : perr);
            fail(s, 400, "invalid_request_error", NULL, msg);
            r = -1;
        } else {
            r = answer_now(R, s, req);
        }
        yajl_tree_free(req);
        return r;
    }
    struct mseq *q = calloc(1, sizeof *q);
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
    struct mseq **tail = &R->prep_head;
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
    struct mseq *done = NULL;
    for (struct mseq **pp = &R->pending; *pp;) {
        struct mseq *q = *pp;
        if (q->prep == PREP_DONE) {
            *pp = q->pending_next;
            q->pending_next = done;
            done = q;
        } else {
            pp = &q->pending_next;
        }
    }
    pthread_mutex_unlock(&R->prep_mu);
    for (struct mseq *q = done, *next; q; q = next) {
        next = q->pending_next;
        q->pending_next = NULL;
        if (!q->seq->done) prep_finish(R, q->seq);
    }
}

static int mr_admit(void *self, llm_seq *s)
{
    struct model_runner *R = self;
    struct mseq *q = s->state;
    if (!q || !q->ready) return 0;       /* still being tokenized */
    if (q->ch[0].vs) return 1;
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
    llm_seq *s = q->seq;
    s->choice = q->index;
    switch (ev->kind) {
    case PARSE_REASONING:
        seq_emit_text(s, LLM_EV_REASONING_DELTA, ev->text, ev->len);
        break;
    case PARSE_CONTENT:
        q->in_reasoning = false;
        seq_emit_text(s, LLM_EV_CONTENT_DELTA, ev->text, ev->len);
        break;
    case PARSE_TOOL_BEGIN:
        q->in_reasoning = false;
        seq_emit_tool_begin(s, (uint32_t)ev->index, ev->id, ev->name);
        break;
    case PARSE_TOOL_ARGS:
        seq_emit_tool_args(s, (uint32_t)ev->index, ev->text, ev->len);
        break;
    case PARSE_TOOL_END:
        seq_emit_tool_end(s, (uint32_t)ev->index);
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
    else seq_emit_text(q->seq, LLM_EV_CONTENT_DELTA, text, len);
}

/* Usage of the whole request: the prompt once, every choice's tokens. */
static void emit_usage(llm_seq *s)
{
    struct mseq *q = s->state;
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
    seq_emit_usage(s, &u);
}

/* The end of a choice: release held text, close the parser; with n = 1
 * usage and finish, else the choice's own finish, and usage and the final
 * finish after the last one. */
static void finish(struct model_runner *R, struct mchoice *q, enum gen_stop why)
{
    llm_seq *s = q->seq;
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
    struct mseq *m = q->q;
    s->stop = q->stop.matched ? (uint32_t)q->stop.which + 1 : 0;
    if (m->n > 1) {
        s->choice = q->index;
        seq_emit_choice_finish(s, r);
        v4_seq_free(R->model, q->vs);     /* its blocks serve others now */
        q->vs = NULL;
        r = LLM_FINISH_STOP;
        s->stop = 0;
    }
    if (--m->left > 0) return;
    emit_usage(s);
    seq_emit_finish(s, r);
}

static void emit_logprob(struct model_runner *R, struct mchoice *q, const sample_result *sr)
{
    llm_seq *s = q->seq;
    s->choice = q->index;
    size_t blen;
    const char *b = tok_id_bytes(R->tok, sr->token, &blen);
    const char *tb[SAMPLER_MAX_TOP_LOGPROBS];
    size_t tl[SAMPLER_MAX_TOP_LOGPROBS];
    for (int i = 0; i < sr->n_top; i++) {
        tb[i] = tok_id_bytes(R->tok, sr->top_token[i], &tl[i]);
        if (!tb[i]) { tb[i] = ""; tl[i] = 0; }
    }
    seq_emit_logprob(s, (uint32_t)sr->token, sr->logprob, b ? b : "", b ? blen : 0,
                     (uint32_t)sr->n_top, sr->top_logprob, tb, tl);
}

/* Sample the next token from logits and push it through detokenizer, stop
 * matcher and parser; ends the sequence when it should. */
static void take_token(struct model_runner *R, struct mchoice *q, float *logits)
{
    struct mseq *m = q->q;
    if (R->eos >= 0 && (m->ignore_eos || q->generated < m->min_tokens))
        sampler_ban(logits, R->eos);
    sample_result sr;
    sampler_sample(q->smp, logits, &sr);
    q->generated++;
    if (q->in_reasoning) q->reasoning_tokens++;
    if (m->top_logprobs >= 0) emit_logprob(R, q, &sr);
    if (sr.token == R->eos) { finish(R, q, GEN_STOP); return; }

    sb_reset(&q->text);
    sb_reset(&q->kept);
    tok_stream_push(&q->detok, sr.token, &q->text);
    bool stopped = stop_feed(&q->stop, q->text.data ? q->text.data : "", q->text.len, &q->kept);
    emit_text(q, q->kept.data, q->kept.len);
    sb_reset(&q->kept);
    if (stopped) { finish(R, q, GEN_STOP); return; }
    if (q->generated >= m->budget) { finish(R, q, GEN_LENGTH); return; }
    q->next = sr.token;
    q->has_next = true;
}

static int mr_step(void *self, llm_seq **batch, int n, strbuf *err)
{
    struct model_runner *R = self;
    int budget = R->rc->max_num_batched_tokens, n_items = 0;
    struct mchoice *owner[R->rc->max_num_seqs > 0 ? R->rc->max_num_seqs : 1];

    /* decoding choices first (one token each), then prefill chunks (choice
     * 0's: the others fork from it); the scheduler admits at most
     * max_num_seqs choices in all */
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < n; i++) {
            struct mseq *m = batch[i]->state;
            for (int j = 0; j < m->n && n_items < R->rc->max_num_seqs; j++) {
                struct mchoice *q = &m->ch[j];
                bool decoding = q->fed == (int)m->prompt.len;
                if (q->done || decoding != (pass == 0) || budget <= 0 || (j && !decoding))
                    continue;
                v4_step_item *it = &R->items[n_items];
                if (decoding) {
                    it->tokens = &q->next;
                    it->n_tokens = 1;
                } else {
                    int left = (int)m->prompt.len - q->fed;
                    it->tokens = m->prompt.data + q->fed;
                    it->n_tokens = v4_seq_prefix_chunk(R->model, q->vs,
                                                       left < budget ? left : budget);
                }
                budget -= it->n_tokens;
                it->seq = q->vs;
                it->logits = R->logits + (size_t)n_items * (size_t)R->vocab;
                it->all_logits = false;
                owner[n_items++] = q;
            }
        }
    }
    if (!n_items) return 0;
    if (v4_step(R->model, R->items, n_items, err)) return -1;

    int made = 0;
    for (int i = 0; i < n_items; i++) {
        struct mchoice *q = owner[i];
        struct mseq *m = q->q;
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
        take_token(R, q, R->items[i].logits);
        made++;
        for (int j = 1; prefilled && j < m->n; j++) {
            float *copy = R->forked + R->vocab;
            memcpy(copy, R->forked, (size_t)R->vocab * sizeof *copy);
            take_token(R, &m->ch[j], copy);
            made++;
        }
    }
    return made;
}

static void mr_cancel(void *self, llm_seq *s)
{
    (void)self;
    if (s->done) return;
    emit_usage(s);
    seq_emit_finish(s, LLM_FINISH_CANCELLED);
}

static void mr_release(void *self, llm_seq *s)
{
    struct model_runner *R = self;
    struct mseq *q = s->state;
    if (q) {
        /* take it off the job queue and the pending list; a job in
         * progress is waited for (it reads the request) */
        pthread_mutex_lock(&R->prep_mu);
        for (struct mseq **pp = &R->prep_head; *pp; pp = &(*pp)->prep_next)
            if (*pp == q) { *pp = q->prep_next; q->prep = PREP_DONE; break; }
        while (q->prep == PREP_RUNNING) pthread_cond_wait(&R->prep_cv, &R->prep_mu);
        for (struct mseq **pp = &R->pending; *pp; pp = &(*pp)->pending_next)
            if (*pp == q) { *pp = q->pending_next; break; }
        pthread_mutex_unlock(&R->prep_mu);
    }
    for (int i = 0; q && q->ch && i < q->n; i++)
        if (q->ch[i].vs) v4_seq_free(R->model, q->ch[i].vs);
    free_mseq(q);
    s->state = NULL;
}

static void mr_stats(void *self, runner_stats *st)
{
    struct model_runner *R = self;
    v4_cache_info ci;
    v4_cache_info_get(R->model, &ci);
    st->kv_blocks_used = ci.blocks_used;
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
    .stats = mr_stats,
    .unload = mr_unload,
};
