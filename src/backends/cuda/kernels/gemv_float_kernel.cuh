// The float-weight GEMV kernel (f32, f16, bf16 weights; f32 x and accumulation), included by gemv_float.cu (launch
// shapes, dispatch) and by its experiment bench/cuda/experiments/gemv_float_sweep.cu, so the experiment times the
// kernel src/ runs. Why the kernels look the way they do: see gemv.cu.
#pragma once

#include "backends/cuda/kernels/gemv_common.cuh"

namespace tessera::cuda::detail {
namespace {

// acc[r] += w[r] · x over one 16-byte vector of each row (E elements of x at xp). With the fused RMSNorm (nw, the
// norm weight at the same offset, non-null) x is multiplied by nw first and ss collects the raw x squared.
template <typename F, int ROWS, bool NORM>
__device__ __forceinline__ void float_step(const uint4 (&wv)[ROWS], const float* __restrict__ xp,
                                           const float* __restrict__ nw, float (&acc)[ROWS], float& ss) {
  constexpr int E = F::kElems;
  float xf[E];
#pragma unroll
  for (int j = 0; j < E / 4; ++j) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(xp) + j);
    xf[4 * j] = v.x, xf[4 * j + 1] = v.y, xf[4 * j + 2] = v.z, xf[4 * j + 3] = v.w;
  }
  if constexpr (NORM) {
#pragma unroll
    for (int j = 0; j < E / 4; ++j) {
      const float4 g = __ldg(reinterpret_cast<const float4*>(nw) + j);
      ss = fmaf(xf[4 * j], xf[4 * j], ss), xf[4 * j] *= g.x;
      ss = fmaf(xf[4 * j + 1], xf[4 * j + 1], ss), xf[4 * j + 1] *= g.y;
      ss = fmaf(xf[4 * j + 2], xf[4 * j + 2], ss), xf[4 * j + 2] *= g.z;
      ss = fmaf(xf[4 * j + 3], xf[4 * j + 3], ss), xf[4 * j + 3] *= g.w;
    }
  }
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    float wf[E];
    F::to_float(wv[r], wf);
#pragma unroll
    for (int e = 0; e < E; ++e) acc[r] = fmaf(wf[e], xf[e], acc[r]);
  }
}

// y[n] = W[n, k] · x[k], one block per ROWS rows, software-pipelined as the quantized kernel (gemv_quant.cu):
//  - the first step's weight loads go into registers before pdl_wait(): weights never depend on an earlier kernel,
//    so with PDL their DRAM latency overlaps the previous kernel's tail instead of following it (the L2 prefetch of
//    the block's first lines stays: in the quantized sweep, dropping it cost 2-15%);
//  - step s+1's loads are issued before step s's arithmetic, so each thread always has a step in flight;
//  - each slot (one 16-byte vector per thread per row) is guarded, so a row's tail is an ordinary step.
// Thread t reads elements t * E + j * THREADS * E, j = 0, 1, ..., and adds them in that order, exactly as the kernel
// before the pipeline did: the results are bit for bit the same (gemv_float_sweep.cu checks it).
//
// NORM is a template parameter, not a run-time flag: as a flag (run 3) the plain kernel lost 2-6% at the issue's
// shapes, ptxas scheduling the loads around the never-taken branch. SWIGLU (GemvInput::swiglu): w is [gate; up]
// (2n rows), a block takes ROWS/2 gate rows and the matching up rows, and writes y[n] = silu(gate · x) * (up · x):
// the swiglu launch after the merged gate|up GEMV disappears. Each row's sum is computed exactly as without it.
// The body is a device function so that the experiment can wrap it in variants of the kernel (gemv_float_sweep.cu).
template <DType D, int THREADS, int ROWS, int UNROLL, int PF, bool NORM, bool SWIGLU>
__device__ __forceinline__ void gemv_float_rows(const uint8_t* __restrict__ w /*[n, k], SWIGLU: [2n, k]*/,
                                                const float* __restrict__ x /*[k]*/, float* __restrict__ y /*[n]*/,
                                                int n, int k, bool accumulate,
                                                const float* __restrict__ norm_w /*[k] or null*/, float norm_eps,
                                                const EarlyL2& early = EarlyL2{}) {
  using F = FloatFmt<D>;
  constexpr int E = F::kElems;
  constexpr int kElemBytes = 16 / E;
  constexpr int kSlot = THREADS * E;      // elements of a row one slot covers (one vector per thread)
  constexpr int kStep = kSlot * UNROLL;   // elements of a row one step covers
  const uint8_t* wr[ROWS];
  int row0;
  if constexpr (SWIGLU) {
    constexpr int H = ROWS / 2;
    row0 = blockIdx.x * H;
#pragma unroll
    for (int r = 0; r < H; ++r) {
      wr[r] = w + static_cast<size_t>(min(row0 + r, n - 1)) * k * kElemBytes;
      wr[H + r] = w + static_cast<size_t>(n + min(row0 + r, n - 1)) * k * kElemBytes;
    }
    prefetch_block_l2<THREADS>(wr[0], static_cast<size_t>(min(H, n - row0)) * k * kElemBytes, early);
    prefetch_block_l2<THREADS>(wr[H], static_cast<size_t>(min(H, n - row0)) * k * kElemBytes, early);
  } else {
    row0 = blockIdx.x * ROWS;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) wr[r] = w + static_cast<size_t>(min(row0 + r, n - 1)) * k * kElemBytes;
    prefetch_block_l2<THREADS>(wr[0], static_cast<size_t>(min(ROWS, n - row0)) * k * kElemBytes, early);
  }
  // Slot u of the step at b0 covers elements b0 + u * kSlot .. + E of each row; slots past the row's end load nothing
  // (k is a multiple of E: upload_weight keeps rows 16-byte aligned).
  auto load_step = [&](int b0, uint4(&wv)[UNROLL][ROWS]) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (b0 + u * kSlot < k) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) wv[u][r] = ld_stream16(wr[r] + static_cast<size_t>(b0 + u * kSlot) * kElemBytes);
      }
  };
  float acc[ROWS] = {};
  float ss = 0.0f;  // sum of x^2 for the fused RMSNorm (every block streams all of x, so it can norm by itself)
  int base = threadIdx.x * E;
  uint4 wv[UNROLL][ROWS] = {};
  load_step(base, wv);
  pdl_wait();
  while (base < k) {
    if constexpr (PF > 0) {
      const int ahead = base + (PF + 1) * kStep;
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
          if (ahead + u * kSlot < k) prefetch_l2(wr[r] + static_cast<size_t>(ahead + u * kSlot) * kElemBytes);
    }
    uint4 wn[UNROLL][ROWS] = {};
    if (base + kStep < k) load_step(base + kStep, wn);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (base + u * kSlot < k)
        float_step<F, ROWS, NORM>(wv[u], x + base + u * kSlot, NORM ? norm_w + base + u * kSlot : nullptr, acc, ss);
    base += kStep;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
#pragma unroll
      for (int r = 0; r < ROWS; ++r) wv[u][r] = wn[u][r];
  }
  // Correctly rounded 1/sqrt, as the rmsnorm kernel: the fused and unfused paths differ only in summation order.
  float scale = 1.0f;
  if constexpr (NORM) scale = 1.0f / sqrtf(block_sum_all<THREADS>(ss) / static_cast<float>(k) + norm_eps);
  if constexpr (SWIGLU)
    block_sum_store_swiglu<THREADS, ROWS>(acc, y, row0, n, scale);
  else if constexpr (NORM)
    block_sum_store<THREADS, ROWS>(acc, y, row0, n, accumulate, scale);
  else
    block_sum_store<THREADS, ROWS>(acc, y, row0, n, accumulate);
}

// CAP: __launch_bounds__(THREADS, 1024 / THREADS), i.e. at most 64 registers, so 1024 threads fit per SM. The
// pipeline holds two steps of weights in registers (61-122 per thread, ptxas -v; the fused RMSNorm adds ~10-30),
// which can push a grid that one wave would hold into a second one; use_capped_kernel says when to trade.
template <DType D, int THREADS, int ROWS, int UNROLL, int PF, bool NORM, bool SWIGLU = false, bool CAP = false>
__global__ void __launch_bounds__(THREADS, CAP ? 1024 / THREADS : 1)
    gemv_float_kernel(const uint8_t* __restrict__ w /*[n, k], SWIGLU: [2n, k]*/, const float* __restrict__ x /*[k]*/,
                      float* __restrict__ y /*[n]*/, int n, int k, bool accumulate,
                      const float* __restrict__ norm_w /*[k] or null*/, float norm_eps, EarlyL2 early) {
  gemv_float_rows<D, THREADS, ROWS, UNROLL, PF, NORM, SWIGLU>(w, x, y, n, k, accumulate, norm_w, norm_eps, early);
}

// Only 16-bit weights at launch shapes of at most 4 vectors per row per step have a capped instantiation: ptxas fits
// their pipeline in 64 registers without spills (ptxas -v, --warn-on-spills); 8 vectors spilled 92-300 bytes, and f32
// weights spilled 8-136 bytes at 4.
template <DType D>
constexpr bool float_cappable(const Shape& s) {
  return FloatFmt<D>::kElems == 8 && s.rows * s.unroll <= 4 && s.prefetch == 0;
}

// The capped kernel where it turns a grid of more than one wave of the plain kernel into one wave (blocks per SM from
// the occupancy calculator; the quantized sweep measured that case +9%, q4_0 4096x14336), and always for the fused
// RMSNorm and SwiGLU variants, whose extra registers (up to 95 at 128/4/1) cost the most occupancy: the float sweep
// (gemv_float_sweep.cu, H100, 2026-11-22) measured capped +norm/+swiglu at 98-107% of copy at Llama-3-8B's shapes vs
// 95-99% uncapped (SmolLM2 gate|up +swiglu 2.83 vs 4.01 us), and plain capped kernels within 1-4% either way.
inline bool use_capped_kernel(int64_t grid, int plain_per_sm, int capped_per_sm, int sms, bool fused) {
  if (fused) return true;
  return grid > static_cast<int64_t>(plain_per_sm) * sms && grid <= static_cast<int64_t>(capped_per_sm) * sms;
}

}  // namespace
}  // namespace tessera::cuda::detail
