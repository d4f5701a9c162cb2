// q2_K and q3_K's tile formats (gemm_quant_tile.h has the contract; gemm_tile_formats.h includes this header).
//
// Both keep 2-bit codes in 64 qs bytes per 256-value super-block as format_detail::k_quant_2bit lays them out: per half
// of 128 values, byte l (0..31) of the half's 32 bytes holds values l, l + 32, l + 64, l + 96 in bits 0-1, 2-3, 4-5,
// 6-7. Step s is values 64 u .. 64 u + 63 (u = s % 4) of super-block s / 4: half u / 2, bit fields 2 (u % 2) and
// 2 (u % 2) + 1 of every byte of that half's 32 qs bytes, and sub-blocks 4 u .. 4 u + 3. Lane c's values of a row,
// k = 16 j + 2c + {0, 1, 8, 9} of the step (j = 0..3), are in qs bytes 16 (j % 2) + 2c + {0, 1, 8, 9} of the half,
// field 2 (u % 2) + j / 2, sub-block 4 u + j: one byte permute gathers bytes 2c, 2c + 1, 2c + 8, 2c + 9 of each
// 16-byte half (lane_bytes), shifts pick the fields, and each byte permute below puts a small code into 128.0f's
// mantissa (0x43 | code: the float 128 + code, exactly), as q4k_tile::codes4 does.
//
// q2_K, w = (d sc) q - dmin m: row image [48 B] = the half's 32 qs bytes (2 x 16), the step's 4 scale|min bytes
// (4 B at 32), the super-block's tail d | dmin << 16 (4 B at 36; SPLIT_Q's 4-byte tail entries are 4-byte aligned).
//
// q3_K, w = (d (sc - 32)) q with q = low - 4 (1 - high) in -4..3: row image [80 B] = hmask (2 x 16: the high bit of
// value e is bit e / 32 of hmask[e % 32], so the step needs bits 2u, 2u + 1 of all 32 bytes), the half's qs (2 x 16 at
// 32), scale word u % 2 (bytes 4 (u % 2) .. + 3 of the 12: the 4 low nibbles of sub-blocks 4 u + j, low nibbles for
// u < 2, high ones for u >= 2; 4 B at 64), scale word 2 (bytes 8..11: bits 2u, 2u + 1 are sub-block 4 u + j's two high
// bits; 4 B at 68), and the 4-byte aligned window of the tail that holds the super-block's fp16 d (4 B at 72: the tail
// is 2-byte entries, so d is the window's low half for an even super-block and its high half for an odd one).
//
// d's 2-byte entries: cp.async copies 4 bytes at least, so which half of the window is d follows the super-block's
// parity, which row_frags takes from the row (kNeedsRow, as q6_K). The window of a weight's last super-block covers 2
// bytes past the tail when the weight has an odd number of super-blocks, inside the allocation (memory.h's DeviceBuffer
// rounds it up to 16 bytes).
#pragma once

#include <cstdint>

#include "backends/cuda/kernels/gemm_quant_tile.h"
#include "backends/cuda/kernels/quant_units.h"
#include "backends/cuda/split_layout.h"
#include "quant/format_traits.h"

namespace tessera::cuda::detail::quant_tile {
namespace low_tile {

// Lane c's bytes of 32 bytes of codes (8 words q32): p0 = bytes 2c, 2c + 1, 2c + 8, 2c + 9 (in this order: values
// k = 2c, 2c + 1 then 2c + 8, 2c + 9 of a k16 slice), p1 = the same of bytes 16..31.
TESSERA_TILE_HD void lane_bytes(const uint32_t* q32, int c, uint32_t& p0, uint32_t& p1) {
  p0 = quant_tile::lane_bytes(q32, c);
  p1 = quant_tile::lane_bytes(q32 + 4, c);
}

// 128 + byte J of x (a code below 128) as a float, exactly: the byte in 128.0f's mantissa.
template <int J>
TESSERA_TILE_HD float plus128(uint32_t x) {
  return format_detail::bits_to_float(unit::byte_perm(x, 0x43u, 0x4055u + (J << 8)));
}

// q2_K's lane c of one row's step s (row image above): sub-block 4u + j's dl = d sc and ml = dmin m rounded as
// Format<Q2_K>::dequantize rounds them, then q4k_tile::codes4's dl q - ml (each product and difference rounded).
TESSERA_TILE_HD void q2k_frags(const uint32_t* img, int c, int s, uint32_t (&out)[4][2]) {
  uint32_t p0, p1;
  lane_bytes(img, c, p0, p1);
  p0 >>= 4 * (s & 1);  // fields 2 (u % 2) and 2 (u % 2) + 1 to bits 0-1 and 2-3 of each byte
  p1 >>= 4 * (s & 1);
  const uint32_t sm = img[8], t = img[9];
  const uint32_t sc = sm & 0x0F0F0F0Fu, m = (sm >> 4) & 0x0F0F0F0Fu;
  const float d = format_detail::half_value(static_cast<uint16_t>(t & 0xFFFFu));
  const float dmin = format_detail::half_value(static_cast<uint16_t>(t >> 16));
  const float dl0 = unit::fmul(d, plus128<0>(sc) - 128.0f), ml0 = unit::fmul(dmin, plus128<0>(m) - 128.0f);
  const float dl1 = unit::fmul(d, plus128<1>(sc) - 128.0f), ml1 = unit::fmul(dmin, plus128<1>(m) - 128.0f);
  const float dl2 = unit::fmul(d, plus128<2>(sc) - 128.0f), ml2 = unit::fmul(dmin, plus128<2>(m) - 128.0f);
  const float dl3 = unit::fmul(d, plus128<3>(sc) - 128.0f), ml3 = unit::fmul(dmin, plus128<3>(m) - 128.0f);
  q4k_tile::codes4(p0 & 0x03030303u, dl0, ml0, out[0][0], out[0][1]);
  q4k_tile::codes4(p1 & 0x03030303u, dl1, ml1, out[1][0], out[1][1]);
  q4k_tile::codes4((p0 >> 2) & 0x03030303u, dl2, ml2, out[2][0], out[2][1]);
  q4k_tile::codes4((p1 >> 2) & 0x03030303u, dl3, ml3, out[3][0], out[3][1]);
}

// Four q3_K values dl q from the codes low | high << 2 (0..7) in the four bytes of x, as two bf16 pairs: lo = (byte 0,
// byte 1), hi = (byte 2, byte 3). q = (128 + code) - 132 = low - 4 (1 - high), exactly; dl q rounded once.
TESSERA_TILE_HD void q3k_codes4(uint32_t x, float dl, uint32_t& lo, uint32_t& hi) {
  const auto value = [&](uint32_t sel) {
    return unit::fmul(dl, format_detail::bits_to_float(unit::byte_perm(x, 0x43u, sel)) - 132.0f);
  };
  lo = pack_bf16(value(0x4055u), value(0x4155u));
  hi = pack_bf16(value(0x4255u), value(0x4355u));
}

// q3_K's lane c of one row's step (u = s % 4; row image above). odd: whether the super-block's index is odd (d is the
// tail window's high half). Sub-block 4u + j's 6-bit scale from scale words u % 2 and 2, dl = d (sc - 32) rounded as
// Format<Q3_K>::dequantize rounds it (sc - 32 exact: (128 + sc) - 160).
TESSERA_TILE_HD void q3k_frags(const uint32_t* img, int c, int u, bool odd, uint32_t (&out)[4][2]) {
  uint32_t h0, h1, p0, p1;
  lane_bytes(img, c, h0, h1);      // hmask
  lane_bytes(img + 8, c, p0, p1);  // the half's qs
  p0 >>= 4 * (u & 1);              // fields 2 (u % 2), 2 (u % 2) + 1 to bits 0-1, 2-3
  p1 >>= 4 * (u & 1);
  h0 >>= 2 * u;  // hmask bits 2u (j = 0, 1) and 2u + 1 (j = 2, 3) to bits 0 and 1
  h1 >>= 2 * u;
  uint32_t w[4];
  words4(img + 16, w);
  const uint32_t sc = ((w[0] >> (4 * (u >> 1))) & 0x0F0F0F0Fu) | (((w[1] >> (2 * u)) & 0x03030303u) << 4);
  const float d = format_detail::half_value(static_cast<uint16_t>(odd ? w[2] >> 16 : w[2] & 0xFFFFu));
  const float dl0 = unit::fmul(d, plus128<0>(sc) - 160.0f), dl1 = unit::fmul(d, plus128<1>(sc) - 160.0f);
  const float dl2 = unit::fmul(d, plus128<2>(sc) - 160.0f), dl3 = unit::fmul(d, plus128<3>(sc) - 160.0f);
  q3k_codes4((p0 & 0x03030303u) | ((h0 << 2) & 0x04040404u), dl0, out[0][0], out[0][1]);
  q3k_codes4((p1 & 0x03030303u) | ((h1 << 2) & 0x04040404u), dl1, out[1][0], out[1][1]);
  q3k_codes4(((p0 >> 2) & 0x03030303u) | ((h0 << 1) & 0x04040404u), dl2, out[2][0], out[2][1]);
  q3k_codes4(((p1 >> 2) & 0x03030303u) | ((h1 << 1) & 0x04040404u), dl3, out[3][0], out[3][1]);
}

}  // namespace low_tile

template <>
struct TileFormat<DType::Q2_K> {
  using L = SplitLayout<DType::Q2_K>;
  static constexpr int kRawRow = 48, kPieces = 4;
  // Pieces 0, 1: the half's 32 qs bytes; 2: the step's 4 scale bytes; 3: the tail's d, dmin.
  TESSERA_TILE_HD static Piece piece(int64_t row, int64_t n, int64_t k, int s, int p) {
    const int64_t nbr = k / 256, blk = row * nbr + s / 4;
    const int u = s & 3;
    if (p < 2) return {blk * L::kQuantBytes + 32 * (u >> 1) + 16 * p, 16 * p, 16, false};
    if (p == 2) return {blk * L::kScaleBytes + 4 * u, 32, 4, true};
    return {n * nbr * L::kScaleBytes + blk * L::kTailBytes, 36, 4, true};
  }
  TESSERA_TILE_HD static void row_frags(const uint32_t* img, int c, int s, uint32_t (&out)[4][2]) {
    low_tile::q2k_frags(img, c, s, out);
  }
};

template <>
struct TileFormat<DType::Q3_K> {
  using L = SplitLayout<DType::Q3_K>;
  static constexpr int kRawRow = 80, kPieces = 7;
  // Pieces 0, 1: hmask; 2, 3: the half's qs; 4: scale word u % 2; 5: scale word 2; 6: the tail window holding d.
  TESSERA_TILE_HD static Piece piece(int64_t row, int64_t n, int64_t k, int s, int p) {
    const int64_t nbr = k / 256, blk = row * nbr + s / 4;
    const int u = s & 3;
    if (p < 2) return {blk * L::kQuantBytes + 16 * p, 16 * p, 16, false};
    if (p < 4) return {blk * L::kQuantBytes + 32 + 32 * (u >> 1) + 16 * (p - 2), 16 * p, 16, false};
    if (p == 4) return {blk * L::kScaleBytes + 4 * (u & 1), 64, 4, true};
    if (p == 5) return {blk * L::kScaleBytes + 8, 68, 4, true};
    return {n * nbr * L::kScaleBytes + (blk >> 1) * 2 * L::kTailBytes, 72, 4, true};  // kScaleBytes % 4 == 0
  }
  static constexpr bool kNeedsRow = true;
  TESSERA_TILE_HD static void row_frags(const uint32_t* img, int c, int s, int64_t row, int64_t k,
                                        uint32_t (&out)[4][2]) {
    low_tile::q3k_frags(img, c, s & 3, ((row * (k / 256) + s / 4) & 1) != 0, out);
  }
};

static_assert(SplitLayout<DType::Q2_K>::kQuantBytes == 64 && SplitLayout<DType::Q2_K>::kScaleBytes == 16 &&
                  SplitLayout<DType::Q2_K>::kTailBytes == 4,
              "q2_K's row image assumes qs [64], scale|min bytes [16], tail d, dmin [4]");
static_assert(SplitLayout<DType::Q3_K>::kQuantBytes == 96 && SplitLayout<DType::Q3_K>::kScaleBytes == 12 &&
                  SplitLayout<DType::Q3_K>::kTailBytes == 2,
              "q3_K's row image assumes hmask|qs [96], packed scales [12], tail d [2]");

}  // namespace tessera::cuda::detail::quant_tile
