// What a loaded tessera::Model holds (shared by its copies and by its sessions).
#pragma once

#include <memory>
#include <optional>

#include "backends/cpu/backend.h"
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
  // Repacked matmul weights, made once per model and shared by every session in fast mode.
  std::shared_ptr<cpu::WeightCache> weight_cache = std::make_shared<cpu::WeightCache>();
};

struct GraphView::Impl {
  graph::Graph graph;
  std::vector<GraphNode> nodes;
  GraphTotals totals;
};

// Public view of an internal graph.
GraphView make_graph_view(graph::Graph g);

}  // namespace tessera
