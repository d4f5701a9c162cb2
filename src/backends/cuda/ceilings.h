// The GPU's ceilings, measured (never datasheet figures): device-memory read and copy bandwidth, each GEMV format's
// bandwidth at Llama-3-8B's widest shape, and matmul rates (cuBLASLt bf16 on a large cube; the engine's T-row matmul
// per weight format at a prefill shape). Serves `tessera bench --ceilings --device cuda` and profile's roofline.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace tessera::cuda {

struct CudaCeilings {
  std::string gpu_name;
  struct Bandwidth {
    std::string name;  // "read", "copy" (bytes read + written), "gemv bf16 4096x14336" (weight bytes read)
    uint64_t bytes = 0;
    std::vector<double> gbps;  // one sample per repeat
  };
  struct Gemm {
    std::string dtype;   // weight dtype
    std::string kernel;  // "cublaslt" (bf16 cube), "tessera" (kernels_rows.h matmul)
    int64_t m = 0, n = 0, k = 0;
    std::vector<double> tflops;
  };
  std::vector<Bandwidth> bandwidth;
  std::vector<Gemm> gemm;
};

// buffer_bytes per bandwidth buffer (>= 1 GiB keeps the 50 MB L2 out of it); `dtypes`: GEMV/matmul formats to time
// (empty: bf16, f16, q8_0, q4_0, q4_1). Events around each repeat, one warm-up first; random data, never zeros.
CudaCeilings measure_cuda_ceilings(uint64_t buffer_bytes, int repeats, const std::vector<DType>& dtypes, bool bandwidth,
                                   bool gemm);

}  // namespace tessera::cuda
