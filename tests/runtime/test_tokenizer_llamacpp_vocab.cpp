// llama.cpp's own vocabulary tests (tests/test-tokenizer-0.cpp): models/ggml-vocab-NAME.gguf holds a model's
// tokenizer metadata only, NAME.gguf.inp the test strings (separated by "\n__ggml_vocab_test__\n") and NAME.gguf.out
// one line of ids per string, tokenized without BOS/EOS and without special-token parsing. Tessera must reproduce
// every line for the vocabularies of the families it runs. The files come from the llama.cpp source vendored in the
// llama-cpp-python sdist, which scripts/setup.sh unpacks (scripts/build_llamacpp.sh --source); the test skips
// locally and fails under CI when they are absent.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>

#include "tessera/error.h"
#include "tessera/tokenizer.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

// Where scripts/build_llamacpp.sh keeps the llama.cpp source (its default cache).
fs::path llamacpp_models_dir() {
  const char* home = std::getenv("HOME");
  return fs::path(home != nullptr ? home : ".") / ".cache/tessera/llama.cpp-0.3.36/src/models";
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct VocabTest {
  std::string text;
  std::vector<TokenId> ids;
};

// test-tokenizer-0's reader: strings split at the separator (a trailing one ends the list), ids one line each.
std::vector<VocabTest> read_vocab_tests(const fs::path& gguf) {
  const std::string inp = read_file(gguf.string() + ".inp");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<VocabTest> tests;
  for (size_t pos = 0; pos < inp.size();) {
    const size_t next = inp.find(sep, pos);
    if (next == std::string::npos) {
      tests.push_back({inp.substr(pos), {}});
      break;
    }
    tests.push_back({inp.substr(pos, next - pos), {}});
    pos = next + sep.size();
  }
  std::istringstream out(read_file(gguf.string() + ".out"));
  size_t i = 0;
  for (std::string line; std::getline(out, line); ++i) {
    if (i >= tests.size()) return {};  // the counts disagree: the caller reports it
    std::istringstream ids(line);
    for (TokenId id; ids >> id;) tests[i].ids.push_back(id);
  }
  if (i != tests.size()) return {};
  return tests;
}

std::string show(const std::vector<TokenId>& ids) {
  std::string s;
  for (const TokenId id : ids) {
    if (!s.empty()) s.push_back(' ');
    s.append(std::to_string(id));
  }
  return s;
}

// The vocabularies of the families Tessera runs or tokenizes (Llama 3: llama-bpe; Llama 2 / Mistral 7B: llama-spm;
// Qwen2 / Qwen2.5 / Qwen3: qwen2; Qwen3.5: qwen35; Phi-3: phi-3; SmolLM's starcoder-style pre-tokenizer: starcoder,
// refact, command-r; plain GPT-2: gpt-2, mpt; falcon; Gemma 4's BPE over raw characters: gemma-4). Every line must
// match, and decode back to its text. (Gemma 3's SentencePiece vocabulary has no file here: test_tokenizer_gemma3.cpp
// checks it on the real model.)
const char* const kRequired[] = {"llama-bpe", "llama-spm", "qwen2",     "qwen35", "phi-3",     "gpt-2",
                                 "mpt",       "falcon",    "starcoder", "refact", "command-r", "gemma-4"};

class LlamaCppVocab : public ::testing::TestWithParam<const char*> {};

TEST_P(LlamaCppVocab, ReproducesEveryOutLine) {
  const fs::path dir = llamacpp_models_dir();
  if (!fs::exists(dir)) {
    const std::string why = dir.string() + " is missing (scripts/build_llamacpp.sh --source unpacks it)";
    if (std::getenv("CI") != nullptr) FAIL() << why;
    GTEST_SKIP() << why;
  }
  const fs::path gguf = dir / (std::string("ggml-vocab-") + GetParam() + ".gguf");
  ASSERT_TRUE(fs::exists(gguf)) << gguf;
  const auto tests = read_vocab_tests(gguf);
  ASSERT_FALSE(tests.empty()) << gguf << ": .inp and .out disagree on the number of tests";
  const Tokenizer tok = Tokenizer::from_model(gguf.string());
  size_t passed = 0, round_trips = 0;
  for (const auto& t : tests) {
    const auto got = tok.encode(t.text, false, false);  // test-tokenizer-0: add_special and parse_special off
    round_trips += tok.decode(got) == t.text;
    if (got == t.ids) {
      ++passed;
    } else {
      ADD_FAILURE() << GetParam() << ": '" << t.text << "'\n  got  " << show(got) << "\n  want " << show(t.ids);
    }
  }
  std::cout << "[ vocab    ] " << GetParam() << ": " << passed << "/" << tests.size() << " lines identical, "
            << round_trips << " decode back to their text\n";
  EXPECT_EQ(round_trips, tests.size());
  RecordProperty("passed", static_cast<int>(passed));
  RecordProperty("total", static_cast<int>(tests.size()));
}

INSTANTIATE_TEST_SUITE_P(Families, LlamaCppVocab, ::testing::ValuesIn(kRequired), [](const auto& info) {
  std::string n = info.param;
  for (char& c : n) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return n;
});

// The other vocabularies in the folder: reported (pass counts, or why Tessera refuses the tokenizer), not required.
TEST(LlamaCppVocabOthers, Report) {
  const fs::path dir = llamacpp_models_dir();
  if (!fs::exists(dir)) GTEST_SKIP() << dir << " is missing";
  const std::set<std::string> required(std::begin(kRequired), std::end(kRequired));
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string f = e.path().filename().string();
    if (f.rfind("ggml-vocab-", 0) != 0 || e.path().extension() != ".gguf") continue;
    const std::string name = f.substr(11, f.size() - 16);
    if (required.count(name) || !fs::exists(e.path().string() + ".out")) continue;
    const auto tests = read_vocab_tests(e.path());
    try {
      const Tokenizer tok = Tokenizer::from_model(e.path().string());
      size_t passed = 0;
      for (const auto& t : tests) passed += tok.encode(t.text, false, false) == t.ids;
      std::cout << "[ vocab    ] " << name << ": " << passed << "/" << tests.size()
                << " lines identical (not required)\n";
    } catch (const Error& err) {
      std::cout << "[ vocab    ] " << name << ": not supported (" << err.what() << ")\n";
    }
  }
}

}  // namespace
}  // namespace tessera
