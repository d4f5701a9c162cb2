#include "models/hgrn_bit.h"

#include <cmath>
#include <string>

#include "core/error.h"
#include "quant/quant.h"

namespace tessera {

using graph::Op;
using graph::Role;

// FusedBitLinear's input norm: layer_norm_linear_quant_fn is called without eps, so its default 1e-6 applies
// (the BitLinear class's own RMSNorm(eps=1e-8) is not what the fused forward reads).
constexpr float kLinearNormEps = 1e-6f;

std::vector<std::vector<float>> hgrn_lower_bounds(const float* lb, int64_t n_layers, int64_t e) {
  std::vector<std::vector<float>> out(static_cast<size_t>(n_layers), std::vector<float>(static_cast<size_t>(e)));
  for (int64_t j = 0; j < e; ++j) {
    double mx = -INFINITY;
    for (int64_t l = 0; l < n_layers; ++l) mx = std::max(mx, double(lb[l * e + j]));
    double sum = 0;
    for (int64_t l = 0; l < n_layers; ++l) sum += std::exp(double(lb[l * e + j]) - mx);
    double cum = 0, first = 0;
    for (int64_t l = 0; l < n_layers; ++l) {
      const double p = std::exp(double(lb[l * e + j]) - mx) / sum;
      if (l == 0) first = p;
      cum += p;
      out[static_cast<size_t>(l)][static_cast<size_t>(j)] = static_cast<float>(cum - first);
    }
  }
  return out;
}

namespace {

struct HgrnPreset {
  const char* name;
  int64_t n_embd, n_layers;
};
// Widths and depths of the released checkpoints; with hidden_ratio 4 and a 32000 vocabulary they give 0.37, 1.36
// and 2.70 billion parameters (hgrn_bit_parameters), the sizes the names state.
constexpr HgrnPreset kHgrnPresets[] = {
    {"mmfreelm-370m", 1024, 24}, {"mmfreelm-1.3b", 2048, 24}, {"mmfreelm-2.7b", 2560, 32}};

}  // namespace

ModelConfig hgrn_bit_preset(const std::string& name) {
  for (const HgrnPreset& p : kHgrnPresets) {
    if (name != p.name) continue;
    ModelConfig c;
    c.architecture = "hgrn_bit";
    c.name = p.name;
    c.n_embd = p.n_embd;
    c.n_layers = p.n_layers;
    c.n_head = c.n_head_kv = 1;
    c.head_dim = c.rope_dim = p.n_embd;
    c.n_ff = 256 * ((p.n_embd * 4 * 2 / 3 + 255) / 256);  // HGRNBitMLP: intermediate_size null, hidden_ratio 4
    c.n_vocab = 32000;
    c.n_ctx_train = 2048;
    c.norm_eps = 1e-6f;
    c.hgrn_lower_bound = true;
    c.act_quant_i8 = true;
    c.ternary = "online";
    c.ternary_output = true;
    c.validate(p.name);
    return c;
  }
  std::string all;
  for (const HgrnPreset& p : kHgrnPresets) all += std::string(all.empty() ? "" : ", ") + p.name;
  fail("unknown hgrn_bit preset '{}' (known: {})", name, all);
}

std::vector<std::string> hgrn_bit_preset_names() {
  std::vector<std::string> v;
  for (const HgrnPreset& p : kHgrnPresets) v.emplace_back(p.name);
  return v;
}

int64_t hgrn_bit_parameters(const ModelConfig& c) {
  const int64_t e = c.n_embd, f = c.n_ff;
  const int64_t linears = 4 * (e * e + e) + (2 * f * e + e) + (e * f + f);  // weights and their input norms
  const int64_t layer = linears + 3 * e;                                    // attn_norm, g_norm, ffn_norm
  return c.n_vocab * e + c.n_layers * layer + c.n_layers * e + e + (c.n_vocab * e + e);
}

graph::Graph build_hgrn_bit_graph(const ModelWeights& w, const LlamaGraphOptions& o) {
  const ModelConfig& c = w.config();
  TESSERA_CHECK(o.n_tokens > 0, "hgrn_bit graph: the token count must be positive (got {})", o.n_tokens);
  TESSERA_CHECK(o.n_past >= 0, "hgrn_bit graph: the position must not be negative (got {})", o.n_past);
  const int64_t T = o.n_tokens, E = c.n_embd, F = c.n_ff, V = c.n_vocab, L = c.n_layers;

  graph::Graph g(T, o.n_past);
  g.model_name = c.name.empty() ? c.architecture : c.name;
  const auto weight = [&](const std::string& name, std::vector<int64_t> shape) {
    const TensorView& t = w.require(name, shape);
    return g.add_weight(name, t.dtype, t.shape, t.data);
  };
  const graph::OpParams norm{.eps = c.norm_eps};
  const graph::OpParams lin_norm{.eps = kLinearNormEps};
  // A BitLinear's input: its own RMSNorm, then int8 activations (shared by the matmuls that read the same input).
  const auto bit_input = [&](int in, const std::string& name, int64_t k, int layer, const char* block) {
    const int n = g.add_node(name + "_in_norm", Op::RMSNORM, Role::LINEAR_NORM, layer, block,
                             {in, weight(name + "_in_norm.weight", {k})}, lin_norm);
    return g.add_node(name + "_act_quant", Op::ACT_QUANT_I8, Role::ACT_QUANT, layer, block, {n});
  };
  const auto bit_linear = [&](int in, const std::string& name, Role role, int64_t n, int64_t k, int layer,
                              const char* block) {
    return g.add_node(name, Op::MATMUL, role, layer, block,
                      {bit_input(in, name, k, layer, block), weight(name + ".weight", {n, k})});
  };

  const int tokens = g.add_input("tokens", DType::I32, {T});
  g.set_io_role(tokens, graph::IoRole::TOKENS);
  std::vector<std::vector<float>> lbs(static_cast<size_t>(L), std::vector<float>(static_cast<size_t>(E), 0.0f));
  if (c.hgrn_lower_bound) {
    const TensorView& t = w.require("lower_bounds", {L, E});
    std::vector<float> raw(static_cast<size_t>(L * E));
    dequantize_row(t.dtype, t.data, raw.data(), L * E);
    lbs = hgrn_lower_bounds(raw.data(), L, E);
  }

  int x =
      g.add_node("token_embd", Op::EMBED, Role::TOKEN_EMBD, -1, "embd", {weight("token_embd.weight", {V, E}), tokens});
  for (int l = 0; l < L; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const int state = g.add_kv_cache(p + "state", DType::F32, {E + 1});  // h, then its position
    g.set_io_role(state, graph::IoRole::STATE, l);
    const int lb = g.add_constant(p + "lower_bound", lbs[static_cast<size_t>(l)]);

    const int h = g.add_node(p + "attn_norm", Op::RMSNORM, Role::ATTN_NORM, l, "attn",
                             {x, weight(p + "attn_norm.weight", {E})}, norm);
    const int i = bit_linear(h, p + "attn_i", Role::MLGRU_I, E, E, l, "attn");
    const int f = bit_linear(h, p + "attn_f", Role::MLGRU_F, E, E, l, "attn");
    const int gp = bit_linear(h, p + "attn_g", Role::MLGRU_G, E, E, l, "attn");
    const int r = g.add_node(p + "mlgru", Op::MLGRU, Role::MLGRU, l, "attn", {f, i, lb, state});
    const int gn = g.add_node(p + "attn_g_norm", Op::RMSNORM, Role::MLGRU_OUT_NORM, l, "attn",
                              {gp, weight(p + "attn_g_norm.weight", {E})}, norm);
    // RMSNorm(g) * w * r * sigmoid(r) = SWIGLU(gate = r, up = RMSNorm(g) * w).
    const int y = g.add_node(p + "attn_out_gate", Op::SWIGLU, Role::MLGRU_OUT_GATE, l, "attn", {r, gn});
    const int ao = bit_linear(y, p + "attn_output", Role::ATTN_O, E, E, l, "attn");
    x = g.add_node(p + "attn_residual", Op::ADD, Role::ATTN_RESIDUAL, l, "attn", {x, ao});

    const int hn = g.add_node(p + "ffn_norm", Op::RMSNORM, Role::FFN_NORM, l, "ffn",
                              {x, weight(p + "ffn_norm.weight", {E})}, norm);
    const int q = bit_input(hn, p + "ffn_gate", E, l, "ffn");  // gate and up are one BitLinear: one norm
    const int gate =
        g.add_node(p + "ffn_gate", Op::MATMUL, Role::FFN_GATE, l, "ffn", {q, weight(p + "ffn_gate.weight", {F, E})});
    const int up =
        g.add_node(p + "ffn_up", Op::MATMUL, Role::FFN_UP, l, "ffn", {q, weight(p + "ffn_up.weight", {F, E})});
    const int act = g.add_node(p + "ffn_act", Op::SWIGLU, Role::FFN_ACT, l, "ffn", {gate, up});
    const int down = bit_linear(act, p + "ffn_down", Role::FFN_DOWN, E, F, l, "ffn");
    x = g.add_node(p + "ffn_residual", Op::ADD, Role::FFN_RESIDUAL, l, "ffn", {x, down});
  }

  if (!o.all_logits && T > 1) x = g.add_node("last_token", Op::LAST_ROW, Role::LAST_TOKEN, -1, "output", {x});
  x = g.add_node("output_norm", Op::RMSNORM, Role::OUTPUT_NORM, -1, "output", {x, weight("output_norm.weight", {E})},
                 norm);
  const int logits = bit_linear(x, "output", Role::OUTPUT, V, E, -1, "output");
  g.mark_output(logits);
  g.set_io_role(logits, graph::IoRole::LOGITS);
  return g;
}

}  // namespace tessera
