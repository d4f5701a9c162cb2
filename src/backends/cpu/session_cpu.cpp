#include "backends/cpu/session_cpu.h"

#include <cstring>
#include <deque>
#include <map>
#include <tuple>

#include "backends/cpu/backend.h"
#include "backends/cpu/cpu_features.h"
#include "backends/cpu/kv_cache.h"
#include "core/error.h"

namespace tessera::cpu {

namespace {

// Plans kept beyond the decode and full-batch ones (prompt remainders of other lengths).
constexpr size_t kMaxPlans = 6;

class CpuWeightStore : public backend::WeightStore {
 public:
  uint64_t bytes() const override { return cache->bytes(); }
  std::shared_ptr<WeightCache> cache = std::make_shared<WeightCache>();
};

// The CPU's switches: "isa=NAME" (the kernels' instruction set), "teal_walk=all|none" (TEAL's sparse kernels).
BackendOptions backend_options(const backend::SessionConfig& c) {
  BackendOptions o{c.n_threads, c.reference};
  for (const std::string& kv : c.options) {
    const size_t eq = kv.find('=');
    const std::string key = kv.substr(0, eq), value = eq == std::string::npos ? "" : kv.substr(eq + 1);
    if (eq != std::string::npos && key == "isa") {
      o.isa = parse_isa(value);
    } else if (eq != std::string::npos && key == "teal_walk") {
      TESSERA_CHECK(value == "all" || value == "none", "cpu backend: teal_walk={} (it takes all or none)", value);
      o.teal_walk = value == "all";
    } else {
      fail("cpu backend: unknown option '{}' (the cpu backend takes isa=scalar|avx2|avx2_vnni|avx512_vnni and "
           "teal_walk=all|none)",
           kv);
    }
  }
  return o;
}

class CpuSession : public backend::DeviceSession {
 public:
  CpuSession(const backend::SessionConfig& c, std::shared_ptr<WeightCache> weights)
      : c_(c), backend_(backend_options(c), std::move(weights)) {
    // The caches' shapes are the graph's: one K and one V [n_kv, n_ctx, head_dim] per layer, or (recurrent models)
    // one state per layer, IoRole::STATE, of a fixed size whatever the context.
    const graph::Graph g = c_.build_graph(1, false, true);
    int64_t layers = 0, n_kv = 0, hd = 0;
    std::vector<const graph::Tensor*> states;
    for (const graph::Tensor& t : g.tensors()) {
      if (t.kind != graph::TensorKind::KV_CACHE) continue;
      if (t.io == graph::IoRole::STATE) {
        states.push_back(&t);
        continue;
      }
      ++layers;
      n_kv = t.shape.at(0);
      hd = t.shape.at(2);
    }
    TESSERA_CHECK((layers > 0 && layers % 2 == 0) || (layers == 0 && !states.empty()),
                  "cpu backend: the graph has no K and V caches and no recurrent state");
    for (int64_t s = 0; s < c_.n_seq; ++s) {
      Slot& slot = slots_.emplace_back();
      if (layers > 0) {
        slot.kv = std::make_unique<KvCache>(layers / 2, n_kv, c_.n_ctx, hd, c_.kv_dtype);
        slot.bindings = slot.kv->bindings();
      }
      for (const graph::Tensor* t : states) {
        slot.states.emplace_back(t->nbytes(), uint8_t{0});
        slot.bindings.push_back({graph::IoRole::STATE, t->io_layer, slot.states.back().data()});
      }
    }
    // Compiling the decode plan prepares (repacks) every weight now, so the first prompt's timing measures the
    // forward pass alone.
    const Plan& p = plan_for(1, false, 0);
    cpu::reset_sparsity_counts();  // the counters are process-wide: a session counts from its opening
    vocab_ = p.graph().tensor(p.graph().require_role(graph::IoRole::LOGITS)).shape.back();
  }

  std::span<const float> eval(int64_t seq, std::span<const int32_t> ids, int64_t pos, bool all_rows) override {
    const int64_t t = static_cast<int64_t>(ids.size());
    Plan& plan = plan_for(t, all_rows, seq);
    std::memcpy(plan.input(graph::IoRole::TOKENS), ids.data(), static_cast<size_t>(t) * sizeof(int32_t));
    backend_.execute(plan, pos);
    // A one-token chunk's logits are its only row, whichever graph ran it.
    const int64_t rows = all_rows ? t : 1;
    return std::span<const float>(plan.output(graph::IoRole::LOGITS), static_cast<size_t>(rows * vocab_));
  }

  void set_profiling(bool on) override { profiling_ = on; }
  // Both per node of the builder's graph (what Session::graph shows), as the plan's nodes are not: a fused plan node
  // (a matmul with its LoRA adapters) reports its time and its threads' spans under the first node it computes, the
  // others 0 (no time, no thread ran them).
  std::vector<uint64_t> profile_thread_spans(int64_t n_tokens) const override {
    auto it = spans_.find(n_tokens);
    if (it == spans_.end()) return {};
    return to_builder_nodes(n_tokens, it->second, 2 * static_cast<size_t>(backend_.n_threads()));
  }
  std::vector<uint64_t> profile_ns(int64_t n_tokens) const override {
    auto it = profile_.find(n_tokens);
    if (it == profile_.end()) return {};
    return to_builder_nodes(n_tokens, it->second, 1);
  }
  int64_t n_vocab() const override { return vocab_; }
  int n_threads() const override { return backend_.n_threads(); }
  // Process-wide counters (ops/sparsify.cpp): exact for the one session a command runs.
  std::pair<uint64_t, uint64_t> sparsity_counts() const override {
    const SparsityCounts c = cpu::sparsity_counts();
    return {c.zeros, c.total};
  }
  void reset_sparsity_counts() override { cpu::reset_sparsity_counts(); }
  void record_activation_histograms(bool on) override { cpu::record_activation_histograms(on); }
  std::map<int, std::vector<uint64_t>> take_activation_histograms() override {
    return cpu::take_activation_histograms();
  }
  void set_node_tap(NodeTap tap) override { tap_ = std::move(tap); }

 private:
  Plan& plan_for(int64_t n_tokens, bool all_logits, int64_t seq) {
    const auto key = std::make_tuple(n_tokens, all_logits, seq);
    auto it = plans_.find(key);
    if (it == plans_.end()) {
      // Decode plans of every slot and slot 0's full-batch plan stay; other chunk sizes come and go.
      if (plans_.size() >= kMaxPlans + static_cast<size_t>(c_.n_seq))
        for (auto p = plans_.begin(); p != plans_.end();) {
          const auto [t, all, s] = p->first;
          p = ((t == 1 && !all) || (t == c_.n_batch && !all && s == 0)) ? std::next(p) : plans_.erase(p);
        }
      it = plans_
               .emplace(key, backend_.compile(c_.build_graph(n_tokens, all_logits, false),
                                              slots_[static_cast<size_t>(seq)].bindings))
               .first;
    }
    Plan& plan = *it->second;
    plan.tap = tap_ ? &tap_ : nullptr;
    if (profiling_) {
      std::vector<uint64_t>& v = profile_[n_tokens];
      v.resize(plan.graph().nodes().size());
      bool fused = false;
      std::vector<std::string> names;
      for (const graph::Node& n : plan.graph().nodes()) {
        fused |= !n.fusion.fused_from.empty();
        names.push_back(n.fusion.fused_from.empty() ? n.name : n.fusion.fused_from[0]);
      }
      if (fused) profile_names_[n_tokens] = std::move(names);
      plan.node_ns = &v;
      plan.thread_spans = &spans_[n_tokens];
    } else {
      plan.node_ns = nullptr;
      plan.thread_spans = nullptr;
    }
    return plan;
  }

  // Per plan node values, `width` each, moved to the builder node whose name the plan node reports under (adding
  // times; a span is the one plan node's that reports there).
  std::vector<uint64_t> to_builder_nodes(int64_t n_tokens, const std::vector<uint64_t>& per_plan, size_t width) const {
    const auto names = profile_names_.find(n_tokens);
    if (names == profile_names_.end()) return per_plan;  // no fused node: the plan's nodes are the builder's
    const graph::Graph g = c_.build_graph(n_tokens, false, false);
    std::vector<uint64_t> out(g.nodes().size() * width, 0);
    for (size_t i = 0; i < names->second.size() && (i + 1) * width <= per_plan.size(); ++i) {
      const int src = g.find_node(names->second[i]);
      if (src < 0) continue;
      for (size_t j = 0; j < width; ++j) out[static_cast<size_t>(src) * width + j] += per_plan[i * width + j];
    }
    return out;
  }

  backend::SessionConfig c_;
  CpuBackend backend_;
  // A sequence slot's state: its KV cache and its recurrent states (one vector per layer, stable addresses: a
  // std::deque never moves its elements), bound to every plan of the slot.
  struct Slot {
    std::unique_ptr<KvCache> kv;
    std::deque<std::vector<uint8_t>> states;
    std::vector<StateBinding> bindings;
  };
  std::deque<Slot> slots_;                                                     // per slot
  std::map<std::tuple<int64_t, bool, int64_t>, std::unique_ptr<Plan>> plans_;  // by (tokens, all, slot)
  std::map<int64_t, std::vector<std::string>> profile_names_;  // by chunk size, where the plan has fused nodes: the
                                                               // builder node each plan node's time is reported under
  std::map<int64_t, std::vector<uint64_t>> profile_;           // by chunk size
  std::map<int64_t, std::vector<uint64_t>> spans_;             // by chunk size: the last run's
  bool profiling_ = false;
  NodeTap tap_;
  int64_t vocab_ = 0;
};

class CpuBackendEntry : public backend::Backend {
 public:
  std::string_view name() const override { return "cpu"; }
  bool available(std::string*) const override { return true; }
  backend::Capabilities capabilities() const override {
    backend::Capabilities c;
    c.reference_mode = true;
    return c;
  }
  bool supports(const graph::Node& node, const graph::Graph& g) const override {
    return CpuBackend::reject_reason(node, g, /*reference=*/false) == nullptr;
  }
  bool native_weight_format(DType dtype) const override { return matmul_supports(dtype); }
  std::shared_ptr<backend::WeightStore> make_weight_store() const override {
    return std::make_shared<CpuWeightStore>();
  }
  std::unique_ptr<backend::DeviceSession> open(const backend::SessionConfig& config,
                                               std::shared_ptr<backend::WeightStore> weights) const override {
    auto* store = dynamic_cast<CpuWeightStore*>(weights.get());
    TESSERA_CHECK(store != nullptr, "cpu backend: the weight store was made by another backend");
    return std::make_unique<CpuSession>(config, store->cache);
  }
  backend::Ceilings measure_ceilings(const backend::CeilingsRequest&) const override {
    fail("cpu backend: the host's ceilings are measured by tessera::measure_ceilings");
  }
};

}  // namespace

const backend::Backend& cpu_backend() {
  static const CpuBackendEntry b;
  return b;
}

}  // namespace tessera::cpu
