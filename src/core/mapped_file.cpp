#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <vector>

#include "core/error.h"

namespace tessera {
namespace {

// The live mappings, so that release_mapped_pages acts only on file-backed memory.
struct Registry {
  std::mutex mu;
  std::vector<std::pair<uintptr_t, size_t>> ranges;
};
Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: mappings may outlive static destruction order
  return *r;
}
void register_range(const uint8_t* p, size_t n) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.ranges.emplace_back(reinterpret_cast<uintptr_t>(p), n);
}
void unregister_range(const uint8_t* p) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::erase_if(r.ranges, [p](const auto& e) { return e.first == reinterpret_cast<uintptr_t>(p); });
}

}  // namespace

size_t release_mapped_pages(const void* data, size_t bytes) {
  if (data == nullptr || bytes == 0) return 0;
  const auto begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t end = begin + bytes;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    const bool inside = std::any_of(r.ranges.begin(), r.ranges.end(),
                                    [&](const auto& e) { return begin >= e.first && end <= e.first + e.second; });
    if (!inside) return 0;
  }
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = (begin + page - 1) / page * page, last = end / page * page;
  if (last <= first) return 0;
  if (::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED) != 0) return 0;
  return last - first;
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    fail("{}: cannot stat: {}", path, std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{}: not a regular file", path);
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    // MAP_PRIVATE + PROT_READ: pages come from the page cache, so a second load of the same model costs nothing.
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      fail("{}: cannot map: {}", path, std::strerror(e));
    }
    data_ = static_cast<const uint8_t*>(p);
    register_range(data_, size_);
  }
  ::close(fd);
}

MappedFile::~MappedFile() { reset(); }

MappedFile::MappedFile(MappedFile&& o) noexcept : path_(std::move(o.path_)), data_(o.data_), size_(o.size_) {
  o.data_ = nullptr;
  o.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    reset();
    path_ = std::move(o.path_);
    data_ = o.data_;
    size_ = o.size_;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

void MappedFile::reset() {
  if (data_ != nullptr) {
    unregister_range(data_);
    ::munmap(const_cast<uint8_t*>(data_), size_);
  }
  data_ = nullptr;
  size_ = 0;
}

}  // namespace tessera
