// Device helpers shared by the CUDA kernels (included by .cu files only).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace tessera::cuda::detail {

constexpr int kWarp = 32;
constexpr int kQ = 32;  // elements per quantization block (q8_0, q4_0, q4_1 and the q8 activations)

// 16-byte load that bypasses L1 allocation: weights are read exactly once, so they should not evict the activation
// vector, which every block re-reads from L1. Read-only (.nc) path: the weights never change during a kernel.
__device__ __forceinline__ uint4 ld_stream16(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = kWarp / 2; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = kWarp / 2; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

__device__ __forceinline__ int warp_sum_int(int v) {
#pragma unroll
  for (int off = kWarp / 2; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// bf16 pairs packed in a 32-bit word -> two floats: a bf16 is the top half of a float, so this is a shift and a mask.
__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

__device__ __forceinline__ float2 half2_to_float2(uint32_t w) {
  __half2 h;
  memcpy(&h, &w, 4);
  return __half22float2(h);
}

// Quantizes one block of 32 values held one per lane (the whole warp takes part): q = round(v / d) with
// d = max|v| / 127, exactly as the host reference does it (same IEEE operations: d = amax / 127, id = 1 / d,
// q = roundf(v * id)), so device and host quantizations agree bit for bit. Returns q; lane 0 gets (d, d * sum(q)).
__device__ __forceinline__ int8_t quantize_lane_q8(float v, float2* ds_out) {
  const float amax = warp_max(fabsf(v));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const int q = static_cast<int>(roundf(v * id));
  const int sum = warp_sum_int(q);
  if ((threadIdx.x & (kWarp - 1)) == 0) *ds_out = make_float2(d, d * static_cast<float>(sum));
  return static_cast<int8_t>(q);
}

inline int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

inline std::string num(int64_t v) { return std::to_string(v); }

// The current device's multiprocessor count (cached per process; Tessera drives one device per process).
int sm_count();

}  // namespace tessera::cuda::detail
