/* A small deterministic OpenAI-style server for the llm-qualify tests: the
 * endpoints llm-qualify drives (/v1/models, /tokenize, /v1/chat/completions
 * streamed or not, /v1/responses, /health, /metrics, /admin/...), a fake
 * tokenizer with irregular costs (qualify_fake_tok.h) and a fake chat
 * template in which reasoning effort adds a paragraph.  Its "model"
 * answers the qualification questions by pattern (or, with --dumb, writes
 * filler like a random model).  --fault NAME switches on one defect at a
 * time so the tests can see each gate fail for the right reason.
 *
 *   qualify_fake_server [--port N] [--port-file F] [--model NAME]
 *       [--max-model-len N] [--admin-token T] [--dumb] [--fault NAME]...
 *       [--startup-delay-ms N] [--readmit-delay-ms N] [--lifetime S]
 *
 * Faults: usage-off-by-one, vague-400, fingerprint-mismatch,
 * bad-tool-args, no-kv, small-kv, route-change, effort-ignored, no-done,
 * flaky-400 (the first long streamed request gets a 400, as r33's 120K
 * attempt did).
 * One connection at a time, Connection: close. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "json.h"
#include "qualify_fake_tok.h"
#include "sha256.h"
#include "strbuf.h"

enum { BOS = 0, EOS = 1, USER = 2, ASSISTANT = 3, SYSTEM = 4, TOOL = 5, THINK = 6, END_THINK = 7,
       TOOLS = 8 };

static const char high_paragraph[] =
    "Reasoning effort: absolute maximum with no shortcuts permitted. Think carefully.";
static const char max_paragraph[] =
    "Reasoning effort: beyond maximum. Examine every step twice, consider every alternative "
    "and verify the answer before writing it.";

static struct {
    const char *model, *admin_token;
    long        max_model_len;
    int         dumb;
    char        faults[512];
    long        readmit_delay_ms;
    int         draining;
    double      resumed_at;
    int         promoted;
} S = { "fake-model", "secret", 4096, 0, "", 0, 0, 0, 0 };

static int fault(const char *name)
{
    char key[80];
    snprintf(key, sizeof key, ",%s,", name);
    return strstr(S.faults, key) != NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- token vectors ------------------------------------------------------ */

typedef struct {
    uint32_t *ids;
    long      n, cap;
} tokv;

static void tv_push(tokv *t, uint32_t id)
{
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 1024;
        t->ids = realloc(t->ids, (size_t)t->cap * sizeof *t->ids);
        if (!t->ids) abort();
    }
    t->ids[t->n++] = id;
}

static void tv_text(tokv *t, const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t len = ft_next(s, n, i);
        tv_push(t, ft_id(s + i, len));
        i += len;
    }
}


/* ---- the fake chat template ---------------------------------------------- */

/* Thinking mode and effort (0 chat, 1 low, 2 high, 3 max) as
 * CHAT_FORMAT.md maps the request. */
static int effort_of(yajl_val req)
{
    yajl_val kw = json_get(req, "chat_template_kwargs");
    int thinking = YAJL_IS_TRUE(json_get(kw, "thinking")) || YAJL_IS_TRUE(json_get(kw, "enable_thinking"));
    const char *e = json_string(json_get(req, "reasoning_effort"));
    if (!e) e = json_string(json_get(kw, "reasoning_effort"));
    if (!thinking || (e && !strcmp(e, "none"))) return 0;
    if (fault("effort-ignored") || !e) return 1;
    if (!strcmp(e, "high") || !strcmp(e, "medium")) return 2;
    if (!strcmp(e, "max") || !strcmp(e, "xhigh")) return 3;
    return 1;
}

static void render(yajl_val req, yajl_val messages, tokv *t)
{
    int effort = effort_of(req);
    tv_push(t, BOS);
    if (effort == 2) tv_text(t, high_paragraph, strlen(high_paragraph));
    if (effort == 3) tv_text(t, max_paragraph, strlen(max_paragraph));
    yajl_val tools = json_get(req, "tools");
    for (size_t i = 0; i < json_len(tools); i++) {
        strbuf sb;
        sb_init(&sb);
        json_dump(&sb, tools->u.array.values[i], JSON_PYTHON);
        tv_push(t, TOOLS);
        tv_text(t, sb.data, sb.len);
        sb_free(&sb);
    }
    for (size_t i = 0; i < json_len(messages); i++) {
        yajl_val m = messages->u.array.values[i];
        const char *role = json_string(json_get(m, "role"));
        const char *c = json_string(json_get(m, "content"));
        role = role ? role : "user";
        tv_push(t, !strcmp(role, "system") ? SYSTEM : !strcmp(role, "assistant") ? ASSISTANT
                   : !strcmp(role, "tool") ? TOOL : USER);
        if (c) tv_text(t, c, strlen(c));
        yajl_val calls = json_get(m, "tool_calls");
        for (size_t j = 0; j < json_len(calls); j++) {
            const char *a = json_string(json_get(json_get(calls->u.array.values[j], "function"), "arguments"));
            if (a) tv_text(t, a, strlen(a));
        }
        if (!strcmp(role, "assistant")) tv_push(t, EOS);
    }
    tv_push(t, ASSISTANT);
    tv_push(t, effort ? THINK : END_THINK);
}

/* The messages of a chat request, or of a Responses input string. */
static yajl_val messages_of(yajl_val req, strbuf *owned)
{
    yajl_val m = json_get(req, "messages");
    if (m) return m;
    const char *input = json_string(json_get(req, "input"));
    if (!input) return NULL;
    sb_puts(owned, "[{\"role\":\"user\",\"content\":");
    json_put_cstr(owned, input);
    sb_puts(owned, "}]");
    char err[64];
    return json_parse(owned->data, owned->len, err, sizeof err);
}

/* ---- the fake model ------------------------------------------------------- */

typedef struct {
    strbuf reasoning, content, args;
    int    tool_call;
} answer;

static const char *last_user(yajl_val messages)
{
    const char *u = "";
    for (size_t i = 0; i < json_len(messages); i++) {
        yajl_val m = messages->u.array.values[i];
        const char *role = json_string(json_get(m, "role"));
        const char *c = json_string(json_get(m, "content"));
        if (role && !strcmp(role, "user") && c) u = c;
    }
    return u;
}

static const char *last_role(yajl_val messages)
{
    size_t n = json_len(messages);
    const char *r = n ? json_string(json_get(messages->u.array.values[n - 1], "role")) : NULL;
    return r ? r : "";
}

static int any_contains(yajl_val messages, const char *needle)
{
    for (size_t i = 0; i < json_len(messages); i++) {
        const char *c = json_string(json_get(messages->u.array.values[i], "content"));
        if (c && strstr(c, needle)) return 1;
    }
    return 0;
}

static void think(yajl_val req, yajl_val messages, answer *a)
{
    const char *u = last_user(messages);
    yajl_val choice = json_get(req, "tool_choice");
    int forced = YAJL_IS_OBJECT(choice) || (json_string(choice) && !strcmp(choice->u.string, "required"));
    int has_tools = json_len(json_get(req, "tools")) > 0;
    if (effort_of(req)) sb_puts(&a->reasoning, "Let me think about this.");
    if (S.dumb) {
        sb_puts(&a->content, " lorem ipsum dolor sit amet consectetur adipiscing elit sed do");
        return;
    }
    if (has_tools && !strcmp(last_role(messages), "tool")) {
        sb_puts(&a->content, "It is 21 degrees and clear in Paris.");
    } else if (forced || (has_tools && strstr(u, "weather"))) {
        a->tool_call = 1;
        const char *city = strstr(u, "Tokyo") ? "Tokyo" : "Paris";
        if (fault("bad-tool-args")) sb_puts(&a->args, "{\"city\": 5}");
        else sb_printf(&a->args, "{\"city\": \"%s\", \"unit\": \"celsius\"}", city);
    } else if (json_string(json_get(json_get(req, "response_format"), "type"))) {
        sb_puts(&a->content, "{\"capital\": \"Paris\"}");
    } else if (strstr(u, "17 * 24")) {
        sb_puts(&a->content, "408");
    } else if (strstr(u, "bloops")) {
        sb_puts(&a->content, "Yes.");
    } else if (strstr(u, "code word did I")) {
        sb_puts(&a->content, any_contains(messages, "PLOVER-7") ? "PLOVER-7" : "I do not know.");
    } else if (strstr(u, "Remember this code word")) {
        sb_puts(&a->content, "OK");
    } else if (strstr(u, "secret number")) {
        const char *p = strstr(u, "secret number is ");
        if (p) sb_printf(&a->content, "%.5s", p + 17);
        else sb_puts(&a->content, "I did not find it.");
    } else if (strstr(u, "Which animal")) {
        sb_puts(&a->content, "The fox jumps over the dog, and then it rests by the river.");
    } else {
        sb_puts(&a->content, "Hello! This is the fake server speaking.");
    }
}

/* Cut the answer to max_tokens fake tokens; returns tokens used and sets
 * *length when it was cut. */
static long budget(answer *a, long max_tokens, int *length)
{
    strbuf *parts[3] = { &a->reasoning, &a->content, &a->args };
    long used = 0;
    *length = 0;
    for (int p = 0; p < 3; p++) {
        strbuf *s = parts[p];
        size_t i = 0;
        while (i < s->len && used < max_tokens) {
            i += ft_next(s->data, s->len, i);
            used++;
        }
        if (i < s->len) {
            s->len = i;
            s->data[i] = 0;
            *length = 1;
        }
    }
    if (a->tool_call && *length) a->tool_call = 0;   /* a cut call is text */
    return used;
}

/* ---- HTTP ------------------------------------------------------------------- */

static void send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w <= 0) {
            if (w < 0 && errno == EINTR) continue;
            return;
        }
        p += w;
        n -= (size_t)w;
    }
}

static void respond(int fd, int status, const char *ctype, const char *extra, const char *body, size_t n)
{
    const char *reason = status == 200 ? "OK" : status == 400 ? "Bad Request" : status == 401 ? "Unauthorized"
                         : status == 404 ? "Not Found" : status == 503 ? "Service Unavailable" : "Error";
    strbuf h;
    sb_init(&h);
    sb_printf(&h, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n%s\r\n",
              status, reason, ctype, n, extra ? extra : "");
    send_all(fd, h.data, h.len);
    send_all(fd, body, n);
    sb_free(&h);
}

static void respond_json(int fd, int status, const strbuf *body)
{
    respond(fd, status, "application/json", NULL, body->data ? body->data : "", body->len);
}

static void error(int fd, int status, const char *type, const char *code, const char *msg, const char *extra)
{
    strbuf b;
    sb_init(&b);
    sb_puts(&b, "{\"error\":{\"message\":");
    json_put_cstr(&b, msg);
    sb_printf(&b, ",\"type\":\"%s\",\"param\":null,\"code\":", type);
    if (code) json_put_cstr(&b, code);
    else sb_puts(&b, "null");
    sb_puts(&b, "}}");
    respond(fd, status, "application/json", extra, b.data, b.len);
    sb_free(&b);
}

static void stream_begin(int fd)
{
    static const char h[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                            "Cache-Control: no-cache\r\nConnection: close\r\n\r\n";
    send_all(fd, h, sizeof h - 1);
}

static void sse(int fd, const char *event, const strbuf *data)
{
    strbuf e;
    sb_init(&e);
    if (event) sb_printf(&e, "event: %s\n", event);
    sb_printf(&e, "data: %s\n\n", data->data);
    send_all(fd, e.data, e.len);
    sb_free(&e);
}

static int serving(void)
{
    return !S.draining && now_s() >= S.resumed_at;
}

/* ---- endpoints -------------------------------------------------------------- */

/* A KV pool of about three full-length sequences (small-kv: half of one). */
static long kv_tokens(void)
{
    return fault("small-kv") ? S.max_model_len / 2 + 123 : S.max_model_len * 3 + 123;
}

static void status_json(strbuf *b, int with_kv)
{
    int ready = serving();
    sb_printf(b, "{\"status\":\"%s\",\"routes\":[{\"model\":", ready ? "ok" : "unavailable");
    json_put_cstr(b, S.model);
    sb_printf(b, ",\"engines\":[\"fake-0\"],\"ready\":%s,\"promoted\":%s}],\"engines\":[{\"name\":"
                 "\"fake-0\",\"state\":\"%s\",\"draining\":%s,\"epoch\":\"00000000000000aa\","
                 "\"max_model_len\":%ld,\"engine_version\":\"fake-1.0\",\"engine_build\":"
                 "\"fake-1.0 (test)\",\"system_fingerprint\":\"fp-fake\",\"models\":[",
              ready ? "true" : "false", S.promoted ? "true" : "false",
              S.draining ? "draining" : ready ? "healthy" : "probing", S.draining ? "true" : "false",
              S.max_model_len);
    json_put_cstr(b, S.model);
    sb_puts(b, "]");
    if (with_kv && !fault("no-kv"))
        sb_printf(b, ",\"kv_capacity_tokens\":%ld,\"kv_capacity_bytes\":%ld", kv_tokens(),
                  kv_tokens() * 3584L);
    sb_puts(b, "}]}");
}

static void tokenize(int fd, yajl_val req)
{
    strbuf owned, b;
    sb_init(&owned);
    sb_init(&b);
    tokv t = { 0 };
    const char *prompt = json_string(json_get(req, "prompt"));
    yajl_val msgs = json_get(req, "messages");
    if (prompt) tv_text(&t, prompt, strlen(prompt));
    else if (msgs) render(req, msgs, &t);
    else {
        error(fd, 400, "invalid_request_error", NULL, "give prompt or messages", NULL);
        return;
    }
    sb_printf(&b, "{\"count\":%ld,\"max_model_len\":%ld,\"tokens\":[", t.n, S.max_model_len);
    sha256_ctx c;
    sha256_init(&c);
    for (long i = 0; i < t.n; i++) {
        sb_printf(&b, "%s%u", i ? "," : "", t.ids[i]);
        uint8_t le[4] = { (uint8_t)t.ids[i], (uint8_t)(t.ids[i] >> 8), (uint8_t)(t.ids[i] >> 16),
                          (uint8_t)(t.ids[i] >> 24) };
        sha256_update(&c, le, 4);
    }
    uint8_t d[32];
    char hex[65];
    sha256_final(&c, d);
    sha256_to_hex(d, hex);
    if (fault("fingerprint-mismatch")) hex[0] = hex[0] == '0' ? '1' : '0';
    sb_printf(&b, "],\"fingerprint\":\"%s\"}", hex);
    respond_json(fd, 200, &b);
    free(t.ids);
    sb_free(&b);
    sb_free(&owned);
}

/* Chat completions and Responses share the model; kind 'c' or 'r'. */
static void generate(int fd, yajl_val req, char kind)
{
    strbuf owned;
    sb_init(&owned);
    yajl_val msgs = messages_of(req, &owned);
    yajl_val parsed = owned.len ? msgs : NULL;
    const char *model = json_string(json_get(req, "model"));
    if (!model || strcmp(model, S.model)) {
        error(fd, 404, "invalid_request_error", "model_not_found", "The model does not exist.", NULL);
        goto out;
    }
    if (!json_len(msgs)) {
        error(fd, 400, "invalid_request_error", NULL, "messages must be a non-empty array", NULL);
        goto out;
    }
    if (!serving()) {
        error(fd, 503, "service_unavailable", "service_unavailable", "the engine is draining",
              "Retry-After: 1\r\n");
        goto out;
    }
    long long max_tokens = 256;
    json_int(json_get(req, kind == 'c' ? "max_tokens" : "max_output_tokens"), &max_tokens);
    tokv t = { 0 };
    render(req, msgs, &t);
    long prompt = t.n;
    free(t.ids);
    if (prompt + max_tokens > S.max_model_len) {
        char msg[512];
        if (fault("vague-400"))
            snprintf(msg, sizeof msg, "The prompt is too long.");
        else
            snprintf(msg, sizeof msg, "This model's maximum context length is %ld tokens. However, you "
                     "requested %lld tokens (%ld in the messages, %lld in the completion).",
                     S.max_model_len, prompt + max_tokens, prompt, max_tokens);
        error(fd, 400, "invalid_request_error", "context_length_exceeded", msg, NULL);
        goto out;
    }
    static int flaked;
    if (fault("flaky-400") && !flaked && prompt > 500 && YAJL_IS_TRUE(json_get(req, "stream"))) {
        flaked = 1;
        error(fd, 400, "invalid_request_error", NULL, "injected transient failure", NULL);
        goto out;
    }
    if (fault("usage-off-by-one") && prompt > 1000) prompt++;
    answer a;
    sb_init(&a.reasoning);
    sb_init(&a.content);
    sb_init(&a.args);
    a.tool_call = 0;
    think(req, msgs, &a);
    int length;
    long used = budget(&a, max_tokens, &length);
    const char *finish = length ? "length" : a.tool_call ? "tool_calls" : "stop";
    int stream = YAJL_IS_TRUE(json_get(req, "stream"));
    strbuf b;
    sb_init(&b);
    if (kind == 'r') {
        strbuf text;
        sb_init(&text);
        json_put_string(&text, a.content.data ? a.content.data : "", a.content.len);
        if (stream) {
            static const char *const types[] = {
                "response.created", "response.in_progress", "response.output_item.added",
                "response.content_part.added", "response.output_text.delta",
                "response.output_text.done", "response.content_part.done",
                "response.output_item.done", "response.completed" };
            stream_begin(fd);
            for (int i = 0; i < 9; i++) {
                sb_reset(&b);
                sb_printf(&b, "{\"type\":\"%s\",\"sequence_number\":%d", types[i], i);
                if (i == 4) sb_printf(&b, ",\"delta\":%s", text.data);
                if (i == 8) sb_printf(&b, ",\"response\":{\"object\":\"response\",\"status\":\"completed\","
                                      "\"usage\":{\"input_tokens\":%ld,\"output_tokens\":%ld}}", prompt, used);
                sb_putc(&b, '}');
                sse(fd, types[i], &b);
            }
        } else {
            sb_printf(&b, "{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"completed\",\"model\":");
            json_put_cstr(&b, S.model);
            sb_printf(&b, ",\"output\":[{\"type\":\"message\",\"role\":\"assistant\",\"content\":"
                          "[{\"type\":\"output_text\",\"text\":%s}]}],\"usage\":{\"input_tokens\":%ld,"
                          "\"output_tokens\":%ld,\"total_tokens\":%ld}}", text.data, prompt, used, prompt + used);
            respond_json(fd, 200, &b);
        }
        sb_free(&text);
    } else if (!stream) {
        sb_puts(&b, "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"model\":");
        json_put_cstr(&b, S.model);
        sb_puts(&b, ",\"system_fingerprint\":\"fp-fake\",\"choices\":[{\"index\":0,\"message\":{\"role\":"
                    "\"assistant\",\"content\":");
        if (a.tool_call) sb_puts(&b, "null");
        else json_put_string(&b, a.content.data ? a.content.data : "", a.content.len);
        if (a.reasoning.len) {
            sb_puts(&b, ",\"reasoning_content\":");
            json_put_string(&b, a.reasoning.data, a.reasoning.len);
        }
        if (a.tool_call) {
            sb_puts(&b, ",\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":"
                        "\"get_weather\",\"arguments\":");
            json_put_string(&b, a.args.data, a.args.len);
            sb_puts(&b, "}}]");
        }
        sb_printf(&b, "},\"finish_reason\":\"%s\"}],\"usage\":{\"prompt_tokens\":%ld,\"completion_tokens\":"
                      "%ld,\"total_tokens\":%ld,\"prompt_tokens_details\":{\"cached_tokens\":0}}}",
                  finish, prompt, used, prompt + used);
        respond_json(fd, 200, &b);
    } else {
        stream_begin(fd);
        sb_puts(&b, "{\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":"
                    "\"assistant\"}}]}");
        sse(fd, NULL, &b);
        /* one chunk per fake token of reasoning and content */
        strbuf *parts[2] = { &a.reasoning, &a.content };
        const char *keys[2] = { "reasoning_content", "content" };
        for (int p = 0; p < 2; p++) {
            strbuf *s = parts[p];
            for (size_t i = 0; i < s->len;) {
                size_t len = ft_next(s->data, s->len, i);
                sb_reset(&b);
                sb_printf(&b, "{\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"%s\":",
                          keys[p]);
                json_put_string(&b, s->data + i, len);
                sb_puts(&b, "}}]}");
                sse(fd, NULL, &b);
                i += len;
            }
        }
        if (a.tool_call) {
            sb_reset(&b);
            sb_puts(&b, "{\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":"
                        "[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":"
                        "\"get_weather\",\"arguments\":\"\"}}]}}]}");
            sse(fd, NULL, &b);
            size_t half = a.args.len / 2;
            for (int part = 0; part < 2; part++) {
                sb_reset(&b);
                sb_puts(&b, "{\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":"
                            "[{\"index\":0,\"function\":{\"arguments\":");
                json_put_string(&b, a.args.data + (part ? half : 0), part ? a.args.len - half : half);
                sb_puts(&b, "}}]}}]}");
                sse(fd, NULL, &b);
            }
        }
        sb_reset(&b);
        sb_printf(&b, "{\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},"
                      "\"finish_reason\":\"%s\"}]}", finish);
        sse(fd, NULL, &b);
        if (YAJL_IS_TRUE(json_get(json_get(req, "stream_options"), "include_usage"))) {
            sb_reset(&b);
            sb_printf(&b, "{\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":"
                          "%ld,\"completion_tokens\":%ld,\"total_tokens\":%ld,\"prompt_tokens_details\":"
                          "{\"cached_tokens\":0}}}", prompt, used, prompt + used);
            sse(fd, NULL, &b);
        }
        if (!fault("no-done")) send_all(fd, "data: [DONE]\n\n", 14);
    }
    sb_free(&b);
    sb_free(&a.reasoning);
    sb_free(&a.content);
    sb_free(&a.args);
out:
    if (parsed) yajl_tree_free(parsed);
    sb_free(&owned);
}

static void admin(int fd, const char *path, const char *auth)
{
    char want[256];
    snprintf(want, sizeof want, "Bearer %s", S.admin_token);
    if (!auth || strcmp(auth, want)) {
        error(fd, 401, "authentication_error", "invalid_token", "a valid bearer token is required", NULL);
        return;
    }
    strbuf b;
    sb_init(&b);
    if (!strncmp(path, "/admin/status", 13)) {
        status_json(&b, 0);
    } else if (!strncmp(path, "/admin/drain?engine=fake-0", 26)) {
        S.draining = 1;
        sb_puts(&b, "{\"engine\":\"fake-0\",\"draining\":true,\"state\":\"draining\"}");
    } else if (!strncmp(path, "/admin/resume?engine=fake-0", 27)) {
        S.draining = 0;
        S.resumed_at = now_s() + S.readmit_delay_ms / 1000.0;
        if (fault("route-change")) S.promoted = 1;
        sb_puts(&b, "{\"engine\":\"fake-0\",\"draining\":false,\"state\":\"probing\"}");
    } else {
        error(fd, 404, "invalid_request_error", "not_found", "no such admin operation or engine", NULL);
        sb_free(&b);
        return;
    }
    respond_json(fd, 200, &b);
    sb_free(&b);
}

static void handle(int fd, const char *method, const char *path, const char *auth, const char *body, size_t n)
{
    strbuf b;
    sb_init(&b);
    if (!strcmp(path, "/v1/models")) {
        sb_puts(&b, "{\"object\":\"list\",\"data\":[{\"id\":");
        json_put_cstr(&b, S.model);
        sb_printf(&b, ",\"object\":\"model\",\"owned_by\":\"fake\",\"max_model_len\":%ld}]}", S.max_model_len);
        respond_json(fd, 200, &b);
    } else if (!strncmp(path, "/health", 7)) {
        status_json(&b, 1);
        respond_json(fd, serving() ? 200 : 503, &b);
    } else if (!strcmp(path, "/metrics")) {
        sb_puts(&b, "# HELP llm_running Sequences running.\n# TYPE llm_running gauge\nllm_running 0\n");
        if (!fault("no-kv"))
            sb_printf(&b, "llm_engine_kv_capacity_tokens{engine=\"fake-0\"} %ld\n", kv_tokens());
        respond(fd, 200, "text/plain; version=0.0.4", NULL, b.data, b.len);
    } else if (!strncmp(path, "/admin/", 7)) {
        admin(fd, path, auth);
    } else if (!strcmp(method, "POST")) {
        char err[256];
        yajl_val req = json_parse(body, n, err, sizeof err);
        if (!req) error(fd, 400, "invalid_request_error", NULL, err, NULL);
        else if (!strcmp(path, "/tokenize")) tokenize(fd, req);
        else if (!strcmp(path, "/v1/chat/completions")) generate(fd, req, 'c');
        else if (!strcmp(path, "/v1/responses")) generate(fd, req, 'r');
        else error(fd, 404, "invalid_request_error", "model_not_found", "no such endpoint", NULL);
        yajl_tree_free(req);
    } else {
        error(fd, 404, "invalid_request_error", "model_not_found", "no such endpoint", NULL);
    }
    sb_free(&b);
}

/* Read one request (headers, then Content-Length bytes) and answer it. */
static void serve_conn(int fd)
{
    strbuf in;
    sb_init(&in);
    char buf[65536];
    char *hdr_end = NULL;
    size_t need = 0;
    for (;;) {
        ssize_t r = read(fd, buf, sizeof buf);
        if (r <= 0) break;
        sb_append(&in, buf, (size_t)r);
        if (!hdr_end && (hdr_end = strstr(in.data, "\r\n\r\n"))) {
            const char *cl = strcasestr(in.data, "\r\ncontent-length:");
            need = (size_t)(hdr_end - in.data) + 4 + (cl && cl < hdr_end ? strtoul(cl + 17, NULL, 10) : 0);
        }
        if (hdr_end && in.len >= need) break;
        hdr_end = NULL;   /* recomputed: in.data may have moved */
    }
    hdr_end = in.data ? strstr(in.data, "\r\n\r\n") : NULL;
    if (hdr_end) {
        char method[16] = "", path[1024] = "", auth[512] = "";
        sscanf(in.data, "%15s %1023s", method, path);
        const char *a = strcasestr(in.data, "\r\nauthorization:");
        if (a && a < hdr_end) {
            a += 16;
            while (*a == ' ') a++;
            size_t len = strcspn(a, "\r\n");
            snprintf(auth, sizeof auth, "%.*s", (int)len, a);
        }
        const char *body = hdr_end + 4;
        handle(fd, method, path, auth[0] ? auth : NULL, body, in.len - (size_t)(body - in.data));
    }
    sb_free(&in);
}

int main(int argc, char **argv)
{
    int port = 0;
    const char *port_file = NULL;
    long startup_ms = 0, lifetime = 120;
    strbuf faults;
    sb_init(&faults);
    sb_putc(&faults, ',');
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--dumb")) { S.dumb = 1; continue; }
        if (!v) { fprintf(stderr, "fake: %s needs a value\n", a); return 2; }
        i++;
        if (!strcmp(a, "--port")) port = atoi(v);
        else if (!strcmp(a, "--port-file")) port_file = v;
        else if (!strcmp(a, "--model")) S.model = v;
        else if (!strcmp(a, "--max-model-len")) S.max_model_len = atol(v);
        else if (!strcmp(a, "--admin-token")) S.admin_token = v;
        else if (!strcmp(a, "--fault")) sb_printf(&faults, "%s,", v);
        else if (!strcmp(a, "--startup-delay-ms")) startup_ms = atol(v);
        else if (!strcmp(a, "--readmit-delay-ms")) S.readmit_delay_ms = atol(v);
        else if (!strcmp(a, "--lifetime")) lifetime = atol(v);
        else { fprintf(stderr, "fake: unknown option %s\n", a); return 2; }
    }
    snprintf(S.faults, sizeof S.faults, "%s", faults.data);
    sb_free(&faults);
    signal(SIGPIPE, SIG_IGN);
    alarm((unsigned)lifetime);   /* never outlive a test that forgot us */
    if (startup_ms) usleep((useconds_t)startup_ms * 1000);
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(s, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(s, 16) < 0) {
        fprintf(stderr, "fake: cannot listen on port %d: %s\n", port, strerror(errno));
        return 1;
    }
    socklen_t alen = sizeof addr;
    getsockname(s, (struct sockaddr *)&addr, &alen);
    if (port_file) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", port_file);
        FILE *f = fopen(tmp, "w");
        if (!f) return 1;
        fprintf(f, "%d\n", ntohs(addr.sin_port));
        fclose(f);
        rename(tmp, port_file);
    }
    fprintf(stderr, "fake: serving %s on 127.0.0.1:%d\n", S.model, ntohs(addr.sin_port));
    for (;;) {
        int c = accept(s, NULL, NULL);
        if (c < 0) continue;
        serve_conn(c);
        close(c);
    }
}
