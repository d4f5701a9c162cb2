// The TEAL rewrite (graph/passes/sparsify.h) on a llama-shaped graph: one SPARSIFY per block input (q|k|v share one,
// gate|up share one, o and down their own), every block matmul reading it, MATMUL_SPARSE only in one-token graphs,
// the output projection untouched, prefill unchanged unless asked, calibrated thresholds per (layer, input).
#include <gtest/gtest.h>

#include <map>

#include "graph/graph.h"
#include "graph/passes/fuse.h"
#include "graph/passes/sparsify.h"
#include "tessera/error.h"

namespace tessera::graph {
namespace {

const char kBytes[1] = {0};

// norm -> q, k, v; attention stand-in (SCALE) -> o; norm -> gate, up -> SWIGLU -> down; output matmul.
Graph block_graph(int64_t t, int layers) {
  Graph g(t, 0);
  int x = g.add_input("x", DType::F32, {t, 64});
  const int nw = g.add_weight("norm.weight", DType::F32, {64}, kBytes);
  for (int l = 0; l < layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const auto w = [&](const std::string& n, int64_t rows, int64_t cols) {
      return g.add_weight(p + n, DType::F16, {rows, cols}, kBytes);
    };
    const int h = g.add_node(p + "attn_norm", Op::RMSNORM, Role::ATTN_NORM, l, "attn", {x, nw}, {.eps = 1e-5f});
    const int q = g.add_node(p + "attn_q", Op::MATMUL, Role::ATTN_Q, l, "attn", {h, w("q", 64, 64)});
    const int k = g.add_node(p + "attn_k", Op::MATMUL, Role::ATTN_K, l, "attn", {h, w("k", 64, 64)});
    const int v = g.add_node(p + "attn_v", Op::MATMUL, Role::ATTN_V, l, "attn", {h, w("v", 64, 64)});
    const int qk = g.add_node(p + "qk", Op::ADD, Role::NONE, l, "attn", {q, k});
    const int a = g.add_node(p + "attn", Op::ADD, Role::ATTN, l, "attn", {qk, v});
    const int o = g.add_node(p + "attn_output", Op::MATMUL, Role::ATTN_O, l, "attn", {a, w("o", 64, 64)});
    x = g.add_node(p + "attn_residual", Op::ADD, Role::ATTN_RESIDUAL, l, "attn", {x, o});
    const int f = g.add_node(p + "ffn_norm", Op::RMSNORM, Role::FFN_NORM, l, "ffn", {x, nw}, {.eps = 1e-5f});
    const int gt = g.add_node(p + "ffn_gate", Op::MATMUL, Role::FFN_GATE, l, "ffn", {f, w("gate", 96, 64)});
    const int up = g.add_node(p + "ffn_up", Op::MATMUL, Role::FFN_UP, l, "ffn", {f, w("up", 96, 64)});
    const int s = g.add_node(p + "ffn_act", Op::SWIGLU, Role::FFN_ACT, l, "ffn", {gt, up});
    const int d = g.add_node(p + "ffn_down", Op::MATMUL, Role::FFN_DOWN, l, "ffn", {s, w("down", 64, 96)});
    x = g.add_node(p + "ffn_residual", Op::ADD, Role::FFN_RESIDUAL, l, "ffn", {x, d});
  }
  const int ow = g.add_weight("output.weight", DType::F16, {50, 64}, kBytes);
  g.mark_output(g.add_node("output", Op::MATMUL, Role::OUTPUT, -1, "output", {x, ow}));
  return g;
}

TEST(Sparsify, OneNodePerBlockInputAndSparseMatmulsAtDecode) {
  const Graph g = block_graph(1, 2);
  const Graph s = sparsify(g, {.sparsity = 0.5f});
  EXPECT_TRUE(verify_rewrite(s, run_passes(s, FusionSupport{})).empty());       // what a backend's compile checks
  for (const Node& n : g.nodes()) EXPECT_GE(s.find_node(n.name), 0) << n.name;  // every source node is still there
  std::map<std::string, int> sparsify_nodes;
  for (const Node& n : s.nodes()) {
    if (n.op == Op::SPARSIFY) {
      EXPECT_EQ(n.params.sparsity, 0.5f);
      EXPECT_LT(n.params.sparse_threshold, 0.0f);
      sparsify_nodes[n.name] = n.output;
    }
  }
  EXPECT_EQ(sparsify_nodes.size(), 8u);  // 4 inputs x 2 layers
  for (const Node& n : s.nodes()) {
    if (n.op != Op::SPARSIFY && sparse_input_of(n.role) != SparseInput::COUNT) {
      EXPECT_EQ(n.op, Op::MATMUL_SPARSE) << n.name;
      EXPECT_EQ(s.node(s.tensor(n.inputs[0]).producer).op, Op::SPARSIFY) << n.name;
    }
  }
  // q, k and v read one SPARSIFY; gate and up another.
  EXPECT_EQ(s.node(s.find_node("blk.1.attn_q")).inputs[0], s.node(s.find_node("blk.1.attn_v")).inputs[0]);
  EXPECT_EQ(s.node(s.find_node("blk.1.ffn_gate")).inputs[0], s.node(s.find_node("blk.1.ffn_up")).inputs[0]);
  EXPECT_NE(s.node(s.find_node("blk.1.attn_q")).inputs[0], s.node(s.find_node("blk.1.ffn_up")).inputs[0]);
  EXPECT_EQ(s.node(s.find_node("output")).op, Op::MATMUL);  // the output projection stays dense
  EXPECT_EQ(s.tensor(s.node(s.find_node("output")).inputs[0]).name, "blk.1.ffn_residual");
  // Node::source indexes this graph (a backend's profile and drop_ops name nodes by it), SPARSIFY nodes included, and
  // a backend's passes keep pointing at the right nodes.
  for (size_t i = 0; i < s.nodes().size(); ++i)
    EXPECT_EQ(s.nodes()[i].source, static_cast<int>(i)) << s.nodes()[i].name;
  const Graph fused = run_passes(s, FusionSupport{});
  for (const Node& n : fused.nodes())
    if (n.source >= 0) {
      EXPECT_EQ(s.node(n.source).op == Op::SPARSIFY, n.op == Op::SPARSIFY) << n.name;
      if (n.fusion.fused_from.empty()) {
        EXPECT_EQ(s.node(n.source).name, n.name);
      }
    }
}

TEST(Sparsify, PrefillStaysDenseUnlessAskedAndThenKeepsDenseMatmuls) {
  const Graph g = block_graph(7, 1);
  EXPECT_EQ(sparsify(g, {.sparsity = 0.5f}).nodes().size(), g.nodes().size());
  const Graph all = sparsify(g, {.sparsity = 0.5f, .all_rows = true});
  int n_sparsify = 0;
  for (const Node& n : all.nodes()) {
    n_sparsify += n.op == Op::SPARSIFY;
    EXPECT_NE(n.op, Op::MATMUL_SPARSE);  // several rows: the dense matmul on the zeroed x
  }
  EXPECT_EQ(n_sparsify, 4);
  EXPECT_EQ(sparsify(g, {}).nodes().size(), g.nodes().size());  // off
}

TEST(Sparsify, CalibratedThresholdsPerLayerAndInput) {
  const Graph g = block_graph(1, 2);
  SparsifyOptions o;
  o.thresholds = {{0.1f, 0.2f, 0.3f, 0.4f}, {1.1f, 1.2f, 1.3f, 1.4f}};
  const Graph s = sparsify(g, o);
  const auto thr = [&](const std::string& matmul) {
    return s.node(s.tensor(s.node(s.find_node(matmul)).inputs[0]).producer).params.sparse_threshold;
  };
  EXPECT_EQ(thr("blk.0.attn_k"), 0.1f);
  EXPECT_EQ(thr("blk.0.attn_output"), 0.2f);
  EXPECT_EQ(thr("blk.0.ffn_up"), 0.3f);
  EXPECT_EQ(thr("blk.1.ffn_down"), 1.4f);
  o.thresholds.pop_back();
  EXPECT_THROW(sparsify(g, o), Error);  // thresholds for one layer, a model of two
}

}  // namespace
}  // namespace tessera::graph
