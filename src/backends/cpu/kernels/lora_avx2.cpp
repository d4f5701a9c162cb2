// lora.h's accumulate with AVX2/FMA/F16C: per token, 32 columns of y held in four registers while the r rows of bt
// stream past them (y read and written once; a task's columns of bt stay in L1/L2 across a chunk's tokens).
#include <immintrin.h>

#include "backends/cpu/kernels/lora.h"
#include "quant/half.h"

namespace tessera::cpu::detail {

namespace {

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline float load1(const float* p) { return *p; }
inline float load1(const uint16_t* p) { return fp16_to_f32(*p); }

template <typename B>
void rows(const float* u, const B* bt, float* y, int64_t t, int64_t r, int64_t n, int64_t c0, int64_t c1) {
  for (int64_t i = 0; i < t; ++i) {
    const float* ui = u + i * r;
    float* yi = y + i * n;
    int64_t c = c0;
    for (; c + 32 <= c1; c += 32) {
      __m256 y0 = _mm256_loadu_ps(yi + c), y1 = _mm256_loadu_ps(yi + c + 8);
      __m256 y2 = _mm256_loadu_ps(yi + c + 16), y3 = _mm256_loadu_ps(yi + c + 24);
      for (int64_t j = 0; j < r; ++j) {
        const __m256 s = _mm256_set1_ps(ui[j]);
        const B* b = bt + j * n + c;
        y0 = _mm256_fmadd_ps(s, load8(b), y0);
        y1 = _mm256_fmadd_ps(s, load8(b + 8), y1);
        y2 = _mm256_fmadd_ps(s, load8(b + 16), y2);
        y3 = _mm256_fmadd_ps(s, load8(b + 24), y3);
      }
      _mm256_storeu_ps(yi + c, y0);
      _mm256_storeu_ps(yi + c + 8, y1);
      _mm256_storeu_ps(yi + c + 16, y2);
      _mm256_storeu_ps(yi + c + 24, y3);
    }
    for (; c + 8 <= c1; c += 8) {
      __m256 y0 = _mm256_loadu_ps(yi + c);
      for (int64_t j = 0; j < r; ++j) y0 = _mm256_fmadd_ps(_mm256_set1_ps(ui[j]), load8(bt + j * n + c), y0);
      _mm256_storeu_ps(yi + c, y0);
    }
    for (; c < c1; ++c) {
      float acc = yi[c];
      for (int64_t j = 0; j < r; ++j) acc += ui[j] * load1(bt + j * n + c);
      yi[c] = acc;
    }
  }
}

}  // namespace

void lora_accumulate_rows_avx2(const float* u, const void* bt, bool bt_f16, float* y, int64_t t, int64_t r, int64_t n,
                               int64_t c0, int64_t c1) {
  if (bt_f16)
    rows(u, static_cast<const uint16_t*>(bt), y, t, r, n, c0, c1);
  else
    rows(u, static_cast<const float*>(bt), y, t, r, n, c0, c1);
}

}  // namespace tessera::cpu::detail
