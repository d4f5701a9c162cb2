// GEGLU (graph.h): out = gelu_tanh(gate) * up, Gemma's gated activation (HF "gelu_pytorch_tanh", ggml_gelu). The
// registered kernel is both modes' reference and the fast path; on AVX2 CPUs its loop is geglu_avx2.cpp's (the scalar
// std::tanh took ~30% of Gemma 3 270M's prefill), within a few ulp of this file's formula.
#include <cmath>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/op_kernel.h"

namespace tessera::cpu {
namespace detail {
void geglu_avx2(const float* g /*[n]*/, const float* u /*[n]*/, float* y /*[n]*/, int64_t n);  // geglu_avx2.cpp
}  // namespace detail
namespace {

// Below this many elements waking the pool costs more than the loop (a decode row is 2048-16384 values).
constexpr int64_t kMinParallel = 1 << 15;

void geglu(const OpCall& call, int64_t /*n_past*/, ThreadPool& pool) {
  const auto* g = static_cast<const float*>(call.in[0]);
  const auto* u = static_cast<const float*>(call.in[1]);
  auto* y = static_cast<float*>(call.out);  // may be g's or u's storage: each element is read before it is written
  const int64_t n = call.out_tensor->numel();
  const bool avx2 = active_isa() >= Isa::AVX2;
  const auto run = [&](int64_t b, int64_t e) {
    if (avx2) return detail::geglu_avx2(g + b, u + b, y + b, e - b);
    constexpr float kC = 0.7978845608028654f;  // sqrt(2 / pi)
    for (int64_t i = b; i < e; ++i) {
      const float x = g[i];
      y[i] = 0.5f * x * (1.0f + std::tanh(kC * (x + 0.044715f * x * x * x))) * u[i];
    }
  };
  if (n < kMinParallel || pool.n_threads() < 2) return run(0, n);
  pool.parallel_range(n, [&](int64_t b, int64_t e, int) { run(b, e); });
}

[[maybe_unused]] const bool kRegistered = register_op_kernel(graph::Op::GEGLU, {.run = geglu});

}  // namespace
}  // namespace tessera::cpu
