// lora.h's accumulate with AVX2/FMA/F16C: 32 columns of y per token held in four registers while the R rows of Bᵀ
// stream past them (y read and written once; a task's columns of Bᵀ stay in L1/L2 across a chunk's tokens).
#include <immintrin.h>

#include "backends/cpu/kernels/lora.h"
#include "quant/half.h"

namespace tessera::cpu::detail {

namespace {

// Bᵀ's row j, 8 columns from c, as f32 (I8: times its block's scale).
struct F32B {
  const float* b;
  int64_t r;
  __m256 load8(int64_t j, int64_t c) const { return _mm256_loadu_ps(b + LoraBtView::at(r, j, c)); }
  float load1(int64_t j, int64_t c) const { return b[LoraBtView::at(r, j, c)]; }
};
struct F16B {
  const uint16_t* b;
  int64_t r;
  __m256 load8(int64_t j, int64_t c) const {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + LoraBtView::at(r, j, c))));
  }
  float load1(int64_t j, int64_t c) const { return fp16_to_f32(b[LoraBtView::at(r, j, c)]); }
};
struct I8B {
  const int8_t* b;
  const float* d;
  int64_t r;
  __m256 load8(int64_t j, int64_t c) const {  // c % 8 == 0: the 8 columns share one 32-column block
    const __m256i q =
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + LoraBtView::at(r, j, c))));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(d[LoraBtView::at(r, j, c) / 32]));
  }
  float load1(int64_t j, int64_t c) const {
    return d[LoraBtView::at(r, j, c) / 32] * static_cast<float>(b[LoraBtView::at(r, j, c)]);
  }
};

// TT tokens from token 0 of u / y: 32 columns at a time in 4 * TT accumulators, each Bᵀ vector loaded (converted) once
// for the TT tokens (a chunk's tokens come two at a time: 8 accumulators and 4 Bᵀ vectors fill the 16 ymm registers).
template <int TT, typename B>
void tokens(const float* u, const B& bt, int64_t r, int64_t n, float* y, int64_t c0, int64_t c1) {
  int64_t c = c0;
  for (; c + 32 <= c1; c += 32) {
    __m256 acc[TT][4];
    for (int i = 0; i < TT; ++i)
      for (int q = 0; q < 4; ++q) acc[i][q] = _mm256_loadu_ps(y + i * n + c + 8 * q);
    for (int64_t j = 0; j < r; ++j) {
      __m256 b[4];
      for (int q = 0; q < 4; ++q) b[q] = bt.load8(j, c + 8 * q);
      for (int i = 0; i < TT; ++i) {
        const __m256 s = _mm256_set1_ps(u[i * r + j]);
        for (int q = 0; q < 4; ++q) acc[i][q] = _mm256_fmadd_ps(s, b[q], acc[i][q]);
      }
    }
    for (int i = 0; i < TT; ++i)
      for (int q = 0; q < 4; ++q) _mm256_storeu_ps(y + i * n + c + 8 * q, acc[i][q]);
  }
  for (; c + 8 <= c1; c += 8) {
    __m256 acc[TT];
    for (int i = 0; i < TT; ++i) acc[i] = _mm256_loadu_ps(y + i * n + c);
    for (int64_t j = 0; j < r; ++j) {
      const __m256 b = bt.load8(j, c);
      for (int i = 0; i < TT; ++i) acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(u[i * r + j]), b, acc[i]);
    }
    for (int i = 0; i < TT; ++i) _mm256_storeu_ps(y + i * n + c, acc[i]);
  }
  for (; c < c1; ++c)
    for (int i = 0; i < TT; ++i) {
      float acc = y[i * n + c];
      for (int64_t j = 0; j < r; ++j) acc += u[i * r + j] * bt.load1(j, c);
      y[i * n + c] = acc;
    }
}

template <typename B>
void rows(const float* u, const B& bt, int64_t r, int64_t n, float* y, int64_t t, int64_t c0, int64_t c1) {
  int64_t i = 0;
  for (; i + 2 <= t; i += 2) tokens<2>(u + i * r, bt, r, n, y + i * n, c0, c1);
  for (; i < t; ++i) tokens<1>(u + i * r, bt, r, n, y + i * n, c0, c1);
}

}  // namespace

void lora_accumulate_rows_avx2(const float* u, const LoraBtView& bt, float* y, int64_t t, int64_t c0, int64_t c1) {
  const int64_t r = bt.r, n = bt.n;
  // A vector of columns from a multiple of its width never crosses a tile (or an I8 scale's 32 columns).
  if (c0 % 8 != 0) return lora_accumulate_rows(u, bt, y, t, c0, c1);
  switch (bt.type) {
    case LoraBt::F32:
      return rows(u, F32B{static_cast<const float*>(bt.data), r}, r, n, y, t, c0, c1);
    case LoraBt::F16:
      return rows(u, F16B{static_cast<const uint16_t*>(bt.data), r}, r, n, y, t, c0, c1);
    case LoraBt::I8:
      return rows(u, I8B{static_cast<const int8_t*>(bt.data), bt.scale, r}, r, n, y, t, c0, c1);
  }
}

}  // namespace tessera::cpu::detail
