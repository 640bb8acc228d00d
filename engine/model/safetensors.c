#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json.h"

static const struct { const char *name; size_t size; } dtypes[ST_NDTYPES] = {
    [ST_F32] = { "F32", 4 },        [ST_BF16] = { "BF16", 2 },
    [ST_F16] = { "F16", 2 },        [ST_F8_E4M3] = { "F8_E4M3", 1 },
    [ST_F8_E8M0] = { "F8_E8M0", 1 }, [ST_I8] = { "I8", 1 },
    [ST_U8] = { "U8", 1 },          [ST_I32] = { "I32", 4 },
    [ST_I64] = { "I64", 8 },
};

size_t st_dtype_size(enum st_dtype d) { return dtypes[d].size; }
const char *st_dtype_name(enum st_dtype d) { return dtypes[d].name; }

int64_t st_numel(const st_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

const char *st_file_of(const safetensors *st, const st_tensor *t)
{
    return st->files[t->file].path;
}

static int cmp_tensor(const void *a, const void *b)
{
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

const st_tensor *st_find(const safetensors *st, const char *name)
{
    st_tensor key = { .name = (char *)name };
    return bsearch(&key, st->tensors, st->ntensors, sizeof key, cmp_tensor);
}

/* Validate one header entry and append it.  Returns 0 or -1 (message in err). */
static int add_tensor(safetensors *st, int fi, const char *name, yajl_val v,
                      const uint8_t *data, size_t data_len, strbuf *err)
{
    const char *path = st->files[fi].path;
    yajl_val dt = json_get(v, "dtype"), shape = json_get(v, "shape");
    yajl_val offs = json_get(v, "data_offsets");
    st_tensor t = { 0 };
    const char *ds = json_string(dt);
    int d = 0;
    while (d < ST_NDTYPES && !(ds && !strcmp(ds, dtypes[d].name))) d++;
    if (!YAJL_IS_OBJECT(v) || !ds || !shape || !YAJL_IS_ARRAY(shape) || !offs
        || !YAJL_IS_ARRAY(offs) || offs->u.array.len != 2) {
        sb_printf(err, "%s: tensor %s: header entry needs dtype, shape and data_offsets\n",
                  path, name);
        return -1;
    }
    if (d == ST_NDTYPES) {
        sb_printf(err, "%s: tensor %s: unsupported dtype %s\n", path, name, ds);
        return -1;
    }
    t.dtype = d;
    if (shape->u.array.len > ST_MAX_DIMS) {
        sb_printf(err, "%s: tensor %s: too many dimensions\n", path, name);
        return -1;
    }
    t.ndim = (int)shape->u.array.len;
    /* Element count with overflow checking (bounded by the file size). */
    uint64_t numel = 1;
    for (int i = 0; i < t.ndim; i++) {
        long long x;
        if (!json_int(shape->u.array.values[i], &x) || x < 0) {
            sb_printf(err, "%s: tensor %s: shape must hold non-negative integers\n", path, name);
            return -1;
        }
        t.shape[i] = x;
        if (x && numel > (UINT64_MAX / 16) / (uint64_t)x) {
            sb_printf(err, "%s: tensor %s: shape too large\n", path, name);
            return -1;
        }
        numel *= (uint64_t)x;
    }
    long long b, e;
    if (!json_int(offs->u.array.values[0], &b) || !json_int(offs->u.array.values[1], &e)
        || b < 0 || e < b) {
        sb_printf(err, "%s: tensor %s: bad data_offsets\n", path, name);
        return -1;
    }
    if ((uint64_t)e > data_len) {
        sb_printf(err, "%s: tensor %s: data_offsets [%lld, %lld] past the end of the data "
                  "(%zu bytes; file truncated?)\n", path, name, b, e, data_len);
        return -1;
    }
    uint64_t want = numel * dtypes[d].size;
    if ((uint64_t)(e - b) != want) {
        sb_printf(err, "%s: tensor %s: %lld bytes for shape x %s = %llu bytes\n", path, name,
                  e - b, dtypes[d].name, (unsigned long long)want);
        return -1;
    }
    t.nbytes = (size_t)want;
    t.data = data + b;
    t.file = fi;
    size_t align = dtypes[d].size;
    if ((uintptr_t)t.data % align) {
        /* Kernels read typed elements; keep a correctly aligned copy. */
        void *copy = aligned_alloc(64, (t.nbytes + 63) / 64 * 64);
        if (!copy) { sb_printf(err, "%s: tensor %s: out of memory\n", path, name); return -1; }
        memcpy(copy, t.data, t.nbytes);
        t.data = copy;
        st->copies = realloc(st->copies, (st->ncopies + 1) * sizeof *st->copies);
        st->copies[st->ncopies++] = copy;
    }
    t.name = strdup(name);
    st->tensors = realloc(st->tensors, (st->ntensors + 1) * sizeof *st->tensors);
    st->tensors[st->ntensors++] = t;
    return 0;
}

/* Map one file and add its tensors (unsorted). */
static int load_file(safetensors *st, const char *path, strbuf *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        sb_printf(err, "%s: cannot open: %s\n", path, strerror(errno));
        return -1;
    }
    struct stat sbuf;
    if (fstat(fd, &sbuf) < 0 || !S_ISREG(sbuf.st_mode)) {
        sb_printf(err, "%s: not a regular file\n", path);
        close(fd);
        return -1;
    }
    size_t size = (size_t)sbuf.st_size;
    if (size < 8) {
        sb_printf(err, "%s: too short for a safetensors file (%zu bytes)\n", path, size);
        close(fd);
        return -1;
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        sb_printf(err, "%s: mmap: %s\n", path, strerror(errno));
        return -1;
    }
    int fi = st->nfiles++;
    st->files = realloc(st->files, st->nfiles * sizeof *st->files);
    st->files[fi] = (st_file){ strdup(path), map, size };

    const uint8_t *p = map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | p[i];
    if (hlen > size - 8) {
        sb_printf(err, "%s: header length %llu exceeds the file (%zu bytes)\n", path,
                  (unsigned long long)hlen, size);
        return -1;
    }
    char perr[200];
    yajl_val root = json_parse((const char *)p + 8, (size_t)hlen, perr, sizeof perr);
    if (!root || !YAJL_IS_OBJECT(root)) {
        sb_printf(err, "%s: header is not a JSON object%s%s\n", path, root ? "" : ": ",
                  root ? "" : perr);
        yajl_tree_free(root);
        return -1;
    }
    int rc = 0;
    for (size_t i = 0; i < root->u.object.len && !rc; i++) {
        const char *name = root->u.object.keys[i];
        if (!strcmp(name, "__metadata__")) continue;
        rc = add_tensor(st, fi, name, root->u.object.values[i], p + 8 + hlen,
                        size - 8 - (size_t)hlen, err);
    }
    yajl_tree_free(root);
    return rc;
}

/* Sort and reject names that appear twice (in one file or across shards). */
static int finish(safetensors *st, strbuf *err)
{
    qsort(st->tensors, st->ntensors, sizeof *st->tensors, cmp_tensor);
    for (size_t i = 1; i < st->ntensors; i++)
        if (!strcmp(st->tensors[i].name, st->tensors[i - 1].name)) {
            sb_printf(err, "%s: tensor %s appears twice (also in %s)\n",
                      st_file_of(st, &st->tensors[i]), st->tensors[i].name,
                      st_file_of(st, &st->tensors[i - 1]));
            return -1;
        }
    return 0;
}

int st_open_file(safetensors *st, const char *path, strbuf *err)
{
    memset(st, 0, sizeof *st);
    if (load_file(st, path, err) || finish(st, err)) { st_close(st); return -1; }
    return 0;
}

static int open_index(safetensors *st, const char *dir, const char *ipath, strbuf *err)
{
    strbuf sb, fp;
    sb_init(&sb);
    sb_init(&fp);
    if (sb_read_file(&sb, ipath) < 0) {
        sb_printf(err, "%s: cannot read: %s\n", ipath, strerror(errno));
        sb_free(&sb);
        return -1;
    }
    char perr[200];
    int rc = -1;
    yajl_val root = json_parse(sb.data, sb.len, perr, sizeof perr);
    yajl_val wm = json_get(root, "weight_map");
    if (!root) {
        sb_printf(err, "%s: invalid JSON: %s\n", ipath, perr);
        goto out;
    }
    if (!wm || !YAJL_IS_OBJECT(wm)) {
        sb_printf(err, "%s: weight_map: missing or not an object\n", ipath);
        goto out;
    }
    /* Shard files in first-seen order, each loaded once. */
    const char **shards = calloc(wm->u.object.len + 1, sizeof *shards);
    int nshards = 0;
    for (size_t i = 0; i < wm->u.object.len; i++) {
        const char *f = json_string(wm->u.object.values[i]);
        if (!f || !*f || strchr(f, '/')) {
            sb_printf(err, "%s: weight_map.%s: expected a file name in %s\n", ipath,
                      wm->u.object.keys[i], dir);
            free(shards);
            goto out;
        }
        int k = 0;
        while (k < nshards && strcmp(shards[k], f)) k++;
        if (k == nshards) shards[nshards++] = f;
    }
    for (int k = 0; k < nshards; k++) {
        sb_reset(&fp);
        sb_printf(&fp, "%s/%s", dir, shards[k]);
        if (load_file(st, fp.data, err)) { free(shards); goto out; }
    }
    free(shards);
    if (finish(st, err)) goto out;
    /* Every indexed tensor must live in the shard the index names. */
    for (size_t i = 0; i < wm->u.object.len; i++) {
        const char *name = wm->u.object.keys[i], *f = json_string(wm->u.object.values[i]);
        const st_tensor *t = st_find(st, name);
        const char *tf = t ? strrchr(st_file_of(st, t), '/') + 1 : NULL;
        if (!t || strcmp(tf, f)) {
            sb_printf(err, "%s: tensor %s: listed in %s but not found there\n", ipath, name, f);
            goto out;
        }
    }
    rc = 0;
out:
    yajl_tree_free(root);
    sb_free(&sb);
    sb_free(&fp);
    return rc;
}

int st_open_dir(safetensors *st, const char *dir, strbuf *err)
{
    strbuf p;
    sb_init(&p);
    memset(st, 0, sizeof *st);
    sb_printf(&p, "%s/model.safetensors.index.json", dir);
    int rc;
    if (access(p.data, F_OK) == 0) {
        rc = open_index(st, dir, p.data, err);
        if (rc) st_close(st);
    } else {
        sb_reset(&p);
        sb_printf(&p, "%s/model.safetensors", dir);
        if (access(p.data, F_OK) == 0) {
            rc = st_open_file(st, p.data, err);
        } else {
            sb_printf(err, "%s: no model.safetensors.index.json or model.safetensors\n", dir);
            rc = -1;
        }
    }
    sb_free(&p);
    return rc;
}

void st_close(safetensors *st)
{
    for (size_t i = 0; i < st->ntensors; i++) free(st->tensors[i].name);
    for (size_t i = 0; i < st->ncopies; i++) free(st->copies[i]);
    for (int i = 0; i < st->nfiles; i++) {
        munmap(st->files[i].map, st->files[i].size);
        free(st->files[i].path);
    }
    free(st->tensors);
    free(st->copies);
    free(st->files);
    memset(st, 0, sizeof *st);
}
