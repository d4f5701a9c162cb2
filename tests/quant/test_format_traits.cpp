// The traits table (quant/format_traits.h, quant.h): its facts against dtype.h's layout table, the K-quant quantizers'
// error bounds, the 8-bit-activation dot products against a float64 dot of the same values, convert_rows (what a
// backend does at load for a format it has no kernel for), and FormatSupport's tables and texts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <set>
#include <vector>

#include "quant/format_support.h"
#include "quant/half.h"
#include "quant/quant.h"
#include "tessera/error.h"

namespace tessera {
namespace {

uint32_t test_seed() {
  if (const char* s = std::getenv("TESSERA_SEED")) return static_cast<uint32_t>(std::strtoul(s, nullptr, 10));
  return std::random_device{}();
}

// Sub-blocks of varied shape and scale (centred, one-signed, offset, heavy-tailed, one outlier), 5 decades of scale.
std::vector<float> random_values(std::mt19937& rng, int64_t n) {
  std::vector<float> x(static_cast<size_t>(n));
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t b = 0; b < n / 16; ++b) {
    const float scale = std::pow(10.0f, -2.0f + 4.0f * u01(rng));
    for (int64_t j = 0; j < 16; ++j) {
      float& v = x[static_cast<size_t>(16 * b + j)];
      switch (b % 5) {
        case 0:
          v = scale * normal(rng);
          break;
        case 1:
          v = scale * u01(rng);
          break;
        case 2:
          v = scale * (u01(rng) + 3.0f);
          break;
        case 3:
          v = scale * normal(rng) * normal(rng) * normal(rng);
          break;
        default:
          v = scale * (j == 5 ? 50.0f : 0.01f * normal(rng));
          break;
      }
    }
  }
  return x;
}

TEST(FormatTraits, AgreeWithTheDtypeTable) {
  ASSERT_GE(formats().size(), 11u);
  DType prev = formats()[0].type;
  for (const FormatInfo& f : formats()) {
    SCOPED_TRACE(f.name);
    const DTypeInfo& d = dtype_info(f.type);
    EXPECT_EQ(d.name, f.name);
    EXPECT_EQ(d.block_size, static_cast<uint32_t>(f.block_size));
    EXPECT_EQ(d.type_size, static_cast<uint32_t>(f.block_bytes));
    EXPECT_EQ(d.is_quantized, f.quantized);
    EXPECT_NE(f.to_float, nullptr);
    EXPECT_EQ(f.dot_q8 != nullptr, f.quantized) << "every quantized format has an 8-bit-activation dot product";
    EXPECT_EQ(format_info(f.type), &f);
    EXPECT_TRUE(can_dequantize(f.type));
    if (&f != &formats()[0]) {
      EXPECT_LT(static_cast<uint32_t>(prev), static_cast<uint32_t>(f.type)) << "DType order";
    }
    prev = f.type;
  }
  EXPECT_EQ(format_info(DType::Q8_1), nullptr);
  EXPECT_EQ(format_info(DType::I32), nullptr);
}

// The device-usable traits are the ones the table runs: Format<D>::dequantize of one block equals dequantize_row.
TEST(FormatTraits, BlockDequantizeIsTheRowFunction) {
  std::mt19937 rng(test_seed());
  const auto x = random_values(rng, 256);
  BlockQ6_K b6;
  quantize_row(DType::Q6_K, x.data(), &b6, 256);
  std::vector<float> a(256), b(256);
  Format<DType::Q6_K>::dequantize(b6, a.data());
  dequantize_row(DType::Q6_K, &b6, b.data(), 256);
  EXPECT_EQ(a, b);
  BlockQ4_1 b41;
  quantize_row(DType::Q4_1, x.data(), &b41, 32);
  Format<DType::Q4_1>::dequantize(b41, a.data());
  dequantize_row(DType::Q4_1, &b41, b.data(), 32);
  EXPECT_EQ(std::vector<float>(a.begin(), a.begin() + 32), std::vector<float>(b.begin(), b.begin() + 32));
  BlockQ2_K b2;
  quantize_row(DType::Q2_K, x.data(), &b2, 256);
  Format<DType::Q2_K>::dequantize(b2, a.data());
  dequantize_row(DType::Q2_K, &b2, b.data(), 256);
  EXPECT_EQ(a, b);
  BlockQ3_K b3;
  quantize_row(DType::Q3_K, x.data(), &b3, 256);
  Format<DType::Q3_K>::dequantize(b3, a.data());
  dequantize_row(DType::Q3_K, &b3, b.data(), 256);
  EXPECT_EQ(a, b);
  BlockQ5_K b5;
  quantize_row(DType::Q5_K, x.data(), &b5, 256);
  Format<DType::Q5_K>::dequantize(b5, a.data());
  dequantize_row(DType::Q5_K, &b5, b.data(), 256);
  EXPECT_EQ(a, b);
}

// q6_K: per sub-block of 16 the step is |d * sc|. The quantizer rounds d and sc up, so the step is at least the
// sub-block's max|x| / 32 and no element is clipped more than one step (the positive twin of the extreme at +32 steps
// becomes 31): |err| <= step. And the step is not coarser than needed: step <= max|x| / 32 + d (sc rounded up by less
// than 1), d <= max over sub-blocks of max|x| / 32 / 127, rounded up to a half (relative 2^-10).
TEST(KQuantRoundTrip, Q6_KErrorBound) {
  const uint32_t seed = test_seed();
  SCOPED_TRACE(::testing::Message() << "TESSERA_SEED=" << seed);
  std::mt19937 rng(seed);
  const int64_t n = 256 * 256;
  const auto x = random_values(rng, n);
  std::vector<BlockQ6_K> q(static_cast<size_t>(n / 256));
  quantize_row(DType::Q6_K, x.data(), q.data(), n);
  std::vector<float> y(static_cast<size_t>(n));
  dequantize_row(DType::Q6_K, q.data(), y.data(), n);
  double worst_ratio = 0, num = 0, den = 0;
  for (int64_t b = 0; b < n / 256; ++b) {
    const float d = fp16_to_f32(q[static_cast<size_t>(b)].d);
    float max_amax = 0;
    for (int j = 0; j < 16; ++j) {
      float amax = 0;
      for (int l = 0; l < 16; ++l) amax = std::max(amax, std::fabs(x[static_cast<size_t>(256 * b + 16 * j + l)]));
      max_amax = std::max(max_amax, amax);
      const float step = std::fabs(d * static_cast<float>(q[static_cast<size_t>(b)].scales[j]));
      ASSERT_GE(step * (1 + 1e-6), amax / 32) << "block " << b << " sub-block " << j;
      ASSERT_LE(step, amax / 32 + d * (1 + 1e-6)) << "block " << b << " sub-block " << j;
      for (int l = 0; l < 16; ++l) {
        const size_t i = static_cast<size_t>(256 * b + 16 * j + l);
        const double err = std::fabs(double(y[i]) - x[i]);
        ASSERT_LE(err, step * (1 + 1e-5)) << "element " << i;
        if (step > 0) worst_ratio = std::max(worst_ratio, err / step);
        num += err * err;
        den += double(x[i]) * x[i];
      }
    }
    ASSERT_LE(d, max_amax / 32 / 127 * (1 + 1.0 / 1024) * (1 + 1e-6)) << "block " << b;
  }
  EXPECT_GT(worst_ratio, 0.45) << "the bound is loose: no element came near it";
  // Rounding to 64 levels: (step^2 / 12) / E[x^2] ~ 1e-4 for these blocks; 1e-3 fails a step twice too coarse.
  EXPECT_LT(num / den, 1e-3);
}

// The asymmetric K-quants (q2_K, q4_K, q5_K): per sub-block of len elements, step = d * sc >= (max - min(min, 0)) /
// levels (d and sc rounded up) and offset dmin * m within dmin / 2 of -min(min, 0): |err| <= step / 2 + dmin / 2, and
// step <= range / levels + d. `scale_min(block, j)` reads sub-block j's codes.
template <typename Block, typename ScaleMin>
void check_min_format(DType t, int len, int levels, double max_nmse, ScaleMin scale_min) {
  const uint32_t seed = test_seed();
  SCOPED_TRACE(::testing::Message() << dtype_name(t) << " TESSERA_SEED=" << seed);
  std::mt19937 rng(seed);
  const int64_t n = 256 * 256;
  const auto x = random_values(rng, n);
  std::vector<Block> q(static_cast<size_t>(n / 256));
  quantize_row(t, x.data(), q.data(), n);
  std::vector<float> y(static_cast<size_t>(n));
  dequantize_row(t, q.data(), y.data(), n);
  double worst_ratio = 0, num = 0, den = 0;
  for (int64_t b = 0; b < n / 256; ++b) {
    const Block& blk = q[static_cast<size_t>(b)];
    const float d = fp16_to_f32(blk.d), dmin = fp16_to_f32(blk.dmin);
    for (int j = 0; j < 256 / len; ++j) {
      float lo = 0, hi = 0;
      for (int l = 0; l < len; ++l) {
        lo = std::min(lo, x[static_cast<size_t>(256 * b + len * j + l)]);
        hi = std::max(hi, x[static_cast<size_t>(256 * b + len * j + l)]);
      }
      const auto [sc, m] = scale_min(blk, j);
      (void)m;
      const float step = d * static_cast<float>(sc);
      ASSERT_GE(step * (1 + 1e-6), (hi - lo) / levels) << "block " << b << " sub-block " << j;
      ASSERT_LE(step, (hi - lo) / levels + d * (1 + 1e-6)) << "block " << b << " sub-block " << j;
      const double bound = step / 2 + dmin / 2;
      for (int l = 0; l < len; ++l) {
        const size_t i = static_cast<size_t>(256 * b + len * j + l);
        const double err = std::fabs(double(y[i]) - x[i]);
        ASSERT_LE(err, bound * (1 + 1e-5) + 1e-30) << "element " << i;
        if (bound > 0) worst_ratio = std::max(worst_ratio, err / bound);
        num += err * err;
        den += double(x[i]) * x[i];
      }
    }
  }
  EXPECT_GT(worst_ratio, 0.4) << "the bound is loose: no element came near it";
  EXPECT_LT(num / den, max_nmse);
}

// Rounding to levels + 1 values over the range: (step^2 / 12) / E[x^2] ~ 2e-3 (q4_K), 5e-4 (q5_K), 5e-2 (q2_K) for
// these blocks; each limit fails a step twice too coarse.
TEST(KQuantRoundTrip, Q4_KErrorBound) {
  check_min_format<BlockQ4_K>(DType::Q4_K, 32, 15, 1e-2, [](const BlockQ4_K& b, int j) {
    int sc, m;
    format_detail::q4_k_scale_min(j, b.scales, &sc, &m);
    return std::pair{sc, m};
  });
}

TEST(KQuantRoundTrip, Q5_KErrorBound) {
  check_min_format<BlockQ5_K>(DType::Q5_K, 32, 31, 2.5e-3, [](const BlockQ5_K& b, int j) {
    int sc, m;
    format_detail::q4_k_scale_min(j, b.scales, &sc, &m);
    return std::pair{sc, m};
  });
}

TEST(KQuantRoundTrip, Q2_KErrorBound) {
  check_min_format<BlockQ2_K>(DType::Q2_K, 16, 3, 0.2, [](const BlockQ2_K& b, int j) {
    return std::pair{b.scales[j] & 0xF, b.scales[j] >> 4};
  });
}

// q3_K as q6_K: per sub-block of 16 the step is |d * (sc - 32)| >= max|x| / 4 (d and sc rounded up), |err| <= step
// (the positive twin of the extreme at -4 steps is clipped to +3), and step <= max|x| / 4 + d.
TEST(KQuantRoundTrip, Q3_KErrorBound) {
  const uint32_t seed = test_seed();
  SCOPED_TRACE(::testing::Message() << "TESSERA_SEED=" << seed);
  std::mt19937 rng(seed);
  const int64_t n = 256 * 256;
  const auto x = random_values(rng, n);
  std::vector<BlockQ3_K> q(static_cast<size_t>(n / 256));
  quantize_row(DType::Q3_K, x.data(), q.data(), n);
  std::vector<float> y(static_cast<size_t>(n));
  dequantize_row(DType::Q3_K, q.data(), y.data(), n);
  double worst_ratio = 0, num = 0, den = 0;
  for (int64_t b = 0; b < n / 256; ++b) {
    const float d = fp16_to_f32(q[static_cast<size_t>(b)].d);
    float max_amax = 0;
    for (int j = 0; j < 16; ++j) {
      float amax = 0;
      for (int l = 0; l < 16; ++l) amax = std::max(amax, std::fabs(x[static_cast<size_t>(256 * b + 16 * j + l)]));
      max_amax = std::max(max_amax, amax);
      const int s = format_detail::q3_k_scale(j, q[static_cast<size_t>(b)].scales) - 32;
      const float step = std::fabs(d * static_cast<float>(s));
      ASSERT_GE(step * (1 + 1e-6), amax / 4) << "block " << b << " sub-block " << j;
      ASSERT_LE(step, amax / 4 + d * (1 + 1e-6)) << "block " << b << " sub-block " << j;
      for (int l = 0; l < 16; ++l) {
        const size_t i = static_cast<size_t>(256 * b + 16 * j + l);
        const double err = std::fabs(double(y[i]) - x[i]);
        ASSERT_LE(err, step * (1 + 1e-5)) << "element " << i;
        if (step > 0) worst_ratio = std::max(worst_ratio, err / step);
        num += err * err;
        den += double(x[i]) * x[i];
      }
    }
    ASSERT_LE(d, max_amax / 4 / 31 * (1 + 1.0 / 1024) * (1 + 1e-6)) << "block " << b;
  }
  EXPECT_GT(worst_ratio, 0.45) << "the bound is loose: no element came near it";
  // 8 levels: (step^2 / 12) / E[x^2] ~ 2e-2 for these blocks; 0.1 fails a step twice too coarse.
  EXPECT_LT(num / den, 0.1);
}

TEST(KQuantRoundTrip, ZeroAndConstantBlocks) {
  for (const DType t :
       {DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS}) {
    for (const float v : {0.0f, 1.0f, -3.0f}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(t) << " all " << v);
      std::vector<float> x(256, v), y(256, 7.0f);
      std::vector<uint8_t> q(*dtype_row_bytes(t, 256));
      quantize_row(t, x.data(), q.data(), 256);
      dequantize_row(t, q.data(), y.data(), 256);
      for (float e : y) EXPECT_NEAR(e, v, std::fabs(v) * 1e-3);
    }
  }
}

// iq4_nl / iq4_xs (Tessera's own quantizers): every element's code is the table value nearest to x / (the scale it is
// decoded with), so |err| <= 12 |scale| (half the table's widest gap, 113 - 89) inside the table's range and the
// distance to its end beyond; and the scale search is worth its cost: iq4_nl's squared error is at most that of the
// plain scale max / -127 (the search's first trial, before refitting), measured here on the same blocks.
double iq4_nearest_err(float x, float scale) {
  double best = INFINITY;
  for (int c = 0; c < 16; ++c)
    best = std::min(best, std::fabs(double(x) - double(scale) * format_detail::iq4nl_value(c)));
  return best;
}

TEST(IQ4RoundTrip, CodesAreNearestAndTheSearchBeatsTheMaxScale) {
  const uint32_t seed = test_seed();
  SCOPED_TRACE(::testing::Message() << "TESSERA_SEED=" << seed);
  std::mt19937 rng(seed);
  const int64_t n = 256 * 256;
  const auto x = random_values(rng, n);
  double base_err = 0, den = 0, nmse[2] = {0, 0}, worst_ratio = 0;
  for (size_t i = 0; i < x.size(); i += 32) {
    float amax = 0, max = 0;
    for (size_t l = i; l < i + 32; ++l) {
      if (std::fabs(x[l]) > amax) {
        amax = std::fabs(x[l]);
        max = x[l];
      }
    }
    const float d0 = fp16_to_f32(f32_to_fp16(max / -127.0f));
    for (size_t l = i; l < i + 32; ++l) {
      base_err += iq4_nearest_err(x[l], d0) * iq4_nearest_err(x[l], d0);
      den += double(x[l]) * x[l];
    }
  }
  for (const DType t : {DType::IQ4_NL, DType::IQ4_XS}) {
    SCOPED_TRACE(dtype_name(t));
    std::vector<uint8_t> q(*dtype_row_bytes(t, n));
    quantize_row(t, x.data(), q.data(), n);
    std::vector<float> y(static_cast<size_t>(n));
    dequantize_row(t, q.data(), y.data(), n);
    double err2 = 0;
    for (int64_t j = 0; j < n / 32; ++j) {
      float scale;
      if (t == DType::IQ4_NL) {
        scale = fp16_to_f32(reinterpret_cast<const BlockIQ4_NL*>(q.data())[j].d);
      } else {
        const BlockIQ4_XS& b = reinterpret_cast<const BlockIQ4_XS*>(q.data())[j / 8];
        scale = fp16_to_f32(b.d) * static_cast<float>(format_detail::iq4_xs_scale(b, static_cast<int>(j % 8)));
      }
      for (int64_t l = 32 * j; l < 32 * j + 32; ++l) {
        const size_t e = static_cast<size_t>(l);
        const double err = std::fabs(double(y[e]) - x[e]);
        ASSERT_LE(err, iq4_nearest_err(x[e], scale) * (1 + 1e-6) + 1e-30) << "element " << l << " is not nearest";
        const double inside = std::fabs(x[e]) <= std::fabs(scale) * (x[e] * scale < 0 ? 127 : 113);
        if (inside) {
          ASSERT_LE(err, 12 * std::fabs(scale) * (1 + 1e-6)) << "element " << l;
          if (scale != 0) worst_ratio = std::max(worst_ratio, err / (12 * std::fabs(scale)));
        }
        err2 += err * err;
      }
    }
    nmse[t == DType::IQ4_XS] = err2 / den;
  }
  EXPECT_GT(worst_ratio, 0.5) << "the bound is loose: no element came near it";
  EXPECT_LE(nmse[0], base_err / den) << "iq4_nl: the search lost to the plain max scale";
  // The 6-bit sub-block scales cost iq4_xs accuracy; a misplaced scale or sub-block would cost far more.
  EXPECT_LE(nmse[1], 2 * base_err / den) << "iq4_xs";
  std::printf("[ nmse     ] iq4_nl %.3e, iq4_xs %.3e, max-scale baseline %.3e\n", nmse[0], nmse[1], base_err / den);
}

// dot_q8: integer sums per block, scaled in float. Against a float64 dot of the same dequantized weights with the
// same dequantized activations (d * qs), the only difference is float rounding of a handful of scaled partial sums
// per block: relative 1e-5 of the sum of |terms| is ample and far below any indexing slip (which moves whole terms).
TEST(FormatTraits, DotQ8MatchesFloat64DotOfTheSameValues) {
  const uint32_t seed = test_seed();
  SCOPED_TRACE(::testing::Message() << "TESSERA_SEED=" << seed);
  std::mt19937 rng(seed);
  const int64_t k = 1024;
  for (const FormatInfo& f : formats()) {
    if (!f.quantized) continue;
    SCOPED_TRACE(f.name);
    for (int rep = 0; rep < 20; ++rep) {
      const auto w = random_values(rng, k);
      auto x = random_values(rng, k);
      std::vector<uint8_t> wq(*dtype_row_bytes(f.type, k));
      quantize_row(f.type, w.data(), wq.data(), k);
      std::vector<BlockQ8Act> xq(static_cast<size_t>(k / 32));
      quantize_act_q8(x.data(), xq.data(), k);
      std::vector<float> wd(static_cast<size_t>(k));
      dequantize_row(f.type, wq.data(), wd.data(), k);
      double want = 0, mag = 0;
      for (int64_t i = 0; i < k; ++i) {
        const double xi = double(xq[static_cast<size_t>(i / 32)].d) * xq[static_cast<size_t>(i / 32)].qs[i % 32];
        want += wd[static_cast<size_t>(i)] * xi;
        mag += std::fabs(wd[static_cast<size_t>(i)] * xi);
      }
      EXPECT_NEAR(dot_q8_ref(f.type, wq.data(), xq.data(), k), want, 1e-5 * mag);
    }
  }
  std::vector<BlockQ8Act> xq(1);
  std::vector<float> w(32, 1.0f);
  EXPECT_THROW(dot_q8_ref(DType::F32, w.data(), xq.data(), 32), Error);
}

// Ternary formats: values already in {-s, 0, s} with s an exact half come back exactly (d = max|x| = s), whichever
// element positions carry which trit, so every trit and 2-bit field position is exercised.
TEST(TernaryRoundTrip, TernaryValuesAreExact) {
  std::mt19937 rng(test_seed());
  std::uniform_int_distribution<int> trit(-1, 1);
  for (const DType t : {DType::TQ1_0, DType::TQ2_0}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    const int64_t k = 512;
    std::vector<float> x(static_cast<size_t>(k));
    for (auto& v : x) v = 0.75f * static_cast<float>(trit(rng));
    x[0] = 0.75f;
    x[256] = -0.75f;
    std::vector<uint8_t> q(*dtype_row_bytes(t, k));
    quantize_row(t, x.data(), q.data(), k);
    std::vector<float> y(static_cast<size_t>(k));
    dequantize_row(t, q.data(), y.data(), k);
    EXPECT_EQ(x, y);
  }
}

TEST(FormatTraits, QuantizeActQ8RoundsAsTheKernelsDo) {
  std::vector<float> x(32);
  for (int i = 0; i < 32; ++i) x[static_cast<size_t>(i)] = static_cast<float>(i - 16) * 0.25f;
  x[3] = 8.0f;  // max|x| = 8: id = 127 / 8 = 15.875
  BlockQ8Act b;
  quantize_act_q8(x.data(), &b, 32);
  EXPECT_EQ(b.d, 8.0f / 127.0f);
  int32_t sum = 0;
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(b.qs[i], static_cast<int8_t>(std::nearbyint(x[static_cast<size_t>(i)] * (127.0f / 8.0f)))) << i;
    sum += b.qs[i];
  }
  EXPECT_EQ(b.qs[3], 127);
  EXPECT_EQ(b.s, b.d * static_cast<float>(sum));
  EXPECT_THROW(quantize_act_q8(x.data(), &b, 31), Error);
}

// convert_rows is dequantize then quantize, row by row: q6_K -> bf16 equals bf16(dequantized value) for every
// element, and rows are independent (converting one row alone gives the same bytes).
TEST(ConvertRows, KQuantsToSixteenBitsAreTheRoundedValues) {
  std::mt19937 rng(test_seed());
  const int64_t n = 5, k = 512;
  for (const DType from : {DType::Q6_K, DType::Q4_K, DType::Q2_K, DType::Q3_K, DType::Q5_K}) {
    for (const DType to : {DType::BF16, DType::F16}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(from) << " -> " << dtype_name(to));
      const auto x = random_values(rng, n * k);
      std::vector<uint8_t> src(*dtype_row_bytes(from, n * k));
      quantize_row(from, x.data(), src.data(), n * k);
      std::vector<uint16_t> dst(static_cast<size_t>(n * k), 0xFFFF);
      convert_rows(from, src.data(), to, dst.data(), n, k);
      std::vector<float> v(static_cast<size_t>(n * k));
      dequantize_row(from, src.data(), v.data(), n * k);
      for (int64_t i = 0; i < n * k; ++i) {
        const float f = v[static_cast<size_t>(i)];
        ASSERT_EQ(dst[static_cast<size_t>(i)], to == DType::BF16 ? f32_to_bf16(f) : f32_to_fp16(f)) << "element " << i;
      }
      std::vector<uint16_t> row(static_cast<size_t>(k));
      const uint64_t rb = *dtype_row_bytes(from, k);
      convert_rows(from, src.data() + 3 * rb, to, row.data(), 1, k);
      EXPECT_TRUE(std::equal(row.begin(), row.end(), dst.begin() + 3 * k));
    }
  }
}

TEST(ConvertRows, RefusesWhatItCannotDo) {
  std::vector<uint8_t> src(4096), dst(4096);
  EXPECT_THROW(convert_rows(DType::Q8_1, src.data(), DType::BF16, dst.data(), 1, 32), Error);  // unreadable
  EXPECT_THROW(convert_rows(DType::Q8_0, src.data(), DType::Q8_1, dst.data(), 1, 32), Error);  // unproducible
  EXPECT_THROW(convert_rows(DType::Q8_0, src.data(), DType::Q6_K, dst.data(), 1, 32), Error);  // 32 is no q6_K row
  EXPECT_THROW(convert_rows(DType::Q6_K, src.data(), DType::BF16, dst.data(), 1, 100), Error);
}

// q4_k_rows_as_q4_1 (the TEAL sparse GEMVs' copy of q4_K): every element of the q4_1 rows is q4_K's value up to the
// fp16 rounding of D = d sc and M = -dmin m (2^-11 of each: |D q| + |M| bounds it), each block's nibbles are q4_K's
// codes (the largest error would be ~|D| with a nibble off by one), and rows are independent.
TEST(ConvertRows, Q4KAsQ4_1KeepsTheCodes) {
  std::mt19937 rng(test_seed());
  const int64_t n = 7, k = 768;
  const auto x = random_values(rng, n * k);
  std::vector<uint8_t> src(*dtype_row_bytes(DType::Q4_K, n * k));
  quantize_row(DType::Q4_K, x.data(), src.data(), n * k);
  std::vector<uint8_t> dst(*dtype_row_bytes(DType::Q4_1, n * k));
  q4_k_rows_as_q4_1(src.data(), dst.data(), n, k);
  std::vector<float> want(static_cast<size_t>(n * k)), got(want.size());
  dequantize_row(DType::Q4_K, src.data(), want.data(), n * k);
  dequantize_row(DType::Q4_1, dst.data(), got.data(), n * k);
  const auto* blocks = reinterpret_cast<const BlockQ4_1*>(dst.data());
  for (int64_t i = 0; i < n * k; ++i) {
    const BlockQ4_1& b = blocks[i / 32];
    const float d = fp16_to_f32(b.d), m = fp16_to_f32(b.m);
    const int c = static_cast<int>(i % 32), q = c < 16 ? b.qs[c] & 0xF : b.qs[c - 16] >> 4;
    const double bound = std::ldexp(std::fabs(d * static_cast<float>(q)) + std::fabs(m), -11) * 1.01 + 1e-12;
    ASSERT_NEAR(got[static_cast<size_t>(i)], want[static_cast<size_t>(i)], bound) << "element " << i;
  }
  std::vector<uint8_t> row(*dtype_row_bytes(DType::Q4_1, k));
  q4_k_rows_as_q4_1(src.data() + 4 * *dtype_row_bytes(DType::Q4_K, k), row.data(), 1, k);
  EXPECT_TRUE(std::equal(row.begin(), row.end(), dst.begin() + 4 * static_cast<int64_t>(row.size())));
  EXPECT_THROW(q4_k_rows_as_q4_1(src.data(), dst.data(), 1, 512 + 32), Error);
}

TEST(FormatSupport, TablesAndTexts) {
  const FormatSupport s("cuda", {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1},
                        DType::BF16);
  EXPECT_EQ(s.native_names(), "f32, f16, bf16, q8_0, q4_0 and q4_1");
  EXPECT_TRUE(s.is_native(DType::Q4_1));
  EXPECT_TRUE(s.is_native_quantized(DType::Q4_1));
  EXPECT_FALSE(s.is_native_quantized(DType::BF16));
  EXPECT_FALSE(s.is_native_quantized(DType::Q6_K));
  EXPECT_EQ(s.runs_as(DType::Q8_0), DType::Q8_0);
  EXPECT_EQ(s.runs_as(DType::Q6_K), DType::BF16);
  EXPECT_EQ(s.runs_as(DType::Q4_K), DType::BF16);
  EXPECT_EQ(s.runs_as(DType::Q8_1), std::nullopt);
  EXPECT_EQ(s.summary(),
            "the CUDA kernels read f32, f16, bf16, q8_0, q4_0 and q4_1, and q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, "
            "iq4_nl, "
            "iq4_xs, tq1_0 and tq2_0 are converted to bf16 at load");
  // bf16 is 2 bytes per weight, q6_K 210 / 256.
  EXPECT_EQ(s.conversion_notice("blk.0.ffn_down.weight", DType::Q6_K),
            "tessera: cuda: q6_k weights (first: blk.0.ffn_down.weight) have no CUDA kernel; converted to bf16 at load "
            "(2.44x their size)");
  EXPECT_THROW(FormatSupport("x", {DType::F32}, DType::BF16), Error);  // the fallback must be native
  EXPECT_THROW(FormatSupport("x", {DType::Q8_1}, DType::Q8_1), Error);
}

TEST(FormatSupport, NoticesOncePerFormat) {
  const FormatSupport s("cpu", {DType::F32, DType::F16}, DType::F16);
  ConversionNotices n;
  ::testing::internal::CaptureStderr();
  n.note(s, "blk.0.ffn_down.weight", DType::Q6_K);
  n.note(s, "blk.1.ffn_down.weight", DType::Q6_K);
  n.note(s, "blk.0.attn_q.weight", DType::Q4_K);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err,
            "tessera: cpu: q6_k weights (first: blk.0.ffn_down.weight) have no CPU kernel; converted to f16 at load "
            "(2.44x their size)\n"
            "tessera: cpu: q4_k weights (first: blk.0.attn_q.weight) have no CPU kernel; converted to f16 at load "
            "(3.56x their size)\n");
  EXPECT_EQ(n.converted(), (std::set<DType>{DType::Q4_K, DType::Q6_K}));
}

}  // namespace
}  // namespace tessera
