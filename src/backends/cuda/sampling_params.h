// The sampler chain's options as the device sampler takes them: a plain header (no CUDA types, C++17) shared by
// backend_cuda.h, which the runtime includes, and device_sampler.h, which nvcc compiles.
#pragma once

#include <cstdint>

namespace tessera::cuda {

// runtime::Sampler's options (tessera::SamplingOptions without the window and the seed, which stay on the host).
struct DeviceSamplingParams {
  float temperature = 0.8f;  // <= 0: greedy
  int32_t top_k = 40;        // <= 0: off
  float top_p = 0.95f;       // >= 1: off
  float min_p = 0.05f;       // <= 0: off
  float repeat_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
};

}  // namespace tessera::cuda
