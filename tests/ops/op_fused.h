// The op table's fused-node rows (tests/ops/test_ops_fused.cpp): a case is a small graph of builder nodes that a
// backend's passes rewrite into fused nodes (graph/passes/fuse.h: a norm folded into a matmul, stacked matmuls, a
// SwiGLU or residual epilogue, the residual matmul writing the next norm's quantized input). The reference is the CPU
// backend in reference mode on the builder's graph; the CPU backend runs it fast (fusing only a matmul with LoRA
// adapters); the CUDA runner runs the graph as the CUDA decoder's passes rewrite it, each fused node through the kernel
// entry point the decoder calls for it.
#pragma once

#include <optional>
#include <vector>

#include "graph/graph.h"
#include "ops/op_case.h"

namespace tessera::ops_test {

// The rewritten one-token graph `rg` of og.g, run node by node through the CUDA decoder's kernels; the output is the
// tensor named as og.g's last node's output. nullopt when a node has no runner here (the row skips, naming it in
// *skipped).
std::optional<std::vector<float>> run_cuda_fused(const OpGraph& og, const graph::Graph& rg, std::string* skipped);

}  // namespace tessera::ops_test
