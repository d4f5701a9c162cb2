// Tokenizer agreement with its peers on the nasty corpus (tests/data/tokenizer/corpus.json, from
// python/make_tokenizer_corpus.py):
//   - llama.cpp's llama-tokenize on the default model (golden_llamacpp.json, python/make_tokenizer_golden.py), with
//     special-token parsing on for every string and off for the strings holding special-token text;
//   - llama.cpp on the same vocabulary with other pre-tokenizers (golden_pre.json: llama3, qwen2, gpt2, default);
//   - Hugging Face `tokenizers` on a tokenizer.json exported from the default model's vocabulary and merges
//     (smollm_4k.tokenizer.json, golden_hf.json);
// and decode(encode(s)) == s for every string.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "formats/gguf.h"
#include "runtime/tokenizer_vocab.h"
#include "tessera/tokenizer.h"
#include "test_util.h"
#include "tokenizer_test_util.h"

namespace tessera {
namespace {

using nlohmann::json;

json load_json(const std::string& rel) { return test::load_tokenizer_json(rel); }
std::vector<TokenId> ids_of(const json& packed) { return test::unpack_ids(packed.get<std::string>()); }

const std::vector<std::string>& corpus() {
  static const std::vector<std::string> c = load_json("tokenizer/corpus.json").get<std::vector<std::string>>();
  return c;
}

std::string quote(const std::string& s) { return json(s).dump(-1, ' ', false, json::error_handler_t::replace); }

std::string show(const std::vector<TokenId>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) s.push_back(',');
    s.append(std::to_string(ids[i]));
  }
  s.push_back(']');
  return s;
}

// Counts mismatches, reporting the first few in full.
struct MismatchLog {
  int count = 0;
  void check(size_t index, const std::string& text, const std::vector<TokenId>& got,
             const std::vector<TokenId>& want, const char* what) {
    if (got == want) return;
    if (++count <= 8) {
      ADD_FAILURE() << what << ": corpus string " << index << " " << quote(text) << "\n  got  " << show(got)
                    << "\n  want " << show(want);
    }
  }
};

TEST(TokenizerGolden, CorpusIsLargeAndNasty) {
  const auto& c = corpus();
  EXPECT_GE(c.size(), 1000u);
  auto any = [&](std::string_view needle) {
    return std::any_of(c.begin(), c.end(), [&](const std::string& s) { return s.find(needle) != std::string::npos; });
  };
  for (std::string_view needle : {"\t", "\r\n", "\u200d", "\u00a0", "\u200b", "<|im_start|>", "\U0001F44D\U0001F3FB",
                                  "\u4e2d", "\u0645", "\u05e9", "\u0436", "\u03b1", "\u00e9", "e\u0301"}) {
    EXPECT_TRUE(any(needle)) << "corpus lacks " << quote(std::string(needle));
  }
}

TEST(TokenizerGolden, LlamaCppOnDefaultModel) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  const Tokenizer tok = Tokenizer::from_model(model);
  const json golden = load_json("tokenizer/golden_llamacpp.json");
  const auto& special = golden.at("special");
  ASSERT_EQ(special.size(), corpus().size()) << "golden_llamacpp.json is stale: rerun python/make_tokenizer_golden.py";
  MismatchLog log;
  for (size_t i = 0; i < corpus().size(); ++i) {
    // llama-tokenize adds BOS/EOS as the model asks (add_special) and parses special tokens by default.
    log.check(i, corpus()[i], tok.encode(corpus()[i], true, true), ids_of(special[i]),
              "parse_special");
  }
  const auto& plain = golden.at("plain");
  EXPECT_GT(plain.size(), 50u);
  for (auto it = plain.begin(); it != plain.end(); ++it) {
    const size_t i = std::stoul(it.key());
    log.check(i, corpus()[i], tok.encode(corpus()[i], true, false), ids_of(it.value()),
              "no parse_special");
  }
  EXPECT_EQ(log.count, 0);
}

TEST(TokenizerGolden, LlamaCppOtherPreTokenizers) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  const json golden = load_json("tokenizer/golden_pre.json");
  const json base = load_json("tokenizer/golden_llamacpp.json").at("special");
  const gguf::File file = gguf::File::open(model);
  for (auto it = golden.at("pre").begin(); it != golden.at("pre").end(); ++it) {
    SCOPED_TRACE(::testing::Message() << "tokenizer.ggml.pre = " << it.key());
    tok::VocabData v = tok::vocab_from_gguf(file);
    v.pre = it.key();
    v.ignore_merges = it.value().at("ignore_merges").get<bool>();
    const Tokenizer tok = tok::make_tokenizer(std::move(v));
    const json& diff = it.value().at("differs");  // ids where they differ from the smollm golden
    MismatchLog log;
    size_t n = 0;
    for (size_t i = 0; i < corpus().size(); i += golden.at("stride").get<size_t>(), ++n) {
      const std::string key = std::to_string(i);
      const json& want = diff.contains(key) ? diff.at(key) : base.at(i);
      log.check(i, corpus()[i], tok.encode(corpus()[i], true, true), ids_of(want), "pre");
    }
    EXPECT_EQ(n, it.value().at("checked").get<size_t>());
    EXPECT_EQ(log.count, 0);
  }
}

TEST(TokenizerGolden, HuggingFaceTokenizersOnExportedJson) {
  const Tokenizer tok = Tokenizer::from_model(test::data_path("tokenizer/smollm_4k.tokenizer.json"));
  EXPECT_EQ(tok.kind(), "hf-bpe");
  const json golden = load_json("tokenizer/golden_hf.json");
  const auto& ids = golden.at("ids");
  ASSERT_EQ(ids.size(), corpus().size()) << "golden_hf.json is stale: rerun python/make_tokenizer_golden.py";
  MismatchLog log;
  for (size_t i = 0; i < corpus().size(); ++i) {
    // tokenizers always splits out added tokens; encode(add_special_tokens=False).
    log.check(i, corpus()[i], tok.encode(corpus()[i], false, true), ids_of(ids[i]), "tokenizers");
  }
  EXPECT_EQ(log.count, 0);
}

TEST(TokenizerGolden, RoundTripEveryCorpusString) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  const Tokenizer gguf_tok = Tokenizer::from_model(model);
  const Tokenizer hf_tok = Tokenizer::from_model(test::data_path("tokenizer/smollm_4k.tokenizer.json"));
  int failures = 0;
  for (size_t i = 0; i < corpus().size(); ++i) {
    const std::string& s = corpus()[i];
    for (const Tokenizer* t : {&gguf_tok, &hf_tok}) {
      for (bool special : {true, false}) {
        const std::string back = t->decode(t->encode(s, false, special));
        if (back != s && ++failures <= 5) {
          ADD_FAILURE() << "round trip of corpus string " << i << " " << quote(s) << " gave " << quote(back);
        }
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

}  // namespace
}  // namespace tessera
