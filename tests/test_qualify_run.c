/* build/bin/llm-qualify end to end against the fake server
 * (qualify_fake_server.c): a clean run passes every gate with exact
 * capacity targets, a well-formed status file and report, and artifact
 * hashes that match the files; each injected defect fails the gate it
 * belongs to, with a detail that says why; a random model's output checks
 * are never passed; the managed start is timed and stopped. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ipc/llm_ipc.h"
#include "artifacts.h"
#include "test_env.h"
#include "json.h"
#include "tap.h"

#define QUALIFY build_path("bin/llm-qualify")
#define FAKE build_path("tests/qualify_fake_server")

static char tmp[256];
static pid_t fakes[8];
static int n_fakes;
static pid_t running;   /* the llm-qualify being waited for */

static void cleanup(void)
{
    if (running > 0) {
        kill(running, SIGKILL);
        waitpid(running, NULL, 0);
        running = 0;
    }
    for (int i = 0; i < n_fakes; i++)
        if (fakes[i] > 0) {
            kill(fakes[i], SIGKILL);
            waitpid(fakes[i], NULL, 0);
        }
    n_fakes = 0;
    if (tmp[0]) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
        if (system(cmd) != 0) fprintf(stderr, "# could not remove %s\n", tmp);
        tmp[0] = 0;
    }
}

static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "not ok - test ran past its bound (30 s x $LLM_TEST_TIME_SCALE)\n";
    if (write(1, msg, sizeof msg - 1) < 0) _exit(2);
    cleanup();
    _exit(1);
}

static int free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (bind(s, (struct sockaddr *)&a, sizeof a) < 0 || getsockname(s, (struct sockaddr *)&a, &len) < 0) {
        close(s);
        return -1;
    }
    close(s);
    return ntohs(a.sin_port);
}

static int port_open(int port)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int rc = connect(s, (struct sockaddr *)&a, sizeof a) == 0;
    close(s);
    return rc;
}

/* Start the fake with extra arguments (NULL-terminated); returns its URL. */
static const char *fake(const char *const *extra)
{
    static char url[64];
    static int seq;
    char port_file[300];
    snprintf(port_file, sizeof port_file, "%s/port-%d", tmp, seq++);
    const char *argv[32] = { FAKE, "--port-file", port_file, "--model", "tiny", "--lifetime", "60" };
    int n = 7;
    for (int i = 0; extra && extra[i] && n < 30; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    fflush(stdout);
    pid_t p = fork();
    if (p == 0) {
        int fd = open("/dev/null", O_WRONLY);
        dup2(fd, 2);
        execv(FAKE, (char *const *)argv);
        _exit(127);
    }
    fakes[n_fakes++] = p;
    for (int i = 0; i < 200; i++) {
        FILE *f = fopen(port_file, "r");
        int port = 0;
        if (f && fscanf(f, "%d", &port) == 1) {
            fclose(f);
            snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
            return url;
        }
        if (f) fclose(f);
        usleep(10 * 1000);
    }
    return "http://127.0.0.1:1";
}

static void stop_fakes(void)
{
    for (int i = 0; i < n_fakes; i++) {
        kill(fakes[i], SIGKILL);
        waitpid(fakes[i], NULL, 0);
    }
    n_fakes = 0;
}

/* Run llm-qualify with its output in OUT/run.log; returns the exit code. */
static int qualify(const char *out, const char *url, const char *const *args)
{
    const char *argv[48] = { QUALIFY, "--base-url", url, "--model", "tiny", "--out", out,
                             "--admin-token", "secret" };
    int n = 9;
    for (int i = 0; args && args[i] && n < 46; i++) argv[n++] = args[i];
    argv[n] = NULL;
    mkdir(out, 0755);
    char log[400];
    snprintf(log, sizeof log, "%s/run.log", out);
    fflush(stdout);
    pid_t p = fork();
    if (p == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        execv(QUALIFY, (char *const *)argv);
        _exit(127);
    }
    running = p;
    int st;
    waitpid(p, &st, 0);
    running = 0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static yajl_val load_status(const char *out)
{
    char path[400], err[256];
    snprintf(path, sizeof path, "%s/qualification-status.json", out);
    strbuf sb;
    sb_init(&sb);
    yajl_val v = NULL;
    if (sb_read_file(&sb, path) == 0) v = json_parse(sb.data, sb.len, err, sizeof err);
    if (!v) diag("%s: missing or not JSON", path);
    sb_free(&sb);
    return v;
}

static yajl_val gate(yajl_val st, const char *id)
{
    yajl_val gates = json_get(st, "gates");
    for (size_t i = 0; i < json_len(gates); i++) {
        const char *g = json_string(json_get(gates->u.array.values[i], "id"));
        if (g && !strcmp(g, id)) return gates->u.array.values[i];
    }
    return NULL;
}

static const char *status_of(yajl_val st, const char *id)
{
    const char *s = json_string(json_get(gate(st, id), "status"));
    return s ? s : "(missing)";
}

/* Some check of the gate with this status has a detail containing text. */
static int has_check(yajl_val st, const char *id, const char *status, const char *text)
{
    yajl_val checks = json_get(gate(st, id), "checks");
    for (size_t i = 0; i < json_len(checks); i++) {
        yajl_val c = checks->u.array.values[i];
        const char *s = json_string(json_get(c, "status")), *d = json_string(json_get(c, "detail"));
        if (s && d && !strcmp(s, status) && strstr(d, text)) return 1;
    }
    diag("gate %s has no %s check mentioning \"%s\"", id, status, text);
    return 0;
}

static double num(yajl_val v)
{
    double d = -1;
    json_number(v, &d);
    return d;
}

/* Every listed artifact exists with the listed bytes and SHA-256, and
 * every file under artifacts/ is listed. */
static int artifacts_match(const char *out, yajl_val st, int *count)
{
    yajl_val arts = json_get(st, "artifacts");
    int good = json_len(arts) > 0;
    *count = (int)json_len(arts);
    for (size_t i = 0; i < json_len(arts); i++) {
        yajl_val a = arts->u.array.values[i];
        const char *rel = json_string(json_get(a, "path")), *sha = json_string(json_get(a, "sha256"));
        long long bytes = -2, listed = -1;
        json_int(json_get(a, "bytes"), &listed);
        char path[1024], hex[65] = "";
        snprintf(path, sizeof path, "%s/%s", out, rel ? rel : "");
        if (!rel || !sha || file_sha256(path, hex, &bytes) < 0 || strcmp(hex, sha) || bytes != listed) {
            diag("artifact %s: listed %s/%lld, file %s/%lld", rel ? rel : "?", sha ? sha : "-", listed,
                 hex, bytes);
            good = 0;
        }
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "find '%s/artifacts' -type f | wc -l", out);
    FILE *p = popen(cmd, "r");
    int files = -1;
    if (p && fscanf(p, "%d", &files) != 1) files = -1;
    if (p) pclose(p);
    if (files != *count) {
        diag("%d files under artifacts/, %d listed", files, *count);
        good = 0;
    }
    return good;
}

/* report.md has the table and one row per gate with its status. */
static int report_ok(const char *out, yajl_val st)
{
    char path[400];
    snprintf(path, sizeof path, "%s/report.md", out);
    strbuf md;
    sb_init(&md);
    int good = sb_read_file(&md, path) == 0 && strstr(md.data, "| Gate | Status | Result |\n|---|---|---|\n");
    yajl_val gates = json_get(st, "gates");
    for (size_t i = 0; good && i < json_len(gates); i++) {
        char row[256];
        snprintf(row, sizeof row, "| %s | %s", json_string(json_get(gates->u.array.values[i], "title")),
                 json_string(json_get(gates->u.array.values[i], "status")));
        if (!strstr(md.data, row)) {
            diag("report.md lacks the row \"%s\"", row);
            good = 0;
        }
    }
    sb_free(&md);
    return good;
}

/* The status file's shape: schema, result, identity, eight gates in the
 * r33 order, each with a known status, a bounded duration and the lists. */
static int well_formed(yajl_val st)
{
    static const char *const ids[] = { "cold_start", "prompt_contract", "functional", "quality",
                                       "capacity", "kv_allocation", "orphan_cleanup", "route" };
    const char *schema = json_string(json_get(st, "schema"));
    const char *result = json_string(json_get(st, "result"));
    yajl_val gates = json_get(st, "gates");
    int good = schema && !strcmp(schema, "llm-qualify/status/1") && result
               && (!strcmp(result, "pass") || !strcmp(result, "fail"))
               && YAJL_IS_OBJECT(json_get(st, "identity")) && json_len(gates) == 8;
    for (size_t i = 0; good && i < 8; i++) {
        yajl_val g = gates->u.array.values[i];
        const char *id = json_string(json_get(g, "id")), *s = json_string(json_get(g, "status"));
        double d = num(json_get(g, "duration_s")), b = num(json_get(g, "bound_s"));
        good = id && !strcmp(id, ids[i]) && s
               && (!strcmp(s, "pass") || !strcmp(s, "fail") || !strcmp(s, "skipped")
                   || !strcmp(s, "not_meaningful"))
               && d >= 0 && b > 0 && d <= b + 1 && YAJL_IS_OBJECT(json_get(g, "measurements"))
               && YAJL_IS_ARRAY(json_get(g, "checks")) && YAJL_IS_ARRAY(json_get(g, "caveats"))
               && YAJL_IS_ARRAY(json_get(g, "artifacts")) && json_string(json_get(g, "summary"));
        if (!good) diag("gate %zu (%s) is malformed", i, id ? id : "?");
    }
    return good;
}

static void clean_run(void)
{
    char out[300], recipe[300], contract[300], cfg_hash[65], recipe_hash[65];
    snprintf(out, sizeof out, "%s/clean", tmp);
    snprintf(recipe, sizeof recipe, "%s/recipe.yaml", tmp);
    snprintf(contract, sizeof contract, "%s/contract.json", tmp);
    char cwd[256];
    if (!getcwd(cwd, sizeof cwd)) cwd[0] = 0;
    FILE *f = fopen(recipe, "w");
    fprintf(f, "name: tiny-qualify\nrun_dir: %s\nbackend: cpu\nmodel:\n  path: %s/tests/fixtures/tiny-a\n"
               "  served_model_name: tiny\nmax_model_len: 4096\n", tmp, cwd);
    fclose(f);
    file_sha256(recipe, recipe_hash, NULL);
    file_sha256("tests/fixtures/tiny-a/config.json", cfg_hash, NULL);

    const char *url = fake(NULL);
    const char *args[] = { "--recipe", recipe, "--write-contract", contract, NULL };
    is_int(qualify(out, url, args), 0, "clean run: exit 0");
    yajl_val st = load_status(out);
    ok(well_formed(st), "clean run: the status file is well-formed (8 gates in order, bounded durations)");
    is_str(json_string(json_get(st, "result")), "pass", "clean run: result pass");
    static const char *const pass_ids[] = { "prompt_contract", "functional", "quality", "capacity",
                                            "kv_allocation", "orphan_cleanup", "route" };
    int all = 1;
    for (int i = 0; i < 7; i++)
        if (strcmp(status_of(st, pass_ids[i]), "pass")) {
            diag("%s: %s", pass_ids[i], status_of(st, pass_ids[i]));
            all = 0;
        }
    ok(all, "clean run: every gate but the cold start passes");
    is_str(status_of(st, "cold_start"), "skipped", "clean run: no --start-cmd, the cold start is skipped");

    yajl_val id = json_get(st, "identity");
    is_str(json_string(json_get(id, "model_config_sha256")), cfg_hash,
           "identity: the model config hash is SHA-256 of the recipe's model.path/config.json");
    is_str(json_string(json_get(id, "recipe_sha256")), recipe_hash, "identity: the recipe hash");
    is_str(json_string(json_get(id, "engine_version")), "fake-1.0", "identity: engine version from /health");
    is_int(num(json_get(id, "max_model_len")), 4096, "identity: max_model_len from /v1/models");

    /* capacity: exact, monotonic, up to the limit; over the limit a 400 */
    yajl_val m = json_get(gate(st, "capacity"), "measurements");
    yajl_val probes = json_get(m, "probes");
    int exact = json_len(probes) == 5;
    double prev = 0, last = 0;
    for (size_t i = 0; i < json_len(probes); i++) {
        yajl_val p = probes->u.array.values[i];
        double t = num(json_get(p, "target")), r = num(json_get(p, "prompt_tokens_reported"));
        if (t != r || num(json_get(p, "prompt_tokens_tokenize")) != t || r <= prev) exact = 0;
        prev = last = r;
        if (num(json_get(p, "ttft_s")) < 0 || num(json_get(p, "e2e_s")) < 0) exact = 0;
    }
    ok(exact, "capacity: 5 targets, each API-reported count equal to its target, rising, timed");
    is_int(last, 4096 - 256, "capacity: the largest is max_model_len minus the completion budget");
    yajl_val over = json_get(m, "over_limit");
    ok(num(json_get(over, "status")) == 400 && num(json_get(over, "prompt_tokens")) == 3841
           && !strcmp(json_string(json_get(over, "code")) ? json_string(json_get(over, "code")) : "",
                      "context_length_exceeded"),
       "capacity: one token over the limit gets 400 context_length_exceeded");

    /* contract: three different prompts, fingerprints, the pinned file */
    yajl_val eff = json_get(json_get(gate(st, "prompt_contract"), "measurements"), "efforts");
    double low = num(json_get(json_get(eff, "low"), "prompt_tokens"));
    double high = num(json_get(json_get(eff, "high"), "prompt_tokens"));
    double max = num(json_get(json_get(eff, "max"), "prompt_tokens"));
    const char *fp = json_string(json_get(json_get(eff, "max"), "fingerprint"));
    ok(low > 0 && high > low && max > high && fp && strlen(fp) == 64,
       "contract: low/high/max = %.0f/%.0f/%.0f tokens with SHA-256 fingerprints", low, high, max);
    ok(has_check(st, "prompt_contract", "pass", "agrees with the server"),
       "contract: our fingerprint agrees with the server's");
    ok(access(contract, R_OK) == 0, "contract: --write-contract wrote %s", contract);
    is_int(num(json_get(json_get(gate(st, "functional"), "measurements"), "passed")), 6,
           "functional: 6/6");
    ok(has_check(st, "orphan_cleanup", "pass", "removed the segment and its stale socket"),
       "orphan cleanup: the real janitor removed the planted segment on the second scan");
    ok(has_check(st, "route", "pass", "HTTP 503 with Retry-After"), "route: refused while draining");

    int count = 0;
    int match = artifacts_match(out, st, &count);
    ok(match, "artifacts: all %d listed with hashes and sizes that match "
       "their files, none unlisted", count);
    ok(report_ok(out, st), "report.md: the gates table with a row per gate");
    yajl_tree_free(st);

    /* The pinned contract holds; a tampered one fails with the drift. */
    snprintf(out, sizeof out, "%s/pinned", tmp);
    const char *pin[] = { "--contract", contract, "--gates", "prompt_contract", NULL };
    is_int(qualify(out, url, pin), 0, "contract: the pinned values hold on a rerun");
    strbuf c;
    sb_init(&c);
    sb_read_file(&c, contract);
    char key[64];
    snprintf(key, sizeof key, "\"prompt_tokens\":%.0f", high);
    char *at = strstr(c.data, key);
    if (at) at[strlen(key) - 1]++;   /* one more token than pinned */
    f = fopen(contract, "w");
    fputs(c.data, f);
    fclose(f);
    sb_free(&c);
    snprintf(out, sizeof out, "%s/drift", tmp);
    is_int(qualify(out, url, pin), 1, "contract: a drifted value fails the run");
    st = load_status(out);
    ok(has_check(st, "prompt_contract", "fail", "drift: pinned"), "contract: the failure names the drift");
    yajl_tree_free(st);
    stop_fakes();
}

/* One defect, the gates it concerns, and what the failure must say. */
static void defect(const char *name, const char *const *fake_args, const char *gates,
                   const char *const *more, const char *gate_id, const char *text)
{
    char out[300];
    snprintf(out, sizeof out, "%s/%s", tmp, name);
    const char *url = fake(fake_args);
    const char *args[16] = { "--gates", gates };
    int n = 2;
    for (int i = 0; more && more[i]; i++) args[n++] = more[i];
    args[n] = NULL;
    int rc = qualify(out, url, args);
    yajl_val st = load_status(out);
    ok(rc == 1 && !strcmp(status_of(st, gate_id), "fail") && has_check(st, gate_id, "fail", text),
       "%s: exit 1, %s fails saying \"%s\"", name, gate_id, text);
    yajl_tree_free(st);
    stop_fakes();
}

static void defects(void)
{
    defect("usage-mismatch", (const char *[]){ "--fault", "usage-off-by-one", NULL }, "capacity", NULL,
           "capacity", "usage.prompt_tokens is 1921 but /tokenize counted 1920");
    defect("vague-400", (const char *[]){ "--fault", "vague-400", NULL }, "capacity", NULL, "capacity",
           "does not state the limit 4096; the prompt's 3841 tokens; the 256 requested completion");
    defect("no-kv", (const char *[]){ "--fault", "no-kv", NULL }, "kv_allocation", NULL, "kv_allocation",
           "reports the KV capacity");
    defect("small-kv", (const char *[]){ "--fault", "small-kv", NULL }, "kv_allocation", NULL,
           "kv_allocation", "2171 tokens cannot hold one 4096-token sequence");
    defect("route-change", (const char *[]){ "--fault", "route-change", NULL }, "route", NULL, "route",
           "routes or promotions changed");
    defect("slow-readmit", (const char *[]){ "--readmit-delay-ms", "3000", NULL }, "route",
           (const char *[]){ "--readmit-timeout", "1", NULL }, "route", "not readmitted within 1 s");
    defect("bad-tool-args", (const char *[]){ "--fault", "bad-tool-args", NULL }, "functional", NULL,
           "functional", "0/20 forced calls valid against the schema; first bad: tool-call-01: $.city: 5 "
           "is not of type \"string\"");
    defect("fingerprint", (const char *[]){ "--fault", "fingerprint-mismatch", NULL }, "prompt_contract",
           NULL, "prompt_contract", "differs from the SHA-256 of its own token ids");
    defect("effort-ignored", (const char *[]){ "--fault", "effort-ignored", NULL }, "prompt_contract",
           NULL, "prompt_contract", "reasoning_effort is ignored");
    defect("no-done", (const char *[]){ "--fault", "no-done", NULL }, "functional", NULL, "functional",
           "the stream ended without data: [DONE]");
    defect("over-target", NULL, "capacity", (const char *[]){ "--capacity-targets", "1000,5000", NULL },
           "capacity", "target 5000 exceeds max_model_len 4096");
}

/* No KV numbers over HTTP: with --recipe the gate reads the engine's
 * header through `llm-engine status` (a real engine, scripted runner). */
static void kv_from_engine(void)
{
    char recipe[300], name[64], out[300];
    snprintf(name, sizeof name, "qualify-kv-%d", (int)getpid());
    snprintf(recipe, sizeof recipe, "%s/kv.yaml", tmp);
    FILE *f = fopen(recipe, "w");
    fprintf(f, "name: %s\nrun_dir: %s\nbackend: cpu\nmodel:\n  path: /nonexistent/x\n"
               "  served_model_name: tiny\nmax_model_len: 4096\n", name, tmp);
    fclose(f);
    fflush(stdout);
    pid_t eng = fork();
    if (eng == 0) {
        int fd = open("/dev/null", O_WRONLY);
        dup2(fd, 2);
        execl(build_path("tests/llm-engine-test"), "llm-engine-test", "serve", "--recipe", recipe,
              "--test-runner", "scripted", (char *)NULL);
        _exit(127);
    }
    fakes[n_fakes++] = eng;   /* killed with the fakes */
    char sock[400];
    snprintf(sock, sizeof sock, "%s/%s.sock", tmp, name);
    for (int i = 0; i < 300 && access(sock, F_OK) < 0; i++) usleep(10 * 1000);
    const char *url = fake((const char *[]){ "--fault", "no-kv", NULL });
    snprintf(out, sizeof out, "%s/kv-engine", tmp);
    const char *a[] = { "--gates", "kv_allocation", "--recipe", recipe, NULL };
    is_int(qualify(out, url, a), 0, "KV from the engine's header when HTTP does not report it");
    yajl_val st = load_status(out);
    yajl_val e = json_get(json_get(gate(st, "kv_allocation"), "measurements"), "engines");
    yajl_val e0 = json_len(e) ? e->u.array.values[0] : NULL;
    const char *src = json_string(json_get(e0, "source"));
    ok(src && !strcmp(src, "llm-engine status") && num(json_get(e0, "capacity_tokens")) > 0
           && num(json_get(e0, "concurrency_at_max_model_len")) > 0,
       "source llm-engine status, %.0f tokens, %.2fx max_model_len", num(json_get(e0, "capacity_tokens")),
       num(json_get(e0, "concurrency_at_max_model_len")));
    const char *bin = json_string(json_get(json_get(st, "identity"), "engine_bin_version"));
    ok(bin && !strncmp(bin, "llm-engine ", 11), "identity: the local engine binary's version (%s)",
       bin ? bin : "none");
    yajl_tree_free(st);
    stop_fakes();
    char shm[LLM_IPC_SHM_NAME_MAX];
    llm_ipc_shm_name(shm, tmp, name);
    shm_unlink(shm);
}

/* A failed probe is replayed only with --capacity-retries, and the failed
 * attempt stays on record (r33 kept its 400 at 120K). */
static void retained_failure(void)
{
    char out[300];
    const char *url = fake((const char *[]){ "--fault", "flaky-400", NULL });
    snprintf(out, sizeof out, "%s/flaky-retry", tmp);
    const char *a[] = { "--gates", "capacity", "--capacity-retries", "1", NULL };
    is_int(qualify(out, url, a), 0, "a probe that fails once passes on its replay");
    yajl_val st = load_status(out);
    yajl_val cav = json_get(gate(st, "capacity"), "caveats");
    const char *c0 = json_len(cav) ? json_string(cav->u.array.values[0]) : NULL;
    ok(c0 && strstr(c0, "retained failure: target 960, attempt 1: HTTP 400") && strstr(c0, "injected"),
       "the failed attempt is kept as a caveat with its error: %s", c0 ? c0 : "none");
    yajl_val p0 = json_get(json_get(gate(st, "capacity"), "measurements"), "probes");
    is_int(num(json_get(json_len(p0) ? p0->u.array.values[0] : NULL, "attempts")), 2,
           "and the probe records 2 attempts");
    yajl_tree_free(st);
    stop_fakes();
    defect("flaky-no-retry", (const char *[]){ "--fault", "flaky-400", NULL }, "capacity", NULL,
           "capacity", "HTTP 400 invalid_request_error/-: injected transient failure");
}

static void random_model(void)
{
    char out[300];
    const char *dumb[] = { "--dumb", NULL };
    snprintf(out, sizeof out, "%s/dumb", tmp);
    const char *url = fake(dumb);
    const char *g[] = { "--gates", "functional,quality", "--tool-calls", "3", "--k", "2", NULL };
    is_int(qualify(out, url, g), 1, "a model that writes filler fails without --model-is-random");
    yajl_val st = load_status(out);
    ok(!strcmp(status_of(st, "quality"), "fail") && has_check(st, "quality", "fail", "0/2; arithmetic-1 answered"),
       "quality fails and shows the wrong answer");
    ok(!strcmp(status_of(st, "functional"), "fail") && has_check(st, "functional", "fail", "no tool call"),
       "functional fails: no tool call");
    yajl_tree_free(st);

    snprintf(out, sizeof out, "%s/random", tmp);
    const char *r[] = { "--gates", "functional,quality", "--tool-calls", "3", "--k", "2",
                        "--model-is-random", NULL };
    is_int(qualify(out, url, r), 0, "with --model-is-random the run does not fail on model output");
    st = load_status(out);
    is_str(status_of(st, "quality"), "not_meaningful", "quality is not_meaningful, never pass");
    is_str(status_of(st, "functional"), "not_meaningful", "functional is not_meaningful");
    ok(has_check(st, "functional", "pass", "prompt + ") && has_check(st, "functional", "pass", "output items"),
       "its protocol checks (smoke, Responses API) still pass on their own merit");
    yajl_tree_free(st);
    stop_fakes();
}

static void managed_start(void)
{
    char out[300], cmd[300];
    int port = free_port();
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    snprintf(cmd, sizeof cmd, "exec %s --port %d --model tiny --startup-delay-ms 400 --lifetime 30",
             FAKE, port);
    snprintf(out, sizeof out, "%s/start", tmp);
    const char *a[] = { "--start-cmd", cmd, "--gates", "cold_start,kv_allocation", NULL };
    is_int(qualify(out, url, a), 0, "managed start: exit 0");
    yajl_val st = load_status(out);
    double t = num(json_get(json_get(gate(st, "cold_start"), "measurements"), "seconds_to_ready"));
    ok(!strcmp(status_of(st, "cold_start"), "pass") && t >= 0.35 && t < 10,
       "managed start: ready (health + one token) in %.2f s, after the 0.4 s startup", t);
    ok(!port_open(port), "managed start: the stack is stopped when the run ends");
    yajl_tree_free(st);

    snprintf(out, sizeof out, "%s/start-fails", tmp);
    const char *b[] = { "--start-cmd", "echo boom >&2; exit 3", "--gates", "cold_start,functional", NULL };
    is_int(qualify(out, url, b), 1, "a start command that dies: exit 1");
    st = load_status(out);
    ok(has_check(st, "cold_start", "fail", "exited with status 3 before the stack was ready; log tail: boom"),
       "the failure gives the exit status and the log tail");
    ok(num(json_get(gate(st, "cold_start"), "duration_s")) < 1, "and comes as soon as the command dies");
    is_str(json_string(json_get(gate(st, "functional"), "skip_reason")),
           "the managed stack did not become ready", "the HTTP gates are skipped with the reason");
    yajl_tree_free(st);

    const char *busy = fake(NULL);
    snprintf(out, sizeof out, "%s/start-busy", tmp);
    const char *c[] = { "--start-cmd", "sleep 5", "--gates", "cold_start", "--gate-timeout",
                        "cold_start=5", NULL };
    is_int(qualify(out, busy, c), 1, "something already serving: exit 1");
    st = load_status(out);
    ok(has_check(st, "cold_start", "fail", "already answers /health"), "no cold start can be measured");
    yajl_tree_free(st);
    stop_fakes();
}

static void usage_errors(void)
{
    char out[300];
    snprintf(out, sizeof out, "%s/usage", tmp);
    const char *a[] = { "--gates", "capacity,nonsense", NULL };
    is_int(qualify(out, "http://127.0.0.1:1", a), 2, "an unknown gate is a usage error");
    const char *b[] = { "--capacity-targets", "2000,1000", NULL };
    is_int(qualify(out, "http://127.0.0.1:1", b), 2, "capacity targets that do not rise: usage error");
    const char *c[] = { "--gates", "route", NULL };
    snprintf(out, sizeof out, "%s/unreachable", tmp);
    is_int(qualify(out, "http://127.0.0.1:1", c), 1, "nothing at the URL: the route gate fails");
    yajl_val st = load_status(out);
    ok(has_check(st, "route", "fail", "GET /v1/models: no HTTP response"), "saying nothing answered");
    yajl_tree_free(st);
}

int main(void)
{
    snprintf(tmp, sizeof tmp, "/tmp/llm-qualify-test-XXXXXX");
    if (!mkdtemp(tmp)) {
        printf("Bail out! mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    atexit(cleanup);
    signal(SIGALRM, on_alarm);
    alarm(test_time_bound(30));
    clean_run();
    defects();
    kv_from_engine();
    retained_failure();
    random_model();
    managed_start();
    usage_errors();
    return exit_status();
}
