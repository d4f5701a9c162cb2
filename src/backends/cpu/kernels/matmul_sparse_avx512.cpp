// AVX-512 VNNI sparse GEMV (matmul_sparse_x86.h: a whole 64-row tile per zmm vpdpbusd).
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which its own -Wmaybe-uninitialized then reports
// (matmul_quant_avx512.cpp says the same).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define TESSERA_SPARSE_VNNI 1
#include "backends/cpu/kernels/matmul_sparse_x86.h"

namespace tessera::cpu::detail {
SparseKernel avx512_sparse_kernel(DType dtype) { return sparse_kernel_for(dtype); }
}  // namespace tessera::cpu::detail
