// Scalar reference conversions per dtype: the ground truth every SIMD or GPU kernel is checked against.
// Rows are `n` elements long; n must be a multiple of the dtype's block size (callers validate shapes first).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace tessera {

using ToFloatFn = void (*)(const void* src, float* dst, int64_t n);
using FromFloatFn = void (*)(const float* src, void* dst, int64_t n);

struct QuantTraits {
  DType type;
  ToFloatFn to_float;      // nullptr: Tessera cannot read this dtype's values (yet)
  FromFloatFn from_float;  // nullptr: Tessera cannot produce this dtype (K-quants are read-only for now)
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

}  // namespace tessera
