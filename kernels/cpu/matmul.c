#include "matmul.h"

#include <stdlib.h>

/* Rows dequantized together; they share each load of x. */
#define RB 4

/* x86-64: build the hot loops for AVX2 too and pick at load time. */
#if defined(__x86_64__) && defined(__GNUC__)
#define HOT __attribute__((target_clones("avx2", "default")))
#else
#define HOT
#endif

/* Eight independent partial sums per row keep the loop free of
 * reassociation, so the compiler vectorizes it without -ffast-math. */
HOT static void dot_rows(const float *x, const float *w, int K, int nr, float *out)
{
    float acc[RB][8] = { { 0 } };
    int k = 0;
    if (nr == RB) {
        const float *w0 = w, *w1 = w + K, *w2 = w + 2 * K, *w3 = w + 3 * K;
        for (; k + 8 <= K; k += 8)
            for (int j = 0; j < 8; j++) {
                float xv = x[k + j];
                acc[0][j] += xv * w0[k + j];
                acc[1][j] += xv * w1[k + j];
                acc[2][j] += xv * w2[k + j];
                acc[3][j] += xv * w3[k + j];
            }
    }
    for (int r = 0; r < nr; r++) {
        float s = 0;
        for (int kk = k; kk < K; kk++) s += x[kk] * w[r * K + kk];
        for (int j = 0; j < 8; j++) s += acc[r][j];
        out[r] = s;
    }
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

void cpu_matmul(threadpool *p, const qweight *w, const float *x, int ldx, int T,
                float *y, int ldy)
{
    if (T <= 0 || w->rows <= 0) return;
    int nthreads = threadpool_size(p);
    int groups = (w->rows + RB - 1) / RB;
    int ntasks = nthreads == 1 ? 1 : nthreads * 4;
    if (ntasks > groups) ntasks = groups;
    int per = (groups + ntasks - 1) / ntasks * RB;
    ntasks = (w->rows + per - 1) / per;
    mm_job J = { w, x, ldx, T, y, ldy, per };
    threadpool_run(p, mm_task, &J, ntasks);
}
