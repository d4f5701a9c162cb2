// Portable matmul kernels (the fallback on CPUs without AVX2) on the file's own row layout. The quantized ones use the
// same int8 activations and the same per-block float arithmetic as the AVX2 kernels, so the two agree to float
// rounding and the tests can compare them tightly. Plain multiply-adds, not std::fma: on a CPU without FMA (the
// only one that runs this path in production) std::fma is a slow software routine.
#include <cmath>
#include <vector>

#include "backends/cpu/kernels/matmul_internal.h"
#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/quant.h"

namespace tessera::cpu::detail {
namespace {

template <typename Block>
int32_t dot_q4(const Block& w, const BlockQ8A& x) {
  int32_t sum = 0;
  for (int l = 0; l < kBlock / 2; ++l) {
    sum += (w.qs[l] & 0x0F) * x.qs[l];
    sum += (w.qs[l] >> 4) * x.qs[l + kBlock / 2];
  }
  return sum;
}

void q4_0_rows(const MatmulArgs& a, int64_t r0, int64_t r1) {
  const int64_t n = a.w->n, kb = a.w->k / kBlock;
  const auto* w = static_cast<const BlockQ4_0*>(a.w->rows);
  for (int64_t j = r0; j < r1; ++j) {
    for (int64_t i = 0; i < a.t; ++i) {
      const BlockQ8A* x = a.xq + i * kb;
      float acc = 0.0f;
      for (int64_t b = 0; b < kb; ++b) {
        const BlockQ4_0& wb = w[j * kb + b];
        const float d = fp16_to_f32(wb.d);
        // w = d * (q - 8): the -8 is folded in through the activation block sum.
        acc += static_cast<float>(dot_q4(wb, x[b])) * (d * x[b].d);
        acc += d * (-8.0f * x[b].s);
      }
      a.y[i * n + j] = acc;
    }
  }
}

void q4_1_rows(const MatmulArgs& a, int64_t r0, int64_t r1) {
  const int64_t n = a.w->n, kb = a.w->k / kBlock;
  const auto* w = static_cast<const BlockQ4_1*>(a.w->rows);
  for (int64_t j = r0; j < r1; ++j) {
    for (int64_t i = 0; i < a.t; ++i) {
      const BlockQ8A* x = a.xq + i * kb;
      float acc = 0.0f;
      for (int64_t b = 0; b < kb; ++b) {
        const BlockQ4_1& wb = w[j * kb + b];
        acc += static_cast<float>(dot_q4(wb, x[b])) * (fp16_to_f32(wb.d) * x[b].d);
        acc += fp16_to_f32(wb.m) * x[b].s;
      }
      a.y[i * n + j] = acc;
    }
  }
}

void q8_0_rows(const MatmulArgs& a, int64_t r0, int64_t r1) {
  const int64_t n = a.w->n, kb = a.w->k / kBlock;
  const auto* w = static_cast<const BlockQ8_0*>(a.w->rows);
  for (int64_t j = r0; j < r1; ++j) {
    for (int64_t i = 0; i < a.t; ++i) {
      const BlockQ8A* x = a.xq + i * kb;
      float acc = 0.0f;
      for (int64_t b = 0; b < kb; ++b) {
        const BlockQ8_0& wb = w[j * kb + b];
        int32_t sum = 0;
        for (int l = 0; l < kBlock; ++l) sum += wb.qs[l] * x[b].qs[l];
        acc += static_cast<float>(sum) * (fp16_to_f32(wb.d) * x[b].d);
      }
      a.y[i * n + j] = acc;
    }
  }
}

// f32 / f16 / bf16: each weight row converted once into a float buffer, then dotted with every token.
void float_rows(const MatmulArgs& a, int64_t r0, int64_t r1) {
  const int64_t n = a.w->n, k = a.w->k;
  const DType dt = a.w->dtype;
  const uint64_t row_bytes = dt == DType::F32 ? 4 * static_cast<uint64_t>(k) : 2 * static_cast<uint64_t>(k);
  thread_local std::vector<float> buf;
  if (buf.size() < static_cast<size_t>(k)) buf.resize(static_cast<size_t>(k));
  for (int64_t j = r0; j < r1; ++j) {
    const void* row = static_cast<const uint8_t*>(a.w->rows) + static_cast<uint64_t>(j) * row_bytes;
    const float* wr = static_cast<const float*>(row);
    if (dt != DType::F32) {
      dequantize_row(dt, row, buf.data(), k);
      wr = buf.data();
    }
    for (int64_t i = 0; i < a.t; ++i) {
      const float* x = a.x + i * k;
      float acc = 0.0f;
      for (int64_t c = 0; c < k; ++c) acc += wr[c] * x[c];
      a.y[i * n + j] = acc;
    }
  }
}

}  // namespace

void quantize_act_scalar(const float* x, BlockQ8A* xq, int64_t k) {
  for (int64_t b = 0; b < k / kBlock; ++b, x += kBlock) {
    float amax = 0.0f;
    for (int l = 0; l < kBlock; ++l) amax = std::fmax(amax, std::fabs(x[l]));
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int32_t sum = 0;
    for (int l = 0; l < kBlock; ++l) {
      const auto q = static_cast<int32_t>(std::nearbyint(x[l] * id));  // round half to even, as vcvtps2dq does
      xq[b].qs[l] = static_cast<int8_t>(q);
      sum += q;
    }
    xq[b].d = amax / 127.0f;
    xq[b].s = xq[b].d * static_cast<float>(sum);
  }
}

RowKernel scalar_kernel(DType dtype) {
  switch (dtype) {
    case DType::Q4_0:
      return q4_0_rows;
    case DType::Q4_1:
      return q4_1_rows;
    case DType::Q8_0:
      return q8_0_rows;
    case DType::F32:
    case DType::F16:
    case DType::BF16:
      return float_rows;
    default:
      return nullptr;
  }
}

}  // namespace tessera::cpu::detail
