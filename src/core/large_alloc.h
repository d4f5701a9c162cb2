// Large, long-lived buffers (repacked weights) in transparent huge pages where the kernel allows them.
// Decode streams every weight once per token; with 4 KiB pages that is one TLB miss and one stop of the hardware
// prefetcher per 4 KiB. Linux hands out 2 MiB pages only to mappings that ask (THP "madvise" mode is the common
// default), so a buffer of at least 2 MiB is mapped 2 MiB-aligned and advised MADV_HUGEPAGE; smaller ones come
// from the heap. Where huge pages are off or unavailable the mapping simply stays in 4 KiB pages.
#pragma once

#include <cstddef>
#include <memory>

namespace tessera {

// A buffer of at least `bytes` with unspecified contents, aligned to at least 64 bytes, owned by the returned pointer.
// Throws tessera::Error when the memory cannot be had.
std::shared_ptr<void> allocate_large(size_t bytes);

}  // namespace tessera
