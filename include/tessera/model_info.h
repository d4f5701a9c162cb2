// Public API: what a model file holds, without loading its weights (the file is mapped, not read).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace tessera {

struct TensorInfo {
  std::string name;
  std::string dtype;           // "q4_1", "f32", "bf16", ...
  std::vector<int64_t> shape;  // row-major, outermost first: a linear weight is {out_features, in_features}
  uint64_t bytes = 0;
};

struct ModelInfo {
  std::string path;
  std::string format;          // "gguf" or "safetensors"
  uint32_t format_version = 0; // GGUF version; 0 for safetensors
  std::string architecture;
  std::string name;
  int64_t n_layers = 0, n_embd = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_ff = 0, n_vocab = 0, n_ctx_train = 0;
  double rope_base = 0;
  std::string rope_scaling;    // "none", "linear", "llama3", ...
  double rope_scaling_factor = 1;
  double norm_eps = 0;
  bool tied_output = false;
  std::string tokenizer_kind;  // "gpt2" (byte-level BPE), "llama" (SentencePiece), "hf-bpe", or "none"
  int64_t tokenizer_vocab = 0;
  bool has_chat_template = false;
  std::vector<std::pair<std::string, std::string>> metadata;  // every key, value rendered short (arrays summarized)
  std::vector<TensorInfo> tensors;
  uint64_t n_params = 0;
  uint64_t n_bytes = 0;
  std::map<std::string, uint64_t> bytes_by_dtype;
  std::map<std::string, uint64_t> params_by_dtype;
};

// Reads a GGUF file, a .safetensors file, a sharded model's index.json, or a directory holding one of those plus
// config.json. Throws tessera::Error (one sentence) on anything invalid.
ModelInfo inspect_model(const std::string& path);

// "gguf" or "safetensors", from the file's first bytes (a directory is a Hugging Face model); anything else is an
// Error "<path>: not a GGUF or safetensors model (...)", the same for every command.
std::string model_format(const std::string& path);

// The model cache directory: $TESSERA_HOME, else $XDG_CACHE_HOME/tessera/models, else ~/.cache/tessera/models.
std::string model_cache_dir();
// `path` if non-empty; else the default model in the cache, or an Error saying how to fetch it.
std::string resolve_model_path(const std::string& path);

}  // namespace tessera
