#include "api/model_impl.h"
#include "core/error.h"
#include "graph/printer.h"
#include "models/model_graph.h"

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
std::string GraphView::format(std::string_view format) const { return graph::format_graph(impl_->graph, format); }

GraphView build_graph(const Model& model, int64_t n_tokens, int64_t n_past, const GraphOptions& options) {
  TESSERA_CHECK(model.loaded(), "no model is loaded");
  TESSERA_CHECK(n_tokens > 0, "the token count must be positive (got {})", n_tokens);
  TESSERA_CHECK(n_past >= 0, "the position must not be negative (got {})", n_past);
  DType kv = DType::F16;
  if (options.kv_dtype == "f32") kv = DType::F32;
  else TESSERA_CHECK(options.kv_dtype == "f16", "kv cache type '{}' is not supported (f16 or f32)", options.kv_dtype);
  return make_graph_view(build_model_graph(model.impl()->weights, ModelGraphOptions{.n_tokens = n_tokens,
                                                                                    .n_past = n_past,
                                                                                    .n_ctx = options.n_ctx,
                                                                                    .kv_dtype = kv,
                                                                                    .all_logits = options.all_logits}));
}

}  // namespace tessera
