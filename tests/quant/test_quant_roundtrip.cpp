// quantize -> dequantize error within each format's bound, on fresh random inputs, and the errors dequantize_row /
// quantize_row must raise. The seed is random per run (set TESSERA_SEED=<n> to replay one) and printed on failure.
//
// Every bound below is per element, derived from the format and written so that an implementation that is off by a
// factor of 2 (rounding replaced by truncation, a scale twice too coarse, the clamp on the wrong side) fails. Each
// test also checks that the largest observed error reaches a good fraction of its bound, so the bound itself cannot
// silently become loose. "fp16(v)" is the stored half of v, computed with quant/half.h (checked in test_half.cpp).
#include <fmt/core.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <vector>

#include "quant/half.h"
#include "quant/quant.h"
#include "tessera/error.h"

namespace tessera {
namespace {

constexpr int kBlock = 32;
constexpr int kBlocks = 1024;  // 32768 values per format: well under 100 ms

uint32_t test_seed() {
  if (const char* s = std::getenv("TESSERA_SEED")) return static_cast<uint32_t>(std::strtoul(s, nullptr, 10));
  return std::random_device{}();
}

float fp16_round(float v) { return fp16_to_f32(f32_to_fp16(v)); }

// Blocks of 32 of varied shape: centred normal, uniform, heavy tails, sparse with one outlier, and offset blocks
// whose minimum is far from zero. Scales span 5 decades so the fp16 scale stays a normal half (2^-14 .. 65504).
std::vector<float> random_blocks(std::mt19937& rng) {
  std::vector<float> x(kBlocks * kBlock);
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int b = 0; b < kBlocks; ++b) {
    const float scale = std::pow(10.0f, -1.0f + 4.0f * u01(rng));
    const float offset = (b % 5 == 4) ? scale * (u01(rng) * 8.0f - 4.0f) : 0.0f;
    float* p = x.data() + b * kBlock;
    for (int j = 0; j < kBlock; ++j) {
      switch (b % 4) {
        case 0:
          p[j] = scale * normal(rng);
          break;
        case 1:
          p[j] = scale * (2.0f * u01(rng) - 1.0f);
          break;
        case 2:
          p[j] = scale * normal(rng) * normal(rng) * normal(rng);
          break;
        default:
          p[j] = scale * 0.01f * normal(rng);
          break;
      }
      p[j] += offset;
    }
    if (b % 4 == 3) p[rng() % kBlock] = scale * (u01(rng) < 0.5f ? -1.0f : 1.0f);
  }
  return x;
}

std::vector<float> round_trip(DType t, const std::vector<float>& x) {
  std::vector<uint8_t> q(dtype_row_bytes(t, x.size()).value());
  quantize_row(t, x.data(), q.data(), static_cast<int64_t>(x.size()));
  std::vector<float> y(x.size());
  dequantize_row(t, q.data(), y.data(), static_cast<int64_t>(x.size()));
  return y;
}

// Relative slack for float rounding inside quantize and dequantize. The quantizers compute t = x * (1/d) (plus
// 8.5 or 0.5) with |t| <= 16 or 128 before rounding to an integer, which moves t by at most ~128 * 3 * 2^-24 < 2^-15
// steps; the dequantizer's multiply(-add) adds a few ulp of the block's magnitude.
constexpr double kStepSlack = 0x1p-15;
constexpr double kValueSlack = 0x1p-21;

struct Worst {
  double ratio = 0.0;  // largest err / bound seen
  std::string where;
  void see(double err, double bound, int i, float x, float y) {
    if (err / bound > ratio) {
      ratio = err / bound;
      where = fmt::format("element {} (block {}): x={:.9g} y={:.9g} err={:.6g} bound={:.6g}", i, i / kBlock, x, y, err,
                          bound);
    }
  }
};

// q8_0: d = amax/127, q = round(x/d) in -127..127, y = q * fp16(d).
//   |x - y| <= |x - q d| + |q| |d - fp16(d)| <= d/2 + 127 |d - fp16(d)|   (= amax/254 + the fp16 rounding of d)
// Truncating instead of rounding makes the first term d; a scale of amax/63.5 makes it 2 d/2.
TEST(QuantRoundTrip, Q8_0ErrorBound) {
  const uint32_t seed = test_seed();
  SCOPED_TRACE(fmt::format("TESSERA_SEED={}", seed));
  std::mt19937 rng(seed);
  const std::vector<float> x = random_blocks(rng);
  const std::vector<float> y = round_trip(DType::Q8_0, x);
  Worst worst;
  for (int b = 0; b < kBlocks; ++b) {
    float amax = 0.0f;
    for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(x[b * kBlock + j]));
    const double d = amax / 127.0f;
    const double bound =
        d * (0.5 + kStepSlack) + 127.0 * std::fabs(d - fp16_round(static_cast<float>(d))) + kValueSlack * amax;
    for (int j = b * kBlock; j < (b + 1) * kBlock; ++j) worst.see(std::fabs(double{x[j]} - y[j]), bound, j, x[j], y[j]);
  }
  EXPECT_LE(worst.ratio, 1.0) << worst.where;
  EXPECT_GE(worst.ratio, 0.8) << "bound is loose: " << worst.where;
}

// q4_0: d = max/-8 (max: the value of largest magnitude, with its sign), t = x/d in [-8, 8], q = round(t) clamped
// to 7, y = q * fp16(d). Where t <= 7.5 rounding costs at most half a step; above 7.5 (values of the sign opposite to
// max, near -max) the clamp costs t - 7, up to a full step |d|:
//   |x - y| <= |d| * (t <= 7.5 ? 1/2 : t - 7) + 8 |d - fp16(d)|
TEST(QuantRoundTrip, Q4_0ErrorBound) {
  const uint32_t seed = test_seed();
  SCOPED_TRACE(fmt::format("TESSERA_SEED={}", seed));
  std::mt19937 rng(seed);
  const std::vector<float> x = random_blocks(rng);
  const std::vector<float> y = round_trip(DType::Q4_0, x);
  Worst worst;
  double max_clamped_steps = 0.0;
  for (int b = 0; b < kBlocks; ++b) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < kBlock; ++j) {
      if (std::fabs(x[b * kBlock + j]) > amax) {
        amax = std::fabs(x[b * kBlock + j]);
        max = x[b * kBlock + j];
      }
    }
    const double d = max / -8.0f;
    const double fp16_err = 8.0 * std::fabs(d - fp16_round(static_cast<float>(d)));
    for (int j = b * kBlock; j < (b + 1) * kBlock; ++j) {
      const double t = x[j] / d;
      const double steps = t <= 7.5 ? 0.5 : t - 7.0;
      if (t > 7.5) max_clamped_steps = std::max(max_clamped_steps, steps);
      const double bound = std::fabs(d) * (steps + kStepSlack) + fp16_err + kValueSlack * amax;
      worst.see(std::fabs(double{x[j]} - y[j]), bound, j, x[j], y[j]);
    }
  }
  EXPECT_LE(worst.ratio, 1.0) << worst.where;
  EXPECT_GE(worst.ratio, 0.8) << "bound is loose: " << worst.where;
  // The inputs must exercise the clamp (some value within a quarter step of -max), else the t > 7.5 branch is idle.
  EXPECT_GT(max_clamped_steps, 0.75);
}

// q4_1: m = min, d = (max - min)/15, t = (x - m)/d in [0, 15], q = round(t), y = q * fp16(d) + fp16(m).
//   |x - y| <= d/2 + 15 |d - fp16(d)| + |m - fp16(m)|
TEST(QuantRoundTrip, Q4_1ErrorBound) {
  const uint32_t seed = test_seed();
  SCOPED_TRACE(fmt::format("TESSERA_SEED={}", seed));
  std::mt19937 rng(seed);
  const std::vector<float> x = random_blocks(rng);
  const std::vector<float> y = round_trip(DType::Q4_1, x);
  Worst worst;
  for (int b = 0; b < kBlocks; ++b) {
    const auto [lo_it, hi_it] = std::minmax_element(x.begin() + b * kBlock, x.begin() + (b + 1) * kBlock);
    const float lo = *lo_it, hi = *hi_it;
    const double d = (hi - lo) / 15.0f;
    const double bound = d * (0.5 + kStepSlack) + 15.0 * std::fabs(d - fp16_round(static_cast<float>(d))) +
                         std::fabs(double{lo} - fp16_round(lo)) + kValueSlack * (std::fabs(lo) + std::fabs(hi));
    for (int j = b * kBlock; j < (b + 1) * kBlock; ++j) worst.see(std::fabs(double{x[j]} - y[j]), bound, j, x[j], y[j]);
  }
  EXPECT_LE(worst.ratio, 1.0) << worst.where;
  EXPECT_GE(worst.ratio, 0.8) << "bound is loose: " << worst.where;
}

// Blocks of float subnormals make 1/d overflow to inf (x * inf is inf or NaN before the float -> int conversion).
// The scale's half is zero, so whatever the codes, every value must come back as zero, without a crash or UB.
TEST(QuantRoundTrip, SubnormalBlocksComeBackAsZero) {
  const uint32_t seed = test_seed();
  SCOPED_TRACE(fmt::format("TESSERA_SEED={}", seed));
  std::mt19937 rng(seed);
  std::vector<float> x(4 * kBlock);
  for (float& v : x) v = f32_from_bits(rng() & 0x807FFFFFu);  // any sign, exponent field 0
  x[5] = 0.0f;
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_1}) {
    const std::vector<float> y = round_trip(t, x);
    for (size_t i = 0; i < y.size(); ++i) EXPECT_EQ(y[i], 0.0f) << dtype_name(t) << " element " << i;
  }
}

// f16 rounds to nearest: |x - f16(x)| <= half an ulp = 2^-11 * 2^floor(log2|x|) <= 2^-11 |x| for normal halves
// (|x| in [2^-14, 65504]), and <= 2^-25 (half the subnormal spacing 2^-24) below 2^-14. bf16 keeps 8 significant
// bits: |x - bf16(x)| <= 2^-8 |x| for every finite float that does not round up past the largest bf16.
// Truncation doubles either error.
TEST(QuantRoundTrip, HalfRelativeErrorBound) {
  const uint32_t seed = test_seed();
  SCOPED_TRACE(fmt::format("TESSERA_SEED={}", seed));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  std::vector<float> x(1 << 15);
  for (size_t i = 0; i < x.size(); ++i) {
    // log-uniform over f16's normal range, then a stretch of the subnormal range
    const float mag = i % 8 == 7 ? u01(rng) * 0x1p-14f : std::exp2(-14.0f + 30.0f * u01(rng));
    x[i] = std::min(mag, 65504.0f) * (rng() & 1 ? -1.0f : 1.0f);
  }
  const std::vector<float> y16 = round_trip(DType::F16, x);
  const std::vector<float> y_bf = round_trip(DType::BF16, x);
  Worst w16, w_bf;
  for (size_t i = 0; i < x.size(); ++i) {
    const double ax = std::fabs(double{x[i]});
    const double bound16 = ax >= 0x1p-14 ? ax * 0x1p-11 : 0x1p-25;
    w16.see(std::fabs(x[i] - double{y16[i]}), bound16, static_cast<int>(i), x[i], y16[i]);
    if (ax > 0) w_bf.see(std::fabs(x[i] - double{y_bf[i]}), ax * 0x1p-8, static_cast<int>(i), x[i], y_bf[i]);
  }
  EXPECT_LE(w16.ratio, 1.0) << "f16 " << w16.where;
  EXPECT_GE(w16.ratio, 0.9) << "f16 bound is loose: " << w16.where;
  EXPECT_LE(w_bf.ratio, 1.0) << "bf16 " << w_bf.where;
  EXPECT_GE(w_bf.ratio, 0.9) << "bf16 bound is loose: " << w_bf.where;

  // Overflow: f16's largest finite value is 65504 and 65520 is the tie to 65536 (even), which is inf.
  EXPECT_EQ(fp16_to_f32(f32_to_fp16(65519.996f)), 65504.0f);
  EXPECT_TRUE(std::isinf(fp16_to_f32(f32_to_fp16(65520.0f))));
  EXPECT_TRUE(std::isinf(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::max()))));
}

TEST(QuantErrors, UnsupportedDtypeThrows) {
  std::vector<uint8_t> src(1024, 0);
  std::vector<float> dst(64, 7.0f);
  int checked = 0;
  for (uint32_t id = 0; id < 64; ++id) {
    const DTypeInfo* info = dtype_info(id);
    if (info == nullptr) continue;
    const auto n = static_cast<int64_t>(info->block_size);
    if (!can_dequantize(info->type)) {
      EXPECT_THROW(dequantize_row(info->type, src.data(), dst.data(), n), Error) << info->name;
      ++checked;
    }
    if (!can_quantize(info->type)) {
      EXPECT_THROW(quantize_row(info->type, dst.data(), src.data(), n), Error) << info->name;
    }
  }
  EXPECT_GT(checked, 10);  // q5_0, the i-quants, integer types...
  EXPECT_THROW(dequantize_row(DType::Q5_0, src.data(), dst.data(), 32), Error);
  EXPECT_THROW(quantize_row(DType::Q5_1, dst.data(), src.data(), 32), Error);
  EXPECT_THROW(quantize_row(DType::IQ4_NL, dst.data(), src.data(), 32), Error);
  for (float v : dst) EXPECT_EQ(v, 7.0f) << "a refused call wrote output";
  try {
    dequantize_row(DType::Q5_0, src.data(), dst.data(), 32);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q5_0"), std::string::npos) << e.what();
  }
}

TEST(QuantErrors, PartialBlockRowThrows) {
  std::vector<uint8_t> src(4096, 0);
  std::vector<float> dst(1024, 7.0f);
  for (DType t :
       {DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    const auto bs = static_cast<int64_t>(dtype_info(t).block_size);
    for (int64_t n : {bs - 1, bs + 1, 2 * bs + bs / 2, int64_t{-1}, -bs})
      EXPECT_THROW(dequantize_row(t, src.data(), dst.data(), n), Error) << dtype_name(t) << " n=" << n;
    if (can_quantize(t)) {
      for (int64_t n : {bs - 1, bs + 1, -bs})
        EXPECT_THROW(quantize_row(t, dst.data(), src.data(), n), Error) << dtype_name(t) << " n=" << n;
    }
    dequantize_row(t, src.data(), dst.data(), 0);  // an empty row is a valid no-op
  }
  EXPECT_THROW(dequantize_row(DType::F16, src.data(), dst.data(), -1), Error);
  for (float v : dst) EXPECT_EQ(v, 7.0f) << "a refused call wrote output";
  try {
    dequantize_row(DType::Q4_1, src.data(), dst.data(), 33);
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("33"), std::string::npos) << msg;
    EXPECT_NE(msg.find("q4_1"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace tessera
