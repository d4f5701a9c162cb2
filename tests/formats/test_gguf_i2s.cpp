// bitnet.cpp's I2_S tensors in a GGUF (src/quant/i2s.h): the reader converts them at load, and the weights read back
// equal the ternary source times the scale, exactly. Golden data: tests/data/gguf/i2s-ternary.gguf, made by
// `.venv/bin/python python/make_i2s_golden.py` (packing random trits as bitnet.cpp's quantize_i2_s does).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "formats/gguf.h"
#include "quant/i2s.h"
#include "quant/quant.h"
#include "test_util.h"

namespace tessera {
namespace {

const char* kFile = "gguf/i2s-ternary.gguf";

std::vector<float> weights_of(const TensorView& t) {
  const int64_t k = t.shape.back(), n = t.numel() / k;
  const uint64_t row = *dtype_row_bytes(t.dtype, static_cast<uint64_t>(k));
  EXPECT_EQ(t.nbytes, row * static_cast<uint64_t>(n));
  std::vector<float> w(static_cast<size_t>(t.numel()));
  for (int64_t r = 0; r < n; ++r) dequantize_row(t.dtype, t.data + row * static_cast<uint64_t>(r), w.data() + r * k, k);
  return w;
}

TEST(GgufI2S, ConvertsExactlyToTq20OrF32) {
  const gguf::File f = gguf::File::open(test::data_path(kFile));
  struct Want {
    const char* name;
    std::vector<int64_t> shape;
    DType dtype;
  };
  // a: rows of 512 and a bf16 scale -> TQ2_0; b: rows of 384 and c: scale 0.1 (no fp16 value) -> F32.
  for (const Want& want :
       {Want{"a", {16, 512}, DType::TQ2_0}, Want{"b", {8, 384}, DType::F32}, Want{"c", {4, 256}, DType::F32}}) {
    SCOPED_TRACE(want.name);
    const std::string name = want.name;
    const TensorView* w = f.find_tensor(name + ".weight");
    const TensorView* t = f.find_tensor(name + ".ternary");
    const TensorView* s = f.find_tensor(name + ".scale");
    ASSERT_TRUE(w && t && s);
    EXPECT_EQ(w->dtype, want.dtype);
    EXPECT_EQ(w->shape, want.shape);
    ASSERT_EQ(t->dtype, DType::I8);
    float scale;
    std::memcpy(&scale, s->data, sizeof(scale));
    const std::vector<float> got = weights_of(*w);
    ASSERT_EQ(got.size(), static_cast<size_t>(t->numel()));
    int nonzero = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const auto trit = static_cast<int8_t>(t->data[i]);
      ASSERT_EQ(got[i], static_cast<float>(trit) * scale) << "element " << i;
      nonzero += trit != 0;
    }
    EXPECT_GT(nonzero, static_cast<int>(got.size()) / 2);  // random trits: not a vacuous all-zero match
  }
}

// The raw layout, independently of the file: element i of block b sits in byte 32 b + i % 32, bits 6 - 2 (i / 32).
TEST(GgufI2S, CodesAndScaleLayout) {
  std::vector<uint8_t> raw(i2s_bytes(256), 0);
  EXPECT_EQ(raw.size(), 256u / 4 + 32);
  raw[0] = 0b10'01'00'11;       // elements 0, 32, 64, 96 of block 0: codes 2, 1, 0, 3
  raw[32 + 5] = 0b00'10'00'00;  // element 128 + 32 + 5: code 2
  const float s = 0.75f;
  std::memcpy(raw.data() + 64, &s, sizeof(s));
  EXPECT_EQ(i2s_code(raw.data(), 0), 2);
  EXPECT_EQ(i2s_code(raw.data(), 32), 1);
  EXPECT_EQ(i2s_code(raw.data(), 64), 0);
  EXPECT_EQ(i2s_code(raw.data(), 96), 3);
  EXPECT_EQ(i2s_code(raw.data(), 128 + 37), 2);
  EXPECT_EQ(i2s_code(raw.data(), 1), 0);
  EXPECT_EQ(i2s_scale(raw.data(), 256), 0.75f);
  // Through TQ2_0: the same values, code 3 (never written by bitnet.cpp) reading as +2 as in bitnet.cpp's kernels.
  std::vector<uint8_t> out;
  ASSERT_EQ(i2s_convert(raw.data(), 1, 256, out), DType::TQ2_0);
  std::vector<float> got(256), want(256);
  dequantize_row(DType::TQ2_0, out.data(), got.data(), 256);
  i2s_dequantize(raw.data(), 256, want.data());
  EXPECT_EQ(got, want);
  EXPECT_EQ(got[0], 0.75f);
  EXPECT_EQ(got[64], -0.75f);
  EXPECT_EQ(got[96], 1.5f);
  EXPECT_THROW(i2s_bytes(100), Error);
}

TEST(GgufI2S, RejectsRowsOfPartialBlocks) {
  std::ifstream in(test::data_path(kFile), std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 1000u);
  // Tensor info of b.weight: name, u32 n_dims = 2, u64 ne[0] = 384 -> 100 (numel 800, not whole blocks).
  const std::string name = "b.weight";
  auto at = std::search(bytes.begin(), bytes.end(), name.begin(), name.end());
  ASSERT_NE(at, bytes.end());
  const size_t ne0 = static_cast<size_t>(at - bytes.begin()) + name.size() + 4;
  uint64_t v = 100;
  std::memcpy(bytes.data() + ne0, &v, sizeof(v));
  try {
    gguf::File::parse(bytes.data(), bytes.size(), "patched");
    FAIL() << "accepted rows of 100";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not whole blocks of 128"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera
