// The tile GEMM's q5_0, q5_1, iq4_nl (32-value blocks) and iq4_xs (gemm_quant_tile.h has the contract and q4_K's,
// whose lane layout all four follow).
//
// A step (64 values) of a 32-block format is blocks 2s and 2s + 1 of the row: their 16 + 16 quant bytes are 32
// consecutive, 32-byte aligned bytes of quants, the image's [0, 32). Value l of a block (0..31) is the low nibble of
// its quant byte l for l < 16, the high nibble of byte l - 16 for l >= 16, so slices j = 0, 1 are the first block's
// low and high nibbles and j = 2, 3 the second block's, and lane c takes bytes 2c, 2c + 1, 2c + 8, 2c + 9 of each
// block's 16 (q4_K's gather). iq4_xs's step s % 4 = sub is sub-blocks 2 sub and 2 sub + 1 of its super-block, qs
// bytes [32 sub, + 32) laid out the same way.
//
// Images (K is a multiple of 64, so every row has an even number of 32-blocks and so has the weight: nb is even):
//  - q5_0 [48 B]: qs [0, 32), the two fp16 d [32, 36), the two blocks' qh [36, 40), [40, 44). Both d are 4 bytes at
//    scales byte 2 b0 (b0 = 2s + row's first block: even); each qh is 4 bytes at nb * 2 + 4 b: 4-byte aligned, but
//    the pair is 8-byte aligned only where nb % 4 == 0, so they come as two 4-byte pieces (5 pieces).
//  - q5_1 [48 B]: qs [0, 32), (d, m) of both blocks [32, 40) (8 bytes at 4 b0), both qh [40, 48) (8 bytes at
//    nb * 4 + 4 b0: 8-byte aligned as nb and b0 are even) (4 pieces).
//  - iq4_nl [48 B]: qs [0, 32), both fp16 d [32, 36) (3 pieces).
//  - iq4_xs [48 B]: qs [0, 32), the super-block's 8-byte head (fp16 d, scales_h, scales_l[4]) [32, 40) (3 pieces;
//    each of the super-block's four steps re-reads the head, from L2).
// 48 bytes: rows 12 banks apart, so the 8 rows a warp reads at once fall in distinct banks.
//
// Values, each formed as Format<D>::dequantize forms it and rounded once to bf16:
//  - q5_0 / q5_1: the 5-bit code q (nibble | qh bit l << 4) goes into 128.0f's mantissa by a byte permute (128 + q,
//    exact, codes4's way); q5_0: (128 + q - 144) d = (q - 16) d; q5_1: ((128 + q) - 128) d, then + m (two roundings).
//  - iq4_nl / iq4_xs: four codes into their table values in three byte permutes (quant_units.h's iq4nl_lookup4, with
//    a table biased by 128, so the value v comes as the byte v + 128 = u); u goes into the low byte of 2^23
//    (0x4B000000: the float 2^23 + u, exact) and 2^23 + 128 comes off: v, exact. iq4_nl: v d; iq4_xs: dl v with
//    dl = d (ls - 32) (exact: 11 by 6 bits), one dl per sub-block.
#pragma once

#include <cstdint>

#include "backends/cuda/kernels/gemm_quant_tile.h"
#include "backends/cuda/kernels/quant_units.h"
#include "backends/cuda/split_layout.h"
#include "quant/format_traits.h"

namespace tessera::cuda::detail {
namespace blocks_tile {

static_assert(SplitLayout<DType::Q5_0>::kQuantBytes == 16 && SplitLayout<DType::Q5_0>::kScaleBytes == 2 &&
              SplitLayout<DType::Q5_0>::kTailBytes == 4);
static_assert(SplitLayout<DType::Q5_1>::kQuantBytes == 16 && SplitLayout<DType::Q5_1>::kScaleBytes == 4 &&
              SplitLayout<DType::Q5_1>::kTailBytes == 4);
static_assert(SplitLayout<DType::IQ4_NL>::kQuantBytes == 16 && SplitLayout<DType::IQ4_NL>::kScaleBytes == 2);
static_assert(SplitLayout<DType::IQ4_XS>::kQuantBytes == 128 && SplitLayout<DType::IQ4_XS>::kScaleBytes == 8);

constexpr int kRawRow = 48;

// Pieces 0, 1 of a 32-block format's step: blocks 2s, 2s + 1's quant bytes. b0: the step's first block in the
// weight (row * k / 32 + 2s).
TESSERA_TILE_HD quant_tile::Piece quants(int64_t b0, int p) { return {b0 * 16 + 16 * p, 16 * p, 16, false}; }

// The fifth bits of the lane's four codes as bit 4 of four bytes, from h = qh >> 2c: bits 0, 1, 8, 9 of h (sel
// 0x1100: the low nibbles' values 2c, 2c + 1, 2c + 8, 2c + 9) or bits 16, 17, 24, 25 (sel 0x3322: the high nibbles'
// values, 16 on). The permute gives bytes (b, b, b', b'), whose bit 0 (bytes 0, 2) or bit 1 (bytes 1, 3) is wanted.
TESSERA_TILE_HD uint32_t fifth_bits(uint32_t h, uint32_t sel) {
  const uint32_t y = unit::byte_perm(h, 0u, sel);
  return ((y << 4) & 0x00100010u) | ((y << 3) & 0x10001000u);
}

// Four values of 5-bit codes (the bytes of x) as bf16 pairs lo = bytes (0, 1), hi = (2, 3): 128 + q exactly by a byte
// permute into 128.0f's mantissa, minus `bias` (exact), times d, plus m where kMin (each rounded on its own).
template <bool kMin>
TESSERA_TILE_HD void codes5(uint32_t x, float bias, float d, float m, uint32_t& lo, uint32_t& hi) {
  const auto value = [&](uint32_t sel) {
    const float w = unit::fmul(unit::fsub(format_detail::bits_to_float(unit::byte_perm(x, 0x43u, sel)), bias), d);
    return kMin ? unit::fadd(w, m) : w;
  };
  lo = quant_tile::pack_bf16(value(0x4055u), value(0x4155u));
  hi = quant_tile::pack_bf16(value(0x4255u), value(0x4355u));
}

// One 32-block of a q5 step: p its lane bytes (lane_bytes), qh its fifth bits, into slices j (low nibbles) and j + 1
// (high nibbles).
template <bool kMin>
TESSERA_TILE_HD void q5_block(uint32_t p, uint32_t qh, int c, float bias, float d, float m, uint32_t (&lo)[2],
                              uint32_t (&hi)[2]) {
  const uint32_t h = qh >> (2 * c);
  codes5<kMin>((p & 0x0F0F0F0Fu) | fifth_bits(h, 0x1100u), bias, d, m, lo[0], lo[1]);
  codes5<kMin>(((p >> 4) & 0x0F0F0F0Fu) | fifth_bits(h, 0x3322u), bias, d, m, hi[0], hi[1]);
}

// iq4nl_lookup4 with each table value v stored as v + 128 (v ^ 0x80): the four biased values of the four codes in n's
// low 16 bits, in their order.
TESSERA_TILE_HD uint32_t iq4nl_biased4(uint32_t n) {
  constexpr uint32_t kBias = 0x80808080u;
  constexpr uint32_t k0 = 0xbfad9881u ^ kBias, k1 = 0xf6eaddcfu ^ kBias, k2 = 0x26190d01u ^ kBias,
                     k3 = 0x71594535u ^ kBias;
  const uint32_t sel = n & 0x7777u;
  const uint32_t lo = unit::byte_perm(k0, k1, sel), hi = unit::byte_perm(k2, k3, sel);
  return unit::byte_perm(lo, hi, 0x3210u | ((n & 0x8888u) >> 1));
}

// One 32-block (or iq4_xs sub-block) of an iq4 step: p its lane bytes, d its scale, into slices j (low nibbles) and
// j + 1 (high nibbles). a holds the biased values of p's bytes 0, 1 as (low, high, low, high), b those of bytes 2, 3.
TESSERA_TILE_HD void iq4_block(uint32_t p, float d, uint32_t (&lo)[2], uint32_t (&hi)[2]) {
  const uint32_t a = iq4nl_biased4(p), b = iq4nl_biased4(p >> 16);
  const auto value = [&](uint32_t u, uint32_t sel) {
    return unit::fmul(unit::fsub(format_detail::bits_to_float(unit::byte_perm(u, 0x4B000000u, sel)), 8388736.0f), d);
  };
  lo[0] = quant_tile::pack_bf16(value(a, 0x7650u), value(a, 0x7652u));
  hi[0] = quant_tile::pack_bf16(value(a, 0x7651u), value(a, 0x7653u));
  lo[1] = quant_tile::pack_bf16(value(b, 0x7650u), value(b, 0x7652u));
  hi[1] = quant_tile::pack_bf16(value(b, 0x7651u), value(b, 0x7653u));
}

TESSERA_TILE_HD float half_lo(uint32_t w) { return format_detail::half_value(static_cast<uint16_t>(w & 0xFFFFu)); }
TESSERA_TILE_HD float half_hi(uint32_t w) { return format_detail::half_value(static_cast<uint16_t>(w >> 16)); }

}  // namespace blocks_tile

namespace quant_tile {

// q5_0: w = (q - 16) d. Pieces 0, 1: the two blocks' qs; 2: their d; 3, 4: their qh (the tail, after all nb d).
template <>
struct TileFormat<DType::Q5_0> {
  static constexpr int kRawRow = blocks_tile::kRawRow, kPieces = 5;
  TESSERA_TILE_HD static Piece piece(int64_t row, int64_t n, int64_t k, int s, int p) {
    const int64_t b0 = row * (k / 32) + 2 * s;
    if (p < 2) return blocks_tile::quants(b0, p);
    if (p == 2) return {b0 * 2, 32, 4, true};
    return {n * (k / 32) * 2 + (b0 + p - 3) * 4, 36 + 4 * (p - 3), 4, true};
  }
  TESSERA_TILE_HD static void row_frags(const uint32_t* img, int c, int /*s*/, uint32_t (&out)[4][2]) {
    const uint32_t dd = img[8];
    blocks_tile::q5_block<false>(quant_tile::lane_bytes(img, c), img[9], c, 144.0f, blocks_tile::half_lo(dd), 0.0f,
                                 out[0], out[1]);
    blocks_tile::q5_block<false>(quant_tile::lane_bytes(img + 4, c), img[10], c, 144.0f, blocks_tile::half_hi(dd), 0.0f,
                                 out[2], out[3]);
  }
};

// q5_1: w = q d + m. Pieces 0, 1: the two blocks' qs; 2: their (d, m); 3: their qh.
template <>
struct TileFormat<DType::Q5_1> {
  static constexpr int kRawRow = blocks_tile::kRawRow, kPieces = 4;
  TESSERA_TILE_HD static Piece piece(int64_t row, int64_t n, int64_t k, int s, int p) {
    const int64_t b0 = row * (k / 32) + 2 * s;
    if (p < 2) return blocks_tile::quants(b0, p);
    if (p == 2) return {b0 * 4, 32, 8, true};
    return {n * (k / 32) * 4 + b0 * 4, 40, 8, true};
  }
  TESSERA_TILE_HD static void row_frags(const uint32_t* img, int c, int /*s*/, uint32_t (&out)[4][2]) {
    const uint32_t dm0 = img[8], dm1 = img[9];
    blocks_tile::q5_block<true>(quant_tile::lane_bytes(img, c), img[10], c, 128.0f, blocks_tile::half_lo(dm0),
                                blocks_tile::half_hi(dm0), out[0], out[1]);
    blocks_tile::q5_block<true>(quant_tile::lane_bytes(img + 4, c), img[11], c, 128.0f, blocks_tile::half_lo(dm1),
                                blocks_tile::half_hi(dm1), out[2], out[3]);
  }
};

// iq4_nl: w = kvalues[q] d. Pieces 0, 1: the two blocks' qs; 2: their d.
template <>
struct TileFormat<DType::IQ4_NL> {
  static constexpr int kRawRow = blocks_tile::kRawRow, kPieces = 3;
  TESSERA_TILE_HD static Piece piece(int64_t row, int64_t /*n*/, int64_t k, int s, int p) {
    const int64_t b0 = row * (k / 32) + 2 * s;
    if (p < 2) return blocks_tile::quants(b0, p);
    return {b0 * 2, 32, 4, true};
  }
  TESSERA_TILE_HD static void row_frags(const uint32_t* img, int c, int /*s*/, uint32_t (&out)[4][2]) {
    const uint32_t dd = img[8];
    blocks_tile::iq4_block(quant_tile::lane_bytes(img, c), blocks_tile::half_lo(dd), out[0], out[1]);
    blocks_tile::iq4_block(quant_tile::lane_bytes(img + 4, c), blocks_tile::half_hi(dd), out[2], out[3]);
  }
};

// iq4_xs: w = dl kvalues[q], dl = d (ls - 32) per sub-block. Pieces 0, 1: the step's 32 qs bytes; 2: the head.
template <>
struct TileFormat<DType::IQ4_XS> {
  static constexpr int kRawRow = blocks_tile::kRawRow, kPieces = 3;
  TESSERA_TILE_HD static Piece piece(int64_t row, int64_t /*n*/, int64_t k, int s, int p) {
    const int64_t sb = row * (k / 256) + s / 4;
    if (p < 2) return {sb * 128 + (s % 4) * 32 + 16 * p, 16 * p, 16, false};
    return {sb * 8, 32, 8, true};
  }
  // Head words: img[8] = d | scales_h << 16, img[9] = scales_l[0..3]. Sub-block 2 sub + i's 6-bit scale: nibble i of
  // scales_l[sub], and bits 2i, 2i + 1 of scales_h's 4 bits from 4 sub.
  TESSERA_TILE_HD static void row_frags(const uint32_t* img, int c, int s, uint32_t (&out)[4][2]) {
    const int sub = s & 3;
    const uint32_t h0 = img[8], sl = img[9] >> (8 * sub), sh = h0 >> (16 + 4 * sub);
    const int ls0 = static_cast<int>((sl & 0xFu) | ((sh & 3u) << 4));
    const int ls1 = static_cast<int>(((sl >> 4) & 0xFu) | ((sh & 0xCu) << 2));
    const float d = blocks_tile::half_lo(h0);
    blocks_tile::iq4_block(quant_tile::lane_bytes(img, c), unit::fmul(d, static_cast<float>(ls0 - 32)), out[0], out[1]);
    blocks_tile::iq4_block(quant_tile::lane_bytes(img + 4, c), unit::fmul(d, static_cast<float>(ls1 - 32)), out[2],
                           out[3]);
  }
};

}  // namespace quant_tile
}  // namespace tessera::cuda::detail
