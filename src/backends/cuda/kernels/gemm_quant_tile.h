// The quantized tile GEMM's layout and dequantization (kernels/gemm_quant_tile.cu), as functions both compilers take:
// the kernel calls them on the device, and tests/backends/cuda/test_gemm_quant_tile.cpp runs the same functions on the
// host (no GPU) against Format<D>::dequantize rounded to bf16, which is what src's expansion writes (gemm_convert.cu).
// Grown for q4_K in bench/cuda/experiments/quant_prefill_tile.cu (its header has the design and the H100 figures).
//
// One pipeline step covers 64 values of K for every format. Each W row's bytes of a step sit in shared memory as a row
// image of TileFormat<D>::kRawRow bytes, copied there by cp.async in TileFormat<D>::kPieces pieces (Piece: 4, 8 or 16
// bytes from the weight's SPLIT_Q quants or scales buffer, split_layout.h), and each lane dequantizes its part of two
// rows' images straight into wgmma's register A fragments (TileFormat<D>::row_frags). A format is one specialization
// of TileFormat: the kernel, its pipeline and its tests are shared.
//
// q4_K (the first; q4k_tile below): a step is one 32-byte group of a super-block's 128 qs bytes (sub-block 2i in the
// low nibbles, 2i + 1 in the high ones). Its row image is [48 B]: the 32 qs bytes, then the super-block's 16-byte head
// (fp16 d, fp16 dmin, 12 packed scale bytes; SPLIT_Q keeps both 16-byte aligned). 48 rather than 32 + a separate head
// array: rows 12 banks apart, so the 8 rows a warp reads at once fall in distinct banks.
#pragma once

#include <cstdint>
#include <cstring>

#include "backends/cuda/kernels/quant_units.h"
#include "quant/format_traits.h"
#include "quant/half.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#define TESSERA_TILE_HD __host__ __device__ __forceinline__
#else
#define TESSERA_TILE_HD inline
#endif

namespace tessera::cuda::detail {
namespace quant_tile {

constexpr int kStepK = 64;  // K per pipeline step
constexpr int kXRow = 128;  // bytes of one token's x per step (64 bf16): one 128-byte swizzle row
constexpr int kStages = 4;  // steps in flight (loads issued kStages - 1 steps ahead of their use)
constexpr int kRows = 128;  // W rows per CTA: two warpgroups of 64
constexpr int kThreads = 256;

// One cp.async of a W row's step: `bytes` (4, 8 or 16, and src and dst aligned to it) from byte `src` of the weight's
// quants buffer (scales = false) or of its scales buffer (scales = true: the tail, split_layout.h, follows the scales)
// to byte `dst` of the row's image in shared memory.
struct Piece {
  int64_t src;
  int dst;
  int bytes;
  bool scales;
};

// Round to nearest even, as src's pack16x2 (device) and quant/half.h's f32_to_bf16 (host).
TESSERA_TILE_HD uint32_t pack_bf16(float lo, float hi) {
#if defined(__CUDA_ARCH__)
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &h, 4);
  return u;
#else
  return static_cast<uint32_t>(f32_to_bf16(lo)) | static_cast<uint32_t>(f32_to_bf16(hi)) << 16;
#endif
}

// Bytes 2c, 2c + 1, 2c + 8, 2c + 9 of the 16 bytes in words w[0..3]: what lane c (= lane % 4) of the m16n8k16 A layout
// takes of a 16-value run whose bytes are in value order (one byte permute).
TESSERA_TILE_HD uint32_t lane_bytes(const uint32_t* w, int c) {
  return unit::byte_perm(w[c >> 1], w[(c >> 1) + 2], (c & 1) ? 0x7632u : 0x5410u);
}

// Four consecutive words of a row image (16-byte aligned): one shared-memory vector load on the device.
TESSERA_TILE_HD void words4(const uint32_t* p, uint32_t (&w)[4]) {
#if defined(__CUDA_ARCH__)
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
#else
  memcpy(w, p, 16);
#endif
}

// A format's tile GEMM: the specializations (this header's q4_K, q5_K and q6_K; gemm_tile_formats.h's others) give
//  - kRawRow: bytes of one W row's image per step in shared memory, a multiple of 16; kRawRow / 4 words apart, the
//    8 rows g = 0..7 a warp reads at once should fall in distinct banks (kRawRow / 16 odd, or 4 word-banks apart);
//  - kPieces: cp.async copies that build one row's image of a step;
//  - piece(row, n, k, s, p): copy p of row `row`'s image of step s (of the whole K; s = 0 .. k / 64 - 1), for a
//    weight of n rows and k columns;
//  - row_frags(img, c, s, out): what lane c (= lane % 4) of a warp holds of one W row at step s, from the row's image
//    img (16-byte aligned): out[j][0] the bf16 pair at k = 16 j + 2c, 2c + 1 of the step and out[j][1] at
//    16 j + 2c + 8, 2c + 9 (j = 0..3, the step's four k16 slices: the m16n8k16 A layout, which is wgmma's register A
//    per warp), each Format<D>::dequantize's value rounded once to bf16: the expansion's weights bit for bit.
template <DType D>
struct TileFormat;

// A format whose image cannot say everything (q6_K's fp16 d sits in a 4-byte window at either half, by the block's
// parity) declares kNeedsRow = true and takes row_frags(img, c, s, row, k, out) with the W row (clamped to n - 1, as
// piece got it) and K; the others take row_frags(img, c, s, out). frags() calls whichever the format has.
template <DType D, typename = void>
struct TileNeedsRow {
  static constexpr bool value = false;
};
template <DType D>
struct TileNeedsRow<D, decltype(void(TileFormat<D>::kNeedsRow))> {
  static constexpr bool value = TileFormat<D>::kNeedsRow;
};
template <DType D>
TESSERA_TILE_HD void frags(const uint32_t* img, int c, int s, int64_t row, int64_t k, uint32_t (&out)[4][2]) {
  if constexpr (TileNeedsRow<D>::value) {
    TileFormat<D>::row_frags(img, c, s, row, k, out);
  } else {
    (void)row, (void)k;
    TileFormat<D>::row_frags(img, c, s, out);
  }
}

// Whether the format has a tile kernel (a specialization of TileFormat).
template <DType D, typename = void>
struct HasTileFormat {
  static constexpr bool value = false;
};
template <DType D>
struct HasTileFormat<D, decltype(void(TileFormat<D>::kRawRow))> {
  static constexpr bool value = true;
};

}  // namespace quant_tile

namespace q4k_tile {
using quant_tile::kStages;
using quant_tile::kStepK;
using quant_tile::kXRow;
using quant_tile::lane_bytes;
using quant_tile::pack_bf16;

constexpr int kRawRow = 48;  // bytes of one W row per step in shared memory

// Source of W's 16-byte piece p of row `row` at step s (of the whole K): p = 0, 1 the step's qs bytes 16p .. 16p + 15
// in quants ([n * nb, 128]), p = 2 the super-block's head in heads ([n * nb, 16]); byte offsets. nb = K / 256.
TESSERA_TILE_HD int64_t raw_src(int64_t row, int64_t nb, int s, int p) {
  const int64_t blk = row * nb + s / 4;
  return p < 2 ? blk * 128 + (s % 4) * 32 + p * 16 : blk * 16;
}

// format_detail::q4_k_scale_min on the head's three scale words (bytes 0..11) with j known only at run time: selects,
// not an indexed array (which would live in local memory).
TESSERA_TILE_HD int scale_byte(uint32_t s0, uint32_t s1, uint32_t s2, int i) {
  const uint32_t w = i < 4 ? s0 : i < 8 ? s1 : s2;
  return static_cast<int>((w >> (8 * (i & 3))) & 0xFFu);
}
TESSERA_TILE_HD void scale_min(uint32_t s0, uint32_t s1, uint32_t s2, int j, int& sc, int& m) {
  if (j < 4) {
    sc = scale_byte(s0, s1, s2, j) & 63;
    m = scale_byte(s0, s1, s2, j + 4) & 63;
  } else {
    sc = (scale_byte(s0, s1, s2, j + 4) & 0xF) | ((scale_byte(s0, s1, s2, j - 4) >> 6) << 4);
    m = (scale_byte(s0, s1, s2, j + 4) >> 4) | ((scale_byte(s0, s1, s2, j) >> 6) << 4);
  }
}

// Four values from the 4-bit codes in the four bytes of x (each 0..15, the other nibble masked off) as two bf16 pairs:
// lo = (byte 0, byte 1), hi = (byte 2, byte 3). A byte permute puts each code into 128.0f's mantissa (0x43 into bits
// 24..31, the code into bits 16..23: the float 128 + q, exactly, where I2F would run at quarter rate); then
// q = (128 + q) - 128 and d q - m, each rounded: the expansion's value bit for bit. (The experiment's one-FFMA form,
// fma(d, 128 + q, -(128 d + m)), measured ~5% faster but moves 5 of 8,192 weights by one bf16 unit: not src's.)
TESSERA_TILE_HD void codes4(uint32_t x, float d, float m, uint32_t& lo, uint32_t& hi) {
  const auto value = [&](uint32_t sel) {
    return unit::fsub(unit::fmul(d, format_detail::bits_to_float(unit::byte_perm(x, 0x43u, sel)) - 128.0f), m);
  };
  lo = pack_bf16(value(0x4055u), value(0x4155u));
  hi = pack_bf16(value(0x4255u), value(0x4355u));
}

// What lane c (lane % 4) dequantizes of one W row's step (row_frags has the layout): p0, p1 its qs bytes 2c, 2c + 1,
// 2c + 8, 2c + 9 of the first and of the second 16-byte half (two word loads and one byte permute per half; sub-block
// 2 sub's codes in the low nibbles, 2 sub + 1's in the high ones), and the two sub-blocks' scales d sc and mins dmin m,
// each rounded as the expansion rounds it. A function of its own so that the experiment's one-FFMA form
// (bench/cuda/experiments/quant_prefill_tile.cu) shares it.
struct RowLane {
  uint32_t p0, p1;
  float dl, ml;  // sub-block 2 sub
  float dh, mh;  // sub-block 2 sub + 1
};
TESSERA_TILE_HD RowLane row_lane(const uint32_t* q32, const uint32_t (&h)[4], int c, int sub) {
  const uint32_t p0 = quant_tile::lane_bytes(q32, c), p1 = quant_tile::lane_bytes(q32 + 4, c);
  const float d = format_detail::half_value(static_cast<uint16_t>(h[0] & 0xFFFFu));
  const float dmin = format_detail::half_value(static_cast<uint16_t>(h[0] >> 16));
  int sc, m;
  scale_min(h[1], h[2], h[3], 2 * sub, sc, m);
  const float dl = unit::fmul(d, static_cast<float>(sc)), ml = unit::fmul(dmin, static_cast<float>(m));
  scale_min(h[1], h[2], h[3], 2 * sub + 1, sc, m);
  const float dh = unit::fmul(d, static_cast<float>(sc)), mh = unit::fmul(dmin, static_cast<float>(m));
  return {p0, p1, dl, ml, dh, mh};
}

// One W row's part of the A fragments of a step for the lane with lane % 4 = c: out[j][0] holds the row's values at
// k = 16 j + 2c, 2c + 1 and out[j][1] at 16 j + 2c + 8, 2c + 9 (j = 0..3 the step's four k16 slices; the m16n8k16 A
// layout, which is wgmma's register A per warp: a0/a2 for row g, a1/a3 for row g + 8). q32: the row's 32 qs bytes of
// the step as 8 words, h: its head (d | dmin << 16, then scale bytes 0..11), sub: the step's place in its super-block
// (0..3). Slices j = 0, 1 are sub-block 2 sub's values (low nibbles of qs bytes 0..15, 16..31), j = 2, 3 sub-block
// 2 sub + 1's (the high nibbles). Lane c needs bytes 2c, 2c + 1, 2c + 8, 2c + 9 of each 16-byte half (row_lane).
TESSERA_TILE_HD void row_frags(const uint32_t* q32, const uint32_t (&h)[4], int c, int sub, uint32_t (&out)[4][2]) {
  const RowLane r = row_lane(q32, h, c, sub);
  codes4(r.p0 & 0x0F0F0F0Fu, r.dl, r.ml, out[0][0], out[0][1]);
  codes4(r.p1 & 0x0F0F0F0Fu, r.dl, r.ml, out[1][0], out[1][1]);
  codes4((r.p0 >> 4) & 0x0F0F0F0Fu, r.dh, r.mh, out[2][0], out[2][1]);
  codes4((r.p1 >> 4) & 0x0F0F0F0Fu, r.dh, r.mh, out[3][0], out[3][1]);
}

}  // namespace q4k_tile

namespace quant_tile {

template <>
struct TileFormat<DType::Q4_K> {
  static constexpr int kRawRow = q4k_tile::kRawRow, kPieces = 3;
  // Pieces 0, 1: the step's 32 qs bytes; piece 2: the super-block's head.
  TESSERA_TILE_HD static Piece piece(int64_t row, int64_t /*n*/, int64_t k, int s, int p) {
    return {q4k_tile::raw_src(row, k / 256, s, p), 16 * p, 16, p == 2};
  }
  TESSERA_TILE_HD static void row_frags(const uint32_t* img, int c, int s, uint32_t (&out)[4][2]) {
    uint32_t h[4];
    words4(img + 8, h);
    q4k_tile::row_frags(img, h, c, s & 3, out);
  }
};

}  // namespace quant_tile
}  // namespace tessera::cuda::detail
