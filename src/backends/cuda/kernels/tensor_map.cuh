// The driver's cuTensorMapEncodeTiled, for the kernels that load by TMA (attn_prefill_tma.cu, gemm_quant_tile.cu). The
// runtime is linked statically and libcuda opened by it, so the driver entry point is looked up once through the
// runtime rather than linked. Host code; included by .cu files only.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <mutex>

namespace tessera::cuda::detail {

// nullptr where the driver lacks it (before CUDA 12).
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    cudaDriverEntryPointQueryResult q{};
    void* f = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  });
  return encode;
}

}  // namespace tessera::cuda::detail
