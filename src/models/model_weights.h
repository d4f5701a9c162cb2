// An opened model: its configuration and its tensors under GGUF names (blk.N.attn_q.weight, ...), whatever the file
// format. GGUF tensors are used in place; safetensors tensors are renamed with hf_to_gguf_name and also used in
// place. The only copies are small: 1-D weights (norms, rope frequency divisors) converted to f32 when the file
// stores them otherwise, because the norm kernels read f32.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "formats/tensor_view.h"
#include "models/config.h"

namespace tessera {
namespace gguf {
class File;
}
namespace safetensors {
class Model;
}

class ModelWeights {
 public:
  ModelWeights() = default;
  // `path`: a .gguf file, a .safetensors file or index.json, or a Hugging Face model directory. Error (one sentence
  // naming the path) when the file is invalid or the configuration inconsistent.
  static ModelWeights open(const std::string& path);
  // A weight table without a file, for tests and display-only graphs; views may have null data.
  static ModelWeights from_views(ModelConfig config, std::vector<TensorView> views, std::string name);

  const ModelConfig& config() const;
  const std::string& path() const;
  const std::string& format() const;  // "gguf" or "safetensors"
  const std::vector<TensorView>& tensors() const;

  const TensorView* find(std::string_view gguf_name) const;  // nullptr when absent
  // The tensor, checked against `shape` (row-major); Error naming the file and tensor when missing or mis-shaped.
  const TensorView& require(std::string_view gguf_name, const std::vector<int64_t>& shape) const;

  const gguf::File* gguf_file() const;              // null unless format() == "gguf"
  const safetensors::Model* safetensors() const;    // null unless format() == "safetensors"

  struct State;  // opaque; shared by copies

 private:
  std::shared_ptr<const State> s_;
};

}  // namespace tessera
