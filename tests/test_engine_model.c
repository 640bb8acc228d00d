/* The serving runner with the real demo model (tests/fixtures/demo) behind
 * `llm-engine serve`: greedy tokens equal the argmax of a direct forward
 * pass (so chunked prefill, decode and sampling through the scheduler are
 * the model's), concurrent requests do not disturb each other, seeds
 * reproduce, stop strings cut output, the context limit is an error with
 * the numbers, user text never becomes a special token, cancel works. */
#include <math.h>

#include "tap.h"
#include "engine_harness.h"
#include "model.h"
#include "tokenizer.h"

#define DEMO "tests/fixtures/demo"
#define MAX_LEN 1024

static llm_ipc_client C;

/* Every event of one request, as JSON lines; returns the finish reason. */
static int run(const char *body, enum llm_ipc_kind kind, strbuf *lines, strbuf *content)
{
    llm_ipc_handle h;
    sb_reset(lines);
    if (content) sb_reset(content);
    if (h_submit(&C, &h, body, kind)) return -100;
    int fin = h_collect(&C, &h, 15000, lines, content);
    llm_ipc_release(&C, &h);
    return fin;
}

/* Values of "key":N (or "key":[N,...]) in the JSON lines of one event
 * type, in order.  A text scan: logprob lines carry raw token bytes that
 * need not be valid UTF-8. */
static int ints_of(const strbuf *lines, const char *type, const char *key, int32_t *out, int max)
{
    int n = 0;
    char want[64], k[64];
    snprintf(want, sizeof want, "\"type\":\"%s\"", type);
    snprintf(k, sizeof k, "\"%s\":", key);
    for (const char *p = lines->data; p && *p && n < max;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        const char *at = memmem(p, len, want, strlen(want)) ? memmem(p, len, k, strlen(k)) : NULL;
        if (at) {
            const char *q = at + strlen(k);
            bool list = *q == '[';
            if (list) q++;
            while (n < max && q < p + len) {
                char *e;
                long v = strtol(q, &e, 10);
                if (e == q) break;
                out[n++] = (int32_t)v;
                if (!list || *e != ',') break;
                q = e + 1;
            }
        }
        p = nl ? nl + 1 : p + len;
    }
    return n;
}

/* Greedy continuation of ids computed directly with the model API. */
static int direct_greedy(v4_model *m, const int32_t *prompt, int n, int steps, int32_t *out)
{
    strbuf err;
    sb_init(&err);
    v4_seq *s = v4_seq_new(m, &err);
    int vocab = v4_model_config(m)->vocab_size;
    float *logits = malloc(sizeof(float) * (size_t)vocab);
    v4_step_item it = { s, prompt, n, logits, false, NULL };
    int rc = v4_step(m, &it, 1, &err);
    for (int t = 0; t < steps && rc == 0; t++) {
        int best = 0;
        for (int i = 1; i < vocab; i++) if (logits[i] > logits[best]) best = i;
        out[t] = best;
        v4_step_item next = { s, &out[t], 1, logits, false, NULL };
        if (t + 1 < steps) rc = v4_step(m, &next, 1, &err);
    }
    if (rc) diag("direct forward: %s", err.data);
    free(logits);
    v4_seq_free(m, s);
    sb_free(&err);
    return rc;
}

int main(void)
{
    h_init("model");
    const char *name = h_name("model");
    char extra[512], path[300];
    if (!realpath(DEMO, path)) { perror(DEMO); return 1; }
    /* 16 batched tokens: every prompt is prefilled in several chunks */
    snprintf(extra, sizeof extra,
             "max_model_len: %d\ntensor_parallel_size: 2\nmax_num_batched_tokens: 16\n"
             "kv_cache_memory_bytes: 64MiB\nlog_stats_interval: 0.05\n"
             "model:\n  path: %s\n  served_model_name: demo\n",
             MAX_LEN, path);
    const char *recipe = h_recipe(name, 2, 8, extra);
    /* h_recipe writes a placeholder model mapping first; drop it */
    {
        strbuf r;
        sb_init(&r);
        sb_read_file(&r, recipe);
        char *dup = strstr(r.data, "model:\n  path: /nonexistent");
        if (dup) {
            char *end = strstr(dup, "max_num_seqs:");
            memmove(dup, end, strlen(end) + 1);
        }
        FILE *f = fopen(recipe, "w");
        fputs(r.data, f);
        fclose(f);
        sb_free(&r);
    }
    /* a bad LLM_SAMPLE_THREADS or LLM_PREFIX_MARK_MIN fails the load,
     * naming it */
    static const char *const bad_env[][4] = {   /* engine, variable, value, error */
        { "badthreads", "LLM_SAMPLE_THREADS", "0", "LLM_SAMPLE_THREADS=0: expected 1 to 64" },
        { "badmark", "LLM_PREFIX_MARK_MIN", "-1",
          "LLM_PREFIX_MARK_MIN=-1: expected 0 to 1073741824" },
    };
    for (size_t k = 0; k < sizeof bad_env / sizeof bad_env[0]; k++) {
        const char *bad = h_name(bad_env[k][0]);
        char brecipe[400];
        snprintf(brecipe, sizeof brecipe, "%s/%s.yaml", h_run_dir, bad);
        strbuf r;
        sb_init(&r);
        sb_read_file(&r, recipe);
        char *nl = strchr(r.data, '\n');     /* the first line is the name */
        FILE *f = fopen(brecipe, "w");
        fprintf(f, "name: %s%s", bad, nl ? nl : "\n");
        fclose(f);
        sb_free(&r);
        setenv(bad_env[k][1], bad_env[k][2], 1);
        pid_t b = h_start_engine_with(bad, brecipe, "model");
        is_int(h_wait_exit(b, 15000), 1, "%s=%s: the engine exits 1", bad_env[k][1], bad_env[k][2]);
        unsetenv(bad_env[k][1]);
        strbuf text;
        sb_init(&text);
        h_engine_log(bad, &text);
        ok(text.data && strstr(text.data, bad_env[k][3]), "... saying why");
        sb_free(&text);
    }
    /* four threads sample a step's choices (on the CPU backend one does
     * by default): the parallel path under the tests */
    setenv("LLM_SAMPLE_THREADS", "4", 1);
    pid_t engine = h_start_engine_with(name, recipe, "model");
    if (h_attach_ready(&C, name, 15000)) {
        ok(0, "engine with the demo model is ready");
        return exit_status();
    }
    ok(1, "engine with the demo model is ready");

    strbuf lines, content;
    sb_init(&lines);
    sb_init(&content);

    /* prompt ids via tokenize, generated ids via logprob events */
    const char *msgs = "\"messages\":[{\"role\":\"system\",\"content\":\"You are a helpful assistant who answers briefly.\"},"
        "{\"role\":\"user\",\"content\":\"Tell me about the sea and the mountains, please.\"}]";
    char body[1024];
    snprintf(body, sizeof body, "{%s}", msgs);
    int32_t prompt[512];
    is_int(run(body, LLM_KIND_TOKENIZE, &lines, NULL), LLM_FINISH_STOP, "tokenize answers");
    int np = ints_of(&lines, "tokens", "ids", prompt, 512);
    ok(np > 16, "chat prompt has %d tokens (more than one prefill chunk)", np);

    snprintf(body, sizeof body,
             "{%s,\"max_tokens\":10,\"temperature\":0,\"logprobs\":true,\"ignore_eos\":true}", msgs);
    is_int(run(body, LLM_KIND_CHAT, &lines, &content), LLM_FINISH_LENGTH, "greedy run ends at max_tokens");
    int32_t got[16], want[16];
    int ng = ints_of(&lines, "logprob", "token_id", got, 16);
    is_int(ng, 10, "one logprob event per generated token");
    int32_t usage[1];
    ok(ints_of(&lines, "usage", "completion_tokens", usage, 1) == 1 && usage[0] == 10,
       "usage counts 10 completion tokens");
    ok(ints_of(&lines, "usage", "prompt_tokens", usage, 1) == 1 && usage[0] == np,
       "usage prompt_tokens equals the tokenize count");

    v4_model *m = NULL;
    strbuf err;
    sb_init(&err);
    v4_options opt = { .tp = 1, .max_seqs = 1 };
    if (v4_model_load(&m, DEMO, &opt, &err)) diag("load: %s", err.data);
    ok(m && direct_greedy(m, prompt, np, 10, want) == 0
       && !memcmp(got, want, sizeof(int32_t) * 10),
       "served greedy tokens (tp 2, chunked prefill) equal a direct forward pass (tp 1)");
    if (m) v4_model_free(m);
    sb_free(&err);
    char greedy_text[4096];
    snprintf(greedy_text, sizeof greedy_text, "%s", content.data ? content.data : "");

    /* two at once: batching changes nothing */
    {
        llm_ipc_handle a, b;
        strbuf la, lb, ca, cb;
        sb_init(&la); sb_init(&lb); sb_init(&ca); sb_init(&cb);
        snprintf(body, sizeof body, "{%s,\"max_tokens\":10,\"temperature\":0,\"ignore_eos\":true}", msgs);
        int ra = h_submit(&C, &a, body, LLM_KIND_CHAT);
        int rb = h_submit(&C, &b, body, LLM_KIND_CHAT);
        int fa = ra ? -1 : h_collect(&C, &a, 15000, &la, &ca);
        int fb = rb ? -1 : h_collect(&C, &b, 15000, &lb, &cb);
        ok(fa == LLM_FINISH_LENGTH && fb == LLM_FINISH_LENGTH && !strcmp(ca.data, greedy_text)
           && !strcmp(cb.data, greedy_text), "two concurrent greedy requests give the same text");
        llm_ipc_release(&C, &a);
        llm_ipc_release(&C, &b);
        sb_free(&la); sb_free(&lb); sb_free(&ca); sb_free(&cb);
    }

    /* seeds */
    snprintf(body, sizeof body, "{%s,\"max_tokens\":12,\"temperature\":1.0,\"seed\":99}", msgs);
    run(body, LLM_KIND_CHAT, &lines, &content);
    char first[4096];
    snprintf(first, sizeof first, "%s", content.data ? content.data : "");
    run(body, LLM_KIND_CHAT, &lines, &content);
    ok(content.data && !strcmp(first, content.data), "same seed, same sampled text");

    /* n = 2: one request, two choices, each its own seed stream (seed + i),
     * so choice i is what n = 1 with seed 99 + i gives */
    {
        char want[2][4096];
        for (int i = 0; i < 2; i++) {
            snprintf(body, sizeof body, "{%s,\"max_tokens\":12,\"temperature\":1.0,"
                     "\"ignore_eos\":true,\"seed\":%d}", msgs, 99 + i);
            run(body, LLM_KIND_CHAT, &lines, &content);
            snprintf(want[i], sizeof want[i], "%s", content.data ? content.data : "");
        }
        snprintf(body, sizeof body, "{%s,\"max_tokens\":12,\"temperature\":1.0,"
                 "\"ignore_eos\":true,\"seed\":99,\"n\":2}", msgs);
        int fin = run(body, LLM_KIND_CHAT, &lines, NULL);
        strbuf got[2];
        sb_init(&got[0]);
        sb_init(&got[1]);
        int ends = 0, lengths = 0, bad = 0;
        long long completion = -1;
        for (const char *p = lines.data; p && *p;) {
            const char *nl = strchr(p, '\n');
            size_t len = nl ? (size_t)(nl - p) : strlen(p);
            char e[64];
            yajl_val v = json_parse(p, len, e, sizeof e);
            const char *type = json_string(json_get(v, "type"));
            long long ch = 0;
            json_int(json_get(v, "choice"), &ch);
            if (type && !strcmp(type, "content_delta")) {
                if (ch < 0 || ch > 1) bad++;
                else sb_puts(&got[ch], json_string(json_get(v, "text")));
            } else if (type && !strcmp(type, "finish") && json_get(v, "choice_end")) {
                ends++;
                lengths += !strcmp(json_string(json_get(v, "reason")), "length");
            } else if (type && !strcmp(type, "usage")) {
                json_int(json_get(v, "completion_tokens"), &completion);
            }
            yajl_tree_free(v);
            p = nl ? nl + 1 : p + len;
        }
        ok(fin == LLM_FINISH_STOP && ends == 2 && lengths == 2 && !bad,
           "n = 2: two choices end (length), then the request");
        ok(completion == 24, "n = 2: usage counts both choices' tokens (%lld)", completion);
        ok(got[0].data && got[1].data && !strcmp(got[0].data, want[0])
           && !strcmp(got[1].data, want[1]),
           "n = 2: choice i is the text of seed 99 + i");
        ok(strcmp(want[0], want[1]) != 0, "n = 2: the choices differ");
        sb_free(&got[0]);
        sb_free(&got[1]);

        snprintf(body, sizeof body, "{%s,\"max_tokens\":4,\"n\":3}", msgs);
        fin = run(body, LLM_KIND_CHAT, &lines, NULL);
        ok(fin == LLM_FINISH_ERROR && strstr(lines.data, "\"param\":\"n\"")
           && strstr(lines.data, "at most 2 sequences"),
           "n over max_num_seqs: 400 naming n");
    }

    /* stop string: a piece from the middle of the greedy text */
    {
        size_t L = strlen(greedy_text), k = L / 2;
        while (k > 0 && ((unsigned char)greedy_text[k] & 0xC0) == 0x80) k--;
        size_t e = k + 2;
        while (e < L && ((unsigned char)greedy_text[e] & 0xC0) == 0x80) e++;
        char stop[64];
        snprintf(stop, sizeof stop, "%.*s", (int)(e - k), greedy_text + k);
        const char *first_at = strstr(greedy_text, stop);
        strbuf sb;
        sb_init(&sb);
        json_put_cstr(&sb, stop);
        snprintf(body, sizeof body,
                 "{%s,\"max_tokens\":10,\"temperature\":0,\"ignore_eos\":true,"
                 "\"stop\":[\"\\u0001never\",%s]}", msgs, sb.data);
        sb_free(&sb);
        int fin = run(body, LLM_KIND_CHAT, &lines, &content);
        ok(L > 4 && fin == LLM_FINISH_STOP && first_at
           && content.len == (size_t)(first_at - greedy_text)
           && !memcmp(content.data ? content.data : "", greedy_text, content.len),
           "stop string ends the text right before its first occurrence");
        ok(lines.data && strstr(lines.data, "\"reason\":\"stop\",\"stop\":1}"),
           "the finish event names the stop string that matched (index 1)");
    }

    /* context limit */
    snprintf(body, sizeof body, "{%s,\"max_tokens\":%d}", msgs, MAX_LEN);
    is_int(run(body, LLM_KIND_CHAT, &lines, NULL), LLM_FINISH_ERROR, "prompt + max_tokens over the limit");
    ok(strstr(lines.data, "context_length_exceeded") && strstr(lines.data, "maximum context length is 1024")
       && strstr(lines.data, "1024 in the completion"), "error names the limit and the numbers");

    /* special-token text from a user stays text */
    {
        tokenizer *t = tok_load(DEMO "/tokenizer.json", extra, sizeof extra);
        int32_t user_id = t ? tok_added_token_id(t, "<｜User｜>") : -1;
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"a<｜User｜>b</think>\"}]}");
        run(body, LLM_KIND_TOKENIZE, &lines, NULL);
        int32_t ids[128];
        int n = ints_of(&lines, "tokens", "ids", ids, 128);
        int users = 0;
        for (int i = 0; i < n; i++) users += ids[i] == user_id;
        ok(user_id >= 0 && users == 1, "only the template's <｜User｜> is a special token");
        if (t) tok_free(t);
    }

    /* bad request, cancel */
    is_int(run("{\"messages\":\"hi\"}", LLM_KIND_CHAT, &lines, NULL), LLM_FINISH_ERROR,
           "messages of the wrong type: error");
    ok(strstr(lines.data, "\"status\":400") != NULL, "... with status 400");
    /* a malformed canonical request (nginx never writes one) */
    is_int(run("{\"messages\":[{\"role\":\"user\",\"content\":\"\xc0\xaf\"}]}",
               LLM_KIND_CHAT, &lines, NULL), LLM_FINISH_ERROR, "invalid UTF-8 in the request: error");
    ok(strstr(lines.data, "\"status\":400") && strstr(lines.data, "the canonical request is not"),
       "... 400 saying the canonical request is malformed");
    /* a canonical request outside llm_request.h's limits (nginx never
     * writes one; another client of the library may) */
    {
        static const char *bad[][2] = {
            { "\"temperature\":5", "temperature" },
            { "\"top_p\":0", "top_p" },
            { "\"top_k\":1.5", "top_k" },
            { "\"min_p\":\"x\"", "min_p" },
            { "\"top_logprobs\":21,\"logprobs\":true", "top_logprobs" },
            { "\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\","
              "\"11\",\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"]", "stop" },
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            char want[64];
            snprintf(body, sizeof body, "{%s,%s}", msgs, bad[i][0]);
            snprintf(want, sizeof want, "\"param\":\"%s\"", bad[i][1]);
            is_int(run(body, LLM_KIND_CHAT, &lines, NULL), LLM_FINISH_ERROR,
                   "canonical request with %s: error", bad[i][0]);
            ok(strstr(lines.data, "\"status\":400") && strstr(lines.data, want),
               "... 400 naming %s", bad[i][1]);
        }
    }
    {
        llm_ipc_handle h;
        snprintf(body, sizeof body, "{%s,\"max_tokens\":500,\"ignore_eos\":true}", msgs);
        h_submit(&C, &h, body, LLM_KIND_CHAT);
        h_sleep_ms(100);
        llm_ipc_cancel(&C, &h);
        int fin = h_collect(&C, &h, 15000, &lines, NULL);
        is_int(fin, LLM_FINISH_CANCELLED, "cancel ends a running request");
        ok(strstr(lines.data, "\"type\":\"usage\"") != NULL, "... after a usage event");
        llm_ipc_release(&C, &h);
    }

    /* The statistics lines (log_stats_interval 0.05 s, and the last
     * window at exit) account for every token the engine generated. */
    {
        uint64_t made = h_counter(&C, LLM_CTR_TOKENS_OUT);
        kill(engine, SIGTERM);
        is_int(h_wait_exit(engine, 15000), 0, "SIGTERM stops the idle engine");
        strbuf text;
        sb_init(&text);
        h_engine_log(name, &text);
        long long generated = 0, steps = 0, lines_seen = 0;
        int well_formed = 1;
        for (const char *p = text.data; p && (p = strstr(p, "stats over ")); p++) {
            long long st, g;
            double model;
            const char *a = strstr(p, " steps, "), *b = strstr(p, "tok/s (");
            b = b ? strstr(b + 1, "tok/s (") : NULL;   /* the second: generated */
            const char *c = strstr(p, "a step: model ");
            if (!a || !b || !c || sscanf(strstr(p, "s: ") + 3, "%lld", &st) != 1
                || sscanf(b + 7, "%lld", &g) != 1 || sscanf(c + 14, "%lf", &model) != 1
                || st < 1 || !(model > 0)) {
                well_formed = 0;
                break;
            }
            if (!lines_seen++) {
                const char *e = strchr(p, '\n');
                diag("%.*s", (int)(e ? e - p : 200), p);
            }
            steps += st;
            generated += g;
        }
        ok(lines_seen >= 2 && well_formed, "%lld statistics lines, each with steps and the "
           "model's time a step", lines_seen);
        ok(generated == (long long)made && steps >= generated / 8,
           "their generated tokens add up to the tokens_out counter (%lld, %llu)", generated,
           (unsigned long long)made);
        sb_free(&text);
    }
    sb_free(&lines);
    sb_free(&content);
    llm_ipc_detach(&C);
    return exit_status();
}
