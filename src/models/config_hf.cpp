// ModelConfig from a Hugging Face config.json (LlamaForCausalLM, MistralForCausalLM, Gemma3ForCausalLM,
// Qwen2ForCausalLM, Qwen3ForCausalLM), as transformers 4.x and 5.x write it. Absent optional keys take the defaults
// of transformers' config classes.
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "core/error.h"
#include "models/config.h"

namespace tessera {
namespace {

using nlohmann::json;

// A key that is absent or null counts as absent: transformers writes null for unset optional values.
const json* find_key(const json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

std::optional<int64_t> opt_int(const json& j, const char* key, const std::string& source) {
  const json* v = find_key(j, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number_integer()) fail("{}: '{}' must be an integer, not {}", source, key, v->dump());
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()))
    fail("{}: '{}' = {} is out of range", source, key, v->dump());
  const int64_t x = v->get<int64_t>();
  TESSERA_CHECK(x > 0, "{}: '{}' must be positive (got {})", source, key, x);
  return x;
}

int64_t req_int(const json& j, const char* key, const std::string& source) {
  auto v = opt_int(j, key, source);
  if (!v) fail("{}: required key '{}' is missing", source, key);
  return *v;
}

std::optional<double> opt_number(const json& j, const char* key, const std::string& source) {
  const json* v = find_key(j, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) fail("{}: '{}' must be a number, not {}", source, key, v->dump());
  const double x = v->get<double>();
  TESSERA_CHECK(std::isfinite(x) && x > 0, "{}: '{}' must be a positive number (got {})", source, key, v->dump());
  return x;
}

std::optional<bool> opt_bool(const json& j, const char* key, const std::string& source) {
  const json* v = find_key(j, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) fail("{}: '{}' must be true or false, not {}", source, key, v->dump());
  return v->get<bool>();
}

std::optional<std::string> opt_string(const json& j, const char* key, const std::string& source) {
  const json* v = find_key(j, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) fail("{}: '{}' must be a string, not {}", source, key, v->dump());
  return v->get<std::string>();
}

// "llama", "mistral", "gemma3", "qwen2" or "qwen3" from architectures[0], else model_type.
std::string read_family(const json& j, const std::string& source) {
  static constexpr std::pair<const char*, const char*> kArchs[] = {
      {"LlamaForCausalLM", "llama"},   {"MistralForCausalLM", "mistral"}, {"Gemma3ForCausalLM", "gemma3"},
      {"Qwen2ForCausalLM", "qwen2"},   {"Qwen3ForCausalLM", "qwen3"},     {"Phi3ForCausalLM", "phi3"},
      {"BitNetForCausalLM", "bitnet"}, {"HGRNBitForCausalLM", "hgrn_bit"}};
  if (const json* a = find_key(j, "architectures")) {
    if (!a->is_array() || a->empty() || !(*a)[0].is_string())
      fail("{}: 'architectures' must be a non-empty list of names", source);
    const std::string& arch = (*a)[0].get_ref<const std::string&>();
    for (const auto& [hf, family] : kArchs)
      if (arch == hf) return family;
    fail(
        "{}: architecture '{}' is not supported (supported: LlamaForCausalLM, MistralForCausalLM, Gemma3ForCausalLM, "
        "Qwen2ForCausalLM, Qwen3ForCausalLM, Phi3ForCausalLM, BitNetForCausalLM, HGRNBitForCausalLM)",
        source, arch);
  }
  auto mt = opt_string(j, "model_type", source);
  if (!mt) fail("{}: neither 'architectures' nor 'model_type' says what model this is", source);
  if (*mt == "llama" || *mt == "mistral" || *mt == "qwen2" || *mt == "qwen3" || *mt == "phi3" || *mt == "bitnet" ||
      *mt == "hgrn_bit")
    return *mt;
  if (*mt == "gemma3_text") return "gemma3";
  fail(
      "{}: model_type '{}' is not supported (supported: llama, mistral, gemma3_text, qwen2, qwen3, phi3, bitnet, "
      "hgrn_bit)",
      source, *mt);
}

// Gemma 3's local (sliding) layers: layer_types when given ("sliding_attention" / "full_attention"), else every
// sliding_window_pattern-th layer is global (transformers' default pattern: 6).
void read_gemma3(const json& j, const std::string& source, ModelConfig& c) {
  c.ffn_act = "gelu_tanh";
  c.qk_norm = true;
  c.post_norms = true;
  c.norm_weight_offset = 1.0f;  // Gemma3RMSNorm multiplies by (1 + w)
  c.embd_scale = std::sqrt(static_cast<float>(c.n_embd));
  c.attn_scale = static_cast<float>(1.0 / std::sqrt(opt_number(j, "query_pre_attn_scalar", source).value_or(256)));
  c.final_softcap = static_cast<float>(opt_number(j, "final_logit_softcapping", source).value_or(0));
  if (find_key(j, "attn_logit_softcapping") != nullptr)
    fail("{}: attn_logit_softcapping is set, and attention logit softcapping is not supported", source);
  if (auto act = opt_string(j, "hidden_activation", source); act && *act != "gelu_pytorch_tanh")
    fail("{}: hidden_activation '{}' is not supported (Gemma 3 uses gelu_pytorch_tanh)", source, *act);
  c.sliding_window = opt_int(j, "sliding_window", source).value_or(4096);
  c.rope_base_local = static_cast<float>(opt_number(j, "rope_local_base_freq", source).value_or(10000.0));
  if (const json* lt = find_key(j, "layer_types")) {
    if (!lt->is_array() || static_cast<int64_t>(lt->size()) != c.n_layers)
      fail("{}: 'layer_types' must list one type per layer ({} layers)", source, c.n_layers);
    for (const json& t : *lt) {
      if (!t.is_string() || (t != "sliding_attention" && t != "full_attention"))
        fail("{}: layer type {} is not 'sliding_attention' or 'full_attention'", source, t.dump());
      c.layer_local.push_back(t == "sliding_attention" ? 1 : 0);
    }
  } else {
    c.swa_pattern = opt_int(j, "sliding_window_pattern", source).value_or(6);
  }
}

// transformers' BitNet quantization (quant_method "bitnet", integrations/bitnet.py): every nn.Linear but lm_head
// becomes a BitLinear (ternary weights packed four per uint8 along the rows, W = ternary / weight_scale) or an
// AutoBitLinear (W = weight * weight_scale offline, packed or not; absmean-ternarized float weights online), both
// quantizing their input activations to int8 per token. BitNet b1.58 2B4T ships AutoBitLinear offline; Falcon3's
// 1.58-bit Llama models the default BitLinear.
void read_bitnet_quantization(const json& q, const std::string& source, ModelConfig& c) {
  const std::string ctx = source + ": quantization_config";
  if (!q.is_object()) fail("{} must be an object, not {}", ctx, q.dump());
  const auto method = opt_string(q, "quant_method", ctx);
  if (!method || *method != "bitnet")
    fail("{}: quant_method {} is not supported (only BitNet's ternary checkpoints are)", ctx,
         method ? "'" + *method + "'" : std::string("(none)"));
  const std::string cls = opt_string(q, "linear_class", ctx).value_or("bitlinear");
  const std::string mode = opt_string(q, "quantization_mode", ctx).value_or("offline");
  if (cls != "bitlinear" && cls != "autobitlinear")
    fail("{}: linear_class '{}' is not bitlinear or autobitlinear", ctx, cls);
  if (mode != "offline" && mode != "online") fail("{}: quantization_mode '{}' is not offline or online", ctx, mode);
  if (opt_bool(q, "use_rms_norm", ctx).value_or(false))
    fail("{}: use_rms_norm is true, and BitLinear's own input norm is not supported", ctx);
  // transformers keeps lm_head (the output embedding) in float when the list is absent; a list naming other modules
  // would change which linears are ternary.
  if (const json* skip = find_key(q, "modules_to_not_convert")) {
    if (!skip->is_array() || skip->size() != 1 || (*skip)[0] != "lm_head")
      fail("{}: modules_to_not_convert {} is not supported (only [\"lm_head\"] or none)", ctx, skip->dump());
  }
  c.act_quant_i8 = true;
  c.ternary = cls == "bitlinear" ? "div" : mode == "online" ? "online" : "mul";
}

// The MatMul-free LM (ridgerchu/matmulfreellm's HGRNBitConfig; absent keys take its defaults). Every linear is a
// FusedBitLinear: its own RMSNorm, int8 activations, weights ternarized by absmean when loaded (online); the MLP's
// width is intermediate_size or 256 * ceil(int(hidden * hidden_ratio * 2 / 3) / 256), as HGRNBitMLP computes it.
ModelConfig read_hgrn_bit(const json& j, const std::string& source) {
  ModelConfig c;
  c.architecture = "hgrn_bit";
  if (auto n = opt_string(j, "_name_or_path", source)) c.name = *n;
  c.n_embd = opt_int(j, "hidden_size", source).value_or(2048);
  c.n_layers = opt_int(j, "num_hidden_layers", source).value_or(24);
  c.n_vocab = opt_int(j, "vocab_size", source).value_or(32000);
  c.n_head = opt_int(j, "num_heads", source).value_or(1);
  c.n_head_kv = c.n_head;
  TESSERA_CHECK(c.n_embd % c.n_head == 0, "{}: hidden_size {} is not divisible by num_heads {}", source, c.n_embd,
                c.n_head);
  c.head_dim = c.n_embd / c.n_head;
  c.rope_dim = c.head_dim % 2 == 0 ? c.head_dim : c.head_dim - 1;  // no rope: any valid value
  if (opt_int(j, "expand_ratio", source).value_or(1) != 1)
    fail("{}: expand_ratio other than 1 is not supported (the forget gates' lower bounds are hidden_size wide)",
         source);
  if (opt_bool(j, "use_short_conv", source).value_or(false))
    fail("{}: use_short_conv is true, and the short convolution is not supported", source);
  if (auto mode = opt_string(j, "attn_mode", source); mode && *mode != "fused_recurrent")
    fail("{}: attn_mode '{}' is not supported (fused_recurrent)", source, *mode);
  if (auto act = opt_string(j, "hidden_act", source); act && *act != "swish" && *act != "silu")
    fail("{}: hidden_act '{}' is not supported (hgrn_bit uses swish)", source, *act);
  if (auto f = opt_int(j, "intermediate_size", source)) {
    c.n_ff = *f;
  } else {
    const int64_t ratio = opt_int(j, "hidden_ratio", source).value_or(4);
    const int64_t f0 = c.n_embd * ratio * 2 / 3;
    c.n_ff = 256 * ((f0 + 255) / 256);
  }
  c.n_ctx_train = opt_int(j, "max_position_embeddings", source).value_or(2048);
  c.norm_eps = static_cast<float>(opt_number(j, "rms_norm_eps", source).value_or(1e-6));
  if (opt_bool(j, "tie_word_embeddings", source).value_or(false))
    fail("{}: tie_word_embeddings is true, and a ternary lm_head tied to the embedding is not supported", source);
  c.hgrn_lower_bound = opt_bool(j, "use_lower_bound", source).value_or(true);
  c.act_quant_i8 = true;
  c.ternary = "online";
  c.ternary_output = true;
  c.validate(source);
  return c;
}

// Phi-3's longrope: two sets of per-dimension divisors and the factor cos and sin are multiplied by, which
// transformers derives from the context extension when the config does not give it.
void read_longrope(const json& j, const json& rs, const std::string& ctx, std::optional<double> factor,
                   RopeScaling& s) {
  s.type = "longrope";
  if (s.original_context == 0)  // transformers 4.x keeps it beside max_position_embeddings, not in rope_scaling
    s.original_context = opt_int(j, "original_max_position_embeddings", ctx).value_or(0);
  if (s.original_context <= 1) fail("{} of type 'longrope' needs original_max_position_embeddings > 1", ctx);
  const auto factors = [&](const char* key) {
    const json* v = find_key(rs, key);
    if (v == nullptr || !v->is_array() || v->empty())
      fail("{} of type 'longrope' needs '{}', a list of numbers", ctx, key);
    std::vector<float> out;
    for (const json& x : *v) {
      if (!x.is_number() || !std::isfinite(x.get<double>()) || x.get<double>() <= 0)
        fail("{}: '{}' holds {}, not a positive number", ctx, key, x.dump());
      out.push_back(x.get<float>());
    }
    return out;
  };
  s.short_factor = factors("short_factor");
  s.long_factor = factors("long_factor");
  if (s.short_factor.size() != s.long_factor.size())
    fail("{}: short_factor has {} values and long_factor {}", ctx, s.short_factor.size(), s.long_factor.size());
  if (auto a = opt_number(rs, "attention_factor", ctx)) {
    s.attn_factor = static_cast<float>(*a);
    return;
  }
  // transformers: the ratio of the trained to the original context stands for the factor when none is given.
  const double f = factor ? *factor
                          : double(opt_int(j, "max_position_embeddings", ctx).value_or(s.original_context)) /
                                double(s.original_context);
  s.attn_factor =
      f <= 1.0 ? 1.0f : static_cast<float>(std::sqrt(1 + std::log(f) / std::log(double(s.original_context))));
}

// YaRN (Qwen2.5 / Qwen3's long-context setting, DeepSeek): transformers' _compute_yarn_parameters.
void read_yarn(const json& j, const json& rs, const std::string& ctx, std::optional<double> factor, RopeScaling& s) {
  if (s.original_context == 0)
    s.original_context = opt_int(j, "original_max_position_embeddings", ctx)
                             .value_or(opt_int(j, "max_position_embeddings", ctx).value_or(0));
  if (s.original_context <= 1) fail("{} of type 'yarn' needs original_max_position_embeddings > 1", ctx);
  const double f = factor ? *factor
                          : double(opt_int(j, "max_position_embeddings", ctx).value_or(s.original_context)) /
                                double(s.original_context);
  if (!(f > 0)) fail("{}: yarn factor {} is not a positive number", ctx, f);
  s.factor = static_cast<float>(f);
  if (auto b = opt_number(rs, "beta_fast", ctx); b && *b != 0) s.beta_fast = static_cast<float>(*b);
  if (auto b = opt_number(rs, "beta_slow", ctx); b && *b != 0) s.beta_slow = static_cast<float>(*b);
  if (const json* t = find_key(rs, "truncate"); t != nullptr && t->is_boolean()) s.truncate = t->get<bool>();
  const auto get_mscale = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
  if (auto a = opt_number(rs, "attention_factor", ctx)) {
    s.attn_factor = static_cast<float>(*a);
  } else {
    const auto m = opt_number(rs, "mscale", ctx), m_all = opt_number(rs, "mscale_all_dim", ctx);
    s.attn_factor = static_cast<float>(m && m_all && *m != 0 && *m_all != 0 ? get_mscale(f, *m) / get_mscale(f, *m_all)
                                                                            : get_mscale(f, 1.0));
  }
}

// rope_scaling (transformers 4.x) or rope_parameters (5.x, which also holds rope_theta). `rope_type` "default" is
// plain RoPE; "llama3" needs all four of its parameters (transformers refuses the config otherwise).
void read_rope(const json& j, const std::string& source, ModelConfig& c) {
  if (auto theta = opt_number(j, "rope_theta", source)) c.rope_base = static_cast<float>(*theta);
  if (auto theta = opt_number(j, "rope_local_base_freq", source)) c.rope_base_local = static_cast<float>(*theta);
  const json* rs = find_key(j, "rope_parameters");
  std::string what = "rope_parameters";
  if (rs == nullptr) {
    rs = find_key(j, "rope_scaling");
    what = "rope_scaling";
  }
  if (rs == nullptr) return;
  if (!rs->is_object()) fail("{}: '{}' must be an object or null, not {}", source, what, rs->dump());
  // transformers 5.x writes Gemma 3's as one set per layer type: the global layers' is the model's rope, the local
  // layers' gives their base (their scaling, if any, is not applied; Gemma 3's local layers have none).
  if (const json* full = find_key(*rs, "full_attention")) {
    if (const json* local = find_key(*rs, "sliding_attention"); local != nullptr && local->is_object())
      if (auto theta = opt_number(*local, "rope_theta", source + ": " + what + ".sliding_attention"))
        c.rope_base_local = static_cast<float>(*theta);
    rs = full;
    what += ".full_attention";
    if (!rs->is_object()) fail("{}: '{}' must be an object, not {}", source, what, rs->dump());
  }
  const std::string ctx = source + ": " + what;
  if (auto theta = opt_number(*rs, "rope_theta", ctx)) c.rope_base = static_cast<float>(*theta);
  auto type = opt_string(*rs, "rope_type", ctx);
  if (!type) type = opt_string(*rs, "type", ctx);
  if (!type) fail("{} has neither 'rope_type' nor 'type'", ctx);
  RopeScaling& s = c.rope_scaling;
  if (*type == "default") return;
  s.type = *type;
  auto factor = opt_number(*rs, "factor", ctx);
  if (*type == "linear" || *type == "llama3") {
    if (!factor) fail("{} of type '{}' has no 'factor'", ctx, *type);
  }
  if (factor) s.factor = static_cast<float>(*factor);
  if (auto orig = opt_int(*rs, "original_max_position_embeddings", ctx)) s.original_context = *orig;
  if (*type == "longrope" || *type == "su") {  // "su": the name Phi-3's first 128k configs used
    read_longrope(j, *rs, ctx, factor, s);
    return;
  }
  if (*type == "yarn") {
    read_yarn(j, *rs, ctx, factor, s);
    return;
  }
  if (*type != "llama3") return;
  auto low = opt_number(*rs, "low_freq_factor", ctx);
  auto high = opt_number(*rs, "high_freq_factor", ctx);
  if (!low || !high || s.original_context == 0)
    fail("{} of type 'llama3' needs low_freq_factor, high_freq_factor and original_max_position_embeddings", ctx);
  // The llama3 smoothing divides by (high - low).
  TESSERA_CHECK(*low < *high, "{}: low_freq_factor {} must be below high_freq_factor {}", ctx, *low, *high);
  s.low_freq_factor = static_cast<float>(*low);
  s.high_freq_factor = static_cast<float>(*high);
}

}  // namespace

ModelConfig config_from_hf(const json& j, const std::string& source) {
  if (!j.is_object()) fail("{}: is not a JSON object", source);
  ModelConfig c;
  const std::string family = read_family(j, source);
  if (family == "hgrn_bit") return read_hgrn_bit(j, source);
  // Mistral is a Llama with an optional sliding window; one builder serves every family (models/model_graph.h).
  c.architecture = family == "mistral" ? "llama" : family;
  if (auto n = opt_string(j, "_name_or_path", source)) c.name = *n;

  // Features of these families that Tessera's builder does not implement: refuse rather than run wrong.
  if (family != "gemma3" && family != "bitnet")
    if (auto act = opt_string(j, "hidden_act", source); act && *act != "silu")
      fail("{}: hidden_act '{}' is not supported ({} uses silu)", source, *act, family);
  // Qwen2 has q/k/v biases whatever attention_bias says (transformers' Qwen2Attention hard-codes them).
  if (family != "qwen2" && opt_bool(j, "attention_bias", source).value_or(false))
    fail("{}: attention_bias is true, and biased attention projections are not supported", source);
  if ((family == "qwen2" || family == "qwen3") && opt_bool(j, "use_sliding_window", source).value_or(false))
    fail("{}: use_sliding_window is true, and Qwen's per-layer sliding window is not supported", source);
  if (opt_bool(j, "mlp_bias", source).value_or(false))
    fail("{}: mlp_bias is true, and biased MLP projections are not supported", source);
  if (const json* q = find_key(j, "quantization_config")) {
    if (family != "bitnet" && family != "llama")
      fail("{}: has a quantization_config; pre-quantized Hugging Face checkpoints are not supported", source);
    read_bitnet_quantization(*q, source, c);
  }

  c.n_embd = req_int(j, "hidden_size", source);
  c.n_ff = req_int(j, "intermediate_size", source);
  c.n_layers = req_int(j, "num_hidden_layers", source);
  c.n_head = req_int(j, "num_attention_heads", source);
  c.n_vocab = req_int(j, "vocab_size", source);
  c.n_head_kv = opt_int(j, "num_key_value_heads", source).value_or(c.n_head);
  TESSERA_CHECK(c.n_head % c.n_head_kv == 0, "{}: num_attention_heads {} is not divisible by num_key_value_heads {}",
                source, c.n_head, c.n_head_kv);
  if (auto hd = opt_int(j, "head_dim", source)) {
    c.head_dim = *hd;
  } else {
    TESSERA_CHECK(c.n_embd % c.n_head == 0, "{}: hidden_size {} is not divisible by num_attention_heads {}", source,
                  c.n_embd, c.n_head);
    c.head_dim = c.n_embd / c.n_head;
  }
  c.rope_dim = c.head_dim;
  c.n_ctx_train = opt_int(j, "max_position_embeddings", source).value_or(family == "mistral" ? 4096 * 32 : 2048);
  c.norm_eps = static_cast<float>(opt_number(j, "rms_norm_eps", source).value_or(family == "bitnet" ? 1e-5 : 1e-6));
  c.tied_output = opt_bool(j, "tie_word_embeddings", source).value_or(false);
  if (family == "mistral") {
    // MistralConfig defaults to a 4096 window; an explicit null means full attention.
    auto it = j.find("sliding_window");
    c.sliding_window = it == j.end() ? 4096 : opt_int(j, "sliding_window", source).value_or(0);
  }
  if (family == "phi3") {
    // Phi3Config: a sliding window when set (Phi-3-mini: 2047), rotary embedding on a fraction of each head.
    c.sliding_window = opt_int(j, "sliding_window", source).value_or(0);
    const double frac = opt_number(j, "partial_rotary_factor", source).value_or(1.0);
    TESSERA_CHECK(frac <= 1.0, "{}: partial_rotary_factor {} is above 1", source, frac);
    c.rope_dim = static_cast<int64_t>(std::llround(frac * double(c.head_dim)));
  }
  c.qkv_bias = family == "qwen2";
  c.qk_norm = family == "qwen3";
  if (family == "gemma3") {
    c.tied_output = opt_bool(j, "tie_word_embeddings", source).value_or(true);  // Gemma3TextConfig's default
    read_gemma3(j, source, c);
  }
  if (family == "bitnet") {
    // BitNetConfig: relu2 by default (silu accepted), sub-norms, rope base 500000 unless given.
    c.ffn_act = opt_string(j, "hidden_act", source).value_or("relu2");
    if (c.ffn_act != "relu2" && c.ffn_act != "silu")
      fail("{}: hidden_act '{}' is not supported (bitnet uses relu2 or silu)", source, c.ffn_act);
    c.sub_norms = true;
    c.rope_base = 500000.0f;
  }
  read_rope(j, source, c);
  // transformers applies rotate_half to un-permuted q/k weights: NeoX-style pairs (i, i + head_dim / 2).
  c.rope_neox = true;
  c.validate(source);
  return c;
}

}  // namespace tessera
