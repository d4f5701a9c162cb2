// The tile GEMM's q5_K and q6_K (gemm_quant_tile.h has the contract and q4_K's, whose lane layout both follow).
//
// q5_K: q4_K's super-block plus 32 bytes of fifth bits (bit j of qh[l]: element l of sub-block j). A step is q4_K's
// (its 32 qs bytes and the 16-byte head), and the super-block's whole qh, re-read by each of its four steps (L2, not
// DRAM): image [80 B] = qs [0, 32), head [32, 48), qh [48, 80). Lane c takes qh's bytes at the positions row_lane
// takes of qs, so bit 2 sub (low nibbles) or 2 sub + 1 (high) of each lands beside its nibble: codes 0..31, formed
// and scaled as q4_K's (d sc q - dmin m).
//
// q6_K: a super-block's half h (128 values) is ql [64h, + 64) and qh [32h, + 32): values l and l + 64 of the half share
// ql byte l (low, high nibble), and l, l + 32, l + 64, l + 96 share qh byte l % 32 (2 bits each). A step (64 values:
// half h = (s % 4) / 2, nibble n = s % 2) so needs all 64 ql bytes and 32 qh bytes of its half, which the half's other
// step reads again (L2): image [112 B] = ql [0, 64), qh [64, 96), the half's 8 int8 scales [96, 104), and the 4-byte
// aligned window of the tail holding the fp16 d [104, 108) (d of block b at byte 2b of the tail: the low half of the
// window for even b, the high half for odd; kNeedsRow gives row_frags the block; the last of an odd number of blocks
// reads 2 bytes past the tail, inside the allocation: memory.h's DeviceBuffer rounds it up to 16 bytes). Value v of the
// step (0..63): ql byte v, nibble n; qh byte v % 32, bits 4n + 2 (v / 32); scale 4n + v / 16 of the half's 8. Each
// value is (d sc) (q - 32) as Format<Q6_K>::dequantize forms it.
#pragma once

#include <cstdint>

#include "backends/cuda/kernels/gemm_quant_tile.h"
#include "backends/cuda/kernels/quant_units.h"
#include "backends/cuda/split_layout.h"
#include "quant/format_traits.h"

namespace tessera::cuda::detail {
namespace kquant_tile {

// Four values of 6-bit codes q (bytes of x, each 0..63) as (ds (q - 32)) bf16 pairs: lo = bytes (0, 1), hi = (2, 3).
// 128 + q exactly by a byte permute into 128.0f's mantissa (codes4's way), minus 160: q - 32, exact.
TESSERA_TILE_HD void codes6(uint32_t x, float ds, uint32_t& lo, uint32_t& hi) {
  const auto value = [&](uint32_t sel) {
    return unit::fmul(ds, format_detail::bits_to_float(unit::byte_perm(x, 0x43u, sel)) - 160.0f);
  };
  lo = quant_tile::pack_bf16(value(0x4055u), value(0x4155u));
  hi = quant_tile::pack_bf16(value(0x4255u), value(0x4355u));
}

}  // namespace kquant_tile

namespace quant_tile {

template <>
struct TileFormat<DType::Q5_K> {
  static constexpr int kRawRow = 80, kPieces = 5;
  // Pieces 0, 1: the step's 32 qs bytes (after the block's 32 qh bytes in quants); 2: the head; 3, 4: qh.
  TESSERA_TILE_HD static Piece piece(int64_t row, int64_t /*n*/, int64_t k, int s, int p) {
    const int64_t blk = row * (k / 256) + s / 4;
    if (p < 2) return {blk * 160 + 32 + (s % 4) * 32 + 16 * p, 16 * p, 16, false};
    if (p == 2) return {blk * 16, 32, 16, true};
    return {blk * 160 + 16 * (p - 3), 48 + 16 * (p - 3), 16, false};
  }
  TESSERA_TILE_HD static void row_frags(const uint32_t* img, int c, int s, uint32_t (&out)[4][2]) {
    uint32_t h[4];
    words4(img + 8, h);
    const int sub = s & 3;
    const q4k_tile::RowLane r = q4k_tile::row_lane(img, h, c, sub);
    const uint32_t h0 = quant_tile::lane_bytes(img + 12, c), h1 = quant_tile::lane_bytes(img + 16, c);
    const auto fifth = [&](uint32_t qh, int bit) { return ((qh >> bit) & 0x01010101u) << 4; };
    q4k_tile::codes4((r.p0 & 0x0F0F0F0Fu) | fifth(h0, 2 * sub), r.dl, r.ml, out[0][0], out[0][1]);
    q4k_tile::codes4((r.p1 & 0x0F0F0F0Fu) | fifth(h1, 2 * sub), r.dl, r.ml, out[1][0], out[1][1]);
    q4k_tile::codes4(((r.p0 >> 4) & 0x0F0F0F0Fu) | fifth(h0, 2 * sub + 1), r.dh, r.mh, out[2][0], out[2][1]);
    q4k_tile::codes4(((r.p1 >> 4) & 0x0F0F0F0Fu) | fifth(h1, 2 * sub + 1), r.dh, r.mh, out[3][0], out[3][1]);
  }
};

template <>
struct TileFormat<DType::Q6_K> {
  static constexpr int kRawRow = 112, kPieces = 8;
  static constexpr bool kNeedsRow = true;
  // Pieces 0-3: the half's 64 ql bytes; 4, 5: its 32 qh bytes; 6: its 8 scales; 7: the tail's window holding d.
  TESSERA_TILE_HD static Piece piece(int64_t row, int64_t n, int64_t k, int s, int p) {
    const int64_t blk = row * (k / 256) + s / 4;
    const int half = (s % 4) / 2;
    if (p < 4) return {blk * 192 + 64 * half + 16 * p, 16 * p, 16, false};
    if (p < 6) return {blk * 192 + 128 + 32 * half + 16 * (p - 4), 64 + 16 * (p - 4), 16, false};
    if (p == 6) return {blk * 16 + 8 * half, 96, 8, true};
    return {n * (k / 256) * 16 + (blk & ~int64_t{1}) * 2, 104, 4, true};  // the tail follows all scales
  }
  TESSERA_TILE_HD static void row_frags(const uint32_t* img, int c, int s, int64_t row, int64_t k,
                                        uint32_t (&out)[4][2]) {
    const int nib = 4 * (s & 1);                            // the step's ql nibble
    const bool odd = ((row * (k / 256) + s / 4) & 1) != 0;  // d in the window's high half
    const float d = format_detail::half_value(static_cast<uint16_t>(odd ? img[26] >> 16 : img[26] & 0xFFFFu));
    const uint32_t sc = img[24 + (s & 1)];  // scales 4 nib / 4 .. + 3 of the half's 8
    const uint32_t h0 = quant_tile::lane_bytes(img + 16, c), h1 = quant_tile::lane_bytes(img + 20, c);
    TESSERA_UNROLL
    for (int j = 0; j < 4; ++j) {
      const uint32_t ql = quant_tile::lane_bytes(img + 4 * j, c);
      const uint32_t qh = j & 1 ? h1 : h0;   // qh byte v % 32
      const int shift = nib + 2 * (j >> 1);  // bits 4n + 2 (v / 32)
      const uint32_t q = ((ql >> nib) & 0x0F0F0F0Fu) | (((qh >> shift) & 0x03030303u) << 4);
      const float ds = unit::fmul(d, static_cast<float>(static_cast<int8_t>((sc >> (8 * j)) & 0xFFu)));
      kquant_tile::codes6(q, ds, out[j][0], out[j][1]);
    }
  }
};

}  // namespace quant_tile
}  // namespace tessera::cuda::detail
