// Several sequences in one engine (CPU): slots are independent contexts; decode_batch gives each row the logits that
// decoding its sequence alone gives; generate_batch equals generate per prompt; bad batches fail with one sentence
// and evaluate nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "models/model_weights.h"
#include "runtime/session.h"
#include "tessera/error.h"
#include "tessera/tokenizer.h"
#include "test_util.h"

namespace tessera::runtime {
namespace {

// Fixed prompts in ids (inside the default model's vocabulary), of different lengths so slots sit at different
// positions.
const std::vector<std::vector<int32_t>> kPrompts{
    {504, 3575, 282, 4649, 314, 7042, 30},
    {378, 1797, 1918, 553},
    {253, 504, 3575, 282, 4649, 314, 7042, 30, 378, 1797, 1918},
};

std::unique_ptr<Engine> make_engine(const ModelWeights& w, int64_t n_ctx, int64_t n_seq, int64_t n_batch = 512) {
  SessionOptions so;
  so.n_ctx = n_ctx;
  so.n_batch = n_batch;
  so.n_threads = 2;
  so.n_seq = n_seq;
  return std::make_unique<Engine>(w, nullptr, resolve_options(so, w.config()));
}

// max |a - b| / max |b|
double rel_diff(std::span<const float> a, std::span<const float> b) {
  double d = 0, m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, double(std::fabs(a[i] - b[i])));
    m = std::max(m, double(std::fabs(b[i])));
  }
  return d / m;
}

class BatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TESSERA_REQUIRE_DEFAULT_MODEL(path);
    path_ = path;
    weights_ = ModelWeights::open(path);
  }
  std::string path_;
  ModelWeights weights_;
};

TEST_F(BatchTest, DecodeBatchEqualsPerSequenceDecode) {
  const size_t v = static_cast<size_t>(weights_.config().n_vocab);
  auto batch = make_engine(weights_, 64, 3);
  std::vector<std::unique_ptr<Engine>> alone;
  for (size_t s = 0; s < kPrompts.size(); ++s) {
    alone.push_back(make_engine(weights_, 64, 1));
    const std::span<const float> ref = alone[s]->eval(kPrompts[s]);
    const std::vector<float> r(ref.begin(), ref.end());
    const std::span<const float> got = batch->eval_seq(static_cast<int64_t>(s), kPrompts[s]);
    EXPECT_LE(rel_diff(got, r), 1e-6) << "prefill of slot " << s;
  }
  for (size_t s = 0; s < kPrompts.size(); ++s) EXPECT_EQ(batch->tokens(int64_t(s)), kPrompts[s]);

  // Three steps over all slots, then one over a subset in another order: rows follow `seqs`, not slot order.
  const std::vector<std::vector<int32_t>> steps_seqs{{0, 1, 2}, {2, 0, 1}, {1, 2, 0}, {2, 0}};
  int32_t next = 100;
  for (const std::vector<int32_t>& seqs : steps_seqs) {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < seqs.size(); ++i) ids.push_back(next++);
    const std::span<const float> out = batch->decode_batch(ids, seqs);
    ASSERT_EQ(out.size(), seqs.size() * v);
    const std::vector<float> rows(out.begin(), out.end());
    for (size_t i = 0; i < seqs.size(); ++i) {
      const std::span<const float> ref = alone[static_cast<size_t>(seqs[i])]->eval(std::span<const int32_t>(&ids[i], 1));
      // The same decode plan and kernels on the same inputs: equal up to thread-order rounding in reductions.
      EXPECT_LE(rel_diff(std::span<const float>(rows.data() + i * v, v), ref), 1e-6)
          << "slot " << seqs[i] << " in a batch of " << seqs.size();
    }
  }
  for (size_t s = 0; s < kPrompts.size(); ++s) {
    EXPECT_EQ(batch->tokens(int64_t(s)), alone[s]->tokens());
    EXPECT_EQ(batch->n_past(int64_t(s)), alone[s]->n_past());
  }
  // The per-slot logits are the last row each slot got.
  EXPECT_LE(rel_diff(batch->logits(1), alone[1]->logits()), 1e-6);
}

// decode_batch_greedy (CPU: the logits' argmax taken on the host) picks each row's argmax of what decode_batch gives
// for the same step in a twin engine, and fails like decode_batch on a bad batch.
TEST_F(BatchTest, DecodeBatchGreedyIsTheArgmaxOfDecodeBatch) {
  const size_t v = static_cast<size_t>(weights_.config().n_vocab);
  auto a = make_engine(weights_, 64, 3), b = make_engine(weights_, 64, 3);
  for (size_t s = 0; s < kPrompts.size(); ++s) {
    a->eval_seq(static_cast<int64_t>(s), kPrompts[s]);
    b->eval_seq(static_cast<int64_t>(s), kPrompts[s]);
  }
  const std::vector<std::vector<int32_t>> steps_seqs{{0, 1, 2}, {2, 0}, {1}};
  int32_t next = 200;
  for (const std::vector<int32_t>& seqs : steps_seqs) {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < seqs.size(); ++i) ids.push_back(next++);
    const std::span<const float> out = a->decode_batch(ids, seqs);
    const std::vector<int32_t> got = b->decode_batch_greedy(ids, seqs);
    ASSERT_EQ(got.size(), seqs.size());
    for (size_t i = 0; i < seqs.size(); ++i) {
      const auto row = out.subspan(i * v, v);
      EXPECT_EQ(got[i], static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin())) << "row " << i;
    }
  }
  for (size_t s = 0; s < kPrompts.size(); ++s) EXPECT_EQ(a->tokens(int64_t(s)), b->tokens(int64_t(s)));
  EXPECT_THROW(b->decode_batch_greedy(std::vector<int32_t>{1}, std::vector<int32_t>{3}), Error);
  EXPECT_THROW(b->decode_batch_greedy(std::vector<int32_t>{1, 2}, std::vector<int32_t>{0}), Error);
  EXPECT_EQ(b->tokens(0).size(), a->tokens(0).size());  // the failed calls evaluated nothing
}

// decode_greedy_chain (on the CPU a decode_batch_greedy loop) picks what step-by-step greedy decoding picks, stops
// when its callback says so (the last token passed is not evaluated) and at the end of the context.
TEST_F(BatchTest, DecodeGreedyChainEqualsStepByStep) {
  auto a = make_engine(weights_, 24, 1), b = make_engine(weights_, 24, 1);
  a->eval(kPrompts[0]);
  b->eval(kPrompts[0]);
  const int32_t slot = 0;
  const auto steps = [&](int32_t t, int n) {
    std::vector<int32_t> out;
    for (int i = 0; i < n; ++i)
      out.push_back(t = b->decode_batch_greedy(std::span<const int32_t>(&t, 1), std::span<const int32_t>(&slot, 1))[0]);
    return out;
  };
  std::vector<int32_t> got;
  EXPECT_EQ(a->decode_greedy_chain(200, 5, [&](int32_t id) { return got.push_back(id), true; }), 5);
  EXPECT_EQ(got, steps(200, 5));
  EXPECT_EQ(a->tokens(), b->tokens());
  got.clear();
  EXPECT_EQ(a->decode_greedy_chain(201, 10, [&](int32_t id) { return got.push_back(id), got.size() < 3; }), 3);
  EXPECT_EQ(got, steps(201, 3));
  EXPECT_EQ(a->tokens(), b->tokens());
  got.clear();  // 7 + 5 + 3 = 15 of 24: 9 more fit
  EXPECT_EQ(a->decode_greedy_chain(202, 100, [&](int32_t id) { return got.push_back(id), true; }), 9);
  EXPECT_EQ(got, steps(202, 9));
  EXPECT_EQ(a->tokens(), b->tokens());
  EXPECT_THROW(a->decode_greedy_chain(203, 1, [](int32_t) { return true; }), Error);  // full
}

TEST_F(BatchTest, SlotsAreIndependent) {
  auto e = make_engine(weights_, 64, 2);
  e->eval_seq(0, kPrompts[0]);
  e->eval_seq(1, kPrompts[2]);  // another slot at another length
  EXPECT_EQ(e->n_past(0), static_cast<int64_t>(kPrompts[0].size()));
  EXPECT_EQ(e->n_past(1), static_cast<int64_t>(kPrompts[2].size()));
  // Slot 0's cache was not touched by slot 1: decoding it equals a fresh engine's decode.
  auto ref = make_engine(weights_, 64, 1);
  ref->eval(kPrompts[0]);
  const std::span<const float> r = ref->eval(std::vector<int32_t>{42});
  const std::vector<float> rv(r.begin(), r.end());
  const std::span<const float> got = e->eval_seq(0, std::vector<int32_t>{42});
  EXPECT_LE(rel_diff(got, rv), 1e-6);
  // Truncating one slot leaves the other.
  e->truncate(1, 3);
  EXPECT_EQ(e->n_past(1), 3);
  EXPECT_EQ(e->n_past(0), static_cast<int64_t>(kPrompts[0].size()) + 1);
  EXPECT_TRUE(e->logits(1).empty());
  EXPECT_FALSE(e->logits(0).empty());
}

TEST_F(BatchTest, BadBatchesFailAndEvaluateNothing) {
  auto e = make_engine(weights_, 12, 3);
  e->eval_seq(0, kPrompts[0]);
  e->eval_seq(1, kPrompts[1]);
  e->eval_seq(2, kPrompts[2]);
  const auto snapshot = [&] {
    std::vector<int64_t> p;
    for (int64_t s = 0; s < 3; ++s) p.push_back(e->n_past(s));
    return p;
  };
  const std::vector<int64_t> before = snapshot();
  using V = std::vector<int32_t>;
  EXPECT_THROW(e->decode_batch(V{1, 2}, V{0, 0}), Error);          // duplicate slot
  EXPECT_THROW(e->decode_batch(V{1, 2}, V{0, 3}), Error);          // slot out of range
  EXPECT_THROW(e->decode_batch(V{1, 2}, V{-1, 1}), Error);         // negative slot
  EXPECT_THROW(e->decode_batch(V{1, 2, 3, 4}, V{0, 1, 2, 0}), Error);  // more rows than slots
  EXPECT_THROW(e->decode_batch(V{1, 2}, V{0}), Error);             // sizes differ
  EXPECT_THROW(e->decode_batch(V{}, V{}), Error);                  // empty
  EXPECT_THROW(e->decode_batch(V{1, -5}, V{0, 1}), Error);         // bad token
  EXPECT_THROW(e->decode_batch(V{1, int32_t(e->n_vocab())}, V{0, 1}), Error);
  EXPECT_THROW(e->eval_seq(3, V{1}), Error);
  EXPECT_THROW(e->truncate(5, 0), Error);
  EXPECT_THROW(e->tokens(-1), Error);
  EXPECT_THROW(e->logits(3), Error);
  // Slot 2 holds 11 of 12 positions: one more fits, then its context is full; the batch then fails as a whole.
  e->decode_batch(V{7}, V{2});
  EXPECT_EQ(e->n_past(2), 12);
  const std::vector<int64_t> full = snapshot();
  try {
    e->decode_batch(V{1, 2}, V{0, 2});
    ADD_FAILURE() << "a batch with a full sequence was evaluated";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("sequence 2 is full"), std::string::npos) << err.what();
  }
  EXPECT_EQ(snapshot(), full);
  EXPECT_EQ(before[0], full[0]);
  EXPECT_EQ(before[1], full[1]);

  SessionOptions so;
  so.n_seq = 0;
  EXPECT_THROW(resolve_options(so, weights_.config()), Error);
}

TEST_F(BatchTest, GenerateBatchGreedyEqualsGeneratePerPrompt) {
  const Tokenizer tok = Tokenizer::from_model(path_);
  GenerateOptions g;
  g.max_tokens = 12;
  g.sampling.temperature = 0;
  auto batch = make_engine(weights_, 64, 3, 4);  // n_batch 4: the prompts prefill in several chunks
  // Slot 1 holds leftovers first: generate_batch resets every slot it uses.
  batch->eval_seq(1, kPrompts[2]);
  const std::vector<GenerateResult> got = generate_batch(*batch, &tok, kPrompts, g);
  ASSERT_EQ(got.size(), kPrompts.size());
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    auto one = make_engine(weights_, 64, 1, 4);
    const GenerateResult want = generate(*one, &tok, kPrompts[i], g, {});
    EXPECT_EQ(got[i].tokens, want.tokens) << "prompt " << i;
    EXPECT_EQ(got[i].text, want.text) << "prompt " << i;
    EXPECT_EQ(got[i].stop_reason, want.stop_reason) << "prompt " << i;
    EXPECT_EQ(got[i].timings.prompt_tokens, static_cast<int64_t>(kPrompts[i].size()));
    EXPECT_FALSE(got[i].tokens.empty());
  }

  // A stop string ends one sequence while the others go on; a too-small context ends with context_full.
  GenerateOptions s = g;
  s.stop = {got[0].text.substr(0, std::min<size_t>(3, got[0].text.size()))};
  if (!s.stop[0].empty()) {
    auto e = make_engine(weights_, 64, 3);
    const std::vector<GenerateResult> r = generate_batch(*e, &tok, kPrompts, s);
    EXPECT_EQ(r[0].stop_reason, StopReason::STOP_STRING);
    auto one = make_engine(weights_, 64, 1);
    const GenerateResult w = generate(*one, &tok, kPrompts[1], s, {});
    EXPECT_EQ(r[1].tokens, w.tokens);
    EXPECT_EQ(r[1].stop_reason, w.stop_reason);
  }
  auto small = make_engine(weights_, 14, 3);
  const std::vector<GenerateResult> r = generate_batch(*small, &tok, kPrompts, g);
  EXPECT_EQ(r[2].stop_reason, StopReason::CONTEXT_FULL);  // 11 prompt tokens of 14
  EXPECT_EQ(r[2].tokens.size(), 4u);                      // 3 evaluated, the 4th sampled at a full context
  EXPECT_EQ(r[0].stop_reason, StopReason::CONTEXT_FULL);

  const std::vector<std::vector<int32_t>> too_many(4, kPrompts[0]);
  EXPECT_THROW(generate_batch(*batch, &tok, too_many, g), Error);
  const std::vector<std::vector<int32_t>> empty_one{kPrompts[0], {}};
  EXPECT_THROW(generate_batch(*batch, &tok, empty_one, g), Error);
}

}  // namespace
}  // namespace tessera::runtime
