// STUB (owner: decode-rows helper): delete this file when rope_kv.cu and attn_decode.cu implement these.
#include "backends/cuda/kernels_rows.h"
#include "core/error.h"

namespace tessera::cuda {

void rope_store_kv_rows(float*, int64_t, const float*, const float*, int64_t, const KvCacheView&, const int32_t*,
                        const int32_t*, int64_t, int64_t, int64_t, const float*, bool, cudaStream_t) {
  fail("cuda rope_store_kv_rows: not implemented yet");
}
struct AttnRowsWorkspace::Impl {
  int64_t max_t = 0;
};
AttnRowsWorkspace::AttnRowsWorkspace(int64_t max_t, int64_t, const KvCacheView&) : impl_(std::make_unique<Impl>()) {
  impl_->max_t = max_t;
}
AttnRowsWorkspace::~AttnRowsWorkspace() = default;
int64_t AttnRowsWorkspace::max_t() const { return impl_->max_t; }
void attn_decode_rows(const float*, int64_t, const KvCacheView&, const int32_t*, const int32_t*, int64_t, float*,
                      int64_t, float, AttnRowsWorkspace&, cudaStream_t) {
  fail("cuda attn_decode_rows: not implemented yet");
}

}  // namespace tessera::cuda
