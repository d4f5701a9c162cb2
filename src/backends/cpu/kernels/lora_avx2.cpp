// lora.h's accumulate with AVX2/FMA/F16C: per token, 32 columns of y held in four registers while the R rows of Bᵀ
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

template <typename B>
void rows(const float* u, const B& bt, int64_t r, int64_t n, float* y, int64_t t, int64_t c0, int64_t c1) {
  for (int64_t i = 0; i < t; ++i) {
    const float* ui = u + i * r;
    float* yi = y + i * n;
    int64_t c = c0;
    for (; c + 32 <= c1; c += 32) {
      __m256 y0 = _mm256_loadu_ps(yi + c), y1 = _mm256_loadu_ps(yi + c + 8);
      __m256 y2 = _mm256_loadu_ps(yi + c + 16), y3 = _mm256_loadu_ps(yi + c + 24);
      for (int64_t j = 0; j < r; ++j) {
        const __m256 s = _mm256_set1_ps(ui[j]);
        y0 = _mm256_fmadd_ps(s, bt.load8(j, c), y0);
        y1 = _mm256_fmadd_ps(s, bt.load8(j, c + 8), y1);
        y2 = _mm256_fmadd_ps(s, bt.load8(j, c + 16), y2);
        y3 = _mm256_fmadd_ps(s, bt.load8(j, c + 24), y3);
      }
      _mm256_storeu_ps(yi + c, y0);
      _mm256_storeu_ps(yi + c + 8, y1);
      _mm256_storeu_ps(yi + c + 16, y2);
      _mm256_storeu_ps(yi + c + 24, y3);
    }
    for (; c + 8 <= c1; c += 8) {
      __m256 y0 = _mm256_loadu_ps(yi + c);
      for (int64_t j = 0; j < r; ++j) y0 = _mm256_fmadd_ps(_mm256_set1_ps(ui[j]), bt.load8(j, c), y0);
      _mm256_storeu_ps(yi + c, y0);
    }
    for (; c < c1; ++c) {
      float acc = yi[c];
      for (int64_t j = 0; j < r; ++j) acc += ui[j] * bt.load1(j, c);
      yi[c] = acc;
    }
  }
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
