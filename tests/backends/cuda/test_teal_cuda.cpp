// TEAL on CUDA end to end (issue 23): decode with --sparsity on the GPU against the CPU's, on the same synthetic
// two-layer SmolLM2-shaped models, token by token. The decoder runs SPARSIFY (the CPU's top-k rule, kernels/
// gemv_sparse.h) and the sparse GEMV for bf16 and f16 weights (quantized weights: the dense GEMV on the zeroed x).
//
// Tolerance: as test_backend_cuda.cpp's (float 1%, quantized 3% relative L2 of the logits), doubled: besides the
// summation order, an entry within rounding of the top-k cut may be kept on one side and zeroed on the other, which
// moves a dot product by that entry's (smallest surviving) magnitude times its weight. Achieved sparsity is counted on
// both devices and must agree (the same rule on nearly the same values).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/kernels/gemv_sparse.h"
#include "cuda_test_util.h"
#include "tessera/model.h"
#include "tessera/random_model.h"
#include "tessera/session.h"

namespace tessera {
namespace {

std::vector<int32_t> random_ids(int n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> u(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& x : ids) x = u(rng);
  return ids;
}

struct TealCase {
  std::string dtype;
  float sparsity;
};

class CudaTeal : public ::testing::TestWithParam<TealCase> {};

TEST_P(CudaTeal, SparseDecodeMatchesCpu) {
  TESSERA_REQUIRE_GPU();
  const TealCase tc = GetParam();
  const Model m = make_random_model({.arch = "smollm2-135m", .dtype = tc.dtype, .seed = 7, .n_layers = 2});
  const std::vector<int32_t> ids = random_ids(24, 49152, 13);
  SessionOptions cpu_o{.n_ctx = 64, .n_threads = 2};
  cpu_o.sparsity = tc.sparsity;
  SessionOptions gpu_o = cpu_o;
  gpu_o.device = "cuda";
  Session cpu(m, cpu_o);
  Session gpu(m, gpu_o);
  cpu.reset_achieved_sparsity();
  gpu.reset_achieved_sparsity();
  const bool quant = tc.dtype.rfind("q", 0) == 0;
  const double tol = quant ? 6e-2 : 2e-2;
  double worst = 0;
  int agree = 0;
  for (int32_t id : ids) {
    const std::span<const float> sa = cpu.decode(id);
    const std::vector<float> a(sa.begin(), sa.end());
    const std::span<const float> b = gpu.decode(id);
    ASSERT_EQ(a.size(), b.size());
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_TRUE(std::isfinite(b[i])) << "logit " << i;
      num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
      den += double(a[i]) * a[i];
    }
    worst = std::max(worst, std::sqrt(num / std::max(den, 1e-30)));
    agree += std::max_element(a.begin(), a.end()) - a.begin() == std::max_element(b.begin(), b.end()) - b.begin();
  }
  const double sc = cpu.achieved_sparsity(), sg = gpu.achieved_sparsity();
  std::cout << tc.dtype << " sparsity " << tc.sparsity << ": worst relative L2 " << worst << ", top-1 equal in "
            << agree << " of " << ids.size() << " steps, achieved sparsity cpu " << sc << " cuda " << sg << "\n";
  EXPECT_LE(worst, tol);
  EXPECT_GE(agree * 10, static_cast<int>(ids.size()) * 8);
  EXPECT_NEAR(sg, sc, 0.005);
  EXPECT_GT(sg, tc.sparsity - 0.01);
}

INSTANTIATE_TEST_SUITE_P(Formats, CudaTeal,
                         ::testing::Values(TealCase{"bf16", 0.5f}, TealCase{"bf16", 0.25f}, TealCase{"f16", 0.5f},
                                           TealCase{"q8_0", 0.5f}, TealCase{"q4_1", 0.5f}),
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

}  // namespace
}  // namespace tessera
