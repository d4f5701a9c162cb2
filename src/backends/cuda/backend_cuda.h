// The CUDA backend: runs the engine's graphs on the GPU. Three executors share one CudaShared (weights uploaded once,
// one KV cache per layer holding every sequence slot, one stream and the matmul workspace):
// - CudaDecoder: the one-token (T = 1) graph of slot 0, batch-1 decode. After a first plain step the whole step is
//   captured as a CUDA graph and replayed: token id and position are read from device memory, so one captured graph
//   serves every position.
// - CudaRowsExecutor in PREFILL mode: a T-row graph run for t <= T consecutive positions of one slot (prefill chunks;
//   the chunk's position and length are run-time values, so one executor serves every chunk of a prompt).
// - CudaRowsExecutor in BATCH mode: B rows, row r the next token of slot seqs[r] at its own position (batched decode),
//   captured and replayed as a CUDA graph like the decoder.
//
// Plain C++ header (no CUDA types) so the runtime can hold executors without compiling CUDA code.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda/sampling_params.h"
#include "graph/graph.h"

namespace tessera::cuda {

struct CudaBackendOptions {
  int device = 0;
  bool use_graph = true;  // capture steps as CUDA graphs (falls back to plain launches when capture fails)
  // Positions per slot of graphs that have no KV cache to tell them (a recurrent STATE only: the MatMul-free LM);
  // 0: 4096. Graphs with a KV cache take its length.
  int64_t n_ctx = 0;
};

// What every executor of one engine shares: device weights by host data pointer (tied embeddings share one), stacked
// weights of merged matmuls by their members, the KV caches (by role CACHE_K/CACHE_V and layer, each [n_seq, n_kv,
// n_ctx, hd] f16 or bf16, allocated by the first graph that names them), the stream every executor launches on (so
// executors never overlap and can share workspaces), and the matmul workspace for up to max_rows rows.
struct DeviceWeights;  // executor_common.h

class CudaShared {
 public:
  // weights: the model's device weights, shared with the model's other sessions (null: private to this one).
  CudaShared(int64_t n_seq, int64_t max_rows, const CudaBackendOptions& options = {},
             std::shared_ptr<DeviceWeights> weights = nullptr);
  ~CudaShared();
  CudaShared(const CudaShared&) = delete;
  CudaShared& operator=(const CudaShared&) = delete;

  int64_t n_seq() const;
  int64_t max_rows() const;
  const CudaBackendOptions& options() const;
  uint64_t device_bytes() const;  // weights, caches and workspaces (executors' activations not included)

  struct Impl;
  Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

class CudaDecoder {
 public:
  // g: a graph for one token (n_tokens() == 1) whose WEIGHT tensors have data; its KV_CACHE tensors map onto slot 0
  // of the shared caches (a private CudaShared with one slot when `shared` is null). Error naming the node when an op
  // or dtype has no CUDA kernel.
  explicit CudaDecoder(const graph::Graph& g, std::shared_ptr<CudaShared> shared = nullptr,
                       const CudaBackendOptions& options = {});
  ~CudaDecoder();
  CudaDecoder(const CudaDecoder&) = delete;
  CudaDecoder& operator=(const CudaDecoder&) = delete;

  // Evaluates `token` at position `pos` (the caches hold positions [0, pos)) and returns the logits [n_vocab], valid
  // until the next call. Error when the token is outside the vocabulary or the position outside the cache.
  std::span<const float> decode(int32_t token, int64_t pos);
  // Same step, but only the argmax of the logits comes back (computed on the device).
  int32_t decode_argmax(int32_t token, int64_t pos);
  // Same step, then a draw from its logits on the device (DeviceSampler: the sampler chain with `params`, the
  // window's penalty counts as runtime::penalty_counts gives them, and u, the uniform number the host's generator
  // would draw next). Returns {token, candidates}: candidates 1 means no number was needed (the caller's generator
  // must not advance), 0 that every logit was NaN (token 0). Only the two ids come back; logits() fetches the logits.
  std::pair<int32_t, int32_t> decode_sample(int32_t token, int64_t pos, const DeviceSamplingParams& params,
                                            const std::vector<std::pair<int32_t, int32_t>>& penalties, double u);
  // Greedy decoding chained on the device: evaluates `token` at `pos`, then each step's argmax at the next position,
  // n steps at most, and the host never waits between steps: each step's argmax kernel writes the next step's token,
  // position and embedding row, and the token into host-mapped memory; graphs of 8 steps (TESSERA_CUDA_CHAIN_STEPS),
  // up to three queued ahead of the host. on_token(id) gets every step's argmax in order; false stops (the steps
  // already queued finish in stream order after the return, unwaited, and are dropped: their cache rows lie past the
  // accepted positions). Returns the steps accepted = the tokens evaluated (`token` and every accepted argmax but the
  // last). Error as decode(), or when pos + n exceeds the cache. Profiled or with TESSERA_CUDA_CHAIN=0 it runs
  // decode_argmax step by step (same results).
  int64_t generate_greedy(int32_t token, int64_t pos, int64_t n, const std::function<bool(int32_t)>& on_token);
  // The logits [n_vocab] of the last step (decode, decode_argmax or the last accepted generate_greedy step), copied
  // from the device now; valid until the next call. Empty before any step, and after a generate_greedy whose steps
  // ran past the last accepted one (the device holds a dropped step's logits).
  std::span<const float> logits();

  // When set (size = the graph's nodes), steps run as plain launches with events between them and each launch's
  // time in ns is added to its graph node (fused nodes get 0: their time is the launching node's). null: off.
  void set_profile(std::vector<uint64_t>* node_ns);

  int64_t n_vocab() const;
  int64_t n_ctx() const;
  bool graph_captured() const;    // whether steps replay a CUDA graph (false before the second step or on fallback)
  uint64_t device_bytes() const;  // weights, caches and activations allocated on the device

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

enum class RowsMode {
  PREFILL,  // rows are consecutive positions p0 .. p0 + t - 1 of one slot; causal prefill attention
  BATCH,    // row r is one token of slot seqs[r] at position pos[r]; batched decode attention, CUDA graph per B
};

class CudaRowsExecutor {
 public:
  // g: a graph for T = n_tokens() rows built at n_past 0 (PREFILL: last-row or all-row logits; BATCH: all-row logits)
  // whose KV_CACHE tensors name the shared caches. Error naming the node when an op or dtype has no CUDA kernel.
  CudaRowsExecutor(const graph::Graph& g, RowsMode mode, std::shared_ptr<CudaShared> shared);
  ~CudaRowsExecutor();
  CudaRowsExecutor(const CudaRowsExecutor&) = delete;
  CudaRowsExecutor& operator=(const CudaRowsExecutor&) = delete;

  // PREFILL: evaluates ids [t] (1 <= t <= rows()) at positions p0 .. p0 + t - 1 of slot `seq` (whose cache holds
  // [0, p0)). Returns the logits [t, n_vocab] (all-row graph) or [1, n_vocab] (the last row), valid until the next
  // call. Error for a bad slot, a position past the cache or a token outside the vocabulary.
  std::span<const float> prefill(std::span<const int32_t> ids, int64_t seq, int64_t p0);
  // PREFILL on an all-row graph: the same step, but only each row's (log-sum-exp, logit of targets[r]) comes back,
  // reduced on the device (kernels_rows.h, row_scores): [t, 2] doubles, valid until the next call.
  std::span<const double> prefill_scores(std::span<const int32_t> ids, int64_t seq, int64_t p0,
                                         std::span<const int32_t> targets);
  // BATCH: row r evaluates ids[r] at position pos[r] of slot seqs[r] (exactly rows() rows; slots distinct). Returns
  // the logits [rows(), n_vocab], valid until the next call.
  std::span<const float> decode_rows(std::span<const int32_t> ids, std::span<const int32_t> seqs,
                                     std::span<const int32_t> pos);
  // BATCH: the same step, but only each row's argmax comes back (computed on the device: [rows()] token ids, the
  // first on ties), valid until the next call. Greedy decoding of B sequences copies B ids, not B * n_vocab logits.
  std::span<const int32_t> decode_rows_argmax(std::span<const int32_t> ids, std::span<const int32_t> seqs,
                                              std::span<const int32_t> pos);

  // As CudaDecoder::set_profile (index = node id of the graph this executor was built from).
  void set_profile(std::vector<uint64_t>* node_ns);

  RowsMode mode() const;
  int64_t rows() const;  // T of the graph
  int64_t n_vocab() const;
  bool graph_captured() const;
  uint64_t device_bytes() const;  // activations and workspaces of this executor

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Whether a usable CUDA device exists; `why` gets the reason when not.
bool cuda_available(std::string* why);

}  // namespace tessera::cuda
