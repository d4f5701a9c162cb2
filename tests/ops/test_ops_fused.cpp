// The op table's fused-node rows (ops/op_fused.h): small graphs of builder nodes that the CUDA decoder's passes rewrite
// into fused nodes, each run on the CPU (reference and fast: the CPU fuses only the LORA_ rows) and on CUDA as
// rewritten, and compared with the reference by normalized MSE as the one-node rows are (test_ops.cpp: the limits'
// reasons). Each row also names the fusion the decoder's passes must make of it, so a pass that stops fusing fails
// here, on the graph, before any GPU runs: on a machine without a GPU only the CUDA runs skip.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "graph/passes/fuse.h"
#include "ops/op_fused.h"

#ifdef TESSERA_HAVE_CUDA
#include "backends/cuda/executor_common.h"
#endif

namespace tessera::ops_test {
namespace {

using graph::Op;
using graph::Role;

constexpr double kF32 = 1e-10, kQ8 = 1e-4;

// What a row's rewritten graph must hold: a node of `op` whose fusion passes `check` (described by `what`).
struct Expect {
  std::string what;
  std::function<bool(const graph::Node&)> check;
};

struct FusedRow {
  std::string name;
  std::function<OpGraph(std::mt19937&)> build;
  std::vector<Expect> expect;
  double max_nmse_cpu = 0, max_nmse_cuda = 0;
};

bool quantized(DType t) { return t == DType::Q8_0 || t == DType::Q4_0 || t == DType::Q4_1; }
std::string dn(DType t) { return std::string(dtype_name(t)); }
// Float weights' GEMVs sum in f32 (t = 1: f32 x); quantized ones take x in 8 bits per block of 32.
double limit(DType w) { return quantized(w) ? kQ8 : kF32; }

// x -> RMSNORM -> MATMUL: float weights fold the norm into the GEMV (the prologue); quantized ones keep the norm.
FusedRow norm_matmul(DType wt, int64_t n, int64_t k) {
  FusedRow r;
  r.name = "NORM_MATMUL_" + dn(wt) + "_n" + std::to_string(n) + "_k" + std::to_string(k);
  r.build = [=](std::mt19937& rng) {
    OpGraph og{graph::Graph(1, 0)};
    const int x = add_f32_input(og, rng, "x", {1, k}, -2, 2);
    const int nw = add_weight(og, rng, "norm_w", DType::F32, {k}, 0.5f, 1.5f);
    const int h = og.g.add_node("norm", Op::RMSNORM, Role::ATTN_NORM, 0, "attn", {x, nw}, {.eps = 1e-5f});
    const int w = add_weight(og, rng, "w", wt, {n, k}, -1, 1);
    og.g.mark_output(og.g.add_node("mm", Op::MATMUL, Role::ATTN_Q, 0, "attn", {h, w}));
    return og;
  };
  if (!quantized(wt))
    r.expect.push_back({"a matmul with the norm as its prologue",
                        [](const graph::Node& nd) { return nd.op == Op::MATMUL && nd.fusion.norm_weight >= 0; }});
  r.max_nmse_cpu = r.max_nmse_cuda = limit(wt);
  return r;
}

// x -> RMSNORM -> three matmuls of one width -> (q + k) + v: one stacked GEMV and three column slices.
FusedRow qkv_stack(DType wt, int64_t n, int64_t k) {
  FusedRow r;
  r.name = "QKV_STACK_" + dn(wt) + "_n" + std::to_string(n) + "_k" + std::to_string(k);
  r.build = [=](std::mt19937& rng) {
    OpGraph og{graph::Graph(1, 0)};
    const int x = add_f32_input(og, rng, "x", {1, k}, -2, 2);
    const int nw = add_weight(og, rng, "norm_w", DType::F32, {k}, 0.5f, 1.5f);
    const int h = og.g.add_node("norm", Op::RMSNORM, Role::ATTN_NORM, 0, "attn", {x, nw}, {.eps = 1e-5f});
    const int q =
        og.g.add_node("q", Op::MATMUL, Role::ATTN_Q, 0, "attn", {h, add_weight(og, rng, "wq", wt, {n, k}, -1, 1)});
    const int kk =
        og.g.add_node("k", Op::MATMUL, Role::ATTN_K, 0, "attn", {h, add_weight(og, rng, "wk", wt, {n, k}, -1, 1)});
    const int v =
        og.g.add_node("v", Op::MATMUL, Role::ATTN_V, 0, "attn", {h, add_weight(og, rng, "wv", wt, {n, k}, -1, 1)});
    const int qk = og.g.add_node("qk", Op::ADD, Role::NONE, 0, "attn", {q, kk});
    og.g.mark_output(og.g.add_node("qkv", Op::ADD, Role::NONE, 0, "attn", {qk, v}));
    return og;
  };
  r.expect.push_back({"one matmul over the three stacked weights",
                      [](const graph::Node& nd) { return nd.op == Op::MATMUL && nd.fusion.n_weights == 3; }});
  r.expect.push_back({"column slices of the stack", [](const graph::Node& nd) { return nd.op == Op::SLICE; }});
  r.max_nmse_cpu = r.max_nmse_cuda = limit(wt);
  return r;
}

// x -> gate, up -> SWIGLU: float weights run it in the stacked GEMV's epilogue; quantized ones stack gate|up only.
FusedRow gate_up_swiglu(DType wt, int64_t f, int64_t k) {
  FusedRow r;
  r.name = "GATE_UP_SWIGLU_" + dn(wt) + "_f" + std::to_string(f) + "_k" + std::to_string(k);
  r.build = [=](std::mt19937& rng) {
    OpGraph og{graph::Graph(1, 0)};
    const int x = add_f32_input(og, rng, "x", {1, k}, -2, 2);
    const int g =
        og.g.add_node("gate", Op::MATMUL, Role::FFN_GATE, 0, "ffn", {x, add_weight(og, rng, "wg", wt, {f, k}, -1, 1)});
    const int u =
        og.g.add_node("up", Op::MATMUL, Role::FFN_UP, 0, "ffn", {x, add_weight(og, rng, "wu", wt, {f, k}, -1, 1)});
    og.g.mark_output(og.g.add_node("act", Op::SWIGLU, Role::FFN_ACT, 0, "ffn", {g, u}));
    return og;
  };
  if (quantized(wt))
    r.expect.push_back({"gate|up stacked", [](const graph::Node& nd) {
                          return nd.op == Op::MATMUL && nd.fusion.n_weights == 2 && !nd.fusion.swiglu;
                        }});
  else
    r.expect.push_back({"gate|up stacked with the SwiGLU epilogue", [](const graph::Node& nd) {
                          return nd.op == Op::MATMUL && nd.fusion.n_weights == 2 && nd.fusion.swiglu;
                        }});
  r.max_nmse_cpu = r.max_nmse_cuda = limit(wt);
  return r;
}

// a, x -> MATMUL -> ADD(a, y): the GEMV accumulates into the residual.
FusedRow residual(DType wt, int64_t n, int64_t k) {
  FusedRow r;
  r.name = "RESIDUAL_MATMUL_" + dn(wt) + "_n" + std::to_string(n) + "_k" + std::to_string(k);
  r.build = [=](std::mt19937& rng) {
    OpGraph og{graph::Graph(1, 0)};
    // The residual stream is an activation (an ADD of two inputs here), as it is in a model: the passes never write
    // over a graph input.
    const int a =
        og.g.add_node("a", Op::ADD, Role::NONE, 0, "attn",
                      {add_f32_input(og, rng, "a0", {1, n}, -2, 2), add_f32_input(og, rng, "a1", {1, n}, -2, 2)});
    const int x = add_f32_input(og, rng, "x", {1, k}, -2, 2);
    const int y =
        og.g.add_node("o", Op::MATMUL, Role::ATTN_O, 0, "attn", {x, add_weight(og, rng, "w", wt, {n, k}, -1, 1)});
    og.g.mark_output(og.g.add_node("res", Op::ADD, Role::ATTN_RESIDUAL, 0, "attn", {a, y}));
    return og;
  };
  r.expect.push_back({"a matmul accumulating into the residual",
                      [](const graph::Node& nd) { return nd.op == Op::MATMUL && nd.fusion.residual >= 0; }});
  r.max_nmse_cpu = r.max_nmse_cuda = limit(wt);
  return r;
}

// a, x -> MATMUL -> ADD -> RMSNORM -> MATMUL: the residual GEMV also writes the norm's quantized output (the
// decoder's default for q4_0, q4_1, q5_0, q4_K, q5_K, q6_K, iq4_xs and tq2_0 off its x-stationary kernel), and the next
// GEMV scales by the rms from its block sums.
FusedRow residual_norm_out(DType wt, int64_t n, int64_t k, int64_t m) {
  FusedRow r;
  r.name =
      "RESIDUAL_NORM_OUT_" + dn(wt) + "_n" + std::to_string(n) + "_k" + std::to_string(k) + "_m" + std::to_string(m);
  r.build = [=](std::mt19937& rng) {
    OpGraph og{graph::Graph(1, 0)};
    // The residual stream is an activation (an ADD of two inputs here), as it is in a model: the passes never write
    // over a graph input.
    const int a =
        og.g.add_node("a", Op::ADD, Role::NONE, 0, "attn",
                      {add_f32_input(og, rng, "a0", {1, n}, -2, 2), add_f32_input(og, rng, "a1", {1, n}, -2, 2)});
    const int x = add_f32_input(og, rng, "x", {1, k}, -2, 2);
    const int y =
        og.g.add_node("o", Op::MATMUL, Role::ATTN_O, 0, "attn", {x, add_weight(og, rng, "w", wt, {n, k}, -1, 1)});
    const int s = og.g.add_node("res", Op::ADD, Role::ATTN_RESIDUAL, 0, "attn", {a, y});
    const int h = og.g.add_node("norm", Op::RMSNORM, Role::FFN_NORM, 0, "ffn",
                                {s, add_weight(og, rng, "norm_w", DType::F32, {n}, 0.5f, 1.5f)}, {.eps = 1e-5f});
    og.g.mark_output(
        og.g.add_node("down", Op::MATMUL, Role::FFN_DOWN, 0, "ffn", {h, add_weight(og, rng, "w2", wt, {m, n}, -1, 1)}));
    return og;
  };
  r.expect.push_back({"the residual matmul writing the norm's input", [](const graph::Node& nd) {
                        return nd.op == Op::MATMUL && nd.fusion.residual >= 0 && nd.fusion.norm_out >= 0;
                      }});
  r.expect.push_back({"the norm computed by its producer",
                      [](const graph::Node& nd) { return nd.op == Op::RMSNORM && nd.fusion.in_producer; }});
  r.max_nmse_cpu = r.max_nmse_cuda = kQ8;
  return r;
}

// x -> MATMUL and its unmerged LoRA adapters y += (x·A_iᵀ)·B_iᵀ (models/llama.cpp's graph): the CPU's fast mode runs
// them as one matmul with a LoRA epilogue (kernels/lora.h), the reference mode as these nodes. `ranks`: one adapter
// each. The adapters' weights are as large as the base's so a lost or doubled term shows far above the limit.
FusedRow lora(DType wt, DType lt, int64_t t, int64_t n, int64_t k, std::vector<int64_t> ranks) {
  FusedRow r;
  r.name = "LORA_" + dn(wt) + "_" + dn(lt) + "_t" + std::to_string(t) + "_n" + std::to_string(n) + "_k" +
           std::to_string(k) + "_r";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) r.name += "_";
    r.name += std::to_string(ranks[i]);
  }
  r.build = [=](std::mt19937& rng) {
    OpGraph og{graph::Graph(t, 0)};
    const int x = add_f32_input(og, rng, "x", {t, k}, -2, 2);
    int y = og.g.add_node("q", Op::MATMUL, Role::ATTN_Q, 0, "attn", {x, add_weight(og, rng, "w", wt, {n, k}, -1, 1)});
    for (size_t i = 0; i < ranks.size(); ++i) {
      const std::string id = "q.lora" + std::to_string(i);
      const int a = add_weight(og, rng, id + ".a", lt, {ranks[i], k}, -1, 1);
      const int b = add_weight(og, rng, id + ".b", lt, {n, ranks[i]}, -1, 1);
      const int xa = og.g.add_node(id + "_a", Op::MATMUL, Role::NONE, 0, "attn", {x, a});
      const int xab = og.g.add_node(id + "_b", Op::MATMUL, Role::NONE, 0, "attn", {xa, b});
      y = og.g.add_node(id, Op::ADD, Role::NONE, 0, "attn", {y, xab});
    }
    og.g.mark_output(y);
    return og;
  };
  const int n_adapters = static_cast<int>(ranks.size());
  r.expect.push_back({"a matmul with its adapters as a LoRA epilogue (the CPU's passes)",
                      [=](const graph::Node& nd) { return nd.op == Op::MATMUL && nd.fusion.lora == n_adapters; }});
  // Quantized bases take x in 8 bits per block; so does the f16 A's GEMV at decode.
  r.max_nmse_cpu = r.max_nmse_cuda = quantized(wt) || lt != DType::F32 ? kQ8 : kF32;
  return r;
}

bool is_lora_row(const FusedRow& r) { return r.name.starts_with("LORA_"); }

const std::vector<FusedRow>& fused_rows() {
  static const std::vector<FusedRow> kRows = [] {
    std::vector<FusedRow> v;
    for (const DType w : {DType::F32, DType::F16, DType::BF16, DType::Q4_1}) v.push_back(norm_matmul(w, 96, 576));
    for (const DType w : {DType::F16, DType::BF16, DType::Q8_0, DType::Q4_1}) v.push_back(qkv_stack(w, 64, 576));
    for (const DType w : {DType::F16, DType::BF16, DType::Q8_0, DType::Q4_1}) v.push_back(gate_up_swiglu(w, 1536, 576));
    for (const DType w : {DType::F32, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1})
      v.push_back(residual(w, 576, 1536));
    v.push_back(residual_norm_out(DType::Q4_1, 576, 1536, 1536));
    v.push_back(residual_norm_out(DType::Q4_1, 4096, 4096, 1024));
    // quant_norm=auto's other formats (backend_cuda.cpp): q4_0 and q4_K at the 8B o-projection's shape, q6_K at its
    // down, tq2_0 at BitNet-2B4T's down projection (its shared kernel, not the x-stationary one, which has no norm
    // epilogue).
    v.push_back(residual_norm_out(DType::Q4_0, 4096, 4096, 1024));
    v.push_back(residual_norm_out(DType::Q4_K, 4096, 4096, 1024));
    v.push_back(residual_norm_out(DType::Q6_K, 4096, 14336, 1024));
    v.push_back(residual_norm_out(DType::Q5_0, 4096, 4096, 1024));
    v.push_back(residual_norm_out(DType::Q5_K, 4096, 14336, 1024));
    v.push_back(residual_norm_out(DType::IQ4_XS, 1024, 4096, 256));
    v.push_back(residual_norm_out(DType::TQ2_0, 2560, 6912, 1024));
    // Decode (one token, the default model's q and down shapes), several adapters, and prefill chunks split over
    // threads with a width that leaves the AVX2 kernel a tail.
    v.push_back(lora(DType::Q4_1, DType::F16, 1, 576, 576, {16}));
    v.push_back(lora(DType::Q4_1, DType::F16, 1, 576, 1536, {16, 8}));
    v.push_back(lora(DType::F32, DType::F32, 1, 100, 64, {5}));
    v.push_back(lora(DType::F32, DType::F32, 37, 100, 64, {5, 3}));
    v.push_back(lora(DType::Q4_1, DType::F16, 64, 1536, 576, {16}));
    // The stacked, tiled forms (kernels/lora.h): A of 21 rows (a partial row pass at decode), Bᵀ with a partial
    // 64-column tile and a partial 32-column int8 block (n = 200), a chunk split by tokens unevenly (t = 5), and a
    // float base (A and Bᵀ stay f16: the base's x is not 8-bit).
    v.push_back(lora(DType::Q4_1, DType::F16, 1, 200, 576, {16, 5}));
    v.push_back(lora(DType::Q4_1, DType::F16, 5, 200, 576, {16, 5}));
    v.push_back(lora(DType::F16, DType::F16, 1, 200, 64, {16}));
    v.push_back(lora(DType::F16, DType::F16, 3, 200, 64, {16}));
    return v;
  }();
  return kRows;
}

#ifdef TESSERA_HAVE_CUDA
// The decoder's passes at their defaults (fusion on, norm and SwiGLU folds on).
graph::Graph decoder_rewrite(const graph::Graph& g) {
  return graph::run_passes(g, cuda::decoder_fusion_support(true, true, true));
}
#endif

using Param = std::tuple<size_t, Backend>;
class FusedTable : public ::testing::TestWithParam<Param> {};

TEST_P(FusedTable, MatchesReference) {
  const FusedRow& row = fused_rows()[std::get<0>(GetParam())];
  const Backend be = std::get<1>(GetParam());
  if (be == Backend::CUDA) {
#ifndef TESSERA_HAVE_CUDA
    GTEST_SKIP() << "this build has no CUDA backend";
#endif
    const std::string why = cuda_skip_reason();
    if (!why.empty()) GTEST_SKIP() << why;
    // This table's CUDA runner (op_cuda_fused.cpp) has no form for a matmul with adapters: the decoder's adapted
    // nodes are checked by tests/backends/cuda/test_lora.cpp (CudaLora*).
    if (is_lora_row(row)) GTEST_SKIP() << "the op table's CUDA runner has no LoRA form (see CudaLora* instead)";
  }
  const uint32_t s = seed();
  SCOPED_TRACE(::testing::Message() << "TESSERA_TEST_SEED=" << s);
  std::mt19937 rng(s);
  const OpGraph og = row.build(rng);
  const std::vector<float> ref = run_cpu(og, true);
  std::vector<float> out;
  if (be == Backend::CPU) {
    out = run_cpu(og, false);
  } else {
#ifdef TESSERA_HAVE_CUDA
    std::string skipped;
    std::optional<std::vector<float>> y = run_cuda_fused(og, decoder_rewrite(og.g), &skipped);
    if (!y) GTEST_SKIP() << skipped;
    out = std::move(*y);
#endif
  }
  ASSERT_EQ(out.size(), ref.size());
  for (size_t i = 0; i < out.size(); ++i) ASSERT_TRUE(std::isfinite(out[i])) << "element " << i << " is " << out[i];
  const double e = nmse(out, ref);
  const double lim = be == Backend::CPU ? row.max_nmse_cpu : row.max_nmse_cuda;
  std::printf("[ nmse     ] %s on %s: %.3e (limit %.0e)\n", row.name.c_str(), backend_name(be), e, lim);
  EXPECT_LE(e, lim) << row.name << " on " << backend_name(be);
}

INSTANTIATE_TEST_SUITE_P(Fused, FusedTable,
                         ::testing::Combine(::testing::Range<size_t>(0, fused_rows().size()),
                                            ::testing::Values(Backend::CPU, Backend::CUDA)),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return fused_rows()[std::get<0>(info.param)].name + "_" +
                                  backend_name(std::get<1>(info.param));
                         });

TEST(FusedTable, NamesAreUnique) {
  std::set<std::string> seen;
  for (const FusedRow& r : fused_rows()) EXPECT_TRUE(seen.insert(r.name).second) << r.name;
}

// The decoder's passes make of each row the fused nodes it names (graph only: no GPU needed, only a CUDA build for
// the decoder's FusionSupport), and every fusion kind they emit has a row.
TEST(FusedTable, TheDecoderPassesFuseEachRowAsNamed) {
#ifndef TESSERA_HAVE_CUDA
  GTEST_SKIP() << "this build has no CUDA backend (its FusionSupport is the one these rows exercise)";
#else
  std::mt19937 rng(7);
  std::set<std::string> kinds;
  for (const FusedRow& r : fused_rows()) {
    if (is_lora_row(r)) continue;  // LoRA's CUDA passes: tests/graph (PassesLora) and CudaLoraGraph
    const OpGraph og = r.build(rng);
    const graph::Graph rg = decoder_rewrite(og.g);
    for (const Expect& e : r.expect) {
      const bool found = std::any_of(rg.nodes().begin(), rg.nodes().end(), e.check);
      EXPECT_TRUE(found) << r.name << ": expected " << e.what;
    }
    for (const graph::Node& n : rg.nodes()) {
      const graph::Fusion& f = n.fusion;
      if (f.norm_weight >= 0) kinds.insert("norm prologue");
      if (f.n_weights > 1) kinds.insert("stack");
      if (f.swiglu) kinds.insert("swiglu epilogue");
      if (f.residual >= 0) kinds.insert("residual epilogue");
      if (f.norm_out >= 0) kinds.insert("norm epilogue");
    }
  }
  for (const char* k : {"norm prologue", "stack", "swiglu epilogue", "residual epilogue", "norm epilogue"})
    EXPECT_TRUE(kinds.count(k)) << "no fused row exercises the " << k;
#endif
}

// The CPU's passes (fast mode) fuse each LoRA row into one matmul with its adapters, and nothing else: the rows above
// then compare that fused step with the reference mode's unfused nodes.
TEST(FusedTable, CpuFusesEachLoraRow) {
  std::mt19937 rng(7);
  int rows = 0;
  for (const FusedRow& r : fused_rows()) {
    if (!is_lora_row(r)) continue;
    ++rows;
    const OpGraph og = r.build(rng);
    const graph::Graph rg = graph::run_passes(og.g, graph::FusionSupport{.lora_epilogue = true});
    ASSERT_EQ(rg.nodes().size(), 1u) << r.name;
    for (const Expect& e : r.expect) EXPECT_TRUE(e.check(rg.nodes()[0])) << r.name << ": expected " << e.what;
    EXPECT_EQ(rg.tensor(rg.nodes()[0].output).shape, og.g.tensor(og.g.nodes().back().output).shape) << r.name;
  }
  EXPECT_GT(rows, 0);
}

// An adapter whose intermediate is read by another node too is left as it is (the fused step would not write it).
TEST(FusedTable, CpuKeepsALoraWhoseProductIsReadElsewhere) {
  std::mt19937 rng(7);
  OpGraph og{graph::Graph(1, 0)};
  const int x = add_f32_input(og, rng, "x", {1, 64}, -2, 2);
  const int y = og.g.add_node("q", Op::MATMUL, Role::ATTN_Q, 0, "attn",
                              {x, add_weight(og, rng, "w", DType::F32, {32, 64}, -1, 1)});
  const int xa = og.g.add_node("q.lora0_a", Op::MATMUL, Role::NONE, 0, "attn",
                               {x, add_weight(og, rng, "a", DType::F32, {4, 64}, -1, 1)});
  const int xab = og.g.add_node("q.lora0_b", Op::MATMUL, Role::NONE, 0, "attn",
                                {xa, add_weight(og, rng, "b", DType::F32, {32, 4}, -1, 1)});
  const int sum = og.g.add_node("q.lora0", Op::ADD, Role::NONE, 0, "attn", {y, xab});
  og.g.mark_output(og.g.add_node("other", Op::ADD, Role::NONE, 0, "attn", {sum, xab}));
  const graph::Graph rg = graph::run_passes(og.g, graph::FusionSupport{.lora_epilogue = true});
  ASSERT_EQ(rg.nodes().size(), og.g.nodes().size());
  for (const graph::Node& n : rg.nodes()) EXPECT_EQ(n.fusion.lora, 0) << n.name;
}

}  // namespace
}  // namespace tessera::ops_test
