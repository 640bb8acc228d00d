/* janitor: a dead engine's segment is recorded on the first orphaned scan
 * and removed on the second consecutive one; a live engine's segment and
 * a dead one that a process still maps are never touched; a scan that
 * finds the segment in use again resets the count. */
#include "tap.h"
#include "engine_harness.h"

static strbuf scan_out;
static int scan_lines_ok = 1;

/* One janitor scan; its output stays in scan_out.  Every line must be a
 * JSON object with segment, action and reason. */
static void scan(void)
{
    sb_reset(&scan_out);
    const char *args[] = { "janitor", "--run-dir", h_run_dir, NULL };
    if (h_run_cli(&scan_out, args) != 0) scan_lines_ok = 0;
    for (char *line = scan_out.data; line && *line;) {
        char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        char err[128];
        yajl_val v = json_parse(line, len, err, sizeof err);
        if (!v || !json_string(json_get(v, "segment")) || !json_string(json_get(v, "action"))
            || !json_string(json_get(v, "reason")))
            scan_lines_ok = 0;
        yajl_tree_free(v);
        line = nl ? nl + 1 : line + len;
    }
}

/* The action the last scan printed for llm-<name> ("absent" if none). */
static const char *action(const char *name)
{
    static char act[32];
    char key[LLM_IPC_SHM_NAME_MAX + 32], shm[LLM_IPC_SHM_NAME_MAX];
    llm_ipc_shm_name(shm, h_run_dir, name);
    snprintf(key, sizeof key, "{\"segment\":\"%s\",\"action\":\"", shm + 1);
    const char *p = scan_out.data ? strstr(scan_out.data, key) : NULL;
    snprintf(act, sizeof act, "%s", p ? p + strlen(key) : "absent");
    act[strcspn(act, "\"")] = 0;
    return act;
}

static int segment_exists(const char *name)
{
    char shm[LLM_IPC_SHM_NAME_MAX], path[LLM_IPC_SHM_NAME_MAX + 16];
    llm_ipc_shm_name(shm, h_run_dir, name);
    snprintf(path, sizeof path, "/dev/shm%s", shm);
    return access(path, F_OK) == 0;
}

/* Start an engine, wait until ready, kill -9 it: its segment stays. */
static void dead_engine(const char *name)
{
    pid_t eng = h_start_engine(name, h_recipe(name, 1, 4, NULL));
    llm_ipc_client c;
    if (h_attach_ready(&c, name, 5000) == 0) llm_ipc_detach(&c);
    kill(eng, SIGKILL);
    h_wait_exit(eng, 3000);
}

/* A child that maps llm-<name> until killed. */
static pid_t mapper(const char *name)
{
    int p[2];
    if (pipe(p) < 0) return -1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        llm_ipc_client c;
        char err[256];
        int rc = llm_ipc_attach(&c, h_run_dir, name, 1, err, sizeof err);
        if (write(p[1], rc == 0 ? "y" : "n", 1) != 1) _exit(1);
        for (;;) pause();
    }
    h_track_child(pid);
    char ch = 'n';
    if (read(p[0], &ch, 1) != 1) ch = 'n';
    close(p[0]);
    close(p[1]);
    return ch == 'y' ? pid : -1;
}

int main(void)
{
    h_init("janitor");
    sb_init(&scan_out);
    const char *live = h_name("live"), *dead = h_name("dead"), *held = h_name("held"),
               *again = h_name("again");
    h_start_engine(live, h_recipe(live, 1, 4, NULL));
    llm_ipc_client c;
    ok(h_attach_ready(&c, live, 5000) == 0, "a live engine");
    llm_ipc_detach(&c);
    dead_engine(dead);
    ok(segment_exists(dead), "a dead engine's segment stays in /dev/shm");

    scan();
    is_str(action(live), "kept", "scan 1: the live engine's segment is kept");
    is_str(action(dead), "recorded", "scan 1: the dead engine's segment is recorded");
    ok(segment_exists(dead), "but not removed yet");
    scan();
    is_str(action(live), "kept", "scan 2: live kept again");
    is_str(action(dead), "removed", "scan 2: the orphan is removed");
    ok(!segment_exists(dead), "it is gone from /dev/shm");
    ok(segment_exists(live), "the live segment is untouched");
    scan();
    is_str(action(dead), "absent", "scan 3: nothing more to say about it");

    /* Dead engine, but a process still maps the segment: never removed. */
    dead_engine(held);
    pid_t m = mapper(held);
    ok(m > 0, "a process maps the dead engine's segment");
    scan();
    is_str(action(held), "kept", "scan: kept while mapped");
    char pidtxt[32];
    snprintf(pidtxt, sizeof pidtxt, "(%d)", (int)m);
    ok(strstr(scan_out.data, pidtxt) != NULL, "naming the process that maps it");
    scan();
    is_str(action(held), "kept", "next scan: still kept");
    kill(m, SIGKILL);
    waitpid(m, NULL, 0);
    scan();
    is_str(action(held), "recorded", "mapper gone: recorded");
    scan();
    is_str(action(held), "removed", "then removed");

    /* The two orphaned scans must be consecutive. */
    dead_engine(again);
    scan();
    is_str(action(again), "recorded", "orphan recorded");
    m = mapper(again);
    scan();
    is_str(action(again), "kept", "mapped again: kept, and the record is dropped");
    kill(m, SIGKILL);
    waitpid(m, NULL, 0);
    scan();
    is_str(action(again), "recorded", "orphaned again: recorded anew, not removed");
    ok(segment_exists(again), "still there");
    scan();
    is_str(action(again), "removed", "second consecutive orphaned scan: removed");
    ok(scan_lines_ok, "every janitor line is a JSON object with segment, action, reason");
    ok(segment_exists(live), "the live engine's segment survived every scan");
    sb_free(&scan_out);
    return exit_status();
}
