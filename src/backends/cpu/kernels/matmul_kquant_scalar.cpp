// Portable K-quant matmul (the fallback without AVX2) on the file's rows: each super-block's dot product is the traits'
// Format<D>::dot_q8 (integer sums per sub-block, scaled in float), the same numbers the SIMD kernels compute.
#include "backends/cpu/kernels/matmul_kquant.h"
#include "backends/cpu/kernels/matmul_superblock_scalar.h"

namespace tessera::cpu::detail {

bool kquant_needs_half_sums(DType dtype) {
  return dtype == DType::Q2_K || dtype == DType::Q3_K || dtype == DType::Q6_K;
}

void kquant_half_sums(const BlockQ8A* xq, float* out, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b) {
    int32_t lo = 0, hi = 0;
    for (int l = 0; l < kQK / 2; ++l) {
      lo += xq[b].qs[l];
      hi += xq[b].qs[l + kQK / 2];
    }
    out[2 * b] = xq[b].d * static_cast<float>(lo);
    out[2 * b + 1] = xq[b].d * static_cast<float>(hi);
  }
}

RowKernel kquant_kernel(Isa isa, DType dtype, WeightLayout layout) {
  RowKernel k = nullptr;
  if (isa == Isa::AVX512_VNNI) {
    k = kquant_avx512_kernel(dtype, layout);
  } else if (isa == Isa::AVX2_VNNI) {
    k = kquant_avxvnni_kernel(dtype, layout);
  } else if (isa == Isa::AVX2) {
    k = kquant_avx2_kernel(dtype, layout);
  }
  return k != nullptr ? k : kquant_scalar_kernel(dtype);
}

RowKernel kquant_scalar_kernel(DType dtype) {
  switch (dtype) {
    case DType::Q2_K:
      return superblock_rows<DType::Q2_K>;
    case DType::Q3_K:
      return superblock_rows<DType::Q3_K>;
    case DType::Q4_K:
      return superblock_rows<DType::Q4_K>;
    case DType::Q5_K:
      return superblock_rows<DType::Q5_K>;
    case DType::Q6_K:
      return superblock_rows<DType::Q6_K>;
    default:
      return nullptr;
  }
}

}  // namespace tessera::cpu::detail
