// The routed experts' grouped GEMMs of the fp8 mode (moe_gemm_fp8.cu):
// MXFP4 weights times act_quant's FP8 codes on Hopper's FP8 tensor cores
// (wgmma).  A header of its own so that only its two users recompile.
#pragma once

#include "kernels.cuh"

// The grouped GEMM of moe_gemm.cu (weights, tiles, slot mapping, output;
// g.x is not read) with x given as act_quant's codes: xq [rows][ldq]
// e4m3 and per 128 columns the scale xs[kb * xs_ld + row] (as
// cu_act_quant_fp8 writes them for xs_ld rows).
struct dmoe_gemm8 {
    dmoe_gemm g;
    const uint8_t *xq;
    const float *xs;
    int ldq, xs_ld;
};

// Whether cu_moe_gemm_fp8 takes these weights: MXFP4 views that start on
// a scale block (c0 and ld multiples of 32, 16-byte aligned experts), a
// width that is a positive multiple of 16 whose scale rows fit in shared
// memory (up to ~7,800 columns), w1 and w3 of one shape.
bool cu_moe_gemm_fp8_ok(const dmoe_gemm &g);

// Slots per tile of moe_sort's table for cu_moe_gemm_fp8 (two wgmma M's).
#define CU_TILE_M8 128

// y = x8 . W^T (or SwiGLU of w1 and w3) over moe_sort's tiles of CU_TILE_M8
// slots (a persistent grid: any number of tiles); the codes' rows 16-byte
// aligned (ldq a multiple of 16).  false: not taken (cu_moe_gemm_fp8_ok or
// the codes' alignment), nothing launched.
bool cu_moe_gemm_fp8(cudaStream_t st, const dmoe_gemm8 &a, int max_tiles);
