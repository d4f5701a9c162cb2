// q5_0, q5_1, iq4_nl and iq4_xs on the CPU: their repacked 8-row layouts (WeightLayout::ROWS_X8, the interleave of
// matmul_internal.h) and the entry points of their kernels (matmul_q5iq4_*.cpp) and repacking (repack_q5iq4.cpp).
//
// Layouts, one per 8-row group and 32-element block (iq4_xs: per 256-element super-block):
// - qs: the rows' nibbles interleaved in 4-byte chunks exactly as BlockQ4_0x8's, so one 256-bit load holds chunk c of
//   all 8 rows (one row per 32-bit lane) and the kernels unpack nibbles as the q4 kernels do.
// - qh (q5): row r's 32 fifth bits in lane r, reordered at repack time so that bit j of byte b is element 4j + b's.
//   The unpacked register for elements 4j..4j+3 (one byte each) then takes its fifth bits with one 16-bit shift that
//   brings bit j of every byte to bit 4 and one AND: no per-element bit gathering in the kernel.
// - iq4_xs: the rows' fp16 super-block scales together, and each sub-block's 6-bit scale decoded at repack time to a
//   signed byte (sc - 32) per row, 8 rows side by side: one 8-byte load and a widening convert per sub-block.
#pragma once

#include <cstdint>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/kernels/matmul_internal.h"

namespace tessera::cpu::detail {

struct BlockQ5_0x8 {
  uint16_t d[kGroup];
  uint8_t qh[kGroup * 4];
  uint8_t qs[kGroup * kBlock / 2];
};
static_assert(sizeof(BlockQ5_0x8) == 16 + 32 + 128, "wrong BlockQ5_0x8 size/padding");

struct BlockQ5_1x8 {
  uint16_t d[kGroup];
  uint16_t m[kGroup];
  uint8_t qh[kGroup * 4];
  uint8_t qs[kGroup * kBlock / 2];
};
static_assert(sizeof(BlockQ5_1x8) == 32 + 32 + 128, "wrong BlockQ5_1x8 size/padding");

struct BlockIQ4_NLx8 {
  uint16_t d[kGroup];
  uint8_t qs[kGroup * kBlock / 2];
};
static_assert(sizeof(BlockIQ4_NLx8) == 16 + 128, "wrong BlockIQ4_NLx8 size/padding");

constexpr int kSubBlocks = 8;  // 32-element sub-blocks per iq4_xs super-block

struct BlockIQ4_XSx8 {
  uint16_t d[kGroup];
  int8_t sc[kSubBlocks][kGroup];  // sub-block j's scale (sc - 32) of row r
  uint8_t qs[kSubBlocks][kGroup * kBlock / 2];
};
static_assert(sizeof(BlockIQ4_XSx8) == 16 + 64 + 1024, "wrong BlockIQ4_XSx8 size/padding");

// The byte values of iq4_nl's table plus 128 (1..241): the unsigned operand vpdpbusd wants; the kernels subtract
// 128 * sum(x) through the activation block's s.
constexpr uint8_t kIQ4Biased[16] = {1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241};
constexpr int8_t kIQ4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
constexpr uint8_t kIQ4Abs[16] = {127, 104, 83, 65, 49, 35, 22, 10, 1, 13, 25, 38, 53, 69, 89, 113};

// True for the four formats of this file.
bool is_q5iq4(DType dtype);
// repack_x8 / repack_x8_bytes for these formats (callers check is_q5iq4 first).
void repack_q5iq4(DType dtype, const void* rows, int64_t n, int64_t k, void* dst);
uint64_t repack_q5iq4_bytes(DType dtype, int64_t n, int64_t k);

// The kernel for `isa` (ROWS_X8 for the SIMD families, the file's rows for SCALAR); nullptr for another dtype.
RowKernel q5iq4_kernel(Isa isa, DType dtype);
RowKernel scalar_q5iq4_kernel(DType dtype);
RowKernel avx2_q5iq4_kernel(DType dtype);
RowKernel avxvnni_q5iq4_kernel(DType dtype);
RowKernel avx512_q5iq4_kernel(DType dtype);

}  // namespace tessera::cpu::detail
