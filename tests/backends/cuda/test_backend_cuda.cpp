// The CUDA backend against the CPU backend on whole models: synthetic two-layer SmolLM2-135M-shaped models (random
// weights, every GPU weight format) and the default model, decoded token by token through both sessions.
//
// Tolerances, by what differs between the two paths (both keep an f16 KV cache):
// - float weights (bf16, f16): both multiply f32 activations with the same weight values; only summation order
//   differs (f32 partial sums in another order, ~1e-6 relative per dot product), plus f16 rounding of cache entries
//   that may land on the other side of a rounding boundary: 1% relative L2 error leaves two orders of margin.
// - quantized weights (q8_0, q4_0, q4_1): both quantize activations to 8 bits per block of 32 (rounding step
//   max|x|/127, ~0.4% of the block's largest value), but a tiny upstream difference can flip one rounding, which moves
//   a dot product by up to one step of one element; through two layers that stays at a few tenths of a percent: 3%.
// Top-1 must agree in at least 99% of the decisive steps (see compare_sessions), and at least half must be decisive.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/backend_cuda.h"
#include "cuda_test_util.h"
#include "tessera/error.h"
#include "tessera/model.h"
#include "tessera/random_model.h"
#include "tessera/session.h"
#include "test_util.h"

namespace tessera {
namespace {

struct Compare {
  int steps = 0, decisive = 0, agree = 0;
  double worst_rel = 0;
};

// Feeds the same ids to both sessions one token at a time and compares every step's logits.
// A step is decisive when the CPU's best logit leads the second by more than twice `tol` times the logits' RMS: each
// of the two logits may move by about the tolerated error level, so a smaller lead may flip legitimately.
Compare compare_sessions(const Model& model, const std::vector<int32_t>& ids, double tol) {
  SessionOptions cpu_o{.n_ctx = static_cast<int64_t>(ids.size()) + 8, .n_threads = 2};
  SessionOptions gpu_o = cpu_o;
  gpu_o.device = "cuda";
  Session cpu(model, cpu_o);
  Session gpu(model, gpu_o);
  Compare c;
  for (int32_t id : ids) {
    const std::span<const float> sa = cpu.decode(id);
    const std::vector<float> a(sa.begin(), sa.end());
    const std::span<const float> b = gpu.decode(id);
    EXPECT_EQ(a.size(), b.size());
    if (a.size() != b.size()) return c;
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(std::isfinite(b[i])) << "logit " << i << " at step " << c.steps;
      num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
      den += double(a[i]) * a[i];
    }
    c.worst_rel = std::max(c.worst_rel, std::sqrt(num / std::max(den, 1e-30)));
    std::vector<size_t> order(a.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::partial_sort(order.begin(), order.begin() + 2, order.end(), [&](size_t x, size_t y) { return a[x] > a[y]; });
    const size_t gpu_top = static_cast<size_t>(std::max_element(b.begin(), b.end()) - b.begin());
    if (a[order[0]] - a[order[1]] > 2 * tol * std::sqrt(den / double(a.size()))) {
      ++c.decisive;
      c.agree += gpu_top == order[0] ? 1 : 0;
    }
    ++c.steps;
  }
  return c;
}

std::vector<int32_t> random_ids(int n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> u(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& x : ids) x = u(rng);
  return ids;
}

void expect_close(const Compare& c, double tol, const std::string& what) {
  EXPECT_LE(c.worst_rel, tol) << what;
  std::cout << what << ": worst relative L2 error " << c.worst_rel << ", top-1 agrees in " << c.agree << " of "
            << c.decisive << " decisive steps (" << c.steps << " steps)\n";
  // Random-weight logits are near-Gaussian over 49152 tokens: the top-2 gap is exponential with mean ~0.2 of their
  // RMS, so a 6% threshold leaves ~75% of the steps decisive.
  EXPECT_GE(c.decisive * 2, c.steps) << what << ": too many near-ties to judge top-1";
  EXPECT_GE(c.agree * 100, c.decisive * 99) << what << ": top-1 agrees in " << c.agree << " of " << c.decisive;
}

class CudaBackendDtype : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaBackendDtype, MatchesCpuOnSyntheticModel) {
  TESSERA_REQUIRE_GPU();
  const std::string dtype = GetParam();
  const Model m = make_random_model({.arch = "smollm2-135m", .dtype = dtype, .seed = 7, .n_layers = 2});
  const bool quant = dtype.rfind("q", 0) == 0;
  const double tol = quant ? 3e-2 : 1e-2;
  const Compare c = compare_sessions(m, random_ids(40, 49152, 11), tol);
  expect_close(c, tol, "smollm2-135m x2 layers, " + dtype);
}

INSTANTIATE_TEST_SUITE_P(Formats, CudaBackendDtype, ::testing::Values("bf16", "f16", "q8_0", "q4_0", "q4_1"),
                         [](const auto& info) { return info.param; });

TEST(CudaBackend, MatchesCpuOnDefaultModel) {
  TESSERA_REQUIRE_GPU();
  TESSERA_REQUIRE_DEFAULT_MODEL(path);
  const Model m = Model::load(path);
  const std::vector<int32_t> prompt =
      m.tokenizer().encode("The capital of France is Paris, and the capital of", true, false);
  std::vector<int32_t> ids = prompt;
  const std::vector<int32_t> more = random_ids(64, 49152, 5);
  ids.insert(ids.end(), more.begin(), more.end());
  const Compare c = compare_sessions(m, ids, 3e-2);
  expect_close(c, 3e-2, "default model");
}

// Greedy generation through the captured CUDA graph gives the same tokens as plain launches: the graph reads the
// token and position from device memory, so a replay at a later position must not reuse the first step's values.
TEST(CudaBackend, GraphReplayMatchesPlainLaunches) {
  TESSERA_REQUIRE_GPU();
  const Model m = make_random_model({.arch = "smollm2-135m", .dtype = "q8_0", .seed = 3, .n_layers = 2});
  const std::vector<int32_t> ids = random_ids(24, 49152, 9);
  const auto run = [&](bool graph, bool fuse = true) {
    if (graph)
      unsetenv("TESSERA_CUDA_GRAPH");
    else
      setenv("TESSERA_CUDA_GRAPH", "0", 1);
    if (fuse)
      unsetenv("TESSERA_CUDA_FUSE");
    else
      setenv("TESSERA_CUDA_FUSE", "0", 1);
    Session s(m, {.n_ctx = 64, .device = "cuda"});
    std::vector<float> all;
    for (int32_t id : ids) {
      const std::span<const float> l = s.decode(id);
      all.insert(all.end(), l.begin(), l.end());
    }
    unsetenv("TESSERA_CUDA_GRAPH");
    unsetenv("TESSERA_CUDA_FUSE");
    return all;
  };
  const std::vector<float> plain = run(false);
  const std::vector<float> graph = run(true);
  ASSERT_EQ(plain.size(), graph.size());
  double worst = 0;
  for (size_t i = 0; i < plain.size(); ++i) worst = std::max(worst, std::fabs(double(plain[i]) - graph[i]));
  EXPECT_LE(worst, 1e-5);  // same kernels, same inputs: any difference comes from launch order alone

  // Unfused (separate q, k, v and gate, up GEMVs; residual adds as their own launches): the same math with other
  // summation orders, so only f32 rounding differs, except where it flips one 8-bit activation rounding (one
  // quantization step of one element, ~1e-3 of the logits' scale after two layers).
  const std::vector<float> unfused = run(false, false);
  ASSERT_EQ(plain.size(), unfused.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    diff = std::max(diff, std::fabs(double(plain[i]) - unfused[i]));
    scale = std::max(scale, std::fabs(double(plain[i])));
  }
  EXPECT_LE(diff, 1e-2 * scale);
}

TEST(CudaBackend, ClearErrorWithoutGpuOrForBadDevice) {
  const Model m = make_random_model({.arch = "smollm2-135m", .dtype = "q8_0", .seed = 3, .n_layers = 1});
  EXPECT_THROW(Session(m, {.n_ctx = 16, .device = "tpu"}), Error);
  if (cuda::test::gpu_skip_reason().empty()) {
    EXPECT_THROW(Session(m, {.n_ctx = 16, .kv_dtype = "f32", .device = "cuda"}), Error);
    return;
  }
  try {
    Session s(m, {.n_ctx = 16, .device = "cuda"});
    ADD_FAILURE() << "a session on device 'cuda' started without a GPU";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("device 'cuda' is not available"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera
