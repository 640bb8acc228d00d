/* llm-bench-serve: a serving benchmark through the OpenAI endpoint, with
 * the columns of vLLM's benchmark_serving.py (and SGLang's bench_serving)
 * so numbers compare: request throughput, output and total tokens/s,
 * TTFT, TPOT, ITL and end-to-end latency (mean, p50, p90, p99).
 *
 * N requests, at most C in flight (C client threads, each with its own
 * keep-alive connection), each a streamed chat completion of a random
 * prompt of exactly --input-len tokens (measured through /tokenize in
 * chat form and landed exactly by the calibrator) asking for exactly
 * --output-len tokens (ignore_eos, as vLLM's random dataset does).
 *
 * Tokens are counted three ways and must agree: usage.completion_tokens,
 * the requested length, and (with --logprobs, which sends one logprob
 * entry per token) the entries streamed.  Without --logprobs the chunks
 * with text are counted too, but a chunk may hold several tokens (a
 * character split over tokens), so only usage is checked.
 *
 * Exit status: 0 when every request completed with consistent counts,
 * 1 when one failed or miscounted, 2 on a usage or setup error. */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calibrate.h"
#include "http.h"
#include "json.h"
#include "jsonw.h"
#include "sse.h"

static const char usage_text[] =
    "usage: llm-bench-serve --model NAME [options]\n"
    "\n"
    "  --base-url URL       the OpenAI endpoint's server (http://127.0.0.1:8080)\n"
    "  --model NAME         served model name\n"
    "  --num-prompts N      requests (64)\n"
    "  --concurrency C      requests in flight at once (1)\n"
    "  --input-len L        prompt tokens of each request, exact (256)\n"
    "  --output-len O       completion tokens of each request, exact (128)\n"
    "  --seed S             random prompts' seed (0)\n"
    "  --logprobs           ask for log probabilities and count their entries\n"
    "  --no-warmup          skip the untimed first request\n"
    "  --request-timeout S  bound of one request (600)\n"
    "  --json FILE          also write the results as JSON (vLLM's key names)\n";

typedef struct {
    const char *base_url, *model, *json_path;
    int    num_prompts, concurrency, input_len, output_len;
    unsigned long long seed;
    bool   logprobs, warmup;
    double timeout_s;
} bs_opts;

typedef struct {
    strbuf body;              /* the streamed chat request */
    long   prompt_tokens;     /* measured through /tokenize */
} bs_prompt;

typedef struct {
    bool    ok;
    char    error[320];
    double  t_start, ttft, latency;   /* seconds */
    double  t_last;                   /* last chunk with text */
    double *itl;                      /* gaps between chunks with text */
    int     n_itl, cap_itl;
    long long usage_prompt, usage_completion;
    long    text_chunks, logprob_entries;
    bool    saw_done, saw_finish;
} bs_result;

typedef struct {
    const bs_opts *o;
    bs_prompt     *prompts;
    bs_result     *results;
    atomic_int     next;
    atomic_int     failed_prep;
    pthread_mutex_t err_lock;
    strbuf         prep_error;        /* the first preparation failure */
} bs_run;

static void on_signal(int sig)
{
    (void)sig;
    http_interrupted = 1;
}

/* ---- prompts ---------------------------------------------------------- */

typedef struct {
    http_client   *http;
    const bs_opts *o;
    calibrator    *cal;
    strbuf         body;
} measure_ctx;

static void chat_body(const bs_opts *o, const char *text, bool generate, strbuf *out)
{
    jw w;
    sb_reset(out);
    jw_init(&w, out);
    jw_obj(&w, NULL);
    jw_str(&w, "model", o->model);
    jw_arr(&w, "messages");
    jw_obj(&w, NULL);
    jw_str(&w, "role", "user");
    jw_str(&w, "content", text);
    jw_end(&w);
    jw_end(&w);
    if (generate) {
        jw_bool(&w, "stream", true);
        jw_json(&w, "stream_options", "{\"include_usage\":true}");
        jw_int(&w, "max_tokens", o->output_len);
        jw_bool(&w, "ignore_eos", true);
        jw_num(&w, "temperature", 0, 1);
        if (o->logprobs) jw_bool(&w, "logprobs", true);
    }
    jw_end(&w);
}

/* /tokenize in chat form: the prompt's token count as the server counts it. */
static int tokenize_count(http_client *h, const bs_opts *o, const char *body, size_t len,
                          long *count, strbuf *err)
{
    http_resp r;
    http_resp_init(&r);
    int rc = -1;
    yajl_val v = NULL;
    http_request(h, "POST", "/tokenize", body, len, false, o->timeout_s, NULL, NULL, &r);
    if (r.status != 200) {
        sb_printf(err, "/tokenize: %s%s%ld %.200s", r.error, r.error[0] ? "; " : "HTTP ",
                  r.status, r.body.data ? r.body.data : "");
        goto out;
    }
    char jerr[160];
    long long n;
    v = json_parse(r.body.data, r.body.len, jerr, sizeof jerr);
    if (!v || !json_int(json_get(v, "count"), &n) || n < 0) {
        sb_printf(err, "/tokenize: no integer \"count\" in %.200s", r.body.data);
        goto out;
    }
    *count = (long)n;
    rc = 0;
out:
    yajl_tree_free(v);
    http_resp_free(&r);
    return rc;
}

static int measure(void *user, const calib_fill *f, long *tokens, strbuf *err)
{
    measure_ctx *m = user;
    strbuf text;
    sb_init(&text);
    calib_text(m->cal, f, NULL, &text);
    chat_body(m->o, text.data ? text.data : "", false, &m->body);
    sb_free(&text);
    return tokenize_count(m->http, m->o, m->body.data, m->body.len, tokens, err);
}

/* xorshift64*: deterministic per prompt, independent of thread timing. */
static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ULL;
}

/* Prompt i: a unit of random lowercase words, unique to the prompt, so
 * no two requests share more than the chat template's few tokens. */
static int prompt_make(bs_run *run, http_client *h, int i, strbuf *err)
{
    const bs_opts *o = run->o;
    uint64_t s = (o->seed + 1) * 0x9E3779B97F4A7C15ULL ^ (uint64_t)(i + 1) * 0xD1B54A32D192ED03ULL;
    if (!s) s = 1;
    strbuf unit;
    sb_init(&unit);
    for (int w = 0; w < 12; w++) {
        sb_putc(&unit, ' ');
        int len = 2 + (int)(rng_next(&s) % 7);
        for (int c = 0; c < len; c++) sb_putc(&unit, (char)('a' + rng_next(&s) % 26));
    }
    sb_putc(&unit, '.');
    calibrator cal;
    measure_ctx m = { h, o, &cal, { 0 } };
    sb_init(&m.body);
    calib_init(&cal, measure, &m);
    cal.unit = unit.data;
    calib_result res;
    int rc = calibrate(&cal, o->input_len, &res, err);
    if (rc == 0) {
        strbuf text;
        sb_init(&text);
        calib_text(&cal, &res.fill, NULL, &text);
        chat_body(o, text.data ? text.data : "", true, &run->prompts[i].body);
        run->prompts[i].prompt_tokens = res.actual;
        sb_free(&text);
    }
    sb_free(&m.body);
    sb_free(&unit);
    return rc;
}

/* ---- one request ------------------------------------------------------ */

static void fail(bs_result *r, const char *fmt, const char *a)
{
    if (r->error[0]) return;   /* the first problem says most */
    snprintf(r->error, sizeof r->error, fmt, a);
}

static bool nonempty(yajl_val v)
{
    const char *s = json_string(v);
    return (s && *s) || (YAJL_IS_ARRAY(v) && v->u.array.len);
}

static int on_event(void *user, const char *event, const char *data, size_t len)
{
    (void)event;
    bs_result *r = user;
    double now = now_s();
    if (len == 6 && !memcmp(data, "[DONE]", 6)) {
        r->saw_done = true;
        return 0;
    }
    char err[200];
    yajl_val v = json_parse(data, len, err, sizeof err);
    if (!v) {
        fail(r, "a stream chunk is not JSON: %s", err);
        return 0;
    }
    if (json_get(v, "error")) fail(r, "the stream carried an error: %.240s", data);
    yajl_val u = json_get(v, "usage");
    if (YAJL_IS_OBJECT(u)) {
        json_int(json_get(u, "prompt_tokens"), &r->usage_prompt);
        json_int(json_get(u, "completion_tokens"), &r->usage_completion);
    }
    yajl_val choices = json_get(v, "choices");
    for (size_t i = 0; YAJL_IS_ARRAY(choices) && i < choices->u.array.len; i++) {
        yajl_val c = choices->u.array.values[i];
        yajl_val d = json_get(c, "delta");
        if (nonempty(json_get(d, "content")) || nonempty(json_get(d, "reasoning_content"))
            || nonempty(json_get(d, "tool_calls"))) {
            if (r->text_chunks++ == 0) {
                r->ttft = now - r->t_start;
            } else {
                if (r->n_itl == r->cap_itl) {
                    r->cap_itl = r->cap_itl ? 2 * r->cap_itl : 256;
                    r->itl = realloc(r->itl, (size_t)r->cap_itl * sizeof *r->itl);
                    if (!r->itl) abort();
                }
                r->itl[r->n_itl++] = now - r->t_last;
            }
            r->t_last = now;
        }
        r->logprob_entries += (long)json_len(json_get(json_get(c, "logprobs"), "content"));
        if (json_string(json_get(c, "finish_reason"))) r->saw_finish = true;
    }
    yajl_tree_free(v);
    return 0;
}

static int on_data(void *user, const char *data, size_t n)
{
    return sse_feed(user, data, n);
}

static void request_run(const bs_opts *o, http_client *h, const bs_prompt *p, bs_result *r)
{
    memset(r, 0, sizeof *r);
    r->usage_prompt = r->usage_completion = -1;
    sse_parser sse;
    sse_init(&sse, on_event, r);
    http_resp resp;
    http_resp_init(&resp);
    r->t_start = now_s();
    http_request(h, "POST", "/v1/chat/completions", p->body.data, p->body.len, false,
                 o->timeout_s, on_data, &sse, &resp);
    r->latency = now_s() - r->t_start;
    char got[64];
    if (resp.error[0]) fail(r, "transport: %s", resp.error);
    else if (resp.status != 200) {
        snprintf(got, sizeof got, "HTTP %ld: ", resp.status);
        fail(r, "%s", got);
        size_t l = strlen(r->error);
        snprintf(r->error + l, sizeof r->error - l, "%.200s", resp.body.data ? resp.body.data : "");
    } else if (!r->saw_done) fail(r, "%s", "the stream ended without data: [DONE]");
    else if (!r->saw_finish) fail(r, "%s", "no choice carried a finish_reason");
    else if (r->usage_completion < 0 || r->usage_prompt < 0) fail(r, "%s", "no usage chunk");
    else if (r->text_chunks == 0) fail(r, "%s", "no chunk carried text");
    else {
        /* The counts must agree, or the throughput numbers mean nothing. */
        snprintf(got, sizeof got, "%lld", r->usage_completion);
        if (r->usage_completion != o->output_len)
            fail(r, "usage.completion_tokens is %s, not the --output-len asked for", got);
        if (o->logprobs && r->logprob_entries != r->usage_completion) {
            snprintf(got, sizeof got, "%ld entries, usage %lld", r->logprob_entries,
                     r->usage_completion);
            fail(r, "logprob entries streamed differ from usage.completion_tokens (%s)", got);
        }
        if (r->usage_prompt != p->prompt_tokens) {
            snprintf(got, sizeof got, "%lld, /tokenize %ld", r->usage_prompt, p->prompt_tokens);
            fail(r, "usage.prompt_tokens differs from /tokenize (%s)", got);
        }
    }
    r->ok = !r->error[0];
    sse_free(&sse);
    http_resp_free(&resp);
}

/* ---- workers ---------------------------------------------------------- */

typedef struct {
    bs_run *run;
    int     phase;   /* 0: prepare prompts, 1: send requests */
} worker_arg;

static void *worker(void *arg)
{
    worker_arg *a = arg;
    bs_run *run = a->run;
    http_client *h = http_new(run->o->base_url, NULL);
    if (!h) {
        pthread_mutex_lock(&run->err_lock);
        if (!run->prep_error.len) sb_puts(&run->prep_error, "cannot make an HTTP client");
        pthread_mutex_unlock(&run->err_lock);
        atomic_fetch_add(&run->failed_prep, 1);
        return NULL;
    }
    for (;;) {
        int i = atomic_fetch_add(&run->next, 1);
        if (i >= run->o->num_prompts || http_interrupted) break;
        if (a->phase == 1) {
            request_run(run->o, h, &run->prompts[i], &run->results[i]);
            continue;
        }
        strbuf err;
        sb_init(&err);
        if (prompt_make(run, h, i, &err) < 0) {
            atomic_fetch_add(&run->failed_prep, 1);
            pthread_mutex_lock(&run->err_lock);
            if (!run->prep_error.len) sb_printf(&run->prep_error, "prompt %d: %s", i, err.data);
            pthread_mutex_unlock(&run->err_lock);
        }
        sb_free(&err);
        if (atomic_load(&run->failed_prep)) break;
    }
    http_free(h);
    return NULL;
}

static void run_phase(bs_run *run, int phase)
{
    int n = run->o->concurrency < run->o->num_prompts ? run->o->concurrency : run->o->num_prompts;
    pthread_t *t = calloc((size_t)n, sizeof *t);
    worker_arg a = { run, phase };
    atomic_store(&run->next, 0);
    for (int i = 0; i < n; i++)
        if (pthread_create(&t[i], NULL, worker, &a)) {
            fprintf(stderr, "llm-bench-serve: cannot start thread %d\n", i);
            exit(2);
        }
    for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
    free(t);
}

/* ---- statistics ------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define DASHES "--------------------------------------------------"

typedef struct {
    double mean, median, p90, p99, std;
} bs_stat;

/* numpy.percentile's default (linear between closest ranks), as vLLM. */
static double percentile(const double *sorted, size_t n, double q)
{
    if (!n) return 0;
    double pos = q / 100.0 * (double)(n - 1);
    size_t lo = (size_t)floor(pos), hi = lo + 1 < n ? lo + 1 : lo;
    return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - (double)lo);
}

/* Over v[0..n) in seconds, reported in ms; sorts v. */
static bs_stat stat_of(double *v, size_t n)
{
    bs_stat s = { 0 };
    if (!n) return s;
    qsort(v, n, sizeof *v, cmp_double);
    double sum = 0, sq = 0;
    for (size_t i = 0; i < n; i++) sum += v[i];
    s.mean = sum / (double)n;
    for (size_t i = 0; i < n; i++) sq += (v[i] - s.mean) * (v[i] - s.mean);
    s.std = sqrt(sq / (double)n) * 1e3;
    s.mean *= 1e3;
    s.median = percentile(v, n, 50) * 1e3;
    s.p90 = percentile(v, n, 90) * 1e3;
    s.p99 = percentile(v, n, 99) * 1e3;
    return s;
}

static void print_stat(const char *title, const char *abbr, const bs_stat *s)
{
    /* vLLM's "{:-^50}" section heading. */
    int len = (int)strlen(title) + 2, left = (50 - len) / 2;
    printf("%.*s %s %.*s\n", left, DASHES, title, 50 - len - left, DASHES);
    const char *what[] = { "Mean", "Median", "P90", "P99" };
    double v[] = { s->mean, s->median, s->p90, s->p99 };
    for (int i = 0; i < 4; i++) {
        char label[64];
        snprintf(label, sizeof label, "%s %s (ms):", what[i], abbr);
        printf("%-40s %10.2f\n", label, v[i]);
    }
}

static void json_stat(jw *w, const char *name, const bs_stat *s)
{
    char key[64];
    snprintf(key, sizeof key, "mean_%s_ms", name);
    jw_num(w, key, s->mean, 4);
    snprintf(key, sizeof key, "median_%s_ms", name);
    jw_num(w, key, s->median, 4);
    snprintf(key, sizeof key, "std_%s_ms", name);
    jw_num(w, key, s->std, 4);
    snprintf(key, sizeof key, "p90_%s_ms", name);
    jw_num(w, key, s->p90, 4);
    snprintf(key, sizeof key, "p99_%s_ms", name);
    jw_num(w, key, s->p99, 4);
}

static int report(const bs_opts *o, bs_run *run, double duration)
{
    int n = o->num_prompts, completed = 0, failed = 0;
    long long in_tok = 0, out_tok = 0, counted = 0, chunks = 0;
    size_t n_itl = 0;
    for (int i = 0; i < n; i++) n_itl += (size_t)run->results[i].n_itl;
    double *ttft = calloc((size_t)n + 1, sizeof *ttft), *tpot = calloc((size_t)n + 1, sizeof *tpot);
    double *e2e = calloc((size_t)n + 1, sizeof *e2e), *itl = calloc(n_itl + 1, sizeof *itl);
    size_t n_tpot = 0;
    n_itl = 0;
    for (int i = 0; i < n; i++) {
        bs_result *r = &run->results[i];
        if (!r->ok) {
            if (failed++ < 5)
                fprintf(stderr, "llm-bench-serve: request %d: %s\n", i,
                        r->error[0] ? r->error : "not sent (interrupted)");
            continue;
        }
        ttft[completed] = r->ttft;
        e2e[completed] = r->latency;
        completed++;
        in_tok += r->usage_prompt;
        out_tok += r->usage_completion;
        counted += o->logprobs ? r->logprob_entries : r->usage_completion;
        chunks += r->text_chunks;
        if (r->usage_completion > 1)
            tpot[n_tpot++] = (r->latency - r->ttft) / (double)(r->usage_completion - 1);
        memcpy(itl + n_itl, r->itl, (size_t)r->n_itl * sizeof *itl);
        n_itl += (size_t)r->n_itl;
    }
    bs_stat s_ttft = stat_of(ttft, (size_t)completed), s_tpot = stat_of(tpot, n_tpot);
    bs_stat s_itl = stat_of(itl, n_itl), s_e2e = stat_of(e2e, (size_t)completed);
    double req_tput = completed / duration, out_tput = (double)out_tok / duration;
    double tot_tput = (double)(in_tok + out_tok) / duration;

    printf("%s\n", "============ Serving Benchmark Result ============");
    printf("%-40s %10d\n", "Successful requests:", completed);
    printf("%-40s %10d\n", "Failed requests:", failed);
    printf("%-40s %10d\n", "Maximum request concurrency:", o->concurrency);
    printf("%-40s %10.2f\n", "Benchmark duration (s):", duration);
    printf("%-40s %10lld\n", "Total input tokens:", in_tok);
    printf("%-40s %10lld\n", "Total generated tokens:", out_tok);
    printf("%-40s %10lld\n", o->logprobs ? "Generated tokens counted (logprobs):"
                                          : "Generated tokens (usage):", counted);
    printf("%-40s %10lld\n", "Streamed chunks with text:", chunks);
    printf("%-40s %10.2f\n", "Request throughput (req/s):", req_tput);
    printf("%-40s %10.2f\n", "Output token throughput (tok/s):", out_tput);
    printf("%-40s %10.2f\n", "Total Token throughput (tok/s):", tot_tput);
    print_stat("Time to First Token", "TTFT", &s_ttft);
    print_stat("Time per Output Token (excl. 1st token)", "TPOT", &s_tpot);
    print_stat("Inter-token Latency", "ITL", &s_itl);
    print_stat("End-to-end Latency", "E2EL", &s_e2e);
    printf("%s\n", "==================================================");

    int rc = failed ? 1 : 0;
    if (o->json_path) {
        strbuf sb;
        sb_init(&sb);
        jw w;
        jw_init(&w, &sb);
        jw_obj(&w, NULL);
        jw_str(&w, "model_id", o->model);
        jw_int(&w, "num_prompts", n);
        jw_int(&w, "max_concurrency", o->concurrency);
        jw_int(&w, "input_len", o->input_len);
        jw_int(&w, "output_len", o->output_len);
        jw_num(&w, "duration", duration, 6);
        jw_int(&w, "completed", completed);
        jw_int(&w, "failed", failed);
        jw_int(&w, "total_input_tokens", in_tok);
        jw_int(&w, "total_output_tokens", out_tok);
        jw_int(&w, "counted_output_tokens", counted);
        jw_bool(&w, "counted_by_logprobs", o->logprobs);
        jw_int(&w, "text_chunks", chunks);
        jw_num(&w, "request_throughput", req_tput, 6);
        jw_num(&w, "output_throughput", out_tput, 6);
        jw_num(&w, "total_token_throughput", tot_tput, 6);
        json_stat(&w, "ttft", &s_ttft);
        json_stat(&w, "tpot", &s_tpot);
        json_stat(&w, "itl", &s_itl);
        json_stat(&w, "e2el", &s_e2e);
        jw_end(&w);
        sb_putc(&sb, '\n');
        FILE *f = fopen(o->json_path, "w");
        if (!f || fwrite(sb.data, 1, sb.len, f) != sb.len || fclose(f)) {
            fprintf(stderr, "llm-bench-serve: cannot write %s\n", o->json_path);
            rc = 2;
        }
        sb_free(&sb);
    }
    free(ttft);
    free(tpot);
    free(e2e);
    free(itl);
    return rc;
}

/* ---- main ------------------------------------------------------------- */

static int die_usage(const char *fmt, const char *arg)
{
    fprintf(stderr, "llm-bench-serve: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(llm-bench-serve --help for usage)\n");
    return 2;
}

static bool parse_int(const char *s, long lo, long hi, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) return false;
    *out = (int)v;
    return true;
}

int main(int argc, char **argv)
{
    bs_opts o = { .base_url = "http://127.0.0.1:8080", .num_prompts = 64, .concurrency = 1,
                  .input_len = 256, .output_len = 128, .warmup = true, .timeout_s = 600 };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage_text, stdout);
            return 0;
        }
        if (!strcmp(a, "--logprobs")) {
            o.logprobs = true;
            continue;
        }
        if (!strcmp(a, "--no-warmup")) {
            o.warmup = false;
            continue;
        }
        if (i + 1 >= argc) return die_usage("%s needs a value", a);
        const char *v = argv[++i];
        bool ok = true;
        if (!strcmp(a, "--base-url")) o.base_url = v;
        else if (!strcmp(a, "--model")) o.model = v;
        else if (!strcmp(a, "--json")) o.json_path = v;
        else if (!strcmp(a, "--num-prompts")) ok = parse_int(v, 1, 1000000, &o.num_prompts);
        else if (!strcmp(a, "--concurrency")) ok = parse_int(v, 1, 4096, &o.concurrency);
        else if (!strcmp(a, "--input-len")) ok = parse_int(v, 1, 100000000, &o.input_len);
        else if (!strcmp(a, "--output-len")) ok = parse_int(v, 1, 100000000, &o.output_len);
        else if (!strcmp(a, "--seed")) o.seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--request-timeout")) ok = (o.timeout_s = atof(v)) > 0;
        else return die_usage("unknown option %s", a);
        if (!ok) {
            fprintf(stderr, "llm-bench-serve: %s: bad value '%s'\n", a, v);
            return 2;
        }
    }
    if (!o.model) return die_usage("%s is required", "--model");
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGPIPE, SIG_IGN);

    bs_run run = { .o = &o };
    run.prompts = calloc((size_t)o.num_prompts, sizeof *run.prompts);
    run.results = calloc((size_t)o.num_prompts, sizeof *run.results);
    pthread_mutex_init(&run.err_lock, NULL);
    sb_init(&run.prep_error);
    for (int i = 0; i < o.num_prompts; i++) sb_init(&run.prompts[i].body);

    /* The first client initializes libcurl, before any thread does. */
    http_client *h0 = http_new(o.base_url, NULL);
    if (!h0) {
        fprintf(stderr, "llm-bench-serve: cannot make an HTTP client for %s\n", o.base_url);
        return 2;
    }
    fprintf(stderr, "llm-bench-serve: %d prompts of %d tokens (measured through /tokenize) ...\n",
            o.num_prompts, o.input_len);
    double t0 = now_s();
    run_phase(&run, 0);
    int rc = 2;
    if (atomic_load(&run.failed_prep) || http_interrupted) {
        fprintf(stderr, "llm-bench-serve: %s\n",
                run.prep_error.len ? run.prep_error.data : "interrupted");
        goto out;
    }
    fprintf(stderr, "llm-bench-serve: prompts ready in %.1f s\n", now_s() - t0);
    if (o.warmup) {
        /* Untimed, as vLLM's initial test run: fails fast on a setup
         * error, and graphs or caches made lazily are made here. */
        bs_result w;
        request_run(&o, h0, &run.prompts[0], &w);
        free(w.itl);
        if (!w.ok) {
            fprintf(stderr, "llm-bench-serve: the warm-up request failed: %s\n", w.error);
            goto out;
        }
    }
    fprintf(stderr, "llm-bench-serve: %d requests, concurrency %d, %d output tokens each\n",
            o.num_prompts, o.concurrency, o.output_len);
    t0 = now_s();
    run_phase(&run, 1);
    rc = report(&o, &run, now_s() - t0);
out:
    http_free(h0);
    for (int i = 0; i < o.num_prompts; i++) {
        sb_free(&run.prompts[i].body);
        free(run.results[i].itl);
    }
    free(run.prompts);
    free(run.results);
    sb_free(&run.prep_error);
    pthread_mutex_destroy(&run.err_lock);
    return rc;
}
