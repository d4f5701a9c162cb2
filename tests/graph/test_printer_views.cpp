// The model views (printer_svg.cpp, printer_html.cpp) on a llama-shaped graph: modules nested, layers outside the
// range collapsed into one box with their totals, shapes on edges, cost and arithmetic intensity on nodes, fused nodes
// listing what they fused, the profile overlay, and the HTML page's data holding every node.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "graph/graph.h"
#include "graph/passes/fuse.h"
#include "graph/printer.h"
#include "tessera/error.h"

namespace tessera::graph {
namespace {

// Weights are never read: any non-null address marks them bound (the passes stack only bound weights).
const char kBytes[1] = {0};

// Three layers of the llama builder's nodes (src/models/llama.cpp), written with the graph API.
Graph llama_like(int layers = 3, int64_t T = 1) {
  const int64_t E = 64, H = 4, Hkv = 2, D = 16, F = 128, V = 96, C = 32;
  Graph g(T, 0);
  g.model_name = "tiny <llama>";
  const int tokens = g.add_input("tokens", DType::I32, {T});
  const int positions = g.add_input("positions", DType::I32, {T});
  g.set_io_role(tokens, IoRole::TOKENS);
  g.set_io_role(positions, IoRole::POSITIONS);
  const int inv = g.add_constant("rope_inv_freq", std::vector<float>(static_cast<size_t>(D / 2), 1.0f));
  const auto w = [&](const std::string& name, std::vector<int64_t> shape, DType t) {
    return g.add_weight(name, t, std::move(shape), kBytes);
  };
  const int embd = w("token_embd.weight", {V, E}, DType::Q8_0);
  int x = g.add_node("token_embd", Op::EMBED, Role::TOKEN_EMBD, -1, "embd", {embd, tokens});
  const OpParams rq{.n_head = H, .head_dim = D, .rope_dim = D};
  OpParams rk = rq;
  rk.n_head = Hkv;
  const OpParams norm{.eps = 1e-5f};
  const OpParams kv{.n_head_kv = Hkv, .head_dim = D};
  const OpParams at{.n_head = H, .n_head_kv = Hkv, .head_dim = D, .attn_scale = 0.25f};
  for (int l = 0; l < layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const int ck = g.add_kv_cache(p + "cache_k", DType::F16, {Hkv, C, D});
    const int cv = g.add_kv_cache(p + "cache_v", DType::F16, {Hkv, C, D});
    g.set_io_role(ck, IoRole::CACHE_K, l);
    g.set_io_role(cv, IoRole::CACHE_V, l);
    int h = g.add_node(p + "attn_norm", Op::RMSNORM, Role::ATTN_NORM, l, "attn",
                       {x, w(p + "attn_norm.weight", {E}, DType::F32)}, norm);
    int q = g.add_node(p + "attn_q", Op::MATMUL, Role::ATTN_Q, l, "attn",
                       {h, w(p + "attn_q.weight", {H * D, E}, DType::Q4_1)});
    int k = g.add_node(p + "attn_k", Op::MATMUL, Role::ATTN_K, l, "attn",
                       {h, w(p + "attn_k.weight", {Hkv * D, E}, DType::Q4_1)});
    int v = g.add_node(p + "attn_v", Op::MATMUL, Role::ATTN_V, l, "attn",
                       {h, w(p + "attn_v.weight", {Hkv * D, E}, DType::Q4_1)});
    q = g.add_node(p + "rope_q", Op::ROPE, Role::ROPE_Q, l, "attn", {q, positions, inv}, rq);
    k = g.add_node(p + "rope_k", Op::ROPE, Role::ROPE_K, l, "attn", {k, positions, inv}, rk);
    const int sk = g.add_node(p + "cache_k_store", Op::KV_STORE, Role::CACHE_K, l, "attn", {k, ck}, kv);
    const int sv = g.add_node(p + "cache_v_store", Op::KV_STORE, Role::CACHE_V, l, "attn", {v, cv}, kv);
    g.mark_output(sk);
    g.mark_output(sv);
    const int a = g.add_node(p + "attn", Op::ATTENTION, Role::ATTN, l, "attn", {q, sk, sv}, at);
    const int ao = g.add_node(p + "attn_output", Op::MATMUL, Role::ATTN_O, l, "attn",
                              {a, w(p + "attn_output.weight", {E, H * D}, DType::Q4_1)});
    x = g.add_node(p + "attn_residual", Op::ADD, Role::ATTN_RESIDUAL, l, "attn", {x, ao});
    h = g.add_node(p + "ffn_norm", Op::RMSNORM, Role::FFN_NORM, l, "ffn",
                   {x, w(p + "ffn_norm.weight", {E}, DType::F32)}, norm);
    const int gate = g.add_node(p + "ffn_gate", Op::MATMUL, Role::FFN_GATE, l, "ffn",
                                {h, w(p + "ffn_gate.weight", {F, E}, DType::Q4_1)});
    const int up =
        g.add_node(p + "ffn_up", Op::MATMUL, Role::FFN_UP, l, "ffn", {h, w(p + "ffn_up.weight", {F, E}, DType::Q4_1)});
    const int act = g.add_node(p + "ffn_act", Op::SWIGLU, Role::FFN_ACT, l, "ffn", {gate, up});
    const int down = g.add_node(p + "ffn_down", Op::MATMUL, Role::FFN_DOWN, l, "ffn",
                                {act, w(p + "ffn_down.weight", {E, F}, DType::Q4_1)});
    x = g.add_node(p + "ffn_residual", Op::ADD, Role::FFN_RESIDUAL, l, "ffn", {x, down});
  }
  x = g.add_node("output_norm", Op::RMSNORM, Role::OUTPUT_NORM, -1, "output",
                 {x, w("output_norm.weight", {E}, DType::F32)}, norm);
  const int logits = g.add_node("output", Op::MATMUL, Role::OUTPUT, -1, "output", {x, embd});
  g.mark_output(logits);
  g.set_io_role(logits, IoRole::LOGITS);
  return g;
}

// The JSON the HTML page carries (between its data script's tags).
nlohmann::json page_data(const std::string& html) {
  const std::string open = "<script id=\"graph-data\" type=\"application/json\">";
  const size_t b = html.find(open);
  EXPECT_NE(b, std::string::npos);
  const size_t e = html.find("</script>", b);
  EXPECT_NE(e, std::string::npos);
  return nlohmann::json::parse(html.substr(b + open.size(), e - b - open.size()));
}

// `"name" [`: where DOT declares a node (GCC 12 warns falsely on `"\"" + name` under -O3).
std::string node_decl(const std::string& name) {
  std::string s = "\"";
  s += name;
  s += "\" [";
  return s;
}

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

TEST(ModelDot, NestsModulesAndCollapsesOtherLayers) {
  const Graph g = llama_like(3);
  const std::string dot = to_model_dot(g);  // default: layer 0 in full
  for (const char* c :
       {"subgraph cluster_model", "subgraph cluster_layer_0 ", "cluster_layer_0_attn", "cluster_layer_0_ffn"})
    EXPECT_NE(dot.find(c), std::string::npos) << c;
  EXPECT_EQ(dot.find("cluster_layer_1"), std::string::npos);
  // Layers 1 and 2 are one box each, with their node count and totals.
  uint64_t flops1 = 0;
  for (const Node& n : g.nodes()) flops1 += n.layer == 1 ? n.flops : 0;
  std::string collapsed = "blk.1: 17 ops (collapsed)\\n";
  collapsed += human_unit(double(flops1), "FLOP");
  EXPECT_NE(dot.find(collapsed), std::string::npos) << dot;
  EXPECT_NE(dot.find("\"layer:2\" [shape=box3d"), std::string::npos);
  EXPECT_EQ(dot.find("\"blk.1.attn_q\""), std::string::npos);
  // Layer 0's nodes with op, output shape and dtype, weight, cost and intensity; shapes on edges.
  EXPECT_NE(dot.find("blk.0.attn_q\\nmatmul -> [1, 64] f32\\nW blk.0.attn_q.weight [64, 64] q4_1"), std::string::npos);
  EXPECT_NE(dot.find("FLOP/B"), std::string::npos);
  EXPECT_NE(dot.find("\"blk.0.attn_q\" -> \"blk.0.rope_q\" [label=\"[1, 64] f32\"]"), std::string::npos);
  // The residual stream runs from layer 0 into layer 1's box and on into layer 2's, once per pair of boxes.
  EXPECT_EQ(count(dot, "\"layer:1\" -> \"layer:2\""), 1);
  EXPECT_EQ(std::count(dot.begin(), dot.end(), '{'), std::count(dot.begin(), dot.end(), '}'));

  RenderOptions all;
  all.full_first = 0;
  all.full_last = 2;
  const std::string full = to_model_dot(g, all);
  EXPECT_EQ(full.find("collapsed"), std::string::npos);
  for (const Node& n : g.nodes()) EXPECT_NE(full.find(node_decl(n.name)), std::string::npos) << n.name;
}

TEST(ModelDot, FusedNodesListWhatTheyFuse) {
  FusionSupport f;
  f.rope_store_attention = true;
  f.residual_epilogue = true;
  const Graph g = run_passes(llama_like(2), f);
  const std::string dot = to_model_dot(g);
  // The attention absorbed both ropes and both cache stores, which are no nodes of their own any more but are named
  // in its label.
  const size_t fuses = dot.find("fuses:");
  ASSERT_NE(fuses, std::string::npos) << dot;
  for (const char* name : {"blk.0.rope_q", "blk.0.rope_k", "blk.0.cache_k_store", "blk.0.cache_v_store"}) {
    EXPECT_NE(dot.find(name, fuses), std::string::npos) << name;
    EXPECT_EQ(dot.find(node_decl(name)), std::string::npos) << name;
  }
  EXPECT_NE(dot.find("penwidth=2"), std::string::npos);
}

TEST(ModelDot, ProfileColoursAndLabelsEveryNode) {
  const Graph g = llama_like(2);
  RenderOptions o;
  for (size_t i = 0; i < g.nodes().size(); ++i) o.node_ms.push_back(0.01 * double(i + 1));
  o.node_roof.assign(g.nodes().size(), 0.5);
  o.wall_ms = 10.0;
  o.profile = "measured: test";
  o.full_last = 1;
  const std::string dot = to_model_dot(g, o);
  // The slowest node (the last) is the darkest red; every node says its time, share of wall and of roof.
  EXPECT_NE(dot.find("fillcolor=\"#a50026\""), std::string::npos);
  EXPECT_EQ(count(dot, "% of wall, 50% of roof"), static_cast<int>(g.nodes().size()));
  EXPECT_NE(dot.find("measured: test"), std::string::npos);
  // A profile of another graph's size is no profile of this one: drawn without it.
  o.node_ms.pop_back();
  EXPECT_EQ(to_model_dot(g, o).find("% of wall"), std::string::npos);
}

TEST(ModelHtml, CarriesEveryNodesDataAndNeedsNoNetwork) {
  FusionSupport f;
  f.rope_store_attention = true;
  const Graph g = run_passes(llama_like(3), f);
  const std::string html = to_html(g);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  // Self-contained: no script, style or image is fetched.
  EXPECT_FALSE(std::regex_search(html, std::regex("(src|href)=\"(https?:)?//")));
  EXPECT_EQ(html.find("@import"), std::string::npos);
  const nlohmann::json d = page_data(html);
  EXPECT_EQ(d["model"], "tiny <llama>");  // '<' escaped inside the script, read back whole
  ASSERT_EQ(d["nodes"].size(), g.nodes().size());
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    const nlohmann::json& j = d["nodes"][i];
    EXPECT_EQ(j["name"], n.name);
    EXPECT_EQ(j["op"], std::string(op_name(n.op)));
    EXPECT_EQ(j["layer"], n.layer);
    EXPECT_EQ(j["flops"].get<uint64_t>(), n.flops);
    EXPECT_EQ(j["bytes"].get<uint64_t>(), n.bytes);
    EXPECT_EQ(j["shape"].get<std::vector<int64_t>>(), g.tensor(n.output).shape);
    EXPECT_EQ(j["fused"].get<std::vector<std::string>>(), n.fusion.fused_from);
    EXPECT_EQ(j["inputs"].size(), n.inputs.size());
    EXPECT_TRUE(j["ms"].is_null());
  }
  EXPECT_TRUE(d["full"].is_null());
}

TEST(ModelHtml, ProfileAndLayerRange) {
  const Graph g = llama_like(3);
  RenderOptions o;
  o.node_ms.assign(g.nodes().size(), 0.25);
  o.wall_ms = 12.5;
  o.full_first = 1;
  o.full_last = 2;
  o.collapse_others = true;
  const nlohmann::json d = page_data(to_html(g, o));
  EXPECT_DOUBLE_EQ(d["wall_ms"].get<double>(), 12.5);
  EXPECT_DOUBLE_EQ(d["nodes"][3]["ms"].get<double>(), 0.25);
  EXPECT_TRUE(d["nodes"][3]["roof"].is_null());
  EXPECT_EQ(d["full"], nlohmann::json::array({1, 2}));
}

TEST(ModelSvg, LaysOutThroughGraphvizOrSaysWhatToInstall) {
  const Graph g = llama_like(2);
  std::string svg;
  try {
    svg = to_svg(g);
  } catch (const Error& e) {
    // Only where neither libgvc nor the dot program is there; the error says what to install.
    ASSERT_FALSE(svg_uses_libgvc());
    EXPECT_NE(std::string(e.what()).find("install"), std::string::npos) << e.what();
    GTEST_SKIP() << e.what();
  }
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("<title>blk.0.attn_q</title>"), std::string::npos);
  EXPECT_NE(svg.find("<title>layer:1</title>"), std::string::npos);
}

}  // namespace
}  // namespace tessera::graph
