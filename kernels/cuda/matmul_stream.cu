// Dense matmuls of decode batches (up to 64 tokens) on tensor cores with x
// streamed: y = x W^T, W in FP8 (e4m3, UE8M0 128x128 block scales) or
// BF16, each weight read once for all the tokens, mma.sync with bf16
// operands (FP8 decoded exactly, x split in two bf16 parts or rounded
// once: smm.cuh, matmul_mma.cu's fragment scheme) and float32 sums.
//
// matmul_mma.cu stages a block's whole column range of x before its first
// product, which at 33-64 tokens bounds that range by shared memory (640
// columns), forces clusters of 8 blocks along the columns and leaves the
// staging unoverlapped; a cluster of 8 fits 15 times on an H200, so a
// 4096 x 4096 matrix (16 clusters) ran in two waves (run H1: 76 us at 64
// tokens, cuBLASLt on dequantized weights 34).  Here x travels with the
// weights: a block stage is 128 columns (FP8; BF16 64) of the block's 128
// or 256 rows (4 or 8 warps along the rows of 32 each; with 4, two warps
// split each stage's columns) and of x's tokens, STAGES of them in flight
// (cp.async, each thread's copies of a stage one group), split in place
// once landed; so a block's range of columns is free and the plan picks
// rows per block and the cluster's blocks along the columns (KS, whose
// partial sums meet through distributed shared memory in a fixed order)
// for the grid that keeps the most SMs busy in the fewest waves
// (cudaOccupancyMaxActiveClusters), charging each block its weight bytes,
// x bytes and tensor-core work.
#include "smm.cuh"

#define ST_THREADS 256
#define ST_SMEM (200 * 1024)    // stage buffers per block, at most
#define ST_WARP_BYTES 4096      // a warp's weights of one block stage (2 sub-stages of 2 KB)

struct stm_args {
    dqw w;
    const float *x;
    int ldx, T;
    float *y;
    int ldy;
    int WM;     // warps along the rows (8 or 4; 8 / WM along a stage's columns)
    int Kc;     // columns per block (a multiple of the block stage)
    int x16;    // x's rows are whole float4s (aligned, ldx % 4 == 0)
};

template <int QT, int NT> struct stm_shape {
    static constexpr int EB = QT == QT_BF16 ? 2 : 1;    // bytes per weight
    static constexpr int SC = 16 / EB;                  // columns per lane copy
    static constexpr int STEP = 4 * SC;                 // columns per 2 KB sub-stage
    static constexpr int BK = 2 * STEP;                 // columns per block stage
    static constexpr int TP = NT * 8;                   // tokens, padded
    static constexpr int XST = BK * 4 + (QT == QT_FP8 ? 32 : 16);  // bytes per x row (xsw)
    static constexpr int SB = 8 * ST_WARP_BYTES + TP * XST;       // bytes per block stage
    // stages in flight: as many as fit (3 at 64 tokens, 4 at 16; run H3
    // found the blocks waiting on memory), at most 6
    static constexpr int STAGES = ST_SMEM / SB > 6 ? 6 : ST_SMEM / SB;
    static constexpr size_t smem()
    {
        size_t st = (size_t)STAGES * SB, red = (size_t)256 * (TP + 1) * 4 * 2;
        return st > red ? st : red;
    }
};

template <int QT, int NT, bool SPLIT>
__global__ void __launch_bounds__(ST_THREADS, 1) stm_kernel(const __grid_constant__ stm_args a)
{
    extern __shared__ __align__(16) uint8_t sh[];
    using S = stm_shape<QT, NT>;
    constexpr int SC = S::SC, STEP = S::STEP, BK = S::BK, TP = S::TP, XST = S::XST;
    constexpr int SB = S::SB, KSTEPS = SC / 4, NC = BK / 4, ST_STAGES = S::STAGES;
    const dqw &w = a.w;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int WM = a.WM, WK = 8 / WM, wm = warp % WM, wk = warp / WM, BR = 32 * WM;
    int kb0 = blockIdx.y * a.Kc, kend = min(kb0 + a.Kc, w.cols);
    int nst = (kend - kb0 + BK - 1) / BK;       // the plan gives every block columns

    const uint8_t *rp[4], *sp[4];
    bool rok[4];
    lane_rows<QT>(w, blockIdx.x * BR + wm * 32, rp, sp, rok);
    // Sub-stages h of a block stage this warp takes: h = wk, wk + WK, ...
    // Its weights of block stage s into the warp's slot (zeros past the
    // view's rows and the block's columns; nothing past the last stage).
    auto issue_w = [&](int s) {
        if (s >= nst) return;
        uint8_t *dst = sh + (s % ST_STAGES) * SB + warp * ST_WARP_BYTES + lane * 16;
        for (int h = wk, i = 0; h < 2; h += WK, i++)
            copy_rows<QT>(dst + i * 2048, rp, rok, kb0 + s * BK + h * STEP + t * SC, kend);
    };
    // x of block stage s: tokens [0, TP) x the stage's columns as float4
    // chunks (zeros past the tokens and the block's columns), this
    // thread's share.
    auto issue_x = [&](int s) {
        if (s < nst)
            stage_x(sh + (s % ST_STAGES) * SB + 8 * ST_WARP_BYTES, a.x, a.ldx, a.T, a.x16, TP, NC,
                    XST, kb0 + s * BK, kend, ST_THREADS, [](int c) { return xsw(c); });
    };
    // The weights depend on no earlier kernel: on their way before the wait.
    for (int s = 0; s < ST_STAGES - 1; s++) issue_w(s), cp_async_commit();
    pdl_wait();
    for (int s = 0; s < ST_STAGES - 1; s++) issue_x(s), cp_async_commit();

    float acc[2][NT][4] = {};
    const uint8_t *xt0 = sh + 8 * ST_WARP_BYTES + g * XST;     // token g of n-tile 0
    for (int s = 0; s < nst; s++) {
        // Stage s landed (every thread's copies) and stage s - 1 is
        // consumed: its slot takes stage s + STAGES - 1.
        cp_async_wait<ST_STAGES - 2>();
        __syncthreads();
        issue_w(s + ST_STAGES - 1);
        issue_x(s + ST_STAGES - 1);
        cp_async_commit();
        uint8_t *xs = sh + (s % ST_STAGES) * SB + 8 * ST_WARP_BYTES;
        for (int i = threadIdx.x; i < TP * NC / 2; i += ST_THREADS) {
            int tok = i / (NC / 2), q = i % (NC / 2);
            split_x8<QT, SPLIT>((uint4 *)(xs + tok * XST + xsw(2 * q) * 16),
                                (uint4 *)(xs + tok * XST + xsw(2 * q + 1) * 16));
        }
        __syncthreads();
        const uint8_t *wsl = sh + (s % ST_STAGES) * SB + warp * ST_WARP_BYTES + lane * 16;
        for (int h = wk, i = 0; h < 2; h += WK, i++) {
            uint32_t A[KSTEPS][2][4];
            lane_frags<QT>(wsl + i * 2048, sp, w, kb0 + s * BK + h * STEP + t * SC, kend, A);
            mma_stage<QT, NT, SPLIT, KSTEPS, SC>(acc, A, xt0 + (s % ST_STAGES) * SB, XST,
                                                 (h * STEP + t * SC) / 8);
        }
    }
    cp_async_wait<0>();     // (empty groups only: every stage was waited for)

    if (gridDim.y == 1 && WK == 1) {    // the warp owns whole sums
        each_sum<NT>([&](int m, int n, int q, int r, int tok) {
            int row = blockIdx.x * BR + wm * 32 + r;
            if (tok < a.T && row < w.rows) a.y[(long long)tok * a.ldy + row] = acc[m][n][q];
        });
        return;
    }
    // The warps' partial sums [wk][row][token] (rows PL floats apart) ...
    constexpr int PL = TP + 1;
    float *part = (float *)sh;
    __syncthreads();    // every warp past its last stage
    store_partials<NT>(part, acc, wm, wk, BR);
    __syncthreads();
    if (gridDim.y == 1) {       // added over the warps, in warp order
        for (int e = threadIdx.x; e < BR * a.T; e += ST_THREADS) {
            int tok = e / BR, r = e % BR, orow = blockIdx.x * BR + r;
            float v = 0;
            for (int k = 0; k < WK; k++) v += part[(k * BR + r) * PL + tok];
            if (orow < w.rows) a.y[(long long)tok * a.ldy + orow] = v;
        }
        return;
    }
    // ... over the warps and the cluster's blocks (smm.cuh).
    cluster_sums<NT>(part, part + (size_t)8 * 32 * PL, BR, WK, a.T, blockIdx.x * BR, w.rows, a.y,
                     a.ldy);
}

template <int QT, int NT, bool SPLIT>
static bool stm_launch(cudaStream_t st, stm_args a)
{
    using S = stm_shape<QT, NT>;
    auto *k = stm_kernel<QT, NT, SPLIT>;
    size_t smem = S::smem();
    smem_attr<QT * 64 + NT * 2 + SPLIT>(k, smem);     // before the occupancy queries
    const dqw &w = a.w;
    int nsm = cu_sm_count();
    double best = 0;
    int bWM = 0, bKS = 0, bKc = 0;
    for (int WM = 8; WM >= 4; WM /= 2)
        for (int KS = 1; KS <= 8; KS *= 2) {
            int Kc = ((w.cols + KS - 1) / KS + S::BK - 1) / S::BK * S::BK;
            if ((long long)(KS - 1) * Kc >= w.cols) continue;
            int nrg = (w.rows + 32 * WM - 1) / (32 * WM);
            int maxc = KS == 1 ? nsm : smm_max_clusters(k, KS, ST_THREADS, smem);
            if (maxc < 1) continue;
            int waves = (nrg + maxc - 1) / maxc, active = (nrg < maxc ? nrg : maxc) * KS;
            double rows = 32.0 * WM;
            double s = waves * smm_block_s(rows * Kc * S::EB, (double)S::TP * Kc * 4,
                                           rows * Kc * S::TP * 2.0 * (SPLIT ? 2 : 1), 2e12,
                                           active, KS, rows * S::TP * 4);
            if (!bWM || s < best) best = s, bWM = WM, bKS = KS, bKc = Kc;
        }
    if (!bWM) return false;
    a.WM = bWM, a.Kc = bKc;
    dim3 grid((unsigned)((w.rows + 32 * bWM - 1) / (32 * bWM)), bKS);
    return smm_started(
        cu_launch_cluster(k, grid, ST_THREADS, smem, st, dim3(1, bKS > 1 ? bKS : 0), a));
}

bool cu_matmul_stream(cudaStream_t st, const dqw &w, const float *x, int ldx, int T, float *y,
                      int ldy, bool split)
{
    if (!dense_view_ok(w, T) || (!split && T <= 56))   // unsplit: the prefill modes' x at 64
        return false;
    stm_args a = {};
    a.w = w, a.x = x, a.ldx = ldx, a.T = T, a.y = y, a.ldy = ldy;
    a.x16 = (uintptr_t)x % 16 == 0 && ldx % 4 == 0;
    int NT = (T + 7) / 8;
#define STM(Q)                                                                                   \
    do {                                                                                         \
        if (!split) return stm_launch<Q, 8, false>(st, a);                                       \
        if (NT <= 2) return stm_launch<Q, 2, true>(st, a);                                       \
        if (NT == 3) return stm_launch<Q, 3, true>(st, a);                                       \
        if (NT == 4) return stm_launch<Q, 4, true>(st, a);                                       \
        if (NT <= 6) return stm_launch<Q, 6, true>(st, a);                                       \
        return stm_launch<Q, 8, true>(st, a);                                                    \
    } while (0)
    if (w.type == QT_FP8) STM(QT_FP8);
    STM(QT_BF16);
#undef STM
}
