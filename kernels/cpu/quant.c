#include "quant.h"

#include <math.h>

const float fp4_e2m1_table[16] = {
    0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f,
};

float fp8_e4m3_to_f32(uint8_t b)
{
    int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    float v;
    if (e == 15 && m == 7) return NAN;
    if (e == 0) v = ldexpf((float)m, -9);            /* subnormal: m/8 * 2^-6 */
    else v = ldexpf((float)(m | 8), e - 10);         /* (1 + m/8) * 2^(e-7) */
    return s ? -v : v;
}

float e8m0_to_f32(uint8_t e)
{
    /* 2^(e-127) is the float with exponent field e; e = 0 is the
     * subnormal 2^-127. */
    uint32_t u = e == 255 ? 0x7fc00000u : e ? (uint32_t)e << 23 : 0x00400000u;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static float fp8_values[256];

__attribute__((constructor)) static void fp8_table_init(void)
{
    for (int i = 0; i < 256; i++) fp8_values[i] = fp8_e4m3_to_f32((uint8_t)i);
}

const float *const fp8_e4m3_table = fp8_values;

uint16_t f32_to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffff) > 0x7f800000) return 0x7fc0;
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* Nearest of n ascending non-negative values; ties to the even index. */
static int nearest(const float *v, int n, float a)
{
    int lo = 0, hi = n - 1;
    if (a >= v[hi]) return hi;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (v[mid] <= a) lo = mid;
        else hi = mid;
    }
    float dl = a - v[lo], dh = v[hi] - a;
    return dl < dh ? lo : dh < dl ? hi : (lo % 2 ? hi : lo);
}

uint8_t f32_to_fp8_e4m3(float x)
{
    if (isnan(x)) return 0x7f;
    uint8_t s = signbit(x) ? 0x80 : 0;
    return s | (uint8_t)nearest(fp8_values, 127, fabsf(x));   /* 0x7e = 448 */
}

uint8_t f32_to_fp4_e2m1(float x)
{
    uint8_t s = signbit(x) ? 8 : 0;
    return s | (uint8_t)nearest(fp4_e2m1_table, 8, fabsf(x));
}

float act_quant_scale(float amax)
{
    float s = fmaxf(amax, 1e-4f) * (1.0f / 448.0f);
    uint32_t u;
    memcpy(&u, &s, sizeof u);
    /* 2^ceil(log2 s) from the bits: the exponent, plus one unless s is
     * already a power of two (s >= 1e-4 / 448 is a normal number) */
    int e = (int)((u >> 23) & 0xff) - 127 + ((u & 0x7fffff) != 0);
    u = (uint32_t)(e + 127) << 23;
    memcpy(&s, &u, sizeof s);
    return s;
}

void act_quant_fp8(const float *x, int n, uint8_t *codes, float *scales)
{
    for (int g = 0; g * ACT_GROUP < n; g++) {
        int k0 = g * ACT_GROUP, k1 = k0 + ACT_GROUP < n ? k0 + ACT_GROUP : n;
        float amax = 0;
        for (int k = k0; k < k1; k++) amax = fmaxf(amax, fabsf(x[k]));
        float s = act_quant_scale(amax);
        scales[g] = s;
        for (int k = k0; k < k1; k++) codes[k] = f32_to_fp8_e4m3(x[k] / s);
    }
}

void act_quant_round(float *x, int n)
{
    uint8_t codes[ACT_GROUP];
    float s;
    for (int k0 = 0; k0 < n; k0 += ACT_GROUP) {
        int m = n - k0 < ACT_GROUP ? n - k0 : ACT_GROUP;
        act_quant_fp8(x + k0, m, codes, &s);
        for (int k = 0; k < m; k++) x[k0 + k] = fp8_values[codes[k]] * s;
    }
}
