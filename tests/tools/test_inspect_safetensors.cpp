// `tessera inspect --json` on the tiny Hugging Face models (tests/data/hf, golden.json from
// python/make_tiny_hf_model.py), and on broken ones: a non-zero exit and one "tessera: error: ..." line.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "formats/test_safetensors_util.h"

namespace tessera {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

json inspect_json(const std::string& path) {
  std::string out;
  const int rc = test::run_command(test::cli_path() + " inspect --json -m '" + path + "'", &out);
  EXPECT_EQ(rc, 0) << out;
  return json::parse(out);
}

void expect_matches_golden(const json& j, const json& g) {
  const json& c = g["config"];
  EXPECT_EQ(j["format"], "safetensors");
  EXPECT_EQ(j["architecture"], c["architecture"]);
  for (const char* k : {"n_layers", "n_embd", "n_head", "n_head_kv", "head_dim", "n_ff", "n_vocab", "n_ctx_train"})
    EXPECT_EQ(j[k], c[k]) << k;
  EXPECT_EQ(j["tied_output"], c["tied_output"]);
  EXPECT_EQ(j["rope_scaling"]["type"], c["rope_scaling"]["type"]);
  EXPECT_EQ(static_cast<float>(j["rope_scaling"]["factor"].get<double>()),
            static_cast<float>(c["rope_scaling"]["factor"].get<double>()));
  EXPECT_EQ(static_cast<float>(j["rope_base"].get<double>()), static_cast<float>(c["rope_base"].get<double>()));
  EXPECT_EQ(j["tokenizer"]["n_vocab"], g["tokenizer_vocab"]);
  EXPECT_EQ(j["tokenizer"]["kind"], g["has_tokenizer"].get<bool>() ? "hf-bpe" : "none");
  ASSERT_EQ(j["tensors"].size(), g["tensors"].size());
  uint64_t bytes = 0;
  for (const json& gt : g["tensors"]) {
    bool found = false;
    for (const json& t : j["tensors"]) {
      if (t["name"] != gt["name"]) continue;
      found = true;
      EXPECT_EQ(t["dtype"], gt["dtype"]) << gt["name"];
      EXPECT_EQ(t["shape"], gt["shape"]) << gt["name"];
      EXPECT_EQ(t["bytes"], gt["nbytes"]) << gt["name"];
    }
    EXPECT_TRUE(found) << gt["name"];
    bytes += gt["nbytes"].get<uint64_t>();
  }
  EXPECT_EQ(j["n_bytes"].get<uint64_t>(), bytes);
}

TEST(InspectSafetensors, TinyModelsMatchGolden) {
  const json golden = test::hf_golden()["models"];
  ASSERT_EQ(golden.size(), 3u);
  for (const auto& [model, g] : golden.items()) {
    SCOPED_TRACE(model);
    const std::string dir = test::data_path("hf/" + model);
    expect_matches_golden(inspect_json(dir), g);
    const std::string weights =
        g["sharded"].get<bool>() ? dir + "/model.safetensors.index.json" : dir + "/model.safetensors";
    expect_matches_golden(inspect_json(weights), g);
  }
}

void expect_clean_failure(const std::string& path, const std::string& expect) {
  std::string out;
  const int rc = test::run_command(test::cli_path() + " inspect -m '" + path + "'", &out);
  SCOPED_TRACE(path);
  EXPECT_GT(rc, 0) << out;
  EXPECT_LT(rc, 128) << "crashed: " << out;
  ASSERT_EQ(out.rfind("tessera: error: ", 0), 0u) << out;
  EXPECT_EQ(out.find('\n'), out.size() - 1) << "expected exactly one line: " << out;
  EXPECT_NE(out.find(expect), std::string::npos) << "expected '" << expect << "' in: " << out;
}

TEST(InspectSafetensors, BrokenModelsFailCleanly) {
  test::TempDir d;
  test::copy_model("tiny-llama3-f32", d);
  fs::remove(d / "config.json");
  expect_clean_failure(d.str(), "config.json is missing");

  test::write_text(d / "config.json", "{\"architectures\": [\"LlamaForCausalLM\"]}");
  expect_clean_failure(d.str(), "config.json: required key 'hidden_size' is missing");

  fs::copy_file(test::data_path("hf/tiny-llama3-f32/config.json"), d / "config.json",
                fs::copy_options::overwrite_existing);
  auto b = test::read_bytes(d / "model.safetensors");
  b.resize(b.size() - 1);
  test::write_bytes(d / "model.safetensors", b);
  expect_clean_failure(d / "model.safetensors", "past the end of the data section");

  test::write_bytes(d / "model.safetensors", test::make_safetensors("{\"w\":", 0));
  expect_clean_failure(d.str(), "model.safetensors: header is not valid JSON");

  test::TempDir s;
  test::copy_model("tiny-mistral-sharded", s);
  fs::remove(s / "model-00001-of-00002.safetensors");
  expect_clean_failure(s.str(), "shard 'model-00001-of-00002.safetensors'");

  test::write_text(s / "model.safetensors.index.json", "not json");
  expect_clean_failure(s / "model.safetensors.index.json", "model.safetensors.index.json: not valid JSON");

  test::TempDir e;
  expect_clean_failure(e.str(), "holds neither model.safetensors nor model.safetensors.index.json");
}

}  // namespace
}  // namespace tessera
