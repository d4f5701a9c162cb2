#include "runtime/tokenizer_bpe.h"

#include <algorithm>
#include <climits>
#include <queue>

#include "core/error.h"
#include "runtime/tokenizer_utf8.h"

namespace tessera::tok {

namespace {

// Words up to this many bytes merge with a flat scan over a rank array (no allocation, cache-friendly); longer
// ones (runs of repeated characters, long identifiers) use a heap so the cost stays O(n log n).
constexpr size_t kSmallWord = 64;

uint64_t pair_key(uint32_t l, uint32_t r) { return (uint64_t{l} << 32) | r; }

uint64_t hash_key(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  return k;
}

}  // namespace

uint32_t BpeModel::intern(const std::string& text) {
  auto [it, inserted] = sym_of_text_.try_emplace(text, n_symbols_);
  if (inserted) ++n_symbols_;
  return it->second;
}

void BpeModel::add_merge(uint32_t left, uint32_t right, int32_t rank, uint32_t result) {
  const uint64_t key = pair_key(left, right);
  for (uint64_t h = hash_key(key) & mask_;; h = (h + 1) & mask_) {
    Merge& m = table_[h];
    if (m.key == kEmpty) {
      m = {key, rank, result};
      return;
    }
    if (m.key == key) return;  // a repeated merge keeps its first (lowest) rank, as llama.cpp does
  }
}

const BpeModel::Merge* BpeModel::find_merge(uint32_t left, uint32_t right) const {
  const uint64_t key = pair_key(left, right);
  for (uint64_t h = hash_key(key) & mask_;; h = (h + 1) & mask_) {
    const Merge& m = table_[h];
    if (m.key == key) return &m;
    if (m.key == kEmpty) return nullptr;
  }
}

BpeModel::BpeModel(const VocabData& v) : n_vocab_(static_cast<uint32_t>(v.tokens.size())) {
  sym_of_text_.reserve(v.tokens.size() + v.merges.size() / 8 + 256);
  for (uint32_t id = 0; id < n_vocab_; ++id) sym_of_text_[v.tokens[id]] = id;  // a repeated text maps to its last id
  n_symbols_ = n_vocab_;
  raw_ = v.raw_bpe;
  for (int b = 0; b < 256; ++b) {
    if (raw_) {
      const auto one = sym_of_text_.find(std::string(1, static_cast<char>(b)));
      byte_sym_[b] = one != sym_of_text_.end() ? one->second : kNoSym;
      static constexpr char kHex[] = "0123456789ABCDEF";
      const auto tok = sym_of_text_.find(std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">");
      byte_token_[b] = tok != sym_of_text_.end() && tok->second < n_vocab_ ? static_cast<TokenId>(tok->second) : -1;
      continue;
    }
    std::string s;
    utf8_append(s, byte_to_codepoint(static_cast<uint8_t>(b)));
    byte_sym_[b] = intern(s);
    byte_token_[b] = byte_sym_[b] < n_vocab_ ? static_cast<TokenId>(byte_sym_[b]) : -1;
  }
  size_t cap = 16;
  while (cap < v.merges.size() * 2) cap *= 2;
  table_.assign(cap, Merge{kEmpty, 0, 0});
  mask_ = cap - 1;
  for (size_t i = 0; i < v.merges.size(); ++i) {
    const auto& [a, b] = v.merges[i];
    const uint32_t l = intern(a), r = intern(b), m = intern(a + b);
    add_merge(l, r, static_cast<int32_t>(i), m);
  }
  ignore_merges_ = v.ignore_merges;
  if (ignore_merges_) {
    for (uint32_t id = 0; id < n_vocab_; ++id) {
      const std::string& t = v.tokens[id];
      std::string raw;
      bool ok = true;
      for (size_t i = 0; i < t.size() && ok;) {
        const int len = utf8_sequence_length(reinterpret_cast<const uint8_t*>(t.data()) + i, t.size() - i);
        if (len <= 0) {
          ok = false;
          break;
        }
        const int byte = codepoint_to_byte(utf8_next(t, i));
        if (byte < 0) ok = false;
        raw.push_back(static_cast<char>(byte));
      }
      if (ok && !raw.empty()) token_of_bytes_[raw] = static_cast<TokenId>(id);
    }
  }
}

void BpeModel::emit(uint32_t sym, std::string_view bytes, std::vector<TokenId>& out) const {
  if (sym < n_vocab_) {
    out.push_back(static_cast<TokenId>(sym));
    return;
  }
  // A merge produced a string the vocabulary lacks: fall back to the single-byte tokens that exist.
  for (const char c : bytes) {
    const TokenId t = byte_token_[static_cast<uint8_t>(c)];
    if (t >= 0) out.push_back(t);
  }
}

size_t BpeModel::init_symbols(std::string_view word, uint32_t* sym, uint32_t* pos) const {
  if (!raw_) {
    for (size_t i = 0; i < word.size(); ++i) {
      sym[i] = byte_sym_[static_cast<uint8_t>(word[i])];
      pos[i] = static_cast<uint32_t>(i);
    }
    return word.size();
  }
  // One symbol per character, its length read from the lead byte alone, as llama.cpp does.
  size_t m = 0;
  for (size_t i = 0; i < word.size(); ++m) {
    const auto c = static_cast<uint8_t>(word[i]);
    const size_t len = std::min(word.size() - i, size_t{c < 0xC0 ? 1u : c < 0xE0 ? 2u : c < 0xF0 ? 3u : 4u});
    if (len == 1) {
      sym[m] = byte_sym_[c];
    } else {
      const auto it = sym_of_text_.find(std::string(word.substr(i, len)));
      sym[m] = it != sym_of_text_.end() ? it->second : kNoSym;
    }
    pos[m] = static_cast<uint32_t>(i);
    i += len;
  }
  return m;
}

void BpeModel::encode_word(std::string_view word, std::vector<TokenId>& out) const {
  if (word.empty()) return;
  if (raw_ && word.find_first_not_of('\n') == std::string_view::npos) {
    // A run of newlines that is one token stays one (llama.cpp's Gemma 4 rule), whatever the merges say.
    const auto it = sym_of_text_.find(std::string(word));
    if (it != sym_of_text_.end() && it->second < n_vocab_) {
      out.push_back(static_cast<TokenId>(it->second));
      return;
    }
  }
  if (ignore_merges_) {
    auto it = token_of_bytes_.find(std::string(word));
    if (it != token_of_bytes_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (word.size() <= kSmallWord) {
    merge_small(word, out);
  } else {
    merge_large(word, out);
  }
}

void BpeModel::merge_small(std::string_view word, std::vector<TokenId>& out) const {
  uint32_t sym[kSmallWord], pos[kSmallWord], res[kSmallWord];
  int32_t rank[kSmallWord];
  size_t m = init_symbols(word, sym, pos);
  auto set_rank = [&](size_t i) {  // pair (i, i+1)
    const Merge* mg = find_merge(sym[i], sym[i + 1]);
    rank[i] = mg != nullptr ? mg->rank : INT32_MAX;
    res[i] = mg != nullptr ? mg->result : 0;
  };
  for (size_t i = 0; i + 1 < m; ++i) set_rank(i);
  while (m > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < m; ++i) {
      if (rank[i] < rank[best]) best = i;  // strict: the leftmost of equal ranks wins
    }
    if (rank[best] == INT32_MAX) break;
    sym[best] = res[best];
    for (size_t i = best + 1; i + 1 < m; ++i) {
      sym[i] = sym[i + 1];
      pos[i] = pos[i + 1];
      rank[i] = rank[i + 1];
      res[i] = res[i + 1];
    }
    --m;
    if (best > 0) set_rank(best - 1);
    if (best + 1 < m) set_rank(best);
  }
  for (size_t i = 0; i < m; ++i) {
    const uint32_t end = i + 1 < m ? pos[i + 1] : static_cast<uint32_t>(word.size());
    emit(sym[i], word.substr(pos[i], end - pos[i]), out);
  }
}

void BpeModel::merge_large(std::string_view word, std::vector<TokenId>& out) const {
  std::vector<uint32_t> sym(word.size()), pos(word.size());
  const int n = static_cast<int>(init_symbols(word, sym.data(), pos.data()));
  std::vector<int> prev(n), next(n);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Cand {
    int32_t rank;
    int left, right;
    uint32_t lsym, rsym, result;
  };
  // Lowest rank first, then leftmost: the same order as the flat scan.
  auto worse = [](const Cand& a, const Cand& b) { return a.rank > b.rank || (a.rank == b.rank && a.left > b.left); };
  std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> heap(worse);
  auto push = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    const Merge* mg = find_merge(sym[l], sym[r]);
    if (mg != nullptr) heap.push({mg->rank, l, r, sym[l], sym[r], mg->result});
  };
  for (int i = 0; i + 1 < n; ++i) push(i, i + 1);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    // Stale entries: a side was merged away or grew since the candidate was pushed (a symbol at a position only
    // ever grows, so equal ids mean unchanged).
    if (sym[c.left] != c.lsym || sym[c.right] != c.rsym || next[c.left] != c.right) continue;
    sym[c.left] = c.result;
    sym[c.right] = UINT32_MAX;
    next[c.left] = next[c.right];
    if (next[c.right] >= 0) prev[next[c.right]] = c.left;
    push(prev[c.left], c.left);
    push(c.left, next[c.left]);
  }
  for (int i = 0; i >= 0 && i < n; i = next[i]) {
    const size_t end = next[i] >= 0 ? pos[static_cast<size_t>(next[i])] : word.size();
    emit(sym[i], word.substr(pos[static_cast<size_t>(i)], end - pos[static_cast<size_t>(i)]), out);
  }
}

}  // namespace tessera::tok
