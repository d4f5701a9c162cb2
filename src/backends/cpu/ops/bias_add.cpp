// BIAS_ADD (graph.h): y[t, :] = x[t, :] + b, the bias of a linear layer (Qwen2's q/k/v projections).
#include "backends/cpu/op_kernel.h"

namespace tessera::cpu {
namespace {

void bias_add(const OpCall& call, int64_t /*n_past*/, ThreadPool& /*pool*/) {
  const auto* x = static_cast<const float*>(call.in[0]);
  const auto* b = static_cast<const float*>(call.in[1]);
  auto* y = static_cast<float*>(call.out);  // may be x's storage
  const int64_t n = call.in_tensors[1]->shape[0];
  const int64_t t = call.out_tensor->numel() / n;
  for (int64_t r = 0; r < t; ++r)
    for (int64_t i = 0; i < n; ++i) y[r * n + i] = x[r * n + i] + b[i];
}

[[maybe_unused]] const bool kRegistered = register_op_kernel(graph::Op::BIAS_ADD, {.run = bias_add});

}  // namespace
}  // namespace tessera::cpu
