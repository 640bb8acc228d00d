// wgmma with A in registers and B a K-major bf16 (or e4m3) tile in
// shared memory (sm_90a): matmul_wgmma.cu's decode-batch matmuls,
// indexer_mma.cu's scores.
#pragma once

#include <stdint.h>

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// wgmma's descriptor of a K-major bf16 tile in the 128-byte swizzle (rows
// of 128 bytes, 16-byte chunk c of row r at c ^ (r & 7), 8-row groups
// 1024 bytes apart, 1024-byte aligned); k step s starts 32 s bytes on.
__device__ __forceinline__ uint64_t swm_desc(uint32_t addr)
{
    return (uint64_t)((addr & 0x3ffff) >> 4) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 |
           (uint64_t)1 << 62;
}

#define SW_R8(i)                                                                              \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]),                \
        "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define SW_S8(a, b, c, e, f, g, h, i)                                                         \
    "%" #a ", %" #b ", %" #c ", %" #e ", %" #f ", %" #g ", %" #h ", %" #i

// d = A . B + (acc ? d : 0) for A 64 x 16 bf16 in registers (the mma
// fragment layout per warp) and B NP x 16 bf16 at descriptor db (K-major).
template <int NP>
__device__ __forceinline__ void swm_wgmma(float *d, const uint32_t (&a)[4], uint64_t db,
                                          int acc = 1);

template <>
__device__ __forceinline__ void swm_wgmma<64>(float *d, const uint32_t (&a)[4], uint64_t db,
                                              int acc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{" SW_S8(0, 1, 2, 3, 4, 5, 6, 7) ", " SW_S8(8, 9, 10, 11, 12, 13, 14, 15) ", "
                 SW_S8(16, 17, 18, 19, 20, 21, 22, 23) ", "
                 SW_S8(24, 25, 26, 27, 28, 29, 30, 31) "}, "
                 "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
                 : SW_R8(0), SW_R8(8), SW_R8(16), SW_R8(24)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}

template <>
__device__ __forceinline__ void swm_wgmma<128>(float *d, const uint32_t (&a)[4], uint64_t db,
                                               int acc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{" SW_S8(0, 1, 2, 3, 4, 5, 6, 7) ", " SW_S8(8, 9, 10, 11, 12, 13, 14, 15) ", "
                 SW_S8(16, 17, 18, 19, 20, 21, 22, 23) ", "
                 SW_S8(24, 25, 26, 27, 28, 29, 30, 31) ", "
                 SW_S8(32, 33, 34, 35, 36, 37, 38, 39) ", "
                 SW_S8(40, 41, 42, 43, 44, 45, 46, 47) ", "
                 SW_S8(48, 49, 50, 51, 52, 53, 54, 55) ", "
                 SW_S8(56, 57, 58, 59, 60, 61, 62, 63) "}, "
                 "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
                 : SW_R8(0), SW_R8(8), SW_R8(16), SW_R8(24), SW_R8(32), SW_R8(40), SW_R8(48),
                   SW_R8(56)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}
// d = A . B + (acc ? d : 0) for A 64 x 32 e4m3 in registers (the same
// bytes of a row a thread holds as swm_wgmma's bf16 fragment: 4 codes a
// register) and B 64 x 32 e4m3 at descriptor db (K-major, as FP8 must be).
__device__ __forceinline__ void swm_wgmma_e4m3_64(float *d, const uint32_t (&a)[4], uint64_t db,
                                                  int acc = 1)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
                 "{" SW_S8(0, 1, 2, 3, 4, 5, 6, 7) ", " SW_S8(8, 9, 10, 11, 12, 13, 14, 15) ", "
                 SW_S8(16, 17, 18, 19, 20, 21, 22, 23) ", "
                 SW_S8(24, 25, 26, 27, 28, 29, 30, 31) "}, "
                 "{%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
                 : SW_R8(0), SW_R8(8), SW_R8(16), SW_R8(24)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}
#undef SW_R8
#undef SW_S8

// The compiler must keep the accumulators where wgmma left them.
template <int N> __device__ __forceinline__ void swm_pin(float (&d)[N])
{
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}

// mbarriers (shared::cta): arrive releases this thread's earlier writes,
// wait acquires those of a completed phase of the given parity.
__device__ __forceinline__ void swm_bar_init(uint32_t bar, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void swm_bar_arrive(uint32_t bar)
{
    asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// An arrival that also makes the phase wait for `bytes` more to land
// (swm_bulk_load's).
__device__ __forceinline__ void swm_bar_expect(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
                 "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void swm_bar_wait(uint32_t bar, uint32_t parity)
{
    uint32_t ok;
    do {
        asm volatile("{\n.reg .pred p;\n"
                     "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(ok)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!ok);
}

// bytes (a multiple of 16; both addresses 16-byte aligned) from global
// memory to shared memory by the copy engine, counted on bar as they land:
// one thread's instruction for what a block's cp.async loop would move.
__device__ __forceinline__ void swm_bulk_load(uint32_t dst, const void *src, uint32_t bytes,
                                              uint32_t bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
                 "[%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
#endif
