// Per-op kernels for the ops the CPU plan has no dedicated step for: the extension point that lets an op's CPU kernel
// live in a file of its own (src/backends/cpu/ops/<op>.cpp) and register itself, so adding an op edits no CPU file.
//
// The ops a model runs every token (embedding, norm, matmul, rope, cache store, attention, add, swiglu, last row) keep
// their dedicated steps (plan_step.h, executor.cpp: resolved pointers, SIMD kernels, threading chosen per op); the
// registry serves every other op in both modes as its plain reference. An op that becomes hot gets a dedicated step.
//
// How a kernel registers (its file is linked whole into every binary: src/CMakeLists.txt, tessera_cpu_ops):
//   namespace { const bool kRegistered = cpu::register_op_kernel(graph::Op::SCALE, {.run = scale}); }
#pragma once

#include <cstdint>
#include <vector>

#include "core/thread_pool.h"
#include "graph/graph.h"

namespace tessera::cpu {

// One node as the plan binds it, resolved at compile time: the kernel reads shapes and dtypes from the tensors and
// the op's parameters from the node; nothing is looked up per token.
struct OpCall {
  const graph::Node* node = nullptr;             // params, name (for errors)
  std::vector<const graph::Tensor*> in_tensors;  // per input: shape and dtype
  // Per input: its bytes. Activations and inputs: f32 (or the input's dtype) in the plan's arena, row-major; weights:
  // as the file stores them; KV caches: the session's storage, head-major [Hkv, C, D] in the cache's dtype.
  std::vector<const void*> in;
  const graph::Tensor* out_tensor = nullptr;  // shape and dtype of the output
  void* out = nullptr;                        // the output in the arena; may be input i's storage where the op's
                                              // traits allow it (graph::may_write_over_input)
};

struct OpKernel {
  // Runs the node for tokens at positions [n_past, n_past + T) (T: the graph's n_tokens). It may split its work over
  // the pool. Input validation belongs in `supports` or the op's shape check: this runs after every check has passed.
  void (*run)(const OpCall& call, int64_t n_past, ThreadPool& pool) = nullptr;
  // Whether the kernel handles this node (dtypes, shapes beyond the op's shape check); nullptr: every node the graph
  // accepts.
  bool (*supports)(const graph::Node& node, const graph::Graph& g) = nullptr;
};

// Registers the CPU kernel of `op`; called from a static initializer in the kernel's own file. Returns true (so the
// call can initialize a constant). A second kernel for one op is a build bug: the process stops with a message.
bool register_op_kernel(graph::Op op, OpKernel kernel);
// The registered kernel of `op`, nullptr when there is none.
const OpKernel* find_op_kernel(graph::Op op);

}  // namespace tessera::cpu
