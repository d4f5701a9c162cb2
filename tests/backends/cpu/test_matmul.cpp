// matmul vs matmul_ref for every dtype, odd shapes, 1-3 threads, and every kernel family the CPU has.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/kernels.h"
#include "core/error.h"
#include "cpu_test_util.h"
#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/quant.h"

namespace tessera::cpu {
namespace {

using test::IsaScope;

constexpr float kU = 0x1.0p-24f;  // unit roundoff of float

bool kquant(DType t) {
  return t == DType::Q2_K || t == DType::Q3_K || t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K;
}
bool quantized(DType t) {
  return t == DType::Q4_0 || t == DType::Q4_1 || t == DType::Q8_0 || t == DType::Q5_0 || t == DType::Q5_1 ||
         t == DType::IQ4_NL || t == DType::IQ4_XS || kquant(t);
}

struct Problem {
  DType dtype;
  int64_t t, n, k;
  std::vector<uint8_t> w;        // [n, k] in dtype
  std::vector<float> wf;         // [n, k] dequantized
  std::vector<float> x;          // [t, k]
  std::vector<float> ref;        // [t, n] matmul_ref
  std::vector<float> abs_dot;    // [t, n] sum_k |w x|
  std::vector<float> act_bound;  // [t, n] worst-case error of 8-bit activations (quantized dtypes)
};

// W [n, k] given as the file's bytes in dtype, x [t, k].
Problem make_problem_raw(DType dtype, int64_t t, int64_t n, int64_t k, std::vector<uint8_t> w, std::vector<float> x) {
  Problem p{dtype, t, n, k, std::move(w), {}, std::move(x), {}, {}, {}};
  const uint64_t row_bytes = *dtype_row_bytes(dtype, static_cast<uint64_t>(k));
  p.wf.resize(static_cast<size_t>(n * k));
  for (int64_t j = 0; j < n; ++j)
    dequantize_row(dtype, p.w.data() + static_cast<uint64_t>(j) * row_bytes, p.wf.data() + j * k, k);
  p.ref.resize(static_cast<size_t>(t * n));
  matmul_ref(dtype, p.w.data(), p.x.data(), p.ref.data(), t, n, k);
  p.abs_dot.assign(static_cast<size_t>(t * n), 0.0f);
  p.act_bound.assign(static_cast<size_t>(t * n), 0.0f);
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double a = 0.0, b = 0.0;
      for (int64_t c0 = 0; c0 < k; c0 += 32) {
        // x rounded to int8 with scale amax/127 moves each element by at most amax/254.
        double amax = 0.0, wsum = 0.0;
        for (int64_t c = c0; c < std::min(k, c0 + 32); ++c) {
          amax = std::max(amax, static_cast<double>(std::fabs(p.x[static_cast<size_t>(i * k + c)])));
          wsum += std::fabs(p.wf[static_cast<size_t>(j * k + c)]);
          a += std::fabs(static_cast<double>(p.wf[static_cast<size_t>(j * k + c)]) *
                         p.x[static_cast<size_t>(i * k + c)]);
        }
        b += amax / 254.0 * wsum;
      }
      p.abs_dot[static_cast<size_t>(i * n + j)] = static_cast<float>(a);
      p.act_bound[static_cast<size_t>(i * n + j)] = static_cast<float>(b);
    }
  }
  return p;
}

// W [n, k] = w0 in dtype, x [t, k].
Problem make_problem(DType dtype, int64_t t, int64_t n, int64_t k, const std::vector<float>& w0, std::vector<float> x) {
  const uint64_t row_bytes = *dtype_row_bytes(dtype, static_cast<uint64_t>(k));
  std::vector<uint8_t> w(row_bytes * static_cast<uint64_t>(n));
  for (int64_t j = 0; j < n; ++j)
    quantize_row(dtype, w0.data() + j * k, w.data() + static_cast<uint64_t>(j) * row_bytes, k);
  return make_problem_raw(dtype, t, n, k, std::move(w), std::move(x));
}

Problem make_problem(std::mt19937& rng, DType dtype, int64_t t, int64_t n, int64_t k) {
  const std::vector<float> w0 = test::random_floats(rng, static_cast<size_t>(n * k));
  return make_problem(dtype, t, n, k, w0, test::random_floats(rng, static_cast<size_t>(t * k)));
}

// Allowed |y - ref| for one output.
// Float weights: the kernel sums k products in float; the worst case of any summation order is k * u * sum|w x|.
// Quantized weights: the activation rounding bound (sum over blocks of amax/254 * sum|w|, exact worst case) plus float
// accumulation over k/32 block terms, bounded by (k/32 + 4) * u * sum|w x| with the block terms and scales folded in;
// 1% slack on the first covers rounding inside the scale computation.
float tolerance(const Problem& p, size_t idx) {
  if (!quantized(p.dtype)) return static_cast<float>(p.k) * kU * p.abs_dot[idx] + 1e-30f;
  return 1.01f * p.act_bound[idx] + static_cast<float>(p.k / 32 + 4) * 4 * kU * p.abs_dot[idx] + 1e-30f;
}

std::vector<float> run(ThreadPool& pool, const Problem& p) {
  const PackedWeight w = prepare_weight(p.dtype, p.w.data(), p.n, p.k);
  std::vector<float> y(static_cast<size_t>(p.t * p.n), std::nanf(""));
  matmul(pool, w, p.x.data(), y.data(), p.t);
  return y;
}

void check_against_ref(const Problem& p, const std::vector<float>& y, const std::string& what) {
  double err2 = 0.0, ref2 = 0.0;
  for (size_t i = 0; i < y.size(); ++i) {
    ASSERT_LE(std::fabs(y[i] - p.ref[i]), tolerance(p, i))
        << what << " output " << i << ": got " << y[i] << " want " << p.ref[i];
    err2 += (y[i] - p.ref[i]) * static_cast<double>(y[i] - p.ref[i]);
    ref2 += static_cast<double>(p.ref[i]) * p.ref[i];
  }
  // The worst-case bound above is ~sqrt(k) looser than typical errors, so also check the mean: for uniform x the
  // normalized MSE of 8-bit activations is (d^2/12)/E[x^2] = (1/127^2/12)/(1/3) = 1.6e-5; 1e-4 leaves room for the
  // chi-square spread of >= 64 outputs (ggml's mul_mat test accepts 5e-4 for the same scheme).
  if (quantized(p.dtype) && y.size() >= 64) {
    EXPECT_LT(err2 / ref2, 1e-4) << what << " normalized MSE";
  }
}

TEST(Matmul, MatchesReferenceForEveryDtypeShapeThreadCountAndIsa) {
  TESSERA_SEEDED_RNG(rng);
  const DType dtypes[] = {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1};
  const int64_t ts[] = {1, 2, 3, 7, 33};
  for (DType dtype : dtypes) {
    const bool q = quantized(dtype);
    const std::vector<std::pair<int64_t, int64_t>> shapes =
        q ? std::vector<std::pair<int64_t, int64_t>>{{1, 32}, {7, 64}, {13, 160}, {67, 96}, {200, 576}}
          : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {7, 7}, {13, 33}, {67, 100}, {150, 40}, {200, 576}};
    for (auto [n, k] : shapes) {
      for (int64_t t : ts) {
        if (n * k * t > 200 * 576 * 7) continue;  // keeps the double-precision reference fast
        const Problem p = make_problem(rng, dtype, t, n, k);
        std::vector<float> scalar_y;
        for (Isa isa : test::isas()) {
          IsaScope scope(isa);
          for (ThreadPool* pool : test::pools()) {
            const std::string what = fmt::format("{} t={} n={} k={} isa={} threads={}", dtype_name(dtype), t, n, k,
                                                 isa_name(isa), pool->n_threads());
            const std::vector<float> y = run(*pool, p);
            check_against_ref(p, y, what);
            if (::testing::Test::HasFatalFailure()) return;
            if (isa == Isa::SCALAR && pool->n_threads() == 1) scalar_y = y;
            // Same int8 activations and block arithmetic in every kernel family: only the float rounding of the
            // per-block accumulation may differ (one rounding per block term, fma or not).
            for (size_t i = 0; q && i < y.size(); ++i)
              ASSERT_LE(std::fabs(y[i] - scalar_y[i]), static_cast<float>(k / 32 + 4) * 4 * kU * p.abs_dot[i] + 1e-30f)
                  << what << " vs scalar, output " << i;
          }
        }
      }
    }
  }
}

// The K-quants' kernels (matmul_kquant_*.cpp): every ISA path this CPU has, odd row counts (a partial 8-row group, a
// partial 16-row AVX-512 pass), decode (t = 1), short and long prefill tiles (3, 8 and 67 tokens: full tiles plus
// every remainder size), against the reference with the bound of the 8-bit activations, and against the scalar kernel.
TEST(Matmul, KQuantsMatchReferenceOnEveryIsa) {
  TESSERA_SEEDED_RNG(rng);
  const DType dtypes[] = {DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q2_K, DType::Q3_K};
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 256}, {7, 512}, {13, 256}, {24, 768}, {67, 512}};
  for (DType dtype : dtypes) {
    for (auto [n, k] : shapes) {
      for (int64_t t : {1, 3, 8, 67}) {
        if (n * k * t > 24 * 768 * 67) continue;  // keeps the double-precision reference fast
        const Problem p = make_problem(rng, dtype, t, n, k);
        std::vector<float> scalar_y;
        for (Isa isa : test::isas()) {
          IsaScope scope(isa);
          for (ThreadPool* pool : {test::pools()[0], test::pools()[2]}) {
            const std::string what = fmt::format("{} t={} n={} k={} isa={} threads={}", dtype_name(dtype), t, n, k,
                                                 isa_name(isa), pool->n_threads());
            const PackedWeight w = prepare_weight(p.dtype, p.w.data(), p.n, p.k);
            EXPECT_EQ(w.layout, isa >= Isa::AVX2 ? WeightLayout::ROWS_X8 : WeightLayout::ROWS) << what;
            std::vector<float> y(static_cast<size_t>(p.t * p.n), std::nanf(""));
            matmul(*pool, w, p.x.data(), y.data(), p.t);
            check_against_ref(p, y, what);
            if (::testing::Test::HasFatalFailure()) return;
            if (isa == Isa::SCALAR && pool->n_threads() == 1) scalar_y = y;
            for (size_t i = 0; i < y.size(); ++i)
              ASSERT_LE(std::fabs(y[i] - scalar_y[i]), static_cast<float>(k / 32 + 4) * 4 * kU * p.abs_dot[i] + 1e-30f)
                  << what << " vs scalar, output " << i;
          }
        }
      }
    }
  }
}

// q5_0, q5_1, iq4_nl and iq4_xs (matmul_q5iq4*.cpp, repacked by repack_q5iq4.cpp) on every kernel family this CPU
// has: odd row counts (a partial 8-row group, a partial 16-row AVX-512 pass), T = 1 (decode), 3 and 8 (one partial and
// one full token tile) and 67 (full tiles and a remainder), K of one and several iq4_xs super-blocks.
TEST(Matmul, Q5AndIQ4MatchReferenceOnEveryIsa) {
  TESSERA_SEEDED_RNG(rng);
  for (DType dtype : {DType::Q5_0, DType::Q5_1, DType::IQ4_NL, DType::IQ4_XS}) {
    for (auto [n, k] : std::vector<std::pair<int64_t, int64_t>>{{1, 256}, {13, 512}, {67, 256}, {40, 768}}) {
      for (int64_t t : {1, 3, 8, 67}) {
        const Problem p = make_problem(rng, dtype, t, n, k);
        std::vector<float> scalar_y;
        for (Isa isa : test::isas()) {
          IsaScope scope(isa);
          for (ThreadPool* pool : test::pools()) {
            if (pool->n_threads() == 2 && isa != Isa::SCALAR) continue;  // 1 and 3 threads cover the splits
            const std::string what = fmt::format("{} t={} n={} k={} isa={} threads={}", dtype_name(dtype), t, n, k,
                                                 isa_name(isa), pool->n_threads());
            const std::vector<float> y = run(*pool, p);
            check_against_ref(p, y, what);
            if (::testing::Test::HasFatalFailure()) return;
            if (isa == Isa::SCALAR && pool->n_threads() == 1) scalar_y = y;
            for (size_t i = 0; i < y.size(); ++i)
              ASSERT_LE(std::fabs(y[i] - scalar_y[i]), static_cast<float>(k / 32 + 4) * 4 * kU * p.abs_dot[i] + 1e-30f)
                  << what << " vs scalar, output " << i;
          }
        }
      }
    }
  }
}

// The largest products the kernels meet: q5 codes 31 and iq4's -127 against activations of 127, in every lane. An
// int16 partial sum that saturates (vpmaddubsw without VNNI) would be off by thousands of steps.
TEST(Matmul, Q5AndIQ4ExtremeCodesDoNotOverflow) {
  const int64_t n = 16, k = 256, t = 2;
  std::vector<float> w0(static_cast<size_t>(n * k), 0.9375f);
  for (int64_t i = 0; i < n * k; i += 32) w0[static_cast<size_t>(i)] = -1.0f;  // q5: 0.9375 -> code 31
  std::vector<float> x(static_cast<size_t>(t * k), 1.0f);                      // int8 127 everywhere
  std::fill(x.begin() + k, x.end(), -1.0f);
  std::vector<float> w_iq4(static_cast<size_t>(n * k), -1.0f);  // iq4: code 0, value -127
  for (DType dtype : {DType::Q5_0, DType::Q5_1, DType::IQ4_NL, DType::IQ4_XS}) {
    const bool iq4 = dtype == DType::IQ4_NL || dtype == DType::IQ4_XS;
    const Problem p = make_problem(dtype, t, n, k, iq4 ? w_iq4 : w0, x);
    for (Isa isa : test::isas()) {
      IsaScope scope(isa);
      check_against_ref(p, run(*test::pools()[0], p), fmt::format("{} isa={}", dtype_name(dtype), isa_name(isa)));
    }
  }
}

// q8_0's extreme codes, which its kernels store biased by 128 (matmul_internal.h): -128 (a file may hold it; the
// quantizer writes -127 .. 127) becomes 0 and 127 becomes 255, against activations of +-127 in every lane, for one
// token (the GEMV) and several (the token tiles), and 24 rows (a partial 16-row AVX-512 pass).
TEST(Matmul, Q8_0ExtremeCodesMatchReference) {
  const int64_t n = 24, k = 128;
  std::vector<BlockQ8_0> blocks(static_cast<size_t>(n * k / 32));
  for (size_t i = 0; i < blocks.size(); ++i) {
    blocks[i].d = f32_to_fp16(0.25f);
    for (int j = 0; j < 32; ++j)
      blocks[i].qs[j] = static_cast<int8_t>((i + static_cast<size_t>(j / 4)) % 3 == 0 ? 127 : -128);
  }
  std::vector<uint8_t> w(blocks.size() * sizeof(BlockQ8_0));
  std::memcpy(w.data(), blocks.data(), w.size());
  for (int64_t t : {1, 5}) {
    std::vector<float> x(static_cast<size_t>(t * k));
    for (size_t i = 0; i < x.size(); ++i) x[i] = (i / 7) % 2 == 0 ? 1.0f : -1.0f;  // int8 +-127
    const Problem p = make_problem_raw(DType::Q8_0, t, n, k, w, x);
    for (Isa isa : test::isas()) {
      IsaScope scope(isa);
      check_against_ref(p, run(*test::pools()[0], p), fmt::format("q8_0 t={} isa={}", t, isa_name(isa)));
    }
  }
}

TEST(Matmul, PreparedWeightKeepsTheFileRows) {
  std::vector<float> w(8 * 64, 0.5f);
  const PackedWeight pw = prepare_weight(DType::F32, w.data(), 8, 64);
  EXPECT_EQ(pw.rows, w.data());
  EXPECT_EQ(pw.layout, WeightLayout::ROWS);
}

TEST(Matmul, RejectsBadShapesAndDtypes) {
  std::vector<uint8_t> buf(4096);
  EXPECT_THROW(prepare_weight(DType::Q4_1, buf.data(), 4, 48), Error);    // k not a multiple of 32
  EXPECT_THROW(prepare_weight(DType::Q4_K, buf.data(), 4, 288), Error);   // k not a multiple of 256
  EXPECT_THROW(prepare_weight(DType::IQ4_XS, buf.data(), 4, 32), Error);  // k not a multiple of 256
  EXPECT_THROW(prepare_weight(DType::Q8_1, buf.data(), 4, 256), Error);   // a format the CPU cannot read
  EXPECT_THROW(prepare_weight(DType::F32, buf.data(), 0, 8), Error);
  EXPECT_THROW(prepare_weight(DType::F32, nullptr, 4, 8), Error);
  EXPECT_FALSE(matmul_supports(DType::Q8_1));
  EXPECT_TRUE(matmul_supports(DType::Q6_K));
  EXPECT_TRUE(matmul_supports(DType::Q4_1));
  ThreadPool pool(1);
  const PackedWeight pw = prepare_weight(DType::F32, buf.data(), 4, 8);
  std::vector<float> x(8), y(4);
  EXPECT_THROW(matmul(pool, pw, x.data(), y.data(), 0), Error);
  EXPECT_THROW(matmul(pool, PackedWeight{}, x.data(), y.data(), 1), Error);
}

}  // namespace
}  // namespace tessera::cpu
