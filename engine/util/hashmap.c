#include "hashmap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n, size);
    if (!p) { fprintf(stderr, "out of memory (%zu x %zu bytes)\n", n, size); abort(); }
    return p;
}

static uint64_t mix(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

uint64_t hash_bytes(const void *p, size_t n)
{
    const unsigned char *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (n * 0x100000001B3ULL);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ mix(w)) * 0x100000001B3ULL;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    return mix(h ^ mix(w));
}

static size_t capacity_for(size_t expected)
{
    size_t cap = 16;
    while (cap < expected * 2) cap *= 2;   /* load factor <= 1/2 */
    return cap;
}

void strmap_init(strmap *m, size_t expected)
{
    m->cap = capacity_for(expected);
    m->n = 0;
    m->slots = xcalloc(m->cap, sizeof *m->slots);
}

void strmap_free(strmap *m)
{
    free(m->slots);
    m->slots = NULL;
    m->cap = m->n = 0;
}

static strmap_slot *strmap_find(const strmap *m, const char *key, size_t len)
{
    size_t i = hash_bytes(key, len) & (m->cap - 1);
    for (;;) {
        strmap_slot *s = &m->slots[i];
        if (!s->key || (s->len == len && memcmp(s->key, key, len) == 0)) return s;
        i = (i + 1) & (m->cap - 1);
    }
}

void strmap_put(strmap *m, const char *key, size_t len, int32_t val)
{
    if ((m->n + 1) * 2 > m->cap) {
        strmap old = *m;
        strmap_init(m, old.cap);
        for (size_t i = 0; i < old.cap; i++)
            if (old.slots[i].key) strmap_put(m, old.slots[i].key, old.slots[i].len, old.slots[i].val);
        strmap_free(&old);
    }
    strmap_slot *s = strmap_find(m, key, len);
    if (!s->key) {
        s->key = key;
        s->len = (uint32_t)len;
        m->n++;
    }
    s->val = val;
}

bool strmap_get(const strmap *m, const char *key, size_t len, int32_t *val)
{
    if (!m->cap) return false;
    strmap_slot *s = strmap_find(m, key, len);
    if (!s->key) return false;
    *val = s->val;
    return true;
}

void u64map_init(u64map *m, size_t expected)
{
    m->cap = capacity_for(expected);
    m->n = 0;
    m->slots = xcalloc(m->cap, sizeof *m->slots);
    for (size_t i = 0; i < m->cap; i++) m->slots[i].key = U64MAP_EMPTY;
}

void u64map_free(u64map *m)
{
    free(m->slots);
    m->slots = NULL;
    m->cap = m->n = 0;
}

static u64map_slot *u64map_find(const u64map *m, uint64_t key)
{
    size_t i = mix(key) & (m->cap - 1);
    for (;;) {
        u64map_slot *s = &m->slots[i];
        if (s->key == key || s->key == U64MAP_EMPTY) return s;
        i = (i + 1) & (m->cap - 1);
    }
}

void u64map_put(u64map *m, uint64_t key, uint64_t val)
{
    if ((m->n + 1) * 2 > m->cap) {
        u64map old = *m;
        u64map_init(m, old.cap);
        for (size_t i = 0; i < old.cap; i++)
            if (old.slots[i].key != U64MAP_EMPTY) u64map_put(m, old.slots[i].key, old.slots[i].val);
        u64map_free(&old);
    }
    u64map_slot *s = u64map_find(m, key);
    if (s->key == U64MAP_EMPTY) {
        s->key = key;
        m->n++;
    }
    s->val = val;
}

bool u64map_get(const u64map *m, uint64_t key, uint64_t *val)
{
    if (!m->cap) return false;
    u64map_slot *s = u64map_find(m, key);
    if (s->key == U64MAP_EMPTY) return false;
    *val = s->val;
    return true;
}
