// Causal prefill attention through cuDNN's fused SDPA (the cuDNN frontend's graph API; on Hopper its flash-attention
// kernel with wgmma and TMA), as a peer of attn_prefill (kernels_rows.h) that the executors can pick per shape.
//
// cuDNN is optional twice over. At build time only headers are needed (the cuDNN frontend and cudnn.h; CMake option
// TESSERA_CUDNN, default AUTO). At run time libcudnn.so.9 is loaded with dlopen (the frontend's dynamic loading), so
// the binary runs where cuDNN is absent: cudnn_attention_available() then says why and callers use attn_prefill.
// Where to find the library: $TESSERA_CUDNN_LIB (a path), else "libcudnn.so.9" on the loader's search path
// (LD_LIBRARY_PATH; PyTorch's wheel ships it under site-packages/nvidia/cudnn/lib): the one environment variable the
// CUDA backend reads, a file location a user sets. CudaOptions::cudnn = false (cuda_options.h) turns the feature off
// (same-run A/B against attn_prefill).
//
// Plan choice. cuDNN's heuristics offer a ranked list of engine configurations for a graph; by default the first is
// taken, as PyTorch's SDPA does. CudnnAttnOptions::autotune = 1 keeps every distinct configuration that builds, and at
// the graph's first call outside CUDA graph capture times each on that call's own buffers (interleaved rounds, CUDA
// events, median per plan); the fastest is used from then on, the heuristics' first unless another is >= 1% faster (a
// variable-length graph is timed at its first call's t and p0). This costs the extra plan builds and tens of launches
// (about 100 ms of GPU time at most) once per graph. =2 also tries variants of the offered engines with one knob
// changed (slower to build; for exploring). Off by default: on the H100 (2026-11-22, bf16 causal 32/8 heads, hd 128,
// t = 2k/8k/16k) the heuristics offer four plans, two of cuDNN's engine 2 that tie and two of engine 1 at half the
// speed, and the first is already the fastest (docs/PERFORMANCE.md). Autotuning and exact_full_chunk are options of a
// workspace (CudnnAttnOptions) that the engine leaves at their defaults; bench/cuda/bench_attention sets them
// (--autotune, --exact-first) to measure them again.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/kernels.h"

namespace tessera::cuda {

// True when this build has the cuDNN path, cuda_options().cudnn is on, libcudnn (major version 9) loads and the
// current device is sm_90 (Hopper: what the path was measured on). Otherwise false, with the reason in *why.
// Loading is tried once per process; the switch and the device are checked on every call.
bool cudnn_attention_available(std::string* why = nullptr);

struct CudnnAttnOptions {
  // 0: the heuristics' first plan. 1: time every distinct plan the heuristics offer at the graph's first call and
  // keep the fastest. 2: as 1, plus variants of those engines with one knob changed.
  int autotune = 0;
  // Variable-length workspaces only: a call with p0 = 0 and t = max_t (a prompt's first chunk when it fills the
  // chunk) runs on a graph built for exactly that shape, 2-15% faster than the variable-length graph (H100: ~7 us
  // per layer at 2k, ~0.2 ms at 16k). One extra graph per workspace, i.e. per prefill executor, shared by all its
  // layers (one build, 40-100 ms plus tuning, at the first such call), so it pays off over repeated or long prompts,
  // not for one short prompt; every other (t, p0) still shares the variable-length graph. Off by default: end to end
  // the gain is within the noise (8B bf16 pp2048 on the H100: 41,006 ± 2,220 tok/s with it and autotuning, 42,592 ±
  // 570 without) and the build costs ~240 ms per executor.
  bool exact_full_chunk = false;
};

// One built graph, for benchmarks, tests and logs.
struct CudnnPlanInfo {
  std::string name;  // cuDNN's engine tag (engine and knob choices)
  int64_t workspace_bytes = 0;
  double tune_ms = -1;  // median while tuning; < 0: not timed (not tuned yet, tuning off, or it failed to run)
};
struct CudnnGraphInfo {
  int64_t t = 0, s_kv = 0;  // query rows and keys declared (variable-length: max_t and n_ctx)
  bool varlen = false;
  int64_t configs = 0;  // engine configurations offered (heuristics A + fallback, with repeats; + knob variants)
  std::vector<CudnnPlanInfo> plans;  // those that built, without repeats, heuristics' order (plans[0]: its choice)
  int64_t chosen = 0;                // index into plans of the plan calls use
  bool tuned = false;                // timing done (or nothing to choose from)
  double build_ms = 0, tune_ms = 0;  // building the graph and its plans; timing them (wall clock)
};

// The cuDNN handle and one built graph (its candidate execution plans, the chosen one, workspace size) per attention
// shape. Building a graph takes milliseconds to seconds (heuristics, and for some engines run-time compilation), so
// each shape is built once, on its first use or by prepare(), and kept; its plans are timed at its first call outside
// CUDA graph capture (CudnnAttnOptions::autotune; a call during capture runs the current choice and leaves timing to
// a later call). One workspace buffer serves every shape; it grows only when a new shape is
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
// The exact mode declares K and V p0 + t long (the tile loads past them read zeros) and has no such condition. A
// variable-length workspace runs a call with p0 = 0 and t = max_t on an exact graph (CudnnAttnOptions::
// exact_full_chunk), under the variable-length conditions all the same.
class CudnnAttnWorkspace {
 public:
  explicit CudnnAttnWorkspace(int64_t max_t = 0, const CudnnAttnOptions& options = CudnnAttnOptions{});
  int64_t max_t() const;
  const CudnnAttnOptions& options() const;
  ~CudnnAttnWorkspace();
  CudnnAttnWorkspace(const CudnnAttnWorkspace&) = delete;
  CudnnAttnWorkspace& operator=(const CudnnAttnWorkspace&) = delete;

  // Builds (if not built yet) the graph that attn_prefill_cudnn uses for these arguments (the same meaning as there;
  // no pointer is needed). Call before capturing a CUDA graph that contains new shapes: building allocates.
  void prepare(const KvCacheView& cache, int64_t ld_q, int64_t p0, int64_t t, int64_t n_head, float scale);
  // Shapes built so far, and the milliseconds their builds took together (for benchmarks and logs).
  int64_t graphs_built() const;
  double build_ms() const;
  // Every graph built so far (order: by shape key), with its plans and their tuning times.
  std::vector<CudnnGraphInfo> graph_info() const;
  // For tests and benchmarks: calls run plans[plan] of their graph (CudnnGraphInfo) instead of the chosen one, and
  // do not tune; -1 restores the choice. A graph with fewer plans fails the call (tessera::Error).
  void force_plan(int64_t plan);

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
