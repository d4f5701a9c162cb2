// Packed quantization blocks, byte-compatible with GGUF/GGML. A block holds `block_size` weights of one row.
#pragma once

#include <cstdint>

namespace tessera {

constexpr int kQK = 32;    // elements per block of the legacy formats
constexpr int kQKK = 256;  // elements per super-block of the K-quants

// q4_0: w = d * (q - 8), q in 0..15. Low nibbles hold elements 0..15, high nibbles 16..31.
struct BlockQ4_0 {
  uint16_t d;  // fp16 scale
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ4_0) == 2 + kQK / 2, "wrong q4_0 block size/padding");

// q4_1: w = d * q + m, q in 0..15; same nibble order as q4_0.
struct BlockQ4_1 {
  uint16_t d;  // fp16 scale
  uint16_t m;  // fp16 minimum
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ4_1) == 4 + kQK / 2, "wrong q4_1 block size/padding");

// q8_0: w = d * q, q in -127..127.
struct BlockQ8_0 {
  uint16_t d;  // fp16 scale
  int8_t qs[kQK];
};
static_assert(sizeof(BlockQ8_0) == 2 + kQK, "wrong q8_0 block size/padding");

// q4_K: 8 sub-blocks of 32; 6-bit scale and min per sub-block packed into 12 bytes; w = d*sc*q - dmin*m.
struct BlockQ4_K {
  uint16_t d;     // fp16 super-block scale of the scales
  uint16_t dmin;  // fp16 super-block scale of the mins
  uint8_t scales[12];
  uint8_t qs[kQKK / 2];
};
static_assert(sizeof(BlockQ4_K) == 4 + 12 + kQKK / 2, "wrong q4_K block size/padding");

// q6_K: 16 sub-blocks of 16; 6-bit q = 4 low bits (ql) + 2 high bits (qh), int8 scale per sub-block; w = d*sc*(q-32).
struct BlockQ6_K {
  uint8_t ql[kQKK / 2];
  uint8_t qh[kQKK / 4];
  int8_t scales[kQKK / 16];
  uint16_t d;  // fp16
};
static_assert(sizeof(BlockQ6_K) == kQKK / 2 + kQKK / 4 + kQKK / 16 + 2, "wrong q6_K block size/padding");

}  // namespace tessera
