// Public API: quantize a model file, as llama.cpp's llama-quantize does, to the byte.
//
//   tessera::QuantizeResult r = tessera::quantize_model("model-f16.gguf", "model-q4_k_m.gguf", {.type = "q4_K_M"});
//
// Input: a GGUF file of f32/f16/bf16 weights (quantized ones too, with allow_requantize), or a Hugging Face model
// (a folder with config.json and safetensors; written as the GGUF Tessera would read, q/k rows permuted to GGUF's rope
// order). Output: a GGUF file with the input's metadata (general.quantization_version and general.file_type moved to
// the end, split.* dropped), tensors in llama.cpp's order (names outside blk.N first, then by layer, each group by
// name), aligned to 32 bytes, each tensor's type chosen by llama.cpp's rules for the mix (llama_tensor_get_type: the
// _M mixes give attn_v and ffn_down of some layers more bits, output/token_embd q6_K, a row not a whole number of
// 256-blocks falls back to a 32-block type) and quantized with GGML's reference quantizers. For a GGUF input without an
// importance matrix the file equals llama-quantize's (scripts/quantize_vs_llamacpp.sh checks it; docs/QUANTIZE.md).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tessera {

// One output type: its name as `tessera quantize` and llama-quantize spell it, and what it holds.
struct QuantizeType {
  std::string name;         // "q4_K_M"
  std::string description;  // "q4_K mix: attn_v and ffn_down of 1/2 the layers q6_K, output q6_K"
};
// Every type quantize_model accepts, in llama-quantize's listing order.
const std::vector<QuantizeType>& quantize_types();

// One tensor as it is written, reported before its data is produced.
struct QuantizeTensorInfo {
  int64_t index = 0, count = 0;  // 1-based position among `count` tensors
  std::string name;
  std::vector<int64_t> shape;  // row-major, outermost first
  std::string from, to;        // dtype names ("f16" -> "q6_K"); equal when the tensor is copied
  uint64_t bytes_in = 0, bytes_out = 0;
  bool fallback = false;  // the mix's type did not fit the row length and a 32-block type was used instead
};

struct QuantizeOptions {
  // A name of quantize_types() (case-insensitive; "q4_K" means q4_K_M, "q5_K" q5_K_M) or its llama.cpp LLAMA_FTYPE
  // number ("15" is q4_K_M), as llama-quantize accepts.
  std::string type;
  int n_threads = 0;              // <= 0: one per hardware thread
  bool allow_requantize = false;  // quantize tensors that are already quantized (dequantized first; loses quality)
  // tq1_0 / tq2_0 only: BitNet b1.58's absmean ternarization (one scale, mean |W|, per tensor) in place of
  // llama-quantize's absmax per block of 256 (the default, byte for byte llama-quantize's file).
  bool ternary_absmean = false;
  std::function<void(const QuantizeTensorInfo&)> on_tensor;  // progress: called once per tensor, in file order
  std::function<void(const std::string&)> on_warning;        // one sentence per call (fallbacks, requantizing)
};

struct QuantizeResult {
  int64_t n_tensors = 0, n_quantized = 0, n_fallback = 0, n_requantized = 0;
  uint64_t bytes_in = 0, bytes_out = 0;  // tensor data only
  uint32_t file_type = 0;                // llama.cpp's LLAMA_FTYPE written to general.file_type
};

// Reads `input`, writes `output` (atomically: a temporary file renamed at the end). Throws tessera::Error with one
// sentence on a bad input, an unknown type, a quantized input without allow_requantize, a tensor the type cannot hold,
// non-finite weights or an I/O failure.
QuantizeResult quantize_model(const std::string& input, const std::string& output, const QuantizeOptions& options);

}  // namespace tessera
