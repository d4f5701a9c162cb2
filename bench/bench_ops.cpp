// The non-matmul kernels at SmolLM2-135M sizes (d 576, ffn 1536, 9 heads / 3 kv heads of 64), decode and prefill,
// plus the thread pool's dispatch cost. Run: build-kernels/bin/tessera_bench_kernels --benchmark_filter='ops/'
#include <benchmark/benchmark.h>

#include <cmath>
#include <vector>

#include "backends/cpu/kernels.h"
#include "bench_util.h"

namespace tessera::bench {
namespace {

void BM_pool_dispatch(benchmark::State& state) {
  ThreadPool& tp = pool(static_cast<int>(state.range(0)));
  int64_t sink = 0;
  for (auto _ : state) {
    tp.parallel_for(state.range(0) * 2, [&](int64_t task, int) { benchmark::DoNotOptimize(sink += task); });
  }
}
BENCHMARK(BM_pool_dispatch)->Name("ops/pool_dispatch/threads")->Arg(1)->Arg(2)->UseRealTime();

void BM_rmsnorm(benchmark::State& state) {
  const int64_t t = state.range(0), d = 576;
  const auto x = random_floats(static_cast<size_t>(t * d), 1), w = random_floats(static_cast<size_t>(d), 2);
  std::vector<float> y(x.size());
  for (auto _ : state) cpu::rmsnorm(x.data(), w.data(), y.data(), t, d, 1e-5f);
  state.SetItemsProcessed(state.iterations() * t * d);
}
BENCHMARK(BM_rmsnorm)->Name("ops/rmsnorm/576/t")->Arg(1)->Arg(512);

void BM_swiglu(benchmark::State& state) {
  const int64_t n = state.range(0);
  const auto g = random_floats(static_cast<size_t>(n), 1, -6, 6), u = random_floats(static_cast<size_t>(n), 2);
  std::vector<float> y(g.size());
  for (auto _ : state) cpu::swiglu(g.data(), u.data(), y.data(), n);
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_swiglu)->Name("ops/swiglu/n")->Arg(1536)->Arg(512 * 1536);

void BM_rope(benchmark::State& state) {
  const int64_t t = state.range(0), heads = 9, hd = 64;
  auto x = random_floats(static_cast<size_t>(t * heads * hd), 1);
  std::vector<int32_t> pos(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(100 + i);
  std::vector<float> inv_freq(hd / 2);
  for (int64_t i = 0; i < hd / 2; ++i) inv_freq[static_cast<size_t>(i)] = std::pow(1e5f, -2.0f * i / hd);
  for (auto _ : state) cpu::rope(x.data(), t, heads, hd, hd, pos.data(), inv_freq.data(), false);
  state.SetItemsProcessed(state.iterations() * t * heads * hd);
}
BENCHMARK(BM_rope)->Name("ops/rope/9x64/t")->Arg(1)->Arg(512);

// Attention over an f16 cache, head-major: (pos0, t) = (ctx, 1) for decode and (0, 512) for a prefill chunk.
void BM_attention(benchmark::State& state) {
  const int64_t pos0 = state.range(0), t = state.range(1), threads = state.range(2);
  const int64_t n_head = 9, n_kv = 3, hd = 64, n_ctx = pos0 + t;
  std::vector<uint16_t> kc(static_cast<size_t>(n_ctx * n_kv * hd)), vc(kc.size());
  const cpu::KvView k = cpu::kv_head_major(DType::F16, kc.data(), n_ctx, n_kv, hd);
  const cpu::KvView v = cpu::kv_head_major(DType::F16, vc.data(), n_ctx, n_kv, hd);
  const auto rows = random_floats(static_cast<size_t>(n_ctx * n_kv * hd), 1);
  cpu::kv_store(k, rows.data(), n_ctx, n_kv, hd, 0);
  cpu::kv_store(v, rows.data(), n_ctx, n_kv, hd, 0);
  const auto q = random_floats(static_cast<size_t>(t * n_head * hd), 2);
  std::vector<float> out(q.size());
  ThreadPool& tp = pool(static_cast<int>(threads));
  for (auto _ : state) cpu::attention(tp, q.data(), k, v, out.data(), t, n_head, n_kv, hd, pos0, 0.125f);
  // QK^T and PV: 2 * 2 * hd flops per (query, visible key), causal.
  const double pairs = static_cast<double>(t) * static_cast<double>(pos0) + static_cast<double>(t * (t + 1) / 2);
  state.counters["GFLOP/s"] =
      benchmark::Counter(4.0 * hd * n_head * pairs * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_attention)
    ->Name("ops/attention/pos0_t_threads")
    ->Args({128, 1, 1})
    ->Args({128, 1, 2})
    ->Args({2048, 1, 2})
    ->Args({0, 512, 1})
    ->Args({0, 512, 2})
    ->UseRealTime();

}  // namespace
}  // namespace tessera::bench
