/* Storage formats of the attention cache (the sliding-window ring, the
 * compressed entries and the indexer keys), and their encoders/decoders.
 *
 * Rows of n values are stored in regions of `nrows` rows (a ring, or one
 * layer's rows in a block):
 *   KV_F32   float32 rows;
 *   KV_BF16  bfloat16 rows (round to nearest, ties to even);
 *   KV_FP8   FP8 e4m3fn codes [nrows][n], then UE8M0 scales
 *            [nrows][ceil(n / KV_FP8_GROUP)]: each group of KV_FP8_GROUP
 *            channels of a row has the power-of-two scale 2^e with the
 *            smallest e such that amax <= 448 * 2^e (amax clamped to at
 *            least 1e-4, so zero rows are safe), as DeepSeek's inference
 *            code chooses its UE8M0 scales; value = code * 2^e; codes are
 *            rounded to nearest even and saturate at +-448.
 * The group is 64 channels: DeepSeek V4's RoPE tail (64 channels of the
 * 512) is a group of its own, and the indexer's 128-channel keys get two.
 * The CUDA kernels (kernels/cuda/common.cuh) store the same bytes. */
#ifndef LLM_CPU_KV_QUANT_H
#define LLM_CPU_KV_QUANT_H

#include <stddef.h>
#include <stdint.h>

enum kv_dtype { KV_F32, KV_BF16, KV_FP8 };

#define KV_FP8_GROUP 64

static inline int kv_groups(int n) { return (n + KV_FP8_GROUP - 1) / KV_FP8_GROUP; }

/* Bytes of one stored row of n values (FP8: codes and scales). */
static inline size_t kv_row_bytes(enum kv_dtype t, int n)
{
    return t == KV_F32 ? 4 * (size_t)n : t == KV_BF16 ? 2 * (size_t)n
                                                      : (size_t)n + kv_groups(n);
}

/* Bytes of a region of nrows rows, rounded up to 16 so the next region
 * stays aligned. */
static inline size_t kv_region_bytes(enum kv_dtype t, int nrows, int n)
{
    return ((size_t)nrows * kv_row_bytes(t, n) + 15) / 16 * 16;
}

/* The UE8M0 exponent e (scale 2^e) of a group whose largest magnitude is
 * amax: the smallest e with max(amax, 1e-4) <= 448 * 2^e.  448 = 1.75 * 2^8,
 * so with amax = m * 2^E (1 <= m < 2), e = E - 8, plus 1 when m > 1.75. */
int kv_fp8_exponent(float amax);

/* Row i of a region: store x (n values), load it back as floats. */
void kv_store(enum kv_dtype t, void *region, int nrows, int n, int i, const float *x);
void kv_load(enum kv_dtype t, const void *region, int nrows, int n, int i, float *out);
/* x = what storing and loading x gives (in place). */
void kv_round(enum kv_dtype t, float *x, int n);

#endif
