// Scalar reference conversions per weight format: the ground truth every SIMD or GPU kernel is checked against.
// One run-time row per format, built from the traits in quant/format_traits.h. Rows are `n` elements long; n must be
// a multiple of the format's block size (callers validate shapes first).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/dtype.h"
#include "quant/format_traits.h"

namespace tessera {

using ToFloatFn = void (*)(const void* src, float* dst, int64_t n);
using FromFloatFn = void (*)(const float* src, void* dst, int64_t n);
using DotQ8Fn = double (*)(const void* row, const BlockQ8Act* x, int64_t n);

// A format's row of the traits table.
struct FormatInfo {
  DType type;
  const char* name;  // as dtype_name prints it
  int block_size;    // elements per block
  int block_bytes;   // bytes per block
  bool quantized;
  ToFloatFn to_float;      // every format of the table can be read
  FromFloatFn from_float;  // nullptr: Tessera cannot produce this format
  // from_float gives the same bytes as GGML's reference quantizer (tests/quant checks them against gguf-py). False for
  // the K-quants, whose quantizers are Tessera's own (simple max-based scales, checked by their round-trip error): a
  // file written with them is valid and reads back everywhere, but is not what llama-quantize would write.
  bool from_float_is_ggml;
  DotQ8Fn dot_q8;  // quantized formats: the weight row · x quantized to 8 bits (Format<D>::dot_q8); else nullptr
};

// Every format whose values Tessera knows, in DType order.
std::span<const FormatInfo> formats();
// Its row, or nullptr for a dtype Tessera cannot read.
const FormatInfo* format_info(DType t);

struct QuantTraits {
  DType type;
  ToFloatFn to_float;      // nullptr: Tessera cannot read this dtype's values (yet)
  FromFloatFn from_float;  // nullptr: Tessera cannot produce this dtype
};

// The row for `t`; directions Tessera lacks are nullptr.
QuantTraits quant_traits(DType t);
bool can_dequantize(DType t);
bool can_quantize(DType t);

// Throw tessera::Error when the dtype or direction is unsupported or n is not a whole number of blocks.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);
void quantize_row(DType t, const float* src, void* dst, int64_t n);

// Reference dot product of one weight row (dtype t) with float activations, accumulated in double.
double vec_dot_ref(DType t, const void* row, const float* x, int64_t n);

// x [n] -> n / 32 activation blocks (n % 32 == 0), rounding as the CPU and CUDA kernels do: d = max|x| / 127,
// qs = x * (127 / max|x|) rounded to nearest even, s = d * sum(qs).
void quantize_act_q8(const float* x, BlockQ8Act* out, int64_t n);
// Reference dot product of one quantized weight row (dtype t) with activations quantized by quantize_act_q8: the
// integer sums of Format<D>::dot_q8 per block, the blocks' results summed in double. Error for a float dtype.
double dot_q8_ref(DType t, const void* row, const BlockQ8Act* x, int64_t n);

// Rewrites W [n, k] from format `from` to format `to` row by row (dequantize, then quantize): what a backend does at
// load for a format it has no kernel for. dst holds n rows of `to` (dtype_row_bytes(to, k) each). Error when either
// direction is unsupported or k is not a whole number of blocks of both formats.
void convert_rows(DType from, const void* src, DType to, void* dst, int64_t n, int64_t k);

// W [n, k] in format t as f32, row-major; empty (no Error) when t has no reader, src is null or k is not a whole
// number of t's blocks: the matmul-chain rewrite's weight reader (graph::WeightValues) in both backends.
std::vector<float> dequantize_matrix(DType t, const void* src, int64_t n, int64_t k);

// q4_K rows W [n, k] as q4_1 rows (dst: n * k / 32 BlockQ4_1): each 32-element sub-block w = d sc q - dmin m becomes
// the q4_1 block D = fp16(d sc), M = fp16(-dmin m) over the same 4-bit q, so the value differs from q4_K's by the
// fp16 rounding of D and M (at most 2^-11 of each). The TEAL sparse GEMVs run q4_K on q4_1's kernels over this copy
// (20 bytes per 32 weights against q4_K's 18). Error for k not a multiple of 256.
void q4_k_rows_as_q4_1(const void* src, void* dst, int64_t n, int64_t k);

}  // namespace tessera
