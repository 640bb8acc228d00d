// DeepSeek's activation quantization for FP8 GEMMs (cpu/quant.h,
// act_quant_fp8: the same codes and scales), and the weights' UE8M0 block
// scales as the float32 tables cuBLASLt's block-scaled FP8 GEMMs read.
#include "act_quant.h"

#include <stdio.h>

#include "cpu/quant.h"
#include "kernels.cuh"

static unsigned blocks_for(long long n, int threads) { return (unsigned)((n + threads - 1) / threads); }

// A warp per (token, AQ_GROUPS groups of ACT_GROUP channels), lane i
// holding channels 4i to 4i + 3 of each, their loads issued together.
// q: codes [T][ldq] and scales s[g * T + t] (tokens contiguous per group,
// as cuBLASLt's VEC128 scales of the B operand), or NULL; out: code * s
// as floats [T][ldo], or NULL.  V4 (K, ldx, ldo multiples of 4, ldq of
// 4, the rows so aligned): 16-byte loads and float4 / 4-byte stores.
// Its earlier form, a warp a group and 4-byte loads, took 26.8 ms of a
// 2 x 32K fp8 prefill on the H100 (run F10), this one 19.4 (run I1).
#define AQ_GROUPS 4
template <bool V4>
__global__ void act_quant_kernel(const float *x, int ldx, int T, int K, uint8_t *q, int ldq,
                                 float *s, float *out, int ldo)
{
    int G = (K + ACT_GROUP - 1) / ACT_GROUP, GW = (G + AQ_GROUPS - 1) / AQ_GROUPS;
    long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (w >= (long long)T * GW) return;
    int t = (int)(w / GW), g0 = (int)(w % GW) * AQ_GROUPS;
    const float *xt = x + (long long)t * ldx;
    float v[AQ_GROUPS][4];
#pragma unroll
    for (int i = 0; i < AQ_GROUPS; i++) {
        int k = (g0 + i) * ACT_GROUP + 4 * lane;
        if (V4) {
            float4 f = k < K ? *(const float4 *)(xt + k) : make_float4(0, 0, 0, 0);
            v[i][0] = f.x, v[i][1] = f.y, v[i][2] = f.z, v[i][3] = f.w;
        } else {
#pragma unroll
            for (int j = 0; j < 4; j++) v[i][j] = k + j < K ? xt[k + j] : 0.0f;
        }
    }
#pragma unroll
    for (int i = 0; i < AQ_GROUPS; i++) {
        int g = g0 + i, k = g * ACT_GROUP + 4 * lane;
        if (g >= G) break;
        float amax = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) amax = fmaxf(amax, fabsf(v[i][j]));
        float sc = act_scale(warp_max(amax));
        uint32_t c[4];
#pragma unroll
        for (int j = 0; j < 4; j++) c[j] = fp8_enc(v[i][j] / sc);
        long long qo = (long long)t * ldq + k, oo = (long long)t * ldo + k;
        if (V4 && k < K) {
            if (q) *(uint32_t *)(q + qo) = c[0] | c[1] << 8 | c[2] << 16 | c[3] << 24;
            if (out)
                *(float4 *)(out + oo) = make_float4(fp8f(c[0]) * sc, fp8f(c[1]) * sc,
                                                    fp8f(c[2]) * sc, fp8f(c[3]) * sc);
        } else if (!V4) {
#pragma unroll
            for (int j = 0; j < 4; j++) {
                if (k + j >= K) break;
                if (q) q[qo + j] = (uint8_t)c[j];
                if (out) out[oo + j] = fp8f(c[j]) * sc;
            }
        }
        if (s && lane == 0) s[(long long)g * T + t] = sc;
    }
}

static void act_quant(cudaStream_t st, const float *x, int ldx, int T, int K, uint8_t *q, int ldq,
                      float *s, float *out, int ldo)
{
    auto a = [](const void *p, int n) { return (uintptr_t)p % n == 0; };
    bool v4 = K % 4 == 0 && ldx % 4 == 0 && a(x, 16) && (!q || (ldq % 4 == 0 && a(q, 4))) &&
              (!out || (ldo % 4 == 0 && a(out, 16)));
    long long G = (K + ACT_GROUP - 1) / ACT_GROUP, warps = T * ((G + AQ_GROUPS - 1) / AQ_GROUPS);
    if (warps <= 0) return;
    auto k = v4 ? act_quant_kernel<true> : act_quant_kernel<false>;
    k<<<blocks_for(warps * 32, 256), 256, 0, st>>>(x, ldx, T, K, q, ldq, s, out, ldo);
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
