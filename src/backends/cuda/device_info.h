// CUDA device discovery: what `tessera devices` prints and what the CUDA backend checks before it starts.
#pragma once

#include <string>
#include <vector>

namespace tessera::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;  // compute capability; Tessera's kernels target 9.0 (Hopper)
  size_t total_memory = 0;         // bytes
  int sm_count = 0;
  double memory_bandwidth_gbps = 0;  // theoretical: 2 * memory clock * bus width
};

// Devices the CUDA runtime sees; empty (never an error) on a machine without a driver or GPU. `why` gets the
// runtime's reason when it is empty.
std::vector<DeviceInfo> list_devices(std::string* why = nullptr);

}  // namespace tessera::cuda
