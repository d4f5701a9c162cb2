// TEAL on CUDA end to end (issue 23): decode with --sparsity on the GPU against the CPU's, on the same synthetic
// two-layer SmolLM2-shaped models, token by token. The decoder runs SPARSIFY (the CPU's top-k rule, kernels/
// gemv_sparse.h) and the sparse GEMVs: bf16/f16 channel-major reading x, quantized the list walk with 8-bit x values.
//
// Tolerance: as test_backend_cuda.cpp's (float 1%, quantized 3% relative L2 of the logits), doubled: besides the
// summation order, an entry within rounding of the top-k cut may be kept on one side and zeroed on the other, which
// moves a dot product by that entry's (smallest surviving) magnitude times its weight. Achieved sparsity is counted on
// both devices and must agree (the same rule on nearly the same values).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/kernels/gemv_sparse.h"
#include "cuda_test_util.h"
#include "tessera/calibrate.h"
#include "tessera/model.h"
#include "tessera/random_model.h"
#include "tessera/session.h"

namespace tessera {
namespace {

using cuda::test::random_ids;

struct TealCase {
  std::string dtype;
  float sparsity;
};

class CudaTeal : public ::testing::TestWithParam<TealCase> {};

// Decodes ids on the CPU and the GPU with the same options (but the device) and compares the logits step by step.
void expect_gpu_matches_cpu(const Model& m, const SessionOptions& cpu_o, const std::string& what, bool quant,
                            float min_sparsity, const std::vector<std::string>& gpu_options = {},
                            double tol_override = 0) {
  const std::vector<int32_t> ids = random_ids(24, 49152, 13);
  SessionOptions gpu_o = cpu_o;
  gpu_o.device = "cuda";
  gpu_o.backend_options = gpu_options;
  Session cpu(m, cpu_o);
  Session gpu(m, gpu_o);
  cpu.reset_achieved_sparsity();
  gpu.reset_achieved_sparsity();
  // An entry within rounding of the cut (top-k's or a calibrated threshold) kept on one side only moves this random
  // two-layer model's logits far more than rounding does. Measured on the H100 (2026-11-26), worst relative L2: bf16
  // 50% 7e-6, 25% 0.024, calibrated 0.035 (10 of 157k entries decided differently); q8_0 dense 0.002, 50% 0.038,
  // calibrated 3e-7; q4_1 dense 0.011, 50% 0.096; top-1 equal in every step. The kernels themselves are checked
  // against references in test_gemv_sparse.cpp (the list's 8-bit values bit for bit against the CPU's).
  const double tol = tol_override > 0 ? tol_override : quant ? 1.2e-1 : 5e-2;
  double worst = 0;
  int agree = 0;
  for (int32_t id : ids) {
    const std::span<const float> sa = cpu.decode(id);
    const std::vector<float> a(sa.begin(), sa.end());
    const std::span<const float> b = gpu.decode(id);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) ASSERT_TRUE(std::isfinite(b[i])) << "logit " << i;
    worst = std::max(worst, cuda::test::rel_l2(b.data(), a.data(), a.size()));
    agree += std::max_element(a.begin(), a.end()) - a.begin() == std::max_element(b.begin(), b.end()) - b.begin();
  }
  const double sc = cpu.achieved_sparsity(), sg = gpu.achieved_sparsity();
  std::cout << what << ": worst relative L2 " << worst << ", top-1 equal in " << agree << " of " << ids.size()
            << " steps, achieved sparsity cpu " << sc << " cuda " << sg << "\n";
  EXPECT_LE(worst, tol);
  EXPECT_GE(agree * 10, static_cast<int>(ids.size()) * 8);
  EXPECT_NEAR(sg, sc, 0.005);
  EXPECT_GT(sg, min_sparsity);
}

TEST_P(CudaTeal, SparseDecodeMatchesCpu) {
  TESSERA_REQUIRE_GPU();
  const TealCase tc = GetParam();
  const Model m = make_random_model({.arch = "smollm2-135m", .dtype = tc.dtype, .seed = 7, .n_layers = 2});
  SessionOptions o{.n_ctx = 64, .n_threads = 2};
  o.sparsity = tc.sparsity;
  expect_gpu_matches_cpu(m, o, tc.dtype + " sparsity " + std::to_string(tc.sparsity), tc.dtype.rfind("q", 0) == 0,
                         tc.sparsity - 0.01f);
}

// Calibrated thresholds (--teal), TEAL's decode form: the bf16 decoder skips the SPARSIFY launches and its sparse
// GEMVs threshold x themselves (gemv_sparse_x); q8_0 keeps the launch for its gate|up walk only (teal_walk=auto, the
// default), its other inputs and q4_1's (no walk by default: CudaOptions::teal_walk) skipping it, their dense GEMVs'
// quantize_q8 applying the threshold (q8_0's bound: Q8WalkFormsMatchCpu below says why). Calibrated on the CPU.
TEST(CudaTeal, CalibratedThresholdsMatchCpu) {
  TESSERA_REQUIRE_GPU();
  const auto dir = std::filesystem::temp_directory_path();
  const std::string text = (dir / "tessera_teal_cuda.txt").string();
  {
    std::ofstream f(text);
    for (int i = 0; i < 40; ++i) f << "And the evening and the morning were the first day, and the light was good. ";
  }
  for (const std::string dtype : {"bf16", "q8_0", "q4_1"}) {
    const Model m = make_random_model({.arch = "smollm2-135m", .dtype = dtype, .seed = 7, .n_layers = 2},
                                      {.load_tokenizer = true});  // calibrate tokenizes its text
    const std::string thr = (dir / ("tessera_teal_cuda_" + dtype + ".json")).string();
    save_teal_thresholds(
        calibrate(m, {.text_path = text, .sparsity = 0.5f, .n_threads = 2, .n_ctx = 64, .max_tokens = 128}), thr);
    SessionOptions o{.n_ctx = 64, .n_threads = 2};
    o.teal = thr;
    expect_gpu_matches_cpu(m, o, dtype + " calibrated at 0.5", dtype != "bf16", 0.2f, {}, dtype == "q8_0" ? 0.3 : 0);
  }
}

// q8_0 under each teal_walk: its list walk everywhere (q8_0), for the wide gate|up stack only with the dense GEMV on
// the zeroed x elsewhere (auto: one layer mixes both forms, each SPARSIFY input serving one), or nowhere (none); top-k
// and calibrated thresholds.
// Calibrated thresholds in front of a dense GEMV are applied by the GEMV's own quantize_q8, to x as the fused norm
// computes it: entries within rounding of a threshold fall on the other side of it than on the CPU. Measured on the
// H100 (twentieth session): the walk (SPARSIFY on the same f32 x as the CPU) 3.8e-7 relative L2 and the same achieved
// sparsity to six digits; auto and none 0.224 with the sparsity 6e-5 apart (about 9 of the 157k entries decided
// differently), top-1 equal in 20 of 24 steps. This random two-layer model moves that far on so few flips (the CPU's
// own fast path against its reference: 0.30-0.37 under --teal, docs/TEAL.md), so those two forms get 0.3; a threshold
// applied at the wrong scale or to the wrong input would move the achieved sparsity, which stays within 0.005.
TEST(CudaTeal, Q8WalkFormsMatchCpu) {
  TESSERA_REQUIRE_GPU();
  const auto dir = std::filesystem::temp_directory_path();
  const std::string text = (dir / "tessera_teal_cuda_q8.txt").string();
  {
    std::ofstream f(text);
    for (int i = 0; i < 40; ++i) f << "And God said, Let there be light: and there was light, and it was good. ";
  }
  const Model m = make_random_model({.arch = "smollm2-135m", .dtype = "q8_0", .seed = 7, .n_layers = 2},
                                    {.load_tokenizer = true});
  const std::string thr = (dir / "tessera_teal_cuda_q8_walk.json").string();
  save_teal_thresholds(
      calibrate(m, {.text_path = text, .sparsity = 0.5f, .n_threads = 2, .n_ctx = 64, .max_tokens = 128}), thr);
  for (const std::string walk : {"auto", "q8_0", "none"}) {
    SessionOptions topk{.n_ctx = 64, .n_threads = 2};
    topk.sparsity = 0.5f;
    expect_gpu_matches_cpu(m, topk, "q8_0 top-k 0.5, teal_walk=" + walk, true, 0.49f, {"teal_walk=" + walk});
    SessionOptions cal{.n_ctx = 64, .n_threads = 2};
    cal.teal = thr;
    expect_gpu_matches_cpu(m, cal, "q8_0 calibrated at 0.5, teal_walk=" + walk, true, 0.2f, {"teal_walk=" + walk},
                           walk == "q8_0" ? 0 : 0.3);
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, CudaTeal,
                         ::testing::Values(TealCase{"bf16", 0.5f}, TealCase{"bf16", 0.25f}, TealCase{"f16", 0.5f},
                                           TealCase{"q8_0", 0.5f}, TealCase{"q4_1", 0.5f},
                                           // dense baselines: how far the quantized decoders differ without TEAL
                                           TealCase{"q8_0", 0.0f}, TealCase{"q4_1", 0.0f}),
                         [](const auto& info) {
                           return info.param.dtype + "_s" + std::to_string(static_cast<int>(info.param.sparsity * 100));
                         });

// The sparse decode's step is captured as a CUDA graph and chained like the dense one (device argmax feeding the next
// step): chained greedy generation equals step-by-step greedy decoding, token for token and in the last logits.
TEST(CudaTeal, GreedyChainEqualsStepByStep) {
  TESSERA_REQUIRE_GPU();
  const Model m = make_random_model({.arch = "smollm2-135m", .dtype = "bf16", .seed = 23, .n_layers = 2});
  SessionOptions o{.n_ctx = 64, .n_batch = 16, .device = "cuda"};
  o.sparsity = 0.5f;
  Session a(m, o), b(m, o);
  const std::vector<int32_t> prompt = random_ids(10, 49152, 77);
  a.eval(prompt);
  b.eval(prompt);
  std::vector<int32_t> got;
  EXPECT_EQ(a.decode_greedy_chain(5, 20,
                                  [&](int32_t id) {
                                    got.push_back(id);
                                    return true;
                                  }),
            20);
  std::vector<int32_t> want;
  int32_t t = 5;
  for (int i = 0; i < 20; ++i) want.push_back(t = b.decode_greedy(t));
  EXPECT_EQ(got, want);
  EXPECT_EQ(a.tokens(), b.tokens());
}

// Batched decode (decode_batch: B sequences, one row each) under TEAL: every row is thresholded as a one-token decode
// step is, by its own top-k, and the matmuls run dense on the zeroed rows (the union of B rows' kept channels is
// nearly every channel: docs/TEAL.md, "What runs"). Each row against CPU sessions decoding that sequence alone, with
// the same sparsity and without. Before the twentieth session the batched graph was not sparsified at all on CUDA
// (dense rows: 0.005 from the CPU's dense decode, 0.39-0.54 from its sparse one on this model), which the achieved
// sparsity and the comparison of the two distances catch. The batched rows compute x through other kernels than the
// one-row decoder (0.5% apart from the CPU dense), so entries within that of the top-k cut land on the other side;
// this random two-layer model amplifies those flips (first H100 run: 0.207 bf16, 0.112 q8_0 worst relative L2 from
// the CPU's sparse decode; the one-row decoder, whose x matches the CPU's, 7e-6 and 0.038), hence the bound of 0.3.
TEST(CudaTeal, BatchedDecodeThresholdsEveryRow) {
  TESSERA_REQUIRE_GPU();
  constexpr int kB = 3;
  for (const std::string dtype : {"bf16", "q8_0"}) {
    const Model m = make_random_model({.arch = "smollm2-135m", .dtype = dtype, .seed = 5, .n_layers = 2});
    SessionOptions go{.n_ctx = 96, .n_batch = 16, .device = "cuda", .n_seq = kB};
    go.sparsity = 0.5f;
    Session gpu(m, go);
    std::vector<std::unique_ptr<Session>> sparse, dense;
    for (int s = 0; s < kB; ++s) {
      SessionOptions co{.n_ctx = 96, .n_batch = 16, .n_threads = 2};
      dense.push_back(std::make_unique<Session>(m, co));
      co.sparsity = 0.5f;
      sparse.push_back(std::make_unique<Session>(m, co));
      const std::vector<int32_t> prompt = random_ids(5 + 3 * s, 49152, 100 + uint32_t(s));
      sparse.back()->eval(prompt);
      dense.back()->eval(prompt);
      gpu.eval_seq(s, prompt, false);
    }
    gpu.reset_achieved_sparsity();
    double worst = 0, sum_sparse = 0, sum_dense = 0;
    for (int step = 0; step < 6; ++step) {
      std::vector<int32_t> seqs;
      for (int s = 0; s < kB; ++s) seqs.push_back(step % 2 ? kB - 1 - s : s);
      const std::vector<int32_t> ids = random_ids(kB, 49152, 200 + uint32_t(step));
      const std::span<const float> out = gpu.decode_batch(ids, seqs);
      const std::vector<float> got(out.begin(), out.end());
      for (size_t i = 0; i < seqs.size(); ++i) {
        const std::span<const float> rs = sparse[static_cast<size_t>(seqs[i])]->decode(ids[i]);
        ASSERT_EQ(rs.size() * seqs.size(), got.size());
        const double es = cuda::test::rel_l2(got.data() + i * rs.size(), rs.data(), rs.size());
        const std::span<const float> rd = dense[static_cast<size_t>(seqs[i])]->decode(ids[i]);
        const double ed = cuda::test::rel_l2(got.data() + i * rd.size(), rd.data(), rd.size());
        worst = std::max(worst, es), sum_sparse += es, sum_dense += ed;
      }
    }
    const double sg = gpu.achieved_sparsity();
    std::cout << dtype << " batched decode, top-k 0.5: worst relative L2 " << worst << " from the CPU's sparse decode"
              << ", mean " << sum_sparse / (6 * kB) << " (from its dense decode: " << sum_dense / (6 * kB)
              << "), achieved sparsity cuda " << sg << "\n";
    EXPECT_LE(worst, 0.3) << dtype;
    EXPECT_LT(2 * sum_sparse, sum_dense) << dtype << ": the batched rows are not nearer the sparse decode than the dense";
    EXPECT_NEAR(sg, 0.5, 0.005) << dtype;
  }
}
// TEAL's two-row decode over the union of the rows' masks (teal_union=1, the default) against the dense matmul on the
// same zeroed rows (teal_union=0): the same values summed in another order. Each trial is one two-row step after the
// same two 4-token prompts (prefilled by the multi-row GEMV, the same bits in both sessions), so the two runs differ
// by rounding only, and that only where an entry within rounding of a later top-k cut falls on the other side of it
// (on this random two-layer model one such flip moves the logits by ~0.2 relative L2; the full CUDA suite met one in
// the twenty-fifth session). So: at most two of the eight trials may differ beyond 1e-4, none beyond 0.6, and the
// union's logits are not bit for bit the dense ones (which would mean the walk never ran). The options are set per
// session and read when its executors compile: the two sessions of a trial run one after the other.
TEST(CudaTeal, TwoRowDecodeUnionMatchesDense) {
  TESSERA_REQUIRE_GPU();
  constexpr int kTrials = 8;
  for (const std::string dtype : {"bf16", "f16"}) {
    const Model m = make_random_model({.arch = "smollm2-135m", .dtype = dtype, .seed = 9, .n_layers = 2});
    int close = 0;
    double worst = 0, best = 1;
    bool differs = false;
    for (int trial = 0; trial < kTrials; ++trial) {
      std::map<std::string, std::vector<float>> logits;
      std::map<std::string, double> sparsity;
      const std::vector<int32_t> seqs = trial % 2 ? std::vector<int32_t>{1, 0} : std::vector<int32_t>{0, 1};
      for (const std::string u : {"1", "0"}) {
        SessionOptions o{.n_ctx = 32, .n_batch = 16, .device = "cuda", .n_seq = 2};
        o.sparsity = 0.5f;
        o.backend_options = {"teal_union=" + u};
        Session gpu(m, o);
        for (int s = 0; s < 2; ++s) gpu.eval_seq(s, random_ids(4, 49152, 300 + uint32_t(10 * trial + s)), false);
        gpu.reset_achieved_sparsity();
        const std::span<const float> out = gpu.decode_batch(random_ids(2, 49152, 400 + uint32_t(trial)), seqs);
        logits[u].assign(out.begin(), out.end());
        sparsity[u] = gpu.achieved_sparsity();
      }
      const std::vector<float>& a = logits["1"];
      const std::vector<float>& b = logits["0"];
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_TRUE(std::isfinite(a[i])) << dtype << " logit " << i;
        differs |= a[i] != b[i];
      }
      const double rel = cuda::test::rel_l2(a.data(), b.data(), a.size());
      close += rel <= 1e-4;
      worst = std::max(worst, rel), best = std::min(best, rel);
      EXPECT_NEAR(sparsity["1"], sparsity["0"], 0.01) << dtype << " trial " << trial;
    }
    std::cout << dtype << " two-row decode, union walk against dense on the zeroed rows: " << close << " of "
              << kTrials << " trials within 1e-4 relative L2 (best " << best << ", worst " << worst << ")\n";
    EXPECT_GE(close, kTrials - 2) << dtype;
    EXPECT_LE(worst, 0.6) << dtype;
    EXPECT_TRUE(differs) << dtype << ": bit for bit the dense result: the union walk did not run";
  }
}

// CUDA options are process-wide, and a session's executors compile lazily: two sessions alive together with different
// options each run with their own (own_options in session_cuda.cpp). Before, the one opened last set them for both, so
// A's two-row executor, compiled after B opened, took B's teal_union=0. A's step must give the bits A alone gives.
TEST(CudaTeal, SessionsAliveTogetherKeepTheirOwnOptions) {
  TESSERA_REQUIRE_GPU();
  const Model m = make_random_model({.arch = "smollm2-135m", .dtype = "bf16", .seed = 9, .n_layers = 2});
  const auto options = [](const std::string& union_on) {
    SessionOptions o{.n_ctx = 32, .n_batch = 16, .device = "cuda", .n_seq = 2};
    o.sparsity = 0.5f;
    o.backend_options = {"teal_union=" + union_on};
    return o;
  };
  const auto step = [&](Session& s) {
    for (int q = 0; q < 2; ++q) s.eval_seq(q, random_ids(4, 49152, 500 + uint32_t(q)), false);
    const std::span<const float> out = s.decode_batch(random_ids(2, 49152, 600), std::vector<int32_t>{0, 1});
    return std::vector<float>(out.begin(), out.end());
  };
  std::vector<float> alone_union, alone_dense;
  {
    Session a(m, options("1"));
    alone_union = step(a);
  }
  {
    Session b(m, options("0"));
    alone_dense = step(b);
  }
  ASSERT_NE(alone_union, alone_dense) << "the union walk and the dense matmul gave the same bits: nothing to tell apart";
  Session a(m, options("1"));
  Session b(m, options("0"));  // opened last: its options were the process's
  const std::vector<float> got_a = step(a);
  const std::vector<float> got_b = step(b);
  EXPECT_EQ(got_a, alone_union) << "session A did not run with its own teal_union=1";
  EXPECT_EQ(got_b, alone_dense) << "session B did not run with its own teal_union=0";
}

}  // namespace
}  // namespace tessera
