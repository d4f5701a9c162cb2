// SentencePiece BPE (GGUF tokenizer.ggml.model = "llama"): the text (spaces already escaped to U+2581) starts as
// one symbol per UTF-8 character; the adjacent pair whose concatenation is a vocabulary token with the highest
// score (leftmost on ties) is merged until none is left; characters outside the vocabulary become <0xXX> tokens.
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "runtime/tokenizer_vocab.h"

namespace tessera::tok {

class SpmModel {
 public:
  SpmModel() = default;
  explicit SpmModel(const VocabData& v);

  void encode(std::string_view text, std::vector<TokenId>& out) const;

 private:
  TokenId find(std::string_view s) const;

  std::unordered_map<std::string_view, TokenId> token_of_text_;  // views into the Impl's token strings
  std::vector<float> scores_;
  TokenId byte_token_[256] = {};
  TokenId unk_ = -1;
};

}  // namespace tessera::tok
