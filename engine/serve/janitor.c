#include "janitor.h"

#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "json.h"
#include "procfs.h"
#include "segment.h"

/* A segment without a valid header may be one an engine is creating this
 * instant; only call it orphaned once it is this old. */
#define HEADERLESS_GRACE_S 60

struct record {
    char          name[256];
    unsigned long inode;
};

static int load_state(const char *path, struct record **recs)
{
    FILE *f = fopen(path, "r");
    int n = 0, cap = 0;
    *recs = NULL;
    if (!f) return 0;
    struct record r;
    while (fscanf(f, "%255s %lu", r.name, &r.inode) == 2) {
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            *recs = realloc(*recs, (size_t)cap * sizeof **recs);
        }
        (*recs)[n++] = r;
    }
    fclose(f);
    return n;
}

static bool recorded(const struct record *recs, int n, const char *name, unsigned long inode)
{
    for (int i = 0; i < n; i++)
        if (recs[i].inode == inode && !strcmp(recs[i].name, name)) return true;
    return false;
}

/* Whether /dev/shm/<file> is the segment of an engine of this run_dir (its
 * name carries the run_dir's hash), so its socket would be in run_dir. */
static bool ours(const char *run_dir, const llm_ipc_header *h, const char *file)
{
    char want[LLM_IPC_SHM_NAME_MAX], name[LLM_IPC_NAME_MAX];
    memcpy(name, h->name, sizeof name);
    name[sizeof name - 1] = 0;
    return llm_ipc_shm_name(want, run_dir, name) == 0 && !strcmp(want + 1, file);
}

/* Remove <run_dir>/<engine>.sock when nothing listens on it. */
static void remove_dead_socket(const char *run_dir, const char *engine)
{
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    int n = snprintf(a.sun_path, sizeof a.sun_path, "%s/%s.sock", run_dir, engine);
    if (n < 0 || (size_t)n >= sizeof a.sun_path) return;
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0) return;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0 && errno == ECONNREFUSED)
        unlink(a.sun_path);
    close(fd);
}

static void line(strbuf *out, const char *file, const char *action, int pid, const char *reason)
{
    sb_puts(out, "{\"segment\":");
    json_put_cstr(out, file);
    sb_puts(out, ",\"action\":");
    json_put_cstr(out, action);
    if (pid) sb_printf(out, ",\"pid\":%d", pid);
    sb_puts(out, ",\"reason\":");
    json_put_cstr(out, reason);
    sb_puts(out, "}\n");
}

int janitor_scan(const char *run_dir, strbuf *out, strbuf *err)
{
    char state_path[4096], tmp_path[4200];
    snprintf(state_path, sizeof state_path, "%s/janitor.state", run_dir);
    snprintf(tmp_path, sizeof tmp_path, "%s.%d", state_path, (int)getpid());
    struct record *prev;
    int n_prev = load_state(state_path, &prev);
    FILE *next = fopen(tmp_path, "w");
    if (!next) {
        sb_printf(err, "cannot write %s: %s", tmp_path, strerror(errno));
        free(prev);
        return -1;
    }
    DIR *d = opendir("/dev/shm");
    if (!d) {
        sb_printf(err, "cannot list /dev/shm: %s", strerror(errno));
        fclose(next);
        unlink(tmp_path);
        free(prev);
        return -1;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "llm-", 4)) continue;
        char path[512], reason[512];
        snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
        struct stat st;
        if (lstat(path, &st) < 0 || !S_ISREG(st.st_mode)) continue;

        llm_ipc_header h;
        int pid = 0;
        bool owner_dead;
        if (segment_peek(e->d_name, &h) == 0) {
            pid = h.pid;
            owner_dead = !pid_alive(pid);
            if (!owner_dead) {
                snprintf(reason, sizeof reason, "engine pid %d is alive (%s)", pid,
                         llm_ipc_state_name(atomic_load(&h.state)));
                line(out, e->d_name, "kept", pid, reason);
                continue;
            }
        } else {
            owner_dead = time(NULL) - st.st_ctime > HEADERLESS_GRACE_S;
            if (!owner_dead) {
                line(out, e->d_name, "kept", 0, "no valid header yet (an engine may be creating it)");
                continue;
            }
        }
        pid_t users[8];
        bool unknown;
        int n_users = shm_users(e->d_name, users, 8, &unknown);
        if (n_users || unknown) {
            int k = snprintf(reason, sizeof reason, "engine is gone but ");
            if (n_users) {
                k += snprintf(reason + k, sizeof reason - (size_t)k, "%d process%s still map it (",
                              n_users, n_users == 1 ? "" : "es");
                for (int i = 0; i < n_users && i < 8 && k < (int)sizeof reason - 16; i++)
                    k += snprintf(reason + k, sizeof reason - (size_t)k, "%s%d", i ? " " : "",
                                  (int)users[i]);
                snprintf(reason + k, sizeof reason - (size_t)k, ")");
            } else {
                snprintf(reason + k, sizeof reason - (size_t)k,
                         "some processes could not be inspected");
            }
            line(out, e->d_name, "kept", pid, reason);
            continue;
        }
        unsigned long inode = (unsigned long)st.st_ino;
        if (recorded(prev, n_prev, e->d_name, inode)) {
            if (shm_unlink(e->d_name) < 0 && errno != ENOENT) {
                snprintf(reason, sizeof reason, "cannot remove: %s", strerror(errno));
                line(out, e->d_name, "kept", pid, reason);
                fprintf(next, "%s %lu\n", e->d_name, inode);
                continue;
            }
            if (pid && ours(run_dir, &h, e->d_name)) remove_dead_socket(run_dir, h.name);
            line(out, e->d_name, "removed", pid,
                 "orphaned on two consecutive scans (engine dead, nobody maps it)");
        } else {
            fprintf(next, "%s %lu\n", e->d_name, inode);
            line(out, e->d_name, "recorded", pid,
                 "orphaned (engine dead, nobody maps it); removed if still so on the next scan");
        }
    }
    closedir(d);
    free(prev);
    if (fclose(next) != 0 || rename(tmp_path, state_path) < 0) {
        sb_printf(err, "cannot write %s: %s", state_path, strerror(errno));
        unlink(tmp_path);
        return -1;
    }
    return 0;
}
