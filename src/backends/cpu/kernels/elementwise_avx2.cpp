// AVX2 elementwise kernels. Compiled with -mavx2 -mfma -mf16c; like every *_avx2.cpp file it includes no header whose
// inline functions the portable files also use (see matmul_float_avx2.cpp).
#include <immintrin.h>

#include <cstdint>

#include "backends/cpu/kernels/avx2_math.h"
#include "backends/cpu/kernels/elementwise_internal.h"

namespace tessera::cpu::detail {
namespace {

float exp1(float v) {
  alignas(32) float buf[8] = {v};
  _mm256_store_ps(buf, exp8(_mm256_load_ps(buf)));
  return buf[0];
}

}  // namespace

void rmsnorm_avx2(const float* x, const float* w, float* y, int64_t t, int64_t d, float eps) {
  for (int64_t i = 0; i < t; ++i, x += d, y += d) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 16 <= d; j += 16) {
      const __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + 8);
      s0 = _mm256_fmadd_ps(a, a, s0);
      s1 = _mm256_fmadd_ps(b, b, s1);
    }
    float ss = hsum8(_mm256_add_ps(s0, s1));
    for (; j < d; ++j) ss += x[j] * x[j];
    const float r = 1.0f / __builtin_sqrtf(ss / static_cast<float>(d) + eps);
    const __m256 vr = _mm256_set1_ps(r);
    for (j = 0; j + 8 <= d; j += 8)
      _mm256_storeu_ps(y + j, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + j), vr), _mm256_loadu_ps(w + j)));
    for (; j < d; ++j) y[j] = x[j] * r * w[j];
  }
}

void swiglu_avx2(const float* gate, const float* up, float* out, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = exp8(_mm256_xor_ps(g, sign));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + exp1(-gate[i])) * up[i];
}

void f32_to_f16_avx2(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

int32_t argmax_avx2(const float* x, int64_t n) {
  // Per-lane running maximum and its first index; strict > keeps the earliest on ties and never takes a NaN.
  __m256 best = _mm256_set1_ps(-__builtin_inff());
  __m256i best_i = _mm256_setzero_si256();
  __m256i cur = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i step = _mm256_set1_epi32(8);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 gt = _mm256_cmp_ps(v, best, _CMP_GT_OQ);
    best = _mm256_blendv_ps(best, v, gt);
    best_i = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(best_i), _mm256_castsi256_ps(cur), gt));
    cur = _mm256_add_epi32(cur, step);
  }
  alignas(32) float bv[8];
  alignas(32) int32_t bi[8];
  _mm256_store_ps(bv, best);
  _mm256_store_si256(reinterpret_cast<__m256i*>(bi), best_i);
  float m = -__builtin_inff();
  int64_t idx = -1;
  for (int l = 0; l < 8; ++l) {
    if (i == 0) break;
    if (bv[l] > m || (bv[l] == m && idx >= 0 && bi[l] < idx)) {
      m = bv[l];
      idx = bi[l];
    }
  }
  for (; i < n; ++i) {
    if (x[i] > m) {
      m = x[i];
      idx = i;
    }
  }
  if (idx < 0) {
    // Everything was -inf or NaN: the first element that is not NaN, as argmax_ref defines it.
    for (int64_t j = 0; j < n; ++j)
      if (x[j] == x[j]) return static_cast<int32_t>(j);
    return 0;
  }
  return static_cast<int32_t>(idx);
}

}  // namespace tessera::cpu::detail
