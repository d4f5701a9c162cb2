// The portable matmul over a super-block format's file rows (K-quants, TQ1_0/TQ2_0: 256 elements per block): each
// block's dot product with the 8-bit activations is the traits' Format<D>::dot_q8, the numbers the SIMD kernels
// compute. Shared by the scalar K-quant and ternary kernels (the fallbacks without AVX2).
#pragma once

#include <cstring>
#include <vector>

#include "backends/cpu/kernels/matmul_internal.h"
#include "quant/format_traits.h"

namespace tessera::cpu::detail {

static_assert(sizeof(BlockQ8A) == sizeof(BlockQ8Act), "BlockQ8A and BlockQ8Act must hold the same numbers");

template <DType D>
void superblock_rows(const MatmulArgs& a, int64_t r0, int64_t r1) {
  using F = Format<D>;
  const int64_t n = a.w->n, k = a.w->k, kb = k / kQK, sb = k / kQKK;
  // The activations as the traits' type (same fields; copied rather than aliased).
  thread_local std::vector<BlockQ8Act> x;
  x.resize(static_cast<size_t>(a.t * kb));
  for (int64_t i = 0; i < a.t * kb; ++i) {
    x[static_cast<size_t>(i)].d = a.xq[i].d;
    x[static_cast<size_t>(i)].s = a.xq[i].s;
    std::memcpy(x[static_cast<size_t>(i)].qs, a.xq[i].qs, kQK);
  }
  const auto* w = static_cast<const uint8_t*>(a.w->rows);
  typename F::Block blk;
  for (int64_t j = r0; j < r1; ++j) {
    for (int64_t i = 0; i < a.t; ++i) {
      float acc = 0.0f;
      for (int64_t b = 0; b < sb; ++b) {
        std::memcpy(&blk, w + (j * sb + b) * F::kBlockBytes, sizeof(blk));
        acc += F::dot_q8(blk, x.data() + i * kb + b * (kQKK / kQK));
      }
      a.y[i * n + j] = acc;
    }
  }
}

}  // namespace tessera::cpu::detail
