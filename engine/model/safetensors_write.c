#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "safetensors.h"

void stw_init(st_writer *w) { memset(w, 0, sizeof *w); }

void stw_free(st_writer *w)
{
    for (size_t i = 0; i < w->n; i++) {
        free(w->t[i].name);
        free(w->t[i].data);
    }
    free(w->t);
    memset(w, 0, sizeof *w);
}

stw_tensor *stw_get(st_writer *w, const char *name)
{
    for (size_t i = 0; i < w->n; i++)
        if (!strcmp(w->t[i].name, name)) return &w->t[i];
    return NULL;
}

void stw_remove(st_writer *w, const char *name)
{
    stw_tensor *t = stw_get(w, name);
    if (!t) return;
    free(t->name);
    free(t->data);
    *t = w->t[--w->n];
}

stw_tensor *stw_add(st_writer *w, const char *name, enum st_dtype dt, int ndim,
                    const int64_t *shape)
{
    stw_remove(w, name);
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 64;
        w->t = realloc(w->t, w->cap * sizeof *w->t);
    }
    stw_tensor *t = &w->t[w->n++];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    t->dtype = dt;
    t->ndim = ndim;
    size_t n = 1;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        n *= (size_t)shape[i];
    }
    t->nbytes = n * st_dtype_size(dt);
    t->data = calloc(t->nbytes ? t->nbytes : 1, 1);
    return t;
}

/* Write tensors [i0, i1) of w to path. */
static int write_range(const st_writer *w, size_t i0, size_t i1, const char *path, strbuf *err)
{
    strbuf h;
    sb_init(&h);
    sb_puts(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
    size_t off = 0;
    for (size_t i = i0; i < i1; i++) {
        const stw_tensor *t = &w->t[i];
        sb_putc(&h, ',');
        json_put_cstr(&h, t->name);
        sb_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[", st_dtype_name(t->dtype));
        for (int d = 0; d < t->ndim; d++) sb_printf(&h, "%s%lld", d ? "," : "", (long long)t->shape[d]);
        sb_printf(&h, "],\"data_offsets\":[%zu,%zu]}", off, off + t->nbytes);
        off += t->nbytes;
    }
    sb_putc(&h, '}');
    while (h.len % 8) sb_putc(&h, ' ');
    FILE *f = fopen(path, "wb");
    if (!f) {
        sb_printf(err, "%s: cannot create: %s\n", path, strerror(errno));
        sb_free(&h);
        return -1;
    }
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)h.len >> (8 * i));
    int bad = fwrite(len, 1, 8, f) != 8 || sb_fwrite(&h, f);
    for (size_t i = i0; i < i1 && !bad; i++)
        bad = fwrite(w->t[i].data, 1, w->t[i].nbytes, f) != w->t[i].nbytes;
    bad |= fclose(f) != 0;
    sb_free(&h);
    if (bad) sb_printf(err, "%s: write failed\n", path);
    return bad ? -1 : 0;
}

int stw_write(const st_writer *w, const char *path, strbuf *err)
{
    return write_range(w, 0, w->n, path, err);
}

int stw_write_dir(const st_writer *w, const char *dir, int nshards, strbuf *err)
{
    strbuf p, idx;
    sb_init(&p);
    sb_init(&idx);
    int rc = 0;
    if (nshards <= 1) {
        sb_printf(&p, "%s/model.safetensors", dir);
        rc = stw_write(w, p.data, err);
        sb_free(&p);
        return rc;
    }
    size_t per = (w->n + nshards - 1) / nshards;
    sb_puts(&idx, "{\"metadata\":{},\"weight_map\":{");
    for (int k = 0; k < nshards && !rc; k++) {
        size_t i0 = k * per, i1 = i0 + per < w->n ? i0 + per : w->n;
        if (i0 > i1) i0 = i1;
        char fname[64];
        snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", k + 1, nshards);
        sb_reset(&p);
        sb_printf(&p, "%s/%s", dir, fname);
        rc = write_range(w, i0, i1, p.data, err);
        for (size_t i = i0; i < i1; i++) {
            if (i) sb_putc(&idx, ',');
            json_put_cstr(&idx, w->t[i].name);
            sb_putc(&idx, ':');
            json_put_cstr(&idx, fname);
        }
    }
    sb_puts(&idx, "}}\n");
    if (!rc) {
        sb_reset(&p);
        sb_printf(&p, "%s/model.safetensors.index.json", dir);
        FILE *f = fopen(p.data, "w");
        if (!f || sb_fwrite(&idx, f)) {
            sb_printf(err, "%s: cannot write\n", p.data);
            rc = -1;
        }
        if (f) fclose(f);
    }
    sb_free(&p);
    sb_free(&idx);
    return rc;
}
