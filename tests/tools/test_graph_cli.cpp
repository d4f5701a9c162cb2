// `tessera graph`: JSON nodes, edges and totals for the default model, DOT and text output, bad flags.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace {

using nlohmann::json;
using tessera::test::cli_path;
using tessera::test::run_command;

int run_stdout(const std::string& args, std::string* out) { return run_command("{ " + cli_path() + " " + args + " 2>/dev/null; }", out); }

TEST(GraphCli, JsonNodesEdgesAndTotals) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  for (int t : {1, 512}) {
    std::string out;
    ASSERT_EQ(run_stdout("graph -m " + model + " --format json --tokens " + std::to_string(t), &out), 0) << out;
    const json j = json::parse(out);
    EXPECT_EQ(j["n_tokens"], t);
    // 30 blocks of 17 nodes, embedding, output norm, output (and the last-token selection for a chunk).
    EXPECT_EQ(j["nodes"].size(), size_t(30 * 17 + (t > 1 ? 4 : 3)));
    uint64_t flops = 0, mm = 0;
    for (const auto& n : j["nodes"]) {
      ASSERT_TRUE(n.contains("name") && n.contains("op") && n.contains("shape") && n.contains("dtype") &&
                  n.contains("flops") && n.contains("bytes"));
      flops += n["flops"].get<uint64_t>();
      if (n["op"] == "matmul") mm += n["flops"].get<uint64_t>();
    }
    EXPECT_EQ(j["totals"]["flops"].get<uint64_t>(), flops);
    EXPECT_EQ(j["totals"]["matmul_flops"].get<uint64_t>(), mm);
    EXPECT_GT(j["totals"]["matmul_flop_share"].get<double>(), 0.9);
    EXPECT_GT(j["edges"].size(), j["nodes"].size());
    bool found = false;
    for (const auto& n : j["nodes"])
      if (n["name"] == "blk.3.attn_q") {
        found = true;
        EXPECT_EQ(n["role"], "attn_q");
        EXPECT_EQ(n["layer"], 3);
        EXPECT_EQ(n["shape"], (std::vector<int>{t, 576}));
        EXPECT_EQ(n["flops"].get<uint64_t>(), uint64_t(2) * uint64_t(t) * 576 * 576);
      }
    EXPECT_TRUE(found);
  }
}

TEST(GraphCli, DotAndText) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  std::string out;
  ASSERT_EQ(run_stdout("graph -m " + model + " --format dot", &out), 0);
  EXPECT_EQ(out.rfind("digraph", 0), 0u);
  EXPECT_NE(out.find("cluster_blk_29"), std::string::npos);
  // Graphviz must accept it (checked where Graphviz is installed).
  std::string ignored;
  if (run_command("command -v dot", &ignored) == 0) {
    EXPECT_EQ(run_command(cli_path() + " graph -m " + model + " --format dot | dot -Tsvg -o /dev/null", &out), 0) << out;
  }
  ASSERT_EQ(run_stdout("graph -m " + model, &out), 0);
  EXPECT_NE(out.find("blk.0.ffn_down"), std::string::npos);
  EXPECT_NE(out.find("matmul share"), std::string::npos);
}

TEST(GraphCli, BadFlags) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  for (const std::string& args : {std::string("graph -m ") + model + " --format svg",
                                  std::string("graph -m ") + model + " --tokens 0"}) {
    std::string out;
    EXPECT_EQ(run_command(cli_path() + " " + args, &out), 1) << out;
    EXPECT_EQ(out.rfind("tessera: error: ", 0), 0u) << out;
  }
}

}  // namespace
