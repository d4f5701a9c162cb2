// q5_0, q5_1, iq4_nl and iq4_xs matmul kernels for AVX2 on the ROWS_X8 layouts of matmul_q5iq4.h, written once and
// compiled twice as matmul_quant_x86.h is: by matmul_q5iq4_avx2.cpp (vpmaddubsw + vpmaddwd) and by
// matmul_q5iq4_avxvnni.cpp (vpdpbusd; TESSERA_QDOT_VNNI selects). Internal linkage throughout; include only from
// those two files.
//
// The scheme is the q4 kernels': per (8-row group, 32-element block) the weights are unpacked once into 8 registers,
// each holding 4 consecutive weights of all 8 rows (one row per 32-bit lane), and serve a tile of tokens, each a
// broadcast of 4 activation bytes per register, so the 8 rows' dot products build up in 8 lanes with no horizontal sum.
// - q5_0 / q5_1: the nibbles as q4's, OR'ed with the fifth bits (one shift and AND per register, see the layout);
//   codes 0..31, so q5_0's -16 and q5_1's minimum enter through the activation sum s as q4_0's -8 and q4_1's do.
// - iq4_nl / iq4_xs: the table lookup in register (vpshufb of the 16 values by the nibbles). vpmaddubsw / vpdpbusd
//   multiply unsigned by signed bytes and the table is signed: with VNNI the table is read biased by +128 (unsigned,
//   1..241) and 128 * sum(x) = 128 * s / dx is taken off per block; vpmaddubsw would saturate on 241 * 127 * 2, so
//   without VNNI |w| multiplies x carrying w's sign (vpsignb), as the q8_0 kernel does.
#pragma once

#include <immintrin.h>

#include <cstring>

#include "backends/cpu/kernels/matmul_q5iq4.h"

#ifndef TESSERA_QDOT_VNNI
#error "define TESSERA_QDOT_VNNI to 0 or 1 before including matmul_q5iq4_x86.h"
#endif

namespace tessera::cpu::detail {
namespace {

inline __m256i x4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

inline __m256 half8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

inline __m256i table16(const void* t) {
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(static_cast<const __m128i*>(t)));
}

inline void store8(float* y, __m256 v, int valid) {
  if (valid == kGroup) {
    _mm256_storeu_ps(y, v);
  } else {
    alignas(32) float tmp[kGroup];
    _mm256_store_ps(tmp, v);
    std::memcpy(y, tmp, sizeof(float) * static_cast<size_t>(valid));
  }
}

// nib[c]: the 4-bit codes of elements 4c..4c+3 of all 8 rows (chunk c of the low nibbles for c < 4, chunk c - 4 of the
// high nibbles for c >= 4), one byte each.
inline void unpack_nibbles(const uint8_t* qs /*[128]*/, __m256i* nib /*[8]*/) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int c = 0; c < 4; ++c) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c));
    nib[c] = _mm256_and_si256(raw, m4);
    nib[4 + c] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
  }
}

// Bit c of every byte of qh (the spread layout) to bit 4: 16-bit shifts move bits across the byte boundary only below
// bit 4 (left shifts of at most 4) or above it (right shifts of at most 3), so the AND keeps each byte's own bit.
inline void add_fifth_bits(const uint8_t* qh /*[32]*/, __m256i* q /*[8]*/) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh));
  const __m256i b4 = _mm256_set1_epi8(0x10);
  q[0] = _mm256_or_si256(q[0], _mm256_and_si256(_mm256_slli_epi16(h, 4), b4));
  q[1] = _mm256_or_si256(q[1], _mm256_and_si256(_mm256_slli_epi16(h, 3), b4));
  q[2] = _mm256_or_si256(q[2], _mm256_and_si256(_mm256_slli_epi16(h, 2), b4));
  q[3] = _mm256_or_si256(q[3], _mm256_and_si256(_mm256_slli_epi16(h, 1), b4));
  q[4] = _mm256_or_si256(q[4], _mm256_and_si256(h, b4));
  q[5] = _mm256_or_si256(q[5], _mm256_and_si256(_mm256_srli_epi16(h, 1), b4));
  q[6] = _mm256_or_si256(q[6], _mm256_and_si256(_mm256_srli_epi16(h, 2), b4));
  q[7] = _mm256_or_si256(q[7], _mm256_and_si256(_mm256_srli_epi16(h, 3), b4));
}

// 8 rows' dot products of unsigned weights (q5's 0..31; with VNNI also iq4's biased 1..241) with one activation block.
inline __m256i dot_u8x8(const __m256i* q, const BlockQ8A& x) {
#if TESSERA_QDOT_VNNI
  __m256i s0 = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), q[0], x4(x.qs + 0));
  __m256i s1 = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), q[1], x4(x.qs + 4));
  s0 = _mm256_dpbusd_avx_epi32(s0, q[2], x4(x.qs + 8));
  s1 = _mm256_dpbusd_avx_epi32(s1, q[3], x4(x.qs + 12));
  s0 = _mm256_dpbusd_avx_epi32(s0, q[4], x4(x.qs + 16));
  s1 = _mm256_dpbusd_avx_epi32(s1, q[5], x4(x.qs + 20));
  s0 = _mm256_dpbusd_avx_epi32(s0, q[6], x4(x.qs + 24));
  s1 = _mm256_dpbusd_avx_epi32(s1, q[7], x4(x.qs + 28));
  return _mm256_add_epi32(s0, s1);
#else
  // q5 codes: a pair of products is at most 2 * 31 * 128 = 7936, four pairs 31744, so each half may sum four
  // vpmaddubsw results in int16 before vpmaddwd widens it (eight would overflow, unlike q4's).
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i s0 = _mm256_maddubs_epi16(q[0], x4(x.qs + 0));
  __m256i s1 = _mm256_maddubs_epi16(q[1], x4(x.qs + 4));
  s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(q[2], x4(x.qs + 8)));
  s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(q[3], x4(x.qs + 12)));
  s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(q[4], x4(x.qs + 16)));
  s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(q[5], x4(x.qs + 20)));
  s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(q[6], x4(x.qs + 24)));
  s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(q[7], x4(x.qs + 28)));
  return _mm256_add_epi32(_mm256_madd_epi16(s0, ones), _mm256_madd_epi16(s1, ones));
#endif
}

#if !TESSERA_QDOT_VNNI
// iq4 without VNNI: sum |w| * (x with w's sign); a pair reaches 2 * 127 * 127 = 32258, so each product pair is
// widened at once.
inline __m256i dot_signed8x8(const __m256i* w, const __m256i* aw, const BlockQ8A& x) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
  for (int c = 0; c < 8; c += 2) {
    const __m256i p0 = _mm256_maddubs_epi16(aw[c], _mm256_sign_epi8(x4(x.qs + 4 * c), w[c]));
    const __m256i p1 = _mm256_maddubs_epi16(aw[c + 1], _mm256_sign_epi8(x4(x.qs + 4 * c + 4), w[c + 1]));
    s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(p0, ones));
    s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(p1, ones));
  }
  return _mm256_add_epi32(s0, s1);
}
#endif

// One 32-element block of 8 rows, unpacked: y += d * dx * dot(x) + c * s per token (c: the offset's coefficient).
struct Unpacked {
  __m256i q[8];
#if !TESSERA_QDOT_VNNI
  __m256i aq[8];  // iq4 only: |w|
#endif
  __m256 d, c;
};

// Per format: Blk, the elements per Blk, kSigned (iq4's table) and unpack(w, b, u) of 32-element block b of a group.
struct Q5_0Fmt {
  static constexpr int kBlockElems = kBlock;
  using Blk = BlockQ5_0x8;
  static constexpr bool kSigned = false;
  static void unpack(const Blk* w, int64_t b, Unpacked* u) {
    unpack_nibbles(w[b].qs, u->q);
    add_fifth_bits(w[b].qh, u->q);
    u->d = half8(w[b].d);
    u->c = _mm256_mul_ps(u->d, _mm256_set1_ps(-16.0f));  // w = d * (q - 16)
  }
};

struct Q5_1Fmt {
  static constexpr int kBlockElems = kBlock;
  using Blk = BlockQ5_1x8;
  static constexpr bool kSigned = false;
  static void unpack(const Blk* w, int64_t b, Unpacked* u) {
    unpack_nibbles(w[b].qs, u->q);
    add_fifth_bits(w[b].qh, u->q);
    u->d = half8(w[b].d);
    u->c = half8(w[b].m);  // w = d * q + m
  }
};

// The table lookup of iq4's codes: with VNNI the biased values (y gets -128 * d * s), else signed values and |w|.
inline void iq4_lookup(const uint8_t* qs, Unpacked* u) {
  unpack_nibbles(qs, u->q);
#if TESSERA_QDOT_VNNI
  const __m256i t = table16(kIQ4Biased);
  for (int c = 0; c < 8; ++c) u->q[c] = _mm256_shuffle_epi8(t, u->q[c]);
#else
  const __m256i t = table16(kIQ4Values), ta = table16(kIQ4Abs);
  for (int c = 0; c < 8; ++c) {
    u->aq[c] = _mm256_shuffle_epi8(ta, u->q[c]);
    u->q[c] = _mm256_shuffle_epi8(t, u->q[c]);
  }
#endif
}

struct IQ4_NLFmt {
  static constexpr int kBlockElems = kBlock;
  using Blk = BlockIQ4_NLx8;
  static constexpr bool kSigned = true;
  static void unpack(const Blk* w, int64_t b, Unpacked* u) {
    iq4_lookup(w[b].qs, u);
    u->d = half8(w[b].d);
    u->c = _mm256_mul_ps(u->d, _mm256_set1_ps(-128.0f));
  }
};

// Block b is sub-block b % 8 of super-block b / 8; its row scales are d * (sc - 32), exact in float.
struct IQ4_XSFmt {
  static constexpr int kBlockElems = kBlock * kSubBlocks;
  using Blk = BlockIQ4_XSx8;
  static constexpr bool kSigned = true;
  static void unpack(const Blk* w, int64_t b, Unpacked* u) {
    const Blk& s = w[b / kSubBlocks];
    const int j = static_cast<int>(b % kSubBlocks);
    iq4_lookup(s.qs[j], u);
    const __m256i sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s.sc[j])));
    u->d = _mm256_mul_ps(half8(s.d), _mm256_cvtepi32_ps(sc));
    u->c = _mm256_mul_ps(u->d, _mm256_set1_ps(-128.0f));
  }
};

template <typename F>
inline __m256i block_dot(const Unpacked& u, const BlockQ8A& x) {
#if TESSERA_QDOT_VNNI
  return dot_u8x8(u.q, x);
#else
  if constexpr (F::kSigned) {
    return dot_signed8x8(u.q, u.aq, x);
  } else {
    return dot_u8x8(u.q, x);
  }
#endif
}

// Without VNNI the signed iq4 dot has no offset (w's own sign is used); every other case adds c * s.
template <typename F>
constexpr bool kAddsOffset = !(F::kSigned && !TESSERA_QDOT_VNNI);

// One 8-row group against NT tokens: y[tok * n + r] for r < valid.
// Decode's software prefetch distance (matmul_quant_avx512.cpp measured it for q8_0 on AVX-512).
constexpr int64_t kPrefetchBytes = 16384;

template <typename F, int NT>
void tile8(const typename F::Blk* w, int64_t kb, const BlockQ8A* x /*[NT, kb]*/, float* y, int64_t n, int valid) {
  __m256 acc[NT];
  for (int i = 0; i < NT; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < kb; ++b) {
    if constexpr (NT == 1) {
      // One token streams the weights once: fetch what this step reaches kPrefetchBytes later, spread evenly over
      // the blocks of 32 (iq4_xs's super-blocks too; a burst per super-block measured slower on the K-quants).
      constexpr int kStep = static_cast<int>(sizeof(typename F::Blk)) / (F::kBlockElems / kBlock);
      const char* pf = reinterpret_cast<const char*>(w) + b * kStep + kPrefetchBytes;
      for (int l = 0; l < kStep; l += 64) _mm_prefetch(pf + l, _MM_HINT_T0);
    }
    Unpacked u;
    F::unpack(w, b, &u);
    for (int i = 0; i < NT; ++i) {
      const BlockQ8A& xb = x[i * kb + b];
      const __m256 sum = _mm256_cvtepi32_ps(block_dot<F>(u, xb));
      acc[i] = _mm256_fmadd_ps(sum, _mm256_mul_ps(u.d, _mm256_set1_ps(xb.d)), acc[i]);
      if constexpr (kAddsOffset<F>) acc[i] = _mm256_fmadd_ps(u.c, _mm256_set1_ps(xb.s), acc[i]);
    }
  }
  for (int i = 0; i < NT; ++i) store8(y + i * n, acc[i], valid);
}

// Tokens per tile: unpacked weights (8 registers, 16 for iq4 without VNNI) plus NT accumulators in the 16 ymm
// registers; q4's measured best was 6 (matmul_quant_x86.h).
template <typename F>
constexpr int kTile = kAddsOffset<F> ? 6 : 4;

template <typename F, int NT>
void tile8_remainder(const typename F::Blk* w, int64_t kb, const BlockQ8A* x, float* y, int64_t n, int valid,
                     int64_t r) {
  if constexpr (NT > 0) {
    if (r == NT) return tile8<F, NT>(w, kb, x, y, n, valid);
    tile8_remainder<F, NT - 1>(w, kb, x, y, n, valid, r);
  }
}

template <typename F>
void rows8(const MatmulArgs& a, int64_t r0, int64_t r1) {
  const int64_t n = a.w->n, kb = a.w->k / kBlock;
  const int64_t group_blocks = a.w->k / F::kBlockElems;  // interleaved blocks per group
  const auto* w = static_cast<const typename F::Blk*>(a.w->packed);
  for (int64_t row = r0; row < r1; row += kGroup) {
    const int valid = static_cast<int>(r1 - row < kGroup ? r1 - row : kGroup);
    const typename F::Blk* wg = w + (row / kGroup) * group_blocks;
    int64_t i = 0;
    for (; i + kTile<F> <= a.t; i += kTile<F>) tile8<F, kTile<F>>(wg, kb, a.xq + i * kb, a.y + i * n + row, n, valid);
    if (i < a.t) tile8_remainder<F, kTile<F> - 1>(wg, kb, a.xq + i * kb, a.y + i * n + row, n, valid, a.t - i);
  }
}

RowKernel q5iq4_rows8(DType dtype) {
  switch (dtype) {
    case DType::Q5_0:
      return rows8<Q5_0Fmt>;
    case DType::Q5_1:
      return rows8<Q5_1Fmt>;
    case DType::IQ4_NL:
      return rows8<IQ4_NLFmt>;
    case DType::IQ4_XS:
      return rows8<IQ4_XSFmt>;
    default:
      return nullptr;
  }
}

}  // namespace
}  // namespace tessera::cpu::detail
