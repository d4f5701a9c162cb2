#include "backends/cuda/session_cuda.h"

#include <algorithm>
#include <cstdint>
#include <exception>
#include <map>
#include <thread>

#include "backends/cuda/backend_cuda.h"
#include "backends/cuda/ceilings.h"
#include "backends/cuda/cuda_options.h"
#include "backends/cuda/executor_common.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/gemv_sparse.h"
#include "core/error.h"

namespace tessera::cuda {

namespace {

class CudaWeightStore : public backend::WeightStore {
 public:
  uint64_t bytes() const override {
    uint64_t b = 0;
    for (const auto& [p, w] : weights->weights) b += w.bytes();
    for (const auto& [k, w] : weights->stacks) b += w->bytes();
    return b;
  }
  std::shared_ptr<DeviceWeights> weights = std::make_shared<DeviceWeights>();
};

class CudaSession : public backend::DeviceSession {
 public:
  CudaSession(const backend::SessionConfig& c, std::shared_ptr<DeviceWeights> weights) : c_(c) {
    TESSERA_CHECK(!c.reference, "the reference path runs on the CPU only, not on device 'cuda'");
    // f32 is opt-in on the GPU too (f32 models keep f32 precision; the default stays f16: half the cache bytes).
    TESSERA_CHECK(c.kv_dtype == DType::F16 || c.kv_dtype == DType::F32,
                  "kv cache type {} is not supported on device 'cuda' (f16 or f32)", dtype_name(c.kv_dtype));
    // Every session runs with the defaults and its own switches (so one session's switches never leak into another):
    // set here and again at each entry after another session set its own (own_options).
    for (const std::string& kv : c.options) parse_cuda_option(opts_, kv);
    own_options();
    // Uploading every weight now (the decoder's graph names them all) keeps it out of the first prompt's timing.
    CudaBackendOptions bo;
    bo.n_ctx = c.n_ctx;  // graphs with a recurrent state and no KV cache take the session's context
    shared_ = std::make_shared<CudaShared>(c.n_seq, std::max(c.n_batch, c.n_seq), bo, std::move(weights));
    const graph::Graph g1 = c.build_graph(1, false, true);
    for (const graph::Tensor& t : g1.tensors()) {
      has_state_ |= t.io == graph::IoRole::STATE;
      // Head sizes the attention kernels take (decode and prefill: 64, 128 and 256): refuse others here, in the
      // user's terms, not at the first prompt.
      TESSERA_CHECK(t.kind != graph::TensorKind::KV_CACHE || t.io == graph::IoRole::STATE || t.shape.size() != 3 ||
                        t.shape[2] == 64 || t.shape[2] == 128 || t.shape[2] == 256,
                    "cuda backend: this model's attention heads are {} wide, and CUDA's attention takes 64, 128 or "
                    "256; run it with --device cpu",
                    t.shape.size() == 3 ? t.shape[2] : 0);
    }
    if (has_state_) state_pos_.assign(static_cast<size_t>(c.n_seq), 0);
    decoder_ = std::make_unique<CudaDecoder>(g1, shared_);
    device_sample_ = cuda_options().sample;
  }

  std::span<const float> eval(int64_t seq, std::span<const int32_t> ids, int64_t pos, bool all_rows) override {
    own_options();
    const int64_t t = static_cast<int64_t>(ids.size());
    const StateStep st = state_step(seq, pos, t);
    if (t == 1 && seq == 0) {  // the decoder: merged GEMVs, CUDA graph replay
      decoder_->set_profile(slot(1));
      return decoder_->decode(ids[0], pos);
    }
    if (t == 1) {  // another slot: a one-row batched decode step
      CudaRowsExecutor& e = batch(1);
      e.set_profile(slot(1));
      const int32_t s = static_cast<int32_t>(seq), p = static_cast<int32_t>(pos);
      return e.decode_rows(ids, std::span<const int32_t>(&s, 1), std::span<const int32_t>(&p, 1));
    }
    // One executor compiled for n_batch rows serves every chunk length t <= n_batch and every position.
    auto& e = prefill_[all_rows ? 1 : 0];
    if (!e)
      e = std::make_unique<CudaRowsExecutor>(c_.build_graph(c_.n_batch, all_rows, false), RowsMode::PREFILL, shared_);
    e->set_profile(slot(t));
    return e->prefill(ids, seq, pos);
  }

  std::span<const backend::RowScore> eval_scores(int64_t seq, std::span<const int32_t> ids, int64_t pos,
                                                 std::span<const int32_t> targets) override {
    own_options();
    const StateStep st = state_step(seq, pos, static_cast<int64_t>(ids.size()));
    auto& e = prefill_[1];  // the all-row graph: its logits stay on the device, reduced there
    if (!e) e = std::make_unique<CudaRowsExecutor>(c_.build_graph(c_.n_batch, true, false), RowsMode::PREFILL, shared_);
    e->set_profile(slot(static_cast<int64_t>(ids.size())));
    const std::span<const double> s = e->prefill_scores(ids, seq, pos, targets);
    scores_.resize(ids.size());
    for (size_t r = 0; r < ids.size(); ++r) scores_[r] = {s[2 * r], s[2 * r + 1]};
    return scores_;
  }

  std::span<const float> decode_rows(std::span<const int32_t> ids, std::span<const int32_t> seqs,
                                     std::span<const int32_t> pos) override {
    own_options();
    std::vector<StateStep> st;
    for (size_t i = 0; i < ids.size(); ++i) st.push_back(state_step(seqs[i], pos[i], 1));
    CudaRowsExecutor& e = batch(static_cast<int64_t>(ids.size()));
    e.set_profile(slot(1));
    return e.decode_rows(ids, seqs, pos);
  }

  std::vector<int32_t> decode_rows_argmax(std::span<const int32_t> ids, std::span<const int32_t> seqs,
                                          std::span<const int32_t> pos) override {
    own_options();
    std::vector<StateStep> st;
    for (size_t i = 0; i < ids.size(); ++i) st.push_back(state_step(seqs[i], pos[i], 1));
    if (ids.size() == 1 && seqs[0] == 0) {  // the decoder (CUDA graph, merged GEMVs) and its device argmax
      decoder_->set_profile(slot(1));
      return {decoder_->decode_argmax(ids[0], pos[0])};
    }
    CudaRowsExecutor& e = batch(static_cast<int64_t>(ids.size()));
    e.set_profile(slot(1));
    const std::span<const int32_t> r = e.decode_rows_argmax(ids, seqs, pos);
    return {r.begin(), r.end()};
  }

  int64_t generate_greedy(int32_t token, int64_t pos, int64_t n,
                          const std::function<bool(int32_t)>& on_token) override {
    own_options();
    StateStep st = state_step(0, pos, 0);
    decoder_->set_profile(slot(1));
    const int64_t done = decoder_->generate_greedy(token, pos, n, on_token);
    st.to = pos + done;  // the decoder steps a state one by one: exactly these
    return done;
  }

  std::optional<std::pair<int32_t, int32_t>> decode_sample(int32_t token, int64_t pos,
                                                           const backend::SampleRequest& r) override {
    own_options();
    if (!device_sample_) return std::nullopt;
    const StateStep st = state_step(0, pos, 1);
    const DeviceSamplingParams p{r.temperature,       r.top_k,           r.top_p, r.min_p, r.repeat_penalty,
                                 r.frequency_penalty, r.presence_penalty};
    static const std::vector<std::pair<int32_t, int32_t>> none;
    decoder_->set_profile(slot(1));
    return decoder_->decode_sample(token, pos, p, r.penalties != nullptr ? *r.penalties : none, r.u);
  }

  std::span<const float> last_logits() override { return decoder_->logits(); }

  // The device's counters are process-wide, as the CPU's (sparsify writes them in every executor).
  std::pair<uint64_t, uint64_t> sparsity_counts() const override { return read_sparsity_counters(); }
  void reset_sparsity_counts() override { reset_sparsity_counters(); }

  void set_profiling(bool on) override { profiling_ = on; }
  std::vector<uint64_t> profile_ns(int64_t n_tokens) const override {
    auto it = profile_.find(n_tokens);
    return it == profile_.end() ? std::vector<uint64_t>{} : it->second;
  }
  int64_t n_vocab() const override { return decoder_->n_vocab(); }
  int n_threads() const override {
    return c_.n_threads > 0 ? c_.n_threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }

 private:
  // This session's options made the process's (cuda_options), where another session or a test has set others since:
  // executors compile lazily and launches read them, so each session runs with its own.
  void own_options() {
    if (options_generation_ == cuda_options_generation()) return;
    set_cuda_options(opts_);
    options_generation_ = cuda_options_generation();
  }
  // The profile vector of steps of n_tokens rows (null when not profiling); executors size it to their graph.
  std::vector<uint64_t>* slot(int64_t n_tokens) { return profiling_ ? &profile_[n_tokens] : nullptr; }
  CudaRowsExecutor& batch(int64_t rows) {
    auto& e = batch_[rows];
    if (!e) e = std::make_unique<CudaRowsExecutor>(c_.build_graph(rows, true, true), RowsMode::BATCH, shared_);
    return *e;
  }

  // A recurrent state (the MatMul-free LM's MLGRU) holds the tokens it absorbed and cannot rewind: a step of slot seq
  // at pos must start a sequence (pos 0) or continue it, as the CPU's MLGRU kernel checks (the device kernel can only
  // write NaN). The slot's new position (t tokens on) is recorded when the step returns without an error.
  struct StateStep {
    int64_t* p = nullptr;  // the slot's position, or null (no state)
    int64_t to = 0;
    StateStep() = default;
    StateStep(int64_t* slot_pos, int64_t new_pos) : p(slot_pos), to(new_pos) {}
    StateStep(StateStep&& o) noexcept : p(o.p), to(o.to) { o.p = nullptr; }
    StateStep(const StateStep&) = delete;
    StateStep& operator=(const StateStep&) = delete;
    StateStep& operator=(StateStep&&) = delete;
    ~StateStep() {
      if (p != nullptr && std::uncaught_exceptions() == 0) *p = to;
    }
  };
  [[nodiscard]] StateStep state_step(int64_t seq, int64_t pos, int64_t t) {
    if (!has_state_ || seq < 0 || seq >= static_cast<int64_t>(state_pos_.size())) return {};
    int64_t& p = state_pos_[static_cast<size_t>(seq)];
    TESSERA_CHECK(pos == 0 || pos == p,
                  "the recurrent state of sequence {} holds {} tokens, not {}: a recurrent model cannot go back to an "
                  "earlier position (evaluate again from position 0)",
                  seq, p, pos);
    return {&p, pos + t};
  }

  backend::SessionConfig c_;
  CudaOptions opts_;                  // the defaults with this session's switches
  uint64_t options_generation_ = UINT64_MAX;  // cuda_options_generation() when own_options last set opts_
  bool has_state_ = false;
  std::vector<int64_t> state_pos_;  // per slot, with has_state_: the tokens its state has absorbed
  std::shared_ptr<CudaShared> shared_;
  std::unique_ptr<CudaDecoder> decoder_;
  std::unique_ptr<CudaRowsExecutor> prefill_[2];                // last-row and all-row logits
  std::vector<backend::RowScore> scores_;                       // eval_scores' answer
  std::map<int64_t, std::unique_ptr<CudaRowsExecutor>> batch_;  // by rows
  std::map<int64_t, std::vector<uint64_t>> profile_;            // by chunk size
  bool profiling_ = false;
  bool device_sample_ = true;  // decode_sample draws on the device (cuda option sample=0: the host draws)
};

class CudaBackendEntry : public backend::Backend {
 public:
  std::string_view name() const override { return "cuda"; }
  bool available(std::string* why) const override { return cuda_available(why); }
  // The passes the executors run (decoder for one token, rows executor otherwise) with the options' defaults; their
  // FusionSupport reads weight formats and launch shapes on the host only, so no GPU is needed.
  graph::Graph rewrite_for_display(const graph::Graph& g) const override {
    const CudaOptions& o = cuda_options();
    return g.n_tokens() == 1 ? graph::run_passes(g, decoder_fusion_support(o.fuse, o.fold_norm, o.fold_swiglu))
                             : graph::run_passes(g, rows_fusion_support(o.fuse, o.merge_gate_up));
  }
  graph::ChainCostModel chain_cost_model() const override { return cuda_chain_cost_model(); }
  backend::Capabilities capabilities() const override {
    backend::Capabilities c;
    c.device_argmax = c.device_sampling = c.chained_greedy = c.batched_decode = c.device_scores = true;
    return c;
  }
  // The builder's ops the executors run (after their passes), with every weight in a format the GPU reads natively or
  // after conversion, and caches in a type the attention kernels read; other ops (a test-only op, a new op before its
  // CUDA kernel) are refused.
  bool supports(const graph::Node& n, const graph::Graph& g) const override {
    using graph::Op;
    for (int t : n.inputs) {
      const graph::Tensor& x = g.tensor(t);
      if (x.kind == graph::TensorKind::WEIGHT && x.data != nullptr && !weight_formats().runs_as(x.dtype)) return false;
      if (x.kind == graph::TensorKind::KV_CACHE && x.dtype != DType::F16 && x.dtype != DType::BF16 &&
          x.dtype != DType::F32)
        return false;
    }
    switch (n.op) {
      case Op::EMBED:
      case Op::RMSNORM:
      case Op::MATMUL:
      case Op::ROPE:
      case Op::KV_STORE:
      case Op::ATTENTION:
      case Op::ADD:
      case Op::SWIGLU:
      case Op::LAST_ROW:
      case Op::SPARSIFY:       // TEAL: kernels/gemv_sparse.h
      case Op::MATMUL_SPARSE:  // the decoder's sparse GEMV (K-quants: the dense GEMV on the zeroed x)
      case Op::ACT_QUANT_I8:   // the ternary families (kernels_ternary.h)
      case Op::RELU2_GLU:
      case Op::MLGRU:
        return true;
      default:
        return false;
    }
  }
  bool native_weight_format(DType dtype) const override { return gemv_supports(dtype); }
  std::shared_ptr<backend::WeightStore> make_weight_store() const override {
    return std::make_shared<CudaWeightStore>();
  }
  std::unique_ptr<backend::DeviceSession> open(const backend::SessionConfig& config,
                                               std::shared_ptr<backend::WeightStore> weights) const override {
    auto* store = dynamic_cast<CudaWeightStore*>(weights.get());
    TESSERA_CHECK(store != nullptr, "cuda backend: the weight store was made by another backend");
    return std::make_unique<CudaSession>(config, store->weights);
  }
  backend::Ceilings measure_ceilings(const backend::CeilingsRequest& r) const override {
    for (DType dt : r.dtypes) {
      TESSERA_CHECK(gemv_supports(dt), "dtype '{}' has no CUDA kernel to measure", dtype_name(dt));
    }
    const CudaCeilings cc = measure_cuda_ceilings(r.buffer_bytes, r.repeats, r.dtypes, r.bandwidth, r.gemm);
    backend::Ceilings c;
    c.device_name = cc.gpu_name;
    for (const auto& b : cc.bandwidth) c.bandwidth.push_back({b.name, b.bytes, b.gbps});
    for (const auto& g : cc.gemm) c.gemm.push_back({g.dtype, g.kernel, g.m, g.n, g.k, g.tflops});
    return c;
  }
};

}  // namespace

const backend::Backend& cuda_backend() {
  static const CudaBackendEntry b;
  return b;
}

}  // namespace tessera::cuda
