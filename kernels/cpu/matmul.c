#include "matmul.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "hot.h"

/* Rows dequantized together; they share each load of x. */
#define RB 4


/* Eight independent partial sums per row keep the loops free of
 * reassociation, so the compiler vectorizes them without -ffast-math. */
HOT static float dot1(const float *x, const float *w, int K)
{
    float acc[8] = { 0 };
    int k = 0;
    for (; k + 8 <= K; k += 8)
        for (int j = 0; j < 8; j++) acc[j] += x[k + j] * w[k + j];
    float s = 0;
    for (; k < K; k++) s += x[k] * w[k];
    for (int j = 0; j < 8; j++) s += acc[j];
    return s;
}

/* Four rows against one x: each load of x serves four rows. */
HOT static void dot4(const float *x, const float *w, int K, float *out)
{
    float a0[8] = { 0 }, a1[8] = { 0 }, a2[8] = { 0 }, a3[8] = { 0 };
    const float *w0 = w, *w1 = w + K, *w2 = w + 2 * K, *w3 = w + 3 * K;
    int k = 0;
    for (; k + 8 <= K; k += 8)
        for (int j = 0; j < 8; j++) {
            float xv = x[k + j];
            a0[j] += xv * w0[k + j];
            a1[j] += xv * w1[k + j];
            a2[j] += xv * w2[k + j];
            a3[j] += xv * w3[k + j];
        }
    float s[4] = { 0, 0, 0, 0 };
    for (; k < K; k++) {
        s[0] += x[k] * w0[k];
        s[1] += x[k] * w1[k];
        s[2] += x[k] * w2[k];
        s[3] += x[k] * w3[k];
    }
    for (int j = 0; j < 8; j++) {
        s[0] += a0[j];
        s[1] += a1[j];
        s[2] += a2[j];
        s[3] += a3[j];
    }
    for (int r = 0; r < 4; r++) out[r] = s[r];
}

static void dot_rows(const float *x, const float *w, int K, int nr, float *out)
{
    if (nr == RB) dot4(x, w, K, out);
    else
        for (int r = 0; r < nr; r++) out[r] = dot1(x, w + (size_t)r * K, K);
}

float cpu_dot(const float *a, const float *b, int n)
{
    float out;
    dot_rows(a, b, n, 1, &out);
    return out;
}

typedef struct {
    const qweight *w;
    const float *x;
    int ldx, T;
    float *y;
    int ldy;
    int rows_per_task;
    atomic_bool failed;     /* a task had no scratch */
} mm_job;

static void mm_task(void *ctx, int task)
{
    mm_job *J = ctx;
    const qweight *w = J->w;
    int K = w->cols;
    int r0 = task * J->rows_per_task;
    int r1 = r0 + J->rows_per_task;
    if (r1 > w->rows) r1 = w->rows;
    float *buf = malloc((size_t)RB * K * sizeof *buf);
    if (!buf) {
        atomic_store(&J->failed, true);
        return;
    }
    for (int r = r0; r < r1; r += RB) {
        int nr = r1 - r < RB ? r1 - r : RB;
        for (int i = 0; i < nr; i++) qweight_row(w, r + i, 0, K, buf + (size_t)i * K);
        for (int t = 0; t < J->T; t++) {
            float out[RB];
            dot_rows(J->x + (size_t)t * J->ldx, buf, K, nr, out);
            for (int i = 0; i < nr; i++) J->y[(size_t)t * J->ldy + r + i] = out[i];
        }
    }
    free(buf);
}

int cpu_matmul(threadpool *p, const qweight *w, const float *x, int ldx, int T,
               float *y, int ldy)
{
    if (T <= 0 || w->rows <= 0) return 0;
    int nthreads = threadpool_size(p);
    int groups = (w->rows + RB - 1) / RB;
    /* Below ~64K multiply-adds waking the workers costs more than it saves. */
    bool small = (int64_t)w->rows * w->cols * T < (1 << 16);
    int ntasks = nthreads == 1 || small ? 1 : nthreads * 4;
    if (ntasks > groups) ntasks = groups;
    int per = (groups + ntasks - 1) / ntasks * RB;
    ntasks = (w->rows + per - 1) / per;
    mm_job J = { w, x, ldx, T, y, ldy, per, false };
    threadpool_run(p, mm_task, &J, ntasks);
    return atomic_load(&J.failed) ? -1 : 0;
}
