// The CPU backend: compiles a graph into a plan (weights prepared, activation memory planned once per graph) and
// executes it with the kernels of kernels.h on a persistent thread pool.
//
// Two modes. Fast: SIMD kernels, repacked weights, 8-bit activation quantization inside quantized matmuls.
// Reference: every op runs its scalar `_ref` kernel (weights dequantized to f32, dot products in double, no
// activation quantization); work is still split over threads by token, which does not change any result.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/kernels/lora.h"
#include "backends/cpu/kernels/matmul_sparse.h"
#include "core/thread_pool.h"
#include "graph/graph.h"
#include "graph/passes/fuse.h"
#include "quant/format_support.h"

namespace tessera::cpu {

struct BackendOptions {
  int n_threads = 0;       // 0: one per hardware thread
  bool reference = false;  // scalar reference kernels (see above)
  // The kernels' instruction set (`--cpu-isa scalar|avx2|avx2_vnni|avx512_vnni`, parse_isa); empty: the best this
  // CPU runs. Process-wide: the backend's constructor sets active_isa() (an ISA the CPU lacks is a tessera::Error).
  std::optional<Isa> isa;
  // TEAL's MATMUL_SPARSE (`--cpu-teal-walk`, "teal_walk=all|none"): true walks the surviving channels of the sparse
  // copy (kernels/matmul_sparse.h); false (the default) runs the dense kernel on the zeroed input, the same values up
  // to summation order. On the 2-core AMD EPYC dev machine (twenty-fourth session, default model as Q4_1, Q8_0 and F16,
  // `--teal` 50%, 2 threads) the walk decoded at 0.63x / 0.83x / 0.94x of dense and the dense kernel on the zeroed x
  // at 0.96x / 0.96x / 0.99x: the walks skip arithmetic but still touch about every cache line (docs/TEAL.md).
  bool teal_walk = false;
};

// Matmul weights prepared for the fast kernels, shared by every plan and session of one model: the repacked copy
// of a weight is made once. Weights in a format the matmul kernels lack (K-quants, ...) are converted once to the
// table's fallback (matmul_formats(): f16), with one notice per format on stderr. Thread-safe.
class WeightCache {
 public:
  const PackedWeight& get(const graph::Tensor& w);  // w: a 2-D WEIGHT tensor [N, K] with data
  uint64_t bytes() const;                           // bytes of repacked or converted copies held
  // The channel-major copy MATMUL_SPARSE reads (kernels/matmul_sparse.h), made on first use; nullptr where the active
  // ISA has no sparse kernel for the weight's (possibly converted) format.
  const SparseWeight* get_sparse(const graph::Tensor& w);
  // The LoRA adapters (A [r, K], B [N, r] each) of a fused matmul through `base` [N, K] (get()'s), stacked and
  // converted for kernels/lora.h, made on first use (one copy per base and list of adapters, shared by every plan).
  const LoraWeights& get_lora(const std::vector<std::pair<const graph::Tensor*, const graph::Tensor*>>& adapters,
                              const PackedWeight& base);

 private:
  mutable std::mutex mu_;
  std::unordered_map<const void*, std::unique_ptr<PackedWeight>> map_;
  std::unordered_map<const void*, std::unique_ptr<SparseWeight>> sparse_;
  std::map<std::vector<const void*>, std::unique_ptr<LoraWeights>> lora_;  // by the adapters' A and B data
  std::vector<std::shared_ptr<std::vector<uint8_t>>> converted_;
  ConversionNotices notices_;
  std::set<DType> dense_sparse_;  // formats get_sparse had no kernel for (one notice each)
  uint64_t bytes_ = 0;
};

// Persistent tensors the session owns, bound to graph KV_CACHE tensors by role (CACHE_K / CACHE_V) and layer.
struct OpCall;  // op_kernel.h

struct StateBinding {
  graph::IoRole role = graph::IoRole::NONE;
  int layer = -1;
  void* data = nullptr;
};

// A compiled graph. Inputs are written into the plan's own storage before execute(); outputs are read after.
class Plan {
 public:
  Plan();
  ~Plan();
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;

  const graph::Graph& graph() const { return graph_; }
  // Storage of an INPUT tensor (e.g. "tokens", "positions": i32 [T]); Error when there is none of that name.
  void* input(std::string_view name);
  const float* output(std::string_view name) const;  // an f32 ACTIVATION tensor
  // The same by role (TOKENS, POSITIONS; LOGITS): what runtimes use, so a builder may name its tensors freely.
  void* input(graph::IoRole role);
  const float* output(graph::IoRole role) const;
  uint64_t arena_bytes() const { return arena_bytes_; }
  // When set (size = nodes), execute() adds each node's wall time in nanoseconds (for `tessera profile`).
  std::vector<uint64_t>* node_ns = nullptr;
  // When set too (profile --trace), execute() writes where each pool thread worked in each node of its last run:
  // [2 * (node * threads + thread)] the first task's start and [+ 1] the last task's end, in ns after the node's
  // start plus 1 (0 and 0: the thread ran none of that node's tasks). Overwritten by every run.
  std::vector<uint64_t>* thread_spans = nullptr;
  // When set, execute() calls it after each node: (node, rows, n_past, first input, output) (backend::NodeTap).
  const std::function<void(int, int64_t, int64_t, const float*, float*)>* tap = nullptr;

  struct Step;
  struct Lora;

 private:
  friend class CpuBackend;
  graph::Graph graph_;
  std::vector<Step> steps_;
  std::vector<int64_t> offsets_;  // per tensor: byte offset in the arena, -1 when it has none
  void* arena_ = nullptr;         // 64-byte aligned
  uint64_t arena_bytes_ = 0;
  std::vector<std::pair<std::string, int>> input_ids_;  // INPUT tensors by name
  std::vector<std::unique_ptr<OpCall>> calls_;          // bindings of the steps that run a registered op kernel
  std::vector<std::unique_ptr<Lora>> loras_;            // the LoRA epilogues of fused matmuls
  // Matmul weights graph_ owns (the chain rewrite's folded constants): prepared per plan, never in the WeightCache,
  // whose entries, keyed by address, outlive this graph.
  std::vector<std::unique_ptr<PackedWeight>> own_weights_;
};

// What the CPU's plans run fused, declared to the graph passes (graph/passes/fuse.h): in fast mode, matmul chains in
// the order the chain pass finds cheapest under graph::ChainCostModel's defaults (a 2-core AVX2 machine's f32 path),
// weight-only products folded into f32 constants, and each matmul with its unmerged LoRA adapters in one step;
// nothing in reference mode (it runs the builder's nodes: the fast mode's oracle).
graph::FusionSupport cpu_fusion_support(bool reference);

class CpuBackend {
 public:
  CpuBackend(const BackendOptions& options, std::shared_ptr<WeightCache> weights);

  // Whether this backend runs the node (shape and dtype included); compile() fails on the first it cannot. An op
  // without a dedicated step runs through its registered kernel (op_kernel.h), and is unsupported without one.
  bool supports(const graph::Node& node, const graph::Graph& g) const;
  // Why a backend in fast (reference = false) or reference mode rejects the node, nullptr when it runs it: supports()
  // without a backend (no thread pool), for the backend interface's supports().
  static const char* reject_reason(const graph::Node& node, const graph::Graph& g, bool reference);
  // Prepares weights, plans activation memory and binds the caches. Error naming the node or tensor at fault.
  std::unique_ptr<Plan> compile(const graph::Graph& g, const std::vector<StateBinding>& state);
  // Runs the plan for tokens at positions [n_past, n_past + T): the caches must hold positions [0, n_past).
  // Token ids are checked against the vocabulary before any work is done.
  void execute(Plan& plan, int64_t n_past);

  ThreadPool& pool() { return pool_; }
  int n_threads() const { return pool_.n_threads(); }
  bool reference() const { return options_.reference; }
  const BackendOptions& options() const { return options_; }

 private:
  void run_step(const Plan::Step& s, int64_t n_past);
  // nullptr when supported, else the end of the sentence saying why not ("has no CPU kernel").
  const char* reject_reason(const graph::Node& node, const graph::Graph& g) const;

  BackendOptions options_;
  std::shared_ptr<WeightCache> weights_;
  ThreadPool pool_;
};

}  // namespace tessera::cpu
