// fp16 and bf16 conversions: every half value against numpy (through gguf-py), f32 -> half rounding of tricky floats
// (ties, subnormals, overflow, NaN, inf) against numpy (f16) and gguf-py (bf16), and round-trip identities.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "golden.h"
#include "quant/half.h"
#include "quant/quant.h"
#include "sha256.h"

namespace tessera {
namespace {

using test::quant_blob;
using test::quant_floats;
using test::quant_index;

bool f16_is_nan(uint16_t h) { return (h & 0x7C00) == 0x7C00 && (h & 0x03FF) != 0; }
bool bf16_is_nan(uint16_t h) { return (h & 0x7F80) == 0x7F80 && (h & 0x007F) != 0; }

std::vector<uint16_t> all_halves() {
  std::vector<uint16_t> h(65536);
  for (uint32_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint16_t>(i);
  return h;
}

TEST(Half, EveryF16ToF32MatchesNumpy) {
  const std::vector<uint16_t> h = all_halves();
  std::vector<float> f(h.size()), via_row(h.size());
  dequantize_row(DType::F16, h.data(), via_row.data(), static_cast<int64_t>(h.size()));
  std::vector<uint32_t> canon(h.size());
  for (size_t i = 0; i < h.size(); ++i) {
    f[i] = fp16_to_f32(h[i]);
    const uint32_t bits = f32_bits(f[i]);
    ASSERT_EQ(bits, f32_bits(via_row[i])) << "dequantize_row(f16) differs from fp16_to_f32 at 0x" << std::hex << i;
    // numpy keeps NaN payload bits, ggml and Tessera quiet them: compare NaNs as "NaN of this sign" (the script
    // hashes them the same way), and check here that a NaN half gives a NaN and nothing else does.
    ASSERT_EQ(std::isnan(f[i]), f16_is_nan(h[i])) << std::hex << i;
    canon[i] = std::isnan(f[i]) ? (0x7FC00000u | (bits & 0x80000000u)) : bits;
  }
  EXPECT_EQ(test::sha256_hex(canon.data(), canon.size() * 4),
            quant_index().at("half").at("f16_sha256").get<std::string>());
}

TEST(Half, EveryBf16ToF32MatchesGgufPy) {
  const std::vector<uint16_t> h = all_halves();
  std::vector<float> f(h.size()), via_row(h.size());
  dequantize_row(DType::BF16, h.data(), via_row.data(), static_cast<int64_t>(h.size()));
  for (size_t i = 0; i < h.size(); ++i) f[i] = bf16_to_f32(h[i]);
  EXPECT_EQ(test::compare_float_bits(via_row.data(), f.data(), f.size()), "");
  EXPECT_EQ(test::sha256_hex(f.data(), f.size() * 4), quant_index().at("half").at("bf16_sha256").get<std::string>());
}

TEST(Half, RoundTripThroughF32IsIdentity) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto h = static_cast<uint16_t>(i);
    const uint16_t f16 = f32_to_fp16(fp16_to_f32(h));
    const uint16_t bf16 = f32_to_bf16(bf16_to_f32(h));
    if (f16_is_nan(h)) {
      EXPECT_TRUE(f16_is_nan(f16) && (f16 & 0x8000) == (h & 0x8000)) << std::hex << i << " -> " << f16;
    } else {
      EXPECT_EQ(f16, h) << std::hex << i;
    }
    if (bf16_is_nan(h)) {
      EXPECT_EQ(bf16, h | 0x0040) << std::hex << i;  // quieted, payload kept (ggml_compute_fp32_to_bf16)
    } else {
      EXPECT_EQ(bf16, h) << std::hex << i;
    }
  }
}

// Tricky floats through f32_to_fp16 and quantize_row(f16): bit-exact against numpy's astype(float16), except that
// a NaN only has to stay a NaN of the same sign (numpy keeps payload bits, ggml returns 0x7E00).
TEST(Half, F32ToF16MatchesNumpyOnTrickyFloats) {
  const auto& q = quant_index().at("quantize");
  const std::vector<float> x = quant_floats(q.at("float_inputs"));
  for (const auto& c : q.at("float")) {
    if (c.at("dtype") != "f16") continue;
    const std::vector<uint8_t> bytes = quant_blob(c.at("expected"));
    ASSERT_EQ(bytes.size(), x.size() * 2);
    std::vector<uint16_t> want(x.size()), via_row(x.size());
    std::memcpy(want.data(), bytes.data(), bytes.size());
    quantize_row(DType::F16, x.data(), via_row.data(), static_cast<int64_t>(x.size()));
    int bad = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const uint16_t got = f32_to_fp16(x[i]);
      ASSERT_EQ(got, via_row[i]);
      const bool ok = f16_is_nan(want[i]) ? f16_is_nan(got) && (got & 0x8000) == (want[i] & 0x8000) : got == want[i];
      if (!ok && ++bad <= 10)
        ADD_FAILURE() << "f16 of " << x[i] << " (0x" << std::hex << f32_bits(x[i]) << "): got 0x" << got << " want 0x"
                      << want[i];
    }
    EXPECT_EQ(bad, 0);
    return;
  }
  FAIL() << "no f16 case in tests/data/quant/index.json";
}

// bf16: gguf-py's bit arithmetic is ggml's, NaN quieting included, so every bit must match.
TEST(Half, F32ToBf16MatchesGgufPyOnTrickyFloats) {
  const auto& q = quant_index().at("quantize");
  const std::vector<float> x = quant_floats(q.at("float_inputs"));
  for (const auto& c : q.at("float")) {
    if (c.at("dtype") != "bf16") continue;
    const std::vector<uint8_t> bytes = quant_blob(c.at("expected"));
    ASSERT_EQ(bytes.size(), x.size() * 2);
    std::vector<uint16_t> want(x.size()), via_row(x.size());
    std::memcpy(want.data(), bytes.data(), bytes.size());
    quantize_row(DType::BF16, x.data(), via_row.data(), static_cast<int64_t>(x.size()));
    int bad = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const uint16_t got = f32_to_bf16(x[i]);
      ASSERT_EQ(got, via_row[i]);
      if (got != want[i] && ++bad <= 10)
        ADD_FAILURE() << "bf16 of " << x[i] << " (0x" << std::hex << f32_bits(x[i]) << "): got 0x" << got << " want 0x"
                      << want[i];
    }
    EXPECT_EQ(bad, 0);
    return;
  }
  FAIL() << "no bf16 case in tests/data/quant/index.json";
}

}  // namespace
}  // namespace tessera
