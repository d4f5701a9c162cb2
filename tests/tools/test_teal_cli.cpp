// TEAL's flags on the commands (docs/TEAL.md): run refuses a bad or doubled setting in one sentence, bench and
// perplexity report the achieved sparsity, calibrate writes a file that --teal reads and another model refuses; logits
// and chat apply --sparsity (deterministically, and --sparsity 0 is dense) and refuse bad settings in one line.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

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
  // --cpu-teal-walk: the sparse kernels (all) or the dense ones on the zeroed input (none, the default); CPU only.
  ASSERT_EQ(run_command(cli_path() + " bench -m " + model + " -p 0 -n 4 -r 1 -t 2 --sparsity 0.5 --cpu-teal-walk all",
                        &out),
            0)
      << out;
  EXPECT_NE(out.find("achieved activation sparsity 50.0%"), std::string::npos) << out;
  EXPECT_NE(run_command(cli_path() + " run -m " + model + " -p hi -n 2 --sparsity 0.5 --cpu-teal-walk some", &out), 0);
  EXPECT_NE(out.find("--cpu-teal-walk"), std::string::npos) << out;

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

// logits --sparsity: every prompt row is sparsified, so the logits move away from the dense ones (by a good share of
// their scale at 50%), the same run twice gives the same bytes, and --sparsity 0 is the dense run. A bad value or both
// flags are refused in one line.
TEST(TealCli, LogitsSparsityDiffersFromDenseAndIsDeterministic) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  const std::string out =
      (std::filesystem::temp_directory_path() / ("tessera_teal_cli_" + std::to_string(::getpid()) + "_logits.npy"))
          .string();
  const auto logits = [&](const std::string& flags) {
    std::string log;
    std::filesystem::remove(out);
    EXPECT_EQ(run_command(cli_path() + " logits -m " + model + " --ids 1,504,3537,314,4649,30 -t 2 -q --out " + out +
                              " " + flags,
                          &log),
              0)
        << flags << ": " << log;
    tessera::test::Npy npy = tessera::test::read_npy(out);
    EXPECT_EQ(npy.rows, 6) << flags;
    EXPECT_EQ(npy.cols, 49152) << flags;
    return std::move(npy.data);
  };
  const std::vector<float> dense = logits(""), sparse = logits("--sparsity 0.5"), again = logits("--sparsity 0.5"),
                           zero = logits("--sparsity 0");
  std::filesystem::remove(out);
  ASSERT_EQ(dense.size(), 6u * 49152u);
  ASSERT_EQ(sparse.size(), dense.size());
  ASSERT_EQ(zero.size(), dense.size());
  double scale = 0, moved = 0;
  for (size_t i = 0; i < dense.size(); ++i) {
    scale = std::max(scale, std::fabs(double(dense[i])));
    moved = std::max(moved, std::fabs(double(sparse[i]) - double(dense[i])));
  }
  EXPECT_GT(moved, 0.05 * scale) << "--sparsity 0.5 did not change the logits";
  EXPECT_EQ(sparse, again) << "two runs of --sparsity 0.5 differ";
  EXPECT_EQ(zero, dense) << "--sparsity 0 is dense";
  std::string log;
  EXPECT_EQ(run_command(cli_path() + " logits -m " + model + " --ids 1,2 -t 2 --out " + out + " --sparsity 1.5", &log),
            1);
  EXPECT_EQ(log, "tessera: error: sparsity 1.5 must be at least 0 and below 1\n");
  EXPECT_EQ(run_command(cli_path() + " logits -m " + model + " --ids 1,2 -t 2 --out " + out +
                            " --sparsity 0.5 --teal /nonexistent.json",
                        &log),
            1);
  EXPECT_EQ(log.rfind("tessera: error: ", 0), 0u) << log;
  EXPECT_NE(log.find("give one of them"), std::string::npos) << log;
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << log;
  std::filesystem::remove(out);
}

// chat --sparsity (stdin-driven, as tests/tools/test_chat_cli.cpp): the reply is produced, the same every time, other
// than the dense reply at 50%, and the dense one at 0. A bad value and a missing thresholds file are one line, exit 1.
TEST(TealCli, ChatTakesSparsity) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  const auto chat = [&](const std::string& flags, std::string* out) {
    return run_command("{ printf 'Hello, who are you?\\n' | " + cli_path() + " chat -m " + model +
                           " -n 12 --temp 0 -t 2 " + flags + " 2>/dev/null; }",
                       out);
  };
  std::string dense, sparse, again, zero;
  ASSERT_EQ(chat("", &dense), 0) << dense;
  ASSERT_EQ(chat("--sparsity 0.5", &sparse), 0) << sparse;
  ASSERT_EQ(chat("--sparsity 0.5", &again), 0) << again;
  ASSERT_EQ(chat("--sparsity 0", &zero), 0) << zero;
  ASSERT_GT(sparse.size(), 2u);
  EXPECT_EQ(sparse.back(), '\n');
  EXPECT_EQ(sparse, again);
  EXPECT_NE(sparse, dense) << "--sparsity 0.5 did not change the greedy reply";
  EXPECT_EQ(zero, dense);
  std::string out;
  for (const std::string& bad : {std::string("--sparsity 1.5"), std::string("--sparsity -0.1"),
                                 std::string("--teal /nonexistent/thresholds.json")}) {
    EXPECT_EQ(
        run_command("{ printf 'Hello\\n' | " + cli_path() + " chat -m " + model + " -n 2 -t 2 " + bad + "; }", &out), 1)
        << bad;
    EXPECT_EQ(out.rfind("tessera: error: ", 0), 0u) << bad << ": " << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << bad << ": " << out;
  }
}

}  // namespace
