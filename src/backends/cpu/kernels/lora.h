// The CPU's LoRA step (graph::Fusion::lora): y = x·Wᵀ + Σ_i (x·A_iᵀ)·B_iᵀ in one pool job. The adapters are stacked
// (A [R, K] = A_0; A_1; ..., Bᵀ [R, N] = B_0ᵀ; B_1ᵀ; ..., R = Σ r_i: one product each, whatever the count), u = x·Aᵀ
// [t, R] runs as the job's first tasks (the base matmul's hooks, kernels.h: reading x in the form the base's kernel
// already made of it), and each base task adds u·Bᵀ to the columns of y it has just written. Bᵀ is stored transposed
// so each output row is R axpys over contiguous memory: no horizontal sum per (row, token), which is what B [N, r]
// costs a row-major GEMV at K = r = 16 (docs/LORA.md), and no [t, N] intermediate or add.
#pragma once

#include <cstdint>
#include <vector>

#include "backends/cpu/kernels.h"
#include "core/thread_pool.h"

namespace tessera::cpu {

// One adapter as the graph holds it: A [r, k] and B [n, r] (scale folded in), each f32 or f16, row-major.
struct LoraFactor {
  DType a_dtype = DType::F32, b_dtype = DType::F32;
  const void* a = nullptr;
  const void* b = nullptr;
  int64_t r = 0;
};

// A matmul's adapters, stacked and converted once (WeightCache::get_lora). With q8_a (a base whose kernel quantizes x
// to 8 bits anyway), f16 A (what fast sessions run) becomes q8_0, read with the base's own 8-bit x by the VNNI kernels
// (a third of f16 A's CPU time per token, docs/LORA.md); otherwise f16 stays f16, as B does. f32 stays f32 (exact: the
// op table's f32 rows).
struct LoraWeights {
  PackedWeight a;               // [R, k]
  std::vector<uint8_t> a_rows;  // a's file-layout bytes (a.rows points here)
  std::vector<uint8_t> bt;      // [R, n], f16 or f32
  bool bt_f16 = false;
  int64_t r = 0, n = 0, k = 0;
};
LoraWeights make_lora_weights(const std::vector<LoraFactor>& factors, int64_t n, int64_t k, bool q8_a);

// y [t, n] = x [t, k]·Wᵀ + u·Bᵀ with u = x·Aᵀ written to `u` [t, R] (scratch). One pool job (see above).
void lora_matmul(ThreadPool& pool, const PackedWeight& w, const LoraWeights& l, const float* x, float* y, float* u,
                 int64_t t);

// y[t, c0:c1] += u[t, r] · bt[r, c0:c1] (rows of y and bt n long), bt in f32 or (bt_f16) f16.
void lora_accumulate(const float* u, const void* bt, bool bt_f16, float* y, int64_t t, int64_t r, int64_t n, int64_t c0,
                     int64_t c1);

namespace detail {
// The portable loops and their AVX2/FMA/F16C forms.
void lora_accumulate_rows(const float* u, const void* bt, bool bt_f16, float* y, int64_t t, int64_t r, int64_t n,
                          int64_t c0, int64_t c1);
void lora_accumulate_rows_avx2(const float* u, const void* bt, bool bt_f16, float* y, int64_t t, int64_t r, int64_t n,
                               int64_t c0, int64_t c1);
}  // namespace detail

}  // namespace tessera::cpu
