// Internals shared by the CUDA executors (backend_cuda.cpp, executor_rows.cpp): CudaShared's state, the launch list
// with graph node ids, per-node profiling with events, and CUDA graph capture.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/cuda/backend_cuda.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels_rows.h"
#include "backends/cuda/memory.h"
#include "quant/format_support.h"

namespace tessera::cuda {

bool is_quantized_dtype(DType t);

struct CudaShared::Impl {
  int64_t n_seq = 1;
  int64_t max_rows = 1;
  CudaBackendOptions options;
  bool fuse = true;  // merge matmuls sharing an input and fold residual adds (TESSERA_CUDA_FUSE=0: off)
  cudaStream_t stream = nullptr;
  std::unordered_map<const void*, DeviceWeight> weights;                    // by host data pointer
  std::map<std::vector<const void*>, std::unique_ptr<DeviceWeight>> stacks;  // by member weights' host pointers
  struct Cache {
    DType dtype = DType::F16;
    int64_t n_kv = 0, n_ctx = 0, hd = 0;
    DeviceBuffer data;  // [n_seq, n_kv, n_ctx, hd]
  };
  std::map<std::string, Cache> caches;  // by graph tensor name
  std::unique_ptr<GemmWorkspace> gemm;  // created by the first rows executor
  uint64_t bytes = 0;
  ConversionNotices notices;  // weights converted at upload (no kernel for their format): one notice per format

  // Error text prefix for a node that cannot run: "cuda backend: node 'x' (op) cannot run on the GPU: why".
  [[noreturn]] static void unsupported(const graph::Node& n, const std::string& why);
  // The device copy of a 2-D weight (uploaded on first use).
  const DeviceWeight& weight(const graph::Node& n, const graph::Tensor& t);
  // The weights of `members` (same dtype and K) stacked row-wise as one matrix (uploaded on first use).
  const DeviceWeight& stack(const graph::Node& n, const std::vector<const graph::Tensor*>& members);
  // Host W [rows, k] in t's format uploaded as it is, or converted to weight_formats()'s fallback first when no
  // kernel reads that format (with the format's notice); unsupported(n, ...) when Tessera cannot read it.
  DeviceWeight upload_any(const graph::Node& n, const graph::Tensor& t, const void* host, int64_t rows, int64_t k);
  // Device storage of KV_CACHE tensor t (every slot): allocated zeroed the first time its name is seen.
  void* cache(const graph::Tensor& t);
  // The matmul workspace, grown to (max_rows, max_k, max_quant_nk) if it is smaller. Only before any executor has
  // captured a graph over it: callers size it at compile time.
  GemmWorkspace& gemm_workspace(int64_t max_k, int64_t max_quant_nk);
  int64_t gemm_k = 0, gemm_nk = 0;
  uint64_t gemm_generation = 0;  // bumped when the workspace is replaced: graphs captured over the old one are stale
};

// ROPE and KV_STORE nodes emit no launch of their own: the ATTENTION node reading them launches the fused rotation +
// cache store (+ attention). A ROPE node as the executors record it (by its output tensor id):
struct RopeInfo {
  int src = -1;  // tensor rotated (the matmul output)
  int inv_freq = -1;
  graph::OpParams p;
};
// What one ATTENTION node fuses: the tensors rotated into q and k, the stored values, and the rotation.
struct FusedAttention {
  int q = -1, k = -1, v = -1;
  const RopeInfo* rope = nullptr;
};
// Resolves the ATTENTION node n's inputs through `rope` and `kv_src` (KV_STORE output -> stored tensor) and checks the
// pattern the fused launches assume (q and k rotated alike, v not, the rotated k read by nothing else); otherwise
// CudaShared::Impl::unsupported naming the node.
FusedAttention resolve_fused_attention(const graph::Node& n, const std::unordered_map<int, RopeInfo>& rope,
                                       const std::unordered_map<int, int>& kv_src,
                                       const std::vector<std::vector<int>>& consumers);
// The cache view of an attention node whose K cache tensor is kt ([n_kv, n_ctx, hd], storage k and v for n_seq
// slots); unsupported when the node's head sizes disagree with it.
KvCacheView attention_cache_view(const graph::Node& n, const graph::Tensor& kt, void* k, void* v, int64_t n_seq);
// Whether decode attention runs rope + store fused into it (TESSERA_CUDA_FUSE_ATTN=0: two launches, for comparison).
bool fuse_attention_enabled();
// Whether the environment variable `name` is "0": the executors' switches that turn a fusion off for comparison.
bool env_switched_off(const char* name);
// Whether it is "1": the switches of a path still off by default.
bool env_is_on(const char* name);

// Run-time values of one step that the launches read on the host (PREFILL passes t, p0 and the slot; BATCH t only).
struct RunArgs {
  int64_t t = 1;
  int64_t p0 = 0;
  int64_t seq = 0;
};

struct Launch {
  int node = -1;  // graph node whose time this launch is
  std::function<void(cudaStream_t, const RunArgs&)> fn;
};

// Runs the launches plainly; with `profile`, records an event after each and adds the elapsed ns to its node
// (synchronizes the stream).
class LaunchRunner {
 public:
  ~LaunchRunner();
  void run(const std::vector<Launch>& launches, cudaStream_t stream, const RunArgs& args,
           std::vector<uint64_t>* profile);

 private:
  std::vector<cudaEvent_t> events_;
};

// Captures the launches on `stream` into an executable graph; false (and the runtime's error cleared) when capture
// or instantiation fails, in which case the caller keeps launching plainly.
bool capture_graph(const std::vector<Launch>& launches, cudaStream_t stream, const RunArgs& args, cudaGraph_t* graph,
                   cudaGraphExec_t* exec);

// The shared state of `shared`, or of a fresh private one-slot CudaShared stored into `shared`.
CudaShared::Impl& shared_impl(std::shared_ptr<CudaShared>& shared, const CudaBackendOptions& options);

}  // namespace tessera::cuda
