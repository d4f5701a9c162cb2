// The ternary families on the CUDA backend (issue #24): tests/data/hf's tiny BitNet with rows of 256 (tiny-bitnet-256:
// every linear but the embedding loads as TQ2_0, so the TQ2_0 GEMV, multi-row GEMV and bf16 expansion run, with
// ACT_QUANT_I8 and RELU2_GLU; head size 64, which the attention kernels take) and the MatMul-free LM
// (tiny-hgrn-bit-f32: the MLGRU and its recurrent state, ffn_down as TQ2_0, the rest as float weights holding the
// ternary values times their scale), each run by a cpu and a cuda Session on the same loaded model:
//  - prefill with every row's logits in chunks of 8 (the rows executor: multi-row GEMV) and in one chunk of 40+
//    (the rows executor: TQ2_0 expanded to bf16 for cuBLASLt), then decode steps (the one-token decoder and its
//    CUDA graph), against the CPU backend's logits and the goldens the CPU tests use (transformers' forward for
//    BitNet, python/hgrn_bit_reference.py's numpy forward for hgrn_bit);
//  - hgrn_bit's state: a second prompt from position 0 starts from a zero state, two slots decoded together keep
//    their own states (batched decode: mlgru_rows with the slots on the device), and chained greedy decoding
//    (positions advanced on the device) gives the step-by-step tokens.
// Tolerances: both backends quantize the activations to int8 per token (ACT_QUANT_I8) and again per 32 for the
// ternary dp4a; the GPU sums in another order and its bf16 expansion path takes bf16 activations, so a rounding tie
// may land one int8 level apart: against the CPU, the relative L2 error per row of logits the CPU itself shows against
// the golden (at least 5%), and the CPU tests' own bounds against the goldens (1e-1 of the logit scale, top-1 at
// 90%). Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels_ternary.h"
#include "cuda_test_util.h"
#include "tessera/error.h"
#include "tessera/model.h"
#include "tessera/session.h"
#include "test_util.h"

namespace tessera {
namespace {

using cuda::test::worst_rel;

constexpr double kVsCpu = 5e-2;     // relative L2 error per row of logits, GPU against CPU (the floor; see below)
constexpr double kVsGolden = 1e-1;  // max |err| / the row's logit scale, as the CPU tests (test_session_hf.cpp)

struct Golden {
  std::vector<int32_t> ids;
  std::vector<std::vector<double>> logits;
};

Golden read_golden(const std::string& dir) {
  nlohmann::json j;
  std::ifstream(dir + "/golden.json") >> j;
  return {j["ids"].get<std::vector<int32_t>>(), j["logits"].get<std::vector<std::vector<double>>>()};
}

// Rows [0, rows) of got against the golden: the worst max |err| / scale, and how many top-1 agree.
std::pair<double, size_t> vs_golden(const std::vector<float>& got, const Golden& g, size_t rows) {
  const size_t V = g.logits[0].size();
  double worst = 0;
  size_t top1 = 0;
  for (size_t t = 0; t < rows; ++t) {
    double scale = 0;
    size_t bw = 0, bg = 0;
    for (size_t i = 0; i < V; ++i) {
      scale = std::max(scale, std::fabs(g.logits[t][i]));
      if (g.logits[t][i] > g.logits[t][bw]) bw = i;
      if (got[t * V + i] > got[t * V + bg]) bg = i;
    }
    for (size_t i = 0; i < V; ++i) worst = std::max(worst, std::fabs(got[t * V + i] - g.logits[t][i]) / scale);
    top1 += bw == bg;
  }
  return {worst, top1};
}

// The golden's prompt evaluated token by token by `s` (from position 0): every row's logits.
std::vector<float> decode_each(Session& s, const std::vector<int32_t>& ids) {
  s.reset();
  std::vector<float> out;
  for (int32_t id : ids) {
    const std::span<const float> x = s.decode(id);
    out.insert(out.end(), x.begin(), x.end());
  }
  return out;
}

// Prefill (chunks of n_batch), then decode steps, on both backends; both against the CPU and the golden.
void check_model(const char* name, int64_t n_batch) {
  const std::string dir = test::data_path(std::string("hf/") + name);
  const Golden g = read_golden(dir);
  const Model m = Model::load(dir, {.load_tokenizer = false});
  const size_t V = g.logits[0].size();
  ASSERT_EQ(int64_t(V), m.spec().n_vocab);
  SessionOptions co{.n_ctx = 64, .n_batch = n_batch, .n_threads = 2};
  SessionOptions go = co;
  go.device = "cuda";
  Session cpu(m, co), gpu(m, go);
  // Prefill: the rows executor.
  const std::vector<float> pc = cpu.eval_all_logits(g.ids), pg = gpu.eval_all_logits(g.ids);
  // The GPU may stand as far from the CPU as the CPU stands from the independent implementation (the golden), in the
  // same measure, and never less than kVsCpu: int8 rounding ties that land one level apart move BitNet's logits by
  // about as much as transformers' bf16-simulated BitLinear does (measured on the H100, session 14: GPU vs CPU 0.050
  // to 0.072 on tiny-bitnet-256, a tighter 5% bound written without a GPU failed by 0.001 to 0.022).
  std::vector<float> gold_rows;
  for (const auto& row : g.logits) gold_rows.insert(gold_rows.end(), row.begin(), row.end());
  const double cpu_gold = worst_rel(gold_rows, pc, V);
  const double bound = std::max(kVsCpu, cpu_gold);
  const double prefill = worst_rel(pc, pg, V);
  EXPECT_LE(prefill, bound) << name << " prefill (chunks of " << n_batch << "); CPU vs golden " << cpu_gold;
  const auto [pgold, ptop] = vs_golden(pg, g, g.ids.size());
  EXPECT_LE(pgold, kVsGolden) << name << " prefill against the golden";
  EXPECT_GE(ptop, g.ids.size() * 9 / 10) << name << " prefill top-1 against the golden";
  // Decode from position 0: the one-token decoder (its CUDA graph replayed from the second step).
  const std::vector<float> dc = decode_each(cpu, g.ids), dg = decode_each(gpu, g.ids);
  const double decode = worst_rel(dc, dg, V);
  EXPECT_LE(decode, bound) << name << " decode; CPU vs golden " << cpu_gold;
  const auto [dgold, dtop] = vs_golden(dg, g, g.ids.size());
  EXPECT_LE(dgold, kVsGolden) << name << " decode against the golden";
  EXPECT_GE(dtop, g.ids.size() * 9 / 10) << name << " decode top-1 against the golden";
  // A longer prompt in one chunk (48 rows: past the multi-row GEMV's reach, the weights expanded to bf16 for
  // cuBLASLt; hgrn_bit: 48 recurrence steps in one launch), against the CPU only.
  if (n_batch >= 48) {
    std::vector<int32_t> ids;
    for (int i = 0; i < 48; ++i) ids.push_back(int32_t((i * 37 + 5) % int(V)));
    cpu.reset();
    gpu.reset();
    // This path rounds the dequantized int8 activations and the weights' scales to bf16 before the GEMM, a rounding
    // the int8 paths do not have, which moves more int8 levels at the next layer's quantization: twice the bound
    // (measured on the H100, session 14: 0.0725 on tiny-bitnet-256 against a bound of 0.0661), and the top-1 tokens
    // of at least 90% of the rows as the CPU's.
    const std::vector<float> lc = cpu.eval_all_logits(ids), lg = gpu.eval_all_logits(ids);
    EXPECT_LE(worst_rel(lc, lg, V), 2 * bound) << name << " 48-row prefill";
    size_t same = 0;
    for (size_t r = 0; r < ids.size(); ++r) {
      const auto c0 = lc.begin() + static_cast<ptrdiff_t>(r * V), g0 = lg.begin() + static_cast<ptrdiff_t>(r * V);
      same += std::max_element(c0, c0 + static_cast<ptrdiff_t>(V)) - c0 ==
              std::max_element(g0, g0 + static_cast<ptrdiff_t>(V)) - g0;
    }
    EXPECT_GE(same, ids.size() * 9 / 10) << name << " 48-row prefill top-1 against the CPU";
  }
  std::printf(
      "[ ternary  ] %s n_batch %lld: GPU vs CPU rel L2 prefill %.3g, decode %.3g (bound %.3g: CPU vs golden %.3g); vs "
      "golden %.3g / %.3g, top-1 %zu / %zu of %zu\n",
      name, static_cast<long long>(n_batch), prefill, decode, bound, cpu_gold, pgold, dgold, ptop, dtop, g.ids.size());
}

// The tiny models load as the formats these tests mean to exercise (runs without a GPU).
TEST(CudaTernaryModels, LoadAsTernary) {
  const Model b = Model::load(test::data_path("hf/tiny-bitnet-256"), {.load_tokenizer = false});
  EXPECT_EQ(b.spec().architecture, "bitnet");
  EXPECT_EQ(b.spec().head_dim, 64);  // a head size the CUDA attention kernels take
  const Model h = Model::load(test::data_path("hf/tiny-hgrn-bit-f32"), {.load_tokenizer = false});
  EXPECT_EQ(h.spec().architecture, "hgrn_bit");
}

// tq2_0's GEMV launch shapes (swept on the H100: eight rows per block of the shared kernel, or the x-stationary
// kernel at the large 8B shapes) are shapes a kernel is compiled for, with the warp-group epilogue's too, at the
// issue's and the families' shapes; tq1_0 (uploaded as tq2_0) gets tq2_0's answers. No GPU needed.
TEST(CudaTernaryModels, LaunchShapesAreCompiledOnes) {
  const std::pair<int64_t, int64_t> shapes[] = {{4096, 14336}, {14336, 4096}, {4096, 4096}, {6144, 4096},
                                                {28672, 4096}, {6912, 2560},  {2560, 6912}, {1024, 1024},
                                                {256, 512},    {128256, 4096}};
  for (const auto& [n, k] : shapes) {
    const cuda::GemvConfig c = cuda::gemv_default_config(DType::TQ2_0, n, k);
    EXPECT_TRUE(cuda::gemv_config_supported(DType::TQ2_0, c)) << n << "x" << k;
    EXPECT_TRUE(!c.stationary || cuda::gemv_tq2_stationary_fits(k)) << n << "x" << k;
    const cuda::GemvConfig c1 = cuda::gemv_default_config(DType::TQ1_0, n, k);
    EXPECT_TRUE(c1.threads == c.threads && c1.rows == c.rows && c1.unroll == c.unroll) << n << "x" << k;
    const cuda::GemvConfig o = cuda::gemv_norm_out_config(DType::TQ2_0, n, k);
    EXPECT_TRUE(cuda::gemv_norm_out_supported(o, DType::TQ2_0)) << n << "x" << k;
    EXPECT_TRUE(cuda::gemv_norm_out_supported(cuda::gemv_norm_out_config(DType::TQ1_0, n, k), DType::TQ1_0));
  }
}

// The decoder's ACT_QUANT_I8 writes its readers' q8 input itself: the same bytes as act_quant_i8_rows, then
// quantize_q8 on its output (rows of 2560 and 6912: BitNet 2B4T's widths; 3 rows: the per-row offsets).
TEST(CudaTernary, ActQuantQ8OutputIsQuantizeQ8OfItsOutput) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(cuda::test::test_seed());
  for (const int64_t n : {2560, 6912}) {
    const int64_t t = 3;
    const std::vector<float> x = cuda::test::random_floats(rng, static_cast<size_t>(t * n), -4.0f, 4.0f);
    cuda::DeviceBuffer xd = cuda::test::to_device(x), y1 = cuda::test::poisoned(static_cast<size_t>(t * n) * 4),
                       y2 = cuda::test::poisoned(static_cast<size_t>(t * n) * 4);
    cuda::DeviceBuffer qa = cuda::test::poisoned(static_cast<size_t>(t * n)),
                       qb = cuda::test::poisoned(static_cast<size_t>(t * n));
    cuda::DeviceBuffer da = cuda::test::poisoned(static_cast<size_t>(t * n / 32) * 8),
                       db = cuda::test::poisoned(static_cast<size_t>(t * n / 32) * 8);
    cuda::act_quant_i8_rows(xd.as<float>(), n, y1.as<float>(), t, n, nullptr, qa.as<int8_t>(), da.as<float2>());
    cuda::act_quant_i8_rows(xd.as<float>(), n, y2.as<float>(), t, n, nullptr);
    cuda::quantize_q8(y2.as<float>(), qb.as<int8_t>(), db.as<float2>(), t * n, nullptr);
    cuda::synchronize();
    const auto ya = cuda::test::to_host<float>(y1, static_cast<size_t>(t * n));
    const auto yb = cuda::test::to_host<float>(y2, static_cast<size_t>(t * n));
    EXPECT_EQ(std::memcmp(ya.data(), yb.data(), ya.size() * 4), 0) << "n=" << n;
    EXPECT_EQ(cuda::test::to_host<int8_t>(qa, static_cast<size_t>(t * n)),
              cuda::test::to_host<int8_t>(qb, static_cast<size_t>(t * n)))
        << "n=" << n;
    const auto a = cuda::test::to_host<float>(da, static_cast<size_t>(t * n / 16));
    const auto b = cuda::test::to_host<float>(db, static_cast<size_t>(t * n / 16));
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "n=" << n;
  }
}

TEST(CudaTernary, BitNetMatchesCpuAndTransformers) {
  TESSERA_REQUIRE_GPU();
  check_model("tiny-bitnet-256", 8);   // multi-row TQ2_0 GEMV (t <= 8 per chunk)
  check_model("tiny-bitnet-256", 64);  // one chunk; and 48 rows in one chunk: the bf16 expansion
}

TEST(CudaTernary, HgrnBitMatchesCpuAndNumpy) {
  TESSERA_REQUIRE_GPU();
  check_model("tiny-hgrn-bit-f32", 5);   // the state carried across chunk boundaries
  check_model("tiny-hgrn-bit-f32", 64);  // one chunk
}

// A second prompt from position 0 starts from a zero state; going back into a state is an error, raised on the host by
// the CUDA session (the device kernel could only write NaN), as the CPU's MLGRU raises it.
TEST(CudaTernary, HgrnBitStateRestartsAtPositionZero) {
  TESSERA_REQUIRE_GPU();
  const std::string dir = test::data_path("hf/tiny-hgrn-bit-f32");
  const Golden g = read_golden(dir);
  const Model m = Model::load(dir, {.load_tokenizer = false});
  Session gpu(m, {.n_ctx = 64, .n_batch = 5, .n_threads = 2, .device = "cuda"});
  const std::vector<float> first = gpu.eval_all_logits(g.ids);
  gpu.reset();
  const std::vector<float> second = gpu.eval_all_logits(g.ids);
  EXPECT_LE(worst_rel(first, second, g.logits[0].size()), 1e-6);
  gpu.truncate(4);
  EXPECT_THROW(gpu.eval(std::span<const int32_t>(g.ids).subspan(4, 2)), Error);
}

// Two slots decoded together (batched decode, one MLGRU step per row on its own slot's state): slot 1 runs the prompt
// shifted by three tokens, so a shared or misbound state changes both rows.
TEST(CudaTernary, HgrnBitEachSlotKeepsItsOwnState) {
  TESSERA_REQUIRE_GPU();
  const std::string dir = test::data_path("hf/tiny-hgrn-bit-f32");
  const Golden g = read_golden(dir);
  const Model m = Model::load(dir, {.load_tokenizer = false});
  Session gpu(m, {.n_ctx = 64, .n_batch = 8, .n_threads = 2, .device = "cuda", .n_seq = 2});
  Session cpu(m, {.n_ctx = 64, .n_batch = 8, .n_threads = 2, .n_seq = 2});
  const std::span<const int32_t> ids(g.ids);
  (void)gpu.eval_seq(1, ids.subspan(0, 3), false);
  (void)cpu.eval_seq(1, ids.subspan(0, 3), false);
  const size_t V = g.logits[0].size();
  std::vector<float> a, b;
  for (size_t t = 0; t + 3 < g.ids.size(); ++t) {
    const std::vector<int32_t> toks = {g.ids[t], g.ids[t + 3]}, seqs = {0, 1};
    const std::span<const float> x = cpu.decode_batch(toks, seqs);
    a.insert(a.end(), x.begin(), x.end());
    const std::span<const float> y = gpu.decode_batch(toks, seqs);
    b.insert(b.end(), y.begin(), y.end());
    for (size_t i = 0; i < V; ++i) {
      double s0 = 0, s1 = 0;
      for (size_t j = 0; j < V; ++j) s0 = std::max(s0, std::fabs(g.logits[t][j]));
      for (size_t j = 0; j < V; ++j) s1 = std::max(s1, std::fabs(g.logits[t + 3][j]));
      ASSERT_NEAR(y[i], g.logits[t][i], kVsGolden * s0) << "slot 0 token " << t << " logit " << i;
      ASSERT_NEAR(y[V + i], g.logits[t + 3][i], kVsGolden * s1) << "slot 1 token " << t + 3 << " logit " << i;
    }
  }
  EXPECT_LE(worst_rel(a, b, V), kVsCpu);
}

// Chained greedy decoding (the device advances token and position between steps; the MLGRU reads the position there)
// gives the tokens of greedy steps taken one by one.
TEST(CudaTernary, HgrnBitChainedGreedyMatchesSteps) {
  TESSERA_REQUIRE_GPU();
  const std::string dir = test::data_path("hf/tiny-hgrn-bit-f32");
  const Golden g = read_golden(dir);
  const Model m = Model::load(dir, {.load_tokenizer = false});
  Session gpu(m, {.n_ctx = 64, .n_batch = 8, .n_threads = 2, .device = "cuda"});
  const std::span<const int32_t> prompt = std::span<const int32_t>(g.ids).subspan(0, 4);
  (void)gpu.eval(prompt.subspan(0, 3));
  std::vector<int32_t> chained;
  (void)gpu.decode_greedy_chain(prompt[3], 20, [&](int32_t id) {
    chained.push_back(id);
    return true;
  });
  gpu.reset();
  (void)gpu.eval(prompt.subspan(0, 3));
  std::vector<int32_t> stepped;
  int32_t id = prompt[3];
  for (size_t i = 0; i < chained.size(); ++i) stepped.push_back(id = gpu.decode_greedy(id));
  EXPECT_EQ(chained, stepped);
  EXPECT_EQ(chained.size(), 20u);
}

}  // namespace
}  // namespace tessera
