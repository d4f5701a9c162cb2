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
#include "core/error.h"
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

  graph::Graph g;  // a copy: node and tensor metadata for error messages
  std::shared_ptr<CudaShared> shared_owner;
  CudaShared::Impl* sh = nullptr;  // weights, caches, stream
  CudaBackendOptions options;
  cudaStream_t stream = nullptr;
  std::vector<DeviceBuffer> owned;
  std::vector<void*> ptr;          // per tensor: device storage
  std::unordered_map<int, Q8> q8;  // by activation tensor id
  std::unordered_map<int, RopeInfo> rope;                 // by ROPE output tensor id
  std::unordered_map<int, int> kv_src;                    // KV_STORE output tensor -> stored tensor
  std::vector<std::unique_ptr<AttnWorkspace>> attn_ws;
  std::vector<Launch> launches;
  LaunchRunner runner;
  std::vector<uint64_t>* profile = nullptr;
  std::vector<std::vector<int>> consumers;  // per tensor: consuming node ids
  std::vector<bool> done;                   // per node: already emitted by a fused launch
  bool fuse = true;                         // merge GEMVs and fold residual adds (TESSERA_CUDA_FUSE=0: off)
  // RMSNorm folded into the float GEMVs reading its output (GemvInput::norm_w), by the norm's output tensor id: the
  // GEMVs read the raw input and scale by themselves, one launch less per norm (TESSERA_CUDA_FOLD_NORM=0: off).
  struct NormFold {
    const float* w;
    float eps;
  };
  std::unordered_map<int, NormFold> norm_fold;
  // RMSNorm before quantized GEMVs folded into the residual GEMV before it (GemvInput::norm_out_* / rms_sumsq), by the
  // norm's output tensor id: that GEMV writes the readers' rms-free q8 input and per-32 sums of squares, the readers
  // scale by 1/rms; no rmsnorm launch. Opt-in (TESSERA_CUDA_QUANT_NORM=1): measured slower on the H100 (8B q8_0
  // 307.7 -> 240.7 tok/s, q4_1 476.4 -> 448.8): the residual GEMVs run as thread-block clusters, which cost more than
  // the rmsnorm launch they replace (docs/CUDA_NOTES.md).
  struct QuantNorm {
    const float* sumsq;
    float eps;
  };
  std::unordered_map<int, QuantNorm> quant_norm;
  bool fold_norm = true;
  bool fold_swiglu = true;  // SwiGLU in the gate|up GEMV's epilogue (float weights; TESSERA_CUDA_FOLD_SWIGLU=0: off)
  int tokens_id = -1, positions_id = -1, logits_id = -1;
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
  const DeviceWeight& weight(const graph::Node& n, int tid) { return sh->weight(n, g.tensor(tid)); }
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
  // Whether RMSNorm node `id` can fold into its readers: every reader is a float-weight matmul of its output, and they
  // are the nodes right after it, so nothing can write its input in between (the GEMVs read the input when they run,
  // not when the norm would have).
  bool norm_foldable(int id) const {
    if (!fuse || !fold_norm) return false;
    const graph::Node& n = g.node(id);
    const graph::Tensor& o = g.tensor(n.output);
    const auto& co = consumers[static_cast<size_t>(n.output)];
    if (o.is_output || co.empty() || o.numel() % 4 != 0) return false;
    for (size_t i = 0; i < co.size(); ++i) {
      const graph::Node& m = g.node(co[i]);
      if (co[i] != id + 1 + static_cast<int>(i) || m.op != Op::MATMUL || m.inputs.at(0) != n.output) return false;
      const graph::Tensor& w = g.tensor(m.inputs.at(1));
      if (w.data == nullptr || w.shape.size() != 2 || is_quantized_dtype(w.dtype) || !gemv_supports(w.dtype))
        return false;
    }
    return true;
  }
  // The SWIGLU node a merged (gate, up) matmul pair feeds, when it can fold into their GEMV's epilogue: the pair's
  // outputs are that node's gate and up inputs (in order) and nothing else reads them. -1 if none.
  int swiglu_of_pair(const std::vector<int>& group) const {
    if (!fuse || !fold_swiglu || group.size() != 2) return -1;
    const int a = g.node(group[0]).output, b = g.node(group[1]).output;
    const auto& ca = consumers[static_cast<size_t>(a)];
    const auto& cb = consumers[static_cast<size_t>(b)];
    if (ca.size() != 1 || cb.size() != 1 || ca[0] != cb[0]) return -1;
    const graph::Node& s = g.node(ca[0]);
    if (s.op != Op::SWIGLU || s.inputs.size() != 2 || s.inputs[0] != a || s.inputs[1] != b) return -1;
    if (g.tensor(a).is_output || g.tensor(b).is_output || g.tensor(a).numel() != g.tensor(b).numel() ||
        g.tensor(s.output).numel() != g.tensor(a).numel())
      return -1;
    return ca[0];
  }
  // The ADD node that matmul `id` may accumulate into: its output's only reader is ADD(a, output), in place on a (a
  // is an activation whose last reader is that ADD, and every other reader of a runs before the matmul). -1 if none.
  int residual_add_target(int id) const {
    if (!fuse) return -1;
    const int out = g.node(id).output;
    const auto& co = consumers[static_cast<size_t>(out)];
    if (co.size() != 1) return -1;
    const graph::Node& r = g.node(co[0]);
    if (r.op != Op::ADD || r.inputs.size() != 2 || r.inputs[1] != out || r.inputs[0] == out) return -1;
    const int a = r.inputs[0];
    const graph::Tensor& at = g.tensor(a);
    if (at.kind != graph::TensorKind::ACTIVATION || at.is_output || ptr[static_cast<size_t>(a)] == nullptr) return -1;
    if (at.numel() != g.tensor(out).numel()) return -1;
    const auto& ca = consumers[static_cast<size_t>(a)];
    if (ca.empty() || ca.back() != co[0]) return -1;
    for (int c : ca)
      if (c != co[0] && c > id) return -1;
    return co[0];
  }
  // The RMSNORM node that the quantized residual GEMV accumulating through ADD node `add` (weight w) can write the
  // input of (GemvInput::norm_out_*): the first reader of the sum is that norm, every reader of the norm's output is a
  // quantized matmul of it, the shapes fit and the GEMV's launch shape has the epilogue. -1 if none. On by default for
  // q4_1 (8B decode on the H100, warp groups, 2026-11-22: 476.2 -> 498.6 tok/s); q8_0 measured even (311.8 vs
  // 312.3-313.1), q4_0 not measured: off. TESSERA_CUDA_QUANT_NORM=1 / 0 turns it on / off for every format.
  int quant_norm_after(int add, const DeviceWeight& w) const {
    if (!fuse || !is_quantized_dtype(w.dtype) || env_switched_off("TESSERA_CUDA_QUANT_NORM")) return -1;
    if (w.dtype != DType::Q4_1 && !env_is_on("TESSERA_CUDA_QUANT_NORM")) return -1;
    const int sum = g.node(add).output;
    const auto& cs = consumers[static_cast<size_t>(sum)];
    if (cs.empty()) return -1;
    const graph::Node& nn = g.node(cs[0]);
    if (nn.op != Op::RMSNORM || nn.inputs.at(0) != sum) return -1;
    const graph::Tensor& o = g.tensor(nn.output);
    const auto& co = consumers[static_cast<size_t>(nn.output)];
    if (o.is_output || co.empty() || o.numel() != w.n || w.n % 32 != 0) return -1;
    for (int c : co) {
      const graph::Node& m = g.node(c);
      if (m.op != Op::MATMUL || m.inputs.at(0) != nn.output) return -1;
      const graph::Tensor& wt = g.tensor(m.inputs.at(1));
      if (wt.data == nullptr || wt.shape.size() != 2 || !is_quantized_dtype(wt.dtype)) return -1;
    }
    const bool clusters = env_is_on("TESSERA_CUDA_QUANT_NORM_CLUSTERS");
    if (!gemv_norm_out_supported(gemv_norm_out_config(w.dtype, w.n, w.k, clusters), clusters)) return -1;
    return cs[0];
  }
  float* act(int tid) { return static_cast<float*>(ptr[static_cast<size_t>(tid)]); }
  // Whether a quantized matmul reads tensor `tid` (then its producer writes the 8-bit copy too).
  bool feeds_quantized_matmul(int tid) const {
    for (int c : consumers[static_cast<size_t>(tid)]) {
      const graph::Node& n = g.node(c);
      if (n.op == Op::MATMUL && n.inputs[0] == tid && is_quantized_dtype(g.tensor(n.inputs[1]).dtype)) return true;
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

  void compile();
  void compile_node(int id);
  // TESSERA_CUDA_DROP_OPS=op[,op...] (graph op names: rmsnorm, swiglu, attention, matmul, add, embed): the decode
  // step leaves out every launch of a node of those ops, so a benchmark shows what they cost in the replayed graph
  // (their readers read whatever the buffers held: the outputs are WRONG; a timing study only, announced on stderr).
  void drop_launches_for_timing() {
    const char* e = std::getenv("TESSERA_CUDA_DROP_OPS");
    if (e == nullptr || *e == '\0') return;
    std::vector<std::string> ops;
    for (std::string_view rest = e; !rest.empty();) {
      const size_t comma = rest.find(',');
      ops.emplace_back(rest.substr(0, comma));
      rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    }
    const size_t before = launches.size();
    std::erase_if(launches, [&](const Launch& l) {
      return l.node >= 0 && std::find(ops.begin(), ops.end(), graph::op_name(g.node(l.node).op)) != ops.end();
    });
    embed_launch = -2;  // launch indices moved: the chain keeps the embedding as a launch (if it is still there)
    std::fprintf(stderr, "tessera: TESSERA_CUDA_DROP_OPS=%s left out %zu of %zu decode launches: outputs are wrong, "
                 "timing study only\n", e, before - launches.size(), before);
  }
  void check_step(int32_t token, int64_t pos) const;
  void upload_step(int32_t token, int64_t pos);
  void step(int32_t token, int64_t pos);
  int32_t step_argmax(int32_t token, int64_t pos);  // step, then its argmax back on the host (decode_argmax)
  void chain_setup();
  void chain_step(int n_steps);
  int64_t generate_greedy(int32_t token, int64_t pos, int64_t n, const std::function<bool(int32_t)>& on_token);
};

void CudaDecoder::Impl::compile() {
  TESSERA_CHECK(g.n_tokens() == 1, "cuda backend: only one-token (decode) graphs run on the GPU, not {} tokens",
                g.n_tokens());
  ptr.assign(g.tensors().size(), nullptr);
  done.assign(g.nodes().size(), false);
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
      ptr[i] = sh->cache(t);  // slot 0 of the shared cache
      ctx = t.shape[1];
    }
  }
  TESSERA_CHECK(tokens_id >= 0, "cuda backend: the graph has no tokens input (role TOKENS)");
  for (size_t i = 0; i < g.nodes().size(); ++i) compile_node(static_cast<int>(i));
  drop_launches_for_timing();
  for (const auto& [out, src] : kv_src) {
    bool read = false;
    for (int c : consumers[static_cast<size_t>(out)]) read |= g.node(c).op == Op::ATTENTION;
    TESSERA_CHECK(read, "cuda backend: cache store '{}' is not followed by attention (stores are fused into it)",
                  g.tensor(out).name);
  }
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

void CudaDecoder::Impl::compile_node(int id) {
  const graph::Node& n = g.node(id);
  const int out = n.output;
  const graph::Tensor& ot = g.tensor(out);
  const auto in = [&](size_t i) { return n.inputs.at(i); };
  const auto new_act = [&]() {
    if (ot.dtype != DType::F32) unsupported(n, "its output is not f32");
    ptr[static_cast<size_t>(out)] = alloc(ot.nbytes());
    return act(out);
  };
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
      if (done[static_cast<size_t>(id)]) {  // written by the residual GEMV before it (quant_norm)
        ptr[static_cast<size_t>(out)] = ptr[static_cast<size_t>(in(0))];  // never read as f32: its readers read q8
        return;
      }
      const float* x = act(in(0));
      const float* w = vector_f32(n, in(1));
      if (norm_foldable(id)) {
        ptr[static_cast<size_t>(out)] = ptr[static_cast<size_t>(in(0))];  // the readers see the raw input
        norm_fold[out] = NormFold{w, n.params.eps};
        return;
      }
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
    case Op::MATMUL: {
      if (done[static_cast<size_t>(id)]) return;  // computed by an earlier merged GEMV
      const graph::Tensor& w0 = g.tensor(in(1));
      // Matmuls sharing this input and weight format (q|k|v, gate|up) run as one GEMV over the stacked weights:
      // fewer launches, and the small matrices stream at the big one's efficiency.
      std::vector<int> group{id};
      if (fuse && w0.shape.size() == 2 && w0.data != nullptr)
        for (int c : consumers[static_cast<size_t>(in(0))]) {
          if (c <= id) continue;
          const graph::Node& m = g.node(c);
          if (m.op != Op::MATMUL || m.inputs.at(0) != in(0)) continue;
          const graph::Tensor& wt = g.tensor(m.inputs.at(1));
          if (wt.dtype == w0.dtype && wt.shape.size() == 2 && wt.shape[1] == w0.shape[1] && wt.data != nullptr &&
              wt.kind == graph::TensorKind::WEIGHT && g.tensor(m.output).dtype == DType::F32)
            group.push_back(c);
        }
      const DeviceWeight* wp = nullptr;
      if (group.size() == 1) {
        wp = &weight(n, in(1));
      } else {
        std::vector<const graph::Tensor*> members;
        for (int c : group) members.push_back(&g.tensor(g.node(c).inputs[1]));
        wp = &sh->stack(n, members);
      }
      GemvInput x;
      if (is_quantized_dtype(wp->dtype)) {
        Q8& b = q8_of(in(0));
        if (!b.written) {
          const float* xf = act(in(0));
          int8_t* q = b.q8.as<int8_t>();
          float2* ds = b.ds.as<float2>();
          const int64_t k = wp->k;
          launches.push_back({id, [=](cudaStream_t s, const RunArgs&) { quantize_q8(xf, q, ds, k, s); }});
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
        if (const auto f = norm_fold.find(in(0)); f != norm_fold.end()) {
          x.norm_w = f->second.w;
          x.norm_eps = f->second.eps;
        }
      }
      float* y = nullptr;
      bool accumulate = false;
      int sw = swiglu_of_pair(group);
      if (sw >= 0 && is_quantized_dtype(wp->dtype)) {
        // Quantized: the epilogue also writes the down projection's q8 input, so only when that is what reads the
        // SwiGLU's output. Opt-in (TESSERA_CUDA_QUANT_SWIGLU=1), measured slower on the H100 in both forms: tickets
        // (8B q8_0 303.2 -> 295.0 tok/s, q4_1 461.1 -> 425.4; every block of the multi-wave gate|up grid holds its
        // slot through a fence and a ticket atomic) and warp groups (q8_0 311.9 -> 290.7, q4_1 499.0 -> 460.8; the
        // 448 blocks of 16 warps stream slower than the 7,168 small blocks; not profiled) (docs/CUDA_NOTES.md).
        const int so = g.node(sw).output;
        const int64_t f = g.tensor(so).numel();
        // TESSERA_CUDA_QUANT_SWIGLU_TICKETS=1: the first form (tickets across blocks); =1: warp groups, one block per
        // 32 gate rows and their up rows, at the default shape if it has that form.
        const bool tickets = env_is_on("TESSERA_CUDA_QUANT_SWIGLU_TICKETS");
        const bool groups_ok = gemv_swiglu_groups_supported(gemv_default_config(wp->dtype, wp->n, wp->k));
        if (!env_is_on("TESSERA_CUDA_QUANT_SWIGLU") || f % 32 != 0 || !feeds_quantized_matmul(so) ||
            (!tickets && !groups_ok)) {
          sw = -1;
        } else {
          Q8& b = q8_of(so);
          b.written = true;
          x.swiglu_q8 = b.q8.as<int8_t>();
          x.swiglu_ds = b.ds.as<float2>();
          x.swiglu_groups = !tickets;
          if (tickets) {
            x.swiglu_tickets = static_cast<unsigned int*>(alloc(static_cast<size_t>(f / 32) * sizeof(unsigned int)));
            TESSERA_CUDA_CHECK(cudaMemset(x.swiglu_tickets, 0, static_cast<size_t>(f / 32) * sizeof(unsigned int)));
          }
        }
      }
      if (sw >= 0) {
        // silu(gate) * up in the GEMV's epilogue: the merged [gate; up] weight, one output of F elements.
        const graph::Node& s = g.node(sw);
        y = static_cast<float*>(alloc(static_cast<size_t>(g.tensor(s.output).numel()) * sizeof(float)));
        for (int c : group) {
          ptr[static_cast<size_t>(g.node(c).output)] = y;  // never read: their only reader is the folded swiglu
          done[static_cast<size_t>(c)] = true;
        }
        ptr[static_cast<size_t>(s.output)] = y;
        done[static_cast<size_t>(sw)] = true;
        x.swiglu = true;
      } else if (group.size() > 1) {
        y = static_cast<float*>(alloc(static_cast<size_t>(wp->n) * sizeof(float)));
        int64_t off = 0;
        for (int c : group) {
          const graph::Node& m = g.node(c);
          if (g.tensor(m.output).numel() != g.tensor(m.inputs[1]).shape[0]) unsupported(m, "it is not one token");
          ptr[static_cast<size_t>(m.output)] = y + off;
          off += g.tensor(m.inputs[1]).shape[0];
          done[static_cast<size_t>(c)] = true;
        }
      } else if (const int r = residual_add_target(id); r >= 0 && act(in(0)) != act(g.node(r).inputs[0])) {
        // y = a + W·x written as a += W·x: the residual add disappears into the GEMV.
        y = act(g.node(r).inputs[0]);
        ptr[static_cast<size_t>(out)] = y;
        accumulate = true;
        done[static_cast<size_t>(r)] = true;
        if (const int nn = quant_norm_after(r, *wp); nn >= 0) {
          const graph::Node& norm = g.node(nn);
          Q8& b = q8_of(norm.output);
          b.written = true;
          auto* sumsq = static_cast<float*>(alloc(static_cast<size_t>(wp->n / 32) * sizeof(float)));
          x.norm_out_w = vector_f32(norm, norm.inputs.at(1));
          x.norm_out_q8 = b.q8.as<int8_t>();
          x.norm_out_ds = b.ds.as<float2>();
          x.norm_out_sumsq = sumsq;
          x.norm_out_clusters = env_is_on("TESSERA_CUDA_QUANT_NORM_CLUSTERS");
          quant_norm[norm.output] = QuantNorm{sumsq, norm.params.eps};
          done[static_cast<size_t>(nn)] = true;
        }
      } else {
        y = new_act();
      }
      const GemvConfig c = x.norm_out_w != nullptr ? gemv_norm_out_config(wp->dtype, wp->n, wp->k, x.norm_out_clusters)
                                                   : gemv_default_config(wp->dtype, wp->n, wp->k);
      launches.push_back({id, [=](cudaStream_t s, const RunArgs&) { gemv(*wp, x, y, s, &c, accumulate); }});
      return;
    }
    case Op::ROPE: {
      // Rotated in place by the attention's fused launch: the output shares the input's storage, so nothing else
      // may read the unrotated input.
      if (consumers[static_cast<size_t>(in(0))].size() != 1)
        unsupported(n, "its input is read by other nodes too (rope is fused into attention)");
      if (in(1) != positions_id) unsupported(n, "its positions are not the graph's positions input");
      ptr[static_cast<size_t>(out)] = ptr[static_cast<size_t>(in(0))];
      rope[out] = RopeInfo{in(0), in(2), n.params};
      vector_f32(n, in(2));
      return;
    }
    case Op::KV_STORE:
      ptr[static_cast<size_t>(out)] = ptr[static_cast<size_t>(in(1))];
      kv_src[out] = in(0);
      return;
    case Op::ATTENTION: {
      const FusedAttention fa = resolve_fused_attention(n, rope, kv_src, consumers);
      const KvCacheView cache = attention_cache_view(n, g.tensor(in(1)), ptr[static_cast<size_t>(in(1))],
                                                     ptr[static_cast<size_t>(in(2))], sh->n_seq);
      const int64_t n_head = n.params.n_head;
      if (attn_ws.empty() || attn_ws.back()->n_head() != n_head || attn_ws.back()->hd() != cache.hd)
        attn_ws.push_back(std::make_unique<AttnWorkspace>(n_head, cache));
      AttnWorkspace* ws = attn_ws.back().get();
      float* qp = act(fa.q);
      const float* kp = act(fa.k);
      const float* vp = act(fa.v);
      const auto* pos = static_cast<const int32_t*>(ptr[static_cast<size_t>(positions_id)]);
      const float* inv_freq = act(fa.rope->inv_freq);
      const int64_t rope_dim = fa.rope->p.rope_dim;
      const bool neox = fa.rope->p.rope_neox;
      const float scale = n.params.attn_scale;
      float* y = new_act();
      if (fuse_attention_enabled()) {
        // A quantized o-projection's 8-bit input written by attention itself: one quantize_q8 launch less per layer
        // where the context is short (H100, 8B -d 128: q8_0 303.2 -> 309.9 tok/s, q4_1 461.1 -> 475.8;
        // TESSERA_CUDA_ATTN_Q8=0: the quantize_q8 launch).
        int8_t* q8o = nullptr;
        float2* dso = nullptr;
        if (!env_switched_off("TESSERA_CUDA_ATTN_Q8") && ot.numel() % 32 == 0 && feeds_quantized_matmul(out)) {
          Q8& b = q8_of(out);
          b.written = true;
          q8o = b.q8.as<int8_t>();
          dso = b.ds.as<float2>();
        }
        launches.push_back({id, [=](cudaStream_t s, const RunArgs&) {
          attn_decode_rope(qp, kp, vp, cache, pos, rope_dim, inv_freq, neox, y, n_head, scale, *ws, s, q8o, dso);
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
      if (done[static_cast<size_t>(id)]) {  // accumulated by the GEMV producing its second operand
        ptr[static_cast<size_t>(out)] = ptr[static_cast<size_t>(in(0))];
        return;
      }
      // In place on the first operand when this is its last reader (the residual stream), else copy then add.
      const int a = in(0), b = in(1);
      const auto& ca = consumers[static_cast<size_t>(a)];
      const bool last_reader = g.tensor(a).kind == graph::TensorKind::ACTIVATION && !g.tensor(a).is_output &&
                               !ca.empty() && ca.back() == id && a != b;
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
          TESSERA_CUDA_CHECK(
              cudaMemcpyAsync(y, ap, static_cast<size_t>(count) * sizeof(float), cudaMemcpyDeviceToDevice, s));
          add(y, bp, count, s);
        }});
      }
      return;
    }
    case Op::SWIGLU: {
      if (done[static_cast<size_t>(id)]) return;  // computed by the gate|up GEMV's epilogue
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
    case Op::LAST_ROW:
      ptr[static_cast<size_t>(out)] = ptr[static_cast<size_t>(in(0))];  // T = 1: the last row is the only one
      return;
    case Op::SLICE:
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
  if (positions_id >= 0)
    TESSERA_CUDA_CHECK(cudaMemcpyAsync(ptr[static_cast<size_t>(positions_id)], &host_io[1], sizeof(int32_t),
                                       cudaMemcpyHostToDevice, stream));
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
  if (const char* e = std::getenv("TESSERA_CUDA_CHAIN_STEPS"); e != nullptr && *e != '\0')
    chain_k = std::clamp(std::atoi(e), 1, 16);
  chain_embed = embed_launch >= 0 && !env_switched_off("TESSERA_CUDA_CHAIN_EMBED");
  chain_launches[0] = launches;
  if (chain_embed) chain_launches[0].erase(chain_launches[0].begin() + embed_launch);
  ArgmaxChain c;
  if (chain_embed) c.embed = embed_table, c.embed_out = embed_out;
  c.token = static_cast<int32_t*>(ptr[static_cast<size_t>(tokens_id)]);
  c.pos = static_cast<int32_t*>(ptr[static_cast<size_t>(positions_id)]);
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
  if (profile != nullptr || positions_id < 0 || env_switched_off("TESSERA_CUDA_CHAIN")) {
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
  impl_->g = g;
  impl_->options = impl_->sh->options;
  impl_->fuse = impl_->sh->fuse;
  impl_->fold_norm = !env_switched_off("TESSERA_CUDA_FOLD_NORM");
  impl_->fold_swiglu = !env_switched_off("TESSERA_CUDA_FOLD_SWIGLU");
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
  if (node_ns != nullptr && node_ns->size() < impl_->g.nodes().size()) node_ns->resize(impl_->g.nodes().size());
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
