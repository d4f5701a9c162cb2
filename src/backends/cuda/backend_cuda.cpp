// CudaDecoder: compiles a T = 1 graph into a list of kernel launches over fixed device pointers, then runs them plainly
// or as a captured CUDA graph. ROPE and KV_STORE emit no launch of their own: the attention node launches
// attn_decode_rope (rotation, cache store and attention in one kernel), so the graph's rope/store/attention triple
// becomes one launch (TESSERA_CUDA_FUSE_ATTN=0: rope_store_kv then attn_decode, two). Quantized matmuls read an 8-bit
// copy of their input written by its producer (attention, the residual GEMV before an RMSNorm, rmsnorm or swiglu; or
// one quantize_q8 launch), shared by every matmul reading that tensor.
#include "backends/cuda/backend_cuda.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device_info.h"
#include "backends/cuda/device_sampler.h"
#include "backends/cuda/executor_common.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/gemv_sparse.h"
#include "backends/cuda/kernels_family.h"
#include "backends/cuda/kernels_ternary.h"
#include "core/error.h"
#include "graph/passes/fuse.h"
#include "quant/quant.h"

namespace tessera::cuda {

using graph::Op;

bool cuda_available(std::string* why) {
  std::string reason;
  const std::vector<DeviceInfo> devs = list_devices(&reason);
  if (devs.empty() && why != nullptr) *why = reason.empty() ? "no CUDA device was found" : reason;
  return !devs.empty();
}

struct CudaDecoder::Impl {
  struct Q8 {
    DeviceBuffer q8, ds;
    bool written = false;  // a launch that writes it has been emitted
  };

  graph::Graph src;  // the graph given: profiles and TESSERA_CUDA_DROP_OPS index its nodes (Node::source)
  graph::Graph g;    // src rewritten by the graph passes (decoder_fusion_support): what compile() runs
  std::shared_ptr<CudaShared> shared_owner;
  CudaShared::Impl* sh = nullptr;  // weights, caches, stream
  CudaBackendOptions options;
  cudaStream_t stream = nullptr;
  std::vector<DeviceBuffer> owned;
  // Activations: one arena planned over g (plan_cuda_memory), allocated at compile and never moved (captured graphs
  // hold its addresses).
  graph::MemoryPlan plan;
  DeviceBuffer arena;
  std::vector<void*> ptr;          // per tensor: device storage
  std::unordered_map<int, Q8> q8;  // by activation tensor id
  std::vector<std::unique_ptr<AttnWorkspace>> attn_ws;
  std::vector<Launch> launches;
  LaunchRunner runner;
  std::vector<uint64_t>* profile = nullptr;
  std::vector<std::vector<int>> consumers;  // per tensor: consuming node ids
  bool fuse = true;                         // merge GEMVs and fold residual adds (TESSERA_CUDA_FUSE=0: off)
  // RMSNorm before quantized GEMVs folded into the residual GEMV before it (GemvInput::norm_out_* / rms_sumsq; the
  // graph passes' norm epilogue, Fusion::norm_out), by the norm's output tensor id: that GEMV writes the readers'
  // rms-free q8 input and per-32 sums of squares, the readers scale by 1/rms; no rmsnorm launch.
  struct QuantNorm {
    const float* sumsq;
    float eps;
  };
  std::unordered_map<int, QuantNorm> quant_norm;
  bool fold_norm = true;
  bool fold_swiglu = true;  // SwiGLU in the gate|up GEMV's epilogue (float weights; TESSERA_CUDA_FOLD_SWIGLU=0: off)
  int tokens_id = -1, positions_id = -1, logits_id = -1;
  // The step's position on the device: the positions input, or (a graph without one: the MatMul-free LM, whose
  // MLGRU reads its position there) a buffer of the decoder's own that upload_step fills alike.
  int32_t* pos_dev = nullptr;
  bool has_state = false;  // a recurrent STATE (MLGRU): generate_greedy steps one by one (see there)
  int64_t vocab = 0, ctx = 0, embd_rows = 0;
  int32_t* host_io = nullptr;    // pinned: [0] token, [1] position, [2] argmax or sampled token, [3] candidates
  float* host_logits = nullptr;  // pinned [vocab]
  std::unique_ptr<ArgmaxWorkspace> argmax_ws;
  DeviceBuffer argmax_out;                 // [2]: the argmax, or decode_sample's token and candidates
  std::unique_ptr<DeviceSampler> sampler;  // decode_sample's, made on first use
  cudaGraph_t cgraph = nullptr;
  cudaGraphExec_t cexec = nullptr;
  bool captured = false, capture_failed = false;
  int steps = 0;
  uint64_t bytes = 0;
  bool logits_current = true;  // false after generate_greedy ran steps past the last accepted one
  // Chained greedy decoding (generate_greedy): the step's launches plus the chained argmax, captured as one graph for
  // a single step ([0]) and one for chain_k steps in a row ([1]: no graph boundary between those steps, so PDL
  // overlaps them too); the host-mapped ring of generated tokens, by position; an event per launch in flight.
  static constexpr int kChainAhead = 2;  // launches queued beyond the one the host waits for
  int chain_k = 8;                       // steps per multi-step launch (TESSERA_CUDA_CHAIN_STEPS, 1..16)
  std::vector<Launch> chain_launches[2];
  cudaGraph_t chain_graph[2] = {nullptr, nullptr};
  cudaGraphExec_t chain_exec[2] = {nullptr, nullptr};
  bool chain_captured[2] = {false, false}, chain_capture_failed[2] = {false, false};
  // The EMBED launch (its index in `launches`; -1 none, -2 several): chained steps fold it into the previous step's
  // argmax (TESSERA_CUDA_CHAIN_EMBED=0: kept), so it runs once, before the chain's first step.
  int embed_launch = -1;
  const DeviceWeight* embed_table = nullptr;
  float* embed_out = nullptr;
  bool chain_embed = false;
  int32_t* ring_host = nullptr;  // [ctx], cudaHostAllocMapped
  int32_t* ring_dev = nullptr;
  std::vector<cudaEvent_t> chain_events;

  void* alloc(size_t n) {
    owned.emplace_back(n);
    bytes += n;
    return owned.back().get();
  }
  [[noreturn]] void unsupported(const graph::Node& n, const std::string& why) { CudaShared::Impl::unsupported(n, why); }
  const DeviceWeight& weight(const graph::Node& n, int tid) { return sh->weight(g, n, g.tensor(tid)); }
  // A 1-D weight (norm weight, rope frequencies) as f32 on the device.
  float* vector_f32(const graph::Node& n, int tid) {
    if (ptr[static_cast<size_t>(tid)] != nullptr) return static_cast<float*>(ptr[static_cast<size_t>(tid)]);
    const graph::Tensor& t = g.tensor(tid);
    if (t.data == nullptr || !can_dequantize(t.dtype)) unsupported(n, "weight '" + t.name + "' cannot be read as f32");
    std::vector<float> host(static_cast<size_t>(t.numel()));
    dequantize_row(t.dtype, t.data, host.data(), t.numel());
    void* d = alloc(host.size() * sizeof(float));
    TESSERA_CUDA_CHECK(cudaMemcpy(d, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
    ptr[static_cast<size_t>(tid)] = d;
    return static_cast<float*>(d);
  }
  float* act(int tid) { return static_cast<float*>(ptr[static_cast<size_t>(tid)]); }
  // Tensor tid's block in the arena.
  float* planned(const graph::Node& n, int tid) {
    const int64_t off = plan.offsets[static_cast<size_t>(tid)];
    if (off < 0) unsupported(n, "its output '" + g.tensor(tid).name + "' has no planned storage");
    return reinterpret_cast<float*>(static_cast<char*>(arena.get()) + off);
  }
  // Whether a quantized matmul reads tensor `tid` (then its producer writes the 8-bit copy too).
  bool feeds_quantized_matmul(int tid) const {
    for (int c : consumers[static_cast<size_t>(tid)]) {
      const graph::Node& n = g.node(c);
      if (graph::is_matmul_like(n.op) && n.inputs[0] == tid && is_quantized_dtype(g.tensor(n.inputs[1]).dtype))
        return true;
    }
    return false;
  }
  Q8& q8_of(int tid) {
    auto it = q8.find(tid);
    if (it != q8.end()) return it->second;
    const int64_t k = g.tensor(tid).numel();
    Q8 b;
    b.q8 = DeviceBuffer(static_cast<size_t>(k));
    b.ds = DeviceBuffer(static_cast<size_t>(k / 32) * sizeof(float2));
    bytes += b.q8.bytes() + b.ds.bytes();
    return q8.emplace(tid, std::move(b)).first->second;
  }

  // TEAL (kernels/gemv_sparse.h): per SPARSIFY output, what its readers need. bf16/f16 sparse GEMVs read the row
  // itself (gemv_sparse_x: the channel-major copy, the threshold applied in the GEMV), so with calibrated thresholds
  // the SPARSIFY launch is skipped when every reader is such a GEMV and the plan put its output over its input (the
  // GEMVs then read the untouched x there). A quantized GEMV without its walk (CudaOptions::teal_walk) likewise, its
  // input's quantize_q8 applying the threshold. Top-k, another reader, or the quantized walks (which read the list)
  // keep the launch. The flags are final when compile ends, before the first launch reads them.
  struct SparseList {
    float threshold = -1.0f;  // >= 0: calibrated thresholds
    bool in_place = false;    // the output's storage is the input's
    bool launch = false;      // the sparsify launch runs (writes the zeroed row, counts the achieved sparsity)
    bool list_used = false;   // and writes the surviving-channel list for a quantized sparse GEMV
    int counter = -1;         // where the launch is skipped: the reader (node id) whose GEMV counts instead
    SparseEntry* list = nullptr;
    int32_t* count = nullptr;
  };
  std::unordered_map<int, std::unique_ptr<SparseList>> sparse_lists;
  std::unordered_map<const DeviceWeight*, std::unique_ptr<SparseWeight>> sparse_weights;  // quantized (float: CudaShared)
  std::unique_ptr<SparseGemvWorkspace> sparse_ws;
  // A MATMUL_SPARSE as a sparse GEMV; false where it has none (the K-quants, an input that is not a SPARSIFY
  // output, a fused RMSNorm epilogue): the caller compiles it as the dense MATMUL on the zeroed input, the same values.
  bool compile_sparse_matmul(int id_in_g);

  void compile();
  void compile_node(int id_in_g);
  // CudaOptions::drop_ops (graph op names: rmsnorm, swiglu, attention, matmul, add, embed): the decode
  // step leaves out every launch of a node of those ops, so a benchmark shows what they cost in the replayed graph
  // (their readers read whatever the buffers held: the outputs are WRONG; a timing study only, announced on stderr).
  void drop_launches_for_timing() {
    const std::vector<std::string>& ops = cuda_options().drop_ops;
    if (ops.empty()) return;
    std::string e;
    for (const std::string& o : ops) e += (e.empty() ? "" : ",") + o;
    const size_t before = launches.size();
    std::erase_if(launches, [&](const Launch& l) {
      return l.node >= 0 && std::find(ops.begin(), ops.end(), graph::op_name(src.node(l.node).op)) != ops.end();
    });
    embed_launch = -2;  // launch indices moved: the chain keeps the embedding as a launch (if it is still there)
    std::fprintf(stderr,
                 "tessera: cuda option drop_ops=%s left out %zu of %zu decode launches: outputs are wrong, "
                 "timing study only\n",
                 e.c_str(), before - launches.size(), before);
  }
  void check_step(int32_t token, int64_t pos) const;
  void upload_step(int32_t token, int64_t pos);
  void step(int32_t token, int64_t pos);
  int32_t step_argmax(int32_t token, int64_t pos);  // step, then its argmax back on the host (decode_argmax)
  void chain_setup();
  void chain_step(int n_steps);
  int64_t generate_greedy(int32_t token, int64_t pos, int64_t n, const std::function<bool(int32_t)>& on_token);
};

// What the decoder's launches run fused (graph/passes/fuse.h): the preconditions that depend on the device (weight
// formats, launch shapes) and on the comparison switches; the graph passes check the rest.
graph::FusionSupport decoder_fusion_support(bool fuse, bool fold_norm, bool fold_swiglu) {
  graph::FusionSupport f;
  f.rope_store_attention = true;  // rope and stores have no launch of their own (TESSERA_CUDA_FUSE_ATTN=0: two)
  f.windowed_attention = true;    // attn_decode* mask keys outside the window (KvCacheView::window)
  if (!fuse) return f;
  // Matmul chains in their cheapest order (executor_common.h): at one token no LoRA adapter folds, but the decoder
  // takes the rewrite's plain matmul by an f32 constant (the f32 GEMV) wherever a chain does.
  f.chain_orders = cuda_chain_cost_model();
  f.weight_values = cuda_weight_values;
  // Weights whose format has no kernel run as their converted copy (bf16): they stack with weights of that format.
  f.weight_format = [](const graph::Tensor& w) { return weight_formats().runs_as(w.dtype).value_or(w.dtype); };
  f.stack_shared_input = true;
  f.residual_epilogue = true;
  // Unmerged LoRA adapters in their matmul's node, folded first so that q|k|v and gate|up still stack and the norm,
  // SwiGLU and residual epilogues still fold (kernels_lora.h: two launches per adapted node).
  f.lora_epilogue = true;
  f.lora_first = true;
  // RMSNorm folded into the float GEMVs reading its output (GemvInput::norm_w): the GEMVs read the raw input and
  // scale by themselves, one launch less per norm (TESSERA_CUDA_FOLD_NORM=0: off).
  if (fold_norm)
    f.norm_prologue = [](const graph::Tensor& w) { return !is_quantized_dtype(w.dtype) && gemv_supports(w.dtype); };
  // SwiGLU in the gate|up GEMV's epilogue: float weights only (TESSERA_CUDA_FOLD_SWIGLU=0: off). The quantized form,
  // which also wrote the down projection's q8 input, measured slower on the H100 in both its forms (tickets, warp
  // groups) and left src/ (docs/CUDA_NOTES.md).
  if (fold_swiglu)
    f.swiglu_epilogue = [](const graph::Graph& gr, const std::vector<int>& weights, int) {
      return !is_quantized_dtype(gr.tensor(weights[0]).dtype);
    };
  // The residual GEMV writing the next RMSNorm's q8 input (GemvInput::norm_out_*) for quantized readers. On by default
  // (QuantNorm::AUTO) where it measured faster on the H100 (8B decode, tg128; docs/PERFORMANCE.md, seventeenth
  // session): q4_1 (warp groups, 2026-11-22: 476.2 -> 498.6 tok/s), q4_0 (2026-11-26: 545.0 -> 568.0), q4_K (485.4 ->
  // 515.3), q6_K (354.7 -> 369.5), and tq2_0 / tq1_0 where the residual GEMV's own default is not the x-stationary
  // kernel, which has no norm_out epilogue (BitNet-2B4T shape 1,233.2 -> 1,257.2; at the 8B shape only the
  // o-projection takes it: even, where taking the down projection off its x-stationary kernel too lost, 780.3).
  // Also q5_K (398.2 -> 413.4), iq4_xs (453.7 -> 461.4) and q5_0 (434.4 -> 438.5). Off: iq4_nl (lost, 489.8 ->
  // 475.9), q8_0 (even), and the formats not measured. CudaOptions::quant_norm
  // q4_1 / all / none: q4_1 alone (the former default), every format, or none. Its first form, thread-block clusters,
  // measured slower on the H100 (8B q8_0 307.7 -> 240.7 tok/s, q4_1 476.4 -> 448.8: the clusters cost more than the
  // rmsnorm launch they replace; docs/CUDA_NOTES.md) and left src/.
  f.residual_norm_out = [](const graph::Tensor& w, const std::vector<const graph::Tensor*>& readers) {
    const QuantNorm qn = cuda_options().quant_norm;
    if (!is_quantized_dtype(w.dtype) || qn == QuantNorm::NONE) return false;
    const int64_t n = w.shape[0], k = w.shape[1];
    switch (qn) {
      case QuantNorm::ALL:
        break;
      case QuantNorm::Q4_1_ONLY:
        if (w.dtype != DType::Q4_1) return false;
        break;
      default:                                                     // AUTO
        if (w.dtype == DType::TQ2_0 || w.dtype == DType::TQ1_0) {  // gemv_default_config maps tq1_0 to tq2_0
          if (gemv_default_config(w.dtype, n, k).stationary) return false;
        } else if (w.dtype != DType::Q4_0 && w.dtype != DType::Q4_1 && w.dtype != DType::Q5_0 &&
                   w.dtype != DType::Q4_K && w.dtype != DType::Q5_K && w.dtype != DType::Q6_K &&
                   w.dtype != DType::IQ4_XS) {
          return false;
        }
    }
    for (const graph::Tensor* r : readers)
      if (!is_quantized_dtype(r->dtype)) return false;
    return gemv_norm_out_supported(gemv_norm_out_config(w.dtype, n, k), w.dtype);
  };
  return f;
}

void CudaDecoder::Impl::compile() {
  TESSERA_CHECK(g.n_tokens() == 1, "cuda backend: only one-token (decode) graphs run on the GPU, not {} tokens",
                g.n_tokens());
  ptr.assign(g.tensors().size(), nullptr);
  plan = plan_cuda_memory(g, true);
  arena = DeviceBuffer(static_cast<size_t>(plan.total));
  bytes += plan.total;
  consumers.assign(g.tensors().size(), {});
  for (size_t i = 0; i < g.nodes().size(); ++i)
    for (int t : g.nodes()[i].inputs) consumers[static_cast<size_t>(t)].push_back(static_cast<int>(i));
  for (size_t i = 0; i < g.tensors().size(); ++i) {
    const graph::Tensor& t = g.tensors()[i];
    if (t.kind == graph::TensorKind::INPUT) {
      TESSERA_CHECK(t.dtype == DType::I32 && t.numel() == 1, "cuda backend: input '{}' must be one i32", t.name);
      ptr[i] = alloc(sizeof(int32_t));
      if (t.io == graph::IoRole::TOKENS)
        tokens_id = static_cast<int>(i);
      else if (t.io == graph::IoRole::POSITIONS)
        positions_id = static_cast<int>(i);
      else
        fail("cuda backend: graph input '{}' has no known role (tokens and positions have)", t.name);
    } else if (t.kind == graph::TensorKind::KV_CACHE) {
      ptr[i] = sh->cache(t);                               // slot 0 of the shared cache (or recurrent state)
      if (t.io != graph::IoRole::STATE) ctx = t.shape[1];  // a state has no positions to bound
      has_state |= t.io == graph::IoRole::STATE;
    }
  }
  TESSERA_CHECK(tokens_id >= 0, "cuda backend: the graph has no tokens input (role TOKENS)");
  if (ctx == 0) ctx = state_only_ctx(sh->options);  // no KV cache: the session's context
  pos_dev = positions_id >= 0 ? static_cast<int32_t*>(ptr[static_cast<size_t>(positions_id)])
                              : static_cast<int32_t*>(alloc(sizeof(int32_t)));
  for (size_t i = 0; i < g.nodes().size(); ++i) compile_node(static_cast<int>(i));
  drop_launches_for_timing();
  logits_id = g.find_role(graph::IoRole::LOGITS);
  TESSERA_CHECK(logits_id >= 0 && g.tensor(logits_id).dtype == DType::F32,
                "cuda backend: the graph has no f32 logits tensor (role LOGITS)");
  vocab = g.tensor(logits_id).numel();
  TESSERA_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host_io), 4 * sizeof(int32_t), cudaHostAllocDefault));
  TESSERA_CUDA_CHECK(
      cudaHostAlloc(reinterpret_cast<void**>(&host_logits), static_cast<size_t>(vocab) * sizeof(float), 0));
  argmax_ws = std::make_unique<ArgmaxWorkspace>(vocab);
  argmax_out = DeviceBuffer(2 * sizeof(int32_t));
}

bool CudaDecoder::Impl::compile_sparse_matmul(int id_in_g) {
  const graph::Node& n = g.node(id_in_g);
  const auto li = sparse_lists.find(n.inputs.at(0));
  if (li == sparse_lists.end()) return false;
  SparseList* sl = li->second.get();
  // The residual GEMV that also writes the next RMSNorm's q8 input (Fusion::norm_out, q4_1's last down projection
  // before the output norm) has no sparse form: the dense GEMV on the zeroed x does both.
  if (n.fusion.norm_weight >= 0 || n.fusion.norm_out >= 0) return false;
  const int n_weights = n.fusion.n_weights;
  const DeviceWeight* wp = nullptr;
  if (n_weights == 1) {
    wp = &weight(n, n.inputs.at(1));
  } else {
    std::vector<const graph::Tensor*> members;
    for (int i = 0; i < n_weights; ++i) members.push_back(&g.tensor(n.inputs.at(static_cast<size_t>(1 + i))));
    wp = &sh->stack(g, n, members);
  }
  // q4_K: q4_1's list walk over a q4_1 copy of the weights (q4_k_rows_as_q4_1), as the CPU runs it.
  const bool q4k = wp->dtype == DType::Q4_K;
  if (!q4k && !gemv_sparse_supports(wp->dtype)) return false;
  // The quantized walks (CudaOptions::teal_walk): by default q8_0's for its wide weights only (auto). On the H100
  // (tessera_bench_sparse, L2 flushed, 8B shapes at 50%) q4_0's and q4_1's walks took 1.3-1.9x their dense GEMV's time
  // at every shape, q8_0's 0.68x at 4096->14336 and 1.04-1.37x elsewhere; a format without its walk runs the dense
  // GEMV on the zeroed x (no sparse copy of its weights either).
  if (q4k || gemv_quantized(wp->dtype)) {
    const TealWalk walk = cuda_options().teal_walk;
    const bool q8 = wp->dtype == DType::Q8_0;
    const bool wide = wp->n >= 2 * wp->k;  // the gate|up stack (28672 x 4096 at the 8B shape), or a lone gate or up
    if (!(walk == TealWalk::ALL || (walk == TealWalk::Q8_0 && q8) || (walk == TealWalk::AUTO && q8 && wide)))
      return false;
  }
  std::vector<uint8_t> q4k_rows;  // the node's q4_K rows on the host (a stack: its members in order)
  if (q4k && sparse_weights.find(wp) == sparse_weights.end()) {
    for (int i = 0; i < n_weights; ++i) {
      const graph::Tensor& t = g.tensor(n.inputs.at(static_cast<size_t>(1 + i)));
      if (t.dtype != DType::Q4_K || t.data == nullptr || t.shape.size() != 2 || t.shape[1] != wp->k) return false;
      const auto* p = static_cast<const uint8_t*>(t.data);
      q4k_rows.insert(q4k_rows.end(), p, p + t.nbytes());
    }
    if (static_cast<int64_t>(q4k_rows.size()) != wp->n * static_cast<int64_t>(*dtype_row_bytes(DType::Q4_K, wp->k)))
      return false;
  }
  const bool columns = !q4k && !gemv_quantized(wp->dtype);  // bf16/f16: gemv_sparse_x; quantized: the list walk
  if (columns) {
    if (sl->threshold < 0 || !sl->in_place) sl->launch = true;
    if (sl->counter < 0) sl->counter = id_in_g;
  } else {
    sl->launch = true;
    sl->list_used = true;
  }
  // bf16/f16: the model's one channel-major copy (CudaShared, shared with the batched-decode executor).
  const SparseWeight* swp = columns ? &sh->sparse_columns(*wp) : nullptr;
  std::unique_ptr<SparseWeight>& sw = sparse_weights[wp];
  if (!columns && !sw && q4k) {
    std::vector<uint8_t> q41(static_cast<size_t>(wp->n) * *dtype_row_bytes(DType::Q4_1, wp->k));
    q4_k_rows_as_q4_1(q4k_rows.data(), q41.data(), wp->n, wp->k);
    const DeviceWeight w41 = upload_weight(DType::Q4_1, q41.data(), wp->n, wp->k);
    sw = std::make_unique<SparseWeight>(make_sparse_weight(w41, stream));
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));  // w41 is freed here, its sparse copy made
    bytes += sw->data.bytes();
  }
  if (!columns && !sw) {
    sw = std::make_unique<SparseWeight>(make_sparse_weight(*wp, stream));
    bytes += sw->data.bytes();
  }
  if (!columns) swp = sw.get();
  if (!sparse_ws) {
    // One workspace for every sparse GEMV of the graph: sized for the tallest weight (stacks: the members' rows).
    int64_t max_n = 0;
    for (const graph::Node& m : g.nodes()) {
      if (m.op != Op::MATMUL_SPARSE) continue;
      int64_t rows = 0;
      for (int i = 0; i < m.fusion.n_weights; ++i) rows += g.tensor(m.inputs.at(static_cast<size_t>(1 + i))).shape[0];
      max_n = std::max(max_n, rows);
    }
    sparse_ws = std::make_unique<SparseGemvWorkspace>(std::max(max_n, wp->n));
  }
  const int out = n.output;
  const graph::Tensor& ot = g.tensor(out);
  if (ot.dtype != DType::F32) unsupported(n, "its output is not f32");
  float* y = nullptr;
  float* gate_up = nullptr;  // the SwiGLU epilogue: the [gate; up] outputs, then one swiglu launch
  bool accumulate = false;
  const float* copy_first = nullptr;
  const int64_t f = ot.numel();
  if (n.fusion.swiglu) {
    ptr[static_cast<size_t>(out)] = planned(n, out);
    y = act(out);
    if (wp->n != 2 * f) unsupported(n, "its stacked weight is not [gate; up] for its output");
  } else if (n_weights > 1) {
    if (f != wp->n) unsupported(n, "its output is not the stack's width");
    ptr[static_cast<size_t>(out)] = planned(n, out);
    y = act(out);
  } else if (n.fusion.residual >= 0) {
    // As the dense MATMUL: y = a + W·x as a += W·x, over the residual's storage where the plan allows.
    if (act(n.inputs.at(0)) == act(n.fusion.residual))
      unsupported(n, "its input lives in the residual it accumulates into");
    if (plan.in_place_input[static_cast<size_t>(id_in_g)] == n.fusion.residual) {
      y = act(n.fusion.residual);
      ptr[static_cast<size_t>(out)] = y;
    } else {
      copy_first = act(n.fusion.residual);
      ptr[static_cast<size_t>(out)] = planned(n, out);
      y = act(out);
    }
    accumulate = true;
  } else {
    ptr[static_cast<size_t>(out)] = planned(n, out);
    y = act(out);
  }
  SparseGemvWorkspace* ws = sparse_ws.get();
  const SparseEntry* list = sl->list;
  const int32_t* count = sl->count;
  const float* xs = act(n.inputs.at(0));  // SPARSIFY's output: the zeroed x, or (launch skipped) x itself
  SparseXFusion fusion;
  // SwiGLU in the stripe form's epilogue (no [gate; up] output, no swiglu launch) where that form runs this weight.
  if (n.fusion.swiglu) {
    if (columns && fold_swiglu && gemv_sparse_x_stripe_shape(*swp, xs, true).first > 0)
      fusion.swiglu = true;
    else
      gate_up = static_cast<float*>(alloc(static_cast<size_t>(2 * f) * sizeof(float)));
  }
  unsigned long long* counters = sparsity_counters();
  const size_t y_bytes = static_cast<size_t>(ot.nbytes());
  launches.push_back({n.source, [=](cudaStream_t s, const RunArgs&) {
                        if (copy_first != nullptr)
                          TESSERA_CUDA_CHECK(cudaMemcpyAsync(y, copy_first, y_bytes, cudaMemcpyDeviceToDevice, s));
                        float* dst = gate_up != nullptr ? gate_up : y;
                        const bool acc = gate_up == nullptr && accumulate;
                        if (columns) {
                          // Skipped launch: x is raw, the threshold applies here, and one reader counts.
                          const float th = sl->launch ? 0.0f : sl->threshold;
                          unsigned long long* z = !sl->launch && sl->counter == id_in_g ? counters : nullptr;
                          gemv_sparse_x(*swp, xs, th, dst, acc, *ws, s, z, 0, fusion);
                        } else {
                          gemv_sparse(*swp, list, count, dst, acc, *ws, s);
                        }
                        if (gate_up != nullptr) swiglu(gate_up, gate_up + f, y, f, s);
                      }});
  return true;
}

void CudaDecoder::Impl::compile_node(int id_in_g) {
  const graph::Node& n = g.node(id_in_g);
  const int id = n.source;  // launches report their time under the source graph's node
  const int out = n.output;
  const graph::Tensor& ot = g.tensor(out);
  const auto in = [&](size_t i) { return n.inputs.at(i); };
  const auto new_act = [&]() {
    if (ot.dtype != DType::F32) unsupported(n, "its output is not f32");
    ptr[static_cast<size_t>(out)] = planned(n, out);
    return act(out);
  };
  // Any reader of a SPARSIFY output but a sparse GEMV reads the zeroed row: that launch must run.
  if (n.op != Op::MATMUL_SPARSE)
    for (int t : n.inputs)
      if (const auto it = sparse_lists.find(t); it != sparse_lists.end()) it->second->launch = true;
  switch (n.op) {
    case Op::EMBED: {
      const DeviceWeight& w = weight(n, in(0));
      embd_rows = w.n;
      const auto* ids = static_cast<const int32_t*>(ptr[static_cast<size_t>(in(1))]);
      float* y = new_act();
      const DeviceWeight* wp = &w;
      embed_launch = embed_launch == -1 ? static_cast<int>(launches.size()) : -2;  // -2: several, none folded
      embed_table = wp;
      embed_out = y;
      launches.push_back({id, [=](cudaStream_t s, const RunArgs&) { embedding(*wp, ids, y, 1, s); }});
      return;
    }
    case Op::RMSNORM: {
      if (n.fusion.in_producer) {  // written by the residual GEMV before it (its Fusion::norm_out)
        if (quant_norm.find(out) == quant_norm.end()) unsupported(n, "its producer did not write it");
        ptr[static_cast<size_t>(out)] = ptr[static_cast<size_t>(in(0))];  // never read as f32: its readers read q8
        return;
      }
      const float* x = act(in(0));
      const float* w = vector_f32(n, in(1));
      float* y = new_act();
      const int64_t d = ot.numel();
      int8_t* q = nullptr;
      float2* ds = nullptr;
      if (d % 32 == 0 && feeds_quantized_matmul(out)) {
        Q8& b = q8_of(out);
        b.written = true;
        q = b.q8.as<int8_t>();
        ds = b.ds.as<float2>();
      }
      const float eps = n.params.eps;
      launches.push_back({id, [=](cudaStream_t s, const RunArgs&) { rmsnorm(x, w, y, 1, d, eps, s, q, ds); }});
      return;
    }
    case Op::SPARSIFY: {
      // The zeroed row for dense readers and the list of its surviving channels for the sparse GEMVs.
      const float* x = act(in(0));
      float* y = new_act();
      const int64_t k = ot.numel();
      auto& slp = sparse_lists[out];
      slp = std::make_unique<SparseList>();
      SparseList* sl = slp.get();
      sl->list = static_cast<SparseEntry*>(alloc(static_cast<size_t>(k) * sizeof(SparseEntry)));
      sl->count = static_cast<int32_t*>(alloc(sizeof(int32_t)));
      sl->threshold = n.params.sparse_threshold;
      sl->in_place = y == x;
      sl->launch = sl->threshold < 0;  // top-k needs the select; the readers may add reasons (compile_sparse_matmul)
      const float sp = n.params.sparsity, th = n.params.sparse_threshold;
      unsigned long long* zeros = sparsity_counters();
      launches.push_back({id, [=](cudaStream_t s, const RunArgs&) {
                            if (!sl->launch) return;
                            // The list feeds the quantized sparse GEMVs only: 8-bit values, as the CPU's.
                            sparsify(x, y, 1, k, sp, th, sl->list_used ? sl->list : nullptr,
                                     sl->list_used ? sl->count : nullptr, zeros, s, sl->list_used);
                          }});
      return;
    }
    case Op::MATMUL_SPARSE:
      if (compile_sparse_matmul(id_in_g)) return;
      [[fallthrough]];
    case Op::MATMUL: {
      // A stack of weights (q|k|v, gate|up: Fusion::n_weights) runs as one GEMV over the stacked matrix: fewer
      // launches, and the small matrices stream at the big one's efficiency.
      const int n_weights = n.fusion.n_weights;
      const DeviceWeight* wp = nullptr;
      // A float base with adapters: its weight with A_stack appended (DeviceAugmented); wp: the base's rows.
      const DeviceAugmented* ag = n.fusion.lora > 0 ? sh->augmented(g, n) : nullptr;
      if (ag != nullptr) {
        wp = &ag->head;
      } else if (n_weights == 1) {
        wp = &weight(n, in(1));
      } else {
        std::vector<const graph::Tensor*> members;
        for (int i = 0; i < n_weights; ++i) members.push_back(&g.tensor(in(static_cast<size_t>(1 + i))));
        wp = &sh->stack(g, n, members);
      }
      // The dense GEMV on a SPARSIFY output (a MATMUL_SPARSE without a sparse GEMV): with calibrated thresholds, the
      // output over the input and a quantized weight whose 8-bit input is made here, that quantization applies the
      // threshold and counts the achieved sparsity itself (the same bits), so this reader needs no SPARSIFY launch.
      // Otherwise the launch writes the zeroed row it reads.
      SparseList* sparse_in = nullptr;
      if (n.op == Op::MATMUL_SPARSE)
        if (const auto it = sparse_lists.find(in(0)); it != sparse_lists.end()) sparse_in = it->second.get();
      const bool fold_threshold = sparse_in != nullptr && sparse_in->threshold >= 0.0f && sparse_in->in_place &&
                                  is_quantized_dtype(wp->dtype) && !q8_of(in(0)).written;
      if (sparse_in != nullptr && !fold_threshold) sparse_in->launch = true;
      GemvInput x;
      if (is_quantized_dtype(wp->dtype)) {
        Q8& b = q8_of(in(0));
        if (!b.written) {
          const float* xf = act(in(0));
          int8_t* q = b.q8.as<int8_t>();
          float2* ds = b.ds.as<float2>();
          const int64_t k = wp->k;
          const SparseList* sl = fold_threshold ? sparse_in : nullptr;
          unsigned long long* counters = sl != nullptr ? sparsity_counters() : nullptr;
          // sl->launch is final when compile ends: if another reader still needs the SPARSIFY launch, it counts.
          launches.push_back({id, [=](cudaStream_t s, const RunArgs&) {
                                if (sl == nullptr) return quantize_q8(xf, q, ds, k, s);
                                quantize_q8(xf, q, ds, k, s, sl->threshold, sl->launch ? nullptr : counters);
                              }});
          b.written = true;
        }
        x.q8 = b.q8.as<int8_t>();
        x.q8_ds = b.ds.as<float2>();
        if (const auto f = quant_norm.find(in(0)); f != quant_norm.end()) {
          x.rms_sumsq = f->second.sumsq;
          x.rms_eps = f->second.eps;
        }
      } else {
        x.f32 = act(in(0));
        if (n.fusion.norm_weight >= 0) {  // the norm prologue: the GEMV reads the raw input and scales it itself
          x.norm_w = vector_f32(n, n.fusion.norm_weight);
          x.norm_eps = n.fusion.norm_eps;
        }
      }
      float* y = nullptr;
      bool accumulate = false;
      const float* copy_first = nullptr;  // a residual the plan kept apart: copied into y, then accumulated into
      if (n.fusion.swiglu) {
        // silu(gate) * up in the GEMV's epilogue: the merged [gate; up] weight, one output of F elements.
        y = new_act();
        x.swiglu = true;
      } else if (n_weights > 1) {
        // The members' outputs are the SLICE nodes after this one (views at their offsets).
        if (ot.numel() != wp->n) unsupported(n, "its output is not the stack's width");
        y = new_act();
      } else if (n.fusion.residual >= 0) {
        // y = a + W·x written as a += W·x: the residual add (the passes' residual epilogue) disappears into the GEMV.
        // The plan writes it over the residual (the passes fold only where the matmul is the residual's last
        // reader); where it did not, y gets its own block and a copy of the residual first.
        if (act(in(0)) == act(n.fusion.residual)) unsupported(n, "its input lives in the residual it accumulates into");
        if (plan.in_place_input[static_cast<size_t>(id_in_g)] == n.fusion.residual) {
          y = act(n.fusion.residual);
          ptr[static_cast<size_t>(out)] = y;
        } else {
          copy_first = act(n.fusion.residual);
          y = new_act();
        }
        accumulate = true;
        if (n.fusion.norm_out >= 0) {
          const graph::Node& norm = g.node(g.tensor(n.fusion.norm_out).producer);
          Q8& b = q8_of(norm.output);
          b.written = true;
          auto* sumsq = static_cast<float*>(alloc(static_cast<size_t>(wp->n / 32) * sizeof(float)));
          x.norm_out_w = vector_f32(norm, norm.inputs.at(1));
          x.norm_out_q8 = b.q8.as<int8_t>();
          x.norm_out_ds = b.ds.as<float2>();
          x.norm_out_sumsq = sumsq;
          quant_norm[norm.output] = QuantNorm{sumsq, norm.params.eps};
        }
      } else {
        y = new_act();
      }
      const GemvConfig c = x.norm_out_w != nullptr ? gemv_norm_out_config(wp->dtype, wp->n, wp->k)
                                                   : gemv_default_config(wp->dtype, wp->n, wp->k);
      const size_t y_bytes = static_cast<size_t>(ot.nbytes());
      if (n.fusion.lora > 0) {
        // Unmerged adapters (kernels_lora.h): the base GEMV as without them, u = A_stack·x for every adapter of the
        // node in one GEMV (the same x: normalized by the GEMV where the norm is folded, f32 beside a quantized
        // base), then one launch adding each member's u_m·B_mᵀ to its rows of y (the stack's output or the residual)
        // or, with the SwiGLU epilogue, forming silu(gate + Δ)·(up + Δ) from the [gate; up] output the base GEMV now
        // writes plainly.
        if (x.norm_out_w != nullptr || quant_norm.contains(in(0)))
          unsupported(n, "its adapters need the f32 input, which the norm epilogue does not write");
        const DeviceLora* lp = &sh->lora(g, n, wp->dtype);
        const bool swiglu = n.fusion.swiglu;
        const int64_t width = swiglu ? wp->n / 2 : wp->n;
        if (ag != nullptr) {
          // One GEMV over [W; A_stack] (the norm folded in for both) writes [y; u]; one launch then forms the output
          // (y + Δ, or silu(gate + Δ)·(up + Δ)) or adds y + Δ to the residual.
          if (ag->tail.n != lp->layout.r_total) unsupported(n, "its appended A rows are not its adapters' rank");
          const DeviceWeight* wa = &ag->aug;
          auto* yu = static_cast<float*>(alloc(static_cast<size_t>(wa->n) * sizeof(float)));
          const float* u = yu + wp->n;
          GemvInput xb = x;
          xb.swiglu = false;
          const GemvConfig cb = gemv_default_config(wa->dtype, wa->n, wa->k);
          launches.push_back({id, [=](cudaStream_t s, const RunArgs&) {
                                if (copy_first != nullptr)
                                  TESSERA_CUDA_CHECK(
                                      cudaMemcpyAsync(y, copy_first, y_bytes, cudaMemcpyDeviceToDevice, s));
                                gemv(*wa, xb, yu, s, &cb);
                                if (swiglu)
                                  lora_b_swiglu(lp->b.get(), lp->layout, u, yu, y, width, 1, s);
                                else
                                  lora_b_add(lp->b.get(), lp->layout, u, y, width, width, 1, s, yu, width, accumulate);
                              }});
          return;
        }
        GemvInput xa;
        xa.f32 = act(in(0));
        xa.norm_w = x.norm_w;
        xa.norm_eps = x.norm_eps;
        if (xa.f32 == nullptr) unsupported(n, "its input has no f32 storage for the adapters");
        auto* u = static_cast<float*>(alloc(static_cast<size_t>(lp->a.n) * sizeof(float)));
        const GemvConfig ca = gemv_default_config(lp->a.dtype, lp->a.n, lp->a.k);
        GemvInput xb = x;
        xb.swiglu = false;
        float* base_y = swiglu ? static_cast<float*>(alloc(static_cast<size_t>(wp->n) * sizeof(float))) : y;
        const GemvConfig cb = gemv_default_config(wp->dtype, wp->n, wp->k);
        launches.push_back({id, [=](cudaStream_t s, const RunArgs&) {
                              if (copy_first != nullptr)
                                TESSERA_CUDA_CHECK(
                                    cudaMemcpyAsync(y, copy_first, y_bytes, cudaMemcpyDeviceToDevice, s));
                              gemv(*wp, xb, base_y, s, &cb, accumulate);
                              gemv(lp->a, xa, u, s, &ca);
                              if (swiglu)
                                lora_b_swiglu(lp->b.get(), lp->layout, u, base_y, y, width, 1, s);
                              else
                                lora_b_add(lp->b.get(), lp->layout, u, y, width, width, 1, s);
                            }});
        return;
      }
      launches.push_back({id, [=](cudaStream_t s, const RunArgs&) {
                            if (copy_first != nullptr)
                              TESSERA_CUDA_CHECK(cudaMemcpyAsync(y, copy_first, y_bytes, cudaMemcpyDeviceToDevice, s));
                            gemv(*wp, x, y, s, &c, accumulate);
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
      const KvCacheView cache = attention_cache_view(n, g.tensor(in(1)), ptr[static_cast<size_t>(in(1))],
                                                     ptr[static_cast<size_t>(in(2))], sh->n_seq);
      const int64_t n_head = n.params.n_head;
      if (attn_ws.empty() || attn_ws.back()->n_head() != n_head || attn_ws.back()->hd() != cache.hd)
        attn_ws.push_back(std::make_unique<AttnWorkspace>(n_head, cache));
      AttnWorkspace* ws = attn_ws.back().get();
      float* qp = act(in(0));
      const float* kp = act(in(3));
      const float* vp = act(in(4));
      const auto* pos = static_cast<const int32_t*>(ptr[static_cast<size_t>(positions_id)]);
      const float* inv_freq = vector_f32(n, in(6));
      const int64_t rope_dim = n.params.rope_dim;
      const bool neox = n.params.rope_neox;
      const float scale = n.params.attn_scale;
      float* y = new_act();
      if (fuse_attention_enabled()) {
        // A quantized o-projection's 8-bit input written by attention itself: one quantize_q8 launch less per layer
        // where the context is short (H100, 8B -d 128: q8_0 303.2 -> 309.9 tok/s, q4_1 461.1 -> 475.8;
        // TESSERA_CUDA_ATTN_Q8=0: the quantize_q8 launch).
        int8_t* q8o = nullptr;
        float2* dso = nullptr;
        if (cuda_options().attn_q8 && ot.numel() % 32 == 0 && feeds_quantized_matmul(out)) {
          Q8& b = q8_of(out);
          b.written = true;
          q8o = b.q8.as<int8_t>();
          dso = b.ds.as<float2>();
        }
        launches.push_back({id, [=](cudaStream_t s, const RunArgs&) {
                              attn_decode_rope(qp, kp, vp, cache, pos, rope_dim, inv_freq, neox, y, n_head, scale, *ws,
                                               s, q8o, dso);
                            }});
        return;
      }
      launches.push_back({id, [=](cudaStream_t s, const RunArgs&) {
                            rope_store_kv(qp, kp, vp, cache, pos, n_head, rope_dim, inv_freq, neox, s);
                            attn_decode(qp, cache, pos, y, n_head, scale, *ws, s);
                          }});
      return;
    }
    case Op::ADD: {
      // In place on the first operand where the plan gives the output its block (this is its last reader: the
      // residual stream), else copy then add.
      const int a = in(0), b = in(1);
      const bool last_reader = plan.in_place_input[static_cast<size_t>(id_in_g)] == a;
      const float* bp = act(b);
      const int64_t count = ot.numel();
      if (last_reader) {
        float* y = act(a);
        ptr[static_cast<size_t>(out)] = y;
        launches.push_back({id, [=](cudaStream_t s, const RunArgs&) { add(y, bp, count, s); }});
      } else {
        const float* ap = act(a);
        float* y = new_act();
        launches.push_back({id, [=](cudaStream_t s, const RunArgs&) {
                              TESSERA_CUDA_CHECK(cudaMemcpyAsync(y, ap, static_cast<size_t>(count) * sizeof(float),
                                                                 cudaMemcpyDeviceToDevice, s));
                              add(y, bp, count, s);
                            }});
      }
      return;
    }
    case Op::SWIGLU: {
      const float* gp = act(in(0));
      const float* up = act(in(1));
      float* y = new_act();
      const int64_t count = ot.numel();
      int8_t* q = nullptr;
      float2* ds = nullptr;
      if (count % 32 == 0 && feeds_quantized_matmul(out)) {
        Q8& b = q8_of(out);
        b.written = true;
        q = b.q8.as<int8_t>();
        ds = b.ds.as<float2>();
      }
      launches.push_back({id, [=](cudaStream_t s, const RunArgs&) { swiglu(gp, up, y, count, s, q, ds); }});
      return;
    }
    case Op::GEGLU:
    case Op::RELU2_GLU: {
      // Gemma's GELU-tanh and BitNet's squared-ReLU gating, one row. A quantized down projection quantizes the output
      // itself (quantize_q8).
      const float* gp = act(in(0));
      const float* up = act(in(1));
      const int64_t count = ot.numel();
      if (g.tensor(in(0)).numel() != count || g.tensor(in(1)).numel() != count)
        unsupported(n, "its gate and up inputs differ in size from its output");
      float* y = new_act();
      const auto gate = n.op == Op::GEGLU ? geglu_rows : relu2_glu_rows;
      launches.push_back({id, [=](cudaStream_t s, const RunArgs&) { gate(gp, up, count, y, 1, count, s); }});
      return;
    }
    case Op::ACT_QUANT_I8: {
      // BitLinear's activation fake-quant (kernels_ternary.h), one row. The quantized matmuls reading it take it
      // quantized again per 32, as the CPU's do: written by this launch (the values quantize_q8 would write).
      const float* x = act(in(0));
      const int64_t w = ot.numel();
      if (g.tensor(in(0)).numel() != w) unsupported(n, "its input and output sizes differ");
      float* y = new_act();
      int8_t* q = nullptr;
      float2* ds = nullptr;
      if (w % 32 == 0 && feeds_quantized_matmul(out)) {
        Q8& b = q8_of(out);
        b.written = true;
        q = b.q8.as<int8_t>();
        ds = b.ds.as<float2>();
      }
      launches.push_back({id, [=](cudaStream_t s, const RunArgs&) { act_quant_i8_rows(x, w, y, 1, w, s, q, ds); }});
      return;
    }
    case Op::MLGRU: {
      // The recurrence's one step on the layer's state (slot 0), at the position the step uploaded: the captured
      // graph replays it at every position.
      const graph::Tensor& st = g.tensor(in(3));
      const int64_t d = ot.numel();
      if (st.kind != graph::TensorKind::KV_CACHE || st.io != graph::IoRole::STATE || st.numel() != d + 1)
        unsupported(n, "its state is not a STATE cache of its width plus one");
      if (g.tensor(in(0)).numel() != d || g.tensor(in(1)).numel() != d || g.tensor(in(2)).numel() != d)
        unsupported(n, "its inputs differ in width from its output");
      const float* fp = act(in(0));
      const float* cp = act(in(1));
      const float* lb = vector_f32(n, in(2));
      float* state = static_cast<float*>(ptr[static_cast<size_t>(in(3))]);
      const int32_t* pos = pos_dev;
      float* y = new_act();
      launches.push_back(
          {id, [=](cudaStream_t s, const RunArgs&) { mlgru_rows(fp, cp, lb, state, nullptr, pos, y, 1, d, s); }});
      return;
    }
    case Op::HEAD_RMSNORM:
    case Op::BIAS_ADD:
    case Op::SOFTCAP:
    case Op::SCALE: {
      // Row-wise ops of the families beyond Llama (never fused by the passes), one row; the output is its own block.
      const float* x = act(in(0));
      const int64_t w = ot.numel();
      if (g.tensor(in(0)).numel() != w) unsupported(n, "its input and output sizes differ");
      const float* p = n.op == Op::HEAD_RMSNORM || n.op == Op::BIAS_ADD ? vector_f32(n, in(1)) : nullptr;
      float* y = new_act();
      const Op op = n.op;
      const float eps = n.params.eps, factor = n.params.scale;
      const int64_t hd = n.params.head_dim;
      if (op == Op::HEAD_RMSNORM && (hd <= 0 || w % hd != 0))
        unsupported(n, "its width is not a whole number of heads of head_dim values");
      if (op == Op::BIAS_ADD && g.tensor(in(1)).numel() != w) unsupported(n, "its bias is not one value per column");
      if (op == Op::HEAD_RMSNORM && g.tensor(in(1)).numel() != hd) unsupported(n, "its weight is not head_dim values");
      launches.push_back({id, [=](cudaStream_t s, const RunArgs&) {
                            if (op == Op::HEAD_RMSNORM)
                              head_rmsnorm(x, w, p, y, 1, w / hd, hd, eps, s);
                            else if (op == Op::BIAS_ADD)
                              bias_add_rows(x, w, p, y, 1, w, s);
                            else if (op == Op::SOFTCAP)
                              softcap_rows(x, w, y, 1, w, factor, s);
                            else
                              scale_rows(x, w, y, 1, w, factor, s);
                          }});
      return;
    }
    case Op::LAST_ROW: {
      // T = 1: the last row is the only one; the plan gives it the row's block where nothing reads the row later,
      // else a copy.
      if (plan.in_place_input[static_cast<size_t>(id_in_g)] == in(0)) {
        ptr[static_cast<size_t>(out)] = ptr[static_cast<size_t>(in(0))];
        return;
      }
      if (ot.nbytes() != g.tensor(in(0)).nbytes()) unsupported(n, "it is not one token");
      const float* x = act(in(0));
      float* y = new_act();
      const size_t row_bytes = static_cast<size_t>(ot.nbytes());
      launches.push_back({id, [=](cudaStream_t s, const RunArgs&) {
                            TESSERA_CUDA_CHECK(cudaMemcpyAsync(y, x, row_bytes, cudaMemcpyDeviceToDevice, s));
                          }});
      return;
    }
    case Op::SLICE: {
      // Columns of a stacked GEMV's one-token output: a view at their offset.
      if (ot.numel() != ot.shape.back()) unsupported(n, "it is not one token");
      ptr[static_cast<size_t>(out)] = act(in(0)) + n.params.slice_begin;
      return;
    }
    default:  // an op with no CUDA kernel
      break;
  }
  unsupported(n, "the op has no CUDA kernel");
}

void CudaDecoder::Impl::check_step(int32_t token, int64_t pos) const {
  TESSERA_CHECK(token >= 0 && token < embd_rows, "token id {} is outside the vocabulary of {} tokens", token,
                embd_rows);
  TESSERA_CHECK(pos >= 0 && pos < ctx, "the context is full: position {} is outside the cache of {} tokens", pos, ctx);
}

void CudaDecoder::Impl::upload_step(int32_t token, int64_t pos) {
  // host_io is pinned and read by the copies asynchronously: nothing may still be reading it (the callers synchronize
  // after every step, or, chained, upload once before the first).
  host_io[0] = token;
  host_io[1] = static_cast<int32_t>(pos);
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(ptr[static_cast<size_t>(tokens_id)], &host_io[0], sizeof(int32_t),
                                     cudaMemcpyHostToDevice, stream));
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(pos_dev, &host_io[1], sizeof(int32_t), cudaMemcpyHostToDevice, stream));
}

void CudaDecoder::Impl::step(int32_t token, int64_t pos) {
  check_step(token, pos);
  upload_step(token, pos);
  logits_current = true;
  if (profile != nullptr) {  // timed launch by launch: no graph replay
    runner.run(launches, stream, RunArgs{}, profile);
    ++steps;
    return;
  }
  // The first step runs plainly (kernel attributes get set, faults show up uncaptured); the second captures.
  if (options.use_graph && !captured && !capture_failed && steps >= 1) {
    captured = capture_graph(launches, stream, RunArgs{}, &cgraph, &cexec);
    capture_failed = !captured;
  }
  if (captured)
    TESSERA_CUDA_CHECK(cudaGraphLaunch(cexec, stream));
  else
    runner.run(launches, stream, RunArgs{}, nullptr);
  ++steps;
}

void CudaDecoder::Impl::chain_setup() {
  if (ring_host != nullptr) return;
  TESSERA_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&ring_host), static_cast<size_t>(ctx) * sizeof(int32_t),
                                   cudaHostAllocMapped));
  TESSERA_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&ring_dev), ring_host, 0));
  for (int i = 0; i < kChainAhead + 2; ++i) {
    cudaEvent_t e = nullptr;
    TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    chain_events.push_back(e);
  }
  chain_k = std::clamp(cuda_options().chain_steps, 1, 16);
  chain_embed = embed_launch >= 0 && cuda_options().chain_embed;
  // The chained argmax writes the next step's embedding while it reads the logits: never into the logits' block.
  const char* lo = reinterpret_cast<const char*>(act(logits_id));
  const char* eo = reinterpret_cast<const char*>(embed_out);
  if (chain_embed && embed_table != nullptr && eo < lo + static_cast<size_t>(vocab) * sizeof(float) &&
      lo < eo + static_cast<size_t>(embed_table->k) * sizeof(float))
    chain_embed = false;
  chain_launches[0] = launches;
  if (chain_embed) chain_launches[0].erase(chain_launches[0].begin() + embed_launch);
  ArgmaxChain c;
  if (chain_embed) c.embed = embed_table, c.embed_out = embed_out;
  c.token = static_cast<int32_t*>(ptr[static_cast<size_t>(tokens_id)]);
  c.pos = pos_dev;
  c.ring = ring_dev;
  c.ring_size = static_cast<int32_t>(ctx);
  const float* x = act(logits_id);
  const int64_t n = vocab;
  ArgmaxWorkspace* ws = argmax_ws.get();
  int32_t* out = argmax_out.as<int32_t>();
  chain_launches[0].push_back({-1, [=](cudaStream_t s, const RunArgs&) { argmax(x, n, out, *ws, s, c); }});
  for (int i = 0; i < chain_k; ++i)
    chain_launches[1].insert(chain_launches[1].end(), chain_launches[0].begin(), chain_launches[0].end());
}

void CudaDecoder::Impl::chain_step(int n_steps) {
  // As step(): the first chained step runs plainly, the next captures (once per kind; a failed capture keeps
  // launching plainly).
  const int g = n_steps == 1 ? 0 : 1;
  if (options.use_graph && !chain_captured[g] && !chain_capture_failed[g] && steps >= 1) {
    chain_captured[g] = capture_graph(chain_launches[g], stream, RunArgs{}, &chain_graph[g], &chain_exec[g]);
    chain_capture_failed[g] = !chain_captured[g];
  }
  if (chain_captured[g])
    TESSERA_CUDA_CHECK(cudaGraphLaunch(chain_exec[g], stream));
  else
    for (int i = 0; i < n_steps; ++i) runner.run(chain_launches[0], stream, RunArgs{}, nullptr);
  steps += n_steps;
}

int64_t CudaDecoder::Impl::generate_greedy(int32_t token, int64_t pos, int64_t n,
                                           const std::function<bool(int32_t)>& on_token) {
  TESSERA_CHECK(n >= 0, "cannot generate {} tokens", n);
  if (n == 0) return 0;
  check_step(token, pos);
  TESSERA_CHECK(pos + n <= ctx, "the context is full: {} steps from position {} do not fit the cache of {} tokens", n,
                pos, ctx);
  int64_t done = 0;
  // A recurrent state steps one by one: chained steps queued past a stop would have advanced the state beyond the
  // accepted tokens (a KV cache only gains rows past them), and a recurrence cannot take them back.
  if (profile != nullptr || has_state || !cuda_options().chain) {
    // Step by step: every step's argmax comes back before the next is launched.
    for (int32_t t = token; done < n;) {
      t = step_argmax(t, pos + done);
      ++done;
      if (!on_token(t)) break;
    }
    return done;
  }
  chain_setup();
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));  // host_io may still be read by an earlier step's copy
  upload_step(token, pos);
  if (chain_embed) launches[static_cast<size_t>(embed_launch)].fn(stream, RunArgs{});  // later steps: the argmax
  // Launches in flight, oldest first: (the step after its last, its event). chain_k steps per launch while that many
  // remain, then single steps.
  std::deque<std::pair<int64_t, cudaEvent_t>> flight;
  int64_t launched = 0, n_launches = 0;
  try {
    while (done < n) {
      while (launched < n && flight.size() <= static_cast<size_t>(kChainAhead)) {
        const int take = chain_k > 1 && n - launched >= chain_k ? chain_k : 1;
        chain_step(take);
        cudaEvent_t e = chain_events[static_cast<size_t>(n_launches++) % chain_events.size()];
        TESSERA_CUDA_CHECK(cudaEventRecord(e, stream));
        launched += take;
        flight.emplace_back(launched, e);
      }
      TESSERA_CUDA_CHECK(cudaEventSynchronize(flight.front().second));
      const int64_t end = flight.front().first;
      flight.pop_front();
      bool go = true;
      while (go && done < end) {
        const int32_t id = static_cast<volatile int32_t*>(ring_host)[pos + done];
        ++done;
        go = on_token(id);
      }
      if (!go) break;
    }
  } catch (...) {
    (void)cudaStreamSynchronize(stream);  // the steps in flight finish before anything else reuses their buffers
    logits_current = false;
    throw;
  }
  // Steps launched past the last accepted one are not waited for: they only write cache rows past the accepted context,
  // the token/position buffers (the next step uploads its own, stream-ordered after them) and the ring, and whatever
  // runs next on the stream runs after them (a chat's next prompt is typed meanwhile).
  logits_current = launched == done;
  return done;
}

CudaDecoder::CudaDecoder(const graph::Graph& g, std::shared_ptr<CudaShared> shared, const CudaBackendOptions& options)
    : impl_(std::make_unique<Impl>()) {
  impl_->sh = &shared_impl(shared, options);
  impl_->shared_owner = std::move(shared);
  impl_->src = g;
  impl_->options = impl_->sh->options;
  impl_->fuse = impl_->sh->fuse;
  impl_->fold_norm = cuda_options().fold_norm;
  impl_->fold_swiglu = cuda_options().fold_swiglu;
  impl_->g = graph::run_passes(g, decoder_fusion_support(impl_->fuse, impl_->fold_norm, impl_->fold_swiglu));
  impl_->stream = impl_->sh->stream;
  impl_->compile();
  synchronize();
}

CudaDecoder::~CudaDecoder() {
  // Destructors must not throw: release what exists and ignore the runtime's answers.
  if (!impl_) return;
  if (impl_->stream != nullptr) (void)cudaStreamSynchronize(impl_->stream);
  if (impl_->cexec != nullptr) (void)cudaGraphExecDestroy(impl_->cexec);
  if (impl_->cgraph != nullptr) (void)cudaGraphDestroy(impl_->cgraph);
  for (int g = 0; g < 2; ++g) {
    if (impl_->chain_exec[g] != nullptr) (void)cudaGraphExecDestroy(impl_->chain_exec[g]);
    if (impl_->chain_graph[g] != nullptr) (void)cudaGraphDestroy(impl_->chain_graph[g]);
  }
  for (cudaEvent_t e : impl_->chain_events) (void)cudaEventDestroy(e);
  if (impl_->ring_host != nullptr) (void)cudaFreeHost(impl_->ring_host);
  if (impl_->host_io != nullptr) (void)cudaFreeHost(impl_->host_io);
  if (impl_->host_logits != nullptr) (void)cudaFreeHost(impl_->host_logits);
}

void CudaDecoder::set_profile(std::vector<uint64_t>* node_ns) {
  if (node_ns != nullptr && node_ns->size() < impl_->src.nodes().size()) node_ns->resize(impl_->src.nodes().size());
  impl_->profile = node_ns;
}

std::span<const float> CudaDecoder::decode(int32_t token, int64_t pos) {
  Impl& m = *impl_;
  m.step(token, pos);
  return logits();
}

int32_t CudaDecoder::Impl::step_argmax(int32_t token, int64_t pos) {
  step(token, pos);
  argmax(act(logits_id), vocab, argmax_out.as<int32_t>(), *argmax_ws, stream);
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(&host_io[2], argmax_out.get(), sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  return host_io[2];
}

int32_t CudaDecoder::decode_argmax(int32_t token, int64_t pos) { return impl_->step_argmax(token, pos); }

std::pair<int32_t, int32_t> CudaDecoder::decode_sample(int32_t token, int64_t pos, const DeviceSamplingParams& params,
                                                       const std::vector<std::pair<int32_t, int32_t>>& penalties,
                                                       double u) {
  Impl& m = *impl_;
  if (!m.sampler) m.sampler = std::make_unique<DeviceSampler>(m.vocab);
  m.step(token, pos);
  int32_t* out = m.argmax_out.as<int32_t>();
  m.sampler->sample(m.act(m.logits_id), params, penalties, u, out, m.stream);
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(&m.host_io[2], out, 2 * sizeof(int32_t), cudaMemcpyDeviceToHost, m.stream));
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  return {m.host_io[2], m.host_io[3]};
}

int64_t CudaDecoder::generate_greedy(int32_t token, int64_t pos, int64_t n,
                                     const std::function<bool(int32_t)>& on_token) {
  return impl_->generate_greedy(token, pos, n, on_token);
}

std::span<const float> CudaDecoder::logits() {
  Impl& m = *impl_;
  if (m.steps == 0 || !m.logits_current) return {};
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(m.host_logits, m.act(m.logits_id), static_cast<size_t>(m.vocab) * sizeof(float),
                                     cudaMemcpyDeviceToHost, m.stream));
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  return {m.host_logits, static_cast<size_t>(m.vocab)};
}

int64_t CudaDecoder::n_vocab() const { return impl_->vocab; }
int64_t CudaDecoder::n_ctx() const { return impl_->ctx; }
bool CudaDecoder::graph_captured() const { return impl_->captured; }
uint64_t CudaDecoder::device_bytes() const { return impl_->bytes + impl_->sh->bytes; }

}  // namespace tessera::cuda
