/* llm-qualify: run the r33 qualification gates against a serving stack
 * and write OUT/qualification-status.json and OUT/report.md.  Exit 0 when
 * no required gate failed, 1 when one did, 2 on a usage or setup error. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "qualify.h"

static const char usage_text[] =
    "usage: llm-qualify --base-url URL --model NAME --out DIR [options]\n"
    "\n"
    "  --recipe FILE            recipe served (hashes it and model.path/config.json)\n"
    "  --start-cmd CMD          start the stack (sh -c, own process group) and time it;\n"
    "                           stopped when the run ends unless --keep-running\n"
    "  --stop-cmd CMD           run at the end instead of signalling the process group\n"
    "  --contract FILE          fail on drift from pinned prompt-contract values\n"
    "  --write-contract FILE    pin the current prompt-contract values\n"
    "  --gates LIST             gates to run (default all): cold_start,prompt_contract,\n"
    "                           functional,quality,capacity,kv_allocation,orphan_cleanup,route\n"
    "  --advisory LIST          gates whose failure does not fail the run\n"
    "  --admin-token T          bearer token for /admin (or env LLM_ADMIN_TOKEN)\n"
    "  --engine NAME            engine to drain in the route gate (default: the route's first)\n"
    "  --engine-bin PATH        llm-engine for the janitor (default build/bin/llm-engine)\n"
    "  --scratch-dir DIR        run dir for the janitor fixture (default: a new /tmp dir)\n"
    "  --model-is-random        model-output checks are not_meaningful (tiny random model)\n"
    "  --tool-calls N           forced tool calls in the preflight (20)\n"
    "  --k N                    repeats of each quality check (3)\n"
    "  --quality-effort E       reasoning effort for quality checks (high)\n"
    "  --max-tokens N           completion budget of preflight/quality requests (1024,\n"
    "                           at most max_model_len/2)\n"
    "  --needle-tokens N        needle context size in tokens (32768)\n"
    "  --capacity-targets LIST  exact prompt token counts, strictly increasing\n"
    "  --capacity-fractions LIST  targets as fractions of max_model_len - budget\n"
    "                           (default 0.25,0.5,0.75,0.9,1)\n"
    "  --capacity-max-tokens N  completion budget of capacity requests (256)\n"
    "  --capacity-retries N     replays of a failed capacity probe, each failure kept (0)\n"
    "  --request-timeout S      bound of one request (600)\n"
    "  --readmit-timeout S      readmission bound after resume (60)\n"
    "  --gate-timeout GATE=S    bound of a gate (repeatable)\n"
    "  --no-drain-check         do not require 503 while the only engine drains\n";

static const struct {
    const char *id, *title;
    double      bound_s;
} gate_defs[G_N] = {
    [G_COLD_START] = { "cold_start", "Cold managed start", 900 },
    [G_CONTRACT] = { "prompt_contract", "Reasoning prompt contract", 120 },
    [G_FUNCTIONAL] = { "functional", "Functional preflight", 900 },
    [G_QUALITY] = { "quality", "Repeated quality", 1800 },
    [G_CAPACITY] = { "capacity", "Near-limit capacity", 3600 },
    [G_KV] = { "kv_allocation", "KV allocation", 60 },
    [G_JANITOR] = { "orphan_cleanup", "Orphan cleanup", 120 },
    [G_ROUTE] = { "route", "Route and readmission", 300 },
};

static void on_signal(int sig)
{
    (void)sig;
    http_interrupted = 1;
}

static int die_usage(const char *fmt, const char *arg)
{
    fprintf(stderr, "llm-qualify: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(llm-qualify --help for usage)\n");
    return 2;
}

static int gate_index(const char *id, size_t len)
{
    for (int i = 0; i < G_N; i++)
        if (strlen(gate_defs[i].id) == len && !strncmp(gate_defs[i].id, id, len)) return i;
    return -1;
}

/* "a,b,c" of gate ids -> flags; -1 on an unknown id (named in bad). */
static int parse_gates(const char *list, bool *flags, char *bad, size_t cap)
{
    for (int i = 0; i < G_N; i++) flags[i] = false;
    for (const char *p = list; *p;) {
        size_t len = strcspn(p, ",");
        int g = gate_index(p, len);
        if (g < 0) {
            snprintf(bad, cap, "%.*s", (int)len, p);
            return -1;
        }
        flags[g] = true;
        p += len + (p[len] == ',');
    }
    return 0;
}

static int parse_long(const char *s, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min || v > max) return -1;
    *out = v;
    return 0;
}

static int parse_double(const char *s, double min, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= min)) return -1;
    *out = v;
    return 0;
}

static void run_stop_cmd(const char *cmd)
{
    fflush(NULL);
    pid_t p = fork();
    if (p == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; p > 0 && i < 600; i++) {   /* at most 60 s */
        if (waitpid(p, NULL, WNOHANG) == p) return;
        usleep(100 * 1000);
    }
    if (p > 0) {
        fprintf(stderr, "llm-qualify: --stop-cmd still runs after 60 s; killing it\n");
        kill(p, SIGKILL);
        waitpid(p, NULL, 0);
    }
}

int main(int argc, char **argv)
{
    qctx q;
    memset(&q, 0, sizeof q);
    q.engine_bin = "build/bin/llm-engine";
    q.quality_effort = "high";
    q.request_timeout_s = 600;
    q.readmit_timeout_s = 60;
    q.tool_calls = 20;
    q.quality_k = 3;
    q.quality_max_tokens = 1024;
    q.needle_tokens = 32768;
    q.capacity_max_tokens = 256;
    q.drain_check = true;
    q.admin_token = getenv("LLM_ADMIN_TOKEN");
    const double default_fracs[] = { 0.25, 0.5, 0.75, 0.9, 1.0 };
    q.n_fracs = 5;
    memcpy(q.target_fracs, default_fracs, sizeof default_fracs);
    const char *stop_cmd = NULL;
    bool selected[G_N], advisory[G_N] = { false };
    for (int i = 0; i < G_N; i++) selected[i] = true;
    double bounds[G_N];
    for (int i = 0; i < G_N; i++) bounds[i] = gate_defs[i].bound_s;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage_text, stdout);
            return 0;
        }
        bool flag = !strcmp(a, "--model-is-random") || !strcmp(a, "--keep-running")
                    || !strcmp(a, "--no-drain-check");
        if (flag) {
            if (!strcmp(a, "--model-is-random")) q.model_is_random = true;
            else if (!strcmp(a, "--keep-running")) q.keep_running = true;
            else q.drain_check = false;
            continue;
        }
        if (strncmp(a, "--", 2) || i + 1 >= argc) return die_usage("unexpected argument '%s'", a);
        const char *v = argv[++i];
        long n;
        char bad[64];
        if (!strcmp(a, "--base-url")) q.base_url = v;
        else if (!strcmp(a, "--model")) q.model = v;
        else if (!strcmp(a, "--out")) q.out_dir = v;
        else if (!strcmp(a, "--recipe")) q.recipe_path = v;
        else if (!strcmp(a, "--start-cmd")) q.start_cmd = v;
        else if (!strcmp(a, "--stop-cmd")) stop_cmd = v;
        else if (!strcmp(a, "--contract")) q.contract_path = v;
        else if (!strcmp(a, "--write-contract")) q.write_contract_path = v;
        else if (!strcmp(a, "--admin-token")) q.admin_token = v;
        else if (!strcmp(a, "--engine")) q.engine_name = v;
        else if (!strcmp(a, "--engine-bin")) q.engine_bin = v;
        else if (!strcmp(a, "--scratch-dir")) q.scratch_dir = v;
        else if (!strcmp(a, "--quality-effort")) q.quality_effort = v;
        else if (!strcmp(a, "--gates") || !strcmp(a, "--advisory")) {
            if (parse_gates(v, !strcmp(a, "--gates") ? selected : advisory, bad, sizeof bad) < 0)
                return die_usage("unknown gate '%s' (see --help)", bad);
        } else if (!strcmp(a, "--tool-calls") || !strcmp(a, "--k") || !strcmp(a, "--max-tokens")
                   || !strcmp(a, "--needle-tokens") || !strcmp(a, "--capacity-max-tokens")) {
            if (parse_long(v, 1, 100000000, &n) < 0)
                return die_usage("%s needs a positive integer", a);
            if (!strcmp(a, "--tool-calls")) q.tool_calls = (int)n;
            else if (!strcmp(a, "--k")) q.quality_k = (int)n;
            else if (!strcmp(a, "--max-tokens")) q.quality_max_tokens = (int)n;
            else if (!strcmp(a, "--needle-tokens")) q.needle_tokens = (int)n;
            else q.capacity_max_tokens = (int)n;
        } else if (!strcmp(a, "--capacity-retries")) {
            if (parse_long(v, 0, 10, &n) < 0) return die_usage("%s needs an integer 0..10", a);
            q.capacity_retries = (int)n;
        } else if (!strcmp(a, "--request-timeout") || !strcmp(a, "--readmit-timeout")) {
            double d;
            if (parse_double(v, 0.001, &d) < 0) return die_usage("%s needs seconds > 0", a);
            if (!strcmp(a, "--request-timeout")) q.request_timeout_s = d;
            else q.readmit_timeout_s = d;
        } else if (!strcmp(a, "--gate-timeout")) {
            const char *eq = strchr(v, '=');
            double d;
            int g = eq ? gate_index(v, (size_t)(eq - v)) : -1;
            if (g < 0 || parse_double(eq + 1, 0.001, &d) < 0)
                return die_usage("--gate-timeout needs GATE=SECONDS with a known gate, not '%s'", v);
            bounds[g] = d;
        } else if (!strcmp(a, "--capacity-targets") || !strcmp(a, "--capacity-fractions")) {
            bool ints = !strcmp(a, "--capacity-targets");
            int k = 0;
            for (const char *p = v; *p && k < MAX_TARGETS;) {
                char item[64];
                size_t len = strcspn(p, ",");
                snprintf(item, sizeof item, "%.*s", (int)len, p);
                double d;
                if (ints ? parse_long(item, 1, LONG_MAX, &n) < 0
                         : parse_double(item, 0, &d) < 0 || d <= 0 || d > 1)
                    return die_usage(ints ? "--capacity-targets: '%s' is not a positive integer"
                                          : "--capacity-fractions: '%s' is not in (0, 1]", item);
                if (ints) {
                    if (k && n <= q.targets[k - 1])
                        return die_usage("--capacity-targets must rise strictly: '%s' does not", v);
                    q.targets[k++] = n;
                } else {
                    if (k && d <= q.target_fracs[k - 1])
                        return die_usage("--capacity-fractions must rise strictly: '%s' does not", v);
                    q.target_fracs[k++] = d;
                }
                p += len + (p[len] == ',');
            }
            if (ints) q.n_targets = k;
            else q.n_fracs = k;
        } else {
            return die_usage("unknown option '%s'", a);
        }
    }
    if (!q.base_url || !q.model || !q.out_dir)
        return die_usage("%s", "--base-url, --model and --out are required");
    /* The managed stack is what the other gates talk to: it always starts. */
    if (q.start_cmd) selected[G_COLD_START] = true;

    if (mkdir(q.out_dir, 0755) < 0 && errno != EEXIST)
        return die_usage("cannot create --out %s", q.out_dir);
    strbuf err;
    sb_init(&err);
    if (art_init(&q.art, q.out_dir, &err) < 0) return die_usage("%s", err.data);
    q.http = http_new(q.base_url, q.admin_token);
    if (!q.http) return die_usage("%s", "cannot initialize libcurl");
    sb_init(&q.identity);
    sb_init(&q.identity_problem);
    sb_init(&q.stack_log);
    jw_init(&q.iw, &q.identity);
    for (int i = 0; i < G_N; i++) {
        gate_init(&q.gates[i], gate_defs[i].id, gate_defs[i].title, bounds[i]);
        q.gates[i].selected = selected[i];
        q.gates[i].required = !advisory[i];
    }
    if (q.gates[G_ROUTE].bound_s < q.readmit_timeout_s + 60) q.gates[G_ROUTE].bound_s = q.readmit_timeout_s + 60;

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESETHAND;   /* a second signal ends the run at once */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct timeval tv;
    gettimeofday(&tv, NULL);
    double started = (double)tv.tv_sec + tv.tv_usec * 1e-6, t0 = now_s();

    /* 1. cold start, 2. identity, 3. the rest in the r33 table's order. */
    bool stack_down = false;
    gate *cs = &q.gates[G_COLD_START];
    if (!cs->selected) gate_skip(cs, "not selected (--gates)");
    else if (!q.start_cmd) gate_skip(cs, "no --start-cmd: the stack was started outside llm-qualify");
    if (cs->skipped) {
        gate_end(&q, cs);
    } else {
        gate_begin(&q, cs);
        gate_cold_start(&q, cs);
        gate_end(&q, cs);
        stack_down = cs->status == ST_FAIL;
    }
    q.deadline = now_s() + 60;
    if (!stack_down) identity_collect(&q);

    void (*const run[G_N])(qctx *, gate *) = {
        [G_CONTRACT] = gate_contract, [G_FUNCTIONAL] = gate_functional,
        [G_QUALITY] = gate_quality,   [G_CAPACITY] = gate_capacity,
        [G_KV] = gate_kv,             [G_JANITOR] = gate_janitor,
        [G_ROUTE] = gate_route,
    };
    for (int i = G_CONTRACT; i < G_N; i++) {
        gate *g = &q.gates[i];
        bool http_gate = i != G_JANITOR;
        if (!g->selected) gate_skip(g, "not selected (--gates)");
        else if (http_interrupted) gate_skip(g, "the run was interrupted before this gate");
        else if (http_gate && stack_down) gate_skip(g, "the managed stack did not become ready");
        else if (i == G_ROUTE && !q.admin_token)
            gate_skip(g, "no --admin-token (or LLM_ADMIN_TOKEN): the admin API cannot be driven");
        if (g->skipped) {
            gate_end(&q, g);
            continue;
        }
        gate_begin(&q, g);
        if (http_gate && i != G_KV && (!q.model_served || !q.max_model_len))
            gate_check(g, ST_FAIL, "model", "%s", q.identity_problem.data);
        else
            run[i](&q, g);
        gate_end(&q, g);
    }

    if (q.stack_pid && !q.keep_running) {
        if (stop_cmd) run_stop_cmd(stop_cmd);
        stack_stop(&q);
    }
    int missing = art_finalize(&q.art);
    if (missing) fprintf(stderr, "llm-qualify: %d artifact(s) could not be read back\n", missing);
    int rc = report_write(&q, started, now_s() - t0, &err);
    bool failed = false;
    for (int i = 0; i < G_N; i++)
        if (q.gates[i].required && q.gates[i].status == ST_FAIL) failed = true;
    if (rc < 0)
        fprintf(stderr, "llm-qualify: %s; gates %s, but no report was written\n", err.data,
                failed ? "FAILED" : "passed");
    else
        fprintf(stderr, "llm-qualify: %s; wrote %s/qualification-status.json and report.md\n",
                failed ? "FAILED" : "passed", q.out_dir);

    for (int i = 0; i < G_N; i++) gate_free(&q.gates[i]);
    http_free(q.http);
    art_free(&q.art);
    sb_free(&q.identity);
    sb_free(&q.identity_problem);
    sb_free(&q.stack_log);
    sb_free(&err);
    return rc < 0 ? 2 : failed ? 1 : 0;
}
