// Portable ternary matmul (the fallback without AVX2) on the file's rows: each block's dot product is the traits'
// Format<D>::dot_q8 (adds and subtracts of the int8 activations per block of 32, scaled in float), and the ISA
// dispatch of the ternary kernels.
#include "backends/cpu/kernels/matmul_ternary.h"
#include "backends/cpu/kernels/matmul_superblock_scalar.h"

namespace tessera::cpu::detail {

RowKernel ternary_scalar_kernel(DType dtype) {
  switch (dtype) {
    case DType::TQ1_0:
      return superblock_rows<DType::TQ1_0>;
    case DType::TQ2_0:
      return superblock_rows<DType::TQ2_0>;
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
