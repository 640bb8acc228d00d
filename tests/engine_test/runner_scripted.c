/* The scripted runner: TEST-ONLY.  It has no model; each request carries
 * its own script and the runner plays it back through the real scheduler
 * and protocol, so scheduling, cancellation, slow readers, draining and
 * faults can be tested without weights.  Linked only into the test
 * binary (build/tests/llm-engine-test, main.c here), selected by its
 * `serve --test-runner scripted`; no recipe key enables it.
 *
 * A token is one Unicode code point.  The request may hold
 *
 *   "test_script": {
 *     "reasoning": "...",            reasoning_delta text, first
 *     "content": "...",              content_delta text, next
 *     "tool_calls": [{"id", "name", "arguments"}],   then these
 *     "tokens_per_step": 1,          code points per step per sequence
 *     "step_ms": 0,                  each step sleeps this long (batch: the max)
 *     "finish": "stop",              stop | length | tool_calls (default:
 *                                    tool_calls when there are calls, else stop)
 *     "prompt_tokens": N,            default: code points of the prompt text
 *     "logprobs": false,             one logprob event per token
 *     "error": {"status", "code", "message"},   refuse the request at prepare
 *     "fail_after": N                fatal runner error once N tokens were made
 *   }
 *
 * plus max_tokens / max_completion_tokens / max_output_tokens (completion
 * budget: finish "length" when the script is longer).  Prompt text is the
 * messages' content, "prompt" or "input".  tokenize answers with the
 * prompt's code points; detokenize turns "tokens" back into text. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "json.h"
#include "runner.h"

#define BLOCK_TOKENS  16
#define TOKEN_BYTES   1024      /* pretend KV bytes per token for capacity */
#define MAX_CALLS     8

struct scripted {
    int64_t blocks_total, blocks_used;
    int     max_model_len;
    int     default_max_tokens;
};

struct call {
    char  *id, *name;
    strbuf args;
};

struct script {
    strbuf      reasoning, content;
    struct call calls[MAX_CALLS];
    int         n_calls;
    int         tokens_per_step, step_ms;
    enum llm_finish_reason finish;
    bool        logprobs;
    long long   fail_after;          /* -1: never */
    int         budget;              /* completion tokens allowed */
    uint64_t    fingerprint;
    /* progress */
    bool        started;
    int         phase;               /* 0 reasoning, 1 content, 2 calls, 3 end */
    size_t      pos;                 /* byte offset in the current text */
    int         call;
    bool        call_open;
    int         generated, reasoning_tokens;
    int64_t     blocks;
};

/* ---- text helpers ------------------------------------------------------ */

static size_t cp_len(const char *s, size_t left)
{
    unsigned char c = (unsigned char)*s;
    size_t n = c < 0x80 ? 1 : c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
    return n <= left ? n : left;
}

static uint32_t cp_value(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    if (n == 1) return u[0];
    uint32_t v = u[0] & (0x7f >> n);
    for (size_t i = 1; i < n; i++) v = (v << 6) | (u[i] & 0x3f);
    return v;
}

static int count_cps(const char *s, size_t len)
{
    int n = 0;
    for (size_t i = 0; i < len; i += cp_len(s + i, len - i)) n++;
    return n;
}

static void put_cp(strbuf *sb, uint32_t c)
{
    if (c < 0x80) sb_putc(sb, (char)c);
    else if (c < 0x800) {
        sb_putc(sb, (char)(0xc0 | (c >> 6)));
        sb_putc(sb, (char)(0x80 | (c & 0x3f)));
    } else if (c < 0x10000) {
        sb_putc(sb, (char)(0xe0 | (c >> 12)));
        sb_putc(sb, (char)(0x80 | ((c >> 6) & 0x3f)));
        sb_putc(sb, (char)(0x80 | (c & 0x3f)));
    } else {
        sb_putc(sb, (char)(0xf0 | (c >> 18)));
        sb_putc(sb, (char)(0x80 | ((c >> 12) & 0x3f)));
        sb_putc(sb, (char)(0x80 | ((c >> 6) & 0x3f)));
        sb_putc(sb, (char)(0x80 | (c & 0x3f)));
    }
}

/* Strings of a content value: a string, or an array of parts with "text". */
static void add_content(strbuf *sb, yajl_val v)
{
    if (json_string(v)) sb_puts(sb, json_string(v));
    else if (v && YAJL_IS_ARRAY(v))
        for (size_t i = 0; i < v->u.array.len; i++) {
            yajl_val part = v->u.array.values[i];
            if (json_string(part)) sb_puts(sb, json_string(part));
            else if (json_string(json_get(part, "text"))) sb_puts(sb, json_string(json_get(part, "text")));
            else add_content(sb, json_get(part, "content"));
        }
}

static void prompt_text(strbuf *sb, yajl_val root)
{
    yajl_val msgs = json_get(root, "messages");
    if (msgs && YAJL_IS_ARRAY(msgs))
        for (size_t i = 0; i < msgs->u.array.len; i++)
            add_content(sb, json_get(msgs->u.array.values[i], "content"));
    add_content(sb, json_get(root, "prompt"));
    add_content(sb, json_get(root, "input"));
}

static uint64_t fnv1a(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h;
}

/* ---- runner ops -------------------------------------------------------- */

static int sc_load(void **self, const recipe *rc, runner_capacity *cap, strbuf *err)
{
    struct scripted *R = calloc(1, sizeof *R);
    if (!R) {
        sb_puts(err, "out of memory");
        return -1;
    }
    int64_t bytes = rc->kv_cache_memory_bytes ? rc->kv_cache_memory_bytes : 64ll << 20;
    cap->kv_capacity_tokens = bytes / TOKEN_BYTES;
    cap->kv_capacity_bytes = bytes;
    cap->kv_blocks_total = cap->kv_capacity_tokens / BLOCK_TOKENS;
    snprintf(cap->fingerprint, sizeof cap->fingerprint, "fp_scripted_%s", rc->name);
    R->blocks_total = cap->kv_blocks_total;
    R->max_model_len = rc->max_model_len;
    R->default_max_tokens = rc->max_tokens;
    *self = R;
    return 0;
}

static void free_script(struct script *sc)
{
    sb_free(&sc->reasoning);
    sb_free(&sc->content);
    for (int i = 0; i < sc->n_calls; i++) {
        free(sc->calls[i].id);
        free(sc->calls[i].name);
        sb_free(&sc->calls[i].args);
    }
    free(sc);
}

static bool get_int(yajl_val obj, const char *key, long long *out)
{
    return json_int(json_get(obj, key), out);
}

/* tokenize / detokenize answer at once. */
static void answer_tokens(llm_request *s, yajl_val root)
{
    strbuf t;
    sb_init(&t);
    if (s->kind == LLM_KIND_TOKENIZE) {
        prompt_text(&t, root);
        size_t n = 0;
        uint32_t *ids = malloc((t.len + 1) * sizeof *ids);
        for (size_t i = 0; i < t.len;) {
            size_t k = cp_len(t.data + i, t.len - i);
            ids[n++] = cp_value(t.data + i, k);
            i += k;
        }
        req_emit_prompt_info(s, (uint32_t)n, 0, fnv1a(t.data ? t.data : "", t.len));
        req_emit_tokens(s, ids, n);
        free(ids);
    } else {
        yajl_val toks = json_get(root, "tokens");
        for (size_t i = 0; toks && YAJL_IS_ARRAY(toks) && i < toks->u.array.len; i++) {
            long long c;
            if (json_int(toks->u.array.values[i], &c) && c >= 0 && c < 0x110000) put_cp(&t, (uint32_t)c);
        }
        req_emit_text(s, LLM_EV_CONTENT_DELTA, t.data ? t.data : "", t.len);
    }
    req_emit_finish(s, LLM_FINISH_STOP);
    sb_free(&t);
}

static int sc_prepare(void *self, llm_request *s)
{
    struct scripted *R = self;
    char perr[256];
    yajl_val root = json_parse(s->request, s->request_len, perr, sizeof perr);
    if (!root || !YAJL_IS_OBJECT(root)) {
        req_emit_error(s, 400, "invalid_request", NULL, "request body is not a JSON object: %s",
                       root ? "other JSON value" : perr);
        req_emit_finish(s, LLM_FINISH_ERROR);
        yajl_tree_free(root);
        return -1;
    }
    if (s->kind == LLM_KIND_TOKENIZE || s->kind == LLM_KIND_DETOKENIZE) {
        answer_tokens(s, root);
        yajl_tree_free(root);
        return 0;
    }
    yajl_val ts = json_get(root, "test_script");
    yajl_val e = json_get(ts, "error");
    long long n = 1;
    if (get_int(root, "n", &n) && n != 1) {
        req_emit_error(s, 400, "invalid_request_error", "n", "n: the scripted test runner "
                       "plays one choice (the model runner serves n > 1)");
        req_emit_finish(s, LLM_FINISH_ERROR);
        yajl_tree_free(root);
        return -1;
    }
    if (e) {
        long long status = 400;
        get_int(e, "status", &status);
        const char *msg = json_string(json_get(e, "message"));
        req_emit_error(s, (uint32_t)status, json_string(json_get(e, "code")), NULL, "%s",
                       msg ? msg : "scripted error");
        req_emit_finish(s, LLM_FINISH_ERROR);
        yajl_tree_free(root);
        return -1;
    }

    struct script *sc = calloc(1, sizeof *sc);
    sb_init(&sc->reasoning);
    sb_init(&sc->content);
    const char *r = json_string(json_get(ts, "reasoning"));
    const char *c = json_string(json_get(ts, "content"));
    if (r) sb_puts(&sc->reasoning, r);
    if (c) sb_puts(&sc->content, c);
    else if (!ts) sb_puts(&sc->content, "Hello from the scripted runner.");
    yajl_val calls = json_get(ts, "tool_calls");
    for (size_t i = 0; calls && YAJL_IS_ARRAY(calls) && i < calls->u.array.len && i < MAX_CALLS; i++) {
        yajl_val cv = calls->u.array.values[i];
        struct call *k = &sc->calls[sc->n_calls++];
        const char *id = json_string(json_get(cv, "id"));
        const char *name = json_string(json_get(cv, "name"));
        const char *args = json_string(json_get(cv, "arguments"));
        char idbuf[32];
        snprintf(idbuf, sizeof idbuf, "call_%zu", i);
        k->id = strdup(id ? id : idbuf);
        k->name = strdup(name ? name : "f");
        sb_init(&k->args);
        if (args) sb_puts(&k->args, args);
    }
    long long v;
    sc->tokens_per_step = get_int(ts, "tokens_per_step", &v) && v > 0 ? (int)v : 1;
    sc->step_ms = get_int(ts, "step_ms", &v) && v > 0 ? (int)v : 0;
    sc->fail_after = get_int(ts, "fail_after", &v) ? v : -1;
    json_bool(json_get(ts, "logprobs"), &sc->logprobs);
    const char *fin = json_string(json_get(ts, "finish"));
    sc->finish = fin && !strcmp(fin, "length") ? LLM_FINISH_LENGTH
               : fin && !strcmp(fin, "tool_calls") ? LLM_FINISH_TOOL_CALLS
               : fin && !strcmp(fin, "stop") ? LLM_FINISH_STOP
               : sc->n_calls ? LLM_FINISH_TOOL_CALLS : LLM_FINISH_STOP;

    strbuf pt;
    sb_init(&pt);
    prompt_text(&pt, root);
    int prompt = count_cps(pt.data ? pt.data : "", pt.len);
    sc->fingerprint = fnv1a(pt.data ? pt.data : "", pt.len);
    sb_free(&pt);
    if (get_int(ts, "prompt_tokens", &v) && v > 0) prompt = (int)v;
    if (prompt < 1) prompt = 1;

    long long max_tokens = -1;
    if (!get_int(root, "max_completion_tokens", &max_tokens)
        && !get_int(root, "max_tokens", &max_tokens))
        get_int(root, "max_output_tokens", &max_tokens);
    yajl_tree_free(root);
    s->state = sc;
    s->prompt_tokens = prompt;

    if (prompt >= R->max_model_len || (max_tokens > 0 && prompt + max_tokens > R->max_model_len)) {
        long long want = max_tokens > 0 ? max_tokens : 0;
        req_emit_error(s, 400, "context_length_exceeded", "messages",
                       "This model's maximum context length is %d tokens. However, you "
                       "requested %lld tokens (%d in the messages, %lld in the completion). "
                       "Please reduce the length of the messages or completion.",
                       R->max_model_len, prompt + want, prompt, want);
        req_emit_finish(s, LLM_FINISH_ERROR);
        return -1;
    }
    int room = R->max_model_len - prompt;
    sc->budget = max_tokens > 0 ? (int)max_tokens : R->default_max_tokens;
    if (s->kind == LLM_KIND_PROBE) sc->budget = 1;
    if (sc->budget > room) sc->budget = room;
    return 0;
}

static int sc_admit(void *self, llm_request *s)
{
    struct scripted *R = self;
    struct script *sc = s->state;
    int64_t need = (s->prompt_tokens + sc->budget + BLOCK_TOKENS - 1) / BLOCK_TOKENS;
    /* probes have room of their own (LLM_IPC_PROBE_SEATS) */
    if (R->blocks_used + need > R->blocks_total && R->blocks_used > 0
        && s->kind != LLM_KIND_PROBE)
        return 0;
    sc->blocks = need;
    R->blocks_used += need;
    return 1;
}

static void emit_logprobs(llm_request *s, const char *text, size_t len)
{
    static const float top_lp[2] = { -0.25f, -2.5f };
    for (size_t i = 0; i < len;) {
        size_t k = cp_len(text + i, len - i);
        const char *top[2] = { text + i, "?" };
        size_t top_len[2] = { k, 1 };
        req_emit_logprob(s, cp_value(text + i, k), -0.25f, text + i, k, 2, top_lp, top, top_len);
        i += k;
    }
}

/* Up to n tokens of the current text phase; returns the tokens taken. */
static int play_text(llm_request *s, struct script *sc, const strbuf *t, enum llm_ev_type type,
                     int n)
{
    size_t start = sc->pos;
    int taken = 0;
    while (taken < n && sc->pos < t->len) {
        sc->pos += cp_len(t->data + sc->pos, t->len - sc->pos);
        taken++;
    }
    if (taken) {
        req_emit_text(s, type, t->data + start, sc->pos - start);
        if (sc->logprobs) emit_logprobs(s, t->data + start, sc->pos - start);
    }
    return taken;
}

static void finish(llm_request *s, struct script *sc, enum llm_finish_reason why)
{
    if (sc->call_open) req_emit_tool_end(s, (uint32_t)sc->call);
    llm_ipc_usage u = { (uint32_t)s->prompt_tokens, (uint32_t)sc->generated,
                        (uint32_t)sc->reasoning_tokens, 0 };
    req_emit_usage(s, &u);
    req_emit_finish(s, why);
}

/* One step of one sequence; returns the tokens made. */
static int play(llm_request *s, struct script *sc)
{
    if (!sc->started) {
        sc->started = true;
        req_emit_prompt_info(s, (uint32_t)s->prompt_tokens, 0, sc->fingerprint);
    }
    int made = 0;
    int want = sc->tokens_per_step;
    if (want > sc->budget - sc->generated) want = sc->budget - sc->generated;
    while (made < want && sc->phase < 3) {
        int got = 0;
        if (sc->phase < 2) {
            const strbuf *t = sc->phase == 0 ? &sc->reasoning : &sc->content;
            got = play_text(s, sc, t, sc->phase == 0 ? LLM_EV_REASONING_DELTA
                                                     : LLM_EV_CONTENT_DELTA, want - made);
            if (sc->phase == 0) sc->reasoning_tokens += got;
            if (sc->pos >= t->len) {
                sc->phase++;
                sc->pos = 0;
            }
        } else if (sc->call < sc->n_calls) {
            struct call *k = &sc->calls[sc->call];
            if (!sc->call_open) {
                req_emit_tool_begin(s, (uint32_t)sc->call, k->id, k->name);
                sc->call_open = true;
            }
            size_t start = sc->pos;
            while (got < want - made && sc->pos < k->args.len) {
                sc->pos += cp_len(k->args.data + sc->pos, k->args.len - sc->pos);
                got++;
            }
            if (got) req_emit_tool_args(s, (uint32_t)sc->call, k->args.data + start, sc->pos - start);
            if (sc->pos >= k->args.len) {
                req_emit_tool_end(s, (uint32_t)sc->call);
                sc->call_open = false;
                sc->call++;
                sc->pos = 0;
            }
        } else {
            sc->phase = 3;
        }
        made += got;
        sc->generated += got;
    }
    if (sc->phase == 2 && sc->call >= sc->n_calls) sc->phase = 3;
    if (sc->phase == 3) finish(s, sc, sc->finish);
    else if (sc->generated >= sc->budget) finish(s, sc, LLM_FINISH_LENGTH);
    return made;
}

static int sc_step(void *self, llm_request **batch, int n, strbuf *err)
{
    (void)self;
    int sleep_ms = 0, total = 0;
    for (int i = 0; i < n; i++) {
        struct script *sc = batch[i]->state;
        if (sc->step_ms > sleep_ms) sleep_ms = sc->step_ms;
    }
    if (sleep_ms) {
        struct timespec ts = { sleep_ms / 1000, (long)(sleep_ms % 1000) * 1000000L };
        nanosleep(&ts, NULL);
    }
    for (int i = 0; i < n; i++) {
        struct script *sc = batch[i]->state;
        total += play(batch[i], sc);
        if (sc->fail_after >= 0 && sc->generated >= sc->fail_after) {
            sb_printf(err, "scripted failure after %d tokens on slot %u", sc->generated,
                      batch[i]->slot);
            return -1;
        }
    }
    return total;
}

static void sc_cancel(void *self, llm_request *s)
{
    (void)self;
    struct script *sc = s->state;
    if (sc) finish(s, sc, LLM_FINISH_CANCELLED);
}

static void sc_release(void *self, llm_request *s)
{
    struct scripted *R = self;
    struct script *sc = s->state;
    if (!sc) return;
    R->blocks_used -= sc->blocks;
    free_script(sc);
    s->state = NULL;
}

static void sc_stats(void *self, runner_stats *st)
{
    struct scripted *R = self;
    st->kv_blocks_used = R->blocks_used;
    st->kv_blocks_free = R->blocks_total > R->blocks_used ? R->blocks_total - R->blocks_used : 0;
    st->prefix_cache_hits = 0;
}

static void sc_unload(void *self)
{
    free(self);
}

const runner_ops runner_scripted = {
    .name = "scripted",
    .load = sc_load,
    .prepare = sc_prepare,
    .admit = sc_admit,
    .step = sc_step,
    .cancel = sc_cancel,
    .release = sc_release,
    .stats = sc_stats,
    .unload = sc_unload,
};
