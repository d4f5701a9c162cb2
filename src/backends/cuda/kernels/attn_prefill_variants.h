// Launch shapes of the prefill attention kernel (attn_prefill.cu), exposed so that bench/cuda/bench_attention can time
// every shape next to the default one; the engine only calls attn_prefill (kernels_rows.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "backends/cuda/kernels.h"

namespace tessera::cuda::detail {

int attn_prefill_variant_count();
// e.g. "m128 n64 q:smem": query rows per block, keys per tile, where the query fragments live.
std::string attn_prefill_variant_name(int variant, int64_t hd);
// The variant attn_prefill picks for this head size, head count and row count.
int attn_prefill_default_variant(int64_t hd, int64_t n_head, int64_t t);
// attn_prefill with a given launch shape (same checks, same results up to summation order).
void attn_prefill_variant(int variant, const float* q, int64_t ld_q, const KvCacheView& cache, int64_t seq, int64_t p0,
                          int64_t t, float* out, int64_t n_head, float scale, cudaStream_t stream,
                          void* out16 = nullptr, DType out16_type = DType::BF16);

}  // namespace tessera::cuda::detail
