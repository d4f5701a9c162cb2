// The matmul-chain rewrite (graph/passes/chain.h) run on the CPU backend: graphs whose chains the DP orders other than
// left to right compute what the builder's graphs compute. Each case runs the builder's graph and the rewritten one in
// reference mode (double sums: they differ by f32 rounding at different points, the intermediates' against the folded
// constant's), and the builder's graph in fast mode, which rewrites it itself (cpu_fusion_support) and multiplies by
// the folded constants with its f32 kernels. tests/graph/test_chain.cpp checks the rewrite's structure.
#include <gtest/gtest.h>

#include <fmt/core.h>

#include <cstring>
#include <random>

#include "backends/cpu/backend.h"
#include "graph/passes/chain.h"
#include "graph/passes/fuse.h"
#include "ops/op_case.h"

namespace tessera::ops_test {
namespace {

using graph::Op;
using graph::Role;

// Normalized MSE limits (op_case.h's comparison). Both paths sum in f32 or better: the rewritten graph rounds the
// folded constant to f32 once, the builder's graph each intermediate product; fast f32 kernels sum in f32 (the op
// table's f32 matmul limit, test_ops.cpp). A wrong order, transpose or dropped factor shows as ~1.
constexpr double kF32 = 1e-10;

// The nodes of g the CPU's fast passes rewrite into a matmul by a folded constant.
int folded_nodes(const graph::Graph& g) {
  const graph::Graph r = graph::run_passes(g, cpu::cpu_fusion_support(false));
  int n = 0;
  for (const graph::Node& node : r.nodes()) n += node.fusion.names_only();
  return n;
}

// The builder's graph rewritten, with the same weights and inputs (its output keeps its tensor).
OpGraph rewritten(const OpGraph& og) {
  const graph::FusionSupport fs = cpu::cpu_fusion_support(false);
  OpGraph r = og;
  r.g = graph::apply_chain_orders(og.g, *fs.chain_orders, fs.weight_values);
  EXPECT_TRUE(graph::verify_rewrite(og.g, r.g).empty());
  return r;
}

// Runs og three ways (see the top of the file) and compares with the builder's graph in reference mode.
void expect_same_values(const OpGraph& og, const std::string& what) {
  const std::vector<float> ref = run_cpu(og, true);
  EXPECT_LE(nmse(run_cpu(rewritten(og), true), ref), kF32) << what << ": rewritten, reference mode";
  EXPECT_LE(nmse(run_cpu(og, false), ref), kF32) << what << ": fast mode";
}

// y = x·Wᵀ + (x·Aᵀ)·Bᵀ, x [t, k], W [n, k], A [r, k], B [n, r], as models/llama.cpp writes an adapted matmul.
OpGraph lora(std::mt19937& rng, int64_t t, int64_t k, int64_t r, int64_t n, DType a_type, DType b_type) {
  OpGraph og{graph::Graph(t, 0)};
  const int x = add_f32_input(og, rng, "x", {t, k}, -1, 1);
  const int y = og.g.add_node("q", Op::MATMUL, Role::ATTN_Q, 0, "attn",
                              {x, add_weight(og, rng, "q.weight", DType::F32, {n, k}, -1, 1)});
  const int xa = og.g.add_node("q.lora0_a", Op::MATMUL, Role::NONE, 0, "attn",
                               {x, add_weight(og, rng, "q.lora0_a.weight", a_type, {r, k}, -1, 1)});
  const int xab = og.g.add_node("q.lora0_b", Op::MATMUL, Role::NONE, 0, "attn",
                                {xa, add_weight(og, rng, "q.lora0_b.weight", b_type, {n, r}, -0.2f, 0.2f)});
  og.g.mark_output(og.g.add_node("q.lora0", Op::ADD, Role::NONE, 0, "attn", {y, xab}));
  return og;
}

TEST(ChainRewriteCpu, HighRankLoraComputesTheSameValues) {
  const uint32_t s = seed();
  std::mt19937 rng(s);
  // x [4, 8]·Aᵀ [8, 64]·Bᵀ [64, 8]: the DP folds B·A (tests/graph/test_chain.cpp).
  const OpGraph og = lora(rng, 4, 8, 64, 8, DType::F32, DType::F32);
  ASSERT_EQ(folded_nodes(og.g), 1);
  expect_same_values(og, fmt::format("lora t4 k8 r64 n8 (seed {})", s));
}

TEST(ChainRewriteCpu, QuantizedFactorsFoldExactly) {
  // A in f16, B in q8_0: the fold dequantizes them as the reference kernels do, so only the sums' order differs. At
  // T = 64 the fold's one [32, 32] product per call beats two [64, 64]-sized ones.
  const uint32_t s = seed();
  std::mt19937 rng(s);
  const OpGraph og = lora(rng, 64, 32, 64, 32, DType::F16, DType::Q8_0);
  ASSERT_EQ(folded_nodes(og.g), 1);
  expect_same_values(og, fmt::format("lora t64 k32 r64 n32, a f16, b q8_0 (seed {})", s));
  // At T = 4 the same adapter stays left to right.
  EXPECT_EQ(folded_nodes(lora(rng, 4, 32, 64, 32, DType::F16, DType::Q8_0).g), 0);
}

TEST(ChainRewriteCpu, NormalRankLoraIsNotRewritten) {
  std::mt19937 rng(seed());
  for (int64_t t : {1, 4, 64}) {
    const OpGraph og = lora(rng, t, 64, 16, 64, DType::F32, DType::F32);
    EXPECT_EQ(folded_nodes(og.g), 0) << t;
    EXPECT_EQ(rewritten(og).g.nodes().size(), og.g.nodes().size()) << t;
  }
}

TEST(ChainRewriteCpu, RandomChainsComputeTheSameValues) {
  const uint32_t s = seed();
  std::mt19937 rng(s);
  std::uniform_int_distribution<int> n_weights(2, 5), dim(1, 48), tokens(1, 16);
  int rewrites = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int n = n_weights(rng);
    const int64_t t = tokens(rng);
    int64_t k = dim(rng);
    OpGraph og{graph::Graph(t, 0)};
    int y = add_f32_input(og, rng, "x", {t, k}, -1, 1);
    for (int i = 0; i < n; ++i) {
      const int64_t m = dim(rng);
      y = og.g.add_node(fmt::format("m{}", i), Op::MATMUL, Role::NONE, 0, "ffn",
                        {y, add_weight(og, rng, fmt::format("w{}", i), DType::F32, {m, k}, -1, 1)});
      k = m;
    }
    og.g.mark_output(y);
    const int folded = folded_nodes(og.g);
    rewrites += folded > 0;
    expect_same_values(og, fmt::format("trial {} (seed {}): {} weights, {} folded", trial, s, n, folded));
  }
  EXPECT_GT(rewrites, 10);  // the random chains exercise the rewrite
}

}  // namespace
}  // namespace tessera::ops_test
