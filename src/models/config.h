// Hyperparameters of a Llama-family model, read from GGUF metadata or a Hugging Face config.json.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace tessera {
namespace gguf {
class File;
}

struct RopeScaling {
  // "none", "linear", "llama3" (computed smoothing), "freqs" (GGUF rope_freqs.weight divisors), "yarn" (read only)
  std::string type = "none";
  float factor = 1.0f;
  float low_freq_factor = 1.0f;    // llama3
  float high_freq_factor = 4.0f;   // llama3
  int64_t original_context = 0;    // llama3 / yarn: original_max_position_embeddings
};

struct ModelConfig {
  std::string architecture;  // "llama" (Llama 2/3, SmolLM2, Mistral share it)
  std::string name;          // human-readable, may be empty
  int64_t n_layers = 0;
  int64_t n_embd = 0;        // model width
  int64_t n_head = 0;
  int64_t n_head_kv = 0;     // GQA: n_head % n_head_kv == 0
  int64_t head_dim = 0;      // usually n_embd / n_head
  int64_t n_ff = 0;          // SwiGLU hidden width
  int64_t n_vocab = 0;
  int64_t n_ctx_train = 0;   // trained context length
  float rope_base = 10000.0f;
  int64_t rope_dim = 0;      // rotated dimensions per head (== head_dim for Llama)
  bool rope_neox = false;    // false: GGUF/llama.cpp "normal" pairs (GGUF q/k weights are permuted to use it)
  RopeScaling rope_scaling;
  float norm_eps = 1e-5f;
  bool tied_output = false;  // output projection shares token_embd
  int64_t sliding_window = 0;  // Mistral; 0 = none

  // Throws tessera::Error naming the first inconsistent field (zero sizes, heads not dividing, ...).
  void validate(const std::string& source) const;
};

// From GGUF metadata ("{arch}.block_count", ...); `tied_output` from the absence of output.weight.
ModelConfig config_from_gguf(const gguf::File& f);
// From a Hugging Face config.json (LlamaForCausalLM, MistralForCausalLM); `source` names the file in errors.
ModelConfig config_from_hf(const nlohmann::json& j, const std::string& source);

}  // namespace tessera
