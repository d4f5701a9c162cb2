// Malformed safetensors buffers and model directories: each must throw tessera::Error naming the problem, never crash
// or read out of bounds (the fuzzer, tests/fuzz/fuzz_safetensors.cpp, covers what these cases do not).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "formats/safetensors.h"
#include "formats/test_safetensors_util.h"

namespace tessera {
namespace {

using test::make_safetensors;
using test::TempDir;

void parse(const std::vector<uint8_t>& b) { safetensors::parse_header(b.data(), b.size(), "bad.safetensors"); }

// Header text with one f32 tensor "w" of `shape` at `offsets`.
std::string one_tensor(const std::string& shape, const std::string& offsets, const std::string& dtype = "\"F32\"") {
  return R"({"w":{"dtype":)" + dtype + R"(,"shape":)" + shape + R"(,"data_offsets":)" + offsets + "}}";
}

TEST(SafetensorsMalformed, ValidBaseline) {
  auto b = make_safetensors(one_tensor("[2,2]", "[0,16]"), 16);
  safetensors::Header h = safetensors::parse_header(b.data(), b.size(), "ok");
  ASSERT_EQ(h.tensors.size(), 1u);
  EXPECT_EQ(h.tensors[0].offset, h.data_offset);
  EXPECT_EQ(h.data_offset, b.size() - 16);
  // Spaces after the JSON (writers pad the header to 8 bytes) are fine.
  auto padded = make_safetensors(one_tensor("[2,2]", "[0,16]") + "     ", 16);
  EXPECT_NO_THROW(parse(padded));
}

TEST(SafetensorsMalformed, FileTooSmall) {
  std::vector<uint8_t> b = {1, 0, 0};
  EXPECT_ERROR_HAS(parse(b), "too small");
  EXPECT_ERROR_HAS(safetensors::parse_header(nullptr, 0, "empty.safetensors"), "empty.safetensors: file is 0 bytes");
}

TEST(SafetensorsMalformed, HeaderLengthBeyondFile) {
  auto b = make_safetensors(one_tensor("[2,2]", "[0,16]"), 16);
  b[0] = static_cast<uint8_t>(b.size());  // header length = whole file: 8 bytes too long
  b[1] = static_cast<uint8_t>(b.size() >> 8);
  EXPECT_ERROR_HAS(parse(b), "bad.safetensors: header length");
  EXPECT_ERROR_HAS(parse(b), "extends past the end of the file");
}

TEST(SafetensorsMalformed, HeaderLengthAboveLimit) {
  auto b = make_safetensors("{}", 0);
  const uint64_t n = safetensors::kMaxHeaderBytes + 1;
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(n >> (8 * i));
  EXPECT_ERROR_HAS(parse(b), "exceeds the 100 MB limit");
  // A GGUF file given as safetensors: its magic and version read as an absurd length.
  std::vector<uint8_t> gguf = {'G', 'G', 'U', 'F', 3, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_ERROR_HAS(parse(gguf), "is this a safetensors file?");
}

TEST(SafetensorsMalformed, TruncatedHeaderJson) {
  const std::string full = one_tensor("[2,2]", "[0,16]");
  EXPECT_ERROR_HAS(parse(make_safetensors(full.substr(0, full.size() / 2), 16)), "header is not valid JSON");
}

TEST(SafetensorsMalformed, HeaderNotJson) {
  EXPECT_ERROR_HAS(parse(make_safetensors("hello world", 0)), "header is not a JSON object");
  EXPECT_ERROR_HAS(parse(make_safetensors("", 0)), "header is not a JSON object");
  EXPECT_ERROR_HAS(parse(make_safetensors("[1, 2]", 0)), "header is not a JSON object");
  EXPECT_ERROR_HAS(parse(make_safetensors("{not json}", 0)), "header is not valid JSON");
  EXPECT_ERROR_HAS(parse(make_safetensors("{} trailing", 0)), "header is not valid JSON");
  EXPECT_ERROR_HAS(parse(make_safetensors("{\"w\": \"\xff\xfe\"}", 0)), "header is not valid JSON");  // bad UTF-8
}

TEST(SafetensorsMalformed, MissingFields) {
  auto hdr = [](const std::string& fields) { return make_safetensors("{\"w\":{" + fields + "}}", 16); };
  EXPECT_ERROR_HAS(parse(hdr(R"("shape":[4],"data_offsets":[0,16])")), "tensor 'w' has no dtype");
  EXPECT_ERROR_HAS(parse(hdr(R"("dtype":"F32","data_offsets":[0,16])")), "tensor 'w' has no shape");
  EXPECT_ERROR_HAS(parse(hdr(R"("dtype":"F32","shape":[4])")), "tensor 'w' has no data_offsets");
  EXPECT_ERROR_HAS(parse(make_safetensors(R"({"w":5})", 0)), "tensor 'w' entry is a number, not an object");
}

TEST(SafetensorsMalformed, WrongFieldTypes) {
  EXPECT_ERROR_HAS(parse(make_safetensors(one_tensor("[4]", "[0,16]", "5"), 16)), "dtype is a number");
  EXPECT_ERROR_HAS(parse(make_safetensors(one_tensor("\"4\"", "[0,16]"), 16)), "shape is a string");
  EXPECT_ERROR_HAS(parse(make_safetensors(one_tensor("[\"4\"]", "[0,16]"), 16)), "shape holds a string");
  EXPECT_ERROR_HAS(parse(make_safetensors(one_tensor("[2.5]", "[0,16]"), 16)), "non-integer dimension (2.5)");
  EXPECT_ERROR_HAS(parse(make_safetensors(one_tensor("[4]", "[0]"), 16)), "array of two integers");
  EXPECT_ERROR_HAS(parse(make_safetensors(one_tensor("[4]", "[0,16,32]"), 16)), "array of two integers");
  EXPECT_ERROR_HAS(parse(make_safetensors(one_tensor("[4]", "{}"), 16)), "array of two integers");
  EXPECT_ERROR_HAS(parse(make_safetensors(one_tensor("[4]", "[-1,16]"), 16)), "not a non-negative integer");
  EXPECT_ERROR_HAS(parse(make_safetensors(one_tensor("[4]", "[0,16.0]"), 16)), "not a non-negative integer");
}

TEST(SafetensorsMalformed, UnknownAndUnsupportedDtypes) {
  EXPECT_ERROR_HAS(parse(make_safetensors(one_tensor("[4]", "[0,16]", "\"F33\""), 16)), "unknown dtype 'F33'");
  for (const char* dt : {"BOOL", "F8_E4M3", "F8_E5M2", "U32"})  // U8 reads as I8 (BitNet)
    EXPECT_ERROR_HAS(parse(make_safetensors(one_tensor("[4]", "[0,4]", std::string("\"") + dt + "\""), 16)),
                     std::string("tensor 'w' has unsupported dtype ") + dt);
}

TEST(SafetensorsMalformed, OffsetsOutOfRange) {
  EXPECT_ERROR_HAS(parse(make_safetensors(one_tensor("[4]", "[0,16]"), 15)), "past the end of the data section");
  EXPECT_ERROR_HAS(parse(make_safetensors(one_tensor("[4]", "[18446744073709551600,18446744073709551615]"), 16)),
                   "past the end of the data section");
  EXPECT_ERROR_HAS(parse(make_safetensors(one_tensor("[0]", "[16,0]"), 16)), "begin after end");
}

TEST(SafetensorsMalformed, SizeMismatch) {
  EXPECT_ERROR_HAS(parse(make_safetensors(one_tensor("[2,2]", "[0,12]"), 16)),
                   "tensor 'w' occupies 12 bytes but its shape and dtype need 16");
  EXPECT_ERROR_HAS(parse(make_safetensors(one_tensor("[3]", "[0,8]", "\"BF16\""), 16)), "need 6");
}

TEST(SafetensorsMalformed, OverlappingTensors) {
  const std::string h = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})";
  EXPECT_ERROR_HAS(parse(make_safetensors(h, 20)), "tensors 'a' and 'b' overlap");
  const std::string same = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                           R"("b":{"dtype":"I32","shape":[4],"data_offsets":[0,16]}})";
  EXPECT_ERROR_HAS(parse(make_safetensors(same, 16)), "overlap");
  // Adjacent tensors and an empty tensor at a shared offset are fine.
  const std::string ok = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                         R"("e":{"dtype":"F32","shape":[0,3],"data_offsets":[8,8]},)"
                         R"("b":{"dtype":"F32","shape":[1],"data_offsets":[16,20]}})";
  EXPECT_NO_THROW(parse(make_safetensors(ok, 20)));
}

TEST(SafetensorsMalformed, NegativeAndHugeDims) {
  EXPECT_ERROR_HAS(parse(make_safetensors(one_tensor("[-2,-2]", "[0,16]"), 16)), "negative dimension (-2)");
  EXPECT_ERROR_HAS(parse(make_safetensors(one_tensor("[4611686018427387904,4]", "[0,16]"), 16)),
                   "element count overflows");
  EXPECT_ERROR_HAS(parse(make_safetensors(one_tensor("[2305843009213693952,2]", "[0,16]"), 16)), "byte size overflows");
  EXPECT_ERROR_HAS(parse(make_safetensors(one_tensor("[9223372036854775808]", "[0,16]"), 16)), "too large");
}

TEST(SafetensorsMalformed, DuplicateAndEmptyNames) {
  const std::string h = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                        R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  EXPECT_ERROR_HAS(parse(make_safetensors(h, 8)), "tensor 'a' appears twice");
  EXPECT_ERROR_HAS(parse(make_safetensors(R"({"":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4)),
                   "empty name");
}

TEST(SafetensorsMalformed, BadMetadata) {
  EXPECT_ERROR_HAS(parse(make_safetensors(R"({"__metadata__":{"format":1}})", 0)),
                   "__metadata__ value 'format' is a number");
  EXPECT_ERROR_HAS(parse(make_safetensors(R"({"__metadata__":[]})", 0)), "__metadata__ is an array");
}

TEST(SafetensorsMalformed, DeepNesting) {
  std::string deep = "{\"w\":" + std::string(64, '[') + std::string(64, ']') + "}";
  EXPECT_ERROR_HAS(parse(make_safetensors(deep, 0)), "nests deeper");
}

// Every prefix of a valid file fails cleanly or (for the full length) parses.
TEST(SafetensorsMalformed, EveryTruncationOfARealFileFailsCleanly) {
  const auto bytes = test::read_bytes(test::data_path("hf/dtypes.safetensors"));
  ASSERT_GT(bytes.size(), 100u);
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_THROW(parse(cut), Error) << "prefix of " << n << " bytes";
  }
  EXPECT_NO_THROW(parse(bytes));
}

// ---- files and model directories ----

TEST(SafetensorsModelErrors, PathMissing) {
  TempDir d;
  EXPECT_ERROR_HAS(safetensors::Model::open(d / "nope"), "no such file or directory");
  EXPECT_ERROR_HAS(safetensors::File::open(d / "nope.safetensors"), "cannot open");
}

TEST(SafetensorsModelErrors, DirectoryWithoutWeights) {
  TempDir d;
  test::write_text(d / "config.json", "{}");
  EXPECT_ERROR_HAS(safetensors::Model::open(d.str()),
                   "holds neither model.safetensors nor model.safetensors.index.json");
}

TEST(SafetensorsModelErrors, ConfigMissingOrBroken) {
  TempDir d;
  test::copy_model("tiny-llama3-f32", d);
  std::filesystem::remove(d / "config.json");
  EXPECT_ERROR_HAS(safetensors::Model::open(d.str()), "config.json is missing");
  test::write_text(d / "config.json", "{\"hidden_size\": 32,");
  EXPECT_ERROR_HAS(safetensors::Model::open(d.str()), "config.json: not valid JSON");
  test::write_text(d / "config.json", "[1]");
  EXPECT_ERROR_HAS(safetensors::Model::open(d.str()), "config.json: holds an array, not a JSON object");
}

TEST(SafetensorsModelErrors, TruncatedWeightsFile) {
  TempDir d;
  test::copy_model("tiny-llama3-f32", d);
  auto b = test::read_bytes(d / "model.safetensors");
  b.resize(b.size() / 2);
  test::write_bytes(d / "model.safetensors", b);
  EXPECT_ERROR_HAS(safetensors::Model::open(d.str()), "past the end of the data section");
  EXPECT_ERROR_HAS(safetensors::Model::open(d.str()), "model.safetensors: tensor '");
}

TEST(SafetensorsModelErrors, TokenizerFilesAreOptional) {
  TempDir d;
  test::copy_model("tiny-llama-bf16-tied", d);
  EXPECT_EQ(safetensors::Model::open(d.str()).tokenizer_path(), d / "tokenizer.json");
  EXPECT_EQ(safetensors::Model::open(d.str()).tokenizer_config_path(), "");
  std::filesystem::remove(d / "tokenizer.json");
  test::write_text(d / "tokenizer_config.json", "{}");
  safetensors::Model m = safetensors::Model::open(d / "model.safetensors");
  EXPECT_EQ(m.tokenizer_path(), "");
  EXPECT_EQ(m.tokenizer_config_path(), d / "tokenizer_config.json");
}

class ShardedErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    test::copy_model("tiny-mistral-sharded", dir_);
    index_ = test::load_json(dir_ / "model.safetensors.index.json");
  }
  void write_index() { test::write_text(dir_ / "model.safetensors.index.json", index_.dump(1)); }
  void expect_error(const std::string& substr) { EXPECT_ERROR_HAS(safetensors::Model::open(dir_.str()), substr); }
  TempDir dir_;
  nlohmann::json index_;
  const std::string s1_ = "model-00001-of-00002.safetensors";
  const std::string s2_ = "model-00002-of-00002.safetensors";
};

TEST_F(ShardedErrors, BaselineOpens) { EXPECT_EQ(safetensors::Model::open(dir_.str()).shard_paths().size(), 2u); }

TEST_F(ShardedErrors, ShardFileMissing) {
  std::filesystem::remove(dir_ / s2_);
  expect_error("shard 'model-00002-of-00002.safetensors' (holding tensor 'lm_head.weight') does not exist");
}

TEST_F(ShardedErrors, IndexPointsAtMissingFile) {
  index_["weight_map"]["lm_head.weight"] = "model-00003-of-00002.safetensors";
  write_index();
  expect_error("shard 'model-00003-of-00002.safetensors' (holding tensor 'lm_head.weight') does not exist");
}

TEST_F(ShardedErrors, IndexBadJson) {
  test::write_text(dir_ / "model.safetensors.index.json", "{\"weight_map\": {");
  expect_error("model.safetensors.index.json: not valid JSON");
}

TEST_F(ShardedErrors, IndexWithoutWeightMap) {
  index_.erase("weight_map");
  write_index();
  expect_error("index has no weight_map");
  index_["weight_map"] = nlohmann::json::array();
  write_index();
  expect_error("weight_map is an array, not an object");
  index_["weight_map"] = nlohmann::json::object();
  write_index();
  expect_error("weight_map lists no tensors");
  test::write_text(dir_ / "model.safetensors.index.json", "3");
  expect_error("index holds a number, not a JSON object");
}

TEST_F(ShardedErrors, WeightMapEntryNotAFileName) {
  index_["weight_map"]["lm_head.weight"] = 2;
  write_index();
  expect_error("weight_map entry 'lm_head.weight' is a number");
  index_["weight_map"]["lm_head.weight"] = "../" + s2_;
  write_index();
  expect_error("which is not a file name in the model directory");
}

TEST_F(ShardedErrors, TensorListedButNotInItsShard) {
  index_["weight_map"]["model.layers.5.mlp.up_proj.weight"] = s1_;
  write_index();
  expect_error("tensor 'model.layers.5.mlp.up_proj.weight' is listed in shard '" + s1_ +
               "' but that shard does not hold it");
}

TEST_F(ShardedErrors, TensorInShardAssignedToAnother) {
  index_["weight_map"]["model.embed_tokens.weight"] = s2_;
  write_index();
  expect_error("holds tensor 'model.embed_tokens.weight', which the index assigns to shard '" + s2_ + "'");
}

TEST_F(ShardedErrors, TensorInShardNotListed) {
  index_["weight_map"].erase("model.norm.weight");
  write_index();
  expect_error("tensor 'model.norm.weight' is not listed in");
}

TEST_F(ShardedErrors, CorruptShard) {
  auto b = test::read_bytes(dir_ / s1_);
  b[8] = '[';  // header no longer starts with '{'
  test::write_bytes(dir_ / s1_, b);
  expect_error(s1_ + ": header is not a JSON object");
}

}  // namespace
}  // namespace tessera
