// GGML-exact quantizers (see quantize_ggml.h). Compiled with -ffp-contract=off: every expression below keeps GGML's
// operand order, and GGML's own reference code is built without FMA contraction (ggml-base has no -march flags), so
// the same separate roundings give the same codes.
#include "quant/quantize_ggml.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "core/error.h"
#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/quant.h"

namespace tessera {
namespace {

// Below this amplitude a group is "all zero" in GGML's K-quant searches.
constexpr float kGroupMaxEps = 1e-15f;

// iq4_nl's 16 levels (GGML's kvalues_iq4nl), ascending.
constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// Float -> int as C's cast does on x86 (cvttss2si) for the values GGML's legacy quantizers meet; 0 outside int's
// range (inf or NaN from a block of subnormals), where the cast would be undefined in C++.
inline int trunc_int(float v) { return v > -0x1p31f && v < 0x1p31f ? static_cast<int>(v) : 0; }

// GGML's nearest_int: round to nearest even through the float adder (1.5 * 2^23 puts the integer in the low mantissa
// bits). Exact for |v| <= 2^22; beyond that GGML's result is whatever the bits say, and so is ours.
inline int nearest_int(float v) {
  const float shifted = v + 12582912.f;
  int32_t i;
  std::memcpy(&i, &shifted, 4);
  return (i & 0x007fffff) - 0x00400000;
}

template <typename Block>
inline void store(void* y, int64_t i, const Block& b) {
  std::memcpy(static_cast<uint8_t*>(y) + i * static_cast<int64_t>(sizeof(Block)), &b, sizeof(Block));
}

// ---- 32-element legacy formats

void q4_0(const float* x, void* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    float amax = 0.0f, max = 0.0f;  // the signed value of largest magnitude maps to -8
    for (int j = 0; j < kQK; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -8;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ4_0 b;
    b.d = f32_to_fp16(d);
    for (int j = 0; j < kQK / 2; ++j) {
      // GGML casts to int8_t before MIN: keep the wrap for the (NaN-free) values that reach it.
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>(trunc_int(x[j] * id + 8.5f))));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>(trunc_int(x[j + kQK / 2] * id + 8.5f))));
      b.qs[j] = static_cast<uint8_t>(static_cast<uint8_t>(q0) | (static_cast<uint8_t>(q1) << 4));
    }
    store(y, i, b);
  }
}

void q4_1(const float* x, void* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < kQK; ++j) {
      if (x[j] < min) min = x[j];
      if (x[j] > max) max = x[j];
    }
    const float d = (max - min) / 15;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ4_1 b;
    b.d = f32_to_fp16(d);
    b.m = f32_to_fp16(min);
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>(trunc_int((x[j] - min) * id + 0.5f))));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>(trunc_int((x[j + kQK / 2] - min) * id + 0.5f))));
      b.qs[j] = static_cast<uint8_t>(static_cast<uint8_t>(q0) | (static_cast<uint8_t>(q1) << 4));
    }
    store(y, i, b);
  }
}

void q5_0(const float* x, void* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < kQK; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -16;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ5_0 b;
    b.d = f32_to_fp16(d);
    uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const auto q0 =
          static_cast<uint8_t>(std::min(31, static_cast<int>(static_cast<int8_t>(trunc_int(x[j] * id + 16.5f)))));
      const auto q1 = static_cast<uint8_t>(
          std::min(31, static_cast<int>(static_cast<int8_t>(trunc_int(x[j + kQK / 2] * id + 16.5f)))));
      b.qs[j] = static_cast<uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
      qh |= ((q0 & 0x10u) >> 4) << j;
      qh |= ((q1 & 0x10u) >> 4) << (j + kQK / 2);
    }
    std::memcpy(b.qh, &qh, 4);
    store(y, i, b);
  }
}

void q5_1(const float* x, void* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < kQK; ++j) {
      if (x[j] < min) min = x[j];
      if (x[j] > max) max = x[j];
    }
    const float d = (max - min) / 31;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ5_1 b;
    b.d = f32_to_fp16(d);
    b.m = f32_to_fp16(min);
    uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      // No clamp here in GGML: (x - min) * id + 0.5 stays below 32 for finite input.
      const auto q0 = static_cast<uint8_t>(trunc_int((x[j] - min) * id + 0.5f));
      const auto q1 = static_cast<uint8_t>(trunc_int((x[j + kQK / 2] - min) * id + 0.5f));
      b.qs[j] = static_cast<uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
      qh |= ((q0 & 0x10u) >> 4) << j;
      qh |= ((q1 & 0x10u) >> 4) << (j + kQK / 2);
    }
    std::memcpy(b.qh, &qh, 4);
    store(y, i, b);
  }
}

void q8_0(const float* x, void* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ8_0 b;
    b.d = f32_to_fp16(d);
    for (int j = 0; j < kQK; ++j) b.qs[j] = static_cast<int8_t>(trunc_int(std::round(x[j] * id)));
    store(y, i, b);
  }
}

// ---- K-quant searches

// Fits x [n] ≈ scale * L + min with L in 0..nmax and min <= 0, minimizing the weighted squared error: a first guess
// from the extremes, then nstep + 1 candidate scales (rmin + rdelta * is + nmax steps over the range), each refit by
// weighted least squares for both scale and min. Returns the scale; *the_min = -min.
// The pointers are __restrict, as GGML's: stores through the uint8_t/int8_t code arrays may otherwise alias the
// floats and keep the compiler from vectorizing the per-element work.
float make_qkx2_quants(int n, int nmax, const float* __restrict x, const float* __restrict weights,
                       uint8_t* __restrict L, float* __restrict the_min, uint8_t* __restrict Laux, float rmin,
                       float rdelta, int nstep) {
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
    float diff = scale * L[i] + min - x[i];
    diff = diff * diff;
    best_error += weights[i] * diff;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * (x[i] - min));
      l = std::max(0, std::min(nmax, l));
      Laux[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      sum_l += w * l;
      sum_l2 += w * l * l;
      sum_xl += w * l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * Laux[i] + this_min - x[i];
        diff = diff * diff;
        cur_error += weights[i] * diff;
      }
      if (cur_error < best_error) {
        for (int i = 0; i < n; ++i) L[i] = Laux[i];
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// Symmetric fit x [n] ≈ scale * (L - nmax), L in 0..2*nmax-1, weights x^2 (GGML's rmse_type 1): the extreme maps to
// -nmax, then 18 nearby scales (nmax ± 0.1 * is) are tried and the best least-squares one kept.
float make_qx_quants(int n, int nmax, const float* __restrict x, int8_t* __restrict L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  float iscale = -nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    int l = nearest_int(iscale * x[i]);
    l = std::max(-nmax, std::min(nmax - 1, l));
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * x[i]);
      l = std::max(-nmax, std::min(nmax - 1, l));
      const float w = x[i] * x[i];
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) {
        const int l = nearest_int(iscale * x[i]);
        L[i] = static_cast<int8_t>(nmax + std::max(-nmax, std::min(nmax - 1, l)));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// 6-bit scale j and min j of q4_K/q5_K's 12-byte packing.
inline void scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
  }
}

// The shared front half of q4_K and q5_K: per sub-block of 32 a weighted min/scale fit, the 8 scales and mins coded in
// 6 bits against the super-block's largest, then every element re-coded with the scale it will be decoded with.
// Fills scales[12], d, dmin and the codes L[256] (0..nmax).
void k_scales_and_codes(const float* x, int nmax, float rmin, int nstep, uint8_t* scales12, uint16_t* d_out,
                        uint16_t* dmin_out, uint8_t* L) {
  uint8_t Laux[32];
  float weights[32], mins[kQKK / 32], scales[kQKK / 32];
  float max_scale = 0, max_min = 0;  // scales are positive: the min is subtracted
  for (int j = 0; j < kQKK / 32; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  std::memset(scales12, 0, 12);
  for (int j = 0; j < kQKK / 32; ++j) {
    // GGML stores nearest_int into a uint8_t before clamping: the wrap is part of the format's bytes.
    auto ls = static_cast<uint8_t>(nearest_int(inv_scale * scales[j]));
    auto lm = static_cast<uint8_t>(nearest_int(inv_min * mins[j]));
    ls = std::min<uint8_t>(63, ls);
    lm = std::min<uint8_t>(63, lm);
    if (j < 4) {
      scales12[j] = ls;
      scales12[j + 4] = lm;
    } else {
      scales12[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
      scales12[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      scales12[j - 0] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  *d_out = f32_to_fp16(max_scale / 63.f);
  *dmin_out = f32_to_fp16(max_min / 63.f);
  for (int j = 0; j < kQKK / 32; ++j) {
    uint8_t sc, m;
    scale_min_k4(j, scales12, &sc, &m);
    const float d = fp16_to_f32(*d_out) * sc;
    if (d == 0.0f) continue;  // the codes of the fit stay
    const float dm = fp16_to_f32(*dmin_out) * m;
    for (int ii = 0; ii < 32; ++ii) {
      const int l = nearest_int((x[32 * j + ii] + dm) / d);
      L[32 * j + ii] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
    }
  }
}

void q4_k(const float* x, void* y, int64_t n) {
  uint8_t L[kQKK];
  for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
    BlockQ4_K b;
    k_scales_and_codes(x, 15, -1.f, 20, b.scales, &b.d, &b.dmin, L);
    uint8_t* q = b.qs;
    for (int j = 0; j < kQKK; j += 64, q += 32)
      for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
    store(y, i, b);
  }
}

void q5_k(const float* x, void* y, int64_t n) {
  uint8_t L[kQKK];
  for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
    BlockQ5_K b;
    k_scales_and_codes(x, 31, -0.5f, 15, b.scales, &b.d, &b.dmin, L);
    std::memset(b.qh, 0, sizeof(b.qh));
    uint8_t* ql = b.qs;
    uint8_t m1 = 1, m2 = 2;
    for (int base = 0; base < kQKK; base += 64, ql += 32) {
      for (int j = 0; j < 32; ++j) {
        int l1 = L[base + j], l2 = L[base + j + 32];
        if (l1 > 15) l1 -= 16, b.qh[j] |= m1;
        if (l2 > 15) l2 -= 16, b.qh[j] |= m2;
        ql[j] = static_cast<uint8_t>(l1 | (l2 << 4));
      }
      m1 = static_cast<uint8_t>(m1 << 2);
      m2 = static_cast<uint8_t>(m2 << 2);
    }
    store(y, i, b);
  }
}

void q6_k(const float* x, void* y, int64_t n) {
  int8_t L[kQKK];
  float scales[kQKK / 16];
  for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < kQKK / 16; ++ib) {
      const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
      scales[ib] = scale;
      if (std::fabs(scale) > max_abs_scale) {
        max_abs_scale = std::fabs(scale);
        max_scale = scale;
      }
    }
    BlockQ6_K b;
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(&b, 0, sizeof(b));
      b.d = f32_to_fp16(0.f);
      store(y, i, b);
      continue;
    }
    const float iscale = -128.f / max_scale;
    b.d = f32_to_fp16(1 / iscale);
    for (int ib = 0; ib < kQKK / 16; ++ib)
      b.scales[ib] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[ib])));
    for (int j = 0; j < kQKK / 16; ++j) {
      const float d = fp16_to_f32(b.d) * b.scales[j];
      if (d == 0.0f) continue;
      for (int ii = 0; ii < 16; ++ii) {
        int l = nearest_int(x[16 * j + ii] / d);
        l = std::max(-32, std::min(31, l));
        L[16 * j + ii] = static_cast<int8_t>(l + 32);
      }
    }
    uint8_t* ql = b.ql;
    uint8_t* qh = b.qh;
    for (int j = 0; j < kQKK; j += 128, ql += 64, qh += 32) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t q1 = L[j + l + 0] & 0xF, q2 = L[j + l + 32] & 0xF;
        const uint8_t q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
        ql[l + 0] = static_cast<uint8_t>(q1 | (q3 << 4));
        ql[l + 32] = static_cast<uint8_t>(q2 | (q4 << 4));
        qh[l] = static_cast<uint8_t>((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                                     ((L[j + l + 96] >> 4) << 6));
      }
    }
    store(y, i, b);
  }
}

// ---- iq4_nl

// The level of kIq4nlValues nearest to v (ties to the lower one): GGML's best_index_int8, whose bisection ends at
// mu = the number of levels <= v, found here by counting instead. Same index, same final comparison, but no
// data-dependent branches: mispredicted branches cost more than the rest of iq4_nl's search (544 lookups per block
// of 32).
inline int best_index_iq4nl(float v) {
  static constexpr float kLevels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  if (v <= kLevels[0]) return 0;
  if (v >= kLevels[15]) return 15;
  int mu = 0;
#if defined(__SSE2__)
  // Four compares of four levels each (SSE2 is x86-64's baseline; cmple is false for NaN, as the scalar <=).
  const __m128 vv = _mm_set1_ps(v);
  const int mask = _mm_movemask_ps(_mm_cmple_ps(_mm_loadu_ps(kLevels + 0), vv)) |
                   _mm_movemask_ps(_mm_cmple_ps(_mm_loadu_ps(kLevels + 4), vv)) << 4 |
                   _mm_movemask_ps(_mm_cmple_ps(_mm_loadu_ps(kLevels + 8), vv)) << 8 |
                   _mm_movemask_ps(_mm_cmple_ps(_mm_loadu_ps(kLevels + 12), vv)) << 12;
  mu = __builtin_popcount(static_cast<unsigned>(mask));
#else
  for (int k = 0; k < 16; ++k) mu += kLevels[k] <= v ? 1 : 0;
#endif
  if (mu == 0) return 15;  // NaN: the bisection never moves its upper end
  // Arithmetic, not a ?: the compiler turns into a jump: which side of the midpoint v falls is a coin toss.
  return mu - static_cast<int>(v - kLevels[mu - 1] < kLevels[mu] - v);
}

// One block of 32 with weights x^2: the extreme maps to level -127, then 15 scales (itry = -7..7 steps from there)
// refit by least squares; the best one is stored and every element re-coded with it (quantize_iq4_nl's ntry = 7, what
// llama-quantize runs; quantize_row_iq4_nl_ref's -1 would differ).
void iq4_nl(const float* x, void* y, int64_t n) {
  constexpr int kTry = 7;
  const int8_t* values = kIq4nlValues;
  for (int64_t ib = 0; ib < n / kQK; ++ib, x += kQK) {
    float weight[kQK];
    uint8_t L[kQK];
    for (int j = 0; j < kQK; ++j) weight[j] = x[j] * x[j];
    float amax = 0, max = 0;
    for (int j = 0; j < kQK; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) {
        amax = ax;
        max = x[j];
      }
    }
    float scale = 0;
    if (amax >= kGroupMaxEps) {
      float d = -max / values[0];
      float id = 1 / d;
      float sumqx = 0, sumq2 = 0;
      for (int j = 0; j < kQK; ++j) {
        const int l = best_index_iq4nl(id * x[j]);
        const float q = values[l];
        const float w = weight[j];
        sumqx += w * q * x[j];
        sumq2 += w * q * q;
      }
      d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
      float best = d * sumqx;
      for (int itry = -kTry; itry <= kTry; ++itry) {
        id = static_cast<float>(itry + values[0]) / max;
        sumqx = sumq2 = 0;
        for (int j = 0; j < kQK; ++j) {
          const int l = best_index_iq4nl(id * x[j]);
          const float q = values[l];
          const float w = weight[j];
          sumqx += w * q * x[j];
          sumq2 += w * q * q;
        }
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
          d = sumqx / sumq2;
          best = d * sumqx;
        }
      }
      scale = d;
    }
    BlockIQ4_NL b;
    b.d = f32_to_fp16(scale);
    const float id = scale != 0.0f ? 1 / scale : 0;
    for (int j = 0; j < kQK; ++j) L[j] = static_cast<uint8_t>(best_index_iq4nl(id * x[j]));
    for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(L[j] | (L[16 + j] << 4));
    store(y, ib, b);
  }
}

// tq1_0 and tq2_0: GGML's quantize_tq*_0 is its reference quantizer (quantize_row_tq*_ref, imatrix ignored), which
// quant.cpp's from_float reproduces (checked against gguf-py's in tests/quant).
void tq1_0(const float* x, void* y, int64_t n) { quantize_row(DType::TQ1_0, x, y, n); }
void tq2_0(const float* x, void* y, int64_t n) { quantize_row(DType::TQ2_0, x, y, n); }

using RowFn = void (*)(const float*, void*, int64_t);

RowFn row_fn(DType t) {
  switch (t) {
    case DType::Q4_0:
      return q4_0;
    case DType::Q4_1:
      return q4_1;
    case DType::Q5_0:
      return q5_0;
    case DType::Q5_1:
      return q5_1;
    case DType::Q8_0:
      return q8_0;
    case DType::Q4_K:
      return q4_k;
    case DType::Q5_K:
      return q5_k;
    case DType::Q6_K:
      return q6_k;
    case DType::IQ4_NL:
      return iq4_nl;
    case DType::TQ1_0:
      return tq1_0;
    case DType::TQ2_0:
      return tq2_0;
    default:
      return nullptr;
  }
}

}  // namespace

bool can_quantize_ggml(DType t) { return row_fn(t) != nullptr; }

void quantize_row_ggml(DType t, const float* x, void* y, int64_t n) {
  const RowFn fn = row_fn(t);
  TESSERA_CHECK(fn != nullptr, "GGML's quantizer for {} is not implemented", dtype_name(t));
  const DTypeInfo& info = dtype_info(t);
  TESSERA_CHECK(n >= 0 && n % info.block_size == 0, "a row of {} elements is not a whole number of {} blocks of {}", n,
                info.name, info.block_size);
  fn(x, y, n);
}

}  // namespace tessera
