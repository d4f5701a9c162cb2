// Pre-tokenization: regex splitting of text into words before BPE, through PCRE2 (UTF + UCP, JIT-compiled once).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::tok {

// A word: byte range [begin, end) of the text.
struct Span {
  uint32_t begin;
  uint32_t end;
};

class PreTokenizer {
 public:
  PreTokenizer() = default;
  // Compiles the patterns (Error naming `source` and the pattern when one does not compile).
  PreTokenizer(const std::vector<std::string>& patterns, const std::string& source);

  // Splits valid UTF-8 `text` into words. Each pattern in turn splits every piece left by the previous one into
  // its matches and the gaps between matches (llama.cpp's regex sequence, Hugging Face's Split "Isolated"); a
  // match's lookahead does not see past its piece. With no patterns the whole text is one word.
  void split(std::string_view text, std::vector<Span>& words) const;

  bool empty() const { return patterns_.empty(); }

 private:
  struct Pattern;
  std::vector<std::shared_ptr<const Pattern>> patterns_;
};

// Rewrites \s and \S in a pattern (outside and inside character classes) so that whitespace is the Unicode
// White_Space set used by llama.cpp and by Hugging Face (Oniguruma): PCRE2 10.42 also counts U+180E as a space.
std::string adapt_whitespace(std::string_view pattern);

}  // namespace tessera::tok
