// Dense matmuls of decode batches (9-64 tokens) on tensor cores:
// y = x W^T, W in FP8 (e4m3, UE8M0 128x128 block scales) or BF16, each
// weight read from memory once for all the tokens (the GEMV reads it once
// per 8).  mma.sync m16n8k16, bf16 operands, float32 accumulation: the
// weight rows are M (16 per tile), the tokens N (8 per tile, padded with
// zeros).  Weights go from global memory to registers untouched by shared
// memory's banks: each lane's 16-byte copies (cp.async, SM_STAGES deep per
// warp, no registers held while they fly) are exactly the A fragments it
// needs, because the order of the k terms inside an mma is free: lane
// (g, t) loads bytes [16t, 16t + 16) of a stage's row g and g + 8, and
// the mma's k slots {2t, 2t+1, 2t+8, 2t+9} of step s are given columns
// {16t + 4s .. 16t + 4s + 3} (FP8; BF16: 8t + 4s .., 2 steps a stage);
// x's B fragments take the same columns.  FP8 codes become bf16 exactly
// (hardware e4m3x2 -> f16x2, then float32 times the block scale: a power
// of two, exact short of scales below 2^-124, as cu_dequant), so the
// scale is applied per 16-byte load, whatever the view's row and column
// origin.  x is staged in shared memory for the block's columns once: its
// float32 rows copied in (cp.async), then split in place into two bf16
// parts, hi = bf16(x) and lo = bf16(x - hi), whose two products share the
// weight fragments (bf16x2, within 2^-16 of each x), or rounded once.
// Columns are split over 8 / WM warps of a block and over the KS blocks
// of a thread-block cluster; the partial sums meet in shared memory and,
// across the cluster, through distributed shared memory (each block
// stores its sums into the block that owns them, which adds them), in a
// fixed order (deterministic, no atomics, no scratch, graph-capturable).
//
// The same kernel runs the routed experts of decode batches (MXFP4, over
// moe_sort's tiles of up to 8 slots of one expert, w1 and w3 over tiles
// of up to 4 with x staged in 4 rows; blockIdx.z the tile):
// x's rows gathered from the tile's slots (or the sorted rows of g), y's
// scattered back to slot order, and w1 with w3 paired in each warp (its
// first m-tile w1's rows, its second w3's same rows) so SwiGLU takes both
// sums at the end.  A lane's 16-byte copy is 32 E2M1 codes, one UE8M0
// scale block (views on 32-column boundaries); the 8 codes of a word w
// become 4 bf16 pairs (columns j and j + 4, nibbles j and j + 4): each
// nibble's sign goes to bit 15 of its half, its three magnitude bits
// under the exponent (bits 6-8; smm.cuh's fp4x8_bf16x2), which makes
// e2m1 * 2^-126 (0.5 a subnormal), then
// one bf16x2 multiply by 2^(S - 1) gives e2m1 * 2^(S - 127) exactly (two
// for S > 128, whose 2^(S - 1) bf16 cannot hold; S = 255: NaN, as the
// CPU's).  Staged x keeps each 8 columns in that order, c0 c4 c1 c5 c2
// c6 c3 c7, so its B fragments take the same columns.
#include "smm.cuh"

#define SM_THREADS 256
#define SM_STAGES 4                 // weight stages in flight per warp (2 KB each)
#define SM_STAGE_BYTES 2048         // 4 copies of 16 bytes per lane
#define SM_XMAX (160 * 1024)        // staged x per block, bytes
#define SM_XMAX2 (48 * 1024)        // the same for two blocks an SM (expert tiles)
#define SM_SRING_BYTES 1024         // L2: a warp's scale ring (2 chunks of 32 rows x 16 bytes)

struct smm_args {
    dqw w;
    const float *x;
    int ldx, T;
    float *y;
    int ldy;
    // expert tiles (SMM_TILES, SMM_SWIGLU): moe_sort's table, x's row of
    // sorted slot s x[perm[s] / xdiv] (xdiv 0: x[s]), y's y[perm[s]] when
    // scatter (else y[s]); SMM_SWIGLU: y = swiglu1(x . w, x . w3, limit)
    dqw w3;
    const int4 *tiles;
    const int *ntiles, *perm;
    int xdiv;
    bool scatter;
    float limit;
    int R, nrg;         // row groups (BR rows) per block (R > 1: WM 8, one block along
                        // the columns), and of the matrix
    int WM;             // warps along the rows (32 rows each); 8 / WM along the columns
    int Kb;             // columns per block (a multiple of 64 * 8 / WM)
    int xst;            // bytes per staged token row (smm_xst)
    int xr;             // token rows staged: dense TP; expert tiles 4 or 8 (tiles of up
                        // to 4 slots: the mma's tokens g and g + 4 read one row)
    int x16;            // x's rows are whole float4s (aligned, ldx % 4 == 0)
};

// Staged x: chunk c of a token row (16 bytes: 4 floats, after the split 8
// bf16) at 16-byte unit c + c / 8.  A lane's chunks of a stage are then
// consecutive units, those of the next stage a fixed stride further (one
// add a stage, immediate offsets for the loads), and a row stride of RS
// units mod 8 (MXFP4 4, FP8 2, BF16 1) puts the 8 lanes of an LDS.128
// phase (2 tokens x 4 column slots) on distinct banks.
__device__ __forceinline__ int xpos(int c) { return c + (c >> 3); }

// Bytes per staged token row of Kb columns (a multiple of 32).
static int smm_xst(int qt, int Kb)
{
    int u = Kb / 32 * 9, rs = qt == QT_MXFP4 ? 4 : qt == QT_FP8 ? 2 : 1;
    return (u + ((rs - u) & 7)) * 16;
}

// MODE: SMM_DENSE (y = x W^T), SMM_TILES (one expert matrix over the
// tiles), SMM_SWIGLU (w1 and w3 of the tiles' experts with SwiGLU).
// L2 (MXFP4 tiles, smm_l2_ok): the weights copied in units of one
// m-tile's 16 rows x 128 bytes (two stages' columns, whole 128-byte lines:
// one L2 request a line, not two of 64 bytes) and the scales through
// shared memory, 16 bytes a row for four stages (one request a row, not
// one a stage and row: the 1-byte loads missed L1 and made a third of
// the kernel's L2 requests; run D2's ncu: L2 76.8% busy beside DRAM
// 60.8%; run D3: the w1 + w3 tiles 304 -> 276 us, DRAM 67%).
enum { SMM_DENSE, SMM_TILES, SMM_SWIGLU };

template <int QT, int NT, bool SPLIT, int MODE, bool L2 = false>
__global__ void __launch_bounds__(SM_THREADS, QT == QT_MXFP4 ? 2 : 1)
    smm_kernel(const __grid_constant__ smm_args a)
{
    extern __shared__ __align__(16) uint8_t sm_sh[];
    __shared__ int xrow[NT * 8], yrow[NT * 8];     // the tokens' x and y rows (-1: none)
    constexpr bool FP4 = QT == QT_MXFP4;
    constexpr int EB = QT == QT_BF16 ? 2 : 1;       // bytes per weight (MXFP4: per 2)
    constexpr int SC = FP4 ? 32 : 16 / EB;          // columns per lane slot per stage
    constexpr int STEP = 4 * SC;                    // columns per warp stage
    constexpr int KSTEPS = SC / 4;                  // mma k steps per stage
    constexpr int TP = NT * 8;                      // tokens, padded
    const dqw &w = a.w;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int WM = a.WM, WK = 8 / WM, wm = warp % WM, wk = warp / WM, BR = 32 * WM;
    int kb0 = blockIdx.y * a.Kb, Kw = a.Kb / WK;
    int cw0 = wk * Kw;                              // the warp's first column in the block
    int kend = min(kb0 + a.Kb, w.cols);             // the block's columns end (view)
    int nst = max(0, min(Kw, kend - kb0 - cw0) + STEP - 1) / STEP;
    uint8_t *xs = sm_sh;
    uint8_t *wq = sm_sh + (size_t)a.xr * a.xst + (size_t)warp * SM_STAGES * SM_STAGE_BYTES;
    static_assert(!L2 || (FP4 && MODE != SMM_DENSE), "L2: MXFP4 tiles only");
    // L2: this warp's scale ring (a chunk: 4 stages' scales), after the stages
    uint8_t *sring =
        sm_sh + (size_t)a.xr * a.xst + 8 * SM_STAGES * SM_STAGE_BYTES + warp * SM_SRING_BYTES;
    auto cbytes = [](long long c) { return FP4 ? c >> 1 : c * EB; };

    // The block's row groups of BR rows (expert tiles: a.R of them, one
    // stage sequence through all; dense: one) and the expert (tiles: the
    // tile's, known after the wait).
    int rg0 = MODE == SMM_DENSE ? blockIdx.x : blockIdx.x * a.R, e = 0;
    int ng = MODE == SMM_DENSE ? 1 : min(a.R, a.nrg - rg0);
    // This lane's rows in row group rg: m-tile j / 2, row g (+ 8 for odd
    // j); under SMM_SWIGLU m-tile 1 is w3's rows of m-tile 0.  Their
    // weights (for the copies) and scale rows (for the scales, which run
    // behind the copies).
    const uint8_t *rp[4], *sp[4];
    bool rok[4];
    auto rows = [&](int rg, bool weights) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const dqw &W = MODE == SMM_SWIGLU && j >= 2 ? a.w3 : w;
            int r = MODE == SMM_SWIGLU ? rg * (BR / 2) + wm * 16 + (j & 1) * 8 + g
                                       : rg * BR + wm * 32 + (j >> 1) * 16 + (j & 1) * 8 + g;
            long long rr = W.r0 + min(r, W.rows - 1);
            if (weights) {
                rok[j] = r < W.rows;
                rp[j] = W.data + e * W.estride + cbytes(rr * W.ld + W.c0);
            } else {
                sp[j] = W.scale + e * W.sestride + (FP4 ? rr : rr >> 7) * W.sld;
            }
        }
    };
    // The next stage of this warp's weights (stage is of row group ig, the
    // iss-th overall) into slot iss % SM_STAGES; zeros past the view's rows
    // and columns (past the warp's stages: an empty group).
    // Whole (the usual case: every stage's columns and every group's rows
    // inside the view) takes full copies without a test each.
    int iss = 0, is = 0, ig = 0;
    int rdiv = MODE == SMM_SWIGLU ? BR / 2 : BR;
    bool whole = nst > 0 && kend - kb0 - cw0 >= nst * STEP && (rg0 + ng) * rdiv <= w.rows;
    auto issue = [&]() {
        uint8_t *dst = wq + (iss % SM_STAGES) * SM_STAGE_BYTES + lane * 16;
        int col = kb0 + cw0 + is * STEP + t * SC;
        if (whole) {
            if (ig < ng)
#pragma unroll
                for (int j = 0; j < 4; j++) cp_async16(dst + j * 512, rp[j] + cbytes(col), 16);
        } else {
            bool live = ig < ng && nst > 0;
            int n = live ? min(SC, kend - col) : 0;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                bool on = rok[j] && n > 0;
                if (live) cp_async16(dst + j * 512, on ? rp[j] + cbytes(col) : rp[j],
                                     on ? (int)cbytes(n + FP4) : 0);
            }
        }
        cp_async_commit();
        iss++;
        if (++is == nst) {
            is = 0;
            if (++ig < ng) rows(rg0 + ig, true);
        }
    };
    // L2: unit u (slot u % SM_STAGES) is m-tile u % 2 of stage pair u / 2
    // (pair p in slots 2 (p % 2), + 1: pairs per row group are even).
    // Lane l copies rows 4c + l / 8 (c = 0..3) of the m-tile, bytes 16 (l %
    // 8) of the pair's 128: slot layout [half of the pair][rows g / g + 8]
    // [g][t] x 16 bytes as the old stage's, the second half's 64-byte groups
    // swapped (no bank conflict between a line's halves).  up: the lane's
    // first row of each m-tile at its bytes of the warp's first line, ulim
    // its rows inside the view, uldb4 4 rows' bytes; srow: row l's scales
    // from the warp's first column (its m-tile l / 16, row l % 16).  The
    // slots and the ring by shared-window addresses computed once (wsl,
    // ssl, dl: this lane's place in a unit).
    const uint8_t *up[2], *srow = nullptr;
    int ulim[2], uldb4[2], ip = 0, ich = 0;
    bool sok = false;
    const uint32_t wsl = (uint32_t)__cvta_generic_to_shared(wq);
    const uint32_t ssl = (uint32_t)__cvta_generic_to_shared(sring);
    const int hsl = (lane >> 2) & 1;
    const uint32_t dl = hsl * 1024 + (((lane >> 3) * 64 + (lane & 3) * 16) ^ (hsl * 64));
    auto rows2 = [&](int rg) {
#pragma unroll
        for (int mt = 0; mt < 2; mt++) {
            const dqw &W = MODE == SMM_SWIGLU && mt ? a.w3 : w;
            int r0 = MODE == SMM_SWIGLU ? rg * (BR / 2) + wm * 16 : rg * BR + wm * 32 + mt * 16;
            ulim[mt] = max(0, min(16, W.rows - r0));
            uldb4[mt] = 4 * (int)cbytes(W.ld);
            long long rr = W.r0 + min(r0 + (lane >> 3), W.rows - 1);
            up[mt] = W.data + e * W.estride + cbytes(rr * W.ld + W.c0 + kb0 + cw0) +
                     (lane & 7) * 16;
            if (mt == lane >> 4) {
                int r = r0 + (lane & 15);
                sok = r < W.rows;
                rr = W.r0 + min(r, W.rows - 1);
                srow = W.scale + e * W.sestride + rr * W.sld + ((W.c0 + kb0 + cw0) >> 5);
            }
        }
    };
    // The next unit, m-tile IMT of pair ip (units alternate m-tiles; the
    // scales of pairs ip and ip + 1 with m-tile 0 of an even pair).
    // whole: every row of every group inside the view (no tests a copy).
    auto issue2 = [&](auto imt) {
        constexpr int IMT = decltype(imt)::value;
        if (ig < ng && nst > 0) {
            uint32_t dst = wsl + ((ip & 1) * 2 + IMT) * SM_STAGE_BYTES + dl;
            const uint8_t *src = up[IMT] + ip * 128;
            if (whole) {
#pragma unroll
                for (int c = 0; c < 4; c++)
                    cp_async16s(dst + (c >> 1) * 512 + (c & 1) * 256, src + c * uldb4[IMT]);
            } else {
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    bool on = c * 4 + (lane >> 3) < ulim[IMT];
                    cp_async16s(dst + (c >> 1) * 512 + (c & 1) * 256,
                                on ? src + c * uldb4[IMT] : src, on ? 16 : 0);
                }
            }
            if (IMT == 0 && (ip & 1) == 0) {
                cp_async16s(ssl + (ich & 1) * 512 + lane * 16, sok ? srow + ip * 8 : srow,
                            sok ? 16 : 0);
                ich++;
            }
        }
        cp_async_commit();
        if (IMT == 1 && ++ip == nst / 2) {
            ip = 0;
            if (++ig < ng) rows2(rg0 + ig);
        }
    };
    using I0 = std::integral_constant<int, 0>;
    using I1 = std::integral_constant<int, 1>;
    int ntok = a.T;
    if (MODE == SMM_DENSE) {
        // The weights depend on no earlier kernel: on their way before the wait.
        rows(rg0, true);
        rows(rg0, false);
        for (int s = 0; s < SM_STAGES - 1; s++) issue();
        pdl_wait();
        int i = threadIdx.x;
        if (i < TP) xrow[i] = yrow[i] = i < a.T ? i : -1;
    } else {
        pdl_wait();     // the tile table is moe_sort's
        int nt = *a.ntiles;
        int4 tl = a.tiles[blockIdx.z];      // read with the count (max_tiles of them)
        if ((int)blockIdx.z >= nt) return;  // the whole cluster (same z)
        ntok = tl.z, e = tl.x;
        if constexpr (L2) {
            rows2(rg0);
            issue2(I0()), issue2(I1()), issue2(I0());
        } else {
            rows(rg0, true);
            rows(rg0, false);
            for (int s = 0; s < SM_STAGES - 1; s++) issue();
        }
        if (threadIdx.x < TP) {
            int i = threadIdx.x, s = tl.y + i;
            xrow[i] = i >= tl.z ? -1 : a.xdiv ? a.perm[s] / a.xdiv : s;
            yrow[i] = i >= tl.z ? -1 : a.scatter ? a.perm[s] : s;
        }
    }
    __syncthreads();

    // x: the ntok real tokens x the block's columns as float4 chunks, a
    // warp a token (zeros past the columns), then each 8 columns' 2 chunks
    // split in place: hi in the first, lo in the second (unsplit: the
    // first only).  The padding tokens' rows [ntok, xr) stay as they are:
    // an mma's column of sums reads only its own token's row, and those
    // columns are neither stored nor sent.  (Expert tiles at 64 tokens
    // hold about 2 real tokens of 8; in run M1's ncu profile a third of
    // the w1 / w3 kernel's instructions ran outside its stage loop: x
    // staged and partial sums sent for all 8 tokens, with divisions.)
    int nc = a.Kb / 4;
    for (int tok = warp; tok < ntok; tok += SM_THREADS / 32) {
        int xr = xrow[tok];
        const float *xt = a.x + (long long)xr * a.ldx;
        for (int c = lane; c < nc; c += 32) {
            int col = kb0 + 4 * c, n = min(4, w.cols - col);
            uint8_t *dst = xs + (size_t)tok * a.xst + xpos(c) * 16;
            const float *src = xt + (n > 0 ? col : 0);
            if (a.x16) {
                cp_async16(dst, src, n > 0 ? n * 4 : 0);
            } else {
                float *d = (float *)dst;
                for (int e = 0; e < 4; e++) d[e] = e < n ? src[e] : 0.0f;
            }
        }
    }
    cp_async_commit();
    cp_async_wait<0>();     // x and the first weight stages (this thread's copies)
    __syncthreads();
    for (int i = threadIdx.x; i < ntok * nc / 2; i += SM_THREADS) {
        int tok = i / (nc / 2), q = i - tok * (nc / 2);
        uint4 *p0 = (uint4 *)(xs + (size_t)tok * a.xst + xpos(2 * q) * 16);
        uint4 *p1 = (uint4 *)(xs + (size_t)tok * a.xst + xpos(2 * q + 1) * 16);
        split_x8<QT, SPLIT>(p0, p1);
    }
    __syncthreads();

    float acc[2][NT][4] = {};
    // Block scales (FP8 per 128 x 128, MXFP4 per row and 32 columns) of the
    // next stage (ss of row group sg), one stage ahead of their use.
    uint32_t scn[4] = { 127, 127, 127, 127 };
    int ss = 0, sg = 0;
    auto scales = [&](uint32_t (&sc)[4]) {
        int col = kb0 + cw0 + ss * STEP + t * SC;
        if (QT != QT_BF16 && sg < ng && nst > 0 && col < w.cols) {  // past the view: zeros
            int cb = (w.c0 + col) >> (FP4 ? 5 : 7);
#pragma unroll
            for (int j = 0; j < 4; j++) sc[j] = sp[j][cb];
        }
        if (++ss == nst) {
            ss = 0;
            if (++sg < ng) rows(rg0 + sg, false);
        }
    };
    if (!L2) scales(scn);
    // Token g of n-tile 0, the lane's first chunk (xpos: its stage's
    // chunks are units 0 .. SC / 4 - 1 from there, the next stage's XSTEP
    // bytes further; cw0 is a multiple of 64 columns).
    constexpr int XSTEP = STEP / 32 * 9 * 16;
    const int xg = MODE == SMM_DENSE ? g : g & (a.xr - 1);
    const uint8_t *xt = xs + (size_t)xg * a.xst +
                        xpos(cw0 / 4 + t * SC / 4) * 16;
    // Expert tiles whose warps own whole sums (one block along the
    // columns, one warp along them): each row group's outputs stored
    // from the registers, no block-wide end.
    bool direct = MODE != SMM_DENSE && gridDim.y == 1 && WM == 8;
    int cs = 0;     // stages consumed
    // One FP4 stage's products from the lane's copies u (rows g, g + 8 of
    // m-tile 0, then of m-tile 1) and their scale bytes sb; read() once
    // every lane has read the stage's slot (h = 0 used all four copies).
    // Word h of rows g, g + 8 gives k steps 2h (columns 0-1, 4-5 of the
    // word's 8) and 2h + 1 (2-3, 6-7): decoded and multiplied word by word
    // (16 registers of A at a time, not the stage's 64).  The multiplier of
    // a scale up to 128 is one bf16 pair; a stage of the warp with a larger
    // one (rare: a warp-wide test) takes fp4_mults' two multiplies.
    auto fp4_stage = [&](const uint4(&u)[4], const uint32_t(&sb)[4], const uint8_t *xq,
                         auto read) {
        uint32_t mm[4], m2[4];
        bool big = false;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            big |= sb[j] > 128;
            mm[j] = ((sb[j] + 126) << 7) * 0x10001u;
        }
        big = __any_sync(0xffffffffu, big);
        if (big)
#pragma unroll
            for (int j = 0; j < 4; j++) fp4_mults(sb[j], mm[j], m2[j]);
#pragma unroll
        for (int h = 0; h < 4; h++) {
            uint32_t A[2][2][4];
#pragma unroll
            for (int m = 0; m < 2; m++) {
                uint32_t p[4], q[4];
                fp4x8_bf16x2(word(u[2 * m], h), mm[2 * m], p);
                fp4x8_bf16x2(word(u[2 * m + 1], h), mm[2 * m + 1], q);
                if (big)
#pragma unroll
                    for (int j = 0; j < 4; j++)
                        p[j] = mul_bf16x2(p[j], m2[2 * m]), q[j] = mul_bf16x2(q[j], m2[2 * m + 1]);
#pragma unroll
                for (int k = 0; k < 2; k++) {
                    A[k][m][0] = p[2 * k];
                    A[k][m][1] = q[2 * k];
                    A[k][m][2] = p[2 * k + 1];
                    A[k][m][3] = q[2 * k + 1];
                }
            }
            if (h == 0) read();
#pragma unroll
            for (int part = 0; part < (SPLIT ? 2 : 1); part++)
                mma_group<NT>(acc, A, xq, a.xst, (2 * h + part) * 16);
        }
    };
    // L2: the lane's offsets in a stage's half of a slot (hs: the pair's
    // first or second stage) and its scale bytes' in the ring's chunk: row
    // (j / 2) 16 + (j % 2) 8 + g, block t of each stage's 4.
    const int lo[2] = { lane * 16, 1024 + ((lane * 16) ^ 64) };
    const int sro = (int)(sring - sm_sh) + g * 16 + t;
    const int wso = (int)(wq - sm_sh);
    for (int i = 0; i < ng; i++) {
    if constexpr (L2) {
        // A stage pair at a time (its units' slots and the halves' offsets
        // fixed): both its units landed (one unit issued after them may
        // fly), the warp's lanes having copied each other's bytes.
        for (int s = 0; s < nst; s += 2, cs += 2) {
            cp_async_wait<1>();
            __syncwarp();
            int pw = wso + ((cs >> 1) & 1) * 2 * SM_STAGE_BYTES;
            int sr = sro + ((cs >> 2) & 1) * 512 + ((cs >> 1) & 1) * 8;
#pragma unroll
            for (int hs = 0; hs < 2; hs++) {
                uint4 u[4];
                uint32_t sb[4];
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    u[j] = *(const uint4 *)(sm_sh + pw + (j >> 1) * SM_STAGE_BYTES + (j & 1) * 512 +
                                            lo[hs]);
                    sb[j] = sm_sh[sr + hs * 4 + ((j >> 1) * 16 + (j & 1) * 8) * 16];
                }
                // the unit after the next ones: m-tile 1 of the next pair
                // into the slot read two stages ago; then m-tile 0 of the
                // pair after into this pair's first slot
                fp4_stage(u, sb, xt + (s + hs) * XSTEP, [&] {
                    __syncwarp();
                    if (hs == 0) issue2(I1());
                    else issue2(I0());
                });
            }
        }
    } else {
    for (int s = 0; s < nst; s++, cs++) {
        uint4 u[4];
        uint32_t sb[4];     // the stage's scale bytes (MXFP4), as floats (FP8)
        float sc[4];
        cp_async_wait<SM_STAGES - 2>();
        const uint8_t *src = wq + (cs % SM_STAGES) * SM_STAGE_BYTES + lane * 16;
#pragma unroll
        for (int j = 0; j < 4; j++) u[j] = *(const uint4 *)(src + j * 512);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            sb[j] = scn[j];
            if constexpr (!FP4) sc[j] = e8m0f(scn[j]);
        }
        scales(scn);
        if constexpr (FP4) {
            // The slot is read: the stage after the next ones there.
            fp4_stage(u, sb, xt + s * XSTEP, [&] { issue(); });
        } else {
            // A fragments of the stage's k steps: [step][m-tile][4]
            uint32_t A[KSTEPS][2][4];
            frag_a<QT>(u, sc, A);
            // The slot is read (A came from it): the stage after the next ones there.
            issue();
            // The lane's 8-column groups of the stage (FP8 two, BF16
            // one): part p of group h at unit 2 h + p.
            mma_stage_at<QT, NT, SPLIT, KSTEPS, SC>(acc, A, xt + s * XSTEP, a.xst,
                                                    [](int h, int p) { return (2 * h + p) * 16; });
        }
    }
    }
    if (direct) {
        int rg = rg0 + i;
        each_sum<NT>([&](int m, int n, int q, int r, int tok) {
            int orow = MODE == SMM_SWIGLU ? rg * (BR / 2) + wm * 16 + r : rg * BR + wm * 32 + r;
            if ((MODE != SMM_SWIGLU || m == 0) && tok < ntok && orow < w.rows)
                a.y[(long long)yrow[tok] * a.ldy + orow] =
                    MODE == SMM_SWIGLU ? swiglu1(acc[0][n][q], acc[1][n][q], a.limit)
                                       : acc[m][n][q];
        });
        each_sum<NT>([&](int m, int n, int q, int, int) { acc[m][n][q] = 0; });
    }
    }
    cp_async_wait<0>();     // no copy lands in what becomes the partial sums
    if (direct) return;
    // Every block of the cluster is past its loop: its x and weight stages
    // are free for the partial sums and what the others send.
    cg::cluster_group cl = cg::this_cluster();
    cl.sync();

    // The warps' partial sums, added over the warps and pushed to the
    // blocks that own them (smm.cuh) ...
    constexpr int PL = TP + 1;
    float *part = (float *)sm_sh;
    store_partials<NT>(part, acc, wm, wk, BR);
    __syncthreads();
    int KS = (int)cl.num_blocks(), q = (int)cl.block_rank(), per = BR * TP / KS;
    float *recv = part + (size_t)8 * 32 * PL;
    push_partials<NT>(cl, part, recv, BR, WK, BR * ntok, per);
    cl.sync();
    // ... then each block adds its share over the ranks, in rank order
    // (SMM_SWIGLU: a w1 row r of a warp's 32 with its w3 row r + 16, in
    // the same share: per is a multiple of 32).
    for (int i = threadIdx.x; i < per; i += SM_THREADS) {
        int e = q * per + i, tok = e / BR, r = e - tok * BR;
        if (tok >= ntok) break;     // (not sent: push_partials' real tokens only)
        if (MODE == SMM_SWIGLU && (r & 16)) continue;
        float v = 0, v3 = 0;
        for (int p = 0; p < KS; p++) v += recv[p * per + i];
        if (MODE == SMM_SWIGLU)
            for (int p = 0; p < KS; p++) v3 += recv[p * per + i + 16];
        int orow = MODE == SMM_SWIGLU ? rg0 * (BR / 2) + (r >> 5) * 16 + (r & 15) : rg0 * BR + r;
        if (orow < w.rows)
            a.y[(long long)yrow[tok] * a.ldy + orow] =
                MODE == SMM_SWIGLU ? swiglu1(v, v3, a.limit) : v;
    }
}

struct smm_plan {
    int WM, KS, Kb;         // smm_args' own, and the cluster's blocks along the columns
    long long blocks;       // per tile
    size_t smem;
};

// The plan: rows per block (32 WM) and the cluster's blocks along the
// columns (KS), staged x within xmax bytes; the most rows per block (x
// staged and split once for them) whose grid (ntile tiles) still fills
// 7/8 of the SMs, else the largest grid.  false: no plan fits.
static bool smm_plan_for(int qt, int rows, int cols, int TP, int xr, long long ntile,
                         long long xmax, smm_plan *p, size_t extra = 0)
{
    int nsm = cu_sm_count();
    int step = qt == QT_FP8 ? 64 : qt == QT_MXFP4 ? 128 : 32;   // columns per warp stage
    long long best = -1;
    for (int WM = 8; WM >= 1 && best * ntile < nsm * 7 / 8; WM /= 2)
        for (int KS = 1; KS <= 8; KS *= 2) {
            int gran = (step > 64 ? step : 64) * (8 / WM);
            int Kb = ((cols + KS - 1) / KS + gran - 1) / gran * gran;
            if ((KS > 1 && (long long)(KS - 1) * Kb >= cols) ||
                (long long)xr * smm_xst(qt, Kb) > xmax)
                continue;
            long long blocks = (long long)(rows + 32 * WM - 1) / (32 * WM) * KS;
            if (blocks > best) best = blocks, p->WM = WM, p->KS = KS, p->Kb = Kb;
            if (blocks * ntile >= nsm * 7 / 8) break;
        }
    if (best < 0) return false;
    p->blocks = best;
    p->smem = (size_t)xr * smm_xst(qt, p->Kb) + 8 * SM_STAGES * SM_STAGE_BYTES + extra;
    size_t psum = (size_t)8 * 32 * (TP + 1) * 4 + (size_t)32 * p->WM * TP * 4;   // part, recv
    if (p->smem < psum) p->smem = psum;
    return true;
}

bool cu_matmul_mma(cudaStream_t st, const dqw &w, const float *x, int ldx, int T, float *y,
                   int ldy, bool split, bool measured)
{
    int TP = (T + 15) / 16 * 16;
    if (!dense_view_ok(w, T) || (!split && TP != 64)) return false;
    smm_args a = {};
    a.w = w, a.x = x, a.ldx = ldx, a.T = T, a.y = y, a.ldy = ldy, a.R = 1;
    a.x16 = (uintptr_t)x % 16 == 0 && ldx % 4 == 0;
    smm_plan p;
    // Run SM2 (docs/PERFORMANCE.md, rank6 shapes): 1.3-3.6x faster than
    // the GEMV in chunks of 8 at 16 and 32 tokens wherever a block has 256+
    // columns; 0.85x for 4096 x 1024 (blocks of 128 columns over a cluster
    // of 8); at 64 tokens 0.4-0.7x of cuBLASLt (the head: 785 GB/s, 100
    // TFLOP/s of bf16 products, far from either ceiling: not yet explained).
    if (!smm_plan_for(w.type, w.rows, w.cols, TP, TP, 1, SM_XMAX, &p) ||
        (measured && (TP > 32 || p.Kb < 256)))
        return false;
    a.WM = p.WM, a.Kb = p.Kb, a.xst = smm_xst(w.type, p.Kb), a.xr = TP;
    dim3 grid((unsigned)p.blocks / p.KS, p.KS);
#define SMM(Q, N, S)                                                                             \
    do {                                                                                         \
        smem_attr<Q * 64 + N * 2 + S>(smm_kernel<Q, N, S, SMM_DENSE>, p.smem);                   \
        return smm_started(cu_launch_cluster(smm_kernel<Q, N, S, SMM_DENSE>, grid, SM_THREADS,   \
                                             p.smem, st, dim3(1, p.KS), a));                              \
    } while (0)
    if (w.type == QT_FP8) {
        if (!split) SMM(QT_FP8, 8, false);
        if (TP == 16) SMM(QT_FP8, 2, true);
        if (TP == 32) SMM(QT_FP8, 4, true);
        if (TP == 48) SMM(QT_FP8, 6, true);
        SMM(QT_FP8, 8, true);
    } else {
        if (!split) SMM(QT_BF16, 8, false);
        if (TP == 16) SMM(QT_BF16, 2, true);
        if (TP == 32) SMM(QT_BF16, 4, true);
        if (TP == 48) SMM(QT_BF16, 6, true);
        SMM(QT_BF16, 8, true);
    }
#undef SMM
}

// MXFP4 views whose rows start on 32-column boundaries (16-byte copies of
// whole scale blocks).
static bool fp4_view_ok(const dqw &w)
{
    return w.type == QT_MXFP4 && w.rows > 0 && w.cols > 0 && w.c0 % 32 == 0 && w.ld % 32 == 0 &&
           (uintptr_t)w.data % 16 == 0 && w.estride % 16 == 0;
}

// L2's copies: every warp's columns start and end on 512-column boundaries
// (its stages in whole pairs and its scale chunks in whole 16 bytes), the
// scale rows 16-byte aligned.
static bool smm_l2_ok(const dqw &w, const smm_plan &p)
{
    int Kw = p.Kb / (8 / p.WM);
    return w.cols % 512 == 0 && w.c0 % 512 == 0 && Kw % 512 == 0 && w.sld % 16 == 0 &&
           w.sestride % 16 == 0 && (uintptr_t)w.scale % 16 == 0;
}

bool cu_moe_tiles_mma(cudaStream_t st, const dqw &w, const dqw *w3, const int4 *tiles,
                      const int *ntiles, int max_tiles, int tile_m, int est_tiles, const int *perm,
                      bool scatter, const float *x, int ldx, int xdiv, float limit, float *y,
                      int ldy, bool split, int per_sm, bool l2)
{
    if (!fp4_view_ok(w) || (w3 && (!fp4_view_ok(*w3) || w3->rows != w.rows ||
                                   w3->cols != w.cols)) ||
        tile_m < 1 || tile_m > 8 || max_tiles > 65535)
        return false;
    if (max_tiles <= 0) return true;
    smm_args a = {};
    a.w = w, a.x = x, a.ldx = ldx, a.T = 0, a.y = y, a.ldy = ldy;
    a.x16 = (uintptr_t)x % 16 == 0 && ldx % 4 == 0;
    if (w3) a.w3 = *w3;
    a.tiles = tiles, a.ntiles = ntiles, a.perm = perm, a.xdiv = xdiv, a.scatter = scatter;
    a.limit = limit;
    smm_plan p;
    // per_sm 2: two blocks an SM (128 registers; x within SM_XMAX2 beside
    // the 64 KB of weight stages), 16 warps to hide the decode's and the
    // mma's latencies (w1 and w3 of 4096 columns then take clusters of 4
    // blocks for tiles of 8 slots, of 2 for tiles of 4: x staged in 4 rows,
    // the mma's tokens g and g + 4 reading one, the upper four's sums
    // never stored; a warp's stages doubled for the same prologue and end:
    // runs G3-G4 on an H100, B = 64 4.84-4.91 -> 4.77 ms, B = 32 3.75 ->
    // 3.65); 1: one, x of up to SM_XMAX (every column in one block).
    int vrows = w3 ? 2 * w.rows : w.rows, est = est_tiles < 1 ? 1 : est_tiles;
    int xr = tile_m <= 4 ? 4 : 8;
    // l2: the warps' scale rings beside x and the stages (x that much
    // smaller), where the plan's views allow; else the 64-byte copies.
    long long xmax = per_sm == 1 ? SM_XMAX : SM_XMAX2;
    const size_t ring = 8 * SM_SRING_BYTES;
    l2 = l2 && split && smm_plan_for(QT_MXFP4, vrows, w.cols, 8, xr, est, xmax - ring, &p, ring) &&
         smm_l2_ok(w, p) && (!w3 || smm_l2_ok(*w3, p));
    if (!l2 && !smm_plan_for(QT_MXFP4, vrows, w.cols, 8, xr, est, xmax, &p)) return false;
    a.WM = p.WM, a.Kb = p.Kb, a.xst = smm_xst(QT_MXFP4, p.Kb), a.xr = xr;
    // Warps that own whole sums stream R row groups of 256 rows through
    // one pipeline (x staged once, no block-wide end between them): R such
    // that the grid still makes about 4 waves of the expected tiles.
    a.nrg = (vrows + 32 * p.WM - 1) / (32 * p.WM);
    a.R = 1;
    if (p.KS == 1 && p.WM == 8) {
        long long r = (long long)a.nrg * est / (4LL * per_sm * cu_sm_count());
        a.R = r < 1 ? 1 : r > a.nrg ? a.nrg : (int)r;
    }
    dim3 grid((unsigned)((a.nrg + a.R - 1) / a.R), p.KS, max_tiles);
#define SMT(S, M, L)                                                                             \
    do {                                                                                         \
        smem_attr<1000 + L * 8 + M * 2 + S>(smm_kernel<QT_MXFP4, 1, S, M, L>, p.smem);           \
        return smm_started(cu_launch_cluster(smm_kernel<QT_MXFP4, 1, S, M, L>, grid, SM_THREADS, \
                                             p.smem, st, dim3(1, p.KS), a));                     \
    } while (0)
    if (w3 && l2) SMT(true, SMM_SWIGLU, true);
    if (w3 && split) SMT(true, SMM_SWIGLU, false);
    if (w3) SMT(false, SMM_SWIGLU, false);
    if (l2) SMT(true, SMM_TILES, true);
    if (split) SMT(true, SMM_TILES, false);
    SMT(false, SMM_TILES, false);
#undef SMT
}
