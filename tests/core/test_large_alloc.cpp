// allocate_large: big buffers start on a 2 MiB boundary (so the kernel can back them with huge pages) and small ones
// come from the heap, 64-byte aligned; every byte is writable and the memory goes back when the last owner drops it.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "core/large_alloc.h"

namespace tessera {
namespace {

uint64_t mapped_kib() {  // VmSize of this process
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmSize:", 0) == 0) return std::stoull(line.substr(7));
  return 0;
}

TEST(LargeAlloc, BigBuffersAreHugePageAligned) {
  for (size_t bytes : {size_t{2} << 20, (size_t{5} << 20) + 123}) {
    const auto p = allocate_large(bytes);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p.get()) % (size_t{2} << 20), 0u) << bytes;
    std::memset(p.get(), 0x5a, bytes);
    EXPECT_EQ(static_cast<unsigned char*>(p.get())[bytes - 1], 0x5a);
  }
}

TEST(LargeAlloc, SmallBuffersAreCacheLineAligned) {
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{4096}, (size_t{2} << 20) - 1}) {
    const auto p = allocate_large(bytes);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p.get()) % 64, 0u) << bytes;
    if (bytes > 0) std::memset(p.get(), 1, bytes);
  }
}

TEST(LargeAlloc, TheMappingIsReturned) {
  const uint64_t before = mapped_kib();
  { const auto p = allocate_large(size_t{64} << 20); }
  const uint64_t after = mapped_kib();
  if (before == 0) GTEST_SKIP() << "no /proc/self/status";
  EXPECT_LT(after, before + 4096) << "64 MiB stayed mapped after the last owner dropped it";
}

// Pieces under 2 MiB share huge-page slabs: they do not overlap, and the slabs go when their last piece does.
TEST(LargeAlloc, SmallPiecesShareSlabsThatAreReturned) {
  const uint64_t before = mapped_kib();
  {
    std::vector<std::shared_ptr<void>> pieces;
    for (int i = 0; i < 100; ++i) {
      pieces.push_back(allocate_large(size_t{1} << 20));
      std::memset(pieces.back().get(), i, size_t{1} << 20);
    }
    for (int i = 0; i < 100; ++i)
      EXPECT_EQ(static_cast<unsigned char*>(pieces[static_cast<size_t>(i)].get())[(size_t{1} << 20) - 1], i) << i;
  }
  if (before == 0) GTEST_SKIP() << "no /proc/self/status";
  EXPECT_LT(mapped_kib(), before + 40 * 1024) << "the slabs of 100 MiB of pieces stayed mapped";
}

}  // namespace
}  // namespace tessera
