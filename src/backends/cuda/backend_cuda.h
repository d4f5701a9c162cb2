// The CUDA backend: runs the one-token (T = 1) graph the CPU backend gets on the GPU, for batch-1 decode. Weights are
// uploaded once (kernels.h's repacked layouts), activations and the KV cache live on the device, and after a first
// plain step the whole step is captured as a CUDA graph and replayed: the token id and position are read from device
// memory, so one captured graph serves every position.
//
// Plain C++ header (no CUDA types) so the runtime can hold a decoder without compiling CUDA code.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "graph/graph.h"

namespace tessera::cuda {

struct CudaBackendOptions {
  int device = 0;
  bool use_graph = true;  // capture the step as a CUDA graph (falls back to plain launches when capture fails)
};

class CudaDecoder {
 public:
  // g: a graph for one token (n_tokens() == 1) whose WEIGHT tensors have data; its KV_CACHE tensors become device
  // caches of the same shape and dtype (f16 or bf16). Error naming the node when an op or dtype has no CUDA kernel.
  CudaDecoder(const graph::Graph& g, const CudaBackendOptions& options = {});
  ~CudaDecoder();
  CudaDecoder(const CudaDecoder&) = delete;
  CudaDecoder& operator=(const CudaDecoder&) = delete;

  // Evaluates `token` at position `pos` (the caches hold positions [0, pos)) and returns the logits [n_vocab], valid
  // until the next call. Error when the token is outside the vocabulary or the position outside the cache.
  std::span<const float> decode(int32_t token, int64_t pos);
  // Same step, but only the argmax of the logits comes back (computed on the device).
  int32_t decode_argmax(int32_t token, int64_t pos);

  int64_t n_vocab() const;
  int64_t n_ctx() const;
  bool graph_captured() const;    // whether steps replay a CUDA graph (false before the second step or on fallback)
  uint64_t device_bytes() const;  // weights, caches and activations allocated on the device

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Whether a usable CUDA device exists; `why` gets the reason when not.
bool cuda_available(std::string* why);

}  // namespace tessera::cuda
