/* The numeric modes of a backend that change its outputs: recipe keys
 * (gemm_mode, moe_kernel, attn_tokens; docs/RECIPES.md), part of
 * system_fingerprint, passed to the backend when it is created.  The CPU
 * backend is the float32 reference: of these it honours gemm_mode fp8
 * alone (DeepSeek's FP8 numerics, the reference of the GPU's fp8 mode)
 * and computes every other mode exactly.
 *
 * Adding a GEMM mode: a value before BACKEND_GEMM_N, its name at the same
 * index of backend_gemm_names, and the CUDA backend's
 * handling; the recipe, the overrides and the fingerprint follow. */
#ifndef LLM_BACKEND_MODES_H
#define LLM_BACKEND_MODES_H

#include <stddef.h>

/* Prefill GEMMs (and tensor cores for attention and the indexer):
 * activations in two bf16 parts, in one, or float32 operands; or fp8,
 * DeepSeek's numerics: activations of FP8 and MXFP4 matmuls quantized by
 * act_quant (e4m3 per 128 channels, UE8M0 scales), FP8 weights multiplied
 * as FP8, everything else as under bf16 (docs/MODEL.md). */
enum backend_gemm {
    BACKEND_GEMM_BF16X2, BACKEND_GEMM_BF16, BACKEND_GEMM_F32, BACKEND_GEMM_FP8, BACKEND_GEMM_N
};
static const char *const backend_gemm_names[BACKEND_GEMM_N + 1] = { "bf16x2", "bf16", "f32", "fp8",
                                                                    NULL };

/* Prefill experts: the grouped MXFP4 kernel (moe_gemm.cu) or cuBLASLt per
 * expert. */
enum backend_moe { BACKEND_MOE_GROUPED, BACKEND_MOE_CUBLASLT, BACKEND_MOE_N };
static const char *const backend_moe_names[BACKEND_MOE_N + 1] = { "grouped", "cublaslt", NULL };

#define BACKEND_ATTN_TOKENS_MAX 2   /* query tokens per tensor-core attention block */

typedef struct {
    int gemm;          /* enum backend_gemm */
    int moe;           /* enum backend_moe */
    int attn_tokens;   /* 1 .. BACKEND_ATTN_TOKENS_MAX */
} backend_modes;

#define BACKEND_MODES_DEFAULT { BACKEND_GEMM_BF16X2, BACKEND_MOE_GROUPED, 1 }

/* Apply the environment overrides LLM_CUDA_GEMM, LLM_CUDA_MOE and
 * LLM_CUDA_ATTN_TOKENS (comparisons and benchmarks; unset or empty: keep).
 * 0, or -1 with a message naming the variable and the values it takes. */
int backend_modes_env(backend_modes *m, char *err, size_t errlen);

/* "gemm_mode=bf16x2 moe_kernel=grouped attn_tokens=1" */
void backend_modes_describe(const backend_modes *m, char *out, size_t len);

#endif
