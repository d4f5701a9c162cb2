// Dequantization bit-exact against gguf-py's numpy implementation: random blocks of every dtype Tessera reads, and
// the default model's tensors read straight from the mapped file (offsets recorded by python/make_quant_golden.py,
// so this test does not depend on Tessera's GGUF reader).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "core/mapped_file.h"
#include "golden.h"
#include "quant/half.h"
#include "quant/quant.h"
#include "sha256.h"
#include "test_util.h"

namespace tessera {
namespace {

using test::compare_float_bits;
using test::quant_blob;
using test::quant_floats;
using test::quant_index;

TEST(DequantGolden, EveryReadableDtypeHasGoldenBlocks) {
  std::set<std::string> covered;
  for (const auto& c : quant_index().at("dequant")) covered.insert(c.at("dtype").get<std::string>());
  for (uint32_t id = 0; id < 64; ++id) {
    const DTypeInfo* info = dtype_info(id);
    if (info == nullptr || !can_dequantize(info->type)) continue;
    EXPECT_TRUE(covered.count(std::string(info->name))) << info->name << " has a to_float but no golden blocks";
  }
}

TEST(DequantGolden, RandomBlocksMatchGgufPy) {
  for (const auto& c : quant_index().at("dequant")) {
    const DType t = test::dtype_named(c.at("dtype").get<std::string>());
    SCOPED_TRACE(std::string(dtype_name(t)));
    const auto n = c.at("n").get<int64_t>();
    const std::vector<uint8_t> src = quant_blob(c.at("src"));
    const std::vector<float> want = quant_floats(c.at("expected"));
    ASSERT_EQ(dtype_row_bytes(t, static_cast<uint64_t>(n)).value_or(0), src.size());
    ASSERT_EQ(want.size(), static_cast<size_t>(n));

    std::vector<float> got(want.size(), -1.0f);
    dequantize_row(t, src.data(), got.data(), n);
    EXPECT_EQ(compare_float_bits(got.data(), want.data(), want.size()), "") << "as one row";

    // One block per call: the result must not depend on how a tensor is split into rows.
    const DTypeInfo& info = dtype_info(t);
    std::fill(got.begin(), got.end(), -1.0f);
    for (int64_t b = 0; b < n / info.block_size; ++b)
      dequantize_row(t, src.data() + b * info.type_size, got.data() + b * info.block_size, info.block_size);
    EXPECT_EQ(compare_float_bits(got.data(), want.data(), want.size()), "") << "one block per call";
  }
}

TEST(DequantGolden, DefaultModelTensorsMatchGgufPy) {
  TESSERA_REQUIRE_DEFAULT_MODEL(path);
  const auto& m = quant_index().at("model");
  const MappedFile file(path);
  ASSERT_EQ(file.size(), m.at("size").get<size_t>())
      << path << " is not the file tests/data/quant was made from (rerun python/make_quant_golden.py)";

  std::set<std::string> dtypes_seen;
  std::vector<float> buf;
  for (const auto& t : m.at("tensors")) {
    const std::string name = t.at("name").get<std::string>();
    SCOPED_TRACE(name);
    const DType dt = test::dtype_named(t.at("dtype").get<std::string>());
    dtypes_seen.insert(std::string(dtype_name(dt)));
    const auto ne = t.at("ne").get<std::vector<int64_t>>();  // GGUF order: ne[0] is the row length
    int64_t n_rows = 1;
    for (size_t i = 1; i < ne.size(); ++i) n_rows *= ne[i];
    const auto offset = t.at("offset").get<uint64_t>();
    const auto n_bytes = t.at("n_bytes").get<uint64_t>();
    const uint64_t row_bytes = dtype_row_bytes(dt, static_cast<uint64_t>(ne[0])).value_or(0);
    ASSERT_GT(row_bytes, 0u);
    ASSERT_EQ(row_bytes * static_cast<uint64_t>(n_rows), n_bytes);
    ASSERT_LE(offset + n_bytes, file.size());

    // Dequantize a few hundred KB at a time, hashing as we go: token_embd alone is 113 MB of floats.
    const int64_t rows_per_chunk = std::max<int64_t>(1, (1 << 18) / ne[0]);
    buf.resize(static_cast<size_t>(rows_per_chunk * ne[0]));
    test::Sha256 hash;
    std::vector<uint32_t> first8;
    for (int64_t r = 0; r < n_rows; r += rows_per_chunk) {
      const int64_t rows = std::min(rows_per_chunk, n_rows - r);
      dequantize_row(dt, file.data() + offset + static_cast<uint64_t>(r) * row_bytes, buf.data(), rows * ne[0]);
      hash.update(buf.data(), static_cast<size_t>(rows * ne[0]) * sizeof(float));
      for (size_t i = 0; first8.size() < 8 && i < buf.size(); ++i) first8.push_back(f32_bits(buf[i]));
    }
    EXPECT_EQ(first8, t.at("first8_bits").get<std::vector<uint32_t>>());
    EXPECT_EQ(hash.hex_digest(), t.at("sha256").get<std::string>()) << "sha256 of the dequantized float32 bytes";
  }
  // The subset must keep covering every dtype of the model (q8_0 token_embd, q4_1 matrices, f32 norms).
  EXPECT_EQ(dtypes_seen, (std::set<std::string>{"f32", "q4_1", "q8_0"}));
}

TEST(Sha256, KnownDigests) {
  // FIPS 180-4 example messages; a broken hash would make the model test pass or fail for the wrong reason.
  EXPECT_EQ(test::sha256_hex("", 0), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(test::sha256_hex("abc", 3), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  EXPECT_EQ(test::sha256_hex(two_blocks.data(), two_blocks.size()),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // Split updates of odd sizes must agree with one update.
  std::string million(1000000, 'a');
  test::Sha256 s;
  for (size_t i = 0, step = 1; i < million.size(); i += step, step = step % 97 + 1)
    s.update(million.data() + i, std::min(step, million.size() - i));
  EXPECT_EQ(s.hex_digest(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

}  // namespace
}  // namespace tessera
