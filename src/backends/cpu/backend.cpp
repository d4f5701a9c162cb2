// Plan compilation: weight preparation, activation memory planning, cache binding.
#include "backends/cpu/backend.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>

#include "backends/cpu/op_kernel.h"
#include "backends/cpu/plan_step.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "graph/passes/fuse.h"
#include "graph/passes/memory_plan.h"
#include "quant/half.h"
#include "quant/quant.h"

namespace tessera::cpu {

using graph::Op;
using graph::Tensor;
using graph::TensorKind;

// ---------------------------------------------------------------------------------------------------------------------
// WeightCache

const PackedWeight& WeightCache::get(const Tensor& w) {
  TESSERA_CHECK(w.kind == TensorKind::WEIGHT && w.shape.size() == 2 && w.data != nullptr,
                "cpu backend: '{}' is not a bound 2-D weight", w.name);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(w.data);
  if (it != map_.end()) return *it->second;
  const int64_t n = w.shape[0], k = w.shape[1];
  DType dtype = w.dtype;
  const void* data = w.data;
  const FormatSupport& formats = matmul_formats();
  if (!formats.is_native(dtype)) {
    // No kernel reads this format: keep it usable (slower, 2 bytes per weight) rather than refuse the model.
    const std::optional<DType> as = formats.runs_as(dtype);
    TESSERA_CHECK(as.has_value(), "cpu backend: weight '{}' is {}, which Tessera cannot read; {}", w.name,
                  dtype_name(dtype), formats.summary());
    auto copy = std::make_shared<std::vector<uint8_t>>(*dtype_row_bytes(*as, static_cast<uint64_t>(n * k)));
    convert_rows(dtype, w.data, *as, copy->data(), n, k);
    notices_.note(formats, w.name, dtype);
    bytes_ += copy->size();
    data = copy->data();
    dtype = *as;
    converted_.push_back(std::move(copy));
  }
  auto pw = std::make_unique<PackedWeight>(prepare_weight(dtype, data, n, k));
  if (pw->packed != nullptr) release_mapped_pages(w.data, w.nbytes());  // the kernels read the copy: drop the file's
  bytes_ += pw->packed_bytes;
  return *map_.emplace(w.data, std::move(pw)).first->second;
}

const SparseWeight* WeightCache::get_sparse(const Tensor& w) {
  const PackedWeight& pw = get(w);  // the dense copy: converted formats are read as their fallback
  std::lock_guard<std::mutex> lock(mu_);
  if (!sparse_matmul_supports(pw.dtype)) {
    // Say once per format why sparsity buys nothing here (a CPU without AVX2 runs every format dense: no notice).
    if (active_isa() >= Isa::AVX2 && dense_sparse_.insert(pw.dtype).second)
      std::fprintf(stderr,
                   "tessera: %s weights have no sparse (TEAL) kernel on the CPU: their matmuls run the dense kernel on "
                   "the sparsified input (docs/TEAL.md)\n",
                   std::string(dtype_name(pw.dtype)).c_str());
    return nullptr;
  }
  auto it = sparse_.find(w.data);
  if (it != sparse_.end()) return it->second.get();
  auto sw = std::make_unique<SparseWeight>(prepare_sparse_weight(pw.dtype, pw.rows, pw.n, pw.k));
  bytes_ += sw->bytes;
  return sparse_.emplace(w.data, std::move(sw)).first->second.get();
}

const LoraWeights& WeightCache::get_lora(const std::vector<std::pair<const Tensor*, const Tensor*>>& adapters,
                                         const PackedWeight& base) {
  const int64_t n = base.n, k = base.k;
  // The base's kernel quantizes x to 8 bits (matmul.cpp): the adapters then run in 8 bits too (kernels/lora.h).
  const bool q8 = matmul_formats().is_native_quantized(base.dtype);
  std::vector<const void*> key{q8 ? &base : nullptr};
  for (const auto& [a, b] : adapters)
    for (const Tensor* w : {a, b}) {
      TESSERA_CHECK(w->kind == TensorKind::WEIGHT && w->shape.size() == 2 && w->data != nullptr &&
                        can_dequantize(w->dtype) && w->shape[1] % dtype_info(w->dtype).block_size == 0,
                    "cpu backend: '{}' is not a bound 2-D weight in a format the CPU reads", w->name);
      key.push_back(w->data);
    }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = lora_.find(key);
  if (it != lora_.end()) return *it->second;
  // Factors in f32 or f16 as they are; any other format the CPU reads, dequantized to f32 for the conversion.
  std::vector<std::vector<float>> f32;
  const auto as_factor = [&](const Tensor& w, DType* dtype) -> const void* {
    *dtype = w.dtype;
    if (w.dtype == DType::F32 || w.dtype == DType::F16) return w.data;
    *dtype = DType::F32;
    std::vector<float>& v = f32.emplace_back(static_cast<size_t>(w.numel()));
    convert_rows(w.dtype, w.data, DType::F32, v.data(), w.shape[0], w.shape[1]);
    return v.data();
  };
  std::vector<LoraFactor> factors;
  for (const auto& [a, b] : adapters) {
    LoraFactor f;
    f.r = a->shape[0];
    f.a = as_factor(*a, &f.a_dtype);
    f.b = as_factor(*b, &f.b_dtype);
    factors.push_back(f);
  }
  auto l = std::make_unique<LoraWeights>(make_lora_weights(factors, n, k, q8));
  bytes_ += l->bytes();
  return *lora_.emplace(std::move(key), std::move(l)).first->second;
}

uint64_t WeightCache::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

// ---------------------------------------------------------------------------------------------------------------------
// Plan

Plan::Plan() = default;

Plan::~Plan() {
  if (arena_ != nullptr) ::operator delete (arena_, std::align_val_t{64});
}

void* Plan::input(std::string_view name) {
  for (const auto& [n, id] : input_ids_)
    if (n == name) return static_cast<uint8_t*>(arena_) + offsets_[static_cast<size_t>(id)];
  fail("plan: the graph has no input named '{}'", name);
}

const float* Plan::output(std::string_view name) const {
  const int id = graph_.find_tensor(name);
  TESSERA_CHECK(id >= 0 && offsets_[static_cast<size_t>(id)] >= 0 && graph_.tensor(id).dtype == DType::F32,
                "plan: '{}' is not an f32 activation of the graph", name);
  return reinterpret_cast<const float*>(static_cast<const uint8_t*>(arena_) + offsets_[static_cast<size_t>(id)]);
}

void* Plan::input(graph::IoRole role) {
  const int id = graph_.require_role(role);
  TESSERA_CHECK(graph_.tensor(id).kind == TensorKind::INPUT && offsets_[static_cast<size_t>(id)] >= 0,
                "plan: the {} tensor is not an input", graph::io_role_name(role));
  return static_cast<uint8_t*>(arena_) + offsets_[static_cast<size_t>(id)];
}

const float* Plan::output(graph::IoRole role) const { return output(graph_.tensor(graph_.require_role(role)).name); }

// ---------------------------------------------------------------------------------------------------------------------
// Compilation

CpuBackend::CpuBackend(const BackendOptions& options, std::shared_ptr<WeightCache> weights)
    : options_(options), weights_(std::move(weights)), pool_(options.n_threads) {
  if (options.isa) set_active_isa(*options.isa);
  if (!weights_) weights_ = std::make_shared<WeightCache>();
}

bool CpuBackend::supports(const graph::Node& n, const graph::Graph& g) const { return reject_reason(n, g) == nullptr; }

const char* CpuBackend::reject_reason(const graph::Node& n, const graph::Graph& g) const {
  return reject_reason(n, g, options_.reference);
}

const char* CpuBackend::reject_reason(const graph::Node& n, const graph::Graph& g, bool reference) {
  const auto in = [&](size_t i) -> const Tensor& { return g.tensor(n.inputs.at(i)); };
  const auto inputs_ok = [](bool ok) -> const char* { return ok ? nullptr : "is not supported with these inputs"; };
  // The CPU declares one fusion, fast mode only (cpu_fusion_support): a matmul with its LoRA adapters. A matmul by a
  // folded weight (the chain rewrite's, also fast mode only) is a plain matmul, in either mode.
  const bool folded = n.op == Op::MATMUL && n.fusion.names_only() && n.inputs.size() == 2;
  if (!n.fusion.empty() && !folded) {
    const graph::Fusion& f = n.fusion;
    const bool lora_only = !reference && n.op == Op::MATMUL && f.lora > 0 && f.n_weights == 1 && f.norm_weight < 0 &&
                           f.residual < 0 && !f.swiglu && f.norm_out < 0 &&
                           n.inputs.size() == 2 + 2 * static_cast<size_t>(f.lora);
    if (!lora_only) return "is a fused node the CPU backend does not declare";
    for (size_t i = 2; i < n.inputs.size(); ++i)
      if (!can_dequantize(in(i).dtype) || in(i).shape[1] % dtype_info(in(i).dtype).block_size != 0)
        return "is not supported with these inputs";
    if (!matmul_supports(in(1).dtype) && !can_dequantize(in(1).dtype)) return "is not supported with these inputs";
    return nullptr;
  }
  switch (n.op) {
    case Op::EMBED:
      return inputs_ok(can_dequantize(in(0).dtype) && in(0).shape[1] % dtype_info(in(0).dtype).block_size == 0);
    case Op::MATMUL:
    case Op::MATMUL_SPARSE:
      if (reference || !matmul_supports(in(1).dtype))
        return inputs_ok(can_dequantize(in(1).dtype) && in(1).shape[1] % dtype_info(in(1).dtype).block_size == 0);
      return nullptr;
    case Op::RMSNORM:
    case Op::ROPE:
    case Op::ADD:
    case Op::SWIGLU:
    case Op::LAST_ROW:
      return nullptr;
    case Op::KV_STORE:
    case Op::ATTENTION: {
      const DType d = in(1).dtype;
      return inputs_ok(d == DType::F16 || d == DType::F32);
    }
    default: {
      // No dedicated step: the op's registered kernel (op_kernel.h, backends/cpu/ops/<op>.cpp) runs it, if it has one.
      const OpKernel* k = find_op_kernel(n.op);
      if (k == nullptr || graph::is_view(n.op)) return "has no CPU kernel";
      return inputs_ok(k->supports == nullptr || k->supports(n, g));
    }
  }
}

namespace {

// Arena blocks start on cache lines: the SIMD kernels' aligned loads and no false sharing between threads' rows.
constexpr uint64_t kAlign = 64;

}  // namespace

graph::FusionSupport cpu_fusion_support(bool reference) {
  graph::FusionSupport f;
  if (reference) return f;
  f.chain_orders = graph::ChainCostModel{};
  f.weight_values = [](const Tensor& w) {  // empty for a format the CPU cannot read: the chain stays as built
    return w.shape.size() == 2 ? dequantize_matrix(w.dtype, w.data, w.shape[0], w.shape[1]) : std::vector<float>{};
  };
  f.lora_epilogue = true;
  return f;
}

std::unique_ptr<Plan> CpuBackend::compile(const graph::Graph& g, const std::vector<StateBinding>& state) {
  auto plan = std::make_unique<Plan>();
  // The passes verify the rewrite in either mode (cpu_fusion_support).
  plan->graph_ = graph::run_passes(g, cpu_fusion_support(options_.reference));
  const graph::Graph& pg = plan->graph_;
  for (const graph::Node& n : pg.nodes()) {
    const char* why = reject_reason(n, pg);
    TESSERA_CHECK(why == nullptr, "cpu backend: node '{}' ({}) {}", n.name, graph::op_name(n.op), why);
  }
  const graph::MemoryPlan mp = graph::plan_memory(pg, graph::MemoryPlanOptions{.alignment = kAlign});
  plan->offsets_ = mp.offsets;
  plan->arena_bytes_ = std::max<uint64_t>(mp.total, kAlign);
  plan->arena_ = ::operator new (plan->arena_bytes_, std::align_val_t{64});
  uint8_t* arena = static_cast<uint8_t*>(plan->arena_);
  for (size_t i = 0; i < pg.tensors().size(); ++i) {
    if (pg.tensors()[i].kind != TensorKind::INPUT) continue;
    plan->input_ids_.emplace_back(pg.tensors()[i].name, static_cast<int>(i));
    // Inputs start zeroed so a caller that forgets one reads valid ids (0), never garbage.
    std::memset(arena + mp.offsets[i], 0, pg.tensors()[i].nbytes());
  }

  // KV caches: bound by role and layer to the session's storage.
  std::unordered_map<int, KvView> caches;
  for (size_t i = 0; i < pg.tensors().size(); ++i) {
    const Tensor& t = pg.tensors()[i];
    if (t.kind != TensorKind::KV_CACHE) continue;
    void* data = nullptr;
    for (const StateBinding& b : state)
      if (t.io != graph::IoRole::NONE && b.role == t.io && b.layer == t.io_layer) data = b.data;
    TESSERA_CHECK(data != nullptr, "cpu backend: kv cache '{}' is not bound to any storage", t.name);
    // A recurrent state (IoRole::STATE, MLGRU) is a flat vector its op's kernel reads and writes whole.
    caches[static_cast<int>(i)] = t.shape.size() == 3 ? kv_head_major(t.dtype, data, t.shape[1], t.shape[0], t.shape[2])
                                                      : KvView{.dtype = t.dtype, .data = data};
  }
  const auto act = [&](int id) -> float* {
    const int64_t off = mp.offsets[static_cast<size_t>(id)];
    TESSERA_CHECK(off >= 0, "cpu backend: tensor '{}' has no storage", pg.tensor(id).name);
    return reinterpret_cast<float*>(arena + off);
  };
  const auto cache_of = [&](int id) {
    const Tensor& t = pg.tensor(id);
    const int root = t.alias >= 0 ? t.alias : id;
    auto it = caches.find(root);
    TESSERA_CHECK(it != caches.end(), "cpu backend: '{}' is not a kv cache", t.name);
    return it->second;
  };

  for (size_t i = 0; i < pg.nodes().size(); ++i) {
    const graph::Node& n = pg.nodes()[i];
    const auto in = [&](size_t j) -> const Tensor& { return pg.tensor(n.inputs[j]); };
    Plan::Step s;
    s.op = n.op;
    s.node = static_cast<int>(i);
    s.p = n.params;
    if (n.op != Op::KV_STORE) s.y = act(n.output);
    switch (n.op) {
      case Op::EMBED:
        s.w_dtype = in(0).dtype;
        s.w_raw = in(0).data;
        TESSERA_CHECK(s.w_raw != nullptr, "cpu backend: embedding '{}' has no data", in(0).name);
        s.ids = reinterpret_cast<const int32_t*>(act(n.inputs[1]));
        s.n = in(0).shape[0];
        s.k = in(0).shape[1];
        s.t = in(1).shape[0];
        break;
      case Op::RMSNORM:
        s.a = act(n.inputs[0]);
        s.wf = static_cast<const float*>(in(1).data);
        TESSERA_CHECK(s.wf != nullptr, "cpu backend: norm weight '{}' has no data", in(1).name);
        s.t = in(0).shape[0];
        s.k = in(0).shape[1];
        break;
      case Op::MATMUL:
      case Op::MATMUL_SPARSE:
        s.a = act(n.inputs[0]);
        s.w_dtype = in(1).dtype;
        s.w_raw = in(1).data;
        TESSERA_CHECK(s.w_raw != nullptr, "cpu backend: weight '{}' has no data", in(1).name);
        if (!options_.reference && pg.owns(s.w_raw)) {
          plan->own_weights_.push_back(
              std::make_unique<PackedWeight>(prepare_weight(s.w_dtype, s.w_raw, in(1).shape[0], in(1).shape[1])));
          s.w = plan->own_weights_.back().get();
        } else if (!options_.reference) {
          s.w = &weights_->get(in(1));
        }
        // The walk only with BackendOptions::teal_walk, and where the ISA has a sparse kernel for the format; else the
        // dense kernel on the zeroed x, the same values.
        if (!options_.reference && options_.teal_walk && n.op == Op::MATMUL_SPARSE)
          s.sw = weights_->get_sparse(in(1));
        s.t = in(0).shape[0];
        s.n = in(1).shape[0];
        s.k = in(1).shape[1];
        if (n.fusion.lora > 0) {
          auto lora = std::make_unique<Plan::Lora>();
          std::vector<std::pair<const Tensor*, const Tensor*>> adapters;
          for (int i = 0; i < n.fusion.lora; ++i)
            adapters.emplace_back(&in(2 + 2 * static_cast<size_t>(i)), &in(3 + 2 * static_cast<size_t>(i)));
          lora->weights = &weights_->get_lora(adapters, *s.w);
          lora->u.assign(static_cast<size_t>(s.t * lora->weights->r), 0.0f);
          s.lora = lora.get();
          plan->loras_.push_back(std::move(lora));
        }
        break;
      case Op::ROPE:
        s.a = act(n.inputs[0]);
        s.copy_a = mp.in_place_input[i] != n.inputs[0];
        s.ids = reinterpret_cast<const int32_t*>(act(n.inputs[1]));
        s.wf = static_cast<const float*>(in(2).data);
        s.t = in(0).shape[0];
        s.k = in(0).shape[1];
        break;
      case Op::KV_STORE:
        s.a = act(n.inputs[0]);
        s.kv_k = cache_of(n.inputs[1]);
        s.t = in(0).shape[0];
        break;
      case Op::ATTENTION:
        s.a = act(n.inputs[0]);
        s.kv_k = cache_of(n.inputs[1]);
        s.kv_v = cache_of(n.inputs[2]);
        s.t = in(0).shape[0];
        break;
      case Op::ADD:
        // The kernel computes y += x: with y in input 1's storage the operands swap (addition commutes).
        s.a = act(n.inputs[0]);
        s.b = act(n.inputs[1]);
        if (mp.in_place_input[i] == n.inputs[1]) std::swap(s.a, s.b);
        s.copy_a = mp.in_place_input[i] < 0;
        s.t = in(0).shape[0];
        s.n = in(0).numel() / std::max<int64_t>(s.t, 1);
        break;
      case Op::SWIGLU:  // the kernel may write over gate or up
        s.a = act(n.inputs[0]);
        s.b = act(n.inputs[1]);
        s.t = in(0).shape[0];
        s.n = in(0).numel() / std::max<int64_t>(s.t, 1);
        break;
      case Op::LAST_ROW:
        s.a = act(n.inputs[0]);
        s.t = in(0).shape[0];
        s.k = in(0).shape[1];
        break;
      default: {  // an op with no dedicated step: its registered kernel (supports() checked it has one)
        auto call = std::make_unique<OpCall>();
        call->node = &n;
        for (int id : n.inputs) {
          const Tensor& t = pg.tensor(id);
          call->in_tensors.push_back(&t);
          if (t.kind == TensorKind::WEIGHT) {
            TESSERA_CHECK(t.data != nullptr, "cpu backend: weight '{}' has no data", t.name);
            call->in.push_back(t.data);
          } else if (t.kind == TensorKind::KV_CACHE || t.alias >= 0) {
            call->in.push_back(cache_of(id).data);
          } else {
            call->in.push_back(act(id));
          }
        }
        call->out_tensor = &pg.tensor(n.output);
        call->out = s.y;
        s.kernel = find_op_kernel(n.op)->run;
        s.call = call.get();
        s.t = pg.n_tokens();
        plan->calls_.push_back(std::move(call));
        break;
      }
    }
    plan->steps_.push_back(s);
  }
  return plan;
}

}  // namespace tessera::cpu
