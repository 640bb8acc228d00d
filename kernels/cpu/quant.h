/* Scalar decoders for the number formats of the released DeepSeek V4
 * checkpoint: BF16, FP8 e4m3 (the "fn" variant: no infinities, 0x7f
 * and 0xff are NaN), UE8M0 power-of-two scales and MXFP4 (E2M1) codes. */
#ifndef LLM_CPU_QUANT_H
#define LLM_CPU_QUANT_H

#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float fp8_e4m3_to_f32(uint8_t b);
/* 2^(e - 127); 255 is NaN. */
float e8m0_to_f32(uint8_t e);

/* All 256 FP8 e4m3 values, indexed by the byte. */
extern const float *const fp8_e4m3_table;
/* E2M1 codes: 0, .5, 1, 1.5, 2, 3, 4, 6, then the same negated (bit 3). */
extern const float fp4_e2m1_table[16];

/* Encoders (round to nearest, ties to even), for writing checkpoints. */
uint16_t f32_to_bf16(float x);
uint8_t f32_to_fp8_e4m3(float x);      /* saturates at +-448 */
uint8_t f32_to_fp4_e2m1(float x);      /* saturates at +-6 */

/* x rounded to the nearest bf16 (ties to even), as a float. */
static inline float bf16_round(float x) { return bf16_to_f32(f32_to_bf16(x)); }

/* Activations as DeepSeek's inference code quantizes them for its FP8
 * GEMMs (act_quant with scale_fmt "ue8m0"): each group of ACT_GROUP
 * channels (the last one may be shorter) gets the power-of-two scale
 * s = 2^ceil(log2(max(amax, 1e-4) * (1/448))), the float32 product taken
 * as is, and codes e4m3(x / s) rounded to nearest even, saturating at
 * +-448.  act_quant_fp8 writes the codes and scales (scales[g] for group
 * g); act_quant_round replaces x by code * s, the values an FP8 GEMM
 * multiplies (exact in float32 and in bf16). */
#define ACT_GROUP 128
float act_quant_scale(float amax);
void act_quant_fp8(const float *x, int n, uint8_t *codes, float *scales);
void act_quant_round(float *x, int n);

#endif
