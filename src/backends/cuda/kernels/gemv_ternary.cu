// GEMV kernels for tq2_0 (ternary weights; tq1_0 is uploaded as tq2_0) in the SPLIT_Q layout: gemv_quant_kernel.cuh's
// kernel with tq2_0's 128-element unit (quant_units.h: 2-bit codes masked in place and dotted with the q8 activation
// by dp4a, one scale per unit), so every epilogue of the quantized GEMV (accumulate, the RMSNorm folds) serves it as
// it serves the K-quants. Its own file so that it compiles beside gemv_kquant.cu.
#include "backends/cuda/kernels/gemv_quant_kernel.cuh"

namespace tessera::cuda::detail {

void launch_gemv_ternary(int index, const LaunchArgs& a) {
  switch (a.w->dtype) {
    case DType::TQ2_0:
      launch_indexed<DType::TQ2_0>(index, a, std::make_index_sequence<kNumShapes>{});
      break;
    default:
      fail_message("gemv: no quant kernel for this dtype");
  }
}

}  // namespace tessera::cuda::detail
