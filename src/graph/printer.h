// Renderings of a Graph for people and tools: an aligned text table, JSON (nodes, tensors, edges, totals) and
// Graphviz DOT (one cluster per transformer block).
#pragma once

#include <string>
#include <string_view>

#include "graph/graph.h"

namespace tessera::graph {

std::string to_text(const Graph& g);
std::string to_json(const Graph& g, int indent = 1);
std::string to_dot(const Graph& g);
// format: "text", "json" or "dot"; Error naming the format otherwise.
std::string format_graph(const Graph& g, std::string_view format);

// 1234567 -> "1.23 M" (SI prefixes, 3 significant digits).
std::string human_count(double v);
// 1234567, "B" -> "1.23 MB"; 12, "B" -> "12 B".
std::string human_unit(double v, std::string_view unit);

}  // namespace tessera::graph
