#include "backends/cuda/cuda_check.h"

#include "core/error.h"

namespace tessera::cuda {

void fail_cuda(cudaError_t err, const char* what, const char* file, int line) {
  const char* name = cudaGetErrorName(err);
  const char* reason = cudaGetErrorString(err);
  // Clear a non-sticky error so the caller can recover (a sticky one, e.g. an illegal address, stays).
  (void)cudaGetLastError();
  fail("CUDA call '{}' failed at {}:{}: {} ({})", what, file, line, reason ? reason : "unknown error",
       name ? name : "?");
}

void fail_message(const std::string& message) { fail("{}", message); }

}  // namespace tessera::cuda
