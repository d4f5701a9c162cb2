// The backend registry and the interface's contract as the runtime relies on it: names, one-sentence errors for an
// unknown or unusable device, one weight store per model and device shared by sessions, and the interface's default
// steps (batched rows, argmax, greedy chain) equal to what eval gives.
#include <gtest/gtest.h>

#include <algorithm>

#include "backends/backend.h"
#include "models/model_weights.h"
#include "runtime/session.h"
#include "tessera/error.h"
#include "test_util.h"

namespace tessera::runtime {
namespace {

TEST(BackendRegistry, NamesTheCpuAndRefusesUnknownDevicesInOneSentence) {
  const std::vector<std::string> n = backend::names();
  EXPECT_NE(std::find(n.begin(), n.end(), "cpu"), n.end());
  EXPECT_EQ(backend::get("cpu").name(), "cpu");
  try {
    (void)backend::get("tpu");
    ADD_FAILURE() << "an unknown device was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("device 'tpu' is not supported (cpu"), std::string::npos) << e.what();
  }
}

TEST(BackendRegistry, CudaIsUsableOrSaysWhyNot) {
  try {
    const backend::Backend& b = backend::get("cuda");
    std::string why;
    EXPECT_TRUE(b.available(&why)) << why;
    EXPECT_TRUE(b.capabilities().device_argmax);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("device 'cuda' is not available: "), std::string::npos) << e.what();
  }
}

// The CPU backend's supports(): a test-only op runs through its registered reference kernel; a fused node does not
// (the CPU declares no fusion).
TEST(BackendRegistry, CpuSupportsRegisteredOpsNotFusedNodes) {
  graph::Graph g(3, 0);
  const int x = g.add_input("x", DType::F32, {3, 8});
  graph::OpParams p;
  p.scale = 2.0f;
  g.add_node("s", graph::Op::SCALE, graph::Role::NONE, 0, "test", {x}, p);
  EXPECT_TRUE(backend::get("cpu").supports(g.node(0), g));
  graph::Node fused = g.node(0);
  fused.fusion.fused_from = {"s", "t"};
  EXPECT_FALSE(backend::get("cpu").supports(fused, g));
}

class BackendStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TESSERA_REQUIRE_DEFAULT_MODEL(path);
    weights_ = ModelWeights::open(path);
  }
  std::unique_ptr<Engine> engine(std::shared_ptr<backend::WeightStore> store, int64_t n_seq = 1) {
    SessionOptions so;
    so.n_ctx = 64;
    so.n_threads = 2;
    so.n_seq = n_seq;
    return std::make_unique<Engine>(weights_, std::move(store), resolve_options(so, weights_.config()));
  }
  ModelWeights weights_;
};

// The repacked copies are made once per store: a second session over the same store adds nothing to it, and one over
// a fresh store makes its own.
TEST_F(BackendStoreTest, SessionsShareTheModelsWeightStore) {
  std::shared_ptr<backend::WeightStore> store = backend::get("cpu").make_weight_store();
  auto a = engine(store);
  const uint64_t after_first = store->bytes();
  ASSERT_GT(after_first, 0u) << "the default model's quantized matmuls are repacked into the store";
  auto b = engine(store);
  EXPECT_EQ(store->bytes(), after_first);
  std::shared_ptr<backend::WeightStore> other = backend::get("cpu").make_weight_store();
  auto c = engine(other);
  EXPECT_EQ(other->bytes(), after_first);
  const std::vector<int32_t> ids{504, 3575, 282, 4649};
  const std::span<const float> la = a->eval(ids);
  const std::vector<float> first(la.begin(), la.end());
  const std::span<const float> lb = b->eval(ids);
  EXPECT_TRUE(std::equal(first.begin(), first.end(), lb.begin()));
}

// On a backend without batched decode or a device argmax (the CPU), the runtime's host loop gives each row of a greedy
// batch step the argmax of the logits eval gives that slot alone.
TEST_F(BackendStoreTest, DefaultBatchedStepsEqualEval) {
  auto e = engine(nullptr, 2);
  e->eval_seq(0, std::vector<int32_t>{504, 3575});
  e->eval_seq(1, std::vector<int32_t>{378});
  auto alone = engine(nullptr, 2);
  alone->eval_seq(0, std::vector<int32_t>{504, 3575});
  alone->eval_seq(1, std::vector<int32_t>{378});
  const std::vector<int32_t> toks{282, 1797}, seqs{0, 1};
  const std::vector<int32_t> am = e->decode_batch_greedy(toks, seqs);
  const size_t v = static_cast<size_t>(weights_.config().n_vocab);
  for (size_t i = 0; i < 2; ++i) {
    const std::span<const float> l = alone->eval_seq(seqs[i], std::span<const int32_t>(&toks[i], 1));
    EXPECT_EQ(am[i], std::max_element(l.begin(), l.end()) - l.begin());
    ASSERT_EQ(l.size(), v);
  }
}

}  // namespace
}  // namespace tessera::runtime
