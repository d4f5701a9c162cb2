// ModelConfig from GGUF metadata, and the consistency checks every loader runs.
#include <cmath>
#include <string>

#include "core/error.h"
#include "formats/gguf.h"
#include "models/config.h"

namespace tessera {

void ModelConfig::validate(const std::string& source) const {
  TESSERA_CHECK(!architecture.empty(), "{}: architecture is not set", source);
  auto positive = [&](int64_t v, const char* what) {
    TESSERA_CHECK(v > 0, "{}: {} must be positive (got {})", source, what, v);
  };
  positive(n_layers, "layer count");
  positive(n_embd, "embedding width");
  positive(n_head, "head count");
  positive(n_head_kv, "kv head count");
  positive(head_dim, "head dimension");
  positive(n_ff, "feed-forward width");
  positive(n_vocab, "vocabulary size");
  // Limits far above any real Llama; they keep a hostile file from making later size products overflow.
  TESSERA_CHECK(n_layers <= 4096 && n_embd <= (1 << 20) && n_ff <= (1 << 22) && n_vocab <= (1 << 24) &&
                    head_dim <= 4096 && n_head <= 4096,
                "{}: hyperparameters are implausibly large (layers {}, width {}, ffn {}, vocab {})", source, n_layers,
                n_embd, n_ff, n_vocab);
  TESSERA_CHECK(n_head % n_head_kv == 0, "{}: head count {} is not a multiple of the kv head count {}", source, n_head,
                n_head_kv);
  TESSERA_CHECK(rope_dim > 0 && rope_dim <= head_dim && rope_dim % 2 == 0,
                "{}: rope dimension {} must be even and at most the head dimension {}", source, rope_dim, head_dim);
  TESSERA_CHECK(std::isfinite(rope_base) && rope_base > 0, "{}: rope base {} is not a positive number", source,
                rope_base);
  TESSERA_CHECK(std::isfinite(norm_eps) && norm_eps > 0 && norm_eps < 1, "{}: norm epsilon {} is out of range", source,
                norm_eps);
  TESSERA_CHECK(n_ctx_train >= 0, "{}: context length {} is negative", source, n_ctx_train);
  TESSERA_CHECK(ffn_act == "silu" || ffn_act == "gelu_tanh" || ffn_act == "relu2",
                "{}: feed-forward activation '{}' is not supported", source, ffn_act);
  TESSERA_CHECK(ternary == "none" || ternary == "mul" || ternary == "div" || ternary == "online",
                "{}: ternary weight storage '{}' is not one of none, mul, div, online", source, ternary);
  TESSERA_CHECK(sliding_window >= 0, "{}: sliding window {} is negative", source, sliding_window);
  TESSERA_CHECK(swa_pattern >= 0, "{}: sliding-window layer pattern {} is negative", source, swa_pattern);
  TESSERA_CHECK(std::isfinite(embd_scale) && embd_scale >= 0, "{}: embedding scale {} is not a number >= 0", source,
                embd_scale);
  TESSERA_CHECK(std::isfinite(attn_scale) && attn_scale >= 0, "{}: attention scale {} is not a number >= 0", source,
                attn_scale);
  TESSERA_CHECK(std::isfinite(rope_base_local) && rope_base_local >= 0, "{}: local rope base {} is not a number >= 0",
                source, rope_base_local);
  TESSERA_CHECK(std::isfinite(final_softcap) && final_softcap >= 0, "{}: final logit softcap {} is not a number >= 0",
                source, final_softcap);
  TESSERA_CHECK(layer_local.empty() || static_cast<int64_t>(layer_local.size()) == n_layers,
                "{}: {} layer types given for {} layers", source, layer_local.size(), n_layers);
  TESSERA_CHECK(std::isfinite(norm_weight_offset), "{}: norm weight offset {} is not a number", source,
                norm_weight_offset);
  TESSERA_CHECK(std::isfinite(rope_scaling.factor) && rope_scaling.factor > 0,
                "{}: rope scaling factor {} is not a positive number", source, rope_scaling.factor);
  TESSERA_CHECK(std::isfinite(rope_scaling.attn_factor) && rope_scaling.attn_factor > 0,
                "{}: rope attention factor {} is not a positive number", source, rope_scaling.attn_factor);
}

namespace {

int64_t require_int(const gguf::File& f, const std::string& key) {
  auto v = f.get_uint(key);
  TESSERA_CHECK(v.has_value(), "{}: required metadata key '{}' is missing", f.path(), key);
  TESSERA_CHECK(*v <= static_cast<uint64_t>(INT64_MAX / 2), "{}: metadata '{}' = {} is out of range", f.path(), key,
                *v);
  return static_cast<int64_t>(*v);
}

int64_t opt_int(const gguf::File& f, const std::string& key, int64_t dflt) {
  auto v = f.get_uint(key);
  if (!v) return dflt;
  TESSERA_CHECK(*v <= static_cast<uint64_t>(INT64_MAX / 2), "{}: metadata '{}' = {} is out of range", f.path(), key,
                *v);
  return static_cast<int64_t>(*v);
}

float opt_float(const gguf::File& f, const std::string& key, float dflt) {
  auto v = f.get_float(key);
  return v ? static_cast<float>(*v) : dflt;
}

// ---- bitnet.cpp's BitNet b1.58 files and Tessera's own hgrn_bit files (the architectures beyond llama.cpp's) ----

// microsoft/BitNet's converters: utils/convert-hf-to-gguf-bitnet.py (BitnetModel, the 2B4T GGUF on Hugging Face)
// writes "bitnet-b1.58", the earlier utils/convert-ms-to-gguf-bitnet.py "bitnet-25"; its llama.cpp fork runs both
// with build_bitnet_158. Keys under that prefix, llama.cpp's bitnet tensor names (attn_sub_norm, ffn_sub_norm), no
// permutation of q/k (NeoX rotation), relu(gate)^2 * up, every linear reading int8 activations (its I2_S dot products
// are ggml_vec_dot_i2_i8_s of src/ggml-bitnet-mad.cpp; one scale per token, as BitNet's activation quantizer),
// lm_head tied to token_embd unless output.weight is there.
bool is_bitnet_cpp_arch(const std::string& arch) { return arch == "bitnet-b1.58" || arch == "bitnet-25"; }

// Runs it as Tessera's "bitnet" family. The linears hold ternary x scale: I2_S (read as TQ2_0 or F32 by the GGUF
// reader) or float (its f32 files before llama-quantize), so "mul" with no scale tensors keeps them as they are or
// stores float ones as TQ2_0.
void read_bitnet_cpp(const gguf::File& f, ModelConfig& c) {
  c.architecture = "bitnet";
  c.rope_neox = true;
  c.sub_norms = true;
  c.ffn_act = "relu2";
  c.act_quant_i8 = true;
  c.ternary = "mul";
  c.tied_output = f.find_tensor("output.weight") == nullptr;
}

// The MatMul-free LM as Tessera's random-model writer stores it (src/api/random_model.cpp; no converter writes this
// architecture): the hgrn_bit graph's tensor names (blk.N.attn_{i,f,g}, their *_in_norm, attn_g_norm, lower_bounds,
// output_in_norm), weights stored as they run (ternary x scale in TQ2_0, TQ1_0 or a float format; no conversion at
// load), one head, no rope.
void read_hgrn_bit(const gguf::File& f, ModelConfig& c) {
  c.act_quant_i8 = true;
  c.ternary_output = true;
  c.hgrn_lower_bound = f.find_tensor("lower_bounds") != nullptr;
  c.ternary = "none";
  TESSERA_CHECK(!c.tied_output, "{}: hgrn_bit needs output.weight (its lm_head is a BitLinear of its own)", f.path());
  c.rope_dim = c.head_dim % 2 == 0 ? c.head_dim : c.head_dim - 1;  // no rope: any valid value
}

}  // namespace

ModelConfig config_from_gguf(const gguf::File& f) {
  ModelConfig c;
  auto arch = f.get_string("general.architecture");
  TESSERA_CHECK(arch.has_value(), "{}: metadata key 'general.architecture' is missing", f.path());
  c.architecture = std::string(*arch);
  TESSERA_CHECK(c.architecture == "llama" || c.architecture == "mistral" || c.architecture == "gemma3" ||
                    c.architecture == "qwen2" || c.architecture == "qwen3" || c.architecture == "phi3" ||
                    c.architecture == "bitnet" || is_bitnet_cpp_arch(c.architecture) || c.architecture == "hgrn_bit",
                "{}: architecture '{}' is not supported yet (supported: llama, mistral, gemma3, qwen2, qwen3, phi3, "
                "bitnet, bitnet-b1.58, bitnet-25, hgrn_bit)",
                f.path(), c.architecture);
  if (auto name = f.get_string("general.name")) c.name = std::string(*name);
  const std::string a = c.architecture + ".";
  c.n_layers = require_int(f, a + "block_count");
  c.n_embd = require_int(f, a + "embedding_length");
  c.n_ff = require_int(f, a + "feed_forward_length");
  c.n_head = require_int(f, a + "attention.head_count");
  c.n_head_kv = opt_int(f, a + "attention.head_count_kv", c.n_head);
  c.n_ctx_train = opt_int(f, a + "context_length", 0);
  TESSERA_CHECK(c.n_head > 0, "{}: head count must be positive", f.path());
  c.head_dim = opt_int(f, a + "attention.key_length", c.n_embd / c.n_head);
  c.rope_dim = opt_int(f, a + "rope.dimension_count", c.head_dim);
  c.rope_base = opt_float(f, a + "rope.freq_base", 10000.0f);
  c.norm_eps = opt_float(f, a + "attention.layer_norm_rms_epsilon", 1e-5f);
  c.sliding_window = opt_int(f, a + "attention.sliding_window", 0);

  // Vocabulary: the metadata key when present, else the token list, else the embedding's row count.
  c.n_vocab = opt_int(f, a + "vocab_size", 0);
  if (c.n_vocab == 0) {
    if (const gguf::Value* toks = f.find("tokenizer.ggml.tokens"); toks != nullptr && toks->is_array())
      c.n_vocab = static_cast<int64_t>(toks->len);
  }
  const TensorView* embd = f.find_tensor("token_embd.weight");
  TESSERA_CHECK(embd != nullptr, "{}: tensor 'token_embd.weight' is missing", f.path());
  if (c.n_vocab == 0 && embd->shape.size() == 2) c.n_vocab = embd->shape[0];
  c.tied_output = f.find_tensor("output.weight") == nullptr;

  if (auto type = f.get_string(a + "rope.scaling.type")) {
    c.rope_scaling.type = std::string(*type);
    c.rope_scaling.factor = opt_float(f, a + "rope.scaling.factor", 1.0f);
    c.rope_scaling.original_context = opt_int(f, a + "rope.scaling.original_context_length", 0);
    if (c.rope_scaling.type == "yarn") {
      // llama.cpp's reading: the original context defaults to the trained one, the band to rotations 32..1, and the
      // attention factor is 0.1 ln(factor) + 1 (a ratio of two such when yarn_log_multiplier is set) times attn_factor.
      RopeScaling& y = c.rope_scaling;
      if (y.original_context == 0) y.original_context = c.n_ctx_train;
      TESSERA_CHECK(y.original_context > 1, "{}: yarn rope scaling needs rope.scaling.original_context_length > 1",
                    f.path());
      y.beta_fast = opt_float(f, a + "rope.scaling.yarn_beta_fast", 32.0f);
      y.beta_slow = opt_float(f, a + "rope.scaling.yarn_beta_slow", 1.0f);
      const float log_mul = opt_float(f, a + "rope.scaling.yarn_log_multiplier", 0.0f);
      const auto get_mscale = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
      const double mscale =
          log_mul != 0 ? get_mscale(y.factor, 1.0) / get_mscale(y.factor, log_mul) : get_mscale(y.factor, 1.0);
      y.attn_factor = static_cast<float>(mscale * opt_float(f, a + "rope.scaling.attn_factor", 1.0f));
    }
  }
  // Llama 3.x GGUFs carry llama3 scaling as a rope_freqs.weight tensor of per-dimension divisors.
  if (f.find_tensor("rope_freqs.weight") != nullptr && c.rope_scaling.type == "none") c.rope_scaling.type = "freqs";
  c.rope_neox = false;  // GGUF's converter permutes q/k for the "normal" (adjacent pairs) rotation
  if (c.architecture == "phi3") {
    c.rope_neox = true;
    // Phi-3's 128k variants scale rope per dimension: rope_factors_{short,long}.weight, chosen by the context
    // (models/llama.cpp), and cos and sin multiplied by rope.scaling.attn_factor (1 when absent, as llama.cpp reads
    // it).
    const bool has_long = f.find_tensor("rope_factors_long.weight") != nullptr;
    if (has_long || f.find_tensor("rope_factors_short.weight") != nullptr) {
      TESSERA_CHECK(has_long && f.find_tensor("rope_factors_short.weight") != nullptr,
                    "{}: Phi-3's longrope needs both rope_factors_short.weight and rope_factors_long.weight", f.path());
      c.rope_scaling.type = "longrope";
      c.rope_scaling.attn_factor = opt_float(f, a + "rope.scaling.attn_factor", 1.0f);
      if (c.rope_scaling.original_context == 0)
        c.rope_scaling.original_context = opt_int(f, a + "rope.scaling.original_context_length", c.n_ctx_train);
    }
  }
  if (c.architecture == "qwen2" || c.architecture == "qwen3" || c.architecture == "gemma3") {
    // llama.cpp's converter permutes q/k rows for llama only: these keep HF's NeoX pairs (i, i + D/2).
    c.rope_neox = true;
    c.qkv_bias = c.architecture == "qwen2";
    c.qk_norm = c.architecture != "qwen2";
    // Qwen2 GGUFs may carry a sliding window that llama.cpp does not apply (HF's use_sliding_window is off in every
    // released Qwen2/2.5): full attention, as both peers run it.
    if (c.architecture != "gemma3") c.sliding_window = 0;
  }
  if (c.architecture == "bitnet") {
    // llama.cpp's bitnet (src/models/bitnet.cpp, written for 1bitLLM's bitnet_b1_58 3B): the converter stores the
    // ternarized weights in float (or TQ1_0/TQ2_0) unpermuted (NeoX rotation), sub-norms, SwiGLU, the output tied to
    // the embedding whatever the file holds, optional per-matrix `.scale` tensors multiplying each linear's output,
    // and no activation quantization.
    c.rope_neox = true;
    c.sub_norms = true;
    c.tied_output = true;
    c.ternary = "mul";
  }
  if (is_bitnet_cpp_arch(c.architecture)) read_bitnet_cpp(f, c);
  if (c.architecture == "hgrn_bit") read_hgrn_bit(f, c);
  if (c.architecture == "gemma3") {
    // llama.cpp's gemma3: the converter stores the norms' (1 + w) so they are plain RMSNorm here; GEGLU; embeddings
    // times sqrt(E); post-norms; local layers (five of six) with a 10000 rope base, values llama.cpp fixes in code
    // rather than reading from the file, and so do we.
    c.ffn_act = "gelu_tanh";
    c.post_norms = true;
    c.embd_scale = std::sqrt(static_cast<float>(c.n_embd));
    // The local layers: every sixth layer is global unless the file says otherwise (a period, or one bool per layer
    // as llama.cpp's converter may write), with llama.cpp's default local rope base unless the file gives one.
    c.swa_pattern = 6;
    if (const gguf::Value* pat = f.find(a + "attention.sliding_window_pattern")) {
      if (pat->is_array()) {
        TESSERA_CHECK(static_cast<int64_t>(pat->len) == c.n_layers,
                      "{}: metadata '{}attention.sliding_window_pattern' has {} entries for {} layers", f.path(), a,
                      pat->len, c.n_layers);
        for (uint64_t i = 0; i < pat->len; ++i) c.layer_local.push_back(pat->int_at(i) != 0 ? 1 : 0);
      } else {
        c.swa_pattern = require_int(f, a + "attention.sliding_window_pattern");
      }
    }
    c.rope_base_local = opt_float(f, a + "rope.freq_base_swa", 10000.0f);
    // query_pre_attn_scalar is not in the file: it is head_dim except for the 27B model (62 layers), whose scalar is
    // n_embd / n_head; llama.cpp decides the same way.
    c.attn_scale = static_cast<float>(
        1.0 / std::sqrt(c.n_layers == 62 ? double(c.n_embd) / double(c.n_head) : double(c.head_dim)));
    c.final_softcap = opt_float(f, a + "final_logit_softcapping", 0.0f);
  }
  c.validate(f.path());
  return c;
}

}  // namespace tessera
