// The families beyond Llama through the shared builder (models/llama.cpp via models/model_graph.h): the nodes each
// family's config adds (Gemma 3: embedding scale, q/k norms, post-norms, GEGLU, local and global layers, softcap;
// Qwen2: biases; Qwen3: q/k norms), and the graph passes on those graphs: the new ops are never fused, a windowed
// attention is never folded into the rope + store + attention node, a post-norm keeps its matmul from taking the
// residual add, and the rewrite stays whole. Weights point at a buffer of zeros (never read).
#include <gtest/gtest.h>

#include <cmath>

#include "graph/passes/fuse.h"
#include "models/model_graph.h"
#include "models/model_weights.h"
#include "tessera/error.h"

namespace tessera {
namespace {

using graph::Op;
using graph::Role;

alignas(64) const float kZeros[4096] = {};

constexpr int64_t E = 64, H = 4, Hkv = 2, D = 16, F = 96, V = 100;

ModelWeights family_weights(const std::string& arch, int layers = 3) {
  ModelConfig c;
  c.architecture = arch;
  c.name = "tiny-" + arch;
  c.n_layers = layers;
  c.n_embd = E;
  c.n_head = H;
  c.n_head_kv = Hkv;
  c.head_dim = D;
  c.n_ff = F;
  c.n_vocab = V;
  c.n_ctx_train = 128;
  c.rope_dim = D;
  c.rope_base = 1e6f;
  c.rope_neox = true;
  c.tied_output = true;
  c.qkv_bias = arch == "qwen2";
  c.qk_norm = arch != "qwen2";
  if (arch == "gemma3") {
    c.ffn_act = "gelu_tanh";
    c.post_norms = true;
    c.embd_scale = 8.0f;
    c.attn_scale = 0.2f;
    c.sliding_window = 8;
    c.swa_pattern = 3;  // layers 0 and 1 local, 2 global
    c.rope_base_local = 1e4f;
    c.final_softcap = 30.0f;
  }
  std::vector<TensorView> v;
  const auto add = [&](std::string name, DType dt, std::vector<int64_t> shape) {
    TensorView t;
    t.name = std::move(name);
    t.dtype = dt;
    t.shape = std::move(shape);
    t.data = reinterpret_cast<const uint8_t*>(kZeros);
    v.push_back(std::move(t));
  };
  add("token_embd.weight", DType::Q8_0, {V, E});
  add("output_norm.weight", DType::F32, {E});
  for (int l = 0; l < layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", DType::F32, {E});
    add(p + "ffn_norm.weight", DType::F32, {E});
    add(p + "attn_q.weight", DType::F16, {H * D, E});
    add(p + "attn_k.weight", DType::F16, {Hkv * D, E});
    add(p + "attn_v.weight", DType::F16, {Hkv * D, E});
    add(p + "attn_output.weight", DType::Q4_1, {E, H * D});
    add(p + "ffn_gate.weight", DType::F16, {F, E});
    add(p + "ffn_up.weight", DType::F16, {F, E});
    add(p + "ffn_down.weight", DType::Q4_1, {E, F});
    if (c.qkv_bias) {
      add(p + "attn_q.bias", DType::F32, {H * D});
      add(p + "attn_k.bias", DType::F32, {Hkv * D});
      add(p + "attn_v.bias", DType::F32, {Hkv * D});
    }
    if (c.qk_norm) {
      add(p + "attn_q_norm.weight", DType::F32, {D});
      add(p + "attn_k_norm.weight", DType::F32, {D});
    }
    if (c.post_norms) {
      add(p + "post_attention_norm.weight", DType::F32, {E});
      add(p + "post_ffw_norm.weight", DType::F32, {E});
    }
  }
  return ModelWeights::from_views(c, v, "tiny-" + arch);
}

const graph::Node& node(const graph::Graph& g, const std::string& name) {
  const int id = g.find_node(name);
  EXPECT_GE(id, 0) << name;
  return g.node(id < 0 ? 0 : id);
}

bool quantized(DType t) { return t == DType::Q8_0 || t == DType::Q4_0 || t == DType::Q4_1; }

// What the CUDA executors declare (as tests/graph/test_passes.cpp writes them): the one-token decoder and the rows
// executor.
graph::FusionSupport decoder_support() {
  graph::FusionSupport f;
  f.norm_prologue = [](const graph::Tensor& w) { return !quantized(w.dtype); };
  f.stack_shared_input = true;
  f.swiglu_epilogue = [](const graph::Graph& g, const std::vector<int>& w, int) {
    return !quantized(g.tensor(w[0]).dtype);
  };
  f.residual_epilogue = true;
  f.residual_norm_out = [](const graph::Tensor& w, const std::vector<const graph::Tensor*>&) {
    return w.dtype == DType::Q4_1;
  };
  f.rope_store_attention = true;
  return f;
}

graph::FusionSupport rows_support() {
  graph::FusionSupport f;
  f.stack_qkv = true;
  f.stack_gate_up = true;
  f.residual_epilogue = true;
  f.rope_store_attention = true;
  return f;
}

TEST(FamilyGraph, Gemma3Nodes) {
  const ModelWeights w = family_weights("gemma3");
  const graph::Graph g = build_model_graph(w, {.n_tokens = 5, .n_past = 20, .n_ctx = 64});
  EXPECT_EQ(node(g, "token_embd_scale").op, Op::SCALE);
  EXPECT_EQ(node(g, "token_embd_scale").params.scale, 8.0f);
  EXPECT_EQ(node(g, "blk.0.attn_q_norm").op, Op::HEAD_RMSNORM);
  EXPECT_EQ(node(g, "blk.0.attn_q_norm").params.head_dim, D);
  EXPECT_EQ(node(g, "blk.0.attn_k_norm").op, Op::HEAD_RMSNORM);
  EXPECT_EQ(node(g, "blk.0.ffn_act").op, Op::GEGLU);
  EXPECT_EQ(node(g, "blk.0.attn_post_norm").role, Role::ATTN_POST_NORM);
  EXPECT_EQ(node(g, "blk.0.ffn_post_norm").role, Role::FFN_POST_NORM);
  // The residual adds read the post-norms, not the matmuls.
  EXPECT_EQ(g.tensor(node(g, "blk.0.attn_residual").inputs[1]).name, "blk.0.attn_post_norm");
  EXPECT_EQ(g.tensor(node(g, "blk.0.ffn_residual").inputs[1]).name, "blk.0.ffn_post_norm");
  // Local layers slide and rotate with their own frequencies; the global layer does neither.
  EXPECT_EQ(node(g, "blk.0.attn").params.window, 8);
  EXPECT_EQ(node(g, "blk.1.attn").params.window, 8);
  EXPECT_EQ(node(g, "blk.2.attn").params.window, 0);
  EXPECT_EQ(node(g, "blk.0.attn").params.attn_scale, 0.2f);
  EXPECT_EQ(g.tensor(node(g, "blk.0.rope_q").inputs[2]).name, "rope_inv_freq_local");
  EXPECT_EQ(g.tensor(node(g, "blk.2.rope_q").inputs[2]).name, "rope_inv_freq");
  EXPECT_EQ(g.tensor(node(g, "blk.0.rope_q").inputs[0]).name, "blk.0.attn_q_norm");
  EXPECT_EQ(node(g, "output_softcap").op, Op::SOFTCAP);
  EXPECT_EQ(g.tensor(g.require_role(graph::IoRole::LOGITS)).name, "output_softcap");
  // A window as long as the cache drops nothing: the attention is a plain one.
  const graph::Graph short_ctx = build_model_graph(w, {.n_tokens = 1, .n_past = 0, .n_ctx = 8});
  EXPECT_EQ(node(short_ctx, "blk.0.attn").params.window, 0);
  // The cost model counts the window's keys only.
  EXPECT_LT(node(g, "blk.0.attn").flops, node(g, "blk.2.attn").flops);
}

TEST(FamilyGraph, QwenNodes) {
  const graph::Graph q2 = build_model_graph(family_weights("qwen2"), {.n_tokens = 2, .n_ctx = 16});
  for (const char* b : {"blk.1.attn_q_bias", "blk.1.attn_k_bias", "blk.1.attn_v_bias"})
    EXPECT_EQ(node(q2, b).op, Op::BIAS_ADD) << b;
  EXPECT_EQ(q2.tensor(node(q2, "blk.1.rope_q").inputs[0]).name, "blk.1.attn_q_bias");
  EXPECT_EQ(q2.tensor(node(q2, "blk.1.cache_v_store").inputs[0]).name, "blk.1.attn_v_bias");
  EXPECT_EQ(q2.find_node("blk.0.attn_q_norm"), -1);
  const graph::Graph q3 = build_model_graph(family_weights("qwen3"), {.n_tokens = 2, .n_ctx = 16});
  EXPECT_EQ(node(q3, "blk.1.attn_k_norm").op, Op::HEAD_RMSNORM);
  EXPECT_EQ(q3.find_node("blk.0.attn_q_bias"), -1);
  EXPECT_EQ(node(q3, "blk.0.ffn_act").op, Op::SWIGLU);
}

TEST(FamilyGraph, MissingFamilyTensorIsNamed) {
  ModelWeights w = family_weights("qwen2");
  std::vector<TensorView> views = w.tensors();
  std::erase_if(views, [](const TensorView& t) { return t.name == "blk.1.attn_k.bias"; });
  const ModelWeights broken = ModelWeights::from_views(w.config(), views, "tiny-qwen2");
  try {
    build_model_graph(broken, {.n_tokens = 1, .n_ctx = 16});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'blk.1.attn_k.bias' is missing"), std::string::npos) << e.what();
  }
  ModelConfig c = w.config();
  c.architecture = "gpt2";
  EXPECT_THROW(build_model_graph(ModelWeights::from_views(c, w.tensors(), "x"), {.n_tokens = 1}), Error);
}

// The passes on each family's graph, as both CUDA executors declare them: whole, the new ops untouched.
TEST(FamilyPasses, NewOpsAreNeverFused) {
  for (const std::string arch : {"gemma3", "qwen2", "qwen3"}) {
    for (const int64_t t : {1, 6}) {
      const graph::Graph g = build_model_graph(family_weights(arch), {.n_tokens = t, .n_ctx = 64});
      for (const graph::FusionSupport& fs : {decoder_support(), rows_support()}) {
        const graph::Graph r = graph::run_passes(g, fs);
        const auto problems = graph::verify_rewrite(g, r);
        EXPECT_TRUE(problems.empty()) << arch << ": " << (problems.empty() ? "" : problems[0]);
        for (const graph::Node& n : r.nodes()) {
          const std::string what = arch + " " + n.name;
          if (n.op == Op::GEGLU || n.op == Op::HEAD_RMSNORM || n.op == Op::BIAS_ADD || n.op == Op::SOFTCAP ||
              n.op == Op::SCALE) {
            EXPECT_TRUE(n.fusion.empty()) << what;
          }
          for (const std::string& part : n.fusion.fused_from) {
            const graph::Node& src = g.node(g.find_node(part));
            EXPECT_TRUE(src.op != Op::GEGLU && src.op != Op::HEAD_RMSNORM && src.op != Op::BIAS_ADD &&
                        src.op != Op::SOFTCAP && src.op != Op::SCALE)
                << what << " swallowed " << part;
            // A post-norm stays a norm of its own: neither a matmul's prologue nor written by a residual matmul.
            EXPECT_TRUE(src.role != Role::ATTN_POST_NORM && src.role != Role::FFN_POST_NORM) << what << " " << part;
          }
          if (n.role == Role::ATTN_POST_NORM || n.role == Role::FFN_POST_NORM) {
            EXPECT_FALSE(n.fusion.in_producer);
          }
          // A windowed attention stays unfused (the fused executors read no window), so they refuse it.
          if (n.op == Op::ATTENTION && n.params.window > 0) {
            EXPECT_FALSE(n.fusion.rope_store) << what;
          }
          // Gemma's o and down projections feed post-norms, so no residual epilogue may take their adds.
          if (arch == "gemma3" && is_matmul_like(n.op)) {
            EXPECT_LT(n.fusion.residual, 0) << what;
          }
        }
        // Gemma's global layer (no window) still fuses its rope, store and attention, with the q norm before them.
        if (arch == "gemma3") {
          bool global_fused = false;
          for (const graph::Node& n : r.nodes())
            global_fused |= n.op == Op::ATTENTION && n.layer == 2 && n.fusion.rope_store;
          EXPECT_TRUE(global_fused);
        }
      }
    }
  }
}

}  // namespace
}  // namespace tessera
