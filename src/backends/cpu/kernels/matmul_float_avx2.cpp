// AVX2 matmul kernels for f32, f16 and bf16 weights, read in place from the file's row layout.
// Compiled with -mavx2 -mfma -mf16c (src/CMakeLists.txt). This file includes no header with inline functions the
// portable files also use (quant/half.h, std containers): the linker keeps one copy of an inline function, and an
// AVX2-compiled copy would crash the scalar path on an older CPU.
//
// Tile: RT weight rows x TT tokens, RT * TT ymm accumulators over K. Both operands are K-contiguous (x is [T, K], W is
// [N, K]), so each step loads RT weight vectors (converted to f32 once) and uses every token's x vector RT times
// straight from L1 as the FMA's memory operand. 4 x 3 = 12 accumulators + 4 weight registers fill the 16 ymm.
#include <immintrin.h>

#include <cstdint>

#include "backends/cpu/kernels/matmul_internal.h"

namespace tessera::cpu::detail {
namespace {

struct F32W {
  using T = float;
  static __m256 load8(const T* p) { return _mm256_loadu_ps(p); }
  static float load1(const T* p) { return *p; }
};
struct F16W {
  using T = uint16_t;
  static __m256 load8(const T* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static float load1(const T* p) { return _cvtsh_ss(*p); }
};
struct BF16W {
  using T = uint16_t;
  static __m256 load8(const T* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  static float load1(const T* p) {
    const uint32_t u = static_cast<uint32_t>(*p) << 16;
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
  }
};

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// y[i * n + j] for RT rows starting at w (row stride k) and TT tokens starting at x (row stride k).
template <typename W, int RT, int TT>
void tile(const typename W::T* w, const float* x, float* y, int64_t n, int64_t k) {
  __m256 acc[RT][TT];
  for (int j = 0; j < RT; ++j)
    for (int i = 0; i < TT; ++i) acc[j][i] = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 8 <= k; c += 8) {
    __m256 wv[RT];
    for (int j = 0; j < RT; ++j) wv[j] = W::load8(w + j * k + c);
    for (int i = 0; i < TT; ++i) {
      for (int j = 0; j < RT; ++j) acc[j][i] = _mm256_fmadd_ps(wv[j], _mm256_loadu_ps(x + i * k + c), acc[j][i]);
    }
  }
  for (int j = 0; j < RT; ++j) {
    for (int i = 0; i < TT; ++i) {
      float s = hsum8(acc[j][i]);
      for (int64_t cc = c; cc < k; ++cc) s += W::load1(w + j * k + cc) * x[i * k + cc];
      y[i * n + j] = s;
    }
  }
}

// T = 1: the FMA latency (4 cycles) times its throughput (2 per cycle) asks for 8 independent accumulators, so K is
// unrolled by two with a second accumulator per row (4 rows x 2); the 3-token tile above has 12 and needs no unroll.
template <typename W, int RT>
void gemv_tile(const typename W::T* w, const float* x, float* y, int64_t k) {
  __m256 acc[RT][2];
  for (int j = 0; j < RT; ++j) acc[j][0] = acc[j][1] = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 16 <= k; c += 16) {
    const __m256 x0 = _mm256_loadu_ps(x + c), x1 = _mm256_loadu_ps(x + c + 8);
    for (int j = 0; j < RT; ++j) {
      acc[j][0] = _mm256_fmadd_ps(W::load8(w + j * k + c), x0, acc[j][0]);
      acc[j][1] = _mm256_fmadd_ps(W::load8(w + j * k + c + 8), x1, acc[j][1]);
    }
  }
  for (; c + 8 <= k; c += 8) {
    const __m256 x0 = _mm256_loadu_ps(x + c);
    for (int j = 0; j < RT; ++j) acc[j][0] = _mm256_fmadd_ps(W::load8(w + j * k + c), x0, acc[j][0]);
  }
  for (int j = 0; j < RT; ++j) {
    float s = hsum8(_mm256_add_ps(acc[j][0], acc[j][1]));
    for (int64_t cc = c; cc < k; ++cc) s += W::load1(w + j * k + cc) * x[cc];
    y[j] = s;
  }
}

template <typename W, int RT>
void row_tile(const typename W::T* w, const MatmulArgs& a, int64_t row) {
  const int64_t n = a.w->n, k = a.w->k;
  if (a.t == 1) return gemv_tile<W, RT>(w, a.x, a.y + row, k);
  int64_t i = 0;
  for (; i + 3 <= a.t; i += 3) tile<W, RT, 3>(w, a.x + i * k, a.y + i * n + row, n, k);
  if (a.t - i == 2) tile<W, RT, 2>(w, a.x + i * k, a.y + i * n + row, n, k);
  if (a.t - i == 1) tile<W, RT, 1>(w, a.x + i * k, a.y + i * n + row, n, k);
}

template <typename W>
void rows(const MatmulArgs& a, int64_t r0, int64_t r1) {
  const auto* w = static_cast<const typename W::T*>(a.w->rows);
  const int64_t k = a.w->k;
  int64_t row = r0;
  for (; row + 4 <= r1; row += 4) row_tile<W, 4>(w + row * k, a, row);
  for (; row < r1; ++row) row_tile<W, 1>(w + row * k, a, row);
}

}  // namespace

RowKernel avx2_float_kernel(DType dtype, WeightLayout layout) {
  if (layout != WeightLayout::ROWS) return nullptr;
  switch (dtype) {
    case DType::F32:
      return rows<F32W>;
    case DType::F16:
      return rows<F16W>;
    case DType::BF16:
      return rows<BF16W>;
    default:
      return nullptr;
  }
}

}  // namespace tessera::cpu::detail
