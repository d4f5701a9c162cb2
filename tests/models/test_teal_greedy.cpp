// TEAL's block-wise greedy allocation (tessera calibrate --greedy, src/api/calibrate.cpp) and the node tap it runs on
// (Session::set_node_tap): the tap sees every node of a pass and what it writes is what later nodes read; greedy
// reaches its weighted target with an allocation that is not uniform, each threshold giving its input's share on the
// calibration text, and a session with the file zeroes about that weighted share of the skippable weights.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "tessera/calibrate.h"
#include "tessera/error.h"
#include "tessera/graph.h"
#include "tessera/random_model.h"
#include "tessera/session.h"
#include "test_util.h"

namespace tessera {
namespace {

TEST(NodeTap, SeesEveryNodeAndItsWritesAreRead) {
  const Model m = make_random_model({.arch = "smollm2-135m", .dtype = "q8_0", .seed = 5, .n_layers = 2});
  Session s(m, {.n_ctx = 16, .n_threads = 1});
  const std::vector<int32_t> ids = {3, 4, 5};
  const std::span<const float> b = s.eval(ids);  // the last row's logits: graph(3, 0) is the graph that ran
  const std::vector<float> base(b.begin(), b.end());
  const GraphView g = s.graph(3, 0);
  int last_residual = -1;
  for (const GraphNode& n : g.nodes())
    if (n.layer == 1) last_residual = n.id;
  ASSERT_GE(last_residual, 0);
  std::vector<int> seen;
  s.set_node_tap([&](const Session::NodeTapEvent& e) {
    seen.push_back(e.node);
    EXPECT_EQ(e.n_past, 0);
    if (e.node == last_residual) {
      ASSERT_NE(e.output, nullptr);
      for (int64_t i = 0; i < e.rows * 576; ++i) e.output[i] = 0.0f;  // the residual stream into the final norm
    }
  });
  s.reset();
  const std::span<const float> tapped = s.eval(ids);
  EXPECT_EQ(seen.size(), g.nodes().size());
  // A zero residual makes the final norm's output zero, so every logit is 0: the tap's write was read.
  for (float v : tapped) ASSERT_EQ(v, 0.0f);
  s.set_node_tap({});
  s.reset();
  const std::span<const float> again = s.eval(ids);
  EXPECT_EQ(std::vector<float>(again.begin(), again.end()), base);
}

TEST(TealGreedy, ReachesItsWeightedTargetWithANonUniformAllocation) {
  const Model m =
      make_random_model({.arch = "smollm2-135m", .dtype = "q8_0", .seed = 7, .n_layers = 2}, {.load_tokenizer = true});
  const std::string text_path = (std::filesystem::temp_directory_path() / "tessera_teal_greedy.txt").string();
  {
    std::FILE* f = std::fopen(text_path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    for (int i = 0; i < 30; ++i)
      std::fprintf(f, "And the greedy engine tried each input in turn, and kept the one that moved the block least. ");
    std::fclose(f);
  }
  CalibrateOptions o;
  o.text_path = text_path;
  o.sparsity = 0.3f;
  o.greedy = true;
  o.greedy_step = 0.05f;
  o.greedy_tokens = 32;
  o.n_ctx = 64;
  o.max_tokens = 128;
  o.n_threads = 2;
  int steps = 0;
  o.progress = [&](std::string_view line) { steps += line.find("greedy step") != std::string_view::npos; };
  const TealThresholds t = calibrate(m, o);
  EXPECT_TRUE(t.greedy);
  EXPECT_EQ(steps, 6);  // 0.3 / 0.05
  // smollm2-135m's blocks: q|k|v 576 x (576 + 192 + 192), o 576 x 576, gate|up 2 x 1536 x 576, down 1536 x 576.
  const double params[4] = {576.0 * 960, 576.0 * 576, 2.0 * 1536 * 576, 1536.0 * 576};
  const double total = params[0] + params[1] + params[2] + params[3];
  ASSERT_EQ(t.sparsity_at.size(), 2u);
  for (size_t l = 0; l < 2; ++l) {
    double weighted = 0, lo = 1, hi = 0;
    for (size_t in = 0; in < 4; ++in) {
      weighted += t.sparsity_at[l][in] * params[in] / total;
      lo = std::min<double>(lo, t.sparsity_at[l][in]);
      hi = std::max<double>(hi, t.sparsity_at[l][in]);
    }
    // Each threshold zeroes at least its allocation (by at most one histogram bucket more).
    EXPECT_GE(weighted, 0.3 - 1e-6) << "layer " << l;
    EXPECT_LT(weighted, 0.36) << "layer " << l;
    EXPECT_GT(hi - lo, 0.05) << "layer " << l << ": greedy gave every input the same sparsity";
  }
  const std::string out = text_path + ".json";
  save_teal_thresholds(t, out);
  EXPECT_TRUE(read_teal_thresholds(out).greedy);
  Session s(m, {.n_ctx = 64, .n_threads = 2, .teal = out});
  EXPECT_NO_THROW(s.eval(std::vector<int32_t>{1, 2, 3, 4}));
  o.greedy_step = 0.5f;  // larger than the target
  EXPECT_THROW(calibrate(m, o), Error);
  std::remove(out.c_str());
  std::remove(text_path.c_str());
}

}  // namespace
}  // namespace tessera
