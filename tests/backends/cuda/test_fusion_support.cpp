// What the CUDA executors declare to the graph passes, checked on the llama builder's graph without a device: the
// rewritten graph has the node structure the executors' launches assume (one-token decode of float weights: five
// launching nodes per layer; T rows: q|k|v and gate|up stacks, residual epilogues, fused attention), and the
// comparison switches turn fusions off.
#include <gtest/gtest.h>

#include "backends/cuda/executor_common.h"
#include "models/llama.h"
#include "models/model_weights.h"

namespace tessera::cuda {
namespace {

using graph::Op;

const uint8_t kByte = 0;  // weights are never read: an address marks them bound

ModelWeights tiny(DType dt) {
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
  c.tied_output = true;
  std::vector<TensorView> v;
  const auto add = [&](std::string name, DType t, std::vector<int64_t> shape) {
    TensorView w;
    w.name = std::move(name);
    w.dtype = t;
    w.shape = std::move(shape);
    w.data = &kByte;
    v.push_back(std::move(w));
  };
  add("token_embd.weight", dt, {100, 64});
  add("output_norm.weight", DType::F32, {64});
  for (int l = 0; l < 2; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", DType::F32, {64});
    add(p + "ffn_norm.weight", DType::F32, {64});
    add(p + "attn_q.weight", dt, {64, 64});
    add(p + "attn_k.weight", dt, {32, 64});
    add(p + "attn_v.weight", dt, {32, 64});
    add(p + "attn_output.weight", dt, {64, 64});
    add(p + "ffn_gate.weight", dt, {96, 64});
    add(p + "ffn_up.weight", dt, {96, 64});
    add(p + "ffn_down.weight", dt, {64, 96});
  }
  return ModelWeights::from_views(c, v, "tiny");
}

// Nodes of layer l that launch something (SLICE is a view; an RMSNORM written by its producer launches nothing).
int launching(const graph::Graph& g, int l) {
  int n = 0;
  for (const graph::Node& x : g.nodes()) n += x.layer == l && x.op != Op::SLICE && !x.fusion.in_producer;
  return n;
}

TEST(CudaFusionSupport, DecoderFloatWeightsFiveLaunchesPerLayer) {
  const ModelWeights w = tiny(DType::BF16);
  const graph::Graph g = build_llama_graph(w, {.n_tokens = 1, .n_ctx = 32});
  const graph::Graph r = graph::run_passes(g, decoder_fusion_support(true, true, true));
  for (int l = 0; l < 2; ++l) EXPECT_EQ(launching(r, l), 5) << l;
  const graph::Node& ffn = r.node(r.find_node("blk.1.ffn_norm+ffn_gate+ffn_up+ffn_act"));
  EXPECT_TRUE(ffn.fusion.swiglu);
  EXPECT_GE(ffn.fusion.norm_weight, 0);
  // TESSERA_CUDA_FOLD_NORM=0 / FOLD_SWIGLU=0: the norms and the SwiGLU launch again.
  const graph::Graph nf = graph::run_passes(g, decoder_fusion_support(true, false, false));
  for (int l = 0; l < 2; ++l) EXPECT_EQ(launching(nf, l), 8) << l;
  // TESSERA_CUDA_FUSE=0: only rope and stores stay inside the attention.
  const graph::Graph off = graph::run_passes(g, decoder_fusion_support(false, true, true));
  for (int l = 0; l < 2; ++l) EXPECT_EQ(launching(off, l), 13) << l;
}

TEST(CudaFusionSupport, DecoderQuantizedWeights) {
  const ModelWeights w = tiny(DType::Q8_0);
  const graph::Graph g = build_llama_graph(w, {.n_tokens = 1, .n_ctx = 32});
  const graph::Graph r = graph::run_passes(g, decoder_fusion_support(true, true, true));
  // q8_0 writes no norm input by default (TESSERA_CUDA_QUANT_NORM): norm, q|k|v, attention, o, norm, gate|up, swiglu,
  // down.
  for (int l = 0; l < 2; ++l) EXPECT_EQ(launching(r, l), 8) << l;
  EXPECT_GE(r.find_node("blk.0.attn_q+attn_k+attn_v"), 0);
  EXPECT_GE(r.find_node("blk.0.ffn_gate+ffn_up"), 0);
  EXPECT_EQ(r.node(r.find_node("blk.0.ffn_act")).op, Op::SWIGLU);
  EXPECT_LT(r.node(r.find_node("blk.0.attn_q+attn_k+attn_v")).fusion.norm_weight, 0);  // no prologue on q8
}

TEST(CudaFusionSupport, RowsStacksResidualsAndAttention) {
  const ModelWeights w = tiny(DType::BF16);
  const graph::Graph g = build_llama_graph(w, {.n_tokens = 8, .n_ctx = 32});
  const graph::Graph r = graph::run_passes(g, rows_fusion_support(true, true));
  // norm, q|k|v, attention, o (+residual), norm, gate|up, swiglu, down (+residual).
  for (int l = 0; l < 2; ++l) EXPECT_EQ(launching(r, l), 8) << l;
  EXPECT_TRUE(r.node(r.find_node("blk.0.ffn_gate+ffn_up")).fusion.gate_up);
  // TESSERA_CUDA_MERGE_GATE_UP=0: gate and up separate.
  const graph::Graph sep = graph::run_passes(g, rows_fusion_support(true, false));
  EXPECT_LT(sep.find_node("blk.0.ffn_gate+ffn_up"), 0);
  EXPECT_GE(sep.find_node("blk.0.ffn_gate"), 0);
  const graph::Graph off = graph::run_passes(g, rows_fusion_support(false, true));
  for (const graph::Node& n : off.nodes()) {
    EXPECT_TRUE(n.fusion.fused_from.empty() || n.fusion.rope_store) << n.name;
  }
}

}  // namespace
}  // namespace tessera::cuda
