// The quantized matmul kernels for x86 (ROWS_X8 layout), written once and compiled twice: by matmul_quant_avx2.cpp
// with vpmaddubsw + vpmaddwd, and by matmul_quant_avxvnni.cpp with AVX-VNNI's vpdpbusd, which does the multiply, the
// pairwise adds and the int32 accumulation in one instruction (TESSERA_QDOT_VNNI selects). Everything here has
// internal linkage, so the two compilations never meet at link time. Include only from those two files.
//
// Per (8-row group, block of 32, token) the work is 8 multiply-adds on registers that each hold 4 weights of all 8
// rows (one row per 32-bit lane) against a broadcast of the 4 matching activations, so each lane ends up with its own
// row's dot product: no horizontal sums anywhere, and the 8 outputs are stored with one vector store. The weight
// block is loaded and unpacked once and reused for a tile of tokens (prefill), which is what makes T > 1
// compute-bound rather than bound by re-reading the weights.
#pragma once

#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "backends/cpu/kernels/matmul_internal.h"

#ifndef TESSERA_QDOT_VNNI
#error "define TESSERA_QDOT_VNNI to 0 or 1 before including matmul_quant_x86.h"
#endif

namespace tessera::cpu::detail {
namespace {

inline __m256i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

inline __m256 load_half8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// 8 rows' dot products (one per 32-bit lane) of unpacked 4-bit weights q[0..7] with one activation block. q[c] holds
// the low nibbles of chunk c (elements 4c..4c+3), q[4+c] the high nibbles (elements 16+4c..16+4c+3).
inline __m256i dot_q4x8(const __m256i* q, const BlockQ8A& x) {
#if TESSERA_QDOT_VNNI
  __m256i s0 = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), q[0], bcast4(x.qs + 0));
  __m256i s1 = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), q[1], bcast4(x.qs + 4));
  s0 = _mm256_dpbusd_avx_epi32(s0, q[2], bcast4(x.qs + 8));
  s1 = _mm256_dpbusd_avx_epi32(s1, q[3], bcast4(x.qs + 12));
  s0 = _mm256_dpbusd_avx_epi32(s0, q[4], bcast4(x.qs + 16));
  s1 = _mm256_dpbusd_avx_epi32(s1, q[5], bcast4(x.qs + 20));
  s0 = _mm256_dpbusd_avx_epi32(s0, q[6], bcast4(x.qs + 24));
  s1 = _mm256_dpbusd_avx_epi32(s1, q[7], bcast4(x.qs + 28));
  return _mm256_add_epi32(s0, s1);
#else
  // Products are at most 15 * 127, a pair 3810 and eight pairs 30480, so the int16 sums cannot overflow before
  // vpmaddwd widens them.
  __m256i s0 = _mm256_maddubs_epi16(q[0], bcast4(x.qs + 0));
  __m256i s1 = _mm256_maddubs_epi16(q[1], bcast4(x.qs + 4));
  s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(q[2], bcast4(x.qs + 8)));
  s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(q[3], bcast4(x.qs + 12)));
  s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(q[4], bcast4(x.qs + 16)));
  s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(q[5], bcast4(x.qs + 20)));
  s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(q[6], bcast4(x.qs + 24)));
  s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(q[7], bcast4(x.qs + 28)));
  return _mm256_madd_epi16(_mm256_add_epi16(s0, s1), _mm256_set1_epi16(1));
#endif
}

inline void store_rows(float* y, __m256 v, int valid) {
  if (valid == kGroup) {
    _mm256_storeu_ps(y, v);
  } else {
    alignas(32) float tmp[kGroup];
    _mm256_store_ps(tmp, v);
    std::memcpy(y, tmp, sizeof(float) * static_cast<size_t>(valid));
  }
}

// Decode (one token) streams the weights once: each block step prefetches the block kPrefetchBytes ahead
// (matmul_quant_avx512.cpp measured the distance).
constexpr int64_t kPrefetchBytes = 16384;

template <typename Blk, int NT>
inline void prefetch_ahead(const Blk* blk) {
  if constexpr (NT == 1) {
    const char* pf = reinterpret_cast<const char*>(blk) + kPrefetchBytes;
    for (int l = 0; l < static_cast<int>(sizeof(Blk)); l += 64) _mm_prefetch(pf + l, _MM_HINT_T0);
  }
}

// One 8-row group against NT tokens: y[tok * n + r] for r < valid.
template <typename Blk, int NT>
void q4x8_tile(const Blk* w /*[kb]*/, int64_t kb, const BlockQ8A* x /*[NT, kb]*/, float* y, int64_t n, int valid) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256 acc[NT];
  for (int i = 0; i < NT; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < kb; ++b) {
    prefetch_ahead<Blk, NT>(w + b);
    const Blk& blk = w[b];
    const __m256 d8 = load_half8(blk.d);
    __m256i q[8];
    for (int c = 0; c < 4; ++c) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs + 32 * c));
      q[c] = _mm256_and_si256(raw, m4);
      q[4 + c] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
    }
    if constexpr (std::is_same_v<Blk, BlockQ4_1x8>) {
      const __m256 m8 = load_half8(blk.m);
      for (int i = 0; i < NT; ++i) {
        const BlockQ8A& xb = x[i * kb + b];
        const __m256 sum = _mm256_cvtepi32_ps(dot_q4x8(q, xb));
        acc[i] = _mm256_fmadd_ps(sum, _mm256_mul_ps(d8, _mm256_set1_ps(xb.d)), acc[i]);
        acc[i] = _mm256_fmadd_ps(m8, _mm256_set1_ps(xb.s), acc[i]);  // q4_1's min: m * sum(x)
      }
    } else {
      for (int i = 0; i < NT; ++i) {
        const BlockQ8A& xb = x[i * kb + b];
        const __m256 sum = _mm256_cvtepi32_ps(dot_q4x8(q, xb));
        acc[i] = _mm256_fmadd_ps(sum, _mm256_mul_ps(d8, _mm256_set1_ps(xb.d)), acc[i]);
        acc[i] = _mm256_fmadd_ps(d8, _mm256_set1_ps(-8.0f * xb.s), acc[i]);  // q4_0's offset: d * -8 * sum(x)
      }
    }
  }
  for (int i = 0; i < NT; ++i) store_rows(y + i * n, acc[i], valid);
}

// q8_0 (biased weights, matmul_internal.h). With VNNI, vpdpbusd takes the biased bytes as its unsigned operand and the
// signed activations as they are: the sum is sum((w + 128) x), corrected per block by the caller. Without VNNI a pair
// of products u * x reaches 2 * 255 * 127, past vpmaddubsw's int16, so the bias is flipped back and |w| multiplies x
// carrying w's sign (a pair then reaches 2 * 128 * 127 = 32512), each vpmaddubsw result widened at once.
inline __m256i dot_q8x8(const uint8_t* w /*[8 chunks][8 rows][4]*/, const BlockQ8A& x) {
  __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
  for (int c = 0; c < 8; c += 2) {
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32 * c));
    const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32 * c + 32));
#if TESSERA_QDOT_VNNI
    s0 = _mm256_dpbusd_avx_epi32(s0, w0, bcast4(x.qs + 4 * c));
    s1 = _mm256_dpbusd_avx_epi32(s1, w1, bcast4(x.qs + 4 * c + 4));
#else
    const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
    const __m256i sw0 = _mm256_xor_si256(w0, bias), sw1 = _mm256_xor_si256(w1, bias);
    const __m256i x0 = _mm256_sign_epi8(bcast4(x.qs + 4 * c), sw0);
    const __m256i x1 = _mm256_sign_epi8(bcast4(x.qs + 4 * c + 4), sw1);
    const __m256i ones = _mm256_set1_epi16(1);
    s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(sw0), x0), ones));
    s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(sw1), x1), ones));
#endif
  }
  return _mm256_add_epi32(s0, s1);
}

template <int NT>
void q8x8_tile(const BlockQ8_0x8* w /*[kb]*/, int64_t kb, const BlockQ8A* x /*[NT, kb]*/, float* y, int64_t n,
               int valid) {
  __m256 acc[NT];
  for (int i = 0; i < NT; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < kb; ++b) {
    prefetch_ahead<BlockQ8_0x8, NT>(w + b);
    const BlockQ8_0x8& blk = w[b];
    const __m256 d8 = load_half8(blk.d);
    for (int i = 0; i < NT; ++i) {
      const BlockQ8A& xb = x[i * kb + b];
      const __m256 sum = _mm256_cvtepi32_ps(dot_q8x8(blk.qs, xb));
#if TESSERA_QDOT_VNNI
      // d_x sum((w + 128) x_q) - 128 d_x sum(x_q) = d_x sum(w x_q); then the rows' scales.
      const __m256 dot = _mm256_fmadd_ps(sum, _mm256_set1_ps(xb.d), _mm256_set1_ps(-128.0f * xb.s));
      acc[i] = _mm256_fmadd_ps(dot, d8, acc[i]);
#else
      acc[i] = _mm256_fmadd_ps(sum, _mm256_mul_ps(d8, _mm256_set1_ps(xb.d)), acc[i]);
#endif
    }
  }
  for (int i = 0; i < NT; ++i) store_rows(y + i * n, acc[i], valid);
}

// Tokens per tile: each unpacked weight block serves this many tokens. Measured 2, 4, 6, 8 (bench_layout.cpp, q4_1
// 2048x2048 and 1536x576, T = 64, one thread, CPU time): 6 was best, ~10-15% over 4 and level with 8, whose
// accumulators and unpacked weights no longer fit the 16 ymm registers. q8_0 re-reads its weights per token anyway.
constexpr int kTileQ4 = 6;
constexpr int kTileQ8 = 2;

// A remainder of r < kTileQ4 tokens runs as one tile of r, not r tiles of 1.
template <typename Blk, int NT>
void q4x8_remainder(const Blk* w, int64_t kb, const BlockQ8A* x, float* y, int64_t n, int valid, int64_t r) {
  if constexpr (NT > 0) {
    if (r == NT) return q4x8_tile<Blk, NT>(w, kb, x, y, n, valid);
    q4x8_remainder<Blk, NT - 1>(w, kb, x, y, n, valid, r);
  }
}

template <typename Blk>
void q4x8_tokens(const Blk* w, int64_t kb, const MatmulArgs& a, int64_t row0, int valid) {
  const int64_t n = a.w->n;
  int64_t i = 0;
  for (; i + kTileQ4 <= a.t; i += kTileQ4) q4x8_tile<Blk, kTileQ4>(w, kb, a.xq + i * kb, a.y + i * n + row0, n, valid);
  if (i < a.t) q4x8_remainder<Blk, kTileQ4 - 1>(w, kb, a.xq + i * kb, a.y + i * n + row0, n, valid, a.t - i);
}

template <typename Blk>
void q4x8_rows(const MatmulArgs& a, int64_t r0, int64_t r1) {
  const int64_t kb = a.w->k / kBlock;
  const auto* w = static_cast<const Blk*>(a.w->packed);
  for (int64_t row = r0; row < r1; row += kGroup) {
    const int valid = static_cast<int>(r1 - row < kGroup ? r1 - row : kGroup);
    const Blk* wg = w + (row / kGroup) * kb;
    if (a.t == 1) {
      q4x8_tile<Blk, 1>(wg, kb, a.xq, a.y + row, a.w->n, valid);
    } else {
      q4x8_tokens<Blk>(wg, kb, a, row, valid);
    }
  }
}

void q8x8_rows(const MatmulArgs& a, int64_t r0, int64_t r1) {
  const int64_t n = a.w->n, kb = a.w->k / kBlock;
  const auto* w = static_cast<const BlockQ8_0x8*>(a.w->packed);
  for (int64_t row = r0; row < r1; row += kGroup) {
    const int valid = static_cast<int>(r1 - row < kGroup ? r1 - row : kGroup);
    const BlockQ8_0x8* wg = w + (row / kGroup) * kb;
    int64_t i = 0;
    for (; i + kTileQ8 <= a.t; i += kTileQ8) q8x8_tile<kTileQ8>(wg, kb, a.xq + i * kb, a.y + i * n + row, n, valid);
    for (; i < a.t; ++i) q8x8_tile<1>(wg, kb, a.xq + i * kb, a.y + i * n + row, n, valid);
  }
}

}  // namespace
}  // namespace tessera::cpu::detail
