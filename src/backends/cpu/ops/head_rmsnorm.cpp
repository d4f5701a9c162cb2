// HEAD_RMSNORM (graph.h): RMSNorm of each head's head_dim values of x[T, H*D] with one weight w[D] shared by the
// heads (Qwen3's and Gemma 3's q/k norms). Sums in double, as the RMSNORM reference does; both modes run it (its cost
// is T*H*D, a fraction of the q/k projections before it).
#include <cmath>

#include "backends/cpu/op_kernel.h"

namespace tessera::cpu {
namespace {

void head_rmsnorm(const OpCall& call, int64_t /*n_past*/, ThreadPool& /*pool*/) {
  const auto* x = static_cast<const float*>(call.in[0]);
  const auto* w = static_cast<const float*>(call.in[1]);
  auto* y = static_cast<float*>(call.out);  // may be x's storage: a head is summed before it is written
  const int64_t d = call.node->params.head_dim;
  const double eps = call.node->params.eps;
  const int64_t rows = call.out_tensor->numel() / d;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * d;
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += double(xr[i]) * xr[i];
    const auto inv = static_cast<float>(1.0 / std::sqrt(ss / double(d) + eps));
    float* yr = y + r * d;
    for (int64_t i = 0; i < d; ++i) yr[i] = xr[i] * inv * w[i];
  }
}

[[maybe_unused]] const bool kRegistered = register_op_kernel(graph::Op::HEAD_RMSNORM, {.run = head_rmsnorm});

}  // namespace
}  // namespace tessera::cpu
