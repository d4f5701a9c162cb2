// Sampling on the device (issue 6: "output projection with argmax and sampling on the device"): the host sampler's
// chain (runtime::Sampler: penalties, top-k, top-p, min-p, temperature, one uniform draw) over logits that stay on the
// GPU, so a sampled step copies back a token instead of the vocabulary's logits.
//
// CudaDecoder::decode_sample runs it after the decode step; runtime::generate uses that for every sampled token of
// slot 0 on CUDA (TESSERA_CUDA_SAMPLE=0: the host sampler on copied logits instead).
// tests/backends/cuda/test_sampler.cpp compares it with runtime::Sampler draw by draw.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "backends/cuda/memory.h"
#include "backends/cuda/sampling_params.h"

namespace tessera::cuda {

class DeviceSampler {
 public:
  explicit DeviceSampler(int64_t vocab);
  ~DeviceSampler();
  DeviceSampler(const DeviceSampler&) = delete;
  DeviceSampler& operator=(const DeviceSampler&) = delete;

  // Draws from logits [vocab] (device memory); `penalties`: the window's (token, occurrences), as
  // runtime::penalty_counts gives them (this header is compiled by nvcc as C++17 too: a vector, not a span). `u` is the
  // uniform number in [0, 1) runtime::Sampler would draw next (the host keeps the generator, so a seed gives the same
  // stream either way). Writes out[0] = the token and out[1] = how many candidates the draw chose from (1: no draw was
  // needed, and runtime::Sampler then draws no number, so the caller must not advance its generator; 0: every logit was
  // NaN). `out` is device memory (or host-mapped). Asynchronous: the penalties go through a pinned staging buffer
  // that the next call rewrites, so the caller synchronizes `stream` between calls (it reads `out` anyway).
  void sample(const float* logits, const DeviceSamplingParams& p,
              const std::vector<std::pair<int32_t, int32_t>>& penalties, double u, int32_t* out, cudaStream_t stream);

  int64_t vocab() const { return vocab_; }

 private:
  int64_t vocab_;
  DeviceBuffer keys_in_, keys_out_, ids_in_, ids_out_, temp_, pen_;
  size_t temp_bytes_ = 0;
  size_t pen_capacity_ = 0;   // entries of pen_ and pen_host_
  void* pen_host_ = nullptr;  // pinned staging of the penalties
};

}  // namespace tessera::cuda
