// The engine behind tessera::Session: KV cache, plans per chunk size, prefill in chunks, decode; and the generation
// loop (sampling, end-of-generation and stop strings, streaming, a full context).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "backends/cpu/backend.h"
#ifdef TESSERA_HAVE_CUDA
#include "backends/cuda/backend_cuda.h"
#endif
#include "models/model_weights.h"
#include "runtime/kv_cache.h"
#include "tessera/session.h"
#include "tessera/tokenizer.h"

namespace tessera::runtime {

struct EngineOptions {
  int64_t n_ctx = 0;  // resolved: positive
  int64_t n_batch = 512;
  int n_threads = 0;
  bool reference = false;
  DType kv_dtype = DType::F16;
  bool cuda = false;  // run on the CUDA backend (decode path, token by token)
};

// Resolves SessionOptions against the model (defaults, limits); Error naming the bad option.
EngineOptions resolve_options(const SessionOptions& o, const ModelConfig& c);

class Engine {
 public:
  Engine(ModelWeights weights, std::shared_ptr<cpu::WeightCache> cache, const EngineOptions& options);

  const EngineOptions& options() const { return o_; }
  const ModelWeights& weights() const { return w_; }
  int64_t n_ctx() const { return o_.n_ctx; }
  int64_t n_vocab() const { return w_.config().n_vocab; }
  int64_t n_past() const { return static_cast<int64_t>(tokens_.size()); }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  int n_threads() const { return backend_.n_threads(); }

  // Appends ids at n_past in chunks of n_batch. Returns the last token's logits [n_vocab]. With `all` set, also
  // writes the logits of every token into all [ids.size() * n_vocab].
  std::span<const float> eval(std::span<const int32_t> ids, float* all = nullptr);
  std::span<const float> logits() const;
  void truncate(int64_t n);

  graph::Graph build_graph(int64_t n_tokens, int64_t n_past, bool all_logits) const;
  void set_profiling(bool on) { profiling_ = on; }
  std::vector<uint64_t> profile_ns(int64_t n_tokens) const;

 private:
  cpu::Plan& plan_for(int64_t n_tokens, bool all_logits);

  ModelWeights w_;
  EngineOptions o_;
  cpu::CpuBackend backend_;
  KvCache kv_;
  std::vector<int32_t> tokens_;
  std::map<std::pair<int64_t, bool>, std::unique_ptr<cpu::Plan>> plans_;
  std::map<int64_t, std::vector<uint64_t>> profile_;  // by chunk size
  std::vector<float> logits_;                         // [n_vocab] of the last token
  bool has_logits_ = false;
  bool profiling_ = false;
#ifdef TESSERA_HAVE_CUDA
  std::unique_ptr<cuda::CudaDecoder> cuda_;
#endif
};

// Appends the prompt ids and generates (see tessera::Session::generate_tokens). `tokenizer` may be null: the text
// is then empty and stop strings are not checked.
GenerateResult generate(Engine& engine, const Tokenizer* tokenizer, std::span<const int32_t> prompt,
                        const GenerateOptions& options, const TextCallback& on_text);

uint64_t peak_rss_bytes();

}  // namespace tessera::runtime
