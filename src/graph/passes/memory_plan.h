// One memory planner for every backend: liveness over a (rewritten) graph, offsets in one arena, in-place reuse where
// the op allows it. A tensor's storage is released after its last reader (readers through views count: a SLICE or a
// KV_STORE output lives in its source's storage); an op that may write over a dying input of the same size takes that
// input's block (graph::may_write_over_input; a matmul with a residual epilogue over its residual). Freed blocks are
// reused best-fit, so a llama graph needs a handful of [T, max(E, F)] blocks however many layers it has. Inputs and
// graph outputs keep their own blocks (an output's block was never another tensor's); weights and caches have none.
// Extra buffers that are no graph tensor (a backend's 16-bit copy of an activation) take blocks from the same arena for
// the nodes they live through.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace tessera::graph {

struct MemoryPlanOptions {
  uint64_t alignment = 64;  // every block's offset and size are multiples of it (the backend's vector or DMA width)
  // Whether node n's output may take the block of its input j (dying there, same size); empty: may_write_over_input.
  // A backend whose kernels do not all allow it narrows this. A matmul's residual epilogue always writes over its
  // residual: that is what the epilogue is.
  std::function<bool(const Node& n, size_t j)> write_over_input;
  bool inputs = true;  // false: graph inputs get no block (the backend stores them itself)
};

// A buffer that is no graph tensor, live from node first_node through node last_node (both included).
struct ExtraBuffer {
  uint64_t bytes = 0;
  int first_node = 0, last_node = 0;
};

struct MemoryPlan {
  std::vector<int64_t> offsets;        // per tensor: byte offset in the arena, -1 when it has no storage of its own
  std::vector<int> in_place_input;     // per node: the input whose storage the output took, -1 if none
  std::vector<int> last_use;           // per tensor: the last node reading it (through views too), -1 if none
  std::vector<int64_t> extra_offsets;  // per extra buffer: byte offset in the arena
  uint64_t total = 0;                  // arena bytes
};

MemoryPlan plan_memory(const Graph& g, const MemoryPlanOptions& options = {},
                       const std::vector<ExtraBuffer>& extras = {});

// What is wrong with plan mp of g (with `extras`), one sentence each; empty when nothing is: two tensors, two extras,
// or a tensor and an extra whose byte ranges overlap while both are live (closed node intervals: a tensor from its
// producer, or the start for an input, to its last reader, or the end for a graph output), except an output written
// over the input it replaces at the node where that input dies (MemoryPlan::in_place_input); an offset outside the
// arena or not a multiple of `alignment`. For tests of a backend's plan.
std::vector<std::string> check_memory_plan(const Graph& g, const MemoryPlan& mp, const std::vector<ExtraBuffer>& extras,
                                           uint64_t alignment);

}  // namespace tessera::graph
