#include "core/large_alloc.h"

#include <cstdint>
#include <mutex>
#include <new>

#include "core/error.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace tessera {

namespace {

constexpr size_t kAlign = 64;

#if defined(__linux__) && defined(MADV_HUGEPAGE)
constexpr size_t kHuge = size_t{2} << 20;
constexpr size_t kSlab = size_t{32} << 20;

// A mapping of `bytes` rounded up to 2 MiB, starting on a 2 MiB boundary and advised MADV_HUGEPAGE: over-map by one
// huge page, then trim both ends.
std::shared_ptr<void> map_huge(size_t bytes) {
  const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
  const size_t span = rounded + kHuge;
  void* raw = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  TESSERA_CHECK(raw != MAP_FAILED, "out of memory: could not map {} bytes", span);
  const auto base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (base + kHuge - 1) / kHuge * kHuge;
  if (aligned > base) ::munmap(raw, aligned - base);
  const uintptr_t end = base + span, kept_end = aligned + rounded;
  if (end > kept_end) ::munmap(reinterpret_cast<void*>(kept_end), end - kept_end);
  void* p = reinterpret_cast<void*>(aligned);
  ::madvise(p, rounded, MADV_HUGEPAGE);  // advice only: failure leaves 4 KiB pages
  return std::shared_ptr<void>(p, [rounded](void* q) { ::munmap(q, rounded); });
}

// Buffers under 2 MiB (most of a small model's weights: SmolLM2-135M's largest layer matrix is 0.55 MB) are cut from
// 32 MiB huge-page slabs, so that they too sit in huge pages. Each piece holds its slab alive; the slab is unmapped
// when its last piece goes (the allocator keeps only a weak reference), so a freed model returns its memory.
struct Slabs {
  std::mutex mu;
  std::weak_ptr<void> slab;
  size_t used = 0;
};

std::shared_ptr<void> cut_from_slab(size_t bytes) {
  static Slabs* s = new Slabs;  // never destroyed: pieces may outlive static destruction
  std::lock_guard<std::mutex> lock(s->mu);
  std::shared_ptr<void> slab = s->slab.lock();
  const size_t size = (bytes + kAlign - 1) / kAlign * kAlign;
  if (slab == nullptr || s->used + size > kSlab) {
    slab = map_huge(kSlab);
    s->slab = slab;
    s->used = 0;
  }
  void* p = static_cast<char*>(slab.get()) + s->used;
  s->used += size;
  return std::shared_ptr<void>(slab, p);  // aliasing: owns the slab, points at the piece
}
#endif

}  // namespace

std::shared_ptr<void> allocate_large(size_t bytes) {
  if (bytes == 0) bytes = 1;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  return bytes >= kHuge ? map_huge(bytes) : cut_from_slab(bytes);
#else
  void* p = ::operator new (bytes, std::align_val_t{kAlign});
  return std::shared_ptr<void>(p, [](void* q) { ::operator delete (q, std::align_val_t{kAlign}); });
#endif
}

}  // namespace tessera
