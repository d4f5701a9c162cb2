// Hyperparameters of a model (Llama family, Gemma 3, Qwen2/3), read from GGUF metadata or a Hugging Face config.json.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace tessera {
namespace gguf {
class File;
}

struct RopeScaling {
  // "none", "linear", "llama3" (computed smoothing), "freqs" (GGUF rope_freqs.weight divisors), "longrope" (Phi-3's
  // per-dimension divisors, a short and a long set, and an attention factor), "yarn" (YaRN: a blend of interpolated
  // and extrapolated frequencies, and an attention factor)
  std::string type = "none";
  float factor = 1.0f;
  float low_freq_factor = 1.0f;   // llama3
  float high_freq_factor = 4.0f;  // llama3
  int64_t original_context = 0;   // llama3 / yarn / longrope: original_max_position_embeddings
  // longrope: a context longer than original_context rotates with long_factor, else short_factor (llama.cpp's choice,
  // made once per session; transformers switches per forward pass by its sequence length). GGUF files hold the two
  // sets as the tensors rope_factors_{short,long}.weight instead (these stay empty then).
  std::vector<float> short_factor, long_factor;
  float attn_factor = 1.0f;  // longrope, yarn: cos and sin are multiplied by it (transformers' attention_scaling)
  float beta_fast = 32.0f;   // yarn: the rotation counts bounding the band blended between
  float beta_slow = 1.0f;    //   interpolated (divided by factor) and extrapolated (kept) frequencies
  bool truncate = true;      // yarn: the band's ends rounded outward to whole dimensions (transformers' default)
};

struct ModelConfig {
  std::string architecture;  // "llama" (Llama 2/3, SmolLM2, Mistral share it), "gemma3", "qwen2", "qwen3"
  std::string name;          // human-readable, may be empty
  int64_t n_layers = 0;
  int64_t n_embd = 0;  // model width
  int64_t n_head = 0;
  int64_t n_head_kv = 0;  // GQA: n_head % n_head_kv == 0
  int64_t head_dim = 0;   // usually n_embd / n_head
  int64_t n_ff = 0;       // SwiGLU / GEGLU hidden width
  int64_t n_vocab = 0;
  int64_t n_ctx_train = 0;  // trained context length
  float rope_base = 10000.0f;
  int64_t rope_dim = 0;    // rotated dimensions per head (== head_dim for Llama)
  bool rope_neox = false;  // false: GGUF/llama.cpp "normal" pairs (GGUF q/k weights are permuted to use it)
  RopeScaling rope_scaling;
  float norm_eps = 1e-5f;
  bool tied_output = false;    // output projection shares token_embd
  int64_t sliding_window = 0;  // Mistral, Gemma 3 local layers; 0 = none

  // Families beyond Llama (architecture "gemma3", "qwen2", "qwen3"; Mistral is "llama" with a sliding window).
  std::string ffn_act = "silu";  // "silu" (SwiGLU), "gelu_tanh" (GEGLU: Gemma) or "relu2" (BitNet: relu(g)^2 * up)
  bool qkv_bias = false;         // q/k/v projections have biases (Qwen2)
  bool qk_norm = false;          // per-head RMSNorm of q and k before rope (Qwen3, Gemma 3)
  bool post_norms = false;       // RMSNorm of each block's output before its residual add (Gemma 3)
  float embd_scale = 0;          // embeddings multiplied by this (Gemma: sqrt(n_embd)); 0 = not scaled
  float attn_scale = 0;          // attention score scale; 0 = 1/sqrt(head_dim) (Gemma: query_pre_attn_scalar^-1/2)
  // Sliding-window layers: with swa_pattern > 0, layer l uses the window only when (l + 1) % swa_pattern != 0 (Gemma
  // 3: five local layers, then a global one); 0: every layer uses sliding_window.
  int64_t swa_pattern = 0;
  float rope_base_local = 0;     // rope base of the sliding-window layers (Gemma 3: 10000); 0 = rope_base
  float final_softcap = 0;       // logits = cap * tanh(logits / cap) (Gemma's final_logit_softcapping); 0 = none
  float norm_weight_offset = 0;  // added to every RMSNorm weight at load (HF Gemma stores w for (1 + w); GGUF 1 + w)
  // Per layer, whether it slides (HF's layer_types); empty: swa_pattern decides.
  std::vector<uint8_t> layer_local;

  // Ternary models (architecture "bitnet": BitNet b1.58; and Llama with a BitNet quantization_config: Falcon3-1.58bit).
  bool sub_norms = false;     // RMSNorm of the attention output before o and of the gated FFN before down (BitNet)
  bool act_quant_i8 = false;  // BitLinear: int8 per-token activation fake-quant in front of every ternary linear
  // How the file stores the ternary linears (q, k, v, o, gate, up, down); the loader turns each into plain float
  // weights holding ternary times scale (models/ternary_weights.h):
  //   "none": plain float weights, used as stored;
  //   "mul": W = ternary * scale (transformers' AutoBitLinear offline; llama.cpp's optional `.scale` tensors);
  //   "div": W = ternary / scale (transformers' BitLinear, the packed checkpoints' default class);
  //   "online": float weights ternarized at load by absmean (AutoBitLinear online, BitNet's WeightQuant).
  std::string ternary = "none";
  // The MatMul-free LM (architecture "hgrn_bit"): every linear, lm_head included, is a BitLinear with its own RMSNorm
  // of its input; the token mixer is the MLGRU recurrence with per-layer forget-gate lower bounds.
  bool ternary_output = false;    // lm_head is ternary too (its input norm: output_in_norm.weight)
  bool hgrn_lower_bound = false;  // forget gates bounded below by softmax-cumsum of lower_bounds [L, E]

  // Whether layer l attends through the sliding window (and takes the local rope base).
  bool is_local_layer(int64_t l) const {
    if (sliding_window <= 0) return false;
    if (!layer_local.empty()) return l >= 0 && l < static_cast<int64_t>(layer_local.size()) && layer_local[l] != 0;
    return swa_pattern <= 0 || (l + 1) % swa_pattern != 0;
  }

  // Throws tessera::Error naming the first inconsistent field (zero sizes, heads not dividing, ...).
  void validate(const std::string& source) const;
};

// From GGUF metadata ("{arch}.block_count", ...); `tied_output` from the absence of output.weight.
ModelConfig config_from_gguf(const gguf::File& f);
// From a Hugging Face config.json (LlamaForCausalLM, MistralForCausalLM, Gemma3ForCausalLM, Qwen2ForCausalLM,
// Qwen3ForCausalLM); `source` names the file in errors.
ModelConfig config_from_hf(const nlohmann::json& j, const std::string& source);

}  // namespace tessera
