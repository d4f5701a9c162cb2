// Helpers shared by the tokenizer tests: golden files store token ids packed as base64 of little-endian uint16
// (python/make_tokenizer_golden.py pack(); uint32 for larger vocabularies), about a third of their size as JSON
// arrays.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tessera/tokenizer.h"
#include "test_util.h"

namespace tessera::test {

// width: bytes per id (2, or 4 for vocabularies above 65536: python/make_tokenizer_golden.py pack32()).
inline std::vector<TokenId> unpack_ids(const std::string& b64, int width = 2) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::vector<uint8_t> bytes;
  uint32_t acc = 0;
  int bits = 0;
  for (const char c : b64) {
    if (c == '=') break;
    const int v = value(c);
    if (v < 0) throw std::runtime_error("bad base64 in golden file");
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      bytes.push_back(static_cast<uint8_t>(acc >> bits));
    }
  }
  std::vector<TokenId> ids(bytes.size() / static_cast<size_t>(width));
  for (size_t i = 0; i < ids.size(); ++i) {
    uint32_t v = 0;
    for (int b = width - 1; b >= 0; --b) v = (v << 8) | bytes[i * static_cast<size_t>(width) + static_cast<size_t>(b)];
    ids[i] = static_cast<TokenId>(v);
  }
  return ids;
}

inline nlohmann::json load_tokenizer_json(const std::string& rel) {
  std::ifstream f(data_path(rel), std::ios::binary);
  if (!f.good()) throw std::runtime_error("missing test data " + rel);
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

}  // namespace tessera::test
