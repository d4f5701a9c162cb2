// What the model views (printer_svg.cpp, printer_html.cpp) share: the module a node belongs to, its weights and
// arithmetic intensity, and the colour of its measured time.
#pragma once

#include <fmt/core.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "graph/graph.h"
#include "graph/printer.h"

namespace tessera::graph::view {

// A JSON string literal (also a DOT quoted id). '<' is escaped too, so the text can sit inside an HTML <script>.
inline std::string quote(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      case '<':
        out += "\\u003c";
        break;
      default:
        if (c < 0x20)
          out += fmt::format("\\u{:04x}", c);
        else
          out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// FLOPs per byte moved; 0 for a node that moves nothing.
inline double intensity(const Node& n) { return n.bytes ? double(n.flops) / double(n.bytes) : 0.0; }

// "attn", "ffn", or the node's block outside the layers ("embd", "output").
inline std::string module_of(const Node& n) { return n.block.empty() ? std::string("other") : n.block; }

// The weights a node reads: "blk.0.attn_q.weight [576, 576] q4_1".
inline std::vector<std::string> weight_lines(const Graph& g, const Node& n) {
  std::vector<std::string> out;
  for (int i : n.inputs) {
    const Tensor& t = g.tensor(i);
    if (t.kind == TensorKind::WEIGHT && t.shape.size() >= 2)
      out.push_back(fmt::format("{} {} {}", t.name, shape_string(t.shape), dtype_name(t.dtype)));
  }
  return out;
}

inline bool has_profile(const RenderOptions& o, const Graph& g) { return o.node_ms.size() == g.nodes().size(); }
inline double node_ms(const RenderOptions& o, size_t i) { return i < o.node_ms.size() ? o.node_ms[i] : 0.0; }
inline double node_roof(const RenderOptions& o, size_t i) { return i < o.node_roof.size() ? o.node_roof[i] : -1.0; }

// White through orange to dark red as a node's time approaches the slowest node's: the eye finds the hot spots.
inline std::string heat_colour(double fraction) {
  const double t = std::clamp(fraction, 0.0, 1.0);
  struct C {
    double r, g, b;
  };
  const C stops[] = {{255, 247, 236}, {253, 174, 97}, {215, 48, 39}, {165, 0, 38}};
  const double x = t * 3.0;
  const int k = std::min(2, static_cast<int>(x));
  const double f = x - k;
  const C& a = stops[k];
  const C& b = stops[k + 1];
  return fmt::format("#{:02x}{:02x}{:02x}", int(a.r + (b.r - a.r) * f), int(a.g + (b.g - a.g) * f),
                     int(a.b + (b.b - a.b) * f));
}

// Fill of a node without a profile, by op class.
inline const char* class_colour(const Node& n) {
  if (is_matmul_like(n.op)) return "#cfe2ff";
  if (n.op == Op::ATTENTION) return "#ffe5b4";
  if (n.op == Op::RMSNORM) return "#d8f3dc";
  return "#eeeeee";
}

// "0.412 ms, 3.1% of wall, 54% of roof" (the parts that were measured).
inline std::string time_line(const RenderOptions& o, size_t i) {
  std::string s = fmt::format("{:.3f} ms", node_ms(o, i));
  if (o.wall_ms > 0) s += fmt::format(", {:.1f}% of wall", 100.0 * node_ms(o, i) / o.wall_ms);
  if (node_roof(o, i) >= 0) s += fmt::format(", {:.0f}% of roof", 100.0 * node_roof(o, i));
  return s;
}

}  // namespace tessera::graph::view
