// Safetensors reading checked against golden data from python/make_tiny_hf_model.py (numpy + the safetensors
// package): tensor tables, byte ranges, raw-byte checksums, bit-exact f32 conversions, GGUF names, shards.
#include <fmt/core.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "formats/safetensors.h"
#include "formats/test_safetensors_util.h"
#include "quant/quant.h"

namespace tessera {
namespace {

using nlohmann::json;
using test::data_path;
using test::fnv1a64;

std::string hex64(uint64_t v) { return fmt::format("{:016x}", v); }

// Compares one tensor with its golden entry: table fields, raw bytes, and values converted to f32 by dequantize_row.
void expect_tensor(const TensorView& t, const json& g) {
  SCOPED_TRACE(t.name);
  EXPECT_EQ(std::string(dtype_name(t.dtype)), g["dtype"].get<std::string>());
  EXPECT_EQ(t.shape, g["shape"].get<std::vector<int64_t>>());
  EXPECT_EQ(t.offset, g["offset"].get<uint64_t>());
  EXPECT_EQ(t.nbytes, g["nbytes"].get<uint64_t>());
  ASSERT_NE(t.data, nullptr);
  EXPECT_EQ(hex64(fnv1a64(t.data, t.nbytes)), g["fnv1a64_raw"].get<std::string>());
  if (g.contains("fnv1a64_f32")) {
    std::vector<float> f(static_cast<size_t>(t.numel()));
    if (!f.empty()) dequantize_row(t.dtype, t.data, f.data(), t.numel());
    EXPECT_EQ(hex64(fnv1a64(f.data(), f.size() * 4)), g["fnv1a64_f32"].get<std::string>());
    for (const json& s : g["samples_f32_bits"]) {
      const auto i = s[0].get<size_t>();
      uint32_t bits;
      std::memcpy(&bits, &f.at(i), 4);
      EXPECT_EQ(bits, s[1].get<uint32_t>()) << "element " << i;
    }
  }
  if (g.contains("values_raw_int")) {
    const auto& want = g["values_raw_int"];
    ASSERT_EQ(static_cast<size_t>(t.numel()), want.size());
    const size_t es = t.nbytes / want.size();
    for (size_t i = 0; i < want.size(); ++i) {
      const uint8_t* p = t.data + i * es;
      if (t.dtype == DType::F64) {
        uint64_t v;
        std::memcpy(&v, p, 8);
        EXPECT_EQ(v, want[i].get<uint64_t>()) << "element " << i;
        continue;
      }
      int64_t v = 0;
      switch (t.dtype) {
        case DType::I8: {
          int8_t x;
          std::memcpy(&x, p, 1);
          v = x;
          break;
        }
        case DType::I16: {
          int16_t x;
          std::memcpy(&x, p, 2);
          v = x;
          break;
        }
        case DType::I32: {
          int32_t x;
          std::memcpy(&x, p, 4);
          v = x;
          break;
        }
        case DType::I64:
          std::memcpy(&v, p, 8);
          break;
        default:
          FAIL() << "unexpected dtype " << dtype_name(t.dtype);
      }
      EXPECT_EQ(v, want[i].get<int64_t>()) << "element " << i;
    }
  }
}

void expect_model(const safetensors::Model& m, const std::string& model, const json& g) {
  SCOPED_TRACE(model);
  namespace fs = std::filesystem;
  EXPECT_EQ(m.sharded(), g["sharded"].get<bool>());
  std::vector<std::string> shards;
  for (const auto& p : m.shard_paths()) shards.push_back(fs::path(p).filename().string());
  EXPECT_EQ(shards, g["shards"].get<std::vector<std::string>>());
  EXPECT_EQ(fs::path(m.config_path()).filename(), "config.json");
  EXPECT_TRUE(m.config_json().is_object());
  EXPECT_EQ(m.config_json()["_name_or_path"], "tessera/" + model);
  EXPECT_EQ(!m.tokenizer_path().empty(), g["has_tokenizer"].get<bool>());
  if (!m.tokenizer_path().empty()) {
    EXPECT_TRUE(fs::is_regular_file(m.tokenizer_path()));
  }
  EXPECT_EQ(m.metadata(), (g["metadata"].get<std::map<std::string, std::string>>()));
  ASSERT_EQ(m.tensors().size(), g["tensors"].size());
  uint64_t total = 0;
  for (const json& gt : g["tensors"]) {
    const std::string name = gt["name"].get<std::string>();
    const TensorView* t = m.find_tensor(name);
    ASSERT_NE(t, nullptr) << name;
    expect_tensor(*t, gt);
    total += t->nbytes;
    const std::string gguf_name = gt["gguf_name"].get<std::string>();
    ASSERT_FALSE(gguf_name.empty()) << "gguf-py does not know " << name;
    EXPECT_EQ(safetensors::hf_to_gguf_name(name), gguf_name);
    EXPECT_EQ(m.find_tensor_gguf(gguf_name), t);
  }
  EXPECT_EQ(m.total_bytes(), total);
  EXPECT_EQ(m.find_tensor("no.such.tensor"), nullptr);
  EXPECT_EQ(m.find_tensor_gguf("blk.99.attn_q.weight"), nullptr);
}

class HfModels : public ::testing::TestWithParam<std::string> {};

TEST_P(HfModels, DirectoryMatchesGolden) {
  const json g = test::hf_golden()["models"][GetParam()];
  ASSERT_TRUE(g.is_object());
  expect_model(safetensors::Model::open(data_path("hf/" + GetParam())), GetParam(), g);
}

TEST_P(HfModels, WeightsPathMatchesGolden) {
  const json g = test::hf_golden()["models"][GetParam()];
  const std::string dir = data_path("hf/" + GetParam());
  const std::string weights =
      g["sharded"].get<bool>() ? dir + "/model.safetensors.index.json" : dir + "/model.safetensors";
  safetensors::Model m = safetensors::Model::open(weights);
  EXPECT_EQ(m.weights_path(), weights);
  expect_model(m, GetParam(), g);
}

TEST_P(HfModels, ShardsParseAloneAndFromMemory) {
  const json g = test::hf_golden()["models"][GetParam()];
  for (const json& shard : g["shards"]) {
    const std::string path = data_path("hf/" + GetParam() + "/" + shard.get<std::string>());
    safetensors::File f = safetensors::File::open(path);
    const std::vector<uint8_t> bytes = test::read_bytes(path);
    EXPECT_EQ(f.file_size(), bytes.size());
    safetensors::Header h = safetensors::parse_header(bytes.data(), bytes.size(), path);
    EXPECT_EQ(h.data_offset, f.data_offset());
    ASSERT_EQ(h.tensors.size(), f.tensors().size());
    for (size_t i = 0; i < h.tensors.size(); ++i) {
      EXPECT_EQ(h.tensors[i].name, f.tensors()[i].name);
      EXPECT_EQ(h.tensors[i].offset, f.tensors()[i].offset);
      // Zero-copy: tensors point into the buffer they were parsed from.
      EXPECT_EQ(h.tensors[i].data, bytes.data() + h.tensors[i].offset);
      EXPECT_EQ(std::memcmp(h.tensors[i].data, f.tensors()[i].data, h.tensors[i].nbytes), 0);
      if (i > 0) {
        EXPECT_GE(h.tensors[i].offset, h.tensors[i - 1].offset + h.tensors[i - 1].nbytes);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, HfModels,
                         ::testing::Values("tiny-llama-bf16-tied", "tiny-llama3-f32", "tiny-mistral-sharded"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

TEST(Safetensors, EverySupportedDtypeBitExact) {
  const json g = test::hf_golden()["dtypes"];
  safetensors::File f = safetensors::File::open(data_path("hf/dtypes.safetensors"));
  EXPECT_EQ(f.metadata(), (g["metadata"].get<std::map<std::string, std::string>>()));
  ASSERT_EQ(f.tensors().size(), g["tensors"].size());
  for (const json& gt : g["tensors"]) {
    const TensorView* t = f.find_tensor(gt["name"].get<std::string>());
    ASSERT_NE(t, nullptr) << gt["name"];
    expect_tensor(*t, gt);
  }
  EXPECT_EQ(f.find_tensor("scalar")->shape.size(), 0u);
  EXPECT_EQ(f.find_tensor("empty")->numel(), 0);
}

TEST(Safetensors, TiedModelHasNoOutputMatrix) {
  safetensors::Model m = safetensors::Model::open(data_path("hf/tiny-llama-bf16-tied"));
  EXPECT_EQ(m.find_tensor_gguf("output.weight"), nullptr);
  EXPECT_NE(m.find_tensor_gguf("token_embd.weight"), nullptr);
  safetensors::Model s = safetensors::Model::open(data_path("hf/tiny-llama3-f32"));
  EXPECT_NE(s.find_tensor_gguf("output.weight"), nullptr);
}

TEST(Safetensors, HfToGgufNamesMatchGgufPy) {
  const json g = test::hf_golden()["extra_names"];
  ASSERT_FALSE(g.empty());
  for (const json& e : g) EXPECT_EQ(safetensors::hf_to_gguf_name(e[0].get<std::string>()), e[1].get<std::string>());
}

TEST(Safetensors, HfToGgufUnknownNamesAreEmpty) {
  for (const char* n :
       {"", "model.layers.0.self_attn.rotary_emb.inv_freq", "model.layers.x.mlp.up_proj.weight",
        "model.layers..mlp.up_proj.weight", "model.layers.01.mlp.up_proj.weight", "model.layers.0.mlp.up_proj",
        "model.layers.0.mlp.up_proj.weight.extra", "layers.0.mlp.up_proj.weight", "model.embed_tokens.bias",
        "lm_head.weight2", "model.layers.1234567890.mlp.up_proj.weight"})
    EXPECT_EQ(safetensors::hf_to_gguf_name(n), "") << n;
}

TEST(Safetensors, DtypeNames) {
  EXPECT_EQ(safetensors::dtype_from_safetensors("BF16", "x"), DType::BF16);
  EXPECT_EQ(safetensors::dtype_from_safetensors("I8", "x"), DType::I8);
  EXPECT_ERROR_HAS(safetensors::dtype_from_safetensors("bf16", "x"), "unknown dtype 'bf16'");
  EXPECT_ERROR_HAS(safetensors::dtype_from_safetensors("F8_E4M3", "x"), "unsupported dtype F8_E4M3");
}

}  // namespace
}  // namespace tessera
