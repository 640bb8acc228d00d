/* y = x W^T over a quantized weight: y[t][n] = sum_k x[t][k] W[n][k].
 * Threads split the output rows; each group of rows is dequantized once
 * and applied to every token of the batch, so a weight is read once per
 * call whatever T is. */
#ifndef LLM_CPU_MATMUL_H
#define LLM_CPU_MATMUL_H

#include "qweight.h"
#include "threadpool.h"

/* x: T rows of w->cols floats, row stride ldx; y: T rows of w->rows floats,
 * row stride ldy.  y is overwritten.  0, or -1 when a task's scratch (a
 * few dequantized rows) could not be allocated: y is then undefined. */
int cpu_matmul(threadpool *p, const qweight *w, const float *x, int ldx, int T,
                float *y, int ldy);

/* Plain float dot product (the vectorized inner loop matmul uses). */
float cpu_dot(const float *a, const float *b, int n);

#endif
