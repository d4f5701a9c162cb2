// `tessera logits`: the .npy dump python/hf_oracle.py reads (header, shape, values equal to the session's logits),
// --prompts/--batched over several prompts, and one "tessera: error:" line with a non-zero exit on bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tessera/model.h"
#include "tessera/session.h"
#include "test_util.h"

namespace {

using tessera::test::cli_path;
using tessera::test::Npy;
using tessera::test::read_npy;
using tessera::test::run_command;
namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("tessera_logits_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  return p;
}

double max_rel(const float* a, const float* b, size_t n) {
  double m = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) {
    m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return scale > 0 ? m / scale : m;
}

TEST(LogitsCli, IdsDumpEqualsSessionLogits) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model_path);
  const fs::path out = scratch("ids.npy");
  std::string log;
  ASSERT_EQ(run_command(cli_path() + " logits -m " + model_path + " --ids 1,504,3537,314,4649,30 --out " +
                            out.string() + " -t 2",
                        &log),
            0)
      << log;
  const Npy n = read_npy(out.string());
  ASSERT_EQ(n.rows, 6) << n.header;
  ASSERT_EQ(n.cols, 49152) << n.header;
  ASSERT_EQ((10 + n.header.size()) % 64, 0u);
  ASSERT_EQ(n.header.back(), '\n');

  tessera::Model m = tessera::Model::load(model_path);
  tessera::Session s(m, {.n_ctx = 16, .n_threads = 2});
  const std::vector<int32_t> ids = {1, 504, 3537, 314, 4649, 30};
  const std::vector<float> ref = s.eval_all_logits(ids);
  ASSERT_EQ(ref.size(), n.data.size());
  // Same path, same threads: the dump is the session's logits, to the bit or nearly (thread timing aside).
  EXPECT_LT(max_rel(n.data.data(), ref.data(), ref.size()), 1e-5);
  fs::remove(out);
}

TEST(LogitsCli, PromptsFileAndBatchedAgree) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model_path);
  const fs::path dir = scratch("dir");
  fs::create_directories(dir);
  const fs::path prompts = dir / "prompts.json";
  std::ofstream(prompts) << R"({"prompts": [{"name": "p0", "ids": [1, 504, 3537, 314, 4649]},
                                            {"name": "p1", "ids": [9, 8]},
                                            {"name": "p2", "ids": [100, 200, 300, 400, 500, 600, 700]}]})";
  std::string log;
  ASSERT_EQ(run_command(cli_path() + " logits -m " + model_path + " --prompts " + prompts.string() + " --out " +
                            (dir / "single").string() + " -t 2",
                        &log),
            0)
      << log;
  ASSERT_EQ(run_command(cli_path() + " logits -m " + model_path + " --prompts " + prompts.string() + " --out " +
                            (dir / "batched").string() + " --batched -t 2",
                        &log),
            0)
      << log;
  tessera::Model m = tessera::Model::load(model_path);
  tessera::Session s(m, {.n_ctx = 16, .n_threads = 2});
  const std::vector<std::vector<int32_t>> ids = {{1, 504, 3537, 314, 4649}, {9, 8}, {100, 200, 300, 400, 500, 600, 700}};
  for (size_t p = 0; p < ids.size(); ++p) {
    const std::string name = std::string("p").append(std::to_string(p));  // (GCC 12's -Wrestrict misfires on "p" + s)
    const Npy a = read_npy((dir / "single" / (name + ".npy")).string());
    const Npy b = read_npy((dir / "batched" / (name + ".npy")).string());
    ASSERT_EQ(a.rows, static_cast<int64_t>(ids[p].size())) << name;
    ASSERT_EQ(b.rows, a.rows) << name;
    // The batched dump is the token-by-token decode of that prompt alone (the CPU runs each slot's decode).
    s.reset();
    std::vector<float> dec;
    for (int32_t id : ids[p]) {
      const std::span<const float> l = s.decode(id);
      dec.insert(dec.end(), l.begin(), l.end());
    }
    EXPECT_LT(max_rel(b.data.data(), dec.data(), dec.size()), 1e-5) << name;
    // Prefill and decode kernels round differently (8-bit activations in both, different blockings): close, and
    // the same argmax except at near ties.
    EXPECT_LT(max_rel(a.data.data(), dec.data(), dec.size()), 0.1) << name;
  }
  fs::remove_all(dir);
}

// Token ids need no tokenizer: an HF folder with only config.json and model.safetensors (tests/data/lora/base) runs
// with --ids and --prompts, and --text there says what is missing in one line.
TEST(LogitsCli, IdsRunOnAModelWithoutTokenizer) {
  const std::string base = std::string(TESSERA_TEST_DATA) + "/lora/base";
  ASSERT_FALSE(fs::exists(base + "/tokenizer.json")) << "the test needs a model folder without a tokenizer";
  const fs::path dir = scratch("notok");
  fs::create_directories(dir);
  std::string out;
  ASSERT_EQ(run_command(cli_path() + " logits -m " + base + " --ids 1,2,3 -q --out " + (dir / "x.npy").string(), &out),
            0)
      << out;
  EXPECT_TRUE(fs::exists(dir / "x.npy"));
  EXPECT_EQ(run_command(cli_path() + " logits -m " + base + " --text hello --out " + (dir / "y.npy").string(), &out), 1)
      << out;
  EXPECT_NE(out.find("tessera: error: "), std::string::npos) << out;
  fs::remove_all(dir);
}

TEST(LogitsCli, BadInputFailsWithOneLine) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model_path);
  const fs::path dir = scratch("bad");
  fs::create_directories(dir);
  std::ofstream(dir / "notjson.json") << "{\"prompts\": [";
  std::ofstream(dir / "noids.json") << R"({"prompts": [{"name": "a"}]})";
  std::ofstream(dir / "badname.json") << R"({"prompts": [{"name": "../x", "ids": [1]}]})";
  std::ofstream(dir / "negative.json") << R"({"prompts": [{"name": "a", "ids": [1, -2]}]})";
  const std::string m = " -m " + model_path;
  const std::string o = " --out " + (dir / "o").string();
  for (const std::string& args :
       {std::string("logits") + m + o, "logits" + m + " --ids 1,2", "logits" + m + " --ids 1,x" + o,
        "logits" + m + " --ids 1,99999999" + o, "logits" + m + " --ids 1 --text hi" + o,
        "logits" + m + " --ids 1 --batched" + o, "logits" + m + " --prompts " + (dir / "missing.json").string() + o,
        "logits" + m + " --prompts " + (dir / "notjson.json").string() + o,
        "logits" + m + " --prompts " + (dir / "noids.json").string() + o,
        "logits" + m + " --prompts " + (dir / "badname.json").string() + o,
        "logits" + m + " --prompts " + (dir / "negative.json").string() + o, "logits" + m + " --ids 1,2 -c 1" + o,
        "logits" + m + " --ids 1 --device tpu" + o}) {
    std::string out;
    EXPECT_EQ(run_command(cli_path() + " " + args, &out), 1) << args << "\n" << out;
    EXPECT_NE(out.find("tessera: error: "), std::string::npos) << args << "\n" << out;
  }
  fs::remove_all(dir);
}

}  // namespace
