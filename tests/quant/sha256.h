// SHA-256 (FIPS 180-4), small and self-contained: the golden files store hashes of large dequantized tensors instead
// of the tensors themselves, and the test must not depend on any other hashing library.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace tessera::test {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  // Lower-case hex digest; the object must not be updated afterwards.
  std::string hex_digest();

 private:
  void compress(const uint8_t* block);  // block: [64] bytes
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_{};
  size_t buf_len_ = 0;
  uint64_t total_bytes_ = 0;
};

std::string sha256_hex(const void* data, size_t n);

}  // namespace tessera::test
