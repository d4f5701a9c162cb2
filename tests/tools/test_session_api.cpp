// The public C++ API (include/tessera): Model, Session (eval, eval_all_logits, truncate, generate) and GraphView,
// used the way the CLI and external programs use it.
#include <gtest/gtest.h>

#include <algorithm>

#include "tessera/error.h"
#include "tessera/graph.h"
#include "tessera/model.h"
#include "tessera/session.h"
#include "test_util.h"

namespace {

using namespace tessera;

TEST(SessionApi, EvalAllLogitsEvalAndGenerate) {
  TESSERA_REQUIRE_DEFAULT_MODEL(path);
  const Model m = Model::load(path);
  EXPECT_EQ(m.spec().n_layers, 30);
  EXPECT_EQ(m.spec().n_vocab, 49152);
  EXPECT_TRUE(m.has_tokenizer());
  const std::vector<int32_t> ids = m.tokenizer().encode("The quick brown fox jumps over", true, false);
  ASSERT_GE(ids.size(), 5u);

  Session s(m, {.n_ctx = 128, .n_threads = 2});
  EXPECT_EQ(s.n_ctx(), 128);
  EXPECT_EQ(s.kv_dtype(), "f16");
  const auto all = s.eval_all_logits(ids);
  ASSERT_EQ(all.size(), ids.size() * size_t(s.n_vocab()));
  EXPECT_EQ(s.n_past(), int64_t(ids.size()));
  const auto last = s.logits();
  ASSERT_EQ(last.size(), size_t(s.n_vocab()));
  EXPECT_TRUE(std::equal(last.begin(), last.end(), all.end() - s.n_vocab()));

  // Re-evaluating after truncate gives the same last-token logits (to rounding: one-row vs all-rows matmul).
  s.truncate(0);
  const auto again = s.eval(ids);
  const auto top = [](std::span<const float> l) { return std::max_element(l.begin(), l.end()) - l.begin(); };
  EXPECT_EQ(top(again), top(std::span<const float>(all).subspan(all.size() - size_t(s.n_vocab()))));

  GenerateOptions g;
  g.max_tokens = 8;
  g.sampling.temperature = 0;
  s.reset();
  const GenerateResult r = s.generate("The capital of France is", g);
  EXPECT_LE(r.tokens.size(), 8u);
  EXPECT_FALSE(r.text.empty());
  // Generated tokens stay in the context (an end-of-generation token is not one of them).
  EXPECT_EQ(s.n_past(), r.timings.prompt_tokens + int64_t(r.tokens.size()));
  EXPECT_EQ(stop_reason_name(r.stop_reason), r.stop_reason == StopReason::MAX_TOKENS ? "length" : "eos");
}

TEST(SessionApi, ReferenceModeUsesF32Cache) {
  TESSERA_REQUIRE_DEFAULT_MODEL(path);
  const Model m = Model::load(path);
  Session s(m, {.n_ctx = 16, .n_threads = 2, .reference = true});
  EXPECT_TRUE(s.reference());
  EXPECT_EQ(s.kv_dtype(), "f32");
  EXPECT_THROW(Session(m, {.n_ctx = 16, .kv_dtype = "bf16"}), Error);
  EXPECT_THROW(Session(Model(), {}), Error);
}

TEST(SessionApi, GraphView) {
  TESSERA_REQUIRE_DEFAULT_MODEL(path);
  const Model m = Model::load(path, {.load_tokenizer = false});
  EXPECT_FALSE(m.has_tokenizer());
  EXPECT_THROW(m.tokenizer(), Error);
  const GraphView g = build_graph(m, 4, 10);
  EXPECT_EQ(g.n_tokens(), 4);
  EXPECT_EQ(g.n_past(), 10);
  ASSERT_EQ(g.nodes().size(), size_t(30 * 17 + 4));
  uint64_t flops = 0;
  for (const GraphNode& n : g.nodes()) flops += n.flops;
  EXPECT_EQ(g.totals().flops, flops);
  EXPECT_FALSE(g.format("json").empty());
  EXPECT_THROW(g.format("yaml"), Error);
  EXPECT_THROW(build_graph(m, 0), Error);
}

}  // namespace
