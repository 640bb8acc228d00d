/* Open-addressing hash maps for vocabularies: byte strings -> int32 and
 * 64-bit keys -> 64-bit values.  String keys are not copied and must
 * outlive the map.  Putting an existing key overwrites its value. */
#ifndef LLM_HASHMAP_H
#define LLM_HASHMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

uint64_t hash_bytes(const void *p, size_t n);

typedef struct {
    const char *key;        /* NULL: empty slot */
    uint32_t len;
    int32_t val;
} strmap_slot;

typedef struct {
    strmap_slot *slots;
    size_t cap, n;          /* cap is a power of two */
} strmap;

void strmap_init(strmap *m, size_t expected);
void strmap_free(strmap *m);
void strmap_put(strmap *m, const char *key, size_t len, int32_t val);
bool strmap_get(const strmap *m, const char *key, size_t len, int32_t *val);

#define U64MAP_EMPTY UINT64_MAX   /* the one key that cannot be stored */

typedef struct {
    uint64_t key, val;
} u64map_slot;

typedef struct {
    u64map_slot *slots;
    size_t cap, n;
} u64map;

void u64map_init(u64map *m, size_t expected);
void u64map_free(u64map *m);
void u64map_put(u64map *m, uint64_t key, uint64_t val);
bool u64map_get(const u64map *m, uint64_t key, uint64_t *val);

#endif
