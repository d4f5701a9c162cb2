// The matmul-chain pass: finds chains of matmuls in a graph (a LoRA adapter's x·Aᵀ·Bᵀ beside the base's x·Wᵀ) and
// chooses each chain's parenthesization by the classic matrix-chain dynamic program, over a cost that weighs FLOPs and
// bytes as the roofline does: a product takes max(FLOPs / peak FLOP/s, bytes / bandwidth), and a chain the sum of its
// products. Every product's cost depends only on its three dimensions, so the DP's optimal substructure holds and its
// answer equals the brute-force optimum over all parenthesizations (tests/graph/test_chain.cpp checks that on random
// chains).
//
// A chain is matrices M0 [d0, d1], M1 [d1, d2], ..., M(n-1) [d(n-1), dn]: dims d0..dn. In the graph, M0 is an
// activation x [T, K] and the rest are transposed weights (MATMUL computes x·Wᵀ), so every order other than left to
// right contains products of weights only. `apply_chain_orders` rewrites a chain whose optimum is not left to right
// into that order: each weight-only product is folded at rewrite time into an f32 constant the graph owns (stored
// transposed, [N, K], as a MATMUL weight), so every remaining product is a plain MATMUL of an activation by a weight
// (a leaf or a folded constant) and no new op is needed. The DP's cost counts every product per call, as if the
// weight-only ones ran each time (`find_chains` reports that figure); the rewritten graph runs those once, at compile,
// so its per-call cost is at most the DP's. For LoRA the optimum is left to right whenever r <= min(K, N) / 2 (by
// FLOPs, at any token count T: 2·T·r·(K + N) <= 2·K·r·N + 2·T·K·N), and the rewrite leaves such chains alone; with the
// bytes counted too, only matrices a few dozen wide differ: at large T every product is then byte-bound and folding
// spares the [T, r] intermediate's write and read, which pays once T·r > K·N while the fold stays byte-bound (K·N <
// 20·(K + N + 2r) under the default ceilings) (tests/data/lora's 32-wide base folds its rank-4 adapter at k and v from
// T = 192; 64 wide and up never does).
#pragma once

#include <cstdint>
#include <functional>
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

// One parenthesization, as a string over the operand names ("(x·A)·B") with its total cost, and as a tree.
struct ChainOrder {
  std::string expr;
  ProductCost cost;  // summed over the order's products
  // The tree: each product's split, in preorder. The product of matrices i..j is (i..s)·(s+1..j); splits[0] is the
  // whole chain's s, then come the left factor's splits, then the right's (n - 1 of them for n matrices). Left to
  // right is {n-2, n-3, ..., 0}.
  std::vector<size_t> splits;
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

// A weight's values in f32, row-major as stored ([N, K]), or empty when they cannot be read. The graph layer reads no
// weight formats (shared/DESIGN.md: graph uses core only): the backend that asks for the rewrite passes its
// dequantizer (FusionSupport::weight_values, passes/fuse.h).
using WeightValues = std::function<std::vector<float>(const Tensor& weight)>;

// The rewrite: every chain of find_chains(g, model) whose best order is not the built one is computed in the best
// order. Along the tree's left spine x·F1·F2·...: each factor Fi is one weight (its node kept as it is) or a product
// of several, folded into an f32 constant (named after its node, "<node>.folded") in the order the DP chose for it,
// accumulated in double; the node multiplying by a folded constant is a plain MATMUL named for the nodes it computes
// (fused_from: the builder's nodes of its factor, so verify_rewrite accounts for each), with the role, layer, block
// and source of the first of them, whose output the chain's readers (a LoRA add) read in place of the tensor those
// nodes wrote last. A chain is left as built where a folded weight has no data or no
// values, or an intermediate it would drop is a graph output.
Graph apply_chain_orders(const Graph& g, const ChainCostModel& model, const WeightValues& values);

// `tessera graph --chains`: each chain, the orders considered with their FLOPs, bytes and cost, and the choice.
std::string format_chains(const Graph& g, const ChainCostModel& model = {});

}  // namespace tessera::graph
