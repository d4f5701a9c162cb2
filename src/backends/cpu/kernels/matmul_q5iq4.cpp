// q5_0, q5_1, iq4_nl and iq4_xs: the kernel for an ISA, and the portable scalar kernels on the file's own rows (the
// fallback without AVX2). The scalar kernels use the same int8 activations and per-block float arithmetic as the SIMD
// ones (codes from quant/format_traits.h), so the two agree to float rounding; plain multiply-adds, as in
// matmul_scalar.cpp.
#include "backends/cpu/kernels/matmul_q5iq4.h"

#include "quant/blocks.h"
#include "quant/format_traits.h"
#include "quant/half.h"

namespace tessera::cpu::detail {
namespace {

// y[i, j] = sum over 32-element blocks b of term(row j's blocks, b, x_i's block b).
template <typename Block, int kElems, typename Term>
void rows(const MatmulArgs& a, int64_t r0, int64_t r1, Term term) {
  const int64_t n = a.w->n, kb = a.w->k / kBlock;
  const auto* w = static_cast<const Block*>(a.w->rows);
  for (int64_t j = r0; j < r1; ++j) {
    const Block* wr = w + j * (a.w->k / kElems);
    for (int64_t i = 0; i < a.t; ++i) {
      const BlockQ8A* x = a.xq + i * kb;
      float acc = 0.0f;
      for (int64_t b = 0; b < kb; ++b) acc += term(wr, b, x[b]);
      a.y[i * n + j] = acc;
    }
  }
}

template <typename Block>
int32_t q5_sum(const Block& w, const BlockQ8A& x) {
  int32_t sum = 0;
  for (int l = 0; l < kBlock; ++l) sum += format_detail::q5_code(w.qs, w.qh, l) * x.qs[l];
  return sum;
}

int32_t iq4_sum(const uint8_t* qs /*[16]*/, const BlockQ8A& x) {
  int32_t sum = 0;
  for (int l = 0; l < kBlock / 2; ++l)
    sum += format_detail::iq4nl_value(qs[l] & 0x0F) * x.qs[l] + format_detail::iq4nl_value(qs[l] >> 4) * x.qs[l + 16];
  return sum;
}

void q5_0_rows(const MatmulArgs& a, int64_t r0, int64_t r1) {
  rows<BlockQ5_0, kBlock>(a, r0, r1, [](const BlockQ5_0* w, int64_t b, const BlockQ8A& x) {
    const float d = fp16_to_f32(w[b].d);
    return static_cast<float>(q5_sum(w[b], x)) * (d * x.d) + d * (-16.0f * x.s);
  });
}

void q5_1_rows(const MatmulArgs& a, int64_t r0, int64_t r1) {
  rows<BlockQ5_1, kBlock>(a, r0, r1, [](const BlockQ5_1* w, int64_t b, const BlockQ8A& x) {
    return static_cast<float>(q5_sum(w[b], x)) * (fp16_to_f32(w[b].d) * x.d) + fp16_to_f32(w[b].m) * x.s;
  });
}

void iq4_nl_rows(const MatmulArgs& a, int64_t r0, int64_t r1) {
  rows<BlockIQ4_NL, kBlock>(a, r0, r1, [](const BlockIQ4_NL* w, int64_t b, const BlockQ8A& x) {
    return static_cast<float>(iq4_sum(w[b].qs, x)) * (fp16_to_f32(w[b].d) * x.d);
  });
}

void iq4_xs_rows(const MatmulArgs& a, int64_t r0, int64_t r1) {
  rows<BlockIQ4_XS, kQKK>(a, r0, r1, [](const BlockIQ4_XS* w, int64_t b, const BlockQ8A& x) {
    const BlockIQ4_XS& s = w[b / kSubBlocks];
    const int j = static_cast<int>(b % kSubBlocks);
    const float d = fp16_to_f32(s.d) * static_cast<float>(format_detail::iq4_xs_scale(s, j));
    return static_cast<float>(iq4_sum(s.qs + 16 * j, x)) * (d * x.d);
  });
}

}  // namespace

RowKernel scalar_q5iq4_kernel(DType dtype) {
  switch (dtype) {
    case DType::Q5_0:
      return q5_0_rows;
    case DType::Q5_1:
      return q5_1_rows;
    case DType::IQ4_NL:
      return iq4_nl_rows;
    case DType::IQ4_XS:
      return iq4_xs_rows;
    default:
      return nullptr;
  }
}

RowKernel q5iq4_kernel(Isa isa, DType dtype) {
  switch (isa) {
    case Isa::AVX512_VNNI:
      return avx512_q5iq4_kernel(dtype);
    case Isa::AVX2_VNNI:
      return avxvnni_q5iq4_kernel(dtype);
    case Isa::AVX2:
      return avx2_q5iq4_kernel(dtype);
    default:
      return scalar_q5iq4_kernel(dtype);
  }
}

}  // namespace tessera::cpu::detail
