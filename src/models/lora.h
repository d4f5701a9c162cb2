// LoRA adapters: low-rank updates W' = W + s · B·A of a base model's matmul weights, read from PEFT's
// adapter_config.json + adapter_model.safetensors or from llama.cpp's GGUF LoRA (general.type "adapter", adapter.type
// "lora", adapter.lora.alpha; tensors blk.N.attn_q.weight.lora_a / .lora_b). Both store A [r, K] and B [N, r] for a
// base weight W [N, K] (GGUF's ne reversed at the reader, as everywhere). The scale s is the adapter's (PEFT:
// lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora; GGUF: alpha / r as llama.cpp computes it, 1 when alpha is 0)
// times the user's (--lora FILE:SCALE).
//
// Unmerged, the graph builder (models/llama.cpp) adds y += (x·Aᵀ)·Bᵀ after each target matmul, with B pre-multiplied
// by s at load so the adapter costs two matmuls and one add per target (the CPU's fast mode runs a target and its
// adapters as one fused step: graph/passes/fuse.h, backends/cpu/kernels/lora.h). Merged (--lora-merge), LoraSet
// computes W + s·B·A once per target at load, in the base weight's format (requantized where the base is quantized).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "models/model_weights.h"

namespace tessera {

// One adapted weight.
struct LoraTarget {
  std::string weight;    // the base weight's GGUF name: "blk.3.attn_q.weight"
  int64_t rank = 0;      // r
  int64_t n_in = 0;      // K: the base weight's columns
  int64_t n_out = 0;     // N: the base weight's rows
  float scale = 0;       // s: the adapter's scale for this target times the user's
  std::vector<float> a;  // A [r, K]
  std::vector<float> b;  // B [N, r], already multiplied by `scale`
  // The same in f16: what fast (non-reference) sessions run (B only at decode; models/llama.cpp says why). Half the
  // bytes of f32: rank 16 on SmolLM2-135M's seven projections is 4.9M parameters, 19.6 MB per decoded token in f32
  // beside the Q4_1 base's 85 MB.
  std::vector<uint16_t> a16, b16;
  const void* a_data(DType t) const { return t == DType::F16 ? static_cast<const void*>(a16.data()) : a.data(); }
  const void* b_data(DType t) const { return t == DType::F16 ? static_cast<const void*>(b16.data()) : b.data(); }
};

struct LoraAdapter {
  std::string path;
  std::string format;  // "peft" or "gguf"
  std::vector<LoraTarget> targets;
  const LoraTarget* find(std::string_view weight) const;  // nullptr when the adapter leaves this weight alone
};

// Reads an adapter for `base`: `path` is a PEFT directory (adapter_config.json + adapter_model.safetensors), its
// adapter_model.safetensors, or a GGUF LoRA. Error (one sentence naming the file) for a malformed file, an option this
// reader does not implement (DoRA, fan_in_fan_out, trained biases), or an adapter made for another base: a target the
// base lacks or does not run as a matmul, or a shape that does not match.
LoraAdapter load_lora_adapter(const std::string& path, float user_scale, const ModelWeights& base);

// "FILE[:SCALE]" -> (FILE, SCALE); the scale defaults to 1. A trailing ":number" is a scale only when it parses as one
// (so "C:/x" or "dir:name" stays a path). Error for a scale that is not finite.
std::pair<std::string, float> parse_lora_spec(const std::string& spec);

// The adapters one session runs, unmerged or merged into copies of the base weights.
struct LoraSet {
  std::vector<std::shared_ptr<const LoraAdapter>> adapters;
  bool merged = false;
  DType dtype = DType::F32;  // unmerged: the type A and B run in (F32, or F16 for fast sessions)
  // Unmerged: the ranks are zero-padded to a multiple of this (exact: A's added rows and B's added columns are 0). CUDA
  // sessions use 8: the GEMV reads weight rows as 16-byte vectors, so B [N, r] needs r % 8 == 0 in f16.
  int64_t rank_multiple = 1;
  // Merged only: base weight name -> W + Σ s·B·A, in the base weight's dtype where Tessera can write it (else f32).
  struct MergedWeight {
    DType dtype = DType::F32;
    std::vector<int64_t> shape;  // [N, K]
    std::vector<uint8_t> data;
  };
  std::unordered_map<std::string, MergedWeight> merged_weights;
  bool empty() const { return adapters.empty(); }
};

// Builds the set; with `merge`, computes every adapted weight's merged copy (the sum over adapters that target it);
// unmerged, pads every rank to a multiple of `rank_multiple` (copies of the adapters whose ranks need it).
std::shared_ptr<const LoraSet> make_lora_set(std::vector<std::shared_ptr<const LoraAdapter>> adapters, bool merge,
                                             const ModelWeights& base, DType dtype = DType::F32,
                                             int64_t rank_multiple = 1);

// `t` with its rank zero-padded up to a multiple of `multiple` (A gains zero rows, B zero columns: B·A is unchanged).
LoraTarget pad_lora_rank(const LoraTarget& t, int64_t multiple);

}  // namespace tessera
