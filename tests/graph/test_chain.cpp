// The matmul-chain pass (graph/passes/chain.h): on random chains the dynamic program's order costs exactly the
// brute-force optimum over every parenthesization, under cost models from FLOP-bound to byte-bound; each order's tree
// (its splits) is the order its expression shows; and the rewrite's graph structure (what it folds, keeps and names,
// and that verify_rewrite accounts for every node). tests/ops/test_chain_rewrite.cpp runs rewritten graphs.
#include <fmt/core.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <set>

#include "graph/passes/chain.h"
#include "graph/passes/fuse.h"

namespace tessera::graph {
namespace {

// Where the orders tie in modelled time (every product byte-bound, the same bytes), the DP takes the one with fewer
// FLOPs: LoRA's (x·Aᵀ)·Bᵀ on a 32-wide matrix at T = 256, not the fold x·(Aᵀ·Bᵀ), which does 4x the FLOPs.
TEST(Chain, TiesInTimeGoToFewerFlops) {
  const ChainCostModel m;
  const std::vector<int64_t> dims = {256, 32, 4, 32};
  const std::vector<std::string> names = {"x", "A", "B"};
  const std::vector<ChainOrder> all = all_chain_orders(dims, names, m);
  ASSERT_EQ(all.size(), 2u);
  ASSERT_NEAR(all[0].cost.seconds, all[1].cost.seconds, 1e-9 * all[0].cost.seconds);  // the tie this test is about
  const ChainOrder dp = optimal_chain_order(dims, names, m);
  EXPECT_EQ(dp.expr, left_to_right_order(dims, names, m).expr);
  EXPECT_EQ(all.front().expr, dp.expr);
  EXPECT_LT(dp.cost.flops, all.back().cost.flops);
}

TEST(Chain, DpEqualsBruteForceOnRandomChains) {
  std::mt19937 rng(25);
  std::uniform_int_distribution<int> n_mats(1, 7), dim(1, 600), pick(0, 2);
  const ChainCostModel models[] = {{2e11, 2e10, 4}, {1e15, 1e9, 2}, {1e9, 1e15, 4}};  // balanced, byte-, FLOP-bound
  int not_left_to_right = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int n = n_mats(rng);
    std::vector<int64_t> dims(static_cast<size_t>(n + 1));
    for (int64_t& d : dims) d = dim(rng);
    std::vector<std::string> names;
    for (int i = 0; i < n; ++i) names.push_back(fmt::format("M{}", i));
    const ChainCostModel& m = models[pick(rng)];
    const ChainOrder dp = optimal_chain_order(dims, names, m);
    const std::vector<ChainOrder> all = all_chain_orders(dims, names, m);
    ASSERT_FALSE(all.empty());
    double brute = all.front().cost.seconds;
    for (const ChainOrder& o : all) brute = std::min(brute, o.cost.seconds);
    ASSERT_NEAR(dp.cost.seconds, brute, 1e-9 * brute) << "trial " << trial;  // ties within 1e-9 go to fewer FLOPs
    // The DP's expression is one of the enumerated orders, with the cost the enumeration gives it.
    bool found = false;
    for (const ChainOrder& o : all)
      if (o.expr == dp.expr) {
        found = true;
        EXPECT_NEAR(o.cost.seconds, dp.cost.seconds, 1e-9 * brute);
      }
    EXPECT_TRUE(found) << dp.expr;
    if (dp.expr != left_to_right_order(dims, names, m).expr) ++not_left_to_right;
  }
  EXPECT_GT(not_left_to_right, 50);  // the random chains exercise orders other than the trivial one
}

TEST(Chain, OrdersAreCatalanManyAndTextual) {
  const std::vector<int64_t> dims = {10, 30, 5, 60};
  const std::vector<std::string> names = {"A", "B", "C"};
  const ChainCostModel flops_only{1e9, 1e30, 4};
  const std::vector<ChainOrder> all = all_chain_orders(dims, names, flops_only);
  ASSERT_EQ(all.size(), 2u);
  // The textbook example: (AB)C = 10·30·5 + 10·5·60 = 4500 multiply-adds, A(BC) = 30·5·60 + 10·30·60 = 27000.
  EXPECT_EQ(all[0].expr, "(A·B)·C");
  EXPECT_EQ(all[0].cost.flops, 2u * 4500);
  EXPECT_EQ(all[1].expr, "A·(B·C)");
  EXPECT_EQ(all[1].cost.flops, 2u * 27000);
  EXPECT_EQ(all_chain_orders({2, 3, 4, 5, 6, 7}, {"A", "B", "C", "D", "E"}, flops_only).size(), 14u);
}

TEST(Chain, LoraOrderIsLeftToRightAtEveryTokenCount) {
  // x [T, 576] · Aᵀ [576, 16] · Bᵀ [16, 1536]: x·(BA)ᵀ would cost a full K x N product; never chosen.
  for (int64_t t : {1, 16, 512, 4096}) {
    const ChainOrder best = optimal_chain_order({t, 576, 16, 1536}, {"x", "A", "B"}, {});
    EXPECT_EQ(best.expr, "(x·A)·B") << t;
  }
}

TEST(Chain, SplitsAreTheTreeTheExpressionShows) {
  const std::vector<std::string> names = {"A", "B", "C", "D"};
  const std::vector<int64_t> dims = {3, 5, 7, 11, 13};
  const ChainCostModel flops_only{1e9, 1e30, 4};
  EXPECT_EQ(left_to_right_order(dims, names, flops_only).splits, (std::vector<size_t>{2, 1, 0}));
  std::map<std::string, std::vector<size_t>> trees;
  for (const ChainOrder& o : all_chain_orders(dims, names, flops_only)) {
    ASSERT_EQ(o.splits.size(), 3u) << o.expr;
    trees[o.expr] = o.splits;
  }
  std::set<std::vector<size_t>> distinct;
  for (const auto& [e, t] : trees) distinct.insert(t);
  EXPECT_EQ(distinct.size(), 5u);  // Catalan(3) distinct trees
  EXPECT_EQ(trees["(A·B)·(C·D)"], (std::vector<size_t>{1, 0, 2}));
  EXPECT_EQ(trees["A·(B·(C·D))"], (std::vector<size_t>{0, 1, 2}));
  EXPECT_EQ(trees["(A·(B·C))·D"], (std::vector<size_t>{2, 0, 1}));
  // The DP's tree is the enumerated order with its expression.
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> dim(1, 300);
  for (int trial = 0; trial < 100; ++trial) {
    std::vector<int64_t> d(5);
    for (int64_t& x : d) x = dim(rng);
    const ChainOrder dp = optimal_chain_order(d, names, {});
    std::map<std::string, std::vector<size_t>> all;
    for (const ChainOrder& o : all_chain_orders(d, names, {})) all[o.expr] = o.splits;
    EXPECT_EQ(all.at(dp.expr), dp.splits) << dp.expr;
  }
}

// ---- The rewrite's structure (the values are checked on the CPU backend by tests/ops/test_chain_rewrite.cpp) ----

// f32 weights whose values the test keeps.
struct Weights {
  std::vector<std::shared_ptr<std::vector<float>>> store;
  std::mt19937 rng{25};
  int add(Graph& g, const std::string& name, int64_t n, int64_t k) {
    std::uniform_real_distribution<float> u(-1, 1);
    auto v = std::make_shared<std::vector<float>>(static_cast<size_t>(n * k));
    for (float& x : *v) x = u(rng);
    store.push_back(v);
    return g.add_weight(name, DType::F32, {n, k}, v->data());
  }
};

std::vector<float> f32_values(const Tensor& w) {
  std::vector<float> v(static_cast<size_t>(w.numel()));
  std::memcpy(v.data(), w.data, v.size() * sizeof(float));
  return v;
}

// y = x·Wᵀ + (x·Aᵀ)·Bᵀ with x [T, K], W [N, K], A [r, K], B [N, r], as models/llama.cpp writes an adapted matmul.
Graph lora_graph(Weights& w, int64_t t, int64_t k, int64_t r, int64_t n) {
  Graph g(t, 0);
  const int x = g.add_input("x", DType::F32, {t, k});
  const int y = g.add_node("q", Op::MATMUL, Role::ATTN_Q, 0, "attn", {x, w.add(g, "q.weight", n, k)});
  const int xa = g.add_node("q.lora0_a", Op::MATMUL, Role::NONE, 0, "attn", {x, w.add(g, "q.lora0_a.weight", r, k)});
  const int xab = g.add_node("q.lora0_b", Op::MATMUL, Role::NONE, 0, "attn", {xa, w.add(g, "q.lora0_b.weight", n, r)});
  g.mark_output(g.add_node("q.lora0", Op::ADD, Role::NONE, 0, "attn", {y, xab}));
  return g;
}

TEST(ChainRewrite, HighRankLoraFoldsBIntoAConstant) {
  // x [4, 8]·Aᵀ [8, 64]·Bᵀ [64, 8]: (x·Aᵀ)·Bᵀ moves 1600 elements per call, x·(B·A)ᵀ 1216 (the fold's 1088 counted
  // per call, as the DP does), so the DP picks the fold.
  Weights w;
  const Graph g = lora_graph(w, 4, 8, 64, 8);
  const std::vector<Chain> chains = find_chains(g);
  ASSERT_EQ(chains.size(), 1u);
  EXPECT_EQ(chains[0].best.expr, "x·(q.lora0_a.weightᵀ·q.lora0_b.weightᵀ)");
  const Graph r = apply_chain_orders(g, {}, f32_values);
  EXPECT_TRUE(verify_rewrite(g, r).empty()) << verify_rewrite(g, r)[0];
  ASSERT_EQ(r.nodes().size(), 3u);
  const Node& f = r.node(r.find_node("q.lora0_a+lora0_b"));
  EXPECT_EQ(f.op, Op::MATMUL);
  EXPECT_TRUE(f.fusion.names_only());
  EXPECT_EQ(f.fusion.fused_from, (std::vector<std::string>{"q.lora0_a", "q.lora0_b"}));
  EXPECT_EQ(f.inputs[0], r.find_tensor("x"));
  EXPECT_EQ(f.source, g.find_node("q.lora0_a"));
  EXPECT_EQ(f.flops, 2u * 4 * 8 * 8);
  const Tensor& c = r.tensor(f.inputs[1]);
  EXPECT_EQ(c.name, "q.lora0_a+lora0_b.folded");
  EXPECT_EQ(c.kind, TensorKind::WEIGHT);
  EXPECT_EQ(c.dtype, DType::F32);
  EXPECT_EQ(c.shape, (std::vector<int64_t>{8, 8}));  // (Aᵀ·Bᵀ)ᵀ = B·A [N, K]
  EXPECT_TRUE(r.owns(c.data));
  EXPECT_FALSE(g.owns(c.data));
  // Its values are B·A.
  const Tensor& a = g.tensor(g.find_tensor("q.lora0_a.weight"));
  const Tensor& b = g.tensor(g.find_tensor("q.lora0_b.weight"));
  const float* av = static_cast<const float*>(a.data);
  const float* bv = static_cast<const float*>(b.data);
  const float* cv = static_cast<const float*>(c.data);
  for (int64_t i = 0; i < 8; ++i)
    for (int64_t j = 0; j < 8; ++j) {
      double want = 0;
      for (int64_t m = 0; m < 64; ++m) want += double(bv[i * 64 + m]) * av[m * 8 + j];
      EXPECT_NEAR(cv[i * 8 + j], want, 1e-6 * std::max(1.0, std::fabs(want)));
    }
  // The add reads the rewritten product; the graph output keeps its tensor; a copy of the graph keeps the constant.
  const Node& add = r.node(r.find_node("q.lora0"));
  EXPECT_EQ(r.tensor(add.inputs[1]).producer, r.find_node("q.lora0_a+lora0_b"));
  EXPECT_EQ(r.tensor(add.inputs[1]).name, "q.lora0_a+lora0_b");
  const Graph copy = r;
  EXPECT_TRUE(copy.owns(c.data));
  // Nothing is left to rewrite.
  EXPECT_TRUE(find_chains(r).empty());
  EXPECT_EQ(apply_chain_orders(r, {}, f32_values).nodes().size(), r.nodes().size());
}

TEST(ChainRewrite, LeftToRightChainsAreUntouched) {
  // LoRA at r <= min(K, N) / 2: left to right at every T.
  for (int64_t t : {1, 7, 512}) {
    Weights w;
    const Graph g = lora_graph(w, t, 64, 16, 48);
    const Graph r = apply_chain_orders(g, {}, f32_values);
    ASSERT_EQ(r.nodes().size(), g.nodes().size());
    ASSERT_EQ(r.tensors().size(), g.tensors().size());
    for (size_t i = 0; i < g.nodes().size(); ++i) {
      EXPECT_EQ(r.nodes()[i].name, g.nodes()[i].name);
      EXPECT_EQ(r.nodes()[i].inputs, g.nodes()[i].inputs);
      EXPECT_TRUE(r.nodes()[i].fusion.empty());
    }
  }
}

TEST(ChainRewrite, LongChainKeepsSingleFactorsAndFoldsTheRest) {
  // x [2, 64]·M1 [64, 4]·M2 [4, 2]·M3 [2, 64]·M4 [64, 3] (Mi = Wiᵀ), FLOPs only: the DP picks ((x·M1)·M2)·(M3·M4)
  // (924 multiply-adds; left to right 1,168), so M1 and M2 keep their nodes and M3·M4 is one folded constant [3, 2].
  Weights w;
  Graph g(2, 0);
  int y = g.add_input("x", DType::F32, {2, 64});
  const int64_t dims[] = {64, 4, 2, 64, 3};
  for (int i = 1; i <= 4; ++i)
    y = g.add_node(fmt::format("m{}", i), Op::MATMUL, Role::NONE, 0, "ffn",
                   {y, w.add(g, fmt::format("w{}", i), dims[i], dims[i - 1])});
  g.mark_output(y);
  const ChainCostModel flops_only{1e9, 1e30, 4};
  const std::vector<Chain> chains = find_chains(g, flops_only);
  ASSERT_EQ(chains.size(), 1u);
  ASSERT_EQ(chains[0].best.expr, "((x·w1ᵀ)·w2ᵀ)·(w3ᵀ·w4ᵀ)");
  const Graph r = apply_chain_orders(g, flops_only, f32_values);
  EXPECT_TRUE(verify_rewrite(g, r).empty());
  ASSERT_EQ(r.nodes().size(), 3u);
  EXPECT_EQ(r.nodes()[0].name, "m1");
  EXPECT_TRUE(r.nodes()[0].fusion.empty());
  EXPECT_EQ(r.nodes()[1].name, "m2");
  const Node& f = r.nodes()[2];
  EXPECT_EQ(f.name, "m3+m4");
  EXPECT_EQ(f.inputs[0], r.nodes()[1].output);
  EXPECT_EQ(r.tensor(f.inputs[1]).shape, (std::vector<int64_t>{3, 2}));
  // The chain's result is a graph output: it keeps its name.
  EXPECT_EQ(r.tensor(f.output).name, "m4");
  EXPECT_TRUE(r.tensor(f.output).is_output);
  // Without values, or with an intermediate the fold would drop read by the caller, the chain stays as built.
  EXPECT_EQ(apply_chain_orders(g, flops_only, [](const Tensor&) { return std::vector<float>{}; }).nodes().size(), 4u);
  Graph out3 = g;
  out3.mark_output(out3.find_tensor("m3"));
  EXPECT_EQ(apply_chain_orders(out3, flops_only, f32_values).nodes().size(), 4u);
}

TEST(ChainRewrite, RunPassesRewritesChainsFirst) {
  // The CPU's fast passes: the rewritten adapter is a matmul by a constant, so the LoRA fold leaves the base matmul,
  // it and the add as they are; an ordinary adapter beside it is folded into its base.
  Weights w;
  Graph g = lora_graph(w, 4, 8, 64, 8);
  const int x = g.find_tensor("x");
  const int y = g.add_node("k", Op::MATMUL, Role::ATTN_K, 0, "attn", {x, w.add(g, "k.weight", 8, 8)});
  const int xa = g.add_node("k.lora0_a", Op::MATMUL, Role::NONE, 0, "attn", {x, w.add(g, "k.lora0_a.weight", 2, 8)});
  const int xab = g.add_node("k.lora0_b", Op::MATMUL, Role::NONE, 0, "attn", {xa, w.add(g, "k.lora0_b.weight", 8, 2)});
  g.mark_output(g.add_node("k.lora0", Op::ADD, Role::NONE, 0, "attn", {y, xab}));
  FusionSupport fs{.chain_orders = ChainCostModel{}, .weight_values = f32_values, .lora_epilogue = true};
  const Graph r = run_passes(g, fs);
  ASSERT_EQ(r.nodes().size(), 4u);  // q, q.lora0_a+lora0_b, q.lora0, k with its adapter
  EXPECT_EQ(r.nodes()[0].name, "q");
  EXPECT_TRUE(r.nodes()[1].fusion.names_only());
  EXPECT_EQ(r.nodes()[2].op, Op::ADD);
  EXPECT_EQ(r.nodes()[3].fusion.lora, 1);
  // A rewritten graph compiled again: verify_rewrite takes its folded node for the builder's nodes it names.
  EXPECT_TRUE(verify_rewrite(r, run_passes(r, FusionSupport{.lora_epilogue = true})).empty());
  Graph lost = r;
  std::vector<Node> nodes = r.nodes();
  nodes[1].fusion.fused_from = {"q.lora0_a"};
  lost.replace_contents(r.tensors(), nodes);
  const std::vector<std::string> problems = verify_rewrite(r, lost);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("'q.lora0_b' was lost"), std::string::npos) << problems[0];
}

TEST(ChainRewrite, FoldedConstantsAreNeverStacked) {
  // The CUDA decoder's stacks (every matmul reading one x with weights of one format and K): q and k stack, the matmul
  // by the folded B·A (f32 and 8 wide like them) stays alone, since executors keep stacks by their members' addresses
  // beyond the graph's life (fuse.cpp, stack_matmuls).
  Weights w;
  Graph g = lora_graph(w, 4, 8, 64, 8);
  const int x = g.find_tensor("x");
  g.mark_output(g.add_node("k", Op::MATMUL, Role::ATTN_K, 0, "attn", {x, w.add(g, "k.weight", 8, 8)}));
  const Graph r = run_passes(
      g, FusionSupport{.chain_orders = ChainCostModel{}, .weight_values = f32_values, .stack_shared_input = true});
  ASSERT_EQ(r.nodes().size(), 5u);  // q+k, its two slices, q.lora0_a+lora0_b, q.lora0
  EXPECT_EQ(r.nodes()[0].name, "q+k");
  EXPECT_EQ(r.nodes()[0].fusion.n_weights, 2);
  const Node& f = r.node(r.find_node("q.lora0_a+lora0_b"));
  EXPECT_TRUE(f.fusion.names_only());
  EXPECT_TRUE(r.owns(r.tensor(f.inputs[1]).data));
  // Without the fold, the adapter's A product (x·Aᵀ, a model weight of K = 8) joins the stack as any matmul does.
  const Graph plain = run_passes(g, FusionSupport{.stack_shared_input = true});
  EXPECT_EQ(plain.nodes()[0].fusion.n_weights, 3);
}

}  // namespace
}  // namespace tessera::graph
