// AVX-512 VNNI sparse GEMV (matmul_sparse_x86.h with 256-bit vpdpbusd, AVX512VL). A 32-row tile is four ymm
// accumulators; zmm would halve the rows per register and need 64-row tiles, which leave SmolLM2's 192-row k|v
// projections with fewer tasks than threads x 4: not tried yet.
#define TESSERA_SPARSE_VNNI 1
#include "backends/cpu/kernels/matmul_sparse_x86.h"

namespace tessera::cpu::detail {
SparseKernel avx512_sparse_kernel(DType dtype) { return sparse_kernel_for(dtype); }
}  // namespace tessera::cpu::detail
