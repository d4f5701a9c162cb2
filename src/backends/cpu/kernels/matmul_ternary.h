// Internal to the CPU matmul kernels: the ternary formats tq1_0 and tq2_0 (w = d * (u - 1) per block of 256, one fp16
// d per block and row) in one interleaved layout (WeightLayout::ROWS_X8) and their kernels' entry points
// (matmul_ternary_*.cpp, repack_ternary.cpp).
//
// Both file formats repack to BlockTQx8: tq1_0's base-3 bytes (5 trits per byte, decoded by a multiply and a shift per
// trit) are unpacked once at load into tq2_0's 2-bit codes, so one kernel serves both and decode never divides bytes
// into trits (tq1_0's smaller file costs nothing at run time, and its weights take tq2_0's 2.06 bits in memory). The
// 2-bit fields sit as the K-quants' (matmul_kquant.h, BlockQ2_Kx8): per sub-block j of 32 elements, two 32-byte
// registers, 4 elements of each of the 8 rows per 32-bit lane, register i in bits 2 (i % 4) of the (i / 4)-th.
//
// Per activation block of 32 (scale xd, code sum xs = xd * sum(qx)): sum_l (u_l - 1) qx_l xd d = d (xd sum(u qx) - xs),
// so the kernel is an unsigned-by-signed integer dot of the codes with the activations and one float correction.
#pragma once

#include <cstdint>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/kernels/matmul_internal.h"

namespace tessera::cpu::detail {

struct BlockTQx8 {
  uint16_t d[kGroup];     // fp16 scale per row (the file block's d)
  uint8_t qs[8][2 * 32];  // 2-bit codes u = w / d + 1 (0..2; tq2_0's unused code 3 is kept and reads as +2)
};
static_assert(sizeof(BlockTQx8) == 16 + 8 * 64, "wrong BlockTQx8 size/padding");

bool is_ternary(DType dtype);
// Repacks W [n, k] (file blocks of 256) into ceil(n/8) groups of k/256 x8 blocks; rows past n are zero (d = 0).
uint64_t ternary_repack_bytes(DType dtype, int64_t n, int64_t k);
void ternary_repack(DType dtype, const void* rows, int64_t n, int64_t k, void* dst);

// Kernels on ROWS_X8 (nullptr for another layout) and the scalar one on the file's rows.
RowKernel ternary_avx2_kernel(WeightLayout layout);
RowKernel ternary_avxvnni_kernel(WeightLayout layout);
RowKernel ternary_avx512_kernel(WeightLayout layout);
RowKernel ternary_scalar_kernel(DType dtype);
// The kernel for `isa` (the scalar one below AVX2 or for a weight left in ROWS layout).
RowKernel ternary_kernel(Isa isa, DType dtype, WeightLayout layout);

}  // namespace tessera::cpu::detail
