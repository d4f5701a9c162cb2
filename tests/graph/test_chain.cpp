// The matmul-chain pass (graph/passes/chain.h): on random chains the dynamic program's order costs exactly the
// brute-force optimum over every parenthesization, under cost models from FLOP-bound to byte-bound.
#include <gtest/gtest.h>

#include <fmt/core.h>

#include <random>

#include "graph/passes/chain.h"

namespace tessera::graph {
namespace {

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
    ASSERT_NEAR(dp.cost.seconds, brute, 1e-12 * brute) << "trial " << trial;
    // The DP's expression is one of the enumerated orders, with the cost the enumeration gives it.
    bool found = false;
    for (const ChainOrder& o : all)
      if (o.expr == dp.expr) {
        found = true;
        EXPECT_NEAR(o.cost.seconds, dp.cost.seconds, 1e-12 * brute);
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

}  // namespace
}  // namespace tessera::graph
