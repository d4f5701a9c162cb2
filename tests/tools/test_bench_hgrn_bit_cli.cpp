// `tessera bench --arch mmfreelm-* --random-weights`: the MatMul-free LM's presets (hgrn_bit, src/models/hgrn_bit.h)
// are listed, build in the hgrn_bit graph's layout with ternary weights, run, and refuse dtypes that cannot hold
// ternary weights. One layer of the 370M shape keeps each run to seconds.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace {

using nlohmann::json;
using tessera::test::cli_path;
using tessera::test::run_command;

int run_stdout(const std::string& args, std::string* out) { return tessera::test::run_cli_stdout(args, out); }

TEST(BenchHgrnBitCli, ListedWithTheirShapes) {
  std::string out;
  ASSERT_EQ(run_stdout("bench --list-archs", &out), 0) << out;
  for (const char* name : {"mmfreelm-370m ", "mmfreelm-1.3b ", "mmfreelm-2.7b ", "mmfreelm-370m-llama "})
    EXPECT_NE(out.find(name), std::string::npos) << name << "\n" << out;
  EXPECT_NE(out.find("hgrn_bit"), std::string::npos) << out;
  ASSERT_EQ(run_command(cli_path() + " bench --help", &out), 0);
  EXPECT_NE(out.find("mmfreelm-2.7b"), std::string::npos) << out;
}

// A short run of the preset itself (not the Llama-shaped stand-in): the row names it, and its weights are TQ2_0.
TEST(BenchHgrnBitCli, RunsTheMlgruGraph) {
  std::string out;
  ASSERT_EQ(run_stdout("bench --arch mmfreelm-370m --random-weights --layers 1 -p 4 -n 2 -r 1 -t 2 --json "
                       "--no-ceilings",
                       &out),
            0)
      << out;
  const json rows = json::parse(out);
  ASSERT_EQ(rows.size(), 2u);
  for (const json& r : rows) {
    EXPECT_EQ(r["arch"], "mmfreelm-370m");
    EXPECT_EQ(r["weight_dtype"], "tq2_0");
    EXPECT_GT(r["tok_s"].get<double>(), 0);
  }
}

// The file: hgrn_bit's tensors and hyperparameters (the released 370M's), every linear ternary in the asked dtype,
// the embedding bf16 beside TQ2_0 (as the checkpoints keep it), and the parameter count of hgrn_bit_parameters.
TEST(BenchHgrnBitCli, WritesTheHgrnBitLayout) {
  const std::string dir = testing::TempDir() + "/tessera_bench_hgrn";
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/m.gguf";
  std::string out;
  for (const char* dtype : {"", "bf16"}) {
    const std::string flag = *dtype ? std::string(" --dtype ") + dtype : std::string();
    ASSERT_EQ(
        run_stdout("bench --arch mmfreelm-370m --random-weights --layers 1" + flag + " --write-model " + path, &out), 0)
        << out;
    ASSERT_EQ(run_stdout("inspect -m " + path + " --json", &out), 0) << out;
    const json m = json::parse(out);
    EXPECT_EQ(m["architecture"], "hgrn_bit");
    EXPECT_EQ(m["n_layers"], 1);
    EXPECT_EQ(m["n_embd"], 1024);
    EXPECT_EQ(m["n_ff"], 2816);
    EXPECT_EQ(m["n_vocab"], 32000);
    EXPECT_EQ(m["tied_output"], false);
    const int64_t E = 1024, F = 2816, V = 32000;  // hgrn_bit_parameters at one layer
    EXPECT_EQ(m["n_params"], 2 * V * E + 4 * (E * E + E) + 3 * E * F + E + F + 3 * E + E + 2 * E);
    const std::string want = *dtype ? dtype : "tq2_0";
    int linears = 0;
    for (const json& t : m["tensors"]) {
      const std::string name = t["name"];
      if (name == "token_embd.weight") {
        EXPECT_EQ(t["dtype"], "bf16");
      }
      if (name.ends_with("_norm.weight") || name == "lower_bounds") {
        EXPECT_EQ(t["dtype"], "f32") << name;
      }
      if (t["shape"].size() == 2 && name != "token_embd.weight" && name != "lower_bounds") {
        EXPECT_EQ(t["dtype"], want) << name;
        ++linears;
      }
    }
    EXPECT_EQ(linears, 8);  // attn_i, attn_f, attn_g, attn_output, ffn_gate, ffn_up, ffn_down, output
  }
  std::filesystem::remove_all(dir);
}

// Formats that would not keep the weights ternary are refused with one sentence naming the preset and the dtype.
TEST(BenchHgrnBitCli, RefusesNonTernaryDtypes) {
  for (const char* dtype : {"q4_0", "q8_0", "iq4_nl"}) {
    std::string out;
    const std::string args =
        std::string("bench --arch mmfreelm-370m --random-weights --layers 1 -p 4 -n 0 --dtype ") + dtype;
    EXPECT_EQ(run_command(cli_path() + " " + args, &out), 1) << args << "\n" << out;
    EXPECT_NE(out.find("tessera: error: "), std::string::npos) << out;
    EXPECT_NE(out.find("ternary"), std::string::npos) << out;
    EXPECT_NE(out.find(dtype), std::string::npos) << out;
  }
}

}  // namespace
