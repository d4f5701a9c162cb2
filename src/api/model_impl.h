// What a loaded tessera::Model holds (shared by its copies and by its sessions).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "backends/backend.h"
#include "graph/graph.h"
#include "models/model_weights.h"
#include "tessera/graph.h"
#include "tessera/model.h"

namespace tessera {

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
};

struct GraphView::Impl {
  graph::Graph graph;
  std::vector<GraphNode> nodes;
  GraphTotals totals;
};

// Public view of an internal graph.
GraphView make_graph_view(graph::Graph g);

}  // namespace tessera
