// Tokenizer unit tests: UTF-8 handling, the byte-level alphabet, whitespace adaptation of the regexes, special
// tokens, BOS/EOS, streaming detokenization, errors. Exact ids against the peers are in test_tokenizer_golden.cpp.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <random>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "formats/gguf.h"
#include "runtime/tokenizer_pretokenize.h"
#include "runtime/tokenizer_utf8.h"
#include "runtime/tokenizer_vocab.h"
#include "tessera/error.h"
#include "tessera/tokenizer.h"
#include "test_util.h"

namespace tessera {
namespace {

using nlohmann::json;

std::vector<std::string> corpus() {
  std::ifstream f(test::data_path("tokenizer/corpus.json"), std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return json::parse(ss.str()).get<std::vector<std::string>>();
}

TEST(TokenizerUtf8, EveryScalarValueRoundTrips) {
  for (uint32_t cp = 0; cp <= 0x10FFFF; cp += (cp < 0x3000 ? 1 : 7)) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    std::string s;
    tok::utf8_append(s, cp);
    ASSERT_TRUE(tok::utf8_is_valid(s)) << cp;
    size_t i = 0;
    ASSERT_EQ(tok::utf8_next(s, i), cp);
    ASSERT_EQ(i, s.size());
    // Every proper prefix of a multi-byte sequence is incomplete, not invalid.
    for (size_t k = 1; k < s.size(); ++k) {
      EXPECT_LT(tok::utf8_sequence_length(reinterpret_cast<const uint8_t*>(s.data()), k), 0);
    }
  }
}

TEST(TokenizerUtf8, IllFormedSequencesAreRejected) {
  // Table 3-7 of the Unicode standard: surrogates, overlongs, values above U+10FFFF, stray continuation bytes.
  for (const std::string bad : {"\xED\xA0\x80", "\xC0\x80", "\xC1\xBF", "\xE0\x80\x80", "\xF0\x80\x80\x80",
                                "\xF4\x90\x80\x80", "\xF5\x80\x80\x80", "\x80", "\xBF", "\xFF", "\xC3\x28"}) {
    EXPECT_FALSE(tok::utf8_is_valid(bad));
    const std::string clean = tok::utf8_sanitize(bad);
    EXPECT_TRUE(tok::utf8_is_valid(clean));
    EXPECT_NE(clean.find("\xEF\xBF\xBD"), std::string::npos);
  }
  const std::string good = "plain \xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80";
  EXPECT_EQ(tok::utf8_sanitize(good), good);
}

TEST(TokenizerUtf8, ByteAlphabetIsABijectionOntoPrintableCharacters) {
  std::set<uint32_t> seen;
  for (int b = 0; b < 256; ++b) {
    const uint32_t cp = tok::byte_to_codepoint(static_cast<uint8_t>(b));
    EXPECT_EQ(tok::codepoint_to_byte(cp), b);
    EXPECT_FALSE(cp <= 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD) << "not printable: " << cp;
    seen.insert(cp);
  }
  EXPECT_EQ(seen.size(), 256u);
  EXPECT_EQ(tok::codepoint_to_byte(0x41), 0x41);
  EXPECT_EQ(tok::codepoint_to_byte(0x20), -1);
  EXPECT_EQ(tok::codepoint_to_byte(0x4E2D), -1);
}

TEST(TokenizerPre, WhitespaceIsUnicodeWhiteSpaceWithoutMongolianVowelSeparator) {
  const tok::PreTokenizer pre({tok::adapt_whitespace("\\s+"), tok::adapt_whitespace("[^\\s]+")}, "test");
  std::vector<tok::Span> words;
  // White_Space characters (incl. NEL U+0085 and NBSP) form one word; U+180E and ZWSP are not spaces.
  const std::string text = "a\xC2\x85\xC2\xA0\xE3\x80\x80" "b\xE1\xA0\x8E" "c\xE2\x80\x8B" "d";
  pre.split(text, words);
  std::vector<std::string> got;
  for (auto w : words) got.push_back(text.substr(w.begin, w.end - w.begin));
  const std::vector<std::string> want = {"a", "\xC2\x85\xC2\xA0\xE3\x80\x80", "b\xE1\xA0\x8E" "c\xE2\x80\x8B" "d"};
  EXPECT_EQ(got, want);
  EXPECT_EQ(tok::adapt_whitespace("[^\\s\\p{L}]"), "(?:\\x{180E}|[^\\s\\p{L}])");
  EXPECT_EQ(tok::adapt_whitespace("\\p{L}+"), "\\p{L}+");
  EXPECT_THROW(tok::PreTokenizer({"(unclosed"}, "test"), Error);
}

TEST(TokenizerPre, PiecesCoverTheTextExactly) {
  const tok::PreTokenizer pre(tok::pre_patterns_for("smollm", "test"), "test");
  std::vector<tok::Span> words;
  for (const std::string& s : corpus()) {
    pre.split(s, words);
    uint32_t at = 0;
    for (auto w : words) {
      ASSERT_EQ(w.begin, at);
      ASSERT_LT(w.begin, w.end);
      at = w.end;
    }
    ASSERT_EQ(at, s.size());
  }
  EXPECT_THROW(tok::pre_patterns_for("no-such-pre", "m.gguf"), Error);
  for (const char* p : {"default", "smollm", "llama3", "llama-bpe", "gpt2", "gpt-2", "qwen2"}) {
    EXPECT_NO_THROW(tok::PreTokenizer(tok::pre_patterns_for(p, "test"), "test")) << p;
  }
}

class DefaultModel : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    path_ = test::default_model_or_skip_reason(&why);
    if (path_.empty()) {
      if (std::getenv("CI") != nullptr) FAIL() << why;
      GTEST_SKIP() << why;
    }
    tok_ = std::make_unique<Tokenizer>(Tokenizer::from_model(path_));
  }
  std::string path_;
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(DefaultModel, MetadataAndSpecialIds) {
  const Tokenizer& t = *tok_;
  EXPECT_EQ(t.kind(), "gpt2");
  EXPECT_EQ(t.pre_type(), "smollm");
  EXPECT_EQ(t.n_vocab(), 49152);
  EXPECT_FALSE(t.add_bos());
  EXPECT_EQ(t.token_text(t.bos_id()), "<|im_start|>");
  EXPECT_EQ(t.token_text(t.eos_id()), "<|im_end|>");
  EXPECT_EQ(t.token_text(t.eot_id()), "<|im_end|>");
  EXPECT_TRUE(t.is_eog(t.eos_id()));
  for (TokenId id = 0; id < t.n_vocab(); ++id) {
    if (t.token_text(id) == "<|endoftext|>") {
      EXPECT_TRUE(t.is_eog(id));
    }
  }
  EXPECT_FALSE(t.is_eog(t.encode("hello", false, false).at(0)));
  EXPECT_FALSE(t.chat_template().empty());
}

TEST_F(DefaultModel, SpecialTokensParseOnlyWhenAsked) {
  const Tokenizer& t = *tok_;
  const std::string text = "<|im_start|>user\nhi<|im_end|>";
  const auto on = t.encode(text, false, true);
  const auto off = t.encode(text, false, false);
  ASSERT_GE(on.size(), 3u);
  EXPECT_EQ(t.token_text(on.front()), "<|im_start|>");
  EXPECT_TRUE(t.is_control(on.front()));
  EXPECT_EQ(on.back(), t.eos_id());
  for (TokenId id : off) EXPECT_FALSE(t.is_control(id)) << "special text must stay plain text";
  EXPECT_GT(off.size(), on.size());
  EXPECT_EQ(t.decode(on), text);
  EXPECT_EQ(t.decode(off), text);
  EXPECT_EQ(t.decode(on, false), "user\nhi");  // control tokens hidden
}

TEST_F(DefaultModel, BosAndEosFollowTheMetadata) {
  const gguf::File file = gguf::File::open(path_);
  tok::VocabData v = tok::vocab_from_gguf(file);
  v.add_bos = true;
  v.add_eos = true;
  const Tokenizer t = tok::make_tokenizer(std::move(v));
  const auto with = t.encode("Hello", true, false);
  const auto without = t.encode("Hello", false, false);
  ASSERT_EQ(with.size(), without.size() + 2);
  EXPECT_EQ(with.front(), t.bos_id());
  EXPECT_EQ(with.back(), t.eos_id());
  EXPECT_EQ(t.encode("", true, false), (std::vector<TokenId>{t.bos_id(), t.eos_id()}));
  EXPECT_TRUE(tok_->encode("", true, true).empty());
}

TEST_F(DefaultModel, InvalidUtf8IsReplacedNotFatal) {
  const Tokenizer& t = *tok_;
  const std::string bad = std::string("ab\xC3\x28 \xFF\xFE z\xE2\x82", 11);
  const auto ids = t.encode(bad, false, false);
  EXPECT_EQ(ids, t.encode(tok::utf8_sanitize(bad), false, false));
  EXPECT_EQ(t.decode(ids), tok::utf8_sanitize(bad));
}

TEST_F(DefaultModel, RandomBytesNeverBreakIt) {
  // Random byte strings, often ill-formed UTF-8 and seeded with pieces of special tokens: encoding never fails,
  // and decoding gives back the input with each ill-formed byte replaced by U+FFFD. The bytes are drawn from those
  // the vocabulary has a single-byte token for: SmolLM2 lacks 21 (e.g. 0x13, 0xF1, 0xFF), which llama.cpp drops
  // from the ids just as we do.
  const Tokenizer& t = *tok_;
  std::vector<char> bytes;
  for (TokenId id = 0; id < t.n_vocab(); ++id) {
    if (t.token_to_piece(id).size() == 1 && !t.is_control(id)) bytes.push_back(t.token_to_piece(id)[0]);
  }
  ASSERT_GT(bytes.size(), 200u);
  std::mt19937 rng(1234);
  const std::vector<std::string> seeds = {"<|im_start|>", "<|im_", "\xF0\x9F", "\xE2\x80\x8D", " ", "\n", "12"};
  for (int iter = 0; iter < 3000; ++iter) {
    std::string s;
    const int n = static_cast<int>(rng() % 24);
    for (int k = 0; k < n; ++k) {
      if (rng() % 4 == 0) {
        s += seeds[rng() % seeds.size()];
      } else {
        s.push_back(bytes[rng() % bytes.size()]);
      }
    }
    for (bool special : {false, true}) {
      const auto ids = t.encode(s, false, special);
      ASSERT_EQ(t.decode(ids), tok::utf8_sanitize(s)) << "special=" << special << " ids=" << json(ids).dump();
    }
  }
}

TEST_F(DefaultModel, StreamDecoderHoldsIncompleteCharacters) {
  const Tokenizer& t = *tok_;
  size_t split_chars = 0;
  for (const std::string& s : corpus()) {
    const auto ids = t.encode(s, false, true);
    StreamDecoder dec(t);
    std::string joined;
    for (TokenId id : ids) {
      const std::string piece = dec.push(id);
      ASSERT_TRUE(tok::utf8_is_valid(piece)) << json(s).dump();
      if (piece.empty() && !t.token_to_piece(id).empty()) ++split_chars;
      joined += piece;
    }
    joined += dec.flush();
    ASSERT_EQ(joined, s) << json(s).dump();
  }
  EXPECT_GT(split_chars, 10u) << "the corpus should contain characters split across tokens";
}

TEST_F(DefaultModel, StreamDecoderReplacesBrokenBytes) {
  const Tokenizer& t = *tok_;
  // A lone lead byte followed by ASCII: the lead byte can never complete, so it becomes U+FFFD.
  TokenId lead = -1;
  for (TokenId id = 0; id < t.n_vocab() && lead < 0; ++id) {
    if (t.token_to_piece(id) == "\xE2") lead = id;
  }
  ASSERT_GE(lead, 0);
  StreamDecoder dec(t);
  EXPECT_EQ(dec.push(lead), "");
  EXPECT_EQ(dec.push(t.encode("x", false, false).at(0)), "\xEF\xBF\xBD" "x");
  EXPECT_EQ(dec.push(lead), "");
  EXPECT_EQ(dec.flush(), "\xEF\xBF\xBD");
}

TEST_F(DefaultModel, ConcurrentEncodesAgree) {
  const Tokenizer& t = *tok_;
  const auto texts = corpus();
  std::vector<std::vector<TokenId>> a(texts.size()), b(texts.size());
  std::thread th([&] {
    for (size_t i = 0; i < texts.size(); ++i) a[i] = t.encode(texts[i], false, true);
  });
  for (size_t i = 0; i < texts.size(); ++i) b[i] = t.encode(texts[i], false, true);
  th.join();
  EXPECT_EQ(a, b);
}

TEST_F(DefaultModel, BadIdsAreErrors) {
  EXPECT_THROW(tok_->decode({0, -1}), Error);
  EXPECT_THROW(tok_->decode({tok_->n_vocab()}), Error);
  EXPECT_THROW(tok_->token_to_piece(1 << 30), Error);
  EXPECT_FALSE(tok_->is_eog(-5));
}

TEST(TokenizerLoad, ClearErrors) {
  EXPECT_THROW(Tokenizer::from_model("/nonexistent/model.gguf"), Error);
  const std::string dir = ::testing::TempDir();
  const std::string bad_json = dir + "/bad.tokenizer.json";
  std::ofstream(bad_json) << "{ not json";
  try {
    Tokenizer::from_model(bad_json);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.tokenizer.json"), std::string::npos) << e.what();
  }
  EXPECT_THROW(tok::vocab_from_tokenizer_json_text(R"({"model":{"type":"Unigram","vocab":[]}})", "x", ""), Error);
  EXPECT_THROW(tok::vocab_from_tokenizer_json_text(
                   R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"pre_tokenizer":{"type":"Metaspace"}})",
                   "x", ""),
               Error);
  // A GGUF without tokenizer metadata.
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::from_string("llama"));
  const auto bytes = w.to_bytes();
  const gguf::File f = gguf::File::parse(bytes.data(), bytes.size(), "empty.gguf");
  try {
    tok::vocab_from_gguf(f);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.ggml.model"), std::string::npos) << e.what();
  }
}

TEST(TokenizerLoad, TokenizerJsonWithConfigFiles) {
  // A minimal byte-level BPE tokenizer.json with a Llama-3-like template post-processor, and config files beside.
  const std::string dir = ::testing::TempDir() + "/tok_cfg";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/tokenizer.json") << R"({
    "added_tokens":[{"id":3,"content":"<bos>","special":true},{"id":4,"content":"<eot>","special":true}],
    "normalizer":null,
    "pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"use_regex":true},
    "post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<bos>","type_id":0}},
                                                             {"Sequence":{"id":"A","type_id":0}}]},
    "model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":[["a","b"]]}})";
  std::ofstream(dir + "/tokenizer_config.json") << R"({"eos_token":"<eot>","chat_template":"<|im_start|>"})";
  std::ofstream(dir + "/generation_config.json") << R"({"eos_token_id":[4,3]})";
  const Tokenizer t = Tokenizer::from_model(dir);
  EXPECT_TRUE(t.add_bos());
  EXPECT_EQ(t.bos_id(), 3);
  EXPECT_EQ(t.eos_id(), 4);
  EXPECT_TRUE(t.is_eog(3));
  EXPECT_EQ(t.chat_template(), "<|im_start|>");
  EXPECT_EQ(t.encode("abab", true, true), (std::vector<TokenId>{3, 2, 2}));
  EXPECT_EQ(t.encode("ab<eot>", false, true), (std::vector<TokenId>{2, 4}));
}

}  // namespace
}  // namespace tessera
