// The memory planner (memory_plan.h).
#include "graph/passes/memory_plan.h"

#include <algorithm>

#include "core/error.h"

namespace tessera::graph {

MemoryPlan plan_memory(const Graph& g, const MemoryPlanOptions& options) {
  const uint64_t align = std::max<uint64_t>(options.alignment, 1);
  const auto align_up = [&](uint64_t v) { return (v + align - 1) / align * align; };
  const size_t nt = g.tensors().size(), nn = g.nodes().size();
  MemoryPlan mp;
  mp.offsets.assign(nt, -1);
  mp.in_place_input.assign(nn, -1);
  mp.last_use.assign(nt, -1);
  // The tensor whose storage t is: views resolve to their source.
  const auto root = [&](int t) {
    for (int p = g.tensor(t).producer; p >= 0 && is_view(g.node(p).op); p = g.tensor(t).producer)
      t = g.node(p).op == Op::KV_STORE ? g.node(p).inputs[1] : g.node(p).inputs[0];
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
  std::vector<int> block_of(nt, -1);
  const auto give = [&](int t, uint64_t size) {
    int best = -1;
    for (size_t b = 0; b < blocks.size(); ++b)
      if (blocks[b].free && blocks[b].size >= size &&
          (best < 0 || blocks[b].size < blocks[static_cast<size_t>(best)].size))
        best = static_cast<int>(b);
    if (best < 0) {
      blocks.push_back(Block{mp.total, size, false});
      mp.total += size;
      best = static_cast<int>(blocks.size() - 1);
    }
    blocks[static_cast<size_t>(best)].free = false;
    block_of[static_cast<size_t>(t)] = best;
    mp.offsets[static_cast<size_t>(t)] = static_cast<int64_t>(blocks[static_cast<size_t>(best)].offset);
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
  for (size_t i = 0; i < nt; ++i)
    if (g.tensors()[i].kind == TensorKind::INPUT) give(static_cast<int>(i), align_up(g.tensors()[i].nbytes()));
  for (size_t i = 0; i < nn; ++i) {
    const Node& n = g.nodes()[i];
    const Tensor& out = g.tensor(n.output);
    if (!is_view(n.op)) {
      std::vector<int> candidates;
      if (is_matmul_like(n.op) && n.fusion.residual >= 0) candidates = {n.fusion.residual};
      for (size_t j = 0; j < n.inputs.size(); ++j)
        if (may_write_over_input(n.op, j)) candidates.push_back(n.inputs[j]);
      // x + x, silu(x) * x: the kernels read both operands at once from one storage; give the output its own.
      if (candidates.size() >= 2 && candidates[candidates.size() - 1] == candidates[candidates.size() - 2])
        candidates.clear();
      int reuse = -1;
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
    for (int t : n.inputs)
      if (dies_here(t, i)) release(t);
    if (mp.last_use[static_cast<size_t>(n.output)] < 0 && !out.is_output &&
        block_of[static_cast<size_t>(n.output)] >= 0)
      release(n.output);  // an output nobody reads (hand-built graphs)
  }
  return mp;
}

}  // namespace tessera::graph
