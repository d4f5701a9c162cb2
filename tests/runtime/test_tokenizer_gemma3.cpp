// Gemma 3's tokenizer (SentencePiece BPE, 262,144 tokens, byte fallback, no space prefix, user-defined tokens such as
// "\n\n" runs and HTML tags) against llama.cpp on the real model file: golden_gemma3.json holds llama_tokenize's ids
// (python/make_tokenizer_golden.py --only gemma3, cross-checked there against llama-tokenize) for every corpus
// string and a few Gemma-specific ones, with special-token parsing on, and off where that differs. The model comes
// from `scripts/fetch_model.sh gemma3-270m`; the test skips with that hint when it is absent.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>

#include "runtime/tokenizer_vocab.h"
#include "tessera/chat.h"
#include "tessera/tokenizer.h"
#include "test_util.h"
#include "tokenizer_test_util.h"

namespace tessera {
namespace {

using nlohmann::json;

std::string gemma3_model() {
  const char* home = std::getenv("TESSERA_HOME");
  const std::string dir =
      home != nullptr ? home : std::string(std::getenv("HOME") ? std::getenv("HOME") : ".") + "/.cache/tessera/models";
  return dir + "/gemma-3-270m-q4_k_m.gguf";
}

#define REQUIRE_GEMMA3(var)                                                                               \
  const std::string var = gemma3_model();                                                                 \
  if (!std::filesystem::exists(var)) GTEST_SKIP() << var << " is missing (scripts/fetch_model.sh gemma3-270m)"

std::string show(const std::vector<TokenId>& ids) { return json(ids).dump(); }

// Gemma 3 stores "</s>" as a user-defined token; llama.cpp counts it as end of generation and so as a control token,
// which text matches only with special parsing. Where "<|tool_response>" also exists (Gemma 4), "</s>" stays text.
TEST(TokenizerGemma3, EndOfSentenceTextIsControlUnlessToolResponseExists) {
  auto make = [](bool with_tool_response) {
    tok::VocabData v;
    v.kind = tok::VocabKind::SPM;
    v.source = "test";
    v.tokens = {"<unk>", "<s>", "</s>", "a", "b"};
    v.types = {tok::TokenType::UNKNOWN, tok::TokenType::CONTROL, tok::TokenType::USER_DEFINED,
               tok::TokenType::NORMAL, tok::TokenType::NORMAL};
    if (with_tool_response) {
      v.tokens.push_back("<|tool_response>");
      v.types.push_back(tok::TokenType::CONTROL);
    }
    v.scores.assign(v.tokens.size(), 0.0f);
    v.unk = 0;
    v.bos = 1;
    return tok::make_tokenizer(std::move(v));
  };
  const Tokenizer gemma3 = make(false);
  EXPECT_TRUE(gemma3.is_eog(2));
  EXPECT_TRUE(gemma3.is_control(2));
  EXPECT_EQ(gemma3.encode("a</s>b", false, true), (std::vector<TokenId>{3, 2, 4}));
  EXPECT_NE(gemma3.encode("a</s>b", false, false), (std::vector<TokenId>{3, 2, 4}));
  const Tokenizer gemma4 = make(true);
  EXPECT_FALSE(gemma4.is_eog(2));
  EXPECT_EQ(gemma4.encode("a</s>b", false, false), (std::vector<TokenId>{3, 2, 4}));  // user-defined: always matched
}

TEST(TokenizerGemma3, MetadataAsLlamaCppReadsIt) {
  REQUIRE_GEMMA3(model);
  const Tokenizer tok = Tokenizer::from_model(model);
  EXPECT_EQ(tok.kind(), "llama");
  EXPECT_EQ(tok.n_vocab(), 262144);
  EXPECT_EQ(tok.bos_id(), 2);
  EXPECT_EQ(tok.eos_id(), 1);
  EXPECT_TRUE(tok.add_bos());
  const TokenId end_of_turn = tok.encode("<end_of_turn>", false, true).at(0);
  EXPECT_TRUE(tok.is_eog(end_of_turn));
  EXPECT_EQ(tok.eot_id(), end_of_turn);
}

TEST(TokenizerGemma3, LlamaCppOnTheCorpus) {
  REQUIRE_GEMMA3(model);
  const Tokenizer tok = Tokenizer::from_model(model);
  const json golden = test::load_tokenizer_json("tokenizer/golden_gemma3.json");
  auto texts = test::load_tokenizer_json("tokenizer/corpus.json").get<std::vector<std::string>>();
  for (const auto& e : golden.at("extra")) texts.push_back(e.get<std::string>());
  const auto& special = golden.at("special");
  ASSERT_EQ(special.size(), texts.size()) << "golden_gemma3.json is stale: rerun python/make_tokenizer_golden.py";
  const auto& plain = golden.at("plain");
  size_t same_special = 0, same_plain = 0;
  int reported = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto want = test::unpack_ids(special[i].get<std::string>(), 4);
    const auto got = tok.encode(texts[i], true, true);
    same_special += got == want;
    if (got != want && ++reported <= 8) {
      ADD_FAILURE() << "string " << i << " " << json(texts[i]).dump() << "\n  got  " << show(got) << "\n  want "
                    << show(want);
    }
    const std::string key = std::to_string(i);
    const auto want_plain = plain.contains(key) ? test::unpack_ids(plain.at(key).get<std::string>(), 4) : want;
    const auto got_plain = tok.encode(texts[i], true, false);
    same_plain += got_plain == want_plain;
    if (got_plain != want_plain && ++reported <= 8) {
      ADD_FAILURE() << "no parse_special: string " << i << " " << json(texts[i]).dump() << "\n  got  "
                    << show(got_plain) << "\n  want " << show(want_plain);
    }
  }
  std::cout << "[ gemma3   ] " << same_special << "/" << texts.size() << " identical with special parsing, "
            << same_plain << "/" << texts.size() << " without\n";
  EXPECT_EQ(same_special, texts.size());
  EXPECT_EQ(same_plain, texts.size());
}

TEST(TokenizerGemma3, ChatPromptTokenizesIntoTurnMarkers) {
  REQUIRE_GEMMA3(model);
  const Tokenizer tok = Tokenizer::from_model(model);
  // The base model's file has no template; the instruct models' is Gemma 3's, which detection names "gemma".
  const ChatTemplate t = chat_template_for(tok, "gemma");
  const std::string prompt = render_chat(t, {{"system", "Be brief."}, {"user", "Hi!"}}, true);
  EXPECT_EQ(prompt, "<start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n<start_of_turn>model\n");
  const auto ids = tok.encode(prompt, true, true);
  const TokenId start = tok.encode("<start_of_turn>", false, true).at(0);
  EXPECT_EQ(ids.front(), tok.bos_id());
  EXPECT_EQ(std::count(ids.begin(), ids.end(), start), 2);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), tok.eot_id()), 1);
  EXPECT_EQ(tok.decode(ids, true), "<bos>" + prompt);
}

TEST(TokenizerGemma3, RoundTrip) {
  REQUIRE_GEMMA3(model);
  const Tokenizer tok = Tokenizer::from_model(model);
  const auto texts = test::load_tokenizer_json("tokenizer/corpus.json").get<std::vector<std::string>>();
  int failures = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    // No space prefix, byte fallback: every byte of every string survives, special text parsed or not.
    const std::string back = tok.decode(tok.encode(texts[i], false, false));
    if (back != texts[i] && ++failures <= 5) ADD_FAILURE() << "string " << i << " " << json(texts[i]).dump();
  }
  EXPECT_EQ(failures, 0);
}

}  // namespace
}  // namespace tessera
