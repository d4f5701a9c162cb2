#include "runtime/tokenizer_pretokenize.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <fmt/core.h>

#include "core/error.h"

namespace tessera::tok {

namespace {

// Patterns are compiled once and shared; JIT needs a private stack per thread (long whitespace runs backtrack
// deeply under \s+(?!\S)), so each thread keeps one JIT stack and match-data block for all patterns.
struct ThreadMatchState {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* ctx = nullptr;
  pcre2_jit_stack* stack = nullptr;
  ThreadMatchState() {
    md = pcre2_match_data_create(1, nullptr);
    ctx = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    if (ctx != nullptr && stack != nullptr) pcre2_jit_stack_assign(ctx, nullptr, stack);
  }
  ~ThreadMatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(ctx);
    pcre2_match_data_free(md);
  }
  ThreadMatchState(const ThreadMatchState&) = delete;
  ThreadMatchState& operator=(const ThreadMatchState&) = delete;
};

ThreadMatchState& match_state() {
  thread_local ThreadMatchState state;
  if (state.md == nullptr || state.ctx == nullptr) tessera::fail("tokenizer: out of memory creating PCRE2 match data");
  return state;
}

}  // namespace

struct PreTokenizer::Pattern {
  pcre2_code* code = nullptr;
  std::string source;
  bool jit = false;
  ~Pattern() { pcre2_code_free(code); }
};

PreTokenizer::PreTokenizer(const std::vector<std::string>& patterns, const std::string& source) {
  for (const auto& p : patterns) {
    auto pat = std::make_shared<Pattern>();
    pat->source = p;
    int err = 0;
    PCRE2_SIZE err_off = 0;
    pat->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(), PCRE2_UTF | PCRE2_UCP, &err, &err_off,
                              nullptr);
    if (pat->code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      tessera::fail("{}: pre-tokenizer regex '{}' does not compile at offset {}: {}", source, p, err_off,
                    reinterpret_cast<const char*>(msg));
    }
    pat->jit = pcre2_jit_compile(pat->code, PCRE2_JIT_COMPLETE) == 0;
    patterns_.push_back(std::move(pat));
  }
}

void PreTokenizer::split(std::string_view text, std::vector<Span>& words) const {
  words.clear();
  if (text.empty()) return;
  words.push_back({0, static_cast<uint32_t>(text.size())});
  if (patterns_.empty()) return;
  ThreadMatchState& st = match_state();
  std::vector<Span> next;
  for (const auto& pat : patterns_) {
    next.clear();
    next.reserve(words.size() * 2);
    for (const Span piece : words) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + piece.begin);
      const PCRE2_SIZE len = piece.end - piece.begin;
      PCRE2_SIZE pos = 0, prev = 0;
      while (pos < len) {
        const int rc = pcre2_match(pat->code, subject, len, pos, PCRE2_NO_UTF_CHECK, st.md, st.ctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          PCRE2_UCHAR msg[256];
          pcre2_get_error_message(rc, msg, sizeof(msg));
          tessera::fail("tokenizer: pre-tokenizer regex '{}' failed on a {}-byte piece: {}", pat->source, len,
                        reinterpret_cast<const char*>(msg));
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.md);
        const PCRE2_SIZE ms = ov[0], me = ov[1];
        if (me == ms) {
          // An empty match splits nothing; step over one character (UTF-8 lead byte to lead byte).
          pos = ms + 1;
          while (pos < len && (subject[pos] & 0xC0) == 0x80) ++pos;
          continue;
        }
        if (ms > prev) next.push_back({piece.begin + static_cast<uint32_t>(prev), piece.begin + static_cast<uint32_t>(ms)});
        next.push_back({piece.begin + static_cast<uint32_t>(ms), piece.begin + static_cast<uint32_t>(me)});
        prev = pos = me;
      }
      if (prev < len) next.push_back({piece.begin + static_cast<uint32_t>(prev), piece.end});
    }
    words.swap(next);
  }
}

std::string adapt_whitespace(std::string_view p) {
  // PCRE2 10.42 counts U+180E (a format character since Unicode 6.3) as \s; llama.cpp and Oniguruma do not.
  static constexpr std::string_view kSpace = "[^\\S\\x{180E}]";
  static constexpr std::string_view kNonSpace = "[\\S\\x{180E}]";
  std::string out;
  out.reserve(p.size() + 32);
  size_t i = 0;
  auto skip_escape = [&](size_t j) {  // j at '\\'; returns index one past the escape
    if (j + 1 >= p.size()) return p.size();
    const char c = p[j + 1];
    if ((c == 'p' || c == 'P' || c == 'x') && j + 2 < p.size() && p[j + 2] == '{') {
      const size_t close = p.find('}', j + 3);
      return close == std::string_view::npos ? p.size() : close + 1;
    }
    return j + 2;
  };
  while (i < p.size()) {
    const char c = p[i];
    if (c == '\\') {
      const size_t e = skip_escape(i);
      if (e == i + 2 && p[i + 1] == 's') {
        out += kSpace;
      } else if (e == i + 2 && p[i + 1] == 'S') {
        out += kNonSpace;
      } else {
        out.append(p.substr(i, e - i));
      }
      i = e;
      continue;
    }
    if (c != '[') {
      out.push_back(c);
      ++i;
      continue;
    }
    // A character class: find its end, noting \s / \S items and negation.
    size_t j = i + 1;
    const bool negated = j < p.size() && p[j] == '^';
    if (negated) ++j;
    if (j < p.size() && p[j] == ']') ++j;  // a leading ']' is a literal
    bool has_s = false, has_S = false;
    while (j < p.size() && p[j] != ']') {
      if (p[j] == '\\') {
        const size_t e = skip_escape(j);
        if (e == j + 2 && p[j + 1] == 's') has_s = true;
        if (e == j + 2 && p[j + 1] == 'S') has_S = true;
        j = e;
      } else if (p[j] == '[' && j + 1 < p.size() && p[j + 1] == ':') {
        const size_t close = p.find(":]", j + 2);
        j = close == std::string_view::npos ? p.size() : close + 2;
      } else {
        ++j;
      }
    }
    const size_t end = j < p.size() ? j + 1 : p.size();
    const std::string_view cls = p.substr(i, end - i);
    i = end;
    // Whether U+180E is an item of the class for PCRE2 (via \s) and for the peers (via \S).
    const bool pcre_item = has_s, peer_item = has_S;
    const bool pcre_match = negated ? !pcre_item : pcre_item;
    const bool peer_match = negated ? !peer_item : peer_item;
    if (has_s && has_S) {
      out.append(cls);  // both include every character
    } else if (pcre_match == peer_match) {
      out.append(cls);
    } else if (peer_match) {
      out += "(?:\\x{180E}|";
      out.append(cls);
      out += ")";
    } else {
      out += "(?:(?!\\x{180E})";
      out.append(cls);
      out += ")";
    }
  }
  return out;
}

}  // namespace tessera::tok
