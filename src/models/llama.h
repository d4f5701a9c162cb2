// The pre-norm decoder graph builder: Llama 2, Llama 3 (rope scaling "llama3" or rope_freqs.weight), SmolLM2, Mistral
// (sliding window), and the families that differ from Llama only in what ModelConfig says: Qwen2 (q/k/v biases),
// Qwen3 (per-head q/k norms), Gemma 3 (GEGLU, post-norms, embeddings times sqrt(E), q/k norms, five local
// sliding-window layers with their own rope base per global one, attention scale, final softcap), BitNet b1.58 and
// Falcon3-1.58bit (sub-layer norms, squared-ReLU gating, int8 activation fake-quant before each ternary linear:
// models/ternary_weights.h makes the weights); grouped-query
// attention; tied or separate output projection. Callers use models/model_graph.h's dispatch.
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "graph/graph.h"
#include "models/lora.h"
#include "models/model_weights.h"

namespace tessera {

struct LlamaGraphOptions {
  int64_t n_tokens = 1;  // T: tokens this graph processes
  int64_t n_past = 0;    // P: tokens already in the cache (only the attention cost depends on it)
  int64_t n_ctx = 0;     // cache length in positions; 0 means n_past + n_tokens
  DType kv_dtype = DType::F16;
  bool all_logits = false;  // logits for all T tokens ([T, vocab]) instead of the last one ([1, vocab])
  // LoRA adapters (models/lora.h), null for none. Unmerged: each target matmul y = x·Wᵀ is followed by, per adapter,
  // "<node>.loraI_a" = x·Aᵀ [T, r], "<node>.loraI_b" = that·Bᵀ [T, N] and "<node>.loraI" = y + that (the order the
  // chain pass, graph/passes/chain.h, finds cheapest). Merged: the target weights are the set's merged copies.
  const LoraSet* lora = nullptr;
};

// Graph inputs, by role (graph::IoRole; names are for display): TOKENS "tokens" i32 [T], POSITIONS "positions" i32 [T],
// CACHE_K / CACHE_V of layer N "blk.N.cache_k" / "blk.N.cache_v" [Hkv, C, D].
// Graph outputs: LOGITS "output" f32 [T or 1, vocab] and the updated caches ("blk.N.cache_k_store", ...).
// Weights are bound to the model's tensors (Error naming the tensor when one is missing or mis-shaped).
graph::Graph build_llama_graph(const ModelWeights& weights, const LlamaGraphOptions& options);

// Inverse rotary frequencies inv_freq[i], i < rope_dim/2: base^(-2i/rope_dim), divided by the per-dimension factors of
// rope_freqs.weight when the model has them, else scaled as rope_scaling says (linear: / factor; llama3: Meta's
// smoothed wavelength-dependent scaling). `freq_factors` may be null.
std::vector<float> rope_inv_freq(const ModelConfig& c, const float* freq_factors /*[rope_dim/2] or null*/);

}  // namespace tessera
