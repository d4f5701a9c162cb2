// The graph passes on the llama builder's own graph (models/llama.cpp), not a copy of it: every layer fuses as the
// CUDA executors expect, and the verifier finds nothing lost. Weights carry a dummy address (never read).
#include <gtest/gtest.h>

#include "graph/passes/fuse.h"
#include "models/llama.h"
#include "models/model_weights.h"

namespace tessera {
namespace {

using graph::Op;

const uint8_t kByte = 0;

ModelWeights tiny_weights() {
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
  const int64_t E = 64, Q = 64, KV = 32, F = 96;
  std::vector<TensorView> v;
  const auto add = [&](std::string name, DType dt, std::vector<int64_t> shape) {
    TensorView t;
    t.name = std::move(name);
    t.dtype = dt;
    t.shape = std::move(shape);
    t.data = &kByte;
    v.push_back(std::move(t));
  };
  add("token_embd.weight", DType::Q8_0, {100, E});
  add("output_norm.weight", DType::F32, {E});
  add("output.weight", DType::F16, {100, E});
  for (int l = 0; l < 2; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", DType::F32, {E});
    add(p + "ffn_norm.weight", DType::F32, {E});
    add(p + "attn_q.weight", DType::F16, {Q, E});
    add(p + "attn_k.weight", DType::F16, {KV, E});
    add(p + "attn_v.weight", DType::F16, {KV, E});
    add(p + "attn_output.weight", DType::Q4_1, {E, Q});
    add(p + "ffn_gate.weight", DType::Q4_0, {F, E});
    add(p + "ffn_up.weight", DType::Q4_0, {F, E});
    add(p + "ffn_down.weight", DType::Q8_0, {E, F});
  }
  return ModelWeights::from_views(c, v, "tiny");
}

bool quantized(DType t) { return t == DType::Q8_0 || t == DType::Q4_0 || t == DType::Q4_1; }

TEST(LlamaPasses, DecoderShapeOfEveryLayer) {
  const ModelWeights w = tiny_weights();
  const graph::Graph g = build_llama_graph(w, {.n_tokens = 1, .n_past = 0, .n_ctx = 64});
  graph::FusionSupport f;
  f.norm_prologue = [](const graph::Tensor& t) { return !quantized(t.dtype); };
  f.stack_shared_input = true;
  f.swiglu_epilogue = [](const graph::Graph& gr, const std::vector<int>& ws, int) {
    return !quantized(gr.tensor(ws[0]).dtype);
  };
  f.residual_epilogue = true;
  f.residual_norm_out = [](const graph::Tensor& t, const std::vector<const graph::Tensor*>& readers) {
    for (const graph::Tensor* r : readers)
      if (!quantized(r->dtype)) return false;
    return t.dtype == DType::Q4_1;
  };
  f.rope_store_attention = true;
  const graph::Graph r = graph::run_passes(g, f);
  EXPECT_TRUE(graph::verify_rewrite(g, r).empty());
  for (int l = 0; l < 2; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const auto node = [&](const std::string& name) -> const graph::Node& {
      const int id = r.find_node(name);
      EXPECT_GE(id, 0) << name;
      return r.node(std::max(id, 0));
    };
    EXPECT_EQ(node(p + "attn_norm+attn_q+attn_k+attn_v").fusion.n_weights, 3);  // f16: norm folded
    EXPECT_TRUE(node(p + "attn").fusion.rope_store);
    EXPECT_TRUE(node(p + "ffn_norm").fusion.in_producer);  // written by the q4_1 o-projection
    EXPECT_EQ(node(p + "attn_output+attn_residual").fusion.norm_out, node(p + "ffn_norm").output);
    EXPECT_EQ(node(p + "ffn_gate+ffn_up").fusion.n_weights, 2);  // q4_0: SwiGLU stays a node
    EXPECT_EQ(node(p + "ffn_act").op, Op::SWIGLU);
    EXPECT_GE(node(p + "ffn_down+ffn_residual").fusion.residual, 0);
  }
  EXPECT_GE(r.find_node("output_norm+output"), 0);  // f16 output: the norm folds into it
  EXPECT_EQ(r.tensor(r.find_role(graph::IoRole::LOGITS)).shape, (std::vector<int64_t>{1, 100}));
}

TEST(LlamaPasses, RowsShapeOfEveryLayer) {
  const ModelWeights w = tiny_weights();
  const graph::Graph g = build_llama_graph(w, {.n_tokens = 5, .n_past = 0, .n_ctx = 64});
  graph::FusionSupport f;
  f.stack_qkv = f.stack_gate_up = f.residual_epilogue = f.rope_store_attention = true;
  const graph::Graph r = graph::run_passes(g, f);
  EXPECT_TRUE(graph::verify_rewrite(g, r).empty());
  int stacks = 0, attn = 0, residual = 0, slices = 0;
  for (const graph::Node& n : r.nodes()) {
    stacks += n.fusion.n_weights > 1;
    attn += n.fusion.rope_store;
    residual += n.fusion.residual >= 0;
    slices += n.op == Op::SLICE;
    EXPECT_NE(n.op, Op::ROPE);
    EXPECT_NE(n.op, Op::KV_STORE);
  }
  EXPECT_EQ(stacks, 4);  // q|k|v and gate|up per layer
  EXPECT_EQ(attn, 2);
  EXPECT_EQ(residual, 4);
  EXPECT_EQ(slices, 10);
  EXPECT_TRUE(r.node(r.find_node("blk.0.ffn_gate+ffn_up")).fusion.gate_up);
}

}  // namespace
}  // namespace tessera
