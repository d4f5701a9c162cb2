// K-quant matmul on AVX-512 VNNI (16 rows per zmm pass). Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni
// (src/CMakeLists.txt); the kernels are matmul_kquant_x86.h's. Includes no header whose inline functions portable
// files also use (matmul_float_avx2.cpp says why).
// GCC 12's own AVX-512 intrinsics start from _mm512_undefined_*(), which -O3 reports as uninitialized use: a false
// positive inside the compiler's headers, silenced for this file only (as matmul_quant_avx512.cpp does).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define TESSERA_QDOT_VNNI 1
#define TESSERA_KQ_WIDTH 512
#include "backends/cpu/kernels/matmul_kquant_x86.h"

namespace tessera::cpu::detail {

RowKernel kquant_avx512_kernel(DType dtype, WeightLayout layout) { return kq_kernel(dtype, layout); }

}  // namespace tessera::cpu::detail
