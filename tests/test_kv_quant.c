/* The cache storage formats (kernels/cpu/kv_quant.h): exact FP8 e4m3 and
 * BF16 encodings of known values, ties to even, subnormals, saturation,
 * the UE8M0 scale choice against its definition, zero and negative rows,
 * partial groups, the planar FP8 layout, and that finite input never
 * comes back NaN. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/kv_quant.h"
#include "cpu/quant.h"
#include "tap.h"

static uint64_t rs = 777;
static double urand(void)
{
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (rs >> 11) / 9007199254740992.0;
}

/* The definition: the smallest e with max(amax, 1e-4) <= 448 * 2^e. */
static int exponent_ref(float amax)
{
    double a = amax < 1e-4f ? 1e-4f : amax;
    int e = -200;
    while (ldexp(448.0, e) < a) e++;
    return e;
}

static void test_exponent(void)
{
    ok(kv_fp8_exponent(448.0f) == 0 && kv_fp8_exponent(nextafterf(448.0f, 1000)) == 1 &&
       kv_fp8_exponent(224.0f) == -1 && kv_fp8_exponent(1.0f) == -8 &&
       kv_fp8_exponent(1.75f) == -8 && kv_fp8_exponent(nextafterf(1.75f, 2)) == -7 &&
       kv_fp8_exponent(2.0f) == -7, "fp8 scale: 448 -> 2^0, 224 -> 2^-1, 1 and 1.75 -> 2^-8, "
       "just above 1.75 -> 2^-7");
    ok(kv_fp8_exponent(0.0f) == -22 && kv_fp8_exponent(1e-30f) == -22 &&
       kv_fp8_exponent(NAN) == -22, "fp8 scale: zero (and tiny) groups take amax 1e-4: 2^-22");
    int bad = 0;
    for (int i = 0; i < 100000; i++) {
        float a = (float)ldexp(urand() + 0.5, (int)(urand() * 200) - 80);
        bad += kv_fp8_exponent(a) != exponent_ref(a);
    }
    /* exact boundaries 448 * 2^k and their neighbours */
    for (int k = -20; k < 100; k++) {
        float b = ldexpf(448.0f, k);
        bad += kv_fp8_exponent(b) != exponent_ref(b);
        bad += kv_fp8_exponent(nextafterf(b, 0)) != exponent_ref(nextafterf(b, 0));
        bad += kv_fp8_exponent(nextafterf(b, INFINITY)) != exponent_ref(nextafterf(b, INFINITY));
    }
    is_int(bad, 0, "fp8 scale: equals the definition on 100000 random amax and at every boundary");
}

/* One row of 64 with amax 448 (scale 2^0): codes are the plain e4m3
 * encodings. */
static void test_fp8_codes(void)
{
    float x[64] = { 448, 1.0f, -2.0f, 0.001953125f /* 2^-9 */, 0.0009765625f /* 2^-10 */,
                    0.0029296875f /* 3*2^-10 */, 1.0625f, 1.1875f, -1.0625f, 0.0f, -0.0f,
                    240.0f, 232.0f, 0.015625f /* 2^-6, smallest normal */, 0.013671875f };
    uint8_t want[15] = { 0x7e, 0x38, 0xc0, 0x01, 0x00, 0x02, 0x38, 0x3a, 0xb8, 0x00, 0x80,
                         0x77, 0x76, 0x08, 0x07 };
    uint8_t region[64 + 1];
    kv_store(KV_FP8, region, 1, 64, 0, x);
    int bad = 0;
    for (int i = 0; i < 15; i++) bad += region[i] != want[i];
    for (int i = 15; i < 64; i++) bad += region[i] != 0;
    ok(!bad && region[64] == 127, "fp8 codes: 448 1 -2, subnormals 2^-9, ties 2^-10 -> 0 and "
       "3*2^-10 -> 2 (even), normal ties 1.0625 -> 1, 1.1875 -> 1.25, signed zeros, 2^-6 "
       "smallest normal, 0.013671875 -> 7*2^-9; scale byte 127");
    float back[64];
    kv_load(KV_FP8, region, 1, 64, 0, back);
    bad = 0;
    for (int i = 0; i < 64; i++) bad += back[i] != fp8_e4m3_to_f32(region[i]);
    ok(!bad && signbit(back[10]), "fp8 load: code * 2^0, -0 kept");

    /* Scale 2^3 (amax 3000): values are divided by 8 before encoding;
     * 3584 = 448 * 8 would be the ceiling, 3000/8 = 375 -> 384 (0x7c is
     * 384; 375 lies between 352 and 384, nearer 384). */
    float y[64] = { 3000.0f, -8.0f, 1.0f };
    kv_store(KV_FP8, region, 1, 64, 0, y);
    ok(region[64] == 130 && region[0] == 0x7c && region[1] == 0xb8 && region[2] == 0x20,
       "fp8 with scale 2^3: 3000 -> 384*8, -8 -> -1*8, 1 -> 0.125*8 (0x20)");
}

static void test_bf16(void)
{
    float x[6] = { 1.0f, 1.00390625f /* 1 + 2^-8: tie */, 1.01171875f /* 1 + 3*2^-8: tie */,
                   -3.0f, 1e-40f /* subnormal */, 3.0e38f };
    uint16_t r[6];
    kv_store(KV_BF16, r, 1, 6, 0, x);
    float sub = 1e-40f;
    uint32_t su;
    memcpy(&su, &sub, 4);
    ok(r[0] == 0x3f80 && r[1] == 0x3f80 && r[2] == 0x3f82 && r[3] == 0xc040 &&
       r[4] == (uint16_t)((su + 0x7fff + ((su >> 16) & 1)) >> 16) && r[5] == 0x7f62,
       "bf16: 1, ties to even (1+2^-8 -> 1, 1+3*2^-8 -> 1+2^-6), -3, subnormal, 3e38");
    float back[6];
    kv_load(KV_BF16, r, 1, 6, 0, back);
    ok(back[0] == 1.0f && back[2] == 1.015625f && back[3] == -3.0f, "bf16 load");
}

/* Rows of random data over a wide range: round trips, layout, round ==
 * store + load, no NaN, error bounds per format. */
static void test_rows(void)
{
    enum { N = 100, R = 5 };      /* two groups: 64 + 36 */
    float x[R][N];
    for (int i = 0; i < R; i++)
        for (int c = 0; c < N; c++)
            x[i][c] = (float)((urand() * 2 - 1) * ldexp(1, (int)(urand() * 60) - 30));
    for (int c = 0; c < N; c++) x[1][c] = 0.0f;        /* zero row */
    for (int c = 0; c < N; c++) x[2][c] = -fabsf(x[0][c]);
    x[3][70] = 1e30f;                                   /* one huge value in group 2 */
    ok(kv_row_bytes(KV_FP8, 512) == 520 && kv_row_bytes(KV_BF16, 512) == 1024 &&
       kv_row_bytes(KV_F32, 512) == 2048 && kv_row_bytes(KV_FP8, 100) == 102 &&
       kv_region_bytes(KV_FP8, 3, 100) == 320, "row bytes: fp8 512 -> 512 + 8 scales");
    static const enum kv_dtype types[3] = { KV_F32, KV_BF16, KV_FP8 };
    static const char *names[3] = { "f32", "bf16", "fp8" };
    for (int ti = 0; ti < 3; ti++) {
        enum kv_dtype t = types[ti];
        _Alignas(16) unsigned char region[R * N * 4 + 16];
        for (int i = 0; i < R; i++) kv_store(t, region, R, N, i, x[i]);
        int nan = 0, notround = 0;
        double worst = 0;
        for (int i = 0; i < R; i++) {
            float back[N], r[N];
            kv_load(t, region, R, N, i, back);
            memcpy(r, x[i], sizeof r);
            kv_round(t, r, N);
            notround += memcmp(r, back, sizeof r) != 0;
            for (int g = 0; g < 2; g++) {
                int c0 = g * 64, c1 = g ? N : 64;
                float amax = 0;
                for (int c = c0; c < c1; c++) amax = fmaxf(amax, fabsf(x[i][c]));
                for (int c = c0; c < c1; c++) {
                    nan += isnan(back[c]);
                    /* relative to the element, for elements within 2^-6 of
                     * the group's largest (fp8's normal range) */
                    if (x[i][c] != 0 && fabsf(x[i][c]) >= amax / 64)
                        worst = fmax(worst, fabs(back[c] - x[i][c]) / fabsf(x[i][c]));
                }
            }
        }
        double bound = t == KV_F32 ? 0 : t == KV_BF16 ? ldexp(1, -8) : ldexp(1, -4);
        ok(!nan && !notround && worst <= bound, "%s rows: round == store + load, no NaN, "
           "worst relative error %.3g <= %.3g (half an ulp)", names[ti], worst, bound);
    }
    /* the planar layout: codes of row i at i*N, its scales at R*N + 2i */
    unsigned char region[R * 102];
    for (int i = 0; i < R; i++) kv_store(KV_FP8, region, R, N, i, x[i]);
    int e0 = kv_fp8_exponent(0), e3 = kv_fp8_exponent(1e30f);
    ok(region[R * N + 2] == e0 + 127 && region[R * N + 3] == e0 + 127 &&
       region[R * N + 7] == e3 + 127 && region[3 * N + 70] == f32_to_fp8_e4m3(ldexpf(1e30f, -e3)),
       "fp8 layout: zero row scales 2^-22 at R*N + 2i, the huge value's group scale 2^%d", e3);
    int sign = 0;
    for (int c = 0; c < N; c++) sign += region[2 * N + c] != (region[c] | 0x80);
    is_int(sign, 0, "fp8: a negated row has the same codes with the sign bit set");

    /* Infinity takes the largest scale and saturates to the largest code,
     * which decodes to infinity again (448 * 2^120 overflows float32),
     * never NaN; the group's finite values flush to zero. */
    float inf[64] = { INFINITY, -1.0f };
    unsigned char ri[65];
    kv_store(KV_FP8, ri, 1, 64, 0, inf);
    float back[64];
    kv_load(KV_FP8, ri, 1, 64, 0, back);
    ok(ri[0] == 0x7e && ri[64] == 247 && back[0] == INFINITY && back[1] == 0 && !isnan(back[2]),
       "fp8: infinity saturates to 448 * 2^%d", ri[64] - 127);
}

int main(void)
{
    test_exponent();
    test_fp8_codes();
    test_bf16();
    test_rows();
    return exit_status();
}
