// GEMV kernels for the K-quants (q2_K, q3_K, q4_K, q5_K, q6_K) and iq4_xs in the SPLIT_Q layout:
// gemv_quant_kernel.cuh's kernel with the formats' 64-element units (quant_units.h), so every epilogue of the quantized
// GEMV (accumulate, the RMSNorm folds) serves them as it serves q4_1.
#include "backends/cuda/kernels/gemv_quant_kernel.cuh"

namespace tessera::cuda::detail {

void launch_gemv_kquant(int index, const LaunchArgs& a) {
  switch (a.w->dtype) {
    case DType::Q4_K:
      launch_indexed<DType::Q4_K>(index, a, std::make_index_sequence<kNumShapes>{});
      break;
    case DType::Q5_K:
      launch_indexed<DType::Q5_K>(index, a, std::make_index_sequence<kNumShapes>{});
      break;
    case DType::Q6_K:
      launch_indexed<DType::Q6_K>(index, a, std::make_index_sequence<kNumShapes>{});
      break;
    case DType::IQ4_XS:
      launch_indexed<DType::IQ4_XS>(index, a, std::make_index_sequence<kNumShapes>{});
      break;
    case DType::Q2_K:
      launch_indexed<DType::Q2_K>(index, a, std::make_index_sequence<kNumShapes>{});
      break;
    case DType::Q3_K:
      launch_indexed<DType::Q3_K>(index, a, std::make_index_sequence<kNumShapes>{});
      break;
    default:
      launch_gemv_ternary(index, a);
  }
}

}  // namespace tessera::cuda::detail
