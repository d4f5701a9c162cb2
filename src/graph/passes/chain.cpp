#include "graph/passes/chain.h"

#include <fmt/core.h>

#include <algorithm>
#include <functional>
#include <limits>

#include "core/error.h"

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
        if (c.seconds < cost[i][j].seconds) {
          cost[i][j] = c;
          split[i][j] = s;
        }
      }
    }
  const std::function<std::string(size_t, size_t)> expr = [&](size_t i, size_t j) -> std::string {
    if (i == j) return names[i];
    const size_t s = split[i][j];
    return wrap(expr(i, s), s == i) + "·" + wrap(expr(s + 1, j), s + 1 == j);
  };
  return {expr(0, n - 1), cost[0][n - 1]};
}

std::vector<ChainOrder> all_chain_orders(const std::vector<int64_t>& dims, const std::vector<std::string>& names,
                                         const ChainCostModel& model) {
  check_chain(dims, names);
  TESSERA_CHECK(names.size() <= 10, "enumerating the orders of a chain of {} matrices is too many (at most 10)",
                names.size());
  const std::function<std::vector<ChainOrder>(size_t, size_t)> orders = [&](size_t i,
                                                                            size_t j) -> std::vector<ChainOrder> {
    if (i == j) return {{names[i], {}}};
    std::vector<ChainOrder> out;
    for (size_t s = i; s < j; ++s)
      for (const ChainOrder& l : orders(i, s))
        for (const ChainOrder& r : orders(s + 1, j)) {
          ChainOrder o{wrap(l.expr, s == i) + "·" + wrap(r.expr, s + 1 == j), l.cost};
          add(o.cost, r.cost);
          add(o.cost, product_cost(dims[i], dims[s + 1], dims[j + 1], model));
          out.push_back(std::move(o));
        }
    return out;
  };
  std::vector<ChainOrder> all = orders(0, names.size() - 1);
  std::stable_sort(all.begin(), all.end(),
                   [](const ChainOrder& a, const ChainOrder& b) { return a.cost.seconds < b.cost.seconds; });
  return all;
}

ChainOrder left_to_right_order(const std::vector<int64_t>& dims, const std::vector<std::string>& names,
                               const ChainCostModel& model) {
  check_chain(dims, names);
  ChainOrder o{names[0], {}};
  for (size_t i = 1; i < names.size(); ++i) {
    o.expr = wrap(o.expr, i == 1) + "·" + names[i];
    add(o.cost, product_cost(dims[0], dims[i], dims[i + 1], model));
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
                          : " (differs from the graph's left-to-right order, which the graph's ops alone express)");
  }
  s += fmt::format("\n{} of {} chains run in their optimal order\n", chains.size() - differs, chains.size());
  return s;
}

}  // namespace tessera::graph
