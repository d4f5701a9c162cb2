// TEAL's flags on the commands (docs/TEAL.md): run refuses a bad or doubled setting in one sentence, bench and
// perplexity report the achieved sparsity, calibrate writes a file that --teal reads and another model refuses.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "test_util.h"

namespace {

using tessera::test::cli_path;
using tessera::test::run_command;

TEST(TealCli, FlagsReachTheSessionAndAreReported) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  std::string out;
  EXPECT_NE(run_command(cli_path() + " run -m " + model + " -p hi -n 2 --sparsity 1.5", &out), 0);
  EXPECT_NE(out.find("sparsity 1.5 must be at least 0 and below 1"), std::string::npos) << out;
  EXPECT_NE(run_command(cli_path() + " run -m " + model + " -p hi -n 2 --sparsity 0.5 --teal x.json", &out), 0);
  EXPECT_NE(out.find("give one of them"), std::string::npos) << out;
  ASSERT_EQ(run_command(cli_path() + " bench -m " + model + " -p 0 -n 4 -r 1 -t 2 --sparsity 0.5", &out), 0) << out;
  EXPECT_NE(out.find("achieved activation sparsity 50.0%"), std::string::npos) << out;

  const auto dir = std::filesystem::temp_directory_path();
  const std::string text = (dir / "tessera_teal_cli.txt").string(), thr = (dir / "tessera_teal_cli.json").string();
  {
    std::ofstream f(text);
    for (int i = 0; i < 60; ++i) f << "And the evening and the morning were the first day, and the light was good. ";
  }
  ASSERT_EQ(run_command(cli_path() + " calibrate -m " + model + " -f " + text + " --sparsity 0.4 -c 64 --tokens 128 " +
                            "-t 2 -o " + thr,
                        &out),
            0)
      << out;
  ASSERT_EQ(run_command(cli_path() + " perplexity -m " + model + " -f " + text + " -c 64 --chunks 2 -t 2 --teal " + thr,
                        &out),
            0)
      << out;
  EXPECT_NE(out.find("achieved activation sparsity"), std::string::npos) << out;
  const std::string other =
      std::string(std::getenv("HOME")) + "/.cache/tessera/models/SmolLM2-135M-Instruct.Q8_0-from-Q4_1.gguf";
  if (std::filesystem::exists(other)) {
    EXPECT_NE(run_command(cli_path() + " run -m " + other + " -p hi -n 2 --teal " + thr, &out), 0);
    EXPECT_NE(out.find("calibrated for another model"), std::string::npos) << out;
  }
  std::remove(text.c_str());
  std::remove(thr.c_str());
}

}  // namespace
