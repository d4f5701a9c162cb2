// TEAL's sparse GEMV (kernels/matmul_sparse.h) against the dense kernel on the same zeroed x, for every format with a
// sparse kernel (q4_K through its q4_1 copy), every ISA at or above AVX2, 1-3 threads, N not
// a multiple of the 32-row tiles, and sparsities that skip nothing, single channels, whole 32-channel blocks and
// everything.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "backends/cpu/kernels.h"
#include "backends/cpu/kernels/matmul_sparse.h"
#include "core/error.h"
#include "cpu_test_util.h"
#include "quant/quant.h"

namespace tessera::cpu {
namespace {

using test::IsaScope;

std::vector<uint8_t> random_weight(std::mt19937& rng, DType dt, int64_t n, int64_t k) {
  const std::vector<float> w0 = test::random_floats(rng, static_cast<size_t>(n * k));
  const uint64_t rb = *dtype_row_bytes(dt, static_cast<uint64_t>(k));
  std::vector<uint8_t> w(rb * static_cast<uint64_t>(n));
  for (int64_t j = 0; j < n; ++j) quantize_row(dt, w0.data() + j * k, w.data() + static_cast<uint64_t>(j) * rb, k);
  return w;
}

// x [t, k] with a share `s` of its entries zeroed; at s >= 0.97 whole 32-blocks are zeroed too.
std::vector<float> sparse_x(std::mt19937& rng, int64_t t, int64_t k, float s) {
  std::vector<float> x = test::random_floats(rng, static_cast<size_t>(t * k));
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (auto& v : x)
    if (u(rng) < s) v = 0.0f;
  if (s >= 0.97f)
    for (int64_t i = 0; i < t * k; ++i)
      if ((i % k) / 32 % 2 == 0) x[static_cast<size_t>(i)] = 0.0f;
  return x;
}

// q4_K runs the q4_1 sparse kernel on a q4_1 copy (matmul_sparse.h), checked against its own dense kernel here: the
// copy rounds D = d sc and M = -dmin m to fp16, at most 2^-11 of each, so its bound adds 2^-11 sum |x| (|D q| + |M|)
// <= 2e-3 sum |x| for these weights (|w| <= ~1.1, so |D q| <= ~2.2 and |M| <= ~1.1); its rows are whole super-blocks.
// The ternary formats have no sparse path (their q4_1 copy would read 2.4x their dense kernel's bytes; docs/TEAL.md).
TEST(MatmulSparse, MatchesDenseKernelOnTheSameX) {
  TESSERA_SEEDED_RNG(rng);
  for (const Isa isa : test::isas()) {
    if (isa < Isa::AVX2) continue;
    IsaScope scope(isa);
    EXPECT_FALSE(sparse_matmul_supports(DType::TQ2_0));
    EXPECT_FALSE(sparse_matmul_supports(DType::TQ1_0));
    for (const DType dt : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q4_K}) {
      const bool q4k = dt == DType::Q4_K;
      ASSERT_TRUE(sparse_matmul_supports(dt)) << dtype_name(dt);
      const std::vector<std::pair<int64_t, int64_t>> shapes =
          q4k ? std::vector<std::pair<int64_t, int64_t>>{{1000, 1536}, {96, 512}, {7, 256}}
              : std::vector<std::pair<int64_t, int64_t>>{{1000, 1536}, {96, 576}, {7, 64}};
      for (const auto& [n, k] : shapes) {
        const std::vector<uint8_t> w = random_weight(rng, dt, n, k);
        const PackedWeight pw = prepare_weight(dt, w.data(), n, k);
        const SparseWeight sw = prepare_sparse_weight(dt, w.data(), n, k);
        EXPECT_EQ(sw.dtype, q4k ? DType::Q4_1 : dt);
        for (const float s : {0.0f, 0.5f, 0.97f, 1.0f}) {
          const int64_t t = 2;
          const std::vector<float> x = sparse_x(rng, t, k, s);
          for (ThreadPool* pool : test::pools()) {
            std::vector<float> dense(static_cast<size_t>(t * n)), sparse(static_cast<size_t>(t * n), -1.0f);
            matmul(*pool, pw, x.data(), dense.data(), t);
            matmul_sparse(*pool, sw, x.data(), sparse.data(), t);
            for (int64_t i = 0; i < t; ++i) {
              // Same products (integer sums for quantized formats), summed in another order: float rounding of
              // sum |w x| <= k (|x| <= 1, |w| <= ~1.1); q4_K's copy adds its fp16 rounding (above).
              double sum_x = 0;
              for (int64_t c = 0; c < k; ++c) sum_x += std::fabs(x[static_cast<size_t>(i * k + c)]);
              const double tol = 1e-5 * static_cast<double>(k) + (q4k ? 2e-3 * sum_x : 0.0);
              for (int64_t j = 0; j < n; ++j) {
                const float d = dense[static_cast<size_t>(i * n + j)], sp = sparse[static_cast<size_t>(i * n + j)];
                ASSERT_NEAR(sp, d, tol) << dtype_name(dt) << " isa " << isa_name(isa) << " n " << n << " k " << k
                                        << " s " << s << " row " << i << " out " << j << " threads "
                                        << pool->n_threads();
                if (s == 1.0f) {
                  ASSERT_EQ(sp, 0.0f);
                }
              }
            }
          }
        }
      }
    }
  }
}

// The nonzero structure of x is built once for the matmuls that read one buffer (q, k and v; gate and up) and rebuilt
// when the buffer's contents change (the next token writes the same buffer), for float and quantized weights alike.
TEST(MatmulSparse, ReusesTheStructureOfAnUnchangedInputOnly) {
  TESSERA_SEEDED_RNG(rng);
  ThreadPool pool(2);
  const int64_t k = 576;
  std::vector<float> x = sparse_x(rng, 1, k, 0.5f);
  for (const DType dt : {DType::Q4_1, DType::F16}) {
    std::vector<std::vector<uint8_t>> w;  // outlives pw: a float PackedWeight may point into it
    std::vector<PackedWeight> pw;
    std::vector<SparseWeight> sw;
    for (const int64_t n : {int64_t{576}, int64_t{192}}) {
      w.push_back(random_weight(rng, dt, n, k));
      pw.push_back(prepare_weight(dt, w.back().data(), n, k));
      sw.push_back(prepare_sparse_weight(dt, w.back().data(), n, k));
    }
    for (int step = 0; step < 4; ++step) {
      if (step == 2) x = sparse_x(rng, 1, k, 0.5f);       // another buffer
      if (step == 3) x[0] = x[0] == 0.0f ? 0.75f : 0.0f;  // same buffer, new contents
      for (size_t i = 0; i < sw.size(); ++i) {
        std::vector<float> dense(static_cast<size_t>(sw[i].n)), sparse(static_cast<size_t>(sw[i].n));
        matmul(pool, pw[i], x.data(), dense.data(), 1);
        matmul_sparse(pool, sw[i], x.data(), sparse.data(), 1);
        for (size_t j = 0; j < dense.size(); ++j)
          ASSERT_NEAR(sparse[j], dense[j], 1e-5f * static_cast<float>(k))
              << dtype_name(dt) << " step " << step << " weight " << i << " out " << j;
      }
    }
  }
}

TEST(MatmulSparse, RefusesWhatItCannotRun) {
  IsaScope scope(Isa::SCALAR);
  EXPECT_FALSE(sparse_matmul_supports(DType::Q4_1));
  std::vector<uint8_t> w(64 * 20);
  EXPECT_THROW(prepare_sparse_weight(DType::Q4_1, w.data(), 2, 64), Error);
}

// Timing on this machine (not a check): run with --gtest_also_run_disabled_tests --gtest_filter='*Timing*'.
TEST(MatmulSparse, DISABLED_Timing) {
  std::mt19937 rng(1);
  ThreadPool pool(1);
  for (const DType dt : {DType::Q4_1, DType::Q8_0, DType::F16}) {
    for (const auto& [n, k] : std::vector<std::pair<int64_t, int64_t>>{{1536, 576}, {576, 1536}, {576, 576}}) {
      const std::vector<uint8_t> w = random_weight(rng, dt, n, k);
      const PackedWeight pw = prepare_weight(dt, w.data(), n, k);
      const SparseWeight sw = prepare_sparse_weight(dt, w.data(), n, k);
      for (const float s : {0.0f, 0.5f}) {
        const std::vector<float> x = sparse_x(rng, 1, k, s);
        std::vector<float> y(static_cast<size_t>(n));
        const auto time = [&](auto&& fn) {
          std::vector<double> us;
          // The machine is shared: the fastest of many short runs is the one no other process interrupted.
          for (int rep = 0; rep < 60; ++rep) {
            const auto t0 = std::chrono::steady_clock::now();
            for (int i = 0; i < 10; ++i) fn();
            us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 10);
          }
          return *std::min_element(us.begin(), us.end());
        };
        const double td = time([&] { matmul(pool, pw, x.data(), y.data(), 1); });
        const double ts = time([&] { matmul_sparse(pool, sw, x.data(), y.data(), 1); });
        std::printf("%-5s %5lldx%-5lld s=%.2f dense %7.2f us  sparse %7.2f us  ratio %.2f\n",
                    std::string(dtype_name(dt)).c_str(), static_cast<long long>(n), static_cast<long long>(k), s, td,
                    ts, td / ts);
      }
    }
  }
}

// Timing with the weights out of cache, as in a decode step (not a check): 120 copies of a 1536x576 weight (66 MB of
// q4_1, the size of SmolLM2's block weights) walked in turn, dense against sparse at 50%, 1 and 2 threads.
// Run with --gtest_also_run_disabled_tests --gtest_filter='*TimingCold*'.
TEST(MatmulSparse, DISABLED_TimingCold) {
  std::mt19937 rng(1);
  constexpr int kCopies = 120;
  const int64_t n = 1536, k = 576;
  for (const DType dt : {DType::Q4_1, DType::Q8_0}) {
    const std::vector<uint8_t> w = random_weight(rng, dt, n, k);
    std::vector<PackedWeight> pw;
    std::vector<SparseWeight> sw;
    for (int i = 0; i < kCopies; ++i) {
      pw.push_back(prepare_weight(dt, w.data(), n, k));
      sw.push_back(prepare_sparse_weight(dt, w.data(), n, k));
    }
    for (const int threads : {1, 2}) {
      ThreadPool pool(threads);
      for (const float s : {0.0f, 0.5f}) {
        const std::vector<float> x = sparse_x(rng, 1, k, s);
        std::vector<float> y(static_cast<size_t>(n));
        const auto time = [&](auto&& fn) {
          std::vector<double> us;
          for (int rep = 0; rep < 15; ++rep) {
            const auto t0 = std::chrono::steady_clock::now();
            for (int i = 0; i < kCopies; ++i) fn(i);
            us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
                         kCopies);
          }
          return *std::min_element(us.begin(), us.end());
        };
        const double td = time([&](int i) { matmul(pool, pw[static_cast<size_t>(i)], x.data(), y.data(), 1); });
        const double ts = time([&](int i) { matmul_sparse(pool, sw[static_cast<size_t>(i)], x.data(), y.data(), 1); });
        std::printf("cold %-5s %lldx%lld threads %d s=%.2f dense %7.2f us  sparse %7.2f us  ratio %.2f\n",
                    std::string(dtype_name(dt)).c_str(), static_cast<long long>(n), static_cast<long long>(k), threads,
                    s, td, ts, td / ts);
      }
    }
  }
}

}  // namespace
}  // namespace tessera::cpu
