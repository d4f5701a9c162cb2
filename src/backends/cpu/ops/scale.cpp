// SCALE, the test-only op (graph.h): y = x * scale. This file is the op's whole CPU side, as docs/ARCHITECTURE.md's
// recipe for adding an op describes: a kernel that registers itself, run by the plan for an op with no dedicated step.
#include "backends/cpu/op_kernel.h"

namespace tessera::cpu {
namespace {

// y[T, E] = x[T, E] * s. y may be x's storage (the op's traits allow it): each element is read before it is written.
void scale(const OpCall& call, int64_t /*n_past*/, ThreadPool& /*pool*/) {
  const auto* x = static_cast<const float*>(call.in[0]);
  auto* y = static_cast<float*>(call.out);
  const float s = call.node->params.scale;
  const int64_t n = call.out_tensor->numel();
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * s;
}

[[maybe_unused]] const bool kRegistered = register_op_kernel(graph::Op::SCALE, {.run = scale});

}  // namespace
}  // namespace tessera::cpu
