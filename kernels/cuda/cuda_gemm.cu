// Prefill GEMMs through cuBLASLt: operands in bf16 (split in two),
// float32, or FP8 with DeepSeek's block scales, algorithms cached per
// shape, MoE experts a GEMM per expert.
#include "backend_cuda.cuh"

static unsigned align_of(const void *p)
{
    unsigned a = 256;
    while (a > 2 && (uintptr_t)p % a) a /= 2;
    return a;
}

#define LTK(call)                                                                                \
    do {                                                                                         \
        cublasStatus_t s_ = (call);                                                              \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                       \
            fail(c, "%s:%d: %s: cuBLASLt status %d", __FILE__, __LINE__, #call, (int)s_);        \
            ok = false;                                                                          \
        }                                                                                        \
    } while (0)

static const void *byte_off(const void *p, long long bytes) { return (const char *)p + bytes; }

// Up to n of cuBLASLt's algorithms for the GEMM, best first by its
// heuristic, into res: how many (0: none for this shape).
static int lt_heuristic(cu_impl *c, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t A,
                        cublasLtMatrixLayout_t B, cublasLtMatrixLayout_t C,
                        const uint32_t *align, cublasLtMatmulHeuristicResult_t *res, int n)
{
    bool ok = true;
    uint64_t ws = LT_WS_BYTES;
    cublasLtMatmulPreference_t pref = NULL;
    LTK(cublasLtMatmulPreferenceCreate(&pref));
    LTK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                             sizeof ws));
    cublasLtMatmulPreferenceAttributes_t which[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES
    };
    for (int i = 0; i < 4; i++)
        LTK(cublasLtMatmulPreferenceSetAttribute(pref, which[i], &align[i < 3 ? i : 2],
                                                 sizeof align[0]));
    int nres = 0;
    if (ok) {   // NOT_SUPPORTED: no algorithm for this shape (the caller decides)
        cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(c->lt, op, A, B, C, C, pref, n, res,
                                                          &nres);
        if (s == CUBLAS_STATUS_NOT_SUPPORTED) nres = 0;
        else LTK(s);
    }
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    return ok ? nres : 0;
}

// The fastest of the n candidates res for y = x W^T as lt_gemm runs it
// (beta 0, its own operands): each run once, then LT_TUNE_RUNS times,
// each after a write of twice L2's bytes so that the weights come from
// memory as in a decode step, not from L2 (LLM_CUDA_LT_TUNE); a candidate
// by its median, and the heuristic's first kept unless another is 3%
// faster (run B3, medians of 3 and any gain: 16 candidates did worse
// than 8, noise choosing).  The host waits for each run: only outside a
// capture (a step's first run, G_WARM, runs its ops as usual).  On
// stderr: the heuristic's first against the choice.
static int lt_fastest(cu_impl *c, cublasLtMatmulDesc_t op,
                      const cublasLtMatmulHeuristicResult_t *res, int n, const void *w,
                      cublasLtMatrixLayout_t A, const void *x, cublasLtMatrixLayout_t B,
                      float *y, cublasLtMatrixLayout_t C, int N, int K, int cols)
{
    // The flush buffer is borrowed for the shape's runs only: the pool was
    // sized leaving POOL_HEADROOM for what a profile step does not reach
    // (long contexts' indexer scratch, graphs), not for this.
    int l2 = 0;
    CK(c, cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, c->dev));
    size_t fbytes = 2 * (size_t)(l2 > 0 ? l2 : 64 << 20);
    void *flush = NULL;
    if (c->failed) return 0;
    if (cudaMalloc(&flush, fbytes) != cudaSuccess) {
        cudaGetLastError();     // (the pool took the memory: tuning is off)
        c->lt_tune = 1;
        fprintf(stderr, "cuda: cuBLASLt tune: no %zu bytes free to flush L2 with: off\n",
                fbytes);
        return 0;
    }
    cudaEvent_t ev[2] = {};
    for (int i = 0; i < 2; i++) CK(c, cudaEventCreate(&ev[i]));
    float alpha = 1, beta = 0, med[LT_TUNE_MAX];
    for (int i = 0; i < n && !c->failed; i++) {
        float ms[LT_TUNE_RUNS + 1];
        bool run = true;
        for (int r = 0; r <= LT_TUNE_RUNS && run && !c->failed; r++) {
            CK(c, cudaMemsetAsync(flush, r, fbytes, c->st));
            CK(c, cudaEventRecord(ev[0], c->st));
            run = cublasLtMatmul(c->lt, op, &alpha, w, A, x, B, &beta, y, C, y, C, &res[i].algo,
                                 c->lt_ws, LT_WS_BYTES, c->st) == CUBLAS_STATUS_SUCCESS;
            CK(c, cudaEventRecord(ev[1], c->st));
            CK(c, cudaEventSynchronize(ev[1]));
            CK(c, cudaEventElapsedTime(&ms[r], ev[0], ev[1]));
        }
        med[i] = -1;    // (chosen for the bucket's count, it may not run this one)
        if (!run || c->failed) continue;
        // the median of the runs after the first (which warms the algorithm up)
        for (int a = 2; a <= LT_TUNE_RUNS; a++)
            for (int b = a; b > 1 && ms[b] < ms[b - 1]; b--) {
                float t = ms[b];
                ms[b] = ms[b - 1], ms[b - 1] = t;
            }
        med[i] = ms[1 + LT_TUNE_RUNS / 2];
    }
    for (int i = 0; i < 2; i++)
        if (ev[i]) cudaEventDestroy(ev[i]);
    cudaFree(flush);    // (after the last run's event: nothing queued uses it)
    int bi = 0;
    for (int i = 1; i < n && !c->failed; i++)
        if (med[i] >= 0 && (med[bi] < 0 || med[i] < 0.97f * med[bi])) bi = i;
    if (!c->failed)
        fprintf(stderr, "cuda: cuBLASLt tune: %dx%d by %d columns: %d candidates, the "
                "heuristic's first %.1f us, #%d %.1f us\n", N, K, cols, n, 1e3 * med[0], bi + 1,
                1e3 * med[bi]);
    return bi;
}

// A rows x cols column-major layout, ld apart; nbatch > 1: that many
// matrices `stride` elements apart (a strided batch).  NULL on failure.
static void lt_layout(cu_impl *c, cublasLtMatrixLayout_t *L, cudaDataType_t dt, int rows,
                      int cols, long long ld, int nbatch, long long stride)
{
    bool ok = true;
    *L = NULL;
    LTK(cublasLtMatrixLayoutCreate(L, dt, rows, cols, ld));
    if (ok && nbatch > 1) {
        LTK(cublasLtMatrixLayoutSetAttribute(*L, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &nbatch,
                                             sizeof nbatch));
        LTK(cublasLtMatrixLayoutSetAttribute(*L, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                             &stride, sizeof stride));
    }
    if (!ok && *L) cublasLtMatrixLayoutDestroy(*L), *L = NULL;
}

// y[T][N] = x[T][K] . W[N][K]^T, float32 accumulation and output (no
// TF32): column-major, that is Y'[N][T] = W'^T X' with W' = W as K x N.
// The pointers' actual alignments go into the algorithm's choice
// (activation views are offset).  FP8 operands (scale set, both): the
// weights' 128x128 and the activations' 1x128 block scales applied per
// K block, float32 sums; those have no algorithm for some shapes: then
// false, nothing launched (every other type fails the backend).  segs:
// the sums go to its segments of rows (x's parts stacked, else false).
// nbatch > 1 (with segs): that many GEMMs in one launch, matrix g of W at
// w.p + g w.stride and its x at x.p + g x.stride (elements), its sums in
// rows g N .. of segs' nbatch N.
bool lt_gemm(cu_impl *c, gemm_op w, int N, int K, gemm_op x, int T, float *y, int ldy,
             const cu_ysegs *segs, int nbatch)
{
    bool ok = true;
    bool fp8 = w.scale != NULL;
    cudaDataType_t dt = fp8 ? CUDA_R_8F_E4M3 : w.bf16 ? CUDA_R_16BF : CUDA_R_32F;
    cublasLtMatmulDesc_t op = fp8 ? c->lt_op8 : c->lt_op;
    if (fp8) {
        LTK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w.scale,
                                           sizeof w.scale));
        LTK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x.scale,
                                           sizeof x.scale));
    }
    int parts = x.parts > 1 ? x.parts : 1;
    // Few tokens in parts (decode batches, short prefill chunks): the
    // parts as parts * T columns of one GEMM (column t * parts + p is part
    // p of token t: bf16_parts' own layout read with the part's stride),
    // so the weights are read once, not once per part, and the parts'
    // products added by cu_sum_parts in part order, as the beta = 1 GEMMs
    // of more tokens add them.
    bool stack = parts > 1 && (long long)parts * T <= LT_STACK_MAX && !fp8 &&
                 x.ld == (long long)parts * x.lo;
    if ((segs || nbatch > 1) && !(stack && segs)) return false;
    float *yg = y;
    int Tg = T, ldyg = ldy, runs = parts;
    long long ldb = x.ld;
    if (stack) {
        // a batch's GEMMs write rows g N .. of each column: nbatch N in all
        yg = (float *)grow(c, &c->ystk, (size_t)parts * T * nbatch * N * sizeof(float));
        if (c->failed) return false;
        Tg = parts * T, ldyg = nbatch * N, runs = 1, ldb = x.lo;
    }
    int tb = 16;
    while (tb < Tg) tb *= 2;
    uint32_t align[3] = { align_of(w.p), align_of(x.p), align_of(yg) };
    for (int part = 1; part < runs; part++) {
        unsigned a = align_of(byte_off(x.p, (long long)part * x.lo * 2));
        if (a < align[1]) align[1] = a;
    }
    int es = fp8 ? 1 : w.bf16 ? 2 : 4;
    if (nbatch > 1) {
        unsigned ab[3] = { align_of(byte_off(w.p, w.stride * es)),
                           align_of(byte_off(x.p, x.stride * es)), align_of(yg + N) };
        for (int i = 0; i < 3; i++) align[i] = ab[i] < align[i] ? ab[i] : align[i];
    }
    int key[ALGO_KEY] = { fp8 ? 2 : w.bf16, N, K, (int)w.ld, (int)ldb, ldyg, tb, (int)align[0],
                          (int)align[1], (int)align[2], nbatch };
    cublasLtMatrixLayout_t A = NULL, B = NULL, C = NULL;
    lt_layout(c, &A, dt, K, N, w.ld, nbatch, w.stride);
    lt_layout(c, &B, dt, K, Tg, ldb, nbatch, x.stride);
    lt_layout(c, &C, CUDA_R_32F, N, Tg, ldyg, nbatch, N);
    ok = ok && A && B && C;
    lt_algo *a = NULL;
    for (int i = 0; i < c->nalgos && i < NALGO && !a; i++)
        if (!memcmp(c->algos[i].key, key, sizeof key)) a = &c->algos[i];
    if (ok && !a) {     // chosen for the bucket's largest count
        cublasLtMatrixLayout_t Bb = NULL, Cb = NULL;
        lt_layout(c, &Bb, dt, K, tb, ldb, nbatch, x.stride);
        lt_layout(c, &Cb, CUDA_R_32F, N, tb, ldyg, nbatch, N);
        ok = ok && Bb && Cb;
        // LLM_CUDA_LT_TUNE: decode batches' GEMMs (x's parts stacked) timed
        // over the heuristic's first candidates; a shape first met in a
        // capture keeps the heuristic's first
        cublasLtMatmulHeuristicResult_t res[LT_TUNE_MAX];
        int n = ok ? lt_heuristic(c, op, A, Bb, Cb, align, res, stack ? c->lt_tune : 1) : 0;
        int pick = 0;
        cudaStreamCaptureStatus cap = cudaStreamCaptureStatusActive;
        if (n > 1 && cudaStreamIsCapturing(c->st, &cap) == cudaSuccess &&
            cap == cudaStreamCaptureStatusNone)
            pick = lt_fastest(c, op, res, n, w.p, A, x.p, B, yg, C, N, K, Tg);
        if (n > 0 && !c->failed) {
            a = &c->algos[c->nalgos++ % NALGO];
            memcpy(a->key, key, sizeof key);
            a->algo = res[pick].algo;
        }
        if (Cb) cublasLtMatrixLayoutDestroy(Cb);
        if (Bb) cublasLtMatrixLayoutDestroy(Bb);
    }
    cublasLtMatmulHeuristicResult_t exact;
    for (int part = 0; part < runs && ok; part++) {
        float alpha = 1, beta = part ? 1 : 0;   // the rests add to the first part's product
        const void *xp = byte_off(x.p, (long long)part * x.lo * 2);
        cublasStatus_t st = CUBLAS_STATUS_NOT_SUPPORTED;
        if (a)
            st = cublasLtMatmul(c->lt, op, &alpha, w.p, A, xp, B, &beta, yg, C, yg, C,
                                &a->algo, c->lt_ws, LT_WS_BYTES, c->st);
        if (st == CUBLAS_STATUS_SUCCESS) continue;
        // Not for this count: choose for it.
        if (lt_heuristic(c, op, A, B, C, align, &exact, 1)) {
            a = NULL;
            LTK(cublasLtMatmul(c->lt, op, &alpha, w.p, A, xp, B, &beta, yg, C, yg, C, &exact.algo,
                               c->lt_ws, LT_WS_BYTES, c->st));
        } else {
            if (!fp8)
                fail(c, "cuBLASLt: no %s algorithm for %dx%d by %d tokens",
                     w.bf16 ? "bf16" : "float32", N, K, Tg);
            ok = false;
        }
    }
    if (ok && stack && segs) cu_sum_parts_segs(c->st, yg, nbatch * N, T, parts, *segs);
    else if (ok && stack) cu_sum_parts(c->st, yg, N, T, parts, y, ldy);
    if (C) cublasLtMatrixLayoutDestroy(C);
    if (B) cublasLtMatrixLayoutDestroy(B);
    if (A) cublasLtMatrixLayoutDestroy(A);
    return ok;
}

// Weights of nexp packed experts from q on as a GEMM operand: in stored
// form when that is the GEMM's type, FP8's bf16 copy where it has one
// (fp8_shadow), else dequantized (exactly) into scratch.
static gemm_op gemm_weights(cu_impl *c, bool bf16, const dqw &q, int nexp)
{
    int es = bf16 ? 2 : 4;
    if (q.type == (bf16 ? QT_BF16 : QT_F32))
        return gemm_op{ byte_off(q.data, ((long long)q.r0 * q.ld + q.c0) * es), q.ld, bf16,
                        q.estride, 0 };
    if (bf16 && q.bf)
        return gemm_op{ byte_off(q.bf, ((long long)q.r0 * q.ld + q.c0) * 2), q.ld, true,
                        q.bstride, 0 };
    long long ld = round_up(q.cols, 8), stride = q.rows * ld * es;
    void *p = grow(c, &c->wdeq, (size_t)nexp * stride);
    if (!c->failed) cu_dequant(c->st, q, nexp, bf16, p, ld);
    return gemm_op{ p, ld, bf16, stride, 0 };
}

// x[T][K] (rows rows[t] / div of x when rows is set) in `parts` bf16
// parts in scratch: each row's first parts, then its rests (cu_round_bf16).
static gemm_op bf16_parts(cu_impl *c, const float *x, int ldx, const int *rows, int div, int T,
                          int K, int parts)
{
    int ld = (int)round_up(K, 8);
    uint16_t *p = (uint16_t *)grow(c, &c->xbf, (size_t)T * parts * ld * 2);
    if (!c->failed) cu_round_bf16(c->st, x, ldx, rows, div, T, K, p, parts * ld, ld, parts);
    return gemm_op{ p, (long long)parts * ld, true, 0, ld, NULL, parts };
}

// Activations x[T][K] (rows rows[t] / div of x when rows is set, then
// ldx == K) as a GEMM operand: bf16 in scratch (split in two under
// bf16x2 unless exact, x's values being exact in bf16), or
// float32 (gathered into scratch when rows is set).
gemm_op gemm_input(cu_impl *c, bool bf16, bool exact, const float *x, int ldx, const int *rows,
                   int div, int T, int K)
{
    if (bf16) {
        bool split = !exact && split_mode(c);
        return bf16_parts(c, x, ldx, rows, div, T, K, split ? 2 : 1);
    }
    if (!rows) return gemm_op{ x, ldx, false, 0, 0 };
    float *p = (float *)grow(c, &c->xs, (size_t)T * K * sizeof(float));
    if (!c->failed) cu_rows_gather(c->st, x, K, rows, div, T, p);
    return gemm_op{ p, K, false, 0, 0 };
}

// x as dense_matmul's GEMMs take it: bf16 in two parts below
// GEMM_MODE_MIN_T tokens, else gemm_input's; while an xkeep_scope is on,
// the parts the last matrix of the same x took (not act_quant's, whose
// scratch each matrix refills).
static gemm_op dense_input(cu_impl *c, bool bf, bool quant, const float *x, int ldx, int T, int K)
{
    auto &k = c->xkeep;
    bool keep = k.on && bf && !quant;
    if (keep && k.set && k.x == x && k.ldx == ldx && k.T == T && k.K == K) return k.op;
    gemm_op in = bf && T < GEMM_MODE_MIN_T ? bf16_parts(c, x, ldx, NULL, 1, T, K, 2)
                                           : gemm_input(c, bf, quant, x, ldx, NULL, 1, T, K);
    if (keep && !c->failed) k.set = true, k.x = x, k.ldx = ldx, k.T = T, k.K = K, k.op = in;
    return in;
}

// fp8: an FP8 weight whose view starts on its 128x128 blocks, times
// act_quant(x), through cuBLASLt's block-scaled FP8 GEMM; false: the view
// does not fit it, or cuBLASLt has no algorithm for the shape (on the
// H200 it had none for 300 rows; nothing written to y).
static bool fp8_matmul(cu_impl *c, const dqw &q, const float *x, int ldx, int T, float *y,
                       int ldy)
{
    int N = q.rows, K = q.cols;
    if (q.type != QT_FP8 || q.r0 % 128 || q.c0 % 128 || K % 16 || q.ld % 16) return false;
    int nrb = (N + 127) / 128, ncb = (K + 127) / 128, l4 = (int)round_up(ncb, 4);
    int ldq = (int)round_up(K, 16);
    float *ws = (float *)grow(c, &c->wsc, (size_t)nrb * l4 * sizeof(float));
    uint8_t *xq = (uint8_t *)grow(c, &c->x8, (size_t)T * ldq);
    float *xs = (float *)grow(c, &c->xsc, (size_t)ncb * T * sizeof(float));
    if (c->failed) return true;
    cu_fp8_wscales(c->st, q.scale + (long long)(q.r0 / 128) * q.sld + q.c0 / 128, q.sld, nrb, ncb,
                   ws, l4);
    // x quantized once for the matrices of one matmuls op that share it
    auto &k = c->xkeep.q8;
    if (!(c->xkeep.on && k.x == x && k.ldx == ldx && k.T == T && k.K == K && k.x8 == xq &&
          k.xs == xs)) {
        cu_act_quant_fp8(c->st, x, ldx, T, K, xq, ldq, xs);
        if (c->xkeep.on) k = { x, ldx, T, K, xq, xs };
    }
    gemm_op w = { q.data + (long long)q.r0 * q.ld + q.c0, q.ld, false, 0, 0, ws };
    gemm_op in = { xq, ldq, false, 0, 0, xs };
    return lt_gemm(c, w, N, K, in, T, y, ldy);
}

// Prefill matmul: y = x W^T through cuBLASLt (bf16 or float32 operands;
// under fp8, FP8 weights as FP8 where the view allows, else, as for
// MXFP4 weights, act_quant(x) as floats times the weights in bf16: the
// same products, exact in float32).  Steps of fewer than GEMM_MODE_MIN_T
// tokens (decode batches past the GEMV's) split x in two bf16 parts under
// bf16 too: the bf16x2 bound every mode keeps there.
void dense_matmul(cu_impl *c, const dqw &q, const float *x, int ldx, int T, float *y,
                         int ldy)
{
    if (q.rows <= 0 || T <= 0) return;
    if (q.cols <= 0) {      // an empty slice (more ranks than units) adds nothing
        CK(c, cudaMemset2DAsync(y, ldy * sizeof(float), 0, q.rows * sizeof(float), T, c->st));
        return;
    }
    bool quant = fp8_quantized(c, q.type, T);
    if (quant && fp8_matmul(c, q, x, ldx, T, y, ldy)) return;
    if (quant) {
        float *xq = (float *)grow(c, &c->xq, (size_t)T * q.cols * sizeof(float));
        if (c->failed) return;
        cu_act_quant_round(c->st, x, ldx, T, q.cols, xq, q.cols);
        x = xq, ldx = q.cols;
    }
    bool bf = use_bf16(c, q);
    gemm_op w = gemm_weights(c, bf, q, 1);
    gemm_op in = dense_input(c, bf, quant, x, ldx, T, q.cols);
    if (!c->failed) lt_gemm(c, w, q.rows, q.cols, in, T, y, ldy);
}

// x in the attention output held in bf16 (c->held): one GEMM of the
// one-part bf16 modes, as dense_matmul multiplies a BF16 weight from
// GEMM_MODE_MIN_T tokens on, its input that output's bf16 form.
void held_matmul(cu_impl *c, const dqw &q, const uint16_t *x, int ldx, int T, float *y, int ldy)
{
    if (split_mode(c) || !use_bf16(c, q) || fp8_quantized(c, q.type, T) ||
        T < GEMM_MODE_MIN_T || q.rows <= 0 || q.cols <= 0) {
        fail(c, "matmul: x is attention's output held in bf16 (out_matmul), which a %d x %d "
             "matmul of %d tokens in this mode does not take", q.rows, q.cols, T);
        return;
    }
    gemm_op w = gemm_weights(c, true, q, 1);
    if (!c->failed) lt_gemm(c, w, q.rows, q.cols, gemm_op{ x, ldx, true, 0, 0 }, T, y, ldy);
}

// Matrices that join_weights laid back to back (the bf16 forms of FP8
// and BF16 weights, one after another in the list's order) times one x,
// as dense_matmul multiplies each in bf16 with x split: one GEMM over all
// their rows, x's parts its stacked columns, each matrix's sums into its
// y (cu_sum_parts_segs).  One GEMM of up to 4,160 rows instead of up to
// 7 (a CSA layer's projections of x).  false: not such a list, not a
// step that joins (joins), or x not split and stacked there; nothing
// launched.
bool lt_joined(cu_impl *c, int n, const dqw *q, const float *x, int ldx, int T, float *const *y,
               const int *ldy)
{
    if (!stacks(c, n, T)) return false;
    cu_ysegs s;
    s.n = n;
    gemm_op w0 = {};
    const uint8_t *next = NULL;
    int N = 0;
    for (int i = 0; i < n; i++) {
        bool bf = q[i].type == QT_BF16 || (q[i].type == QT_FP8 && q[i].bf);
        if (!bf || q[i].rows <= 0 || q[i].cols != q[0].cols || fp8_quantized(c, q[i].type, T))
            return false;
        gemm_op w = gemm_weights(c, true, q[i], 1);     // no launch: bf16 forms
        if (i && (w.ld != w0.ld || w.p != next)) return false;
        if (!i) w0 = w;
        next = (const uint8_t *)byte_off(w.p, (long long)q[i].rows * w.ld * 2);
        N += q[i].rows;
        s.end[i] = N, s.y[i] = y[i], s.ldy[i] = ldy[i];
    }
    gemm_op in = dense_input(c, true, false, x, ldx, T, q[0].cols);
    return c->failed || lt_gemm(c, w0, N, q[0].cols, in, T, NULL, 0, &s);
}

// Views of one matrix a fixed number of rows apart, each times its own x
// a fixed number of columns after the one before (the grouped output
// projection wo_a: 4 groups of 1,024 rows, each over its 4,096 columns of
// the attention's output), as dense_matmul multiplies each in bf16 with x
// split: x's columns split once, one strided-batched GEMM, one sum of the
// parts into each view's y.  Three launches instead of three a view, and
// the batch fills the GPU where one view's GEMM of 1,024 rows could not.
// Steps that batches() takes; false: not such a list or not such a step,
// nothing launched.
bool lt_batched(cu_impl *c, int n, const dqw *q, const float *const *x, int ldx, int T,
                float *const *y, const int *ldy)
{
    if (!batches(c, n, T)) return false;
    long long xs = x[1] - x[0], ws = 0;
    int N = q[0].rows, K = q[0].cols;
    if (N <= 0 || K <= 0 || xs <= 0 || (n - 1) * xs + K > ldx) return false;
    gemm_op w0 = {};
    cu_ysegs s;
    s.n = n;
    for (int i = 0; i < n; i++) {
        bool bf = q[i].type == QT_BF16 || (q[i].type == QT_FP8 && q[i].bf);
        if (!bf || q[i].rows != N || q[i].cols != K || x[i] - x[0] != i * xs ||
            fp8_quantized(c, q[i].type, T))
            return false;
        gemm_op w = gemm_weights(c, true, q[i], 1);     // no launch: bf16 forms
        if (i == 1) ws = ((const uint16_t *)w.p - (const uint16_t *)w0.p);
        if (i && (w.ld != w0.ld || w.p != byte_off(w0.p, i * ws * 2) || ws <= 0)) return false;
        if (!i) w0 = w;
        s.end[i] = (i + 1) * N, s.y[i] = y[i], s.ldy[i] = ldy[i];
    }
    gemm_op in = bf16_parts(c, x[0], ldx, NULL, 1, T, (int)((n - 1) * xs + K), 2);
    c->xkeep.set = false;   // its scratch now holds these parts
    w0.stride = ws, in.stride = xs;
    return c->failed || lt_gemm(c, w0, N, K, in, T, NULL, 0, &s, n);
}

// y = x W^T with float32 products whatever the GEMM mode (the router's
// scores: a token's experts do not move with the mode) through cuBLASLt:
// weights exact in bf16 times x in three bf16 parts (hi, the rest's hi,
// its rest: x exactly, each product exact, float32 sums on the tensor
// cores), else float32 operands (no TF32).
void f32_matmul(cu_impl *c, const dqw &q, const float *x, int ldx, int T, float *y, int ldy)
{
    if (q.rows <= 0 || q.cols <= 0 || T <= 0) return;
    bool bf = q.type != QT_F32;
    gemm_op w = gemm_weights(c, bf, q, 1);
    gemm_op in = bf ? bf16_parts(c, x, ldx, NULL, 1, T, q.cols, 3) : gemm_op{ x, ldx, false, 0, 0 };
    if (!c->failed) lt_gemm(c, w, q.rows, q.cols, in, T, y, ldy);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

// MoE rows sorted by expert (expert e's: ho[e] .. ho[e + 1], host memory):
// y of each = its x . W_e^T, a cuBLASLt GEMM per expert, the weights
// dequantized a chunk of experts at a time.  x: gemm_input's, same type.
void expert_gemms(cu_impl *c, const dqw &w, int E, const int *ho, gemm_op x, float *y,
                         int ldy)
{
    int ns = ho[E];
    if (w.rows <= 0 || ns <= 0) return;
    if (w.cols <= 0) {
        CK(c, cudaMemset2DAsync(y, ldy * sizeof(float), 0, w.rows * sizeof(float), ns, c->st));
        return;
    }
    double t0 = c->profile ? now_ms() : 0;
    size_t per = (size_t)w.rows * round_up(w.cols, 8) * (x.bf16 ? 2 : 4);
    int chunk = (int)(WCHUNK_BYTES / per);
    chunk = chunk < 1 ? 1 : chunk > E ? E : chunk;
    for (int e0 = 0; e0 < E && !c->failed; e0 += chunk) {
        int n = E - e0 < chunk ? E - e0 : chunk;
        if (ho[e0 + n] == ho[e0]) continue;
        dqw q = w;
        q.data += e0 * w.estride;
        if (q.bf) q.bf += e0 * w.bstride;
        if (q.scale) q.scale += e0 * w.sestride;
        gemm_op wc = gemm_weights(c, x.bf16, q, n);
        for (int e = e0; e < e0 + n && !c->failed; e++) {
            int o = ho[e], m = ho[e + 1] - o;
            if (!m) continue;
            gemm_op we = { byte_off(wc.p, (e - e0) * wc.stride), wc.ld, x.bf16, 0, 0 };
            gemm_op xe = { byte_off(x.p, o * x.ld * (x.bf16 ? 2 : 4)), x.ld, x.bf16, 0, x.lo,
                           NULL, x.parts };
            lt_gemm(c, we, w.rows, w.cols, xe, m, y + (size_t)o * ldy, ldy);
        }
    }
    if (c->profile) c->expert_host_ms += now_ms() - t0;
}

// Every GEMM: float32 accumulation (no TF32 for float32 operands),
// W' transposed (lt_gemm).
bool lt_op_new(cu_impl *c)
{
    bool ok = true;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    LTK(cublasLtMatmulDescCreate(&c->lt_op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LTK(cublasLtMatmulDescSetAttribute(c->lt_op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LTK(cublasLtMatmulDescSetAttribute(c->lt_op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    // FP8: the weights' scales per 128x128 block, the activations' per
    // 1x128 (the pointers are set per GEMM)
    int32_t ma = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    int32_t mb = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    LTK(cublasLtMatmulDescCreate(&c->lt_op8, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LTK(cublasLtMatmulDescSetAttribute(c->lt_op8, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LTK(cublasLtMatmulDescSetAttribute(c->lt_op8, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    LTK(cublasLtMatmulDescSetAttribute(c->lt_op8, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma,
                                       sizeof ma));
    LTK(cublasLtMatmulDescSetAttribute(c->lt_op8, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb,
                                       sizeof mb));
    return ok;
}
