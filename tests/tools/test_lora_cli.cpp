// --lora on the CLI: `tessera graph --chains` over the tiny LoRA base and its PEFT adapters (tests/data/lora), the
// adapters' nodes in the graph, and the one-line errors of bad --lora / --lora-merge flags.
#include <gtest/gtest.h>

#include "test_util.h"

namespace {

using tessera::test::cli_path;
using tessera::test::data_path;
using tessera::test::run_command;

int run_cli(const std::string& args, std::string* out) {
  return run_command("{ " + cli_path() + " " + args + " 2>&1; }", out);
}

TEST(LoraCli, GraphChainsListsEveryAdapterChainAndItsChoice) {
  const std::string base = data_path("lora/base"), a = data_path("lora/adapter_a"), b = data_path("lora/adapter_b");
  std::string out;
  ASSERT_EQ(run_cli("graph -m " + base + " --lora " + a + " --lora " + b + ":0.5 -T 64 --chains", &out), 0) << out;
  // adapter_a: 7 projections x 2 layers; adapter_b: q, v and down x 2 layers.
  EXPECT_NE(out.find("20 matmul chains at T = 64"), std::string::npos) << out;
  EXPECT_NE(out.find("chain blk.1.ffn_down.lora0_a (dims 64 x 64 x 4 x 32), added to blk.1.ffn_down"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("<- chosen"), std::string::npos) << out;
  EXPECT_NE(out.find("20 of 20 chains run in their optimal order"), std::string::npos) << out;
  ASSERT_EQ(run_cli("graph -m " + base + " --lora " + a + " -T 1", &out), 0) << out;
  EXPECT_NE(out.find("blk.0.attn_q.lora0_b"), std::string::npos) << out;
  ASSERT_EQ(run_cli("graph -m " + base + " --lora " + a + " --lora-merge -T 1", &out), 0) << out;
  EXPECT_EQ(out.find("lora0"), std::string::npos) << out;  // merged: no adapter nodes
}

TEST(LoraCli, BadFlagsAreOneLine) {
  const std::string base = data_path("lora/base");
  std::string out;
  EXPECT_EQ(run_cli("graph -m " + base + " --lora-merge", &out), 1) << out;
  EXPECT_NE(out.find("tessera: error: --lora-merge needs at least one --lora adapter"), std::string::npos) << out;
  EXPECT_EQ(run_cli("graph -m " + base + " --lora /nonexistent/adapter", &out), 1) << out;
  EXPECT_NE(out.find("no such LoRA adapter"), std::string::npos) << out;
  EXPECT_EQ(run_cli("graph -m " + base + " --chains --format json", &out), 1) << out;
  EXPECT_NE(out.find("--chains prints text"), std::string::npos) << out;
}

}  // namespace
