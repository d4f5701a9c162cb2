// GGML-exact quantizers (src/quant/quantize_ggml.cpp) against llama-quantize --pure's bytes for the same rows
// (tests/data/quantize, written by python/make_quantize_golden.py): edge-case rows (zeros, a constant, one spike, f16
// subnormals, one-signed) and random ones, one test per format.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "quant/quantize_ggml.h"
#include "tessera/error.h"

namespace tessera {
namespace {

const std::string kDir = std::string(TESSERA_TEST_DATA) + "/quantize/";

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

const nlohmann::json& index() {
  static const nlohmann::json j = [] {
    std::ifstream f(kDir + "index.json");
    return nlohmann::json::parse(f);
  }();
  return j;
}

// The golden tensors' rows: blk.0.attn_q.weight [6, 256] (edge cases) then blk.1.ffn_down.weight [4, 512].
struct Rows {
  std::vector<float> x;
  int64_t first = 6 * 256, second = 4 * 512;
};

Rows golden_rows() {
  Rows r;
  const std::vector<uint8_t> b = read_bytes(kDir + "rows.f32.bin");
  r.x.resize(b.size() / 4);
  std::memcpy(r.x.data(), b.data(), b.size());
  EXPECT_EQ(static_cast<int64_t>(r.x.size()), r.first + r.second);
  EXPECT_EQ(index()["rows"]["floats"].get<int64_t>(), r.first + r.second);
  return r;
}

class QuantizeGgml : public ::testing::TestWithParam<std::string> {};

TEST_P(QuantizeGgml, MatchesLlamaQuantizeBytes) {
  const std::string name = GetParam();
  const std::optional<DType> t = dtype_from_name(name);
  ASSERT_TRUE(t.has_value()) << name;
  ASSERT_TRUE(can_quantize_ggml(*t));
  const Rows rows = golden_rows();
  const std::vector<uint8_t> want = read_bytes(kDir + index()["rows"]["formats"][name]["file"].get<std::string>());
  const uint64_t b1 = *dtype_row_bytes(*t, static_cast<uint64_t>(rows.first));
  const uint64_t b2 = *dtype_row_bytes(*t, static_cast<uint64_t>(rows.second));
  ASSERT_EQ(want.size(), b1 + b2);
  std::vector<uint8_t> got(b1 + b2, 0xAA);
  quantize_row_ggml(*t, rows.x.data(), got.data(), rows.first);
  quantize_row_ggml(*t, rows.x.data() + rows.first, got.data() + b1, rows.second);
  const DTypeInfo& info = dtype_info(*t);
  size_t mismatched_blocks = 0, first = got.size();
  for (size_t i = 0; i < got.size(); i += info.type_size) {
    if (std::memcmp(got.data() + i, want.data() + i, info.type_size) != 0) {
      ++mismatched_blocks;
      first = std::min(first, i / info.type_size);
    }
  }
  EXPECT_EQ(mismatched_blocks, 0u) << name << ": first differing block " << first << " of "
                                   << got.size() / info.type_size;
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantizeGgml,
                         ::testing::Values("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_K", "q5_K", "q6_K", "iq4_nl",
                                           "tq1_0", "tq2_0"),
                         [](const auto& info) { return info.param; });

TEST(QuantizeGgmlErrors, RejectsPartialBlocksAndUnsupportedFormats) {
  std::vector<float> x(256, 1.0f);
  std::vector<uint8_t> y(1024);
  EXPECT_THROW(quantize_row_ggml(DType::Q4_K, x.data(), y.data(), 128), Error);
  EXPECT_THROW(quantize_row_ggml(DType::Q4_0, x.data(), y.data(), 33), Error);
  EXPECT_THROW(quantize_row_ggml(DType::Q2_K, x.data(), y.data(), 256), Error);
  EXPECT_FALSE(can_quantize_ggml(DType::F16));
  EXPECT_FALSE(can_quantize_ggml(DType::IQ4_XS));
}

}  // namespace
}  // namespace tessera
