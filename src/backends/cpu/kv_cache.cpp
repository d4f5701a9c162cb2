#include "backends/cpu/kv_cache.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace tessera::cpu {

KvCache::KvCache(int64_t n_layers, int64_t n_head_kv, int64_t n_ctx, int64_t head_dim, DType dtype)
    : n_layers_(n_layers), n_ctx_(n_ctx), dtype_(dtype) {
  TESSERA_CHECK(dtype == DType::F16 || dtype == DType::F32, "kv cache: dtype {} is not supported (f16 or f32)",
                dtype_name(dtype));
  TESSERA_CHECK(n_layers > 0 && n_head_kv > 0 && n_ctx > 0 && head_dim > 0, "kv cache: sizes must be positive");
  const uint64_t elem = dtype == DType::F16 ? 2 : 4;
  const uint64_t raw = uint64_t(n_head_kv) * uint64_t(n_ctx) * uint64_t(head_dim) * elem;
  per_tensor_ = (raw + 4095) / 4096 * 4096;
  bytes_ = per_tensor_ * 2 * uint64_t(n_layers);
  // MAP_NORESERVE: a context of the model's full length is reserved address space, committed only as it fills.
  void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  TESSERA_CHECK(p != MAP_FAILED, "kv cache: cannot reserve {} MiB for {} positions ({})", bytes_ >> 20, n_ctx,
                std::strerror(errno));
  data_ = static_cast<uint8_t*>(p);
}

KvCache::~KvCache() {
  if (data_ != nullptr) munmap(data_, bytes_);
}

void* KvCache::k(int64_t layer) const { return data_ + per_tensor_ * uint64_t(2 * layer); }
void* KvCache::v(int64_t layer) const { return data_ + per_tensor_ * uint64_t(2 * layer + 1); }

std::vector<StateBinding> KvCache::bindings() const {
  std::vector<StateBinding> b;
  for (int64_t l = 0; l < n_layers_; ++l) {
    b.push_back({graph::IoRole::CACHE_K, static_cast<int>(l), k(l)});
    b.push_back({graph::IoRole::CACHE_V, static_cast<int>(l), v(l)});
  }
  return b;
}

}  // namespace tessera::cpu
