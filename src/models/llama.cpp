#include "models/llama.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "core/error.h"

namespace tessera {

using graph::Op;
using graph::Role;

std::vector<float> rope_inv_freq(const ModelConfig& c, const float* freq_factors) {
  const int64_t half = c.rope_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv[static_cast<size_t>(i)] =
        static_cast<float>(1.0 / std::pow(double(c.rope_base), double(2 * i) / double(c.rope_dim)));
  const RopeScaling& s = c.rope_scaling;
  if (freq_factors != nullptr) {
    for (int64_t i = 0; i < half; ++i) {
      TESSERA_CHECK(std::isfinite(freq_factors[i]) && freq_factors[i] > 0,
                    "rope frequency factor {} = {} is not a positive number", i, freq_factors[i]);
      inv[static_cast<size_t>(i)] /= freq_factors[i];
    }
  } else if (s.type == "llama3") {
    TESSERA_CHECK(s.original_context > 0 && s.high_freq_factor > s.low_freq_factor,
                  "llama3 rope scaling needs original_max_position_embeddings and high_freq_factor > low_freq_factor");
    const double old_ctx = double(s.original_context);
    const double low_wavelen = old_ctx / s.low_freq_factor;
    const double high_wavelen = old_ctx / s.high_freq_factor;
    for (float& f : inv) {
      const double wavelen = 2 * std::numbers::pi / f;
      if (wavelen < high_wavelen) continue;  // high frequencies keep their value
      if (wavelen > low_wavelen) {
        f = static_cast<float>(f / s.factor);
      } else {
        const double smooth = (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = static_cast<float>((1 - smooth) * f / s.factor + smooth * f);
      }
    }
  } else if (s.type == "yarn") {
    // YaRN (transformers' _compute_yarn_parameters, ggml's rope_yarn): dimensions rotating fewer than beta_slow times
    // over the original context are interpolated (divided by the factor), those rotating more than beta_fast times
    // kept, the band between blended linearly.
    TESSERA_CHECK(s.original_context > 1 && s.factor > 0, "yarn rope scaling needs an original context and a factor");
    const double dim = double(c.rope_dim), base = double(c.rope_base);
    const auto corr_dim = [&](double rotations) {
      return dim * std::log(double(s.original_context) / (rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
    };
    double low = corr_dim(s.beta_fast), high = corr_dim(s.beta_slow);
    if (s.truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0), high = std::min(high, dim - 1);
    if (low == high) high += 0.001;  // transformers' guard against a zero-width band
    for (int64_t i = 0; i < half; ++i) {
      const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);  // 0: extrapolate, 1: interpolate
      const double f = inv[static_cast<size_t>(i)];
      inv[static_cast<size_t>(i)] = static_cast<float>(f / s.factor * ramp + f * (1 - ramp));
    }
  } else if (s.type != "none" && s.type != "freqs" && s.type != "linear" && s.type != "longrope") {
    fail("rope scaling '{}' is not supported yet (supported: none, linear, llama3, longrope, yarn)", s.type);
  }
  if (s.type == "linear")
    for (float& f : inv) f /= s.factor;
  return inv;
}

graph::Graph build_llama_graph(const ModelWeights& w, const LlamaGraphOptions& o) {
  const ModelConfig& c = w.config();
  TESSERA_CHECK(o.n_tokens > 0, "llama graph: the token count must be positive (got {})", o.n_tokens);
  TESSERA_CHECK(o.n_past >= 0, "llama graph: the position must not be negative (got {})", o.n_past);
  const int64_t n_ctx = o.n_ctx > 0 ? o.n_ctx : o.n_past + o.n_tokens;
  TESSERA_CHECK(o.n_past + o.n_tokens <= n_ctx, "llama graph: {} tokens at position {} do not fit a context of {}",
                o.n_tokens, o.n_past, n_ctx);
  const int64_t T = o.n_tokens, E = c.n_embd, H = c.n_head, Hkv = c.n_head_kv, D = c.head_dim, F = c.n_ff;
  const int64_t V = c.n_vocab;

  graph::Graph g(T, o.n_past);
  g.model_name = c.name.empty() ? c.architecture : c.name;
  const auto weight = [&](const std::string& name, std::vector<int64_t> shape) {
    const TensorView& t = w.require(name, shape);
    if (o.lora != nullptr && o.lora->merged) {
      const auto it = o.lora->merged_weights.find(name);
      if (it != o.lora->merged_weights.end())
        return g.add_weight(name, it->second.dtype, it->second.shape, it->second.data.data());
    }
    return g.add_weight(name, t.dtype, t.shape, t.data);
  };
  // A projection y[T, N] = x[T, K]·Wᵀ and its unmerged adapters, y += (x·Aᵀ)·Bᵀ each (B carries the scale).
  const auto matmul = [&](const std::string& name, Role role, int layer, const std::string& block, int x,
                          const std::string& wname, std::vector<int64_t> shape) {
    int y = g.add_node(name, Op::MATMUL, role, layer, block, {x, weight(wname, std::move(shape))});
    if (o.lora == nullptr || o.lora->merged) return y;
    for (size_t i = 0; i < o.lora->adapters.size(); ++i) {
      const LoraTarget* t = o.lora->adapters[i]->find(wname);
      if (t == nullptr) continue;
      const std::string id = ".lora" + std::to_string(i);
      // A and B in the set's type (fast sessions: f16, half the bytes), except B in prefill chunks: f32. The CPU's fast
      // mode runs these nodes as one fused matmul (graph/passes/fuse.h, rewrite 7) reading Bᵀ [r, N] in B's type
      // (kernels/lora.h): f16 halves a decode step's bytes, f32 spares a chunk's every multiply-add a conversion. The
      // unfused nodes (reference mode, CUDA) multiply B [N, r] as any matmul.
      const DType da = o.lora->dtype, db = o.n_tokens > 1 ? DType::F32 : o.lora->dtype;
      const int a = g.add_weight(wname + id + "_a", da, {t->rank, t->n_in}, t->a_data(da));
      const int b = g.add_weight(wname + id + "_b", db, {t->n_out, t->rank}, t->b_data(db));
      const int xa = g.add_node(name + id + "_a", Op::MATMUL, Role::NONE, layer, block, {x, a});
      const int xab = g.add_node(name + id + "_b", Op::MATMUL, Role::NONE, layer, block, {xa, b});
      y = g.add_node(name + id, Op::ADD, Role::NONE, layer, block, {y, xab});
    }
    return y;
  };

  const int tokens = g.add_input("tokens", DType::I32, {T});
  const int positions = g.add_input("positions", DType::I32, {T});
  g.set_io_role(tokens, graph::IoRole::TOKENS);
  g.set_io_role(positions, graph::IoRole::POSITIONS);
  // Per-dimension divisors of the inverse frequencies: Llama 3's rope_freqs.weight, or Phi-3's longrope set for this
  // context (the long one past the original context, as llama.cpp chooses: once per session, so every graph of a
  // session rotates alike; transformers switches by the sequence length of each forward pass instead).
  const auto f32_factors = [&](const char* name) {
    const TensorView& t = w.require(name, {c.rope_dim / 2});
    TESSERA_CHECK(t.dtype == DType::F32, "tensor '{}' is {}, expected f32", name, dtype_name(t.dtype));
    return reinterpret_cast<const float*>(t.data);
  };
  const float* factors = w.find("rope_freqs.weight") != nullptr ? f32_factors("rope_freqs.weight") : nullptr;
  float rope_attn_factor = c.rope_scaling.type == "yarn" ? c.rope_scaling.attn_factor : 1.0f;
  if (c.rope_scaling.type == "longrope") {
    const bool use_long = n_ctx > c.rope_scaling.original_context;
    const char* name = use_long ? "rope_factors_long.weight" : "rope_factors_short.weight";
    const std::vector<float>& set = use_long ? c.rope_scaling.long_factor : c.rope_scaling.short_factor;
    if (w.find(name) != nullptr) {
      factors = f32_factors(name);
    } else {
      TESSERA_CHECK(static_cast<int64_t>(set.size()) == c.rope_dim / 2,
                    "longrope: {} factors given for {} rotary frequencies", set.size(), c.rope_dim / 2);
      factors = set.data();
    }
    rope_attn_factor = c.rope_scaling.attn_factor;
  }
  // cos and sin times a factor scale the rotated q and k alike, so q.k scales by its square: folded into the attention
  // scale, exact where every dimension rotates (the unrotated ones of a partial rotation are not scaled).
  TESSERA_CHECK(rope_attn_factor == 1.0f || c.rope_dim == c.head_dim,
                "{} rope scaling with an attention factor ({}) on a partial rotation ({} of {} dimensions) is not "
                "supported",
                c.rope_scaling.type, rope_attn_factor, c.rope_dim, c.head_dim);
  const int inv_freq = g.add_constant("rope_inv_freq", rope_inv_freq(c, factors));

  // Local (sliding-window) layers of Gemma 3 rotate with their own base and without the global layers' scaling.
  int inv_freq_local = inv_freq;
  if (c.sliding_window > 0 && c.rope_base_local > 0) {
    ModelConfig local = c;
    local.rope_base = c.rope_base_local;
    local.rope_scaling = RopeScaling{};
    inv_freq_local = g.add_constant("rope_inv_freq_local", rope_inv_freq(local, nullptr));
  }

  const int embd = weight("token_embd.weight", {V, E});
  int x = g.add_node("token_embd", Op::EMBED, Role::TOKEN_EMBD, -1, "embd", {embd, tokens});
  if (c.embd_scale > 0)
    x = g.add_node("token_embd_scale", Op::SCALE, Role::EMBD_SCALE, -1, "embd", {x}, {.scale = c.embd_scale});

  graph::OpParams rope_q{.n_head = H, .head_dim = D, .rope_dim = c.rope_dim, .rope_neox = c.rope_neox};
  graph::OpParams rope_k = rope_q;
  rope_k.n_head = Hkv;
  const graph::OpParams norm{.eps = c.norm_eps};
  const graph::OpParams head_norm{.eps = c.norm_eps, .head_dim = D};
  const graph::OpParams kv{.n_head_kv = Hkv, .head_dim = D};
  const float scale = (c.attn_scale > 0 ? c.attn_scale : static_cast<float>(1.0 / std::sqrt(double(D)))) *
                      rope_attn_factor * rope_attn_factor;
  const Op ffn_act = c.ffn_act == "gelu_tanh" ? Op::GEGLU : c.ffn_act == "relu2" ? Op::RELU2_GLU : Op::SWIGLU;
  // BitLinear (BitNet, Falcon3-1.58bit): every ternary linear quantizes its input to int8 per token; q|k|v and
  // gate|up share one input, so one node serves each group.
  const auto act_quant = [&](int in, const std::string& name, int layer, const char* block) {
    return c.act_quant_i8 ? g.add_node(name, Op::ACT_QUANT_I8, Role::ACT_QUANT, layer, block, {in}) : in;
  };

  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    if (!c.qkv_bias)
      TESSERA_CHECK(w.find(p + "attn_q.bias") == nullptr,
                    "{}: tensor '{}attn_q.bias' found, but {} models have no attention biases", w.path(), p,
                    c.architecture);
    const bool local = c.is_local_layer(l);
    const int cache_k = g.add_kv_cache(p + "cache_k", o.kv_dtype, {Hkv, n_ctx, D});
    const int cache_v = g.add_kv_cache(p + "cache_v", o.kv_dtype, {Hkv, n_ctx, D});
    g.set_io_role(cache_k, graph::IoRole::CACHE_K, l);
    g.set_io_role(cache_v, graph::IoRole::CACHE_V, l);

    int h = g.add_node(p + "attn_norm", Op::RMSNORM, Role::ATTN_NORM, l, "attn",
                       {x, weight(p + "attn_norm.weight", {E})}, norm);
    h = act_quant(h, p + "attn_act_quant", l, "attn");
    int q = matmul(p + "attn_q", Role::ATTN_Q, l, "attn", h, p + "attn_q.weight", {H * D, E});
    int k = matmul(p + "attn_k", Role::ATTN_K, l, "attn", h, p + "attn_k.weight", {Hkv * D, E});
    int v = matmul(p + "attn_v", Role::ATTN_V, l, "attn", h, p + "attn_v.weight", {Hkv * D, E});
    if (c.qkv_bias) {
      q = g.add_node(p + "attn_q_bias", Op::BIAS_ADD, Role::ATTN_Q_BIAS, l, "attn",
                     {q, weight(p + "attn_q.bias", {H * D})});
      k = g.add_node(p + "attn_k_bias", Op::BIAS_ADD, Role::ATTN_K_BIAS, l, "attn",
                     {k, weight(p + "attn_k.bias", {Hkv * D})});
      v = g.add_node(p + "attn_v_bias", Op::BIAS_ADD, Role::ATTN_V_BIAS, l, "attn",
                     {v, weight(p + "attn_v.bias", {Hkv * D})});
    }
    if (c.qk_norm) {
      q = g.add_node(p + "attn_q_norm", Op::HEAD_RMSNORM, Role::ATTN_Q_NORM, l, "attn",
                     {q, weight(p + "attn_q_norm.weight", {D})}, head_norm);
      k = g.add_node(p + "attn_k_norm", Op::HEAD_RMSNORM, Role::ATTN_K_NORM, l, "attn",
                     {k, weight(p + "attn_k_norm.weight", {D})}, head_norm);
    }
    const int freq = local ? inv_freq_local : inv_freq;
    q = g.add_node(p + "rope_q", Op::ROPE, Role::ROPE_Q, l, "attn", {q, positions, freq}, rope_q);
    k = g.add_node(p + "rope_k", Op::ROPE, Role::ROPE_K, l, "attn", {k, positions, freq}, rope_k);
    const int ck = g.add_node(p + "cache_k_store", Op::KV_STORE, Role::CACHE_K, l, "attn", {k, cache_k}, kv);
    const int cv = g.add_node(p + "cache_v_store", Op::KV_STORE, Role::CACHE_V, l, "attn", {v, cache_v}, kv);
    g.mark_output(ck);
    g.mark_output(cv);
    // A window at least as long as the cache drops no key: the attention is then a plain one (which every backend's
    // fused attention runs).
    const graph::OpParams attn{.n_head = H,
                               .n_head_kv = Hkv,
                               .head_dim = D,
                               .attn_scale = scale,
                               .window = local && c.sliding_window < n_ctx ? c.sliding_window : 0};
    int a = g.add_node(p + "attn", Op::ATTENTION, Role::ATTN, l, "attn", {q, ck, cv}, attn);
    if (c.sub_norms)
      a = g.add_node(p + "attn_sub_norm", Op::RMSNORM, Role::ATTN_SUB_NORM, l, "attn",
                     {a, weight(p + "attn_sub_norm.weight", {H * D})}, norm);
    a = act_quant(a, p + "attn_output_act_quant", l, "attn");
    int ao = matmul(p + "attn_output", Role::ATTN_O, l, "attn", a, p + "attn_output.weight", {E, H * D});
    if (c.post_norms)
      ao = g.add_node(p + "attn_post_norm", Op::RMSNORM, Role::ATTN_POST_NORM, l, "attn",
                      {ao, weight(p + "post_attention_norm.weight", {E})}, norm);
    x = g.add_node(p + "attn_residual", Op::ADD, Role::ATTN_RESIDUAL, l, "attn", {x, ao});

    h = g.add_node(p + "ffn_norm", Op::RMSNORM, Role::FFN_NORM, l, "ffn", {x, weight(p + "ffn_norm.weight", {E})},
                   norm);
    h = act_quant(h, p + "ffn_act_quant", l, "ffn");
    const int gate = matmul(p + "ffn_gate", Role::FFN_GATE, l, "ffn", h, p + "ffn_gate.weight", {F, E});
    const int up = matmul(p + "ffn_up", Role::FFN_UP, l, "ffn", h, p + "ffn_up.weight", {F, E});
    int act = g.add_node(p + "ffn_act", ffn_act, Role::FFN_ACT, l, "ffn", {gate, up});
    if (c.sub_norms)
      act = g.add_node(p + "ffn_sub_norm", Op::RMSNORM, Role::FFN_SUB_NORM, l, "ffn",
                       {act, weight(p + "ffn_sub_norm.weight", {F})}, norm);
    act = act_quant(act, p + "ffn_down_act_quant", l, "ffn");
    int down = matmul(p + "ffn_down", Role::FFN_DOWN, l, "ffn", act, p + "ffn_down.weight", {E, F});
    if (c.post_norms)
      down = g.add_node(p + "ffn_post_norm", Op::RMSNORM, Role::FFN_POST_NORM, l, "ffn",
                        {down, weight(p + "post_ffw_norm.weight", {E})}, norm);
    x = g.add_node(p + "ffn_residual", Op::ADD, Role::FFN_RESIDUAL, l, "ffn", {x, down});
  }

  // Only the last token's logits drive generation: skipping the others saves 2·T·V·E FLOPs per prefill chunk.
  if (!o.all_logits && T > 1) x = g.add_node("last_token", Op::LAST_ROW, Role::LAST_TOKEN, -1, "output", {x});
  x = g.add_node("output_norm", Op::RMSNORM, Role::OUTPUT_NORM, -1, "output", {x, weight("output_norm.weight", {E})},
                 norm);
  int logits = c.tied_output ? g.add_node("output", Op::MATMUL, Role::OUTPUT, -1, "output", {x, embd})
                             : matmul("output", Role::OUTPUT, -1, "output", x, "output.weight", {V, E});
  if (c.final_softcap > 0)
    logits = g.add_node("output_softcap", Op::SOFTCAP, Role::OUTPUT_SOFTCAP, -1, "output", {logits},
                        {.scale = c.final_softcap});
  g.mark_output(logits);
  g.set_io_role(logits, graph::IoRole::LOGITS);
  return g;
}

}  // namespace tessera
