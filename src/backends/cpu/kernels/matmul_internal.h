// Internal to the CPU matmul kernels: activation blocks, repacked weight blocks and the per-ISA kernel entry points.
#pragma once

#include <cstdint>

#include "backends/cpu/kernels.h"

namespace tessera::cpu::detail {

constexpr int kBlock = 32;  // elements per block of q4_0 / q4_1 / q8_0 and of the quantized activations
constexpr int kGroup = 8;   // rows per interleaved group (WeightLayout::ROWS_X8)

// One block of 32 activations quantized to int8: x ~= d * qs. s = d * sum(qs) serves the weight formats with an
// offset (q4_1's min, q4_0's -8): sum(w * x) = dw * d * sum(q * qs) + m * s. d and s are float, not fp16 as in
// llama.cpp's q8_0/q8_1, so the only activation error is the int8 rounding itself.
struct BlockQ8A {
  float d;
  float s;
  int8_t qs[kBlock];
};
static_assert(sizeof(BlockQ8A) == 40, "wrong BlockQ8A size/padding");

// Eight rows' blocks at the same K position, interleaved in 4-byte chunks: qs[32 * c + 4 * r + b] = row_r.qs[4 * c + b]
// (c = chunk, r = row in the group, b = byte in the chunk). One 256-bit load then holds chunk c of all 8 rows, one
// row per 32-bit lane, and a broadcast of the 4 matching activation bytes lets vpmaddubsw + vpmaddwd produce 8 rows'
// partial dots in 8 lanes: no horizontal reduction, and for T > 1 the unpacked weights serve several tokens. The 8
// rows' scales sit together so one vcvtph2ps converts them all.
struct BlockQ4_0x8 {
  uint16_t d[kGroup];
  uint8_t qs[kGroup * kBlock / 2];
};
static_assert(sizeof(BlockQ4_0x8) == 16 + 128, "wrong BlockQ4_0x8 size/padding");

struct BlockQ4_1x8 {
  uint16_t d[kGroup];
  uint16_t m[kGroup];
  uint8_t qs[kGroup * kBlock / 2];
};
static_assert(sizeof(BlockQ4_1x8) == 32 + 128, "wrong BlockQ4_1x8 size/padding");

// q8_0's quants are stored biased, u = w + 128 (as bytes: w ^ 0x80), so the VNNI kernels feed them to vpdpbusd as its
// unsigned operand directly, and the activations stay signed: sum(w x) = sum(u x) - 128 sum(x), where the second term
// is the activation block's s (BlockQ8A) times -128, one multiply-add per block and token instead of taking |w| and
// moving w's sign onto x for every chunk. Kernels without VNNI (vpmaddubsw saturates at u = 255) flip the bit back.
struct BlockQ8_0x8 {
  uint16_t d[kGroup];
  uint8_t qs[kGroup * kBlock];  // biased: w ^ 0x80
};
static_assert(sizeof(BlockQ8_0x8) == 16 + 256, "wrong BlockQ8_0x8 size/padding");

// Repacks W [n, k] (file blocks) into ceil(n/8) groups of k/32 interleaved blocks; rows past n are zero (scale 0).
void repack_x8(DType dtype, const void* rows, int64_t n, int64_t k, void* dst);
uint64_t repack_x8_bytes(DType dtype, int64_t n, int64_t k);

// One matmul call as the kernels see it. Kernels compute output rows [r0, r1) for all t tokens.
struct MatmulArgs {
  const PackedWeight* w;
  const float* x;      // [t, k]
  const BlockQ8A* xq;  // [t, k/32] quantized x (quantized dtypes), else nullptr
  float* y;            // [t, n]
  int64_t t;
  const float* xsum16 =
      nullptr;  // [t, k/32, 2] half-block sums of xq (kquant_half_sums: q2_K, q3_K, q6_K), else nullptr
};
using RowKernel = void (*)(const MatmulArgs& a, int64_t r0, int64_t r1);
// The kernel matmul runs w with on the active ISA (Error where there is none).
RowKernel row_kernel(const PackedWeight& w);

// Activation quantization of one row of k elements (k % 32 == 0). Both versions round identically (round to nearest
// even of x * (127 / amax)), so the scalar and AVX2 matmuls see the same integers.
void quantize_act_scalar(const float* x /*[k]*/, BlockQ8A* xq /*[k/32]*/, int64_t k);
void quantize_act_avx2(const float* x /*[k]*/, BlockQ8A* xq /*[k/32]*/, int64_t k);

// Scalar kernels on ROWS layout (all dtypes); quantized ones use xq.
RowKernel scalar_kernel(DType dtype);
// AVX2 kernels: quantized dtypes on ROWS_X8, float dtypes on ROWS. nullptr when none.
RowKernel avx2_quant_kernel(DType dtype, WeightLayout layout);
RowKernel avxvnni_quant_kernel(DType dtype, WeightLayout layout);  // same, with AVX-VNNI
RowKernel avx512_quant_kernel(DType dtype, WeightLayout layout);   // same, 16 rows per zmm pass
RowKernel avx2_float_kernel(DType dtype, WeightLayout layout);

// f32 weights at t >= kBlasMinTokens through OpenBLAS sgemm when the build has it (matmul_blas.cpp); returns false
// when it did nothing (no OpenBLAS, too few tokens), and the caller runs its own kernel.
constexpr int64_t kBlasMinTokens = 16;
bool matmul_f32_blas(ThreadPool& pool, const float* w /*[n, k]*/, const float* x /*[t, k]*/, float* y /*[t, n]*/,
                     int64_t t, int64_t n, int64_t k);

}  // namespace tessera::cpu::detail
