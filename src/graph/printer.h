// Renderings of a Graph for people and tools: an aligned text table, JSON (nodes, tensors, edges, totals), Graphviz
// DOT (one cluster per transformer block), and the model views: SVG (modules nested, repeated layers collapsed, laid
// out by Graphviz) and one self-contained HTML page (pan, zoom, collapsible layers, node details), both optionally
// coloured by measured time per node.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "graph/graph.h"

namespace tessera::graph {

std::string to_text(const Graph& g);
std::string to_json(const Graph& g, int indent = 1);
std::string to_dot(const Graph& g);
// format: "text", "json" or "dot"; Error naming the format otherwise.
std::string format_graph(const Graph& g, std::string_view format);

// What the model views (SVG, HTML) show beyond the graph itself.
struct RenderOptions {
  // Measured time per node in ms (indexed like g.nodes(); a fused node carries its source nodes' time); empty: no
  // profile overlay.
  std::vector<double> node_ms;
  // Fraction of this machine's roofline each node reached (same index); empty or negative: limits not measured.
  std::vector<double> node_roof;
  double wall_ms = 0;   // the measured step's wall time: the base of each node's % of wall
  std::string profile;  // one line saying what was measured ("decode: mean of 16 steps, cpu, 2 threads")
  std::string note;     // one line under the title ("as the cuda backend's passes rewrite it")
  // SVG: the layers drawn in full (inclusive); every other layer is one box with its totals. Default: layer 0.
  int full_first = 0, full_last = 0;
  bool collapse_others = false;  // HTML: open with the other layers collapsed (else every layer open)
};

// Graphviz DOT of the model view: model -> layer -> attention / ffn -> ops as nested clusters, tensor shapes on the
// edges, op, dtype, FLOPs, bytes, arithmetic intensity and what a fused node fused on the nodes.
std::string to_model_dot(const Graph& g, const RenderOptions& o = {});
// That DOT laid out as SVG: by libgvc where Tessera was built with it, else by the `dot` program on PATH; Error
// saying what to install when neither is there.
std::string to_svg(const Graph& g, const RenderOptions& o = {});
// Whether to_svg lays out in-process (libgvc) rather than through the `dot` program.
bool svg_uses_libgvc();
// One self-contained HTML page (inline JS and CSS, no network) holding every node's data; the page lays it out.
std::string to_html(const Graph& g, const RenderOptions& o = {});

// 1234567 -> "1.23 M" (SI prefixes, 3 significant digits).
std::string human_count(double v);
// 1234567, "B" -> "1.23 MB"; 12, "B" -> "12 B".
std::string human_unit(double v, std::string_view unit);

}  // namespace tessera::graph
