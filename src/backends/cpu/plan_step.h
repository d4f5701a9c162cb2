// One executable step of a CPU plan: a graph node with every pointer and size resolved at compile time, so executing
// a token is a loop over plain structs (no lookups, no allocation).
#pragma once

#include <cstdint>
#include <vector>

#include "backends/cpu/backend.h"

namespace tessera::cpu {

struct Plan::Step {
  graph::Op op = graph::Op::ADD;
  int node = -1;
  float* y = nullptr;                // output activation (nullptr for KV_STORE, whose output is the cache)
  const float* a = nullptr;          // first activation input
  const float* b = nullptr;          // second activation input (ADD, SWIGLU)
  bool copy_a = false;               // y is not a's storage: copy a into y before an in-place kernel (ROPE, ADD)
  const PackedWeight* w = nullptr;   // MATMUL, fast mode
  const SparseWeight* sw = nullptr;  // MATMUL_SPARSE, fast mode, where the ISA has a sparse kernel
  DType w_dtype = DType::F32;        // MATMUL (reference mode), EMBED: the raw weight
  const void* w_raw = nullptr;       // [N, K] as in the file
  const float* wf = nullptr;         // RMSNORM weight [E]; ROPE inverse frequencies [R/2]
  const int32_t* ids = nullptr;      // EMBED token ids; ROPE positions
  KvView kv_k, kv_v;                 // KV_STORE: target in kv_k; ATTENTION: both
  int64_t t = 0;                     // rows (tokens) of the input
  int64_t n = 0;                     // MATMUL output features; EMBED vocabulary; elementwise: elements per row
  int64_t k = 0;                     // MATMUL input features; EMBED/RMSNORM/LAST_ROW: row width
  graph::OpParams p;
  // An op with no dedicated step (the switch's default): its registered kernel and binding (op_kernel.h).
  void (*kernel)(const OpCall& call, int64_t n_past, ThreadPool& pool) = nullptr;
  const OpCall* call = nullptr;
  Lora* lora = nullptr;  // MATMUL with a LoRA epilogue (graph::Fusion::lora): its adapters
};

// A matmul's unmerged LoRA adapters, stacked (kernels/lora.h): y = x·Wᵀ + (x·Aᵀ)·Bᵀ in one job, u = x·Aᵀ in `u`.
struct Plan::Lora {
  const LoraWeights* weights = nullptr;  // WeightCache::get_lora
  std::vector<float> u;                  // [T, R]
};

}  // namespace tessera::cpu
