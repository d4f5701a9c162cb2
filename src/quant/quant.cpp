// Reference quantize/dequantize. This file is compiled with -ffp-contract=off (see CMakeLists.txt): a fused
// multiply-add would round differently from GGML's and numpy's separate multiply and add, and these functions must be
// bit-exact with them.
#include "quant/quant.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "quant/blocks.h"
#include "quant/half.h"

namespace tessera {
namespace {

void f32_to_float(const void* src, float* dst, int64_t n) { std::memcpy(dst, src, static_cast<size_t>(n) * 4); }
void f32_from_float(const float* src, void* dst, int64_t n) { std::memcpy(dst, src, static_cast<size_t>(n) * 4); }

void f16_to_float(const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_f32(s[i]);
}
void f16_from_float(const float* src, void* dst, int64_t n) {
  auto* d = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = f32_to_fp16(src[i]);
}

void bf16_to_float(const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
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

void q4_0_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ4_0*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, ++b, dst += kQK) {
    const float d = fp16_to_f32(b->d);
    for (int j = 0; j < kQK / 2; ++j) {
      dst[j] = static_cast<float>((b->qs[j] & 0x0F) - 8) * d;
      dst[j + kQK / 2] = static_cast<float>((b->qs[j] >> 4) - 8) * d;
    }
  }
}
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

void q4_1_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ4_1*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, ++b, dst += kQK) {
    const float d = fp16_to_f32(b->d);
    const float m = fp16_to_f32(b->m);
    for (int j = 0; j < kQK / 2; ++j) {
      dst[j] = static_cast<float>(b->qs[j] & 0x0F) * d + m;
      dst[j + kQK / 2] = static_cast<float>(b->qs[j] >> 4) * d + m;
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

void q8_0_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ8_0*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, ++b, dst += kQK) {
    const float d = fp16_to_f32(b->d);
    for (int j = 0; j < kQK; ++j) dst[j] = static_cast<float>(b->qs[j]) * d;
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

// 6-bit scale and min of sub-block j from the 12 packed bytes of a q4_K block.
inline void q4_k_scale_min(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

void q4_k_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ4_K*>(src);
  for (int64_t i = 0; i < n / kQKK; ++i, ++b) {
    const float d = fp16_to_f32(b->d);
    const float dmin = fp16_to_f32(b->dmin);
    const uint8_t* q = b->qs;
    for (int j = 0, is = 0; j < kQKK; j += 64, is += 2, q += 32) {
      uint8_t sc, m;
      q4_k_scale_min(is, b->scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      q4_k_scale_min(is + 1, b->scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *dst++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *dst++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

void q6_k_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ6_K*>(src);
  for (int64_t i = 0; i < n / kQKK; ++i, ++b) {
    const float d = fp16_to_f32(b->d);
    const uint8_t* ql = b->ql;
    const uint8_t* qh = b->qh;
    const int8_t* sc = b->scales;
    for (int half = 0; half < 2; ++half, dst += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        dst[l] = (d * sc[is + 0]) * static_cast<float>(q1);
        dst[l + 32] = (d * sc[is + 2]) * static_cast<float>(q2);
        dst[l + 64] = (d * sc[is + 4]) * static_cast<float>(q3);
        dst[l + 96] = (d * sc[is + 6]) * static_cast<float>(q4);
      }
    }
  }
}

const QuantTraits kTraits[] = {
    {DType::F32, f32_to_float, f32_from_float},
    {DType::F16, f16_to_float, f16_from_float},
    {DType::BF16, bf16_to_float, bf16_from_float},
    {DType::Q4_0, q4_0_to_float, q4_0_from_float},
    {DType::Q4_1, q4_1_to_float, q4_1_from_float},
    {DType::Q8_0, q8_0_to_float, q8_0_from_float},
    {DType::Q4_K, q4_k_to_float, nullptr},
    {DType::Q6_K, q6_k_to_float, nullptr},
};

void check_row(DType t, int64_t n) {
  const DTypeInfo& info = dtype_info(t);
  TESSERA_CHECK(n >= 0 && n % info.block_size == 0, "a row of {} elements is not a whole number of {} blocks of {}", n,
                info.name, info.block_size);
}

}  // namespace

QuantTraits quant_traits(DType t) {
  for (const auto& e : kTraits)
    if (e.type == t) return e;
  return QuantTraits{t, nullptr, nullptr};
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

double vec_dot_ref(DType t, const void* row, const float* x, int64_t n) {
  std::vector<float> w(static_cast<size_t>(n));
  dequantize_row(t, row, w.data(), n);
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(w[static_cast<size_t>(i)]) * x[i];
  return acc;
}

}  // namespace tessera
