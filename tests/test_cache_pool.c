/* How the cache pool is sized from the load options (model.h): a byte
 * budget (kv_cache_memory_bytes), a token count, and that
 * gpu_memory_utilization leaves the CPU backend's sizing alone (on the
 * CUDA backend it is checked by tests/gpu/test_cuda_model.c). */
#include <string.h>

#include "kv_cache.h"
#include "model.h"
#include "tap.h"

#define DEMO "tests/fixtures/demo"

static v4_model *load(const v4_options *o, strbuf *err)
{
    v4_model *m = NULL;
    sb_reset(err);
    if (v4_model_load(&m, DEMO, o, err)) return NULL;
    return m;
}

int main(void)
{
    strbuf err;
    sb_init(&err);
    v4_config cfg;
    if (v4_config_load(&cfg, DEMO "/config.json", &err)) {
        ok(0, "demo config loads: %s", err.data);
        return exit_status();
    }
    cache_layout L;
    cache_layout_init(&L, &cfg, KV_F32);
    ok(L.block_tokens % 128 == 0 && L.block_bytes > 0 && L.state_bytes > 0,
       "demo layout: blocks of %d positions (a multiple of the largest ratio, 128), %zu bytes; "
       "%zu bytes of state", L.block_tokens, L.block_bytes, L.state_bytes);
    size_t fixed = 3 * L.state_bytes;
    is_int(cache_blocks_in(&L, fixed - 1, 3), -1, "a budget below the state slots fits nothing");
    is_int(cache_blocks_in(&L, fixed, 3), 0, "exactly the state slots: no blocks");
    is_int(cache_blocks_in(&L, fixed + 7 * L.block_bytes - 1, 3), 6, "whole blocks only");
    is_int(cache_blocks_in(&L, fixed + 7 * L.block_bytes, 3), 7, "7 blocks beside 3 slots");
    is_int(cache_blocks_for(&L, 1), 1, "one position takes a block");
    is_int(cache_blocks_for(&L, L.block_tokens + 1), 2, "block_tokens + 1 positions take two");

    v4_cache_info ci;
    v4_options o = { .tp = 1, .threads_per_rank = 1, .max_seqs = 3,
                     .cache_bytes = fixed + 7 * L.block_bytes + 5 };
    v4_model *m = load(&o, &err);
    if (ok(m != NULL, "load with a byte budget")) {
        v4_cache_info_get(m, &ci);
        is_int(ci.blocks_total, 7, "byte budget: 7 blocks");
        is_int(ci.seqs_total, 3, "byte budget: 3 state slots");
        v4_model_free(m);
    } else diag("%s", err.data);

    o.cache_bytes = fixed - 1;
    m = load(&o, &err);
    ok(!m && strstr(err.data, "less than the") && strstr(err.data, "3 sequences"),
       "a byte budget below the state is refused: %s", err.data);
    v4_model_free(m);

    /* No byte budget: max_seqs x tokens, plus a block per sequence for
     * the partial last block; gpu_memory_utilization is for the CUDA
     * backend and changes nothing here. */
    o = (v4_options){ .tp = 2, .threads_per_rank = 1, .max_seqs = 2, .cache_tokens = 1000,
                      .gpu_memory_utilization = 0.5, .max_step_tokens = 64 };
    m = load(&o, &err);
    if (ok(m != NULL, "load with a token count at tp=2")) {
        v4_cache_info_get(m, &ci);
        is_int(ci.blocks_total, cache_blocks_for(&L, 1000) + 2,
               "token count: blocks for 1000 positions + one per sequence");
        size_t f = 1, t = 1;
        v4_model_mem(m, &f, &t);
        ok(f == 0 && t == 0, "the CPU backend reports no device memory");
        v4_model_free(m);
    } else diag("%s", err.data);

#ifdef LLM_HAVE_CUDA
    skip(1, "built with CUDA: the CUDA sizing is tests/gpu/test_cuda_model.c's");
#else
    o.backend = "cuda";
    m = load(&o, &err);
    ok(!m && strstr(err.data, "not available"), "backend cuda in a CUDA=0 build: %s", err.data);
#endif
    cache_layout_free(&L);
    v4_config_free(&cfg);
    sb_free(&err);
    return exit_status();
}
