// STUB (owner: gemm helper): replaced by the real implementation.
#include "backends/cuda/kernels_rows.h"
#include "core/error.h"

namespace tessera::cuda {

struct GemmWorkspace::Impl {
  int64_t max_t = 0, max_k = 0;
};
GemmWorkspace::GemmWorkspace(int64_t max_t, int64_t max_k, int64_t) : impl_(std::make_unique<Impl>()) {
  impl_->max_t = max_t;
  impl_->max_k = max_k;
}
GemmWorkspace::~GemmWorkspace() = default;
int64_t GemmWorkspace::max_t() const { return impl_->max_t; }
int64_t GemmWorkspace::max_k() const { return impl_->max_k; }
void matmul(const DeviceWeight&, const float*, float*, int64_t, GemmWorkspace&, cudaStream_t, bool) {
  fail("cuda matmul: not implemented yet");
}

}  // namespace tessera::cuda
