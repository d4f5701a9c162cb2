// The peer for f32 prefill GEMM: OpenBLAS sgemm on the shapes bench_matmul.cpp runs at T = 512, same thread counts.
// Compare with matmul/f32/... . Built only when pkg-config finds openblas (bench/CMakeLists.txt).
#if defined(TESSERA_HAVE_OPENBLAS)
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <string>
#include <vector>

#include "bench_util.h"
#include "core/error.h"

namespace tessera::bench {
namespace {

void bm_sgemm(benchmark::State& state, int64_t n, int64_t k, int64_t t, int threads) {
  openblas_set_num_threads(threads);
  const std::vector<float> w = random_floats(static_cast<size_t>(n * k), 1);
  const std::vector<float> x = random_floats(static_cast<size_t>(t * k), 2);
  std::vector<float> y(static_cast<size_t>(t * n));
  for (auto _ : state) {
    // y[t, n] = x[t, k] · W[n, k]^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(t), static_cast<int>(n), static_cast<int>(k),
                1.0f, x.data(), static_cast<int>(k), w.data(), static_cast<int>(k), 0.0f, y.data(),
                static_cast<int>(n));
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * static_cast<double>(n * k * t) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

int register_all() {
  const std::pair<int64_t, int64_t> shapes[] = {{576, 576},   {192, 576},  {1536, 576},  {576, 1536},
                                                {2048, 2048}, {512, 2048}, {8192, 2048}, {2048, 8192}};
  for (auto [n, k] : shapes) {
    for (int64_t t : {1, 512}) {
      for (int threads : {1, 2}) {
        const std::string name = fmt::format("openblas_sgemm/{}x{}/t{}/threads:{}", n, k, t, threads);
        benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) { bm_sgemm(s, n, k, t, threads); })
            ->UseRealTime()
            ->Unit(t == 1 ? benchmark::kMicrosecond : benchmark::kMillisecond);
      }
    }
  }
  return 0;
}

const int registered = register_all();

}  // namespace
}  // namespace tessera::bench
#endif
