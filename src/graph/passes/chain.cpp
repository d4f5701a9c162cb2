#include "graph/passes/chain.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>

#include "core/error.h"
#include "graph/passes/fuse.h"
#include "graph/passes/rewriter.h"

namespace tessera::graph {

ProductCost product_cost(int64_t m, int64_t k, int64_t n, const ChainCostModel& model) {
  ProductCost c;
  c.flops = 2 * uint64_t(m) * uint64_t(k) * uint64_t(n);
  c.bytes = static_cast<uint64_t>(double(m * k + k * n + m * n) * model.elem_bytes);
  c.seconds = std::max(double(c.flops) / model.flops_per_s, double(c.bytes) / model.bytes_per_s);
  return c;
}

namespace {

void add(ProductCost& a, const ProductCost& b) {
  a.flops += b.flops;
  a.bytes += b.bytes;
  a.seconds += b.seconds;
}

void check_chain(const std::vector<int64_t>& dims, const std::vector<std::string>& names) {
  TESSERA_CHECK(dims.size() >= 2 && names.size() == dims.size() - 1,
                "a matrix chain of {} dims needs {} operand names (got {})", dims.size(),
                dims.empty() ? 0 : dims.size() - 1, names.size());
  for (int64_t d : dims) TESSERA_CHECK(d > 0, "a matrix chain's dimensions must be positive (got {})", d);
}

std::string wrap(const std::string& s, bool single) { return single ? s : "(" + s + ")"; }

// Whether cost a beats b: less modelled time, and where the times tie (to 1e-9 relative: the same bytes summed in
// another order) fewer FLOPs, then fewer bytes. Without the tie-break a chain whose every product is byte-bound would
// take whichever order the DP tried first (a weight-only fold doing 4x the FLOPs in the same modelled time).
bool cheaper(const ProductCost& a, const ProductCost& b) {
  if (std::isinf(a.seconds) || std::isinf(b.seconds)) return a.seconds < b.seconds;  // the DP's "none yet"
  const double tol = 1e-9 * std::max(a.seconds, b.seconds);
  if (a.seconds < b.seconds - tol) return true;
  if (b.seconds < a.seconds - tol) return false;
  if (a.flops != b.flops) return a.flops < b.flops;
  return a.bytes < b.bytes;
}

// Walks the tree `splits` (ChainOrder::splits, preorder) over matrices i..j from splits[*pos]: f(i, s, j) for each
// product, in preorder. Error for splits that are not a tree over i..j.
void walk_tree(const std::vector<size_t>& splits, size_t i, size_t j, size_t* pos,
               const std::function<void(size_t, size_t, size_t)>& f) {
  if (i == j) return;
  TESSERA_CHECK(*pos < splits.size() && splits[*pos] >= i && splits[*pos] < j,
                "a chain order's splits are not a tree over matrices {}..{}", i, j);
  const size_t s = splits[(*pos)++];
  f(i, s, j);
  walk_tree(splits, i, s, pos, f);
  walk_tree(splits, s + 1, j, pos, f);
}

// Each product's split by its matrices (i, j), for the tree over n matrices.
std::map<std::pair<size_t, size_t>, size_t> split_table(const std::vector<size_t>& splits, size_t n) {
  std::map<std::pair<size_t, size_t>, size_t> t;
  size_t pos = 0;
  walk_tree(splits, 0, n - 1, &pos, [&](size_t i, size_t s, size_t j) { t[{i, j}] = s; });
  TESSERA_CHECK(pos == splits.size(), "a chain order of {} matrices has {} splits", n, splits.size());
  return t;
}

// The tree's expression over the operand names: "(x·A)·B".
std::string tree_expr(const std::vector<size_t>& splits, const std::vector<std::string>& names) {
  const auto split = split_table(splits, names.size());
  const std::function<std::string(size_t, size_t)> expr = [&](size_t i, size_t j) -> std::string {
    if (i == j) return names[i];
    const size_t s = split.at({i, j});
    return wrap(expr(i, s), s == i) + "·" + wrap(expr(s + 1, j), s + 1 == j);
  };
  return expr(0, names.size() - 1);
}

}  // namespace

ChainOrder optimal_chain_order(const std::vector<int64_t>& dims, const std::vector<std::string>& names,
                               const ChainCostModel& model) {
  check_chain(dims, names);
  const size_t n = names.size();
  // cost[i][j]: the cheapest product of matrices i..j; split[i][j]: its last multiplication's split point.
  std::vector<std::vector<ProductCost>> cost(n, std::vector<ProductCost>(n));
  std::vector<std::vector<size_t>> split(n, std::vector<size_t>(n, 0));
  for (size_t len = 2; len <= n; ++len)
    for (size_t i = 0; i + len <= n; ++i) {
      const size_t j = i + len - 1;
      cost[i][j].seconds = std::numeric_limits<double>::infinity();
      for (size_t s = i; s < j; ++s) {
        ProductCost c = cost[i][s];
        add(c, cost[s + 1][j]);
        add(c, product_cost(dims[i], dims[s + 1], dims[j + 1], model));
        if (cheaper(c, cost[i][j])) {
          cost[i][j] = c;
          split[i][j] = s;
        }
      }
    }
  ChainOrder o{"", cost[0][n - 1], {}};
  const std::function<void(size_t, size_t)> tree = [&](size_t i, size_t j) {
    if (i == j) return;
    o.splits.push_back(split[i][j]);
    tree(i, split[i][j]);
    tree(split[i][j] + 1, j);
  };
  tree(0, n - 1);
  o.expr = tree_expr(o.splits, names);
  return o;
}

std::vector<ChainOrder> all_chain_orders(const std::vector<int64_t>& dims, const std::vector<std::string>& names,
                                         const ChainCostModel& model) {
  check_chain(dims, names);
  TESSERA_CHECK(names.size() <= 10, "enumerating the orders of a chain of {} matrices is too many (at most 10)",
                names.size());
  const std::function<std::vector<ChainOrder>(size_t, size_t)> orders = [&](size_t i,
                                                                            size_t j) -> std::vector<ChainOrder> {
    if (i == j) return {{names[i], {}, {}}};
    std::vector<ChainOrder> out;
    for (size_t s = i; s < j; ++s)
      for (const ChainOrder& l : orders(i, s))
        for (const ChainOrder& r : orders(s + 1, j)) {
          ChainOrder o{wrap(l.expr, s == i) + "·" + wrap(r.expr, s + 1 == j), l.cost, {s}};
          o.splits.insert(o.splits.end(), l.splits.begin(), l.splits.end());
          o.splits.insert(o.splits.end(), r.splits.begin(), r.splits.end());
          add(o.cost, r.cost);
          add(o.cost, product_cost(dims[i], dims[s + 1], dims[j + 1], model));
          out.push_back(std::move(o));
        }
    return out;
  };
  std::vector<ChainOrder> all = orders(0, names.size() - 1);
  std::stable_sort(all.begin(), all.end(),
                   [](const ChainOrder& a, const ChainOrder& b) { return cheaper(a.cost, b.cost); });
  return all;
}

ChainOrder left_to_right_order(const std::vector<int64_t>& dims, const std::vector<std::string>& names,
                               const ChainCostModel& model) {
  check_chain(dims, names);
  ChainOrder o{names[0], {}, {}};
  for (size_t i = 1; i < names.size(); ++i) {
    o.expr = wrap(o.expr, i == 1) + "·" + names[i];
    add(o.cost, product_cost(dims[0], dims[i], dims[i + 1], model));
    o.splits.insert(o.splits.begin(), i - 1);
  }
  return o;
}

std::vector<Chain> find_chains(const Graph& g, const ChainCostModel& model) {
  const std::vector<Node>& nodes = g.nodes();
  std::vector<std::vector<int>> consumers(g.tensors().size());
  for (size_t i = 0; i < nodes.size(); ++i)
    for (int t : nodes[i].inputs) consumers[static_cast<size_t>(t)].push_back(static_cast<int>(i));
  // A plain matmul by a weight (2 inputs, no fusion): the links a chain is made of.
  const auto link = [&](int id) {
    const Node& n = nodes[static_cast<size_t>(id)];
    return n.op == Op::MATMUL && n.inputs.size() == 2 && n.fusion.empty() &&
           g.tensor(n.inputs[1]).kind == TensorKind::WEIGHT && g.tensor(n.inputs[1]).shape.size() == 2;
  };
  // The next link of a chain: the only consumer of `id`'s output, when it is a link.
  const auto next = [&](int id) {
    const auto& c = consumers[static_cast<size_t>(nodes[static_cast<size_t>(id)].output)];
    return c.size() == 1 && link(c[0]) ? c[0] : -1;
  };
  std::vector<Chain> out;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const int id = static_cast<int>(i);
    if (!link(id) || next(id) < 0) continue;
    const int producer = g.tensor(nodes[i].inputs[0]).producer;
    if (producer >= 0 && link(producer) && next(producer) == id) continue;  // not the chain's first link
    Chain c;
    c.input = nodes[i].inputs[0];
    const Tensor& x = g.tensor(c.input);
    c.dims = {x.shape.front(), x.shape.back()};
    c.names = {"x"};
    for (int n = id; n >= 0; n = next(n)) {
      c.nodes.push_back(n);
      const Tensor& w = g.tensor(nodes[static_cast<size_t>(n)].inputs[1]);
      c.dims.push_back(w.shape[0]);
      c.names.push_back(w.name + "ᵀ");
    }
    // LoRA: the chain's result is added to the base matmul's output, which reads the same x.
    const auto& last = consumers[static_cast<size_t>(nodes[static_cast<size_t>(c.nodes.back())].output)];
    if (last.size() == 1 && nodes[static_cast<size_t>(last[0])].op == Op::ADD)
      for (int t : nodes[static_cast<size_t>(last[0])].inputs) {
        const int p = g.tensor(t).producer;
        if (p >= 0 && p != c.nodes.back() && nodes[static_cast<size_t>(p)].op == Op::MATMUL &&
            nodes[static_cast<size_t>(p)].inputs[0] == c.input)
          c.beside = p;
      }
    c.built = left_to_right_order(c.dims, c.names, model);
    c.best = optimal_chain_order(c.dims, c.names, model);
    if (c.names.size() <= 6) c.orders = all_chain_orders(c.dims, c.names, model);
    out.push_back(std::move(c));
  }
  return out;
}

Graph apply_chain_orders(const Graph& g, const ChainCostModel& model, const WeightValues& values) {
  TESSERA_CHECK(values != nullptr, "the matmul-chain rewrite needs a reader of weight values");
  Graph r = g;  // gains the folded constants; its nodes are rewritten at the end
  std::vector<bool> dropped(g.nodes().size(), false);
  std::map<int, std::pair<Node, Tensor>> folded;  // at a chain factor's last node: the matmul by its constant
  for (const Chain& c : find_chains(g, model)) {
    if (c.best.splits == c.built.splits) continue;
    const size_t n = c.names.size();  // matrix 0 is x, matrix m >= 1 the weight of node c.nodes[m - 1]
    const auto split = split_table(c.best.splits, n);
    const auto node_of = [&](size_t m) { return c.nodes[m - 1]; };
    const auto weight_of = [&](size_t m) -> const Tensor& { return g.tensor(g.node(node_of(m)).inputs[1]); };
    // The tree's left spine x·F1·F2·...: factor Fi is matrices [a, b].
    std::vector<std::pair<size_t, size_t>> factors;
    for (size_t j = n - 1; j > 0;) {
      const size_t s = split.at({0, j});
      factors.emplace_back(s + 1, j);
      j = s;
    }
    std::reverse(factors.begin(), factors.end());
    // The values of every weight to fold; none (the chain stays as built) where one cannot be read or an intermediate
    // to drop is a graph output.
    std::map<size_t, std::vector<float>> leaf;
    bool ok = true;
    for (const auto& [a, b] : factors)
      for (size_t m = a; a < b && m <= b && ok; ++m) {
        const Tensor& w = weight_of(m);
        const Tensor& y = g.tensor(g.node(node_of(m)).output);
        ok = w.data != nullptr && (m == b || (!y.is_output && y.io == IoRole::NONE));
        if (!ok) break;
        std::vector<float> v = values(w);
        ok = static_cast<int64_t>(v.size()) == w.numel();
        leaf[m] = std::move(v);
      }
    if (!ok) continue;
    // The product of matrices a..b stored as a MATMUL weight, (M(a)·...·M(b))ᵀ = W(b)·...·W(a) [d(b+1), d(a)],
    // multiplied in the order the DP chose and accumulated in double (it runs once per compile).
    const std::function<std::vector<double>(size_t, size_t)> fold = [&](size_t a, size_t b) -> std::vector<double> {
      if (a == b) return {leaf.at(a).begin(), leaf.at(a).end()};
      const size_t s = split.at({a, b});
      const std::vector<double> lw = fold(a, s), rw = fold(s + 1, b);  // [d(s+1), d(a)], [d(b+1), d(s+1)]
      const size_t rows = static_cast<size_t>(c.dims[b + 1]), mid = static_cast<size_t>(c.dims[s + 1]),
                   cols = static_cast<size_t>(c.dims[a]);
      std::vector<double> p(rows * cols, 0.0);
      for (size_t i = 0; i < rows; ++i)
        for (size_t k = 0; k < mid; ++k) {
          const double v = rw[i * mid + k];
          for (size_t j = 0; j < cols; ++j) p[i * cols + j] += v * lw[k * cols + j];
        }
      return p;
    };
    for (const auto& [a, b] : factors) {
      if (a == b) continue;  // one weight: its node stays, reading the previous factor's output (same tensor)
      const Node& first = g.node(node_of(a));
      const Node& last = g.node(node_of(b));
      Node f;
      for (size_t m = a; m <= b; ++m) f.fusion.fused_from.push_back(g.node(node_of(m)).name);
      f.name = joined_name(f.fusion.fused_from);
      f.op = Op::MATMUL;
      f.role = first.role;
      f.layer = first.layer;
      f.block = first.block;
      f.source = first.source;
      const std::vector<double> p = fold(a, b);
      const int w =
          r.add_constant(f.name + ".folded", std::vector<float>(p.begin(), p.end()), {c.dims[b + 1], c.dims[a]});
      f.inputs = {first.inputs[0], w};
      Tensor out = r.tensor(last.output);
      op_info(Op::MATMUL).infer(r, f, out);  // shape [T, d(b+1)], the one `last` wrote; FLOPs and bytes
      TESSERA_CHECK(out.shape == r.tensor(last.output).shape, "chain rewrite: '{}' changed its output's shape", f.name);
      if (!out.is_output) out.name = f.name;  // a graph output keeps its name: runtimes read it by name
      folded[node_of(b)] = {std::move(f), std::move(out)};
      for (size_t m = a; m < b; ++m) dropped[static_cast<size_t>(node_of(m))] = true;
    }
  }
  if (folded.empty()) return g;
  // The chains' dropped nodes and their outputs go; a factor's last node is replaced by its matmul, whose output the
  // chain's readers (a LoRA add) read in its stead (passes/rewriter.h renumbers).
  Rewriter rw(r);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const int id = static_cast<int>(i);
    if (dropped[i]) {
      rw.skip(id);
    } else if (auto it = folded.find(id); it != folded.end()) {
      rw.replace(g.node(id).output, rw.add(std::move(it->second.first), std::move(it->second.second)));
    } else {
      rw.keep(id);
    }
  }
  return rw.finish();
}

std::string format_chains(const Graph& g, const ChainCostModel& model) {
  const std::vector<Chain> chains = find_chains(g, model);
  std::string s = fmt::format(
      "{}: {} matmul chains at T = {} (cost: max(FLOPs / {:.0f} GFLOP/s, bytes / {:.0f} GB/s) per product, "
      "summed)\n",
      g.model_name, chains.size(), g.n_tokens(), model.flops_per_s / 1e9, model.bytes_per_s / 1e9);
  int differs = 0;
  for (const Chain& c : chains) {
    std::string dims;
    for (size_t i = 0; i < c.dims.size(); ++i) dims += (i ? " x " : "") + std::to_string(c.dims[i]);
    s += fmt::format("\nchain {} (dims {}){}\n", g.node(c.nodes.front()).name, dims,
                     c.beside >= 0 ? ", added to " + g.node(c.beside).name : "");
    for (const ChainOrder& o : c.orders)
      s += fmt::format("  {:<60} {:>12} FLOPs {:>10} bytes {:>9.3f} us{}\n", o.expr, o.cost.flops, o.cost.bytes,
                       o.cost.seconds * 1e6, o.expr == c.best.expr ? "  <- chosen" : "");
    const bool same = c.best.expr == c.built.expr;
    differs += same ? 0 : 1;
    s += fmt::format("  choice: {}{}\n", c.best.expr,
                     same ? " (the graph's order)"
                          : " (differs from the graph's left-to-right order; rewritten: weight-only products folded "
                            "into constants at compile, by the CPU's fast mode, and by CUDA where its own ceilings "
                            "choose this order too)");
  }
  s += fmt::format(
      "\n{} of {} chains run in their optimal order{}\n", chains.size() - differs, chains.size(),
      differs ? fmt::format(" as built; the CPU's fast mode rewrites the other {} into theirs, CUDA those its own "
                            "ceilings choose",
                            differs)
              : "");
  return s;
}

}  // namespace tessera::graph
