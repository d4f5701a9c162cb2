// UTF-8 helpers for the tokenizer: strict well-formedness (Unicode Table 3-7: no overlongs, no surrogates, nothing
// above U+10FFFF) and the byte-level BPE alphabet.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessera::tok {

// Length of the well-formed UTF-8 sequence starting at p[0] (1..4), 0 when it is ill-formed, or -k when the n
// available bytes are a valid but incomplete prefix that needs k more bytes.
inline int utf8_sequence_length(const uint8_t* p, size_t n) {
  const uint8_t c = p[0];
  if (c < 0x80) return 1;
  int len;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;  // overlong
    if (c == 0xED) hi = 0x9F;  // surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;  // overlong
    if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return 0;
  }
  for (int i = 1; i < len; ++i) {
    if (static_cast<size_t>(i) >= n) return -(len - i);
    const uint8_t b = p[i];
    if (i == 1 ? (b < lo || b > hi) : (b & 0xC0) != 0x80) return 0;
  }
  return len;
}

inline bool utf8_is_valid(std::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  size_t i = 0;
  while (i < s.size()) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    const int len = utf8_sequence_length(p + i, s.size() - i);
    if (len <= 0) return false;
    i += static_cast<size_t>(len);
  }
  return true;
}

// Copy of `s` with every byte that is not part of a well-formed sequence replaced by U+FFFD.
inline std::string utf8_sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 16);
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  size_t i = 0;
  while (i < s.size()) {
    const int len = utf8_sequence_length(p + i, s.size() - i);
    if (len > 0) {
      out.append(s.data() + i, static_cast<size_t>(len));
      i += static_cast<size_t>(len);
    } else {
      out.append("\xEF\xBF\xBD");
      ++i;
    }
  }
  return out;
}

inline void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// GPT-2's byte-level alphabet: bytes that are printable Latin-1 ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) stand
// for themselves; the other 68 bytes map, in order, to U+0100 upwards, so every byte is one visible character.
inline uint32_t byte_to_codepoint(uint8_t b) {
  const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  if (printable) return b;
  // Count the non-printable bytes below b: 0x00..0x20 (33), 0x7F..0xA0 (34), 0xAD (1).
  uint32_t rank;
  if (b <= 0x20) {
    rank = b;
  } else if (b <= 0xA0) {
    rank = 33 + (b - 0x7F);
  } else {
    rank = 67;  // 0xAD
  }
  return 0x100 + rank;
}

// Inverse of byte_to_codepoint: -1 for a code point outside the alphabet.
inline int codepoint_to_byte(uint32_t cp) {
  if (cp < 0x100) {
    const auto b = static_cast<uint8_t>(cp);
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    return printable ? b : -1;
  }
  if (cp < 0x100 + 33) return static_cast<int>(cp - 0x100);
  if (cp < 0x100 + 67) return static_cast<int>(0x7F + (cp - 0x100 - 33));
  if (cp == 0x100 + 67) return 0xAD;
  return -1;
}

// Decodes one well-formed code point at s[i] (caller guarantees validity), advancing i.
inline uint32_t utf8_next(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const uint8_t c = p[i];
  if (c < 0x80) {
    ++i;
    return c;
  }
  if (c < 0xE0) {
    const uint32_t cp = ((c & 0x1Fu) << 6) | (p[i + 1] & 0x3Fu);
    i += 2;
    return cp;
  }
  if (c < 0xF0) {
    const uint32_t cp = ((c & 0x0Fu) << 12) | ((p[i + 1] & 0x3Fu) << 6) | (p[i + 2] & 0x3Fu);
    i += 3;
    return cp;
  }
  const uint32_t cp = ((c & 0x07u) << 18) | ((p[i + 1] & 0x3Fu) << 12) | ((p[i + 2] & 0x3Fu) << 6) | (p[i + 3] & 0x3Fu);
  i += 4;
  return cp;
}

}  // namespace tessera::tok
