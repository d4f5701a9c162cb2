// quantize_row bit-exact against gguf-py's numpy quantize (which its authors keep bit-exact with ggml's C reference)
// for q8_0, q4_0, q4_1, q5_0 and q5_1 (and tq1_0, tq2_0 on blocks of 256) on blocks chosen to hit every branch: normal,
// tiny (fp16 scale underflow), huge (scale overflow to inf), zeros, all-equal, one-signed, exact rounding ties, |max|
// ties between +a and -a, outliers. gguf-py has no quantizer for the K-quants and i-quants; Tessera's own (not GGML's)
// are checked by their error bounds (test_format_traits.cpp, test_quant_roundtrip.cpp).
#include <fmt/core.h>
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <vector>

#include "golden.h"
#include "quant/quant.h"

namespace tessera {
namespace {

using test::quant_blob;
using test::quant_floats;
using test::quant_index;

std::string hex_bytes(const uint8_t* p, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s += fmt::format("{:02x}", p[i]);
  return s;
}

// One section of golden blocks: blocks of 32 ("block") or of 256 for the ternary formats ("block256").
void check_block_section(const std::string& section, std::set<std::string>& covered) {
  SCOPED_TRACE(section);
  const auto& q = quant_index().at("quantize");
  const std::vector<float> x = quant_floats(q.at(section + "_inputs"));
  const auto n = q.at(section + "_n").get<int64_t>();
  ASSERT_EQ(x.size(), static_cast<size_t>(n));
  for (const auto& c : q.at(section)) {
    const DType t = test::dtype_named(c.at("dtype").get<std::string>());
    covered.insert(std::string(dtype_name(t)));
    SCOPED_TRACE(std::string(dtype_name(t)));
    const DTypeInfo& info = dtype_info(t);
    const std::vector<uint8_t> want = quant_blob(c.at("expected"));
    ASSERT_EQ(dtype_row_bytes(t, static_cast<uint64_t>(n)).value_or(0), want.size());

    std::vector<uint8_t> got(want.size(), 0xAB);
    quantize_row(t, x.data(), got.data(), n);
    int bad = 0;
    for (int64_t b = 0; b < n / info.block_size; ++b) {
      const uint8_t* g = got.data() + b * info.type_size;
      const uint8_t* w = want.data() + b * info.type_size;
      if (std::memcmp(g, w, info.type_size) == 0 || ++bad > 8) continue;
      std::string in;
      for (uint32_t j = 0; j < info.block_size; ++j) in += fmt::format(" {:.9g}", x[b * info.block_size + j]);
      ADD_FAILURE() << "block " << b << "\n  got  " << hex_bytes(g, info.type_size) << "\n  want "
                    << hex_bytes(w, info.type_size) << "\n  input" << in;
    }
    EXPECT_EQ(bad, 0) << "blocks differ";

    // Row boundaries must not matter: quantize one block per call.
    std::vector<uint8_t> per_block(want.size(), 0xCD);
    for (int64_t b = 0; b < n / info.block_size; ++b)
      quantize_row(t, x.data() + b * info.block_size, per_block.data() + b * info.type_size, info.block_size);
    EXPECT_TRUE(per_block == got) << "one block per call differs from one row";
  }
}

TEST(QuantizeGolden, BlocksMatchGgufPy) {
  std::set<std::string> covered;
  check_block_section("block", covered);
  check_block_section("block256", covered);
  // Every block format Tessera produces as GGML does is covered (f16/bf16 are checked in test_half.cpp).
  for (uint32_t id = 0; id < 64; ++id) {
    const DTypeInfo* info = dtype_info(id);
    if (info == nullptr || !info->is_quantized || !can_quantize(info->type)) continue;
    if (!format_info(info->type)->from_float_is_ggml) continue;  // Tessera's own quantizer: test_format_traits.cpp
    EXPECT_TRUE(covered.count(std::string(info->name))) << info->name << " has a from_float but no golden blocks";
  }
}

}  // namespace
}  // namespace tessera
