// Internals shared by the CUDA executors (backend_cuda.cpp, executor_rows.cpp): CudaShared's state, the launch list
// with graph node ids, per-node profiling with events, and CUDA graph capture.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/cuda/backend_cuda.h"
#include "backends/cuda/cuda_options.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/gemv_sparse.h"
#include "backends/cuda/kernels_lora.h"
#include "backends/cuda/kernels_rows.h"
#include "backends/cuda/memory.h"
#include "graph/passes/fuse.h"
#include "graph/passes/memory_plan.h"
#include "quant/format_support.h"

namespace tessera::cuda {

bool is_quantized_dtype(DType t);

// The positions per slot of a graph with no KV cache (CudaBackendOptions::n_ctx, or 4096 when unset).
int64_t state_only_ctx(const CudaBackendOptions& o);

// A matmul node's unmerged LoRA adapters on the device (kernels_lora.h): a = A_stack [R, K], every adapter's A rows
// grouped by stack member, in lora_a_dtype(base format) (one GEMV or GEMM gives u = x·A_stackᵀ for all of them; beside
// a bf16 or f16 base a view of the DeviceAugmented's tail below, which holds the same rows), and
// b, each member's B's side by side in f16 as `layout` says. For the rows executor's tensor-core path (prefill, from
// kLoraGemmMinT rows) also b_bd: every member's B placed block-diagonally in one [N_total, r_total] matrix of A's
// 16-bit type (member m's adapters at rows [row0_m, row0_m + rows_m) and columns [u0_m, u0_m + r_m), zeros elsewhere),
// so that one GEMM y += u·b_bdᵀ adds every member's term to its rows; empty until a caller asks for it (lora()'s
// gemm_b), and never built where r_total is not a multiple of 8 (rows of 16-bit values start 16-byte aligned).
struct DeviceLora {
  DeviceWeight a;
  DeviceBuffer b;
  LoraBLayout layout;
  DeviceWeight b_bd;
};

// An adapted node's float base weight (its stack, or its one weight) with its adapters' A_stack appended as further
// rows in the same format: aug [N + R, K]. The decoder's one GEMV over it writes y and u = x·A_stackᵀ together (the
// norm prologue normalizing x for both), so an adapted node costs one launch more than its base, not two. head and
// tail are views of aug's first N and last R rows: the rows executor multiplies by head, so the model's weights are
// not on the device twice.
struct DeviceAugmented {
  DeviceWeight aug, head, tail;
};

// The format of A_stack beside a base weight of format `base` (its device format): the 16-bit type the base's
// matmuls take x in (matmul_x16_type: bf16 beside bf16 and quantized weights, f16 beside f16), so that A reads the
// same 16-bit copy of x in prefill; f16 beside f32 weights (no 16-bit copy; the graph gives A in f16 or f32).
DType lora_a_dtype(DType base);

// One model's weights on the device (by host data pointer; tied embeddings share one), its stacked weights of
// merged matmuls (by their members' host pointers) and its adapters per node (by their host pointers and layout):
// uploaded once per model, shared by every session's CudaShared. A weight a graph owns (the matmul-chain rewrite's
// folded constants, graph::Graph::owns) is keyed by its content instead (constant_key): its storage lives only as long
// as its graph, so another compile's constant may later be allocated at the same address, while equal contents (a
// chain folded alike in the prefill and batch graphs, or by another session with the same adapters) may share one
// upload.
struct DeviceWeights {
  std::unordered_map<const void*, DeviceWeight> weights;
  std::map<std::string, DeviceWeight> constants;
  std::map<std::vector<const void*>, std::unique_ptr<DeviceWeight>> stacks;
  std::map<std::string, std::unique_ptr<DeviceLora>> loras;
  std::map<std::string, std::unique_ptr<DeviceAugmented>> augmented;
  // TEAL's channel-major copies of float weights (and stacks), by the device weight they copy.
  std::map<const DeviceWeight*, std::unique_ptr<SparseWeight>> sparse_columns;
};

struct CudaShared::Impl {
  explicit Impl(std::shared_ptr<DeviceWeights> w) : store(w ? std::move(w) : std::make_shared<DeviceWeights>()) {}
  std::shared_ptr<DeviceWeights> store;
  int64_t n_seq = 1;
  int64_t max_rows = 1;
  CudaBackendOptions options;
  bool fuse = true;  // declare stacked matmuls and epilogues to the graph passes (TESSERA_CUDA_FUSE=0: off)
  cudaStream_t stream = nullptr;
  std::unordered_map<const void*, DeviceWeight>& weights = store->weights;
  std::map<std::string, DeviceWeight>& constants = store->constants;
  std::map<std::vector<const void*>, std::unique_ptr<DeviceWeight>>& stacks = store->stacks;
  std::map<std::string, std::unique_ptr<DeviceLora>>& loras = store->loras;
  std::map<std::string, std::unique_ptr<DeviceAugmented>>& augmented_weights = store->augmented;
  struct Cache {
    DType dtype = DType::F16;
    int64_t n_kv = 0, n_ctx = 0, hd = 0;
    DeviceBuffer data;  // [n_seq, n_kv, n_ctx, hd]
  };
  std::map<std::pair<graph::IoRole, int>, Cache> caches;  // by the graph tensor's role (CACHE_K / CACHE_V) and layer
  std::unique_ptr<GemmWorkspace> gemm;                    // created by the first rows executor
  uint64_t bytes = 0;
  ConversionNotices notices;  // weights converted at upload (no kernel for their format): one notice per format

  // Error text prefix for a node that cannot run: "cuda backend: node 'x' (op) cannot run on the GPU: why".
  [[noreturn]] static void unsupported(const graph::Node& n, const std::string& why);
  // The device copy of 2-D weight t of graph g (uploaded on first use; by content where g owns it: constant_key).
  const DeviceWeight& weight(const graph::Graph& g, const graph::Node& n, const graph::Tensor& t);
  // The weights of `members` (same dtype and K) stacked row-wise as one matrix (uploaded on first use, by the
  // members' addresses). unsupported(n, ...) for a member g owns: the passes never stack one (stack_matmuls).
  const DeviceWeight& stack(const graph::Graph& g, const graph::Node& n,
                            const std::vector<const graph::Tensor*>& members);
  // The adapters of matmul node n of g (graph::lora_terms; n.fusion.lora > 0) beside its base weight whose device
  // format is `base` (uploaded on first use). Error naming the node for adapters whose shapes do not fit it. gemm_b:
  // with b_bd too (where r_total % 8 == 0 and A is 16-bit), uploaded once on the first call that asks.
  const DeviceLora& lora(const graph::Graph& g, const graph::Node& n, DType base, bool gemm_b = false);
  // The base weight of adapted matmul node n with its A_stack appended (DeviceAugmented; uploaded on first use, in
  // the order lora() gives u's columns), or nullptr where the base is not f32, f16 or bf16 in its own format (then the
  // node takes stack() or weight() and lora()'s A_stack).
  const DeviceAugmented* augmented(const graph::Graph& g, const graph::Node& n);
  // Host W [rows, k] in t's format uploaded as it is, or converted to weight_formats()'s fallback first when no
  // kernel reads that format (with the format's notice); unsupported(n, ...) when Tessera cannot read it.
  DeviceWeight upload_any(const graph::Node& n, const graph::Tensor& t, const void* host, int64_t rows, int64_t k);
  // The channel-major copy of bf16/f16 weight w (make_sparse_columns) for TEAL's sparse GEMVs: made on first use on
  // this stream and kept with the model's weights, so the decoder and the batched-decode executor share one.
  const SparseWeight& sparse_columns(const DeviceWeight& w);
  // Device storage of KV_CACHE tensor t (every slot): allocated zeroed the first time its role and layer are seen.
  // A recurrent state (IoRole::STATE, f32 [D + 1]) is one such tensor per slot, slot s at s * (D + 1) floats.
  void* cache(const graph::Tensor& t);
  // The matmul workspace, grown to (max_rows, max_k, max_quant_nk) if it is smaller. Only before any executor has
  // captured a graph over it: callers size it at compile time.
  GemmWorkspace& gemm_workspace(int64_t max_k, int64_t max_quant_nk);
  int64_t gemm_k = 0, gemm_nk = 0;
  uint64_t gemm_generation = 0;  // bumped when the workspace is replaced: graphs captured over the old one are stale
};

// The key of a graph-owned weight in DeviceWeights::constants: its name, format, shape and a 64-bit hash of its bytes.
// Two keys are equal for equal contents; different contents under one name and shape (the same chain folded from
// another adapter) collide only if their hashes do (about 2^-64 per pair).
std::string constant_key(const graph::Tensor& t);

// The matmul-chain rewrite (graph/passes/chain.h, docs/GRAPH.md "Matmul chains") as both executors declare it: chains
// in the order cheapest under cuda_chain_cost_model(), weight-only products folded into f32 constants (run natively:
// f32 is a GPU weight format) from the values cuda_weight_values() reads. Host code only.
// The ceilings are those of the f32 path the folded constant's product runs on (the f32 GEMV; cuBLASLt's f32 GEMM,
// CUBLAS_COMPUTE_32F without TF32): 50 TFLOP/s, ~75% of the H100's 67 TFLOP/s f32 FMA peak (docs/CUDA_NOTES.md; a
// large SGEMM's usual share, not measured here), and the 2.99 TB/s copy, in 4-byte elements (the constant and the f32
// activations it multiplies: a norm output read by it gets no 16-bit copy). Not the bf16 GEMM's 725 TFLOP/s: the
// builder's order runs its products on the tensor cores (bf16 or f16 A and B), but the fold's T x K x N product would
// run ~14x slower than those figures say, and a wrong fold costs more than a missed one. At ~67 FLOP per element, as
// the CPU's 40, only narrow chains differ: a LoRA folds at ranks far above min(K, N) / 2 in long prefill chunks (a
// rank-48 adapter on a 64-wide base: attention projections from T = 86, FFN ones from T = 194, none at T = 64), at
// r <= min(K, N) / 2 only where min(K, N) < 128 (64 x 64 at rank 32: from T = 129), and never in the one-token decoder
// (a GEMV of any order moves each weight once; the fold only adds a K x N product).
graph::ChainCostModel cuda_chain_cost_model();
// A weight's values in f32, [N, K] row-major, dequantized on the host (quant/quant.h); empty where the host cannot
// read its format, a 2-D shape or data is missing (the chain then stays as built).
std::vector<float> cuda_weight_values(const graph::Tensor& w);

// What the executors run fused, declared to the graph passes (graph/passes/fuse.h). Host code only: no device needed.
// The one-token decoder: matmul chains in their cheapest order (cuda_chain_cost_model), norm prologues (float weights;
// fold_norm), every matmul sharing an input stacked, SwiGLU epilogues (float weights, fold_swiglu; quantized opt-in),
// residual epilogues, the residual GEMV writing the next norm's q8 input (quantized readers; q4_1 by default), rope +
// stores + attention. fuse = false: the last only (the builder's chains left to right).
graph::FusionSupport decoder_fusion_support(bool fuse, bool fold_norm, bool fold_swiglu);
// The T-row executor: matmul chains in their cheapest order, q|k|v stacked where they feed the attention only, gate|up
// (merge_gate_up), residual epilogues, rope + stores + attention. fuse = false: the last only.
graph::FusionSupport rows_fusion_support(bool fuse, bool merge_gate_up);

// The CUDA executors' activations: one arena per executor planned by graph::plan_memory over the rewritten graph
// (decoder: true for the one-token decoder, false for the rows executor), allocated once at compile so captured graphs
// keep their addresses. Offsets are multiples of kArenaAlignment (every vector load and TMA). Graph inputs keep their
// own buffers. An output takes the block of a dying input only where the executor's kernels allow it: a residual
// epilogue over its residual (by design), ADD over its first operand (add: y += x), and in the decoder a one-token
// LAST_ROW over its row (no launch); never a kernel that reads x while writing y (GEMV, rmsnorm, swiglu). Host only.
// `extras` (the rows executor's 16-bit copies) take blocks of the same arena (MemoryPlan::extra_offsets).
constexpr uint64_t kArenaAlignment = 256;
graph::MemoryPlanOptions cuda_memory_plan_options(bool decoder);
graph::MemoryPlan plan_cuda_memory(const graph::Graph& g, bool decoder,
                                   const std::vector<graph::ExtraBuffer>& extras = {});

// A 16-bit copy of a rows-executor activation, written by its producer instead of the f32 tensor from min_t rows on
// and read by matmuls whose weights take a 16-bit x; buffer says its bytes and the nodes it lives through. Host only.
struct X16Copy {
  int tensor = -1;
  DType type = DType::BF16;
  int64_t min_t = INT64_MAX;
  graph::ExtraBuffer buffer;
};
// Every such copy of the rows graph g (rewritten by the passes): rmsnorm and swiglu outputs, and with out16 the
// prefill attention outputs, each read only by matmuls whose weights take the same 16-bit x at runs of g's rows.
std::vector<X16Copy> rows_x16_copies(const graph::Graph& g, bool prefill, bool out16);

// The cache view of an attention node whose K cache tensor is kt ([n_kv, n_ctx, hd], storage k and v for n_seq
// slots); unsupported when the node's head sizes disagree with it.
KvCacheView attention_cache_view(const graph::Node& n, const graph::Tensor& kt, void* k, void* v, int64_t n_seq);
// Whether decode attention runs rope + store fused into it (TESSERA_CUDA_FUSE_ATTN=0: two launches, for comparison).
bool fuse_attention_enabled();

// Run-time values of one step that the launches read on the host (PREFILL passes t, p0 and the slot; BATCH t only).
struct RunArgs {
  int64_t t = 1;
  int64_t p0 = 0;
  int64_t seq = 0;
  // The logits matmul computes rows [logits_row0, t) only (prefill_scores: the rows before it are not scored, and
  // at the 8B shape their share of the [t, vocab] product is ~0.45 ms of a 14 ms perplexity chunk). 0: every row.
  int64_t logits_row0 = 0;
};

struct Launch {
  int node = -1;  // graph node whose time this launch is
  std::function<void(cudaStream_t, const RunArgs&)> fn;
};

// Runs the launches plainly; with `profile`, records an event after each and adds the elapsed ns to its node
// (synchronizes the stream).
class LaunchRunner {
 public:
  ~LaunchRunner();
  void run(const std::vector<Launch>& launches, cudaStream_t stream, const RunArgs& args,
           std::vector<uint64_t>* profile);

 private:
  std::vector<cudaEvent_t> events_;
};

// Captures the launches on `stream` into an executable graph; false (and the runtime's error cleared) when capture
// or instantiation fails, in which case the caller keeps launching plainly.
bool capture_graph(const std::vector<Launch>& launches, cudaStream_t stream, const RunArgs& args, cudaGraph_t* graph,
                   cudaGraphExec_t* exec);

// The shared state of `shared`, or of a fresh private one-slot CudaShared stored into `shared`.
CudaShared::Impl& shared_impl(std::shared_ptr<CudaShared>& shared, const CudaBackendOptions& options);

}  // namespace tessera::cuda
