// Dense matmuls of decode batches of up to 64 tokens on Hopper's wgmma:
// y = x W^T, W in FP8 (e4m3, UE8M0 128x128 block scales) or BF16, each
// weight read once for all the tokens, with x streamed beside the weights
// as in matmul_stream.cu (plan, cluster reduction, exact FP8 decoding).
//
// Why: matmul_stream.cu's mma.sync (m16n8k16) needs, per 32 rows of a
// warp, every token's x fragments loaded from shared memory into
// registers; from 33 tokens those loads and the mmas outgrow the weight
// stream (run H4: slower than cuBLASLt on the dequantized weights from 48
// tokens).  wgmma m64nNk16 takes B from shared memory through a
// descriptor: a warpgroup multiplies 64 rows by all N columns of x in one
// instruction, and no lane loads x.
//
// A (the weights) comes from registers, in the mma fragment scheme of
// matmul_mma.cu (smm.cuh's frag_a: each lane's 16-byte copies are its A
// fragments, k slots permuted); B is x in that permuted k order, written
// by the block itself: each block stage's float32 x (cp.async) is split
// into bf16 rows n = 2 token + part (hi = bf16(x), lo = bf16(x - hi)), or
// n = token rounded once, in wgmma's 128-byte-swizzled K-major layout.
// So a sum's two parts are adjacent columns of a lane's accumulators
// (the D layout: columns 2t, 2t + 1), added once at the end.
//
// A block is two warpgroups (8 warps of 32 rows: 256 rows), a block stage
// 64 columns (one swizzle atom of bf16 x, 4 k steps), STAGES of weights
// and x in flight; the blocks of a cluster split the columns and add
// their partial sums through distributed shared memory (smm.cuh).
#include "smm.cuh"
#include "wgmma.cuh"

#define SW_BK 64                // columns per block stage

bool cu_wgmma_ok()
{
    // once per process (thread-safe): ranks plan on their own threads
    static const bool ok = [] {
        int dev = 0, major = 0, minor = 0;
        return cudaGetDevice(&dev) == cudaSuccess &&
               cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) ==
                   cudaSuccess &&
               cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) ==
                   cudaSuccess &&
               major == 9 && minor == 0;
    }();
    return ok;
}

struct swm_args {
    dqw w;
    const float *x;
    int ldx, T;
    float *y;
    int ldy;
    int Kc;     // columns per block (a multiple of SW_BK)
    int x16;    // x's rows are whole float4s (aligned, ldx % 4 == 0)
};

// WG warpgroups a block (128 rows each: 4 warps of 32).
template <int QT, int NP, bool SPLIT, int WG> struct swm_shape {
    static constexpr int THREADS = 128 * WG;
    static constexpr int BR = 128 * WG;                     // rows per block
    static constexpr int EB = QT == QT_BF16 ? 2 : 1;        // bytes per weight
    static constexpr int SC = 16 / EB;                      // columns per lane copy
    static constexpr int WB = BR * SW_BK * EB;              // weight bytes per stage
    static constexpr int TOK = SPLIT ? NP / 2 : NP;         // tokens, padded
    static constexpr int XST = SW_BK * 4 + 16;              // bytes per staged x row
    static constexpr int SB = WB + TOK * XST;               // bytes per stage
    static constexpr int BB = NP * 128;                     // the B tile (bf16 x)
    // shared memory at most: one block an SM of two warpgroups, two of one
    static constexpr int SMEM = WG == 2 ? 210 * 1024 : 110 * 1024;
    static constexpr int STAGES = (SMEM - 1024 - BB) / SB > 6 ? 6 : (SMEM - 1024 - BB) / SB;
    static constexpr size_t smem()
    {
        // the reduction's partial sums and the cluster's shares reuse it
        size_t st = 1024 + BB + (size_t)STAGES * SB, red = 1024 + (size_t)BR * (2 * TOK + 1) * 4;
        return st > red ? st : red;
    }
};

// The column (of a block stage) that k slot 2t + j (j < 2) or 2t + 8 +
// j - 2 (j >= 2) of k step s takes: frag_a's scheme, FP8 one 16-byte copy
// a lane for the 4 steps, BF16 two (steps 0-1, 2-3).
template <int QT> __device__ __forceinline__ int swm_col(int s, int t, int j)
{
    return QT == QT_BF16 ? 32 * (s >> 1) + 8 * t + 4 * (s & 1) + j : 16 * t + 4 * s + j;
}

template <int QT, int NP, bool SPLIT, int WG>
__global__ void __launch_bounds__(128 * WG, 1) swm_kernel(const __grid_constant__ swm_args a)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(16) uint8_t sh_raw[];
    using S = swm_shape<QT, NP, SPLIT, WG>;
    constexpr int NTH = S::THREADS, BR = S::BR;
    constexpr int SC = S::SC, TOK = S::TOK, XST = S::XST, SB = S::SB;
    constexpr int STAGES = S::STAGES, NC = SW_BK / 4, H = QT == QT_BF16 ? 2 : 1;
    constexpr int KSTEPS = SC / 4;      // k steps a lane copy holds
    static_assert(STAGES >= 2, "two stages at least");
    uint8_t *sh = (uint8_t *)(((uintptr_t)sh_raw + 1023) & ~(uintptr_t)1023);
    uint8_t *bt = sh;                   // the B tile
    uint8_t *stg = sh + S::BB;          // the stages: weights, then x
    const dqw &w = a.w;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int kb0 = blockIdx.y * a.Kc, kend = min(kb0 + a.Kc, w.cols);
    int nst = (kend - kb0 + SW_BK - 1) / SW_BK;     // the plan gives every block columns

    const uint8_t *rp[4], *sp[4];
    bool rok[4];
    lane_rows<QT>(w, blockIdx.x * BR + warp * 32, rp, sp, rok);
    // The warp's weights of stage s (H copies of 16 bytes a row: zeros past
    // the view's rows and the block's columns; nothing past the last stage).
    auto issue_w = [&](int s) {
        if (s >= nst) return;
        uint8_t *dst = stg + (s % STAGES) * SB + warp * (H * 2048) + lane * 16;
#pragma unroll
        for (int h = 0; h < H; h++)
            copy_rows<QT>(dst + h * 2048, rp, rok, kb0 + s * SW_BK + h * 32 + t * SC, kend);
    };
    // x of stage s: tokens [0, TOK) x the stage's columns as float4 chunks
    // (zeros past the tokens and the block's columns), this thread's share.
    auto issue_x = [&](int s) {
        if (s < nst)
            stage_x(stg + (s % STAGES) * SB + S::WB, a.x, a.ldx, a.T, a.x16, TOK, NC, XST,
                    kb0 + s * SW_BK, kend, NTH, [](int c) { return c; });
    };
    // The weights depend on no earlier kernel: on their way before the wait.
    for (int s = 0; s < STAGES - 1; s++) issue_w(s), cp_async_commit();
    pdl_wait();
    for (int s = 0; s < STAGES - 1; s++) issue_x(s), cp_async_commit();

    float acc[2][NP / 2] = {};
    uint64_t db = swm_desc((uint32_t)__cvta_generic_to_shared(bt));
    for (int s = 0; s < nst; s++) {
        // Stage s landed (every thread's copies) and the B tile is free
        // (the last stage's wgmma waited for): stage s + STAGES - 1 into
        // the slot of stage s - 1.
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        issue_w(s + STAGES - 1);
        issue_x(s + STAGES - 1);
        cp_async_commit();
        // x of stage s into the B tile: row n's chunk q (k step q / 2,
        // slots 8 (q & 1) ..) takes x's columns swm_col(q / 2, t', 2 (q &
        // 1) + i) for t' = 0..3, i = 0, 1.
        const uint8_t *xs = stg + (s % STAGES) * SB + S::WB;
        for (int i = threadIdx.x; i < TOK * 8; i += NTH) {
            int tok = i >> 3, q = i & 7;
            uint32_t hi[4], lo[4];
#pragma unroll
            for (int tt = 0; tt < 4; tt++) {
                int c = swm_col<QT>(q >> 1, tt, 2 * (q & 1));
                float2 f = *(const float2 *)(xs + tok * XST + c * 4);
                hi[tt] = pack_bf16x2(f.x, f.y);
                lo[tt] = pack_bf16x2(f.x - bf16f(hi[tt] & 0xffff), f.y - bf16f(hi[tt] >> 16));
            }
            int n = SPLIT ? 2 * tok : tok;
            *(uint4 *)(bt + n * 128 + ((q ^ (n & 7)) << 4)) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
            if (SPLIT) {
                n++;
                *(uint4 *)(bt + n * 128 + ((q ^ (n & 7)) << 4)) =
                    make_uint4(lo[0], lo[1], lo[2], lo[3]);
            }
        }
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        const uint8_t *wsl = stg + (s % STAGES) * SB + warp * (H * 2048) + lane * 16;
#pragma unroll
        for (int h = 0; h < H; h++) {
            uint32_t A[KSTEPS][2][4];
            lane_frags<QT>(wsl + h * 2048, sp, w, kb0 + s * SW_BK + h * 32 + t * SC, kend, A);
            swm_pin(acc[0]);
            swm_pin(acc[1]);
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
            for (int k = 0; k < KSTEPS; k++)
#pragma unroll
                for (int m = 0; m < 2; m++)
                    swm_wgmma<NP>(acc[m], A[k][m], db + 2 * (h * KSTEPS + k));
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            swm_pin(acc[0]);
            swm_pin(acc[1]);
        }
    }
    cp_async_wait<0>();     // (empty groups only: every stage was waited for)

    // Lane (g, t)'s sums: m-tile m, rows g (e = 0) and g + 8 (e = 1), n-tile
    // j: split, token 4 j + t (its two parts adjacent); else tokens 8 j + 2t
    // and + 1.
    auto each = [&](auto f) {
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int j = 0; j < NP / 8; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int r = warp * 32 + m * 16 + e * 8 + g;
                    float d0 = acc[m][4 * j + 2 * e], d1 = acc[m][4 * j + 2 * e + 1];
                    if (SPLIT) {
                        f(r, 4 * j + t, d0 + d1);
                    } else {
                        f(r, 8 * j + 2 * t, d0);
                        f(r, 8 * j + 2 * t + 1, d1);
                    }
                }
    };
    if (gridDim.y == 1) {
        each([&](int r, int tok, float v) {
            int row = blockIdx.x * BR + r;
            if (tok < a.T && row < w.rows) a.y[(long long)tok * a.ldy + row] = v;
        });
        return;
    }
    // The block's partial sums [row][token] added over the cluster (smm.cuh).
    constexpr int PL = TOK + 1;
    float *part = (float *)sh;
    __syncthreads();    // every warp past its last stage
    each([&](int r, int tok, float v) { part[r * PL + tok] = v; });
    __syncthreads();
    cluster_sums<TOK / 8>(part, part + (size_t)BR * PL, BR, 1, a.T, blockIdx.x * BR, w.rows, a.y,
                          a.ldy);
#elif defined(__CUDA_ARCH__)
    __trap();   // built for sm_90a only (wgmma)
#endif
}

// The plan of blocks of WG warpgroups: its estimated seconds (0: none),
// and the columns a block and the cluster size it takes.
struct swm_plan {
    double s;
    int Kc, KS;
};

template <int QT, int NP, bool SPLIT, int WG> static swm_plan swm_plan_for(const dqw &w)
{
    using S = swm_shape<QT, NP, SPLIT, WG>;
    auto *k = swm_kernel<QT, NP, SPLIT, WG>;
    size_t smem = S::smem();
    smem_attr<QT * 64 + NP / 8 * 4 + SPLIT * 2 + WG - 1>(k, smem);  // before the queries
    int nsm = cu_sm_count(), nrg = (w.rows + S::BR - 1) / S::BR, per_sm = 0;
    // blocks an SM at once (registers, shared memory): one of two
    // warpgroups, two of one on an H200
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, S::THREADS, smem) != cudaSuccess)
        cudaGetLastError(), per_sm = 1;
    swm_plan best = { 0, 0, 0 };
    for (int KS = 1; KS <= 8; KS *= 2) {
        int Kc = ((w.cols + KS - 1) / KS + SW_BK - 1) / SW_BK * SW_BK;
        if ((long long)(KS - 1) * Kc >= w.cols) continue;
        int maxc = KS == 1 ? nsm * (per_sm > 0 ? per_sm : 1)
                           : smm_max_clusters(k, KS, S::THREADS, smem);
        if (maxc < 1) continue;
        int waves = (nrg + maxc - 1) / maxc, active = (nrg < maxc ? nrg : maxc) * KS;
        // wgmma at about half its peak rate an SM (the stage's barriers)
        double s = waves * smm_block_s((double)S::BR * Kc * S::EB, (double)S::TOK * Kc * 4,
                                       (double)S::BR * Kc * NP * 2.0, 3.5e12 / 2 * WG, active,
                                       KS, (double)S::BR * S::TOK * 4);
        if (!best.KS || s < best.s) best = { s, Kc, KS };
    }
    return best;
}

template <int QT, int NP, bool SPLIT, int WG>
static bool swm_run(cudaStream_t st, swm_args a, swm_plan p)
{
    using S = swm_shape<QT, NP, SPLIT, WG>;
    a.Kc = p.Kc;
    dim3 grid((unsigned)((a.w.rows + S::BR - 1) / S::BR), p.KS);
    return smm_started(cu_launch_cluster(swm_kernel<QT, NP, SPLIT, WG>, grid, S::THREADS,
                                         S::smem(), st, dim3(1, p.KS > 1 ? p.KS : 0), a));
}

// Blocks of `wg` warpgroups (1 or 2), or (0) whichever plan the cost
// model prefers.
template <int QT, int NP, bool SPLIT> static bool swm_launch(cudaStream_t st, swm_args a, int wg)
{
    swm_plan p1 = swm_plan_for<QT, NP, SPLIT, 1>(a.w), p2 = swm_plan_for<QT, NP, SPLIT, 2>(a.w);
    bool two = wg == 2 || (wg != 1 && p2.KS && (!p1.KS || p2.s <= p1.s));
    if (two ? !p2.KS : !p1.KS) return false;
    return two ? swm_run<QT, NP, SPLIT, 2>(st, a, p2) : swm_run<QT, NP, SPLIT, 1>(st, a, p1);
}

bool cu_matmul_wgmma(cudaStream_t st, const dqw &w, const float *x, int ldx, int T, float *y,
                     int ldy, bool split, int wg)
{
    if (!cu_wgmma_ok() || !dense_view_ok(w, T)) return false;
    swm_args a = {};
    a.w = w, a.x = x, a.ldx = ldx, a.T = T, a.y = y, a.ldy = ldy;
    a.x16 = (uintptr_t)x % 16 == 0 && ldx % 4 == 0;
#define SWM(Q)                                                                                   \
    do {                                                                                         \
        if (!split) return swm_launch<Q, 64, false>(st, a, wg);                                     \
        if (T <= 32) return swm_launch<Q, 64, true>(st, a, wg);                                     \
        return swm_launch<Q, 128, true>(st, a, wg);                                                 \
    } while (0)
    if (w.type == QT_FP8) SWM(QT_FP8);
    SWM(QT_BF16);
#undef SWM
}
