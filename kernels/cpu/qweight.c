#include "qweight.h"

#include "quant.h"

qweight qweight_view(const qweight *w, int r0, int nr, int c0, int nc)
{
    qweight v = *w;
    v.row0 += r0;
    v.col0 += c0;
    v.rows = nr;
    v.cols = nc;
    return v;
}

void qweight_row(const qweight *w, int r, int c0, int n, float *out)
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
    case QT_F16: {
        const uint16_t *p = (const uint16_t *)w->data + row * w->ld + col;
        for (int i = 0; i < n; i++) out[i] = f16_to_f32(p[i]);
        break;
    }
    case QT_FP8: {
        const uint8_t *p = (const uint8_t *)w->data + row * w->ld + col;
        const uint8_t *s = w->scale + (row / 128) * w->scale_ld;
        const float *t = fp8_e4m3_table;
        for (int i = 0; i < n;) {
            int64_t gc = col + i;
            int end = i + (int)(128 - gc % 128);
            if (end > n) end = n;
            float sc = e8m0_to_f32(s[gc / 128]);
            for (; i < end; i++) out[i] = t[p[i]] * sc;
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
            for (; i < end; i++, gc++) {
                uint8_t b = p[gc >> 1];
                out[i] = fp4_e2m1_table[gc & 1 ? b >> 4 : b & 15] * sc;
            }
        }
        break;
    }
    }
}
