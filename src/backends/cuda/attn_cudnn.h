// Causal prefill attention through cuDNN's fused SDPA (the cuDNN frontend's graph API; on Hopper its flash-attention
// kernel with wgmma and TMA), as a peer of attn_prefill (kernels_rows.h) that the executors can pick per shape.
//
// cuDNN is optional twice over. At build time only headers are needed (the cuDNN frontend and cudnn.h; CMake option
// TESSERA_CUDNN, default AUTO). At run time libcudnn.so.9 is loaded with dlopen (the frontend's dynamic loading), so
// the binary runs where cuDNN is absent: cudnn_attention_available() then says why and callers use attn_prefill.
// Where to find the library: $TESSERA_CUDNN_LIB (a path), else "libcudnn.so.9" on the loader's search path
// (LD_LIBRARY_PATH; PyTorch's wheel ships it under site-packages/nvidia/cudnn/lib). TESSERA_CUDA_CUDNN=0 turns the
// feature off (same-run A/B against attn_prefill).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "backends/cuda/kernels.h"

namespace tessera::cuda {

// True when this build has the cuDNN path, TESSERA_CUDA_CUDNN is not "0", libcudnn (major version 9) loads and the
// current device is sm_90 (Hopper: what the path was measured on). Otherwise false, with the reason in *why.
// Loading is tried once per process; the switch and the device are checked on every call.
bool cudnn_attention_available(std::string* why = nullptr);

// The cuDNN handle and one built graph (execution plan + workspace size) per attention shape. Building a graph takes
// milliseconds to seconds (heuristics, and for some engines run-time compilation), so each shape is built once, on
// its first use or by prepare(), and kept. One workspace buffer serves every shape; it grows only when a new shape is
// built. Thread-safe (one mutex), but use one per CUDA stream (the variable-length mode's lengths live in it).
// Construction fails (tessera::Error) when cudnn_attention_available() is false.
//
// Two modes. max_t == 0: one graph per exact (t, p0) (what the graph keys on: t and p0 + t, besides heads, hd, ld_q,
// n_ctx, dtype and scale), so chunked prefill with a new p0 per chunk builds a graph per chunk. max_t > 0
// (variable-length): one graph per (heads, hd, ld_q, n_ctx, dtype, scale) with max_t query rows and n_ctx keys, and
// cuDNN's padding mask takes the actual t and p0 + t from device memory at run time (copied there by each call,
// stream-ordered): every t <= max_t and p0 shares that graph. Then q and out must hold max_t rows (cuDNN may touch
// rows t .. max_t - 1 of both; their contents are undefined afterwards), and the cache positions past p0 + t (up to
// n_ctx) must hold finite values (zeros, or an earlier sequence's): K and V are declared n_ctx long, cuDNN loads whole
// key tiles and masks the scores, so a NaN or inf stored there makes rows NaN (0 * NaN in P·V; seen on the H100).
// The exact mode declares K and V p0 + t long (the tile loads past them read zeros) and has no such condition.
class CudnnAttnWorkspace {
 public:
  explicit CudnnAttnWorkspace(int64_t max_t = 0);
  int64_t max_t() const;
  ~CudnnAttnWorkspace();
  CudnnAttnWorkspace(const CudnnAttnWorkspace&) = delete;
  CudnnAttnWorkspace& operator=(const CudnnAttnWorkspace&) = delete;

  // Builds (if not built yet) the graph that attn_prefill_cudnn uses for these arguments (the same meaning as there;
  // no pointer is needed). Call before capturing a CUDA graph that contains new shapes: building allocates.
  void prepare(const KvCacheView& cache, int64_t ld_q, int64_t p0, int64_t t, int64_t n_head, float scale);
  // Shapes built so far, and the milliseconds their builds took together (for benchmarks and logs).
  int64_t graphs_built() const;
  double build_ms() const;

  struct Impl;
  Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// attn_prefill with 16-bit q and out, computed by cuDNN: the t query rows are positions p0 .. p0 + t - 1 of slot
// `seq`, whose keys and values are already in the cache for positions [0, p0 + t); row i attends causally to cache
// positions [0, p0 + i] (cuDNN's bottom-right causal alignment; p0 > 0 is chunked prefill). GQA: query head h reads
// kv head h / (n_head / n_kv). q [t, ld_q] and out [t, n_head * hd] are in the cache's dtype (bf16 or f16); q is
// rotated; f32 softmax and accumulation inside. hd in {64, 128}. ld_q and both pointers must allow 16-byte rows
// (ld_q a multiple of 8, pointers 16-byte aligned: cuDNN's TMA loads). Errors (tessera::Error, one sentence): an f32
// cache, p0 + t > n_ctx, seq outside [0, n_seq), n_head not a multiple of n_kv, misaligned q/out, or cuDNN refusing
// the shape. A shape not built yet is built first (see CudnnAttnWorkspace); then the call only enqueues on `stream`.
void attn_prefill_cudnn(const void* q /*[t, ld_q] 16-bit*/, int64_t ld_q, const KvCacheView& cache, int64_t seq,
                        int64_t p0, int64_t t, void* out /*[t, n_head * hd] 16-bit*/, int64_t n_head, float scale,
                        CudnnAttnWorkspace& ws, cudaStream_t stream);

}  // namespace tessera::cuda
