#include "prefix_disk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sha256.h"

#define PD_MAGIC "LLMPFX01"

typedef struct {
    char magic[8];
    uint64_t seed, hash, parent;
    uint32_t block_tokens, nunits;
    uint64_t unit_bytes;
    uint8_t sum[32];        /* SHA-256 of the token ids and the units */
} pd_header;

static void say(const prefix_disk *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const prefix_disk *d, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (d->log) d->log(d->log_user, line);
    else fprintf(stderr, "llm-engine: %s\n", line);
}

static void file_name(const prefix_disk *d, uint64_t hash, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%016" PRIx64 ".kv", d->dir, hash);
}

static long find(const prefix_disk *d, uint64_t hash)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->f[i].hash == hash) return (long)i;
    return -1;
}

bool pd_has(const prefix_disk *d, uint64_t hash) { return d->dir && find(d, hash) >= 0; }

static void add(prefix_disk *d, uint64_t hash, uint64_t bytes, uint64_t stamp)
{
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 64;
        pd_file *f = realloc(d->f, cap * sizeof *f);
        if (!f) return;
        d->f = f;
        d->cap = cap;
    }
    d->f[d->n++] = (pd_file){ hash, bytes, stamp };
    d->used += bytes;
}

/* Out of the index (the file stays unless `unlink_it`). */
static void drop(prefix_disk *d, size_t i, bool unlink_it)
{
    if (unlink_it) {
        char path[4096];
        file_name(d, d->f[i].hash, path, sizeof path);
        unlink(path);
    }
    d->used -= d->f[i].bytes;
    d->f[i] = d->f[--d->n];
}

static int mkdir_p(char *path)
{
    for (char *p = path + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            int rc = mkdir(path, 0700) && errno != EEXIST;
            *p = '/';
            if (rc) return -1;
        }
    return mkdir(path, 0700) && errno != EEXIST ? -1 : 0;
}

int pd_open(prefix_disk *d, const char *path, uint64_t seed, uint64_t budget,
            void (*log)(void *, const char *), void *log_user, strbuf *err)
{
    *d = (prefix_disk){ .seed = seed, .budget = budget, .log = log, .log_user = log_user };
    strbuf sb;
    sb_init(&sb);
    sb_printf(&sb, "%s/%016" PRIx64, path, seed);
    DIR *dir = mkdir_p(sb.data) ? NULL : opendir(sb.data);
    if (!dir) {
        sb_printf(err, "kv_offloading_path: cannot use %s: %s\n", sb.data, strerror(errno));
        sb_free(&sb);
        return -1;
    }
    d->dir = strdup(sb.data);
    sb_free(&sb);
    struct dirent *de;
    while ((de = readdir(dir))) {
        uint64_t h;
        char tail[8];
        struct stat st;
        char p[4096];
        if (strlen(de->d_name) != 19 || sscanf(de->d_name, "%16" SCNx64 "%7s", &h, tail) != 2
            || strcmp(tail, ".kv"))
            continue;
        snprintf(p, sizeof p, "%s/%s", d->dir, de->d_name);
        if (stat(p, &st) || !S_ISREG(st.st_mode)) continue;
        uint64_t stamp = (uint64_t)st.st_mtim.tv_sec * 1000000000u + (uint64_t)st.st_mtim.tv_nsec;
        add(d, h, (uint64_t)st.st_size, stamp);
        if (stamp >= d->clock) d->clock = stamp + 1;
    }
    closedir(dir);
    return 0;
}

void pd_close(prefix_disk *d)
{
    free(d->dir);
    free(d->f);
    *d = (prefix_disk){ 0 };
}

/* SHA-256 of the token ids and the units. */
static void digest(const int32_t *tokens, int block_tokens, char *const *units, int nunits,
                   size_t unit_bytes, uint8_t out[32])
{
    sha256_ctx c;
    sha256_init(&c);
    sha256_update(&c, tokens, (size_t)block_tokens * sizeof *tokens);
    for (int k = 0; k < nunits; k++) sha256_update(&c, units[k], unit_bytes);
    sha256_final(&c, out);
}

static bool write_all(int fd, const void *p, size_t n)
{
    for (const char *c = p; n;) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        c += w;
        n -= (size_t)w;
    }
    return true;
}

static bool read_all(int fd, void *p, size_t n)
{
    for (char *c = p; n;) {
        ssize_t r = read(fd, c, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        c += r;
        n -= (size_t)r;
    }
    return true;
}

int pd_write(prefix_disk *d, uint64_t hash, uint64_t parent, const int32_t *tokens,
             int block_tokens, char *const *units, int nunits, size_t unit_bytes)
{
    if (!d->dir || pd_has(d, hash)) return 0;
    uint64_t bytes = sizeof(pd_header) + (uint64_t)block_tokens * sizeof *tokens
                     + (uint64_t)nunits * unit_bytes;
    if (bytes > d->budget) return -1;
    while (d->used + bytes > d->budget && d->n) {     /* least recently used go */
        size_t old = 0;
        for (size_t i = 1; i < d->n; i++)
            if (d->f[i].stamp < d->f[old].stamp) old = i;
        drop(d, old, true);
    }
    pd_header h = { .seed = d->seed, .hash = hash, .parent = parent,
                    .block_tokens = (uint32_t)block_tokens, .nunits = (uint32_t)nunits,
                    .unit_bytes = unit_bytes };
    memcpy(h.magic, PD_MAGIC, 8);
    digest(tokens, block_tokens, units, nunits, unit_bytes, h.sum);
    char path[4096], tmp[4200];
    file_name(d, hash, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    bool okw = fd >= 0 && write_all(fd, &h, sizeof h)
               && write_all(fd, tokens, (size_t)block_tokens * sizeof *tokens);
    for (int k = 0; okw && k < nunits; k++) okw = write_all(fd, units[k], unit_bytes);
    if (fd >= 0 && close(fd)) okw = false;
    if (!okw || rename(tmp, path)) {
        say(d, "prefix cache: cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    add(d, hash, bytes, d->clock++);
    d->writes++;
    return 0;
}

int pd_read(prefix_disk *d, uint64_t hash, uint64_t parent, const int32_t *tokens,
            int block_tokens, size_t unit_bytes, int snap_blocks, char **payload, int *nunits)
{
    long i = d->dir ? find(d, hash) : -1;
    if (i < 0) return 1;
    char path[4096];
    file_name(d, hash, path, sizeof path);
    const char *why = NULL;
    pd_header h;
    int32_t *ids = malloc((size_t)block_tokens * sizeof *ids);
    char *data = NULL;
    struct stat st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) || !read_all(fd, &h, sizeof h)) why = "cannot read its header";
    else if (memcmp(h.magic, PD_MAGIC, 8)) why = "not a prefix cache file (bad magic)";
    else if (h.seed != d->seed)
        why = "written under another model or settings (its seed differs)";
    else if (h.hash != hash || h.parent != parent) why = "another chain (hash or parent differs)";
    else if (h.block_tokens != (uint32_t)block_tokens || h.unit_bytes != unit_bytes
             || (h.nunits != 1 && h.nunits != 1 + (uint32_t)snap_blocks))
        why = "another layout (block size, unit size or count)";
    else if ((uint64_t)st.st_size != sizeof h + (uint64_t)block_tokens * sizeof *ids
                                     + (uint64_t)h.nunits * unit_bytes)
        why = "its size does not match its header";
    else if (!read_all(fd, ids, (size_t)block_tokens * sizeof *ids))
        why = "cannot read its token ids";
    else if (memcmp(ids, tokens, (size_t)block_tokens * sizeof *ids))
        why = "another block's token ids";
    else if (!(data = malloc((size_t)h.nunits * unit_bytes))
             || !read_all(fd, data, (size_t)h.nunits * unit_bytes))
        why = "cannot read its units";
    if (!why) {
        char **u = malloc(h.nunits * sizeof *u);
        uint8_t sum[32];
        for (uint32_t k = 0; k < h.nunits; k++) u[k] = data + k * unit_bytes;
        digest(ids, block_tokens, u, (int)h.nunits, unit_bytes, sum);
        free(u);
        if (memcmp(sum, h.sum, 32)) why = "checksum mismatch (corrupt)";
    }
    if (fd >= 0) close(fd);
    free(ids);
    if (why) {
        say(d, "prefix cache: ignoring %s: %s", path, why);
        free(data);
        drop(d, (size_t)i, false);
        d->rejected++;
        return -1;
    }
    d->f[i].stamp = d->clock++;
    d->reads++;
    *payload = data;
    *nunits = (int)h.nunits;
    return 0;
}

uint64_t pd_clear(prefix_disk *d)
{
    uint64_t bytes = d->used;
    while (d->n) drop(d, d->n - 1, true);
    return bytes;
}
