// Pieces shared by the GEMV kernels (gemv_float.cu, gemv_quant.cu) and their host dispatch (gemv.cu).
#pragma once

#include <utility>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/common.cuh"

namespace tessera::cuda::detail {

__device__ __forceinline__ uint32_t ld_stream4(const void* p) {
  uint32_t v;
  asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t ld_stream2(const void* p) {
  unsigned short v;
  asm("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}

// Before pdl_wait(): asks L2 for the first bytes of this block's weights, [p, p + bytes), at most two 128-byte lines
// per thread. Weights never depend on an earlier kernel, so with PDL these loads overlap the previous kernel's tail
// and the launch gap; the block's own loads after the wait then hit L2. Only the first kPrefetchBlocks blocks (about
// the first wave) do it: run 1 let every block prefetch, and a large GEMV launched early behind another large one
// pulled its whole matrix into L2 while the first still streamed, evicting lines before use (q4_0 4096x14336: 79% of
// copy bandwidth -> 69%). (The bench/cuda/experiments sweeps call this form.)
constexpr unsigned kPrefetchBlocks = 256;
template <int THREADS>
__device__ __forceinline__ void prefetch_block_l2(const uint8_t* p, size_t bytes) {
  if (blockIdx.x >= kPrefetchBlocks) return;
  const size_t end = bytes < size_t{2} * THREADS * 128 ? bytes : size_t{2} * THREADS * 128;
  for (size_t off = static_cast<size_t>(threadIdx.x) * 128; off < end; off += THREADS * 128) prefetch_l2(p + off);
}

// How much of its weights a GEMV block asks L2 for before pdl_wait() (gemv.cu's early_l2(), CudaOptions::early_l2):
// in the decode graph every GEMV follows a small kernel (rmsnorm, attention, swiglu) that reads a few kilobytes, and
// the GEMV's blocks start (PDL) while it runs: memory bandwidth idles unless those blocks fetch their rows meanwhile.
// The first `blocks` blocks prefetch up to `bytes` each (0: two 128-byte lines per thread, the rule above), through
// per-thread prefetch instructions or, with `bulk`, cp.async.bulk.prefetch.L2 from one thread (a single instruction
// per 16 KB run: the block's rows are contiguous).
struct EarlyL2 {
  unsigned blocks = kPrefetchBlocks;
  unsigned bytes = 0;
  unsigned bulk = 0;
};

// [p, p + bytes) into L2 with bulk prefetches (sm_90): the range shrunk inward to 16-byte bounds, 16 KB per
// instruction.
__device__ __forceinline__ void bulk_prefetch_l2(const uint8_t* p, size_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uintptr_t lo = (a + 15) & ~uintptr_t{15};
  const uintptr_t hi = (a + bytes) & ~uintptr_t{15};
  constexpr uintptr_t kChunk = 16384;
  for (; lo < hi; lo += kChunk) {
    const uint32_t n = static_cast<uint32_t>(hi - lo < kChunk ? hi - lo : kChunk);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(lo), "r"(n) : "memory");
  }
#else
  (void)p, (void)bytes;
#endif
}

template <int THREADS>
__device__ __forceinline__ void prefetch_block_l2(const uint8_t* p, size_t bytes, const EarlyL2& e) {
  if (blockIdx.x >= e.blocks) return;
  const size_t cap = e.bytes != 0 ? e.bytes : size_t{2} * THREADS * 128;
  const size_t end = bytes < cap ? bytes : cap;
  if (e.bulk != 0) {
    if (threadIdx.x == 0) bulk_prefetch_l2(p, end);
    return;
  }
  for (size_t off = static_cast<size_t>(threadIdx.x) * 128; off < end; off += THREADS * 128) prefetch_l2(p + off);
}

// The early prefetch every decode GEMV launch passes (CudaOptions::early_l2, a study knob; default: EarlyL2{}).
EarlyL2 early_l2();

// The fused RMSNorm input of the quantized GEMVs (GemvInput::rms_sumsq): x was quantized without its 1/rms factor,
// and the GEMV scales its outputs by it.
struct RmsIn {
  const float* sumsq;  // [k/32] or nullptr
  float eps;
};

// 1/rms from rin's k/32 partial sums of squares for the calling warp (lane: its lane), or 1 without them: lane-strided
// sums, then the warp tree (a fixed order, so every GEMV kernel gets the same scale), correctly rounded as the rmsnorm
// kernel.
__device__ __forceinline__ float rms_out_scale(const RmsIn& rin, int lane, int k) {
  if (rin.sumsq == nullptr) return 1.0f;
  float ss = 0.0f;
  for (int i = lane; i < k / 32; i += kWarp) ss += rin.sumsq[i];
  return 1.0f / sqrtf(warp_sum(ss) / static_cast<float>(k) + rin.eps);
}

// The block-wide sum of v, returned to every thread (two barriers; only for the fused RMSNorm's sum of squares).
template <int THREADS>
__device__ __forceinline__ float block_sum_all(float v) {
  constexpr int kWarps = THREADS / kWarp;
  v = warp_sum(v);
  if constexpr (kWarps == 1) {
    return v;
  } else {
    __shared__ float part[kWarps];
    __shared__ float total;
    const int lane = threadIdx.x & (kWarp - 1), warp = threadIdx.x / kWarp;
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
      float t = lane < kWarps ? part[lane] : 0.0f;
      t = warp_sum(t);
      if (lane == 0) total = t;
    }
    __syncthreads();
    return total;
  }
}

// Sums acc[r] over the block and stores y[row0 + r] = scale * sum (rows past n are dropped); the storing thread
// (thread 0) is left holding the stored values in acc.
template <int THREADS, int ROWS>
__device__ __forceinline__ void block_sum_store(float (&acc)[ROWS], float* __restrict__ y, int row0, int n,
                                                bool accumulate, float scale = 1.0f) {
  constexpr int kWarps = THREADS / kWarp;
  const int lane = threadIdx.x & (kWarp - 1);
  const int warp = threadIdx.x / kWarp;
#pragma unroll
  for (int r = 0; r < ROWS; ++r) acc[r] = warp_sum(acc[r]);
  if constexpr (kWarps == 1) {
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
        if (row0 + r < n) y[row0 + r] = acc[r] = accumulate ? y[row0 + r] + acc[r] * scale : acc[r] * scale;
    }
  } else {
    __shared__ float part[ROWS][kWarps];
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r) part[r][warp] = acc[r];
    }
    __syncthreads();
    if (warp == 0) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        float v = lane < kWarps ? part[r][lane] : 0.0f;
        v = warp_sum(v);
        if (lane == 0 && row0 + r < n) y[row0 + r] = acc[r] = accumulate ? y[row0 + r] + v * scale : v * scale;
      }
    }
  }
}

// The SwiGLU epilogue (GemvInput::swiglu): the block's first ROWS/2 rows are gate rows g0 + j, the others the matching
// up rows; stores y[g0 + j] = silu(scale * gate_j) * (scale * up_j) for the gate rows below n_out.
template <int THREADS, int ROWS>
__device__ __forceinline__ void block_sum_store_swiglu(float (&acc)[ROWS], float* __restrict__ y, int g0, int n_out,
                                                       float scale) {
  static_assert(ROWS % 2 == 0, "the SwiGLU epilogue pairs gate and up rows");
  constexpr int kWarps = THREADS / kWarp;
  constexpr int H = ROWS / 2;
  const int lane = threadIdx.x & (kWarp - 1);
  const int warp = threadIdx.x / kWarp;
#pragma unroll
  for (int r = 0; r < ROWS; ++r) acc[r] = warp_sum(acc[r]);
  if constexpr (kWarps == 1) {
    if (lane == 0) {
#pragma unroll
      for (int j = 0; j < H; ++j)
        if (g0 + j < n_out) y[g0 + j] = silu_mul(acc[j] * scale, acc[H + j] * scale);
    }
  } else {
    __shared__ float part[ROWS][kWarps];
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r) part[r][warp] = acc[r];
    }
    __syncthreads();
    if (warp == 0) {
#pragma unroll
      for (int j = 0; j < H; ++j) {
        const float gv = warp_sum(lane < kWarps ? part[j][lane] : 0.0f);
        const float uv = warp_sum(lane < kWarps ? part[H + j][lane] : 0.0f);
        if (lane == 0 && g0 + j < n_out) y[g0 + j] = silu_mul(gv * scale, uv * scale);
      }
    }
  }
}

// Resident blocks per SM of a kernel (the callers cache it per instantiation: Tessera drives one device per process);
// the quantized and float launchers compare it to pick their register-capped copies.
template <typename Kernel>
int blocks_per_sm(Kernel kernel, int threads) {
  int blocks = 0;
  TESSERA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, 0));
  return blocks;
}

// Every launch shape the benchmark can time: threads per block, rows per block, loads in flight per row, and whether
// each step prefetches the next step's weights into L2. gemv_default_config picks from these by shape
// (docs/CUDA_NOTES.md has the measurements behind the choice).
struct Shape {
  int threads, rows, unroll, prefetch;
};
// The last nine are K-quant candidates (tessera_bench_kquant --all-configs): a 64-element unit per thread and step
// leaves a 4096-wide row (64 units) one step for 64 threads, with nothing for the pipeline to overlap, and a 2048-wide
// row (32 units) half the threads idle: one warp per block (two steps, or one full one), or eight rows per block; the
// last three are one-warp blocks with a 4096-wide row's 64 units in flight in one step (2 or 4 slots per lane).
constexpr Shape kShapes[] = {
    {64, 1, 4, 0},  {128, 1, 4, 0}, {256, 1, 4, 0}, {128, 1, 8, 0}, {256, 1, 8, 0}, {64, 2, 2, 0},  {128, 2, 2, 0},
    {256, 2, 2, 0}, {128, 2, 4, 0}, {256, 2, 4, 0}, {64, 4, 2, 0},  {128, 4, 1, 0}, {256, 4, 1, 0}, {128, 4, 2, 0},
    {256, 4, 2, 0}, {64, 2, 2, 1},  {128, 2, 2, 1}, {256, 2, 2, 1}, {128, 4, 2, 1}, {64, 1, 4, 1},
    // quantized defaults at 4096-6144 x 4096 (experiments/gemv_quant_sweep.cu), then the K-quant candidates
    {64, 4, 1, 0},  {64, 2, 1, 0},  {32, 4, 1, 0},  {32, 2, 2, 0},  {32, 8, 1, 0},  {64, 8, 1, 0},  {32, 4, 2, 0},
    {32, 2, 4, 0},  {32, 1, 4, 0},
};
constexpr int kNumShapes = static_cast<int>(sizeof(kShapes) / sizeof(kShapes[0]));

// The launch shapes with the quantized norm_out epilogue (GemvInput::norm_out_*), as warp groups: a block of kQ / rows
// warps owns 32 rows and each warp streams its rows as a 32-thread block of the shape's rows and unroll would (the
// shape's thread count is not used). Rows 2 or 4 (512 or 256 threads: 1,024-thread blocks would cap registers at 64),
// at most 2 loads in flight per row.
constexpr bool has_norm_out_groups(const Shape& s) {
  return s.prefetch == 0 && (s.rows == 2 || s.rows == 4) && s.unroll <= 2;
}

// The launch shapes a quantized format's kernels are compiled for. ptxas spills (an error in this build) where a q6_K
// or q5_K unit's three or four vectors per row and slot, doubled by the pipeline, meet more than four rows x slots (and
// q3_K's two vectors with its hmask and scale arithmetic: 40 bytes at 4 rows x 2 slots), and where any
// K-quant meets the register cap of a 512- or 1,024-thread warp-group block (128 or 64 registers per thread).
constexpr int max_rows_unroll(DType d) { return d == DType::Q6_K || d == DType::Q5_K || d == DType::Q3_K ? 4 : 8; }
constexpr int max_group_threads(DType d) {
  // tq1_0 runs as tq2_0 (weights.cpp): callers holding the file's format get tq2_0's answer.
  return d == DType::Q4_K || d == DType::Q5_K || d == DType::Q6_K || d == DType::IQ4_XS || d == DType::Q2_K ||
                 d == DType::Q3_K || d == DType::TQ2_0 || d == DType::TQ1_0
             ? 256
             : 1024;
}
constexpr bool shape_compiled(DType d, const Shape& s) { return s.rows * s.unroll <= max_rows_unroll(d); }
// Block size of the warp-group norm_out epilogue (GemvInput::norm_out_*) at launch shape s.
constexpr int norm_out_group_threads(const Shape& s) { return kWarp * (kQ / s.rows); }

struct LaunchArgs {
  const DeviceWeight* w;  // with GemvInput::swiglu: [gate; up], 2 * n_out rows
  const GemvInput* x;
  float* y;
  cudaStream_t stream;
  bool accumulate;
};

// Launches the kernel of w->dtype with shape kShapes[index] (defined in gemv_float.cu and gemv_quant.cu, so the two
// families compile in parallel).
void launch_gemv_float(int index, const LaunchArgs& a);

void launch_gemv_quant(int index, const LaunchArgs& a);
// The K-quants (q4_K, q6_K) of launch_gemv_quant, in gemv_kquant.cu.
void launch_gemv_kquant(int index, const LaunchArgs& a);
// tq2_0 (ternary) of launch_gemv_quant, in gemv_ternary.cu.
void launch_gemv_ternary(int index, const LaunchArgs& a);
// tq2_0's x-stationary kernel (GemvConfig::stationary), in gemv_tq2.cu: rows per block c.rows (4 or 8).
void launch_gemv_tq2_stationary(const GemvConfig& c, const LaunchArgs& a);
// iq4_nl's x-stationary kernel (GemvConfig::stationary), in gemv_qxs.cu: its one compiled launch shape, kIq4nlXsWarps
// warps of one 32-block per lane (k = 4096) and kIq4nlXsRows rows per block.
constexpr int kIq4nlXsWarps = 4, kIq4nlXsRows = 4;
void launch_gemv_q_stationary(const GemvConfig& c, const LaunchArgs& a);

}  // namespace tessera::cuda::detail
