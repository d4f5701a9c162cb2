// Graph passes on the graph alone (no device): each rewrite on a llama-shaped graph, graphs where a rewrite's
// precondition fails (nothing fused, nothing lost), the verifier, the memory planner and role lookup.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "graph/graph.h"
#include "graph/passes/fuse.h"
#include "graph/passes/memory_plan.h"
#include "graph/printer.h"
#include "tessera/error.h"

namespace tessera::graph {
namespace {

// Weights are never read here: any non-null address marks them bound (the passes stack only bound weights).
const char kBytes[1] = {0};
const void* bound() { return kBytes; }

struct Shape {
  int64_t layers = 2, T = 1, E = 64, H = 4, Hkv = 2, D = 16, F = 128, V = 96, ctx = 32;
  DType w = DType::F16;
  std::optional<DType> w_v;  // attn_v's format when it differs from w (a Q4_K_M file's q6_K attn_v)
  // Unmerged LoRA adapters on all seven projections, one per rank, as the builder writes them (x·Aᵀ, ·Bᵀ, add).
  std::vector<int64_t> lora_ranks;
};

// The llama builder's graph (src/models/llama.cpp) written with the graph API, so these tests need no model file.
Graph llama_like(const Shape& s) {
  Graph g(s.T, 0);
  const int tokens = g.add_input("tokens", DType::I32, {s.T});
  const int positions = g.add_input("positions", DType::I32, {s.T});
  g.set_io_role(tokens, IoRole::TOKENS);
  g.set_io_role(positions, IoRole::POSITIONS);
  const int inv = g.add_constant("rope_inv_freq", std::vector<float>(static_cast<size_t>(s.D / 2), 1.0f));
  const auto w = [&](const std::string& name, std::vector<int64_t> shape, DType t) {
    return g.add_weight(name, t, std::move(shape), bound());
  };
  // A projection and its adapters, as models/llama.cpp's `matmul` (A in f16; B in f16 at decode, f32 in chunks).
  const auto matmul = [&](const std::string& name, Role role, int layer, const std::string& block, int x, int wt) {
    int y = g.add_node(name, Op::MATMUL, role, layer, block, {x, wt});
    const int64_t n = g.tensor(wt).shape[0], k = g.tensor(wt).shape[1];
    for (size_t i = 0; i < s.lora_ranks.size(); ++i) {
      const int64_t r = s.lora_ranks[i];
      const std::string id = ".lora" + std::to_string(i);
      const int a = w(name + id + "_a.weight", {r, k}, DType::F16);
      const int b = w(name + id + "_b.weight", {n, r}, s.T > 1 ? DType::F32 : DType::F16);
      const int xa = g.add_node(name + id + "_a", Op::MATMUL, Role::NONE, layer, block, {x, a});
      const int xab = g.add_node(name + id + "_b", Op::MATMUL, Role::NONE, layer, block, {xa, b});
      y = g.add_node(name + id, Op::ADD, Role::NONE, layer, block, {y, xab});
    }
    return y;
  };
  const int embd = w("token_embd.weight", {s.V, s.E}, s.w);
  int x = g.add_node("token_embd", Op::EMBED, Role::TOKEN_EMBD, -1, "embd", {embd, tokens});
  const OpParams rq{.n_head = s.H, .head_dim = s.D, .rope_dim = s.D};
  OpParams rk = rq;
  rk.n_head = s.Hkv;
  const OpParams norm{.eps = 1e-5f};
  const OpParams kv{.n_head_kv = s.Hkv, .head_dim = s.D};
  const OpParams at{.n_head = s.H, .n_head_kv = s.Hkv, .head_dim = s.D, .attn_scale = 0.25f};
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const int ck = g.add_kv_cache(p + "cache_k", DType::F16, {s.Hkv, s.ctx, s.D});
    const int cv = g.add_kv_cache(p + "cache_v", DType::F16, {s.Hkv, s.ctx, s.D});
    g.set_io_role(ck, IoRole::CACHE_K, l);
    g.set_io_role(cv, IoRole::CACHE_V, l);
    int h = g.add_node(p + "attn_norm", Op::RMSNORM, Role::ATTN_NORM, l, "attn",
                       {x, w(p + "attn_norm.weight", {s.E}, DType::F32)}, norm);
    int q = matmul(p + "attn_q", Role::ATTN_Q, l, "attn", h, w(p + "attn_q.weight", {s.H * s.D, s.E}, s.w));
    int k = matmul(p + "attn_k", Role::ATTN_K, l, "attn", h, w(p + "attn_k.weight", {s.Hkv * s.D, s.E}, s.w));
    int v = matmul(p + "attn_v", Role::ATTN_V, l, "attn", h,
                   w(p + "attn_v.weight", {s.Hkv * s.D, s.E}, s.w_v.value_or(s.w)));
    q = g.add_node(p + "rope_q", Op::ROPE, Role::ROPE_Q, l, "attn", {q, positions, inv}, rq);
    k = g.add_node(p + "rope_k", Op::ROPE, Role::ROPE_K, l, "attn", {k, positions, inv}, rk);
    const int sk = g.add_node(p + "cache_k_store", Op::KV_STORE, Role::CACHE_K, l, "attn", {k, ck}, kv);
    const int sv = g.add_node(p + "cache_v_store", Op::KV_STORE, Role::CACHE_V, l, "attn", {v, cv}, kv);
    g.mark_output(sk);
    g.mark_output(sv);
    const int a = g.add_node(p + "attn", Op::ATTENTION, Role::ATTN, l, "attn", {q, sk, sv}, at);
    const int ao =
        matmul(p + "attn_output", Role::ATTN_O, l, "attn", a, w(p + "attn_output.weight", {s.E, s.H * s.D}, s.w));
    x = g.add_node(p + "attn_residual", Op::ADD, Role::ATTN_RESIDUAL, l, "attn", {x, ao});
    h = g.add_node(p + "ffn_norm", Op::RMSNORM, Role::FFN_NORM, l, "ffn",
                   {x, w(p + "ffn_norm.weight", {s.E}, DType::F32)}, norm);
    const int gate = matmul(p + "ffn_gate", Role::FFN_GATE, l, "ffn", h, w(p + "ffn_gate.weight", {s.F, s.E}, s.w));
    const int up = matmul(p + "ffn_up", Role::FFN_UP, l, "ffn", h, w(p + "ffn_up.weight", {s.F, s.E}, s.w));
    const int act = g.add_node(p + "ffn_act", Op::SWIGLU, Role::FFN_ACT, l, "ffn", {gate, up});
    const int down = matmul(p + "ffn_down", Role::FFN_DOWN, l, "ffn", act, w(p + "ffn_down.weight", {s.E, s.F}, s.w));
    x = g.add_node(p + "ffn_residual", Op::ADD, Role::FFN_RESIDUAL, l, "ffn", {x, down});
  }
  if (s.T > 1) x = g.add_node("last_token", Op::LAST_ROW, Role::LAST_TOKEN, -1, "output", {x});
  x = g.add_node("output_norm", Op::RMSNORM, Role::OUTPUT_NORM, -1, "output",
                 {x, w("output_norm.weight", {s.E}, DType::F32)}, norm);
  const int logits = g.add_node("output", Op::MATMUL, Role::OUTPUT, -1, "output", {x, embd});
  g.mark_output(logits);
  g.set_io_role(logits, IoRole::LOGITS);
  return g;
}

bool quantized(DType t) { return t == DType::Q8_0 || t == DType::Q4_0 || t == DType::Q4_1; }

// What the one-token CUDA decoder declares (backend_cuda.cpp), without its device checks.
FusionSupport decoder_support() {
  FusionSupport f;
  f.norm_prologue = [](const Tensor& w) { return !quantized(w.dtype); };
  f.stack_shared_input = true;
  f.swiglu_epilogue = [](const Graph& g, const std::vector<int>& w, int) { return !quantized(g.tensor(w[0]).dtype); };
  f.residual_epilogue = true;
  f.residual_norm_out = [](const Tensor& w, const std::vector<const Tensor*>& readers) {
    if (w.dtype != DType::Q4_1) return false;
    for (const Tensor* r : readers)
      if (!quantized(r->dtype)) return false;
    return true;
  };
  f.rope_store_attention = true;
  return f;
}

// What the T-row CUDA executor declares (executor_rows.cpp).
FusionSupport rows_support() {
  FusionSupport f;
  f.stack_qkv = true;
  f.stack_gate_up = true;
  f.residual_epilogue = true;
  f.rope_store_attention = true;
  return f;
}

// CUDA's LoRA declaration added to a support (backend_cuda.cpp, executor_rows.cpp).
FusionSupport with_lora_first(FusionSupport f) {
  f.lora_epilogue = true;
  f.lora_first = true;
  return f;
}

const Node* find(const Graph& g, const std::string& name) {
  const int id = g.find_node(name);
  return id < 0 ? nullptr : &g.node(id);
}

int count_op(const Graph& g, Op op, int layer) {
  int c = 0;
  for (const Node& n : g.nodes()) c += n.op == op && n.layer == layer;
  return c;
}

void expect_no_overlap(const Graph& g, const MemoryPlan& mp);

void expect_whole(const Graph& source, const Graph& rewritten) {
  const auto problems = verify_rewrite(source, rewritten);
  EXPECT_TRUE(problems.empty()) << (problems.empty() ? "" : problems[0]) << "\n" << to_text(rewritten);
}

// The rows executor's attention reads k and v with one row stride: with attn_v in another format than q and k, a
// q|k stack beside a lone v would give them two, so the q|k|v policy stacks all three or none.
TEST(Passes, QkvStackIsAllOrNone) {
  Shape s;
  s.T = 8;
  s.w = DType::Q4_K;
  s.w_v = DType::Q6_K;
  const Graph g = llama_like(s);
  const Graph r = run_passes(g, rows_support());
  expect_whole(g, r);
  for (const Node& n : r.nodes())
    if (n.role == Role::ATTN_Q || n.role == Role::ATTN_K || n.role == Role::ATTN_V) {
      EXPECT_EQ(n.fusion.n_weights, 1) << n.name;
    }
  s.w_v.reset();  // one format: stacked
  const Graph r2 = run_passes(llama_like(s), rows_support());
  EXPECT_NE(find(r2, "blk.0.attn_q+attn_k+attn_v"), nullptr) << to_text(r2);
}

TEST(Passes, NoSupportMeansNoChange) {
  const Graph g = llama_like({});
  const Graph r = run_passes(g, FusionSupport{});
  ASSERT_EQ(r.nodes().size(), g.nodes().size());
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    EXPECT_EQ(r.nodes()[i].name, g.nodes()[i].name);
    EXPECT_TRUE(r.nodes()[i].fusion.empty());
  }
}

TEST(Passes, DecoderFloatLayerIsFiveFusedNodes) {
  const Shape s;
  const Graph g = llama_like(s);
  const Graph r = run_passes(g, decoder_support());
  expect_whole(g, r);
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    // norm + q|k|v as one matmul over the stack, with three column views for the attention.
    const Node* qkv = find(r, p + "attn_norm+attn_q+attn_k+attn_v");
    ASSERT_NE(qkv, nullptr) << to_text(r);
    EXPECT_EQ(qkv->fusion.n_weights, 3);
    EXPECT_GE(qkv->fusion.norm_weight, 0);
    EXPECT_EQ(r.tensor(qkv->output).shape, (std::vector<int64_t>{1, (s.H + 2 * s.Hkv) * s.D}));
    EXPECT_EQ(count_op(r, Op::SLICE, l), 3);
    EXPECT_EQ(qkv->source, g.find_node(p + "attn_q"));  // profiles report the stack under its first matmul
    // rope + stores + attention.
    const Node* at = find(r, p + "attn");
    ASSERT_NE(at, nullptr);
    EXPECT_TRUE(at->fusion.rope_store);
    EXPECT_EQ(at->fusion.fused_from, (std::vector<std::string>{p + "rope_q", p + "rope_k", p + "cache_k_store",
                                                               p + "cache_v_store", p + "attn"}));
    EXPECT_EQ(r.tensor(at->inputs[1]).io, IoRole::CACHE_K);
    EXPECT_EQ(r.tensor(at->inputs[2]).io, IoRole::CACHE_V);
    EXPECT_EQ(r.tensor(at->inputs[5]).io, IoRole::POSITIONS);
    EXPECT_EQ(count_op(r, Op::ROPE, l) + count_op(r, Op::KV_STORE, l), 0);
    // o-projection accumulating into the residual stream.
    const Node* o = find(r, p + "attn_output+attn_residual");
    ASSERT_NE(o, nullptr);
    EXPECT_GE(o->fusion.residual, 0);
    // norm + gate|up + swiglu: one matmul with a prologue and an epilogue, output [1, F].
    const Node* ffn = find(r, p + "ffn_norm+ffn_gate+ffn_up+ffn_act");
    ASSERT_NE(ffn, nullptr);
    EXPECT_TRUE(ffn->fusion.swiglu);
    EXPECT_EQ(ffn->fusion.n_weights, 2);
    EXPECT_EQ(r.tensor(ffn->output).shape, (std::vector<int64_t>{1, s.F}));
    ASSERT_NE(find(r, p + "ffn_down+ffn_residual"), nullptr);
    // Five computing nodes per layer (the slices are views).
    int computing = 0;
    for (const Node& n : r.nodes()) computing += n.layer == l && n.op != Op::SLICE;
    EXPECT_EQ(computing, 5);
  }
  EXPECT_GE(r.find_role(IoRole::LOGITS), 0);
  EXPECT_NE(to_text(r).find("fuses blk.0.rope_q, blk.0.rope_k"), std::string::npos);
  const auto j = nlohmann::json::parse(to_json(r));
  bool listed = false;
  for (const auto& n : j.at("nodes"))
    if (n.at("name") == "blk.1.attn_output+attn_residual")
      listed = n.at("fused_from") == nlohmann::json({"blk.1.attn_output", "blk.1.attn_residual"});
  EXPECT_TRUE(listed);
  EXPECT_FALSE(nlohmann::json::parse(to_json(g)).at("nodes")[0].contains("fused_from"));
}

TEST(Passes, DecoderQuantizedKeepsNormsAndSwigluAndWritesNormInputs) {
  Shape s;
  s.w = DType::Q4_1;
  const Graph g = llama_like(s);
  const Graph r = run_passes(g, decoder_support());
  expect_whole(g, r);
  // Layer 0's attention norm reads the embedding (no residual matmul before it): a plain norm.
  const Node* n0 = find(r, "blk.0.attn_norm");
  ASSERT_NE(n0, nullptr);
  EXPECT_FALSE(n0->fusion.in_producer);
  ASSERT_NE(find(r, "blk.0.attn_q+attn_k+attn_v"), nullptr);
  // The o-projection writes the ffn norm's quantized input; the norm stays, marked.
  const Node* o = find(r, "blk.0.attn_output+attn_residual");
  ASSERT_NE(o, nullptr);
  const Node* fn = find(r, "blk.0.ffn_norm");
  ASSERT_NE(fn, nullptr);
  EXPECT_TRUE(fn->fusion.in_producer);
  EXPECT_EQ(o->fusion.norm_out, fn->output);
  // gate|up stacked, SwiGLU kept reading the two column views.
  const Node* act = find(r, "blk.0.ffn_act");
  ASSERT_NE(act, nullptr);
  EXPECT_EQ(r.node(r.tensor(act->inputs[0]).producer).op, Op::SLICE);
  EXPECT_EQ(r.node(r.tensor(act->inputs[1]).producer).op, Op::SLICE);
  // The last layer's down projection feeds output_norm, whose reader (the f16... here q4_1 tied embedding) is
  // quantized.
  EXPECT_TRUE(find(r, "output_norm")->fusion.in_producer);
}

TEST(Passes, RowsStacksQkvAndGateUpOnly) {
  Shape s;
  s.T = 8;
  const Graph g = llama_like(s);
  const Graph r = run_passes(g, rows_support());
  expect_whole(g, r);
  const Node* qkv = find(r, "blk.1.attn_q+attn_k+attn_v");
  ASSERT_NE(qkv, nullptr);
  EXPECT_LT(qkv->fusion.norm_weight, 0);  // no norm prologue declared
  const Node* gu = find(r, "blk.1.ffn_gate+ffn_up");
  ASSERT_NE(gu, nullptr);
  EXPECT_FALSE(gu->fusion.swiglu);
  ASSERT_NE(find(r, "blk.1.ffn_act"), nullptr);
  ASSERT_NE(find(r, "blk.1.attn_norm"), nullptr);
  // The output projection reads the last row's norm: nothing to stack it with.
  EXPECT_TRUE(find(r, "output")->fusion.empty());
}

// x·A then ·B beside x·W: the decoder stacks the two readers of x (A and W) and keeps B; the rows policy stacks
// neither (their outputs feed no attention). Either way every node is accounted for.
TEST(Passes, ExtraMatmulChainIsKept) {
  Graph g(1, 0);
  const int x = g.add_input("x", DType::F32, {1, 32});
  const int a =
      g.add_node("xa", Op::MATMUL, Role::NONE, 0, "ffn", {x, g.add_weight("A", DType::F16, {16, 32}, bound())});
  const int ab =
      g.add_node("xab", Op::MATMUL, Role::NONE, 0, "ffn", {a, g.add_weight("B", DType::F16, {32, 16}, bound())});
  const int xw =
      g.add_node("xw", Op::MATMUL, Role::NONE, 0, "ffn", {x, g.add_weight("W", DType::F16, {32, 32}, bound())});
  g.mark_output(g.add_node("sum", Op::ADD, Role::NONE, 0, "ffn", {ab, xw}));
  const Graph d = run_passes(g, decoder_support());
  expect_whole(g, d);
  const Node* st = find(d, "xa+xw");
  ASSERT_NE(st, nullptr) << to_text(d);
  EXPECT_EQ(st->fusion.n_weights, 2);
  ASSERT_NE(find(d, "xab"), nullptr);
  // xw's only reader is sum(ab, xw) and ab is read by nothing else after: the add folds into... nothing, since xw is
  // a stack member (a stack has no residual epilogue).
  ASSERT_NE(find(d, "sum"), nullptr);
  const Graph rr = run_passes(g, rows_support());
  expect_whole(g, rr);
  EXPECT_EQ(rr.nodes().size(), 3u);  // xa, xab, xw+sum: the add folds into the last matmul reading x
  ASSERT_NE(find(rr, "xw+sum"), nullptr) << to_text(rr);
}

// A matmul output with a second reader: no residual fold (the add is not its only reader).
TEST(Passes, ExtraReaderOfMatmulOutputBlocksResidual) {
  Graph g(1, 0);
  const int x = g.add_input("x", DType::F32, {1, 32});
  const int r0 = g.add_node("r0", Op::RMSNORM, Role::NONE, 0, "attn", {x, g.add_weight("n", DType::F32, {32}, bound())},
                            {.eps = 1e-5f});
  const int y =
      g.add_node("mm", Op::MATMUL, Role::NONE, 0, "attn", {x, g.add_weight("W", DType::F16, {32, 32}, bound())});
  const int sum = g.add_node("res", Op::ADD, Role::NONE, 0, "attn", {r0, y});
  g.mark_output(g.add_node("extra", Op::ADD, Role::NONE, 0, "attn", {sum, y}));
  FusionSupport f;
  f.residual_epilogue = true;
  const Graph r = run_passes(g, f);
  expect_whole(g, r);
  EXPECT_TRUE(find(r, "mm")->fusion.empty());
  ASSERT_NE(find(r, "res"), nullptr);
  // Without the extra reader it folds.
  Graph g2(1, 0);
  const int x2 = g2.add_input("x", DType::F32, {1, 32});
  const int n2 = g2.add_node("r0", Op::RMSNORM, Role::NONE, 0, "attn",
                             {x2, g2.add_weight("n", DType::F32, {32}, bound())}, {.eps = 1e-5f});
  const int y2 =
      g2.add_node("mm", Op::MATMUL, Role::NONE, 0, "attn", {x2, g2.add_weight("W", DType::F16, {32, 32}, bound())});
  g2.mark_output(g2.add_node("res", Op::ADD, Role::NONE, 0, "attn", {n2, y2}));
  const Graph r2 = run_passes(g2, f);
  expect_whole(g2, r2);
  ASSERT_NE(find(r2, "mm+res"), nullptr) << to_text(r2);
}

// A bias add after a matmul (y + b, the matmul's output first; b a graph input) is not a residual: kept.
TEST(Passes, BiasAddAfterMatmulIsKept) {
  Graph g(1, 0);
  const int x = g.add_input("x", DType::F32, {1, 32});
  const int b = g.add_input("bias", DType::F32, {1, 16});
  const int y =
      g.add_node("mm", Op::MATMUL, Role::NONE, 0, "attn", {x, g.add_weight("W", DType::F16, {16, 32}, bound())});
  const int yb = g.add_node("bias_add", Op::ADD, Role::NONE, 0, "attn", {y, b});
  const int y2 =
      g.add_node("mm2", Op::MATMUL, Role::NONE, 0, "attn", {yb, g.add_weight("W2", DType::F16, {16, 16}, bound())});
  g.mark_output(g.add_node("bias_add2", Op::ADD, Role::NONE, 0, "attn", {b, y2}));  // bias first: not an activation
  const Graph r = run_passes(g, decoder_support());
  expect_whole(g, r);
  EXPECT_EQ(r.nodes().size(), g.nodes().size());
  for (const Node& n : r.nodes()) EXPECT_TRUE(n.fusion.empty()) << n.name;
}

// An op the passes do not fuse between the norm and its matmuls (LAST_ROW stands in for a new op): the norm is kept,
// and so is everything else.
TEST(Passes, UnknownOpBetweenNormAndMatmulBlocksPrologue) {
  Graph g(1, 0);
  const int x = g.add_input("x", DType::F32, {1, 32});
  const int h = g.add_node("norm", Op::RMSNORM, Role::NONE, 0, "attn",
                           {x, g.add_weight("n", DType::F32, {32}, bound())}, {.eps = 1e-5f});
  const int mid = g.add_node("new_op", Op::LAST_ROW, Role::NONE, 0, "attn", {h});
  g.mark_output(
      g.add_node("mm", Op::MATMUL, Role::NONE, 0, "attn", {mid, g.add_weight("W", DType::F16, {16, 32}, bound())}));
  const Graph r = run_passes(g, decoder_support());
  expect_whole(g, r);
  EXPECT_EQ(r.nodes().size(), 3u);
  EXPECT_TRUE(find(r, "norm")->fusion.empty());
  EXPECT_LT(find(r, "mm")->fusion.norm_weight, 0);
}

// A rope whose input has a second reader cannot be applied in place by the attention: nothing fuses, and the executor
// reports the bare rope.
TEST(Passes, RopeInputReadTwiceBlocksAttentionFusion) {
  Shape s;
  Graph g = llama_like(s);
  // Rebuild layer 0's pattern with an extra reader of the unrotated q: simplest by hand on a tiny graph.
  Graph h(1, 0);
  const int pos = h.add_input("positions", DType::I32, {1});
  h.set_io_role(pos, IoRole::POSITIONS);
  const int inv = h.add_constant("inv", std::vector<float>(8, 1.0f));
  const int q = h.add_input("q", DType::F32, {1, 32});
  const int k = h.add_input("k", DType::F32, {1, 16});
  const int vv = h.add_input("v", DType::F32, {1, 16});
  const int ck = h.add_kv_cache("ck", DType::F16, {1, 8, 16});
  const int cv = h.add_kv_cache("cv", DType::F16, {1, 8, 16});
  const int rq = h.add_node("rope_q", Op::ROPE, Role::ROPE_Q, 0, "attn", {q, pos, inv},
                            {.n_head = 2, .head_dim = 16, .rope_dim = 16});
  const int rk = h.add_node("rope_k", Op::ROPE, Role::ROPE_K, 0, "attn", {k, pos, inv},
                            {.n_head = 1, .head_dim = 16, .rope_dim = 16});
  const int sk = h.add_node("sk", Op::KV_STORE, Role::CACHE_K, 0, "attn", {rk, ck}, {.n_head_kv = 1, .head_dim = 16});
  const int sv = h.add_node("sv", Op::KV_STORE, Role::CACHE_V, 0, "attn", {vv, cv}, {.n_head_kv = 1, .head_dim = 16});
  const int a = h.add_node("attn", Op::ATTENTION, Role::ATTN, 0, "attn", {rq, sk, sv},
                           {.n_head = 2, .n_head_kv = 1, .head_dim = 16, .attn_scale = 0.25f});
  h.mark_output(h.add_node("extra", Op::ADD, Role::NONE, 0, "attn", {a, q}));  // q read twice
  const Graph r = run_passes(h, decoder_support());
  expect_whole(h, r);
  EXPECT_EQ(r.nodes().size(), h.nodes().size());
  EXPECT_FALSE(find(r, "attn")->fusion.rope_store);
  // The llama graph itself fuses every layer.
  const Graph rl = run_passes(g, rows_support());
  for (const Node& n : rl.nodes())
    if (n.op == Op::ATTENTION) {
      EXPECT_TRUE(n.fusion.rope_store);
    }
}

// A sliding-window attention (params.window) is folded with its rope and cache stores only where the backend's fused
// kernels read the window (FusionSupport::windowed_attention, the CUDA executors); elsewhere they must see the bare
// attention and refuse it. The same pattern without a window always fuses; the fused node keeps the window.
TEST(Passes, SlidingWindowAttentionFusesWhereDeclared) {
  for (const bool windowed : {false, true}) {
    for (const int64_t window : {0, 4}) {
      Graph h(1, 0);
      const int pos = h.add_input("positions", DType::I32, {1});
      h.set_io_role(pos, IoRole::POSITIONS);
      const int inv = h.add_constant("inv", std::vector<float>(8, 1.0f));
      const int q = h.add_input("q", DType::F32, {1, 32});
      const int k = h.add_input("k", DType::F32, {1, 16});
      const int vv = h.add_input("v", DType::F32, {1, 16});
      const int ck = h.add_kv_cache("ck", DType::F16, {1, 8, 16});
      const int cv = h.add_kv_cache("cv", DType::F16, {1, 8, 16});
      const int rq = h.add_node("rope_q", Op::ROPE, Role::ROPE_Q, 0, "attn", {q, pos, inv},
                                {.n_head = 2, .head_dim = 16, .rope_dim = 16});
      const int rk = h.add_node("rope_k", Op::ROPE, Role::ROPE_K, 0, "attn", {k, pos, inv},
                                {.n_head = 1, .head_dim = 16, .rope_dim = 16});
      const int sk =
          h.add_node("sk", Op::KV_STORE, Role::CACHE_K, 0, "attn", {rk, ck}, {.n_head_kv = 1, .head_dim = 16});
      const int sv =
          h.add_node("sv", Op::KV_STORE, Role::CACHE_V, 0, "attn", {vv, cv}, {.n_head_kv = 1, .head_dim = 16});
      h.mark_output(h.add_node("attn", Op::ATTENTION, Role::ATTN, 0, "attn", {rq, sk, sv},
                               {.n_head = 2, .n_head_kv = 1, .head_dim = 16, .attn_scale = 0.25f, .window = window}));
      FusionSupport f = decoder_support();
      f.windowed_attention = windowed;
      const Graph r = run_passes(h, f);
      expect_whole(h, r);
      EXPECT_EQ(find(r, "attn")->fusion.rope_store, window == 0 || windowed)
          << "window " << window << " windowed " << windowed;
      EXPECT_EQ(find(r, "attn")->params.window, window);
    }
  }
}

// Every combination of declared fusions on graphs of several shapes and weight formats: the rewrite is whole, the
// FLOPs are all still counted (fused nodes carry their parts' FLOPs), every role is still held once, and the planner
// keeps live tensors apart.
TEST(Passes, EveryDeclarationKeepsEverything) {
  std::vector<FusionSupport> supports{FusionSupport{}, decoder_support(), rows_support()};
  for (int bit = 0; bit < 6; ++bit) {
    FusionSupport f;
    if (bit == 0) f.norm_prologue = [](const Tensor&) { return true; };
    f.stack_shared_input = bit == 1;
    f.stack_qkv = bit == 2;
    f.stack_gate_up = bit == 3;
    f.residual_epilogue = bit == 4;
    f.rope_store_attention = bit == 5;
    supports.push_back(f);
  }
  // The same with the adapters folded last (the CPU) and first (CUDA).
  const size_t plain_supports = supports.size();
  for (size_t k = 0; k < plain_supports; ++k) {
    FusionSupport f = supports[k];
    f.lora_epilogue = true;
    supports.push_back(f);
    supports.push_back(with_lora_first(f));
  }
  for (DType w : {DType::F16, DType::Q4_1, DType::Q8_0})
    for (int64_t t : {1, 3})
      for (int64_t layers : {1, 3})
        for (size_t k = 0; k < supports.size(); ++k) {
          Shape s;
          s.w = w;
          s.T = t;
          s.layers = layers;
          if (k >= plain_supports || k % 2 == 1) s.lora_ranks = {8, 3};
          const Graph g = llama_like(s);
          const Graph r = run_passes(g, supports[k]);
          SCOPED_TRACE(::testing::Message() << dtype_name(w) << " T=" << t << " layers=" << layers << " support " << k
                                            << " adapters " << s.lora_ranks.size());
          expect_whole(g, r);
          EXPECT_EQ(r.totals().flops, g.totals().flops);
          for (const Tensor& x : g.tensors())
            if (x.io != IoRole::NONE) {
              int holders = 0;
              for (const Tensor& y : r.tensors()) holders += y.io == x.io && y.io_layer == x.io_layer;
              EXPECT_EQ(holders, 1) << io_role_name(x.io);
            }
          expect_no_overlap(r, plan_memory(r));
        }
}

// ---- LoRA (docs/LORA.md): the CPU folds each adapted matmul last (its fused step runs single matmuls); CUDA folds
// first (lora_first), so that the adapted matmuls still take their norm prologue, stacks and epilogues.

// The one computing node of layer l whose role (or its first member's) is `role`.
const Node* by_role(const Graph& g, int layer, Role role) {
  for (const Node& n : g.nodes())
    if (n.layer == layer && n.role == role && n.op != Op::SLICE) return &n;
  return nullptr;
}

int adapted_matmuls(const Graph& g) {
  int c = 0;
  for (const Node& n : g.nodes()) c += is_matmul_like(n.op) && n.fusion.lora > 0;
  return c;
}

TEST(PassesLora, DecoderStacksAdaptedMatmulsWithTheirEpilogues) {
  Shape s;
  s.lora_ranks = {16, 4};  // two adapters on every projection
  const Graph g = llama_like(s);
  const Graph r = run_passes(g, with_lora_first(decoder_support()));
  expect_whole(g, r);
  EXPECT_EQ(r.totals().flops, g.totals().flops);
  const int64_t nq = s.H * s.D, nkv = s.Hkv * s.D;
  for (int l = 0; l < s.layers; ++l) {
    SCOPED_TRACE(::testing::Message() << "layer " << l);
    // norm + q|k|v + their six adapters: one node, members 0, 0, 1, 1, 2, 2.
    const Node* qkv = by_role(r, l, Role::ATTN_Q);
    ASSERT_NE(qkv, nullptr) << to_text(r);
    EXPECT_EQ(qkv->fusion.n_weights, 3);
    EXPECT_GE(qkv->fusion.norm_weight, 0);
    EXPECT_EQ(qkv->fusion.lora, 6);
    EXPECT_EQ(qkv->fusion.lora_member, (std::vector<int>{0, 0, 1, 1, 2, 2}));
    const std::vector<LoraTerm> t = lora_terms(r, *qkv);
    ASSERT_EQ(t.size(), 6u);
    EXPECT_EQ(t[0].row0, 0);
    EXPECT_EQ(t[0].rows, nq);
    EXPECT_EQ(t[2].row0, nq);
    EXPECT_EQ(t[4].row0, nq + nkv);
    EXPECT_EQ(t[5].rows, nkv);
    EXPECT_EQ(r.tensor(t[1].a).shape, (std::vector<int64_t>{4, s.E}));
    EXPECT_EQ(r.tensor(t[4].b).shape, (std::vector<int64_t>{nkv, 16}));
    EXPECT_EQ(r.tensor(t[4].b).name, "blk." + std::to_string(l) + ".attn_v.lora0_b.weight");
    EXPECT_EQ(r.tensor(qkv->fusion.norm_weight).shape, (std::vector<int64_t>{s.E}));
    EXPECT_EQ(count_op(r, Op::SLICE, l), 3);
    ASSERT_NE(find(r, "blk." + std::to_string(l) + ".attn_k.cols"), nullptr);  // named by the member's matmul
    // The o projection with its adapters accumulating into the residual; the residual is not an adapter input.
    const Node* o = by_role(r, l, Role::ATTN_O);
    ASSERT_NE(o, nullptr);
    EXPECT_GE(o->fusion.residual, 0);
    EXPECT_EQ(o->fusion.lora, 2);
    EXPECT_EQ(r.tensor(lora_terms(r, *o)[0].a).shape, (std::vector<int64_t>{16, nq}));
    EXPECT_EQ(o->inputs.size(), 3u + 4u);  // x, W, the residual, A0, B0, A1, B1
    EXPECT_EQ(o->inputs[2], o->fusion.residual);
    // norm + gate|up + SwiGLU with four adapters.
    const Node* ffn = by_role(r, l, Role::FFN_GATE);
    ASSERT_NE(ffn, nullptr);
    EXPECT_TRUE(ffn->fusion.swiglu);
    EXPECT_EQ(ffn->fusion.n_weights, 2);
    EXPECT_EQ(ffn->fusion.lora_member, (std::vector<int>{0, 0, 1, 1}));
    EXPECT_EQ(lora_terms(r, *ffn)[2].row0, s.F);
    EXPECT_EQ(r.tensor(ffn->output).shape, (std::vector<int64_t>{1, s.F}));
    const Node* down = by_role(r, l, Role::FFN_DOWN);
    ASSERT_NE(down, nullptr);
    EXPECT_GE(down->fusion.residual, 0);
    EXPECT_EQ(down->fusion.lora, 2);
    // Five computing nodes per layer, as without adapters.
    int computing = 0;
    for (const Node& n : r.nodes()) computing += n.layer == l && n.op != Op::SLICE;
    EXPECT_EQ(computing, 5);
  }
  EXPECT_EQ(adapted_matmuls(r), 4 * static_cast<int>(s.layers));
  expect_no_overlap(r, plan_memory(r));
}

TEST(PassesLora, RowsStacksAdaptedQkvAndGateUp) {
  Shape s;
  s.T = 8;
  s.lora_ranks = {8};
  const Graph g = llama_like(s);
  const Graph r = run_passes(g, with_lora_first(rows_support()));
  expect_whole(g, r);
  for (int l = 0; l < s.layers; ++l) {
    const Node* qkv = by_role(r, l, Role::ATTN_Q);
    ASSERT_NE(qkv, nullptr);
    EXPECT_EQ(qkv->fusion.n_weights, 3) << to_text(r);
    EXPECT_EQ(qkv->fusion.lora_member, (std::vector<int>{0, 1, 2}));
    EXPECT_LT(qkv->fusion.norm_weight, 0);
    const Node* gu = by_role(r, l, Role::FFN_GATE);
    ASSERT_NE(gu, nullptr);
    EXPECT_EQ(gu->fusion.n_weights, 2);
    EXPECT_TRUE(gu->fusion.gate_up);
    EXPECT_FALSE(gu->fusion.swiglu);
    EXPECT_EQ(gu->fusion.lora_member, (std::vector<int>{0, 1}));
    EXPECT_EQ(r.tensor(lora_terms(r, *gu)[1].b).dtype, DType::F32);  // chunks' B as the builder gave it
    EXPECT_GE(by_role(r, l, Role::ATTN_O)->fusion.residual, 0);
    EXPECT_GE(by_role(r, l, Role::FFN_DOWN)->fusion.residual, 0);
    EXPECT_EQ(by_role(r, l, Role::FFN_DOWN)->fusion.lora, 1);
  }
}

// The CPU's declaration (lora_epilogue alone, last): every adapted matmul one node {x, W, A0, B0, A1, B1}, nothing
// else fused, as its executor reads them.
TEST(PassesLora, CpuFoldsEachMatmulAloneAsBefore) {
  Shape s;
  s.lora_ranks = {4, 2};
  for (const int64_t t : {1, 5}) {
    s.T = t;
    const Graph g = llama_like(s);
    const Graph r = run_passes(g, FusionSupport{.lora_epilogue = true});
    expect_whole(g, r);
    EXPECT_EQ(adapted_matmuls(r), 7 * static_cast<int>(s.layers));
    for (const Node& n : r.nodes()) {
      if (n.fusion.lora == 0) {
        EXPECT_TRUE(n.fusion.empty()) << n.name;
        continue;
      }
      EXPECT_EQ(n.fusion.n_weights, 1);
      EXPECT_EQ(n.fusion.lora, 2);
      EXPECT_TRUE(n.fusion.lora_member.empty());
      EXPECT_LT(n.fusion.norm_weight, 0);
      EXPECT_LT(n.fusion.residual, 0);
      ASSERT_EQ(n.inputs.size(), 6u);
      EXPECT_EQ(r.tensor(n.inputs[2]).shape[0], 4);  // A0 [4, K] right after W
      EXPECT_EQ(r.tensor(n.inputs[5]).shape[1], 2);  // B1 [N, 2] last
    }
  }
}

// A quantized model's residual GEMV writes the next norm's 8-bit input only where no adapter is involved: the
// adapters' A products read the norm's f32 output, and the residual is whole only after the adapters.
TEST(PassesLora, QuantizedNormEpilogueLeavesAdaptedMatmulsAlone) {
  Shape s;
  s.w = DType::Q4_1;
  s.lora_ranks = {8};
  const Graph g = llama_like(s);
  const Graph r = run_passes(g, with_lora_first(decoder_support()));
  expect_whole(g, r);
  for (const Node& n : r.nodes()) {
    EXPECT_LT(n.fusion.norm_out, 0) << n.name;
    EXPECT_FALSE(n.fusion.in_producer) << n.name;
  }
  const Node* qkv = by_role(r, 0, Role::ATTN_Q);
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(qkv->fusion.n_weights, 3);
  EXPECT_EQ(qkv->fusion.lora, 3);
}

// Adapters on some stack members only (q and v, not k): each adapter keeps its own member.
TEST(PassesLora, AdaptersOnSomeMembersKeepTheirMember) {
  Graph g(1, 0);
  const int x = g.add_input("x", DType::F32, {1, 32});
  const int nw = g.add_weight("n", DType::F32, {32}, bound());
  const int h = g.add_node("norm", Op::RMSNORM, Role::NONE, 0, "attn", {x, nw}, {.eps = 1e-5f});
  std::vector<int> outs;
  for (const char* m : {"q", "k", "v"}) {
    int y = g.add_node(m, Op::MATMUL, Role::NONE, 0, "attn",
                       {h, g.add_weight(std::string(m) + ".w", DType::F16, {m[0] == 'q' ? 32 : 16, 32}, bound())});
    if (m[0] != 'k') {
      const int n = m[0] == 'q' ? 32 : 16;
      const int a = g.add_node(std::string(m) + ".a", Op::MATMUL, Role::NONE, 0, "attn",
                               {h, g.add_weight(std::string(m) + ".A", DType::F16, {8, 32}, bound())});
      const int b = g.add_node(std::string(m) + ".b", Op::MATMUL, Role::NONE, 0, "attn",
                               {a, g.add_weight(std::string(m) + ".B", DType::F16, {n, 8}, bound())});
      y = g.add_node(std::string(m) + ".lora", Op::ADD, Role::NONE, 0, "attn", {y, b});
    }
    outs.push_back(y);
  }
  g.mark_output(g.add_node("sum", Op::ADD, Role::NONE, 0, "attn", {outs[1], outs[2]}));
  g.mark_output(outs[0]);
  const Graph r = run_passes(g, with_lora_first(decoder_support()));
  expect_whole(g, r);
  const Node* st = nullptr;
  for (const Node& n : r.nodes())
    if (n.fusion.n_weights == 3) st = &n;
  ASSERT_NE(st, nullptr) << to_text(r);
  EXPECT_EQ(st->fusion.lora_member, (std::vector<int>{0, 2}));
  const auto t = lora_terms(r, *st);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[1].row0, 48);
  EXPECT_EQ(t[1].rows, 16);
  EXPECT_EQ(r.tensor(t[1].b).name, "v.B");
  EXPECT_GE(st->fusion.norm_weight, 0);
}

TEST(Passes, VerifierNamesWhatWasLost) {
  const Graph g = llama_like({});
  Graph r = run_passes(g, decoder_support());
  std::vector<Tensor> ts = r.tensors();
  std::vector<Node> ns = r.nodes();
  // Drop the fused attention of layer 1 from its fused_from list's last name.
  for (Node& n : ns)
    if (n.name == "blk.1.attn") n.fusion.fused_from.pop_back();
  r.replace_contents(ts, ns);
  const auto problems = verify_rewrite(g, r);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("'blk.1.attn' was lost"), std::string::npos) << problems[0];
}

// Byte ranges of tensors live at the same node never overlap, except an output written over the input it replaces.
void expect_no_overlap(const Graph& g, const MemoryPlan& mp) {
  const size_t nt = g.tensors().size();
  std::vector<int> def(nt, -1);
  for (size_t i = 0; i < nt; ++i) def[i] = g.tensors()[i].producer;  // inputs: -1 (live from the start)
  const auto end_of = [&](size_t t) {
    return g.tensors()[t].is_output ? int(g.nodes().size()) : std::max(mp.last_use[t], def[t]);
  };
  for (size_t a = 0; a < nt; ++a) {
    if (mp.offsets[a] < 0) continue;
    for (size_t b = a + 1; b < nt; ++b) {
      if (mp.offsets[b] < 0) continue;
      // Live intervals (def, end]: a dies at the node that defines b when b took over a's block.
      const bool live_together = def[a] < end_of(b) && def[b] < end_of(a);
      if (!live_together) continue;
      const bool handover = (def[b] >= 0 && mp.in_place_input[size_t(def[b])] == int(a) && end_of(a) == def[b]) ||
                            (def[a] >= 0 && mp.in_place_input[size_t(def[a])] == int(b) && end_of(b) == def[a]);
      if (handover) continue;
      const int64_t ea = mp.offsets[a] + int64_t(g.tensors()[a].nbytes());
      const int64_t eb = mp.offsets[b] + int64_t(g.tensors()[b].nbytes());
      EXPECT_TRUE(ea <= mp.offsets[b] || eb <= mp.offsets[a])
          << g.tensors()[a].name << " and " << g.tensors()[b].name << " overlap";
    }
  }
}

TEST(MemoryPlan, NoLiveOverlapAndInPlaceReuse) {
  Shape s;
  s.T = 4;
  s.layers = 3;
  const Graph g = llama_like(s);
  const MemoryPlan mp = plan_memory(g, {.alignment = 64});
  expect_no_overlap(g, mp);
  int in_place = 0;
  for (int i : mp.in_place_input) in_place += i >= 0;
  EXPECT_GE(in_place, 3 * 4);  // per layer at least: two ropes and two residual adds write over an input
  for (size_t i = 0; i < g.tensors().size(); ++i)
    if (mp.offsets[i] >= 0) {
      EXPECT_EQ(mp.offsets[i] % 64, 0);
    }
  // Layers reuse blocks: the arena does not grow with depth.
  Shape deep = s;
  deep.layers = 12;
  EXPECT_EQ(plan_memory(llama_like(deep)).total, mp.total);
  // No storage for weights, caches or cache stores.
  for (size_t i = 0; i < g.tensors().size(); ++i) {
    const Tensor& t = g.tensors()[i];
    if (t.kind == TensorKind::WEIGHT || t.kind == TensorKind::KV_CACHE || t.alias >= 0) {
      EXPECT_EQ(mp.offsets[i], -1);
    }
  }
}

TEST(MemoryPlan, FusedGraphResidualWritesInPlaceAndSlicesExtendTheStack) {
  Shape s;
  s.T = 4;
  const Graph g = llama_like(s);
  const Graph r = run_passes(g, rows_support());
  const MemoryPlan mp = plan_memory(r);
  expect_no_overlap(r, mp);
  const int o = r.find_node("blk.0.attn_output+attn_residual");
  ASSERT_GE(o, 0);
  EXPECT_EQ(mp.in_place_input[size_t(o)], r.node(o).fusion.residual);
  // The q|k|v stack lives until the attention reading its slices.
  const int qkv = r.find_node("blk.0.attn_q+attn_k+attn_v");
  const int at = r.find_node("blk.0.attn");
  ASSERT_GE(qkv, 0);
  EXPECT_EQ(mp.last_use[size_t(r.node(qkv).output)], at);
  EXPECT_EQ(mp.offsets[size_t(r.node(r.find_node("blk.0.attn_q.cols")).output)], -1);  // a view
}

TEST(MemoryPlan, StackReadThroughViewsIsFreedAfterItsLastReader) {
  // The q|k|v stack is read only through its column views: its block is free again after the attention, so the
  // fused graph's arena does not grow with depth either.
  Shape s;
  s.T = 4;
  s.layers = 3;
  Shape deep = s;
  deep.layers = 12;
  const Graph r = run_passes(llama_like(s), rows_support());
  const MemoryPlan mp = plan_memory(r);
  EXPECT_TRUE(check_memory_plan(r, mp, {}, 64).empty());
  EXPECT_EQ(plan_memory(run_passes(llama_like(deep), rows_support())).total, mp.total);
}

TEST(MemoryPlan, AnOutputsBlockIsNeverAnotherTensors) {
  // The logits are read after the run: no tensor before them in the run wrote into their block, even where a freed
  // block of the stacks would fit them.
  Shape s;
  s.V = 64;  // the logits fit the freed q|k|v and gate|up blocks
  for (const FusionSupport& f : {FusionSupport{}, rows_support(), decoder_support()}) {
    const Graph r = run_passes(llama_like(s), f);
    const MemoryPlan mp = plan_memory(r);
    const int logits = r.find_role(IoRole::LOGITS);
    ASSERT_GE(logits, 0);
    const int64_t lo = mp.offsets[size_t(logits)], le = lo + int64_t(r.tensor(logits).nbytes());
    for (size_t t = 0; t < r.tensors().size(); ++t)
      if (int(t) != logits && mp.offsets[t] >= 0) {
        const int64_t o = mp.offsets[t];
        EXPECT_TRUE(o + int64_t(r.tensors()[t].nbytes()) <= lo || le <= o) << r.tensors()[t].name;
      }
  }
}

TEST(MemoryPlan, ExtrasTakeBlocksOnlyWhileLive) {
  Shape s;
  s.T = 4;
  const Graph r = run_passes(llama_like(s), rows_support());
  const int qkv = r.find_node("blk.0.attn_q+attn_k+attn_v"), at = r.find_node("blk.0.attn");
  const int down = r.find_node("blk.1.ffn_down+ffn_residual");
  ASSERT_GE(qkv, 0);
  ASSERT_GE(at, 0);
  ASSERT_GE(down, 0);
  const std::vector<ExtraBuffer> one = {{1000, qkv, at}};
  const MemoryPlan a = plan_memory(r, {.alignment = 256}, one);
  ASSERT_EQ(a.extra_offsets.size(), 1u);
  const auto pa = check_memory_plan(r, a, one, 256);
  EXPECT_TRUE(pa.empty()) << pa.front();
  EXPECT_GT(a.total, plan_memory(r, {.alignment = 256}).total);
  // Two at once take two blocks; one that starts after the first ended takes a free block, not a new one.
  const std::vector<ExtraBuffer> two = {{1000, qkv, at}, {1000, qkv, qkv}};
  const MemoryPlan b = plan_memory(r, {.alignment = 256}, two);
  EXPECT_NE(b.extra_offsets[0], b.extra_offsets[1]);
  const auto pb = check_memory_plan(r, b, two, 256);
  EXPECT_TRUE(pb.empty()) << pb.front();
  const std::vector<ExtraBuffer> later = {{1000, qkv, at}, {1000, down, down}};
  const MemoryPlan c = plan_memory(r, {.alignment = 256}, later);
  EXPECT_EQ(c.total, a.total);
  const auto pc = check_memory_plan(r, c, later, 256);
  EXPECT_TRUE(pc.empty()) << pc.front();
  // The checker sees an extra placed over a live tensor.
  MemoryPlan bad = a;
  bad.extra_offsets[0] = a.offsets[size_t(r.node(qkv).output)];
  EXPECT_FALSE(check_memory_plan(r, bad, one, 256).empty());
  EXPECT_THROW(plan_memory(r, {}, {{8, at, qkv}}), Error);
}

TEST(MemoryPlan, BackendNarrowsInPlaceAndKeepsItsInputs) {
  Shape s;
  s.T = 4;
  const Graph g = llama_like(s);
  MemoryPlanOptions o;
  o.write_over_input = [](const Node&, size_t) { return false; };
  o.inputs = false;
  const MemoryPlan mp = plan_memory(g, o);
  for (int i : mp.in_place_input) EXPECT_EQ(i, -1);
  EXPECT_EQ(mp.offsets[size_t(g.find_role(IoRole::TOKENS))], -1);
  EXPECT_TRUE(check_memory_plan(g, mp, {}, 64).empty());
  // A residual epilogue still writes over its residual: that is what it is.
  const Graph r = run_passes(g, rows_support());
  const MemoryPlan mr = plan_memory(r, o);
  const int res = r.find_node("blk.0.attn_output+attn_residual");
  ASSERT_GE(res, 0);
  EXPECT_EQ(mr.in_place_input[size_t(res)], r.node(res).fusion.residual);
  for (size_t i = 0; i < r.nodes().size(); ++i)
    if (mr.in_place_input[i] >= 0) {
      EXPECT_GE(r.nodes()[i].fusion.residual, 0) << r.nodes()[i].name;
    }
  // The checker sees an output that shares a live input's block without having taken it over.
  MemoryPlan bad = mr;
  const Node& qkv = r.node(r.find_node("blk.0.attn_q+attn_k+attn_v"));
  bad.offsets[size_t(qkv.output)] = bad.offsets[size_t(qkv.inputs[0])];
  EXPECT_FALSE(check_memory_plan(r, bad, {}, 64).empty());
}

TEST(Roles, FoundByRoleNotName) {
  Graph g = llama_like({});
  EXPECT_EQ(g.tensor(g.find_role(IoRole::TOKENS)).name, "tokens");
  EXPECT_EQ(g.tensor(g.find_role(IoRole::CACHE_V, 1)).name, "blk.1.cache_v");
  EXPECT_EQ(g.find_role(IoRole::CACHE_K, 7), -1);
  EXPECT_THROW(g.require_role(IoRole::CACHE_K, 7), Error);
  EXPECT_THROW(g.set_io_role(g.find_tensor("positions"), IoRole::TOKENS), Error);  // one tensor per role
  // A builder may name its tensors anything: roles still find them.
  Graph h(1, 0);
  const int ids = h.add_input("ids_any_name", DType::I32, {1});
  h.set_io_role(ids, IoRole::TOKENS);
  EXPECT_EQ(h.find_role(IoRole::TOKENS), ids);
  EXPECT_EQ(h.find_role(IoRole::LOGITS), -1);
  EXPECT_EQ(io_role_name(IoRole::CACHE_K), "cache_k");
}

TEST(OpTraits, MatmulLikeAndInPlace) {
  EXPECT_TRUE(is_matmul_like(Op::MATMUL));
  EXPECT_FALSE(is_matmul_like(Op::ATTENTION));
  EXPECT_TRUE(may_write_over_input(Op::ADD, 1));
  EXPECT_FALSE(may_write_over_input(Op::ROPE, 1));
  EXPECT_FALSE(may_write_over_input(Op::MATMUL, 0));
  EXPECT_TRUE(is_view(Op::KV_STORE));
  EXPECT_TRUE(is_view(Op::SLICE));
}

}  // namespace
}  // namespace tessera::graph
