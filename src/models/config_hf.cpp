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
      {"LlamaForCausalLM", "llama"}, {"MistralForCausalLM", "mistral"}, {"Gemma3ForCausalLM", "gemma3"},
      {"Qwen2ForCausalLM", "qwen2"}, {"Qwen3ForCausalLM", "qwen3"},     {"Phi3ForCausalLM", "phi3"}};
  if (const json* a = find_key(j, "architectures")) {
    if (!a->is_array() || a->empty() || !(*a)[0].is_string())
      fail("{}: 'architectures' must be a non-empty list of names", source);
    const std::string& arch = (*a)[0].get_ref<const std::string&>();
    for (const auto& [hf, family] : kArchs)
      if (arch == hf) return family;
    fail(
        "{}: architecture '{}' is not supported (supported: LlamaForCausalLM, MistralForCausalLM, Gemma3ForCausalLM, "
        "Qwen2ForCausalLM, Qwen3ForCausalLM, Phi3ForCausalLM)",
        source, arch);
  }
  auto mt = opt_string(j, "model_type", source);
  if (!mt) fail("{}: neither 'architectures' nor 'model_type' says what model this is", source);
  if (*mt == "llama" || *mt == "mistral" || *mt == "qwen2" || *mt == "qwen3" || *mt == "phi3") return *mt;
  if (*mt == "gemma3_text") return "gemma3";
  fail("{}: model_type '{}' is not supported (supported: llama, mistral, gemma3_text, qwen2, qwen3, phi3)", source,
       *mt);
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
  // Mistral is a Llama with an optional sliding window; one builder serves every family (models/model_graph.h).
  c.architecture = family == "mistral" ? "llama" : family;
  if (auto n = opt_string(j, "_name_or_path", source)) c.name = *n;

  // Features of these families that Tessera's builder does not implement: refuse rather than run wrong.
  if (family != "gemma3")
    if (auto act = opt_string(j, "hidden_act", source); act && *act != "silu")
      fail("{}: hidden_act '{}' is not supported ({} uses silu)", source, *act, family);
  // Qwen2 has q/k/v biases whatever attention_bias says (transformers' Qwen2Attention hard-codes them).
  if (family != "qwen2" && opt_bool(j, "attention_bias", source).value_or(false))
    fail("{}: attention_bias is true, and biased attention projections are not supported", source);
  if ((family == "qwen2" || family == "qwen3") && opt_bool(j, "use_sliding_window", source).value_or(false))
    fail("{}: use_sliding_window is true, and Qwen's per-layer sliding window is not supported", source);
  if (opt_bool(j, "mlp_bias", source).value_or(false))
    fail("{}: mlp_bias is true, and biased MLP projections are not supported", source);
  if (find_key(j, "quantization_config") != nullptr)
    fail("{}: has a quantization_config; pre-quantized Hugging Face checkpoints are not supported", source);

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
  c.norm_eps = static_cast<float>(opt_number(j, "rms_norm_eps", source).value_or(1e-6));
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
  read_rope(j, source, c);
  // transformers applies rotate_half to un-permuted q/k weights: NeoX-style pairs (i, i + head_dim / 2).
  c.rope_neox = true;
  c.validate(source);
  return c;
}

}  // namespace tessera
