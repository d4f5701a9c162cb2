// Rewriter: what the graph passes (fuse.cpp, chain.cpp) build a rewritten graph with. Source nodes are kept, skipped
// or replaced by new ones, in order; a replaced tensor's readers read its replacement. Tensors keep the source's ids
// while building (new ones are appended); finish() drops the outputs of skipped nodes and renumbers.
#pragma once

#include <unordered_map>
#include <utility>
#include <vector>

#include "graph/graph.h"

namespace tessera::graph {

class Rewriter {
 public:
  explicit Rewriter(const Graph& g) : g_(g), tensors_(g.tensors()), skip_(g.nodes().size(), false) {}

  const Graph& source() const { return g_; }
  void skip(int node) { skip_[static_cast<size_t>(node)] = true; }
  bool skipped(int node) const { return skip_[static_cast<size_t>(node)]; }
  // Readers of `from` read `to` from now on (a node emitted later).
  void replace(int from, int to) { repl_[from] = to; }
  int resolve(int t) const {
    for (auto it = repl_.find(t); it != repl_.end(); it = repl_.find(t)) t = it->second;
    return t;
  }
  // Emits source node i unchanged (inputs resolved). Returns its position.
  int keep(int i) {
    Node n = g_.node(i);
    for (int& t : n.inputs) t = resolve(t);
    if (n.fusion.norm_weight >= 0) n.fusion.norm_weight = resolve(n.fusion.norm_weight);
    if (n.fusion.residual >= 0) n.fusion.residual = resolve(n.fusion.residual);
    return push(std::move(n));
  }
  // Emits a new node whose output is a new tensor `out` (its producer is set here). Returns the output tensor id.
  int add(Node n, Tensor out) {
    out.producer = -2;  // set in finish()
    out.kind = TensorKind::ACTIVATION;
    n.output = static_cast<int>(tensors_.size());
    tensors_.push_back(std::move(out));
    for (int& t : n.inputs) t = resolve(t);
    if (n.fusion.norm_weight >= 0) n.fusion.norm_weight = resolve(n.fusion.norm_weight);
    if (n.fusion.residual >= 0) n.fusion.residual = resolve(n.fusion.residual);
    const int out_id = n.output;
    push(std::move(n));
    return out_id;
  }
  Graph finish();

 private:
  int push(Node n) {
    nodes_.push_back(std::move(n));
    return static_cast<int>(nodes_.size() - 1);
  }
  const Graph& g_;
  std::vector<Tensor> tensors_;
  std::vector<Node> nodes_;
  std::vector<bool> skip_;
  std::unordered_map<int, int> repl_;
};

}  // namespace tessera::graph
