// A tiny random Llama (2 blocks, GQA 4/2 heads, f32 weights) run by the engine and by a naive double-precision
// forward pass written here from the model's definition: checks the graph's semantics (rope pairing in both modes,
// GQA head mapping, causal attention over the cache, SwiGLU, residuals, tied and separate outputs) without any model
// file. The reference path must agree to float rounding; the fast path within f16-cache rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "models/model_weights.h"
#include "naive_llama.h"
#include "runtime/session.h"

namespace tessera::runtime {
namespace {

struct TinyModel {
  ModelConfig c;
  std::vector<std::pair<std::string, std::vector<float>>> tensors;  // name -> f32 data (owned here)
  std::vector<TensorView> views;

  const std::vector<float>& get(const std::string& name) const {
    for (const auto& [n, d] : tensors)
      if (n == name) return d;
    throw std::runtime_error("no tensor " + name);
  }
};

TinyModel make_tiny(bool neox, bool tied, uint32_t seed) {
  TinyModel m;
  ModelConfig& c = m.c;
  c.architecture = "llama";
  c.n_layers = 2;
  c.n_embd = 64;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.head_dim = 16;
  c.n_ff = 96;
  c.n_vocab = 50;
  c.n_ctx_train = 64;
  c.rope_dim = 16;
  c.rope_base = 10000;
  c.rope_neox = neox;
  c.tied_output = tied;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-0.25f, 0.25f);
  const auto add = [&](const std::string& name, std::vector<int64_t> shape, bool norm) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> data(static_cast<size_t>(n));
    for (float& x : data) x = norm ? 1.0f + u(rng) : u(rng);
    m.tensors.emplace_back(name, std::move(data));
    TensorView v;
    v.name = name;
    v.dtype = DType::F32;
    v.shape = shape;
    v.nbytes = static_cast<uint64_t>(n) * 4;
    m.views.push_back(v);
  };
  const int64_t E = c.n_embd, Q = c.n_head * c.head_dim, KV = c.n_head_kv * c.head_dim, F = c.n_ff;
  add("token_embd.weight", {c.n_vocab, E}, false);
  add("output_norm.weight", {E}, true);
  if (!tied) add("output.weight", {c.n_vocab, E}, false);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", {E}, true);
    add(p + "attn_q.weight", {Q, E}, false);
    add(p + "attn_k.weight", {KV, E}, false);
    add(p + "attn_v.weight", {KV, E}, false);
    add(p + "attn_output.weight", {E, Q}, false);
    add(p + "ffn_norm.weight", {E}, true);
    add(p + "ffn_gate.weight", {F, E}, false);
    add(p + "ffn_up.weight", {F, E}, false);
    add(p + "ffn_down.weight", {E, F}, false);
  }
  for (size_t i = 0; i < m.views.size(); ++i)
    m.views[i].data = reinterpret_cast<const uint8_t*>(m.tensors[i].second.data());
  return m;
}

test::NaiveSpec naive_spec(const ModelConfig& c) {
  test::NaiveSpec s;
  s.n_layers = c.n_layers;
  s.n_embd = c.n_embd;
  s.n_head = c.n_head;
  s.n_head_kv = c.n_head_kv;
  s.head_dim = c.head_dim;
  s.n_ff = c.n_ff;
  s.n_vocab = c.n_vocab;
  s.eps = c.norm_eps;
  s.neox = c.rope_neox;
  s.tied = c.tied_output;
  for (int64_t i = 0; i < c.rope_dim / 2; ++i) s.inv_freq.push_back(std::pow(double(c.rope_base), -2.0 * double(i) / double(c.rope_dim)));
  return s;
}

struct Case {
  bool neox, tied, reference;
  int64_t n_batch;
};

class TinyLlama : public ::testing::TestWithParam<Case> {};

TEST_P(TinyLlama, MatchesNaiveForward) {
  const Case cs = GetParam();
  const TinyModel m = make_tiny(cs.neox, cs.tied, 1234);
  const ModelWeights w = ModelWeights::from_views(m.c, m.views, "tiny");
  const std::vector<int32_t> ids{3, 17, 42, 0, 49, 8, 8, 21, 5, 30, 11};
  const auto want = test::naive_forward(naive_spec(m.c), [&](const std::string& n) -> const std::vector<float>& { return m.get(n); }, ids);
  SessionOptions so;
  so.n_ctx = 32;
  so.n_batch = cs.n_batch;
  so.n_threads = 2;
  so.reference = cs.reference;
  Engine e(w, nullptr, resolve_options(so, w.config()));
  // Prefill the first 7 tokens with every position's logits, then decode the rest one by one.
  const size_t V = size_t(m.c.n_vocab);
  std::vector<float> rows(7 * V);
  e.eval(std::span<const int32_t>(ids.data(), 7), rows.data());
  std::vector<std::vector<float>> got;
  for (size_t t = 0; t < 7; ++t) got.emplace_back(rows.begin() + long(t * V), rows.begin() + long((t + 1) * V));
  for (size_t t = 7; t < ids.size(); ++t) {
    const auto l = e.eval(std::span<const int32_t>(&ids[t], 1));
    got.emplace_back(l.begin(), l.end());
  }
  // Reference kernels: float storage, double dot products -> float rounding only. Fast path: an f16 cache
  // (relative rounding 2^-11) and float accumulation.
  const double tol = cs.reference ? 1e-5 : 3e-3;
  for (size_t t = 0; t < ids.size(); ++t) {
    double scale = 0;
    for (double x : want[t]) scale = std::max(scale, std::fabs(x));
    for (size_t i = 0; i < V; ++i)
      ASSERT_NEAR(got[t][i], want[t][i], tol * scale) << "token " << t << " logit " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, TinyLlama,
                         ::testing::Values(Case{false, true, true, 512}, Case{true, false, true, 3},
                                           Case{false, false, false, 512}, Case{true, true, false, 2}));

}  // namespace
}  // namespace tessera::runtime
