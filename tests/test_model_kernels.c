/* CPU kernels of the V4 engine against direct formulas: number formats,
 * block-scaled dequantization, matmul over every weight type and view,
 * RoPE tables (default and YaRN), Sinkhorn, top-k, attention with sinks,
 * the fp8 mode's indexer. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu/matmul.h"
#include "cpu/ops.h"
#include "cpu/quant.h"
#include "cpu/qweight.h"
#include "threadpool.h"
#include "model_internal.h"
#include "tap.h"

static uint64_t rs = 12345;
static double urand(void)
{
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (rs >> 11) / 9007199254740992.0;
}

static void test_formats(void)
{
    /* FP8 e4m3fn: every byte against sign * 2^(e-7) * (1 + m/8), subnormals
     * m/8 * 2^-6, NaN only at 0x7f / 0xff. */
    int bad = 0;
    for (int b = 0; b < 256; b++) {
        int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
        double want = e ? ldexp(1 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
        if (s) want = -want;
        float got = fp8_e4m3_to_f32((uint8_t)b);
        if ((b & 0x7f) == 0x7f) bad += !isnan(got);
        else bad += got != (float)want || fp8_e4m3_table[b] != got;
    }
    is_int(bad, 0, "fp8 e4m3: all 256 codes decode to sign * 2^(e-7) * (1 + m/8)");
    ok(fp8_e4m3_to_f32(0x7e) == 448.0f && fp8_e4m3_to_f32(0x01) == ldexpf(1, -9),
       "fp8 e4m3: max 448, min subnormal 2^-9");
    ok(e8m0_to_f32(127) == 1.0f && e8m0_to_f32(130) == 8.0f && e8m0_to_f32(0) == ldexpf(1, -127)
       && isnan(e8m0_to_f32(255)), "ue8m0: 2^(e-127), 255 is NaN");
    ok(bf16_to_f32(0x3f80) == 1.0f && bf16_to_f32(0xc040) == -3.0f, "bf16 decode");
    const float fp4[8] = { 0, 0.5f, 1, 1.5f, 2, 3, 4, 6 };
    bad = 0;
    for (int c = 0; c < 16; c++) bad += fp4_e2m1_table[c] != (c & 8 ? -fp4[c & 7] : fp4[c & 7]);
    is_int(bad, 0, "e2m1: codes 0-7 = 0 .5 1 1.5 2 3 4 6, bit 3 negates");
    /* Encoders round to nearest and decode back exactly on representable values. */
    bad = 0;
    for (int b = 0; b < 256; b++)
        if ((b & 0x7f) != 0x7f && b != 0x80)
            bad += f32_to_fp8_e4m3(fp8_e4m3_to_f32((uint8_t)b)) != b;
    is_int(bad, 0, "fp8 encoder inverts the decoder");
    ok(f32_to_fp8_e4m3(1000.0f) == 0x7e && f32_to_fp4_e2m1(-2.6f) == 0xd
       && f32_to_fp4_e2m1(0.74f) == 1 && f32_to_fp4_e2m1(0.76f) == 2,
       "encoders saturate and round to nearest");
    ok(f32_to_bf16(1.0f) == 0x3f80 && f32_to_bf16(bf16_to_f32(0x4049) + 1e-6f) == 0x4049,
       "bf16 encoder rounds to nearest");
}

/* A 130x260 FP8 matrix with 2x3 scale blocks: every element must equal
 * fp8 * 2^(scale-127) of its own 128x128 block, also through views. */
static void test_fp8_blocks(void)
{
    int R = 130, C = 260;
    uint8_t *q = malloc(R * C), sc[2 * 3];
    for (int i = 0; i < R * C; i++) q[i] = (uint8_t)(urand() * 256) & 0xf7; /* no NaN */
    for (int i = 0; i < 6; i++) sc[i] = (uint8_t)(120 + i * 3);
    qweight w = { .type = QT_FP8, .rows = R, .cols = C, .data = q, .scale = sc, .ld = C,
                  .scale_ld = 3 };
    float *row = malloc(C * sizeof *row);
    int bad = 0;
    for (int r = 0; r < R; r++) {
        qweight_row(&w, r, 0, C, row);
        for (int c = 0; c < C; c++)
            bad += row[c] != fp8_e4m3_to_f32(q[r * C + c]) * ldexpf(1, sc[(r / 128) * 3 + c / 128] - 127);
    }
    is_int(bad, 0, "fp8 128x128 block dequant: each element scaled by its block");
    qweight v = qweight_view(&w, 127, 3, 125, 7);
    bad = 0;
    for (int r = 0; r < 3; r++) {
        qweight_row(&v, r, 2, 5, row);
        for (int c = 0; c < 5; c++) {
            int gr = 127 + r, gc = 127 + c;
            bad += row[c] != fp8_e4m3_to_f32(q[gr * C + gc]) * ldexpf(1, sc[(gr / 128) * 3 + gc / 128] - 127);
        }
    }
    is_int(bad, 0, "fp8 view across block boundaries uses the stored block's scale");
    free(q);
    free(row);
}

/* DeepSeek's act_quant (ue8m0): per group of 128 channels the scale is the
 * power of two 2^ceil(log2(max(amax, 1e-4) / 448)), computed here with
 * log2/ceil in double; codes are the nearest e4m3 of x / s. */
static void test_act_quant(void)
{
    int n = 300;    /* two full groups and a short one */
    float x[300], r[300], sc[3];
    uint8_t q[300];
    size_t bad_s = 0, bad_q = 0, bad_r = 0;
    uint64_t saved = rs;    /* the later tests keep their inputs */
    for (int it = 0; it < 200; it++) {
        double mag = ldexp(1, (int)(urand() * 40) - 25);
        for (int i = 0; i < n; i++) x[i] = (float)((urand() * 2 - 1) * mag);
        if (it % 7 == 0) x[5] = (float)(448 * ldexp(1, it % 11 - 5));  /* amax exactly 448 * 2^e */
        if (it == 3) memset(x + 128, 0, 128 * sizeof *x);                /* zero group */
        act_quant_fp8(x, n, q, sc);
        memcpy(r, x, sizeof r);
        act_quant_round(r, n);
        for (int g = 0; g < 3; g++) {
            int k0 = g * 128, k1 = k0 + 128 < n ? k0 + 128 : n;
            float amax = 0;
            for (int k = k0; k < k1; k++) amax = fmaxf(amax, fabsf(x[k]));
            double want = ldexp(1, (int)ceil(log2(fmaxf(amax, 1e-4f) * (1.0f / 448.0f))));
            bad_s += sc[g] != (float)want;
            for (int k = k0; k < k1; k++) {
                float v = x[k] / sc[g];
                /* nearest code: no code is closer than the chosen one */
                float got = fp8_e4m3_to_f32(q[k]);
                for (int b = 0; b < 256; b++) {
                    float c = fp8_e4m3_to_f32((uint8_t)b);
                    if (!isnan(c) && fabsf(c - v) < fabsf(got - v)) { bad_q++; break; }
                }
                bad_r += r[k] != got * sc[g];
            }
        }
    }
    rs = saved;
    is_int(bad_s, 0, "act_quant: group scales are 2^ceil(log2(max(amax, 1e-4) / 448))");
    is_int(bad_q, 0, "act_quant: codes are the nearest e4m3 values of x / s");
    is_int(bad_r, 0, "act_quant_round: x becomes code * s");
    ok(act_quant_scale(448.0f) == 1.0f && act_quant_scale(449.0f) == 2.0f &&
       act_quant_scale(0) == ldexpf(1, -22), "act_quant: scales at 448, just past it, and of zeros");
}

static void test_mxfp4(void)
{
    /* Row 0: bytes 0x21, 0xf8 -> codes 1, 2 (low nibble first), 8, 15. */
    uint8_t q[2][32] = { { 0x21, 0xf8 } }, sc[2][2] = { { 128, 126 }, { 127, 127 } };
    for (int i = 0; i < 32; i++) q[1][i] = (uint8_t)(i * 7 + 3);
    qweight w = { .type = QT_MXFP4, .rows = 2, .cols = 64, .data = q, .scale = &sc[0][0],
                  .ld = 64, .scale_ld = 2 };
    float row[64];
    qweight_row(&w, 0, 0, 64, row);
    ok(row[0] == 1.0f && row[1] == 2.0f && row[2] == -0.0f && signbit(row[2]) && row[3] == -12.0f,
       "mxfp4: low nibble first, negative codes, scale 2^1");
    int bad = 0;
    qweight_row(&w, 1, 0, 64, row);
    for (int c = 0; c < 64; c++) {
        uint8_t b = q[1][c / 2];
        bad += row[c] != fp4_e2m1_table[c % 2 ? b >> 4 : b & 15];
    }
    is_int(bad, 0, "mxfp4: second row, scale 1, every nibble");
    qweight v = qweight_view(&w, 0, 2, 30, 4);
    qweight_row(&v, 0, 0, 4, row);
    ok(row[0] == 0 && row[1] == 0 && row[2] == 0 && row[3] == 0, "mxfp4 view (even column offset)");
    qweight_row(&v, 1, 0, 4, row);
    ok(row[0] == fp4_e2m1_table[q[1][15] & 15] && row[2] == fp4_e2m1_table[q[1][16] & 15],
       "mxfp4 view crosses a 32-column scale group");
}

/* y = x W^T against a double-precision reference for every weight type,
 * with views and 1 or 3 threads. */
static void test_matmul(void)
{
    int R = 70, C = 192, T = 5;
    float *wf = malloc(R * C * sizeof *wf), *x = malloc((T * C + 1) * sizeof *x);
    for (int i = 0; i < R * C; i++) wf[i] = (float)(urand() * 2 - 1);
    for (int i = 0; i <= T * C; i++) x[i] = (float)(urand() * 2 - 1);
    uint16_t *bf = malloc(R * C * 2);
    uint8_t *f8 = malloc(R * C), f8s[1 * 2] = { 125, 128 };
    uint8_t *f4 = malloc(R * C / 2), *f4s = malloc(R * C / 32);
    for (int i = 0; i < R * C; i++) bf[i] = f32_to_bf16(wf[i]);
    for (int i = 0; i < R * C; i++) f8[i] = f32_to_fp8_e4m3(wf[i] * 8);
    for (int i = 0; i < R * C / 2; i++)
        f4[i] = f32_to_fp4_e2m1(wf[2 * i] * 6) | f32_to_fp4_e2m1(wf[2 * i + 1] * 6) << 4;
    for (int i = 0; i < R * C / 32; i++) f4s[i] = (uint8_t)(124 + i % 5);
    qweight ws[4] = {
        { .type = QT_F32, .rows = R, .cols = C, .data = wf, .ld = C },
        { .type = QT_BF16, .rows = R, .cols = C, .data = bf, .ld = C },
        { .type = QT_FP8, .rows = R, .cols = C, .data = f8, .scale = f8s, .ld = C, .scale_ld = 2 },
        { .type = QT_MXFP4, .rows = R, .cols = C, .data = f4, .scale = f4s, .ld = C, .scale_ld = C / 32 },
    };
    const char *names[4] = { "f32", "bf16", "fp8", "mxfp4" };
    threadpool *p1 = threadpool_new(1), *p3 = threadpool_new(3);
    float *y = malloc(T * (R + 3) * sizeof *y), *row = malloc(C * sizeof *row);
    for (int k = 0; k < 4; k++)
        for (int pv = 0; pv < 2; pv++) {
            qweight w = pv ? qweight_view(&ws[k], 3, 61, 34, 130) : ws[k];
            int ldy = w.rows + 3;
            cpu_matmul(pv ? p3 : p1, &w, x + 1, C, T, y, ldy);
            double maxerr = 0;
            for (int r = 0; r < w.rows; r++) {
                qweight_row(&w, r, 0, w.cols, row);
                for (int t = 0; t < T; t++) {
                    double s = 0;
                    for (int c = 0; c < w.cols; c++) s += (double)row[c] * x[t * C + 1 + c];
                    maxerr = fmax(maxerr, fabs(s - y[t * ldy + r]) / (1 + fabs(s)));
                }
            }
            ok(maxerr < 1e-5, "matmul %s%s matches double reference (err %.2g)", names[k],
               pv ? " view, 3 threads" : "", maxerr);
        }
    threadpool_free(p1);
    threadpool_free(p3);
    free(wf), free(x), free(bf), free(f8), free(f4), free(f4s), free(y), free(row);
}

/* Inverse frequencies against the formulas of transformers'
 * compute_default_rope_parameters / _compute_yarn_parameters, evaluated
 * in double; then the rotation itself. */
static void test_rope(void)
{
    v4_rope def = { .theta = 10000, .attention_factor = 1 };
    int dim = 64;
    float inv[32];
    v4_rope_inv_freq(&def, dim, inv);
    double maxrel = 0;
    for (int i = 0; i < 32; i++)
        maxrel = fmax(maxrel, fabs(inv[i] - pow(10000.0, -2.0 * i / dim)) * pow(10000.0, 2.0 * i / dim));
    ok(maxrel < 3e-7, "default rope: inv_freq = theta^(-2i/d) (rel err %.2g)", maxrel);

    v4_rope y = { .yarn = true, .theta = 160000, .factor = 16, .beta_fast = 32, .beta_slow = 1,
                  .original_max_pos = 65536, .attention_factor = 1 };
    v4_rope_inv_freq(&y, dim, inv);
    /* V4-Flash numbers: correction range [floor(15.45), ceil(24.7)] = [15, 25]. */
    double low = 15, high = 25;
    maxrel = 0;
    for (int i = 0; i < 32; i++) {
        double extra = pow(160000.0, -2.0 * i / dim), inter = extra / 16;
        double ramp = fmin(1, fmax(0, (i - low) / (high - low)));
        double want = inter * ramp + extra * (1 - ramp);
        maxrel = fmax(maxrel, fabs(inv[i] - want) / want);
    }
    ok(maxrel < 1e-6, "yarn rope: ramp between extrapolation and interpolation (rel err %.2g)",
       maxrel);
    ok(inv[15] == powf(160000.0f, -30.0f / 64) || fabs(inv[15] / pow(160000.0, -30.0 / 64) - 1) < 1e-6,
       "yarn rope: pairs below the range keep theta^(-2i/d)");
    ok(fabs(inv[25] * 16 / pow(160000.0, -50.0 / 64) - 1) < 1e-6,
       "yarn rope: pairs above the range are divided by the factor");

    /* Rotation: last 2*np channels, pairs (2i, 2i+1), and the inverse undoes it. */
    float x[12], x0[12];
    for (int i = 0; i < 12; i++) x[i] = x0[i] = (float)(urand() * 2 - 1);
    float f[2] = { 0.5f, 0.01f };
    cpu_rope_head(x, 12, 2, f, 1.0f, 7, 0);
    int same_nope = !memcmp(x, x0, 8 * sizeof(float));
    double a = 7 * 0.5, err = fabs(x[8] - (x0[8] * cos(a) - x0[9] * sin(a)))
                              + fabs(x[9] - (x0[9] * cos(a) + x0[8] * sin(a)));
    ok(same_nope && err < 1e-6, "rope rotates interleaved pairs of the trailing channels only");
    cpu_rope_head(x, 12, 2, f, 1.0f, 7, 1);
    err = 0;
    for (int i = 0; i < 12; i++) err = fmax(err, fabs(x[i] - x0[i]));
    ok(err < 1e-6, "inverse rope (negated sin) restores the input");
}

static void test_sinkhorn(void)
{
    int hc = 4, nmix = (2 + hc) * hc;
    float m[24], base[24], scale[3] = { 0.7f, 1.3f, 0.9f }, pre[4], post[4], comb[16];
    for (int i = 0; i < nmix; i++) m[i] = (float)(urand() * 4 - 2), base[i] = (float)(urand() - 0.5);
    cpu_hc_mix(m, hc, base, scale, 20, 1e-6f, pre, post, comb);
    /* Direct formula in double. */
    double c[4][4];
    for (int i = 0; i < hc; i++) {
        double mx = -1e30, s = 0;
        for (int j = 0; j < hc; j++) {
            c[i][j] = m[8 + i * 4 + j] * 0.9 + base[8 + i * 4 + j];
            mx = fmax(mx, c[i][j]);
        }
        for (int j = 0; j < hc; j++) s += c[i][j] = exp(c[i][j] - mx);
        for (int j = 0; j < hc; j++) c[i][j] = c[i][j] / s + 1e-6;
    }
    for (int it = 0; it < 20; it++) {
        for (int i = 0; it && i < hc; i++) {
            double s = 0;
            for (int j = 0; j < hc; j++) s += c[i][j];
            for (int j = 0; j < hc; j++) c[i][j] /= s + 1e-6;
        }
        for (int j = 0; j < hc; j++) {
            double s = 0;
            for (int i = 0; i < hc; i++) s += c[i][j];
            for (int i = 0; i < hc; i++) c[i][j] /= s + 1e-6;
        }
    }
    double err = 0, rowdev = 0;
    for (int i = 0; i < hc; i++) {
        double rsum = 0;
        for (int j = 0; j < hc; j++) {
            err = fmax(err, fabs(comb[i * hc + j] - c[i][j]));
            rsum += comb[i * hc + j];
        }
        rowdev = fmax(rowdev, fabs(rsum - 1));
    }
    ok(err < 1e-6, "sinkhorn matches the direct formula (err %.2g)", err);
    ok(rowdev < 1e-3, "sinkhorn output is (nearly) doubly stochastic (row dev %.2g)", rowdev);
    double perr = 0;
    for (int s = 0; s < hc; s++) {
        perr = fmax(perr, fabs(pre[s] - (1 / (1 + exp(-(m[s] * 0.7 + base[s]))) + 1e-6)));
        perr = fmax(perr, fabs(post[s] - 2 / (1 + exp(-(m[4 + s] * 1.3 + base[4 + s])))));
    }
    ok(perr < 1e-6, "hc pre = sigmoid + eps, post = 2 sigmoid");
}

static void test_topk(void)
{
    float v[8] = { 1, 5, 3, 5, -1, 3, 7, 5 };
    int32_t idx[16];
    cpu_topk(v, 8, 4, idx);
    ok(idx[0] == 6 && idx[1] == 1 && idx[2] == 3 && idx[3] == 7,
       "topk: largest first, ties in index order (6 1 3 7)");
    cpu_topk(v, 8, 8, idx);
    ok(idx[4] == 2 && idx[5] == 5 && idx[6] == 0 && idx[7] == 4, "topk with k = n sorts all");
    float big[1000];
    for (int i = 0; i < 1000; i++) big[i] = (float)((i * 7919) % 1000);
    cpu_topk(big, 1000, 10, idx);
    int good = 1;
    for (int k = 0; k < 10; k++) good &= big[idx[k]] == 999 - k;
    ok(good, "topk on 1000 values");
}

/* bf16: the query rounded to bf16 and the softmax over tiles of 32 keys,
 * each exp(logit - running max) rounded to bf16 before it multiplies its
 * key (the fp8 mode's prefill chunks), here in double from the logits on;
 * nk = 70: three tiles, the max moving between them. */
static void test_attend(bool bf16, int nk)
{
    enum { HD = 8, NKMAX = 70 };
    float q[2 * HD], keys[NKMAX][HD], out[2 * HD], work[NKMAX + HD], sinks[2] = { 0.3f, -1.0f };
    const float *kp[NKMAX];
    for (int i = 0; i < 2 * HD; i++) q[i] = (float)(urand() * 4 - 2);
    for (int j = 0; j < nk; j++) {
        for (int d = 0; d < HD; d++) keys[j][d] = (float)(urand() * 2 - 1);
        kp[j] = keys[j];
    }
    cpu_attend(q, 2, HD, kp, nk, 0.35f, sinks, bf16, out, work);
    double err = 0, moved = 0;
    for (int h = 0; h < 2; h++) {
        double s[NKMAX], o[HD] = { 0 }, of[HD] = { 0 }, m = -INFINITY, l = 0, mg = sinks[h], z;
        for (int j = 0; j < nk; j++) {
            s[j] = 0;
            for (int d = 0; d < HD; d++) {
                float qv = q[h * HD + d];
                s[j] += (double)(bf16 ? bf16_round(qv) : qv) * keys[j][d];
            }
            s[j] *= 0.35;
            mg = fmax(mg, s[j]);
        }
        for (int t0 = 0; t0 < nk; t0 += 32) {
            int t1 = nk < t0 + 32 ? nk : t0 + 32;
            double mx = -INFINITY;
            for (int j = t0; j < t1; j++) mx = fmax(mx, s[j]);
            double mn = fmax(m, mx), c = exp(m - mn);
            for (int d = 0; d < HD; d++) o[d] *= c;
            l *= c;
            for (int j = t0; j < t1; j++) {
                double e = exp(s[j] - mn), p = bf16 ? bf16_round((float)e) : e;
                l += e;
                for (int d = 0; d < HD; d++) o[d] += p * keys[j][d];
            }
            m = mn;
        }
        z = exp(sinks[h] - mg);
        for (int j = 0; j < nk; j++) z += exp(s[j] - mg);
        for (int j = 0; j < nk; j++)
            for (int d = 0; d < HD; d++) of[d] += exp(s[j] - mg) / z * keys[j][d];
        for (int d = 0; d < HD; d++) {
            err = fmax(err, fabs(o[d] / (l + exp(sinks[h] - m)) - out[h * HD + d]));
            moved = fmax(moved, fabs(of[d] - out[h * HD + d]));
        }
    }
    ok(err < 1e-6, "attention with a sink%s, %d keys: softmax over keys + sink, values = keys "
       "(%.2g)", bf16 ? ", query and probabilities in bf16" : "", nk, err);
    if (bf16)
        ok(moved > 1e-5 && moved < 0x1p-6,
           "the bf16 roundings move the output off float32's, within a few 2^-8 (%.2g)", moved);
}

/* The indexer's choice by direct formulas: score = sum_h w_h d^-0.5
 * ReLU(q_h . k), in double, on the values as given or (fp8) each query
 * head and key row after act_quant_round; the k best, ascending.  Near
 * ties (reference scores within 1e-9 relative of each other) never occur
 * with these inputs: the set must be the same. */
static void indexer_ref(const indexer_args *a, int i, bool fp8, int32_t *sel)
{
    int nvis = (a->pos0 + i + 1) / a->ratio, d = a->d;
    double *sc = malloc(nvis * sizeof *sc);
    float *k = malloc((d + (size_t)a->nheads * d) * sizeof *k), *q = k + d;
    memcpy(q, a->q + (size_t)i * a->nheads * d, (size_t)a->nheads * d * sizeof *q);
    for (int h = 0; fp8 && h < a->nheads; h++) act_quant_round(q + (size_t)h * d, d);
    for (int s = 0; s < nvis; s++) {
        paged_load(&a->keys, s, k);
        if (fp8) act_quant_round(k, d);
        sc[s] = 0;
        for (int h = 0; h < a->nheads; h++) {
            double dot = 0;
            for (int c = 0; c < d; c++) dot += (double)q[(size_t)h * d + c] * k[c];
            sc[s] += (dot > 0 ? dot : 0) / sqrt(d) * a->w[(size_t)i * a->nheads + h];
        }
    }
    for (int j = 0; j < a->topk; j++) {     /* selection, then ascending */
        int best = -1;
        for (int s = 0; s < nvis; s++)
            if (!isnan(sc[s]) && (best < 0 || sc[s] > sc[best])) best = s;
        sel[j] = best;
        sc[best] = NAN;
    }
    for (int j = 1; j < a->topk; j++)
        for (int m = j; m > 0 && sel[m] < sel[m - 1]; m--) {
            int32_t t = sel[m];
            sel[m] = sel[m - 1], sel[m - 1] = t;
        }
    free(sc), free(k);
}

/* The fp8 mode's indexer (indexer_fp8_scores): a step of 64 tokens over
 * bf16 keys chooses what FP8 queries and keys choose, a step of 63 what
 * the values themselves choose; and the two differ (the quantization is
 * really applied). */
static void test_indexer_fp8(void)
{
    enum { H = 8, D = 128, TOPK = 16, RATIO = 4, POS0 = 600, N = 64 };
    int S = (POS0 + N) / RATIO;
    char *blk = calloc(1, kv_region_bytes(KV_BF16, S, D));
    char *blocks[1] = { blk };
    float *q = malloc((size_t)N * H * D * sizeof *q), *w = malloc(N * H * sizeof *w), k[D];
    for (size_t i = 0; i < (size_t)N * H * D; i++) q[i] = (float)(urand() * 2 - 1);
    for (int i = 0; i < N * H; i++) w[i] = (float)(urand() * 2 - 1);
    indexer_args a = { .n = N, .pos0 = POS0, .ratio = RATIO, .nheads = H, .d = D, .topk = TOPK,
                       .q = q, .w = w, .keys = { blocks, 0, S, D, KV_BF16 } };
    for (int s = 0; s < S; s++) {
        for (int c = 0; c < D; c++) k[c] = (float)(urand() * 2 - 1);
        paged_store(&a.keys, s, k);
    }
    backend *b = backend_cpu_new(2, NULL, 0);
    backend_cpu_set_fp8(b, true);
    int32_t *sel = malloc((size_t)N * TOPK * sizeof *sel), want[TOPK], exact[TOPK];
    int nsel[N];
    for (int n = N; n >= N - 1; n--) {
        a.n = n, a.sel = sel, a.nsel = nsel;
        b->indexer(b, &a, 1);
        int bad = 0, differ = 0;
        for (int i = 0; i < n; i++) {
            indexer_ref(&a, i, n == N, want);
            indexer_ref(&a, i, n != N, exact);
            bad += nsel[i] != TOPK || memcmp(sel + (size_t)i * TOPK, want, sizeof want);
            differ += memcmp(want, exact, sizeof want) != 0;
        }
        ok(!bad && differ && indexer_fp8_scores(&a) == (n == N),
           "fp8 mode's indexer, %d tokens: %s scores (%d of %d tokens choose otherwise; the "
           "other numerics choose otherwise in %d)", n, n == N ? "FP8" : "float32", bad, n,
           differ);
    }
    b->destroy(b);
    free(blk), free(q), free(w), free(sel);
}

int main(void)
{
    test_formats();
    test_fp8_blocks();
    test_act_quant();
    test_mxfp4();
    test_matmul();
    test_rope();
    test_sinkhorn();
    test_topk();
    test_attend(false, 5);
    test_attend(true, 5);
    test_attend(true, 70);
    test_indexer_fp8();
    return exit_status();
}
