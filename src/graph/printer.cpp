#include "graph/printer.h"

#include <fmt/core.h>

#include <cmath>

#include "core/error.h"

namespace tessera::graph {

std::string human_count(double v) {
  static const char* kPrefix[] = {"", "K", "M", "G", "T", "P"};
  int i = 0;
  while (std::fabs(v) >= 1000.0 && i < 5) {
    v /= 1000.0;
    ++i;
  }
  if (i == 0) return fmt::format("{:.0f}", v);
  return fmt::format("{:.{}f} {}", v, std::fabs(v) >= 100 ? 0 : std::fabs(v) >= 10 ? 1 : 2, kPrefix[i]);
}

std::string human_unit(double v, std::string_view unit) {
  const std::string n = human_count(v);
  return n.find(' ') == std::string::npos ? n + " " + std::string(unit) : n + std::string(unit);
}

namespace {

std::string json_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20) out += fmt::format("\\u{:04x}", c);
        else out += static_cast<char>(c);
    }
  }
  out += '"';
  return out;
}

std::string json_shape(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    out += i ? "," : "";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

double share(uint64_t part, uint64_t whole) { return whole ? double(part) / double(whole) : 0.0; }

std::string header_line(const Graph& g) {
  return fmt::format("graph{}: T={} tokens at position P={}, {} nodes, {} tensors", g.model_name.empty() ? "" : " of " + g.model_name,
                     g.n_tokens(), g.n_past(), g.nodes().size(), g.tensors().size());
}

}  // namespace

std::string to_text(const Graph& g) {
  std::string out = header_line(g) + "\n\n";
  size_t name_w = 4;
  for (const Node& n : g.nodes()) name_w = std::max(name_w, n.name.size());
  out += fmt::format("{:>4}  {:<{}}  {:<9}  {:<13}  {:<14}  {:<5}  {:>9}  {:>9}  {}\n", "#", "name", name_w, "op", "role",
                     "shape", "dtype", "FLOPs", "bytes", "inputs");
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    const Tensor& o = g.tensor(n.output);
    std::string ins;
    for (size_t j = 0; j < n.inputs.size(); ++j) {
      const Tensor& t = g.tensor(n.inputs[j]);
      ins += fmt::format("{}{} {} {}", j ? ", " : "", t.name, shape_string(t.shape), dtype_name(t.dtype));
    }
    out += fmt::format("{:>4}  {:<{}}  {:<9}  {:<13}  {:<14}  {:<5}  {:>9}  {:>9}  {}\n", i, n.name, name_w, op_name(n.op),
                       role_name(n.role), shape_string(o.shape), dtype_name(o.dtype), human_count(double(n.flops)),
                       human_unit(double(n.bytes), "B"), ins);
    // A pass's fused node names what it computes, so a rewritten graph can be read against the builder's.
    if (!n.fusion.fused_from.empty()) {
      std::string from;
      for (const std::string& f : n.fusion.fused_from) from += (from.empty() ? "" : ", ") + f;
      out += fmt::format("{:>4}  {:<{}}  fuses {}\n", "", "", name_w, from);
    }
  }
  const Totals t = g.totals();
  out += fmt::format("\n{:<12}  {:>6}  {:>10}  {:>6}  {:>10}  {:>6}\n", "op class", "nodes", "FLOPs", "share", "bytes",
                     "share");
  for (const OpClassTotal& c : t.by_class)
    out += fmt::format("{:<12}  {:>6}  {:>10}  {:>5.1f}%  {:>10}  {:>5.1f}%\n", c.op_class, c.nodes,
                       human_count(double(c.flops)), 100 * share(c.flops, t.flops), human_unit(double(c.bytes), "B"),
                       100 * share(c.bytes, t.bytes));
  out += fmt::format("{:<12}  {:>6}  {:>10}  {:>6}  {:>10}\n", "total", t.nodes, human_count(double(t.flops)), "",
                     human_unit(double(t.bytes), "B"));
  out += fmt::format("\nmatmul share: {:.1f}% of FLOPs, {:.1f}% of bytes; weights read: {}\n",
                     100 * t.matmul_flop_share(), 100 * t.matmul_byte_share(), human_unit(double(t.weight_bytes), "B"));
  return out;
}

std::string to_json(const Graph& g, int indent) {
  const std::string nl = indent > 0 ? "\n" : "";
  const std::string ind = indent > 0 ? std::string(static_cast<size_t>(indent), ' ') : "";
  std::string out = "{" + nl;
  out += fmt::format("{}\"model\": {},{}", ind, json_escape(g.model_name), nl);
  out += fmt::format("{}\"n_tokens\": {},{}{}\"n_past\": {},{}", ind, g.n_tokens(), nl, ind, g.n_past(), nl);

  out += ind + "\"tensors\": [" + nl;
  for (size_t i = 0; i < g.tensors().size(); ++i) {
    const Tensor& t = g.tensors()[i];
    out += fmt::format("{}{}{{\"id\": {}, \"name\": {}, \"kind\": \"{}\", \"dtype\": \"{}\", \"shape\": {}, \"bytes\": {}, "
                       "\"producer\": {}, \"output\": {}}}{}{}",
                       ind, ind, i, json_escape(t.name), tensor_kind_name(t.kind), dtype_name(t.dtype),
                       json_shape(t.shape), t.nbytes(),
                       t.producer >= 0 ? json_escape(g.node(t.producer).name) : "null", t.is_output ? "true" : "false",
                       i + 1 < g.tensors().size() ? "," : "", nl);
  }
  out += ind + "]," + nl;

  out += ind + "\"nodes\": [" + nl;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    const Tensor& o = g.tensor(n.output);
    std::string ins = "[", in_shapes = "[", in_dtypes = "[";
    for (size_t j = 0; j < n.inputs.size(); ++j) {
      const Tensor& t = g.tensor(n.inputs[j]);
      const char* sep = j ? ", " : "";
      ins += sep;
      ins += json_escape(t.name);
      in_shapes += sep;
      in_shapes += json_shape(t.shape);
      in_dtypes += fmt::format("{}\"{}\"", j ? ", " : "", dtype_name(t.dtype));
    }
    // A pass's fused node lists the source nodes it computes (absent on a builder's nodes).
    std::string fused;
    for (size_t j = 0; j < n.fusion.fused_from.size(); ++j)
      fused += (j ? ", " : ", \"fused_from\": [") + json_escape(n.fusion.fused_from[j]);
    if (!fused.empty()) fused += "]";
    out += fmt::format(
        "{}{}{{\"id\": {}, \"name\": {}, \"op\": \"{}\", \"op_class\": \"{}\", \"role\": \"{}\", \"layer\": {}, "
        "\"block\": {}, \"inputs\": {}], \"input_shapes\": {}], \"input_dtypes\": {}], \"output\": {}, \"shape\": {}, "
        "\"dtype\": \"{}\", \"flops\": {}, \"bytes\": {}{}}}{}{}",
        ind, ind, i, json_escape(n.name), op_name(n.op), op_class(n.op), role_name(n.role), n.layer,
        json_escape(n.block), ins, in_shapes, in_dtypes, json_escape(o.name), json_shape(o.shape), dtype_name(o.dtype),
        n.flops, n.bytes, fused, i + 1 < g.nodes().size() ? "," : "", nl);
  }
  out += ind + "]," + nl;

  out += ind + "\"edges\": [" + nl;
  const auto edges = g.edges();
  for (size_t i = 0; i < edges.size(); ++i) {
    const Edge& e = edges[i];
    const Tensor& t = g.tensor(e.from_tensor);
    out += fmt::format("{}{}{{\"from\": {}, \"to\": {}, \"tensor\": {}, \"kind\": \"{}\"}}{}{}", ind, ind,
                       json_escape(e.from_node >= 0 ? g.node(e.from_node).name : t.name),
                       json_escape(g.node(e.to_node).name), json_escape(t.name), tensor_kind_name(t.kind),
                       i + 1 < edges.size() ? "," : "", nl);
  }
  out += ind + "]," + nl;

  const Totals t = g.totals();
  out += ind + "\"totals\": {" + nl;
  out += fmt::format("{}{}\"nodes\": {}, \"flops\": {}, \"bytes\": {}, \"weight_bytes\": {},{}", ind, ind, t.nodes, t.flops,
                     t.bytes, t.weight_bytes, nl);
  out += fmt::format("{}{}\"matmul_flops\": {}, \"matmul_bytes\": {}, \"matmul_flop_share\": {}, "
                     "\"matmul_byte_share\": {},{}",
                     ind, ind, t.matmul_flops, t.matmul_bytes, t.matmul_flop_share(), t.matmul_byte_share(), nl);
  out += ind + ind + "\"by_op_class\": [" + nl;
  for (size_t i = 0; i < t.by_class.size(); ++i) {
    const OpClassTotal& c = t.by_class[i];
    out += fmt::format("{}{}{}{{\"op_class\": \"{}\", \"nodes\": {}, \"flops\": {}, \"bytes\": {}, \"flop_share\": {}, "
                       "\"byte_share\": {}}}{}{}",
                       ind, ind, ind, c.op_class, c.nodes, c.flops, c.bytes, share(c.flops, t.flops),
                       share(c.bytes, t.bytes), i + 1 < t.by_class.size() ? "," : "", nl);
  }
  out += ind + ind + "]" + nl + ind + "}" + nl + "}" + nl;
  return out;
}

std::string to_dot(const Graph& g) {
  const auto id = [](std::string_view s) { return json_escape(s); };  // DOT quoted ids escape like JSON strings
  std::string out = "digraph tessera {\n";
  out += fmt::format("  label={};\n  labelloc=t;\n  rankdir=TB;\n  node [shape=box, fontname=\"Helvetica\", fontsize=10];\n",
                     id(header_line(g)));
  // Leaves other than weights (token ids, positions, caches) are drawn where first used, so a layer's caches sit in
  // its cluster; weights appear in their node's label.
  std::vector<bool> drawn(g.tensors().size(), false);
  int open_layer = -2;
  for (const Node& n : g.nodes()) {
    if (n.layer != open_layer) {
      if (open_layer >= 0) out += "  }\n";
      if (n.layer >= 0)
        out += fmt::format("  subgraph cluster_blk_{} {{\n    label=\"blk.{}\";\n    style=rounded;\n", n.layer, n.layer);
      open_layer = n.layer;
    }
    for (int i : n.inputs) {
      const Tensor& t = g.tensor(i);
      if (t.producer >= 0 || t.kind == TensorKind::WEIGHT || drawn[static_cast<size_t>(i)]) continue;
      drawn[static_cast<size_t>(i)] = true;
      out += fmt::format("  {}{} [shape=ellipse, label={}];\n", n.layer >= 0 ? "  " : "", id("in:" + t.name),
                         id(fmt::format("{}\n{} {}", t.name, shape_string(t.shape), dtype_name(t.dtype))));
    }
    std::string weights;
    for (int i : n.inputs) {
      const Tensor& t = g.tensor(i);
      if (t.kind == TensorKind::WEIGHT) weights += fmt::format("\n{} {} {}", t.name, shape_string(t.shape), dtype_name(t.dtype));
    }
    const Tensor& o = g.tensor(n.output);
    const char* color = is_matmul_like(n.op) ? "#cfe2ff" : n.op == Op::ATTENTION ? "#ffe5b4" : "#eeeeee";
    out += fmt::format("  {}{} [style=filled, fillcolor=\"{}\", label={}];\n", n.layer >= 0 ? "  " : "", id(n.name), color,
                       id(fmt::format("{}\n{} -> {} {}{}\n{}, {}", n.name, op_name(n.op), shape_string(o.shape),
                                      dtype_name(o.dtype), weights, human_unit(double(n.flops), "FLOP"),
                                      human_unit(double(n.bytes), "B"))));
  }
  if (open_layer >= 0) out += "  }\n";
  for (const Edge& e : g.edges()) {
    const Tensor& t = g.tensor(e.from_tensor);
    if (t.kind == TensorKind::WEIGHT) continue;
    out += fmt::format("  {} -> {};\n", e.from_node >= 0 ? id(g.node(e.from_node).name) : id("in:" + t.name),
                       id(g.node(e.to_node).name));
  }
  out += "}\n";
  return out;
}

std::string format_graph(const Graph& g, std::string_view format) {
  if (format == "text") return to_text(g);
  if (format == "json") return to_json(g);
  if (format == "dot") return to_dot(g);
  fail("unknown graph format '{}' (expected text, json or dot)", format);
}

}  // namespace tessera::graph
