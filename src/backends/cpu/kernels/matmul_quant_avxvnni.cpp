// AVX-VNNI quantized matmul: the kernels of matmul_quant_x86.h with vpdpbusd. Compiled with -mavx2 -mfma -mf16c
// -mavxvnni (src/CMakeLists.txt); used only when cpu_features() reports AVX-VNNI too (Isa::AVX2_VNNI).
#define TESSERA_QDOT_VNNI 1
#include "backends/cpu/kernels/matmul_quant_x86.h"

namespace tessera::cpu::detail {

RowKernel avxvnni_quant_kernel(DType dtype, WeightLayout layout) {
  if (layout != WeightLayout::ROWS_X8) return nullptr;
  switch (dtype) {
    case DType::Q4_0:
      return q4x8_rows<BlockQ4_0x8>;
    case DType::Q4_1:
      return q4x8_rows<BlockQ4_1x8>;
    case DType::Q8_0:
      return q8x8_rows;
    default:
      return nullptr;
  }
}

}  // namespace tessera::cpu::detail
