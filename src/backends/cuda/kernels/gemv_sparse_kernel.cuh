// The sparse GEMV kernels' shared pieces (gemv_sparse.cu: bf16/f16; gemv_sparse_quant.cu: q8_0, q4_0, q4_1).
#pragma once

#include "backends/cuda/kernels/gemv_common.cuh"
#include "backends/cuda/kernels/gemv_sparse.h"

namespace tessera::cuda::detail {

// In gemv_sparse_quant.cu: the quantized formats' copy and launch (gemv_sparse.h's make_sparse_weight, gemv_sparse).
SparseWeight make_sparse_quant(const DeviceWeight& w, cudaStream_t stream);
void launch_sparse_quant(const SparseWeight& w, const SparseEntry* list, const int32_t* count, float* y,
                         bool accumulate, SparseGemvWorkspace& ws, cudaStream_t stream, int splits);

constexpr int kGemvThreads = 256;
constexpr int kGemvUnroll = 4;

// SPARSIFY's calibrated rule, as the channel-major GEMVs apply it to x themselves: kept when !(|v| <= threshold) and
// v != 0 (threshold 0: x's nonzero entries, for an x SPARSIFY's top-k already zeroed; a NaN is kept).
__device__ __forceinline__ bool sparse_keep(float v, float threshold) { return !(fabsf(v) <= threshold) && v != 0.0f; }

// Block-wide exclusive prefix sum of v (every thread of a block of at most 1024 calls it); *total gets the sum of all
// v. smem: 32 ints, free again when it returns.
__device__ __forceinline__ int block_scan_excl(int v, int* total, int* smem /*[32]*/) {
  const int lane = threadIdx.x & (kWarp - 1), warp = threadIdx.x / kWarp;
  const int warps = static_cast<int>(blockDim.x) / kWarp;
  int inc = v;
#pragma unroll
  for (int off = 1; off < kWarp; off <<= 1) {
    const int o = __shfl_up_sync(0xffffffffu, inc, off);
    if (lane >= off) inc += o;
  }
  if (lane == kWarp - 1) smem[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    int s = lane < warps ? smem[lane] : 0;
#pragma unroll
    for (int off = 1; off < kWarp; off <<= 1) {
      const int o = __shfl_up_sync(0xffffffffu, s, off);
      if (lane >= off) s += o;
    }
    smem[lane] = s;
  }
  __syncthreads();
  const int base = warp > 0 ? smem[warp - 1] : 0;
  *total = smem[warps - 1];
  __syncthreads();  // smem is reused by the next call
  return base + inc - v;
}

// The end of every sparse GEMV block (tile blockIdx.x, slice blockIdx.y of `splits`): each thread holds RPT rows'
// sums (rows g * RPT .. of the tile, g = threadIdx.x % G with G = TILE / RPT threads per channel); they meet in shared
// memory in a fixed order, and with splits > 1 each block stores its TILE partial sums and the tile's last block (a
// ticket per tile, reset by that block) adds the splits' partials in slice order: no value atomics, the same list
// gives the same bits.
template <int TILE, int RPT, int THREADS>
__device__ __forceinline__ void sparse_epilogue(float (&acc)[RPT], float* __restrict__ y /*[n]*/,
                                                float* __restrict__ partial /*[splits, tiles * TILE]*/,
                                                unsigned int* __restrict__ tickets, int n, int splits,
                                                bool accumulate) {
  constexpr int G = TILE / RPT;
  static_assert(G <= kWarp && TILE <= THREADS, "a channel's run fits one warp, and a thread sums each row at the end");
  const int tile = blockIdx.x, s = blockIdx.y;
  // Lanes l, l ^ G, l ^ 2G, ... of a warp hold the same rows.
#pragma unroll
  for (int off = G; off < kWarp; off <<= 1)
#pragma unroll
    for (int r = 0; r < RPT; ++r) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
  constexpr int kWarps = THREADS / kWarp;
  __shared__ float part[kWarps][TILE + 1];
  const int lane = threadIdx.x & (kWarp - 1), warp = threadIdx.x / kWarp;
  if (lane < G) {
#pragma unroll
    for (int r = 0; r < RPT; ++r) part[warp][lane * RPT + r] = acc[r];
  }
  __syncthreads();
  const int t = threadIdx.x;
  const int row = tile * TILE + t;
  const size_t stride = static_cast<size_t>(gridDim.x) * TILE;
  if (t < TILE) {
    float sum = 0.0f;
#pragma unroll
    for (int wi = 0; wi < kWarps; ++wi) sum += part[wi][t];
    if (splits == 1) {
      if (row < n) y[row] = accumulate ? y[row] + sum : sum;
    } else {
      partial[s * stride + row] = sum;
      __threadfence();
    }
  }
  if (splits == 1) return;
  __shared__ bool last;
  __syncthreads();
  if (t == 0) {
    const unsigned int done = atomicAdd(&tickets[tile], 1u);
    last = done == static_cast<unsigned int>(splits - 1);
    if (last) tickets[tile] = 0;
  }
  __syncthreads();
  if (last && t < TILE) {
    __threadfence();
    // In slice order, 8 loads in flight at a time (one by one, the L2 latencies added up to microseconds of tail).
    float sum = 0.0f;
    for (int i0 = 0; i0 < splits; i0 += 8) {
      float v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) v[u] = i0 + u < splits ? __ldcg(partial + (i0 + u) * stride + row) : 0.0f;
#pragma unroll
      for (int u = 0; u < 8; ++u)
        if (i0 + u < splits) sum += v[u];
    }
    if (row < n) y[row] = accumulate ? y[row] + sum : sum;
  }
}

}  // namespace tessera::cuda::detail
