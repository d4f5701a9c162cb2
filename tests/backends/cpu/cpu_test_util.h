// Shared by the CPU kernel tests: seeded random inputs (seed printed, TESSERA_TEST_SEED reproduces a run), thread
// pools of 1, 2 and 3 threads, and a guard that runs a body under every kernel family this CPU has.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_features.h"
#include "core/thread_pool.h"

namespace tessera::cpu::test {

// A fresh seed per test unless TESSERA_TEST_SEED is set; tests print it with SCOPED_TRACE so a failure can be rerun.
inline uint32_t test_seed() {
  if (const char* s = std::getenv("TESSERA_TEST_SEED")) return static_cast<uint32_t>(std::strtoul(s, nullptr, 10));
  return std::random_device{}();
}

inline std::vector<float> random_floats(std::mt19937& rng, size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& e : v) e = dist(rng);
  return v;
}

// Pools of 1, 2 and 3 threads: 3 on a 2-core machine catches partitioning bugs that an even split hides.
inline std::vector<ThreadPool*>& pools() {
  static ThreadPool p1(1), p2(2), p3(3);
  static std::vector<ThreadPool*> all{&p1, &p2, &p3};
  return all;
}

// Every kernel family the CPU can run, scalar first.
inline std::vector<Isa> isas() {
  std::vector<Isa> v;
  for (Isa isa : {Isa::SCALAR, Isa::AVX2, Isa::AVX2_VNNI, Isa::AVX512_VNNI})
    if (isa_supported(isa)) v.push_back(isa);
  return v;
}

// Sets the active family for a scope and restores the previous one.
class IsaScope {
 public:
  explicit IsaScope(Isa isa) : saved_(active_isa()) { set_active_isa(isa); }
  ~IsaScope() { set_active_isa(saved_); }
  IsaScope(const IsaScope&) = delete;
  IsaScope& operator=(const IsaScope&) = delete;

 private:
  Isa saved_;
};

#define TESSERA_SEEDED_RNG(rng)                             \
  const uint32_t seed_ = ::tessera::cpu::test::test_seed(); \
  SCOPED_TRACE("seed=" + std::to_string(seed_));            \
  std::mt19937 rng(seed_)

}  // namespace tessera::cpu::test
