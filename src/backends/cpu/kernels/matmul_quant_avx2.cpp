// AVX2 quantized matmul (vpmaddubsw + vpmaddwd) and the AVX2 activation quantizer. Compiled with -mavx2 -mfma -mf16c
// (src/CMakeLists.txt); used only when cpu_features() reports all three. Like every *_avx2.cpp file, this includes no
// header whose inline functions the portable files also use (matmul_float_avx2.cpp says why).
#define TESSERA_QDOT_VNNI 0
#include "backends/cpu/kernels/matmul_quant_x86.h"

namespace tessera::cpu::detail {
namespace {

inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

inline int32_t hsum8_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

}  // namespace

void quantize_act_avx2(const float* x, BlockQ8A* xq, int64_t k) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  // vpackssdw/vpacksswb work within 128-bit halves; this permutation puts the 32 bytes back in element order.
  const __m256i unshuffle = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < k / kBlock; ++b, x += kBlock) {
    __m256 v[4];
    for (int j = 0; j < 4; ++j) v[j] = _mm256_loadu_ps(x + 8 * j);
    const __m256 m01 = _mm256_max_ps(_mm256_and_ps(v[0], abs_mask), _mm256_and_ps(v[1], abs_mask));
    const __m256 m23 = _mm256_max_ps(_mm256_and_ps(v[2], abs_mask), _mm256_and_ps(v[3], abs_mask));
    const float amax = hmax8(_mm256_max_ps(m01, m23));
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const __m256 vid = _mm256_set1_ps(id);
    __m256i q[4];
    for (int j = 0; j < 4; ++j) q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], vid));
    const int32_t sum = hsum8_epi32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
    const __m256i p16a = _mm256_packs_epi32(q[0], q[1]);
    const __m256i p16b = _mm256_packs_epi32(q[2], q[3]);
    const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b), unshuffle);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq[b].qs), p8);
    xq[b].d = amax / 127.0f;
    xq[b].s = xq[b].d * static_cast<float>(sum);
  }
}

RowKernel avx2_quant_kernel(DType dtype, WeightLayout layout) {
  if (layout != WeightLayout::ROWS_X8) return nullptr;
  switch (dtype) {
    case DType::Q4_0:
      return q4x8_rows<BlockQ4_0x8>;
    case DType::Q4_1:
      return q4x8_rows<BlockQ4_1x8>;
    case DType::Q8_0:
      return q8x8_rows;
    default:
      return nullptr;
  }
}

}  // namespace tessera::cpu::detail
