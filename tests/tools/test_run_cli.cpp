// `tessera run`: streaming text and a stats line, --json fields, greedy and seeded reproducibility, --chat, and one
// "tessera: error:" line with a non-zero exit on bad input.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace {

using nlohmann::json;
using tessera::test::cli_path;
using tessera::test::run_command;

// stdout only (stderr discarded).
int run_stdout(const std::string& args, std::string* out) { return tessera::test::run_cli_stdout(args, out); }

TEST(RunCli, StreamsTextAndPrintsStats) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  std::string out;
  ASSERT_EQ(run_command(cli_path() + " run -m " + model + " -p 'The capital of France is' -n 8 --temp 0 -t 2", &out), 0)
      << out;
  EXPECT_NE(out.find("prompt "), std::string::npos) << out;
  EXPECT_NE(out.find("generated 8 tok"), std::string::npos) << out;
  EXPECT_NE(out.find("tok/s"), std::string::npos) << out;
  EXPECT_NE(out.find("peak RSS"), std::string::npos) << out;
  std::string text;
  ASSERT_EQ(run_stdout("run -m " + model + " -p 'The capital of France is' -n 8 --temp 0 -t 2", &text), 0);
  EXPECT_GT(text.size(), 1u);
  EXPECT_EQ(text.find("tok/s"), std::string::npos);  // stats go to stderr
}

TEST(RunCli, JsonHasTextTokensTimingsAndIsReproducible) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  const std::string args = "run -m " + model + " -p 'Once upon a time' -n 12 --temp 0 --ignore-eos --json -t 2";
  std::string a, b;
  ASSERT_EQ(run_stdout(args, &a), 0) << a;
  ASSERT_EQ(run_stdout(args, &b), 0) << b;
  const json ja = json::parse(a), jb = json::parse(b);
  ASSERT_TRUE(ja.contains("text") && ja.contains("tokens") && ja.contains("timings")) << a;
  EXPECT_EQ(ja["tokens"].size(), 12u);
  EXPECT_FALSE(ja["text"].get<std::string>().empty());
  EXPECT_EQ(ja["timings"]["generated_tokens"], 12);
  EXPECT_GT(ja["timings"]["prompt_tokens"].get<int>(), 0);
  EXPECT_GT(ja["timings"]["generated_tokens_per_s"].get<double>(), 0.0);
  EXPECT_EQ(ja["stop_reason"], "length");
  EXPECT_EQ(ja["tokens"], jb["tokens"]);  // greedy

  const std::string sampled = "run -m " + model + " -p 'Once upon a time' -n 12 --temp 1 --seed 7 --json -t 2";
  ASSERT_EQ(run_stdout(sampled, &a), 0) << a;
  ASSERT_EQ(run_stdout(sampled, &b), 0) << b;
  EXPECT_EQ(json::parse(a)["tokens"], json::parse(b)["tokens"]);
  EXPECT_EQ(json::parse(a)["seed"], 7);
}

TEST(RunCli, ChatTemplateAndStopString) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  std::string out;
  ASSERT_EQ(run_stdout("run -m " + model + " -p 'What is the capital of France?' --chat -n 16 --temp 0 --json -t 2", &out),
            0)
      << out;
  const json j = json::parse(out);
  EXPECT_FALSE(j["text"].get<std::string>().empty());
  // The chat prompt is longer than the bare question: the template's markup was added.
  EXPECT_GT(j["prompt_tokens"].get<int>(), 10);

  ASSERT_EQ(run_stdout("run -m " + model + " -p 'The capital of France is' -n 16 --temp 0 --json -t 2", &out), 0);
  const std::string full = json::parse(out)["text"];
  ASSERT_GT(full.size(), 4u);
  const std::string stop = full.substr(2, 2);
  ASSERT_EQ(run_stdout("run -m " + model + " -p 'The capital of France is' -n 16 --temp 0 --json -t 2 --stop '" + stop + "'",
                       &out),
            0);
  const json js = json::parse(out);
  EXPECT_EQ(js["stop_reason"], "stop");
  EXPECT_EQ(js["text"], full.substr(0, full.find(stop)));
}

TEST(RunCli, ContextFullStopsWithAMessage) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  std::string out;
  ASSERT_EQ(run_command(cli_path() + " run -m " + model + " -p 'Once upon a time' -c 12 -n 100 --ignore-eos --temp 0 -t 2", &out),
            0)
      << out;
  EXPECT_NE(out.find("context is full"), std::string::npos) << out;
}

TEST(RunCli, BadInputIsOneErrorLine) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  const std::vector<std::string> bad = {
      "run -m " + model + " -n 4",                                   // no prompt
      "run -m /nonexistent/model.gguf -p hi",                        // missing file
      "run -m " + model + " -p hi --top-p 0",                        // top-p out of range
      "run -m " + model + " -p hi --temp -1",                        // negative temperature
      "run -m " + model + " -p hi -c 100000000",                     // beyond the trained context
      "run -m " + model + " -p hi --kv-type q4_0",                   // cache type
      "run -m " + model + " -p hi --chat-template nosuchtemplate",   // unknown template
  };
  for (const std::string& args : bad) {
    std::string out;
    const int rc = run_command(cli_path() + " " + args + " --chat", &out);
    EXPECT_EQ(rc, 1) << args << "\n" << out;
    EXPECT_EQ(out.rfind("tessera: error: ", 0), 0u) << args << "\n" << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << args << "\n" << out;
  }
}

}  // namespace
