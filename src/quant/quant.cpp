// Reference quantize/dequantize. This file is compiled with -ffp-contract=off (see CMakeLists.txt): a fused
// multiply-add would round differently from GGML's and numpy's separate multiply and add, and these functions must be
// bit-exact with them.
#include "quant/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "quant/blocks.h"
#include "quant/format_traits.h"
#include "quant/half.h"

namespace tessera {
namespace {

void f32_from_float(const float* src, void* dst, int64_t n) { std::memcpy(dst, src, static_cast<size_t>(n) * 4); }

void f16_from_float(const float* src, void* dst, int64_t n) {
  auto* d = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = f32_to_fp16(src[i]);
}

void bf16_from_float(const float* src, void* dst, int64_t n) {
  auto* d = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
}

// Float -> int truncation defined for every input. A plain cast of inf, NaN or a value beyond int's range is
// undefined behaviour; the quantizers meet those when 1/d overflows for a block of float subnormals (or on inf/NaN
// inputs). gguf-py's numpy cast (cvttss2si on x86) yields 0 for them, which we keep: the block's fp16 scale is 0
// in the subnormal case, so the codes do not matter for the values.
inline int trunc_to_int(float v) { return v > -0x1p31f && v < 0x1p31f ? static_cast<int>(v) : 0; }

void q4_0_from_float(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ4_0*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, ++b, src += kQK) {
    // The signed value of largest magnitude maps to -8, so the full 16 levels are used on that side.
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < kQK; ++j) {
      if (std::fabs(src[j]) > amax) {
        amax = std::fabs(src[j]);
        max = src[j];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b->d = f32_to_fp16(d);
    for (int j = 0; j < kQK / 2; ++j) {
      const auto q0 = static_cast<uint8_t>(std::min(15, trunc_to_int(src[j] * id + 8.5f)));
      const auto q1 = static_cast<uint8_t>(std::min(15, trunc_to_int(src[j + kQK / 2] * id + 8.5f)));
      b->qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void q4_1_from_float(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ4_1*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, ++b, src += kQK) {
    float lo = src[0], hi = src[0];
    for (int j = 1; j < kQK; ++j) {
      lo = std::min(lo, src[j]);
      hi = std::max(hi, src[j]);
    }
    const float d = (hi - lo) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b->d = f32_to_fp16(d);
    b->m = f32_to_fp16(lo);
    for (int j = 0; j < kQK / 2; ++j) {
      const auto q0 = static_cast<uint8_t>(std::min(15, trunc_to_int((src[j] - lo) * id + 0.5f)));
      const auto q1 = static_cast<uint8_t>(std::min(15, trunc_to_int((src[j + kQK / 2] - lo) * id + 0.5f)));
      b->qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

// q5_0 and q5_1 as GGML's reference quantizers (checked byte for byte against gguf-py's): q4_0's and q4_1's
// arithmetic with 32 levels, the fifth bit of element j in bit j of qh.
void q5_0_from_float(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ5_0*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, ++b, src += kQK) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < kQK; ++j) {
      if (std::fabs(src[j]) > amax) {
        amax = std::fabs(src[j]);
        max = src[j];
      }
    }
    const float d = max / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b->d = f32_to_fp16(d);
    uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const auto q0 = static_cast<uint32_t>(std::min(31, trunc_to_int(src[j] * id + 16.5f)));
      const auto q1 = static_cast<uint32_t>(std::min(31, trunc_to_int(src[j + kQK / 2] * id + 16.5f)));
      b->qs[j] = static_cast<uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
      qh |= ((q0 >> 4) << j) | ((q1 >> 4) << (j + kQK / 2));
    }
    std::memcpy(b->qh, &qh, 4);  // little-endian, as GGML's memcpy
  }
}

void q5_1_from_float(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ5_1*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, ++b, src += kQK) {
    float lo = src[0], hi = src[0];
    for (int j = 1; j < kQK; ++j) {
      lo = std::min(lo, src[j]);
      hi = std::max(hi, src[j]);
    }
    const float d = (hi - lo) / 31.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b->d = f32_to_fp16(d);
    b->m = f32_to_fp16(lo);
    uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const auto q0 = static_cast<uint32_t>(std::min(31, trunc_to_int((src[j] - lo) * id + 0.5f)));
      const auto q1 = static_cast<uint32_t>(std::min(31, trunc_to_int((src[j + kQK / 2] - lo) * id + 0.5f)));
      b->qs[j] = static_cast<uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
      qh |= ((q0 >> 4) << j) | ((q1 >> 4) << (j + kQK / 2));
    }
    std::memcpy(b->qh, &qh, 4);
  }
}

void q8_0_from_float(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_0*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, ++b, src += kQK) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(src[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b->d = f32_to_fp16(d);
    for (int j = 0; j < kQK; ++j) b->qs[j] = static_cast<int8_t>(trunc_to_int(std::round(src[j] * id)));
  }
}

// Tessera's own K-quant quantizers (GGML's search for the best scales is not reproduced; gguf-py has no K-quant
// quantizer to check one against). Scales come from each sub-block's extremes, are rounded to their 6- or 8-bit
// codes relative to the block's fp16 super-scale, and every element is then rounded with the scale it will be
// decoded with, so the round-trip error stays within half a step of the stored scale (tests/quant check the bound).
inline int round_clamp(float v, int lo, int hi) { return std::clamp(trunc_to_int(std::nearbyint(v)), lo, hi); }

// The smallest half >= v (v >= 0 and finite; inf above the largest half): a super-scale rounded up keeps every
// sub-block's scale code within its range, so no code has to be clipped.
uint16_t fp16_at_least(float v) {
  uint16_t h = f32_to_fp16(v);
  if (fp16_to_f32(h) < v && h < 0x7C00u) ++h;
  return h;
}

// The 12 scale bytes of q4_K and q5_K from 6-bit scales and mins (format_detail::q4_k_scale_min reads them).
void pack_q4_k_scales(const uint8_t* sc /*[8]*/, const uint8_t* m /*[8]*/, uint8_t* out /*[12]*/) {
  std::memset(out, 0, 12);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      out[j] |= sc[j];
      out[j + 4] |= m[j];
    } else {
      out[j + 4] = static_cast<uint8_t>((sc[j] & 0xF) | ((m[j] & 0xF) << 4));
      out[j - 4] |= static_cast<uint8_t>((sc[j] >> 4) << 6);
      out[j] |= static_cast<uint8_t>((m[j] >> 4) << 6);
    }
  }
}

// Scales and minimums of the asymmetric K-quants (q2_K, q4_K, q5_K): sub-blocks of `len` elements with
// w = d * sc * q - dmin * m, q in 0..levels, sc and m codes in 0..code_max. The offset m covers the negative part
// (min(x, 0)), so an all-positive sub-block keeps 0 exactly. d is rounded up to a half and each sc up to a code, never
// down (a step rounded down would clip the sub-block's largest element); m is rounded to nearest. Writes the fp16
// d and dmin and the codes; `steps` and `offsets` receive d * sc and dmin * m, the values the elements are rounded
// with.
void min_scales(const float* src, int n_sub, int len, int levels, int code_max, uint16_t* d_out, uint16_t* dmin_out,
                uint8_t* sc, uint8_t* m, float* steps, float* offsets) {
  float scale[16], minus[16], max_scale = 0.0f, max_minus = 0.0f;
  for (int j = 0; j < n_sub; ++j) {
    float lo = 0.0f, hi = 0.0f;
    for (int l = 0; l < len; ++l) {
      lo = std::min(lo, src[len * j + l]);
      hi = std::max(hi, src[len * j + l]);
    }
    scale[j] = (hi - lo) / static_cast<float>(levels);
    minus[j] = -lo;
    max_scale = std::max(max_scale, scale[j]);
    max_minus = std::max(max_minus, minus[j]);
  }
  *d_out = fp16_at_least(max_scale / static_cast<float>(code_max));
  *dmin_out = f32_to_fp16(max_minus / static_cast<float>(code_max));
  const float d = fp16_to_f32(*d_out), dmin = fp16_to_f32(*dmin_out);
  for (int j = 0; j < n_sub; ++j) {
    sc[j] = d > 0.0f ? static_cast<uint8_t>(std::clamp(trunc_to_int(std::ceil(scale[j] / d)), 0, code_max)) : 0;
    m[j] = dmin > 0.0f ? static_cast<uint8_t>(round_clamp(minus[j] / dmin, 0, code_max)) : 0;
    steps[j] = d * static_cast<float>(sc[j]);
    offsets[j] = dmin * static_cast<float>(m[j]);
  }
}

// Codes 0..levels of `len` elements rounded with the decoder's step and offset.
void min_codes(const float* src, int len, float step, float offset, int levels, uint8_t* code) {
  const float inv = step > 0.0f ? 1.0f / step : 0.0f;
  for (int l = 0; l < len; ++l) code[l] = static_cast<uint8_t>(round_clamp((src[l] + offset) * inv, 0, levels));
}

// q4_K: sub-block of 32, q in 0..15, sc and m 6-bit.
void q4_k_from_float(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ4_K*>(dst);
  for (int64_t i = 0; i < n / kQKK; ++i, ++b, src += kQKK) {
    uint8_t sc[8], m[8], code[kQKK];
    float steps[8], offsets[8];
    min_scales(src, 8, 32, 15, 63, &b->d, &b->dmin, sc, m, steps, offsets);
    pack_q4_k_scales(sc, m, b->scales);
    for (int j = 0; j < 8; ++j) min_codes(src + 32 * j, 32, steps[j], offsets[j], 15, code + 32 * j);
    // Sub-block 2i in the low nibbles of qs[32i .. 32i + 31], 2i + 1 in the high ones.
    for (int j = 0; j < 8; j += 2)
      for (int l = 0; l < 32; ++l)
        b->qs[16 * j + l] = static_cast<uint8_t>(code[32 * j + l] | (code[32 * j + 32 + l] << 4));
  }
}

// q5_K: q4_K with 32 levels; bit 4 of element l of sub-block j goes to bit j of qh[l].
void q5_k_from_float(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ5_K*>(dst);
  for (int64_t i = 0; i < n / kQKK; ++i, ++b, src += kQKK) {
    uint8_t sc[8], m[8], code[kQKK];
    float steps[8], offsets[8];
    min_scales(src, 8, 32, 31, 63, &b->d, &b->dmin, sc, m, steps, offsets);
    pack_q4_k_scales(sc, m, b->scales);
    for (int j = 0; j < 8; ++j) min_codes(src + 32 * j, 32, steps[j], offsets[j], 31, code + 32 * j);
    std::memset(b->qh, 0, sizeof(b->qh));
    for (int j = 0; j < 8; ++j) {
      for (int l = 0; l < 32; ++l) {
        const int c = code[32 * j + l];
        uint8_t& q = b->qs[32 * (j / 2) + l];
        q = (j & 1) ? static_cast<uint8_t>((q & 0x0F) | ((c & 0xF) << 4)) : static_cast<uint8_t>(c & 0xF);
        b->qh[l] |= static_cast<uint8_t>((c >> 4) << j);
      }
    }
  }
}

// Places the 2-bit fields of 256 codes as q2_K's and q3_K's qs (format_detail::k_quant_2bit).
void pack_2bit(const uint8_t* code /*[256]*/, uint8_t* qs /*[64]*/) {
  std::memset(qs, 0, kQKK / 4);
  for (int e = 0; e < kQKK; ++e)
    qs[32 * (e / 128) + e % 32] |= static_cast<uint8_t>((code[e] & 3) << (2 * ((e % 128) / 32)));
}

// q2_K: sub-block of 16, q in 0..3, sc and m 4-bit (low and high nibble of scales[j]).
void q2_k_from_float(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ2_K*>(dst);
  for (int64_t i = 0; i < n / kQKK; ++i, ++b, src += kQKK) {
    uint8_t sc[16], m[16], code[kQKK];
    float steps[16], offsets[16];
    min_scales(src, 16, 16, 3, 15, &b->d, &b->dmin, sc, m, steps, offsets);
    for (int j = 0; j < 16; ++j) {
      b->scales[j] = static_cast<uint8_t>(sc[j] | (m[j] << 4));
      min_codes(src + 16 * j, 16, steps[j], offsets[j], 3, code + 16 * j);
    }
    pack_2bit(code, b->qs);
  }
}

// q3_K: sub-block of 16 with w = d * s * q, s = sc - 32 in -32..31, q in -4..3. As q6_K: the element of largest
// magnitude maps to -4 steps (s rounded away from zero, d up to a half), so an element of the other sign at the same
// magnitude is clipped from +4 to +3 steps, one step off at most.
void q3_k_from_float(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ3_K*>(dst);
  for (int64_t i = 0; i < n / kQKK; ++i, ++b, src += kQKK) {
    float scale[16], max_abs = 0.0f;
    for (int j = 0; j < 16; ++j) {
      float amax = 0.0f, max = 0.0f;
      for (int l = 0; l < 16; ++l) {
        if (std::fabs(src[16 * j + l]) > amax) {
          amax = std::fabs(src[16 * j + l]);
          max = src[16 * j + l];
        }
      }
      scale[j] = max / -4.0f;
      max_abs = std::max(max_abs, std::fabs(scale[j]));
    }
    b->d = fp16_at_least(max_abs / 31.0f);
    const float d = fp16_to_f32(b->d);
    uint8_t code[kQKK];
    std::memset(b->scales, 0, sizeof(b->scales));
    std::memset(b->hmask, 0, sizeof(b->hmask));
    for (int j = 0; j < 16; ++j) {
      const float r = d > 0.0f ? scale[j] / d : 0.0f;
      const int s = std::clamp(trunc_to_int(r < 0 ? std::floor(r) : std::ceil(r)), -32, 31);
      const int sc = s + 32;  // 6 bits: 4 low as nibbles of bytes 0..7, 2 high in bytes 8..11
      b->scales[j % 8] |= static_cast<uint8_t>((sc & 0xF) << (j < 8 ? 0 : 4));
      b->scales[8 + j % 4] |= static_cast<uint8_t>((sc >> 4) << (2 * (j / 4)));
      const float step = d * static_cast<float>(s);
      const float inv = step != 0.0f ? 1.0f / step : 0.0f;
      for (int l = 0; l < 16; ++l) {
        const int e = 16 * j + l;
        code[e] = static_cast<uint8_t>(round_clamp(src[e] * inv, -4, 3) + 4);  // 0..7: bit 2 is the high bit
        b->hmask[e % 32] |= static_cast<uint8_t>((code[e] >> 2) << (e / 32));
      }
    }
    pack_2bit(code, b->qs);
  }
}

// q6_K: sub-block of 16 with w = d * sc * (q - 32), q in 0..63, sc int8. The element of largest magnitude maps to
// code 0 (value -32 steps), using the full 64 levels on its side as q4_0 does; an element of the other sign at the same
// magnitude would round to +32 and is clipped to 31, one step off at most.
void q6_k_from_float(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ6_K*>(dst);
  for (int64_t i = 0; i < n / kQKK; ++i, ++b, src += kQKK) {
    float scale[16], max_abs = 0.0f;
    for (int j = 0; j < 16; ++j) {
      float amax = 0.0f, max = 0.0f;
      for (int l = 0; l < 16; ++l) {
        if (std::fabs(src[16 * j + l]) > amax) {
          amax = std::fabs(src[16 * j + l]);
          max = src[16 * j + l];
        }
      }
      scale[j] = max / -32.0f;
      max_abs = std::max(max_abs, std::fabs(scale[j]));
    }
    b->d = fp16_at_least(max_abs / 127.0f);
    const float d = fp16_to_f32(b->d);
    uint8_t code[kQKK];
    for (int j = 0; j < 16; ++j) {
      // Rounded away from zero, as q4_K's scales: a step at least the sub-block's |max| / 32 never clips its extreme.
      const float r = d > 0.0f ? scale[j] / d : 0.0f;
      b->scales[j] = static_cast<int8_t>(std::clamp(trunc_to_int(r < 0 ? std::floor(r) : std::ceil(r)), -127, 127));
      const float step = d * static_cast<float>(b->scales[j]);
      const float inv = step != 0.0f ? 1.0f / step : 0.0f;
      for (int l = 0; l < 16; ++l)
        code[16 * j + l] = static_cast<uint8_t>(round_clamp(src[16 * j + l] * inv, -32, 31) + 32);
    }
    // GGML's bit layout (format_detail::q6_k_code): per half of 128, ql holds the low nibbles of elements l and
    // l + 64 (l < 64), qh the high 2 bits of l, l + 32, l + 64, l + 96 (l < 32).
    for (int half = 0; half < 2; ++half) {
      const uint8_t* c = code + 128 * half;
      uint8_t* ql = b->ql + 64 * half;
      uint8_t* qh = b->qh + 32 * half;
      for (int l = 0; l < 32; ++l) {
        ql[l] = static_cast<uint8_t>((c[l] & 0xF) | ((c[l + 64] & 0xF) << 4));
        ql[l + 32] = static_cast<uint8_t>((c[l + 32] & 0xF) | ((c[l + 96] & 0xF) << 4));
        qh[l] = static_cast<uint8_t>((c[l] >> 4) | ((c[l + 32] >> 4) << 2) | ((c[l + 64] >> 4) << 4) |
                                     ((c[l + 96] >> 4) << 6));
      }
    }
  }
}

// Tessera's own iq4 quantizers (a GGML-exact search is another file's job): for each block the scale comes from a
// small search (a dozen trial scales around max / -127, each refitted by least squares for its codes, the lowest
// squared error kept), and every code is the table value nearest to x / (the stored scale), so the round-trip error
// of an element is at most half the table's widest gap (12 steps) times the scale inside the table's range
// (tests/quant check both properties).
int iq4_nearest(float t) {
  int best = 0;
  float err = std::fabs(t - static_cast<float>(format_detail::iq4nl_value(0)));
  for (int c = 1; c < 16; ++c) {
    const float e = std::fabs(t - static_cast<float>(format_detail::iq4nl_value(c)));
    if (e < err) {
      err = e;
      best = c;
    }
  }
  return best;
}

// The scale of least squared error for 32 values x, over trial scales max / -(127 + 4 s), s = -3..9, each refitted
// by least squares for the codes it picks; 0 for an all-zero block.
float iq4_best_scale(const float* x) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < kQK; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  if (!(amax > 0.0f) || !std::isfinite(amax)) return 0.0f;
  double sxx = 0.0;
  for (int j = 0; j < kQK; ++j) sxx += static_cast<double>(x[j]) * x[j];
  float best = max / -127.0f;
  double best_err = INFINITY;
  for (int s = -3; s <= 9; ++s) {
    const float d = max / -static_cast<float>(127 - 4 * s);
    const float id = 1.0f / d;
    double sxv = 0.0, svv = 0.0;
    for (int j = 0; j < kQK; ++j) {
      const double v = format_detail::iq4nl_value(iq4_nearest(x[j] * id));
      sxv += x[j] * v;
      svv += v * v;
    }
    if (svv == 0.0) continue;
    const double err = sxx - sxv * sxv / svv;  // the squared error at the refitted scale sxv / svv
    if (err < best_err) {
      best_err = err;
      best = static_cast<float>(sxv / svv);
    }
  }
  return best;
}

// The codes of 32 values for the scale d they will be decoded with, nibbles as q4_0's.
void iq4_codes(const float* x, float d, uint8_t* qs /*[16]*/) {
  const float id = d != 0.0f && std::isfinite(d) ? 1.0f / d : 0.0f;
  for (int j = 0; j < kQK / 2; ++j)
    qs[j] = static_cast<uint8_t>(iq4_nearest(x[j] * id) | (iq4_nearest(x[j + kQK / 2] * id) << 4));
}

void iq4_nl_from_float(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockIQ4_NL*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, ++b, src += kQK) {
    b->d = f32_to_fp16(iq4_best_scale(src));
    iq4_codes(src, fp16_to_f32(b->d), b->qs);
  }
}

// iq4_xs: each sub-block's best scale s_j as iq4_nl's, then d = s_max / -32 (s_max: the s_j of largest magnitude) so
// that every 6-bit code round(s_j / d) + 32 fits, and the codes picked for the decoded scale d * (code - 32).
void iq4_xs_from_float(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockIQ4_XS*>(dst);
  for (int64_t i = 0; i < n / kQKK; ++i, ++b, src += kQKK) {
    float s[kQKK / kQK], smax = 0.0f;
    for (int j = 0; j < kQKK / kQK; ++j) {
      s[j] = iq4_best_scale(src + kQK * j);
      if (std::fabs(s[j]) > std::fabs(smax)) smax = s[j];
    }
    b->d = f32_to_fp16(smax / -32.0f);
    const float d = fp16_to_f32(b->d);
    const float id = d != 0.0f && std::isfinite(d) ? 1.0f / d : 0.0f;
    b->scales_h = 0;
    std::memset(b->scales_l, 0, sizeof(b->scales_l));
    for (int j = 0; j < kQKK / kQK; ++j) {
      const int l = round_clamp(s[j] * id, -32, 31);
      const auto code = static_cast<unsigned>(l + 32);
      b->scales_l[j / 2] = static_cast<uint8_t>(b->scales_l[j / 2] | ((code & 0xF) << (4 * (j % 2))));
      b->scales_h = static_cast<uint16_t>(b->scales_h | ((code >> 4) << (2 * j)));
      iq4_codes(src + kQK * j, d * static_cast<float>(l), b->qs + 16 * j);
    }
  }
}

// tq1_0 and tq2_0 as GGML's reference quantizers (quantize_row_tq*_ref; llama-quantize calls them for every tensor it
// writes in these types, ignoring an importance matrix): per block of 256, d = max|x| and every element rounded (half
// away from zero, lroundf) to x / d in {-1, 0, 1}. The clamp only matters for inputs GGML leaves undefined (inf, NaN,
// float subnormals whose 1 / d overflows).
inline int ternary_code(float v) { return std::clamp(trunc_to_int(std::round(v)), -1, 1) + 1; }

float block_absmax(const float* x) {
  float amax = 0.0f;
  for (int j = 0; j < kQKK; ++j) amax = amax > std::fabs(x[j]) ? amax : std::fabs(x[j]);  // GGML's MAX (NaN wins)
  return amax;
}

void tq1_0_from_float(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockTQ1_0*>(dst);
  // Five trits (the first most significant) to the byte ceil(256 * v / 243) that tq1_trit reads back.
  const auto pack = [](const float* x, int stride, int count, float id) {
    int v = 0;
    for (int t = 0; t < count; ++t) v = 3 * v + ternary_code(x[stride * t] * id);
    for (int t = count; t < 5; ++t) v *= 3;
    return static_cast<uint8_t>((v * 256 + 242) / 243);
  };
  for (int64_t i = 0; i < n / kQKK; ++i, ++b, src += kQKK) {
    const float d = block_absmax(src);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b->d = f32_to_fp16(d);
    for (int m = 0; m < 32; ++m) b->qs[m] = pack(src + m, 32, 5, id);
    for (int m = 0; m < 16; ++m) b->qs[32 + m] = pack(src + 160 + m, 16, 5, id);
    for (int j = 0; j < 4; ++j) b->qh[j] = pack(src + 240 + j, 4, 4, id);
  }
}

void tq2_0_from_float(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockTQ2_0*>(dst);
  for (int64_t i = 0; i < n / kQKK; ++i, ++b, src += kQKK) {
    const float d = block_absmax(src);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b->d = f32_to_fp16(d);
    uint8_t code[kQKK];
    for (int e = 0; e < kQKK; ++e) code[e] = static_cast<uint8_t>(ternary_code(src[e] * id));
    pack_2bit(code, b->qs);
  }
}

// Row functions of a format, instantiated from its traits.
template <DType D>
void to_float(const void* src, float* dst, int64_t n) {
  using F = Format<D>;
  const auto* b = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n / F::kBlockSize; ++i) {
    typename F::Block blk;  // a copy: GGUF blocks of 18 or 210 bytes are not aligned for the struct in general
    std::memcpy(&blk, b + i * F::kBlockBytes, sizeof(blk));
    F::dequantize(blk, dst + i * F::kBlockSize);
  }
}

template <DType D>
double dot_q8(const void* row, const BlockQ8Act* x, int64_t n) {
  using F = Format<D>;
  const auto* b = static_cast<const uint8_t*>(row);
  double acc = 0.0;
  for (int64_t i = 0; i < n / F::kBlockSize; ++i) {
    typename F::Block blk;
    std::memcpy(&blk, b + i * F::kBlockBytes, sizeof(blk));
    acc += F::dot_q8(blk, x + i * (F::kBlockSize / kQK));
  }
  return acc;
}

template <DType D>
constexpr FormatInfo info(FromFloatFn from_float, bool from_float_is_ggml) {
  using F = Format<D>;
  DotQ8Fn dot = nullptr;
  if constexpr (F::kQuantized) dot = dot_q8<D>;
  return {D, F::kName, F::kBlockSize, F::kBlockBytes, F::kQuantized, to_float<D>, from_float, from_float_is_ggml, dot};
}

// In DType order. A new format: its Format<D> specialization in format_traits.h and one line here.
const FormatInfo kFormats[] = {
    info<DType::F32>(f32_from_float, true),        info<DType::F16>(f16_from_float, true),
    info<DType::Q4_0>(q4_0_from_float, true),      info<DType::Q4_1>(q4_1_from_float, true),
    info<DType::Q5_0>(q5_0_from_float, true),      info<DType::Q5_1>(q5_1_from_float, true),
    info<DType::Q8_0>(q8_0_from_float, true),      info<DType::Q2_K>(q2_k_from_float, false),
    info<DType::Q3_K>(q3_k_from_float, false),     info<DType::Q4_K>(q4_k_from_float, false),
    info<DType::Q5_K>(q5_k_from_float, false),     info<DType::Q6_K>(q6_k_from_float, false),
    info<DType::IQ4_NL>(iq4_nl_from_float, false), info<DType::IQ4_XS>(iq4_xs_from_float, false),
    info<DType::BF16>(bf16_from_float, true),      info<DType::TQ1_0>(tq1_0_from_float, true),
    info<DType::TQ2_0>(tq2_0_from_float, true),
};

void check_row(DType t, int64_t n) {
  const DTypeInfo& info = dtype_info(t);
  TESSERA_CHECK(n >= 0 && n % info.block_size == 0, "a row of {} elements is not a whole number of {} blocks of {}", n,
                info.name, info.block_size);
}

}  // namespace

std::span<const FormatInfo> formats() { return kFormats; }

const FormatInfo* format_info(DType t) {
  for (const auto& e : kFormats)
    if (e.type == t) return &e;
  return nullptr;
}

QuantTraits quant_traits(DType t) {
  const FormatInfo* f = format_info(t);
  return f != nullptr ? QuantTraits{t, f->to_float, f->from_float} : QuantTraits{t, nullptr, nullptr};
}

bool can_dequantize(DType t) { return quant_traits(t).to_float != nullptr; }
bool can_quantize(DType t) { return quant_traits(t).from_float != nullptr; }

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  const QuantTraits q = quant_traits(t);
  TESSERA_CHECK(q.to_float != nullptr, "dtype {} cannot be converted to float yet", dtype_name(t));
  check_row(t, n);
  q.to_float(src, dst, n);
}

void quantize_row(DType t, const float* src, void* dst, int64_t n) {
  const QuantTraits q = quant_traits(t);
  TESSERA_CHECK(q.from_float != nullptr, "dtype {} cannot be produced from float yet", dtype_name(t));
  check_row(t, n);
  q.from_float(src, dst, n);
}

void quantize_act_q8(const float* x, BlockQ8Act* out, int64_t n) {
  TESSERA_CHECK(n >= 0 && n % kQK == 0, "a row of {} activations is not a whole number of 32-element blocks", n);
  for (int64_t b = 0; b < n / kQK; ++b, x += kQK) {
    float amax = 0.0f;
    for (int l = 0; l < kQK; ++l) amax = std::fmax(amax, std::fabs(x[l]));
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int32_t sum = 0;
    for (int l = 0; l < kQK; ++l) {
      const int q = trunc_to_int(std::nearbyint(x[l] * id));
      out[b].qs[l] = static_cast<int8_t>(q);
      sum += q;
    }
    out[b].d = amax / 127.0f;
    out[b].s = out[b].d * static_cast<float>(sum);
  }
}

double dot_q8_ref(DType t, const void* row, const BlockQ8Act* x, int64_t n) {
  const FormatInfo* f = format_info(t);
  TESSERA_CHECK(f != nullptr && f->dot_q8 != nullptr, "dtype {} has no dot product with 8-bit activations",
                dtype_name(t));
  check_row(t, n);
  return f->dot_q8(row, x, n);
}

void convert_rows(DType from, const void* src, DType to, void* dst, int64_t n, int64_t k) {
  TESSERA_CHECK(can_dequantize(from), "dtype {} cannot be converted to float yet", dtype_name(from));
  TESSERA_CHECK(can_quantize(to), "dtype {} cannot be produced from float yet", dtype_name(to));
  check_row(from, k);
  check_row(to, k);
  const uint64_t in_row = *dtype_row_bytes(from, static_cast<uint64_t>(k));
  const uint64_t out_row = *dtype_row_bytes(to, static_cast<uint64_t>(k));
  std::vector<float> row(static_cast<size_t>(k));
  for (int64_t r = 0; r < n; ++r) {
    quant_traits(from).to_float(static_cast<const uint8_t*>(src) + static_cast<uint64_t>(r) * in_row, row.data(), k);
    quant_traits(to).from_float(row.data(), static_cast<uint8_t*>(dst) + static_cast<uint64_t>(r) * out_row, k);
  }
}

std::vector<float> dequantize_matrix(DType t, const void* src, int64_t n, int64_t k) {
  std::vector<float> v;
  if (src == nullptr || n <= 0 || k <= 0 || !can_dequantize(t) || k % dtype_info(t).block_size != 0) return v;
  const uint64_t row = *dtype_row_bytes(t, static_cast<uint64_t>(k));
  v.resize(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r)
    quant_traits(t).to_float(static_cast<const uint8_t*>(src) + static_cast<uint64_t>(r) * row, v.data() + r * k, k);
  return v;
}

void q4_k_rows_as_q4_1(const void* src, void* dst, int64_t n, int64_t k) {
  TESSERA_CHECK(src != nullptr && dst != nullptr && n > 0 && k > 0 && k % kQKK == 0,
                "q4_K rows as q4_1: null rows, or a row of {} elements (a multiple of 256 is needed)", k);
  const int64_t kb = k / kQK, sb = k / kQKK;
  const auto* in = static_cast<const BlockQ4_K*>(src);
  auto* out = static_cast<BlockQ4_1*>(dst);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t s = 0; s < sb; ++s) {
      const BlockQ4_K& b = in[r * sb + s];
      const float d = format_detail::half_value(b.d), dmin = format_detail::half_value(b.dmin);
      for (int j = 0; j < kQKK / kQK; ++j) {
        int sc = 0, m = 0;
        format_detail::q4_k_scale_min(j, b.scales, &sc, &m);
        BlockQ4_1& o = out[r * kb + s * (kQKK / kQK) + j];
        o.d = f32_to_fp16(d * static_cast<float>(sc));
        o.m = f32_to_fp16(-(dmin * static_cast<float>(m)));
        const uint8_t* q = b.qs + 32 * (j / 2);
        const int shift = 4 * (j & 1);
        for (int l = 0; l < kQK / 2; ++l)  // q4_1's order: element l in the low nibble of byte l, l + 16 in the high
          o.qs[l] = static_cast<uint8_t>(((q[l] >> shift) & 0xF) | (((q[l + 16] >> shift) & 0xF) << 4));
      }
    }
}

double vec_dot_ref(DType t, const void* row, const float* x, int64_t n) {
  std::vector<float> w(static_cast<size_t>(n));
  dequantize_row(t, row, w.data(), n);
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(w[static_cast<size_t>(i)]) * x[i];
  return acc;
}

}  // namespace tessera
