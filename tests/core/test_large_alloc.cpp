// allocate_large: big buffers start on a 2 MiB boundary (so the kernel can back them with huge pages) and small ones
// come from the heap, 64-byte aligned; every byte is writable and the memory goes back when the last owner drops it.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

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

}  // namespace
}  // namespace tessera
