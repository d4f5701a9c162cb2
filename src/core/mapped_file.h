// Read-only memory-mapped file: model weights are used in place, never copied on load.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tessera {

class MappedFile {
 public:
  MappedFile() = default;
  // Maps `path` read-only; throws tessera::Error naming the path and the OS reason on failure.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void reset();
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Gives back the resident pages of [data, data + bytes) when that range lies inside a live MappedFile: for a weight
// whose repacked copy is all the kernels read, so the process does not hold the file's copy beside it (about the
// model's size of RSS). The pages are the file's and unmodified, so a later read of the range faults them back in
// from the page cache: nothing is lost. Only whole pages inside the range are dropped; a range outside every mapping
// (heap or anonymous memory, where dropping would zero the data) is left alone. Returns the bytes released.
size_t release_mapped_pages(const void* data, size_t bytes);

}  // namespace tessera
