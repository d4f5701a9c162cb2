// Checked CUDA calls: every runtime call and every kernel launch of the CUDA backend goes through these, so a failure
// becomes a tessera::Error naming the call and the runtime's reason instead of garbage several kernels later.
// Plain C++ (no fmt, no CUDA language features) so .cu files compiled as C++17 by nvcc can include it.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

namespace tessera::cuda {

// Throws tessera::Error("CUDA call '<what>' failed at <file>:<line>: <reason>").
[[noreturn]] void fail_cuda(cudaError_t err, const char* what, const char* file, int line);

// Throws tessera::Error(message) (for .cu files, which cannot include core/error.h: fmt stays out of nvcc's way).
[[noreturn]] void fail_message(const std::string& message);

inline void check_cuda(cudaError_t err, const char* what, const char* file, int line) {
  if (err != cudaSuccess) fail_cuda(err, what, file, line);
}

}  // namespace tessera::cuda

#define TESSERA_CUDA_CHECK(call) ::tessera::cuda::check_cuda((call), #call, __FILE__, __LINE__)
// After a <<<...>>> launch: catches bad configurations (too many threads, too much shared memory) at once; faults
// inside the kernel surface at the next synchronizing call, which is checked too.
#define TESSERA_CUDA_CHECK_LAUNCH(kernel_name) \
  ::tessera::cuda::check_cuda(cudaGetLastError(), "launch of " kernel_name, __FILE__, __LINE__)
// Argument validation inside .cu files: `message` is any expression convertible to std::string.
#define TESSERA_CUDA_REQUIRE(cond, message)              \
  do {                                                   \
    if (!(cond)) ::tessera::cuda::fail_message(message); \
  } while (0)
