// The x-stationary GEMV for the 32-block formats (issue 21): each lane holds the q8 activation of the 32-blocks it
// covers in registers for the whole launch and streams weight rows past it, as tq2_0's (gemv_tq2_kernel.cuh). The
// shared quantized kernel (gemv_quant_kernel.cuh) reloads a block's 32 activation bytes (through L1) for every few
// rows of 16-18 weight bytes; here x is read once per warp. src compiles it for iq4_nl only (gemv_qxs.cu): the sweep
// (bench/cuda/experiments/gemv_q4_stationary_sweep.cu, which includes this header) measured it faster than the shared
// kernel for iq4_nl at 14336x4096 and 28672x4096 and slower for q4_0, q4_1 and q8_0 at every shape.
//
// Work split: a block of WARPS warps owns R consecutive rows, loaded in one step; warp w covers the 32-blocks
// [w bw, (w + 1) bw) of every row (bw = K / 32 / WARPS, at most 32 P: lane l takes blocks l, l + 32, ..., P of them).
// The arithmetic is the shared kernel's block_dot; each warp sums its R partial rows (tq2_rows_sum's halving shuffles)
// into shared memory, and the block's first R threads add the warps' parts and store.
#pragma once

#include "backends/cuda/kernels/gemv_quant_kernel.cuh"
#include "backends/cuda/kernels/gemv_tq2_kernel.cuh"

namespace tessera::cuda::detail {
namespace {

// y[row] (+)= out_scale * W[row] . x for rows [blockIdx.x * R, + R). Requires K % 32 == 0, (K / 32) % WARPS == 0 and
// 32 (P - 1) < K / 32 / WARPS <= 32 P (qxs_config_fits). rin: GemvInput::rms_sumsq (x quantized without its 1/rms;
// out_scale = 1 / rms from the per-32 sums of squares, summed in a fixed order as the shared kernel does). No
// norm_out or SwiGLU epilogue.
template <DType D, int WARPS, int R, int P>
__global__ void __launch_bounds__(WARPS * 32)
    gemv_q_stationary(const uint8_t* __restrict__ quants, const uint8_t* __restrict__ scales,
                      const int8_t* __restrict__ xq /*[k]*/, const float2* __restrict__ xds /*[k/32]*/,
                      float* __restrict__ y /*[n]*/, int n, int k, bool accumulate, RmsIn rin) {
  static_assert(R >= 1 && R <= 32 && (R & (R - 1)) == 0, "tq2_rows_sum takes a power of two <= 32 rows");
  constexpr int QB = QuantFmt<D>::kQuantBytes, SB = QuantFmt<D>::kScaleBytes;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int nb = k / 32, bw = nb / WARPS;
  const int row0 = static_cast<int>(blockIdx.x) * R;
  int pos[P];
  bool ok[P];
#pragma unroll
  for (int j = 0; j < P; ++j) {
    const int l = lane + 32 * j;
    ok[j] = l < bw;
    pos[j] = warp * bw + (ok[j] ? l : 0);
  }
  // The block's R rows (the last block's rows past n repeat row n - 1: loaded, summed, never stored).
  uint4 wv[R][P][QB / 16];
  uint32_t sc[R][P];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const size_t row = static_cast<size_t>(min(row0 + r, n - 1));
#pragma unroll
    for (int j = 0; j < P; ++j) {
      if (ok[j]) {
        load_block<QB, SB>(quants + row * nb * QB, scales + row * nb * SB, pos[j], wv[r][j], sc[r][j]);
      } else {
#pragma unroll
        for (int v = 0; v < QB / 16; ++v) wv[r][j][v] = make_uint4(0, 0, 0, 0);
        sc[r][j] = 0;
      }
    }
  }
  // The weights never depend on an earlier kernel: their loads are in flight before the wait (PDL); x is the
  // previous kernel's output.
  pdl_wait();
  int xv[P][8];
  float2 ds[P];
#pragma unroll
  for (int j = 0; j < P; ++j) {
    const int4 x0 = __ldg(reinterpret_cast<const int4*>(xq) + 2 * pos[j]);
    const int4 x1 = __ldg(reinterpret_cast<const int4*>(xq) + 2 * pos[j] + 1);
    xv[j][0] = x0.x, xv[j][1] = x0.y, xv[j][2] = x0.z, xv[j][3] = x0.w;
    xv[j][4] = x1.x, xv[j][5] = x1.y, xv[j][6] = x1.z, xv[j][7] = x1.w;
    ds[j] = __ldg(xds + pos[j]);
  }
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    acc[r] = 0.0f;
#pragma unroll
    for (int j = 0; j < P; ++j)
      if (ok[j]) acc[r] += block_dot<D>(wv[r][j], sc[r][j], xv[j], ds[j]);
  }
  // RMS, after the dot products (the weights' registers are free by then: ptxas gave 48 registers with it before them,
  // 40 here, as without it): only warp 0 stores (threads < R <= 32), so only it sums the k/32 partial sums,
  // lane-strided then the warp tree (the shared kernel's fixed order, so both give the same scale).
  const float out_scale = warp == 0 ? rms_out_scale(rin, lane, k) : 1.0f;
  __shared__ float part[WARPS][R];
  int row_of_lane;
  const float sum = tq2_rows_sum<R>(acc, lane, row_of_lane);
  if (lane % (32 / R) == 0) part[warp][row_of_lane] = sum;
  __syncthreads();
  const int t = static_cast<int>(threadIdx.x);
  if (t < R && row0 + t < n) {
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) v += part[w][t];
    y[row0 + t] = accumulate ? y[row0 + t] + v * out_scale : v * out_scale;
  }
}

// Whether (WARPS, P) covers rows of k columns: whole 32-blocks split evenly over the warps, each warp's share needing
// exactly P blocks per lane.
inline bool qxs_config_fits(int warps, int p, int64_t k) {
  if (k % 32 != 0) return false;
  const int64_t nb = k / 32;
  if (nb % warps != 0) return false;
  const int64_t bw = nb / warps;
  return bw > 32 * (p - 1) && bw <= 32 * p;
}

}  // namespace
}  // namespace tessera::cuda::detail
