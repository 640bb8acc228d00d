#include "procfs.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

bool pid_alive(pid_t pid)
{
    if (pid <= 0) return false;
    if (kill(pid, 0) < 0 && errno != EPERM) return false;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return errno != ENOENT;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    /* "pid (comm) S ...": the state follows the last ')' */
    const char *p = strrchr(buf, ')');
    return !(p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'));
}

/* Does a maps line or an fd link name /dev/shm/<file> (maybe "(deleted)")? */
static bool names_file(const char *s, const char *target)
{
    size_t n = strlen(target);
    const char *p = strstr(s, target);
    while (p) {
        char c = p[n];
        if (c == 0 || c == '\n' || c == ' ') return true;
        p = strstr(p + 1, target);
    }
    return false;
}

static bool maps_file(pid_t pid, const char *target, bool *denied)
{
    char path[64], line[PATH_MAX + 128];
    snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno == EACCES || errno == EPERM) *denied = true;
        return false;
    }
    bool hit = false;
    while (!hit && fgets(line, sizeof line, f)) hit = names_file(line, target);
    fclose(f);
    return hit;
}

static bool holds_file(pid_t pid, const char *target, bool *denied)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    if (!d) {
        if (errno == EACCES || errno == EPERM) *denied = true;
        return false;
    }
    bool hit = false;
    struct dirent *e;
    while (!hit && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char fd_path[PATH_MAX], link[PATH_MAX];
        snprintf(fd_path, sizeof fd_path, "%s/%s", path, e->d_name);
        ssize_t n = readlink(fd_path, link, sizeof link - 1);
        if (n <= 0) continue;
        link[n] = 0;
        hit = names_file(link, target);
    }
    closedir(d);
    return hit;
}

int shm_users(const char *file, pid_t *pids, int max, bool *unknown)
{
    char target[PATH_MAX];
    snprintf(target, sizeof target, "/dev/shm/%s", file);
    *unknown = false;
    DIR *d = opendir("/proc");
    if (!d) {
        *unknown = true;
        return 0;
    }
    pid_t self = getpid();
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!isdigit((unsigned char)e->d_name[0])) continue;
        pid_t pid = (pid_t)atoi(e->d_name);
        if (pid == self) continue;
        bool maps_denied = false, fd_denied = false;
        bool hit = maps_file(pid, target, &maps_denied) || holds_file(pid, target, &fd_denied);
        /* Clients keep the segment's fd open while attached, so either
         * view suffices; a live process hiding both might be a user. */
        if (!hit && maps_denied && fd_denied && pid_alive(pid)) *unknown = true;
        if (hit) {
            if (n < max) pids[n] = pid;
            n++;
        }
    }
    closedir(d);
    return n;
}
