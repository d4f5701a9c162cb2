// The memory planner (memory_plan.h).
#include "graph/passes/memory_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"

namespace tessera::graph {

MemoryPlan plan_memory(const Graph& g, const MemoryPlanOptions& options, const std::vector<ExtraBuffer>& extras) {
  const uint64_t align = std::max<uint64_t>(options.alignment, 1);
  const auto align_up = [&](uint64_t v) { return (v + align - 1) / align * align; };
  const size_t nt = g.tensors().size(), nn = g.nodes().size();
  MemoryPlan mp;
  mp.offsets.assign(nt, -1);
  mp.in_place_input.assign(nn, -1);
  mp.last_use.assign(nt, -1);
  mp.extra_offsets.assign(extras.size(), -1);
  for (const ExtraBuffer& e : extras)
    TESSERA_CHECK(e.first_node >= 0 && e.first_node <= e.last_node && e.last_node < static_cast<int>(nn),
                  "memory plan: an extra buffer lives from node {} to node {}, outside the graph's {} nodes",
                  e.first_node, e.last_node, nn);
  // The tensor whose storage t is: views resolve to their source.
  const auto root = [&](int t) {
    for (int p = g.tensor(t).producer; p >= 0 && is_view(g.node(p).op); p = g.tensor(t).producer)
      t = g.node(p).inputs.at(static_cast<size_t>(op_info(g.node(p).op).traits.view_of));
    return t;
  };
  for (size_t i = 0; i < nn; ++i)
    for (int t : g.nodes()[i].inputs) {
      mp.last_use[static_cast<size_t>(t)] = static_cast<int>(i);
      mp.last_use[static_cast<size_t>(root(t))] = static_cast<int>(i);
    }
  struct Block {
    uint64_t offset, size;
    bool free;
  };
  std::vector<Block> blocks;
  std::vector<int> block_of(nt, -1), block_of_extra(extras.size(), -1);
  const auto take = [&](uint64_t size, bool fresh = false) {
    int best = -1;
    for (size_t b = 0; b < blocks.size() && !fresh; ++b)
      if (blocks[b].free && blocks[b].size >= size &&
          (best < 0 || blocks[b].size < blocks[static_cast<size_t>(best)].size))
        best = static_cast<int>(b);
    if (best < 0) {
      blocks.push_back(Block{mp.total, size, false});
      mp.total += size;
      best = static_cast<int>(blocks.size() - 1);
    }
    blocks[static_cast<size_t>(best)].free = false;
    return best;
  };
  // A graph output gets a block no other tensor ever had: the caller reads it after the run, and nothing before it in
  // the run wrote there.
  const auto give = [&](int t, uint64_t size) {
    const int b = take(size, g.tensor(t).is_output);
    block_of[static_cast<size_t>(t)] = b;
    mp.offsets[static_cast<size_t>(t)] = static_cast<int64_t>(blocks[static_cast<size_t>(b)].offset);
  };
  const auto release = [&](int t) {
    blocks[static_cast<size_t>(block_of[static_cast<size_t>(t)])].free = true;
    block_of[static_cast<size_t>(t)] = -1;
  };
  const auto dies_here = [&](int t, size_t node) {
    const Tensor& x = g.tensor(t);
    return x.kind == TensorKind::ACTIVATION && !x.is_output && mp.last_use[static_cast<size_t>(t)] == int(node) &&
           block_of[static_cast<size_t>(t)] >= 0;
  };
  const auto writes_over = [&](const Node& n, size_t j) {
    return options.write_over_input ? options.write_over_input(n, j) : may_write_over_input(n.op, j);
  };
  for (size_t i = 0; i < nt; ++i)
    if (options.inputs && g.tensors()[i].kind == TensorKind::INPUT)
      give(static_cast<int>(i), align_up(g.tensors()[i].nbytes()));
  for (size_t i = 0; i < nn; ++i) {
    const Node& n = g.nodes()[i];
    const Tensor& out = g.tensor(n.output);
    // Extras live through node i: their blocks are taken before the output's, so neither takes the other's.
    for (size_t e = 0; e < extras.size(); ++e)
      if (extras[e].first_node == int(i)) {
        block_of_extra[e] = take(align_up(extras[e].bytes));
        mp.extra_offsets[e] = static_cast<int64_t>(blocks[static_cast<size_t>(block_of_extra[e])].offset);
      }
    if (!is_view(n.op)) {
      std::vector<int> candidates;
      if (is_matmul_like(n.op) && n.fusion.residual >= 0) candidates = {n.fusion.residual};
      for (size_t j = 0; j < n.inputs.size(); ++j)
        if (writes_over(n, j)) candidates.push_back(n.inputs[j]);
      // x + x, silu(x) * x: the kernels read both operands at once from one storage; give the output its own.
      if (candidates.size() >= 2 && candidates[candidates.size() - 1] == candidates[candidates.size() - 2])
        candidates.clear();
      int reuse = -1;
      if (out.is_output) candidates.clear();
      for (int c : candidates)
        if (dies_here(c, i) && g.tensor(c).nbytes() == out.nbytes()) {
          reuse = c;
          break;
        }
      if (reuse >= 0) {
        block_of[static_cast<size_t>(n.output)] = block_of[static_cast<size_t>(reuse)];
        mp.offsets[static_cast<size_t>(n.output)] = mp.offsets[static_cast<size_t>(reuse)];
        block_of[static_cast<size_t>(reuse)] = -1;  // the block now belongs to the output
        mp.in_place_input[i] = reuse;
      } else {
        give(n.output, align_up(out.nbytes()));
      }
    }
    // An input read through a view (a column slice of a stack) releases the storage it is a view of.
    for (int t : n.inputs)
      for (int s : {t, root(t)})
        if (dies_here(s, i)) release(s);
    for (size_t e = 0; e < extras.size(); ++e)
      if (extras[e].last_node == int(i)) blocks[static_cast<size_t>(block_of_extra[e])].free = true;
    if (mp.last_use[static_cast<size_t>(n.output)] < 0 && !out.is_output &&
        block_of[static_cast<size_t>(n.output)] >= 0)
      release(n.output);  // an output nobody reads (hand-built graphs)
  }
  return mp;
}

std::vector<std::string> check_memory_plan(const Graph& g, const MemoryPlan& mp, const std::vector<ExtraBuffer>& extras,
                                           uint64_t alignment) {
  struct Range {
    std::string name;
    int64_t offset;
    uint64_t bytes;
    int from, to;  // live from node `from` through node `to`
    int tensor;    // -1: an extra
  };
  const int nn = static_cast<int>(g.nodes().size());
  std::vector<Range> ranges;
  for (size_t t = 0; t < g.tensors().size(); ++t) {
    if (mp.offsets[t] < 0) continue;
    const Tensor& x = g.tensors()[t];
    const int from = std::max(x.producer, 0);
    const int to = x.is_output ? nn : std::max(mp.last_use[t], x.producer);
    ranges.push_back({"tensor '" + x.name + "'", mp.offsets[t], x.nbytes(), from, to, static_cast<int>(t)});
  }
  for (size_t e = 0; e < extras.size(); ++e)
    ranges.push_back({"extra buffer " + std::to_string(e), e < mp.extra_offsets.size() ? mp.extra_offsets[e] : -1,
                      extras[e].bytes, extras[e].first_node, extras[e].last_node, -1});
  std::vector<std::string> problems;
  const uint64_t align = std::max<uint64_t>(alignment, 1);
  for (const Range& r : ranges)
    if (r.offset < 0 || static_cast<uint64_t>(r.offset) % align != 0 || r.offset + int64_t(r.bytes) > int64_t(mp.total))
      problems.push_back(fmt::format("{} has offset {} ({} bytes) in an arena of {} bytes aligned to {}", r.name,
                                     r.offset, r.bytes, mp.total, align));
  // An output that took the block of the input dying at its producer.
  const auto handover = [&](const Range& a, const Range& b) {
    if (a.tensor < 0 || b.tensor < 0) return false;
    const int p = g.tensor(b.tensor).producer;
    return p >= 0 && mp.in_place_input[static_cast<size_t>(p)] == a.tensor && a.to == p;
  };
  for (size_t i = 0; i < ranges.size(); ++i)
    for (size_t j = i + 1; j < ranges.size(); ++j) {
      const Range &a = ranges[i], &b = ranges[j];
      if (a.from > b.to || b.from > a.to || handover(a, b) || handover(b, a)) continue;
      if (a.offset + int64_t(a.bytes) <= b.offset || b.offset + int64_t(b.bytes) <= a.offset) continue;
      problems.push_back(fmt::format("{} (nodes {}..{}) and {} (nodes {}..{}) overlap in the arena", a.name, a.from,
                                     a.to, b.name, b.from, b.to));
    }
  return problems;
}

}  // namespace tessera::graph
