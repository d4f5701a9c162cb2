// Byte-level BPE (GPT-2 style, GGUF tokenizer.ggml.model = "gpt2" and tokenizer.json BPE): every byte starts as
// one symbol, and the adjacent pair with the lowest merge rank (leftmost on ties) is merged until none is left.
#pragma once

#include <climits>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "runtime/tokenizer_vocab.h"

namespace tessera::tok {

class BpeModel {
 public:
  BpeModel() = default;
  explicit BpeModel(const VocabData& v);

  // Appends the ids of one pre-tokenized word (raw UTF-8 bytes).
  void encode_word(std::string_view word, std::vector<TokenId>& out) const;

 private:
  struct Merge {
    uint64_t key;     // (left symbol << 32) | right symbol; kEmpty when the slot is free
    int32_t rank;
    uint32_t result;  // merged symbol
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};

  uint32_t intern(const std::string& text);
  void add_merge(uint32_t left, uint32_t right, int32_t rank, uint32_t result);
  const Merge* find_merge(uint32_t left, uint32_t right) const;
  void emit(uint32_t sym, std::string_view bytes, std::vector<TokenId>& out) const;
  // The word's first symbols and their byte offsets (one per byte, or per UTF-8 character for raw BPE); returns
  // their count (at most word.size()).
  size_t init_symbols(std::string_view word, uint32_t* sym, uint32_t* pos) const;
  void merge_small(std::string_view word, std::vector<TokenId>& out) const;
  void merge_large(std::string_view word, std::vector<TokenId>& out) const;

  uint32_t n_vocab_ = 0;
  // Symbols: ids below n_vocab_ are tokens; above are strings that merges produce but the vocabulary lacks
  // (possible only in odd vocabularies), which llama.cpp finally emits byte by byte.
  std::unordered_map<std::string, uint32_t> sym_of_text_;
  uint32_t n_symbols_ = 0;
  uint32_t byte_sym_[256] = {};         // symbol of each byte (raw BPE: of the one-byte character, or kNoSym)
  TokenId byte_token_[256] = {};        // token of each byte's single-character string (raw: <0xXX>), -1 if none
  std::vector<Merge> table_;            // open addressing, power-of-two size
  uint64_t mask_ = 0;
  bool ignore_merges_ = false;
  bool raw_ = false;                                         // VocabData::raw_bpe
  static constexpr uint32_t kNoSym = UINT32_MAX - 1;         // a raw character no merge or token knows
  std::unordered_map<std::string, TokenId> token_of_bytes_;  // raw bytes -> token, for ignore_merges
};

}  // namespace tessera::tok
