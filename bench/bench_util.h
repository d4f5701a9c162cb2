// Shared by the kernel benchmarks: the measured read-bandwidth roofline, thread pools, random data.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "quant/quant.h"

namespace tessera::bench {

// Pool with n threads, created once per process (workers persist across benchmarks like they do in a session).
ThreadPool& pool(int n);

// Read bandwidth in GB/s with n threads (vectorized sum over 1 GiB, best of 3), measured once per process;
// TESSERA_BENCH_BW_GBS overrides it.
double read_bandwidth_gbs(int threads);

inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& e : v) e = dist(rng);
  return v;
}

// The ternary kernels' case (bench_ternary_lut.cpp, bench_ternary_sign.cpp): a random [n, k] TQ2_0 matrix
// (quantize_row of uniform floats, seed 5) and an input row (seed 6).
struct Tq2Case {
  std::vector<uint8_t> tq2;  // [n, k] TQ2_0
  std::vector<float> x;      // [k]
};
inline Tq2Case make_tq2_case(int64_t n, int64_t k) {
  Tq2Case c;
  const std::vector<float> wf = random_floats(static_cast<size_t>(n * k), 5);
  const uint64_t row = *dtype_row_bytes(DType::TQ2_0, static_cast<uint64_t>(k));
  c.tq2.resize(row * static_cast<uint64_t>(n));
  for (int64_t j = 0; j < n; ++j) quantize_row(DType::TQ2_0, wf.data() + j * k, c.tq2.data() + row * j, k);
  c.x = random_floats(static_cast<size_t>(k), 6);
  return c;
}

}  // namespace tessera::bench
