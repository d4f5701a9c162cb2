// ACT_QUANT_I8 (graph.h): BitLinear's per-token int8 activation fake-quant, as transformers' BitNet integration
// computes it (ActQuant.forward, BitLinear.activation_quant) in f32: s = 127 / max(max|x|, 1e-5) per row,
// y = clamp(round(x * s), -128, 127) / s with ties to even (torch.round). The values a ternary matmul then reads are
// exactly the int8 grid times 1/s, so a later integer kernel reading (int8, s) computes the same products.
// The registered kernel is both modes' reference and the fast path: one pass over a row beside a matmul over it.
#include <algorithm>
#include <cmath>

#include "backends/cpu/op_kernel.h"

namespace tessera::cpu {
namespace {

// One row of K values; y may be x (each element is read before it is written).
void act_quant_row(const float* x, float* y, int64_t k) {
  float amax = 0;
  for (int64_t i = 0; i < k; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float s = 127.0f / std::max(amax, 1e-5f);
  for (int64_t i = 0; i < k; ++i) {
    // nearbyint rounds ties to even in the default rounding mode, as torch.round does (std::round would not).
    const float q = std::clamp(std::nearbyint(x[i] * s), -128.0f, 127.0f);
    y[i] = q / s;
  }
}

void act_quant_i8(const OpCall& call, int64_t /*n_past*/, ThreadPool& pool) {
  const auto* x = static_cast<const float*>(call.in[0]);
  auto* y = static_cast<float*>(call.out);
  const int64_t t = call.out_tensor->shape[0], k = call.out_tensor->shape[1];
  const auto rows = [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) act_quant_row(x + r * k, y + r * k, k);
  };
  // A decode row (one token) is a few thousand values: the pool's wake-up would cost more than the row.
  if (t < 2 || pool.n_threads() < 2) return rows(0, t);
  pool.parallel_range(t, [&](int64_t b, int64_t e, int) { rows(b, e); });
}

[[maybe_unused]] const bool kRegistered = register_op_kernel(graph::Op::ACT_QUANT_I8, {.run = act_quant_i8});

}  // namespace
}  // namespace tessera::cpu
