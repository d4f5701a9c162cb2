// The ternary kernels (matmul_ternary_*.cpp, repacked by repack_ternary.cpp) against matmul_ref on every kernel family
// this CPU has: odd row counts (a partial 8-row group, a partial 16-row AVX-512 pass), decode (t = 1), a partial and a
// full token tile (3, 8) and full tiles plus a remainder (67), K of one and several blocks of 256; weights quantized
// from floats and raw file bytes (every code, tq2_0's unused code 3 included, and any tq1_0 byte).
#include <fmt/core.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "backends/cpu/kernels.h"
#include "core/error.h"
#include "cpu_test_util.h"
#include "quant/half.h"
#include "quant/quant.h"

namespace tessera::cpu {
namespace {

using test::IsaScope;

constexpr float kU = 0x1.0p-24f;  // unit roundoff of float

struct Problem {
  DType dtype;
  int64_t t, n, k;
  std::vector<uint8_t> w;    // [n, k] in dtype
  std::vector<float> x;      // [t, k]
  std::vector<float> ref;    // [t, n] matmul_ref
  std::vector<float> bound;  // [t, n] allowed |y - ref|
};

// The bound of test_matmul.cpp: 8-bit activations move each element by at most amax / 254 of its block (times
// sum |w| over the block), plus float accumulation over k / 32 block terms.
Problem make_problem(DType dtype, int64_t t, int64_t n, int64_t k, std::vector<uint8_t> w, std::vector<float> x) {
  Problem p{dtype, t, n, k, std::move(w), std::move(x), {}, {}};
  const uint64_t row_bytes = *dtype_row_bytes(dtype, static_cast<uint64_t>(k));
  std::vector<float> wf(static_cast<size_t>(n * k));
  for (int64_t j = 0; j < n; ++j)
    dequantize_row(dtype, p.w.data() + static_cast<uint64_t>(j) * row_bytes, wf.data() + j * k, k);
  p.ref.resize(static_cast<size_t>(t * n));
  matmul_ref(dtype, p.w.data(), p.x.data(), p.ref.data(), t, n, k);
  p.bound.resize(static_cast<size_t>(t * n));
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double act = 0.0, abs_dot = 0.0;
      for (int64_t c0 = 0; c0 < k; c0 += 32) {
        double amax = 0.0, wsum = 0.0;
        for (int64_t c = c0; c < c0 + 32; ++c) {
          const double xv = p.x[static_cast<size_t>(i * k + c)], wv = wf[static_cast<size_t>(j * k + c)];
          amax = std::max(amax, std::fabs(xv));
          wsum += std::fabs(wv);
          abs_dot += std::fabs(wv * xv);
        }
        act += amax / 254.0 * wsum;
      }
      p.bound[static_cast<size_t>(i * n + j)] =
          static_cast<float>(1.01 * act + static_cast<double>(k / 32 + 4) * 4 * kU * abs_dot) + 1e-30f;
    }
  }
  return p;
}

std::vector<uint8_t> quantized(std::mt19937& rng, DType dtype, int64_t n, int64_t k) {
  const std::vector<float> w0 = test::random_floats(rng, static_cast<size_t>(n * k));
  std::vector<uint8_t> w(*dtype_row_bytes(dtype, static_cast<uint64_t>(k)) * static_cast<uint64_t>(n));
  quantize_row(dtype, w0.data(), w.data(), n * k);
  return w;
}

// Random file bytes with a finite scale in [0.5, 2) of either sign in every block (the scale is the last 2 bytes).
std::vector<uint8_t> raw_blocks(std::mt19937& rng, DType dtype, int64_t n, int64_t k) {
  const DTypeInfo& info = dtype_info(dtype);
  std::vector<uint8_t> w(*dtype_row_bytes(dtype, static_cast<uint64_t>(k)) * static_cast<uint64_t>(n));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.5f, 2.0f);
  for (size_t b = 0; b < w.size(); b += info.type_size) {
    for (uint32_t i = 0; i + 2 < info.type_size; ++i) w[b + i] = static_cast<uint8_t>(byte(rng));
    const uint16_t d = f32_to_fp16(byte(rng) & 1 ? scale(rng) : -scale(rng));
    std::memcpy(&w[b + info.type_size - 2], &d, 2);
  }
  return w;
}

std::vector<float> run(ThreadPool& pool, const Problem& p) {
  const PackedWeight w = prepare_weight(p.dtype, p.w.data(), p.n, p.k);
  EXPECT_EQ(w.layout, active_isa() >= Isa::AVX2 ? WeightLayout::ROWS_X8 : WeightLayout::ROWS);
  std::vector<float> y(static_cast<size_t>(p.t * p.n), std::nanf(""));
  matmul(pool, w, p.x.data(), y.data(), p.t);
  return y;
}

// Every ISA and 1 and 3 threads against the reference, and against the scalar kernel (same int8 activations and
// integer sums: only the float rounding of the per-block terms may differ).
void check_everywhere(const Problem& p, const std::string& what) {
  std::vector<float> scalar_y;
  for (Isa isa : test::isas()) {
    IsaScope scope(isa);
    for (ThreadPool* pool : {test::pools()[0], test::pools()[2]}) {
      const std::string at = fmt::format("{} isa={} threads={}", what, isa_name(isa), pool->n_threads());
      const std::vector<float> y = run(*pool, p);
      if (scalar_y.empty()) scalar_y = y;
      for (size_t i = 0; i < y.size(); ++i) {
        ASSERT_LE(std::fabs(y[i] - p.ref[i]), p.bound[i])
            << at << " output " << i << ": got " << y[i] << " want " << p.ref[i];
        ASSERT_LE(std::fabs(y[i] - scalar_y[i]), p.bound[i]) << at << " vs scalar, output " << i;
      }
    }
  }
}

TEST(MatmulTernary, MatchesReferenceOnEveryIsa) {
  TESSERA_SEEDED_RNG(rng);
  for (DType dtype : {DType::TQ2_0, DType::TQ1_0}) {
    for (auto [n, k] : std::vector<std::pair<int64_t, int64_t>>{{1, 256}, {7, 512}, {13, 256}, {24, 768}, {67, 512}}) {
      for (int64_t t : {1, 3, 8, 67}) {
        if (n * k * t > 24 * 768 * 67) continue;  // keeps the double-precision reference fast
        const Problem p = make_problem(dtype, t, n, k, quantized(rng, dtype, n, k),
                                       test::random_floats(rng, static_cast<size_t>(t * k)));
        check_everywhere(p, fmt::format("{} t={} n={} k={}", dtype_name(dtype), t, n, k));
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

// Raw bytes: every 2-bit code (3 included, which reads as +2) and every tq1_0 byte go through the repack.
TEST(MatmulTernary, RawFileBlocksMatchReference) {
  TESSERA_SEEDED_RNG(rng);
  for (DType dtype : {DType::TQ2_0, DType::TQ1_0}) {
    for (auto [t, n, k] :
         std::vector<std::tuple<int64_t, int64_t, int64_t>>{{1, 17, 512}, {9, 40, 256}, {1, 96, 512}}) {
      const Problem p = make_problem(dtype, t, n, k, raw_blocks(rng, dtype, n, k),
                                     test::random_floats(rng, static_cast<size_t>(t * k)));
      check_everywhere(p, fmt::format("raw {} t={} n={} k={}", dtype_name(dtype), t, n, k));
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

// The largest sums the kernels meet: every code 3 (tq2_0 bytes 0xFF) or 2 (+1 everywhere) against activations of
// +-127 in every lane. An int16 partial sum that saturated (vpmaddubsw without VNNI) would be off by thousands.
// One token (t = 1, 48 rows) also goes through AVX-512's 32-row decode pass.
TEST(MatmulTernary, ExtremeCodesDoNotOverflow) {
  const int64_t n = 48, k = 512;
  for (int64_t t : {1, 2})
    for (DType dtype : {DType::TQ2_0, DType::TQ1_0}) {
      std::vector<float> x(static_cast<size_t>(t * k), 1.0f);  // int8 127
      std::fill(x.begin() + (t - 1) * k, x.end(), -1.0f);
      const uint64_t row_bytes = *dtype_row_bytes(dtype, static_cast<uint64_t>(k));
      std::vector<uint8_t> w(row_bytes * n);
      if (dtype == DType::TQ2_0) {
        std::fill(w.begin(), w.end(), 0xFF);
        const uint16_t d = f32_to_fp16(1.0f);
        for (size_t b = 0; b < w.size(); b += 66) std::memcpy(&w[b + 64], &d, 2);
      } else {
        const std::vector<float> ones(static_cast<size_t>(n * k), 1.0f);
        quantize_row(dtype, ones.data(), w.data(), n * k);
      }
      const Problem p = make_problem(dtype, t, n, k, w, x);
      check_everywhere(p, fmt::format("extreme {} t={}", dtype_name(dtype), t));
    }
}

// tq1_0 and tq2_0 of the same ternary weights repack to the same codes: the kernels give identical outputs.
TEST(MatmulTernary, Tq1AndTq2OfTheSameWeightsAgreeExactly) {
  TESSERA_SEEDED_RNG(rng);
  const int64_t n = 21, k = 768, t = 5;
  std::uniform_int_distribution<int> trit(-1, 1);
  std::vector<float> w0(static_cast<size_t>(n * k));
  for (auto& v : w0) v = 0.5f * static_cast<float>(trit(rng));
  for (int64_t b = 0; b < n * k; b += 256) w0[static_cast<size_t>(b)] = 0.5f;  // d = 0.5 in every block
  const std::vector<float> x = test::random_floats(rng, static_cast<size_t>(t * k));
  std::vector<std::vector<float>> ys;
  for (DType dtype : {DType::TQ1_0, DType::TQ2_0}) {
    std::vector<uint8_t> w(*dtype_row_bytes(dtype, static_cast<uint64_t>(k)) * n);
    quantize_row(dtype, w0.data(), w.data(), n * k);
    const PackedWeight pw = prepare_weight(dtype, w.data(), n, k);
    std::vector<float> y(static_cast<size_t>(t * n));
    matmul(*test::pools()[0], pw, x.data(), y.data(), t);
    ys.push_back(y);
  }
  EXPECT_EQ(ys[0], ys[1]);
}

TEST(MatmulTernary, RejectsRowsThatAreNotWholeBlocks) {
  std::vector<uint8_t> buf(4096);
  EXPECT_TRUE(matmul_supports(DType::TQ1_0));
  EXPECT_TRUE(matmul_supports(DType::TQ2_0));
  EXPECT_THROW(prepare_weight(DType::TQ2_0, buf.data(), 4, 576), Error);
  EXPECT_THROW(prepare_weight(DType::TQ1_0, buf.data(), 4, 32), Error);
}

}  // namespace
}  // namespace tessera::cpu
