// The TEAL rewrite (sparsify.h).
#include "graph/passes/sparsify.h"

#include <unordered_map>

#include "core/error.h"

namespace tessera::graph {

std::string_view sparse_input_name(SparseInput s) {
  switch (s) {
    case SparseInput::QKV:
      return "qkv";
    case SparseInput::O:
      return "o";
    case SparseInput::GATE_UP:
      return "gate_up";
    case SparseInput::DOWN:
      return "down";
    default:
      return "?";
  }
}

SparseInput sparse_input_of(Role r) {
  switch (r) {
    case Role::ATTN_Q:
    case Role::ATTN_K:
    case Role::ATTN_V:
      return SparseInput::QKV;
    case Role::ATTN_O:
      return SparseInput::O;
    case Role::FFN_GATE:
    case Role::FFN_UP:
      return SparseInput::GATE_UP;
    case Role::FFN_DOWN:
      return SparseInput::DOWN;
    default:
      return SparseInput::COUNT;
  }
}

Graph sparsify(const Graph& g, const SparsifyOptions& o) {
  if (!o.active() || (g.n_tokens() != 1 && !o.all_rows)) return g;
  std::vector<Tensor> tensors = g.tensors();
  std::vector<Node> nodes;
  nodes.reserve(g.nodes().size() + g.nodes().size() / 4);
  std::unordered_map<int, int> sparse_of;  // input tensor -> its sparsified tensor
  const bool swap = o.sparse_matmul && g.n_tokens() == 1;
  std::vector<int> moved(g.nodes().size(), -1);  // g's node i is nodes[moved[i]]
  for (const Node& src : g.nodes()) {
    Node n = src;
    const SparseInput which = sparse_input_of(n.role);
    if (n.op == Op::MATMUL && which != SparseInput::COUNT && n.layer >= 0) {
      const int x = n.inputs[0];
      auto it = sparse_of.find(x);
      if (it == sparse_of.end()) {
        Node s;
        s.name = tensors[static_cast<size_t>(x)].name + ".sparse";
        s.op = Op::SPARSIFY;
        s.role = n.role;  // the first reader's role: sparse_input_of(role) names the input (calibration keys on it)
        s.layer = n.layer;
        s.block = n.block;
        s.inputs = {x};
        if (!o.thresholds.empty()) {
          TESSERA_CHECK(static_cast<size_t>(n.layer) < o.thresholds.size(),
                        "sparsify: the thresholds cover {} layers; the model has layer {}", o.thresholds.size(),
                        n.layer);
          s.params.sparse_threshold = o.thresholds[static_cast<size_t>(n.layer)][static_cast<size_t>(which)];
        } else {
          s.params.sparsity = o.sparsity;
        }
        Tensor out;
        out.name = s.name;
        out.shape = tensors[static_cast<size_t>(x)].shape;
        s.output = static_cast<int>(tensors.size());
        Node checked = s;
        tensors.push_back(out);
        op_info(Op::SPARSIFY).infer(g, checked, tensors.back());  // the shape check and cost (x is a tensor of g)
        checked.source = static_cast<int>(nodes.size());          // a node of this graph's own, as a builder's
        nodes.push_back(std::move(checked));
        it = sparse_of.emplace(x, s.output).first;
      }
      n.inputs[0] = it->second;
      if (swap) n.op = Op::MATMUL_SPARSE;
    }
    moved[static_cast<size_t>(&src - g.nodes().data())] = static_cast<int>(nodes.size());
    nodes.push_back(std::move(n));
  }
  // Node::source indexes the graph a backend is given, which is this one: the inserted SPARSIFY nodes shift every
  // later node (before the twenty-fourth session they kept g's indices, so CUDA's profile and drop_ops named the
  // wrong nodes under TEAL).
  for (Node& n : nodes)
    if (n.op != Op::SPARSIFY && n.source >= 0 && static_cast<size_t>(n.source) < moved.size())
      n.source = moved[static_cast<size_t>(n.source)];
  for (size_t i = 0; i < nodes.size(); ++i)
    tensors[static_cast<size_t>(nodes[i].output)].producer = static_cast<int>(i);
  Graph r = g;
  r.replace_contents(std::move(tensors), std::move(nodes));
  return r;
}

}  // namespace tessera::graph
