// Internal to the CPU matmul kernels: the K-quants' interleaved layouts (WeightLayout::ROWS_X8 for q2_K, q3_K, q4_K,
// q5_K and q6_K) and their kernels' entry points (matmul_kquant_*.cpp, repack_kquant.cpp).
//
// Every K-quant is read as w = scale * u - min per sub-block, with an unsigned code u: q4_K and q5_K as stored
// (sub-blocks of 32), q2_K as stored (sub-blocks of 16), q6_K with u = q + 32 and min = 32 * scale, q3_K with u = q + 4
// and min = 4 * scale (sub-blocks of 16). So one kernel shape serves all five: per activation block of 32, an integer
// dot of u with the int8 activations (split in halves of 16 for the 16-element sub-blocks), scaled in float, minus
// min times the activations' sum (BlockQ8A's s, or the half sums for sub-blocks of 16).
//
// The x8 blocks hold one super-block (256 elements) of 8 rows. The codes of each 32-element sub-block j are laid out so
// that one 256-bit load holds 4 consecutive elements of all 8 rows (row r in 32-bit lane r, as BlockQ4_0x8's chunks):
// register i (0..7) of sub-block j holds elements 4i..4i+3, byte p = 4r + b being element 4i + b of row r. The low 4
// bits sit as BlockQ4_0x8's nibbles (qs[j][32c + p]: register c in the low nibble, register 4 + c in the high one),
// 2-bit codes as 4 fields per byte (register i of the first or second 32 bytes in bits 2 (i % 4) .. 2 (i % 4) + 1) and
// single high bits as 8 per byte (bit i of byte p: register i). The scales are decoded at repack time into one byte
// per row and sub-block ([sub-block][row]), so the kernels' inner loop never unpacks 6-bit fields.
#pragma once

#include <cstdint>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/kernels/matmul_internal.h"

namespace tessera::cpu::detail {

struct BlockQ4_Kx8 {
  uint16_t d[kGroup];     // fp16 scale of the scales, per row
  uint16_t dmin[kGroup];  // fp16 scale of the mins, per row
  uint8_t sc[8][kGroup];  // 6-bit scale per sub-block of 32
  uint8_t m[8][kGroup];   // 6-bit min per sub-block of 32
  uint8_t qs[8][4 * 32];  // 4-bit codes (nibbles)
};
static_assert(sizeof(BlockQ4_Kx8) == 32 + 128 + 8 * 128, "wrong BlockQ4_Kx8 size/padding");

struct BlockQ5_Kx8 {
  uint16_t d[kGroup];
  uint16_t dmin[kGroup];
  uint8_t sc[8][kGroup];
  uint8_t m[8][kGroup];
  uint8_t qs[8][4 * 32];  // 4 low bits (nibbles)
  uint8_t qh[8][32];      // bit 4 (single bits)
};
static_assert(sizeof(BlockQ5_Kx8) == 32 + 128 + 8 * 160, "wrong BlockQ5_Kx8 size/padding");

struct BlockQ6_Kx8 {
  uint16_t d[kGroup];
  int8_t sc[16][kGroup];  // int8 scale per sub-block of 16
  uint8_t ql[8][4 * 32];  // 4 low bits of u = q + 32 (nibbles)
  uint8_t qh[8][2 * 32];  // bits 4-5 of u (2-bit fields)
};
static_assert(sizeof(BlockQ6_Kx8) == 16 + 128 + 8 * 192, "wrong BlockQ6_Kx8 size/padding");

struct BlockQ2_Kx8 {
  uint16_t d[kGroup];
  uint16_t dmin[kGroup];
  uint8_t scm[16][kGroup];  // the file's byte: 4-bit scale (low) and min (high) per sub-block of 16
  uint8_t qs[8][2 * 32];    // 2-bit codes
};
static_assert(sizeof(BlockQ2_Kx8) == 32 + 128 + 8 * 64, "wrong BlockQ2_Kx8 size/padding");

struct BlockQ3_Kx8 {
  uint16_t d[kGroup];
  int8_t sc[16][kGroup];  // sc - 32 per sub-block of 16
  uint8_t qs[8][2 * 32];  // 2 low bits of u = q + 4
  uint8_t qh[8][32];      // bit 2 of u (the file's hmask bit)
};
static_assert(sizeof(BlockQ3_Kx8) == 16 + 128 + 8 * 96, "wrong BlockQ3_Kx8 size/padding");

bool is_kquant(DType dtype);
// Repacks W [n, k] (file super-blocks, k % 256 == 0) into ceil(n/8) groups of k/256 x8 blocks; rows past n are zero.
uint64_t kquant_repack_bytes(DType dtype, int64_t n, int64_t k);
void kquant_repack(DType dtype, const void* rows, int64_t n, int64_t k, void* dst);

// q2_K, q3_K and q6_K have a min or offset per 16 elements: their kernels take the activations' sums per half block,
// out[2 b + h] = d * sum(qs[16 h .. 16 h + 15]) of block b (MatmulArgs::xsum16).
bool kquant_needs_half_sums(DType dtype);
void kquant_half_sums(const BlockQ8A* xq /*[blocks]*/, float* out /*[2 * blocks]*/, int64_t blocks);

// Kernels on ROWS_X8 (nullptr for another dtype or layout) and the scalar one on the file's rows.
RowKernel kquant_avx2_kernel(DType dtype, WeightLayout layout);
RowKernel kquant_avxvnni_kernel(DType dtype, WeightLayout layout);
RowKernel kquant_avx512_kernel(DType dtype, WeightLayout layout);
RowKernel kquant_scalar_kernel(DType dtype);
// The kernel for `isa` (the scalar one below AVX2 or for a weight left in ROWS layout).
RowKernel kquant_kernel(Isa isa, DType dtype, WeightLayout layout);

}  // namespace tessera::cpu::detail
