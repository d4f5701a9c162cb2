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

// q5_0: w = d * (q - 16), q in 0..31: 4 low bits as q4_0's nibbles, bit 4 of element j in bit j of qh (little-endian).
struct BlockQ5_0 {
  uint16_t d;  // fp16 scale
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ5_0) == 2 + 4 + kQK / 2, "wrong q5_0 block size/padding");

// q5_1: w = d * q + m, q in 0..31; bits as q5_0's.
struct BlockQ5_1 {
  uint16_t d;  // fp16 scale
  uint16_t m;  // fp16 minimum
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ5_1) == 4 + 4 + kQK / 2, "wrong q5_1 block size/padding");

// q2_K: 16 sub-blocks of 16; 4-bit scale (low) and min (high) per sub-block; 2-bit q; w = d*sc*q - dmin*m.
struct BlockQ2_K {
  uint8_t scales[kQKK / 16];
  uint8_t qs[kQKK / 4];
  uint16_t d;     // fp16 super-block scale of the scales
  uint16_t dmin;  // fp16 super-block scale of the mins
};
static_assert(sizeof(BlockQ2_K) == kQKK / 16 + kQKK / 4 + 4, "wrong q2_K block size/padding");

// q3_K: 16 sub-blocks of 16; 2 low bits in qs, the high bit in hmask; 6-bit scales packed into 12 bytes;
// w = d * (sc - 32) * (q - 4 * !high).
struct BlockQ3_K {
  uint8_t hmask[kQKK / 8];
  uint8_t qs[kQKK / 4];
  uint8_t scales[12];
  uint16_t d;  // fp16
};
static_assert(sizeof(BlockQ3_K) == kQKK / 8 + kQKK / 4 + 12 + 2, "wrong q3_K block size/padding");

// q5_K: q4_K's scales and nibbles plus a fifth bit per element in qh; w = d*sc*q - dmin*m, q in 0..31.
struct BlockQ5_K {
  uint16_t d;     // fp16 super-block scale of the scales
  uint16_t dmin;  // fp16 super-block scale of the mins
  uint8_t scales[12];
  uint8_t qh[kQKK / 8];
  uint8_t qs[kQKK / 2];
};
static_assert(sizeof(BlockQ5_K) == 4 + 12 + kQKK / 8 + kQKK / 2, "wrong q5_K block size/padding");

// iq4_nl: w = d * kvalues_iq4nl[q], q in 0..15 (a fixed non-linear table of 16 int8 values); nibbles as q4_0's.
struct BlockIQ4_NL {
  uint16_t d;  // fp16 scale
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockIQ4_NL) == 2 + kQK / 2, "wrong iq4_nl block size/padding");

// iq4_xs: 8 sub-blocks of 32 with iq4_nl's table; 6-bit scales (4 low bits in scales_l, 2 high in scales_h), offset
// by 32; w = d * (sc - 32) * kvalues_iq4nl[q].
struct BlockIQ4_XS {
  uint16_t d;  // fp16
  uint16_t scales_h;
  uint8_t scales_l[kQKK / 64];
  uint8_t qs[kQKK / 2];
};
static_assert(sizeof(BlockIQ4_XS) == 4 + kQKK / 64 + kQKK / 2, "wrong iq4_xs block size/padding");

// tq1_0 (ternary, 1.69 bits per weight): w = d * (t - 1), t in 0..2. Five trits per byte of qs and four per byte of qh,
// each byte holding ceil(256 * v / 243) for the base-3 number v of its trits (first trit most significant), so trit n
// of byte q is ((uint8_t)(q * 3^n) * 3) >> 8. Elements 0..159: trit n of qs[m] (m < 32) is element 32 n + m;
// 160..239: trit n of qs[32 + m] (m < 16) is element 160 + 16 n + m; 240..255: trit n of qh[j] is 240 + 4 n + j.
struct BlockTQ1_0 {
  uint8_t qs[(kQKK - 4 * kQKK / 64) / 5];
  uint8_t qh[kQKK / 64];
  uint16_t d;  // fp16
};
static_assert(sizeof(BlockTQ1_0) == 48 + 4 + 2, "wrong tq1_0 block size/padding");

// tq2_0 (ternary, 2.06 bits per weight): w = d * (q - 1), q in 0..2 (the code 3, which no quantizer writes, reads
// as w = 2 d, as GGML does); per 128 elements, byte m (0..31) holds elements m, m + 32, m + 64, m + 96 in bits 0-1,
// 2-3, 4-5, 6-7 (q2_K's layout).
struct BlockTQ2_0 {
  uint8_t qs[kQKK / 4];
  uint16_t d;  // fp16
};
static_assert(sizeof(BlockTQ2_0) == kQKK / 4 + 2, "wrong tq2_0 block size/padding");

}  // namespace tessera
