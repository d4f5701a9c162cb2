// The CPU's LoRA epilogue (graph::Fusion::lora): y += u·Bᵀ for an adapter's u = x·Aᵀ [t, r], with B stored transposed
// as bt [r, n] so each output row is r axpys over contiguous memory: no horizontal sum per (row, token), which is what
// B [n, r] costs the row-major GEMV kernels at K = r = 16 (docs/LORA.md), and no [t, n] intermediate or add.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"

namespace tessera::cpu {

// y[t, n] += u[t, r] · bt[r, n], bt in f32 or (bt_f16) f16: a decode step reads half the bytes. Split over the pool by
// tokens when t is large enough to pay for a dispatch.
void lora_accumulate(ThreadPool& pool, const float* u, const void* bt, bool bt_f16, float* y, int64_t t, int64_t r,
                     int64_t n);

namespace detail {
// Rows [0, t) on the calling thread: the portable loops and their AVX2/FMA/F16C forms.
void lora_accumulate_rows(const float* u, const void* bt, bool bt_f16, float* y, int64_t t, int64_t r, int64_t n);
void lora_accumulate_rows_avx2(const float* u, const void* bt, bool bt_f16, float* y, int64_t t, int64_t r, int64_t n);
}  // namespace detail

}  // namespace tessera::cpu
