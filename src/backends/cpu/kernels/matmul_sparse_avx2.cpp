// AVX2 sparse GEMV (matmul_sparse_x86.h with vpmaddubsw + vpmaddwd). Compiled with -mavx2 -mfma -mf16c.
#define TESSERA_SPARSE_VNNI 0
#include "backends/cpu/kernels/matmul_sparse_x86.h"

namespace tessera::cpu::detail {
SparseKernel avx2_sparse_kernel(DType dtype) { return sparse_kernel_for(dtype); }
}  // namespace tessera::cpu::detail
