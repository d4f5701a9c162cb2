// RELU2_GLU (graph.h): out = relu(gate)^2 * up, BitNet b1.58's gated activation (transformers' ACT2FN["relu2"] on
// gate_proj, times up_proj). The registered kernel is both modes' reference and the fast path: it is a few
// operations per element beside the matmuls around it.
#include <algorithm>

#include "backends/cpu/op_kernel.h"

namespace tessera::cpu {
namespace {

// Below this many elements waking the pool costs more than the loop (a decode row is 2048-16384 values).
constexpr int64_t kMinParallel = 1 << 15;

void relu2_glu(const OpCall& call, int64_t /*n_past*/, ThreadPool& pool) {
  const auto* g = static_cast<const float*>(call.in[0]);
  const auto* u = static_cast<const float*>(call.in[1]);
  auto* y = static_cast<float*>(call.out);  // may be g's or u's storage: each element is read before it is written
  const int64_t n = call.out_tensor->numel();
  const auto run = [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float r = std::max(g[i], 0.0f);
      y[i] = r * r * u[i];
    }
  };
  if (n < kMinParallel || pool.n_threads() < 2) return run(0, n);
  pool.parallel_range(n, [&](int64_t b, int64_t e, int) { run(b, e); });
}

[[maybe_unused]] const bool kRegistered = register_op_kernel(graph::Op::RELU2_GLU, {.run = relu2_glu});

}  // namespace
}  // namespace tessera::cpu
