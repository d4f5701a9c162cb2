// Issue 26: the command line as a llama.cpp user expects it. Each test names the item it holds in place: the thread
// cap, one message for a file that is no model, parse errors, llama.cpp's spellings, prompt handling, validation
// gaps and the small things.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using tessera::test::cli_path;
using tessera::test::run_command;

std::string cli(const std::string& args) { return cli_path() + " " + args; }

// stdout only.
int run_stdout(const std::string& args, std::string* out) {
  return run_command("{ " + cli(args) + " 2>/dev/null; }", out);
}

struct Scratch {
  fs::path dir = fs::temp_directory_path() / ("tessera_cli_usability_" + std::to_string(::getpid()));
  Scratch() { fs::create_directories(dir); }
  ~Scratch() { fs::remove_all(dir); }
  std::string write(const std::string& name, const std::string& bytes) const {
    const fs::path p = dir / name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p.string();
  }
};

void expect_error(const std::string& args, const std::string& expect) {
  std::string out;
  const int rc = run_command(cli(args), &out);
  EXPECT_EQ(rc, 1) << args << "\n" << out;
  EXPECT_EQ(out.rfind("tessera: error: ", 0), 0u) << args << "\n" << out;
  EXPECT_NE(out.find(expect), std::string::npos) << args << "\nexpected '" << expect << "' in:\n" << out;
}

// Item 1: -t 999 on a 2-core machine made no progress in 60 s.
TEST(CliUsability, ThreadCountIsCappedWithANotice) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  std::string out;
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = run_command("timeout 60 " + cli("run -m " + model + " -p hi -n 1 --temp 0 -t 999"), &out);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(rc, 0) << out;
  EXPECT_LT(s, 30.0);
  EXPECT_NE(out.find("-t 999: this machine has"), std::string::npos) << out;
  ASSERT_EQ(run_command("timeout 60 " + cli("bench -m " + model + " -p 4 -n 2 -r 1 -t 999 --json"), &out), 0) << out;
  EXPECT_NE(out.find("hardware threads"), std::string::npos) << out;
}

// Item 2: a file that is neither format got three different messages, one of them about config.json.
TEST(CliUsability, NotAModelIsOneMessageForEveryCommand) {
  Scratch s;
  const std::string text = s.write("notes.gguf", "these are my notes, not a model\n");
  const std::string empty = s.write("empty.gguf", "");
  const std::string st = s.write("weights.safetensors", "garbage that is not a safetensors header");
  for (const std::string& f : {text, empty, st})
    for (const char* cmd : {"run -p hi -m ", "chat -m ", "inspect -m ", "tokenize hi -m ", "graph -m ",
                            "bench -p 4 -n 0 -m ", "profile -m ", "logits --text hi -o /dev/null -m "})
      expect_error(std::string(cmd) + f, f + ": not a GGUF or safetensors model");
}

// Item 6: parse errors carried CLI11's exit codes (104-114), no prefix and no usage.
TEST(CliUsability, ParseErrorsHaveThePrefixTheUsageAndExitOne) {
  std::string out;
  EXPECT_EQ(run_command(cli("run -n abc -p hi"), &out), 1) << out;
  EXPECT_EQ(out.rfind("tessera: error: ", 0), 0u) << out;
  EXPECT_NE(out.find("usage: tessera run"), std::string::npos) << out;
  EXPECT_EQ(run_command(cli("bench --no-such-flag"), &out), 1) << out;
  EXPECT_EQ(out.rfind("tessera: error: ", 0), 0u) << out;
  EXPECT_NE(out.find("usage: tessera bench"), std::string::npos) << out;
  EXPECT_EQ(run_command(cli("runn -p hi"), &out), 1) << out;
  EXPECT_NE(out.find("tessera: error: unknown command 'runn'; did you mean 'run'?"), std::string::npos) << out;
  EXPECT_EQ(run_command(cli("frobnicate"), &out), 1) << out;
  EXPECT_NE(out.find("commands: bench"), std::string::npos) << out;
  // Plain `tessera` prints the usage with the commands.
  EXPECT_EQ(run_command(cli_path(), &out), 1) << out;
  EXPECT_NE(out.find("run"), std::string::npos) << out;
  EXPECT_NE(out.find("chat"), std::string::npos) << out;
  EXPECT_EQ(out.find("A subcommand is required"), std::string::npos) << out;
  EXPECT_EQ(run_command(cli("run --help"), &out), 0) << out;
  EXPECT_EQ(out.find("token by token"), std::string::npos) << out;  // chunked prefill exists on CUDA too
}

// Item 5: -ngl was read as "-n gl"; --ctx-size, --n-gpu-layers, -e, --batch-size were refused by run.
TEST(CliUsability, LlamaCppSpellings) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  std::string out;
  ASSERT_EQ(
      run_stdout("run -m " + model + " -p hi -n 2 --temp 0 -t 2 -ngl 0 --ctx-size 64 --batch-size 16 -e --json", &out),
      0)
      << out;
  EXPECT_EQ(json::parse(out)["n_ctx"], 64);
  ASSERT_EQ(run_stdout("run -m " + model + " -p hi -n 2 --temp 0 -t 2 --n-gpu-layers 0 --json", &out), 0) << out;
  // -ngl above 0 asks for the GPU: with --device cpu given too that is a contradiction, refused by name.
  expect_error("run -m " + model + " -p hi -n 2 -ngl 99 --device cpu", "-ngl 99 asks for cuda");
  // bench: -b is the logical batch (llama-bench's), -np the sequences decoded together.
  const json rows = json::parse([&] {
    std::string o;
    EXPECT_EQ(run_stdout("bench -m " + model + " -p 32 -n 2 -r 1 -t 2 -b 16 -np 2 --json", &o), 0) << o;
    return o;
  }());
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0]["n_batch"], 16);
  EXPECT_EQ(rows[1]["test"], "tg2x2");
  EXPECT_EQ(rows[1]["batch"], 2);
  ASSERT_EQ(run_stdout("bench -m " + model + " -p 32 -n 0 -r 1 -t 2 -b 64 -ub 8 --json", &out), 0) << out;
  EXPECT_EQ(json::parse(out)[0]["n_batch"], 8);
  // -ngl (llama-bench's default is 99) and -b reach every command that runs the model.
  ASSERT_EQ(run_stdout("bench -m " + model + " -p 8 -n 0 -r 1 -t 2 -ngl 0 --json", &out), 0) << out;
  ASSERT_EQ(run_stdout("profile -m " + model + " -n 1 -t 2 -ngl 0 -b 4 --json", &out), 0) << out;
  EXPECT_EQ(json::parse(out)["n_batch"], 4);
  Scratch s;
  ASSERT_EQ(
      run_stdout("logits -m " + model + " --text hi -o " + (s.dir / "x.npy").string() + " -t 2 -ngl 0 -b 4", &out), 0)
      << out;
}

int prompt_tokens(const std::string& args) {
  std::string out;
  EXPECT_EQ(run_stdout(args + " -n 1 --temp 0 -t 2 --json", &out), 0) << args << "\n" << out;
  try {
    return json::parse(out)["prompt_tokens"].get<int>();
  } catch (...) {
    ADD_FAILURE() << args << "\n" << out;
    return -1;
  }
}

// Item 7: -f kept the file's final newline, \n in -p was literal, -f - was refused, tokenize did not parse specials.
TEST(CliUsability, PromptHandlingAsLlamaCpp) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  Scratch s;
  const std::string base = "run -m " + model;
  const int plain = prompt_tokens(base + " -p 'one line'");
  EXPECT_EQ(prompt_tokens(base + " -f " + s.write("p.txt", "one line\n")), plain);
  EXPECT_EQ(prompt_tokens(base + " -f - < " + s.write("q.txt", "one line\n")), plain);  // stdin
  // Escapes are processed by default: "a\nb" typed with a backslash is the same prompt as a real line break.
  const int real_break = prompt_tokens(base + " -f " + s.write("b.txt", "first\nsecond\n"));
  EXPECT_EQ(prompt_tokens(base + " -p 'first\\nsecond'"), real_break);
  EXPECT_NE(prompt_tokens(base + " -p 'first\\nsecond' --no-escape"), real_break);
  expect_error(base + " -f " + s.dir.string(), "is a directory");
  expect_error("tokenize -m " + model + " -f " + s.dir.string(), "is a directory");
  std::string out;
  ASSERT_EQ(run_stdout("tokenize -m " + model + " --json '<|im_end|>'", &out), 0) << out;
  EXPECT_EQ(json::parse(out).size(), 1u) << out;
  ASSERT_EQ(run_stdout("tokenize -m " + model + " --json --no-parse-special '<|im_end|>'", &out), 0) << out;
  EXPECT_GT(json::parse(out).size(), 1u) << out;
  // tokenize processes escapes as llama-tokenize does (-f keeps its bytes, final newline included).
  std::string escaped, literal, file;
  ASSERT_EQ(run_stdout("tokenize -m " + model + " --json 'first\\nsecond'", &escaped), 0) << escaped;
  ASSERT_EQ(run_stdout("tokenize -m " + model + " --json --no-escape 'first\\nsecond'", &literal), 0) << literal;
  ASSERT_EQ(run_stdout("tokenize -m " + model + " --json -f " + s.write("t.txt", "first\nsecond"), &file), 0) << file;
  EXPECT_EQ(escaped, file);
  EXPECT_NE(literal, file);
}

// Item 8: validation gaps.
TEST(CliUsability, ValidationGaps) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  expect_error("run -m " + model + " -p hi --top-p 2", "--top-p 2 must be in (0, 1]");
  expect_error("run -m " + model + " -p hi --seed 99999999999999999999", "seed '99999999999999999999'");
  expect_error("run -m " + model + " -p hi --min-p 1.5", "--min-p");
  expect_error("graph -m " + model + " -P 100000000", "beyond the model's context");
  std::string out;
  EXPECT_EQ(run_command(cli("bench --arch llama9 --random-weights -p 4 -n 0"), &out), 1) << out;
  EXPECT_EQ(out.find("building"), std::string::npos) << out;
  EXPECT_NE(out.find("unknown --arch 'llama9'"), std::string::npos) << out;
}

// Item 9: small things.
TEST(CliUsability, SmallThings) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  std::string out;
  ASSERT_EQ(run_stdout("profile -m " + model + " -n 1 -t 2", &out), 0) << out;
  EXPECT_NE(out.find("decode: 1 token in"), std::string::npos) << out;
  EXPECT_NE(out.find("--limits"), std::string::npos) << out;  // no limits measured unless asked
  // inspect sorts blk.N as numbers.
  ASSERT_EQ(run_stdout("inspect -m " + model, &out), 0) << out;
  const size_t b2 = out.find("blk.2.attn_k.weight"), b10 = out.find("blk.10.attn_k.weight");
  ASSERT_NE(b2, std::string::npos);
  ASSERT_NE(b10, std::string::npos);
  EXPECT_LT(b2, b10);
  // XDG_CACHE_HOME places the model cache.
  EXPECT_EQ(run_command("env -u TESSERA_HOME XDG_CACHE_HOME=/nonexistent/xdg " + cli("run -p hi"), &out), 1) << out;
  EXPECT_NE(out.find("/nonexistent/xdg/tessera/models"), std::string::npos) << out;
  // --no-stats: nothing on stderr.
  ASSERT_EQ(
      run_command("{ " + cli("run -m " + model + " -p hi -n 2 --temp 0 -t 2 --no-stats") + " >/dev/null; }", &out), 0);
  EXPECT_EQ(out, "");
}

// Item 3: bench measured its 1 GiB bandwidth limits by default (2.4 GB peak, seconds) while printing a third of that.
TEST(CliUsability, BenchMeasuresLimitsOnlyWhenAsked) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  std::string out;
  ASSERT_EQ(run_command(cli("bench -m " + model + " -p 8 -n 2 -r 1 -t 2"), &out), 0) << out;
  EXPECT_EQ(out.find("measuring ceilings"), std::string::npos) << out;
  ASSERT_EQ(run_stdout("bench -m " + model + " -p 8 -n 2 -r 1 -t 2 --json", &out), 0) << out;
  const json rows = json::parse(out);
  EXPECT_TRUE(rows[0]["limit"].is_null());
  // The peak the table reports is the process's: under 1 GiB without the limits' buffers.
  EXPECT_LT(rows[1]["peak_host_bytes"].get<double>(), 1024.0 * 1024 * 1024);
}

// Item 9: `make demo` built all 182 targets (tests and CUDA benchmarks) and printed every ninja line.
TEST(CliUsability, MakeDemoBuildsOnlyTheCli) {
  std::string out;
  ASSERT_EQ(run_command("make -n -C " + std::string(TESSERA_SOURCE_DIR) + " demo BUILD=/nonexistent/build", &out), 0)
      << out;
  EXPECT_NE(out.find("--target tessera_cli"), std::string::npos) << out;
  EXPECT_NE(out.find("cli-build.log"), std::string::npos) << out;  // quiet: the log goes to a file
  std::istringstream lines(out);
  for (std::string l; std::getline(lines, l);) {
    if (l.find("cmake --build") != std::string::npos) {
      EXPECT_NE(l.find("--target"), std::string::npos) << l;
    }
  }
  ASSERT_EQ(run_command("make -n -C " + std::string(TESSERA_SOURCE_DIR) + " install PREFIX=/opt/t", &out), 0) << out;
  EXPECT_NE(out.find("cmake --install"), std::string::npos) << out;
}

}  // namespace
