// rmsnorm, rope, swiglu, add, embedding, argmax vs their references, under every kernel family the CPU has.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "backends/cpu/kernels.h"
#include "core/error.h"
#include "cpu_test_util.h"
#include "quant/quant.h"

namespace tessera::cpu {
namespace {

using test::IsaScope;

constexpr float kU = 0x1.0p-24f;

TEST(Rmsnorm, MatchesReference) {
  TESSERA_SEEDED_RNG(rng);
  for (Isa isa : test::isas()) {
    IsaScope scope(isa);
    for (int64_t t : {1, 3, 7}) {
      for (int64_t d : {1, 5, 16, 33, 576}) {
        const auto x = test::random_floats(rng, static_cast<size_t>(t * d), -3.0f, 3.0f);
        const auto w = test::random_floats(rng, static_cast<size_t>(d));
        std::vector<float> ref(x.size()), y(x.size()), inplace = x;
        rmsnorm_ref(x.data(), w.data(), ref.data(), t, d, 1e-5f);
        rmsnorm(x.data(), w.data(), y.data(), t, d, 1e-5f);
        rmsnorm(inplace.data(), w.data(), inplace.data(), t, d, 1e-5f);
        // A float sum of d squares (relative error <= d u), a sqrt and two products: (d + 8) u relative.
        for (size_t i = 0; i < y.size(); ++i) {
          const float tol = static_cast<float>(d + 8) * kU * std::fabs(ref[i]) + 1e-30f;
          ASSERT_LE(std::fabs(y[i] - ref[i]), tol) << isa_name(isa) << " t=" << t << " d=" << d << " i=" << i;
          ASSERT_EQ(inplace[i], y[i]);
        }
      }
    }
  }
}

TEST(Rope, MatchesReferenceInBothModes) {
  TESSERA_SEEDED_RNG(rng);
  struct Case {
    int64_t t, heads, hd, rope_dim;
  };
  for (const Case c : {Case{1, 1, 2, 2}, Case{3, 9, 64, 64}, Case{7, 2, 128, 128}, Case{2, 3, 64, 32}}) {
    for (bool neox : {false, true}) {
      const auto x = test::random_floats(rng, static_cast<size_t>(c.t * c.heads * c.hd));
      std::vector<int32_t> pos(static_cast<size_t>(c.t));
      for (auto& p : pos) p = std::uniform_int_distribution<int32_t>(0, 8191)(rng);
      std::vector<float> inv_freq(static_cast<size_t>(c.rope_dim / 2));
      for (size_t i = 0; i < inv_freq.size(); ++i)
        inv_freq[i] = std::pow(10000.0f, -2.0f * static_cast<float>(i) / static_cast<float>(c.rope_dim));
      std::vector<float> ref = x, y = x;
      rope_ref(ref.data(), c.t, c.heads, c.hd, c.rope_dim, pos.data(), inv_freq.data(), neox);
      rope(y.data(), c.t, c.heads, c.hd, c.rope_dim, pos.data(), inv_freq.data(), neox);
      // cos/sin rounded to float (u each), then two products and a sum of |x| <= 1 values: 4u * (|x0| + |x1|) <= 8u.
      for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], ref[i], 8 * kU) << "neox=" << neox << " i=" << i;
      // Elements past rope_dim pass through untouched.
      for (int64_t h = 0; h < c.t * c.heads; ++h)
        for (int64_t e = c.rope_dim; e < c.hd; ++e)
          ASSERT_EQ(y[static_cast<size_t>(h * c.hd + e)], x[static_cast<size_t>(h * c.hd + e)]);
    }
  }
}

// rope keeps the cos/sin rows of its last calls (rope.cpp): positions or frequencies that differ in one value must
// not be served from them, and a set seen two calls back must still be right.
TEST(Rope, TablesFollowPositionsAndFrequencies) {
  const int64_t t = 5, heads = 2, hd = 16;
  std::vector<float> f1(hd / 2), f2(hd / 2);
  for (int64_t i = 0; i < hd / 2; ++i) {
    f1[static_cast<size_t>(i)] = std::pow(10000.0f, -2.0f * static_cast<float>(i) / static_cast<float>(hd));
    f2[static_cast<size_t>(i)] = std::pow(1000000.0f, -2.0f * static_cast<float>(i) / static_cast<float>(hd));
  }
  const std::vector<int32_t> p1 = {0, 1, 2, 3, 4}, p2 = {0, 1, 2, 3, 900};
  std::mt19937 rng(3);
  const std::vector<float> x = test::random_floats(rng, static_cast<size_t>(t * heads * hd));
  const std::pair<const std::vector<int32_t>*, const std::vector<float>*> calls[] = {
      {&p1, &f1}, {&p2, &f1}, {&p1, &f2}, {&p1, &f1}, {&p2, &f2}, {&p2, &f1}};
  for (const auto& [pos, freq] : calls) {
    std::vector<float> ref = x, y = x;
    rope_ref(ref.data(), t, heads, hd, hd, pos->data(), freq->data(), true);
    rope(y.data(), t, heads, hd, hd, pos->data(), freq->data(), true);
    for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], ref[i], 8 * kU) << "element " << i;  // as above
  }
}

TEST(Rope, NormalModeRotatesAdjacentPairsAndNeoxRotatesHalves) {
  // pos 1, theta = pi/2 for the first pair: (a, b) -> (-b, a).
  const float inv_freq[2] = {static_cast<float>(M_PI / 2), 0.0f};
  const int32_t pos[1] = {1};
  float normal[4] = {1, 2, 3, 4}, neox[4] = {1, 2, 3, 4};
  rope(normal, 1, 1, 4, 4, pos, inv_freq, false);
  rope(neox, 1, 1, 4, 4, pos, inv_freq, true);
  const float want_normal[4] = {-2, 1, 3, 4}, want_neox[4] = {-3, 2, 1, 4};
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(normal[i], want_normal[i], 1e-6f);
    EXPECT_NEAR(neox[i], want_neox[i], 1e-6f);
  }
  float x[4] = {};
  EXPECT_THROW(rope(x, 1, 1, 4, 3, pos, inv_freq, false), Error);  // odd rope_dim
  EXPECT_THROW(rope(x, 1, 1, 4, 6, pos, inv_freq, false), Error);  // rope_dim > head_dim
}

TEST(Swiglu, MatchesReference) {
  TESSERA_SEEDED_RNG(rng);
  for (Isa isa : test::isas()) {
    IsaScope scope(isa);
    for (int64_t n : {1, 7, 8, 33, 1536}) {
      auto g = test::random_floats(rng, static_cast<size_t>(n), -20.0f, 20.0f);
      const auto u = test::random_floats(rng, static_cast<size_t>(n), -2.0f, 2.0f);
      if (n >= 8) {
        g[0] = -100.0f;  // exp(-g) overflows float: silu must still be ~0, not NaN
        g[1] = 100.0f;
      }
      std::vector<float> ref(g.size()), y(g.size());
      swiglu_ref(g.data(), u.data(), ref.data(), n);
      swiglu(g.data(), u.data(), y.data(), n);
      // exp within a few ulp, then a division and two products: 16u relative; tiny results need an absolute floor.
      for (size_t i = 0; i < y.size(); ++i)
        ASSERT_NEAR(y[i], ref[i], 16 * kU * std::fabs(ref[i]) + 1e-30f) << isa_name(isa) << " g=" << g[i];
    }
  }
}

TEST(Add, MatchesReference) {
  TESSERA_SEEDED_RNG(rng);
  const auto x = test::random_floats(rng, 37);
  auto a = test::random_floats(rng, 37);
  auto b = a;
  add_ref(a.data(), x.data(), 37);
  add(b.data(), x.data(), 37);
  EXPECT_EQ(a, b);  // one float add per element: exact agreement
}

TEST(Embedding, MatchesReferenceForEveryReadableDtype) {
  TESSERA_SEEDED_RNG(rng);
  const int64_t vocab = 11, d = 64;
  const std::vector<int32_t> ids = {0, 10, 3, 3, 7};
  for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1}) {
    const auto src = test::random_floats(rng, static_cast<size_t>(vocab * d));
    const uint64_t row = *dtype_row_bytes(dt, d);
    std::vector<uint8_t> table(row * vocab);
    for (int64_t r = 0; r < vocab; ++r) quantize_row(dt, src.data() + r * d, table.data() + row * r, d);
    std::vector<float> y(ids.size() * d), want(d);
    embedding(dt, table.data(), vocab, ids.data(), y.data(), static_cast<int64_t>(ids.size()), d);
    for (size_t i = 0; i < ids.size(); ++i) {
      dequantize_row(dt, table.data() + row * static_cast<uint64_t>(ids[i]), want.data(), d);
      for (int64_t c = 0; c < d; ++c) ASSERT_EQ(y[i * d + c], want[c]) << dtype_name(dt);
    }
  }
  std::vector<float> table(vocab * d), out(d);
  const int32_t bad[1] = {11}, negative[1] = {-1};
  EXPECT_THROW(embedding(DType::F32, table.data(), vocab, bad, out.data(), 1, d), Error);
  EXPECT_THROW(embedding(DType::F32, table.data(), vocab, negative, out.data(), 1, d), Error);
  EXPECT_THROW(embedding(DType::Q4_1, table.data(), vocab, ids.data(), out.data(), 1, 48), Error);
}

TEST(Argmax, MatchesReferenceIncludingTiesAndNans) {
  TESSERA_SEEDED_RNG(rng);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (Isa isa : test::isas()) {
    IsaScope scope(isa);
    for (int64_t n : {1, 7, 8, 9, 100, 49152}) {
      auto x = test::random_floats(rng, static_cast<size_t>(n));
      EXPECT_EQ(argmax(x.data(), n), argmax_ref(x.data(), n)) << isa_name(isa) << " n=" << n;
      if (n >= 9) {
        x[3] = 5.0f;
        x[static_cast<size_t>(n - 1)] = 5.0f;  // tie: the first wins
        x[1] = nan;
        EXPECT_EQ(argmax(x.data(), n), 3) << isa_name(isa);
        EXPECT_EQ(argmax_ref(x.data(), n), 3);
      }
    }
    const std::vector<float> all_neg_inf = {-inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf};
    EXPECT_EQ(argmax(all_neg_inf.data(), 9), 0);
    const std::vector<float> nan_first = {nan, nan, -inf, -inf, -inf, -inf, -inf, -inf, -inf, 1.0f};
    EXPECT_EQ(argmax(nan_first.data(), 9), argmax_ref(nan_first.data(), 9));
    EXPECT_EQ(argmax(nan_first.data(), 10), 9);
    const std::vector<float> late_tie = {0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 2, 0};
    EXPECT_EQ(argmax(late_tie.data(), 18), 8);
  }
  EXPECT_THROW(argmax(nullptr, 0), Error);
}

}  // namespace
}  // namespace tessera::cpu
