// One memory planner for every backend: liveness over a (rewritten) graph, offsets in one arena, in-place reuse where
// the op allows it. A tensor's storage is released after its last reader (readers through views count: a SLICE or a
// KV_STORE output lives in its source's storage); an op that may write over a dying input of the same size takes that
// input's block (graph::may_write_over_input; a matmul with a residual epilogue over its residual). Freed blocks are
// reused best-fit, so a llama graph needs a handful of [T, max(E, F)] blocks however many layers it has. Inputs and
// graph outputs keep their own blocks; weights and caches have none.
#pragma once

#include <cstdint>
#include <vector>

#include "graph/graph.h"

namespace tessera::graph {

struct MemoryPlanOptions {
  uint64_t alignment = 64;  // every block's offset and size are multiples of it (the backend's vector or DMA width)
};

struct MemoryPlan {
  std::vector<int64_t> offsets;     // per tensor: byte offset in the arena, -1 when it has no storage of its own
  std::vector<int> in_place_input;  // per node: the input whose storage the output took, -1 if none
  std::vector<int> last_use;        // per tensor: the last node reading it (through views too), -1 if none
  uint64_t total = 0;               // arena bytes
};

MemoryPlan plan_memory(const Graph& g, const MemoryPlanOptions& options = {});

}  // namespace tessera::graph
