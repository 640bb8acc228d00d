// Does cuBLASLt run FP8 e4m3 GEMMs with DeepSeek's block scaling (float32
// scales per 1x128 activation block and per 128x128 weight block:
// CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F / BLK128x128_32F) on this GPU,
// and how fast against bf16?  Not part of the engine: it answers that
// question for docs/PERFORMANCE.md.  Build and run (GPU machine):
//   nvcc -O2 -o build/bin/cublaslt-fp8-probe tools/cublaslt_fp8_probe.cu -lcublasLt
//   build/bin/cublaslt-fp8-probe
// Both GEMMs multiply the same values (FP8 codes, exact in bf16); with the
// weight scales 2 and the activation scales 1/4 the FP8 result must be half
// the bf16 one (checked: relative L2 error printed).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#define CK(x)                                                                                    \
    do {                                                                                         \
        cudaError_t e_ = (x);                                                                    \
        if (e_ != cudaSuccess) {                                                                 \
            printf("%s: %s\n", #x, cudaGetErrorString(e_));                                      \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

static size_t WS = 32u << 20;

// D[N][M] column-major = W^T X for W: K x N, X: K x M (TN, as the engine's
// prefill GEMMs).  Returns ms per GEMM, or -1 when cuBLASLt has no
// algorithm (status printed).
static float gemm(cublasLtHandle_t lt, bool fp8, int M, int N, int K, const void *W,
                  const void *X, const float *sw, const float *sx, float *D, void *ws)
{
    cudaDataType_t dt = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
    cublasLtMatmulDesc_t op;
    cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (fp8) {
        int32_t ma = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
        int32_t mb = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma);
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof mb);
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sw, sizeof sw);
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sx, sizeof sx);
    }
    cublasLtMatrixLayout_t A, B, C;
    cublasLtMatrixLayoutCreate(&A, dt, K, N, K);
    cublasLtMatrixLayoutCreate(&B, dt, K, M, K);
    cublasLtMatrixLayoutCreate(&C, CUDA_R_32F, N, M, N);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &WS,
                                         sizeof WS);
    cublasLtMatmulHeuristicResult_t res;
    int n = 0;
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(lt, op, A, B, C, C, pref, 1, &res, &n);
    float ms = -1;
    if (s != CUBLAS_STATUS_SUCCESS || n < 1) {
        printf("  %s %dx%dx%d: no algorithm (heuristic status %d, %d results)\n",
               fp8 ? "fp8 block-scaled" : "bf16", M, N, K, (int)s, n);
    } else {
        float one = 1, zero = 0;
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        for (int i = 0; i < 3; i++)
            s = cublasLtMatmul(lt, op, &one, W, A, X, B, &zero, D, C, D, C, &res.algo, ws, WS, 0);
        cudaEventRecord(e0);
        for (int i = 0; i < 20; i++)
            cublasLtMatmul(lt, op, &one, W, A, X, B, &zero, D, C, D, C, &res.algo, ws, WS, 0);
        cudaEventRecord(e1);
        CK(cudaEventSynchronize(e1));
        cudaEventElapsedTime(&ms, e0, e1);
        ms /= 20;
        if (s != CUBLAS_STATUS_SUCCESS) {
            printf("  %s: cublasLtMatmul status %d\n", fp8 ? "fp8" : "bf16", (int)s);
            ms = -1;
        } else {
            printf("  %s %dx%dx%d: %.3f ms, %.0f TFLOP/s\n", fp8 ? "fp8 block-scaled" : "bf16",
                   M, N, K, ms, 2.0 * M * N * K / ms / 1e9);
        }
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(A);
    cublasLtMatrixLayoutDestroy(B);
    cublasLtMatrixLayoutDestroy(C);
    cublasLtMatmulDescDestroy(op);
    return ms;
}

static void shape(cublasLtHandle_t lt, int M, int N, int K, void *ws)
{
    size_t nw = (size_t)K * N, nx = (size_t)K * M;
    std::vector<__nv_fp8_e4m3> w8(nw), x8(nx);
    std::vector<__nv_bfloat16> wb(nw), xb(nx);
    for (size_t i = 0; i < nw; i++) {
        w8[i] = __nv_fp8_e4m3((float)rand() / RAND_MAX * 2 - 1);
        wb[i] = __float2bfloat16((float)w8[i]);
    }
    for (size_t i = 0; i < nx; i++) {
        x8[i] = __nv_fp8_e4m3((float)rand() / RAND_MAX * 2 - 1);
        xb[i] = __float2bfloat16((float)x8[i]);
    }
    // Scales: more than either layout needs, all equal.
    size_t ns = ((size_t)K / 128 + 1) * ((size_t)(M > N ? M : N) + 128);
    std::vector<float> s2(ns, 2.0f), s4(ns, 0.25f);
    void *dw8, *dx8, *dwb, *dxb;
    float *dsw, *dsx, *d8, *db;
    CK(cudaMalloc(&dw8, nw));
    CK(cudaMalloc(&dx8, nx));
    CK(cudaMalloc(&dwb, nw * 2));
    CK(cudaMalloc(&dxb, nx * 2));
    CK(cudaMalloc(&dsw, ns * 4));
    CK(cudaMalloc(&dsx, ns * 4));
    CK(cudaMalloc(&d8, (size_t)M * N * 4));
    CK(cudaMalloc(&db, (size_t)M * N * 4));
    CK(cudaMemcpy(dw8, w8.data(), nw, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dx8, x8.data(), nx, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dwb, wb.data(), nw * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dxb, xb.data(), nx * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dsw, s2.data(), ns * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dsx, s4.data(), ns * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(d8, 0, (size_t)M * N * 4));
    float tb = gemm(lt, false, M, N, K, dwb, dxb, NULL, NULL, db, ws);
    float t8 = gemm(lt, true, M, N, K, dw8, dx8, dsw, dsx, d8, ws);
    if (tb > 0 && t8 > 0) {
        std::vector<float> y8((size_t)M * N), yb((size_t)M * N);
        CK(cudaMemcpy(y8.data(), d8, y8.size() * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(yb.data(), db, yb.size() * 4, cudaMemcpyDeviceToHost));
        double d = 0, z = 0;
        for (size_t i = 0; i < y8.size(); i++) {
            double e = y8[i] - 0.5 * yb[i];
            d += e * e;
            z += 0.25 * (double)yb[i] * yb[i];
        }
        printf("  fp8 result vs bf16 / 2: rel L2 %.2e; fp8 %.2fx the bf16 speed\n", sqrt(d / z),
               tb / t8);
    }
    cudaFree(dw8), cudaFree(dx8), cudaFree(dwb), cudaFree(dxb);
    cudaFree(dsw), cudaFree(dsx), cudaFree(d8), cudaFree(db);
}

int main(void)
{
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    printf("%s (sm_%d%d), cuBLASLt %zu\n", p.name, p.major, p.minor, cublasLtGetVersion());
    cublasLtHandle_t lt;
    cublasLtCreate(&lt);
    void *ws;
    CK(cudaMalloc(&ws, WS));
    shape(lt, 8192, 4096, 4096, ws);     // a dense prefill GEMM
    shape(lt, 256, 1024, 4096, ws);      // one expert's rows at 8K tokens, TP=2
    cublasLtDestroy(lt);
    return 0;
}
