// What the CUDA executors declare to the graph passes, checked on the llama builder's graph without a device: the
// rewritten graph has the node structure the executors' launches assume (one-token decode of float weights: five
// launching nodes per layer; T rows: q|k|v and gate|up stacks, residual epilogues, fused attention), and the
// comparison switches turn fusions off; and the executors' memory plans (plan_cuda_memory, with the rows executor's
// 16-bit copies) never give two live buffers overlapping bytes.
#include <gtest/gtest.h>

#include "backends/cuda/executor_common.h"
#include "backends/cuda/session_cuda.h"
#include "graph/passes/memory_plan.h"
#include "graph/passes/sparsify.h"
#include "models/llama.h"
#include "models/model_graph.h"
#include "models/model_weights.h"
#include "test_util.h"

namespace tessera::cuda {
namespace {

using graph::Op;

const uint8_t kByte = 0;  // weights are never read: an address marks them bound

ModelWeights tiny(DType dt, int layers = 2) {
  ModelConfig c;
  c.architecture = "llama";
  c.name = "tiny";
  c.n_layers = layers;
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
  for (int l = 0; l < layers; ++l) {
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

// quant_norm=auto (the default): the residual GEMV writes the next norm's 8-bit input for the formats where that
// measured faster on the H100 (q4_0, q4_1, q5_0, q4_K, q5_K, q6_K, iq4_xs; tq2_0 / tq1_0 unless its own kernel is the
// x-stationary one, which has no norm epilogue), and only for quantized readers; q4_1 / all / none as they say.
TEST(CudaFusionSupport, QuantNormFollowsTheMeasuredFormats) {
  const CudaOptions saved = cuda_options();
  const graph::FusionSupport f = decoder_fusion_support(true, true, true);
  const auto w = [](DType d, int64_t n, int64_t k) {
    graph::Tensor t;
    t.dtype = d;
    t.shape = {n, k};
    return t;
  };
  const graph::Tensor q4k_reader = w(DType::Q4_K, 14336, 4096), bf16_reader = w(DType::BF16, 14336, 4096);
  const std::vector<const graph::Tensor*> quantized{&q4k_reader}, mixed{&q4k_reader, &bf16_reader};
  const auto with = [&](QuantNorm qn, DType d, int64_t n, int64_t k) {
    CudaOptions o = saved;
    o.quant_norm = qn;
    set_cuda_options(o);
    return f.residual_norm_out(w(d, n, k), quantized);
  };
  EXPECT_EQ(saved.quant_norm, QuantNorm::AUTO);
  EXPECT_TRUE(with(QuantNorm::AUTO, DType::Q4_1, 4096, 4096));
  EXPECT_TRUE(with(QuantNorm::AUTO, DType::Q4_0, 4096, 4096));
  EXPECT_TRUE(with(QuantNorm::AUTO, DType::Q4_K, 4096, 4096));
  EXPECT_TRUE(with(QuantNorm::AUTO, DType::Q4_K, 4096, 14336));
  EXPECT_TRUE(with(QuantNorm::AUTO, DType::Q6_K, 4096, 14336));
  EXPECT_TRUE(with(QuantNorm::AUTO, DType::Q5_K, 4096, 14336));
  EXPECT_TRUE(with(QuantNorm::AUTO, DType::IQ4_XS, 4096, 4096));
  EXPECT_TRUE(with(QuantNorm::AUTO, DType::Q5_0, 4096, 4096));
  EXPECT_TRUE(with(QuantNorm::AUTO, DType::TQ2_0, 2560, 6912));    // BitNet-2B4T's down: the shared kernel
  EXPECT_TRUE(with(QuantNorm::AUTO, DType::TQ1_0, 2560, 2560));    // held as tq2_0
  EXPECT_FALSE(with(QuantNorm::AUTO, DType::TQ2_0, 4096, 14336));  // Llama-3-8B's down: x-stationary
  EXPECT_FALSE(with(QuantNorm::AUTO, DType::Q8_0, 4096, 4096));    // measured even
  EXPECT_FALSE(with(QuantNorm::AUTO, DType::IQ4_NL, 4096, 4096));  // measured slower
  EXPECT_FALSE(with(QuantNorm::AUTO, DType::BF16, 4096, 4096));    // float weights fold the norm as a prologue
  EXPECT_FALSE(with(QuantNorm::Q4_1_ONLY, DType::Q4_K, 4096, 4096));
  EXPECT_TRUE(with(QuantNorm::Q4_1_ONLY, DType::Q4_1, 4096, 4096));
  EXPECT_TRUE(with(QuantNorm::ALL, DType::Q8_0, 4096, 4096));
  EXPECT_FALSE(with(QuantNorm::NONE, DType::Q4_1, 4096, 4096));
  set_cuda_options(saved);
  EXPECT_FALSE(f.residual_norm_out(w(DType::Q4_K, 4096, 4096), mixed));  // a float reader wants the f32 norm output
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

// The in-place rule of the CUDA plans: an output takes an input's block only as a residual epilogue (every one of
// them: the executors then need no copy), an ADD over its first operand, or the decoder's one-token LAST_ROW or
// SPARSIFY; inputs
// keep their own buffers; the logits' block is never shared.
void expect_cuda_rules(const graph::Graph& r, const graph::MemoryPlan& mp, bool decoder) {
  for (size_t i = 0; i < r.nodes().size(); ++i) {
    const graph::Node& n = r.nodes()[i];
    const int taken = mp.in_place_input[i];
    if (graph::is_matmul_like(n.op) && n.fusion.residual >= 0) {
      EXPECT_EQ(taken, n.fusion.residual) << n.name;
    } else if (taken >= 0) {
      EXPECT_TRUE((n.op == Op::ADD && taken == n.inputs[0]) || (decoder && n.op == Op::LAST_ROW) ||
                  (decoder && n.op == Op::SPARSIFY && taken == n.inputs[0]))
          << n.name;
    }
  }
  for (size_t t = 0; t < r.tensors().size(); ++t)
    if (r.tensors()[t].kind == graph::TensorKind::INPUT) {
      EXPECT_EQ(mp.offsets[t], -1) << r.tensors()[t].name;
    }
  const int logits = r.find_role(graph::IoRole::LOGITS);
  ASSERT_GE(logits, 0);
  const int64_t lo = mp.offsets[size_t(logits)], le = lo + int64_t(r.tensor(logits).nbytes());
  ASSERT_GE(lo, 0);
  for (size_t t = 0; t < r.tensors().size(); ++t)
    if (int(t) != logits && mp.offsets[t] >= 0) {
      const int64_t o = mp.offsets[t];
      EXPECT_TRUE(o + int64_t(r.tensors()[t].nbytes()) <= lo || le <= o) << r.tensors()[t].name;
    }
}

TEST(CudaMemoryPlan, DecoderPlanAtOneToken) {
  for (DType dt : {DType::BF16, DType::F16, DType::Q8_0, DType::Q4_1})
    for (bool fuse : {true, false})
      for (bool fold : {true, false}) {
        const ModelWeights w = tiny(dt);
        const graph::Graph g = build_llama_graph(w, {.n_tokens = 1, .n_ctx = 32});
        const graph::Graph r = graph::run_passes(g, decoder_fusion_support(fuse, fold, fold));
        const graph::MemoryPlan mp = plan_cuda_memory(r, true);
        const auto problems = graph::check_memory_plan(r, mp, {}, kArenaAlignment);
        EXPECT_TRUE(problems.empty()) << dtype_name(dt) << " fuse " << fuse << " fold " << fold << ": "
                                      << problems.front();
        expect_cuda_rules(r, mp, true);
        // Layers reuse blocks: a deeper model needs no larger arena.
        const graph::Graph deep = graph::run_passes(build_llama_graph(tiny(dt, 6), {.n_tokens = 1, .n_ctx = 32}),
                                                    decoder_fusion_support(fuse, fold, fold));
        EXPECT_EQ(plan_cuda_memory(deep, true).total, mp.total) << dtype_name(dt);
      }
}

// TEAL's decode graph (calibrated thresholds): every SPARSIFY writes over its input, so its launch can be skipped and
// the RMSNorm before it fold into the sparse GEMVs (backend_cuda.cpp); the norm's output has no other reader.
TEST(CudaMemoryPlan, DecoderPlanPutsSparsifyOverItsInput) {
  for (DType dt : {DType::BF16, DType::Q4_1}) {
    const ModelWeights w = tiny(dt);
    graph::SparsifyOptions so;
    so.thresholds.assign(2, {0.1f, 0.2f, 0.3f, 0.4f});
    const graph::Graph g = graph::sparsify(build_llama_graph(w, {.n_tokens = 1, .n_ctx = 32}), so);
    const graph::Graph r = graph::run_passes(g, decoder_fusion_support(true, true, true));
    const graph::MemoryPlan mp = plan_cuda_memory(r, true);
    const auto problems = graph::check_memory_plan(r, mp, {}, kArenaAlignment);
    EXPECT_TRUE(problems.empty()) << dtype_name(dt) << ": " << problems.front();
    expect_cuda_rules(r, mp, true);
    int sparsify = 0, after_norm = 0;
    for (size_t i = 0; i < r.nodes().size(); ++i) {
      const graph::Node& n = r.nodes()[i];
      if (n.op != Op::SPARSIFY) continue;
      ++sparsify;
      EXPECT_EQ(mp.in_place_input[i], n.inputs[0]) << n.name;
      EXPECT_EQ(mp.offsets[size_t(n.output)], mp.offsets[size_t(n.inputs[0])]) << n.name;
      const int p = r.tensor(n.inputs[0]).producer;
      if (p >= 0 && r.node(p).op == Op::RMSNORM) ++after_norm;
    }
    EXPECT_EQ(sparsify, 8) << dtype_name(dt);  // 2 layers x (q|k|v, o, gate|up, down)
    if (dt == DType::BF16) {
      EXPECT_EQ(after_norm, 4);  // the attention and ffn norms of each layer
    }
  }
}

TEST(CudaMemoryPlan, RowsPlanWithSixteenBitCopies) {
  for (DType dt : {DType::BF16, DType::Q8_0})
    for (int64_t T : {1, 8, 512})
      for (bool prefill : {true, false})
        for (bool merge : {true, false}) {
          const auto plan = [&](int layers, std::vector<X16Copy>* copies) {
            const graph::Graph r = graph::run_passes(
                build_llama_graph(tiny(dt, layers), {.n_tokens = T, .n_ctx = 1024}), rows_fusion_support(true, merge));
            *copies = rows_x16_copies(r, prefill, true);
            std::vector<graph::ExtraBuffer> extras;
            for (const X16Copy& c : *copies) extras.push_back(c.buffer);
            const graph::MemoryPlan mp = plan_cuda_memory(r, false, extras);
            const auto problems = graph::check_memory_plan(r, mp, extras, kArenaAlignment);
            EXPECT_TRUE(problems.empty()) << dtype_name(dt) << " T " << T << ": " << problems.front();
            expect_cuda_rules(r, mp, false);
            for (const X16Copy& c : *copies) {
              EXPECT_EQ(c.buffer.first_node, r.tensor(c.tensor).producer);
              EXPECT_EQ(c.buffer.bytes, uint64_t(r.tensor(c.tensor).numel()) * 2);
              EXPECT_EQ(c.type, DType::BF16);
            }
            return mp.total;
          };
          std::vector<X16Copy> copies, deep_copies;
          const uint64_t total = plan(2, &copies);
          // From matmul_x16_min_t rows on (5 for bf16, 41 for quantized weights): both norms and the SwiGLU of every
          // layer, and in prefill the attention output for the o-projection.
          const int64_t min_t = dt == DType::BF16 ? 5 : 41;
          const size_t per_layer = T < min_t ? 0 : prefill ? 4 : 3;
          EXPECT_EQ(copies.size(), 2 * per_layer + (T < min_t ? 0 : 1))  // + the output norm's, read by the logits
              << dtype_name(dt) << " T " << T << " prefill " << prefill;
          // The arena holds a few layers' buffers however deep the model is.
          EXPECT_EQ(plan(6, &deep_copies), total) << dtype_name(dt) << " T " << T;
        }
}

// The CUDA backend's supports(): every node a llama graph has, in a native or a converted format (q6_K runs as bf16),
// every node of the ternary families' graphs, and no test-only op (SCALE has no CUDA kernel); the answer needs no
// device.
TEST(CudaBackendSupports, LlamaNodesYesTestOnlyOpNo) {
  const backend::Backend& b = cuda_backend();
  for (DType dt : {DType::BF16, DType::Q8_0, DType::Q6_K}) {
    const graph::Graph g = build_llama_graph(tiny(dt), {.n_tokens = 4, .n_ctx = 32});
    for (const graph::Node& n : g.nodes()) EXPECT_TRUE(b.supports(n, g)) << dtype_name(dt) << " " << n.name;
  }
  // The ternary families (tq2_0 weights, ACT_QUANT_I8, RELU2_GLU; the MatMul-free LM's MLGRU and its f32 STATE).
  for (const char* m : {"hf/tiny-bitnet-256", "hf/tiny-hgrn-bit-f32"}) {
    const ModelWeights w = ModelWeights::open(test::data_path(m));
    for (const int64_t t : {1, 4}) {
      const graph::Graph tg = build_model_graph(w, {.n_tokens = t, .n_ctx = 32});
      for (const graph::Node& n : tg.nodes()) EXPECT_TRUE(b.supports(n, tg)) << m << " " << n.name;
    }
  }
  graph::Graph g(3, 0);
  const int x = g.add_input("x", DType::F32, {3, 8});
  graph::OpParams p;
  p.scale = 2.0f;
  g.add_node("s", graph::Op::SCALE, graph::Role::NONE, 0, "test", {x}, p);
  EXPECT_FALSE(b.supports(g.node(0), g));
}

}  // namespace
}  // namespace tessera::cuda
