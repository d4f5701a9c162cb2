// The LoRA step (kernels/lora.h) against the base matmuls alone, on SmolLM2-135M's shapes: the 210 adapted matmuls of
// a token (30 layers x q, k, v, o, gate, up, down; q4_1 base, seeded random weights) with a rank-16 adapter on each, in
// the forms a fast session runs (decode: f16 A and B, so q8_0 A and int8 Bᵀ beside the q4_1 base; a prefill chunk: f16
// A, f32 B). One thread and CPU time, so that a shared machine's load moves the figures little (docs/LORA.md, Speed):
//   tessera_bench_kernels --benchmark_filter=lora/
#include <benchmark/benchmark.h>

#include <memory>
#include <random>
#include <vector>

#include "backends/cpu/kernels.h"
#include "backends/cpu/kernels/lora.h"
#include "core/thread_pool.h"
#include "quant/half.h"
#include "quant/quant.h"

namespace {

using namespace tessera;
using namespace tessera::cpu;

struct Projection {
  int64_t n = 0, k = 0;
  std::vector<uint8_t> q4;
  PackedWeight w;
  std::vector<uint16_t> a, b;  // f16 A [16, k], B [n, 16]
  std::vector<float> b32;      // B in f32 (a prefill chunk's)
  std::unique_ptr<LoraWeights> decode, chunk;
};

const std::vector<Projection>& model() {
  static const std::vector<Projection> ps = [] {
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.0f, 0.05f);
    const int64_t shapes[7][2] = {{576, 576},  {192, 576},  {192, 576}, {576, 576},
                                  {1536, 576}, {1536, 576}, {576, 1536}};
    std::vector<Projection> v(30 * 7);
    for (size_t i = 0; i < v.size(); ++i) {
      Projection& p = v[i];
      p.n = shapes[i % 7][0];
      p.k = shapes[i % 7][1];
      std::vector<float> w(static_cast<size_t>(p.n * p.k));
      for (float& x : w) x = nd(rng);
      p.q4.resize(*dtype_row_bytes(DType::Q4_1, static_cast<uint64_t>(p.n * p.k)));
      quantize_row(DType::Q4_1, w.data(), p.q4.data(), p.n * p.k);
      p.w = prepare_weight(DType::Q4_1, p.q4.data(), p.n, p.k);
      p.a.resize(static_cast<size_t>(16 * p.k));
      p.b.resize(static_cast<size_t>(p.n * 16));
      for (uint16_t& x : p.a) x = f32_to_fp16(nd(rng));
      for (uint16_t& x : p.b) x = f32_to_fp16(nd(rng));
      for (uint16_t x : p.b) p.b32.push_back(fp16_to_f32(x));
      p.decode = std::make_unique<LoraWeights>(
          make_lora_weights({{DType::F16, DType::F16, p.a.data(), p.b.data(), 16}}, p.n, p.k, true));
      p.chunk = std::make_unique<LoraWeights>(
          make_lora_weights({{DType::F16, DType::F32, p.a.data(), p.b32.data(), 16}}, p.n, p.k, true));
    }
    return v;
  }();
  return ps;
}

// state.range(0): tokens (1: a decode step, 128: a prefill chunk); range(1): 0 the base matmuls alone, 1 with LoRA; 2
// and 3 the same with the first layer's seven matmuls run 30 times (weights and adapters hot in the caches), which
// separates the adapters' arithmetic from their misses.
void BM_lora_layerset(benchmark::State& state) {
  const int64_t t = state.range(0);
  const bool lora = state.range(1) % 2 != 0;
  const bool hot = state.range(1) >= 2;
  const std::vector<Projection>& ps = model();
  ThreadPool pool(1);
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> ud(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(t * 1536)), y(x.size()), u(static_cast<size_t>(t * 16));
  for (float& e : x) e = ud(rng);
  for (auto _ : state) {
    for (size_t i = 0; i < ps.size(); ++i) {
      const Projection& p = ps[hot ? i % 7 : i];
      if (lora)
        lora_matmul(pool, p.w, t == 1 ? *p.decode : *p.chunk, x.data(), y.data(), u.data(), t);
      else
        matmul(pool, p.w, x.data(), y.data(), t);
    }
    benchmark::ClobberMemory();
  }
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(t), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_lora_layerset)
    ->Name("lora/smollm2_210_matmuls/tokens_lora")
    ->Args({1, 0})
    ->Args({1, 1})
    ->Args({1, 2})
    ->Args({1, 3})
    ->Args({128, 0})
    ->Args({128, 1})
    ->Unit(benchmark::kMillisecond);

}  // namespace
