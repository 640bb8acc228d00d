/* Raw artifacts a qualification keeps under OUT/artifacts/: every HTTP
 * exchange, SSE transcript, admin snapshot, janitor output and the managed
 * stack's log.  Their SHA-256 is taken when the run ends, from the files
 * as they then are, so the status file's hashes always match the bytes. */
#ifndef QUALIFY_ARTIFACTS_H
#define QUALIFY_ARTIFACTS_H

#include <stddef.h>

#include "strbuf.h"

typedef struct {
    char  *path;        /* relative to the output dir: artifacts/<gate>/... */
    char   sha256[65];  /* filled by art_finalize */
    long long bytes;
} artifact;

typedef struct {
    char     *out_dir;
    artifact *items;
    int       n, cap;
    int       seq;      /* numbers files in the order they were made */
} artifact_store;

int art_init(artifact_store *s, const char *out_dir, strbuf *err);
void art_free(artifact_store *s);

/* Write data as artifacts/<gate>/<NNN>-<label><ext>.  Returns the index
 * of the new artifact, or -1 (reason in err). */
int art_write(artifact_store *s, const char *gate, const char *label, const char *ext,
              const void *data, size_t n, strbuf *err);
/* Reserve artifacts/<gate>/<NNN>-<label><ext> for a file someone else
 * writes (a child's log); returns its index and absolute path in abs. */
int art_reserve(artifact_store *s, const char *gate, const char *label, const char *ext,
                strbuf *abs, strbuf *err);
/* Hash every artifact from disk.  A file that vanished keeps bytes -1
 * and an empty hash; returns how many could not be read. */
int art_finalize(artifact_store *s);

/* SHA-256 of a whole file as hex; 0, or -1 when it cannot be read. */
int file_sha256(const char *path, char hex[65], long long *bytes);

#endif
