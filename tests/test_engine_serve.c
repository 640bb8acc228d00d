/* The engine daemon with the scripted runner, through the client library
 * and the CLI: event streams, errors, tokenize, cancel and abandon,
 * max_num_seqs with FIFO admission, several client processes, status and
 * client commands. */
#include "tap.h"
#include "engine_harness.h"

static const char *name;
static pid_t engine;

/* Index of the first line containing needle, or -1. */
static int line_of(const char *text, const char *needle)
{
    const char *p = strstr(text, needle);
    if (!p) return -1;
    int n = 0;
    for (const char *q = text; q < p; q++) n += *q == '\n';
    return n;
}

static void test_stream(llm_ipc_client *c)
{
    const char *body =
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hé there\"}],"
        "\"test_script\":{\"reasoning\":\"mull it\",\"content\":\"Grüß dich, 世界!\","
        "\"tool_calls\":[{\"id\":\"call_7\",\"name\":\"lookup\",\"arguments\":\"{\\\"q\\\":\\\"x\\\"}\"}],"
        "\"tokens_per_step\":4}}";
    llm_ipc_handle h;
    is_int(h_submit(c, &h, body, LLM_KIND_CHAT), 0, "submit a chat request");
    strbuf out, content;
    sb_init(&out);
    sb_init(&content);
    int fin = h_collect(c, &h, 5000, &out, &content);
    is_int(fin, LLM_FINISH_TOOL_CALLS, "finish reason tool_calls");
    is_str(content.data, "Grüß dich, 世界!", "content deltas concatenate to the script's content");
    ok(strstr(out.data, "{\"type\":\"prompt_info\",\"prompt_tokens\":8,") == out.data,
       "prompt_info comes first with the prompt's 8 code points");
    ok(strstr(out.data, "{\"type\":\"reasoning_delta\",\"text\":\"mull\"}")
       && strstr(out.data, "{\"type\":\"reasoning_delta\",\"text\":\" it\"}"),
       "reasoning in 4-token steps");
    ok(strstr(out.data, "{\"type\":\"tool_call_begin\",\"index\":0,\"id\":\"call_7\",\"name\":\"lookup\"}")
       != NULL, "tool_call_begin carries id and name");
    /* 7 reasoning + 14 content tokens precede the 9 argument tokens, so
     * 4-token steps cut them as {"q | ":"x | "} */
    ok(strstr(out.data, "{\"type\":\"tool_call_args_delta\",\"index\":0,\"text\":\"{\\\"q\"}")
       && strstr(out.data, "{\"type\":\"tool_call_args_delta\",\"index\":0,\"text\":\"\\\":\\\"x\"}")
       && strstr(out.data, "{\"type\":\"tool_call_args_delta\",\"index\":0,\"text\":\"\\\"}\"}"),
       "arguments stream in deltas, steps running across phases");
    int r = line_of(out.data, "reasoning_delta"), k = line_of(out.data, "content_delta");
    int b = line_of(out.data, "tool_call_begin"), e = line_of(out.data, "tool_call_end");
    int u = line_of(out.data, "\"usage\""), f = line_of(out.data, "\"finish\"");
    ok(r >= 0 && r < k && k < b && b < e && e < u && u < f, "order: reasoning, content, tool call, usage, finish");
    ok(strstr(out.data, "{\"type\":\"usage\",\"prompt_tokens\":8,\"completion_tokens\":30,"
                        "\"reasoning_tokens\":7,\"cached_tokens\":0}") != NULL,
       "usage counts 7 + 14 + 9 = 30 completion tokens, 7 of them reasoning");
    ok(out.data[out.len - 1] == '\n' && strstr(out.data, "\"finish\"") > strstr(out.data, "usage"),
       "finish is the last event");
    is_int(llm_ipc_slot_state(c, &h), LLM_SLOT_FINISHED, "slot is FINISHED after finish");
    is_int(llm_ipc_release(c, &h), 0, "release");
    is_int(llm_ipc_slot_state(c, &h), LLM_IPC_ESTALE, "the released handle is stale");
    sb_free(&out);
    sb_free(&content);
}

static void test_errors(llm_ipc_client *c)
{
    llm_ipc_handle h;
    strbuf out;
    sb_init(&out);
    h_submit(c, &h, "{\"messages\":[],\"max_tokens\":200,\"test_script\":{\"prompt_tokens\":4000}}",
             LLM_KIND_CHAT);
    is_int(h_collect(c, &h, 3000, &out, NULL), LLM_FINISH_ERROR, "over-long prompt ends in error");
    ok(strstr(out.data, "\"status\":400,\"code\":\"context_length_exceeded\"")
       && strstr(out.data, "maximum context length is 4096 tokens")
       && strstr(out.data, "you requested 4200 tokens (4000 in the messages, 200 in the completion)"),
       "context_length_exceeded states limit, prompt and completion tokens");
    llm_ipc_release(c, &h);

    sb_reset(&out);
    h_submit(c, &h, "{\"messages\": [", LLM_KIND_CHAT);
    is_int(h_collect(c, &h, 3000, &out, NULL), LLM_FINISH_ERROR, "malformed JSON ends in error");
    ok(strstr(out.data, "\"status\":400,\"code\":\"invalid_request\"") != NULL, "as a 400 invalid_request");
    llm_ipc_release(c, &h);

    sb_reset(&out);
    h_submit(c, &h, "{\"messages\":[{\"role\":\"user\",\"content\":\"hé!\"}]}", LLM_KIND_TOKENIZE);
    is_int(h_collect(c, &h, 3000, &out, NULL), LLM_FINISH_STOP, "tokenize finishes");
    ok(strstr(out.data, "{\"type\":\"tokens\",\"ids\":[104,233,33]}") != NULL,
       "tokenize answers with the prompt's code points");
    llm_ipc_release(c, &h);

    sb_reset(&out);
    h_submit(c, &h, "{\"max_tokens\":5,\"test_script\":{\"content\":\"abcdefghij\",\"tokens_per_step\":2}}",
             LLM_KIND_CHAT);
    strbuf content;
    sb_init(&content);
    is_int(h_collect(c, &h, 3000, &out, &content), LLM_FINISH_LENGTH, "max_tokens reached: finish length");
    is_str(content.data, "abcde", "exactly max_tokens tokens of content");
    llm_ipc_release(c, &h);
    sb_free(&content);
    sb_free(&out);
}

static const char *slow_body =
    "{\"test_script\":{\"content\":\"0123456789012345678901234567890123456789\","
    "\"tokens_per_step\":1,\"step_ms\":20}}";

static void test_cancel(llm_ipc_client *c)
{
    uint64_t cancelled = h_counter(c, LLM_CTR_REQUESTS_CANCELLED);
    llm_ipc_handle h;
    strbuf out;
    sb_init(&out);
    h_submit(c, &h, slow_body, LLM_KIND_CHAT);
    h_sleep_ms(100);
    is_int(llm_ipc_cancel(c, &h), 0, "cancel a running request");
    long t0 = h_now_ms();
    is_int(h_collect(c, &h, 3000, &out, NULL), LLM_FINISH_CANCELLED, "it ends with finish cancelled");
    diag("cancel took %ld ms (step is 20 ms)", h_now_ms() - t0);
    ok(strstr(out.data, "\"usage\"") && line_of(out.data, "usage") < line_of(out.data, "finish"),
       "usage comes before the cancelled finish");
    llm_ipc_release(c, &h);

    h_submit(c, &h, slow_body, LLM_KIND_CHAT);
    h_sleep_ms(100);
    is_int(llm_ipc_slot_state(c, &h), LLM_SLOT_RUNNING, "second request is running");
    uint32_t slot = h.slot;
    is_int(llm_ipc_release(c, &h), 0, "abandon it mid-stream");
    long end = h_now_ms() + 3000;
    while (h_now_ms() < end
           && LLM_SLOT_STATE(atomic_load(&llm_ipc_slot_at(c->hdr, slot)->word)) != LLM_SLOT_FREE)
        h_sleep_ms(2);
    is_int(LLM_SLOT_STATE(atomic_load(&llm_ipc_slot_at(c->hdr, slot)->word)), LLM_SLOT_FREE,
           "the engine frees the abandoned slot");
    /* The engine counts a finished request just after its finish event
     * reaches the ring, so allow it a moment. */
    end = h_now_ms() + 1000;
    while (h_now_ms() < end && h_counter(c, LLM_CTR_REQUESTS_CANCELLED) < cancelled + 2) h_sleep_ms(2);
    is_int(h_counter(c, LLM_CTR_REQUESTS_CANCELLED), cancelled + 2, "both count as cancelled");
    sb_free(&out);
}

/* 6 requests, max_num_seqs 2: never more than 2 run; admission is FIFO. */
static void test_max_num_seqs(llm_ipc_client *c)
{
    enum { N = 6 };
    llm_ipc_handle h[N];
    const char *body = "{\"test_script\":{\"content\":\"abcdefgh\",\"tokens_per_step\":1,\"step_ms\":10}}";
    int submitted = 0;
    for (int i = 0; i < N; i++) submitted += h_submit(c, &h[i], body, LLM_KIND_CHAT) == 0;
    is_int(submitted, N, "six requests submitted");
    int done[N] = { 0 }, started[N] = { 0 }, order[N], n_started = 0, n_done = 0;
    int max_running = 0, max_counter = 0;
    static unsigned char buf[2 * LLM_IPC_EVENT_MAX];
    long end = h_now_ms() + 10000;
    while (n_done < N && h_now_ms() < end) {
        int running = h_slots_in(c, LLM_SLOT_RUNNING);
        if (running > max_running) max_running = running;
        if ((int)h_counter(c, LLM_CTR_RUNNING) > max_counter) max_counter = (int)h_counter(c, LLM_CTR_RUNNING);
        llm_ipc_msg msgs[32];
        llm_ipc_recv(c, msgs, 32);
        for (int i = 0; i < N; i++) {
            if (done[i]) continue;
            long n = llm_ipc_read_events(c, &h[i], buf, sizeof buf);
            size_t off = 0;
            llm_ipc_event ev;
            while (n > 0 && llm_ipc_event_next(buf, (size_t)n, &off, &ev) == 1) {
                if (!started[i]) {
                    started[i] = 1;
                    order[n_started++] = i;
                }
                if (ev.type == LLM_EV_FINISH) {
                    done[i] = 1;
                    n_done++;
                    llm_ipc_release(c, &h[i]);
                }
            }
        }
        h_sleep_ms(1);
    }
    is_int(n_done, N, "all six finish");
    ok(max_running <= 2 && max_running >= 1, "at most max_num_seqs=2 slots RUNNING at once (saw %d)", max_running);
    ok(max_counter <= 2, "the running counter never passed 2 (saw %d)", max_counter);
    int fifo = n_started == N;
    for (int i = 0; fifo && i < N; i++) fifo = order[i] / 2 == i / 2;
    ok(fifo, "admitted in submission order, two at a time");
}

/* Four client processes at once, each checks its own stream; meanwhile
 * the engine never runs more than max_num_seqs=2 of their requests. */
static void test_processes(const llm_ipc_client *c)
{
    enum { N = 4 };
    pid_t kids[N];
    fflush(stdout);
    for (int i = 0; i < N; i++) {
        kids[i] = fork();
        if (kids[i] == 0) {
            llm_ipc_client c;
            if (h_attach_ready(&c, name, 3000)) _exit(10);
            char body[256], want[64];
            snprintf(want, sizeof want, "child %d says hello to the engine", i);
            snprintf(body, sizeof body, "{\"test_script\":{\"content\":\"%s\",\"tokens_per_step\":3,"
                     "\"step_ms\":2}}", want);
            int ok_all = 1;
            for (int round = 0; round < 3; round++) {
                llm_ipc_handle h;
                strbuf content;
                sb_init(&content);
                if (h_submit(&c, &h, body, LLM_KIND_CHAT)) _exit(11);
                if (h_collect(&c, &h, 8000, NULL, &content) != LLM_FINISH_STOP) _exit(12);
                ok_all &= content.data && !strcmp(content.data, want);
                llm_ipc_release(&c, &h);
                sb_free(&content);
            }
            _exit(ok_all ? 0 : 13);
        }
        h_track_child(kids[i]);
    }
    int max_running = 0, alive = N;
    while (alive) {
        int running = h_slots_in(c, LLM_SLOT_RUNNING);
        if (running > max_running) max_running = running;
        alive = 0;
        for (int i = 0; i < N; i++) {
            siginfo_t si;
            si.si_pid = 0;
            if (waitid(P_PID, (id_t)kids[i], &si, WEXITED | WNOHANG | WNOWAIT) == 0 && !si.si_pid) alive++;
        }
        h_sleep_ms(1);
    }
    ok(max_running >= 1 && max_running <= 2, "concurrent submissions from four processes: at most 2 running (saw %d)",
       max_running);
    int good = 0;
    for (int i = 0; i < N; i++) {
        int st;
        waitpid(kids[i], &st, 0);
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) good++;
        else diag("child %d: status %d", i, WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st));
    }
    is_int(good, N, "four client processes each get their own three streams intact");
}

/* The heartbeat comes from its own thread: a long step does not stop it. */
static void test_heartbeat(llm_ipc_client *c)
{
    llm_ipc_handle h;
    h_submit(c, &h, "{\"test_script\":{\"content\":\"ab\",\"step_ms\":1200}}", LLM_KIND_CHAT);
    int64_t worst = 0;
    long t0 = h_now_ms();
    while (h_now_ms() - t0 < 1000) {
        int64_t age = llm_ipc_heartbeat_age_ms(c);
        if (age > worst) worst = age;
        h_sleep_ms(5);
    }
    ok(worst < 600, "heartbeat stays fresh during a 1.2 s step (worst age %lld ms, period %d ms)",
       (long long)worst, LLM_IPC_HEARTBEAT_MS);
    llm_ipc_release(c, &h);
}

static void test_cli(void)
{
    yajl_val st = h_status(name);
    long long v;
    ok(st && !strcmp(json_string(json_get(st, "state")) ? json_string(json_get(st, "state")) : "", "ready"),
       "status: state ready");
    ok(json_int(json_get(st, "pid"), &v) && v == engine, "status: pid is the engine's");
    ok(json_int(json_get(json_get(st, "limits"), "max_num_seqs"), &v) && v == 2, "status: limits.max_num_seqs");
    ok(json_int(json_get(st, "requests_finished"), &v) && v >= 15, "status: requests_finished counted (%lld)", v);
    ok(json_int(json_get(st, "kv_capacity_tokens"), &v) && v > 0, "status: KV capacity");
    ok(json_int(json_get(st, "heartbeat_age_ms"), &v) && v < 1000, "status: heartbeat is fresh (%lld ms)", v);
    ok(json_string(json_get(st, "epoch")) && strlen(json_string(json_get(st, "epoch"))) == 16, "status: epoch as hex");
    yajl_tree_free(st);

    char req[320];
    snprintf(req, sizeof req, "%s/req.json", h_run_dir);
    FILE *f = fopen(req, "w");
    fputs("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"test_script\":{\"content\":\"ok then\","
          "\"tokens_per_step\":4}}", f);
    fclose(f);
    strbuf out;
    sb_init(&out);
    const char *args[] = { "client", "--run-dir", h_run_dir, "--name", name, "--request", req, NULL };
    is_int(h_run_cli(&out, args), 0, "client command exits 0");
    is_str(out.data, "{\"type\":\"prompt_info\",\"prompt_tokens\":1,\"cached_tokens\":0,\"fingerprint\":\"af63f54c86021707\"}\n"
                     "{\"type\":\"content_delta\",\"text\":\"ok t\"}\n"
                     "{\"type\":\"content_delta\",\"text\":\"hen\"}\n"
                     "{\"type\":\"usage\",\"prompt_tokens\":1,\"completion_tokens\":7,\"reasoning_tokens\":0,\"cached_tokens\":0}\n"
                     "{\"type\":\"finish\",\"reason\":\"stop\"}\n",
           "client command prints one JSON event per line");
    sb_free(&out);
    const char *absent[] = { "status", "--run-dir", h_run_dir, "--name", "no-such-engine", NULL };
    sb_init(&out);
    is_int(h_run_cli(&out, absent), 1, "status of an absent engine exits 1");
    ok(strstr(out.data, "\"state\":\"absent\"") != NULL, "and says absent");
    sb_free(&out);
}

/* The test hooks live only in build/tests/llm-engine-test: the production
 * binary refuses --test-runner and has no bench-ipc. */
static void test_no_hooks_in_production(void)
{
    char recipe[320];
    snprintf(recipe, sizeof recipe, "%s/%s.yaml", h_run_dir, name);
    strbuf out;
    sb_init(&out);
    const char *serve[] = { "serve", "--recipe", recipe, "--test-runner", "scripted", NULL };
    is_int(h_run_cli(&out, serve), 2, "llm-engine serve --test-runner: usage error (exit 2)");
    const char *bench[] = { "bench-ipc", "--iters", "1", NULL };
    is_int(h_run_cli(&out, bench), 2, "llm-engine bench-ipc: unknown command (exit 2)");
    sb_free(&out);
}

int main(void)
{
    h_init("serve");
    name = h_name("serve");
    engine = h_start_engine(name, h_recipe(name, 2, 16, NULL));
    llm_ipc_client c;
    if (h_ready(&c, name)) return exit_status();
    test_stream(&c);
    test_errors(&c);
    test_cancel(&c);
    test_max_num_seqs(&c);
    test_processes(&c);
    test_heartbeat(&c);
    test_cli();
    test_no_hooks_in_production();
    is_int(h_slots_in(&c, LLM_SLOT_FREE), 16, "every slot is free at the end");
    llm_ipc_detach(&c);
    return exit_status();
}
