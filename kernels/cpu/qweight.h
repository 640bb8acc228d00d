/* A weight matrix in its stored precision, or a rectangular view of one
 * (tensor-parallel shards are views: no copies).  Kernels dequantize rows
 * on the fly into float32.
 *
 *   QT_FP8    e4m3 bytes [R][C] with UE8M0 scales [ceil(R/128)][ceil(C/128)]
 *   QT_MXFP4  E2M1 nibbles [R][C/2] (low nibble = even column) with UE8M0
 *             scales [R][C/32]
 *   QT_BF16, QT_F32 plain [R][C]                                          */
#ifndef LLM_CPU_QWEIGHT_H
#define LLM_CPU_QWEIGHT_H

#include <stdint.h>

enum qtype { QT_F32, QT_BF16, QT_FP8, QT_MXFP4 };

typedef struct {
    enum qtype type;
    int rows, cols;             /* of this view */
    const void *data;           /* stored tensor (not offset by the view) */
    const uint8_t *scale;       /* stored scales (FP8, MXFP4) */
    int64_t ld;                 /* stored columns (logical elements) */
    int64_t scale_ld;           /* stored scale columns */
    int row0, col0;             /* view origin in the stored tensor */
    void *dev;                  /* backend-owned copy (unused on CPU) */
} qweight;

/* Sub-view rows [r0, r0+nr) x cols [c0, c0+nc) of w.  MXFP4 needs even c0. */
qweight qweight_view(const qweight *w, int r0, int nr, int c0, int nc);

/* Dequantize view row r, columns [c0, c0+n), into out. */
void qweight_row(const qweight *w, int r, int c0, int n, float *out);

#endif
