#include <fmt/core.h>

#include "api/model_impl.h"
#include "backends/backend.h"
#include "core/error.h"
#include "graph/passes/chain.h"
#include "graph/passes/sparsify.h"
#include "graph/printer.h"
#include "models/llama.h"
#include "models/model_graph.h"
#include "runtime/session.h"
#include "tessera/calibrate.h"
#include "tessera/random_model.h"

namespace tessera {

GraphView make_graph_view(graph::Graph g) {
  auto impl = std::make_shared<GraphView::Impl>();
  impl->graph = std::move(g);
  const graph::Graph& gr = impl->graph;
  for (size_t i = 0; i < gr.nodes().size(); ++i) {
    const graph::Node& n = gr.nodes()[i];
    GraphNode v;
    v.id = static_cast<int>(i);
    v.name = n.name;
    v.op = graph::op_name(n.op);
    v.op_class = graph::op_class(n.op);
    v.role = graph::role_name(n.role);
    v.block = n.block;
    v.layer = n.layer;
    for (int t : n.inputs) {
      const graph::Tensor& x = gr.tensor(t);
      v.inputs.push_back(x.name);
      v.input_shapes.push_back(x.shape);
      v.input_dtypes.emplace_back(dtype_name(x.dtype));
    }
    const graph::Tensor& o = gr.tensor(n.output);
    v.shape = o.shape;
    v.dtype = dtype_name(o.dtype);
    v.flops = n.flops;
    v.bytes = n.bytes;
    v.fused_from = n.fusion.fused_from;
    v.source = n.source;
    impl->nodes.push_back(std::move(v));
  }
  const graph::Totals t = gr.totals();
  GraphTotals& pt = impl->totals;
  pt.nodes = t.nodes;
  pt.flops = t.flops;
  pt.bytes = t.bytes;
  pt.matmul_flops = t.matmul_flops;
  pt.matmul_bytes = t.matmul_bytes;
  pt.weight_bytes = t.weight_bytes;
  pt.matmul_flop_share = t.matmul_flop_share();
  pt.matmul_byte_share = t.matmul_byte_share();
  for (const auto& c : t.by_class) pt.by_op_class.push_back({c.op_class, c.nodes, c.flops, c.bytes});
  return GraphView(std::move(impl));
}

GraphView::GraphView() : impl_(std::make_shared<Impl>()) {}
GraphView::GraphView(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
GraphView::~GraphView() = default;
GraphView::GraphView(const GraphView&) = default;
GraphView& GraphView::operator=(const GraphView&) = default;

int64_t GraphView::n_tokens() const { return impl_->graph.n_tokens(); }
int64_t GraphView::n_past() const { return impl_->graph.n_past(); }
const std::vector<GraphNode>& GraphView::nodes() const { return impl_->nodes; }
const GraphTotals& GraphView::totals() const { return impl_->totals; }
std::string GraphView::format(std::string_view format) const { return this->format(format, GraphRender{}); }

std::string GraphView::format(std::string_view format, const GraphRender& r) const {
  const graph::Graph& g = impl_->graph;
  if (format == "chains") return graph::format_chains(g);
  if (format != "svg" && format != "html") return graph::format_graph(g, format);
  const size_t n = g.nodes().size();
  TESSERA_CHECK(r.node_ms.empty() || r.node_ms.size() == n, "the profile has {} node times for a graph of {} nodes",
                r.node_ms.size(), n);
  TESSERA_CHECK(r.node_roof.empty() || r.node_roof.size() == n,
                "the profile has {} roofline fractions for a graph of {} nodes", r.node_roof.size(), n);
  graph::RenderOptions o;
  o.node_ms = r.node_ms;
  o.node_roof = r.node_roof;
  o.wall_ms = r.wall_ms;
  o.profile = r.profile;
  o.note = r.note;
  o.full_first = r.full_first;
  o.full_last = r.full_last;
  o.collapse_others = r.collapse_others;
  return format == "svg" ? graph::to_svg(g, o) : graph::to_html(g, o);
}

std::string GraphView::format_chains(std::string_view device) const {
  if (device.empty() || device == "cpu") return graph::format_chains(impl_->graph);
  const backend::Backend* b = backend::find_compiled(device);
  if (b == nullptr && device == "cuda")
    fail("device 'cuda': this build of Tessera has no CUDA backend (nvcc was not found at configure time)");
  if (b == nullptr) fail("device '{}' is not supported", device);
  return fmt::format("as the {} backend's chain pass weighs them\n", device) +
         graph::format_chains(impl_->graph, b->chain_cost_model());
}

namespace {

// The builder's graph as `device`'s graph passes rewrite it; the backend need only be compiled in, not runnable here.
GraphView rewrite_view(const GraphView& v, const std::string& device) {
  const backend::Backend* b = backend::find_compiled(device);
  if (b == nullptr && device == "cuda")
    fail(
        "device 'cuda': this build of Tessera has no CUDA backend (nvcc was not found at configure time), so its "
        "graph passes cannot be shown");
  if (b == nullptr) {
    std::string list;
    for (const std::string& name : backend::names()) list += (list.empty() ? "" : " or ") + name;
    fail("device '{}' is not supported ({})", device, list);
  }
  return make_graph_view(b->rewrite_for_display(v.impl().graph));
}

// TEAL's rewrite as a session with these options runs it (runtime::Engine::build_graph); `model` null: a preset, which
// has no thresholds file of its own.
graph::SparsifyOptions sparsify_options(const GraphOptions& o, const Model* model) {
  runtime::check_teal_options(o.sparsity, o.teal);
  graph::SparsifyOptions so;
  so.sparsity = o.sparsity;
  if (!o.teal.empty()) {
    TESSERA_CHECK(model != nullptr,
                  "--teal names a model's thresholds file: give the model (-m FILE), or --sparsity for a preset");
    so.thresholds = load_teal_thresholds(*model, o.teal);
  }
  return so;
}

}  // namespace

GraphView build_graph(const Model& model, int64_t n_tokens, int64_t n_past, const GraphOptions& options) {
  TESSERA_CHECK(model.loaded(), "no model is loaded");
  TESSERA_CHECK(n_tokens > 0, "the token count must be positive (got {})", n_tokens);
  TESSERA_CHECK(n_past >= 0, "the position must not be negative (got {})", n_past);
  if (!options.device.empty()) {
    GraphOptions builder = options;
    builder.device.clear();
    return rewrite_view(build_graph(model, n_tokens, n_past, builder), options.device);
  }
  const std::shared_ptr<const LoraSet> lora = model.impl()->lora_set(options.lora, options.lora_merge, DType::F16);
  DType kv = DType::F16;
  if (options.kv_dtype == "f32")
    kv = DType::F32;
  else
    TESSERA_CHECK(options.kv_dtype == "f16", "kv cache type '{}' is not supported (f16 or f32)", options.kv_dtype);
  const graph::SparsifyOptions so = sparsify_options(options, &model);
  return make_graph_view(
      graph::sparsify(build_model_graph(model.impl()->weights, ModelGraphOptions{.n_tokens = n_tokens,
                                                                                 .n_past = n_past,
                                                                                 .n_ctx = options.n_ctx,
                                                                                 .kv_dtype = kv,
                                                                                 .all_logits = options.all_logits,
                                                                                 .lora = lora.get()}),
                      so));
}

GraphView build_preset_graph(const std::string& arch, const std::string& dtype, int64_t n_tokens, int64_t n_past,
                             const GraphOptions& options) {
  TESSERA_CHECK(n_tokens > 0, "the token count must be positive (got {})", n_tokens);
  TESSERA_CHECK(n_past >= 0, "the position must not be negative (got {})", n_past);
  const RandomModelPreset* preset = nullptr;
  for (const RandomModelPreset& p : random_model_presets())
    if (p.name == arch) preset = &p;
  for (const RandomModelPreset& p : random_model_hgrn_bit_presets())
    TESSERA_CHECK(p.name != arch,
                  "the MatMul-free LM preset '{}' has no weightless graph (its recurrent layers are built from its "
                  "tensors): write it with `tessera bench --arch {} --random-weights --write-model FILE` and pass -m "
                  "FILE",
                  arch, arch);
  if (preset == nullptr) {
    std::string list;
    for (const std::string& a : random_model_archs()) list += (list.empty() ? "" : ", ") + a;
    fail("unknown architecture preset '{}' (expected one of {})", arch, list);
  }
  const std::optional<DType> dt = dtype_from_name(dtype);
  TESSERA_CHECK(dt.has_value(), "unknown dtype '{}' for the preset's weights", dtype);
  DType kv = DType::F16;
  if (options.kv_dtype == "f32")
    kv = DType::F32;
  else
    TESSERA_CHECK(options.kv_dtype == "f16", "kv cache type '{}' is not supported (f16 or f32)", options.kv_dtype);
  const ModelSpec& s = preset->spec;
  ModelConfig c;
  c.architecture = s.architecture;
  c.name = s.name + " (preset, " + dtype + ")";
  c.n_layers = s.n_layers;
  c.n_embd = s.n_embd;
  c.n_head = s.n_head;
  c.n_head_kv = s.n_head_kv;
  c.head_dim = s.head_dim;
  c.n_ff = s.n_ff;
  c.n_vocab = s.n_vocab;
  c.n_ctx_train = s.n_ctx_train;
  c.rope_dim = s.head_dim;
  c.tied_output = s.tied_output;
  // Rope scaling changes only the inverse frequencies' values, which a display-only graph does not show.
  c.validate(arch);
  const int64_t E = c.n_embd, Q = c.n_head * c.head_dim, KV = c.n_head_kv * c.head_dim, F = c.n_ff;
  // The tensors write_random_model writes, with no data: the builder reads names, shapes and dtypes only.
  std::vector<TensorView> views;
  const auto add = [&views](std::string name, DType d, std::vector<int64_t> shape) {
    views.push_back(TensorView{std::move(name), d, std::move(shape), 0, 0, nullptr});
  };
  add("token_embd.weight", *dt, {c.n_vocab, E});
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    add(b + "attn_norm.weight", DType::F32, {E});
    add(b + "attn_q.weight", *dt, {Q, E});
    add(b + "attn_k.weight", *dt, {KV, E});
    add(b + "attn_v.weight", *dt, {KV, E});
    add(b + "attn_output.weight", *dt, {E, Q});
    add(b + "ffn_norm.weight", DType::F32, {E});
    add(b + "ffn_gate.weight", *dt, {F, E});
    add(b + "ffn_up.weight", *dt, {F, E});
    add(b + "ffn_down.weight", *dt, {E, F});
  }
  add("output_norm.weight", DType::F32, {E});
  if (!c.tied_output) add("output.weight", *dt, {c.n_vocab, E});
  const ModelWeights w = ModelWeights::from_views(c, std::move(views), c.name);
  // Presets are Llama-family architectures (random_model.h), so the Llama builder is theirs.
  const graph::SparsifyOptions so = sparsify_options(options, nullptr);
  GraphView v =
      make_graph_view(graph::sparsify(build_llama_graph(w, LlamaGraphOptions{.n_tokens = n_tokens,
                                                                             .n_past = n_past,
                                                                             .n_ctx = options.n_ctx,
                                                                             .kv_dtype = kv,
                                                                             .all_logits = options.all_logits}),
                                      so));
  return options.device.empty() ? v : rewrite_view(v, options.device);
}

}  // namespace tessera
