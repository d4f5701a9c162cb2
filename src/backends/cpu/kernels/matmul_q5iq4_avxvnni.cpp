// AVX-VNNI q5_0, q5_1, iq4_nl and iq4_xs matmul (vpdpbusd): the kernels of matmul_q5iq4_x86.h. Compiled with -mavx2
// -mfma -mf16c -mavxvnni (src/CMakeLists.txt); used only at Isa::AVX2_VNNI.
#define TESSERA_QDOT_VNNI 1
#include "backends/cpu/kernels/matmul_q5iq4_x86.h"

namespace tessera::cpu::detail {

RowKernel avxvnni_q5iq4_kernel(DType dtype) { return q5iq4_rows8(dtype); }

}  // namespace tessera::cpu::detail
