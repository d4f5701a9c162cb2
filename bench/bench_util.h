// Shared by the kernel benchmarks: the measured read-bandwidth roofline, thread pools, random data.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "core/thread_pool.h"

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

}  // namespace tessera::bench
