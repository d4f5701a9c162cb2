// The KV cache: per layer, keys and values [n_head_kv, n_ctx, head_dim] (head-major, the layout the attention
// kernel streams best; see backends/cpu/kernels.h) in f16 or f32. The memory is reserved, not touched: pages are
// committed as positions are written, so a long context costs only what is used.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backends/cpu/backend.h"
#include "core/dtype.h"

namespace tessera::cpu {

class KvCache {
 public:
  KvCache(int64_t n_layers, int64_t n_head_kv, int64_t n_ctx, int64_t head_dim, DType dtype);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  int64_t n_ctx() const { return n_ctx_; }
  DType dtype() const { return dtype_; }
  uint64_t bytes() const { return bytes_; }  // reserved
  void* k(int64_t layer) const;
  void* v(int64_t layer) const;
  // This storage bound to the graph's cache tensors by role (CACHE_K, CACHE_V) and layer.
  std::vector<StateBinding> bindings() const;

 private:
  int64_t n_layers_, n_ctx_;
  DType dtype_;
  uint64_t per_tensor_ = 0;  // bytes of one layer's K (or V), rounded to 4 KiB
  uint64_t bytes_ = 0;
  uint8_t* data_ = nullptr;
};

}  // namespace tessera::cpu
