#include "segment.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "procfs.h"
#include "version.h"

int segment_peek(const char *file, llm_ipc_header *out)
{
    char path[LLM_IPC_NAME_MAX + 32];
    snprintf(path, sizeof path, "/dev/shm/%s", file);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = pread(fd, out, sizeof *out, 0);
    close(fd);
    if (n != (ssize_t)sizeof *out || out->magic != LLM_IPC_MAGIC
        || out->version != LLM_IPC_VERSION || out->header_bytes != sizeof *out)
        return -1;
    out->name[LLM_IPC_NAME_MAX - 1] = 0;
    out->state_msg[LLM_IPC_STATE_MSG - 1] = 0;
    return 0;
}

/* An existing segment of ours: remove it if its engine is dead. */
static int replace_stale(const char *shm_name, strbuf *err)
{
    llm_ipc_header h;
    bool ours = segment_peek(shm_name + 1, &h) == 0;
    if (ours && h.pid != getpid() && pid_alive(h.pid)) {
        sb_printf(err, "shared memory %s belongs to a running engine (pid %d, state %s); "
                  "stop it first or choose another name", shm_name, h.pid,
                  llm_ipc_state_name(atomic_load(&h.state)));
        return -1;
    }
    if (shm_unlink(shm_name) < 0 && errno != ENOENT) {
        sb_printf(err, "cannot remove stale %s: %s", shm_name, strerror(errno));
        return -1;
    }
    if (ours)
        fprintf(stderr, "llm-engine: replaced stale %s (engine pid %d is gone)\n", shm_name, h.pid);
    else
        fprintf(stderr, "llm-engine: replaced %s (no valid header)\n", shm_name);
    return 0;
}

static uint64_t new_epoch(void)
{
    uint64_t e = 0;
    while (!e) {
        if (getrandom(&e, sizeof e, 0) != (ssize_t)sizeof e)
            e = llm_ipc_now_ns() ^ ((uint64_t)getpid() << 32);
    }
    return e;
}

int segment_create(segment *seg, const segment_params *p, strbuf *err)
{
    memset(seg, 0, sizeof *seg);
    seg->fd = -1;
    if (strlen(p->name) >= LLM_IPC_NAME_MAX) {
        sb_printf(err, "engine name '%s' is longer than %d bytes", p->name, LLM_IPC_NAME_MAX - 1);
        return -1;
    }
    llm_ipc_shm_name(seg->shm_name, p->run_dir, p->name);
    uint64_t so, ro, qo, qs;
    uint64_t bytes = llm_ipc_layout(p->n_slots, p->ring_bytes, p->max_request_bytes,
                                    &so, &ro, &qo, &qs);
    int fd = -1;
    for (int attempt = 0; attempt < 2 && fd < 0; attempt++) {
        fd = shm_open(seg->shm_name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0660);
        if (fd < 0 && errno == EEXIST && attempt == 0) {
            if (replace_stale(seg->shm_name, err)) return -1;
        } else if (fd < 0) {
            sb_printf(err, "cannot create shared memory %s: %s", seg->shm_name, strerror(errno));
            return -1;
        }
    }
    /* 0660 whatever the umask: nginx workers of the engine's group map it */
    fchmod(fd, 0660);
    /* Back the fixed parts (header, slots, rings, the first bytes of each
     * request area) now, so a full /dev/shm fails here, not with SIGBUS. */
    uint64_t reserve = p->max_request_bytes < LLM_IPC_REQ_RESERVED ? p->max_request_bytes
                                                                   : LLM_IPC_REQ_RESERVED;
    int rc = ftruncate(fd, (off_t)bytes);
    if (rc == 0) rc = posix_fallocate(fd, 0, (off_t)qo);
    for (uint32_t k = 0; rc == 0 && k < p->n_slots; k++)
        rc = posix_fallocate(fd, (off_t)(qo + k * qs), (off_t)reserve);
    if (rc) {
        int e = rc < 0 ? errno : rc;
        sb_printf(err, "cannot size shared memory %s to %llu bytes: %s (check /dev/shm space, "
                  "slots, max_request_bytes)", seg->shm_name, (unsigned long long)bytes,
                  strerror(e));
        close(fd);
        shm_unlink(seg->shm_name);
        return -1;
    }
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        sb_printf(err, "mmap %s: %s", seg->shm_name, strerror(errno));
        close(fd);
        shm_unlink(seg->shm_name);
        return -1;
    }
    seg->hdr = m;
    seg->bytes = bytes;
    seg->fd = fd;

    llm_ipc_header *h = seg->hdr;   /* fresh pages are zero: every slot FREE, gen 0 */
    h->version = LLM_IPC_VERSION;
    h->header_bytes = sizeof *h;
    h->segment_bytes = bytes;
    h->epoch = new_epoch();
    h->pid = getpid();
    snprintf(h->engine_build, sizeof h->engine_build, "%s", llm_engine_build());
    h->n_slots = p->n_slots;
    atomic_store(&h->state, LLM_STATE_STARTING);
    h->n_models = (uint32_t)(p->n_models < LLM_IPC_MODELS_MAX ? p->n_models : LLM_IPC_MODELS_MAX);
    for (uint32_t i = 0; i < h->n_models; i++)
        snprintf(h->models[i], LLM_IPC_MODEL_MAX, "%s", p->models[i]);
    atomic_store(&h->heartbeat_ns, llm_ipc_now_ns());
    atomic_store(&h->progress_ns, llm_ipc_now_ns());
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    h->start_unix_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    h->max_model_len = p->max_model_len;
    h->max_num_seqs = p->max_num_seqs;
    h->max_num_batched_tokens = p->max_num_batched_tokens;
    h->ring_bytes = p->ring_bytes;
    h->max_request_bytes = p->max_request_bytes;
    h->slots_off = so;
    h->rings_off = ro;
    h->requests_off = qo;
    h->request_stride = qs;
    snprintf(h->name, sizeof h->name, "%s", p->name);
    /* Magic last: a client that sees it sees a complete header. */
    atomic_thread_fence(memory_order_release);
    h->magic = LLM_IPC_MAGIC;
    return 0;
}

void segment_set_state(segment *seg, enum llm_ipc_state st, const char *msg)
{
    if (msg) snprintf(seg->hdr->state_msg, sizeof seg->hdr->state_msg, "%s", msg);
    atomic_store_explicit(&seg->hdr->state, st, memory_order_release);
}

void segment_close(segment *seg, int unlink_it)
{
    if (seg->hdr) munmap(seg->hdr, seg->bytes);
    if (seg->fd >= 0) close(seg->fd);
    if (unlink_it) shm_unlink(seg->shm_name);
    seg->hdr = NULL;
    seg->fd = -1;
}
