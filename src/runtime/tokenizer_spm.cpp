#include "runtime/tokenizer_spm.h"

#include <fmt/core.h>

#include <queue>

#include "core/error.h"
#include "runtime/tokenizer_utf8.h"

namespace tessera::tok {

SpmModel::SpmModel(const VocabData& v) : scores_(v.scores), unk_(v.unk) {
  token_of_text_.reserve(v.tokens.size());
  for (size_t id = 0; id < v.tokens.size(); ++id) token_of_text_[v.tokens[id]] = static_cast<TokenId>(id);
  scores_.resize(v.tokens.size(), 0.0f);
  for (int b = 0; b < 256; ++b) {
    const std::string hex = fmt::format("<0x{:02X}>", b);
    auto it = token_of_text_.find(hex);
    byte_token_[b] = it != token_of_text_.end() ? it->second : -1;
  }
}

TokenId SpmModel::find(std::string_view s) const {
  auto it = token_of_text_.find(s);
  return it == token_of_text_.end() ? -1 : it->second;
}

void SpmModel::encode(std::string_view text, std::vector<TokenId>& out) const {
  if (text.empty()) return;
  struct Sym {
    uint32_t off, len;
    int prev, next;
  };
  std::vector<Sym> syms;
  syms.reserve(text.size());
  for (size_t off = 0; off < text.size();) {
    // One symbol per well-formed character; each byte of an ill-formed sequence is its own symbol and so becomes
    // its own <0xXX> token. (llama.cpp sizes symbols by the lead byte alone, which can swallow the next
    // characters into byte tokens; for valid UTF-8 both agree.)
    const int seq = utf8_sequence_length(reinterpret_cast<const uint8_t*>(text.data()) + off, text.size() - off);
    const size_t len = seq > 0 ? static_cast<size_t>(seq) : 1;
    const int idx = static_cast<int>(syms.size());
    syms.push_back({static_cast<uint32_t>(off), static_cast<uint32_t>(len), idx - 1,
                    off + len == text.size() ? -1 : idx + 1});
    off += len;
  }
  struct Cand {
    float score;
    int left, right;
    uint32_t size;
  };
  // Highest score first, then leftmost.
  auto worse = [](const Cand& a, const Cand& b) { return a.score < b.score || (a.score == b.score && a.left > b.left); };
  std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> heap(worse);
  auto push = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    const TokenId t = find(text.substr(syms[l].off, syms[l].len + syms[r].len));
    if (t >= 0) heap.push({scores_[static_cast<size_t>(t)], l, r, syms[l].len + syms[r].len});
  };
  for (int i = 0; i + 1 < static_cast<int>(syms.size()); ++i) push(i, i + 1);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Sym& l = syms[c.left];
    Sym& r = syms[c.right];
    // Symbols only grow, so an unchanged total size means neither side was merged since the push.
    if (l.len == 0 || r.len == 0 || l.len + r.len != c.size) continue;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = c.left;
    push(l.prev, c.left);
    push(c.left, l.next);
  }
  for (int i = 0; i >= 0; i = syms[i].next) {
    const std::string_view piece = text.substr(syms[i].off, syms[i].len);
    const TokenId t = find(piece);
    if (t >= 0) {
      out.push_back(t);
      continue;
    }
    for (const char ch : piece) {
      const TokenId b = byte_token_[static_cast<uint8_t>(ch)];
      if (b >= 0) {
        out.push_back(b);
      } else if (unk_ >= 0) {
        out.push_back(unk_);
      } else {
        tessera::fail("tokenizer: the vocabulary has neither a <0x{:02X}> byte token nor an unknown token for a "
                      "character outside it", static_cast<uint8_t>(ch));
      }
    }
  }
}

}  // namespace tessera::tok
