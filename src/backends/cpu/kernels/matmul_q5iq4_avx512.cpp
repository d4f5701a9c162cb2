// AVX-512 VNNI q5_0, q5_1, iq4_nl and iq4_xs matmul on the ROWS_X8 layouts of matmul_q5iq4.h, as
// matmul_quant_avx512.cpp does for q4/q8: one zmm holds chunk c of two adjacent 8-row groups (16 rows, one per 32-bit
// lane), so each vpdpbusd and each 4-byte activation broadcast serves 16 rows, and 8 unpacked weight registers plus 8
// token accumulators fit the 32 registers. q5's fifth bits and iq4's table lookup are matmul_q5iq4_x86.h's, 512 bits
// wide (vpshufb looks up within each 128-bit lane, so the 16-byte table is broadcast to all four); iq4 reads the table
// biased by +128 and takes 128 * s off per block. Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni (+ AVX2,
// FMA, F16C; src/CMakeLists.txt); used only at Isa::AVX512_VNNI.
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -O3 reports as uninitialized use (see
// matmul_quant_avx512.cpp): silenced for this file only.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>

#include "backends/cpu/kernels/matmul_q5iq4.h"

namespace tessera::cpu::detail {
namespace {

constexpr int kRows = 2 * kGroup;  // rows per zmm pass

inline __m512i x4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// 32 bytes of group g in the low half, 32 bytes of group g + 1 in the high half.
inline __m512i load_pair(const void* lo, const void* hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(static_cast<const __m256i*>(lo))),
                            _mm256_loadu_si256(static_cast<const __m256i*>(hi)), 1);
}

inline __m512 half16(const uint16_t* lo, const uint16_t* hi) {
  const __m256i h =
      _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lo))),
                              _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi)), 1);
  return _mm512_cvtph_ps(h);
}

inline void store16(float* y, __m512 v, int valid) {
  if (valid == kRows) {
    _mm512_storeu_ps(y, v);
  } else {
    _mm512_mask_storeu_ps(y, static_cast<__mmask16>((1u << valid) - 1), v);
  }
}

// nib[c]: the codes of elements 4c..4c+3 of 16 rows (matmul_q5iq4_x86.h's unpack_nibbles, two groups).
inline void unpack_nibbles(const uint8_t* qs0, const uint8_t* qs1, __m512i* nib) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  for (int c = 0; c < 4; ++c) {
    const __m512i raw = load_pair(qs0 + 32 * c, qs1 + 32 * c);
    nib[c] = _mm512_and_si512(raw, m4);
    nib[4 + c] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
  }
}

// Bit c of every byte to bit 4 (matmul_q5iq4_x86.h's add_fifth_bits says why the 16-bit shifts are safe).
inline void add_fifth_bits(const uint8_t* qh0, const uint8_t* qh1, __m512i* q) {
  const __m512i h = load_pair(qh0, qh1);
  const __m512i b4 = _mm512_set1_epi8(0x10);
  q[0] = _mm512_or_si512(q[0], _mm512_and_si512(_mm512_slli_epi16(h, 4), b4));
  q[1] = _mm512_or_si512(q[1], _mm512_and_si512(_mm512_slli_epi16(h, 3), b4));
  q[2] = _mm512_or_si512(q[2], _mm512_and_si512(_mm512_slli_epi16(h, 2), b4));
  q[3] = _mm512_or_si512(q[3], _mm512_and_si512(_mm512_slli_epi16(h, 1), b4));
  q[4] = _mm512_or_si512(q[4], _mm512_and_si512(h, b4));
  q[5] = _mm512_or_si512(q[5], _mm512_and_si512(_mm512_srli_epi16(h, 1), b4));
  q[6] = _mm512_or_si512(q[6], _mm512_and_si512(_mm512_srli_epi16(h, 2), b4));
  q[7] = _mm512_or_si512(q[7], _mm512_and_si512(_mm512_srli_epi16(h, 3), b4));
}

inline void iq4_lookup(__m512i* q) {
  const __m512i t = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4Biased)));
  for (int c = 0; c < 8; ++c) q[c] = _mm512_shuffle_epi8(t, q[c]);
}

inline __m512i dot16(const __m512i* q, const BlockQ8A& x) {
  __m512i s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[0], x4(x.qs + 0));
  __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[1], x4(x.qs + 4));
  s0 = _mm512_dpbusd_epi32(s0, q[2], x4(x.qs + 8));
  s1 = _mm512_dpbusd_epi32(s1, q[3], x4(x.qs + 12));
  s0 = _mm512_dpbusd_epi32(s0, q[4], x4(x.qs + 16));
  s1 = _mm512_dpbusd_epi32(s1, q[5], x4(x.qs + 20));
  s0 = _mm512_dpbusd_epi32(s0, q[6], x4(x.qs + 24));
  s1 = _mm512_dpbusd_epi32(s1, q[7], x4(x.qs + 28));
  return _mm512_add_epi32(s0, s1);
}

// 32-element block of 16 rows, unpacked into unsigned codes: y += d * dx * dot + c * s per token.
struct Unpacked {
  __m512i q[8];
  __m512 d, c;
};

struct Q5_0Fmt {
  static constexpr int kBlockElems = kBlock;
  using Blk = BlockQ5_0x8;
  static void unpack(const Blk* w0, const Blk* w1, int64_t b, Unpacked* u) {
    unpack_nibbles(w0[b].qs, w1[b].qs, u->q);
    add_fifth_bits(w0[b].qh, w1[b].qh, u->q);
    u->d = half16(w0[b].d, w1[b].d);
    u->c = _mm512_mul_ps(u->d, _mm512_set1_ps(-16.0f));
  }
};

struct Q5_1Fmt {
  static constexpr int kBlockElems = kBlock;
  using Blk = BlockQ5_1x8;
  static void unpack(const Blk* w0, const Blk* w1, int64_t b, Unpacked* u) {
    unpack_nibbles(w0[b].qs, w1[b].qs, u->q);
    add_fifth_bits(w0[b].qh, w1[b].qh, u->q);
    u->d = half16(w0[b].d, w1[b].d);
    u->c = half16(w0[b].m, w1[b].m);
  }
};

struct IQ4_NLFmt {
  static constexpr int kBlockElems = kBlock;
  using Blk = BlockIQ4_NLx8;
  static void unpack(const Blk* w0, const Blk* w1, int64_t b, Unpacked* u) {
    unpack_nibbles(w0[b].qs, w1[b].qs, u->q);
    iq4_lookup(u->q);
    u->d = half16(w0[b].d, w1[b].d);
    u->c = _mm512_mul_ps(u->d, _mm512_set1_ps(-128.0f));
  }
};

struct IQ4_XSFmt {
  static constexpr int kBlockElems = kBlock * kSubBlocks;
  using Blk = BlockIQ4_XSx8;
  static void unpack(const Blk* w0, const Blk* w1, int64_t b, Unpacked* u) {
    const Blk& s0 = w0[b / kSubBlocks];
    const Blk& s1 = w1[b / kSubBlocks];
    const int j = static_cast<int>(b % kSubBlocks);
    unpack_nibbles(s0.qs[j], s1.qs[j], u->q);
    iq4_lookup(u->q);
    int64_t sc0, sc1;
    std::memcpy(&sc0, s0.sc[j], 8);
    std::memcpy(&sc1, s1.sc[j], 8);
    const __m512i sc = _mm512_cvtepi8_epi32(_mm_set_epi64x(sc1, sc0));
    u->d = _mm512_mul_ps(half16(s0.d, s1.d), _mm512_cvtepi32_ps(sc));
    u->c = _mm512_mul_ps(u->d, _mm512_set1_ps(-128.0f));
  }
};

// Decode (one token) streams the weights once, and one core's hardware prefetcher alone leaves it well short of the
// read bandwidth: each step prefetches the bytes it will reach kPrefetchBytes later (matmul_quant_avx512.cpp measured
// the distance for q8_0).
constexpr int64_t kPrefetchBytes = 16384;

// Groups w0 and w1 (w1 == w0 when the pass has one group: its upper 8 lanes are computed and not stored).
template <typename F, int NT>
void tile16(const typename F::Blk* w0, const typename F::Blk* w1, int64_t kb, const BlockQ8A* x /*[NT, kb]*/, float* y,
            int64_t n, int valid) {
  __m512 acc[NT];
  for (int i = 0; i < NT; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < kb; ++b) {
    if constexpr (NT == 1) {
      // A pass reads its two groups' blocks in one contiguous run (w1 == w0 + blocks per group), kStep bytes per
      // block of 32 on average (iq4_xs's super-blocks too: a burst of 35 lines per super-block measured slower than
      // no prefetch on the K-quants, whose kernels spread them the same way).
      constexpr int kStep = 2 * static_cast<int>(sizeof(typename F::Blk)) / (F::kBlockElems / kBlock);
      const char* pf = reinterpret_cast<const char*>(w0) + b * kStep + kPrefetchBytes;
      for (int l = 0; l < kStep; l += 64) _mm_prefetch(pf + l, _MM_HINT_T0);
    }
    Unpacked u;
    F::unpack(w0, w1, b, &u);
    for (int i = 0; i < NT; ++i) {
      const BlockQ8A& xb = x[i * kb + b];
      const __m512 sum = _mm512_cvtepi32_ps(dot16(u.q, xb));
      acc[i] = _mm512_fmadd_ps(sum, _mm512_mul_ps(u.d, _mm512_set1_ps(xb.d)), acc[i]);
      acc[i] = _mm512_fmadd_ps(u.c, _mm512_set1_ps(xb.s), acc[i]);
    }
  }
  for (int i = 0; i < NT; ++i) store16(y + i * n, acc[i], valid);
}

constexpr int kTile = 8;  // as matmul_quant_avx512.cpp's q4 tile

template <typename F, int NT>
void tile16_remainder(const typename F::Blk* w0, const typename F::Blk* w1, int64_t kb, const BlockQ8A* x, float* y,
                      int64_t n, int valid, int64_t r) {
  if constexpr (NT > 0) {
    if (r == NT) return tile16<F, NT>(w0, w1, kb, x, y, n, valid);
    tile16_remainder<F, NT - 1>(w0, w1, kb, x, y, n, valid, r);
  }
}

template <typename F>
void rows16(const MatmulArgs& a, int64_t r0, int64_t r1) {
  const int64_t n = a.w->n, kb = a.w->k / kBlock;
  const int64_t group_blocks = a.w->k / F::kBlockElems;
  const auto* w = static_cast<const typename F::Blk*>(a.w->packed);
  for (int64_t row = r0; row < r1; row += kRows) {
    const int valid = static_cast<int>(r1 - row < kRows ? r1 - row : kRows);
    const typename F::Blk* w0 = w + (row / kGroup) * group_blocks;
    const typename F::Blk* w1 = valid > kGroup ? w0 + group_blocks : w0;
    int64_t i = 0;
    for (; i + kTile <= a.t; i += kTile) tile16<F, kTile>(w0, w1, kb, a.xq + i * kb, a.y + i * n + row, n, valid);
    if (i < a.t) tile16_remainder<F, kTile - 1>(w0, w1, kb, a.xq + i * kb, a.y + i * n + row, n, valid, a.t - i);
  }
}

}  // namespace

RowKernel avx512_q5iq4_kernel(DType dtype) {
  switch (dtype) {
    case DType::Q5_0:
      return rows16<Q5_0Fmt>;
    case DType::Q5_1:
      return rows16<Q5_1Fmt>;
    case DType::IQ4_NL:
      return rows16<IQ4_NLFmt>;
    case DType::IQ4_XS:
      return rows16<IQ4_XSFmt>;
    default:
      return nullptr;
  }
}

}  // namespace tessera::cpu::detail
