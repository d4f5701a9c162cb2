// The one interface every backend implements, and the registry the runtime finds them in. The runtime (Engine) knows
// no device: it asks the registry for a backend by name, gets one weight store per model from it (made once, shared
// by every session of that model) and opens a DeviceSession per session, which owns the KV caches of its sequence
// slots and the compiled graphs, and runs steps that return what the caller wants back: logits, argmaxes, or a token
// drawn on the device.
//
// Plain C++ (no CUDA types): the runtime includes it without compiling device code. eval() is the one step every
// backend has; the others exist where Capabilities says so, and the runtime builds them from eval() elsewhere (its own
// host loops: one per step, not one per backend), so their defaults only refuse; eval_scores' default scores eval's
// logits on the host.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "graph/graph.h"
#include "graph/passes/chain.h"

namespace tessera::backend {

// What a backend does natively (the runtime picks paths by these, never by device name).
struct Capabilities {
  bool device_argmax = false;    // decode_rows_argmax / generate_greedy keep the logits on the device
  bool device_sampling = false;  // decode_sample draws on the device
  bool chained_greedy = false;   // generate_greedy queues steps without a host round trip per token
  bool batched_decode = false;   // decode_rows runs B sequences in one step (not one after another)
  bool reference_mode = false;   // can run the scalar reference kernels (SessionConfig::reference)
  bool device_scores = false;    // eval_scores reduces the logits where they are computed (only the scores come back)
};

// What scoring a row of logits against a target token needs (perplexity): log p(target) = target_logit - lse.
struct RowScore {
  double lse = 0;           // log(sum over the vocabulary of exp(logit))
  double target_logit = 0;  // the logit of the row's target token
};

// The model's weights as one backend holds them (repacked on the CPU, uploaded on a GPU): made once per model and
// backend, shared by every session.
class WeightStore {
 public:
  virtual ~WeightStore() = default;
  virtual uint64_t bytes() const = 0;  // bytes held beyond the mapped file
};

// How a session's graphs are built: T tokens, logits of every row or of the last; decode_rows: the T rows are one
// decode step each of its own sequence (batched decode), not a prompt chunk, so TEAL thresholds every row as the
// one-token decode graph does (graph::SparsifyOptions::all_rows), its matmuls staying dense (docs/TEAL.md).
using GraphBuilder = std::function<graph::Graph(int64_t n_tokens, bool all_logits, bool decode_rows)>;

struct SessionConfig {
  int64_t n_ctx = 0;    // positions per sequence slot
  int64_t n_batch = 0;  // rows per prefill chunk (eval never gets more)
  int64_t n_seq = 1;    // sequence slots, each with its own KV cache
  int n_threads = 0;    // host threads (0: one per hardware thread)
  bool reference = false;
  DType kv_dtype = DType::F16;
  std::vector<std::string> options;  // the backend's own switches, "key=value" (SessionOptions::backend_options)
  GraphBuilder build_graph;
};

// One device-side draw (the sampler chain of runtime::Sampler): the window's penalty counts as
// runtime::penalty_counts gives them, and u, the uniform number the host's generator would draw next.
struct SampleRequest {
  float temperature = 0.8f;
  int32_t top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  float repeat_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  const std::vector<std::pair<int32_t, int32_t>>* penalties = nullptr;
  double u = 0;
};

// A session's state on one backend. Positions are given by the caller (the runtime keeps the tokens): a slot's cache
// holds positions [0, pos) when a step at pos runs; truncating is only the caller moving pos back.
class DeviceSession {
 public:
  virtual ~DeviceSession() = default;

  // Evaluates ids (1 <= t <= n_batch tokens) of slot `seq` at positions [pos, pos + t). Returns the logits of every
  // row [t, n_vocab] (all_rows) or of the last [n_vocab], valid until the next call.
  virtual std::span<const float> eval(int64_t seq, std::span<const int32_t> ids, int64_t pos, bool all_rows) = 0;

  // Evaluates as eval(all_rows = true) and returns, per row r, the RowScore of its logits against targets[r] (an id in
  // the vocabulary; -1: a row not scored, which gets {0, 0}), valid until the next call. The default scores the rows on
  // the host, one after another; a backend with Capabilities::device_scores reduces them where they were computed and
  // copies back only t scores.
  virtual std::span<const RowScore> eval_scores(int64_t seq, std::span<const int32_t> ids, int64_t pos,
                                                std::span<const int32_t> targets) {
    const std::span<const float> all = eval(seq, ids, pos, true);
    const size_t vocab = static_cast<size_t>(n_vocab());
    host_scores_.resize(ids.size());
    for (size_t r = 0; r < ids.size(); ++r)
      host_scores_[r] = targets[r] < 0 ? RowScore{} : score_row(all.subspan(r * vocab, vocab), targets[r]);
    return host_scores_;
  }
  // One row's score in double (the reference the device reductions are checked against).
  static RowScore score_row(std::span<const float> logits, int32_t target) {
    double m = -std::numeric_limits<double>::infinity();
    for (float v : logits) m = std::max(m, static_cast<double>(v));
    double sum = 0;
    for (float v : logits) sum += std::exp(static_cast<double>(v) - m);
    return {m + std::log(sum), static_cast<double>(logits[static_cast<size_t>(target)])};
  }

  // Batched decode (Capabilities::batched_decode): row r evaluates ids[r] in slot seqs[r] (distinct) at position
  // pos[r]. Logits [B, n_vocab].
  virtual std::span<const float> decode_rows(std::span<const int32_t> /*ids*/, std::span<const int32_t> /*seqs*/,
                                             std::span<const int32_t> /*pos*/) {
    refuse("batched decode");
  }
  // The same step returning each row's argmax (the first on ties) instead of logits (Capabilities::device_argmax).
  virtual std::vector<int32_t> decode_rows_argmax(std::span<const int32_t> /*ids*/, std::span<const int32_t> /*seqs*/,
                                                  std::span<const int32_t> /*pos*/) {
    refuse("argmax on the device");
  }
  // Greedy decoding of slot 0 from `token` at `pos` (Capabilities::chained_greedy): at most n steps; on_token gets
  // each step's argmax and returns whether to go on. Returns the steps accepted (tokens evaluated); the steps queued
  // past a stop are dropped.
  virtual int64_t generate_greedy(int32_t /*token*/, int64_t /*pos*/, int64_t /*n*/,
                                  const std::function<bool(int32_t)>& /*on_token*/) {
    refuse("chained greedy decoding");
  }
  // Slot 0 evaluates `token` at `pos`, then draws from its logits on the device: {token, candidates} (candidates 1:
  // the host's generator must not advance; 0: every logit was NaN). nullopt when the backend cannot draw (the caller
  // then evaluates and samples on the host; nothing was evaluated).
  virtual std::optional<std::pair<int32_t, int32_t>> decode_sample(int32_t /*token*/, int64_t /*pos*/,
                                                                   const SampleRequest& /*r*/) {
    return std::nullopt;
  }
  // Slot 0's logits after a step that returned only ids (argmax, sample, generate_greedy), fetched now; empty when
  // the device no longer holds them.
  virtual std::span<const float> last_logits() { return {}; }

  // Per-node wall time of every step of `n_tokens` rows, added into a vector of the graph's size (profile).
  virtual void set_profiling(bool on) = 0;
  virtual std::vector<uint64_t> profile_ns(int64_t n_tokens) const = 0;
  // Where each worker thread ran in each node of the last step of `n_tokens` rows, while profiling (the CPU's
  // Plan::thread_spans layout: [2 * (node * n_threads() + thread)] start, [+ 1] end, ns after the node's start + 1);
  // empty where the backend has no threads of its own to show (CUDA: one stream).
  virtual std::vector<uint64_t> profile_thread_spans(int64_t /*n_tokens*/) const { return {}; }

  virtual int64_t n_vocab() const = 0;
  virtual int n_threads() const = 0;
  // Zeros and elements the session's SPARSIFY nodes wrote (TEAL, graph/passes/sparsify.h) since the last reset:
  // the achieved activation sparsity. {0, 0} on a backend that does not count.
  virtual std::pair<uint64_t, uint64_t> sparsity_counts() const { return {0, 0}; }
  virtual void reset_sparsity_counts() {}
  // Calibration: histograms of the SPARSIFY nodes' inputs per (layer, input) (cpu::take_activation_histograms); a
  // backend without them refuses.
  virtual void record_activation_histograms(bool /*on*/) {
    fail("this device cannot record activation histograms (calibrate on the cpu)");
  }
  virtual std::map<int, std::vector<uint64_t>> take_activation_histograms() { return {}; }
  // The workload dump (tessera dump) and greedy calibration: after each node of every step, tap(node, rows, pos, in,
  // out) with the node's index in the step's graph, its first input and its output (host f32, valid during the call;
  // the tap may rewrite the output, which later nodes then read). An empty function turns it off. A backend whose
  // activations are not on the host refuses.
  using NodeTap = std::function<void(int node, int64_t rows, int64_t pos, const float* in, float* out)>;
  virtual void set_node_tap(NodeTap /*tap*/) { fail("this device cannot show its activations (dump on the cpu)"); }

 private:
  std::vector<RowScore> host_scores_;  // the default eval_scores' answer
  // A step the backend's Capabilities do not offer: the runtime never asks for it, so reaching this is a bug.
  [[noreturn]] static void refuse(const char* step) {
    throw std::logic_error(std::string("backend: ") + step + " asked of a backend whose capabilities lack it");
  }
};

// The GPU's (or host's) measured limits for `tessera bench --ceilings`: bandwidths and matmul rates per repeat.
struct Ceilings {
  std::string device_name;
  struct Bandwidth {
    std::string name;
    uint64_t bytes = 0;
    std::vector<double> gbps;
  };
  struct Gemm {
    std::string dtype, kernel;
    int64_t m = 0, n = 0, k = 0;
    std::vector<double> tflops;
  };
  std::vector<Bandwidth> bandwidth;
  std::vector<Gemm> gemm;
};
struct CeilingsRequest {
  uint64_t buffer_bytes = 1ull << 30;
  int repeats = 5;
  std::vector<DType> dtypes;  // empty: the backend's own list
  bool bandwidth = true, gemm = true;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  // Whether it can run here (a GPU and driver present); `why` gets one sentence when not.
  virtual bool available(std::string* why) const = 0;
  virtual Capabilities capabilities() const = 0;
  // Whether the backend runs `node` of graph `g` as the model builder emits it (ops, shapes, weight formats after
  // load-time conversion); a session's open fails on the first node it does not run, naming it.
  virtual bool supports(const graph::Node& node, const graph::Graph& g) const = 0;
  // Whether a weight in `dtype` runs natively; others are converted at load (see quant's format traits).
  virtual bool native_weight_format(DType dtype) const = 0;
  virtual std::shared_ptr<WeightStore> make_weight_store() const = 0;
  // Error naming the node or option at fault when the model cannot run here.
  virtual std::unique_ptr<DeviceSession> open(const SessionConfig& config,
                                              std::shared_ptr<WeightStore> weights) const = 0;
  // Measured limits; Error when the backend has none to measure.
  virtual Ceilings measure_ceilings(const CeilingsRequest& request) const = 0;
  // The builder's graph `g` as this backend's executors would run it (its graph passes, default options), for display
  // (`tessera graph --device`); host code only, so it needs no device. T = 1: the decode executor's passes.
  virtual graph::Graph rewrite_for_display(const graph::Graph& g) const { return g; }
  // The ceilings this backend's matmul-chain pass weighs orders by (graph/passes/chain.h; `tessera graph --chains
  // --device`); the default is the CPU's.
  virtual graph::ChainCostModel chain_cost_model() const { return {}; }
};

// The backend named `name` ("cpu", "cuda"), ready to run. Error naming the backends there are when no backend has
// that name, or saying in one sentence why it cannot run here (no GPU or driver, not built in).
const Backend& get(std::string_view name);
// The backend named `name` if it is compiled in, whether it can run here or not (nullptr otherwise): for what needs
// no device, such as rewrite_for_display.
const Backend* find_compiled(std::string_view name);
// Names of the backends compiled in, whether usable here or not.
std::vector<std::string> names();

}  // namespace tessera::backend
