// K-quant matmul on AVX2 (vpmaddubsw + vpmaddwd). Compiled with -mavx2 -mfma -mf16c
// (src/CMakeLists.txt); the kernels are matmul_kquant_x86.h's. Includes no header whose inline functions portable
// files also use (matmul_float_avx2.cpp says why).
#define TESSERA_QDOT_VNNI 0
#define TESSERA_KQ_WIDTH 256
#include "backends/cpu/kernels/matmul_kquant_x86.h"

namespace tessera::cpu::detail {

RowKernel kquant_avx2_kernel(DType dtype, WeightLayout layout) { return kq_kernel(dtype, layout); }

}  // namespace tessera::cpu::detail
