// `tessera inspect` on the default model, checked against gguf-py's reading of the same file
// (tests/data/gguf/smollm2_q4_1_golden.json, made by python/make_gguf_golden.py).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace {

using nlohmann::json;

json golden() {
  std::ifstream in(tessera::test::data_path("gguf/smollm2_q4_1_golden.json"));
  return json::parse(in);
}

const json& meta(const json& g, const std::string& key) {
  for (const auto& m : g["metadata"])
    if (m["key"] == key) return m["value"];
  throw std::runtime_error("golden lacks " + key);
}

TEST(InspectCli, JsonMatchesGgufPy) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  std::string out;
  ASSERT_EQ(tessera::test::run_command(tessera::test::cli_path() + " inspect --json -m " + model, &out), 0) << out;
  json j = json::parse(out);
  json g = golden();
  EXPECT_EQ(j["format"], "gguf");
  EXPECT_EQ(j["format_version"], g["version"]);
  EXPECT_EQ(j["architecture"], meta(g, "general.architecture"));
  EXPECT_EQ(j["n_layers"], meta(g, "llama.block_count"));
  EXPECT_EQ(j["n_embd"], meta(g, "llama.embedding_length"));
  EXPECT_EQ(j["n_head"], meta(g, "llama.attention.head_count"));
  EXPECT_EQ(j["n_head_kv"], meta(g, "llama.attention.head_count_kv"));
  EXPECT_EQ(j["n_ff"], meta(g, "llama.feed_forward_length"));
  EXPECT_EQ(j["n_vocab"], meta(g, "llama.vocab_size"));
  EXPECT_EQ(j["n_ctx_train"], meta(g, "llama.context_length"));
  EXPECT_FLOAT_EQ(j["rope_base"].get<float>(), meta(g, "llama.rope.freq_base").get<float>());
  EXPECT_FLOAT_EQ(j["norm_eps"].get<float>(), meta(g, "llama.attention.layer_norm_rms_epsilon").get<float>());
  EXPECT_EQ(j["tokenizer"]["kind"], meta(g, "tokenizer.ggml.model"));
  EXPECT_TRUE(j["has_chat_template"].get<bool>());
  EXPECT_TRUE(j["tied_output"].get<bool>());  // no output.weight in the file

  // Tensor table: same names, order, dtypes, shapes and sizes; totals are their sums.
  const auto& gt = g["tensors"];
  const auto& jt = j["tensors"];
  ASSERT_EQ(jt.size(), gt.size());
  uint64_t params = 0, bytes = 0;
  for (size_t i = 0; i < gt.size(); ++i) {
    EXPECT_EQ(jt[i]["name"], gt[i]["name"]);
    EXPECT_EQ(jt[i]["dtype"], gt[i]["type_name"]);
    EXPECT_EQ(jt[i]["shape"], gt[i]["shape"]);
    EXPECT_EQ(jt[i]["bytes"], gt[i]["n_bytes"]);
    uint64_t n = 1;
    for (const auto& d : gt[i]["shape"]) n *= d.get<uint64_t>();
    params += n;
    bytes += gt[i]["n_bytes"].get<uint64_t>();
  }
  EXPECT_EQ(j["n_params"].get<uint64_t>(), params);
  EXPECT_EQ(j["n_bytes"].get<uint64_t>(), bytes);
  EXPECT_EQ(j["metadata"].size(), g["metadata"].size());
}

TEST(InspectCli, TextShowsHyperparametersAndTotals) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  std::string out;
  ASSERT_EQ(tessera::test::run_command(tessera::test::cli_path() + " inspect -m " + model, &out), 0) << out;
  for (const char* s : {"format        gguf v3", "layers        30", "heads         9 (kv 3, head dim 64)",
                        "token_embd.weight", "blk.29.ffn_down.weight", "totals"})
    EXPECT_NE(out.find(s), std::string::npos) << "missing '" << s << "' in:\n" << out;
}

TEST(InspectCli, MissingFileIsOneLineError) {
  std::string out;
  int rc = tessera::test::run_command(tessera::test::cli_path() + " inspect -m /nonexistent/model.gguf", &out);
  EXPECT_EQ(rc, 1);
  EXPECT_EQ(out, "tessera: error: /nonexistent/model.gguf: no such file or directory\n");
}

TEST(InspectCli, MissingDefaultModelSaysHowToFetchIt) {
  std::string out;
  int rc = tessera::test::run_command("TESSERA_HOME=/nonexistent " + tessera::test::cli_path() + " inspect", &out);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("scripts/fetch_model.sh"), std::string::npos) << out;
}

}  // namespace
