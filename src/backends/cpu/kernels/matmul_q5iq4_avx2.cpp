// AVX2 q5_0, q5_1, iq4_nl and iq4_xs matmul (vpmaddubsw + vpmaddwd): the kernels of matmul_q5iq4_x86.h. Compiled with
// -mavx2 -mfma -mf16c (src/CMakeLists.txt); used only when cpu_features() reports all three.
#define TESSERA_QDOT_VNNI 0
#include "backends/cpu/kernels/matmul_q5iq4_x86.h"

namespace tessera::cpu::detail {

RowKernel avx2_q5iq4_kernel(DType dtype) { return q5iq4_rows8(dtype); }

}  // namespace tessera::cpu::detail
