// AVX-512 VNNI quantized matmul on the same ROWS_X8 layout as the AVX2 kernels: one zmm register holds chunk c of two
// adjacent 8-row groups (16 rows, one per 32-bit lane), so every vpdpbusd and every broadcast of 4 activation bytes
// now serves 16 rows instead of 8, the unpacked weights and 6+ token accumulators fit the 32 registers, and the 16
// outputs leave with one masked store. Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni (+ AVX2, FMA, F16C;
// src/CMakeLists.txt); used only at Isa::AVX512_VNNI. Includes no header shared with portable code beyond plain
// declarations (matmul_float_avx2.cpp says why).
// GCC 12's own AVX-512 intrinsics (_mm512_cvtph_ps, _mm512_inserti64x4, ...) start from _mm512_undefined_*(), which
// -O3 reports as uninitialized use: a false positive inside the compiler's headers, silenced for this file only.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>
#include <type_traits>
#include <vector>

#include "backends/cpu/kernels/matmul_internal.h"

namespace tessera::cpu::detail {
namespace {

constexpr int kRows = 2 * kGroup;  // rows per zmm pass

inline __m512i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// 32 bytes of group g in the low half, 32 bytes of group g + 1 in the high half.
inline __m512i load_pair(const void* lo, const void* hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(static_cast<const __m256i*>(lo))),
                            _mm256_loadu_si256(static_cast<const __m256i*>(hi)), 1);
}

inline __m512 load_half16(const uint16_t* lo, const uint16_t* hi) {
  const __m256i h =
      _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lo))),
                              _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi)), 1);
  return _mm512_cvtph_ps(h);
}

// 16 rows' dot products with one activation block; q as in dot_q4x8 (matmul_quant_x86.h), 16 lanes wide.
inline __m512i dot_q4x16(const __m512i* q, const BlockQ8A& x) {
  __m512i s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[0], bcast4(x.qs + 0));
  __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[1], bcast4(x.qs + 4));
  s0 = _mm512_dpbusd_epi32(s0, q[2], bcast4(x.qs + 8));
  s1 = _mm512_dpbusd_epi32(s1, q[3], bcast4(x.qs + 12));
  s0 = _mm512_dpbusd_epi32(s0, q[4], bcast4(x.qs + 16));
  s1 = _mm512_dpbusd_epi32(s1, q[5], bcast4(x.qs + 20));
  s0 = _mm512_dpbusd_epi32(s0, q[6], bcast4(x.qs + 24));
  s1 = _mm512_dpbusd_epi32(s1, q[7], bcast4(x.qs + 28));
  return _mm512_add_epi32(s0, s1);
}

inline void store_rows(float* y, __m512 v, int valid) {
  if (valid == kRows) {
    _mm512_storeu_ps(y, v);
  } else {
    _mm512_mask_storeu_ps(y, static_cast<__mmask16>((1u << valid) - 1), v);
  }
}

// Software prefetch distance of the GEMV's weight stream: one core's hardware prefetcher alone left it at 12.5-15.1 ms
// for Gemma 3's output matrix (one thread; bench_matmul, q8_0 262144x640, CPU time, the machine loaded). 4 KiB ahead
// took 10.8-13.0 ms; 16, 32 and 64 KiB were within each other's noise (medians 10.0, 9.9 and 9.4 ms): 16 KiB, the
// shortest of those, fetches the least past the end of a task's rows.
constexpr int64_t kPrefetchBytes = 16384;

// Groups w0 and w1 (w1 == w0 when the pass has only one group: its upper 8 lanes are computed and not stored).
template <typename Blk, int NT>
void q4x16_tile(const Blk* w0, const Blk* w1, int64_t kb, const BlockQ8A* x /*[NT, kb]*/, float* y, int64_t n,
                int valid) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  __m512 acc[NT];
  for (int i = 0; i < NT; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < kb; ++b) {
    if constexpr (NT == 1) {
      // Decode: the pass's two groups are one contiguous run (w1 == w0 + kb), 2 blocks per step (q8x16_gemv below).
      const char* pf = reinterpret_cast<const char*>(w0) + 2 * b * int64_t{sizeof(Blk)} + kPrefetchBytes;
      for (int l = 0; l < 2 * static_cast<int>(sizeof(Blk)); l += 64) _mm_prefetch(pf + l, _MM_HINT_T0);
    }
    const Blk& b0 = w0[b];
    const Blk& b1 = w1[b];
    const __m512 d16 = load_half16(b0.d, b1.d);
    __m512i q[8];
    for (int c = 0; c < 4; ++c) {
      const __m512i raw = load_pair(b0.qs + 32 * c, b1.qs + 32 * c);
      q[c] = _mm512_and_si512(raw, m4);
      q[4 + c] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
    }
    if constexpr (std::is_same_v<Blk, BlockQ4_1x8>) {
      const __m512 m16 = load_half16(b0.m, b1.m);
      for (int i = 0; i < NT; ++i) {
        const BlockQ8A& xb = x[i * kb + b];
        const __m512 sum = _mm512_cvtepi32_ps(dot_q4x16(q, xb));
        acc[i] = _mm512_fmadd_ps(sum, _mm512_mul_ps(d16, _mm512_set1_ps(xb.d)), acc[i]);
        acc[i] = _mm512_fmadd_ps(m16, _mm512_set1_ps(xb.s), acc[i]);
      }
    } else {
      for (int i = 0; i < NT; ++i) {
        const BlockQ8A& xb = x[i * kb + b];
        const __m512 sum = _mm512_cvtepi32_ps(dot_q4x16(q, xb));
        acc[i] = _mm512_fmadd_ps(sum, _mm512_mul_ps(d16, _mm512_set1_ps(xb.d)), acc[i]);
        acc[i] = _mm512_fmadd_ps(d16, _mm512_set1_ps(-8.0f * xb.s), acc[i]);
      }
    }
  }
  for (int i = 0; i < NT; ++i) store_rows(y + i * n, acc[i], valid);
}

// q8_0 (biased weights, matmul_internal.h): vpdpbusd takes the biased bytes as its unsigned operand and the signed
// activations as they are, and each block's sum is corrected by -128 sum(x) (the block's s) once per token.
template <int NT>
void q8x16_tile(const BlockQ8_0x8* w0, const BlockQ8_0x8* w1, int64_t kb, const BlockQ8A* x, float* y, int64_t n,
                int valid) {
  __m512 acc[NT];
  for (int i = 0; i < NT; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < kb; ++b) {
    const BlockQ8_0x8& b0 = w0[b];
    const BlockQ8_0x8& b1 = w1[b];
    const __m512 d16 = load_half16(b0.d, b1.d);
    __m512i wv[8];
    for (int c = 0; c < 8; ++c) wv[c] = load_pair(b0.qs + 32 * c, b1.qs + 32 * c);
    for (int i = 0; i < NT; ++i) {
      const BlockQ8A& xb = x[i * kb + b];
      __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
      for (int c = 0; c < 8; c += 2) {
        s0 = _mm512_dpbusd_epi32(s0, wv[c], bcast4(xb.qs + 4 * c));
        s1 = _mm512_dpbusd_epi32(s1, wv[c + 1], bcast4(xb.qs + 4 * c + 4));
      }
      const __m512 sum = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
      const __m512 dot = _mm512_fmadd_ps(sum, _mm512_set1_ps(xb.d), _mm512_set1_ps(-128.0f * xb.s));
      acc[i] = _mm512_fmadd_ps(dot, d16, acc[i]);
    }
  }
  for (int i = 0; i < NT; ++i) store_rows(y + i * n, acc[i], valid);
}

// q8_0 at one token (decode; Gemma 3's tied 262,144 x 640 output matrix is 70% of its bytes per token). A group's
// block is 4 whole zmm loads: bytes 64j..64j+63 are chunks 2j and 2j+1 of its 8 rows (matmul_internal.h), so the
// activation operand must hold x's bytes 8j..8j+3 in every lane of the low half and 8j+4..8j+7 in the high half.
// Those 4 vectors per block are the same for every row: built once per call (XPair below) and read from L1 as
// vpdpbusd's memory operand. A pass sums each group's two halves (chunks of even and odd index) into one 16-lane
// vector of two groups' rows, so per 16 rows and block it issues 8 loads, 8 vpdpbusd, 2 shuffles, 2 adds and 3 float
// ops, against 8 load-and-insert pairs and 8 broadcasts for the token-tile kernel above.
struct alignas(64) XPair {
  int32_t v[16];
};

inline __m512i dot_halves(const BlockQ8_0x8& blk, const XPair* xa /*[4]*/) {
  const auto* q = reinterpret_cast<const __m512i*>(blk.qs);
  __m512i s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_loadu_si512(q + 0), _mm512_load_si512(xa[0].v));
  __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_loadu_si512(q + 1), _mm512_load_si512(xa[1].v));
  s0 = _mm512_dpbusd_epi32(s0, _mm512_loadu_si512(q + 2), _mm512_load_si512(xa[2].v));
  s1 = _mm512_dpbusd_epi32(s1, _mm512_loadu_si512(q + 3), _mm512_load_si512(xa[3].v));
  return _mm512_add_epi32(s0, s1);
}

void q8x16_gemv(const MatmulArgs& a, int64_t r0, int64_t r1) {
  const int64_t kb = a.w->k / kBlock;
  const auto* w = static_cast<const BlockQ8_0x8*>(a.w->packed);
  thread_local std::vector<XPair> xpairs;
  thread_local std::vector<float> xd;
  thread_local std::vector<int32_t> xc;  // -128 sum(x_q) per block: the bias's term, exact in int32
  xpairs.resize(static_cast<size_t>(4 * kb));
  xd.resize(static_cast<size_t>(kb));
  xc.resize(static_cast<size_t>(kb));
  for (int64_t b = 0; b < kb; ++b) {
    const BlockQ8A& xb = a.xq[b];
    for (int j = 0; j < 4; ++j) {
      XPair& p = xpairs[static_cast<size_t>(4 * b + j)];
      for (int l = 0; l < 16; ++l) std::memcpy(&p.v[l], xb.qs + 8 * j + (l < 8 ? 0 : 4), 4);
    }
    int32_t sum = 0;
    for (int8_t q : xb.qs) sum += q;
    xd[static_cast<size_t>(b)] = xb.d;
    xc[static_cast<size_t>(b)] = -128 * sum;
  }
  for (int64_t row = r0; row < r1; row += kRows) {
    const int valid = static_cast<int>(r1 - row < kRows ? r1 - row : kRows);
    const BlockQ8_0x8* w0 = w + (row / kGroup) * kb;
    const BlockQ8_0x8* w1 = valid > kGroup ? w0 + kb : w0;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < kb; ++b) {
      const XPair* xa = xpairs.data() + 4 * b;
      // A pass reads its two groups' 2 x kb blocks in one contiguous run (w1 == w0 + kb), at 2 blocks per step.
      const char* pf = reinterpret_cast<const char*>(w0) + 2 * b * int64_t{sizeof(BlockQ8_0x8)} + kPrefetchBytes;
      for (int l = 0; l < 2 * static_cast<int>(sizeof(BlockQ8_0x8)); l += 64) _mm_prefetch(pf + l, _MM_HINT_T0);
      const __m512i g0 = dot_halves(w0[b], xa), g1 = dot_halves(w1[b], xa);
      // [g0 even chunks | g1 even chunks] + [g0 odd chunks | g1 odd chunks]: lanes 0-7 group 0's rows, 8-15 group 1's.
      const __m512i sum = _mm512_add_epi32(_mm512_shuffle_i64x2(g0, g1, 0x44), _mm512_shuffle_i64x2(g0, g1, 0xEE));
      const __m512i dot_q = _mm512_add_epi32(sum, _mm512_set1_epi32(xc[static_cast<size_t>(b)]));  // sum(w x_q)
      const __m512 dot = _mm512_mul_ps(_mm512_cvtepi32_ps(dot_q), _mm512_set1_ps(xd[static_cast<size_t>(b)]));
      acc = _mm512_fmadd_ps(dot, load_half16(w0[b].d, w1[b].d), acc);
    }
    store_rows(a.y + row, acc, valid);
  }
}

// Tokens per tile. With 32 zmm registers, 8 unpacked weight registers plus NT accumulators fit up to NT ~ 16; 8 keeps
// the activation tile (8 tokens x 40 bytes per block) small and the remainder tiles few.
constexpr int kTileQ4 = 8;
constexpr int kTileQ8 = 4;

template <typename Blk, int NT>
void q4_remainder(const Blk* w0, const Blk* w1, int64_t kb, const BlockQ8A* x, float* y, int64_t n, int valid,
                  int64_t r) {
  if constexpr (NT > 0) {
    if (r == NT) return q4x16_tile<Blk, NT>(w0, w1, kb, x, y, n, valid);
    q4_remainder<Blk, NT - 1>(w0, w1, kb, x, y, n, valid, r);
  }
}

template <int NT>
void q8_remainder(const BlockQ8_0x8* w0, const BlockQ8_0x8* w1, int64_t kb, const BlockQ8A* x, float* y, int64_t n,
                  int valid, int64_t r) {
  if constexpr (NT > 0) {
    if (r == NT) return q8x16_tile<NT>(w0, w1, kb, x, y, n, valid);
    q8_remainder<NT - 1>(w0, w1, kb, x, y, n, valid, r);
  }
}

template <typename Blk>
void q4x16_rows(const MatmulArgs& a, int64_t r0, int64_t r1) {
  const int64_t n = a.w->n, kb = a.w->k / kBlock;
  const auto* w = static_cast<const Blk*>(a.w->packed);
  for (int64_t row = r0; row < r1; row += kRows) {
    const int valid = static_cast<int>(r1 - row < kRows ? r1 - row : kRows);
    const Blk* w0 = w + (row / kGroup) * kb;
    const Blk* w1 = valid > kGroup ? w0 + kb : w0;
    int64_t i = 0;
    for (; i + kTileQ4 <= a.t; i += kTileQ4)
      q4x16_tile<Blk, kTileQ4>(w0, w1, kb, a.xq + i * kb, a.y + i * n + row, n, valid);
    if (i < a.t) q4_remainder<Blk, kTileQ4 - 1>(w0, w1, kb, a.xq + i * kb, a.y + i * n + row, n, valid, a.t - i);
  }
}

void q8x16_rows(const MatmulArgs& a, int64_t r0, int64_t r1) {
  if (a.t == 1) return q8x16_gemv(a, r0, r1);
  const int64_t n = a.w->n, kb = a.w->k / kBlock;
  const auto* w = static_cast<const BlockQ8_0x8*>(a.w->packed);
  for (int64_t row = r0; row < r1; row += kRows) {
    const int valid = static_cast<int>(r1 - row < kRows ? r1 - row : kRows);
    const BlockQ8_0x8* w0 = w + (row / kGroup) * kb;
    const BlockQ8_0x8* w1 = valid > kGroup ? w0 + kb : w0;
    int64_t i = 0;
    for (; i + kTileQ8 <= a.t; i += kTileQ8)
      q8x16_tile<kTileQ8>(w0, w1, kb, a.xq + i * kb, a.y + i * n + row, n, valid);
    if (i < a.t) q8_remainder<kTileQ8 - 1>(w0, w1, kb, a.xq + i * kb, a.y + i * n + row, n, valid, a.t - i);
  }
}

}  // namespace

RowKernel avx512_quant_kernel(DType dtype, WeightLayout layout) {
  if (layout != WeightLayout::ROWS_X8) return nullptr;
  switch (dtype) {
    case DType::Q4_0:
      return q4x16_rows<BlockQ4_0x8>;
    case DType::Q4_1:
      return q4x16_rows<BlockQ4_1x8>;
    case DType::Q8_0:
      return q8x16_rows;
    default:
      return nullptr;
  }
}

}  // namespace tessera::cpu::detail
