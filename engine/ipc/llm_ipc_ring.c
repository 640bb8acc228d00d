/* Segment layout and the per-slot SPSC event ring.
 *
 * head and tail count bytes ever written/consumed; position = count mod
 * ring size.  A record never wraps: when it does not fit before the end,
 * the producer first writes a PAD record covering the rest of the ring.
 * Records are 8-byte aligned and the ring is a power of two, so at least
 * one header always fits before the end.
 *
 * Wakeups: the consumer sets `armed` when it finds the ring empty, then
 * re-checks head; the producer publishes head, then exchanges `armed` to 0
 * and rings only if it was set.  Both sides put a seq_cst fence between
 * their store and their load, so one of them always sees the other. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llm_ipc.h"

#define ALIGN8(n)   (((n) + 7) & ~(uint64_t)7)
#define PAGE_BYTES  4096u

static uint64_t round_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

int llm_ipc_valid_name(const char *name, size_t len)
{
    if (len == 0 || len >= LLM_IPC_NAME_MAX) return 0;
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
              || c == '-' || c == '_' || c == '.'))
            return 0;
    }
    return 1;
}

int llm_ipc_shm_name(char *out, const char *run_dir, const char *name)
{
    char canon[PATH_MAX];
    const char *dir = realpath(run_dir, canon) ? canon : run_dir;
    uint64_t h = 0xcbf29ce484222325ULL;             /* FNV-1a, 64 bits */
    for (const unsigned char *p = (const unsigned char *)dir; *p; p++)
        h = (h ^ *p) * 0x100000001b3ULL;
    int n = snprintf(out, LLM_IPC_SHM_NAME_MAX, "/llm-%s-%016llx", name,
                     (unsigned long long)h);
    return n < 0 || n >= LLM_IPC_SHM_NAME_MAX ? -1 : 0;
}

uint64_t llm_ipc_layout(uint32_t n_slots, uint32_t ring_bytes, uint64_t max_request_bytes,
                        uint64_t *slots_off, uint64_t *rings_off,
                        uint64_t *requests_off, uint64_t *request_stride)
{
    uint64_t off = round_up(sizeof(llm_ipc_header), PAGE_BYTES);
    *slots_off = off;
    off = round_up(off + (uint64_t)n_slots * sizeof(llm_ipc_slot), PAGE_BYTES);
    *rings_off = off;
    off += (uint64_t)n_slots * ring_bytes;
    off = round_up(off, PAGE_BYTES);
    *requests_off = off;
    *request_stride = round_up(max_request_bytes, PAGE_BYTES);
    return off + (uint64_t)n_slots * *request_stride;
}

int llm_ipc_ring_put(llm_ipc_slot *s, unsigned char *ring, uint32_t ring_bytes,
                     const void *rec, size_t len)
{
    uint64_t need = ALIGN8(len);
    uint64_t head = atomic_load_explicit(&s->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&s->tail, memory_order_acquire);
    uint64_t free_bytes = ring_bytes - (head - tail);
    uint64_t pos = head & (ring_bytes - 1);
    uint64_t to_end = ring_bytes - pos;
    uint64_t pad = need > to_end ? to_end : 0;
    if (need > ring_bytes / 2 || pad + need > free_bytes) return 0;
    if (pad) {
        llm_ev_hdr h = { LLM_EV_PAD, 0, (uint32_t)(pad - sizeof h) };
        memcpy(ring + pos, &h, sizeof h);
        head += pad;
        pos = 0;
    }
    memcpy(ring + pos, rec, len);
    if (need > len) memset(ring + pos + len, 0, need - len);
    atomic_store_explicit(&s->head, head + need, memory_order_release);
    return 1;
}

int llm_ipc_ring_wake(llm_ipc_slot *s)
{
    atomic_thread_fence(memory_order_seq_cst);
    if (!atomic_load_explicit(&s->armed, memory_order_relaxed)) return 0;
    return atomic_exchange_explicit(&s->armed, 0, memory_order_acq_rel) != 0;
}

/* Copy whole records from tail up to head; PAD records are skipped. */
static long drain(llm_ipc_slot *s, const unsigned char *ring, uint32_t ring_bytes,
                  uint64_t head, void *buf, size_t cap)
{
    uint64_t tail = atomic_load_explicit(&s->tail, memory_order_relaxed);
    size_t n = 0;
    while (tail != head) {
        uint64_t avail = head - tail;
        uint64_t pos = tail & (ring_bytes - 1);
        llm_ev_hdr h;
        if (avail < sizeof h || avail > ring_bytes) return -1;
        memcpy(&h, ring + pos, sizeof h);
        uint64_t size = ALIGN8(sizeof h + (uint64_t)h.len);
        if (size > avail || pos + size > ring_bytes) return -1;
        if (h.type != LLM_EV_PAD) {
            if (h.type >= LLM_EV_TYPE_END || size > LLM_IPC_EVENT_MAX) return -1;
            if (n + size > cap) {
                if (!n) return -1;      /* cap below LLM_IPC_EVENT_MAX */
                break;
            }
            memcpy((char *)buf + n, ring + pos, size);
            n += size;
        }
        tail += size;
    }
    atomic_store_explicit(&s->tail, tail, memory_order_release);
    return (long)n;
}

long llm_ipc_ring_get(llm_ipc_slot *s, const unsigned char *ring, uint32_t ring_bytes,
                      void *buf, size_t cap)
{
    for (;;) {
        uint64_t head = atomic_load_explicit(&s->head, memory_order_acquire);
        long n = drain(s, ring, ring_bytes, head, buf, cap);
        if (n != 0) return n;
        /* Empty (perhaps after skipping padding): arm, then look again so
         * a record published meanwhile is not left without a doorbell. */
        atomic_store_explicit(&s->armed, 1, memory_order_relaxed);
        atomic_thread_fence(memory_order_seq_cst);
        if (atomic_load_explicit(&s->head, memory_order_acquire) == head) return 0;
    }
}

uint64_t llm_ipc_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
