// `tessera tokenize` / `tessera detokenize` end to end on the default model: the ids match llama.cpp's golden ids,
// detokenize inverts tokenize, and bad input fails with one clear sentence and a non-zero exit.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_util.h"

namespace tessera {
namespace {

using nlohmann::json;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Same decoding as tests/runtime/tokenizer_test_util.h (base64 of little-endian uint16 ids).
std::vector<int> unpack(const std::string& b64) {
  static const std::string abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::vector<unsigned char> bytes;
  unsigned acc = 0;
  int bits = 0;
  for (char c : b64) {
    if (c == '=') break;
    acc = (acc << 6) | static_cast<unsigned>(abc.find(c));
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      bytes.push_back(static_cast<unsigned char>(acc >> bits));
    }
  }
  std::vector<int> ids;
  for (size_t i = 0; i + 1 < bytes.size(); i += 2) ids.push_back(bytes[i] | (bytes[i + 1] << 8));
  return ids;
}

TEST(TokenizeCli, MatchesLlamaCppAndRoundTrips) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  const json corpus = json::parse(slurp(test::data_path("tokenizer/corpus.json")));
  const json golden = json::parse(slurp(test::data_path("tokenizer/golden_llamacpp.json")));
  const std::string tmp = ::testing::TempDir() + "/tok_cli_input.txt";
  // A few varied strings: special tokens, emoji, CJK, whitespace runs.
  for (size_t i : {150u, 700u, 1000u, 1300u}) {
    const std::string text = corpus.at(i).get<std::string>();
    std::ofstream(tmp, std::ios::binary) << text;
    std::string out;
    ASSERT_EQ(test::run_command(test::cli_path() + " tokenize -m " + model + " --special --json -f " + tmp, &out), 0)
        << out;
    const auto ids = json::parse(out).get<std::vector<int>>();
    EXPECT_EQ(ids, unpack(golden.at("special").at(i).get<std::string>())) << "corpus string " << i;
    if (ids.empty()) continue;
    std::string back;
    ASSERT_EQ(test::run_command(test::cli_path() + " detokenize -m " + model + " '" + json(ids).dump() + "'", &back), 0)
        << back;
    EXPECT_EQ(back, text + "\n") << "corpus string " << i;
  }
}

TEST(TokenizeCli, PrintsIdsAndPieces) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  std::string out;
  ASSERT_EQ(test::run_command(
                test::cli_path() + " tokenize -m " + model + " --no-parse-special 'Hello world\t<|im_end|>'", &out),
            0);
  // One line per token: id, then the piece in quotes with the tab escaped; no special parsing with --no-parse-special
  // (by default control-token text is parsed, as llama-tokenize does).
  EXPECT_NE(out.find("'Hello'"), std::string::npos) << out;
  EXPECT_NE(out.find("' world'"), std::string::npos) << out;
  EXPECT_NE(out.find("\\t"), std::string::npos) << out;
  EXPECT_EQ(out.find("'<|im_end|>'"), std::string::npos) << out;
  ASSERT_EQ(test::run_command(test::cli_path() + " tokenize -m " + model + " '<|im_end|>'", &out), 0);
  EXPECT_NE(out.find("'<|im_end|>'"), std::string::npos) << out;
  ASSERT_EQ(test::run_command(test::cli_path() + " detokenize -m " + model + " 2 --hide-special", &out), 0);
  EXPECT_EQ(out, "\n");
}

TEST(TokenizeCli, BadInputFailsClearly) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  std::string out;
  EXPECT_NE(test::run_command(test::cli_path() + " detokenize -m " + model + " 1 99999999", &out), 0);
  EXPECT_NE(out.find("outside the vocabulary"), std::string::npos) << out;
  EXPECT_NE(test::run_command(test::cli_path() + " detokenize -m " + model + " 1 abc", &out), 0);
  EXPECT_NE(out.find("not a token id"), std::string::npos) << out;
  EXPECT_NE(test::run_command(test::cli_path() + " tokenize -m " + model, &out), 0);
  EXPECT_NE(out.find("TEXT"), std::string::npos) << out;
  EXPECT_NE(test::run_command(test::cli_path() + " tokenize -m /nonexistent.gguf hi", &out), 0);
  EXPECT_NE(out.find("/nonexistent.gguf"), std::string::npos) << out;
}

}  // namespace
}  // namespace tessera
