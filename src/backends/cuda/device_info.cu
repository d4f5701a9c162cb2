#include <cuda_runtime.h>

#include "backends/cuda/device_info.h"

namespace tessera::cuda {

std::vector<DeviceInfo> list_devices(std::string* why) {
  std::vector<DeviceInfo> out;
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    // The runtime says "CUDA driver version is insufficient for CUDA runtime version" when no driver is installed at
    // all (libcuda.so.1 absent), which reads as an upgrade request; name the common cause first.
    if (why) {
      if (err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice)
        *why = std::string("no NVIDIA GPU or driver found (") + cudaGetErrorString(err) + ")";
      else
        *why = cudaGetErrorString(err);
    }
    (void)cudaGetLastError();  // clear the sticky error so later calls start clean
    return out;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    DeviceInfo d;
    d.index = i;
    d.name = p.name;
    d.cc_major = p.major;
    d.cc_minor = p.minor;
    d.total_memory = p.totalGlobalMem;
    d.sm_count = p.multiProcessorCount;
    int clock_khz = 0, bus_bits = 0;
    cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, i);
    cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, i);
    d.memory_bandwidth_gbps = 2.0 * clock_khz * 1e3 * (bus_bits / 8.0) / 1e9;
    out.push_back(d);
  }
  if (out.empty() && why) *why = "no NVIDIA GPU or driver found";
  return out;
}

}  // namespace tessera::cuda
