// The routed experts' GEMMs of prefill steps under the fp8 mode (W4A8) on
// Hopper's FP8 tensor cores: wgmma m64n128k32, A = act_quant's e4m3 codes
// of x (DeepSeek's per-token 1x128 groups), B = the MXFP4 weights
// re-encoded as e5m2, float32 accumulation.  Same tiles, slot mapping and
// outputs as moe_gemm.cu (w1 and w3 with SwiGLU; w2 scattered back).
//
// Numerics.  An E2M1 code times its block's 2^e is exact in e5m2 when the
// block's exponent lies within 26 binades of its row's: each weight row
// gets the base b = (largest e of the row) - 13, a block with r = e - b
// in [-13, 13] is re-encoded exactly (|E2M1| <= 6 = 1.5 * 2^2, so
// 6 * 2^13 < e5m2's 57344 and 0.5 * 2^-13 = 2^-14 its smallest normal),
// and 2^(b - 127) multiplies the row's sums once at the end.  A block
// more than 2^26 below its row's largest is flushed to zero (never on
// checkpoints' weights; |change| < 2^-26 of the row's largest weight).
// The products x8 * w5 are exact; the tensor cores sum one 128-column
// group (four k32 steps, the scale group of x) with their limited
// running precision (about 14 bits: DeepSeek-V3 report 3.3.2, the same
// as cuBLASLt's block-scaled FP8 GEMMs of this mode), and each group's
// sum times x's scale of that group is added in float32 (promotion every
// 128 columns, as DeepGEMM does).
//
// Work: items of one tile of moe_sort's table (up to 128 slots of one
// expert, CU_TILE_M8) x 128 weight rows (fused: 64 outputs, their w1 and
// w3 rows), K in stages of 128 columns.  A persistent block per SM takes
// the items in turn (tile-major: the blocks running together share
// experts), warp-specialized (the shape DeepGEMM and CUTLASS use on
// Hopper) because the re-encoding of the weights is integer work that,
// done by the threads issuing wgmma, left the tensor cores idle 3/4 of
// the time (runs S1-S8, docs/GPU_NOTES.md):
//   - 2 producer warpgroups (setmaxnreg 72 registers): per item, the
//     tile's x rows, the 128 rows' scale bytes and each row's base; per
//     stage, x's codes and scales by cp.async (a stage ahead) into a
//     ring of 4 stages
//     (128-byte swizzled, the layout wgmma's descriptors read; zero-filled
//     past the width and the tile's slots), the weights' MXFP4 codes by
//     cp.async 2 stages ahead into a ring of their own, and their
//     re-encoding into the stage; a stage is handed over through an
//     mbarrier (full) as soon as it is whole;
//   - 2 consumer warpgroups (setmaxnreg 184): warpgroup w's wgmma takes
//     the tile's slots 64 w .. 64 w + 63 x all 128 rows (fused: 64 of w1,
//     the same 64 of w3, so SwiGLU pairs sit in one thread's registers),
//     waits, releases the stage (empty), promotes; an item's outputs are
//     stored while the producers fill the next item's stages (rowf, the
//     rows' 2^(b - 127), double-buffered behind a "done" mbarrier).
// The two consumers share one re-encoded B: each weight byte is
// re-encoded once per 128 slots.  A consumer with no slots in a partial
// tile multiplies zeros (wgmma under a data-dependent branch makes ptxas
// serialize every wgmma, warning C7518) and skips the promotion.
#include "moe_gemm_fp8.cuh"
#include "wgmma.cuh"

#define M8_M CU_TILE_M8     // slots per item: 64 (one wgmma's M) per consumer warpgroup
#define M8_N 128            // weight rows per item, shared by the consumers
#define M8_K 128            // columns per stage (one x scale group, 128 bytes)
#define M8_S 4              // stages in the ring
#define M8_D 2              // stages the weights' codes are loaded ahead of their encoding
#define M8_R 4              // the producer's ring of weight codes (> M8_D)
#define M8_PT 256           // producer threads: 2 warpgroups
#define M8_THREADS 512      // the producers, then 2 consumer warpgroups
#define M8_PREG 72          // registers of a producer thread (setmaxnreg), and of a
#define M8_CREG 184         // consumer's: 2 x 128 x (72 + 184) = 65,536
#define M8_A (M8_M * M8_K)              // bytes of x codes per stage
#define M8_STAGE (M8_A + M8_N * M8_K)   // x codes, then the weights' e5m2
#define M8_RAW (M8_N * M8_K / 2)        // MXFP4 codes of a stage's weights
// the ring; the codes' ring; x scales [M8_S][M8_M]; rowf [2][M8_N]; xrow
// [2][M8_M]; the barriers full[M8_S], empty[M8_S], done[2]; then the
// rows' scale bytes [M8_N][m8_nbp(nb)]
#define M8_SMEM0                                                                  \
    (1024 + M8_S * M8_STAGE + M8_R * M8_RAW + (M8_S * M8_M + 2 * M8_N + 2 * M8_M) * 4 + \
     (2 * M8_S + 2) * 8)

// Bytes per row of the scale bytes in shared memory: whole 16-byte chunks,
// an odd number of them (the 8 rows a warp reads at once in 8 banks).
__host__ __device__ inline int m8_nbp(int nb) { return 16 * (((nb + 15) / 16) | 1); }

static_assert(M8_M == 128, "one wgmma of M = 64 per consumer warpgroup");
static_assert(M8_R > M8_D, "a code slot is refilled after its stage is encoded");

// Shared memory of a block for weights of cols columns.
static size_t m8_smem_bytes(int cols)
{
    return M8_SMEM0 + (size_t)M8_N * m8_nbp((cols + 31) / 32);
}

bool cu_moe_gemm_fp8_ok(const dmoe_gemm &g)
{
    auto ok = [](const dqw &w) {
        return w.type == QT_MXFP4 && w.c0 % 32 == 0 && w.ld % 32 == 0 &&
               (uintptr_t)w.data % 16 == 0 && w.estride % 16 == 0;
    };
    return ok(g.w1) && g.w1.cols > 0 && g.w1.cols % 16 == 0 &&
           m8_smem_bytes(g.w1.cols) <= 227 * 1024 &&
           (!g.swiglu || (ok(g.w3) && g.w3.rows == g.w1.rows && g.w3.cols == g.w1.cols));
}

// 32 E2M1 codes (16 bytes, element i in nibble i) of a block whose
// exponent is r above its row's base, as 32 e5m2 bytes: the magnitude
// through a byte permute of an 8-entry table of this r (code 1, 0.5, has
// exponent r + 14; codes 2k and 2k + 1, 2^(k-1) and 1.5 * 2^(k-1), have
// r + 14 + k with mantissa 0 or 2), the sign moved from bit 3 of the
// nibble to bit 7 of the byte.
__device__ __forceinline__ void m8_encode(uint4 c, int r, uint4 &o0, uint4 &o1)
{
    uint32_t t0 = 0, t1 = 0;
    if (r >= -13) {
        uint32_t d = (uint32_t)(r + 13) << 2;
        t0 = 0x0A080400u + d * 0x01010100u;     // codes 0-3: 0, 0.5, 1, 1.5
        t1 = 0x12100E0Cu + d * 0x01010101u;     // codes 4-7: 2, 3, 4, 6
    }
    auto enc = [&](uint32_t u, uint32_t &lo, uint32_t &hi) {
        uint32_t m = u & 0x77777777u, a = u << 4;
        lo = __byte_perm(t0, t1, m) | (__byte_perm(a, u, 0x5140) & 0x80808080u);
        hi = __byte_perm(t0, t1, m >> 16) | (__byte_perm(a, u, 0x7362) & 0x80808080u);
    };
    enc(c.x, o0.x, o0.y);
    enc(c.y, o0.z, o0.w);
    enc(c.z, o1.x, o1.y);
    enc(c.w, o1.z, o1.w);
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ uint32_t m8_smem(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void m8_cp16(uint32_t dst, const void *src, bool ok)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(ok ? 16 : 0)
                 : "memory");
}

__device__ __forceinline__ void m8_cp4(uint32_t dst, const void *src, bool ok)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
                 "r"(ok ? 4 : 0)
                 : "memory");
}

#define M8_F8(i)                                                                              \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]),                \
        "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])

// d (+)= A . B^T for A 64 x 32 e4m3 (x) and B 128 x 32 e5m2 (weights),
// both K-major in shared memory; acc = 0: d is overwritten.
__device__ __forceinline__ void m8_wgmma(float (&d)[64], uint64_t da, uint64_t db, int acc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e5m2 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
                 "%64, %65, p, 1, 1;\n}\n"
                 : M8_F8(0), M8_F8(8), M8_F8(16), M8_F8(24), M8_F8(32), M8_F8(40), M8_F8(48),
                   M8_F8(56)
                 : "l"(da), "l"(db), "r"(acc));
}
#undef M8_F8
#endif

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The producers (M8_PT threads: 2 warpgroups).  For each item of a block:
// the tile's x rows, the weight rows' scale bytes (cp.async) and from them
// each row's base; then per stage x's codes and scales by cp.async a
// stage ahead into the ring, the weights' MXFP4 codes by cp.async M8_D
// stages ahead into a ring of their own, and their re-encoding into the
// stage (the loads in flight while it encodes: the encode never waits for
// memory).  A stage is handed over (full) as soon as it is encoded, so
// that the consumers have up to 3 stages ready, not 2.
template <bool SWIGLU>
__device__ __forceinline__ void m8_produce(const dmoe_gemm8 &a, int ncb, int nitems, uint8_t *sh,
                                           float *sxs, float *rowf, int *xrow, uint8_t *wsc,
                                           int nbp, uint32_t full0, uint32_t empty0,
                                           uint32_t done0)
{
    const dmoe_gemm &G = a.g;
    int tid = threadIdx.x, q = tid & 3, pr = tid >> 2, c8 = tid & 7, r8 = tid >> 3;
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(M8_PREG));
    int cols = G.w1.cols, nrows = G.w1.rows, nb = (cols + 31) / 32, nk = (cols + M8_K - 1) / M8_K;
    uint32_t sbase = m8_smem(sh), sx0 = m8_smem(sxs), raw0 = sbase + M8_S * M8_STAGE,
             wsc0 = m8_smem(wsc);
    // x chunk v of a stage: row r8 + 32 v, 16-byte chunk c8 (swizzled by
    // the row's low 3 bits, the same for every v)
    uint32_t adst = r8 * 128 + ((c8 ^ (r8 & 7)) << 4);
    unsigned g = 0;     // stages produced by this block
    auto commit = [] { asm volatile("cp.async.commit_group;\n" ::: "memory"); };
    int4 tl = nitems > (int)blockIdx.x ? G.tiles[blockIdx.x / ncb] : make_int4(0, 0, 0, 0);
    for (int item = blockIdx.x, it = 0; item < nitems; item += gridDim.x, it++) {
        // every producer is past the last item's encoding (wsc is reused)
        asm volatile("bar.sync 1, %0;\n" ::"n"(M8_PT) : "memory");
        int tile = item / ncb, next = item + gridDim.x;
        int4 tln = next < nitems ? G.tiles[next / ncb] : tl;     // in flight over this item
        int n0 = (item - tile * ncb) * (SWIGLU ? M8_N / 2 : M8_N);
        // B row br: fused, w1's row n0 + br for br < 64, then w3's
        auto srow = [&](int br, bool &ok) {
            int wr = n0 + (SWIGLU ? (br & 63) : br);
            const dqw *W = SWIGLU && br >= 64 ? &G.w3 : &G.w1;
            ok = wr < nrows;
            return W->scale + tl.x * W->sestride + (W->r0 + (ok ? wr : 0)) * W->sld + W->c0 / 32;
        };
        // The 128 rows' scale bytes, [br][nbp] (16 at a time where the
        // rows allow: G.wvec, set by the launcher).
        if (G.wvec) {
            int n16 = nb / 16;
            for (int u = tid; u < M8_N * n16; u += M8_PT) {
                int br = u / n16, c = u - br * n16;
                bool ok;
                const uint8_t *src = srow(br, ok);
                m8_cp16(wsc0 + br * nbp + 16 * c, src + 16 * c, ok);
            }
        } else {
            for (int u = tid; u < M8_N * nb; u += M8_PT) {
                int br = u / nb, j = u - br * nb;
                bool ok;
                const uint8_t *src = srow(br, ok);
                wsc[br * nbp + j] = ok ? src[j] : 0;
            }
        }
        commit();
        // This thread's weight rows: B rows pr + 64 i, block q of each
        // stage (4 threads a row, 16 bytes of codes each), into raw slot
        // (stage % M8_R): [br][64 bytes].
        const uint8_t *crow[2];
        bool rok[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const dqw &W = SWIGLU && i ? G.w3 : G.w1;
            int wr = n0 + pr + (SWIGLU ? 0 : 64 * i);
            rok[i] = wr < nrows;
            long long r = W.r0 + (rok[i] ? wr : 0);
            crow[i] = W.data + tl.x * W.estride + (r * W.ld + W.c0) / 2;
        }
#pragma unroll
        for (int i = 0; i < 2; i++) crow[i] += 16 * q;  // block q of each stage
        unsigned g0 = g;
        auto load_raw = [&](int kt) {
            uint32_t dst = raw0 + ((g0 + kt) % M8_R) * M8_RAW + pr * 64 + q * 16;
            bool jok = 4 * kt + q < nb;
#pragma unroll
            for (int i = 0; i < 2; i++)
                m8_cp16(dst + i * 64 * 64, crow[i] + 64 * kt, rok[i] && jok);
        };
#pragma unroll
        for (int d = 0; d < M8_D; d++) {
            if (d < nk) load_raw(d);
            commit();
        }
        if (tid < M8_M) {
            int s = tl.y + tid;
            xrow[(it & 1) * M8_M + tid] = tid >= tl.z ? -1 : G.xdiv ? G.perm[s] / G.xdiv : s;
        }
        asm volatile("cp.async.wait_group %0;\n" ::"n"(M8_D) : "memory");  // the scale bytes
        asm volatile("bar.sync 1, %0;\n" ::"n"(M8_PT) : "memory");  // every xrow and byte
        // Each row's largest block exponent, over the 4 threads of the row.
        int rbase[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const uint8_t *sr = wsc + (pr + 64 * i) * nbp;
            int mx = 0;
            if (G.wvec) {
                uint32_t m4 = 0;
                for (int j = 16 * q; j < nb; j += 64) {
                    uint4 v = *(const uint4 *)(sr + j);
                    m4 = __vmaxu4(m4, __vmaxu4(__vmaxu4(v.x, v.y), __vmaxu4(v.z, v.w)));
                }
                mx = (int)max(max(m4 & 255, (m4 >> 8) & 255), max((m4 >> 16) & 255, m4 >> 24));
            } else {
                for (int j = q; j < nb; j += 4) mx = max(mx, (int)sr[j]);
            }
            mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            rbase[i] = mx - 13;
        }
        const int *xr = xrow + (it & 1) * M8_M;
        // this thread's x chunks (rows without a slot: xq, not read) and
        // its slot's x scales
        const uint8_t *xp[4];
        unsigned xok = 0;
#pragma unroll
        for (int v = 0; v < 4; v++) {
            int row = xr[r8 + 32 * v];
            xp[v] = a.xq + (row >= 0 ? (long long)row * a.ldq + 16 * c8 : 0);
            xok |= (row >= 0) << v;
        }
        int xsr = tid < M8_M ? xr[tid] : -1;
        const float *xsp = a.xs + (xsr >= 0 ? xsr : 0);
        // rowf[it & 1] is free once the consumers stored item it - 2
        if (it >= 2) swm_bar_wait(done0 + 8 * (it & 1), ((it >> 1) - 1) & 1);
        if (q == 0) {
#pragma unroll
            for (int i = 0; i < 2; i++)
                rowf[(it & 1) * M8_N + pr + 64 * i] = ldexpf(1.0f, rbase[i] - 127);
        }
        // stage kt's x codes and scales into slot gs % M8_S, once free
        auto load_x = [&](int kt, unsigned gs) {
            unsigned s = gs % M8_S;
            if (gs >= M8_S) swm_bar_wait(empty0 + 8 * s, (gs / M8_S - 1) & 1);
            uint32_t A = sbase + s * M8_STAGE;
            unsigned kok = kt * M8_K + 16 * c8 < cols ? xok : 0;
#pragma unroll
            for (int v = 0; v < 4; v++)
                m8_cp16(A + adst + v * 4096, xp[v] + kt * M8_K, kok >> v & 1);
            if (tid < M8_M)
                m8_cp4(sx0 + 4 * (s * M8_M + tid), xsp + (long long)kt * a.xs_ld, xsr >= 0);
        };
        load_x(0, g);
        commit();
        for (int kt = 0; kt < nk; kt++) {
            unsigned s = g % M8_S;
            if (kt + 1 < nk) load_x(kt + 1, g + 1);
            if (kt + M8_D < nk) load_raw(kt + M8_D);
            commit();
            // stage kt's x (a stage ago) and codes (M8_D stages ago) landed
            asm volatile("cp.async.wait_group 1;\n" ::: "memory");
            const uint8_t *rw = sh + M8_S * M8_STAGE + (g % M8_R) * M8_RAW + pr * 64 + q * 16;
            uint8_t *B = sh + s * M8_STAGE + M8_A;
#pragma unroll
            for (int i = 0; i < 2; i++) {
                int br = pr + 64 * i;
                uint4 o0, o1;
                m8_encode(*(const uint4 *)(rw + i * 64 * 64),
                          (int)wsc[br * nbp + 4 * kt + q] - rbase[i], o0, o1);
                uint8_t *row = B + br * 128;
                *(uint4 *)(row + (((2 * q) ^ (br & 7)) << 4)) = o0;
                *(uint4 *)(row + (((2 * q + 1) ^ (br & 7)) << 4)) = o1;
            }
            // the stage to the consumers as soon as it is whole
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            swm_bar_arrive(full0 + 8 * s);
            g++;
        }
        tl = tln;
    }
}

// A consumer warpgroup (cw 0 or 1): the tile's slots 64 cw .. 64 cw + 63
// of each item times all 128 rows, wgmma per stage, promoted with x's
// scale; a stage is released (empty) once its wgmma completed; each
// item's outputs stored while the producer fills the next item's stages.
template <bool SWIGLU>
__device__ __forceinline__ void m8_consume(const dmoe_gemm8 &a, int ncb, int nitems, uint32_t sbase,
                                           const float *sxs, const float *rowf, uint32_t full0,
                                           uint32_t empty0, uint32_t done0)
{
    const dmoe_gemm &G = a.g;
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(M8_CREG));
    int ct = threadIdx.x - M8_PT, cw = ct >> 7, lane = ct & 31, wi = (ct >> 5) & 3;
    int gq = lane >> 2, t4 = lane & 3;
    int nrows = G.w1.rows, nk = (G.w1.cols + M8_K - 1) / M8_K;
    int m0 = 64 * cw + 16 * wi + gq;    // this thread's accumulator slots m0, m0 + 8
    bool v2 = G.ldy % 2 == 0 && (uintptr_t)G.y % 8 == 0 && nrows % 2 == 0;
    float acc[64], P[64];
#pragma unroll
    for (int i = 0; i < 64; i++) P[i] = 0.0f;
    unsigned g = 0;
    for (int item = blockIdx.x, it = 0; item < nitems; item += gridDim.x, it++) {
        int tile = item / ncb;
        int4 tl = G.tiles[tile];
        int n0 = (item - tile * ncb) * (SWIGLU ? M8_N / 2 : M8_N);
        bool busy = 64 * cw < tl.z;     // this warpgroup has slots
#pragma unroll
        for (int i = 0; i < 64; i++) acc[i] = 0.0f;
        for (int kt = 0; kt < nk; kt++, g++) {
            unsigned s = g % M8_S;
            swm_bar_wait(full0 + 8 * s, (g / M8_S) & 1);
            uint32_t A = sbase + s * M8_STAGE + cw * (64 * M8_K), B = sbase + s * M8_STAGE + M8_A;
            uint64_t da = swm_desc(A), db = swm_desc(B);
            swm_pin(P);
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
            for (int kk = 0; kk < 4; kk++) m8_wgmma(P, da + 2 * kk, db + 2 * kk, kk);
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            swm_pin(P);
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            swm_pin(P);
            float s0 = sxs[s * M8_M + m0], s1 = sxs[s * M8_M + m0 + 8];
            swm_bar_arrive(empty0 + 8 * s);
            if (busy) {
#pragma unroll
                for (int j = 0; j < 16; j++) {
                    acc[4 * j] = fmaf(P[4 * j], s0, acc[4 * j]);
                    acc[4 * j + 1] = fmaf(P[4 * j + 1], s0, acc[4 * j + 1]);
                    acc[4 * j + 2] = fmaf(P[4 * j + 2], s1, acc[4 * j + 2]);
                    acc[4 * j + 3] = fmaf(P[4 * j + 3], s1, acc[4 * j + 3]);
                }
            }
        }
        // Accumulator (j, e, h): slot m0 + 8 h, B row 8 j + 2 t4 + e (the
        // wgmma D layout: 4 values per 8 columns); pairs of columns stored
        // together where the output allows.
        const float *rf = rowf + (it & 1) * M8_N;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int m = m0 + 8 * h;
            if (m >= tl.z) continue;
            int s = tl.y + m;
            float *y = G.y + (long long)(G.scatter ? G.perm[s] : s) * G.ldy;
#pragma unroll
            for (int j = 0; j < (SWIGLU ? 8 : 16); j++) {
                int c = 8 * j + 2 * t4, n = n0 + c;
                float v[2];
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    v[e] = acc[4 * j + 2 * h + e] * rf[c + e];
                    if (SWIGLU)
                        v[e] = swiglu1(v[e], acc[4 * (j + 8) + 2 * h + e] * rf[64 + c + e], G.limit);
                }
                if (v2 && n < nrows) {
                    *(float2 *)(y + n) = make_float2(v[0], v[1]);
                } else {
#pragma unroll
                    for (int e = 0; e < 2; e++)
                        if (n + e < nrows) y[n + e] = v[e];
                }
            }
        }
        swm_bar_arrive(done0 + 8 * (it & 1));
    }
}
#endif

// Persistent: a block per SM takes items (tile, 128 weight rows) in turn,
// items tile-major so that the blocks running together share experts.
template <bool SWIGLU>
__global__ void __launch_bounds__(M8_THREADS, 1) moe_gemm8_kernel(dmoe_gemm8 a, int ncb)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    pdl_wait();
    extern __shared__ __align__(1024) uint8_t m8_raw[];
    uint8_t *sh = m8_raw + ((1024 - (m8_smem(m8_raw) & 1023)) & 1023);
    float *sxs = (float *)(sh + M8_S * M8_STAGE + M8_R * M8_RAW);  // [M8_S][M8_M] x scales
    float *rowf = sxs + M8_S * M8_M;               // [2][M8_N] each weight row's 2^(b - 127)
    int *xrow = (int *)(rowf + 2 * M8_N);          // [2][M8_M] each slot's row of x, -1: none
    uint32_t full0 = m8_smem(xrow + 2 * M8_M), empty0 = full0 + 8 * M8_S,
             done0 = empty0 + 8 * M8_S;
    uint8_t *wsc = (uint8_t *)(xrow + 2 * M8_M) + (2 * M8_S + 2) * 8;  // [M8_N][nbp]
    int nbp = m8_nbp((a.g.w1.cols + 31) / 32);
    if (threadIdx.x == 0) {
        for (int s = 0; s < M8_S; s++) {
            swm_bar_init(full0 + 8 * s, M8_PT);
            swm_bar_init(empty0 + 8 * s, 256);
        }
        swm_bar_init(done0, 256);
        swm_bar_init(done0 + 8, 256);
    }
    __syncthreads();
    int nitems = *a.g.ntiles * ncb;
    if (threadIdx.x < M8_PT)
        m8_produce<SWIGLU>(a, ncb, nitems, sh, sxs, rowf, xrow, wsc, nbp, full0, empty0, done0);
    else
        m8_consume<SWIGLU>(a, ncb, nitems, m8_smem(sh), sxs, rowf, full0, empty0, done0);
#elif defined(__CUDA_ARCH__)
    __trap();   // built for sm_90a only (wgmma)
#endif
}

bool cu_moe_gemm_fp8(cudaStream_t st, const dmoe_gemm8 &a, int max_tiles)
{
    if (!cu_moe_gemm_fp8_ok(a.g) || a.ldq % 16 != 0 || (uintptr_t)a.xq % 16 != 0) return false;
    if (a.g.w1.rows <= 0 || max_tiles <= 0) return true;
    int nout = a.g.swiglu ? M8_N / 2 : M8_N, ncb = (a.g.w1.rows + nout - 1) / nout;
    long long items = (long long)max_tiles * ncb;
    int grid = (int)(items < cu_sm_count() ? items : cu_sm_count());
    // wvec: every row's scale bytes start 16-byte aligned and come in 16s
    auto svec = [&](const dqw &w) {
        return (uintptr_t)w.scale % 16 == 0 && w.sld % 16 == 0 && w.sestride % 16 == 0 &&
               (w.c0 / 32) % 16 == 0 && w.cols % 512 == 0;
    };
    dmoe_gemm8 b = a;
    b.g.wvec = svec(a.g.w1) && (!a.g.swiglu || svec(a.g.w3));
    size_t smem = m8_smem_bytes(a.g.w1.cols);
    if (a.g.swiglu) {
        smem_attr<16>(moe_gemm8_kernel<true>, smem);
        cu_launch(moe_gemm8_kernel<true>, dim3(grid), M8_THREADS, smem, st, b, ncb);
    } else {
        smem_attr<17>(moe_gemm8_kernel<false>, smem);
        cu_launch(moe_gemm8_kernel<false>, dim3(grid), M8_THREADS, smem, st, b, ncb);
    }
    return true;
}
