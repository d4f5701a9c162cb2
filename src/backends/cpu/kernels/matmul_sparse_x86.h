// The sparse GEMV kernels (matmul_sparse.h) for x86, written once and compiled twice: by matmul_sparse_avx2.cpp with
// vpmaddubsw + vpmaddwd and by matmul_sparse_avx512.cpp with AVX-512 VNNI's 256-bit vpdpbusd (TESSERA_SPARSE_VNNI).
// Internal linkage only, no std containers (the *_avx2.cpp rule: matmul_float_avx2.cpp says why).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backends/cpu/kernels/matmul_sparse.h"

#ifndef TESSERA_SPARSE_VNNI
#error "define TESSERA_SPARSE_VNNI to 0 or 1 before including matmul_sparse_x86.h"
#endif

namespace tessera::cpu::detail {
namespace {

struct F32S {
  using T = float;
  static __m256 load8(const T* p) { return _mm256_loadu_ps(p); }
};
struct F16S {
  using T = uint16_t;
  static __m256 load8(const T* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
};
struct BF16S {
  using T = uint16_t;
  static __m256 load8(const T* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
};

// Float formats: y[32 rows of chunk r] = sum over nonzero channels c of x[c] * tile[r][c][0..32). Two accumulator
// sets (channels alternate) keep 8 FMA chains in flight.
template <typename W>
void float_chunks(const SparseWeight& w, const SparseX& x, float* y, int64_t c0, int64_t c1) {
  const auto* tiles = static_cast<const typename W::T*>(w.tiles);
  for (int64_t r = c0; r < c1; ++r) {
    const typename W::T* base = tiles + r * w.k * kSparseRows;
    __m256 a[4], b[4];
    for (int i = 0; i < 4; ++i) a[i] = b[i] = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 2 <= x.nnz; j += 2) {
      const typename W::T* p0 = base + static_cast<int64_t>(x.idx[j]) * kSparseRows;
      const typename W::T* p1 = base + static_cast<int64_t>(x.idx[j + 1]) * kSparseRows;
      const __m256 x0 = _mm256_set1_ps(x.val[j]), x1 = _mm256_set1_ps(x.val[j + 1]);
      for (int i = 0; i < 4; ++i) {
        a[i] = _mm256_fmadd_ps(W::load8(p0 + 8 * i), x0, a[i]);
        b[i] = _mm256_fmadd_ps(W::load8(p1 + 8 * i), x1, b[i]);
      }
    }
    if (j < x.nnz) {
      const typename W::T* p0 = base + static_cast<int64_t>(x.idx[j]) * kSparseRows;
      const __m256 x0 = _mm256_set1_ps(x.val[j]);
      for (int i = 0; i < 4; ++i) a[i] = _mm256_fmadd_ps(W::load8(p0 + 8 * i), x0, a[i]);
    }
    const int64_t row0 = r * kSparseRows;
    const int64_t valid = w.n - row0 < kSparseRows ? w.n - row0 : kSparseRows;
    alignas(32) float out[kSparseRows];
    for (int i = 0; i < 4; ++i) _mm256_store_ps(out + 8 * i, _mm256_add_ps(a[i], b[i]));
    std::memcpy(y + row0, out, sizeof(float) * static_cast<size_t>(valid));
  }
}

enum class QFmt { Q8_0, Q4_0, Q4_1 };

// With VNNI, a q4 column's high nibbles (rows 16..31) stay in place, scaled by 16: vpdpbusd takes unsigned bytes up
// to 255, so 16 q (<= 240) times an int8 x sums exactly in 32 bits, and the block's float scale for those rows is
// divided by 16 instead (kHighScale). That saves the shift and a mask per channel. vpmaddubsw sums two such products
// in 16 bits (2 * 240 * 127 > 32767: it would saturate), so the AVX2 path shifts. Likewise q8_0's copy holds w + 128:
// VNNI multiplies it unsigned and subtracts 128 sum(x) per block, where AVX2 restores w and uses vpsignb / vpabsb.
constexpr bool kHighScale = TESSERA_SPARSE_VNNI != 0;

// One channel's 32 rows (its column at byte offset `offset` of the tile's quants) as bytes in row order: q8_0 signed,
// q4 unsigned 0..15 (kHighScale: rows 16..31 times 16).
template <QFmt F>
inline __m256i load_channel(const uint8_t* qs, uint16_t offset) {
  if constexpr (F == QFmt::Q8_0) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + offset));
    // stored as w + 128 (matmul_sparse.h): VNNI multiplies that as unsigned; AVX2 needs w back for vpsignb
    return kHighScale ? v : _mm256_xor_si256(v, _mm256_set1_epi8(static_cast<char>(0x80)));
  } else {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + offset));
    if constexpr (kHighScale) {
      const __m256i m = _mm256_set_m128i(_mm_set1_epi8(static_cast<char>(0xF0)), _mm_set1_epi8(0x0F));
      return _mm256_and_si256(_mm256_broadcastsi128_si256(v), m);
    } else {
      const __m128i m4 = _mm_set1_epi8(0x0F);
      return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4));
    }
  }
}

// acc += per 32-bit lane (one row) the dot product of its 4 weight bytes with the 4 activation bytes in xv.
template <QFmt F>
inline __m256i dot4(__m256i acc, __m256i wq, __m256i xv) {
  if constexpr (F == QFmt::Q8_0 && !kHighScale) {
    // signed weights: |w| times x with w's sign, as the dense q8_0 kernel does
    const __m256i ax = _mm256_sign_epi8(xv, wq);
    wq = _mm256_abs_epi8(wq);
    xv = ax;
  }
#if TESSERA_SPARSE_VNNI
  return _mm256_dpbusd_epi32(acc, wq, xv);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(wq, xv), _mm256_set1_epi16(1)));
#endif
}

template <QFmt F>
void quant_chunks(const SparseWeight& w, const SparseX& x, float* y, int64_t c0, int64_t c1) {
  constexpr int kScales = F == QFmt::Q4_1 ? 2 : 1;
  constexpr uint64_t kTile = 2 * kScales * kSparseRows + (F == QFmt::Q8_0 ? 32 * 32 : 32 * 16);
  const int64_t kb = w.k / 32;
  const auto* tiles = static_cast<const uint8_t*>(w.tiles);
  for (int64_t r = c0; r < c1; ++r) {
    __m256 acc[4];
    for (int i = 0; i < 4; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t bi = 0; bi < x.n_blocks; ++bi) {
      const uint8_t* tile = tiles + static_cast<uint64_t>(r * kb + x.blocks[bi]) * kTile;
      const uint8_t* qs = tile + 2 * kScales * kSparseRows;
      __m256i is[4];
      for (int i = 0; i < 4; ++i) is[i] = _mm256_setzero_si256();
      for (int32_t g = x.group_begin[bi]; g < x.group_begin[bi + 1]; ++g) {
        const uint16_t* ch = x.group_off + 4 * g;
        const __m256i w0 = load_channel<F>(qs, ch[0]), w1 = load_channel<F>(qs, ch[1]);
        const __m256i w2 = load_channel<F>(qs, ch[2]), w3 = load_channel<F>(qs, ch[3]);
        // (row, 4 channels) lanes: t[i] holds rows 4i..4i+3 and 16+4i..16+4i+3 (sparse_lane_row)
        const __m256i a = _mm256_unpacklo_epi8(w0, w1), b = _mm256_unpackhi_epi8(w0, w1);
        const __m256i c = _mm256_unpacklo_epi8(w2, w3), d = _mm256_unpackhi_epi8(w2, w3);
        const __m256i xv = _mm256_set1_epi32(x.group_x[g]);
        is[0] = dot4<F>(is[0], _mm256_unpacklo_epi16(a, c), xv);
        is[1] = dot4<F>(is[1], _mm256_unpackhi_epi16(a, c), xv);
        is[2] = dot4<F>(is[2], _mm256_unpacklo_epi16(b, d), xv);
        is[3] = dot4<F>(is[3], _mm256_unpackhi_epi16(b, d), xv);
      }
      const auto* dh = reinterpret_cast<const uint16_t*>(tile);
      // the activation scale per lane; kHighScale's q4 high halves (rows 16 + 4i..) carry 16 q
      const __m256 xd = F != QFmt::Q8_0 && kHighScale
                            ? _mm256_set_m128(_mm_set1_ps(x.xd[bi] * 0.0625f), _mm_set1_ps(x.xd[bi]))
                            : _mm256_set1_ps(x.xd[bi]);
      if constexpr (F == QFmt::Q8_0 && kHighScale) {
        // sum (w + 128) x - 128 sum x = sum w x, exact in 32 bits
        const __m256i off = _mm256_set1_epi32(128 * x.xq_sum[bi]);
        for (int i = 0; i < 4; ++i) is[i] = _mm256_sub_epi32(is[i], off);
      }
      for (int i = 0; i < 4; ++i) {
        const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dh + 8 * i)));
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[i]), _mm256_mul_ps(dv, xd), acc[i]);
        if constexpr (F == QFmt::Q4_1) {
          const __m256 mv =
              _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dh + kSparseRows + 8 * i)));
          acc[i] = _mm256_fmadd_ps(mv, _mm256_set1_ps(x.xs[bi]), acc[i]);  // q4_1's min: m * sum(x)
        } else if constexpr (F == QFmt::Q4_0) {
          acc[i] = _mm256_fmadd_ps(dv, _mm256_set1_ps(-8.0f * x.xs[bi]), acc[i]);  // q4_0's offset: -8 d sum(x)
        }
      }
    }
    // Lanes back to row order: acc[i]'s low half is rows 4i..4i+3, its high half rows 16+4i..16+4i+3.
    alignas(32) float out[kSparseRows];
    for (int i = 0; i < 4; ++i) {
      _mm_store_ps(out + 4 * i, _mm256_castps256_ps128(acc[i]));
      _mm_store_ps(out + 16 + 4 * i, _mm256_extractf128_ps(acc[i], 1));
    }
    const int64_t row0 = r * kSparseRows;
    const int64_t valid = w.n - row0 < kSparseRows ? w.n - row0 : kSparseRows;
    std::memcpy(y + row0, out, sizeof(float) * static_cast<size_t>(valid));
  }
}

SparseKernel sparse_kernel_for(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return float_chunks<F32S>;
    case DType::F16:
      return float_chunks<F16S>;
    case DType::BF16:
      return float_chunks<BF16S>;
    case DType::Q8_0:
      return quant_chunks<QFmt::Q8_0>;
    case DType::Q4_0:
      return quant_chunks<QFmt::Q4_0>;
    case DType::Q4_1:
      return quant_chunks<QFmt::Q4_1>;
    default:
      return nullptr;
  }
}

}  // namespace
}  // namespace tessera::cpu::detail
