// DeepSeek's activation quantization for FP8 GEMMs (cpu/quant.h,
// act_quant_fp8: the same codes and scales), and the weights' UE8M0 block
// scales as the float32 tables cuBLASLt's block-scaled FP8 GEMMs read.
#include "act_quant.h"

#include <stdio.h>

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

// The same with 16-byte accesses (K, ldx, ldo multiples of 4, ldq of 4,
// the rows so aligned): a warp per (token, AQ_GROUPS groups), lane i
// holding channels 4i to 4i + 3 of each, their loads issued together.
// The warp-a-group form moves 4 bytes a load and one or two groups of
// loads a warp in flight: about half the bandwidth at prefill sizes
// (26.8 ms of a 2 x 32K fp8 prefill, run F10).
#define AQ_GROUPS 4
__global__ void act_quant_v4_kernel(const float *x, int ldx, int T, int K, uint8_t *q, int ldq,
                                    float *s, float *out, int ldo)
{
    int G = (K + ACT_GROUP - 1) / ACT_GROUP, GW = (G + AQ_GROUPS - 1) / AQ_GROUPS;
    long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (w >= (long long)T * GW) return;
    int t = (int)(w / GW), g0 = (int)(w % GW) * AQ_GROUPS;
    float4 v[AQ_GROUPS];
#pragma unroll
    for (int i = 0; i < AQ_GROUPS; i++) {
        int k = (g0 + i) * ACT_GROUP + 4 * lane;
        v[i] = k < K ? *(const float4 *)(x + (long long)t * ldx + k) : make_float4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < AQ_GROUPS; i++) {
        int g = g0 + i, k = g * ACT_GROUP + 4 * lane;
        if (g >= G) break;
        float e[4] = { v[i].x, v[i].y, v[i].z, v[i].w }, amax = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) amax = fmaxf(amax, fabsf(e[j]));
        float sc = act_scale(warp_max(amax));
        if (k < K) {
            uint32_t c[4];
#pragma unroll
            for (int j = 0; j < 4; j++) c[j] = fp8_enc(e[j] / sc);
            if (q)
                *(uint32_t *)(q + (long long)t * ldq + k) = c[0] | c[1] << 8 | c[2] << 16 |
                                                            c[3] << 24;
            if (out)
                *(float4 *)(out + (long long)t * ldo + k) =
                    make_float4(fp8f(c[0]) * sc, fp8f(c[1]) * sc, fp8f(c[2]) * sc,
                                fp8f(c[3]) * sc);
        }
        if (s && lane == 0) s[(long long)g * T + t] = sc;
    }
}

static void act_quant(cudaStream_t st, const float *x, int ldx, int T, int K, uint8_t *q, int ldq,
                      float *s, float *out, int ldo)
{
    auto a = [](const void *p, int n) { return (uintptr_t)p % n == 0; };
    if (K % 4 == 0 && ldx % 4 == 0 && a(x, 16) && (!q || (ldq % 4 == 0 && a(q, 4))) &&
        (!out || (ldo % 4 == 0 && a(out, 16)))) {
        long long G = (K + ACT_GROUP - 1) / ACT_GROUP,
                  warps = T * ((G + AQ_GROUPS - 1) / AQ_GROUPS);
        if (warps > 0)
            act_quant_v4_kernel<<<blocks_for(warps * 32, 256), 256, 0, st>>>(x, ldx, T, K, q, ldq,
                                                                             s, out, ldo);
        return;
    }
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

extern "C" int cuda_act_quant(const float *x, int ldx, int T, int K, uint8_t *q, int ldq,
                              float *s, float *out, int ldo, char *err, size_t errlen)
{
    act_quant(0, x, ldx, T, K, q, ldq, s, out, ldo);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e == cudaSuccess) return 0;
    snprintf(err, errlen, "act_quant: %s", cudaGetErrorString(e));
    return -1;
}
