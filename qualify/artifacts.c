#include "artifacts.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "sha256.h"

static int mkdir_p(const char *path)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0755) < 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(tmp, 0755) < 0 && errno != EEXIST ? -1 : 0;
}

int art_init(artifact_store *s, const char *out_dir, strbuf *err)
{
    memset(s, 0, sizeof *s);
    s->out_dir = strdup(out_dir);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/artifacts", out_dir);
    if (mkdir_p(dir) < 0) {
        sb_printf(err, "cannot create %s: %s", dir, strerror(errno));
        return -1;
    }
    return 0;
}

void art_free(artifact_store *s)
{
    for (int i = 0; i < s->n; i++) free(s->items[i].path);
    free(s->items);
    free(s->out_dir);
    memset(s, 0, sizeof *s);
}

/* Labels come from code, but keep file names safe anyway. */
static void safe_name(char *dst, size_t cap, const char *label)
{
    size_t i = 0;
    for (; label[i] && i + 1 < cap; i++) {
        char c = label[i];
        int keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
                   || c == '-' || c == '_' || c == '.';
        dst[i] = keep ? c : '_';
    }
    dst[i] = 0;
}

int art_reserve(artifact_store *s, const char *gate, const char *label, const char *ext,
                strbuf *abs, strbuf *err)
{
    char dir[4096], name[128];
    snprintf(dir, sizeof dir, "%s/artifacts/%s", s->out_dir, gate);
    if (mkdir_p(dir) < 0) {
        sb_printf(err, "cannot create %s: %s", dir, strerror(errno));
        return -1;
    }
    safe_name(name, sizeof name, label);
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->items = realloc(s->items, (size_t)s->cap * sizeof *s->items);
        if (!s->items) abort();
    }
    artifact *a = &s->items[s->n];
    memset(a, 0, sizeof *a);
    strbuf rel;
    sb_init(&rel);
    sb_printf(&rel, "artifacts/%s/%03d-%s%s", gate, ++s->seq, name, ext);
    a->path = sb_steal(&rel);
    a->bytes = -1;
    sb_reset(abs);
    sb_printf(abs, "%s/%s", s->out_dir, a->path);
    return s->n++;
}

int art_write(artifact_store *s, const char *gate, const char *label, const char *ext,
              const void *data, size_t n, strbuf *err)
{
    strbuf abs;
    sb_init(&abs);
    int idx = art_reserve(s, gate, label, ext, &abs, err);
    if (idx < 0) {
        sb_free(&abs);
        return -1;
    }
    FILE *f = fopen(abs.data, "wb");
    int bad = !f || fwrite(data, 1, n, f) != n;
    if (f && fclose(f) != 0) bad = 1;
    if (bad) {
        sb_printf(err, "cannot write %s: %s", abs.data, strerror(errno));
        idx = -1;
    }
    sb_free(&abs);
    return idx;
}

int file_sha256(const char *path, char hex[65], long long *bytes)
{
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    sha256_ctx c;
    sha256_init(&c);
    unsigned char buf[65536];
    size_t got;
    long long total = 0;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) {
        sha256_update(&c, buf, got);
        total += (long long)got;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) return -1;
    uint8_t d[32];
    sha256_final(&c, d);
    sha256_to_hex(d, hex);
    if (bytes) *bytes = total;
    return 0;
}

int art_finalize(artifact_store *s)
{
    int missing = 0;
    for (int i = 0; i < s->n; i++) {
        char abs[4096];
        snprintf(abs, sizeof abs, "%s/%s", s->out_dir, s->items[i].path);
        if (file_sha256(abs, s->items[i].sha256, &s->items[i].bytes) < 0) {
            s->items[i].sha256[0] = 0;
            s->items[i].bytes = -1;
            missing++;
        }
    }
    return missing;
}
