/* The prefix cache's disk tier (docs/MODEL.md, "Disk tier"): entries that
 * leave the host tier (and what it holds when the model is freed) are
 * written to <dir>/<seed as 16 hex digits>/<chain hash as 16 hex
 * digits>.kv, so they survive restarts of the same model and settings; a
 * lookup that misses in memory reads one back.  A file holds a header
 * (magic, seed, chain hash, parent hash, block size, unit count and size,
 * SHA-256 of what follows), the block's token ids and the entry's host
 * units.  Every field is checked on load: a file that fails any check is
 * ignored with a log line (and not tried again), never trusted.  The
 * files are kept under a byte budget, least recently used deleted first. */
#ifndef LLM_PREFIX_DISK_H
#define LLM_PREFIX_DISK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strbuf.h"

typedef struct {
    uint64_t hash, bytes, stamp;    /* stamp: larger is more recent */
} pd_file;

typedef struct {
    char *dir;              /* <path>/<seed> */
    uint64_t seed, budget, used, clock;
    pd_file *f;
    size_t n, cap;
    void (*log)(void *user, const char *line);
    void *log_user;
    uint64_t writes, reads, rejected;
} prefix_disk;

/* Create <path>/<seed> if needed and index the files there.  0, or -1
 * with a message naming the directory. */
int pd_open(prefix_disk *d, const char *path, uint64_t seed, uint64_t budget,
            void (*log)(void *, const char *), void *log_user, strbuf *err);
void pd_close(prefix_disk *d);
bool pd_has(const prefix_disk *d, uint64_t hash);
/* Write an entry: `nunits` units of unit_bytes (snap: they hold a
 * snapshot too).  0, or -1 (logged; nothing left behind). */
int pd_write(prefix_disk *d, uint64_t hash, uint64_t parent, const int32_t *tokens,
             int block_tokens, char *const *units, int nunits, size_t unit_bytes);
/* Read the entry for (parent, tokens) whose hash is `hash`: 1 when there
 * is no file, -1 when there is one that fails a check (logged, forgotten),
 * 0 with *payload (malloc'd, *nunits units of unit_bytes) when it passes.
 * Units are 1 (the block) or 1 + snap_blocks (a snapshot too). */
int pd_read(prefix_disk *d, uint64_t hash, uint64_t parent, const int32_t *tokens,
            int block_tokens, size_t unit_bytes, int snap_blocks, char **payload, int *nunits);
/* Delete every file of the index; the bytes deleted. */
uint64_t pd_clear(prefix_disk *d);

#endif
