// SOFTCAP (graph.h): y = cap * tanh(x / cap), Gemma's final logit softcapping (cap = params.scale).
#include <cmath>

#include "backends/cpu/op_kernel.h"

namespace tessera::cpu {
namespace {

void softcap(const OpCall& call, int64_t /*n_past*/, ThreadPool& /*pool*/) {
  const auto* x = static_cast<const float*>(call.in[0]);
  auto* y = static_cast<float*>(call.out);  // may be x's storage
  const float cap = call.node->params.scale;
  const int64_t n = call.out_tensor->numel();
  for (int64_t i = 0; i < n; ++i) y[i] = cap * std::tanh(x[i] / cap);
}

[[maybe_unused]] const bool kRegistered = register_op_kernel(graph::Op::SOFTCAP, {.run = softcap});

}  // namespace
}  // namespace tessera::cpu
