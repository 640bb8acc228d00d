/* Orphan cleanup: plant what a dead engine leaves behind (a 4,096-byte
 * /dev/shm/llm-qualify-* segment with a valid protocol header whose
 * engine pid is dead, nobody mapping it, and a stale <name>.sock in a
 * scratch run dir), then run `llm-engine janitor --run-dir SCRATCH` three
 * times: the first scan must record it and leave it, the second must
 * remove it (segment and socket), the third must find nothing of it
 * (clean postcondition, nothing left in janitor.state). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "command.h"
#include "ipc/llm_ipc.h"
#include "json.h"
#include "qualify.h"

#define FIXTURE_BYTES 4096

/* A pid that existed a moment ago and is now gone. */
static pid_t dead_pid(void)
{
    pid_t p = fork();
    if (p == 0) _exit(0);
    if (p < 0) return -1;
    waitpid(p, NULL, 0);
    return kill(p, 0) < 0 && errno == ESRCH ? p : -1;
}

static int plant(const char *shm, const char *name, const char *sock_path, pid_t dead,
                 strbuf *why)
{
    int fd = shm_open(shm, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
        sb_printf(why, "cannot create %s: %s", shm, strerror(errno));
        return -1;
    }
    llm_ipc_header h;
    memset(&h, 0, sizeof h);
    h.magic = LLM_IPC_MAGIC;
    h.version = LLM_IPC_VERSION;
    h.header_bytes = sizeof h;
    h.segment_bytes = FIXTURE_BYTES;
    h.epoch = 0x716c66790000ULL | (uint64_t)(unsigned)dead;
    h.pid = dead;
    atomic_store(&h.state, LLM_STATE_STOPPED);
    snprintf(h.name, sizeof h.name, "%s", name);
    int bad = ftruncate(fd, FIXTURE_BYTES) < 0 || pwrite(fd, &h, sizeof h, 0) != (ssize_t)sizeof h;
    close(fd);   /* unmapped and not held open: only the janitor decides */
    if (bad) {
        sb_printf(why, "cannot write %s: %s", shm, strerror(errno));
        shm_unlink(shm);
        return -1;
    }
    /* A socket file nobody listens on, as a killed engine leaves it. */
    int s = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    size_t len = strlen(sock_path);
    if (len < sizeof a.sun_path) memcpy(a.sun_path, sock_path, len + 1);
    if (s < 0 || len >= sizeof a.sun_path || bind(s, (struct sockaddr *)&a, sizeof a) < 0) {
        sb_printf(why, "cannot create the stale socket %s: %s", sock_path, strerror(errno));
        if (s >= 0) close(s);
        shm_unlink(shm);
        return -1;
    }
    close(s);
    return 0;
}

/* The action the scan printed for segment file (NULL when none), and the
 * other segments it removed, appended to others. */
static const char *action_for(const char *out, const char *file, strbuf *others, char *act, size_t cap)
{
    const char *found = NULL;
    for (const char *p = out; p && *p;) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        char err[128];
        yajl_val v = json_parse(p, len, err, sizeof err);
        const char *seg = json_string(json_get(v, "segment"));
        const char *a = json_string(json_get(v, "action"));
        if (seg && a && !strcmp(seg, file)) {
            snprintf(act, cap, "%s", a);
            found = act;
        } else if (seg && a && others && !strcmp(a, "removed")) {
            sb_printf(others, "%s%s", others->len ? ", " : "", seg);
        }
        yajl_tree_free(v);
        p += len + (eol ? 1 : 0);
    }
    return found;
}

static bool exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

void gate_janitor(qctx *q, gate *g)
{
    char scratch[4096], name[LLM_IPC_NAME_MAX], shm[LLM_IPC_SHM_NAME_MAX], seg_path[128];
    const char *file = shm + 1;
    char sock_path[4200], state_path[4200];
    if (q->scratch_dir) {
        snprintf(scratch, sizeof scratch, "%s", q->scratch_dir);
        if (mkdir(scratch, 0700) < 0 && errno != EEXIST) {
            gate_check(g, ST_FAIL, "scratch", "cannot create %s: %s", scratch, strerror(errno));
            return;
        }
    } else {
        snprintf(scratch, sizeof scratch, "/tmp/llm-qualify-XXXXXX");
        if (!mkdtemp(scratch)) {
            gate_check(g, ST_FAIL, "scratch", "mkdtemp: %s", strerror(errno));
            return;
        }
    }
    if (access(q->engine_bin, X_OK) < 0) {
        gate_check(g, ST_FAIL, "engine binary", "%s is not executable (--engine-bin)", q->engine_bin);
        rmdir(scratch);
        return;
    }
    pid_t dead = dead_pid();
    snprintf(name, sizeof name, "qualify-%d-%04x", (int)getpid(), (unsigned)(random() & 0xffff));
    llm_ipc_shm_name(shm, scratch, name);
    snprintf(seg_path, sizeof seg_path, "/dev/shm/%s", file);
    snprintf(sock_path, sizeof sock_path, "%s/%s.sock", scratch, name);
    snprintf(state_path, sizeof state_path, "%s/janitor.state", scratch);
    jw_str(&g->mw, "run_dir", scratch);
    jw_str(&g->mw, "segment", seg_path);
    jw_int(&g->mw, "fixture_bytes", FIXTURE_BYTES);
    jw_int(&g->mw, "dead_pid", dead);
    strbuf why, out, others;
    sb_init(&why);
    sb_init(&out);
    sb_init(&others);
    if (dead < 0 || plant(shm, name, sock_path, dead, &why) < 0) {
        gate_check(g, ST_FAIL, "fixture", "%s", dead < 0 ? "no dead pid to plant" : why.data);
        goto out;
    }
    gate_check(g, ST_PASS, "fixture", "planted %s (%d bytes, engine pid %d dead, unmapped) and a "
               "stale %s", seg_path, FIXTURE_BYTES, (int)dead, sock_path);
    for (int scan = 1; scan <= 3; scan++) {
        sb_reset(&out);
        sb_reset(&why);
        char label[32], check[32], act[32];
        snprintf(label, sizeof label, "scan-%d", scan);
        snprintf(check, sizeof check, "scan %d", scan);
        char *argv[] = { (char *)q->engine_bin, "janitor", "--run-dir", scratch, NULL };
        int rc = run_command(q, argv, &out, &why);
        q_keep(q, label, ".jsonl", out.data ? out.data : "", out.len);
        if (rc < 0) {
            gate_check(g, ST_FAIL, check, "%s", why.data);
            break;
        }
        const char *a = action_for(out.data, file, scan == 2 ? &others : NULL, act, sizeof act);
        bool seg = exists(seg_path), sock = exists(sock_path);
        if (scan == 1) {
            if (a && !strcmp(a, "recorded") && seg)
                gate_check(g, ST_PASS, check, "recorded, not removed (first orphaned scan)");
            else
                gate_check(g, ST_FAIL, check, "expected \"recorded\" with the segment still there; "
                           "got action %s, segment %s", a ? a : "none", seg ? "present" : "gone");
        } else if (scan == 2) {
            if (a && !strcmp(a, "removed") && !seg && !sock)
                gate_check(g, ST_PASS, check, "removed the segment and its stale socket (second "
                           "consecutive orphaned scan)");
            else
                gate_check(g, ST_FAIL, check, "expected \"removed\" with segment and socket gone; "
                           "got action %s, segment %s, socket %s", a ? a : "none",
                           seg ? "present" : "gone", sock ? "present" : "gone");
        } else {
            strbuf state;
            sb_init(&state);
            bool in_state = sb_read_file(&state, state_path) == 0 && state.data
                            && strstr(state.data, file);
            if (!a && !seg && !sock && !in_state)
                gate_check(g, ST_PASS, "postcondition", "a third scan finds nothing of the fixture "
                           "and janitor.state does not list it");
            else
                gate_check(g, ST_FAIL, "postcondition", "after removal: action %s, segment %s, "
                           "socket %s, janitor.state %s", a ? a : "none", seg ? "present" : "gone",
                           sock ? "present" : "gone", in_state ? "still lists it" : "clean");
            sb_free(&state);
        }
        if (g->n_fail) break;
    }
    if (others.len)
        gate_caveat(g, "the janitor also removed other orphaned segments on this host: %s",
                    others.data);
    if (!g->n_fail)
        gate_summary(g, "Reclaimed %s planted %d-byte fixture through the guarded two-scan path; "
                     "clean postcondition%s", others.len ? "the" : "exactly one", FIXTURE_BYTES,
                     others.len ? " (other orphans were reclaimed too: see caveats)" : "");
out:
    /* Leave nothing behind whatever happened. */
    if (exists(seg_path)) shm_unlink(shm);
    unlink(sock_path);
    unlink(state_path);
    if (rmdir(scratch) < 0 && !q->scratch_dir)
        gate_caveat(g, "could not remove the scratch dir %s: %s", scratch, strerror(errno));
    sb_free(&why);
    sb_free(&out);
    sb_free(&others);
}
