// GEMV kernels for quantized weights (q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1) in the SPLIT_Q layout, against the
// q8-quantized activation: dp4a multiplies 4 int8 pairs per instruction, so a 32-weight block costs a few integer
// instructions instead of 32 float conversions and FMAs. The kernel is gemv_quant_kernel.cuh's; the K-quants are
// instantiated in gemv_kquant.cu.
#include "backends/cuda/kernels/gemv_quant_kernel.cuh"

namespace tessera::cuda::detail {

void launch_gemv_quant(int index, const LaunchArgs& a) {
  switch (a.w->dtype) {
    case DType::Q8_0:
      launch_indexed<DType::Q8_0>(index, a, std::make_index_sequence<kNumShapes>{});
      break;
    case DType::Q4_0:
      launch_indexed<DType::Q4_0>(index, a, std::make_index_sequence<kNumShapes>{});
      break;
    case DType::Q4_1:
      launch_indexed<DType::Q4_1>(index, a, std::make_index_sequence<kNumShapes>{});
      break;
    case DType::IQ4_NL:
      launch_indexed<DType::IQ4_NL>(index, a, std::make_index_sequence<kNumShapes>{});
      break;
    case DType::Q5_0:
      launch_indexed<DType::Q5_0>(index, a, std::make_index_sequence<kNumShapes>{});
      break;
    case DType::Q5_1:
      launch_indexed<DType::Q5_1>(index, a, std::make_index_sequence<kNumShapes>{});
      break;
    default:
      launch_gemv_kquant(index, a);
  }
}

}  // namespace tessera::cuda::detail
