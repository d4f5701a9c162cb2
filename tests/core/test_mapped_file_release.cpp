// release_mapped_pages: a repacked weight's file pages leave the process's resident set (issue 26: the mapped file
// stayed resident beside the repacked copy), the data stays readable, and memory that is not a file mapping is never
// touched (MADV_DONTNEED would zero it).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/mapped_file.h"

namespace tessera {
namespace {

// Resident pages of this process, in bytes (/proc/self/statm, second field).
size_t resident_bytes() {
  std::ifstream f("/proc/self/statm");
  size_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

TEST(MappedFileRelease, DropsTouchedPagesAndKeepsTheData) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("tessera_release_" + std::to_string(::getpid()))).string();
  constexpr size_t kBytes = size_t{64} << 20;
  {
    std::vector<unsigned char> b(kBytes);
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<unsigned char>(i * 7 + 3);
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
  }
  MappedFile f(path);
  uint64_t sum = 0;
  for (size_t i = 0; i < f.size(); i += 4096) sum += f.data()[i];  // fault every page in
  const size_t before = resident_bytes();
  // A range that starts and ends mid-page: only the whole pages inside it go.
  const size_t released = release_mapped_pages(f.data() + 100, f.size() - 200);
  EXPECT_EQ(released, kBytes - 2 * 4096);
  const size_t after = resident_bytes();
  EXPECT_GT(before, after + kBytes / 2) << "resident " << before << " -> " << after;
  uint64_t again = 0;
  for (size_t i = 0; i < f.size(); i += 4096) again += f.data()[i];
  EXPECT_EQ(again, sum);
  EXPECT_EQ(f.data()[12345], static_cast<unsigned char>(12345 * 7 + 3));
  std::remove(path.c_str());
}

TEST(MappedFileRelease, LeavesOtherMemoryAlone) {
  std::vector<unsigned char> heap(size_t{1} << 20, 0xAB);
  EXPECT_EQ(release_mapped_pages(heap.data(), heap.size()), 0u);
  for (unsigned char c : heap) ASSERT_EQ(c, 0xAB);
  EXPECT_EQ(release_mapped_pages(nullptr, 100), 0u);
}

}  // namespace
}  // namespace tessera
