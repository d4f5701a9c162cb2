#include "backends/cuda/memory.h"

#include <utility>

#include "backends/cuda/cuda_check.h"
#include "core/error.h"

namespace tessera::cuda {

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  // Rounded up to 16 bytes (free: cudaMalloc's granule is larger): an aligned vector or cp.async that covers the last
  // bytes stays inside the allocation (the tile GEMM reads q6_K's and q3_K's 2-byte d through its 4-byte window).
  const cudaError_t err = cudaMalloc(&ptr_, (bytes + 15) / 16 * 16);
  if (err != cudaSuccess) {
    ptr_ = nullptr;
    bytes_ = 0;
    (void)cudaGetLastError();
    fail("cannot allocate {} bytes of GPU memory: {}", bytes, cudaGetErrorString(err));
  }
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ && owned_) (void)cudaFree(ptr_);  // a destructor must not throw; a failing free leaves nothing to recover
}

DeviceBuffer DeviceBuffer::view(void* ptr, size_t bytes) {
  DeviceBuffer b;
  b.ptr_ = ptr;
  b.bytes_ = bytes;
  b.owned_ = false;
  return b;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      owned_(std::exchange(other.owned_, true)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (ptr_ && owned_) (void)cudaFree(ptr_);
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    owned_ = std::exchange(other.owned_, true);
  }
  return *this;
}

void DeviceBuffer::upload(const void* host, size_t bytes) {
  TESSERA_CHECK(bytes <= bytes_, "device buffer upload of {} bytes exceeds its size of {} bytes", bytes, bytes_);
  if (bytes) TESSERA_CUDA_CHECK(cudaMemcpy(ptr_, host, bytes, cudaMemcpyHostToDevice));
}

void DeviceBuffer::download(void* host, size_t bytes) const {
  TESSERA_CHECK(bytes <= bytes_, "device buffer download of {} bytes exceeds its size of {} bytes", bytes, bytes_);
  if (bytes) TESSERA_CUDA_CHECK(cudaMemcpy(host, ptr_, bytes, cudaMemcpyDeviceToHost));
}

void DeviceBuffer::fill_bytes(int value) {
  if (bytes_) TESSERA_CUDA_CHECK(cudaMemset(ptr_, value, bytes_));
}

void set_device(int device) {
  TESSERA_CUDA_CHECK(cudaSetDevice(device));
  TESSERA_CUDA_CHECK(cudaFree(nullptr));  // forces context creation here, not inside the first timed kernel
}

void synchronize() { TESSERA_CUDA_CHECK(cudaDeviceSynchronize()); }

}  // namespace tessera::cuda
