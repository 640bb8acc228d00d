/* The indexer's tensor-core scores (kernels/cuda/indexer_mma.cu), callable
 * from C: the path the CUDA backend takes for steps of many tokens, here
 * on its own so tests can read the scores the op keeps internal.  Only
 * linked when the build has CUDA (LLM_HAVE_CUDA). */
#ifndef LLM_CUDA_INDEXER_MMA_H
#define LLM_CUDA_INDEXER_MMA_H

#ifdef __cplusplus
extern "C" {
#endif

#include "backend.h"

/* The kernels: prefill's on mma.sync or wgmma (keys gathered into tiles;
 * bf16, or e4m3 as the fp8 mode scores: indexer_fp8_scores, 256 keys a
 * block or 128), decode's (wgmma, keys read from the cache). */
enum cuda_indexer_kernel {
    CUDA_INDEXER_MMA_SYNC, CUDA_INDEXER_WGMMA, CUDA_INDEXER_DECODE, CUDA_INDEXER_WGMMA_FP8,
    CUDA_INDEXER_WGMMA_FP8_K128
};

/* scores[i][s] (device memory, row stride ld) for s < (pos0+i+1)/ratio of
 * each token i of a that sees more than a->topk entries (other elements
 * are left as they are), computed in token chunks of `chunk` (over key
 * tiles of `ktile` entries for the prefill's kernels), on the current
 * device's default stream by `kernel` (the prefill's wgmma falls back to
 * mma.sync where the device has no wgmma; the decode kernel needs it and
 * FP8 or bf16 keys).  a's q and w are device memory, a->keys.blocks a
 * host array of device block addresses; sel and nsel are not used.
 * Returns 0, or -1 with a message in err. */
int cuda_indexer_mma_scores(const indexer_args *a, float *scores, int ld, int chunk, int ktile,
                            enum cuda_indexer_kernel kernel, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
