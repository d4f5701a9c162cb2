// The matmul-chain pass: finds chains of matmuls in a graph (a LoRA adapter's x·Aᵀ·Bᵀ beside the base's x·Wᵀ) and
// chooses each chain's parenthesization by the classic matrix-chain dynamic program, over a cost that weighs FLOPs and
// bytes as the roofline does: a product takes max(FLOPs / peak FLOP/s, bytes / bandwidth), and a chain the sum of its
// products. Every product's cost depends only on its three dimensions, so the DP's optimal substructure holds and its
// answer equals the brute-force optimum over all parenthesizations (tests/graph/test_chain.cpp checks that on random
// chains).
//
// A chain is matrices M0 [d0, d1], M1 [d1, d2], ..., M(n-1) [d(n-1), dn]: dims d0..dn. In the graph, M0 is an
// activation x [T, K] and the rest are transposed weights (MATMUL computes x·Wᵀ), so any order other than left to right
// multiplies two weights first: the builder's order is the only one the graph's ops express, and `find_chains`
// reports whether the optimum is it (for LoRA it is whenever r <= min(K, N) / 2, at any token count T).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace tessera::graph {

// Ceilings the cost weighs FLOPs and bytes by; the defaults are those of a 2-core AVX2 machine's f32 path (their
// ratio, 10 FLOP per byte, is what decides between orders). Elements are counted in f32 (4 bytes).
struct ChainCostModel {
  double flops_per_s = 2e11;
  double bytes_per_s = 2e10;
  double elem_bytes = 4;
};

struct ProductCost {
  uint64_t flops = 0;  // 2·m·k·n
  uint64_t bytes = 0;  // (m·k + k·n + m·n) elements: both operands read, the product written
  double seconds = 0;  // max(flops / peak, bytes / bandwidth)
};
ProductCost product_cost(int64_t m, int64_t k, int64_t n, const ChainCostModel& model);

// One parenthesization, as a string over the operand names ("(x·A)·B") with its total cost.
struct ChainOrder {
  std::string expr;
  ProductCost cost;  // summed over the order's products
};

// The DP's optimum for dims d0..dn (n >= 1 matrices). Operands are named by `names` (size n).
ChainOrder optimal_chain_order(const std::vector<int64_t>& dims, const std::vector<std::string>& names,
                               const ChainCostModel& model);
// Every parenthesization (Catalan(n-1) of them), by cost ascending; for tests and for printing (n <= 10).
std::vector<ChainOrder> all_chain_orders(const std::vector<int64_t>& dims, const std::vector<std::string>& names,
                                         const ChainCostModel& model);
// Left to right: ((M0·M1)·M2)·...: the order the graph computes.
ChainOrder left_to_right_order(const std::vector<int64_t>& dims, const std::vector<std::string>& names,
                               const ChainCostModel& model);

// A chain of MATMUL nodes in a graph: nodes[0] reads `input` (an activation), each later node reads the one before it
// as its only consumer, and each multiplies by a WEIGHT.
struct Chain {
  std::vector<int> nodes;          // node ids, in graph order
  int input = -1;                  // tensor id of x
  int beside = -1;                 // the node x·Wᵀ whose output this chain's result is added to (LoRA), or -1
  std::vector<int64_t> dims;       // [T, K, r, ..., N]
  std::vector<std::string> names;  // operand names: "x", then each weight's tensor name with "ᵀ"
  ChainOrder built;                // the graph's order (left to right)
  ChainOrder best;                 // the DP's choice
  std::vector<ChainOrder> orders;  // every order considered, by cost
};
std::vector<Chain> find_chains(const Graph& g, const ChainCostModel& model = {});

// `tessera graph --chains`: each chain, the orders considered with their FLOPs, bytes and cost, and the choice.
std::string format_chains(const Graph& g, const ChainCostModel& model = {});

}  // namespace tessera::graph
