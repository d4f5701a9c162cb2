// The llama-family graph builder: node counts, names, shapes, FLOPs formulas, weight binding errors, rope
// frequencies; and the default model's totals at T=1 and T=512.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "models/llama.h"
#include "models/model_weights.h"
#include "tessera/error.h"
#include "test_util.h"

namespace tessera {
namespace {

using graph::Op;

ModelConfig tiny_config(bool tied) {
  ModelConfig c;
  c.architecture = "llama";
  c.name = "tiny";
  c.n_layers = 2;
  c.n_embd = 64;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.head_dim = 16;
  c.n_ff = 96;
  c.n_vocab = 100;
  c.n_ctx_train = 128;
  c.rope_dim = 16;
  c.rope_base = 10000;
  c.tied_output = tied;
  return c;
}

TensorView view(std::string name, DType dt, std::vector<int64_t> shape) {
  TensorView v;
  v.name = std::move(name);
  v.dtype = dt;
  v.shape = std::move(shape);
  return v;
}

std::vector<TensorView> tiny_views(const ModelConfig& c) {
  const int64_t E = c.n_embd, Q = c.n_head * c.head_dim, KV = c.n_head_kv * c.head_dim, F = c.n_ff;
  std::vector<TensorView> v{view("token_embd.weight", DType::Q8_0, {c.n_vocab, E}),
                            view("output_norm.weight", DType::F32, {E})};
  if (!c.tied_output) v.push_back(view("output.weight", DType::F16, {c.n_vocab, E}));
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    v.push_back(view(p + "attn_norm.weight", DType::F32, {E}));
    v.push_back(view(p + "ffn_norm.weight", DType::F32, {E}));
    v.push_back(view(p + "attn_q.weight", DType::Q4_1, {Q, E}));
    v.push_back(view(p + "attn_k.weight", DType::Q4_1, {KV, E}));
    v.push_back(view(p + "attn_v.weight", DType::Q4_1, {KV, E}));
    v.push_back(view(p + "attn_output.weight", DType::Q4_1, {E, Q}));
    v.push_back(view(p + "ffn_gate.weight", DType::Q4_0, {F, E}));
    v.push_back(view(p + "ffn_up.weight", DType::Q4_0, {F, E}));
    v.push_back(view(p + "ffn_down.weight", DType::Q8_0, {E, F}));
  }
  return v;
}

// Matmul FLOPs of one forward pass, from the definition 2·T·N·K summed over the layer's projections.
uint64_t expected_matmul_flops(const ModelConfig& c, int64_t t, int64_t out_rows) {
  const int64_t E = c.n_embd, Q = c.n_head * c.head_dim, KV = c.n_head_kv * c.head_dim, F = c.n_ff;
  const int64_t per_layer = E * Q + 2 * E * KV + Q * E + 3 * E * F;
  return uint64_t(2 * t * per_layer * c.n_layers + 2 * out_rows * c.n_vocab * E);
}

TEST(LlamaGraph, NodesNamesAndShapes) {
  const ModelConfig c = tiny_config(false);
  const ModelWeights w = ModelWeights::from_views(c, tiny_views(c), "tiny");
  const graph::Graph g = build_llama_graph(w, {.n_tokens = 5, .n_past = 3, .n_ctx = 64});
  // 17 nodes per block, plus embedding, last-token selection, output norm and output.
  EXPECT_EQ(g.nodes().size(), size_t(17 * c.n_layers + 4));
  const auto shape_of = [&](const char* name) {
    const int n = g.find_node(name);
    EXPECT_GE(n, 0) << name;
    return n < 0 ? std::vector<int64_t>{} : g.tensor(g.node(n).output).shape;
  };
  EXPECT_EQ(shape_of("token_embd"), (std::vector<int64_t>{5, 64}));
  EXPECT_EQ(shape_of("blk.1.attn_q"), (std::vector<int64_t>{5, 64}));
  EXPECT_EQ(shape_of("blk.1.attn_k"), (std::vector<int64_t>{5, 32}));
  EXPECT_EQ(shape_of("blk.0.ffn_act"), (std::vector<int64_t>{5, 96}));
  EXPECT_EQ(shape_of("blk.0.cache_k_store"), (std::vector<int64_t>{2, 64, 16}));
  EXPECT_EQ(shape_of("last_token"), (std::vector<int64_t>{1, 64}));
  EXPECT_EQ(shape_of("output"), (std::vector<int64_t>{1, 100}));
  const graph::Node& q = g.node(g.find_node("blk.1.attn_q"));
  EXPECT_EQ(q.layer, 1);
  EXPECT_EQ(graph::role_name(q.role), "attn_q");
  EXPECT_EQ(g.tensor(q.inputs[1]).name, "blk.1.attn_q.weight");
  EXPECT_EQ(g.tensor(q.inputs[1]).dtype, DType::Q4_1);
  EXPECT_EQ(g.tensor(g.node(g.find_node("output")).inputs[1]).name, "output.weight");
  EXPECT_EQ(g.tensor(g.find_tensor("blk.0.cache_v")).kind, graph::TensorKind::KV_CACHE);
  EXPECT_TRUE(g.tensor(g.find_tensor("output")).is_output);
  // The builder gives its inputs, logits and caches roles: what backends and the runtime look them up by.
  EXPECT_EQ(g.find_role(graph::IoRole::TOKENS), g.find_tensor("tokens"));
  EXPECT_EQ(g.find_role(graph::IoRole::POSITIONS), g.find_tensor("positions"));
  EXPECT_EQ(g.find_role(graph::IoRole::LOGITS), g.find_tensor("output"));
  EXPECT_EQ(g.find_role(graph::IoRole::CACHE_K, 1), g.find_tensor("blk.1.cache_k"));
  EXPECT_EQ(g.find_role(graph::IoRole::CACHE_V, 0), g.find_tensor("blk.0.cache_v"));

  uint64_t mm = 0;
  for (const auto& n : g.nodes())
    if (n.op == Op::MATMUL) mm += n.flops;
  EXPECT_EQ(mm, expected_matmul_flops(c, 5, 1));
}

TEST(LlamaGraph, TiedOutputAndAllLogits) {
  const ModelConfig c = tiny_config(true);
  const ModelWeights w = ModelWeights::from_views(c, tiny_views(c), "tiny");
  const graph::Graph g = build_llama_graph(w, {.n_tokens = 4, .all_logits = true});
  EXPECT_EQ(g.find_node("last_token"), -1);
  EXPECT_EQ(g.nodes().size(), size_t(17 * c.n_layers + 3));
  const graph::Node& out = g.node(g.find_node("output"));
  EXPECT_EQ(g.tensor(out.inputs[1]).name, "token_embd.weight");
  EXPECT_EQ(g.tensor(out.output).shape, (std::vector<int64_t>{4, 100}));
  EXPECT_EQ(out.flops, uint64_t(2 * 4 * 100 * 64));
}

TEST(LlamaGraph, MissingOrMisshapedWeightIsAnError) {
  const ModelConfig c = tiny_config(false);
  auto views = tiny_views(c);
  std::erase_if(views, [](const TensorView& v) { return v.name == "blk.1.ffn_up.weight"; });
  EXPECT_THROW(build_llama_graph(ModelWeights::from_views(c, views, "tiny"), {}), Error);
  views = tiny_views(c);
  for (auto& v : views)
    if (v.name == "blk.0.attn_k.weight") v.shape = {64, 64};
  try {
    build_llama_graph(ModelWeights::from_views(c, views, "tiny"), {});
    FAIL() << "mis-shaped attn_k accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("blk.0.attn_k.weight"), std::string::npos) << e.what();
  }
}

TEST(LlamaGraph, RejectsTokensBeyondTheContext) {
  const ModelConfig c = tiny_config(true);
  const ModelWeights w = ModelWeights::from_views(c, tiny_views(c), "tiny");
  EXPECT_THROW(build_llama_graph(w, {.n_tokens = 8, .n_past = 60, .n_ctx = 64}), Error);
  EXPECT_THROW(build_llama_graph(w, {.n_tokens = 0}), Error);
}

TEST(RopeInvFreq, PlainLinearFactorsAndLlama3) {
  ModelConfig c = tiny_config(true);
  c.rope_base = 500000;
  const auto plain = rope_inv_freq(c, nullptr);
  ASSERT_EQ(plain.size(), 8u);
  for (size_t i = 0; i < plain.size(); ++i)
    EXPECT_FLOAT_EQ(plain[i], float(std::pow(500000.0, -2.0 * double(i) / 16.0)));

  c.rope_scaling.type = "linear";
  c.rope_scaling.factor = 4;
  const auto lin = rope_inv_freq(c, nullptr);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_FLOAT_EQ(lin[i], plain[i] / 4);

  c.rope_scaling.type = "freqs";
  std::vector<float> factors{1, 2, 3, 4, 5, 6, 7, 8};
  const auto fr = rope_inv_freq(c, factors.data());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_FLOAT_EQ(fr[i], plain[i] / factors[i]);

  // llama3: wavelengths below old_ctx/high keep their frequency, above old_ctx/low are divided by the factor, and
  // the ones in between are interpolated (so they lie between the two).
  c.rope_scaling = RopeScaling{"llama3", 8.0f, 1.0f, 4.0f, 8192};
  const auto l3 = rope_inv_freq(c, nullptr);
  int kept = 0, scaled = 0, mixed = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    const double wavelen = 2 * std::numbers::pi / plain[i];
    if (wavelen < 8192.0 / 4) {
      EXPECT_FLOAT_EQ(l3[i], plain[i]);
      ++kept;
    } else if (wavelen > 8192.0) {
      EXPECT_FLOAT_EQ(l3[i], plain[i] / 8);
      ++scaled;
    } else {
      EXPECT_LT(l3[i], plain[i]);
      EXPECT_GT(l3[i], plain[i] / 8);
      ++mixed;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(scaled, 0);
  // YaRN over the same original context (8192, factor 8, base 500000, 16 dims): pairs rotating more than 32 times
  // (i <= 2) keep their frequency, fewer than once (i >= 5) are divided by the factor, the two between are blended
  // (transformers' logits check the values: FamilyHf's tiny-qwen3-yarn-f32).
  c.rope_scaling.type = "yarn";
  const auto y = rope_inv_freq(c, nullptr);
  for (size_t i = 0; i < plain.size(); ++i) {
    if (i <= 2) {
      EXPECT_FLOAT_EQ(y[i], plain[i]) << i;
    } else if (i >= 5) {
      EXPECT_FLOAT_EQ(y[i], plain[i] / 8) << i;
    } else {
      EXPECT_TRUE(y[i] < plain[i] && y[i] > plain[i] / 8) << i;
    }
  }
  c.rope_scaling.type = "dynamic";
  EXPECT_THROW(rope_inv_freq(c, nullptr), Error);
}

TEST(LlamaGraph, DefaultModelTotals) {
  TESSERA_REQUIRE_DEFAULT_MODEL(path);
  const ModelWeights w = ModelWeights::open(path);
  const ModelConfig& c = w.config();
  EXPECT_EQ(c.n_layers, 30);
  EXPECT_TRUE(c.tied_output);
  for (int64_t t : {1, 512}) {
    const graph::Graph g = build_llama_graph(w, {.n_tokens = t, .n_ctx = 1024});
    EXPECT_EQ(g.nodes().size(), size_t(17 * 30 + (t > 1 ? 4 : 3)));
    const graph::Totals tot = g.totals();
    EXPECT_EQ(tot.matmul_flops, expected_matmul_flops(c, t, 1)) << "T=" << t;
    EXPECT_GT(tot.matmul_flop_share(), 0.9);
    // Every weight of the file is read once per forward pass, plus the rope inverse frequencies (f32 [rope_dim/2]).
    uint64_t file_bytes = 0;
    for (const auto& v : w.tensors()) file_bytes += v.nbytes;
    EXPECT_EQ(tot.weight_bytes, file_bytes + uint64_t(c.rope_dim / 2 * 4));
    EXPECT_EQ(g.tensor(g.node(g.find_node("blk.0.attn_q")).inputs[1]).dtype, DType::Q4_1);
    EXPECT_EQ(g.tensor(g.node(g.find_node("output")).inputs[1]).dtype, DType::Q8_0);
  }
}

}  // namespace
}  // namespace tessera
