// Ternary matmul on AVX-VNNI (vpdpbusd on 256 bits). Compiled with -mavx2 -mfma -mf16c -mavxvnni
// (src/CMakeLists.txt); the kernels are matmul_ternary_x86.h's.
#define TESSERA_QDOT_VNNI 1
#define TESSERA_KQ_WIDTH 256
#include "backends/cpu/kernels/matmul_ternary_x86.h"

namespace tessera::cpu::detail {

RowKernel ternary_avxvnni_kernel(WeightLayout layout) { return tq_kernel(layout); }

}  // namespace tessera::cpu::detail
