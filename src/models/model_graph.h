// The model-family dispatch: one entry point from a model's weights to its graph, whatever its architecture. The
// runtime (Engine::build_graph) and `tessera graph` (api/graph_api.cpp) call this, never a family's builder.
#pragma once

#include "graph/graph.h"
#include "models/llama.h"
#include "models/model_weights.h"

namespace tessera {

using ModelGraphOptions = LlamaGraphOptions;

// The graph of `weights.config().architecture`: "llama" (Llama 2/3, SmolLM2, Mistral with its sliding window),
// "qwen2" (q/k/v biases), "qwen3" (per-head q/k norms) and "gemma3" (GEGLU, post-norms, scaled embeddings, local and
// global layers) and "phi3" (q|k|v and gate|up stored fused, split into views at load by ModelWeights) share the
// pre-norm decoder builder of llama.h, which reads each difference from ModelConfig; so do "bitnet" (BitNet b1.58:
// sub-norms, relu2, int8 activations before its ternary linears) and Llama with a BitNet quantization_config
// (Falcon3-1.58bit). "hgrn_bit" (the MatMul-free LM: the MLGRU recurrence in place of attention) has its own
// builder, models/hgrn_bit.h. Error naming the architecture for any other.
graph::Graph build_model_graph(const ModelWeights& weights, const ModelGraphOptions& options);

}  // namespace tessera
