#include "backends/cpu/kernels/lora.h"

#include "backends/cpu/cpu_features.h"
#include "quant/half.h"

namespace tessera::cpu {

namespace detail {

void lora_accumulate_rows(const float* u, const void* bt, bool bt_f16, float* y, int64_t t, int64_t r, int64_t n) {
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < r; ++j) {
      const float c = u[i * r + j];
      float* yi = y + i * n;
      if (bt_f16) {
        const uint16_t* b = static_cast<const uint16_t*>(bt) + j * n;
        for (int64_t col = 0; col < n; ++col) yi[col] += c * fp16_to_f32(b[col]);
      } else {
        const float* b = static_cast<const float*>(bt) + j * n;
        for (int64_t col = 0; col < n; ++col) yi[col] += c * b[col];
      }
    }
}

}  // namespace detail

void lora_accumulate(ThreadPool& pool, const float* u, const void* bt, bool bt_f16, float* y, int64_t t, int64_t r,
                     int64_t n) {
  const auto rows = active_isa() >= Isa::AVX2 ? detail::lora_accumulate_rows_avx2 : detail::lora_accumulate_rows;
  // A decode step's r·n multiply-adds (16 x 576-1536) cost less than waking the other threads.
  if (t < 4 || pool.n_threads() < 2) {
    rows(u, bt, bt_f16, y, t, r, n);
    return;
  }
  pool.parallel_range(t, [&](int64_t b, int64_t e, int) {
    if (e > b) rows(u + b * r, bt, bt_f16, y + b * n, e - b, r, n);
  });
}

}  // namespace tessera::cpu
