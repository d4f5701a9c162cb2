// Public API: the computation graph of a model, as the engine runs it. Every node has a name (blk.3.attn_q), an op,
// a role, input and output shapes and dtypes, FLOPs and bytes; totals are given per op class, with the share of
// FLOPs and bytes that are matmuls. Printable as text, JSON, Graphviz DOT, and as the model views: SVG (laid out by
// Graphviz) and a self-contained HTML page, optionally coloured by measured time per node (GraphRender).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/model.h"

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
  std::vector<std::string> inputs;  // tensor names (a node's output tensor has the node's name)
  std::vector<std::vector<int64_t>> input_shapes;
  std::vector<std::string> input_dtypes;
  std::vector<int64_t> shape;  // output, row-major
  std::string dtype;           // output
  uint64_t flops = 0;
  uint64_t bytes = 0;  // read + written, weights included
  // A node made by a backend's graph passes (GraphOptions::device): the builder's nodes it computes; empty otherwise.
  std::vector<std::string> fused_from;
  // The builder's node whose time a profile reports this node under (itself on a builder's graph); -1 for none.
  int source = -1;
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
  int64_t n_ctx = 0;  // KV cache length shown; 0: n_past + n_tokens
  std::string kv_dtype = "f16";
  bool all_logits = false;  // logits for every token instead of the last
  // "" or "cpu": the builder's graph (the CPU runs it unfused). "cuda": as the CUDA backend's graph passes rewrite it
  // (fused nodes; needs a build with CUDA, not a GPU).
  std::string device;
  // LoRA adapters shown in the graph (their x·Aᵀ·Bᵀ chains beside the base matmuls), or merged into the weights.
  std::vector<LoraSpec> lora;
  bool lora_merge = false;
  // TEAL (docs/TEAL.md) as a session with these options would run it: zero this share of every block matmul's input
  // per token (top-k), or the thresholds of a `tessera calibrate` file (a model's graph only: the file names its
  // model). In a one-token graph the matmuls reading a sparsified input become MATMUL_SPARSE.
  float sparsity = 0;
  std::string teal;
};

// What the model views (svg, html) show beyond the graph: measured time per node and the layers drawn in full.
struct GraphRender {
  std::vector<double> node_ms;        // per node (index = GraphNode::id); empty: no profile overlay
  std::vector<double> node_roof;      // fraction of this machine's roofline per node; empty or < 0: not measured
  double wall_ms = 0;                 // the measured step's wall time (the base of % of wall)
  std::string profile;                // one line saying what was measured
  std::string note;                   // one line under the title
  int full_first = 0, full_last = 0;  // svg: layers drawn in full (inclusive); others are one box each
  bool collapse_others = false;       // html: open with the layers outside that range collapsed (else all open)
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
  // "text", "json", "dot", "svg", "html" or "chains" (the matmul chains and their orders, graph/passes/chain.h);
  // Error otherwise (svg: also when Graphviz is missing).
  std::string format(std::string_view format) const;
  std::string format(std::string_view format, const GraphRender& render) const;
  // format("chains") under `device`'s ceilings ("cpu" or empty: the CPU's; "cuda": needs a build with CUDA, not a
  // GPU), on this view's graph (build it without GraphOptions::device: a device's view has its chains rewritten).
  std::string format_chains(std::string_view device) const;

  struct Impl;
  explicit GraphView(std::shared_ptr<const Impl> impl);
  const Impl& impl() const { return *impl_; }

 private:
  std::shared_ptr<const Impl> impl_;
};

// The graph of `model` for `n_tokens` tokens at position `n_past` (nothing is executed; weights are not read).
GraphView build_graph(const Model& model, int64_t n_tokens, int64_t n_past = 0, const GraphOptions& options = {});
// The graph of a synthetic model's preset (random_model_archs(), e.g. "llama3-8b") with matmul and embedding weights
// in `dtype`, without making the model: nothing is written or read, so a 32-layer graph is ready at once.
GraphView build_preset_graph(const std::string& arch, const std::string& dtype, int64_t n_tokens, int64_t n_past = 0,
                             const GraphOptions& options = {});

}  // namespace tessera
