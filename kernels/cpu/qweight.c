#include "qweight.h"

#include <math.h>
#include <string.h>

#include "hot.h"
#include "quant.h"

/* Branch-free decoders the compiler vectorizes (no table gathers, no
 * data-dependent branches, no subnormal intermediates); equal to the
 * tables in quant.c, which the tests check code by code. */
static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Select a where mask is all ones, else b. */
static inline uint32_t pick(uint32_t mask, uint32_t a, uint32_t b) { return (a & mask) | (b & ~mask); }

/* e4m3: rebias the exponent by 120; exponent 0 (subnormal) becomes
 * 2^-7 (1 + m/8), from which m/8 * 2^-6 = 2 (x - 2^-7) exactly. */
static inline float fp8_fast(uint32_t b)
{
    float f = bits_f32(((b & 0x7f) << 20) + (120u << 23));
    uint32_t v = pick(-(uint32_t)((b & 0x78) != 0), f32_bits(f),
                      f32_bits(2.0f * (f - 0.0078125f)));
    v = pick(-(uint32_t)((b & 0x7f) == 0x7f), 0x7fc00000u, v);
    return bits_f32(v | (b & 0x80) << 24);
}

/* Both E2M1 values of every byte (low nibble first), built once. */
static float fp4_pairs[256][2];

__attribute__((constructor)) static void fp4_pairs_init(void)
{
    for (int b = 0; b < 256; b++) {
        fp4_pairs[b][0] = fp4_e2m1_table[b & 15];
        fp4_pairs[b][1] = fp4_e2m1_table[b >> 4];
    }
}

qweight qweight_view(const qweight *w, int r0, int nr, int c0, int nc)
{
    qweight v = *w;
    v.row0 += r0;
    v.col0 += c0;
    v.rows = nr;
    v.cols = nc;
    return v;
}

HOT void qweight_row(const qweight *w, int r, int c0, int n, float *out)
{
    int64_t row = (int64_t)w->row0 + r;
    int64_t col = (int64_t)w->col0 + c0;
    switch (w->type) {
    case QT_F32: {
        const float *p = (const float *)w->data + row * w->ld + col;
        for (int i = 0; i < n; i++) out[i] = p[i];
        break;
    }
    case QT_BF16: {
        const uint16_t *p = (const uint16_t *)w->data + row * w->ld + col;
        for (int i = 0; i < n; i++) out[i] = bf16_to_f32(p[i]);
        break;
    }
    case QT_FP8: {
        const uint8_t *p = (const uint8_t *)w->data + row * w->ld + col;
        const uint8_t *s = w->scale + (row / 128) * w->scale_ld;
        for (int i = 0; i < n;) {
            int64_t gc = col + i;
            int end = i + (int)(128 - gc % 128);
            if (end > n) end = n;
            float sc = e8m0_to_f32(s[gc / 128]);
            for (; i < end; i++) out[i] = fp8_fast(p[i]) * sc;
        }
        break;
    }
    case QT_MXFP4: {
        const uint8_t *p = (const uint8_t *)w->data + (row * w->ld) / 2;
        const uint8_t *s = w->scale + row * w->scale_ld;
        for (int i = 0; i < n;) {
            int64_t gc = col + i;
            int end = i + (int)(32 - gc % 32);
            if (end > n) end = n;
            float sc = e8m0_to_f32(s[gc / 32]);
            if (gc % 2 == 0 && (end - i) % 2 == 0) {
                /* whole bytes: both values of a byte from one table entry */
                const uint8_t *q = p + gc / 2;
                float *o = out + i;
                int nb = (end - i) / 2;
                for (int j = 0; j < nb; j++) {
                    const float *pr = fp4_pairs[q[j]];
                    o[2 * j] = pr[0] * sc;
                    o[2 * j + 1] = pr[1] * sc;
                }
                i = end;
            }
            for (; i < end; i++, gc++) {
                uint8_t b = p[gc >> 1];
                out[i] = fp4_pairs[b][gc & 1] * sc;
            }
        }
        break;
    }
    }
}
