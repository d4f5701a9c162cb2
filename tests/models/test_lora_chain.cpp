// The matmul-chain rewrite on a model (graph/passes/chain.h): an adapter whose rank exceeds min(K, N) / 2 is, in
// prefill chunks long enough, cheaper as x·(B·A)ᵀ, which the CPU's fast mode folds at compile; its logits equal the
// reference mode's (the builder's (x·Aᵀ)·Bᵀ). An adapter of ordinary rank is not rewritten (in chunks up to 64: a base
// this narrow folds it in longer ones). The base and adapter_a are tests/data/lora's; the high-rank adapter is written
// by lora_high_rank.h (random, rank 48 on all seven projections of the 32-wide base; CUDA's test uses it too).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "api/model_impl.h"
#include "backends/cpu/backend.h"
#include "graph/passes/fuse.h"
#include "lora_high_rank.h"
#include "models/llama.h"
#include "models/lora.h"
#include "tessera/session.h"
#include "test_util.h"

namespace tessera {
namespace {

using test::write_high_rank_adapter;

Model base() { return Model::load(test::data_path("lora/base"), {.load_tokenizer = false}); }

// Nodes of the T-token graph with `adapter` that the CPU's fast passes turn into a matmul by a folded constant.
int folded_nodes(const ModelWeights& w, const std::string& adapter, int64_t t) {
  auto a = std::make_shared<const LoraAdapter>(load_lora_adapter(adapter, 1.0f, w));
  const auto set = make_lora_set({a}, false, w, DType::F16);  // as a fast session makes it
  const graph::Graph g = build_llama_graph(w, {.n_tokens = t, .lora = set.get()});
  const graph::Graph r = graph::run_passes(g, cpu::cpu_fusion_support(false));
  int n = 0;
  for (const graph::Node& node : r.nodes()) n += node.fusion.names_only();
  return n;
}

std::vector<float> logits(const Model& m, const std::string& adapter, bool reference, const std::vector<int32_t>& ids) {
  SessionOptions so;
  so.n_ctx = 64;
  so.n_batch = 48;  // a chunk of 48 (rewritten) and the 8-token tail (left to right)
  so.n_threads = 2;
  so.reference = reference;
  if (!adapter.empty()) so.lora = {{adapter}};
  so.kv_dtype = "f32";
  Session s(m, so);
  return s.eval_all_logits(ids);
}

TEST(LoraChain, HighRankAdapterIsFoldedAndMatchesTheReference) {
  const Model m = base();
  const ModelWeights& w = m.impl()->weights;
  const std::string adapter = write_high_rank_adapter(w, 48);
  // In chunks of 48 every projection's x·(B·A)ᵀ is cheaper than (x·Aᵀ)·Bᵀ under the CPU's cost model (from T = 16
  // some are); in the 8-token tail and at decode none is.
  EXPECT_EQ(folded_nodes(w, adapter, 48), 14);
  EXPECT_EQ(folded_nodes(w, adapter, 8), 0);
  EXPECT_EQ(folded_nodes(w, adapter, 1), 0);

  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> id(0, 127);
  std::vector<int32_t> ids(56);
  for (int32_t& x : ids) x = id(rng);
  const std::vector<float> fast = logits(m, adapter, false, ids), ref = logits(m, adapter, true, ids);
  const std::vector<float> plain = logits(m, "", true, ids);
  ASSERT_EQ(fast.size(), ref.size());
  const size_t V = 128;
  // test_lora.cpp's limit for unmerged fast sessions (A in f16: the fold's B·A carries A's rounding as the unfused
  // products do), relative to each row's largest logit.
  double moved = 0;
  for (size_t t = 0; t < ids.size(); ++t) {
    double scale = 0;
    for (size_t i = 0; i < V; ++i) scale = std::max(scale, double(std::fabs(ref[t * V + i])));
    for (size_t i = 0; i < V; ++i) {
      ASSERT_NEAR(fast[t * V + i], ref[t * V + i], 6e-3 * scale) << "token " << t << " logit " << i;
      moved = std::max(moved, double(std::fabs(ref[t * V + i] - plain[t * V + i])));
    }
  }
  EXPECT_GT(moved, 0.1);  // the adapter matters: a dropped fold would show
}

TEST(LoraChain, OrdinaryRankAdapterIsNotRewritten) {
  const Model m = base();
  const std::string a = test::data_path("lora/adapter_a");  // rank 4 <= min(K, N) / 2 on every projection
  for (int64_t t : {1, 4, 16, 64}) EXPECT_EQ(folded_nodes(m.impl()->weights, a, t), 0) << t;
  // Only a base this narrow (32 wide) gains from folding even rank 4, in long chunks: every product is byte-bound, and
  // the fold spares the [T, r] intermediate's write and read (chain.h: where K·N < 20·(K + N + 2r)).
  EXPECT_GT(folded_nodes(m.impl()->weights, a, 256), 0);
}

}  // namespace
}  // namespace tessera
