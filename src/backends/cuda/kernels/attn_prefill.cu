// STUB (owner: prefill-attention helper): replaced by the real implementation.
#include "backends/cuda/kernels_rows.h"
#include "core/error.h"

namespace tessera::cuda {

void attn_prefill(const float*, int64_t, const KvCacheView&, int64_t, int64_t, int64_t, float*, int64_t, float,
                  cudaStream_t) {
  fail("cuda attn_prefill: not implemented yet");
}

}  // namespace tessera::cuda
