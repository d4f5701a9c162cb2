// Sampling on the device (issue 6: "output projection with argmax and sampling on the device"): the host sampler's
// chain (runtime::Sampler: penalties, top-k, top-p, min-p, temperature, one uniform draw) over logits that stay on the
// GPU, so a sampled step copies back a token instead of the vocabulary's logits.
//
// Status (seventh session): written and compiled after the session's device budget was spent; NOT yet run on a GPU
// and not yet wired into Session, which still copies the logits to the host for any sampling but greedy.
// tests/backends/cuda/test_sampler.cpp compares it with runtime::Sampler draw by draw.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "backends/cuda/memory.h"

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

class DeviceSampler {
 public:
  explicit DeviceSampler(int64_t vocab);

  // Draws from logits [vocab] (device memory); `penalties`: the window's (token, occurrences), as
  // runtime::penalty_counts gives them (this header is compiled by nvcc as C++17 too: a vector, not a span). `u` is the
  // uniform number in [0, 1) runtime::Sampler would draw next (the host keeps the generator, so a seed gives the same
  // stream either way). Writes out[0] = the token and out[1] = how many candidates the draw chose from (1: no draw was
  // needed, and runtime::Sampler then draws no number, so the caller must not advance its generator; 0: every logit was
  // NaN). `out` is device memory (or host-mapped).
  void sample(const float* logits, const DeviceSamplingParams& p,
              const std::vector<std::pair<int32_t, int32_t>>& penalties, double u, int32_t* out, cudaStream_t stream);

  int64_t vocab() const { return vocab_; }

 private:
  int64_t vocab_;
  DeviceBuffer keys_in_, keys_out_, ids_in_, ids_out_, temp_, pen_;
  size_t temp_bytes_ = 0;
  size_t pen_capacity_ = 0;
};

}  // namespace tessera::cuda
