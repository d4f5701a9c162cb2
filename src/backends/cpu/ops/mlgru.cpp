// MLGRU (graph.h): the MatMul-free LM's token-mixer recurrence, element-wise per channel, as ridgerchu/matmulfreellm
// computes it (HGRNBitAttention.forward then fused_recurrent_hgrn): f = lb + (1 - lb) * sigmoid(f_raw),
// i = silu(c_raw) * (1 - f), h_t = f * h_{t-1} + i, in f32. The layer's state (IoRole::STATE: h, then the tokens
// it has absorbed) is read at entry (as zeros at position 0: a new sequence) and holds the last row's h at exit:
// O(1) memory per layer, whatever the context. The registered kernel is both modes' reference and the fast path: the
// channels are independent, so they split over the pool; the time steps of one channel are sequential by construction.
#include <cmath>

#include "backends/cpu/op_kernel.h"
#include "core/error.h"

namespace tessera::cpu {
namespace {

// Below this many channels x steps waking the pool costs more than the loop.
constexpr int64_t kMinParallel = 1 << 14;

void mlgru(const OpCall& call, int64_t n_past, ThreadPool& pool) {
  const auto* f_raw = static_cast<const float*>(call.in[0]);  // [T, D]
  const auto* c_raw = static_cast<const float*>(call.in[1]);  // [T, D]
  const auto* lb = static_cast<const float*>(call.in[2]);     // [D]
  // [D + 1], the session's storage: the op updates its state in place (graph.h), the one input a kernel writes.
  auto* state = static_cast<float*>(const_cast<void*>(call.in[3]));
  auto* y = static_cast<float*>(call.out);  // [T, D]
  const int64_t t = call.out_tensor->shape[0], d = call.out_tensor->shape[1];
  // The position is kept as a float: exact below 2^24 tokens. A session that truncated its context and goes on
  // from an earlier position would read a state of later tokens: refuse rather than compute wrong values.
  TESSERA_CHECK(n_past == 0 || state[d] == static_cast<float>(n_past),
                "node '{}': the recurrent state holds {} tokens, not {}: a recurrent model cannot go back to an "
                "earlier position (start again from position 0)",
                call.node->name, state[d], n_past);
  state[d] = static_cast<float>(n_past + t);
  const auto run = [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) {
      float h = n_past == 0 ? 0.0f : state[j];
      for (int64_t s = 0; s < t; ++s) {
        const int64_t i = s * d + j;
        const float f = lb[j] + (1.0f - lb[j]) / (1.0f + std::exp(-f_raw[i]));
        const float c = c_raw[i] / (1.0f + std::exp(-c_raw[i]));
        h = f * h + c * (1.0f - f);
        y[i] = h;
      }
      state[j] = h;
    }
  };
  if (t * d < kMinParallel || pool.n_threads() < 2) return run(0, d);
  pool.parallel_range(d, [&](int64_t b, int64_t e, int) { run(b, e); });
}

[[maybe_unused]] const bool kRegistered = register_op_kernel(graph::Op::MLGRU, {.run = mlgru});

}  // namespace
}  // namespace tessera::cpu
