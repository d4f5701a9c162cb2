// Read-bandwidth roofline: a vectorized sum over 1 GiB, split over the thread pool. Decode GEMVs are judged against
// this number (weight bytes per second / roofline).
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>

#include "backends/cpu/cpu_features.h"
#include "bench_util.h"

namespace tessera::bench {
namespace {

constexpr size_t kBytes = size_t{1} << 30;

const float* big_buffer() {
  static std::unique_ptr<float[]> buf = [] {
    std::unique_ptr<float[]> b(new float[kBytes / 4]);
    for (size_t i = 0; i < kBytes / 4; ++i) b[i] = static_cast<float>(i & 7);  // touch every page
    return b;
  }();
  return buf.get();
}

__attribute__((target("avx2"))) float sum_avx2(const float* p, size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
  }
  alignas(32) float t[8];
  _mm256_store_ps(t, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}

float sum_scalar(const float* p, size_t n) {
  float s[4] = {};
  for (size_t i = 0; i + 4 <= n; i += 4)
    for (int l = 0; l < 4; ++l) s[l] += p[i + l];
  return s[0] + s[1] + s[2] + s[3];
}

float parallel_sum(ThreadPool& tp, const float* p, size_t n) {
  const bool avx2 = cpu::best_isa() >= cpu::Isa::AVX2;
  float part[64] = {};
  tp.parallel_range(static_cast<int64_t>(n / 4096), [&](int64_t b, int64_t e, int thread) {
    const float* q = p + b * 4096;
    const auto len = static_cast<size_t>(e - b) * 4096;
    part[thread] += avx2 ? sum_avx2(q, len) : sum_scalar(q, len);
  });
  float s = 0;
  for (float v : part) s += v;
  return s;
}

void BM_read_bandwidth(benchmark::State& state) {
  ThreadPool& tp = pool(static_cast<int>(state.range(0)));
  const float* p = big_buffer();
  for (auto _ : state) benchmark::DoNotOptimize(parallel_sum(tp, p, kBytes / 4));
  state.counters["GB/s"] =
      benchmark::Counter(static_cast<double>(kBytes) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_read_bandwidth)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

ThreadPool& pool(int n) {
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  auto& p = pools[n];
  if (!p) p = std::make_unique<ThreadPool>(n);
  return *p;
}

double read_bandwidth_gbs(int threads) {
  if (const char* env = std::getenv("TESSERA_BENCH_BW_GBS")) return std::atof(env);
  static std::map<int, double> cache;
  auto it = cache.find(threads);
  if (it != cache.end()) return it->second;
  const float* p = big_buffer();
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(parallel_sum(pool(threads), p, kBytes / 4));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(kBytes) / s * 1e-9);
  }
  return cache[threads] = best;
}

}  // namespace tessera::bench
