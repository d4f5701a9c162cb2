// Graph IR: shape checks, the cost model's formulas, edges, totals and the three printers.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "graph/graph.h"
#include "graph/printer.h"
#include "tessera/error.h"

namespace tessera::graph {
namespace {

// x[T, K] -> rmsnorm -> matmul W[N, K] -> add with a second matmul of the same input: a tiny graph with every
// edge kind (input, weight, activation).
Graph small_graph(int64_t t, int64_t k, int64_t n) {
  Graph g(t, 0);
  const int x = g.add_input("x", DType::F32, {t, k});
  const int nw = g.add_weight("norm.weight", DType::F32, {k}, nullptr);
  const int w1 = g.add_weight("w1", DType::Q4_1, {n, k}, nullptr);
  const int w2 = g.add_weight("w2", DType::F16, {n, k}, nullptr);
  const int h = g.add_node("norm", Op::RMSNORM, Role::ATTN_NORM, 0, "attn", {x, nw}, OpParams{.eps = 1e-5f});
  const int a = g.add_node("mm1", Op::MATMUL, Role::ATTN_Q, 0, "attn", {h, w1});
  const int b = g.add_node("mm2", Op::MATMUL, Role::ATTN_K, 0, "attn", {h, w2});
  g.mark_output(g.add_node("sum", Op::ADD, Role::ATTN_RESIDUAL, 0, "attn", {a, b}));
  return g;
}

TEST(Graph, MatmulShapeFlopsAndBytes) {
  const int64_t t = 3, k = 64, n = 40;
  Graph g = small_graph(t, k, n);
  const Node& mm1 = g.node(g.find_node("mm1"));
  EXPECT_EQ(g.tensor(mm1.output).shape, (std::vector<int64_t>{t, n}));
  EXPECT_EQ(mm1.flops, uint64_t(2 * t * n * k));
  // q4_1: 20 bytes per 32 weights; activations f32 in and out.
  const uint64_t w_bytes = uint64_t(n * (k / 32) * 20);
  EXPECT_EQ(mm1.bytes, w_bytes + uint64_t(t * k * 4 + t * n * 4));
  const Node& mm2 = g.node(g.find_node("mm2"));
  EXPECT_EQ(mm2.bytes, uint64_t(n * k * 2 + t * k * 4 + t * n * 4));
  const Node& norm = g.node(g.find_node("norm"));
  EXPECT_EQ(norm.flops, uint64_t(4 * t * k));
  EXPECT_EQ(g.node(g.find_node("sum")).flops, uint64_t(t * n));
}

TEST(Graph, EdgesCoverEveryInput) {
  Graph g = small_graph(2, 32, 8);
  const auto edges = g.edges();
  size_t inputs = 0;
  for (const Node& n : g.nodes()) inputs += n.inputs.size();
  EXPECT_EQ(edges.size(), inputs);
  // norm -> mm1 and norm -> mm2 carry the activation "norm".
  int from_norm = 0;
  for (const Edge& e : edges)
    if (e.from_node == g.find_node("norm")) ++from_norm;
  EXPECT_EQ(from_norm, 2);
  for (const Edge& e : edges) {
    if (g.tensor(e.from_tensor).kind != TensorKind::ACTIVATION) {
      EXPECT_EQ(e.from_node, -1);
    }
  }
}

TEST(Graph, TotalsSumNodesAndSplitMatmuls) {
  Graph g = small_graph(4, 64, 16);
  const Totals t = g.totals();
  uint64_t flops = 0, bytes = 0, mm = 0;
  for (const Node& n : g.nodes()) {
    flops += n.flops;
    bytes += n.bytes;
    if (n.op == Op::MATMUL) mm += n.flops;
  }
  EXPECT_EQ(t.nodes, g.nodes().size());
  EXPECT_EQ(t.flops, flops);
  EXPECT_EQ(t.bytes, bytes);
  EXPECT_EQ(t.matmul_flops, mm);
  EXPECT_DOUBLE_EQ(t.matmul_flop_share(), double(mm) / double(flops));
  uint64_t class_flops = 0;
  for (const auto& c : t.by_class) class_flops += c.flops;
  EXPECT_EQ(class_flops, flops);
  EXPECT_EQ(t.by_class.front().op_class, "matmul");  // sorted by FLOPs
  EXPECT_EQ(t.weight_bytes, g.tensor(g.find_tensor("norm.weight")).nbytes() + g.tensor(g.find_tensor("w1")).nbytes() +
                                g.tensor(g.find_tensor("w2")).nbytes());
}

TEST(Graph, RejectsMismatchedShapesAndDuplicates) {
  Graph g(2, 0);
  const int x = g.add_input("x", DType::F32, {2, 64});
  const int w = g.add_weight("w", DType::F32, {8, 32}, nullptr);
  EXPECT_THROW(g.add_node("mm", Op::MATMUL, Role::NONE, -1, "", {x, w}), Error);
  EXPECT_THROW(g.add_input("x", DType::F32, {1}), Error);
  const int y = g.add_input("y", DType::F32, {2, 32});
  EXPECT_THROW(g.add_node("add", Op::ADD, Role::NONE, -1, "", {x, y}), Error);
  EXPECT_THROW(g.add_node("one", Op::ADD, Role::NONE, -1, "", {x}), Error);
  EXPECT_THROW(g.add_kv_cache("c", DType::Q4_0, {1, 4, 8}), Error);
}

// The op table (ops.cpp) is the one place an op is described: every op has its row, under its own value, and the
// traits the planner and passes ask are read from it.
TEST(OpTable, EveryOpHasItsRow) {
  for (size_t i = 0; i < static_cast<size_t>(Op::COUNT); ++i) {
    const Op op = static_cast<Op>(i);
    const OpInfo& info = op_info(op);
    EXPECT_EQ(info.op, op);
    EXPECT_FALSE(info.name.empty()) << i;
    EXPECT_FALSE(info.op_class.empty()) << info.name;
    EXPECT_GT(info.n_inputs, 0) << info.name;
    EXPECT_TRUE(info.traits.pass_only || info.infer != nullptr) << info.name << " has no shape check";
    EXPECT_EQ(op_name(op), info.name);
    EXPECT_EQ(is_view(op), info.traits.view_of >= 0);
    EXPECT_LT(info.traits.view_of, info.n_inputs) << info.name;
  }
  EXPECT_THROW(op_info(Op::COUNT), Error);
  EXPECT_EQ(op_name(Op::COUNT), "?");
  EXPECT_TRUE(is_matmul_like(Op::MATMUL));
  EXPECT_FALSE(is_matmul_like(Op::ADD));
  EXPECT_TRUE(may_write_over_input(Op::ADD, 1));
  EXPECT_TRUE(may_write_over_input(Op::ROPE, 0));
  EXPECT_FALSE(may_write_over_input(Op::ROPE, 1));
  EXPECT_FALSE(may_write_over_input(Op::MATMUL, 0));
  EXPECT_FALSE(may_write_over_input(Op::ADD, 100));
}

TEST(OpTable, AddNodeChecksTheRowsInputCountAndRejectsPassOnlyOps) {
  Graph g(2, 0);
  const int x = g.add_input("x", DType::F32, {2, 8});
  try {
    g.add_node("last", Op::LAST_ROW, Role::NONE, -1, "", {x, x});
    FAIL() << "two inputs for last_row";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'last' (last_row) takes 1 inputs, got 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(g.add_node("bad", Op::ADD, Role::NONE, -1, "", {x, 7}), Error);  // no tensor 7
  try {
    g.add_node("cols", Op::SLICE, Role::NONE, -1, "", {x});
    FAIL() << "a slice from add_node";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("made by graph passes"), std::string::npos) << e.what();
  }
  EXPECT_EQ(g.nodes().size(), 0u);
}

TEST(Graph, KvStoreAliasesCacheAndAttentionCost) {
  const int64_t t = 5, p = 7, h = 4, hkv = 2, d = 16, ctx = 32;
  Graph g(t, p);
  const int q = g.add_input("q", DType::F32, {t, h * d});
  const int k = g.add_input("k", DType::F32, {t, hkv * d});
  const int ck = g.add_kv_cache("ck", DType::F16, {hkv, ctx, d});
  const int cv = g.add_kv_cache("cv", DType::F32, {hkv, ctx, d});
  const OpParams kv{.n_head_kv = hkv, .head_dim = d};
  const int sk = g.add_node("sk", Op::KV_STORE, Role::CACHE_K, 0, "attn", {k, ck}, kv);
  const int sv = g.add_node("sv", Op::KV_STORE, Role::CACHE_V, 0, "attn", {k, cv}, kv);
  EXPECT_EQ(g.tensor(sk).alias, ck);
  EXPECT_EQ(g.tensor(sk).dtype, DType::F16);
  EXPECT_EQ(g.node(g.find_node("sk")).bytes, uint64_t(t * hkv * d * 4 + t * hkv * d * 2));
  const OpParams ap{.n_head = h, .n_head_kv = hkv, .head_dim = d, .attn_scale = 0.25f};
  g.add_node("attn", Op::ATTENTION, Role::ATTN, 0, "attn", {q, sk, sv}, ap);
  const Node& a = g.node(g.find_node("attn"));
  uint64_t pairs = 0;
  for (int64_t i = 0; i < t; ++i) pairs += uint64_t(p + i + 1);
  EXPECT_EQ(a.flops, uint64_t(h) * pairs * uint64_t(4 * d + 5));
  // The store of a chunk that would run past the cache is refused.
  Graph g2(4, 30);
  const int k2 = g2.add_input("k", DType::F32, {4, hkv * d});
  const int c2 = g2.add_kv_cache("ck", DType::F16, {hkv, ctx, d});
  EXPECT_THROW(g2.add_node("sk", Op::KV_STORE, Role::CACHE_K, 0, "attn", {k2, c2}, kv), Error);
  // GQA heads must divide.
  const OpParams bad{.n_head = 3, .n_head_kv = 2, .head_dim = d};
  const int q3 = g.add_input("q3", DType::F32, {t, 3 * d});
  EXPECT_THROW(g.add_node("attn3", Op::ATTENTION, Role::ATTN, 0, "attn", {q3, sk, sv}, bad), Error);
}

TEST(GraphPrinter, JsonHasNodesEdgesAndTotals) {
  Graph g = small_graph(2, 32, 8);
  g.model_name = "tiny \"quoted\"";
  const auto j = nlohmann::json::parse(to_json(g));
  EXPECT_EQ(j["model"], "tiny \"quoted\"");
  EXPECT_EQ(j["n_tokens"], 2);
  ASSERT_EQ(j["nodes"].size(), g.nodes().size());
  EXPECT_EQ(j["nodes"][1]["name"], "mm1");
  EXPECT_EQ(j["nodes"][1]["op"], "matmul");
  EXPECT_EQ(j["nodes"][1]["shape"], (std::vector<int64_t>{2, 8}));
  EXPECT_EQ(j["nodes"][1]["input_dtypes"][1], "q4_1");
  EXPECT_EQ(j["nodes"][1]["flops"], g.node(1).flops);
  EXPECT_EQ(j["edges"].size(), g.edges().size());
  EXPECT_EQ(j["tensors"].size(), g.tensors().size());
  const Totals t = g.totals();
  EXPECT_EQ(j["totals"]["flops"], t.flops);
  EXPECT_DOUBLE_EQ(j["totals"]["matmul_flop_share"].get<double>(), t.matmul_flop_share());
  EXPECT_EQ(j["totals"]["by_op_class"].size(), t.by_class.size());
}

TEST(GraphPrinter, TextAndDotNameEveryNode) {
  Graph g = small_graph(2, 32, 8);
  const std::string text = to_text(g), dot = to_dot(g);
  for (const Node& n : g.nodes()) {
    EXPECT_NE(text.find(n.name), std::string::npos) << n.name;
    EXPECT_NE(dot.find("\"" + n.name + "\""), std::string::npos) << n.name;
  }
  EXPECT_NE(text.find("matmul share"), std::string::npos);
  EXPECT_EQ(dot.rfind("digraph", 0), 0u);
  EXPECT_EQ(std::count(dot.begin(), dot.end(), '{'), std::count(dot.begin(), dot.end(), '}'));
  EXPECT_THROW(format_graph(g, "svg"), Error);
}

TEST(GraphPrinter, HumanCount) {
  EXPECT_EQ(human_count(999), "999");
  EXPECT_EQ(human_count(1234), "1.23 K");
  EXPECT_EQ(human_count(56'700'000), "56.7 M");
  EXPECT_EQ(human_count(123'000'000'000.0), "123 G");
}

}  // namespace
}  // namespace tessera::graph
