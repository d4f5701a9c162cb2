// The ternary models' ops (BitNet b1.58, the MatMul-free LM): shape checks, costs, and the CPU kernels (both modes)
// against values computed here. Their op-table rows are in test_ops.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/error.h"
#include "op_case.h"

namespace tessera::ops_test {
namespace {

std::vector<float> floats_of(const std::vector<uint8_t>& bytes) {
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

// transformers' ActQuant in f32, written out: s = 127 / max(max|x|, 1e-5); clamp(round-half-even(x * s)) / s.
std::vector<float> act_quant_want(const std::vector<float>& x, int64_t k) {
  std::vector<float> y(x.size());
  for (size_t r = 0; r < x.size() / size_t(k); ++r) {
    float amax = 1e-5f;
    for (int64_t i = 0; i < k; ++i) amax = std::max(amax, std::fabs(x[r * k + i]));
    const float s = 127.0f / amax;
    for (int64_t i = 0; i < k; ++i) {
      const float v = x[r * k + i] * s;
      float q = std::floor(v);
      const float frac = v - q;
      if (frac > 0.5f || (frac == 0.5f && std::fmod(q, 2.0f) != 0)) q += 1;  // half to even
      y[r * k + i] = std::clamp(q, -128.0f, 127.0f) / s;
    }
  }
  return y;
}

TEST(OpTernary, ActQuantI8MatchesActQuant) {
  std::mt19937 rng(11);
  const OpGraph og = simple(rng, graph::Op::ACT_QUANT_I8, {{4, 300}}, {});
  const auto x = floats_of(og.inputs.at("x0"));
  const auto want = act_quant_want(x, 300);
  for (const bool reference : {true, false}) {
    const std::vector<float> y = run_cpu(og, reference);
    ASSERT_EQ(y.size(), want.size());
    for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], want[i]) << "element " << i;
  }
  // At most 256 levels per row, the row's largest magnitude kept exactly.
  const std::vector<float> y = run_cpu(og, true);
  for (int r = 0; r < 4; ++r) {
    float amax = 0, ymax = 0;
    for (int i = 0; i < 300; ++i) {
      amax = std::max(amax, std::fabs(x[r * 300 + i]));
      ymax = std::max(ymax, std::fabs(y[r * 300 + i]));
    }
    EXPECT_NEAR(ymax, amax, 1e-6f * amax);
  }
  EXPECT_EQ(og.g.node(0).flops, 4u * 4 * 300);
  EXPECT_EQ(og.g.node(0).bytes, 2u * 4 * 300 * 4);
  EXPECT_TRUE(graph::may_write_over_input(graph::Op::ACT_QUANT_I8, 0));
}

// Ties round to even as torch.round does: 0.5 * 127 / 127 ... built so x * s lands exactly on halves.
TEST(OpTernary, ActQuantI8RoundsTiesToEvenAndZeroRows) {
  graph::Graph g(2, 0);
  OpGraph og{graph::Graph(2, 0)};
  const int x = og.g.add_input("x0", DType::F32, {2, 4});
  og.g.mark_output(og.g.add_node("q", graph::Op::ACT_QUANT_I8, graph::Role::ACT_QUANT, 0, "test", {x}));
  // Row 0: max 127 so s = 1: 2.5 -> 2, 3.5 -> 4, -0.5 -> -0. Row 1: all zeros stays zeros (scale clamped at 1e-5).
  const float in[8] = {127.0f, 2.5f, 3.5f, -0.5f, 0, 0, 0, 0};
  og.inputs["x0"].resize(sizeof(in));
  std::memcpy(og.inputs["x0"].data(), in, sizeof(in));
  for (const bool reference : {true, false}) {
    const std::vector<float> y = run_cpu(og, reference);
    EXPECT_EQ(y, (std::vector<float>{127.0f, 2.0f, 4.0f, -0.0f, 0, 0, 0, 0}));
  }
  const int ids = g.add_input("ids", DType::I32, {2});
  EXPECT_THROW(g.add_node("ints", graph::Op::ACT_QUANT_I8, graph::Role::ACT_QUANT, 0, "test", {ids}), Error);
}

TEST(OpTernary, Relu2Glu) {
  std::mt19937 rng(12);
  const OpGraph og = simple(rng, graph::Op::RELU2_GLU, {{3, 77}, {3, 77}}, {});
  const auto gate = floats_of(og.inputs.at("x0")), up = floats_of(og.inputs.at("x1"));
  for (const bool reference : {true, false}) {
    const std::vector<float> y = run_cpu(og, reference);
    for (size_t i = 0; i < y.size(); ++i) {
      const double r = std::max(0.0, double(gate[i]));
      ASSERT_NEAR(y[i], r * r * up[i], 1e-6 * std::max(1.0, std::fabs(r * r * up[i]))) << "element " << i;
    }
  }
  EXPECT_EQ(og.g.node(0).flops, 3u * 3 * 77);
  graph::Graph bad(3, 0);
  const int a = bad.add_input("a", DType::F32, {3, 4}), b = bad.add_input("b", DType::F32, {3, 5});
  EXPECT_THROW(bad.add_node("act", graph::Op::RELU2_GLU, graph::Role::FFN_ACT, 0, "ffn", {a, b}), Error);
}

// The recurrence against matmulfreellm's arithmetic written out in double (f = lb + (1 - lb) sigmoid(f_raw),
// i = silu(c_raw) (1 - f), h = f h + i), from the case's random state at P > 0 and from zeros at P = 0.
TEST(OpTernary, MlgruRecurrence) {
  for (const int64_t n_past : {int64_t{0}, int64_t{4}}) {
    std::mt19937 rng(13);
    const int64_t t = 6, d = 37;
    const OpGraph og = mlgru(rng, t, d, n_past);
    const auto f = floats_of(og.inputs.at("f_raw")), c = floats_of(og.inputs.at("c_raw"));
    const auto h0 = floats_of(og.caches.at("state"));
    const float* lb = reinterpret_cast<const float*>(og.weights.at(0)->data());
    for (const bool reference : {true, false}) {
      const std::vector<float> y = run_cpu(og, reference);
      for (int64_t j = 0; j < d; ++j) {
        double h = n_past == 0 ? 0.0 : h0[j];
        for (int64_t s = 0; s < t; ++s) {
          const size_t i = size_t(s * d + j);
          const double ff = lb[j] + (1 - lb[j]) / (1 + std::exp(-double(f[i])));
          h = ff * h + c[i] / (1 + std::exp(-double(c[i]))) * (1 - ff);
          ASSERT_NEAR(y[i], h, 1e-5) << "step " << s << " channel " << j << " P " << n_past;
        }
      }
    }
  }
  // The state must be the layer's f32 STATE [D + 1].
  graph::Graph g(2, 0);
  const int a = g.add_input("a", DType::F32, {2, 8}), b = g.add_input("b", DType::F32, {2, 8});
  const int lb = g.add_input("lb", DType::F32, {8});
  const int cache = g.add_kv_cache("s", DType::F32, {9});
  EXPECT_THROW(g.add_node("r", graph::Op::MLGRU, graph::Role::MLGRU, 0, "attn", {a, b, lb, cache}), Error);
  g.set_io_role(cache, graph::IoRole::STATE, 0);
  EXPECT_NO_THROW(g.add_node("r", graph::Op::MLGRU, graph::Role::MLGRU, 0, "attn", {a, b, lb, cache}));
  const int wrong = g.add_kv_cache("s8", DType::F32, {8});
  g.set_io_role(wrong, graph::IoRole::STATE, 1);
  EXPECT_THROW(g.add_node("r8", graph::Op::MLGRU, graph::Role::MLGRU, 0, "attn", {a, b, lb, wrong}), Error);
}

}  // namespace
}  // namespace tessera::ops_test
