// The model view as Graphviz DOT and SVG. Graphviz lays a graph of a few hundred boxes with edge labels out in
// seconds, but a 32-layer model's 550 nodes come out as one column too long to read; so layers outside the range asked
// for are one box each, with their totals, and the layers drawn in full are nested clusters (layer -> attention /
// ffn -> ops).
#include <fmt/core.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"
#include "graph/printer.h"
#include "graph/printer_model.h"

#ifdef TESSERA_HAVE_GVC
#include <graphviz/gvc.h>
#endif

namespace tessera::graph {

namespace {

using view::quote;

struct LayerTotals {
  int nodes = 0;
  uint64_t flops = 0, bytes = 0;
  double ms = 0;
};

std::string node_label(const Graph& g, const Node& n, size_t i, const RenderOptions& o) {
  const Tensor& out = g.tensor(n.output);
  std::string s = fmt::format("{}\n{} -> {} {}", n.name, op_name(n.op), shape_string(out.shape), dtype_name(out.dtype));
  for (const std::string& w : view::weight_lines(g, n)) {
    s += "\nW ";
    s += w;
  }
  s += fmt::format("\n{}, {}, {:.2f} FLOP/B", human_unit(double(n.flops), "FLOP"), human_unit(double(n.bytes), "B"),
                   view::intensity(n));
  if (!n.fusion.fused_from.empty()) {
    // Three names a line keeps a fused node's box about as wide as its neighbours.
    s += "\nfuses:";
    for (size_t k = 0; k < n.fusion.fused_from.size(); ++k) {
      s += k % 3 == 0 ? "\n  " : ", ";
      s += n.fusion.fused_from[k];
    }
  }
  if (view::has_profile(o, g)) {
    s += '\n';
    s += view::time_line(o, i);
  }
  return s;
}

std::string fill_of(const Graph& g, const Node& n, size_t i, const RenderOptions& o, double max_ms) {
  if (!view::has_profile(o, g)) return view::class_colour(n);
  return view::heat_colour(max_ms > 0 ? view::node_ms(o, i) / max_ms : 0.0);
}

}  // namespace

std::string to_model_dot(const Graph& g, const RenderOptions& o) {
  const bool prof = view::has_profile(o, g);
  double max_ms = 0;
  for (size_t i = 0; prof && i < g.nodes().size(); ++i) max_ms = std::max(max_ms, view::node_ms(o, i));
  const auto full = [&](int layer) { return layer < 0 || (layer >= o.full_first && layer <= o.full_last); };

  std::map<int, LayerTotals> layers;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (n.layer < 0) continue;
    LayerTotals& t = layers[n.layer];
    t.nodes++;
    t.flops += n.flops;
    t.bytes += n.bytes;
    t.ms += view::node_ms(o, i);
  }
  double max_layer_ms = 0;
  for (const auto& [l, t] : layers) max_layer_ms = std::max(max_layer_ms, t.ms);

  std::string title = "model " + (g.model_name.empty() ? std::string("graph") : g.model_name) +
                      fmt::format(": T={} tokens at P={}, {} nodes", g.n_tokens(), g.n_past(), g.nodes().size());
  for (const std::string* line : {&o.note, &o.profile})
    if (!line->empty()) {
      title += '\n';
      title += *line;
    }
  std::string out = "digraph tessera {\n";
  out += fmt::format(
      "  label={};\n  labelloc=t;\n  fontname=\"Helvetica\";\n  rankdir=TB;\n  newrank=true;\n"
      "  node [shape=box, style=\"rounded,filled\", fontname=\"Helvetica\", fontsize=9];\n"
      "  edge [fontname=\"Helvetica\", fontsize=8, color=\"#555555\"];\n",
      quote(title));
  out += "  subgraph cluster_model {\n    label=\"model\";\n    style=dashed;\n";

  // Node ids in DOT: the node's name, or its collapsed layer's box.
  std::vector<std::string> dot_id(g.nodes().size());
  std::vector<bool> drawn_leaf(g.tensors().size(), false);
  int open_layer = -2;
  std::string open_block;
  const auto close_block = [&] {
    if (!open_block.empty()) out += "      }\n";
    open_block.clear();
  };
  const auto close_layer = [&] {
    close_block();
    if (open_layer >= 0 && full(open_layer)) out += "    }\n";
    open_layer = -2;
  };
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (n.layer != open_layer) {
      close_layer();
      open_layer = n.layer;
      if (n.layer >= 0 && full(n.layer))
        out +=
            fmt::format("    subgraph cluster_layer_{} {{\n      label=\"blk.{} (layer {})\";\n      style=rounded;\n",
                        n.layer, n.layer, n.layer);
      if (n.layer >= 0 && !full(n.layer)) {
        const LayerTotals& t = layers[n.layer];
        std::string label = fmt::format("blk.{}: {} ops (collapsed)\n{}, {}", n.layer, t.nodes,
                                        human_unit(double(t.flops), "FLOP"), human_unit(double(t.bytes), "B"));
        std::string fill = "#f4f4f4";
        if (prof) {
          label += fmt::format("\n{:.3f} ms", t.ms);
          if (o.wall_ms > 0) label += fmt::format(", {:.1f}% of wall", 100.0 * t.ms / o.wall_ms);
          fill = view::heat_colour(max_layer_ms > 0 ? t.ms / max_layer_ms * 0.6 : 0.0);
        }
        out += fmt::format("    {} [shape=box3d, style=filled, fillcolor=\"{}\", fontsize=10, label={}];\n",
                           quote(fmt::format("layer:{}", n.layer)), fill, quote(label));
      }
    }
    if (n.layer >= 0 && !full(n.layer)) {
      dot_id[i] = quote(fmt::format("layer:{}", n.layer));
      continue;
    }
    dot_id[i] = quote(n.name);
    const bool in_layer = n.layer >= 0;
    const std::string block = view::module_of(n);
    if (in_layer && block != open_block) {
      close_block();
      open_block = block;
      out +=
          fmt::format("      subgraph cluster_layer_{}_{} {{\n        label={};\n        style=\"rounded,dashed\";\n",
                      n.layer, block, quote(block == "attn" ? "attention" : block));
    }
    const std::string ind = in_layer ? "        " : "    ";
    // Leaves other than weights (token ids, positions, caches) are drawn where first used, so a layer's caches sit
    // in its cluster; weights are listed in their node's label.
    for (int t : n.inputs) {
      const Tensor& x = g.tensor(t);
      if (x.producer >= 0 || x.kind == TensorKind::WEIGHT || drawn_leaf[static_cast<size_t>(t)]) continue;
      drawn_leaf[static_cast<size_t>(t)] = true;
      out += fmt::format("{}{} [shape=ellipse, style=filled, fillcolor=white, label={}];\n", ind, quote("in:" + x.name),
                         quote(fmt::format("{}\n{} {}", x.name, shape_string(x.shape), dtype_name(x.dtype))));
    }
    out += fmt::format("{}{} [fillcolor=\"{}\"{}, label={}];\n", ind, dot_id[i], fill_of(g, n, i, o, max_ms),
                       n.fusion.fused_from.empty() ? "" : ", penwidth=2, color=\"#6a3d9a\"",
                       quote(node_label(g, n, i, o)));
  }
  close_layer();
  out += "  }\n";

  // Edges carry their tensor's shape; an edge inside one collapsed layer disappears, and edges between the same two
  // boxes are drawn once.
  std::set<std::pair<std::string, std::string>> seen;
  for (const Edge& e : g.edges()) {
    const Tensor& t = g.tensor(e.from_tensor);
    if (t.kind == TensorKind::WEIGHT) continue;
    const std::string to = dot_id[static_cast<size_t>(e.to_node)];
    std::string from;
    if (e.from_node >= 0) {
      from = dot_id[static_cast<size_t>(e.from_node)];
    } else {
      // A leaf drawn in a full layer (positions) would send a long line to every collapsed layer: those stay inside.
      if (!drawn_leaf[static_cast<size_t>(e.from_tensor)] || to.rfind("\"layer:", 0) == 0) continue;
      from = quote("in:" + t.name);
    }
    if (from == to || !seen.insert({from, to}).second) continue;
    out += fmt::format("  {} -> {} [label={}];\n", from, to,
                       quote(fmt::format("{} {}", shape_string(t.shape), dtype_name(t.dtype))));
  }
  out += "}\n";
  return out;
}

bool svg_uses_libgvc() {
#ifdef TESSERA_HAVE_GVC
  return true;
#else
  return false;
#endif
}

namespace {

#ifdef TESSERA_HAVE_GVC
std::string layout_libgvc(const std::string& dot) {
  GVC_t* gvc = gvContext();
  TESSERA_CHECK(gvc != nullptr, "Graphviz (libgvc) could not start");
  Agraph_t* ag = agmemread(dot.c_str());
  if (ag == nullptr) {
    gvFreeContext(gvc);
    fail("Graphviz (libgvc) could not read the graph's DOT");
  }
  std::string svg;
  bool ok = gvLayout(gvc, ag, "dot") == 0;
  if (ok) {
    char* buf = nullptr;
    unsigned int len = 0;
    ok = gvRenderData(gvc, ag, "svg", &buf, &len) == 0 && buf != nullptr;
    if (ok) svg.assign(buf, len);
    if (buf != nullptr) gvFreeRenderData(buf);
    gvFreeLayout(gvc, ag);
  }
  agclose(ag);
  gvFreeContext(gvc);
  TESSERA_CHECK(ok, "Graphviz (libgvc) could not lay the graph out as SVG (are its plugins configured? run dot -c)");
  return svg;
}
#endif

[[maybe_unused]] std::string layout_dot_program(const std::string& dot) {
  if (std::system("command -v dot >/dev/null 2>&1") != 0)
    fail(
        "SVG output needs Graphviz: install the Debian package libgraphviz-dev (and reconfigure) or graphviz (the "
        "dot program)");
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path();
  const std::string stem = fmt::format("tessera_graph_{}", static_cast<long>(getpid()));
  const fs::path in = dir / (stem + ".dot"), out = dir / (stem + ".svg");
  {
    std::ofstream f(in, std::ios::binary);
    TESSERA_CHECK(f && f.write(dot.data(), static_cast<std::streamsize>(dot.size())), "{}: cannot write the DOT file",
                  in.string());
  }
  const int rc = std::system(fmt::format("dot -Tsvg '{}' -o '{}'", in.string(), out.string()).c_str());
  std::ifstream f(out, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  std::error_code ec;
  fs::remove(in, ec);
  fs::remove(out, ec);
  TESSERA_CHECK(rc == 0 && !ss.str().empty(), "Graphviz's dot program failed to lay the graph out (exit status {})",
                rc);
  return ss.str();
}

}  // namespace

std::string to_svg(const Graph& g, const RenderOptions& o) {
  const std::string dot = to_model_dot(g, o);
#ifdef TESSERA_HAVE_GVC
  return layout_libgvc(dot);
#else
  return layout_dot_program(dot);
#endif
}

}  // namespace tessera::graph
