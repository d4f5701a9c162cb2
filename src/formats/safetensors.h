// Hugging Face safetensors reader (mmap, zero-copy, fully validated): one file, a sharded model's
// model.safetensors.index.json, or a model directory, together with its config.json and tokenizer.json.
//
// A safetensors file is: u64 little-endian header length N, N bytes of JSON header, then the data section. The header
// maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the data section) and
// may hold "__metadata__" (string -> string). Every value is checked before use (header length, JSON syntax, field
// types, known dtypes, shape products that overflow, offsets inside the data section, byte sizes, overlaps, duplicate
// names); a violation throws tessera::Error with one sentence naming the file and the problem.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/mapped_file.h"
#include "formats/tensor_view.h"

namespace tessera::safetensors {

// The safetensors reference reader refuses headers above 100 MB; so do we (a larger one is a corrupt length field).
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// Tensor data is not guaranteed aligned: the reference writer pads the header to 8 bytes and orders tensors by
// element size, but other writers need not, so readers of `data` use unaligned loads (memcpy) or copy.
struct Header {
  std::vector<TensorView> tensors;              // sorted by data offset; offset is from the start of the buffer
  std::map<std::string, std::string> metadata;  // "__metadata__"
  uint64_t data_offset = 0;                     // start of the data section: 8 + N
};

// Parses one safetensors buffer held by the caller. Tensor `data` pointers point into `data`; `name` names the buffer
// in error messages. Supported dtypes: F32 F16 BF16 F64 I64 I32 I16 I8 (others are rejected as unsupported).
Header parse_header(const uint8_t* data, size_t size, const std::string& name);

// safetensors dtype string ("BF16") -> DType, or an Error naming `name` when unsupported or unknown.
DType dtype_from_safetensors(std::string_view s, const std::string& name);

// One mapped .safetensors file.
class File {
 public:
  static File open(const std::string& path);

  const std::string& path() const { return path_; }
  size_t file_size() const { return map_ ? map_->size() : 0; }
  uint64_t data_offset() const { return header_.data_offset; }
  const std::vector<TensorView>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  const TensorView* find_tensor(std::string_view name) const;

 private:
  std::string path_;
  std::shared_ptr<MappedFile> map_;
  Header header_;
  std::map<std::string, size_t, std::less<>> index_;
};

// A Hugging Face model: weights (one file or shards), config.json (parsed, not interpreted: models/config_hf.cpp turns
// it into a ModelConfig) and the path of tokenizer.json when present. Tensors keep HF names and point into the mapped
// shards, which live as long as the Model.
class Model {
 public:
  // `path`: a .safetensors file, a model.safetensors.index.json, or a directory holding one of
  // model.safetensors / model.safetensors.index.json. config.json must sit in the same directory.
  static Model open(const std::string& path);

  const std::string& path() const { return path_; }                  // what open() was given
  const std::string& weights_path() const { return weights_path_; }  // the .safetensors or index.json read
  const std::string& config_path() const { return config_path_; }
  const nlohmann::json& config_json() const { return *config_; }
  const std::string& tokenizer_path() const { return tokenizer_path_; }  // "" when there is no tokenizer.json
  // tokenizer_config.json (special tokens, chat_template); "" when absent.
  const std::string& tokenizer_config_path() const { return tokenizer_config_path_; }
  bool sharded() const { return sharded_; }
  const std::vector<std::string>& shard_paths() const { return shard_paths_; }

  // All tensors of all shards, in shard order then data order.
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const TensorView* find_tensor(std::string_view hf_name) const;
  // Looks up by Tessera's (GGUF-style) name, e.g. "blk.0.attn_q.weight".
  const TensorView* find_tensor_gguf(std::string_view gguf_name) const;
  // __metadata__ of the shards merged (first shard wins on a repeated key).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  uint64_t total_bytes() const;

 private:
  void add_file(File f, const std::map<std::string, std::string>* weight_map, const std::string& index_path);
  std::string path_, weights_path_, config_path_, tokenizer_path_, tokenizer_config_path_;
  bool sharded_ = false;
  std::vector<std::string> shard_paths_;
  std::vector<File> files_;
  std::shared_ptr<const nlohmann::json> config_;
  std::vector<TensorView> tensors_;
  std::map<std::string, size_t, std::less<>> index_;       // HF name -> tensors_ position
  std::map<std::string, size_t, std::less<>> gguf_index_;  // GGUF-style name -> tensors_ position
  std::map<std::string, std::string> metadata_;
};

// Maps a Hugging Face Llama/Mistral tensor name to the GGUF-style name the rest of Tessera uses:
//   model.embed_tokens.weight -> token_embd.weight, model.norm.weight -> output_norm.weight, lm_head.weight ->
//   output.weight, model.layers.N.{input_layernorm, post_attention_layernorm}.weight -> blk.N.{attn_norm,
//   ffn_norm}.weight, model.layers.N.self_attn.{q,k,v,o}_proj.{weight,bias} -> blk.N.attn_{q,k,v,output}.{weight,bias},
//   model.layers.N.mlp.{gate,up,down}_proj.weight -> blk.N.ffn_{gate,up,down}.weight.
// Returns "" for a name it does not know (e.g. rotary_emb.inv_freq buffers of old checkpoints).
std::string hf_to_gguf_name(std::string_view hf_name);

// Parses a JSON file into *out; Error naming `path` when it cannot be read or is not valid JSON.
void read_json_file(const std::string& path, nlohmann::json* out);

}  // namespace tessera::safetensors
