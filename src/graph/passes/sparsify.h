// TEAL activation sparsity (training-free, magnitude-based; FasterDecoding/TEAL) as a graph rewrite: the input of every
// matmul inside the transformer blocks passes through a SPARSIFY node that zeroes its smallest-magnitude entries, and
// in a one-token (decode) graph the matmuls reading it become MATMUL_SPARSE, whose kernels skip the weight columns of
// the zeroed inputs. q, k and v share one input (the attention norm's output), so they share one SPARSIFY node, as do
// gate and up (the ffn norm's output); o reads the attention output and down the SwiGLU output, each its own.
//
// Prefill stays dense by default (TEAL's finding, docs/TEAL.md): a chunk of T tokens reads each weight once for all T
// rows, and the union of T rows' surviving channels is nearly every channel, so skipping saves nothing there while the
// zeroed prompt activations would still cost quality in the cache every later token attends to.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "graph/graph.h"

namespace tessera::graph {

// The four matmul inputs of a block, in TEAL's naming: q|k|v, o, gate|up, down.
enum class SparseInput : uint8_t { QKV, O, GATE_UP, DOWN, COUNT };
std::string_view sparse_input_name(SparseInput s);  // "qkv", "o", "gate_up", "down"
// The input a matmul role reads; COUNT for roles outside the blocks (the output projection stays dense).
SparseInput sparse_input_of(Role r);

struct SparsifyOptions {
  // Uniform: each row of each input keeps its largest (1 - sparsity) * K entries by magnitude (top-k per token).
  float sparsity = 0;
  // Calibrated (tessera calibrate): thresholds[layer][input]; an entry with |x| <= threshold is zeroed. Non-empty
  // replaces the uniform top-k.
  std::vector<std::array<float, 4>> thresholds;
  // Sparsify graphs of several tokens too (perplexity: every scored position as decode would see it); otherwise only
  // one-token graphs are rewritten and prefill stays dense.
  bool all_rows = false;
  // One-token graphs: swap the matmuls reading a sparsified input for MATMUL_SPARSE (a backend without that kernel
  // leaves this off and runs the dense matmul on the zeroed input: the same values, no speed-up).
  bool sparse_matmul = true;
  bool active() const { return sparsity > 0 || !thresholds.empty(); }
};

// The rewrite (identity when !o.active(), or for a graph of several tokens without all_rows). Error when the
// thresholds do not cover the graph's layers.
Graph sparsify(const Graph& g, const SparsifyOptions& o);

}  // namespace tessera::graph
