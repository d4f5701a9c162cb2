// Tokenizer: special-token partitioning, dispatch to the BPE / SentencePiece engines, decoding and streaming.
#include "tessera/tokenizer.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <unordered_map>

#include "core/error.h"
#include "formats/gguf.h"
#include "runtime/tokenizer_bpe.h"
#include "runtime/tokenizer_pretokenize.h"
#include "runtime/tokenizer_spm.h"
#include "runtime/tokenizer_utf8.h"
#include "runtime/tokenizer_vocab.h"

namespace tessera {

using tok::TokenType;

struct Tokenizer::Impl {
  tok::VocabData v;
  tok::PreTokenizer pre;
  tok::BpeModel bpe;
  tok::SpmModel spm;
  std::vector<std::string> pieces;      // bytes of each token, control tokens rendered
  std::vector<uint8_t> control;         // control or unknown: rendered only on request
  std::vector<uint8_t> eog;             // ends generation
  std::vector<TokenId> specials;        // matched in the text before BPE, longest first
  TokenId eot = -1;
};

namespace {

// Texts llama.cpp treats as end-of-turn / end-of-generation whatever the token type says (data from the model
// conventions, in priority order for choosing the eot id).
constexpr const char* kEotTexts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                                     "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
                                     "<end_of_utterance>"};
// "</s>" is among them (llama.cpp 0.3.36), so Gemma 3's user-defined "</s>" is a control token that only
// special-token parsing matches; it stays a normal token where "<|tool_response>" or "<|plamo:eos|>" also ends
// generation (Gemma 4, PLaMo), as there.
constexpr const char* kEogTexts[] = {"<|eot_id|>",
                                     "<|im_end|>",
                                     "<|end|>",
                                     "<|return|>",
                                     "<|call|>",
                                     "<|flush|>",
                                     "<|calls|>",
                                     "<end_of_turn>",
                                     "<|endoftext|>",
                                     "</s>",
                                     "<|eom_id|>",
                                     "<EOT>",
                                     "_<EOT>",
                                     "[EOT]",
                                     "[EOS]",
                                     "<|end_of_text|>",
                                     "<end_of_utterance>",
                                     "<eos>",
                                     "<turn|>",
                                     "<|tool_response>",
                                     "<｜end▁of▁sentence｜>",
                                     "[e~["};

std::string byte_level_decode(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t start = i;
    const int len = tok::utf8_sequence_length(reinterpret_cast<const uint8_t*>(text.data()) + i, text.size() - i);
    if (len <= 0) {  // not UTF-8: keep the byte
      out.push_back(text[i++]);
      continue;
    }
    const int b = tok::codepoint_to_byte(tok::utf8_next(text, i));
    if (b >= 0) {
      out.push_back(static_cast<char>(b));
    } else {
      out.append(text, start, i - start);  // outside the byte alphabet: keep the character itself
    }
  }
  return out;
}

int parse_byte_token(const std::string& text) {  // "<0xAB>" -> 0xAB, else -1
  if (text.size() != 6 || text.compare(0, 3, "<0x") != 0 || text[5] != '>') return -1;
  int v = 0;
  for (int i = 3; i < 5; ++i) {
    const char c = text[i];
    v *= 16;
    if (c >= '0' && c <= '9') {
      v += c - '0';
    } else if (c >= 'A' && c <= 'F') {
      v += c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      v += c - 'a' + 10;
    } else {
      return -1;
    }
  }
  return v;
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size() + s.size() / 4);
  size_t i = 0;
  while (true) {
    const size_t j = s.find(from, i);
    if (j == std::string_view::npos) break;
    out.append(s.substr(i, j - i));
    out.append(to);
    i = j + from.size();
  }
  out.append(s.substr(i));
  return out;
}

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; }

struct Fragment {
  TokenId token;  // -1 for raw text
  uint32_t begin, end;
};

}  // namespace

namespace tok {

Tokenizer make_tokenizer(VocabData data) {
  auto impl = std::make_shared<Tokenizer::Impl>();
  impl->v = std::move(data);
  VocabData& v = impl->v;
  const size_t n = v.tokens.size();
  TESSERA_CHECK(n > 0, "{}: the tokenizer vocabulary is empty", v.source);
  TESSERA_CHECK(v.types.size() == n, "{}: {} token types for {} tokens", v.source, v.types.size(), n);
  v.lstrip.resize(n, 0);
  v.rstrip.resize(n, 0);
  for (TokenId* id : {&v.bos, &v.eos, &v.eot, &v.eom, &v.unk, &v.pad}) {
    if (*id >= static_cast<TokenId>(n)) *id = -1;  // out of range: treated as absent, as llama.cpp does
  }
  if (v.add_bos) TESSERA_CHECK(v.bos >= 0, "{}: the tokenizer asks for a BOS token but has none", v.source);
  if (v.add_eos) TESSERA_CHECK(v.eos >= 0, "{}: the tokenizer asks for an EOS token but has none", v.source);

  // End-of-turn and end-of-generation tokens by text; such tokens are forced to control type.
  std::unordered_map<std::string_view, TokenId> by_text;
  for (size_t id = 0; id < n; ++id) by_text[v.tokens[id]] = static_cast<TokenId>(id);
  impl->eot = v.eot;
  if (impl->eot < 0) {
    for (const char* t : kEotTexts) {
      auto it = by_text.find(t);
      if (it != by_text.end()) {
        impl->eot = it->second;
        break;
      }
    }
  }
  impl->eog.assign(n, 0);
  const bool normal_s = by_text.count("<|tool_response>") > 0 || by_text.count("<|plamo:eos|>") > 0;
  for (const char* t : kEogTexts) {
    auto it = by_text.find(t);
    if (it == by_text.end() || (normal_s && std::string_view(t) == "</s>")) continue;
    impl->eog[static_cast<size_t>(it->second)] = 1;
    v.types[static_cast<size_t>(it->second)] = TokenType::CONTROL;
  }
  for (TokenId id : {v.eos, impl->eot, v.eom}) {
    if (id >= 0) impl->eog[static_cast<size_t>(id)] = 1;
  }
  for (TokenId id : v.extra_eog) {
    if (id >= 0 && id < static_cast<TokenId>(n)) impl->eog[static_cast<size_t>(id)] = 1;
  }

  if (v.kind == VocabKind::BYTE_BPE) {
    if (!v.pre_explicit) v.pre_patterns = pre_patterns_for(v.pre, v.source);
    impl->pre = PreTokenizer(v.pre_patterns, v.source);
    impl->bpe = BpeModel(v);
  } else {
    impl->spm = SpmModel(v);
  }

  impl->pieces.resize(n);
  impl->control.assign(n, 0);
  for (size_t id = 0; id < n; ++id) {
    const std::string& t = v.tokens[id];
    const TokenType type = v.types[id];
    std::string& piece = impl->pieces[id];
    if (type == TokenType::CONTROL || type == TokenType::UNKNOWN) {
      impl->control[id] = 1;
      piece = t;
    } else if (type == TokenType::USER_DEFINED) {
      piece = t;
    } else if (type == TokenType::BYTE && parse_byte_token(t) >= 0) {
      piece.assign(1, static_cast<char>(parse_byte_token(t)));
    } else if (type == TokenType::NORMAL || type == TokenType::BYTE) {
      piece = v.kind == VocabKind::BYTE_BPE && !v.raw_bpe ? byte_level_decode(t) : replace_all(t, "\xE2\x96\x81", " ");
    }  // UNUSED and UNDEFINED tokens render as nothing, as in llama.cpp
    if (type == TokenType::CONTROL || type == TokenType::USER_DEFINED || type == TokenType::UNKNOWN) {
      if (!t.empty()) impl->specials.push_back(static_cast<TokenId>(id));
    }
  }
  // Longest text first, so that a special token containing another one wins (llama.cpp's order; ties by id).
  std::stable_sort(impl->specials.begin(), impl->specials.end(), [&](TokenId a, TokenId b) {
    return v.tokens[static_cast<size_t>(a)].size() > v.tokens[static_cast<size_t>(b)].size();
  });
  return Tokenizer(std::move(impl));
}

}  // namespace tok

Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

Tokenizer Tokenizer::from_model(const std::string& model_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p(model_path);
  if (fs::is_directory(p, ec)) {
    const fs::path tj = p / "tokenizer.json";
    TESSERA_CHECK(fs::exists(tj, ec), "{}: no tokenizer.json in this model directory", model_path);
    return tok::make_tokenizer(tok::vocab_from_tokenizer_json(tj.string()));
  }
  TESSERA_CHECK(fs::exists(p, ec), "{}: no such file", model_path);
  char magic[4] = {};
  {
    std::ifstream f(model_path, std::ios::binary);
    f.read(magic, 4);
  }
  if (std::memcmp(magic, "GGUF", 4) == 0) {
    const gguf::File file = gguf::File::open(model_path);
    return tok::make_tokenizer(tok::vocab_from_gguf(file));
  }
  const std::string fname = p.filename().string();
  if (fname.size() >= 14 && fname.compare(fname.size() - 14, 14, "tokenizer.json") == 0) {
    return tok::make_tokenizer(tok::vocab_from_tokenizer_json(model_path));
  }
  const fs::path tj = p.parent_path() / "tokenizer.json";
  TESSERA_CHECK(fs::exists(tj, ec), "{}: not a GGUF file, and there is no tokenizer.json beside it", model_path);
  return tok::make_tokenizer(tok::vocab_from_tokenizer_json(tj.string()));
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  const Impl& m = *impl_;
  const tok::VocabData& v = m.v;
  std::vector<TokenId> out;

  // 1. Special tokens, one at a time in priority order, split every raw fragment at each occurrence.
  std::vector<Fragment> frags, next;
  if (!text.empty()) frags.push_back({-1, 0, static_cast<uint32_t>(text.size())});
  for (const TokenId id : m.specials) {
    if (!parse_special && v.types[static_cast<size_t>(id)] != TokenType::USER_DEFINED) continue;
    const std::string& st = v.tokens[static_cast<size_t>(id)];
    if (text.find(st) == std::string_view::npos) continue;
    next.clear();
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      uint32_t b = f.begin;
      const uint32_t e = f.end;
      while (b < e) {
        const size_t at = text.substr(0, e).find(st, b);
        if (at == std::string_view::npos) break;
        uint32_t left_end = static_cast<uint32_t>(at);
        if (v.lstrip[static_cast<size_t>(id)]) {
          while (left_end > b && is_ascii_space(text[left_end - 1])) --left_end;
        }
        if (left_end > b) next.push_back({-1, b, left_end});
        next.push_back({id, 0, 0});
        b = static_cast<uint32_t>(at + st.size());
        if (v.rstrip[static_cast<size_t>(id)]) {
          while (b < e && is_ascii_space(text[b])) ++b;
        }
      }
      if (b < e) next.push_back({-1, b, e});
    }
    frags.swap(next);
  }

  // 2. Model-specific encoding of the raw fragments.
  if (add_special && v.add_bos) out.push_back(v.bos);
  if (v.kind == tok::VocabKind::SPM) {
    bool prev_special = true;  // a space prefix goes before the first fragment and after each special token
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        out.push_back(f.token);
        prev_special = true;
        continue;
      }
      std::string piece;
      if (v.add_space_prefix && prev_special) piece = " ";
      piece.append(text.substr(f.begin, f.end - f.begin));
      m.spm.encode(replace_all(piece, " ", "\xE2\x96\x81"), out);
      prev_special = false;
    }
  } else {
    std::vector<tok::Span> words;
    // Repeated words (most of prose) are encoded once per call: their ids are copied from the first encoding.
    std::unordered_map<std::string_view, std::pair<uint32_t, uint32_t>> cache;
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        out.push_back(f.token);
        continue;
      }
      std::string_view raw = text.substr(f.begin, f.end - f.begin);
      std::string clean;
      if (!tok::utf8_is_valid(raw)) {
        clean = tok::utf8_sanitize(raw);
        raw = clean;
      }
      if (v.raw_bpe && raw.find(' ') != std::string_view::npos) {
        clean = replace_all(raw, " ", "\xE2\x96\x81");  // SentencePiece's space, before the split
        raw = clean;
      }
      m.pre.split(raw, words);
      for (const tok::Span w : words) {
        const std::string_view word = raw.substr(w.begin, w.end - w.begin);
        if (word.size() > 32 || !clean.empty()) {
          m.bpe.encode_word(word, out);
          continue;
        }
        auto [it, inserted] = cache.try_emplace(word, 0, 0);
        if (!inserted) {
          const size_t start = it->second.first;
          for (uint32_t k = 0; k < it->second.second; ++k) {
            const TokenId t = out[start + k];
            out.push_back(t);
          }
          continue;
        }
        const size_t start = out.size();
        m.bpe.encode_word(word, out);
        it->second = {static_cast<uint32_t>(start), static_cast<uint32_t>(out.size() - start)};
      }
    }
  }
  if (add_special && v.add_eos) out.push_back(v.eos);
  return out;
}

std::string Tokenizer::token_to_piece(TokenId id, bool render_special) const {
  TESSERA_CHECK(id >= 0 && id < n_vocab(), "token id {} is outside the vocabulary [0, {})", id, n_vocab());
  if (!render_special && impl_->control[static_cast<size_t>(id)]) return {};
  return impl_->pieces[static_cast<size_t>(id)];
}

std::string Tokenizer::decode(const std::vector<TokenId>& ids, bool render_special) const {
  std::string out;
  bool at_start = impl_->v.kind == tok::VocabKind::SPM && impl_->v.add_space_prefix;
  for (const TokenId id : ids) {
    std::string piece = token_to_piece(id, render_special);
    // The space encode() put before the first word is not part of the text (only that one space).
    if (at_start && !piece.empty()) {
      if (piece[0] == ' ' && !impl_->control[static_cast<size_t>(id)]) piece.erase(0, 1);
      at_start = false;
    }
    out += piece;
  }
  return out;
}

const std::string& Tokenizer::token_text(TokenId id) const {
  TESSERA_CHECK(id >= 0 && id < n_vocab(), "token id {} is outside the vocabulary [0, {})", id, n_vocab());
  return impl_->v.tokens[static_cast<size_t>(id)];
}

int32_t Tokenizer::n_vocab() const { return static_cast<int32_t>(impl_->v.tokens.size()); }
TokenId Tokenizer::bos_id() const { return impl_->v.bos; }
TokenId Tokenizer::eos_id() const { return impl_->v.eos; }
TokenId Tokenizer::eot_id() const { return impl_->eot; }
bool Tokenizer::add_bos() const { return impl_->v.add_bos; }
bool Tokenizer::add_eos() const { return impl_->v.add_eos; }
bool Tokenizer::is_eog(TokenId id) const { return id >= 0 && id < n_vocab() && impl_->eog[static_cast<size_t>(id)]; }
bool Tokenizer::is_control(TokenId id) const {
  return id >= 0 && id < n_vocab() && impl_->control[static_cast<size_t>(id)];
}
std::string Tokenizer::kind() const { return impl_->v.kind_name; }
std::string Tokenizer::pre_type() const { return impl_->v.pre; }
const std::string& Tokenizer::chat_template() const { return impl_->v.chat_template; }

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool render_special)
    : tokenizer_(&tokenizer), render_special_(render_special) {}

std::string StreamDecoder::push(TokenId id) {
  std::string piece = tokenizer_->token_to_piece(id, render_special_);
  const auto& impl = tokenizer_->impl();
  if (first_ && !piece.empty()) {
    if (impl.v.kind == tok::VocabKind::SPM && impl.v.add_space_prefix && piece[0] == ' ' && !tokenizer_->is_control(id)) {
      piece.erase(0, 1);
    }
    first_ = false;
  }
  pending_ += piece;
  // Emit every complete character; hold back a trailing valid-but-incomplete sequence; invalid bytes -> U+FFFD.
  std::string out;
  const auto* p = reinterpret_cast<const uint8_t*>(pending_.data());
  size_t i = 0;
  while (i < pending_.size()) {
    const int len = tok::utf8_sequence_length(p + i, pending_.size() - i);
    if (len > 0) {
      out.append(pending_, i, static_cast<size_t>(len));
      i += static_cast<size_t>(len);
    } else if (len < 0) {
      break;  // incomplete: wait for more bytes
    } else {
      out.append("\xEF\xBF\xBD");
      ++i;
    }
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = tok::utf8_sanitize(pending_);
  pending_.clear();
  first_ = true;
  return out;
}

}  // namespace tessera
