// The CPU's LoRA step (graph::Fusion::lora): y = x·Wᵀ + Σ_i (x·A_iᵀ)·B_iᵀ in one pool job. The adapters are stacked
// (A [R, K] = A_0; A_1; ..., Bᵀ [R, N] = B_0ᵀ; B_1ᵀ; ..., R = Σ r_i: one product each, whatever the count), u = x·Aᵀ
// [t, R] runs as the job's first tasks (the base matmul's hooks, kernels.h: reading x in the form the base's kernel
// already made of it), and each base task adds u·Bᵀ to the columns of y it has just written. Bᵀ is stored transposed
// so each output row is R axpys over contiguous memory: no horizontal sum per (row, token), which is what B [N, r]
// costs a row-major GEMV at K = r = 16 (docs/LORA.md), and no [t, N] intermediate or add.
#pragma once

#include <cstdint>
#include <memory>
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

// Bᵀ [R, n] as the accumulate reads it, in tiles of 64 columns: tile c / 64 holds its 64 columns of row 0, then of
// row 1, ... (the last tile padded with zeros), so a pass over a range of columns reads one sequential stream.
// Row-major Bᵀ made that R = 16 interleaved streams, which the hardware prefetchers do not follow: a decode step's Bᵀ
// (6-48 KiB per matmul, cold) then cost the same ~2 us per matmul in f16 or int8, the latency of its misses
// (docs/LORA.md). Types: f32, f16, or int8 with an f32 scale per row and 32-column block (q8_0's scheme along Bᵀ's
// rows), the scales tiled the same way (2 per row and tile).
enum class LoraBt : uint8_t { F32, F16, I8 };
constexpr int64_t kLoraTile = 64;
struct LoraBtView {
  const void* data = nullptr;
  const float* scale = nullptr;  // I8 only
  LoraBt type = LoraBt::F32;
  int64_t r = 0, n = 0;
  // Index of (row j, column c) in `data`; of its scale is at(j, c) / 32.
  static int64_t at(int64_t r, int64_t j, int64_t c) { return ((c / kLoraTile) * r + j) * kLoraTile + c % kLoraTile; }
};

// A matmul's adapters, stacked and converted once (WeightCache::get_lora). With q8 (a base whose kernel quantizes x
// to 8 bits anyway, so the step's error is of that size already), f16 factors (what fast sessions decode with) become
// 8-bit: A in q8_0, read with the base's own 8-bit x by the VNNI kernels, and Bᵀ in int8 blocks (LoraBt::I8): half
// the bytes of f16 each, what a decode step streams per token (docs/LORA.md). Otherwise f16 stays f16 and f32 stays
// f32 (exact: the op table's f32 rows).
struct LoraWeights {
  PackedWeight a;               // [R, k]
  std::vector<uint8_t> a_rows;  // a's file-layout bytes (a.rows points here)
  // Bᵀ [R, n] in bt_type, tiled (LoraBtView), then (LoraBt::I8) one f32 scale per 32 of its elements: in huge pages
  // (core/large_alloc.h), as the base's repacked weights are: a decode step reads it once per token, and with 4 KiB
  // pages it cost a TLB miss per 4 KiB.
  std::shared_ptr<void> bt;
  uint64_t bt_bytes = 0, bt_scale_offset = 0;  // all of it; where the scales start
  LoraBt bt_type = LoraBt::F32;
  int64_t r = 0, n = 0, k = 0;
  LoraBtView bt_view() const {
    const auto* p = static_cast<const uint8_t*>(bt.get());
    return {p, reinterpret_cast<const float*>(p + bt_scale_offset), bt_type, r, n};
  }
  uint64_t bytes() const { return a_rows.size() + a.packed_bytes + bt_bytes; }
};
LoraWeights make_lora_weights(const std::vector<LoraFactor>& factors, int64_t n, int64_t k, bool q8);

// y [t, n] = x [t, k]·Wᵀ + u·Bᵀ with u = x·Aᵀ written to `u` [t, R] (scratch). One pool job (see above).
void lora_matmul(ThreadPool& pool, const PackedWeight& w, const LoraWeights& l, const float* x, float* y, float* u,
                 int64_t t);

// y[t, c0:c1] += u[t, R] · Bᵀ[R, c0:c1] (y's rows n long).
void lora_accumulate(const float* u, const LoraBtView& bt, float* y, int64_t t, int64_t c0, int64_t c1);

namespace detail {
// The portable loops and their AVX2/FMA/F16C and AVX-512 forms (which need c0 % 8 == 0, resp. c0 % 16 == 0, and fall
// back to the narrower form otherwise).
void lora_accumulate_rows(const float* u, const LoraBtView& bt, float* y, int64_t t, int64_t c0, int64_t c1);
void lora_accumulate_rows_avx2(const float* u, const LoraBtView& bt, float* y, int64_t t, int64_t c0, int64_t c1);
void lora_accumulate_rows_avx512(const float* u, const LoraBtView& bt, float* y, int64_t t, int64_t c0, int64_t c1);
}  // namespace detail

}  // namespace tessera::cpu
