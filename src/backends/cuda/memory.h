// Device memory owned by RAII handles. Plain cudaMalloc (never managed memory: asking for more managed memory than
// the card has can hang the GPU, and the decode path wants fixed device addresses for CUDA graphs anyway).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace tessera::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Allocates `bytes` (0 gives an empty buffer; the allocation is rounded up to 16 bytes, bytes() stays `bytes`).
  // Fails with the size and the runtime's reason when out of memory.
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  // `bytes` at `ptr` inside another buffer, which must outlive this one: never freed here (the rows of a larger
  // weight: executor_common.h, DeviceAugmented).
  static DeviceBuffer view(void* ptr, size_t bytes);

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }
  bool empty() const { return ptr_ == nullptr; }

  // Synchronous copies of `bytes` from the start of the buffer (fail when bytes > size()).
  void upload(const void* host, size_t bytes);
  void download(void* host, size_t bytes) const;
  // Fills every byte with `value` (tests poison outputs with 0xFF: all-ones float bits are a NaN).
  void fill_bytes(int value);

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  bool owned_ = true;
};

// Makes `device` current and checks that the runtime works there; call once before any other CUDA work.
void set_device(int device);
// Waits for all work on the current device and surfaces any asynchronous kernel fault as tessera::Error.
void synchronize();

}  // namespace tessera::cuda
