// Public API: the computation graph of a model, as the engine runs it. Every node has a name (blk.3.attn_q), an op,
// a role, input and output shapes and dtypes, FLOPs and bytes; totals are given per op class, with the share of
// FLOPs and bytes that are matmuls. Printable as text, JSON or Graphviz DOT.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

class Model;

struct GraphNode {
  int id = 0;
  std::string name;      // "blk.3.attn_q"
  std::string op;        // "matmul", "rmsnorm", "rope", "attention", ...
  std::string op_class;  // "matmul", "attention", "norm", "rope", "elementwise", "embedding", "kv_cache", "copy"
  std::string role;      // "attn_q", "ffn_down", "output", ...
  std::string block;     // "embd", "attn", "ffn", "output"
  int layer = -1;        // -1 outside the transformer blocks
  std::vector<std::string> inputs;               // tensor names (a node's output tensor has the node's name)
  std::vector<std::vector<int64_t>> input_shapes;
  std::vector<std::string> input_dtypes;
  std::vector<int64_t> shape;  // output, row-major
  std::string dtype;           // output
  uint64_t flops = 0;
  uint64_t bytes = 0;          // read + written, weights included
};

struct GraphOpClassTotal {
  std::string op_class;
  uint64_t nodes = 0, flops = 0, bytes = 0;
};

struct GraphTotals {
  uint64_t nodes = 0, flops = 0, bytes = 0;
  uint64_t matmul_flops = 0, matmul_bytes = 0;
  uint64_t weight_bytes = 0;
  double matmul_flop_share = 0, matmul_byte_share = 0;
  std::vector<GraphOpClassTotal> by_op_class;  // by FLOPs, descending
};

struct GraphOptions {
  int64_t n_ctx = 0;         // KV cache length shown; 0: n_past + n_tokens
  std::string kv_dtype = "f16";
  bool all_logits = false;   // logits for every token instead of the last
};

class GraphView {
 public:
  GraphView();
  ~GraphView();
  GraphView(const GraphView&);
  GraphView& operator=(const GraphView&);

  int64_t n_tokens() const;
  int64_t n_past() const;
  const std::vector<GraphNode>& nodes() const;
  const GraphTotals& totals() const;
  // "text", "json" or "dot"; Error otherwise.
  std::string format(std::string_view format) const;

  struct Impl;
  explicit GraphView(std::shared_ptr<const Impl> impl);
  const Impl& impl() const { return *impl_; }

 private:
  std::shared_ptr<const Impl> impl_;
};

// The graph of `model` for `n_tokens` tokens at position `n_past` (nothing is executed; weights are not read).
GraphView build_graph(const Model& model, int64_t n_tokens, int64_t n_past = 0, const GraphOptions& options = {});

}  // namespace tessera
