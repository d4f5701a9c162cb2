// The CUDA backend against the CPU backend on whole models: synthetic two-layer SmolLM2-135M-shaped models (random
// weights, every GPU weight format) and the default model, decoded token by token through both sessions.
//
// Tolerances, by what differs between the two paths (both keep an f16 KV cache; F32CacheMatchesCpuOnF32Model: f32):
// - float weights (bf16, f16): both multiply f32 activations with the same weight values; only summation order
//   differs (f32 partial sums in another order, ~1e-6 relative per dot product), plus f16 rounding of cache entries
//   that may land on the other side of a rounding boundary: 1% relative L2 error leaves two orders of margin.
// - quantized weights (q8_0, q4_0, q4_1): both quantize activations to 8 bits per block of 32 (rounding step
//   max|x|/127, ~0.4% of the block's largest value), but a tiny upstream difference can flip one rounding, which moves
//   a dot product by up to one step of one element; through two layers that stays at a few tenths of a percent: 3%.
// Top-1 must agree in at least 99% of the decisive steps (see compare_sessions), and at least half must be decisive.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backends/cuda/attn_cudnn.h"
#include "backends/cuda/backend_cuda.h"
#include "backends/cuda/cuda_options.h"
#include "cuda_test_util.h"
#include "tessera/error.h"
#include "tessera/model.h"
#include "tessera/perplexity.h"
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

using cuda::test::random_ids;

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
  const bool quant = dtype.rfind("q", 0) == 0 || dtype.rfind("iq", 0) == 0;
  const double tol = quant ? 3e-2 : 1e-2;
  const Compare c = compare_sessions(m, random_ids(40, 49152, 11), tol);
  expect_close(c, tol, "smollm2-135m x2 layers, " + dtype);
}

INSTANTIATE_TEST_SUITE_P(Formats, CudaBackendDtype,
                         ::testing::Values("bf16", "f16", "q8_0", "q4_0", "q4_1", "iq4_nl"),
                         [](const auto& info) { return info.param; });

// The default model (Q4_1, 30 layers) on a real prompt followed by random ids: both the CPU fast path and the CUDA
// path quantize activations to 8 bits, independently, so they are judged against the CPU f32 reference path (f32
// weights dequantized, f32 activations and cache), not against each other. Measured on the CPU: the fast path's
// relative L2 error against the reference is ~1% at the median step and up to ~13% at the worst step of this input
// (random ids make flat, ill-conditioned steps), with top-1 equal to the reference's at ~95% of steps. The CUDA path
// must be as close to the reference as the CPU fast path is (median and 90th-percentile step within 1.5x + 2e-3, the
// worst step within 2x, top-1 agreement no more than 3 points lower), whether the prompt goes through prefill or token
// by token. The worst step alone is a noisy statistic of two independent 8-bit roundings: on the H100 (2026-11-22)
// token by token measured median 0.0118 vs the CPU's 0.0124 but worst 0.159 vs 0.105 (1.51x), which is why the worst
// step gets 2x and the 90th percentile carries the 1.5x.
TEST(CudaBackend, MatchesCpuOnDefaultModel) {
  TESSERA_REQUIRE_GPU();
  TESSERA_REQUIRE_DEFAULT_MODEL(path);
  const Model m = Model::load(path);
  std::vector<int32_t> ids = m.tokenizer().encode("The capital of France is Paris, and the capital of", true, false);
  const std::vector<int32_t> more = random_ids(64, 49152, 5);
  ids.insert(ids.end(), more.begin(), more.end());
  const int64_t n = static_cast<int64_t>(ids.size());
  const auto logits_of = [&](SessionOptions o, bool prefill) {
    o.n_ctx = n + 8;
    Session s(m, o);
    std::vector<float> all;
    if (prefill) return s.eval_all_logits(ids);
    for (int32_t id : ids) {
      const std::span<const float> l = s.decode(id);
      all.insert(all.end(), l.begin(), l.end());
    }
    return all;
  };
  const std::vector<float> ref = logits_of({.n_threads = 2, .reference = true}, false);
  const std::vector<float> cpu = logits_of({.n_threads = 2}, false);
  const size_t v = ref.size() / static_cast<size_t>(n);
  struct Err {
    double median = 0, p90 = 0, worst = 0, top1 = 0;
  };
  const auto err = [&](const std::vector<float>& x) {
    std::vector<double> rel;
    int agree = 0;
    for (int64_t t = 0; t < n; ++t) {
      const float* a = x.data() + static_cast<size_t>(t) * v;
      const float* r = ref.data() + static_cast<size_t>(t) * v;
      for (size_t i = 0; i < v; ++i) EXPECT_TRUE(std::isfinite(a[i])) << "logit " << i << " at step " << t;
      rel.push_back(cuda::test::rel_l2(a, r, v));
      agree += std::max_element(a, a + v) - a == std::max_element(r, r + v) - r ? 1 : 0;
    }
    std::sort(rel.begin(), rel.end());
    return Err{rel[rel.size() / 2], rel[rel.size() * 9 / 10], rel.back(), double(agree) / double(n)};
  };
  const Err e_cpu = err(cpu);
  std::cout << "default model, CPU fast path vs reference: median " << e_cpu.median << ", p90 " << e_cpu.p90
            << ", worst " << e_cpu.worst << ", top-1 " << e_cpu.top1 << "\n";
  for (const bool prefill : {false, true}) {
    const std::vector<float> gpu = logits_of({.n_threads = 2, .device = "cuda"}, prefill);
    ASSERT_EQ(gpu.size(), ref.size());
    const Err e = err(gpu);
    const std::string what = std::string("default model on cuda, ") + (prefill ? "prefill" : "token by token");
    std::cout << what << " vs reference: median " << e.median << ", p90 " << e.p90 << ", worst " << e.worst
              << ", top-1 " << e.top1 << "\n";
    EXPECT_LE(e.median, 1.5 * e_cpu.median + 2e-3) << what;
    EXPECT_LE(e.p90, 1.5 * e_cpu.p90 + 2e-3) << what;
    EXPECT_LE(e.worst, 2.0 * e_cpu.worst) << what;
    EXPECT_GE(e.top1, e_cpu.top1 - 0.03) << what;
  }
}

// Greedy generation through the captured CUDA graph gives the same tokens as plain launches: the graph reads the
// token and position from device memory, so a replay at a later position must not reuse the first step's values.
TEST(CudaBackend, GraphReplayMatchesPlainLaunches) {
  TESSERA_REQUIRE_GPU();
  const Model m = make_random_model({.arch = "smollm2-135m", .dtype = "q8_0", .seed = 3, .n_layers = 2});
  const std::vector<int32_t> ids = random_ids(24, 49152, 9);
  const auto run = [&](bool graph, bool fuse = true) {
    Session s(m, {.n_ctx = 64,
                  .device = "cuda",
                  .backend_options = {graph ? "graph=1" : "graph=0", fuse ? "fuse=1" : "fuse=0"}});
    std::vector<float> all;
    for (int32_t id : ids) {
      const std::span<const float> l = s.decode(id);
      all.insert(all.end(), l.begin(), l.end());
    }
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
    EXPECT_THROW(Session(m, {.n_ctx = 16, .kv_dtype = "q8_0", .device = "cuda"}), Error);
    EXPECT_EQ(Session(m, {.n_ctx = 16, .kv_dtype = "f32", .device = "cuda"}).kv_dtype(), "f32");  // opt-in f32 cache
    return;
  }
  try {
    Session s(m, {.n_ctx = 16, .device = "cuda"});
    ADD_FAILURE() << "a session on device 'cuda' started without a GPU";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("device 'cuda' is not available"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------------------------------------------------------------
// T-row executors: prefill chunks and batched decode against the CPU session.
//
// Tolerance 3% relative L2 for every format: the GPU matmul for many rows converts activations to the weight's 16-bit
// type (bf16: 2^-9 relative rounding per element) or, for quantized weights, dequantizes and multiplies 16-bit
// activations, while the CPU quantizes activations to 8 bits per block; both are rounding steps of a few tenths of a
// percent per element, as between the quantized paths above, so the quantized formats' 3% budget applies.

// Relative L2 error of `b` against `a` per row of `v`, and top-1 agreement on decisive rows (as compare_sessions).
Compare compare_rows(const std::vector<float>& a, std::span<const float> b, size_t v, double tol) {
  Compare c;
  EXPECT_EQ(a.size(), b.size());
  if (a.size() != b.size() || v == 0) return c;
  for (size_t r = 0; r < a.size() / v; ++r) {
    const float* x = a.data() + r * v;
    const float* y = b.data() + r * v;
    double num = 0, den = 0;
    size_t best = 0, second = 1, gpu_top = 0;
    for (size_t i = 0; i < v; ++i) {
      if (!std::isfinite(y[i])) {
        ADD_FAILURE() << "logit " << i << " of row " << r << " is not finite";
        return c;
      }
      num += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
      den += double(x[i]) * x[i];
      if (y[i] > y[gpu_top]) gpu_top = i;
    }
    if (x[second] > x[best]) std::swap(best, second);
    for (size_t i = 2; i < v; ++i)
      if (x[i] > x[best]) {
        second = best;
        best = i;
      } else if (x[i] > x[second]) {
        second = i;
      }
    c.worst_rel = std::max(c.worst_rel, std::sqrt(num / std::max(den, 1e-30)));
    if (x[best] - x[second] > 2 * tol * std::sqrt(den / double(v))) {
      ++c.decisive;
      c.agree += gpu_top == best ? 1 : 0;
    }
    ++c.steps;
  }
  return c;
}

struct PrefillCase {
  std::string dtype;
  int64_t n_batch;
};

class CudaPrefill : public ::testing::TestWithParam<PrefillCase> {};

// 100 random ids through the GPU prefill executor (chunks of n_batch: 32 gives 32+32+32+4, so a chunk at a later
// position and a short last chunk; 512 gives one chunk) with every row's logits, then the last-row graph, then decode
// steps that read the cache the prefill wrote.
TEST_P(CudaPrefill, MatchesCpuOnSyntheticModel) {
  TESSERA_REQUIRE_GPU();
  const PrefillCase pc = GetParam();
  const Model m = make_random_model({.arch = "smollm2-135m", .dtype = pc.dtype, .seed = 7, .n_layers = 2});
  const double tol = 3e-2;
  const std::vector<int32_t> ids = random_ids(100, 49152, 13);
  SessionOptions co{.n_ctx = 128, .n_batch = pc.n_batch, .n_threads = 2};
  SessionOptions go = co;
  go.device = "cuda";
  Session cpu(m, co), gpu(m, go);
  const std::vector<float> a = cpu.eval_all_logits(ids);
  const std::vector<float> b = gpu.eval_all_logits(ids);
  const std::string what = pc.dtype + ", n_batch " + std::to_string(pc.n_batch);
  expect_close(compare_rows(a, b, 49152, tol), tol, "prefill all rows, " + what);
  EXPECT_EQ(gpu.n_past(), 100);

  // Last-row graph: the same prompt on fresh contexts.
  cpu.reset();
  gpu.reset();
  const std::span<const float> la = cpu.eval(ids);
  const std::vector<float> last(la.begin(), la.end());
  const std::span<const float> lb = gpu.eval(ids);
  const Compare c = compare_rows(last, lb, 49152, tol);
  EXPECT_LE(c.worst_rel, tol) << "prefill last row, " << what;

  // Decode after the prefill: the cache rows the prefill stored are read back by the decoder.
  std::vector<float> da, db;
  for (int32_t id : random_ids(8, 49152, 17)) {
    const std::span<const float> x = cpu.decode(id);
    da.insert(da.end(), x.begin(), x.end());
    const std::span<const float> y = gpu.decode(id);
    db.insert(db.end(), y.begin(), y.end());
  }
  expect_close(compare_rows(da, db, 49152, tol), tol, "decode after prefill, " + what);
}

INSTANTIATE_TEST_SUITE_P(Formats, CudaPrefill,
                         ::testing::Values(PrefillCase{"bf16", 32}, PrefillCase{"f16", 32}, PrefillCase{"q8_0", 32},
                                           PrefillCase{"q4_1", 32}, PrefillCase{"bf16", 512},
                                           PrefillCase{"f16", 512}, PrefillCase{"q8_0", 512},
                                           PrefillCase{"q4_1", 512}),
                         [](const auto& info) { return info.param.dtype + "_b" + std::to_string(info.param.n_batch); });

// The 16-bit gate|up output (matmul_x16_out16 + swiglu_rows16) and prefill attention output against the f32 ones
// (TESSERA_CUDA_OUT16=0), on bf16 weights in one 100-row chunk: each rounds values the next matmul rounds to bf16
// anyway (attention output) or rounds gate and up once more (2^-9 relative), so the logits move by ~1e-3 relative;
// they must move (the path is taken) and stay far inside the CPU-vs-GPU tolerance of 3e-2.
TEST(CudaBackend, Out16PrefillMatchesF32Outputs) {
  TESSERA_REQUIRE_GPU();
  const Model m = make_random_model({.arch = "smollm2-135m", .dtype = "bf16", .seed = 9, .n_layers = 2});
  const std::vector<int32_t> ids = random_ids(100, 49152, 21);
  const auto run = [&](bool out16) {
    Session s(m, {.n_ctx = 128, .n_batch = 512, .device = "cuda", .backend_options = {out16 ? "out16=1" : "out16=0"}});
    return s.eval_all_logits(ids);
  };
  const std::vector<float> a = run(true), b = run(false);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_NE(a, b) << "TESSERA_CUDA_OUT16=0 changed nothing: the 16-bit outputs were not used";
  const Compare c = compare_rows(b, a, 49152, 1e-2);
  EXPECT_LE(c.worst_rel, 1e-2);
}

// Scores on the device (perplexity's path): each scored row's log-probability equals the log-softmax of the same
// session's all-row logits, where the rows before the first scored one are not multiplied by the output weights at
// all (RunArgs::logits_row0) and a -1 later in the chunk is skipped by the reduction. Chunks of 300 rows (the 16-bit
// x path of the logits matmul) and of 20 (f32 x), bf16 and q4_1 weights; an unscored prefix that covers the chunk.
TEST(CudaBackend, DeviceScoresSkipTheUnscoredPrefix) {
  TESSERA_REQUIRE_GPU();
  for (const char* dtype : {"bf16", "q4_1"}) {
    const Model m = make_random_model({.arch = "smollm2-135m", .dtype = dtype, .seed = 5, .n_layers = 2});
    for (const int64_t n : {int64_t{300}, int64_t{20}}) {
      SCOPED_TRACE(std::string(dtype) + " chunk " + std::to_string(n));
      const std::vector<int32_t> ids = random_ids(static_cast<int>(n), 49152, 31);
      Session s(m, {.n_ctx = 512, .n_batch = 512, .device = "cuda"});
      ASSERT_TRUE(s.scores_on_device());
      const std::vector<float> all = s.eval_all_logits(ids);
      std::vector<int32_t> targets(ids.size(), -1);
      const int64_t first = n / 2;
      for (int64_t r = first; r < n; ++r) targets[static_cast<size_t>(r)] = ids[static_cast<size_t>((r * 7) % n)];
      targets[static_cast<size_t>(first + 3)] = -1;  // a hole after the prefix
      s.reset();
      const std::vector<double> lp = s.eval_target_logprobs(ids, targets);
      ASSERT_EQ(lp.size(), ids.size());
      for (int64_t r = 0; r < n; ++r) {
        const int32_t t = targets[static_cast<size_t>(r)];
        if (t < 0) {
          EXPECT_EQ(lp[static_cast<size_t>(r)], 0.0) << "row " << r;
          continue;
        }
        const std::span<const float> row(all.data() + r * 49152, 49152);
        // bf16: the same products in another GEMM blocking (~1e-6 relative). q4_1: a logits matmul of fewer rows may
        // take another kernel (8-bit activations vs 16-bit expansion), so the two log-probabilities differ by the
        // activation rounding (measured up to 5e-3 at logits of ~10).
        EXPECT_NEAR(lp[static_cast<size_t>(r)], -token_nll(row, t), std::string(dtype) == "bf16" ? 2e-3 : 2e-2)
            << "row " << r;
      }
      s.reset();  // nothing scored: the logits matmul runs no row, every answer is 0
      const std::vector<double> none = s.eval_target_logprobs(ids, std::vector<int32_t>(ids.size(), -1));
      EXPECT_EQ(none, std::vector<double>(ids.size(), 0.0));
    }
  }
}

// Prefill attention through cuDNN (chunks of >= 256 rows, where it is available: libcudnn loadable, Hopper; with
// TESSERA_CUDA_ATTN_TMA=0, since head dimension 64 takes our own attn_prefill_tma by default) against the CPU session,
// and against attn_prefill (TESSERA_CUDA_CUDNN=0 too) on the same GPU: 300 ids in one chunk on bf16 and f16 weights
// (the default f16 cache: bf16 weights also take the f16 -> bf16 conversion of the attention's output), then a
// 300-row chunk after 200 cached positions (bottom-right causal alignment). The default path (attn_prefill_tma where
// supported) against the CPU session too. Skips where cuDNN is unavailable.
TEST(CudaBackend, CudnnPrefillMatchesCpuAndAttnPrefill) {
  TESSERA_REQUIRE_GPU();
  std::string why;
  if (!cuda::cudnn_attention_available(&why)) GTEST_SKIP() << "cuDNN attention unavailable: " << why;
  const double tol = 3e-2;
  for (const std::string dtype : {"bf16", "f16"}) {
    SCOPED_TRACE(dtype);
    const Model m = make_random_model({.arch = "smollm2-135m", .dtype = dtype, .seed = 11, .n_layers = 2});
    const std::vector<int32_t> first = random_ids(200, 49152, 23), ids = random_ids(300, 49152, 29);
    SessionOptions co{.n_ctx = 512, .n_batch = 512, .n_threads = 2};
    SessionOptions go = co;
    go.device = "cuda";
    // Every row's logits of `ids` on a fresh context, then after `first`.
    const auto both_chunks = [&](Session& s) {
      std::vector<float> a = s.eval_all_logits(ids);
      s.reset();
      s.eval(first);
      const std::vector<float> b = s.eval_all_logits(ids);
      a.insert(a.end(), b.begin(), b.end());
      return a;
    };
    // tma / cudnn false: TESSERA_CUDA_ATTN_TMA=0 / CudaOptions::cudnn off (read when the prefill executor is built, at
    // the first chunk: set until the session is done).
    const auto gpu_logits = [&](bool tma, bool cudnn) {
      SessionOptions o = go;
      o.backend_options = {tma ? "attn_tma=1" : "attn_tma=0", cudnn ? "cudnn=1" : "cudnn=0"};
      Session s(m, o);
      return both_chunks(s);
    };
    Session cpu(m, co);
    const std::vector<float> ref = both_chunks(cpu);
    const std::vector<float> by_default = gpu_logits(true, true);
    expect_close(compare_rows(ref, by_default, 49152, tol), tol, "default prefill attention vs CPU, " + dtype);
    const std::vector<float> with = gpu_logits(false, true), without = gpu_logits(false, false);
    expect_close(compare_rows(ref, with, 49152, tol), tol, "cuDNN prefill vs CPU, " + dtype);
    EXPECT_NE(with, without) << "CudaOptions::cudnn off changed nothing: cuDNN was not used";
    EXPECT_LE(compare_rows(without, with, 49152, 1e-2).worst_rel, 1e-2);
  }
}

// The opt-in f32 KV cache on an f32 model, against the CPU session with an f32 cache: nothing is rounded to 16 bits
// on either side (f32 GEMV, the f32 cuBLASLt GEMM without TF32, f32 cache, the FFMA prefill attention and f32 decode
// attention), so the two differ by summation order alone, ~1e-6 relative per dot product; 1e-4 relative L2 per row
// leaves two orders of margin, while an f16 cache on either side rounds every cached k and v by up to 2^-11.
// 70 ids in chunks of 32 (32 + 32 + 6, later chunks reading earlier ones from the cache), then decode steps.
TEST(CudaBackend, F32CacheMatchesCpuOnF32Model) {
  TESSERA_REQUIRE_GPU();
  const Model m = make_random_model({.arch = "smollm2-135m", .dtype = "f32", .seed = 11, .n_layers = 2});
  const double tol = 1e-4;
  const std::vector<int32_t> ids = random_ids(70, 49152, 19);
  SessionOptions co{.n_ctx = 128, .n_batch = 32, .n_threads = 2, .kv_dtype = "f32"};
  SessionOptions go = co;
  go.device = "cuda";
  Session cpu(m, co), gpu(m, go);
  ASSERT_EQ(gpu.kv_dtype(), "f32");
  const std::vector<float> a = cpu.eval_all_logits(ids);
  const std::vector<float> b = gpu.eval_all_logits(ids);
  expect_close(compare_rows(a, b, 49152, tol), tol, "f32 model, f32 cache, prefill all rows");
  std::vector<float> da, db;
  for (int32_t id : random_ids(8, 49152, 23)) {
    const std::span<const float> x = cpu.decode(id);
    da.insert(da.end(), x.begin(), x.end());
    const std::span<const float> y = gpu.decode(id);
    db.insert(db.end(), y.begin(), y.end());
  }
  expect_close(compare_rows(da, db, 49152, tol), tol, "f32 model, f32 cache, decode after prefill");
}

class CudaDecodeBatch : public ::testing::TestWithParam<std::tuple<int, const char*>> {};

// B sequences at different positions (prompts of 5 + 3 s tokens) advanced together by decode_batch; each row against
// a CPU session decoding that sequence alone. Includes a step over a subset of the slots in another order and steps
// replayed from the captured CUDA graph. bf16 at B = 8 takes the 16-bit matmul inputs (matmul_x16: bf16 rounding of
// the activations, ~2^-9 relative per element, well inside the 3% also allowed for q8_0's 8-bit activations) and the
// merged gate|up matmul.
TEST_P(CudaDecodeBatch, MatchesPerSequenceCpuDecode) {
  TESSERA_REQUIRE_GPU();
  const int b = std::get<0>(GetParam());
  const std::string dtype = std::get<1>(GetParam());
  const Model m = make_random_model({.arch = "smollm2-135m", .dtype = dtype, .seed = 5, .n_layers = 2});
  const double tol = 3e-2;
  SessionOptions go{.n_ctx = 96, .n_batch = 16, .device = "cuda", .n_seq = b};
  Session gpu(m, go);
  std::vector<std::unique_ptr<Session>> cpu;
  for (int s = 0; s < b; ++s) {
    cpu.push_back(std::make_unique<Session>(m, SessionOptions{.n_ctx = 96, .n_batch = 16, .n_threads = 2}));
    const std::vector<int32_t> prompt = random_ids(5 + 3 * s, 49152, 100 + uint32_t(s));
    cpu.back()->eval(prompt);
    gpu.eval_seq(s, prompt, false);
    EXPECT_EQ(gpu.n_past(s), 5 + 3 * s);
  }
  std::vector<float> want, got;
  for (int step = 0; step < 6; ++step) {
    std::vector<int32_t> seqs;
    for (int s = 0; s < b; ++s) seqs.push_back(step == 5 ? b - 1 - s : s);
    if (step == 5 && b > 1) seqs.pop_back();  // a smaller batch of another size and order
    const std::vector<int32_t> ids = random_ids(int(seqs.size()), 49152, 200 + uint32_t(step));
    const std::span<const float> out = gpu.decode_batch(ids, seqs);
    got.insert(got.end(), out.begin(), out.end());
    for (size_t i = 0; i < seqs.size(); ++i) {
      const std::span<const float> r = cpu[static_cast<size_t>(seqs[i])]->decode(ids[i]);
      want.insert(want.end(), r.begin(), r.end());
    }
  }
  expect_close(compare_rows(want, got, 49152, tol), tol, "decode_batch " + dtype + " B=" + std::to_string(b));
  for (int s = 0; s < b; ++s) EXPECT_EQ(gpu.tokens(s), cpu[static_cast<size_t>(s)]->tokens());
  EXPECT_THROW(gpu.decode_batch(std::vector<int32_t>{1, 2}, std::vector<int32_t>{0, 0}), Error);
  EXPECT_THROW(gpu.decode_batch(std::vector<int32_t>{1}, std::vector<int32_t>{b}), Error);
}

INSTANTIATE_TEST_SUITE_P(Sizes, CudaDecodeBatch,
                         ::testing::Values(std::make_tuple(3, "q8_0"), std::make_tuple(8, "q8_0"),
                                           std::make_tuple(8, "bf16")),
                         [](const auto& info) {
                           return std::string(std::get<1>(info.param)) + "_B" + std::to_string(std::get<0>(info.param));
                         });

// generate_batch (prefill per slot, then batched decode steps) picks the same greedy tokens as generate per prompt,
// both on the GPU.
TEST(CudaBackend, GenerateBatchGreedyEqualsGenerate) {
  TESSERA_REQUIRE_GPU();
  const Model m = make_random_model({.arch = "smollm2-135m", .dtype = "q4_1", .seed = 9, .n_layers = 2});
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back(random_ids(6 + 17 * i, 49152, 300 + uint32_t(i)));
  GenerateOptions g;
  g.max_tokens = 16;
  g.sampling.temperature = 0;
  Session batch(m, {.n_ctx = 128, .n_batch = 32, .device = "cuda", .n_seq = 4});
  const std::vector<GenerateResult> got = batch.generate_batch(prompts, g);
  ASSERT_EQ(got.size(), prompts.size());
  Session one(m, {.n_ctx = 128, .n_batch = 32, .device = "cuda"});
  int same = 0, total = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    one.reset();
    const GenerateResult want = one.generate_tokens(prompts[i], g);
    ASSERT_EQ(got[i].tokens.size(), want.tokens.size()) << "prompt " << i;
    // Batched and single-row matmuls sum in different orders: a near-tie may flip one greedy choice, after which the
    // sequences legitimately diverge. Count agreement up to the first difference.
    for (size_t k = 0; k < want.tokens.size(); ++k, ++total) {
      if (got[i].tokens[k] != want.tokens[k]) break;
      ++same;
    }
  }
  std::cout << "generate_batch agrees with generate on " << same << " of " << total << " leading tokens\n";
  EXPECT_GE(same * 10, total * 9);
}

// Per-node GPU times through Session::profile_ns: prefill chunks (32 and the 8 left) and decode steps.
TEST(CudaBackend, ProfileCountsEveryLaunch) {
  TESSERA_REQUIRE_GPU();
  const Model m = make_random_model({.arch = "smollm2-135m", .dtype = "q8_0", .seed = 3, .n_layers = 2});
  Session s(m, {.n_ctx = 64, .n_batch = 32, .device = "cuda"});
  s.set_profiling(true);
  s.eval(random_ids(40, 49152, 1));
  s.decode(5);
  s.decode(6);
  s.set_profiling(false);
  for (int64_t t : {32, 8, 1}) {
    const std::vector<uint64_t> ns = s.profile_ns(t);
    ASSERT_EQ(ns.size(), s.graph(t).nodes().size()) << "chunk " << t;
    uint64_t total = 0;
    for (uint64_t x : ns) total += x;
    EXPECT_GT(total, 0u) << "chunk " << t;
    const GraphView gv = s.graph(t);
    for (size_t i = 0; i < ns.size(); ++i) {
      if (gv.nodes()[i].op == "matmul" && gv.nodes()[i].name.find("ffn_down") != std::string::npos) {
        EXPECT_GT(ns[i], 0u) << gv.nodes()[i].name << " chunk " << t;
      }
    }
  }
}

// Greedy decoding with the argmax on the device picks exactly the argmax of the logits the logits-returning calls
// give (same model, same ids, two sessions): the decoder (slot 0, decode_greedy), a one-row batch of another slot, and
// batches of 3 and 8 rows (decode_batch_greedy). After a greedy decoder step logits() fetches that step's logits from
// the device (the same kernels on the same inputs: bit for bit a's).
TEST(CudaBackend, GreedyDecodeIsTheLogitsArgmax) {
  TESSERA_REQUIRE_GPU();
  const Model m = make_random_model({.arch = "smollm2-135m", .dtype = "bf16", .seed = 21, .n_layers = 2});
  const auto argmax_of = [](std::span<const float> l) {
    return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());  // the first on ties
  };
  SessionOptions o{.n_ctx = 64, .n_batch = 16, .device = "cuda", .n_seq = 8};
  Session a(m, o), b(m, o);
  const std::vector<int32_t> ids = random_ids(12, 49152, 31);
  for (int32_t id : ids) {
    const std::span<const float> l = a.decode(id);
    EXPECT_EQ(b.decode_greedy(id), argmax_of(l));
  }
  {
    const std::span<const float> la = a.logits(), lb = b.logits();
    EXPECT_EQ(std::vector<float>(lb.begin(), lb.end()), std::vector<float>(la.begin(), la.end()));
  }
  EXPECT_EQ(a.tokens(), b.tokens());
  for (const int rows : {1, 3, 8}) {
    SCOPED_TRACE(::testing::Message() << rows << " rows");
    std::vector<int32_t> seqs;
    for (int s = 0; s < rows; ++s) seqs.push_back(rows == 1 ? 5 : (s + 1) % 8);  // slot 0 last, or alone slot 5
    for (int step = 0; step < 3; ++step) {
      const std::vector<int32_t> t = random_ids(rows, 49152, 40 + uint32_t(step + 10 * rows));
      const std::span<const float> l = a.decode_batch(t, seqs);
      const std::vector<int32_t> g = b.decode_batch_greedy(t, seqs);
      ASSERT_EQ(g.size(), size_t(rows));
      for (int r = 0; r < rows; ++r)
        EXPECT_EQ(g[size_t(r)], argmax_of(l.subspan(size_t(r) * 49152, 49152))) << "row " << r << " step " << step;
    }
  }
  for (int s = 0; s < 8; ++s) EXPECT_EQ(a.tokens(s), b.tokens(s)) << "slot " << s;
  EXPECT_THROW(b.decode_batch_greedy(std::vector<int32_t>{1, 2}, std::vector<int32_t>{3, 3}), Error);
}

// Prefill attention of a head-128 model (Llama-3.2-3B shape, one layer) through our TMA kernel (the default for
// chunks of >= 256 rows there) against the same prompt with TESSERA_CUDA_ATTN_TMA=0 (cuDNN's kernel, or attn_prefill
// where cuDNN is absent): chunks of 256 at p0 = 0, 256 and 512 (the third ragged, 88 rows: attn_prefill on both
// sides), every row's logits. Both sides round P to 16 bits in another order: the logits agree to a small fraction of
// their scale and the argmax where the top two are apart.
TEST(CudaBackend, PrefillAttentionTmaMatchesTheOtherPath) {
  TESSERA_REQUIRE_GPU();
  // Head dimension 128 (Llama-3.2-3B's heads, 24/8) and 64 (SmolLM2's, 9/3).
  const struct {
    const char* arch;
    int32_t vocab;
  } shapes[] = {{"llama3.2-3b", 128256}, {"smollm2-135m", 49152}};
  for (const auto& sh : shapes) {
    SCOPED_TRACE(sh.arch);
    const Model m = make_random_model({.arch = sh.arch, .dtype = "q8_0", .seed = 7, .n_layers = 1});
    const std::vector<int32_t> ids = random_ids(600, sh.vocab, 33);
    const auto run = [&](bool tma) {
      Session s(m, {.n_ctx = 640, .n_batch = 256, .device = "cuda", .backend_options = {tma ? "attn_tma=1" : "attn_tma=0"}});
      return s.eval_all_logits(ids);
    };
    const std::vector<float> a = run(true), b = run(false);
    ASSERT_EQ(a.size(), b.size());
    const size_t vocab = a.size() / ids.size();
    double worst = 0, scale = 0;
    int argmax_checked = 0, argmax_same = 0;
    for (size_t r = 0; r < ids.size(); ++r) {
      const float* x = a.data() + r * vocab;
      const float* y = b.data() + r * vocab;
      double d = 0, sc = 0;
      size_t ia = 0, ib = 0;
      for (size_t i = 0; i < vocab; ++i) {
        ASSERT_TRUE(std::isfinite(x[i])) << "row " << r;
        d = std::max(d, std::fabs(double(x[i]) - y[i]));
        sc = std::max(sc, std::fabs(double(y[i])));
        if (x[i] > x[ia]) ia = i;
        if (y[i] > y[ib]) ib = i;
      }
      worst = std::max(worst, d / sc);
      scale = std::max(scale, sc);
      // The argmax where the reference's top two are apart by more than the tolerance.
      float second = -INFINITY;
      for (size_t i = 0; i < vocab; ++i)
        if (i != ib) second = std::max(second, y[i]);
      if (y[ib] - second > 2e-2 * sc) {
        ++argmax_checked;
        argmax_same += ia == ib;
      }
    }
    std::cout << "prefill attention TMA vs other path, " << sh.arch << ": worst row max|diff|/max|logit| " << worst
              << ", argmax " << argmax_same << "/" << argmax_checked << "\n";
    EXPECT_LE(worst, 2e-2);
    EXPECT_GT(worst, 0.0);  // two different kernels: equal logits would mean one path ran twice
    EXPECT_EQ(argmax_same, argmax_checked);
    EXPECT_GT(argmax_checked, 10);
  }
}

// Sampled generation draws on the device (CudaDecoder::decode_sample: penalties, top-k, top-p, min-p, temperature,
// the host generator's number) and picks the same tokens as the host sampler drawing from the same steps' logits
// copied back (TESSERA_CUDA_SAMPLE=0), for several option sets and seeds; the sampler's generator advances the same
// way (the seeds' streams stay aligned over the whole generation), the contexts agree, logits() after the generation
// is the last step's, and the stop reasons (max_tokens, a full context) are the same.
TEST(CudaBackend, DeviceSamplingEqualsHostSampling) {
  TESSERA_REQUIRE_GPU();
  const Model m = make_random_model({.arch = "smollm2-135m", .dtype = "q8_0", .seed = 5, .n_layers = 2});
  const std::vector<int32_t> prompt = random_ids(12, 49152, 21);
  struct Case {
    const char* name;
    SamplingOptions o;
    int64_t max_tokens, n_ctx;
  };
  std::vector<Case> cases;
  SamplingOptions o;
  cases.push_back({"defaults", o, 40, 128});
  o.top_k = 0, o.top_p = 1.0f, o.min_p = 0.0f, o.temperature = 1.0f;
  cases.push_back({"the whole vocabulary at T 1", o, 40, 128});
  o = SamplingOptions{};
  o.repeat_penalty = 1.5f, o.frequency_penalty = 0.3f, o.presence_penalty = 0.2f, o.penalty_last_n = 16;
  cases.push_back({"penalties, last 16", o, 40, 128});
  o.temperature = 0.0f, o.penalty_last_n = -1;
  cases.push_back({"greedy after penalties", o, 40, 128});
  o = SamplingOptions{};
  o.top_p = 0.5f, o.temperature = 1.2f;
  cases.push_back({"top-p 0.5, to a full context", o, 1000, 40});
  cases.push_back({"max_tokens 1", SamplingOptions{}, 1, 128});
  for (const Case& c : cases) {
    for (uint64_t seed : {1ull, 77ull}) {
      SCOPED_TRACE(std::string(c.name) + ", seed " + std::to_string(seed));
      GenerateOptions g;
      g.max_tokens = c.max_tokens;
      g.ignore_eos = true;
      g.sampling = c.o;
      g.sampling.seed = seed;
      const auto run = [&](bool device, std::vector<int32_t>* context, std::vector<float>* last) {
        Session s(m, {.n_ctx = c.n_ctx, .device = "cuda", .backend_options = {device ? "sample=1" : "sample=0"}});
        GenerateResult r = s.generate_tokens(prompt, g);
        *context = s.tokens();
        const std::span<const float> l = s.logits();
        last->assign(l.begin(), l.end());
        return r;
      };
      std::vector<int32_t> ctx_dev, ctx_host;
      std::vector<float> l_dev, l_host;
      const GenerateResult dev = run(true, &ctx_dev, &l_dev);
      const GenerateResult host = run(false, &ctx_host, &l_host);
      EXPECT_EQ(dev.tokens, host.tokens);
      EXPECT_EQ(ctx_dev, ctx_host);
      EXPECT_EQ(dev.stop_reason, host.stop_reason);
      EXPECT_EQ(dev.seed, seed);
      const int64_t want = c.n_ctx < 100 ? c.n_ctx - static_cast<int64_t>(prompt.size()) + 1 : c.max_tokens;
      EXPECT_EQ(static_cast<int64_t>(dev.tokens.size()), want);
      EXPECT_EQ(dev.stop_reason, c.n_ctx < 100 ? StopReason::CONTEXT_FULL : StopReason::MAX_TOKENS);
      ASSERT_EQ(l_dev.size(), l_host.size());
      ASSERT_FALSE(l_dev.empty());
      double worst = 0;
      for (size_t i = 0; i < l_dev.size(); ++i) worst = std::max(worst, std::fabs(double(l_dev[i]) - l_host[i]));
      EXPECT_LE(worst, 1e-5);  // the same step's logits, fetched after a device draw or copied for a host draw
      if (c.o.temperature > 0 && c.max_tokens > 1) {  // a real draw: the tokens vary (a stuck sampler would repeat)
        std::vector<int32_t> distinct = dev.tokens;
        std::sort(distinct.begin(), distinct.end());
        EXPECT_GT(std::unique(distinct.begin(), distinct.end()) - distinct.begin(), 3);
      }
    }
  }
}

// Greedy decoding chained on the device (decode_greedy_chain: each step's argmax feeds the next, the host reads the
// tokens a step or two behind) picks the same tokens as decode_greedy step by step, leaves the same context and the
// same last logits; a chain stopped early by its callback drops the steps that ran ahead without disturbing what
// follows; a chain asked for more tokens than the context holds stops at the end of the context. The same with 1, 3
// (a remainder of single steps) and the default 8 steps per launch (TESSERA_CUDA_CHAIN_STEPS), with the embedding
// launched per step instead of written by the argmax (TESSERA_CUDA_CHAIN_EMBED=0), with TESSERA_CUDA_CHAIN=0 (step by
// step inside the decoder), and with a q4_1 embedding table (the folded embedding reads quantized rows).
TEST(CudaBackend, GreedyChainEqualsStepByStep) {
  TESSERA_REQUIRE_GPU();
  struct Config {
    const char *dtype, *chain, *steps, *embed;
  };
  const Config configs[] = {{"bf16", "1", "", ""},  {"bf16", "1", "1", ""}, {"bf16", "1", "3", ""},
                            {"bf16", "1", "", "0"}, {"bf16", "0", "", ""},  {"q4_1", "1", "3", ""}};
  for (const Config& cf : configs) {
    SCOPED_TRACE(::testing::Message() << cf.dtype << " TESSERA_CUDA_CHAIN=" << cf.chain
                                      << " TESSERA_CUDA_CHAIN_STEPS=" << cf.steps
                                      << " TESSERA_CUDA_CHAIN_EMBED=" << cf.embed);
    const Model m = make_random_model({.arch = "smollm2-135m", .dtype = cf.dtype, .seed = 23, .n_layers = 2});
    SessionOptions o{.n_ctx = 64, .n_batch = 16, .device = "cuda"};
    o.backend_options = {std::string("chain=") + cf.chain};
    if (*cf.steps != '\0') o.backend_options.push_back(std::string("chain_steps=") + cf.steps);
    if (*cf.embed != '\0') o.backend_options.push_back(std::string("chain_embed=") + cf.embed);
    Session a(m, o), b(m, o);
    const std::vector<int32_t> prompt = random_ids(10, 49152, 77);
    a.eval(prompt);
    b.eval(prompt);
    // Step by step on b; chained on a.
    const auto steps = [&](int32_t t, int n) {
      std::vector<int32_t> out;
      for (int i = 0; i < n; ++i) out.push_back(t = b.decode_greedy(t));
      return out;
    };
    std::vector<int32_t> got;
    const auto collect = [&](int64_t stop_after) {
      return [&got, stop_after](int32_t id) {
        got.push_back(id);
        return static_cast<int64_t>(got.size()) < stop_after;
      };
    };
    EXPECT_EQ(a.decode_greedy_chain(5, 20, collect(1000)), 20);
    EXPECT_EQ(got, steps(5, 20));
    EXPECT_EQ(a.tokens(), b.tokens());
    {
      const std::span<const float> la = a.logits(), lb = b.logits();
      EXPECT_EQ(std::vector<float>(la.begin(), la.end()), std::vector<float>(lb.begin(), lb.end()));
    }
    // Stopped by the callback after 4 tokens (up to two more steps ran ahead on the device and are dropped).
    got.clear();
    EXPECT_EQ(a.decode_greedy_chain(7, 20, collect(4)), 4);
    EXPECT_EQ(got, steps(7, 4));
    EXPECT_EQ(a.tokens(), b.tokens());
    const std::span<const float> la = a.decode(got.back());
    const std::vector<float> la_copy(la.begin(), la.end());
    const std::span<const float> lb = b.decode(got.back());
    EXPECT_EQ(la_copy, std::vector<float>(lb.begin(), lb.end()));
    // More than the context holds: the chain stops at its end (64 - 35 = 29 tokens).
    got.clear();
    ASSERT_EQ(a.n_past(), 35);
    EXPECT_EQ(a.decode_greedy_chain(9, 100, collect(1000)), 29);
    EXPECT_EQ(got, steps(9, 29));
    EXPECT_EQ(a.tokens(), b.tokens());
    EXPECT_THROW(a.decode_greedy_chain(9, 1, collect(1000)), Error);  // the context is full
    a.truncate(10);
    EXPECT_THROW(a.decode_greedy_chain(-1, 3, collect(1000)), Error);  // outside the vocabulary
    EXPECT_EQ(a.n_past(), 10);
  }
}

// Quantized weights with the fold on and off: attn_q8 (on by default; attention writes the o-projection's 8-bit input
// itself, no quantize_q8 launch). It reproduces the launch it replaces exactly (the same quantization of the same
// values), so the logits are bit for bit the default decoder's, step by step and chained, over a cache the compact
// attention kernel serves (64) and one the split kernel serves (2048).
TEST(CudaBackend, QuantizedFoldsMatchTheLaunchesTheyReplace) {
  TESSERA_REQUIRE_GPU();
  for (const char* dtype : {"q8_0", "q4_1"})
    for (const int64_t n_ctx : {int64_t{64}, int64_t{2048}}) {
      const Model m = make_random_model({.arch = "smollm2-135m", .dtype = dtype, .seed = 29, .n_layers = 2});
      const std::vector<int32_t> prompt = random_ids(12, 49152, 5);
      std::vector<std::vector<float>> logits[2];
      std::vector<int32_t> chained[2];
      for (int i = 0; i < 2; ++i) {
        SCOPED_TRACE(::testing::Message() << dtype << " n_ctx " << n_ctx << " attn_q8=" << i);
        Session s(m, {.n_ctx = n_ctx,
                      .n_batch = 16,
                      .device = "cuda",
                      .backend_options = {std::string("attn_q8=") + (i == 0 ? "1" : "0")}});
        s.eval(prompt);
        for (int32_t id : {11, 12, 13, 14}) {
          const std::span<const float> l = s.decode(id);
          logits[i].emplace_back(l.begin(), l.end());
        }
        s.decode_greedy_chain(15, 6, [&](int32_t t) { return chained[i].push_back(t), true; });
        if (i > 0) {
          EXPECT_EQ(logits[i], logits[0]);
          EXPECT_EQ(chained[i], chained[0]);
        }
      }
    }
}

// A profiled decode of `ids`, one token at a time, in a fresh session with the CUDA options `env` (named as the
// former environment switches): every step's logits, and per decode-graph node its GPU time (0: it launches nothing)
// and "op name".
struct ProfiledDecode {
  std::vector<float> logits;
  std::vector<uint64_t> ns;
  std::vector<std::string> names;
};
ProfiledDecode decode_profiled(const Model& m, const std::vector<int32_t>& ids,
                               const std::vector<std::pair<const char*, const char*>>& env) {
  // The former switch names as CUDA option keys: TESSERA_CUDA_FOLD_NORM=0 is fold_norm=0 (quant_norm: 1 all, 0 none).
  std::vector<std::string> options;
  for (const auto& [k, v] : env) {
    std::string key = std::string(k).substr(std::string("TESSERA_CUDA_").size()), value = v;
    for (char& ch : key) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (key == "quant_norm") value = value == "1" ? "all" : value == "0" ? "none" : value;
    if (!value.empty()) options.push_back(key + "=" + value);
  }
  ProfiledDecode r;
  {
    Session s(m, {.n_ctx = 32, .device = "cuda", .backend_options = options});
    s.set_profiling(true);
    for (int32_t id : ids) {
      const std::span<const float> l = s.decode(id);
      r.logits.insert(r.logits.end(), l.begin(), l.end());
    }
    s.set_profiling(false);
    r.ns = s.profile_ns(1);
    const GraphView gv = s.graph(1);
    for (const auto& n : gv.nodes()) r.names.push_back(n.op + " " + n.name);
  }
  return r;
}

// ||a - b|| / ||b|| over two runs' logits (every value of a finite).
double relative_l2(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) EXPECT_TRUE(std::isfinite(a[i])) << "logit " << i;
  return cuda::test::rel_l2(a.data(), b.data(), n);
}

// Float weights: the decoder folds each RMSNorm into the GEMVs reading it and the SwiGLU into the gate|up GEMV's
// epilogue, so those nodes launch nothing (profile time 0) and the logits match the unfolded decoder
// (TESSERA_CUDA_FOLD_NORM=0, TESSERA_CUDA_FOLD_SWIGLU=0) up to f32 rounding: the folded GEMV sums x^2 itself and
// scales each row's sum once (a few ulp per dot product), and such a difference in k or v now and then lands an f16
// cache entry on the other side of a rounding boundary (2^-11 relative). Measured on the H100: 1.06e-5 relative L2;
// the limit, 1e-4, is two orders below the CPU-vs-GPU tolerance above and far below what a wrong fold would give.
TEST(CudaBackend, FoldedNormAndSwigluMatchUnfolded) {
  TESSERA_REQUIRE_GPU();
  const Model m = make_random_model({.arch = "smollm2-135m", .dtype = "bf16", .seed = 5, .n_layers = 2});
  const std::vector<int32_t> ids = random_ids(12, 49152, 4);
  const ProfiledDecode a = decode_profiled(m, ids, {});
  const ProfiledDecode b = decode_profiled(m, ids, {{"TESSERA_CUDA_FOLD_NORM", "0"}, {"TESSERA_CUDA_FOLD_SWIGLU", "0"}});
  ASSERT_EQ(a.names, b.names);
  int norms = 0, swiglus = 0;
  for (size_t i = 0; i < a.names.size(); ++i) {
    const bool layer_norm = a.names[i].rfind("rmsnorm blk.", 0) == 0;
    const bool swiglu = a.names[i].rfind("swiglu ", 0) == 0;
    if (!layer_norm && !swiglu) continue;
    norms += layer_norm;
    swiglus += swiglu;
    EXPECT_EQ(a.ns[i], 0u) << a.names[i] << " still launches";
    EXPECT_GT(b.ns[i], 0u) << a.names[i] << " launches nothing with folding off";
  }
  EXPECT_EQ(norms, 4);
  EXPECT_EQ(swiglus, 2);
  const double rel = relative_l2(a.logits, b.logits);
  std::cout << "folded vs unfolded decoder, bf16: relative L2 difference " << rel << "\n";
  EXPECT_LT(rel, 1e-4);
}

// The RMSNorm before quantized GEMVs folded into the residual GEMV before it (q4_1 by default; TESSERA_CUDA_QUANT_NORM
// = 1 / 0 for every format): every layer norm but the first (its input comes from the embedding, not a GEMV) launches
// nothing, and the logits agree with the unfolded decoder's to 5e-3 relative L2: the two sides quantize differently
// rounded products of x w, and the warp groups sum the residual GEMV's rows in another order than the unfolded launch,
// so its residual stream differs in the last bit and a code flips where one lands within a rounding error of a half
// step (measured on the H100: 1.6e-7 q4_0, 2.2e-4 q8_0, 2.0e-3 q4_1; a missing or wrong 1/rms would be off by tens of
// percent).
TEST(CudaBackend, QuantNormFoldMatchesUnfolded) {
  TESSERA_REQUIRE_GPU();
  for (const char* dtype : {"q8_0", "q4_0", "q4_1"}) {
    SCOPED_TRACE(dtype);
    const Model m = make_random_model({.arch = "smollm2-135m", .dtype = dtype, .seed = 31, .n_layers = 2});
    const std::vector<int32_t> ids = random_ids(12, 49152, 6);
    const ProfiledDecode a = decode_profiled(m, ids, {{"TESSERA_CUDA_QUANT_NORM", "1"}});
    const ProfiledDecode b = decode_profiled(m, ids, {{"TESSERA_CUDA_QUANT_NORM", "0"}});
    ASSERT_EQ(a.names, b.names);
    int folded = 0, launched = 0;
    for (size_t i = 0; i < a.names.size(); ++i) {
      if (a.names[i].rfind("rmsnorm blk.", 0) != 0) continue;
      EXPECT_GT(b.ns[i], 0u) << a.names[i] << " launches nothing with the fold off";
      EXPECT_EQ(a.ns[i] == 0, a.names[i] != "rmsnorm blk.0.attn_norm") << a.names[i];
      folded += a.ns[i] == 0;
      launched += a.ns[i] > 0;
    }
    EXPECT_EQ(folded, 3);
    EXPECT_EQ(launched, 1);
    const double rel = relative_l2(a.logits, b.logits);
    std::cout << "quantized norm fold vs unfolded, " << dtype << ": relative L2 " << rel << "\n";
    EXPECT_LT(rel, 5e-3);
  }
}

// Quantized weights keep their swiglu launch (the quantized SwiGLU epilogue left src/): with fold_swiglu on (the
// default) every swiglu node of a q4_1 decoder still launches.
TEST(CudaBackend, QuantizedSwigluStaysALaunch) {
  TESSERA_REQUIRE_GPU();
  const Model m = make_random_model({.arch = "smollm2-135m", .dtype = "q4_1", .seed = 37, .n_layers = 2});
  const ProfiledDecode a = decode_profiled(m, random_ids(4, 49152, 8), {});
  int swiglus = 0;
  for (size_t i = 0; i < a.names.size(); ++i) {
    if (a.names[i].rfind("swiglu ", 0) != 0) continue;
    EXPECT_GT(a.ns[i], 0u) << a.names[i] << " launches nothing";
    ++swiglus;
  }
  EXPECT_EQ(swiglus, 2);
}

}  // namespace
}  // namespace tessera
