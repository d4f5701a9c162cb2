// lora.h's accumulate with AVX-512: 64 columns of y per token held in four zmm registers while the R rows of Bᵀ stream
// past them (y read and written once); half the instructions of the AVX2 form for the same bytes of Bᵀ.
// GCC 12's AVX-512 intrinsics trip -Wmaybe-uninitialized inside its own headers (matmul_quant_avx512.cpp says why).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

#include "backends/cpu/kernels/lora.h"

namespace tessera::cpu::detail {

namespace {

// Bᵀ's row j, 16 columns from c (m: the columns that exist), as f32 (I8: times its block's scale).
struct F32B {
  const float* b;
  int64_t r;
  __m512 load16(int64_t j, int64_t c, __mmask16 m) const {
    return _mm512_maskz_loadu_ps(m, b + LoraBtView::at(r, j, c));
  }
};
struct F16B {
  const uint16_t* b;
  int64_t r;
  __m512 load16(int64_t j, int64_t c, __mmask16 m) const {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, b + LoraBtView::at(r, j, c)));
  }
};
struct I8B {
  const int8_t* b;
  const float* d;
  int64_t r;
  __m512 load16(int64_t j, int64_t c, __mmask16 m) const {  // c % 16 == 0: one 32-column block
    const __m512i q = _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, b + LoraBtView::at(r, j, c)));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(d[LoraBtView::at(r, j, c) / 32]));
  }
};

// TT tokens from token 0 of u / y: 64 columns at a time in 4 * TT accumulators, each Bᵀ vector loaded (converted) once
// for the TT tokens. A chunk's tokens come four at a time: 16 independent FMA chains instead of 4 (one token's four
// accumulators wait on the FMA latency), and a quarter of the loads and conversions per FMA.
template <int TT, typename B>
void tokens(const float* u, const B& bt, int64_t r, int64_t n, float* y, int64_t c0, int64_t c1) {
  const __mmask16 all = 0xffff;
  int64_t c = c0;
  for (; c + 64 <= c1; c += 64) {
    __m512 acc[TT][4];
    for (int i = 0; i < TT; ++i)
      for (int q = 0; q < 4; ++q) acc[i][q] = _mm512_loadu_ps(y + i * n + c + 16 * q);
    for (int64_t j = 0; j < r; ++j) {
      __m512 b[4];
      for (int q = 0; q < 4; ++q) b[q] = bt.load16(j, c + 16 * q, all);
      for (int i = 0; i < TT; ++i) {
        const __m512 s = _mm512_set1_ps(u[i * r + j]);
        for (int q = 0; q < 4; ++q) acc[i][q] = _mm512_fmadd_ps(s, b[q], acc[i][q]);
      }
    }
    for (int i = 0; i < TT; ++i)
      for (int q = 0; q < 4; ++q) _mm512_storeu_ps(y + i * n + c + 16 * q, acc[i][q]);
  }
  for (; c < c1; c += 16) {  // 16 columns, or what is left, at a time
    const __mmask16 m = c1 - c >= 16 ? all : static_cast<__mmask16>((1u << (c1 - c)) - 1);
    __m512 acc[TT];
    for (int i = 0; i < TT; ++i) acc[i] = _mm512_maskz_loadu_ps(m, y + i * n + c);
    for (int64_t j = 0; j < r; ++j) {
      const __m512 b = bt.load16(j, c, m);
      for (int i = 0; i < TT; ++i) acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(u[i * r + j]), b, acc[i]);
    }
    for (int i = 0; i < TT; ++i) _mm512_mask_storeu_ps(y + i * n + c, m, acc[i]);
  }
}

template <typename B>
void rows(const float* u, const B& bt, int64_t r, int64_t n, float* y, int64_t t, int64_t c0, int64_t c1) {
  int64_t i = 0;
  for (; i + 4 <= t; i += 4) tokens<4>(u + i * r, bt, r, n, y + i * n, c0, c1);
  for (; i < t; ++i) tokens<1>(u + i * r, bt, r, n, y + i * n, c0, c1);
}

}  // namespace

void lora_accumulate_rows_avx512(const float* u, const LoraBtView& bt, float* y, int64_t t, int64_t c0, int64_t c1) {
  const int64_t r = bt.r, n = bt.n;
  // A vector of columns from a multiple of its width never crosses a tile (or an I8 scale's 32 columns).
  if (c0 % 16 != 0) return lora_accumulate_rows_avx2(u, bt, y, t, c0, c1);
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
