// Ternary matmul on AVX2 (vpmaddubsw + vpmaddwd). Compiled with -mavx2 -mfma -mf16c
// (src/CMakeLists.txt); the kernels are matmul_ternary_x86.h's.
#define TESSERA_QDOT_VNNI 0
#define TESSERA_KQ_WIDTH 256
#include "backends/cpu/kernels/matmul_ternary_x86.h"

namespace tessera::cpu::detail {

RowKernel ternary_avx2_kernel(WeightLayout layout) { return tq_kernel(layout); }

}  // namespace tessera::cpu::detail
