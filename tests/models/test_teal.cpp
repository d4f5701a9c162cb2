// TEAL on a whole (synthetic) model: the thresholds file round trip and its model check, a session decoding with
// --sparsity and with calibrated thresholds (achieved sparsity measured), and decode logits through the sparse GEMV
// against the same session run with prefill sparsified too (every row through SPARSIFY + the dense matmul).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <span>
#include <vector>

#include "tessera/calibrate.h"
#include "tessera/error.h"
#include "tessera/random_model.h"
#include "tessera/session.h"
#include "test_util.h"

namespace tessera {
namespace {

Model small(uint64_t seed, const std::string& dtype = "q4_1") {
  return make_random_model({.arch = "smollm2-135m", .dtype = dtype, .seed = seed, .n_layers = 2});
}

TEST(Teal, ThresholdsFileRoundTripAndModelCheck) {
  const Model m = small(1);
  TealThresholds t;
  t.model_hash = model_fingerprint(m);
  t.text_hash = 42;
  t.sparsity = 0.5f;
  t.thresholds = {{0.1f, 0.2f, 0.3f, 0.4f}, {0.5f, 0.6f, 0.7f, 0.8f}};
  const std::string path = (std::filesystem::temp_directory_path() / "tessera_teal_test.json").string();
  save_teal_thresholds(t, path);
  const TealThresholds r = read_teal_thresholds(path);
  EXPECT_EQ(r.model_hash, t.model_hash);
  EXPECT_EQ(r.thresholds, t.thresholds);
  EXPECT_EQ(load_teal_thresholds(m, path), t.thresholds);
  EXPECT_THROW(load_teal_thresholds(small(2), path), Error);  // another model's weights

  Session s(m, {.n_ctx = 32, .n_threads = 1, .teal = path});
  const std::vector<int32_t> ids = {1, 2, 3, 4};
  s.eval(ids);
  s.reset_achieved_sparsity();
  s.eval(std::vector<int32_t>{5});
  EXPECT_GT(s.achieved_sparsity(), 0.0);
  EXPECT_THROW(Session(m, {.n_ctx = 32, .sparsity = 0.5f, .teal = path}), Error);  // both
  std::remove(path.c_str());
}

TEST(Teal, SparseDecodeMatchesTheDenseMatmulOnTheSameZeros) {
  for (const std::string dtype : {"q4_1", "q8_0", "f16"}) {
    const Model m = small(3, dtype);
    const std::vector<int32_t> prompt = {7, 8, 9};
    // A: decode token 10 through MATMUL_SPARSE's sparse kernels (teal_walk=all). B: all four tokens in one chunk with
    // every row sparsified and the dense matmul (several rows): the last row is the same computation up to float
    // summation order. C: the default, the dense kernel on the zeroed decode row: the same again.
    Session a(m, {.n_ctx = 32,
                  .n_threads = 2,
                  .backend_options = {"teal_walk=all"},
                  .sparsity = 0.5f,
                  .sparsify_prefill = true});
    a.eval(prompt);
    a.reset_achieved_sparsity();
    const std::span<const float> sa = a.eval(std::vector<int32_t>{10});
    const std::vector<float> la(sa.begin(), sa.end());
    EXPECT_NEAR(a.achieved_sparsity(), 0.5, 0.01) << dtype;
    Session b(m, {.n_ctx = 32, .n_threads = 2, .sparsity = 0.5f, .sparsify_prefill = true});
    const std::span<const float> sb = b.eval(std::vector<int32_t>{7, 8, 9, 10});
    const std::vector<float> lb(sb.begin(), sb.end());
    ASSERT_EQ(la.size(), lb.size());
    double num = 0, den = 0;
    for (size_t i = 0; i < la.size(); ++i) {
      num += (la[i] - lb[i]) * (la[i] - lb[i]);
      den += lb[i] * lb[i];
    }
    EXPECT_LT(num / den, 1e-6) << dtype;  // a wrong skipped column moves logits by O(1)
    Session c(m, {.n_ctx = 32, .n_threads = 2, .sparsity = 0.5f, .sparsify_prefill = true});
    c.eval(prompt);
    const std::span<const float> sc = c.eval(std::vector<int32_t>{10});
    double nc = 0;
    for (size_t i = 0; i < la.size(); ++i) nc += (sc[i] - lb[i]) * (sc[i] - lb[i]);
    EXPECT_LT(nc / den, 1e-6) << dtype;
    Session dense(m, {.n_ctx = 32, .n_threads = 2});
    const std::span<const float> sd = dense.eval(std::vector<int32_t>{7, 8, 9, 10});
    const std::vector<float> ld(sd.begin(), sd.end());
    double dn = 0;
    for (size_t i = 0; i < la.size(); ++i) dn += (la[i] - ld[i]) * (la[i] - ld[i]);
    EXPECT_GT(dn / den, 1e-6) << dtype;  // and sparsity did change something
  }
}

// The CPU's TEAL switch ("teal_walk=all|none", --cpu-teal-walk): checked when the session opens.
TEST(Teal, CpuTealWalkOptionIsChecked) {
  const Model m = small(1);
  EXPECT_NO_THROW(Session(m, {.n_ctx = 16, .backend_options = {"teal_walk=all"}, .sparsity = 0.5f}));
  EXPECT_NO_THROW(Session(m, {.n_ctx = 16, .backend_options = {"teal_walk=none"}}));
  EXPECT_THROW(Session(m, {.n_ctx = 16, .backend_options = {"teal_walk=some"}}), Error);
  EXPECT_THROW(Session(m, {.n_ctx = 16, .backend_options = {"teal_walk"}}), Error);
  EXPECT_THROW(Session(m, {.n_ctx = 16, .backend_options = {"walk=all"}}), Error);
}

// tessera calibrate's uniform thresholds on the default model: each (layer, input) threshold zeroes the target share of
// its calibration entries, and a session on the same text with those thresholds achieves about that share.
TEST(Teal, UniformCalibrationHitsItsTarget) {
  TESSERA_REQUIRE_DEFAULT_MODEL(path);
  const Model m = Model::load(path);
  const std::string text_path = (std::filesystem::temp_directory_path() / "tessera_teal_cal.txt").string();
  {
    std::FILE* f = std::fopen(text_path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    for (int i = 0; i < 40; ++i)
      std::fprintf(f,
                   "In the beginning the engine read the weights, and the weights were many; and it skipped "
                   "the ones whose inputs were small, and the output was nearly the same. ");
    std::fclose(f);
  }
  CalibrateOptions o;
  o.text_path = text_path;
  o.sparsity = 0.4f;
  o.n_ctx = 128;
  o.max_tokens = 256;
  o.n_threads = 2;
  const TealThresholds t = calibrate(m, o);
  EXPECT_EQ(t.tokens, 256);
  ASSERT_EQ(static_cast<int64_t>(t.thresholds.size()), 30);
  for (size_t l = 0; l < t.thresholds.size(); ++l)
    for (int in = 0; in < 4; ++in) {
      EXPECT_GT(t.thresholds[l][in], 0.0f);
      EXPECT_GE(t.sparsity_at[l][in], 0.4f);  // the bucket's upper edge: at least the target
      EXPECT_LT(t.sparsity_at[l][in], 0.45f);
    }
  const std::string out = text_path + ".json";
  save_teal_thresholds(t, out);
  Session s(m, {.n_ctx = 128, .n_threads = 2, .teal = out, .sparsify_prefill = true});
  std::vector<int32_t> ids = m.tokenizer().encode(
      "In the beginning the engine read the weights, and the weights were many; and it skipped the ones whose inputs "
      "were small, and the output was nearly the same. In the beginning the engine read the weights.",
      true, false);
  s.eval(ids);
  EXPECT_NEAR(s.achieved_sparsity(), 0.4, 0.1);  // the calibration text's own distribution, fewer positions
  std::remove(out.c_str());
  std::remove(text_path.c_str());
}

}  // namespace
}  // namespace tessera
