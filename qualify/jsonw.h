/* A small streaming JSON writer over strbuf: commas and nesting are
 * tracked, so a gate can add members in any order without building a
 * tree.  Members of an object take a key; elements of an array pass
 * key NULL.  Non-finite numbers are written as null (JSON has no NaN). */
#ifndef QUALIFY_JSONW_H
#define QUALIFY_JSONW_H

#include <stdbool.h>
#include <stddef.h>

#include "strbuf.h"

#define JW_DEPTH 32

typedef struct {
    strbuf *sb;
    int     depth;
    bool    first[JW_DEPTH];
    char    close[JW_DEPTH];
} jw;

/* Write into sb (appending).  The caller opens the outermost value. */
void jw_init(jw *w, strbuf *sb);
void jw_obj(jw *w, const char *key);
void jw_arr(jw *w, const char *key);
void jw_end(jw *w);
void jw_str(jw *w, const char *key, const char *s);      /* NULL -> null */
void jw_strn(jw *w, const char *key, const char *s, size_t n);
void jw_int(jw *w, const char *key, long long v);
void jw_num(jw *w, const char *key, double v, int decimals);
void jw_bool(jw *w, const char *key, bool v);
void jw_null(jw *w, const char *key);
/* Already-serialized JSON text (trusted to be one valid value). */
void jw_raw(jw *w, const char *key, const char *json, size_t n);
void jw_json(jw *w, const char *key, const char *json);   /* NUL-terminated */

#endif
