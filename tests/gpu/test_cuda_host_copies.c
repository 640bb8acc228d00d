/* The CUDA backend's host-tier copies (backend.h: host_alloc, copy_async,
 * copy_fence; the prefix cache's host tier, engine/model/model_prefix.c),
 * make test-gpu, needs a GPU.  The copies run on a stream of their own, so
 * what is checked is their order against the compute stream, with copies
 * large enough (256 MiB) that a missing dependency shows:
 *   - a device-to-host copy issued right after a compute-stream op that
 *     writes its source reads what that op wrote;
 *   - after copy_fence, a compute-stream op reads what a host-to-device
 *     copy wrote, and one that overwrites a copy's source comes after it;
 *   - the host memory is pinned (cudaHostAlloc, portable): with two
 *     devices, rank 1 copies through memory rank 0's backend allocated.
 * Outputs are poisoned before each copy.  The prefix cache's own round
 * trip (bytes and logits bit for bit) is test_prefix_cache's host_roundtrip,
 * which make test-gpu runs with LLM_TEST_BACKEND=cuda. */
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "tap.h"

#define N ((size_t)256 << 20)
#define ROW 16384           /* floats per copy_rows row */

static void fill(uint32_t *p, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) p[i] = seed * 2654435761u + (uint32_t)i * 40503u;
}

/* dst = src on the compute stream (one copy_rows over N bytes). */
static void compute_copy(backend *b, void *dst, const void *src)
{
    b->copy_rows(b, dst, ROW, src, ROW, (int)(N / 4 / ROW), ROW);
}

static void order(backend *b, backend *host_owner, const char *what)
{
    uint32_t *h = host_owner->host_alloc(host_owner, N);
    uint32_t *want = malloc(N), *got = malloc(N);
    char *x = b->alloc(b, N), *y = b->alloc(b, N);
    if (!h || !want || !got || !x || !y) {
        ok(0, "%s: allocations (pinned host %p)", what, (void *)h);
        goto out;
    }
    size_t n = N / 4;

    /* device -> host after a compute op that writes the source */
    fill(want, n, 1);
    fill(got, n, 2);
    b->write(b, y, want, N);
    b->write(b, x, got, N);
    memset(h, 0xff, N);
    compute_copy(b, x, y);
    b->copy_async(b, h, x, N, true);
    b->copy_fence(b, false);
    b->read(b, got, x, 4);      /* the compute stream waits for the copy */
    ok(!memcmp(h, want, N), "%s: a copy to the host reads what the op before it wrote", what);

    /* host -> device, then a compute op that reads it */
    fill(want, n, 3);
    memcpy(h, want, N);
    b->copy_async(b, x, h, N, false);
    b->copy_fence(b, false);
    compute_copy(b, y, x);
    memset(got, 0xff, N);
    b->read(b, got, y, N);
    ok(!memcmp(got, want, N), "%s: after the fence an op reads what a copy from the host wrote",
       what);

    /* device -> host, then a compute op that overwrites the source */
    memset(h, 0xff, N);
    b->copy_async(b, h, x, N, true);
    b->copy_fence(b, false);
    fill(got, n, 4);
    b->write(b, x, got, N);
    b->read(b, got, x, 4);
    ok(!memcmp(h, want, N) && b->error(b) == NULL,
       "%s: an op after the fence overwrites a copy's source only after the copy", what);

    /* a fence that waits: the host finds the copy done */
    memset(h, 0xff, N);
    b->copy_async(b, h, x, N, true);
    b->copy_fence(b, true);
    ok(!memcmp(h, got, N), "%s: after a waiting fence the host reads the copy", what);
out:
    b->release(b, x);
    b->release(b, y);
    if (h) host_owner->host_free(host_owner, h);
    free(want);
    free(got);
}

int main(void)
{
    const char *mt = getenv("LLM_TEST_MAX_TP");
    int tp = mt && atoi(mt) >= 2 ? 2 : 1;
    backend *b[2] = { NULL, NULL };
    backend_modes modes = BACKEND_MODES_DEFAULT;
    char err[256];
    if (backend_cuda_new_group(tp, &modes, b, err, sizeof err)) {
        ok(0, "a CUDA backend group of %d: %s", tp, err);
        return exit_status();
    }
    ok(b[0]->host_alloc && b[0]->host_free && b[0]->copy_async && b[0]->copy_fence,
       "the CUDA backend has host-tier copies");
    if (b[0]->copy_async) {
        order(b[0], b[0], "rank 0");
        if (tp == 2) order(b[1], b[0], "rank 1 through rank 0's pinned memory");
        else diag("one device: the cross-device case is skipped");
    }
    for (int r = 0; r < tp; r++) b[r]->destroy(b[r]);
    return exit_status();
}
