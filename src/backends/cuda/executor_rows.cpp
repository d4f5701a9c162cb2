// CudaRowsExecutor: compiles a T-row graph into launches over fixed device pointers. Row counts are run-time values
// (PREFILL runs any t <= T; the node shapes of the graph scale with it), so every launch receives RunArgs.
//
// What differs from the one-token decoder (backend_cuda.cpp):
// - matmuls go through kernels_rows.h's matmul (f32 activations for every weight format: no 8-bit copies here),
//   except where an rmsnorm or swiglu output read only by matmuls whose weights take a 16-bit x is written by its
//   producer directly in 16 bits (matmul_x16; runs of at least matmul_x16_min_t rows: prefill, and batched decode of
//   B >= 5 float or >= 41 quantized rows): at t = 2048 of Llama-3-8B that removes ~0.45 GB of f32 traffic per layer
//   (the f32 writes and matmul's conversion passes). TESSERA_CUDA_X16=0: off;
// - matmuls whose outputs feed rope/cache stores are merged (q|k|v): their [t, Nq + Nk + Nv] output is read with a
//   row stride by rope_store_kv_rows and the attention kernels; gate|up are merged too (swiglu_rows reads
//   the two halves of the [t, 2 * ff] output with a row stride; TESSERA_CUDA_MERGE_GATE_UP=0: separate);
// - where a run takes the 16-bit inputs, the merged gate|up matmul also writes its output in 16 bits (swiglu_rows16
//   reads it) and prefill attention writes its output in 16 bits for the o-projection: at t = 2048 of Llama-3-8B
//   another ~0.29 GB of f32 traffic per layer (TESSERA_CUDA_OUT16=0: f32 outputs);
// - activations and the 16-bit copies live in one arena planned by graph::plan_memory (plan_cuda_memory): a block
//   is reused after the last node reading it (readers through the stack's column views count), so T = 512 rows of a
//   32-layer model need a few layers' worth of activations, not all of them.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "backends/cuda/attn_cudnn.h"
#include "backends/cuda/backend_cuda.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/executor_common.h"
#include "backends/cuda/kernels/gemv_sparse.h"
#include "backends/cuda/kernels_family.h"
#include "backends/cuda/kernels_ternary.h"
#include "core/error.h"
#include "graph/passes/fuse.h"
#include "quant/quant.h"

namespace tessera::cuda {

using graph::Op;

namespace {

// Whether TEAL's two-row decode walks the union of the rows' masks over w (CudaOptions::teal_union): float weights
// in rows, the layout make_sparse_columns copies.
bool teal_union_takes(const DeviceWeight& w) {
  return cuda_options().teal_union && (w.dtype == DType::BF16 || w.dtype == DType::F16) &&
         w.layout == GemvLayout::ROWS;
}

}  // namespace

struct CudaRowsExecutor::Impl {
  graph::Graph src;  // the graph given: profiles index its nodes (Node::source)
  graph::Graph g;    // src rewritten by the graph passes (rows_fusion_support): what compile() runs
  RowsMode mode = RowsMode::PREFILL;
  std::shared_ptr<CudaShared> shared_owner;
  CudaShared::Impl* sh = nullptr;
  cudaStream_t stream = nullptr;
  int64_t T = 0;
  bool fuse = true;
  bool x16 = true;            // producers write matmul_x16's 16-bit input (TESSERA_CUDA_X16=0: off)
  bool merge_gate_up = true;  // gate|up as one matmul (TESSERA_CUDA_MERGE_GATE_UP=0: off)
  bool out16 = true;          // 16-bit gate|up and prefill attention outputs (TESSERA_CUDA_OUT16=0: off)
  // A tensor read only by matmuls whose weights take a 16-bit x: its copy in `type`, written by its producer instead
  // of the f32 tensor when a run has at least min_t rows (below that the multi-row GEMV of matmul reads f32 x).
  struct X16 {
    void* buf = nullptr;  // [T, width] 16-bit
    DType type = DType::BF16;
    int64_t min_t = INT64_MAX;
  };
  std::unordered_map<int, X16> x16_of;
  // A merged gate|up output (keyed by the stack's output and its gate slice) that its matmul writes in 16 bits
  // (matmul_x16_out16) from min_t rows on, for swiglu_rows16: buf unused, type is the 16-bit type.
  std::unordered_map<int, X16> gate_up16_of;
  // A gate|up stack with adapters (keyed by its output): below gemm_min_t rows the SWIGLU after it adds their B terms
  // (lora_b_swiglu_rows) to the gate and up it reads, so the stack's output is written once, by the matmul (in 16
  // bits where the base's is); from gemm_min_t rows on the matmul's node adds them on the tensor cores (u·b_bdᵀ into
  // its output) and the SWIGLU is the plain one. u: the stack's A products. consumed: a SWIGLU took it (compile
  // checks that each was).
  struct LoraSwiglu {
    const DeviceLora* lora = nullptr;
    const float* u = nullptr;
    int64_t gemm_min_t = INT64_MAX;
    bool consumed = false;
  };
  std::unordered_map<int, LoraSwiglu> lora_swiglu_of;
  // The f32 partial products of u = x·A_stackᵀ over slices of K (matmul_x16_split_k), [splits, t, R] for the
  // largest any run and node may use: one buffer for every adapted node (their launches run one after another on the
  // stream), sized at compile and read through its address at run time.
  DeviceBuffer lora_parts;
  // From gemm_min_t rows, each adapted node's u = x·A_stackᵀ (the split-K GEMM and its sum) runs on a second stream
  // while the base GEMM runs on the executor's: both read the same x, and the base GEMM's few hundred tiles leave
  // SMs free (Llama-3-8B q|k|v at 512 rows: 96 tiles on 132 SMs). The B GEMM, which adds into the base's output,
  // waits for both (lora_join). The side stream has its own cuBLASLt workspace: the shared one is the base GEMM's.
  // lora_parts is only touched there. CudaOptions::lora_side off: everything on the executor's stream, in order.
  bool lora_side_on = true;
  cudaStream_t lora_side = nullptr;
  cudaEvent_t lora_fork = nullptr, lora_join = nullptr;
  std::unique_ptr<GemmWorkspace> lora_gemm;

  // Activations and 16-bit copies: one arena planned over g (plan_cuda_memory), allocated at compile and never moved
  // (captured graphs hold its addresses).
  graph::MemoryPlan plan;
  DeviceBuffer arena;
  std::vector<float*> ptr;   // per tensor: device address of row 0
  std::vector<int64_t> ld;   // per tensor: elements between rows (> width for a slice of a merged output)
  std::vector<bool> scaled;  // per tensor: its row count is the run's t (else the shape's)
  std::vector<std::vector<int>> consumers;
  std::vector<DeviceBuffer> owned;
  std::unique_ptr<AttnRowsWorkspace> attn_ws;
  // Prefill attention through cuDNN (attn_cudnn.h), one variable-length graph for every layer and chunk: the rotated
  // q in the cache's 16-bit type and, when the o-projection takes the other 16-bit type, cuDNN's output before its
  // conversion; both [T, n_head * hd], shared by all layers.
  std::unique_ptr<CudnnAttnWorkspace> cudnn_ws;
  DeviceBuffer cudnn_q16, cudnn_o16;
  bool cudnn_refused = false;    // cuDNN refused a shape (graph build failed): attn_prefill from then on
  uint64_t gemm_generation = 0;  // of the workspace the captured graph was recorded over

  std::vector<Launch> launches;
  LaunchRunner runner;
  std::vector<uint64_t>* profile = nullptr;
  int tokens_id = -1, positions_id = -1, logits_id = -1;
  int64_t vocab = 0, embd_rows = 0, ctx = 0, out_rows = 1;
  DeviceBuffer seq_dev;          // [T] i32 slot of every row
  int32_t* pos_dev = nullptr;    // [T] i32 position of every row: the positions input, or the executor's own buffer
                                 // (a graph without one: the MatMul-free LM, whose MLGRU reads positions there)
  int32_t* host_io = nullptr;    // pinned [4 * T]: ids, positions, slots, and decode_rows_argmax's answer
  DeviceBuffer argmax_dev;       // [T] decode_rows_argmax's answer on the device
  DeviceBuffer scores_dev;       // [T] double2 prefill_scores' answer on the device
  DeviceBuffer targets_dev;      // [T] i32 prefill_scores' targets
  float* host_logits = nullptr;  // pinned [out_rows, vocab]
  cudaGraph_t cgraph = nullptr;
  cudaGraphExec_t cexec = nullptr;
  bool captured = false, capture_failed = false;
  int steps = 0;
  uint64_t bytes = 0;

  [[noreturn]] void unsupported(const graph::Node& n, const std::string& why) { CudaShared::Impl::unsupported(n, why); }
  int64_t width(int tid) const {
    const graph::Tensor& t = g.tensor(tid);
    return t.shape.empty() || t.shape[0] == 0 ? t.numel() : t.numel() / t.shape[0];
  }
  int64_t rows_of(int tid, int64_t t) const { return scaled[static_cast<size_t>(tid)] ? t : g.tensor(tid).shape[0]; }
  float* act(int tid) const { return ptr[static_cast<size_t>(tid)]; }
  bool contiguous(int tid) const { return ld[static_cast<size_t>(tid)] == width(tid); }

  // Tensor tid's block in the arena.
  float* planned(const graph::Node& n, int tid) {
    const int64_t off = plan.offsets[static_cast<size_t>(tid)];
    if (off < 0) unsupported(n, "its output '" + g.tensor(tid).name + "' has no planned storage");
    return reinterpret_cast<float*>(static_cast<char*>(arena.get()) + off);
  }
  float* new_act(const graph::Node& n, int tid) {
    if (g.tensor(tid).dtype != DType::F32) unsupported(n, "its output is not f32");
    ptr[static_cast<size_t>(tid)] = planned(n, tid);
    ld[static_cast<size_t>(tid)] = width(tid);
    return act(tid);
  }
  // Tensor `tid` lives in `src`'s storage at element offset `off` with `src`'s row stride (or `stride` when given).
  void alias(int tid, int src, int64_t off = 0, int64_t stride = -1) {
    ptr[static_cast<size_t>(tid)] = act(src) + off;
    ld[static_cast<size_t>(tid)] = stride >= 0 ? stride : ld[static_cast<size_t>(src)];
  }
  float* vector_f32(const graph::Node& n, int tid) {
    if (ptr[static_cast<size_t>(tid)] != nullptr) return act(tid);
    const graph::Tensor& t = g.tensor(tid);
    if (t.data == nullptr || !can_dequantize(t.dtype)) unsupported(n, "weight '" + t.name + "' cannot be read as f32");
    std::vector<float> host(static_cast<size_t>(t.numel()));
    dequantize_row(t.dtype, t.data, host.data(), t.numel());
    owned.emplace_back(host.size() * sizeof(float));
    owned.back().upload(host.data(), host.size() * sizeof(float));
    bytes += owned.back().bytes();
    ptr[static_cast<size_t>(tid)] = owned.back().as<float>();
    return act(tid);
  }
  void need_contiguous(const graph::Node& n, int tid) {
    if (!contiguous(tid)) unsupported(n, "its input '" + g.tensor(tid).name + "' is a strided slice");
  }
  // Tensor tid's 16-bit copy (rows_x16_copies, placed at compile), or X16{} (buf nullptr) if it has none.
  X16 x16_copy(int tid) const {
    const auto it = x16_of.find(tid);
    return it != x16_of.end() ? it->second : X16{};
  }
  void size_gemm();
  void compile();
  void compile_node(int id_in_g);
  void copy_logits(int64_t rows);
  // Uploads a prefill chunk's ids, positions and slots and runs it; returns the logits rows it made (t or 1).
  // logits_row0: the logits matmul skips the rows before it (RunArgs::logits_row0).
  int64_t run_prefill(std::span<const int32_t> ids, int64_t seq, int64_t p0, int64_t logits_row0 = 0);
  // BATCH: uploads ids, positions and slots (checked) and runs the step (graph replay once captured); the logits stay
  // on the device.
  void decode_step(std::span<const int32_t> ids, std::span<const int32_t> seqs, std::span<const int32_t> pos);
};

std::vector<X16Copy> rows_x16_copies(const graph::Graph& g, bool prefill, bool out16) {
  const int64_t T = g.n_tokens();
  std::vector<std::vector<int>> consumers(g.tensors().size());
  for (size_t i = 0; i < g.nodes().size(); ++i)
    for (int t : g.nodes()[i].inputs) consumers[static_cast<size_t>(t)].push_back(static_cast<int>(i));
  // Tensor tid gets a copy when every reader is a matmul whose weight takes the same 16-bit x (bf16 or quantized:
  // bf16; f16: f16) at some run of this graph's rows.
  const auto copy_of = [&](int producer, int tid) -> std::optional<X16Copy> {
    const graph::Tensor& t = g.tensor(tid);
    const auto& co = consumers[static_cast<size_t>(tid)];
    if (t.is_output || t.dtype != DType::F32 || co.empty()) return std::nullopt;
    X16Copy h;
    h.tensor = tid;
    h.type = DType::F32;
    h.min_t = 0;
    for (int c : co) {
      const graph::Node& m = g.node(c);
      if (!graph::is_matmul_like(m.op) || m.inputs.at(0) != tid) return std::nullopt;
      const graph::Tensor& w = g.tensor(m.inputs.at(1));
      if (w.shape.size() != 2 || w.data == nullptr || !gemv_supports(w.dtype)) return std::nullopt;
      const DType ty = matmul_x16_type(w.dtype);
      if (ty == DType::F32 || (h.type != DType::F32 && ty != h.type)) return std::nullopt;
      h.type = ty;
      h.min_t = std::max(h.min_t, matmul_x16_min_t(w.dtype));
    }
    if (h.min_t > T) return std::nullopt;  // no run of this executor has enough rows
    // Written by its producer, read by the matmuls (never through views: they are its only readers).
    h.buffer =
        graph::ExtraBuffer{static_cast<uint64_t>(t.numel()) * 2, producer, *std::max_element(co.begin(), co.end())};
    return h;
  };
  std::vector<X16Copy> copies;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const graph::Node& n = g.nodes()[i];
    if (n.op == Op::RMSNORM || n.op == Op::SWIGLU || (n.op == Op::ATTENTION && prefill && out16))
      if (auto h = copy_of(static_cast<int>(i), n.output)) copies.push_back(*h);
  }
  return copies;
}

// What this executor's launches run fused (graph/passes/fuse.h): q|k|v stacked where they feed the attention only (its
// [t, Nq + Nk + Nv] output read with a row stride by rope_store_kv_rows and the attention kernels), gate|up stacked
// for swiglu_rows (TESSERA_CUDA_MERGE_GATE_UP=0: separate), residual adds as the matmul's beta = 1, and rope + cache
// store + attention in the attention launch. TESSERA_CUDA_FUSE=0: only the last.
graph::FusionSupport rows_fusion_support(bool fuse, bool merge_gate_up) {
  graph::FusionSupport f;
  f.rope_store_attention = true;
  f.windowed_attention = true;  // attn_decode_rows and attn_prefill mask keys outside it (KvCacheView::window)
  if (!fuse) return f;
  // Matmul chains in their cheapest order (executor_common.h): a LoRA of rank far above min(K, N) / 2 in a long
  // enough chunk becomes x·(B·A)ᵀ, B·A an f32 constant multiplied by the f32 GEMM (no TF32) beside the base; the rest
  // of this support then takes that matmul and its add as any other (its add folds as a residual epilogue).
  f.chain_orders = cuda_chain_cost_model();
  f.weight_values = cuda_weight_values;
  // Weights whose format has no kernel run as their converted copy (bf16): they stack with weights of that format.
  f.weight_format = [](const graph::Tensor& w) { return weight_formats().runs_as(w.dtype).value_or(w.dtype); };
  f.stack_qkv = true;
  f.stack_gate_up = merge_gate_up;
  f.residual_epilogue = true;
  // Unmerged LoRA adapters in their matmul's node, folded first so that q|k|v and gate|up still stack and the
  // residual adds still fold (kernels_lora.h: one A product for the stack's adapters, one launch for their B's).
  f.lora_epilogue = true;
  f.lora_first = true;
  return f;
}

// One workspace serves every executor (they share the stream): sized for the widest K and, for quantized weights, the
// largest matrix a merged matmul may stack (every matmul reading the same input, summed).
void CudaRowsExecutor::Impl::size_gemm() {
  int64_t max_k = 0, max_nk = 0;
  std::unordered_map<int, int64_t> nk_by_input;
  for (const graph::Node& n : g.nodes()) {
    if (!graph::is_matmul_like(n.op)) continue;
    for (int i = 0; i < n.fusion.n_weights; ++i) {
      const graph::Tensor& w = g.tensor(n.inputs.at(static_cast<size_t>(1 + i)));
      if (w.shape.size() != 2) continue;
      max_k = std::max(max_k, w.shape[1]);
      if (is_quantized_dtype(w.dtype)) {
        int64_t& s = nk_by_input[n.inputs[0]];
        s += w.shape[0] * w.shape[1];
        max_nk = std::max(max_nk, s);
      }
    }
  }
  sh->gemm_workspace(max_k, max_nk);
  gemm_generation = sh->gemm_generation;
}

void CudaRowsExecutor::Impl::compile() {
  T = g.n_tokens();
  TESSERA_CHECK(T >= 1 && T <= sh->max_rows, "cuda backend: a graph of {} rows exceeds the {} rows the engine allows",
                T, sh->max_rows);
  const size_t nt = g.tensors().size();
  ptr.assign(nt, nullptr);
  ld.assign(nt, 0);
  scaled.assign(nt, false);
  consumers.assign(nt, {});
  for (size_t i = 0; i < g.nodes().size(); ++i)
    for (int t : g.nodes()[i].inputs) consumers[static_cast<size_t>(t)].push_back(static_cast<int>(i));
  for (size_t i = 0; i < nt; ++i) {
    const graph::Tensor& t = g.tensors()[i];
    if (t.kind == graph::TensorKind::INPUT) {
      TESSERA_CHECK(t.dtype == DType::I32 && t.numel() == T, "cuda backend: input '{}' must be {} i32", t.name, T);
      owned.emplace_back(static_cast<size_t>(T) * sizeof(int32_t));
      TESSERA_CUDA_CHECK(cudaMemset(owned.back().get(), 0, owned.back().bytes()));
      ptr[i] = owned.back().as<float>();  // i32 storage; never read as float
      scaled[i] = true;
      if (t.io == graph::IoRole::TOKENS)
        tokens_id = static_cast<int>(i);
      else if (t.io == graph::IoRole::POSITIONS)
        positions_id = static_cast<int>(i);
      else
        fail("cuda backend: graph input '{}' has no known role (tokens and positions have)", t.name);
    } else if (t.kind == graph::TensorKind::KV_CACHE) {
      ptr[i] = static_cast<float*>(sh->cache(t));          // every slot; views add the slot offset
      if (t.io != graph::IoRole::STATE) ctx = t.shape[1];  // a recurrent state has no positions to bound
    }
  }
  TESSERA_CHECK(tokens_id >= 0, "cuda backend: the graph lacks its tokens input (role TOKENS)");
  if (ctx == 0) ctx = state_only_ctx(sh->options);  // no KV cache: the session's context
  if (positions_id >= 0) {
    pos_dev = reinterpret_cast<int32_t*>(act(positions_id));
  } else {
    owned.emplace_back(static_cast<size_t>(T) * sizeof(int32_t));
    TESSERA_CUDA_CHECK(cudaMemset(owned.back().get(), 0, owned.back().bytes()));
    pos_dev = owned.back().as<int32_t>();
  }
  for (const graph::Node& n : g.nodes())
    if (n.op != Op::LAST_ROW && n.op != Op::KV_STORE && !n.inputs.empty())
      scaled[static_cast<size_t>(n.output)] = scaled[static_cast<size_t>(n.inputs[n.op == Op::EMBED ? 1 : 0])];
  seq_dev = DeviceBuffer(static_cast<size_t>(T) * sizeof(int32_t));
  TESSERA_CUDA_CHECK(cudaMemset(seq_dev.get(), 0, seq_dev.bytes()));
  size_gemm();
  // One arena for the activations and the 16-bit copies, planned before any launch takes an address.
  const std::vector<X16Copy> copies =
      x16 ? rows_x16_copies(g, mode == RowsMode::PREFILL, out16) : std::vector<X16Copy>{};
  std::vector<graph::ExtraBuffer> extras;
  for (const X16Copy& c : copies) extras.push_back(c.buffer);
  plan = plan_cuda_memory(g, false, extras);
  arena = DeviceBuffer(static_cast<size_t>(plan.total));
  bytes += plan.total;
  for (size_t i = 0; i < copies.size(); ++i)
    x16_of[copies[i].tensor] =
        X16{static_cast<char*>(arena.get()) + plan.extra_offsets[i], copies[i].type, copies[i].min_t};
  for (size_t i = 0; i < g.nodes().size(); ++i) compile_node(static_cast<int>(i));
  for (const auto& [t, l] : lora_swiglu_of)
    TESSERA_CHECK(l.consumed, "cuda backend: the adapters of gate|up stack '{}' have no SWIGLU to add their terms",
                  g.tensor(t).name);
  logits_id = g.find_role(graph::IoRole::LOGITS);
  TESSERA_CHECK(logits_id >= 0 && g.tensor(logits_id).dtype == DType::F32 && act(logits_id) != nullptr,
                "cuda backend: the graph has no f32 logits tensor (role LOGITS)");
  vocab = width(logits_id);
  out_rows = g.tensor(logits_id).shape[0];
  TESSERA_CHECK(mode == RowsMode::PREFILL || out_rows == T,
                "cuda backend: a batched-decode graph must give every row's logits ({} rows, not {})", T, out_rows);
  TESSERA_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host_io), static_cast<size_t>(4 * T) * sizeof(int32_t),
                                   cudaHostAllocDefault));
  TESSERA_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host_logits),
                                   static_cast<size_t>(out_rows * vocab) * sizeof(float), cudaHostAllocDefault));
}

void CudaRowsExecutor::Impl::compile_node(int id_in_g) {
  const graph::Node& n = g.node(id_in_g);
  const int id = n.source;  // launches report their time under the source graph's node
  const int out = n.output;
  const auto in = [&](size_t i) { return n.inputs.at(i); };
  switch (n.op) {
    case Op::EMBED: {
      const DeviceWeight* wp = &sh->weight(g, n, g.tensor(in(0)));
      embd_rows = wp->n;
      const auto* ids = reinterpret_cast<const int32_t*>(act(in(1)));
      float* y = new_act(n, out);
      const bool sc = scaled[size_t(out)];
      const int64_t fixed = g.tensor(out).shape[0];
      launches.push_back({id, [=](cudaStream_t s, const RunArgs& a) { embedding(*wp, ids, y, sc ? a.t : fixed, s); }});
      return;
    }
    case Op::RMSNORM: {
      need_contiguous(n, in(0));
      const float* x = act(in(0));
      const float* w = vector_f32(n, in(1));
      const X16 h = x16_copy(out);
      float* y = new_act(n, out);
      const int64_t d = width(out), fixed = g.tensor(out).shape[0];
      const bool sc = scaled[size_t(out)];
      const float eps = n.params.eps;
      launches.push_back({id, [=](cudaStream_t s, const RunArgs& a) {
                            const int64_t rows = sc ? a.t : fixed;
                            if (rows >= h.min_t)
                              rmsnorm(x, w, nullptr, rows, d, eps, s, nullptr, nullptr, h.buf, h.type);
                            else
                              rmsnorm(x, w, y, rows, d, eps, s);
                          }});
      return;
    }
    case Op::SPARSIFY: {
      // TEAL (kernels/gemv_sparse.h), every row: the zeroed rows only; the matmuls after it read them densely.
      need_contiguous(n, in(0));
      const float* x = act(in(0));
      float* y = new_act(n, out);
      const int64_t w = width(out), fixed = g.tensor(out).shape[0];
      const bool sc = scaled[size_t(out)];
      const float sp = n.params.sparsity, th = n.params.sparse_threshold;
      unsigned long long* zeros = sparsity_counters();
      launches.push_back({id, [=](cudaStream_t s, const RunArgs& a) {
                            const int64_t rows = sc ? a.t : fixed;
                            if (rows > 0) sparsify(x, y, rows, w, sp, th, nullptr, nullptr, zeros, s);
                          }});
      return;
    }
    case Op::MATMUL_SPARSE:  // several rows share the weights: the dense matmul on the zeroed rows (the same values)
    case Op::MATMUL: {
      need_contiguous(n, in(0));
      // A stack (Fusion::n_weights: q|k|v or gate|up) runs as one matmul over the stacked weights: one pass over x, one
      // launch; the SLICE nodes after it give each member's columns with a row stride.
      const int n_weights = n.fusion.n_weights;
      const DeviceWeight* wp = nullptr;
      // A float base with adapters: the base's rows of its weight with A_stack appended, which the decoder reads
      // whole (DeviceAugmented), so the weights are on the device once.
      if (const DeviceAugmented* ag = n.fusion.lora > 0 ? sh->augmented(g, n) : nullptr; ag != nullptr) {
        wp = &ag->head;
      } else if (n_weights == 1) {
        wp = &sh->weight(g, n, g.tensor(in(1)));
      } else {
        std::vector<const graph::Tensor*> members;
        for (int i = 0; i < n_weights; ++i) members.push_back(&g.tensor(in(static_cast<size_t>(1 + i))));
        wp = &sh->stack(g, n, members);
      }
      const float* x = act(in(0));
      const bool sc = scaled[size_t(in(0))];
      const int64_t fixed = g.tensor(in(0)).shape[0];
      float* y = nullptr;
      bool accumulate = false;
      const float* copy_first = nullptr;  // a residual the plan kept apart: copied into y, then accumulated into
      if (n_weights > 1) {
        // One storage [T, N_total]; the members' outputs are column slices of it.
        if (width(out) != wp->n || g.tensor(out).shape[0] != T) unsupported(n, "its output is not [T, N_total]");
        y = new_act(n, out);
      } else if (const int a = n.fusion.residual; a >= 0) {
        // y = a + x·Wᵀ written as a += x·Wᵀ: the residual add (the passes' epilogue) disappears into the matmul. The
        // plan writes it over the residual (the passes fold only where the matmul is the residual's last reader);
        // where it did not, y gets its own block and a copy of the residual first.
        if (act(a) == nullptr || !contiguous(a) || act(in(0)) == act(a))
          unsupported(n, "its residual is not a separate contiguous activation");
        if (plan.in_place_input[static_cast<size_t>(id_in_g)] == a) {
          alias(out, a);
          y = act(out);
        } else {
          copy_first = act(a);
          y = new_act(n, out);
        }
        accumulate = true;
      } else {
        y = new_act(n, out);
      }
      // The workspace is looked up at run time: a later executor may have replaced it with a larger one.
      CudaShared::Impl* shp = sh;
      const auto h16 = x16_of.find(in(0));
      const X16 h = h16 != x16_of.end() ? h16->second : X16{};
      // A merged gate|up fed a 16-bit x writes its output in 16 bits too (the f32 storage holds it in its first half;
      // same columns, same row stride in elements), for swiglu_rows16.
      // (With adapters too: the SWIGLU after it adds their terms: lora_swiglu_of.)
      const bool y16 = out16 && n.fusion.gate_up && n_weights == 2 && h.buf != nullptr;
      if (y16) gate_up16_of[out] = X16{nullptr, h.type, h.min_t};
      const int64_t y_width = width(out);
      // The logits matmul may start at a later row (RunArgs::logits_row0); the 16-bit-or-f32 choice stays with the
      // whole run's rows, which decided what the producer of x wrote.
      const bool logits = out == g.find_role(graph::IoRole::LOGITS) && n_weights == 1 && !accumulate && !y16 && sc &&
                          n.fusion.lora == 0;
      const int64_t x_width = width(in(0));
      const size_t h_elem = h.buf != nullptr ? dtype_info(h.type).type_size : 0;
      if (n.fusion.lora > 0) {
        // Unmerged adapters (kernels_lora.h): the base matmul as without them, then u [rows, R] = x·A_stackᵀ for every
        // adapter of the node in one matmul reading the same x (the 16-bit copy where the base reads it: A_stack is
        // in that type), then the B side: from gemm_min_t rows one tensor-core GEMM y += u·b_bdᵀ over the
        // block-diagonal B of every member (u written in the 16-bit type; y the stack's output in f32 or 16 bits, or
        // the residual), below that one launch of lora_b_add adding each member's u_m·B_mᵀ to its columns of y (or,
        // for gate|up, lora_b_swiglu_rows in the SWIGLU after it).
        // b_bd only where a run can reach the tensor-core path (an executor of fewer rows never uploads it).
        const DeviceLora* lp = &sh->lora(g, n, wp->dtype, h.buf != nullptr && T >= std::max(h.min_t, kLoraGemmMinT));
        if (h.buf != nullptr && lp->a.dtype != h.type)
          unsupported(n, "its adapters' A is not in the 16-bit type of its input's copy");
        const DeviceWeight* bd = &lp->b_bd;
        const int64_t gemm_min_t = h.buf != nullptr && !bd->quants.empty() && bd->dtype == h.type && bd->n == y_width
                                       ? std::max(h.min_t, kLoraGemmMinT)
                                       : INT64_MAX;
        owned.emplace_back(static_cast<size_t>(T * lp->a.n) * sizeof(float));  // u: f32, or 16-bit in the GEMM path
        float* u = owned.back().as<float>();
        const int64_t r_total = lp->a.n, k_a = lp->a.k;
        if (gemm_min_t != INT64_MAX) {
          int64_t most = 0;  // the largest splits x rows a run may use (~8192 from 512 rows on: splits shrink with t)
          for (int64_t t = gemm_min_t; t <= T; ++t) most = std::max(most, matmul_split_k_default(t, r_total, k_a) * t);
          if (const size_t need = static_cast<size_t>(most * r_total) * sizeof(float); lora_parts.bytes() < need)
            lora_parts = DeviceBuffer(need);
        }
        const DeviceBuffer* parts = &lora_parts;
        const bool side = lora_side_on && gemm_min_t != INT64_MAX;
        if (side) {
          if (lora_side == nullptr) {
            TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&lora_side, cudaStreamNonBlocking));
            TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&lora_fork, cudaEventDisableTiming));
            TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&lora_join, cudaEventDisableTiming));
          }
          if (!lora_gemm || lora_gemm->max_k() < k_a) lora_gemm = std::make_unique<GemmWorkspace>(T, k_a, 0);
        }
        Impl* self = this;  // the side stream's workspace is looked up at run time (a later node may enlarge it)
        // A gate|up stack (its slices feed one SWIGLU: the passes' gate_up) leaves the terms to that SWIGLU below
        // gemm_min_t rows.
        const bool in_swiglu = n.fusion.gate_up && n_weights == 2;
        if (in_swiglu) lora_swiglu_of[out] = LoraSwiglu{lp, u, gemm_min_t, false};
        launches.push_back({id, [=](cudaStream_t s, const RunArgs& a) {
                              const int64_t rows = sc ? a.t : fixed;
                              if (rows == 0) return;
                              if (copy_first != nullptr)
                                TESSERA_CUDA_CHECK(cudaMemcpyAsync(y, copy_first,
                                                                   static_cast<size_t>(rows * y_width) * sizeof(float),
                                                                   cudaMemcpyDeviceToDevice, s));
                              if (rows >= h.min_t) {
                                // u in 16 bits for the B GEMM: A's few output tiles spread over slices of K; on the
                                // side stream (forked after x's producer, joined before the B GEMM) or after the base
                                // GEMM on this one.
                                const auto a_product = [&](cudaStream_t as, GemmWorkspace& ws) {
                                  if (const int splits = matmul_split_k_default(rows, r_total, k_a); splits > 1) {
                                    float* pp = parts->as<float>();
                                    const int written = matmul_x16_split_k(lp->a, h.buf, pp, rows, splits, ws, as);
                                    lora_sum_parts(pp, written, rows * r_total, u, h.type, as);
                                  } else {
                                    matmul_x16_out16(lp->a, h.buf, u, rows, ws, as);
                                  }
                                };
                                const bool fork = side && rows >= gemm_min_t;
                                if (fork) {
                                  TESSERA_CUDA_CHECK(cudaEventRecord(self->lora_fork, s));
                                  TESSERA_CUDA_CHECK(cudaStreamWaitEvent(self->lora_side, self->lora_fork, 0));
                                  a_product(self->lora_side, *self->lora_gemm);
                                  TESSERA_CUDA_CHECK(cudaEventRecord(self->lora_join, self->lora_side));
                                }
                                if (y16)
                                  matmul_x16_out16(*wp, h.buf, y, rows, *shp->gemm, s);
                                else
                                  matmul_x16(*wp, h.buf, y, rows, *shp->gemm, s, accumulate);
                                if (rows >= gemm_min_t) {
                                  if (fork)
                                    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(s, self->lora_join, 0));
                                  else
                                    a_product(s, *shp->gemm);
                                  if (y16)
                                    matmul_x16_out16(*bd, u, y, rows, *shp->gemm, s, true);
                                  else
                                    matmul_x16(*bd, u, y, rows, *shp->gemm, s, true);
                                  return;
                                }
                                matmul_x16(lp->a, h.buf, u, rows, *shp->gemm, s);
                              } else {
                                matmul(*wp, x, y, rows, *shp->gemm, s, accumulate);
                                matmul(lp->a, x, u, rows, *shp->gemm, s);
                              }
                              if (!in_swiglu) lora_b_add(lp->b.get(), lp->layout, u, y, y_width, y_width, rows, s);
                            }});
        return;
      }
      // TEAL's batched decode at two rows (CudaOptions::teal_union): a matmul reading SPARSIFY's zeroed rows (the
      // pass swaps in MATMUL_SPARSE at one token only) walks the union of the rows' kept channels once (threshold 0:
      // their nonzeros), over the model's channel-major copy (shared with the decoder).
      const int x_producer = g.tensor(in(0)).producer;
      const bool sparse_x = x_producer >= 0 && g.node(x_producer).op == Op::SPARSIFY;
      const SparseWeight* union_w = nullptr;
      if (sparse_x && mode == RowsMode::BATCH && T >= 2 && !y16 && x_width == wp->k && teal_union_takes(*wp)) {
        union_w = &sh->sparse_columns(*wp);
        if (!gemv_sparse_x_rows_runs(*union_w, x, 2) || union_w->n != y_width) union_w = nullptr;
      }
      launches.push_back({id, [=](cudaStream_t s, const RunArgs& a) {
                            const int64_t rows = sc ? a.t : fixed;
                            const int64_t r0 = logits ? std::clamp<int64_t>(a.logits_row0, 0, rows) : 0;
                            if (r0 == rows) return;  // no row wanted
                            if (copy_first != nullptr)
                              TESSERA_CUDA_CHECK(cudaMemcpyAsync(y, copy_first,
                                                                 static_cast<size_t>(rows * y_width) * sizeof(float),
                                                                 cudaMemcpyDeviceToDevice, s));
                            float* yr = y + r0 * y_width;
                            if (union_w != nullptr && rows == 2 && r0 == 0 && rows < h.min_t)
                              gemv_sparse_x_rows(*union_w, x, 2, 0.0f, y, accumulate, s);
                            else if (rows >= h.min_t && y16)
                              matmul_x16_out16(*wp, h.buf, y, rows, *shp->gemm, s);
                            else if (rows >= h.min_t)
                              matmul_x16(*wp, static_cast<char*>(h.buf) + static_cast<size_t>(r0 * x_width) * h_elem,
                                         yr, rows - r0, *shp->gemm, s, accumulate);
                            else
                              matmul(*wp, x + r0 * x_width, yr, rows - r0, *shp->gemm, s, accumulate);
                          }});
      return;
    }
    case Op::ROPE:
    case Op::KV_STORE:
      unsupported(n,
                  "rope and cache stores run inside the attention launch, and the graph passes could not fuse this "
                  "one (see graph/passes/fuse.h)");
    case Op::ATTENTION: {
      // Rope + cache store + attention (Fusion::rope_store): inputs q, caches, k, v, positions, frequencies. The query
      // is rotated in place: the passes fused it only where nothing else reads the unrotated q.
      if (!n.fusion.rope_store) unsupported(n, "attention runs only with its rope and cache stores fused into it");
      if (in(5) != positions_id) unsupported(n, "its positions are not the graph's positions input");
      const int qs = in(0), ks = in(3), vs = in(4);
      if (ld[size_t(ks)] != ld[size_t(vs)]) unsupported(n, "its keys and values have different row strides");
      const KvCacheView cache = attention_cache_view(n, g.tensor(in(1)), act(in(1)), act(in(2)), sh->n_seq);
      const int64_t n_head = n.params.n_head;
      float* qp = act(qs);
      const float* kp = act(ks);
      const float* vp = act(vs);
      const int64_t ld_q = ld[size_t(qs)], ld_kv = ld[size_t(ks)];
      const auto* pos = reinterpret_cast<const int32_t*>(act(positions_id));
      const int32_t* seq = seq_dev.as<int32_t>();
      const float* inv_freq = vector_f32(n, in(6));
      const int64_t rope_dim = n.params.rope_dim;
      const bool neox = n.params.rope_neox;
      const float scale = n.params.attn_scale;
      if (mode == RowsMode::PREFILL) {
        // The output in 16 bits when the o-projection takes a 16-bit x (from its min_t rows on).
        const X16 h = out16 ? x16_copy(out) : X16{};
        float* y = new_act(n, out);
        // Chunks of >= kCudnnMinT rows through cuDNN's fused attention where it is available (H100: 1.3-2.1x faster
        // than attn_prefill at every measured shape, docs/PERFORMANCE.md); below that attn_prefill is as fast and
        // needs no graph build. TESSERA_CUDA_CUDNN=0: attn_prefill always.
        constexpr int64_t kCudnnMinT = 256;
        const int64_t width = n_head * cache.hd;
        const size_t need = static_cast<size_t>(T * width) * 2;
        // The workspace (cuDNN's handle, and the graph built at its first call) is made at the first chunk that
        // uses it, so sessions whose prompts stay short never pay for cuDNN.
        std::unique_ptr<CudnnAttnWorkspace>* cws = nullptr;
        void *q16 = nullptr, *o16 = nullptr;
        // Our own Hopper kernel (attn_prefill_tma: TMA, wgmma, FlashAttention-3's scheduling) where it applies (hd
        // 64 or 128, 16-bit cache, sm_90): measured faster than PyTorch's SDPA at 2k-16k (docs/PERFORMANCE.md);
        // TESSERA_CUDA_ATTN_TMA=0 takes cuDNN instead.
        // Both fused paths take 16-bit q and output (the rope kernel writes q16; the o-projection takes 16 bits).
        // A sliding window: attn_prefill only (neither the TMA kernel nor cuDNN's graph reads one).
        const bool fused16 =
            cache.window == 0 && h.buf != nullptr && cache.dtype != DType::F32 && T >= kCudnnMinT && width % 8 == 0;
        const bool tma = fused16 && cuda_options().attn_tma && attn_prefill_tma_supported(cache, n_head);
        if (fused16 && (tma || ((cache.hd == 64 || cache.hd == 128) && cudnn_attention_available()))) {
          if (cudnn_q16.empty()) cudnn_q16 = DeviceBuffer(need);
          if (cache.dtype != h.type && cudnn_o16.empty()) cudnn_o16 = DeviceBuffer(need);
          if (cudnn_q16.bytes() >= need && (cache.dtype == h.type || cudnn_o16.bytes() >= need)) {
            if (!tma) cws = &cudnn_ws;
            q16 = cudnn_q16.get();
            o16 = cache.dtype == h.type ? h.buf : cudnn_o16.get();
          }
        }
        const DType cache_type = cache.dtype;
        const int64_t max_t = T;
        bool* refused = &cudnn_refused;
        launches.push_back(
            {id, [=](cudaStream_t s, const RunArgs& a) {
               if (tma && q16 != nullptr && a.t >= std::max(h.min_t, kCudnnMinT)) {
                 rope_store_kv_rows(qp, ld_q, kp, vp, ld_kv, cache, pos, seq, a.t, n_head, rope_dim, inv_freq, neox, s,
                                    q16);
                 attn_prefill_tma(q16, width, cache, a.seq, a.p0, a.t, o16, n_head, scale, s);
                 if (o16 != h.buf) convert_16bit(o16, cache_type, h.buf, h.type, a.t * width, s);
                 return;
               }
               if (cws != nullptr && !*refused && a.t >= std::max(h.min_t, kCudnnMinT)) {
                 rope_store_kv_rows(qp, ld_q, kp, vp, ld_kv, cache, pos, seq, a.t, n_head, rope_dim, inv_freq, neox, s,
                                    q16);
                 try {
                   if (!*cws) *cws = std::make_unique<CudnnAttnWorkspace>(max_t);
                   attn_prefill_cudnn(q16, width, cache, a.seq, a.p0, a.t, o16, n_head, scale, **cws, s);
                 } catch (const Error& e) {
                   // A workspace or shape cuDNN will not build fails before anything is enqueued: say
                   // so once and take attn_prefill (the rope below rotates q in place and stores k and
                   // v again, the same values).
                   std::fprintf(stderr,
                                "tessera: cuDNN attention unavailable for this shape (%s); "
                                "using the built-in prefill attention\n",
                                e.what());
                   *refused = true;
                 }
                 if (!*refused) {
                   if (o16 != h.buf) convert_16bit(o16, cache_type, h.buf, h.type, a.t * width, s);
                   return;
                 }
               }
               rope_store_kv_rows(qp, ld_q, kp, vp, ld_kv, cache, pos, seq, a.t, n_head, rope_dim, inv_freq, neox, s);
               if (a.t >= h.min_t)
                 attn_prefill(qp, ld_q, cache, a.seq, a.p0, a.t, nullptr, n_head, scale, s, h.buf, h.type);
               else
                 attn_prefill(qp, ld_q, cache, a.seq, a.p0, a.t, y, n_head, scale, s);
             }});
      } else {
        float* y = new_act(n, out);
        if (!attn_ws) attn_ws = std::make_unique<AttnRowsWorkspace>(T, n_head, cache);
        AttnRowsWorkspace* ws = attn_ws.get();
        // One launch (rows are distinct sequences: decode_rows checks it); TESSERA_CUDA_FUSE_ATTN=0: two.
        if (fuse_attention_enabled()) {
          launches.push_back({id, [=](cudaStream_t s, const RunArgs& a) {
                                attn_decode_rope_rows(qp, ld_q, kp, vp, ld_kv, cache, pos, seq, a.t, rope_dim, inv_freq,
                                                      neox, y, n_head, scale, *ws, s);
                              }});
          return;
        }
        launches.push_back({id, [=](cudaStream_t s, const RunArgs& a) {
                              rope_store_kv_rows(qp, ld_q, kp, vp, ld_kv, cache, pos, seq, a.t, n_head, rope_dim,
                                                 inv_freq, neox, s);
                              attn_decode_rows(qp, ld_q, cache, pos, seq, a.t, y, n_head, scale, *ws, s);
                            }});
      }
      return;
    }
    case Op::ADD: {
      const int a = in(0), b = in(1);
      need_contiguous(n, a);
      need_contiguous(n, b);
      // In place where the plan gives the output a's block (this is a's last reader: the residual stream).
      const bool last_reader = plan.in_place_input[static_cast<size_t>(id_in_g)] == a;
      const float* bp = act(b);
      const int64_t w = width(out), fixed = g.tensor(out).shape[0];
      const bool sc = scaled[size_t(out)];
      if (last_reader) {  // in place on the residual stream
        alias(out, a);
        float* y = act(out);
        launches.push_back({id, [=](cudaStream_t s, const RunArgs& r) { add(y, bp, (sc ? r.t : fixed) * w, s); }});
      } else {
        const float* ap = act(a);
        float* y = new_act(n, out);
        launches.push_back({id, [=](cudaStream_t s, const RunArgs& r) {
                              const int64_t count = (sc ? r.t : fixed) * w;
                              TESSERA_CUDA_CHECK(cudaMemcpyAsync(y, ap, static_cast<size_t>(count) * sizeof(float),
                                                                 cudaMemcpyDeviceToDevice, s));
                              add(y, bp, count, s);
                            }});
      }
      return;
    }
    case Op::SWIGLU: {
      // gate and up may be the two column halves of one merged matmul output (same row stride).
      const int64_t ld_in = ld[size_t(in(0))];
      if (ld[size_t(in(1))] != ld_in || width(in(0)) != width(out) || width(in(1)) != width(out))
        unsupported(n, "its gate and up inputs differ in width or row stride");
      const float* gp = act(in(0));
      const float* up = act(in(1));
      const X16 h = x16_copy(out);
      float* y = new_act(n, out);
      const int64_t w = width(out), fixed = g.tensor(out).shape[0];
      const bool sc = scaled[size_t(out)];
      const auto i16 = gate_up16_of.find(in(0));
      const X16 in16 = i16 != gate_up16_of.end() ? i16->second : X16{};
      const int64_t up_off = up - gp;  // up's column in the merged output (elements, so also in 16 bits)
      const auto plain = [=](cudaStream_t s, int64_t rows) {
        if (rows >= in16.min_t) {
          const auto* g16 = reinterpret_cast<const uint16_t*>(gp);
          if (rows >= h.min_t)
            swiglu_rows16(g16, g16 + up_off, in16.type, ld_in, nullptr, h.buf, h.type, rows, w, s);
          else
            swiglu_rows16(g16, g16 + up_off, in16.type, ld_in, y, nullptr, DType::BF16, rows, w, s);
        } else if (rows >= h.min_t)
          swiglu_rows(gp, up, ld_in, nullptr, h.buf, h.type, rows, w, s);
        else if (ld_in == w)
          swiglu(gp, up, y, rows * w, s);
        else
          swiglu_rows(gp, up, ld_in, y, nullptr, DType::BF16, rows, w, s);
      };
      // After a gate|up stack with adapters: their terms join here (the same branches, through lora_b_swiglu_rows).
      const int gs = g.tensor(in(0)).producer;
      if (const auto it = lora_swiglu_of.find(gs >= 0 && g.node(gs).op == Op::SLICE ? g.node(gs).inputs[0] : -1);
          it != lora_swiglu_of.end()) {
        it->second.consumed = true;
        const DeviceLora* lp = it->second.lora;
        const float* u = it->second.u;
        const int64_t gemm_min_t = it->second.gemm_min_t;
        launches.push_back({id, [=](cudaStream_t s, const RunArgs& a) {
                              const int64_t rows = sc ? a.t : fixed;
                              if (rows == 0) return;
                              if (rows >= gemm_min_t) {  // the stack's node added the terms: the plain SwiGLU
                                plain(s, rows);
                                return;
                              }
                              const DType in_type = rows >= in16.min_t ? in16.type : DType::F32;
                              if (rows >= h.min_t)
                                lora_b_swiglu_rows(lp->b.get(), lp->layout, u, gp, in_type, ld_in, up_off, nullptr,
                                                   h.buf, h.type, w, rows, s);
                              else
                                lora_b_swiglu_rows(lp->b.get(), lp->layout, u, gp, in_type, ld_in, up_off, y, nullptr,
                                                   DType::BF16, w, rows, s);
                            }});
        return;
      }
      launches.push_back({id, [=](cudaStream_t s, const RunArgs& a) { plain(s, sc ? a.t : fixed); }});
      return;
    }
    case Op::GEGLU:
    case Op::RELU2_GLU: {
      // Gemma's GELU-tanh and BitNet's squared-ReLU gating. gate and up may be column slices of one stacked matmul
      // output (same row stride); the down projection reads the f32 output (no 16-bit copy: rows_x16_copies covers
      // RMSNORM and SWIGLU only).
      const int64_t ld_in = ld[size_t(in(0))];
      if (ld[size_t(in(1))] != ld_in || width(in(0)) != width(out) || width(in(1)) != width(out))
        unsupported(n, "its gate and up inputs differ in width or row stride");
      const float* gp = act(in(0));
      const float* up = act(in(1));
      float* y = new_act(n, out);
      const int64_t w = width(out), fixed = g.tensor(out).shape[0];
      const bool sc = scaled[size_t(out)];
      const auto gate = n.op == Op::GEGLU ? geglu_rows : relu2_glu_rows;
      launches.push_back(
          {id, [=](cudaStream_t s, const RunArgs& a) { gate(gp, up, ld_in, y, sc ? a.t : fixed, w, s); }});
      return;
    }
    case Op::ACT_QUANT_I8: {
      // BitLinear's activation fake-quant (kernels_ternary.h); x may be a column slice (read with its row stride).
      const int xs = in(0);
      if (width(xs) != width(out)) unsupported(n, "its input and output widths differ");
      const float* x = act(xs);
      const int64_t ld_x = ld[size_t(xs)];
      float* y = new_act(n, out);
      const int64_t w = width(out), fixed = g.tensor(out).shape[0];
      const bool sc = scaled[size_t(out)];
      launches.push_back(
          {id, [=](cudaStream_t s, const RunArgs& a) { act_quant_i8_rows(x, ld_x, y, sc ? a.t : fixed, w, s); }});
      return;
    }
    case Op::MLGRU: {
      // PREFILL: the chunk's t steps of slot a.seq from a.p0 (host values: prefill runs plainly); BATCH: one step per
      // row of its own slot at its own position (device values: the step is captured).
      need_contiguous(n, in(0));
      need_contiguous(n, in(1));
      const graph::Tensor& st = g.tensor(in(3));
      const int64_t d = width(out), fixed = g.tensor(out).shape[0];
      if (st.kind != graph::TensorKind::KV_CACHE || st.io != graph::IoRole::STATE || st.numel() != d + 1)
        unsupported(n, "its state is not a STATE cache of its width plus one");
      if (width(in(0)) != d || width(in(1)) != d || g.tensor(in(2)).numel() != d)
        unsupported(n, "its inputs differ in width from its output");
      const float* fp = act(in(0));
      const float* cp = act(in(1));
      const float* lb = vector_f32(n, in(2));
      float* states = act(in(3));
      float* y = new_act(n, out);
      const bool sc = scaled[size_t(out)];
      const bool prefill = mode == RowsMode::PREFILL;
      const int32_t* seqs = seq_dev.as<int32_t>();
      const int32_t* pos = pos_dev;
      launches.push_back({id, [=](cudaStream_t s, const RunArgs& a) {
                            const int64_t rows = sc ? a.t : fixed;
                            if (prefill)
                              mlgru(fp, cp, lb, states + a.seq * (d + 1), y, rows, d, a.p0, s);
                            else
                              mlgru_rows(fp, cp, lb, states, seqs, pos, y, rows, d, s);
                          }});
      return;
    }
    case Op::HEAD_RMSNORM:
    case Op::BIAS_ADD:
    case Op::SOFTCAP:
    case Op::SCALE: {
      // Row-wise ops of the families beyond Llama (never fused by the passes): x may be a column slice of a stacked
      // matmul output (read with its row stride); the output is its own contiguous block.
      const int xs = in(0);
      const float* x = act(xs);
      const int64_t ld_x = ld[size_t(xs)];
      if (width(xs) != width(out)) unsupported(n, "its input and output widths differ");
      const float* p = n.op == Op::HEAD_RMSNORM || n.op == Op::BIAS_ADD ? vector_f32(n, in(1)) : nullptr;
      float* y = new_act(n, out);
      const int64_t w = width(out), fixed = g.tensor(out).shape[0];
      const bool sc = scaled[size_t(out)];
      const Op op = n.op;
      const float eps = n.params.eps, factor = n.params.scale;
      const int64_t hd = n.params.head_dim;
      if (op == Op::HEAD_RMSNORM && (hd <= 0 || w % hd != 0))
        unsupported(n, "its width is not a whole number of heads of head_dim values");
      if (op == Op::BIAS_ADD && g.tensor(in(1)).numel() != w) unsupported(n, "its bias is not one value per column");
      if (op == Op::HEAD_RMSNORM && g.tensor(in(1)).numel() != hd) unsupported(n, "its weight is not head_dim values");
      launches.push_back({id, [=](cudaStream_t s, const RunArgs& a) {
                            const int64_t rows = sc ? a.t : fixed;
                            if (op == Op::HEAD_RMSNORM)
                              head_rmsnorm(x, ld_x, p, y, rows, w / hd, hd, eps, s);
                            else if (op == Op::BIAS_ADD)
                              bias_add_rows(x, ld_x, p, y, rows, w, s);
                            else if (op == Op::SOFTCAP)
                              softcap_rows(x, ld_x, y, rows, w, factor, s);
                            else
                              scale_rows(x, ld_x, y, rows, w, factor, s);
                          }});
      return;
    }
    case Op::LAST_ROW: {
      // The chunk's last row is row t - 1, known only at run time: one small copy.
      need_contiguous(n, in(0));
      const float* x = act(in(0));
      const bool sc = scaled[size_t(in(0))];
      const int64_t w = width(in(0)), fixed = g.tensor(in(0)).shape[0];
      float* y = new_act(n, out);
      launches.push_back({id, [=](cudaStream_t s, const RunArgs& a) {
                            const int64_t last = (sc ? a.t : fixed) - 1;
                            TESSERA_CUDA_CHECK(cudaMemcpyAsync(y, x + last * w, static_cast<size_t>(w) * sizeof(float),
                                                               cudaMemcpyDeviceToDevice, s));
                          }});
      return;
    }
    case Op::SLICE: {
      // Columns of a stacked matmul's [T, N_total] output: a view with the stack's row stride.
      const graph::Tensor& o = g.tensor(out);
      if (o.shape.size() != 2 || o.shape[0] != T) unsupported(n, "its output is not [T, N]");
      alias(out, in(0), n.params.slice_begin, ld[static_cast<size_t>(in(0))]);
      // A 16-bit gate|up output: swiglu_rows16 finds it through the gate columns.
      if (const auto it = gate_up16_of.find(in(0)); it != gate_up16_of.end() && n.params.slice_begin == 0)
        gate_up16_of[out] = it->second;
      return;
    }
    default:  // an op with no CUDA kernel
      break;
  }
  unsupported(n, "the op has no CUDA kernel");
}

void CudaRowsExecutor::Impl::copy_logits(int64_t rows) {
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(host_logits, act(logits_id), static_cast<size_t>(rows * vocab) * sizeof(float),
                                     cudaMemcpyDeviceToHost, stream));
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
}

CudaRowsExecutor::CudaRowsExecutor(const graph::Graph& g, RowsMode mode, std::shared_ptr<CudaShared> shared)
    : impl_(std::make_unique<Impl>()) {
  TESSERA_CHECK(shared != nullptr, "cuda backend: a rows executor needs the engine's shared device state");
  impl_->sh = &shared->impl();
  impl_->shared_owner = std::move(shared);
  impl_->src = g;
  impl_->mode = mode;
  impl_->fuse = impl_->sh->fuse;
  impl_->x16 = cuda_options().x16;
  impl_->merge_gate_up = cuda_options().merge_gate_up;
  impl_->out16 = cuda_options().out16;
  impl_->lora_side_on = cuda_options().lora_side;
  impl_->g = graph::run_passes(g, rows_fusion_support(impl_->fuse, impl_->merge_gate_up));
  impl_->stream = impl_->sh->stream;
  impl_->compile();
  synchronize();
}

CudaRowsExecutor::~CudaRowsExecutor() {
  if (!impl_) return;
  if (impl_->stream != nullptr) (void)cudaStreamSynchronize(impl_->stream);
  if (impl_->cexec != nullptr) (void)cudaGraphExecDestroy(impl_->cexec);
  if (impl_->cgraph != nullptr) (void)cudaGraphDestroy(impl_->cgraph);
  if (impl_->host_io != nullptr) (void)cudaFreeHost(impl_->host_io);
  if (impl_->host_logits != nullptr) (void)cudaFreeHost(impl_->host_logits);
  if (impl_->lora_side != nullptr) {
    (void)cudaStreamSynchronize(impl_->lora_side);
    (void)cudaStreamDestroy(impl_->lora_side);
    (void)cudaEventDestroy(impl_->lora_fork);
    (void)cudaEventDestroy(impl_->lora_join);
  }
}

int64_t CudaRowsExecutor::Impl::run_prefill(std::span<const int32_t> ids, int64_t seq, int64_t p0,
                                            int64_t logits_row0) {
  Impl& m = *this;
  TESSERA_CHECK(m.mode == RowsMode::PREFILL, "cuda backend: prefill() called on a batched-decode executor");
  const int64_t t = static_cast<int64_t>(ids.size());
  TESSERA_CHECK(t >= 1 && t <= m.T, "cuda backend: a prefill chunk of {} tokens does not fit this executor's {} rows",
                t, m.T);
  TESSERA_CHECK(seq >= 0 && seq < m.sh->n_seq, "sequence {} is outside the {} sequences of this session", seq,
                m.sh->n_seq);
  TESSERA_CHECK(p0 >= 0 && p0 + t <= m.ctx, "the context is full: {} tokens at position {} do not fit {} positions", t,
                p0, m.ctx);
  for (int32_t id : ids)
    TESSERA_CHECK(id >= 0 && id < m.embd_rows, "token id {} is outside the vocabulary of {} tokens", id, m.embd_rows);
  int32_t* h_ids = m.host_io;
  int32_t* h_pos = m.host_io + m.T;
  int32_t* h_seq = m.host_io + 2 * m.T;
  for (int64_t i = 0; i < t; ++i) {
    h_ids[i] = ids[static_cast<size_t>(i)];
    h_pos[i] = static_cast<int32_t>(p0 + i);
    h_seq[i] = static_cast<int32_t>(seq);
  }
  const size_t nb = static_cast<size_t>(t) * sizeof(int32_t);
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(m.act(m.tokens_id), h_ids, nb, cudaMemcpyHostToDevice, m.stream));
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(m.pos_dev, h_pos, nb, cudaMemcpyHostToDevice, m.stream));
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(m.seq_dev.get(), h_seq, nb, cudaMemcpyHostToDevice, m.stream));
  // Prefill runs plainly: chunk length and position vary per call, and its launches are few and long.
  m.runner.run(m.launches, m.stream, RunArgs{t, p0, seq, logits_row0}, m.profile);
  ++m.steps;
  return m.scaled[size_t(m.logits_id)] ? t : m.out_rows;
}

std::span<const float> CudaRowsExecutor::prefill(std::span<const int32_t> ids, int64_t seq, int64_t p0) {
  Impl& m = *impl_;
  const int64_t rows = m.run_prefill(ids, seq, p0);
  m.copy_logits(rows);
  return {m.host_logits, static_cast<size_t>(rows * m.vocab)};
}

std::span<const double> CudaRowsExecutor::prefill_scores(std::span<const int32_t> ids, int64_t seq, int64_t p0,
                                                         std::span<const int32_t> targets) {
  Impl& m = *impl_;
  const int64_t t = static_cast<int64_t>(ids.size());
  TESSERA_CHECK(targets.size() == ids.size(), "cuda backend: {} tokens scored against {} targets", t, targets.size());
  for (int32_t id : targets)  // -1: a row not scored
    TESSERA_CHECK(id >= -1 && id < m.vocab, "target token {} is outside the vocabulary of {} tokens", id, m.vocab);
  // Rows before the first scored one need no logits: the logits matmul skips them (row_scores skips them too).
  int64_t row0 = 0;
  while (row0 < t && targets[static_cast<size_t>(row0)] < 0) ++row0;
  const int64_t rows = m.run_prefill(ids, seq, p0, row0);
  TESSERA_CHECK(rows == t && m.out_rows * m.vocab >= 8 * m.T,
                "cuda backend: scoring needs an executor built with every row's logits");
  if (m.scores_dev.empty()) {
    m.scores_dev = DeviceBuffer(static_cast<size_t>(m.T) * sizeof(double2));
    m.targets_dev = DeviceBuffer(static_cast<size_t>(m.T) * sizeof(int32_t));
  }
  // The pinned logits buffer ([out_rows = T, vocab] floats) is far larger than t ids and t scores: it stages both
  // (the scores 16-byte aligned at 16 T bytes).
  auto* h_targets = reinterpret_cast<int32_t*>(m.host_logits);
  auto* h_scores = reinterpret_cast<double*>(m.host_logits + 4 * m.T);
  std::memcpy(h_targets, targets.data(), targets.size_bytes());
  TESSERA_CUDA_CHECK(
      cudaMemcpyAsync(m.targets_dev.get(), h_targets, targets.size_bytes(), cudaMemcpyHostToDevice, m.stream));
  row_scores(m.act(m.logits_id), m.targets_dev.as<int32_t>(), t, m.vocab, m.scores_dev.as<double2>(), m.stream);
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(h_scores, m.scores_dev.get(), static_cast<size_t>(t) * sizeof(double2),
                                     cudaMemcpyDeviceToHost, m.stream));
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  return {h_scores, static_cast<size_t>(2 * t)};
}

std::span<const float> CudaRowsExecutor::decode_rows(std::span<const int32_t> ids, std::span<const int32_t> seqs,
                                                     std::span<const int32_t> pos) {
  Impl& m = *impl_;
  m.decode_step(ids, seqs, pos);
  m.copy_logits(m.T);
  return {m.host_logits, static_cast<size_t>(m.T * m.vocab)};
}

std::span<const int32_t> CudaRowsExecutor::decode_rows_argmax(std::span<const int32_t> ids,
                                                              std::span<const int32_t> seqs,
                                                              std::span<const int32_t> pos) {
  Impl& m = *impl_;
  m.decode_step(ids, seqs, pos);
  if (m.argmax_dev.empty()) m.argmax_dev = DeviceBuffer(static_cast<size_t>(m.T) * sizeof(int32_t));
  int32_t* host = m.host_io + 3 * m.T;
  argmax_rows(m.act(m.logits_id), m.T, m.vocab, m.argmax_dev.as<int32_t>(), m.stream);
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(host, m.argmax_dev.get(), static_cast<size_t>(m.T) * sizeof(int32_t),
                                     cudaMemcpyDeviceToHost, m.stream));
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  return {host, static_cast<size_t>(m.T)};
}

void CudaRowsExecutor::Impl::decode_step(std::span<const int32_t> ids, std::span<const int32_t> seqs,
                                         std::span<const int32_t> pos) {
  Impl& m = *this;
  TESSERA_CHECK(m.mode == RowsMode::BATCH, "cuda backend: decode_rows() called on a prefill executor");
  TESSERA_CHECK(static_cast<int64_t>(ids.size()) == m.T && seqs.size() == ids.size() && pos.size() == ids.size(),
                "cuda backend: batched decode of {} rows got {} tokens, {} sequences and {} positions", m.T, ids.size(),
                seqs.size(), pos.size());
  std::unordered_set<int32_t> seen;
  for (size_t i = 0; i < ids.size(); ++i) {
    TESSERA_CHECK(ids[i] >= 0 && ids[i] < m.embd_rows, "token id {} is outside the vocabulary of {} tokens", ids[i],
                  m.embd_rows);
    TESSERA_CHECK(seqs[i] >= 0 && seqs[i] < m.sh->n_seq, "sequence {} is outside the {} sequences of this session",
                  seqs[i], m.sh->n_seq);
    TESSERA_CHECK(seen.insert(seqs[i]).second, "sequence {} appears twice in one batched decode step", seqs[i]);
    TESSERA_CHECK(pos[i] >= 0 && pos[i] < m.ctx, "the context of sequence {} is full: position {} is outside {}",
                  seqs[i], pos[i], m.ctx);
  }
  const size_t nb = ids.size() * sizeof(int32_t);
  std::memcpy(m.host_io, ids.data(), nb);
  std::memcpy(m.host_io + m.T, pos.data(), nb);
  std::memcpy(m.host_io + 2 * m.T, seqs.data(), nb);
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(m.act(m.tokens_id), m.host_io, nb, cudaMemcpyHostToDevice, m.stream));
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(m.pos_dev, m.host_io + m.T, nb, cudaMemcpyHostToDevice, m.stream));
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(m.seq_dev.get(), m.host_io + 2 * m.T, nb, cudaMemcpyHostToDevice, m.stream));
  const RunArgs args{m.T, 0, 0};
  if (m.profile != nullptr) {
    m.runner.run(m.launches, m.stream, args, m.profile);
  } else {
    if (m.captured && m.gemm_generation != m.sh->gemm_generation) {  // the workspace it captured is gone
      (void)cudaGraphExecDestroy(m.cexec);
      (void)cudaGraphDestroy(m.cgraph);
      m.cexec = nullptr;
      m.cgraph = nullptr;
      m.captured = false;
    }
    m.gemm_generation = m.sh->gemm_generation;
    // The first step runs plainly (kernel attributes get set, faults show up uncaptured); the second captures.
    if (m.sh->options.use_graph && !m.captured && !m.capture_failed && m.steps >= 1) {
      m.captured = capture_graph(m.launches, m.stream, args, &m.cgraph, &m.cexec);
      m.capture_failed = !m.captured;
    }
    if (m.captured)
      TESSERA_CUDA_CHECK(cudaGraphLaunch(m.cexec, m.stream));
    else
      m.runner.run(m.launches, m.stream, args, nullptr);
  }
  ++m.steps;
}

void CudaRowsExecutor::set_profile(std::vector<uint64_t>* node_ns) {
  if (node_ns != nullptr && node_ns->size() < impl_->src.nodes().size()) node_ns->resize(impl_->src.nodes().size());
  impl_->profile = node_ns;
}

RowsMode CudaRowsExecutor::mode() const { return impl_->mode; }
int64_t CudaRowsExecutor::rows() const { return impl_->T; }
int64_t CudaRowsExecutor::n_vocab() const { return impl_->vocab; }
bool CudaRowsExecutor::graph_captured() const { return impl_->captured; }
uint64_t CudaRowsExecutor::device_bytes() const { return impl_->bytes; }

}  // namespace tessera::cuda
