/* safetensors reader: mmap'd files, a single model.safetensors or shards
 * listed in model.safetensors.index.json.  Every header is validated
 * (JSON shape, dtype, offsets inside the file, shape x dtype size = byte
 * length) before any tensor is handed out. */
#ifndef LLM_SAFETENSORS_H
#define LLM_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "strbuf.h"

enum st_dtype {
    ST_F32, ST_BF16, ST_F16, ST_F8_E4M3, ST_F8_E8M0, ST_I8, ST_U8, ST_I32, ST_I64,
    ST_NDTYPES
};

#define ST_MAX_DIMS 8

typedef struct {
    char *name;
    enum st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;       /* into the mapping (or an aligned copy) */
    size_t nbytes;
    int file;               /* index into safetensors.files */
} st_tensor;

typedef struct {
    char *path;
    void *map;
    size_t size;
} st_file;

typedef struct {
    st_file *files;
    int nfiles;
    st_tensor *tensors;     /* sorted by name */
    size_t ntensors;
    void **copies;          /* aligned copies of misaligned tensors */
    size_t ncopies;
} safetensors;

/* Open DIR/model.safetensors.index.json (shards) or DIR/model.safetensors.
 * Returns 0, or -1 with a message naming the file (and tensor) in err. */
int st_open_dir(safetensors *st, const char *dir, strbuf *err);
/* Open one .safetensors file. */
int st_open_file(safetensors *st, const char *path, strbuf *err);
void st_close(safetensors *st);

const st_tensor *st_find(const safetensors *st, const char *name);
size_t st_dtype_size(enum st_dtype d);
const char *st_dtype_name(enum st_dtype d);
int64_t st_numel(const st_tensor *t);
const char *st_file_of(const safetensors *st, const st_tensor *t);

/* Writer: collect tensors, then write one file or shards + index. */
typedef struct {
    char *name;
    enum st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    void *data;             /* nbytes, zero-filled by stw_add */
    size_t nbytes;
} stw_tensor;

typedef struct {
    stw_tensor *t;
    size_t n, cap;
} st_writer;

void stw_init(st_writer *w);
void stw_free(st_writer *w);
/* Add a tensor (replacing one of the same name); fill ->data after. */
stw_tensor *stw_add(st_writer *w, const char *name, enum st_dtype dt, int ndim,
                    const int64_t *shape);
stw_tensor *stw_get(st_writer *w, const char *name);
void stw_remove(st_writer *w, const char *name);
int stw_write(const st_writer *w, const char *path, strbuf *err);
/* nshards <= 1: DIR/model.safetensors; else DIR/model-0000K-of-0000N.safetensors
 * and DIR/model.safetensors.index.json. */
int stw_write_dir(const st_writer *w, const char *dir, int nshards, strbuf *err);

#endif
