// Portable ternary matmul (the fallback without AVX2) on the file's rows: each block's dot product is the traits'
// Format<D>::dot_q8 (adds and subtracts of the int8 activations per block of 32, scaled in float), and the ISA
// dispatch of the ternary kernels.
#include <cstring>
#include <vector>

#include "backends/cpu/kernels/matmul_ternary.h"
#include "quant/format_traits.h"

namespace tessera::cpu::detail {
namespace {

static_assert(sizeof(BlockQ8A) == sizeof(BlockQ8Act), "BlockQ8A and BlockQ8Act must hold the same numbers");

template <DType D>
void ternary_rows(const MatmulArgs& a, int64_t r0, int64_t r1) {
  using F = Format<D>;
  const int64_t n = a.w->n, k = a.w->k, kb = k / kQK, sb = k / kQKK;
  thread_local std::vector<BlockQ8Act> x;  // the activations as the traits' type (same fields; copied, not aliased)
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

}  // namespace

RowKernel ternary_scalar_kernel(DType dtype) {
  switch (dtype) {
    case DType::TQ1_0:
      return ternary_rows<DType::TQ1_0>;
    case DType::TQ2_0:
      return ternary_rows<DType::TQ2_0>;
    default:
      return nullptr;
  }
}

RowKernel ternary_kernel(Isa isa, DType dtype, WeightLayout layout) {
  RowKernel k = nullptr;
  if (isa == Isa::AVX512_VNNI) {
    k = ternary_avx512_kernel(layout);
  } else if (isa == Isa::AVX2_VNNI) {
    k = ternary_avxvnni_kernel(layout);
  } else if (isa == Isa::AVX2) {
    k = ternary_avx2_kernel(layout);
  }
  return k != nullptr ? k : ternary_scalar_kernel(dtype);
}

}  // namespace tessera::cpu::detail
