/* DeepSeek's activation quantization on the GPU (act_quant.cu), callable
 * from C so that tests can compare its codes, scales and rounded values
 * with kernels/cpu's act_quant_fp8 / act_quant_round byte for byte.  Only
 * linked when the build has CUDA (LLM_HAVE_CUDA). */
#ifndef LLM_CUDA_ACT_QUANT_H
#define LLM_CUDA_ACT_QUANT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* x [T][ldx] (device memory, K channels a row) quantized in groups of
 * ACT_GROUP channels on the current device's default stream, then
 * waited for: codes q [T][ldq] and scales s [group * T + token] (q NULL:
 * none), and/or the quantized values as floats out [T][ldo] (NULL: none).
 * Returns 0, or -1 with CUDA's message in err. */
int cuda_act_quant(const float *x, int ldx, int T, int K, uint8_t *q, int ldq, float *s,
                   float *out, int ldo, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
