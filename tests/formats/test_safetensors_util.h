// Helpers shared by the safetensors tests: golden data, checksums, temporary directories, buffer builders.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessera/error.h"
#include "test_util.h"

namespace tessera::test {

// Same FNV-1a 64 as python/make_tiny_hf_model.py.
inline uint64_t fnv1a64(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  uint64_t h = 0xCBF29CE484222325ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= b[i];
    h *= 0x100000001B3ull;
  }
  return h;
}

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

inline void write_text(const std::string& path, const std::string& s) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << s;
}

inline nlohmann::json load_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

inline nlohmann::json hf_golden() { return load_json(data_path("hf/golden.json")); }

// A safetensors buffer: u64 little-endian header length, the header text, `data_bytes` bytes of data (0, 1, 2, ...).
inline std::vector<uint8_t> make_safetensors(const std::string& header, size_t data_bytes) {
  const uint64_t n = header.size();
  std::vector<uint8_t> b(8 + n + data_bytes);
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(n >> (8 * i));
  for (size_t i = 0; i < n; ++i) b[8 + i] = static_cast<uint8_t>(header[i]);
  for (size_t i = 0; i < data_bytes; ++i) b[8 + n + i] = static_cast<uint8_t>(i);
  return b;
}

// A fresh directory under the system temp dir, removed with its contents when the object dies.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tessera-st-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& rel) const { return (path_ / rel).string(); }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

// Copies every file of tests/data/hf/<model> into `dir`.
inline void copy_model(const std::string& model, const TempDir& dir) {
  for (const auto& e : std::filesystem::directory_iterator(data_path("hf/" + model)))
    std::filesystem::copy_file(e.path(), dir / e.path().filename().string());
}

}  // namespace tessera::test

// `stmt` must throw tessera::Error whose message contains `substr` (any other exception fails the test too).
#define EXPECT_ERROR_HAS(stmt, substr)                                                               \
  do {                                                                                               \
    try {                                                                                            \
      stmt;                                                                                          \
      ADD_FAILURE() << "no tessera::Error thrown; expected one containing: " << (substr);            \
    } catch (const ::tessera::Error& e_) {                                                           \
      EXPECT_NE(std::string(e_.what()).find(substr), std::string::npos) << "message: " << e_.what(); \
    }                                                                                                \
  } while (0)
