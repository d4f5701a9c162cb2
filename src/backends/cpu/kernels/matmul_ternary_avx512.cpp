// Ternary matmul on AVX-512 VNNI (16 rows per zmm pass). Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni
// (src/CMakeLists.txt); the kernels are matmul_ternary_x86.h's.
// GCC 12's AVX-512 intrinsics trip -Wmaybe-uninitialized inside its own headers (matmul_kquant_avx512.cpp says why).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define TESSERA_QDOT_VNNI 1
#define TESSERA_KQ_WIDTH 512
#include "backends/cpu/kernels/matmul_ternary_x86.h"

namespace tessera::cpu::detail {

RowKernel ternary_avx512_kernel(WeightLayout layout) { return tq_kernel(layout); }

}  // namespace tessera::cpu::detail
