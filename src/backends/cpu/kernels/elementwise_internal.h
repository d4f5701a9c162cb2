// AVX2 versions of the elementwise kernels (elementwise_avx2.cpp), called after the portable wrapper validated shapes.
#pragma once

#include <cstdint>

namespace tessera::cpu::detail {

void rmsnorm_avx2(const float* x /*[t, d]*/, const float* w /*[d]*/, float* y /*[t, d]*/, int64_t t, int64_t d,
                  float eps);
void swiglu_avx2(const float* gate /*[n]*/, const float* up /*[n]*/, float* out /*[n]*/, int64_t n);
int32_t argmax_avx2(const float* x /*[n]*/, int64_t n);
// IEEE half, round to nearest even (vcvtps2ph): bit-identical to quant/half.h's f32_to_fp16 for every non-NaN input.
void f32_to_f16_avx2(const float* src /*[n]*/, uint16_t* dst /*[n]*/, int64_t n);

}  // namespace tessera::cpu::detail
