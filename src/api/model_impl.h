// What a loaded tessera::Model holds (shared by its copies and by its sessions).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "backends/backend.h"
#include "graph/graph.h"
#include "models/lora.h"
#include "models/model_weights.h"
#include "tessera/graph.h"
#include "tessera/model.h"
#include "tessera/session.h"

namespace tessera {

// The public summary of a model's configuration.
inline ModelSpec spec_of(const ModelConfig& c) {
  ModelSpec s;
  s.architecture = c.architecture;
  s.name = c.name;
  s.n_layers = c.n_layers;
  s.n_embd = c.n_embd;
  s.n_head = c.n_head;
  s.n_head_kv = c.n_head_kv;
  s.head_dim = c.head_dim;
  s.n_ff = c.n_ff;
  s.n_vocab = c.n_vocab;
  s.n_ctx_train = c.n_ctx_train;
  s.sliding_window = c.sliding_window;
  s.tied_output = c.tied_output;
  s.rope_scaling = c.rope_scaling.type;
  s.recurrent = c.architecture == "hgrn_bit";
  return s;
}

struct Model::Impl {
  std::string path;
  ModelWeights weights;
  ModelSpec spec;
  std::optional<Tokenizer> tokenizer;
  // The weights as each backend holds them (repacked on the CPU, uploaded on a GPU): made by the first session on
  // that device, shared by every later one.
  std::shared_ptr<backend::WeightStore> weight_store(const std::string& device) {
    std::lock_guard<std::mutex> lock(stores_mu);
    auto& s = stores[device];
    if (!s) s = backend::get(device).make_weight_store();
    return s;
  }
  std::mutex stores_mu;
  std::map<std::string, std::shared_ptr<backend::WeightStore>> stores;
  // The LoRA set a session asked for (SessionOptions::lora), its adapters read once per (path, scale). Sets live as
  // long as the model: the backends' weight stores key repacked weights by their address, so an adapter's memory
  // must never be freed and reused by another while a store may still hold it.
  // `dtype`: what unmerged A and B run in (f32 for reference sessions, f16 otherwise).
  // rank_multiple: LoraSet::rank_multiple (8 for CUDA sessions).
  std::shared_ptr<const LoraSet> lora_set(const std::vector<LoraSpec>& specs, bool merge, DType dtype,
                                          int64_t rank_multiple = 1);
  std::mutex lora_mu;
  std::map<std::string, std::shared_ptr<const LoraAdapter>> lora_adapters;  // key: "scale:path"
  std::map<std::string, std::shared_ptr<const LoraSet>> lora_sets;          // key: the specs and merge
};

struct GraphView::Impl {
  graph::Graph graph;
  std::vector<GraphNode> nodes;
  GraphTotals totals;
};

// Public view of an internal graph.
GraphView make_graph_view(graph::Graph g);

}  // namespace tessera
