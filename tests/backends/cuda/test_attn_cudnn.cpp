// cuDNN prefill attention (attn_prefill_cudnn, attn_cudnn.h): against a double-precision CPU reference at small
// shapes, against our attn_prefill (itself checked against that reference in test_attn_prefill.cpp) at prefill-sized
// shapes, every candidate plan of the autotuner (and its choice) against the reference, the variable-length
// workspace's exact graph for a full first chunk, replayed from a captured CUDA graph, and its argument checks; and
// our own Hopper kernel under the same contract (attn_prefill_tma, at the end). The cuDNN tests skip where cuDNN
// attention is unavailable (no GPU, a build without TESSERA_CUDNN, libcudnn not found, or CudaOptions::cudnn off).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/attn_cudnn.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_options.h"
#include "backends/cuda/kernels_rows.h"
#include "core/error.h"
#include "cuda_test_util.h"

namespace tessera::cuda::test {
namespace {

#define TESSERA_REQUIRE_CUDNN()                                                                     \
  do {                                                                                              \
    TESSERA_REQUIRE_GPU();                                                                          \
    std::string why_cudnn_;                                                                         \
    if (!cudnn_attention_available(&why_cudnn_)) GTEST_SKIP() << "cuDNN attention: " << why_cudnn_; \
  } while (0)

struct Case {
  DType dtype;
  int64_t hd, n_head, n_kv, t, p0, seq;
};

// Random inputs of one case, as both kernels take them: the cache with two slots (positions past p0 + t poisoned
// with 0xFFFF, a NaN in f16 and bf16, so reading them shows), q once in 16 bits and once as the same values in f32,
// each with the row stride of a merged q|k|v matmul output whose k and v columns hold NaN.
struct Inputs {
  int64_t n_ctx = 0, width = 0, ld_q = 0;
  std::vector<uint16_t> kc, vc, q16;
  std::vector<float> q32;
  std::vector<float> kf, vf;  // slot `seq` as floats [n_kv, n_ctx, hd] (for the CPU reference)
  DeviceBuffer kc_d, vc_d, q16_d, q32_d;
  KvCacheView cache;
};

void make_inputs(const Case& c, std::mt19937& rng, Inputs& in) {
  const int64_t n_seq = 2;
  in.n_ctx = c.p0 + c.t + 5;
  const int64_t slot = c.n_kv * in.n_ctx * c.hd;
  in.kc.assign(n_seq * slot, 0xFFFF);
  in.vc.assign(n_seq * slot, 0xFFFF);
  in.kf.assign(slot, 0.0f);
  in.vf.assign(slot, 0.0f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t s = 0; s < n_seq; ++s)
    for (int64_t h = 0; h < c.n_kv; ++h)
      for (int64_t p = 0; p < c.p0 + c.t; ++p)
        for (int64_t i = 0; i < c.hd; ++i) {
          const size_t at = static_cast<size_t>(s * slot + (h * in.n_ctx + p) * c.hd + i);
          in.kc[at] = float_to_cache(c.dtype, normal(rng));
          in.vc[at] = float_to_cache(c.dtype, normal(rng));
          if (s == c.seq) {
            in.kf[at - s * slot] = cache_to_float(c.dtype, in.kc[at]);
            in.vf[at - s * slot] = cache_to_float(c.dtype, in.vc[at]);
          }
        }
  in.width = c.n_head * c.hd;
  in.ld_q = in.width + 2 * c.n_kv * c.hd;
  in.q16.assign(c.t * in.ld_q, 0xFFFF);
  in.q32.assign(c.t * in.ld_q, NAN);
  for (int64_t r = 0; r < c.t; ++r)
    for (int64_t i = 0; i < in.width; ++i) {
      const uint16_t b = float_to_cache(c.dtype, 2.0f * normal(rng));  // scores ~N(0, 4): a few dominant keys per row
      in.q16[r * in.ld_q + i] = b;
      in.q32[r * in.ld_q + i] = cache_to_float(c.dtype, b);
    }
  in.kc_d = to_device(in.kc);
  in.vc_d = to_device(in.vc);
  in.q16_d = to_device(in.q16);
  in.q32_d = to_device(in.q32);
  in.cache = KvCacheView{c.dtype, in.kc_d.get(), in.vc_d.get(), in.n_ctx, c.n_kv, c.hd};
  in.cache.n_seq = n_seq;
}

// The variable-length mode's contract: finite values in slot c.seq past p0 + t (make_inputs poisons them with NaN).
void fill_past_end(const Case& c, std::mt19937& rng, Inputs& in) {
  const int64_t slot = c.n_kv * in.n_ctx * c.hd;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t h = 0; h < c.n_kv; ++h)
    for (int64_t p = c.p0 + c.t; p < in.n_ctx; ++p)
      for (int64_t i = 0; i < c.hd; ++i) {
        const size_t at = static_cast<size_t>(c.seq * slot + (h * in.n_ctx + p) * c.hd + i);
        in.kc[at] = float_to_cache(c.dtype, normal(rng));
        in.vc[at] = float_to_cache(c.dtype, normal(rng));
      }
  in.kc_d.upload(in.kc.data(), 2 * in.kc.size());
  in.vc_d.upload(in.vc.data(), 2 * in.vc.size());
}

// out_rows: the rows of the output buffer, when more than c.t (a variable-length workspace's max_t: cuDNN may write
// rows t .. max_t - 1).
std::vector<float> run_cudnn(const Case& c, const Inputs& in, CudnnAttnWorkspace& ws, int64_t out_rows = 0) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
  DeviceBuffer out = poisoned(2 * std::max(c.t, out_rows) * in.width);
  attn_prefill_cudnn(in.q16_d.get(), in.ld_q, in.cache, c.seq, c.p0, c.t, out.get(), c.n_head, scale, ws, nullptr);
  synchronize();
  const auto bits = to_host<uint16_t>(out, c.t * in.width);
  std::vector<float> o(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) o[i] = cache_to_float(c.dtype, bits[i]);
  return o;
}

// Error budget of cuDNN against the exact result: attn_prefill's (test_attn_prefill.cpp: P rounded to 16 bits for P·V,
// fast exp, f32 sums; 1e-2 for bf16, 3e-3 for f16) plus the output rounded to 16 bits (2^-9 relative per element for
// bf16, 2^-12 for f16, far under those limits). q, K and V are rounded identically on every side.
double limit_vs_exact(DType dtype) { return dtype == DType::BF16 ? 1e-2 : 3e-3; }

// "bf16 hd 128 heads 32/8 t 64 p0 0 seq 1": the case, for traces and printed results.
std::string describe(const Case& c) {
  return std::string(dtype_name(c.dtype)) + " hd " + std::to_string(c.hd) + " heads " + std::to_string(c.n_head) + "/" +
         std::to_string(c.n_kv) + " t " + std::to_string(c.t) + " p0 " + std::to_string(c.p0) + " seq " +
         std::to_string(c.seq);
}

void print_worst(const char* what, const Case& c, double worst, double limit) {
  std::printf("  %s %s: worst row error %.2e (limit %.0e)\n", what, describe(c).c_str(), worst, limit);
}

// The CPU reference of every row of c, checked against o (limit_vs_exact); returns the worst row's error.
double check_vs_reference(const Case& c, const Inputs& in, const std::vector<float>& o) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
  std::vector<double> ref;
  auto ref_row = [&](int64_t r) {
    std::vector<float> qr(in.q32.begin() + r * in.ld_q, in.q32.begin() + r * in.ld_q + in.width);
    attn_decode_ref(qr.data(), in.kf, in.vf, in.n_ctx, c.n_head, c.n_kv, c.hd, static_cast<int32_t>(c.p0 + r), scale,
                    ref);
    return ref;
  };
  return check_rows_rel(o, c.t, in.width, c.p0, ref_row, limit_vs_exact(c.dtype));
}

// o against attn_prefill on the same rows (attn_prefill is checked against the reference in test_attn_prefill.cpp;
// each is within limit_vs_exact of the exact result, so within twice that of each other); prints and returns the
// worst row's error.
double check_vs_attn_prefill(const Case& c, const Inputs& in, const std::vector<float>& o, const char* what) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
  DeviceBuffer ref_d = poisoned(sizeof(float) * c.t * in.width);
  attn_prefill(in.q32_d.as<float>(), in.ld_q, in.cache, c.seq, c.p0, c.t, ref_d.as<float>(), c.n_head, scale, nullptr);
  synchronize();
  const auto ref = to_host<float>(ref_d, c.t * in.width);
  const double limit = 2 * limit_vs_exact(c.dtype);
  auto ref_row = [&](int64_t r) { return &ref[r * in.width]; };
  const double worst = check_rows_rel(o, c.t, in.width, c.p0, ref_row, limit);
  print_worst(what, c, worst, limit);
  return worst;
}

TEST(CudaAttnCudnn, MatchesReference) {
  TESSERA_REQUIRE_CUDNN();
  std::mt19937 rng(test_seed());
  CudnnAttnWorkspace ws;
  // Both dtypes, both head sizes, GQA ratios 3, 4 and 1, single rows, ragged row counts, chunks after p0 cached keys.
  const Case cases[] = {
      {DType::BF16, 128, 32, 8, 64, 0, 0}, {DType::BF16, 64, 9, 3, 200, 0, 1},  {DType::F16, 128, 4, 4, 7, 37, 1},
      {DType::F16, 64, 9, 3, 129, 300, 0}, {DType::BF16, 128, 8, 2, 1, 300, 1}, {DType::BF16, 64, 4, 4, 96, 37, 0},
      {DType::F16, 128, 32, 8, 100, 0, 1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(describe(c));
    Inputs in;
    make_inputs(c, rng, in);
    const auto o = run_cudnn(c, in, ws);
    const double worst = check_vs_reference(c, in, o);
    print_worst("vs reference", c, worst, limit_vs_exact(c.dtype));
    if (HasFailure()) return;
  }
}

// Prefill-sized shapes, where a CPU reference would take minutes: against attn_prefill on the same (16-bit-valued)
// inputs. Each is within limit_vs_exact of the exact result, so they are within twice that of each other.
TEST(CudaAttnCudnn, MatchesAttnPrefill) {
  TESSERA_REQUIRE_CUDNN();
  std::mt19937 rng(test_seed());
  CudnnAttnWorkspace ws;
  const Case cases[] = {
      {DType::BF16, 128, 32, 8, 1024, 0, 1},    // Llama-3-8B heads
      {DType::BF16, 128, 32, 8, 512, 1536, 0},  // a chunk after 1536 cached positions
      {DType::BF16, 64, 9, 3, 2048, 0, 1},      // SmolLM2 heads
      {DType::F16, 64, 32, 8, 777, 1000, 1},    // ragged chunk, f16
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(describe(c));
    Inputs in;
    make_inputs(c, rng, in);
    check_vs_attn_prefill(c, in, run_cudnn(c, in, ws), "vs attn_prefill");
    if (HasFailure()) return;
  }
  EXPECT_EQ(ws.graphs_built(), 4);  // one per shape
  std::printf("  graph builds: %.0f ms for 4 shapes\n", ws.build_ms());
}

// Variable-length mode: chunks of different t and p0 over one cache run on one graph (cuDNN's padding mask with the
// lengths in device memory), each matching attn_prefill on the same rows.
TEST(CudaAttnCudnn, VariableLengthSharesOneGraph) {
  TESSERA_REQUIRE_CUDNN();
  std::mt19937 rng(test_seed());
  const Case whole{DType::BF16, 128, 32, 8, 600, 500, 1};  // cache positions [0, 1100), 600 q rows = max_t
  Inputs in;
  make_inputs(whole, rng, in);
  CudnnAttnWorkspace ws(whole.t);
  const float scale = 1.0f / std::sqrt(static_cast<float>(whole.hd));
  // With NaN in the cache past p0 + t (make_inputs poisons positions 1100..1104), rows whose key tiles reach past
  // p0 + t come out NaN: in this mode K and V are declared n_ctx long, so cuDNN loads whole tiles of stored values and
  // masks the scores, and 0 * NaN in P·V is NaN. Recorded, not required: the documented contract is a finite cache.
  {
    DeviceBuffer out = poisoned(2 * whole.t * in.width);
    attn_prefill_cudnn(in.q16_d.get(), in.ld_q, in.cache, whole.seq, 665, 435, out.get(), whole.n_head, scale, ws,
                       nullptr);
    synchronize();
    const auto bits = to_host<uint16_t>(out, 435 * in.width);
    int64_t nan_rows = 0;
    for (int64_t r = 0; r < 435; ++r) nan_rows += std::isnan(cache_to_float(whole.dtype, bits[r * in.width])) ? 1 : 0;
    std::printf("  varlen with NaN in the cache past p0 + t: %lld of 435 rows NaN\n", static_cast<long long>(nan_rows));
  }
  // The contract: finite values past p0 + t (a zeroed cache, or stale finite values of an earlier sequence).
  fill_past_end(whole, rng, in);
  const int64_t chunks[][2] = {{300, 0}, {300, 300}, {64, 600}, {1, 664}, {435, 665}, {600, 500}};  // {t, p0}
  int64_t rows_past_t_written = 0;
  for (const auto& ch : chunks) {
    const Case c{whole.dtype, whole.hd, whole.n_head, whole.n_kv, ch[0], ch[1], whole.seq};
    SCOPED_TRACE(::testing::Message() << "t " << c.t << " p0 " << c.p0);
    DeviceBuffer out = poisoned(2 * whole.t * in.width);  // max_t rows: cuDNN may touch rows past t
    attn_prefill_cudnn(in.q16_d.get(), in.ld_q, in.cache, c.seq, c.p0, c.t, out.get(), c.n_head, scale, ws, nullptr);
    synchronize();
    const auto bits = to_host<uint16_t>(out, whole.t * in.width);
    std::vector<float> o(c.t * in.width);
    for (size_t i = 0; i < o.size(); ++i) o[i] = cache_to_float(c.dtype, bits[i]);
    for (size_t i = o.size(); i < bits.size(); ++i) rows_past_t_written += bits[i] != 0xFFFF;
    check_vs_attn_prefill(c, in, o, "varlen vs attn_prefill");
    if (HasFailure()) return;
  }
  EXPECT_EQ(ws.graphs_built(), 1);
  std::printf("  varlen: %lld outputs past t were written (allowed; for the record)\n",
              static_cast<long long>(rows_past_t_written));
  EXPECT_THROW(attn_prefill_cudnn(in.q16_d.get(), in.ld_q, in.cache, whole.seq, 0, whole.t + 1, in.q16_d.get(),
                                  whole.n_head, scale, ws, nullptr),
               Error);  // more rows than max_t
}

// Autotuning: whichever plan the timing picks on a given device, every candidate must compute the same attention.
// Each candidate plan (forced) and the tuned choice against the CPU reference, for exact graphs (top-left and
// bottom-right causal) and a variable-length one; autotune level 2 (knob variants) at one shape.
TEST(CudaAttnCudnn, EveryPlanMatchesReference) {
  TESSERA_REQUIRE_CUDNN();
  std::mt19937 rng(test_seed());
  struct TuneCase {
    Case c;
    int64_t max_t;  // > 0: a variable-length workspace (= c.t: q and out hold max_t rows)
    int autotune;
  };
  const TuneCase cases[] = {
      {{DType::BF16, 128, 32, 8, 64, 0, 0}, 0, 1},
      {{DType::F16, 64, 9, 3, 129, 300, 1}, 0, 1},
      {{DType::BF16, 128, 8, 2, 96, 37, 1}, 96, 1},
      {{DType::BF16, 128, 32, 8, 64, 0, 1}, 0, 2},
  };
  for (const TuneCase& tc : cases) {
    const Case& c = tc.c;
    SCOPED_TRACE(::testing::Message() << describe(c) << " max_t " << tc.max_t << " autotune " << tc.autotune);
    Inputs in;
    make_inputs(c, rng, in);
    if (tc.max_t > 0) fill_past_end(c, rng, in);
    CudnnAttnOptions opt;
    opt.autotune = tc.autotune;
    CudnnAttnWorkspace ws(tc.max_t, opt);
    const auto tuned = run_cudnn(c, in, ws);  // the first call times the plans and keeps one
    const auto graphs = ws.graph_info();
    ASSERT_EQ(graphs.size(), 1u);
    const CudnnGraphInfo& g = graphs[0];
    EXPECT_EQ(g.varlen, tc.max_t > 0);
    ASSERT_FALSE(g.plans.empty());
    EXPECT_TRUE(g.tuned);
    ASSERT_GE(g.chosen, 0);
    ASSERT_LT(g.chosen, static_cast<int64_t>(g.plans.size()));
    std::printf("  %s hd %lld t %lld p0 %lld %s, autotune %d: %zu plans of %lld configs, build %.0f ms, tune %.1f ms, "
                "chose %lld\n",
                std::string(dtype_name(c.dtype)).c_str(), static_cast<long long>(c.hd), static_cast<long long>(c.t),
                static_cast<long long>(c.p0), g.varlen ? "varlen" : "exact", tc.autotune, g.plans.size(),
                static_cast<long long>(g.configs), g.build_ms, g.tune_ms, static_cast<long long>(g.chosen));
    for (size_t p = 0; p < g.plans.size(); ++p)
      std::printf("    plan %zu: %s, workspace %lld B, median %.4f ms\n", p, g.plans[p].name.c_str(),
                  static_cast<long long>(g.plans[p].workspace_bytes), g.plans[p].tune_ms);
    if (g.plans.size() > 1) {
      EXPECT_GE(g.plans[static_cast<size_t>(g.chosen)].tune_ms, 0.0);
    }
    const double worst = check_vs_reference(c, in, tuned);
    print_worst("tuned vs reference", c, worst, limit_vs_exact(c.dtype));
    if (HasFailure()) return;
    for (size_t p = 0; p < g.plans.size(); ++p) {
      SCOPED_TRACE(::testing::Message() << "plan " << p << " " << g.plans[p].name);
      ws.force_plan(static_cast<int64_t>(p));
      const auto o = run_cudnn(c, in, ws);
      check_vs_reference(c, in, o);
      if (p == static_cast<size_t>(g.chosen)) {
        int64_t differ = 0;  // the same plan on the same inputs: the same bits
        for (size_t i = 0; i < o.size(); ++i) differ += o[i] != tuned[i];
        EXPECT_EQ(differ, 0) << "outputs differ between the tuned call and its plan forced";
      }
      if (HasFailure()) return;
    }
    ws.force_plan(static_cast<int64_t>(g.plans.size()));  // past the last plan: refused, nothing enqueued
    EXPECT_THROW(run_cudnn(c, in, ws), Error);
    ws.force_plan(-1);
    EXPECT_EQ(ws.graphs_built(), 1);  // forcing and tuning built nothing more
  }
}

// A variable-length workspace runs a full first chunk (p0 = 0, t = max_t) on an exact graph of its own, and every
// other chunk on the variable-length graph; exact_full_chunk = false keeps all on the variable-length one.
TEST(CudaAttnCudnn, FullFirstChunkTakesExactGraph) {
  TESSERA_REQUIRE_CUDNN();
  std::mt19937 rng(test_seed());
  const Case full{DType::BF16, 128, 32, 8, 256, 0, 1};
  Inputs in;
  make_inputs(full, rng, in);
  fill_past_end(full, rng, in);
  for (bool exact : {true, false}) {
    SCOPED_TRACE(exact ? "exact_full_chunk" : "variable-length only");
    CudnnAttnOptions opt;
    opt.exact_full_chunk = exact;
    CudnnAttnWorkspace ws(full.t, opt);
    // q (make_inputs) and out hold max_t = full.t rows for every chunk; row r of a chunk is position p0 + r.
    check_vs_reference(full, in, run_cudnn(full, in, ws));
    const Case shorter{full.dtype, full.hd, full.n_head, full.n_kv, full.t - 56, 0, full.seq};
    check_vs_reference(shorter, in, run_cudnn(shorter, in, ws, full.t));
    const Case later{full.dtype, full.hd, full.n_head, full.n_kv, 100, 156, full.seq};
    check_vs_reference(later, in, run_cudnn(later, in, ws, full.t));
    const auto graphs = ws.graph_info();
    int64_t exact_graphs = 0, varlen_graphs = 0;
    for (const CudnnGraphInfo& g : graphs) {
      exact_graphs += g.varlen ? 0 : 1;
      varlen_graphs += g.varlen ? 1 : 0;
      if (!g.varlen) {
        EXPECT_EQ(g.t, full.t);
      }
    }
    EXPECT_EQ(exact_graphs, exact ? 1 : 0);
    EXPECT_EQ(varlen_graphs, 1);
    if (HasFailure()) return;
  }
}

// The executors capture their launches into CUDA graphs: a prepared shape's execute must be capturable, and the
// replay must write what a direct call writes (bit for bit: same plan, same inputs).
TEST(CudaAttnCudnn, ReplaysFromCapturedGraph) {
  TESSERA_REQUIRE_CUDNN();
  std::mt19937 rng(test_seed());
  const Case c{DType::BF16, 128, 32, 8, 300, 200, 1};
  Inputs in;
  make_inputs(c, rng, in);
  CudnnAttnWorkspace ws;
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
  ws.prepare(in.cache, in.ld_q, c.p0, c.t, c.n_head, scale);
  const auto direct = run_cudnn(c, in, ws);

  cudaStream_t stream = nullptr;
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DeviceBuffer out = poisoned(2 * c.t * in.width);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  TESSERA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  std::string error;
  try {
    attn_prefill_cudnn(in.q16_d.get(), in.ld_q, in.cache, c.seq, c.p0, c.t, out.get(), c.n_head, scale, ws, stream);
  } catch (const Error& e) {
    error = e.what();
  }
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  ASSERT_TRUE(error.empty()) << "execute during capture: " << error;
  ASSERT_EQ(end, cudaSuccess) << cudaGetErrorString(end);
  TESSERA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  TESSERA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  const auto bits = to_host<uint16_t>(out, c.t * in.width);
  int64_t differ = 0;
  for (size_t i = 0; i < bits.size(); ++i) differ += cache_to_float(c.dtype, bits[i]) != direct[i];
  EXPECT_EQ(differ, 0) << "of " << bits.size() << " outputs differ between the graph replay and a direct call";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  // A shape not prepared before capture is refused with a clear error instead of being built (allocating) inside it.
  TESSERA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  EXPECT_THROW(attn_prefill_cudnn(in.q16_d.get(), in.ld_q, in.cache, c.seq, c.p0, c.t - 1, out.get(), c.n_head, scale,
                                  ws, stream),
               Error);
  graph = nullptr;
  TESSERA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(CudaAttnCudnn, RejectsBadArguments) {
  TESSERA_REQUIRE_CUDNN();
  const int64_t n_ctx = 64, hd = 64, n_kv = 2, n_head = 4, ld = n_head * hd;
  DeviceBuffer kc(2 * 2 * n_kv * n_ctx * hd), vc(2 * 2 * n_kv * n_ctx * hd);
  DeviceBuffer q(2 * n_ctx * ld), out(2 * n_ctx * ld);
  KvCacheView cache{DType::BF16, kc.get(), vc.get(), n_ctx, n_kv, hd};
  cache.n_seq = 2;
  CudnnAttnWorkspace ws;
  auto call = [&](const KvCacheView& c, int64_t seq, int64_t p0, int64_t t, int64_t heads, int64_t ld_q,
                  const void* qp) {
    attn_prefill_cudnn(qp, ld_q, c, seq, p0, t, out.get(), heads, 0.125f, ws, nullptr);
  };
  q.fill_bytes(0);  // finite values: the valid call below must run cleanly
  kc.fill_bytes(0);
  vc.fill_bytes(0);
  EXPECT_NO_THROW(call(cache, 1, 10, 54, n_head, ld, q.get()));  // exactly fills the cache
  synchronize();
  EXPECT_THROW(call(cache, 1, 11, 54, n_head, ld, q.get()), Error);    // one row past n_ctx
  EXPECT_THROW(call(cache, 2, 0, 8, n_head, ld, q.get()), Error);      // no slot 2
  EXPECT_THROW(call(cache, -1, 0, 8, n_head, ld, q.get()), Error);     // negative slot
  EXPECT_THROW(call(cache, 0, 0, 8, 3, ld, q.get()), Error);           // 3 heads over 2 kv heads
  EXPECT_THROW(call(cache, 0, 0, 8, n_head, ld + 4, q.get()), Error);  // rows not 16-byte multiples
  EXPECT_THROW(call(cache, 0, 0, 8, n_head, ld, static_cast<const char*>(q.get()) + 2), Error);  // misaligned q
  KvCacheView f32 = cache;
  f32.dtype = DType::F32;
  EXPECT_THROW(call(f32, 0, 0, 8, n_head, ld, q.get()), Error);
  KvCacheView hd96 = cache;
  hd96.hd = 96;
  EXPECT_THROW(call(hd96, 0, 0, 8, n_head, ld, q.get()), Error);
}

// Runs everywhere: the workspace options' defaults are the heuristics' first plan and no exact graph (what the engine
// measured fastest; docs/PERFORMANCE.md; the constructor's default argument is CudnnAttnOptions{}).
TEST(CudaAttnCudnn, OptionsDefaults) {
  const CudnnAttnOptions o;
  EXPECT_EQ(o.autotune, 0);
  EXPECT_FALSE(o.exact_full_chunk);
}

// Runs everywhere (CI has no GPU and no cuDNN): availability is a clean false with a reason, and the switch wins.
TEST(CudaAttnCudnn, ReportsAvailability) {
  std::string why;
  const bool available = cudnn_attention_available(&why);
  if (!available) {
    EXPECT_FALSE(why.empty());
  }
  std::printf("  cuDNN attention: %s\n", available ? "available" : why.c_str());
  CudaOptions off = cuda_options();
  off.cudnn = false;
  const CudaOptionsScope scope(off);
  why.clear();
  EXPECT_FALSE(cudnn_attention_available(&why));
  EXPECT_NE(why.find("CudaOptions::cudnn"), std::string::npos) << why;
  EXPECT_THROW(CudnnAttnWorkspace ws, Error);
}

// ---- attn_prefill_tma (kernels/attn_prefill_tma.cu): our Hopper kernel under the same contract as the cuDNN path
// (16-bit q and output in the cache's type, finite cache values past p0 + t), checked the same ways. Skips where it
// is unsupported (no GPU or not sm_90).

#define TESSERA_REQUIRE_TMA_ATTN()                                                                           \
  do {                                                                                                       \
    TESSERA_REQUIRE_GPU();                                                                                   \
    std::string why_tma_;                                                                                    \
    KvCacheView probe_{DType::BF16, nullptr, nullptr, 1, 1, 128};                                            \
    if (!attn_prefill_tma_supported(probe_, 1, &why_tma_)) GTEST_SKIP() << "attn_prefill_tma: " << why_tma_; \
  } while (0)

std::vector<float> run_tma(const Case& c, const Inputs& in) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
  DeviceBuffer out = poisoned(2 * c.t * in.width);
  attn_prefill_tma(in.q16_d.get(), in.ld_q, in.cache, c.seq, c.p0, c.t, out.get(), c.n_head, scale, nullptr);
  synchronize();
  const auto bits = to_host<uint16_t>(out, c.t * in.width);
  std::vector<float> o(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) o[i] = cache_to_float(c.dtype, bits[i]);
  return o;
}

// Against the double-precision reference: both head dimensions (128, 64), both dtypes, GQA ratios 4, 1, 3 and 2, one
// row, ragged row counts, q tiles that start inside a key tile (p0 not a multiple of 128) and chunks after cached keys,
// both slots.
TEST(CudaAttnTma, MatchesReference) {
  TESSERA_REQUIRE_TMA_ATTN();
  std::mt19937 rng(test_seed());
  const Case cases[] = {
      {DType::BF16, 128, 32, 8, 64, 0, 0},   {DType::F16, 128, 4, 4, 7, 37, 1},
      {DType::BF16, 128, 8, 2, 1, 300, 1},   {DType::F16, 128, 32, 8, 100, 0, 1},
      {DType::BF16, 128, 8, 8, 300, 129, 0}, {DType::F16, 128, 16, 4, 257, 1000, 1},
      {DType::BF16, 128, 4, 1, 384, 0, 1},   {DType::BF16, 64, 9, 3, 200, 0, 1},
      {DType::F16, 64, 9, 3, 129, 300, 0},   {DType::BF16, 64, 32, 8, 300, 129, 1},
      {DType::F16, 64, 4, 4, 7, 37, 0},      {DType::BF16, 64, 32, 8, 1, 1000, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(describe(c));
    Inputs in;
    make_inputs(c, rng, in);
    fill_past_end(c, rng, in);
    const auto o = run_tma(c, in);
    const double worst = check_vs_reference(c, in, o);
    print_worst("tma vs reference", c, worst, limit_vs_exact(c.dtype));
    if (HasFailure()) return;
  }
}

// Prefill-sized shapes against attn_prefill (checked against the reference in test_attn_prefill.cpp).
TEST(CudaAttnTma, MatchesAttnPrefill) {
  TESSERA_REQUIRE_TMA_ATTN();
  std::mt19937 rng(test_seed());
  const Case cases[] = {
      {DType::BF16, 128, 32, 8, 2048, 0, 1},    // Llama-3-8B heads, a whole 2k prompt
      {DType::BF16, 128, 32, 8, 512, 1536, 0},  // a chunk after 1536 cached positions
      {DType::F16, 128, 32, 8, 777, 1000, 1},   // ragged chunk, f16
      {DType::BF16, 64, 32, 8, 2048, 0, 0},     // Llama-3.2-1B heads (hd 64)
      {DType::BF16, 64, 9, 3, 2048, 0, 1},      // SmolLM2 heads
      {DType::F16, 64, 9, 3, 600, 1000, 1},     // ragged chunk after cached keys, hd 64, f16
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(describe(c));
    Inputs in;
    make_inputs(c, rng, in);
    fill_past_end(c, rng, in);
    check_vs_attn_prefill(c, in, run_tma(c, in), "tma vs attn_prefill");
    if (HasFailure()) return;
  }
}

TEST(CudaAttnTma, RejectsBadArguments) {
  TESSERA_REQUIRE_TMA_ATTN();
  std::mt19937 rng(test_seed());
  Case c{DType::BF16, 128, 8, 2, 16, 0, 0};
  Inputs in;
  make_inputs(c, rng, in);
  DeviceBuffer out = poisoned(2 * c.t * in.width);
  const auto run = [&](const KvCacheView& cache, int64_t seq, int64_t p0, int64_t t, int64_t n_head) {
    attn_prefill_tma(in.q16_d.get(), in.ld_q, cache, seq, p0, t, out.get(), n_head, 0.1f, nullptr);
  };
  EXPECT_THROW(run(in.cache, 0, in.n_ctx - 4, 16, 8), Error);  // past the cache
  EXPECT_THROW(run(in.cache, 2, 0, 16, 8), Error);             // slot out of range
  EXPECT_THROW(run(in.cache, 0, 0, 16, 7), Error);             // heads not a multiple of the kv heads
  KvCacheView hd96 = in.cache;
  hd96.hd = 96;
  std::string why;
  EXPECT_FALSE(attn_prefill_tma_supported(hd96, 8, &why));
  EXPECT_NE(why.find("64 or 128"), std::string::npos) << why;
  EXPECT_THROW(run(hd96, 0, 0, 16, 8), Error);
  KvCacheView hd64 = in.cache;  // supported; its q row stride must then hold n_head * 64
  hd64.hd = 64;
  EXPECT_TRUE(attn_prefill_tma_supported(hd64, 8, nullptr));
  KvCacheView f32 = in.cache;
  f32.dtype = DType::F32;
  EXPECT_FALSE(attn_prefill_tma_supported(f32, 8, nullptr));
}

}  // namespace
}  // namespace tessera::cuda::test
