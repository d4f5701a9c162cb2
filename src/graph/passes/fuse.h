// Graph passes: fusion as explicit rewrites. A backend declares what its executors can run fused (FusionSupport);
// run_passes rewrites a builder's graph into one whose nodes say what they compute (graph::Fusion on graph::Node), so
// executors run nodes and never pattern-match. Every rewrite checks its preconditions on the graph and leaves the
// nodes unchanged where one fails; verify_rewrite proves nothing was lost.
//
// The rewrites, in the order they run:
//  0. matmul chains (passes/chain.h, apply_chain_orders): a chain of matmuls by weights whose cheapest order under the
//     backend's cost model is not left to right is computed in that order, its weight-only products folded into f32
//     constants at rewrite time; each remaining product is a plain MATMUL of an activation by a weight (fused_from:
//     the builder's nodes it computes). First, so the rewrites below take such a matmul (and a rewritten LoRA's add)
//     as they take any other node: LoRA's fold (7) does not match it, the add stays an add.
//  1. norm prologue: an RMSNORM whose readers are the matmuls right after it (so nothing writes its input in between)
//     is folded into them: each reads the raw input and the norm weight (MATMUL with fusion.norm_weight).
//  2. stacks: matmuls reading the same x with weights of one format and K run as one matmul over the stacked weights
//     ([sum N, K]); SLICE nodes give each member's columns (a view). Three policies (FusionSupport): every such
//     group, or only q|k|v feeding rope/cache stores, or only a gate|up pair feeding SWIGLU. A matmul by a folded
//     constant (0) is never a member: stacks are cached by their members' addresses beyond the graph's life.
//  3. swiglu epilogue: a stacked [gate; up] whose only reader is SWIGLU(gate, up) computes it itself (output [T, F]).
//  4. residual epilogue: a matmul whose only reader is ADD(a, y), the last reader of a, accumulates into a in place.
//  5. norm epilogue: a residual matmul whose sum is first read by an RMSNORM read only by matmuls whose weights the
//     backend accepts writes that norm's quantized input; the norm stays, marked fusion.in_producer.
//  6. rope + cache store + attention: ATTENTION(rope(q), store(rope(k)), store(v)) becomes one ATTENTION node reading
//     the unrotated q and k, v, the caches, positions and frequencies (fusion.rope_store); a sliding-window
//     attention (params.window, which the fused node keeps) only where the backend declares windowed_attention.
//  7. LoRA epilogue: a plain matmul y = x·Wᵀ whose output is read only by ADD(y, (x·Aᵀ)·Bᵀ) (the graph builder's
//     unmerged adapter, models/llama.cpp), A's product read only by B's and B's only by the add, becomes one matmul
//     with fusion.lora adapters (several adapters chain: each add's output is the next one's y). Runs last, so the
//     rewrites above see the adapters' nodes as the builder wrote them (the CPU: its fused step runs single matmuls
//     only) -- or, where the backend declares lora_first (CUDA), first: then an adapted matmul is one node reading x
//     like its base, so rewrites 1-5 take it as they take the base matmul. Its norm prologue normalizes x for the
//     adapters' A products too, a stack keeps every member's adapters (Fusion::lora_member: which member each adapts;
//     lora_terms: its rows), its SwiGLU epilogue and residual epilogue apply to y with the adapters added, and rewrite
//     5 leaves adapted matmuls alone (the A products read the norm's f32 output, and the residual's sum is whole only
//     after the adapters).
// The ops of the families beyond Llama (GEGLU, HEAD_RMSNORM, BIAS_ADD, SOFTCAP, SCALE) are never fused: a pattern
// above that meets one of them between its nodes (a q norm or bias between a matmul and its rope, a post-norm between
// a matmul and its residual add) does not match.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "graph/passes/chain.h"

namespace tessera::graph {

// What a backend's executor runs fused. Empty (the default): nothing, run_passes returns the graph unchanged.
struct FusionSupport {
  // 0. Matmul chains in the order this cost model makes cheapest (nullopt: as built), folding weight-only products
  // with the values weight_values reads (required with chain_orders).
  std::optional<ChainCostModel> chain_orders;
  WeightValues weight_values;
  // 1. RMSNorm folded into matmuls reading its output, when every reader's weight passes (nullptr: never).
  std::function<bool(const Tensor& weight)> norm_prologue;
  // The format the backend runs a weight in (a backend converts a format it has no kernel for at load); stacks group
  // weights by it. nullptr: the weight's own dtype.
  std::function<DType(const Tensor& weight)> weight_format;
  // 2. Stacking policy.
  bool stack_shared_input = false;  // every matmul reading the same x (same weight format and K)
  bool stack_qkv = false;           // only matmuls whose outputs feed ROPE / KV_STORE nodes only
  bool stack_gate_up = false;       // only a gate|up pair of equal weights whose outputs feed one SWIGLU only
  // 3. SwiGLU epilogue on a stacked gate|up pair with these weights; swiglu: the SWIGLU node (nullptr: never).
  std::function<bool(const Graph& g, const std::vector<int>& weights, int swiglu)> swiglu_epilogue;
  // 4. Residual accumulate epilogue.
  bool residual_epilogue = false;
  // 5. The residual matmul with `weight` also writes the next norm's input for readers with `reader_weights`.
  std::function<bool(const Tensor& weight, const std::vector<const Tensor*>& reader_weights)> residual_norm_out;
  // 6. Rope + cache store + attention in one node; windowed_attention: also where the attention has a sliding window
  // (the fused executor's kernels read params.window).
  bool rope_store_attention = false;
  bool windowed_attention = false;
  // 7. A matmul with its unmerged LoRA adapters in one node; lora_first: that rewrite runs before 1 (see above).
  bool lora_epilogue = false;
  bool lora_first = false;
};

// One adapter of a matmul node with fusion.lora: A [r, K] and B [rows, r] (tensor ids), the stack member it adapts
// and that member's rows [row0, row0 + rows) of the node's output (before a SwiGLU epilogue: of the [gate; up] stack).
struct LoraTerm {
  int a = -1, b = -1;
  int member = 0;
  int64_t row0 = 0, rows = 0;
};
std::vector<LoraTerm> lora_terms(const Graph& g, const Node& n);

// Runs the rewrites the backend supports and verifies the result against g (Error naming what went missing).
Graph run_passes(const Graph& g, const FusionSupport& support);

// Each rewrite alone (run_passes runs them in this order); tests call them one at a time.
Graph fold_norm_prologues(const Graph& g, const FusionSupport& support);
Graph stack_matmuls(const Graph& g, const FusionSupport& support);
Graph fold_residual_adds(const Graph& g, const FusionSupport& support);
Graph fold_residual_norms(const Graph& g, const FusionSupport& support);
Graph fuse_rope_store_attention(const Graph& g, const FusionSupport& support);
Graph fold_lora_epilogues(const Graph& g, const FusionSupport& support);

// Checks that `rewritten` computes everything `source` does: every source node is either kept (same name and op, no
// fusion) or named in exactly one fused node's fused_from; every fused_from name is a source node; every role of the
// source (tokens, positions, logits, caches) is still held by a tensor. A source that is itself a rewrite (a graph
// the chain rewrite returned, compiled again) stands for the nodes its fused nodes name: each of those must be named
// exactly once too. Returns the problems, one sentence each (empty when the rewrite is whole).
std::vector<std::string> verify_rewrite(const Graph& source, const Graph& rewritten);

// Per tensor, the nodes reading it (a node reading it twice appears twice), in node order.
std::vector<std::vector<int>> consumers_of(const Graph& g);

// The name of a node fusing these (source nodes' names, in order): "blk.3.ffn_gate+ffn_up", the first name whole, the
// others without the first one's "blk.N." prefix.
std::string joined_name(const std::vector<std::string>& names);

}  // namespace tessera::graph
