// rmsnorm, swiglu, add, embedding, argmax: the fast versions dispatch to AVX2 where it pays (elementwise_avx2.cpp);
// the _ref twins are plain loops in double where accumulation order matters.
#include <cmath>
#include <vector>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/kernels/elementwise_internal.h"
#include "core/error.h"
#include "quant/quant.h"

namespace tessera::cpu {
namespace {

void check_rmsnorm(int64_t t, int64_t d) {
  TESSERA_CHECK(t > 0 && d > 0, "rmsnorm: shape [{}, {}] must be positive", t, d);
}

void check_embedding(DType dtype, const void* table, int64_t n_vocab, const int32_t* ids, int64_t t, int64_t d) {
  TESSERA_CHECK(can_dequantize(dtype), "embedding: table dtype {} cannot be read on the CPU", dtype_name(dtype));
  TESSERA_CHECK(table != nullptr && ids != nullptr && n_vocab > 0 && d > 0 && t >= 0,
                "embedding: bad table [{}, {}] or {} ids", n_vocab, d, t);
  TESSERA_CHECK(dtype_row_bytes(dtype, static_cast<uint64_t>(d)).has_value(),
                "embedding: rows of {} elements are not a whole number of {} blocks", d, dtype_name(dtype));
  for (int64_t i = 0; i < t; ++i)
    TESSERA_CHECK(ids[i] >= 0 && ids[i] < n_vocab,
                  "embedding: token id {} at position {} is outside the vocabulary "
                  "of {}",
                  ids[i], i, n_vocab);
}

}  // namespace

void rmsnorm_ref(const float* x, const float* w, float* y, int64_t t, int64_t d, float eps) {
  check_rmsnorm(t, d);
  for (int64_t i = 0; i < t; ++i, x += d, y += d) {
    double ss = 0.0;
    for (int64_t j = 0; j < d; ++j) ss += static_cast<double>(x[j]) * x[j];
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(d) + eps);
    for (int64_t j = 0; j < d; ++j) y[j] = static_cast<float>(x[j] * r * w[j]);
  }
}

void rmsnorm(const float* x, const float* w, float* y, int64_t t, int64_t d, float eps) {
  check_rmsnorm(t, d);
  if (active_isa() >= Isa::AVX2) return detail::rmsnorm_avx2(x, w, y, t, d, eps);
  for (int64_t i = 0; i < t; ++i, x += d, y += d) {
    float ss[4] = {0, 0, 0, 0};  // four partial sums: shorter dependency chain, and the compiler can vectorize
    int64_t j = 0;
    for (; j + 4 <= d; j += 4)
      for (int l = 0; l < 4; ++l) ss[l] += x[j + l] * x[j + l];
    for (; j < d; ++j) ss[0] += x[j] * x[j];
    const float r = 1.0f / std::sqrt((ss[0] + ss[1] + ss[2] + ss[3]) / static_cast<float>(d) + eps);
    for (j = 0; j < d; ++j) y[j] = x[j] * r * w[j];
  }
}

void swiglu_ref(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    out[i] = static_cast<float>(g / (1.0 + std::exp(-g)) * up[i]);
  }
}

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  if (active_isa() >= Isa::AVX2) return detail::swiglu_avx2(gate, up, out, n);
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void add_ref(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void add(float* y, const float* x, int64_t n) {
  // A plain loop: the compiler vectorizes it for the baseline target, and it is bound by memory either way.
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void embedding_ref(DType dtype, const void* table, int64_t n_vocab, const int32_t* ids, float* out, int64_t t,
                   int64_t d) {
  check_embedding(dtype, table, n_vocab, ids, t, d);
  const uint64_t row_bytes = *dtype_row_bytes(dtype, static_cast<uint64_t>(d));
  for (int64_t i = 0; i < t; ++i)
    dequantize_row(dtype, static_cast<const uint8_t*>(table) + static_cast<uint64_t>(ids[i]) * row_bytes, out + i * d,
                   d);
}

void embedding(DType dtype, const void* table, int64_t n_vocab, const int32_t* ids, float* out, int64_t t, int64_t d) {
  // One row per token: dequantization of a single row is far from any hot path, so the reference conversion serves.
  embedding_ref(dtype, table, n_vocab, ids, out, t, d);
}

int32_t argmax_ref(const float* x, int64_t n) {
  TESSERA_CHECK(n > 0 && n <= INT32_MAX, "argmax: {} elements; expected 1..2^31-1", n);
  int64_t best = -1;
  for (int64_t i = 0; i < n; ++i)
    if (!std::isnan(x[i]) && (best < 0 || x[i] > x[best])) best = i;
  return static_cast<int32_t>(best < 0 ? 0 : best);
}

int32_t argmax(const float* x, int64_t n) {
  TESSERA_CHECK(n > 0 && n <= INT32_MAX, "argmax: {} elements; expected 1..2^31-1", n);
  if (active_isa() >= Isa::AVX2) return detail::argmax_avx2(x, n);
  return argmax_ref(x, n);
}

}  // namespace tessera::cpu
