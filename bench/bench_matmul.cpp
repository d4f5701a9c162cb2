// matmul at the shapes of SmolLM2-135M, Llama-3.2-1B and Llama-3-8B, every dtype, T = 1 (decode GEMV) and T = 512
// (prefill GEMM), 1 and 2 threads. Counters: GB/s of weight bytes and % of the measured read roofline (T = 1),
// GFLOP/s (T > 1). Run: build-kernels/bin/tessera_bench_kernels --benchmark_filter='matmul/q4_1'
//
// T = 1 cycles through enough copies of the weight to exceed the L3 (decode streams the whole model, which does not
// fit), so the GB/s is DRAM bandwidth, not cache bandwidth. T = 512 uses one copy: its weights are reused 512 times.
#include <benchmark/benchmark.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/kernels.h"
#include "bench_util.h"
#include "core/error.h"
#include "quant/quant.h"

namespace tessera::bench {
namespace {

struct Shape {
  const char* model;
  int64_t n, k;
};

const Shape kShapes[] = {
    {"smollm2", 576, 576},    {"smollm2", 192, 576},   {"smollm2", 1536, 576},  {"smollm2", 576, 1536},
    {"smollm2", 49152, 576},  {"llama1b", 2048, 2048}, {"llama1b", 512, 2048},  {"llama1b", 8192, 2048},
    {"llama1b", 2048, 8192},  {"llama8b", 4096, 4096}, {"llama8b", 1024, 4096}, {"llama8b", 14336, 4096},
    {"llama8b", 4096, 14336}, {"gemma3", 1024, 640},   {"gemma3", 256, 640},    {"gemma3", 640, 1024},
    {"gemma3", 2048, 640},    {"gemma3", 640, 2048},   {"gemma3", 262144, 640},
};

const DType kDtypes[] = {DType::Q4_1,   DType::Q8_0,  DType::Q4_0, DType::Q5_0, DType::Q5_1, DType::IQ4_NL,
                         DType::IQ4_XS, DType::Q4_K,  DType::Q5_K, DType::Q6_K, DType::Q2_K, DType::Q3_K,
                         DType::TQ2_0,  DType::TQ1_0, DType::F16,  DType::BF16, DType::F32};

constexpr uint64_t kColdBytes = uint64_t{128} << 20;  // 4x the 32 MiB L3 of the machine this was tuned on

// Weights of the most recent (dtype, shape): benchmarks are registered grouped by it, so one entry suffices and the
// big f32 matrices are not all alive at once.
struct Weights {
  DType dtype;
  int64_t n = 0, k = 0;
  std::vector<std::vector<uint8_t>> copies;  // [n, k] in dtype, each
  std::vector<cpu::PackedWeight> packed;
};

Weights& weights(DType dtype, int64_t n, int64_t k, size_t copies) {
  static Weights w;
  if (w.dtype != dtype || w.n != n || w.k != k || w.copies.size() < copies) {
    w = Weights{dtype, n, k, {}, {}};
    const uint64_t row = *dtype_row_bytes(dtype, static_cast<uint64_t>(k));
    std::vector<uint8_t> base(row * static_cast<uint64_t>(n));
    const std::vector<float> src = random_floats(static_cast<size_t>(k), 7);
    std::vector<float> r(static_cast<size_t>(k));
    std::mt19937 rng(11);
    for (int64_t j = 0; j < n; ++j) {
      // Rows are scaled copies of one random row: generating n*k fresh randoms per shape would dominate startup.
      const float s = std::uniform_real_distribution<float>(0.5f, 1.5f)(rng);
      for (int64_t c = 0; c < k; ++c) r[static_cast<size_t>(c)] = src[static_cast<size_t>((c + j) % k)] * s;
      quantize_row(dtype, r.data(), base.data() + row * static_cast<uint64_t>(j), k);
    }
    for (size_t c = 0; c < copies; ++c) {
      w.copies.push_back(base);
      w.packed.push_back(cpu::prepare_weight(dtype, w.copies.back().data(), n, k));
    }
  }
  return w;
}

void bm_matmul(benchmark::State& state, DType dtype, Shape shape, int64_t t, int threads, bool warm) {
  const uint64_t bytes = *dtype_row_bytes(dtype, static_cast<uint64_t>(shape.k)) * static_cast<uint64_t>(shape.n);
  const size_t copies =
      t == 1 && !warm ? static_cast<size_t>(std::max<uint64_t>(1, (kColdBytes + bytes - 1) / bytes)) : 1;
  Weights& w = weights(dtype, shape.n, shape.k, copies);
  const std::vector<float> x = random_floats(static_cast<size_t>(t * shape.k), 3);
  std::vector<float> y(static_cast<size_t>(t * shape.n));
  ThreadPool& tp = pool(threads);
  size_t i = 0;
  for (auto _ : state) {
    cpu::matmul(tp, w.packed[i], x.data(), y.data(), t);
    benchmark::DoNotOptimize(y.data());
    i = i + 1 == copies ? 0 : i + 1;
  }
  const double flops = 2.0 * static_cast<double>(shape.n) * static_cast<double>(shape.k) * static_cast<double>(t);
  if (t == 1) {
    state.counters["GB/s"] =
        benchmark::Counter(static_cast<double>(bytes) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
    // Filled in below from the same rate: % of the read bandwidth the same thread count reaches.
    state.counters["roofline%"] =
        benchmark::Counter(static_cast<double>(bytes) * 1e-9 * 100.0 / read_bandwidth_gbs(threads),
                           benchmark::Counter::kIsIterationInvariantRate);
  }
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// Accuracy of the 8-bit-activation kernels against the f64 reference (same dequantized weights, float x): reported as
// counters (normalized MSE, max |err| / max |ref|, mean |err| / mean |ref|), not timed.
void bm_accuracy(benchmark::State& state, DType dtype, int64_t n, int64_t k, int64_t t) {
  const std::vector<float> wsrc = random_floats(static_cast<size_t>(n * k), 5);
  const std::vector<float> x = random_floats(static_cast<size_t>(t * k), 6);
  const uint64_t row = *dtype_row_bytes(dtype, static_cast<uint64_t>(k));
  std::vector<uint8_t> wq(row * static_cast<uint64_t>(n));
  for (int64_t j = 0; j < n; ++j)
    quantize_row(dtype, wsrc.data() + j * k, wq.data() + row * static_cast<uint64_t>(j), k);
  std::vector<float> ref(static_cast<size_t>(t * n)), y(ref.size());
  cpu::matmul_ref(dtype, wq.data(), x.data(), ref.data(), t, n, k);
  const cpu::PackedWeight pw = cpu::prepare_weight(dtype, wq.data(), n, k);
  for (auto _ : state) cpu::matmul(pool(1), pw, x.data(), y.data(), t);
  double e2 = 0, r2 = 0, emax = 0, rmax = 0, esum = 0, rsum = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double e = std::fabs(static_cast<double>(y[i]) - ref[i]);
    e2 += e * e;
    r2 += static_cast<double>(ref[i]) * ref[i];
    emax = std::max(emax, e);
    rmax = std::max(rmax, std::fabs(static_cast<double>(ref[i])));
    esum += e;
    rsum += std::fabs(static_cast<double>(ref[i]));
  }
  state.counters["nmse"] = e2 / r2;
  state.counters["max_err/max_ref"] = emax / rmax;
  state.counters["mean_err/mean_ref"] = esum / rsum;
}

int register_all() {
  for (DType dt : {DType::Q4_1, DType::Q8_0, DType::Q4_0, DType::Q5_0, DType::Q5_1, DType::IQ4_NL, DType::IQ4_XS,
                   DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q2_K, DType::Q3_K, DType::TQ2_0, DType::TQ1_0}) {
    for (int64_t k : {576, 4096}) {
      if (k % dtype_info(dt).block_size != 0) continue;  // 256-element super-blocks need whole rows of them
      const std::string name = fmt::format("accuracy/{}/{}x{}/t8", dtype_name(dt), 256, k);
      benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) {
        bm_accuracy(s, dt, 256, k, 8);
      })->Iterations(1);
    }
  }
  for (DType dt : kDtypes) {
    for (Shape s : kShapes) {
      // SmolLM2's rows of 576 are no whole 256-block of the ternary formats (no ternary file holds them): those run
      // padded to 768 (named "576x768pad"), an upper bound on the time of a kernel with a partial last block.
      const bool pad = (dt == DType::TQ2_0 || dt == DType::TQ1_0) && s.k % 256 != 0;
      if (pad) s.k = (s.k + 255) / 256 * 256;
      if (s.k % dtype_info(dt).block_size != 0) continue;  // e.g. SmolLM2's rows of 576 for the K-quants
      for (int64_t t : {1, 512}) {
        // Prefill at T = 512 for the two smaller models only (an 8B layer at T = 512 takes seconds per iteration),
        // and not the 49152- and 262144-row output matrices, which prefill applies to the last token only.
        if (t > 1 && (std::string(s.model) == "llama8b" || s.n >= 49152)) continue;
        if (s.k % dtype_info(dt).block_size != 0) continue;  // iq4_xs: rows of whole 256-element super-blocks
        for (int threads : {1, 2}) {
          // T = 1 also "warm": one copy, which stays in L2/L3 for the smaller shapes, to show the kernel's own speed.
          for (bool warm : t == 1 ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
            const std::string name = fmt::format("matmul/{}/{}/{}x{}{}/t{}{}/threads:{}", dtype_name(dt), s.model, s.n,
                                                 s.k, pad ? "pad" : "", t, warm ? "/warm" : "", threads);
            benchmark::RegisterBenchmark(name.c_str(),
                                         [=](benchmark::State& st) { bm_matmul(st, dt, s, t, threads, warm); })
                ->UseRealTime()
                ->Unit(t == 1 ? benchmark::kMicrosecond : benchmark::kMillisecond);
          }
        }
      }
    }
  }
  return 0;
}

const int registered = register_all();

}  // namespace
}  // namespace tessera::bench
