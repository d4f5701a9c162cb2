#include "models/model_graph.h"

#include "core/error.h"
#include "models/hgrn_bit.h"

namespace tessera {

graph::Graph build_model_graph(const ModelWeights& weights, const ModelGraphOptions& options) {
  const std::string& arch = weights.config().architecture;
  if (arch == "llama" || arch == "mistral" || arch == "qwen2" || arch == "qwen3" || arch == "gemma3" ||
      arch == "phi3" || arch == "bitnet")
    return build_llama_graph(weights, options);
  if (arch == "hgrn_bit") return build_hgrn_bit_graph(weights, options);
  fail(
      "{}: no graph builder for architecture '{}' (supported: llama, mistral, qwen2, qwen3, gemma3, phi3, bitnet, "
      "hgrn_bit)",
      weights.path(), arch);
}

}  // namespace tessera
