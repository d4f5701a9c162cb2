// Public API: a loaded model. Loading maps the file (nothing is read or copied until a session runs), reads the
// configuration and the tokenizer. Copies of a Model share the same loaded state, so a Model can be passed around by
// value and outlives nothing it was loaded from: sessions keep it alive.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "tessera/tokenizer.h"

namespace tessera {

struct ModelOptions {
  // Load the tokenizer (tokenizer.ggml.* metadata or tokenizer.json). A model without one can still be run on ids.
  bool load_tokenizer = true;
};

// A LoRA adapter (docs/LORA.md): a PEFT folder (adapter_config.json + adapter_model.safetensors), its
// adapter_model.safetensors, or a GGUF LoRA converted by llama.cpp's convert_lora_to_gguf.py; `scale` multiplies the
// adapter's own alpha / r.
struct LoraSpec {
  std::string path;
  float scale = 1.0f;
  // "FILE[:SCALE]": a trailing ":number" is the scale (so "dir:name" stays a path); Error for a scale not finite.
  static LoraSpec parse(const std::string& spec);
};

// A LoRA adapter as a session runs it (Session::adapters).
struct AdapterInfo {
  std::string path;
  std::string format;    // "peft" or "gguf"
  int64_t matmuls = 0;   // base weights it adapts
  int64_t max_rank = 0;  // the largest r among them
  float scale = 1.0f;    // the user's scale (LoraSpec::scale)
  bool merged = false;   // merged into copies of the weights when the session opened
};

// Hyperparameters as the engine understands them.
struct ModelSpec {
  std::string architecture;  // "llama"
  std::string name;
  int64_t n_layers = 0, n_embd = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_ff = 0, n_vocab = 0;
  int64_t n_ctx_train = 0;  // 0 when the file does not say
  int64_t sliding_window = 0;
  bool tied_output = false;
  std::string rope_scaling;  // "none", "linear", "llama3", "freqs", "longrope", "yarn"
  // A recurrent state per sequence instead of a KV cache (the MatMul-free LM): a sequence can be cleared, not cut
  // back to an earlier position.
  bool recurrent = false;
};

class Model {
 public:
  // `path`: a .gguf file, a .safetensors file or index.json, or a Hugging Face model directory; "" loads the default
  // model from the cache. Throws tessera::Error (one sentence naming the file) on anything invalid.
  static Model load(const std::string& path, const ModelOptions& options = {});

  Model();  // empty; loaded() is false
  ~Model();
  Model(const Model&);
  Model& operator=(const Model&);

  bool loaded() const { return impl_ != nullptr; }
  const std::string& path() const;
  const std::string& format() const;  // "gguf" or "safetensors"
  const ModelSpec& spec() const;
  bool has_tokenizer() const;
  // Error when the model has no tokenizer.
  const Tokenizer& tokenizer() const;

  struct Impl;  // internal (src/api/model_impl.h)
  const std::shared_ptr<Impl>& impl() const { return impl_; }

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace tessera
