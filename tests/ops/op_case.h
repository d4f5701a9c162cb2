// The op test table's machinery (in the style of llama.cpp's test-backend-ops): a case is one graph node at one shape
// and dtype, built as a one-node graph with fresh random inputs; each backend runs that graph (the CPU through
// CpuBackend, reference mode being the reference; CUDA through its kernel entry points) and the outputs are compared
// by normalized mean squared error, sum((out - ref)^2) / sum(ref^2).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "graph/graph.h"

namespace tessera::ops_test {

enum class Backend { CPU, CUDA };
const char* backend_name(Backend b);

// One node over leaves that own their bytes. The node's output is the last tensor; KV_STORE's output is its cache.
struct OpGraph {
  graph::Graph g;
  std::vector<std::shared_ptr<std::vector<uint8_t>>> weights;  // bytes of g's WEIGHT tensors (they point here)
  std::map<std::string, std::vector<uint8_t>> inputs;          // INPUT tensors' bytes by name
  std::map<std::string, std::vector<uint8_t>> caches;          // KV_CACHE tensors' initial bytes by name
  int64_t n_past = 0;
  const graph::Node& node() const { return g.nodes().back(); }
};

// A row of the table: how to build the case, and the largest normalized MSE each backend may show against the
// reference, with the reason (STYLE.md: tolerances that know the dtype).
struct Row {
  std::string name;  // unique, gtest-safe: "MATMUL_q6_k_t3_n96_k512"
  std::function<OpGraph(std::mt19937&)> build;
  double max_nmse_cpu = 0;
  double max_nmse_cuda = 0;
  bool cuda = true;  // false: the CUDA backend has no kernel for this case (the row names why in `why`)
  std::string why;
};

// The node's output as floats after running g: on the CPU backend (reference = the scalar `_ref` kernels) or through
// the CUDA kernel entry points. KV_STORE yields the whole cache (rows outside the store must come back unchanged).
// run_cuda gives nothing (the row skips) for an op it has no entry for: an op without a CUDA kernel.
std::vector<float> run_cpu(const OpGraph& og, bool reference);
std::optional<std::vector<float>> run_cuda(const OpGraph& og);
// "" when the CUDA rows can run here, else why not (no CUDA build, no GPU).
std::string cuda_skip_reason();

// Leaves of a case's graph (the builders below use them; multi-node cases, tests/ops/test_ops_fused.cpp, too): a
// weight W (shape [n, k] or [k]) of random values in [lo, hi] quantized to `dtype`, and an f32 input.
int add_weight(OpGraph& og, std::mt19937& rng, const std::string& name, DType dtype, std::vector<int64_t> shape,
               float lo, float hi);
int add_f32_input(OpGraph& og, std::mt19937& rng, const std::string& name, std::vector<int64_t> shape, float lo,
                  float hi);

// The table's seed: TESSERA_TEST_SEED replays a run, else a fresh random one (printed by each case).
uint32_t seed();
// Normalized mean squared error sum((out - ref)^2) / sum(ref^2), the table's one comparison.
double nmse(const std::vector<float>& out, const std::vector<float>& ref);

// ---- Builders: one per graph op. Shapes follow graph.h (row-major, outermost first). ----

OpGraph embed(std::mt19937& rng, DType table, int64_t n_vocab, int64_t d, int64_t t);
OpGraph rmsnorm(std::mt19937& rng, int64_t t, int64_t d);
OpGraph matmul(std::mt19937& rng, DType w, int64_t t, int64_t n, int64_t k);
// MATMUL_SPARSE (TEAL): x with `sparsity` of each row's entries zeroed at random positions (the reference is the dense
// matmul on that same x).
OpGraph matmul_sparse(std::mt19937& rng, DType w, int64_t t, int64_t n, int64_t k, float sparsity);
OpGraph rope(std::mt19937& rng, int64_t t, int64_t n_head, int64_t head_dim, int64_t rope_dim, bool neox,
             int64_t n_past);
OpGraph kv_store(std::mt19937& rng, DType cache, int64_t t, int64_t n_kv, int64_t head_dim, int64_t n_ctx,
                 int64_t n_past);
OpGraph attention(std::mt19937& rng, DType cache, int64_t t, int64_t n_head, int64_t n_kv, int64_t head_dim,
                  int64_t n_ctx, int64_t n_past, int64_t window = 0);
OpGraph add(std::mt19937& rng, int64_t t, int64_t d);
OpGraph swiglu(std::mt19937& rng, int64_t t, int64_t f);
// MLGRU over T steps of D channels at position n_past, its state (cache "state", IoRole::STATE) random.
OpGraph mlgru(std::mt19937& rng, int64_t t, int64_t d, int64_t n_past);
OpGraph last_row(std::mt19937& rng, int64_t t, int64_t d);
// Any op whose inputs are f32 activations (random in [-2, 2]) of these shapes, the first one [T, ...]: a new op of
// that kind takes a row of the table without a builder of its own.
OpGraph simple(std::mt19937& rng, graph::Op op, const std::vector<std::vector<int64_t>>& shapes,
               const graph::OpParams& params = {});
// The row of such an op, named after it and its shapes ("SCALE_7x1000"): one line of the table.
Row simple_row(graph::Op op, std::vector<std::vector<int64_t>> shapes, graph::OpParams params, double max_nmse_cpu,
               double max_nmse_cuda);

}  // namespace tessera::ops_test
