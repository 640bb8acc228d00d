#include "kv_quant.h"

#include <math.h>
#include <string.h>

#include "quant.h"

/* 2^k for -126 <= k <= 127, exactly. */
static float pow2f(int k)
{
    uint32_t u = (uint32_t)(127 + k) << 23;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

int kv_fp8_exponent(float amax)
{
    if (!(amax >= 1e-4f)) amax = 1e-4f;     /* also NaN */
    uint32_t u;
    memcpy(&u, &amax, sizeof u);
    return (int)((u >> 23) & 255) - 127 - 8 + ((u & 0x7fffff) > 0x600000);
}

static float group_amax(const float *x, int n)
{
    float m = 0;
    for (int c = 0; c < n; c++) m = fabsf(x[c]) > m ? fabsf(x[c]) : m;
    return m;
}

void kv_store(enum kv_dtype t, void *region, int nrows, int n, int i, const float *x)
{
    if (t == KV_F32) {
        memcpy((float *)region + (size_t)i * n, x, n * sizeof *x);
    } else if (t == KV_BF16) {
        uint16_t *d = (uint16_t *)region + (size_t)i * n;
        for (int c = 0; c < n; c++) d[c] = f32_to_bf16(x[c]);
    } else {
        uint8_t *codes = (uint8_t *)region + (size_t)i * n;
        uint8_t *scales = (uint8_t *)region + (size_t)nrows * n + (size_t)i * kv_groups(n);
        for (int g = 0; g < kv_groups(n); g++) {
            int c0 = g * KV_FP8_GROUP, len = n - c0 < KV_FP8_GROUP ? n - c0 : KV_FP8_GROUP;
            int e = kv_fp8_exponent(group_amax(x + c0, len));
            float inv = pow2f(-e);
            scales[g] = (uint8_t)(e + 127);
            for (int c = c0; c < c0 + len; c++) codes[c] = f32_to_fp8_e4m3(x[c] * inv);
        }
    }
}

void kv_load(enum kv_dtype t, const void *region, int nrows, int n, int i, float *out)
{
    if (t == KV_F32) {
        memcpy(out, (const float *)region + (size_t)i * n, n * sizeof *out);
    } else if (t == KV_BF16) {
        const uint16_t *s = (const uint16_t *)region + (size_t)i * n;
        for (int c = 0; c < n; c++) out[c] = bf16_to_f32(s[c]);
    } else {
        const uint8_t *codes = (const uint8_t *)region + (size_t)i * n;
        const uint8_t *scales = (const uint8_t *)region + (size_t)nrows * n + (size_t)i * kv_groups(n);
        for (int c = 0; c < n; c++)
            out[c] = fp8_e4m3_table[codes[c]] * pow2f(scales[c / KV_FP8_GROUP] - 127);
    }
}

void kv_round(enum kv_dtype t, float *x, int n)
{
    if (t == KV_F32) return;
    if (t == KV_BF16) {
        for (int c = 0; c < n; c++) x[c] = bf16_round(x[c]);
        return;
    }
    for (int c0 = 0; c0 < n; c0 += KV_FP8_GROUP) {
        int len = n - c0 < KV_FP8_GROUP ? n - c0 : KV_FP8_GROUP;
        int e = kv_fp8_exponent(group_amax(x + c0, len));
        float inv = pow2f(-e), s = pow2f(e);
        for (int c = c0; c < c0 + len; c++) x[c] = fp8_e4m3_table[f32_to_fp8_e4m3(x[c] * inv)] * s;
    }
}
