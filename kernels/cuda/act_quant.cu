// DeepSeek's activation quantization for FP8 GEMMs (cpu/quant.h,
// act_quant_fp8: the same codes and scales), and the weights' UE8M0 block
// scales as the float32 tables cuBLASLt's block-scaled FP8 GEMMs read.
#include "cpu/quant.h"
#include "kernels.cuh"

static unsigned blocks_for(long long n, int threads) { return (unsigned)((n + threads - 1) / threads); }

// A warp per (token, group of 128 channels): lane i holds channels
// i, i + 32, i + 64, i + 96 of the group.  q: codes [T][ldq] and scales
// s[g * T + t] (tokens contiguous per group, as cuBLASLt's VEC128 scales
// of the B operand), or NULL; out: code * s as floats [T][ldo], or NULL.
__global__ void act_quant_kernel(const float *x, int ldx, int T, int K, uint8_t *q, int ldq,
                                 float *s, float *out, int ldo)
{
    int G = (K + ACT_GROUP - 1) / ACT_GROUP;
    long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (w >= (long long)T * G) return;
    int t = (int)(w / G), g = (int)(w % G);
    const float *xt = x + (long long)t * ldx + g * ACT_GROUP;
    int m = K - g * ACT_GROUP < ACT_GROUP ? K - g * ACT_GROUP : ACT_GROUP;
    float v[4], amax = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int k = lane + 32 * i;
        v[i] = k < m ? xt[k] : 0.0f;
        amax = fmaxf(amax, fabsf(v[i]));
    }
    float sc = act_scale(warp_max(amax));
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int k = lane + 32 * i;
        if (k >= m) continue;
        uint32_t code = fp8_enc(v[i] / sc);
        if (q) q[(long long)t * ldq + g * ACT_GROUP + k] = (uint8_t)code;
        if (out) out[(long long)t * ldo + g * ACT_GROUP + k] = fp8f(code) * sc;
    }
    if (s && lane == 0) s[(long long)g * T + t] = sc;
}

static void act_quant(cudaStream_t st, const float *x, int ldx, int T, int K, uint8_t *q, int ldq,
                      float *s, float *out, int ldo)
{
    long long warps = (long long)T * ((K + ACT_GROUP - 1) / ACT_GROUP);
    if (warps > 0)
        act_quant_kernel<<<blocks_for(warps * 32, 256), 256, 0, st>>>(x, ldx, T, K, q, ldq, s, out,
                                                                       ldo);
}

void cu_act_quant_fp8(cudaStream_t st, const float *x, int ldx, int T, int K, uint8_t *q, int ldq,
                      float *s)
{
    act_quant(st, x, ldx, T, K, q, ldq, s, NULL, 0);
}

void cu_act_quant_round(cudaStream_t st, const float *x, int ldx, int T, int K, float *out,
                        int ldo)
{
    act_quant(st, x, ldx, T, K, NULL, 0, NULL, out, ldo);
}

__global__ void fp8_wscales_kernel(const uint8_t *scale, long long sld, int nrb, int ncb,
                                   float *out, int ldo)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nrb * ldo) return;
    int rb = i / ldo, cb = i % ldo;
    out[i] = cb < ncb ? e8m0f(scale[rb * sld + cb]) : 0.0f;
}

void cu_fp8_wscales(cudaStream_t st, const uint8_t *scale, long long sld, int nrb, int ncb,
                    float *out, int ldo)
{
    if (nrb > 0 && ldo > 0)
        fp8_wscales_kernel<<<blocks_for((long long)nrb * ldo, 256), 256, 0, st>>>(scale, sld, nrb,
                                                                                   ncb, out, ldo);
}
