// The K-quant matmul kernels for x86 on their ROWS_X8 layouts (matmul_kquant.h), written once and compiled three
// times: by matmul_kquant_avx2.cpp (256-bit, vpmaddubsw + vpmaddwd), matmul_kquant_avxvnni.cpp (256-bit, vpdpbusd) and
// matmul_kquant_avx512.cpp (512-bit, vpdpbusd: one zmm holds two adjacent 8-row groups, 16 rows, as the AVX-512
// q4_0 kernels do). TESSERA_KQ_WIDTH (256 or 512) and TESSERA_QDOT_VNNI select. Everything here has internal linkage,
// so the compilations never meet at link time. Include only from those files.
//
// Per (row group, sub-block of 32, token): the codes are unpacked once per sub-block into 8 registers (4 elements of
// every row per register, one row per 32-bit lane) and serve a tile of tokens; the integer dot with the broadcast
// activations lands in each row's own lane (no horizontal sums), then
//   acc += xd * (sum * scale) - min * xs
// with scale and min per row decoded from the bytes the repack wrote, and xs the activations' sum (BlockQ8A's s for
// sub-blocks of 32, the half sums for sub-blocks of 16).
#pragma once

#include <immintrin.h>

#include <cstring>
#include <utility>

#include "backends/cpu/kernels/matmul_kquant.h"

#if !defined(TESSERA_QDOT_VNNI) || !defined(TESSERA_KQ_WIDTH)
#error "define TESSERA_QDOT_VNNI and TESSERA_KQ_WIDTH before including matmul_kquant_x86.h"
#endif

namespace tessera::cpu::detail {
namespace {

#if TESSERA_KQ_WIDTH == 512
using vi = __m512i;
using vf = __m512;
constexpr int kLanes = 16;  // rows per pass: two 8-row groups

// 32 bytes of group 0 in the low half, the same 32 bytes of group 1 in the high half.
inline vi ld(const void* g0, const void* g1) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(static_cast<const __m256i*>(g0))),
                            _mm256_loadu_si256(static_cast<const __m256i*>(g1)), 1);
}
inline __m128i ld8x2(const void* g0, const void* g1) {
  return _mm_unpacklo_epi64(_mm_loadl_epi64(static_cast<const __m128i*>(g0)),
                            _mm_loadl_epi64(static_cast<const __m128i*>(g1)));
}
inline vf ld_half(const uint16_t* g0, const uint16_t* g1) {
  return _mm512_cvtph_ps(
      _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g0))),
                              _mm_loadu_si128(reinterpret_cast<const __m128i*>(g1)), 1));
}
inline vi ld_u8_i32(const void* g0, const void* g1) { return _mm512_cvtepu8_epi32(ld8x2(g0, g1)); }
inline vi ld_i8_i32(const void* g0, const void* g1) { return _mm512_cvtepi8_epi32(ld8x2(g0, g1)); }
inline vi and_(vi a, vi b) { return _mm512_and_si512(a, b); }
inline vi or_(vi a, vi b) { return _mm512_or_si512(a, b); }
inline vi add32(vi a, vi b) { return _mm512_add_epi32(a, b); }
inline vi set8(int v) { return _mm512_set1_epi8(static_cast<char>(v)); }
inline vi set32(int v) { return _mm512_set1_epi32(v); }
inline vi zero_i() { return _mm512_setzero_si512(); }
template <int S>
inline vi shift16(vi v) {  // left by S bits (right for S < 0) within each 16-bit lane
  if constexpr (S > 0) return _mm512_slli_epi16(v, S);
  if constexpr (S < 0) return _mm512_srli_epi16(v, -S);
  return v;
}
inline vi srli32(vi v, int s) { return _mm512_srli_epi32(v, static_cast<unsigned>(s)); }
inline vi bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}
inline vi dpbusd(vi acc, vi u, vi s) { return _mm512_dpbusd_epi32(acc, u, s); }
inline vf cvt(vi v) { return _mm512_cvtepi32_ps(v); }
inline vf setf(float v) { return _mm512_set1_ps(v); }
inline vf zero_f() { return _mm512_setzero_ps(); }
inline vf mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
inline vf fmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
inline vf fnmadd(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); }
inline void store_rows(float* y, vf v, int valid) {
  if (valid == kLanes) {
    _mm512_storeu_ps(y, v);
  } else {
    _mm512_mask_storeu_ps(y, static_cast<__mmask16>((1u << valid) - 1), v);
  }
}
#else
using vi = __m256i;
using vf = __m256;
constexpr int kLanes = 8;  // rows per pass: one 8-row group (g1 is ignored)

inline vi ld(const void* g0, const void*) { return _mm256_loadu_si256(static_cast<const __m256i*>(g0)); }
inline vf ld_half(const uint16_t* g0, const uint16_t*) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g0)));
}
inline vi ld_u8_i32(const void* g0, const void*) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(static_cast<const __m128i*>(g0)));
}
inline vi ld_i8_i32(const void* g0, const void*) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(static_cast<const __m128i*>(g0)));
}
inline vi and_(vi a, vi b) { return _mm256_and_si256(a, b); }
inline vi or_(vi a, vi b) { return _mm256_or_si256(a, b); }
inline vi add32(vi a, vi b) { return _mm256_add_epi32(a, b); }
inline vi set8(int v) { return _mm256_set1_epi8(static_cast<char>(v)); }
inline vi set32(int v) { return _mm256_set1_epi32(v); }
inline vi zero_i() { return _mm256_setzero_si256(); }
template <int S>
inline vi shift16(vi v) {
  if constexpr (S > 0) return _mm256_slli_epi16(v, S);
  if constexpr (S < 0) return _mm256_srli_epi16(v, -S);
  return v;
}
inline vi srli32(vi v, int s) { return _mm256_srli_epi32(v, s); }
inline vi bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}
#if TESSERA_QDOT_VNNI
inline vi dpbusd(vi acc, vi u, vi s) { return _mm256_dpbusd_avx_epi32(acc, u, s); }
#endif
inline vf cvt(vi v) { return _mm256_cvtepi32_ps(v); }
inline vf setf(float v) { return _mm256_set1_ps(v); }
inline vf zero_f() { return _mm256_setzero_ps(); }
inline vf mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
inline vf fmadd(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
inline vf fnmadd(vf a, vf b, vf c) { return _mm256_fnmadd_ps(a, b, c); }
inline void store_rows(float* y, vf v, int valid) {
  if (valid == kLanes) {
    _mm256_storeu_ps(y, v);
  } else {
    alignas(32) float tmp[kLanes];
    _mm256_store_ps(tmp, v);
    std::memcpy(y, tmp, sizeof(float) * static_cast<size_t>(valid));
  }
}
#endif

// Per-lane dot products of 4 code registers q[0..3] (16 elements per row, codes 0..kMax) with 16 activations x.
template <int kMax>
inline vi dot16(const vi* q, const int8_t* x) {
#if TESSERA_QDOT_VNNI || TESSERA_KQ_WIDTH == 512
  const vi s0 = dpbusd(dpbusd(zero_i(), q[0], bcast4(x + 0)), q[2], bcast4(x + 8));
  const vi s1 = dpbusd(dpbusd(zero_i(), q[1], bcast4(x + 4)), q[3], bcast4(x + 12));
  return add32(s0, s1);
#else
  // A vpmaddubsw lane is two products of at most kMax * 127: four lanes fit int16 for codes up to 31 (q5_K), two for
  // q6_K's 63, before vpmaddwd widens them.
  const vi ones = _mm256_set1_epi16(1);
  const vi p0 = _mm256_maddubs_epi16(q[0], bcast4(x + 0));
  const vi p1 = _mm256_maddubs_epi16(q[1], bcast4(x + 4));
  const vi p2 = _mm256_maddubs_epi16(q[2], bcast4(x + 8));
  const vi p3 = _mm256_maddubs_epi16(q[3], bcast4(x + 12));
  if constexpr (4 * 2 * kMax * 127 <= 32767) {
    return _mm256_madd_epi16(_mm256_add_epi16(_mm256_add_epi16(p0, p1), _mm256_add_epi16(p2, p3)), ones);
  } else {
    return _mm256_add_epi32(_mm256_madd_epi16(_mm256_add_epi16(p0, p1), ones),
                            _mm256_madd_epi16(_mm256_add_epi16(p2, p3), ones));
  }
#endif
}

// Moves bit From of every byte to bit To (the other bits must be masked off first).
template <int From, int To>
inline vi move_bit(vi v) {
  return shift16<To - From>(v);
}

// The five formats: unpack(sub-block j) -> 8 code registers; scales(...) -> per-row float scale and min vectors.
// Sub-blocks of 32 give one (scale, min) pair per activation block; sub-blocks of 16 two (lo: elements 0..15).
struct Q4K {
  using Blk = BlockQ4_Kx8;
  static constexpr bool kSub16 = false;
  static constexpr int kMax = 15;
  static void unpack(const Blk& b0, const Blk& b1, int j, vi* q) {
    const vi m4 = set8(0x0F);
    for (int c = 0; c < 4; ++c) {
      const vi raw = ld(b0.qs[j] + 32 * c, b1.qs[j] + 32 * c);
      q[c] = and_(raw, m4);
      q[4 + c] = and_(shift16<-4>(raw), m4);
    }
  }
  static void scales(const Blk& b0, const Blk& b1, int j, vf d, vf dmin, vf* s, vf* m) {
    s[0] = mul(d, cvt(ld_u8_i32(b0.sc[j], b1.sc[j])));
    m[0] = mul(dmin, cvt(ld_u8_i32(b0.m[j], b1.m[j])));
  }
};

struct Q5K {
  using Blk = BlockQ5_Kx8;
  static constexpr bool kSub16 = false;
  static constexpr int kMax = 31;
  template <size_t... I>
  static void high(vi h, vi* q, std::index_sequence<I...>) {
    ((q[I] = or_(q[I], move_bit<I, 4>(and_(h, set8(1 << I))))), ...);
  }
  static void unpack(const Blk& b0, const Blk& b1, int j, vi* q) {
    const vi m4 = set8(0x0F);
    for (int c = 0; c < 4; ++c) {
      const vi raw = ld(b0.qs[j] + 32 * c, b1.qs[j] + 32 * c);
      q[c] = and_(raw, m4);
      q[4 + c] = and_(shift16<-4>(raw), m4);
    }
    high(ld(b0.qh[j], b1.qh[j]), q, std::make_index_sequence<8>{});
  }
  static void scales(const Blk& b0, const Blk& b1, int j, vf d, vf dmin, vf* s, vf* m) {
    s[0] = mul(d, cvt(ld_u8_i32(b0.sc[j], b1.sc[j])));
    m[0] = mul(dmin, cvt(ld_u8_i32(b0.m[j], b1.m[j])));
  }
};

struct Q6K {
  using Blk = BlockQ6_Kx8;
  static constexpr bool kSub16 = true;
  static constexpr int kMax = 63;
  template <size_t... I>
  static void high(vi h, vi* q, std::index_sequence<I...>) {  // bits 2I, 2I + 1 of h -> bits 4, 5 of q[I]
    ((q[I] = or_(q[I], shift16<4 - 2 * static_cast<int>(I)>(and_(h, set8(3 << (2 * I)))))), ...);
  }
  static void unpack(const Blk& b0, const Blk& b1, int j, vi* q) {
    const vi m4 = set8(0x0F);
    for (int c = 0; c < 4; ++c) {
      const vi raw = ld(b0.ql[j] + 32 * c, b1.ql[j] + 32 * c);
      q[c] = and_(raw, m4);
      q[4 + c] = and_(shift16<-4>(raw), m4);
    }
    high(ld(b0.qh[j], b1.qh[j]), q, std::make_index_sequence<4>{});
    high(ld(b0.qh[j] + 32, b1.qh[j] + 32), q + 4, std::make_index_sequence<4>{});
  }
  // w = d sc (u - 32): min = 32 * scale.
  static void scales(const Blk& b0, const Blk& b1, int j, vf d, vf, vf* s, vf* m) {
    s[0] = mul(d, cvt(ld_i8_i32(b0.sc[2 * j], b1.sc[2 * j])));
    s[1] = mul(d, cvt(ld_i8_i32(b0.sc[2 * j + 1], b1.sc[2 * j + 1])));
    m[0] = mul(s[0], setf(32.0f));
    m[1] = mul(s[1], setf(32.0f));
  }
};

struct Q2K {
  using Blk = BlockQ2_Kx8;
  static constexpr bool kSub16 = true;
  static constexpr int kMax = 3;
  template <size_t... I>
  static void low(vi a, vi* q, std::index_sequence<I...>) {
    ((q[I] = and_(shift16<-2 * static_cast<int>(I)>(a), set8(3))), ...);
  }
  static void unpack(const Blk& b0, const Blk& b1, int j, vi* q) {
    low(ld(b0.qs[j], b1.qs[j]), q, std::make_index_sequence<4>{});
    low(ld(b0.qs[j] + 32, b1.qs[j] + 32), q + 4, std::make_index_sequence<4>{});
  }
  static void scales(const Blk& b0, const Blk& b1, int j, vf d, vf dmin, vf* s, vf* m) {
    const vi lo = ld_u8_i32(b0.scm[2 * j], b1.scm[2 * j]), hi = ld_u8_i32(b0.scm[2 * j + 1], b1.scm[2 * j + 1]);
    s[0] = mul(d, cvt(and_(lo, set32(0xF))));
    s[1] = mul(d, cvt(and_(hi, set32(0xF))));
    m[0] = mul(dmin, cvt(srli32(lo, 4)));
    m[1] = mul(dmin, cvt(srli32(hi, 4)));
  }
};

struct Q3K {
  using Blk = BlockQ3_Kx8;
  static constexpr bool kSub16 = true;
  static constexpr int kMax = 7;
  template <size_t... I>
  static void unpack_bits(vi a, vi h, vi* q, std::index_sequence<I...>) {  // register I of 4: 2 low bits + bit 2
    ((q[I] = or_(and_(shift16<-2 * static_cast<int>(I)>(a), set8(3)), move_bit<I, 2>(and_(h, set8(1 << I))))), ...);
  }
  template <size_t... I>
  static void unpack_bits_hi(vi a, vi h, vi* q, std::index_sequence<I...>) {  // registers 4..7
    ((q[I] = or_(and_(shift16<-2 * static_cast<int>(I)>(a), set8(3)), move_bit<I + 4, 2>(and_(h, set8(1 << (I + 4)))))),
     ...);
  }
  static void unpack(const Blk& b0, const Blk& b1, int j, vi* q) {
    const vi h = ld(b0.qh[j], b1.qh[j]);
    unpack_bits(ld(b0.qs[j], b1.qs[j]), h, q, std::make_index_sequence<4>{});
    unpack_bits_hi(ld(b0.qs[j] + 32, b1.qs[j] + 32), h, q + 4, std::make_index_sequence<4>{});
  }
  // w = d (sc - 32) (u - 4): min = 4 * scale.
  static void scales(const Blk& b0, const Blk& b1, int j, vf d, vf, vf* s, vf* m) {
    s[0] = mul(d, cvt(ld_i8_i32(b0.sc[2 * j], b1.sc[2 * j])));
    s[1] = mul(d, cvt(ld_i8_i32(b0.sc[2 * j + 1], b1.sc[2 * j + 1])));
    m[0] = mul(s[0], setf(4.0f));
    m[1] = mul(s[1], setf(4.0f));
  }
};

template <typename Fmt>
inline vf load_dmin(const typename Fmt::Blk& b0, const typename Fmt::Blk& b1) {
  if constexpr (requires { b0.dmin; }) {
    return ld_half(b0.dmin, b1.dmin);
  } else {
    return zero_f();
  }
}

// Decode (one token) streams the weights once, and one core's hardware prefetcher alone leaves it well short of the
// read bandwidth: each super-block step prefetches the bytes it will reach kPrefetchBytes later
// (matmul_quant_avx512.cpp measured the distance for q8_0).
constexpr int64_t kPrefetchBytes = 16384;

// Groups w0 and w1 (w1 == w0 on AVX2, and on AVX-512 when the pass has one group) against NT tokens.
// x: [NT, kb] activation blocks; xs: [NT, kb, 2] half sums (sub-blocks of 16 only).
template <typename Fmt, int NT>
void kq_tile(const typename Fmt::Blk* w0, const typename Fmt::Blk* w1, int64_t kb, const BlockQ8A* x, const float* xs,
             float* y, int64_t n, int valid) {
  vf acc[NT];
  for (int i = 0; i < NT; ++i) acc[i] = zero_f();
  for (int64_t sb = 0; sb < kb / 8; ++sb) {
    const auto& b0 = w0[sb];
    const auto& b1 = w1[sb];
    const vf d = ld_half(b0.d, b1.d);
    const vf dmin = load_dmin<Fmt>(b0, b1);
    for (int j = 0; j < 8; ++j) {
      if constexpr (NT == 1) {
        // A pass reads its groups' super-blocks in one contiguous run (on AVX-512 w1 == w0 + super-blocks per group);
        // each sub-block step prefetches an eighth of a step's bytes, not a burst of 36 lines per super-block.
        constexpr int kStep = kLanes / kGroup * static_cast<int>(sizeof(typename Fmt::Blk));
        const char* pf = reinterpret_cast<const char*>(w0) + sb * kStep + kPrefetchBytes;
        for (int l = j * kStep / 8; l < (j + 1) * kStep / 8; l += 64) _mm_prefetch(pf + l, _MM_HINT_T0);
      }
      vi q[8];
      Fmt::unpack(b0, b1, j, q);
      vf s[2], m[2];
      Fmt::scales(b0, b1, j, d, dmin, s, m);
      const int64_t blk = 8 * sb + j;
      for (int i = 0; i < NT; ++i) {
        const BlockQ8A& xb = x[i * kb + blk];
        const vf xd = setf(xb.d);
        if constexpr (Fmt::kSub16) {
          const float* h = xs + 2 * (i * kb + blk);
          const vf t =
              fmadd(cvt(dot16<Fmt::kMax>(q + 4, xb.qs + 16)), s[1], mul(cvt(dot16<Fmt::kMax>(q, xb.qs)), s[0]));
          acc[i] = fmadd(t, xd, acc[i]);
          acc[i] = fnmadd(m[0], setf(h[0]), acc[i]);
          acc[i] = fnmadd(m[1], setf(h[1]), acc[i]);
        } else {
          const vi sum = add32(dot16<Fmt::kMax>(q, xb.qs), dot16<Fmt::kMax>(q + 4, xb.qs + 16));
          acc[i] = fmadd(cvt(sum), mul(s[0], xd), acc[i]);
          acc[i] = fnmadd(m[0], setf(xb.s), acc[i]);
        }
      }
    }
  }
  for (int i = 0; i < NT; ++i) store_rows(y + i * n, acc[i], valid);
}

// Tokens per tile: the 8 unpacked code registers and the scale vectors serve NT tokens. AVX2's 16 registers hold 8
// codes, 4 scale vectors and 4 accumulators; AVX-512's 32 hold 12: against 8, q6_K's unpacking (the costliest) served
// 1.5x the tokens took 11-14% less CPU time at Gemma 3's 640x2048 and T = 512 (one thread, machine loaded), q4_K the
// same time (q5_0's kernel, matmul_q5iq4_avx512.cpp, measured 10-20% slower at 12 and stays at 8).
constexpr int kTile = TESSERA_KQ_WIDTH == 512 ? 12 : 4;

template <typename Fmt, int NT>
void kq_remainder(const typename Fmt::Blk* w0, const typename Fmt::Blk* w1, int64_t kb, const BlockQ8A* x,
                  const float* xs, float* y, int64_t n, int valid, int64_t r) {
  if constexpr (NT > 0) {
    if (r == NT) return kq_tile<Fmt, NT>(w0, w1, kb, x, xs, y, n, valid);
    kq_remainder<Fmt, NT - 1>(w0, w1, kb, x, xs, y, n, valid, r);
  }
}

template <typename Fmt>
void kq_rows(const MatmulArgs& a, int64_t r0, int64_t r1) {
  using Blk = typename Fmt::Blk;
  const int64_t n = a.w->n, kb = a.w->k / kBlock, sbs = a.w->k / 256;
  const auto* w = static_cast<const Blk*>(a.w->packed);
  for (int64_t row = r0; row < r1; row += kLanes) {
    const int valid = static_cast<int>(r1 - row < kLanes ? r1 - row : kLanes);
    const Blk* w0 = w + (row / kGroup) * sbs;
    const Blk* w1 = valid > kGroup ? w0 + sbs : w0;
    int64_t i = 0;
    for (; i + kTile <= a.t; i += kTile) {
      const float* xs = Fmt::kSub16 ? a.xsum16 + 2 * i * kb : nullptr;
      kq_tile<Fmt, kTile>(w0, w1, kb, a.xq + i * kb, xs, a.y + i * n + row, n, valid);
    }
    if (i < a.t) {
      const float* xs = Fmt::kSub16 ? a.xsum16 + 2 * i * kb : nullptr;
      kq_remainder<Fmt, kTile - 1>(w0, w1, kb, a.xq + i * kb, xs, a.y + i * n + row, n, valid, a.t - i);
    }
  }
}

inline RowKernel kq_kernel(DType dtype, WeightLayout layout) {
  if (layout != WeightLayout::ROWS_X8) return nullptr;
  switch (dtype) {
    case DType::Q2_K:
      return kq_rows<Q2K>;
    case DType::Q3_K:
      return kq_rows<Q3K>;
    case DType::Q4_K:
      return kq_rows<Q4K>;
    case DType::Q5_K:
      return kq_rows<Q5K>;
    case DType::Q6_K:
      return kq_rows<Q6K>;
    default:
      return nullptr;
  }
}

}  // namespace
}  // namespace tessera::cpu::detail
