#include "core/large_alloc.h"

#include <cstdint>
#include <new>

#include "core/error.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace tessera {

namespace {

constexpr size_t kHuge = size_t{2} << 20;
constexpr size_t kAlign = 64;

struct HeapFree {
  void operator()(void* p) const { ::operator delete(p, std::align_val_t{kAlign}); }
};

}  // namespace

std::shared_ptr<void> allocate_large(size_t bytes) {
  if (bytes == 0) bytes = 1;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (bytes >= kHuge) {
    // Over-map by one huge page, then trim both ends so the kept range starts on a 2 MiB boundary.
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
#endif
  void* p = ::operator new(bytes, std::align_val_t{kAlign});
  return std::shared_ptr<void>(p, HeapFree{});
}

}  // namespace tessera
