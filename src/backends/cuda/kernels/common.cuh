// Device helpers shared by the CUDA kernels (included by .cu files only).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <utility>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels.h"

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

// SwiGLU's silu(g) * u, one definition for the swiglu kernels and the GEMV epilogue that folds it (the same values).
__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

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

// ---- 16-bit values (bf16 or f16): rounded to nearest even, as the host's f32_to_bf16 / f32_to_fp16 ----
// A 16-bit output written by any kernel is therefore bit-identical to its f32 output converted elsewhere.
__device__ __forceinline__ uint16_t to16(float v, bool bf16) {
  return bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(v)) : __half_as_ushort(__float2half_rn(v));
}
__device__ __forceinline__ float from16(uint16_t v, bool bf16) {
  return bf16 ? __uint_as_float(static_cast<uint32_t>(v) << 16) : __half2float(__ushort_as_half(v));
}
// Two values in one word, lo in the low half (one paired conversion instruction).
__device__ __forceinline__ uint32_t pack16x2(float lo, float hi, bool bf16) {
  uint32_t u;
  if (bf16) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    memcpy(&u, &h, 4);
  } else {
    const __half2 h = __floats2half2_rn(lo, hi);
    memcpy(&u, &h, 4);
  }
  return u;
}
// The same by element type, for templated kernels (f32: unchanged).
template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}

// Float formats: 16 bytes hold 4 (f32) or 8 (f16, bf16) elements.
template <DType D>
struct FloatFmt;
template <>
struct FloatFmt<DType::F32> {
  static constexpr int kElems = 4;
  __device__ static void to_float(const uint4& v, float (&f)[4]) {
    f[0] = __uint_as_float(v.x), f[1] = __uint_as_float(v.y), f[2] = __uint_as_float(v.z), f[3] = __uint_as_float(v.w);
  }
};
template <>
struct FloatFmt<DType::F16> {
  static constexpr int kElems = 8;
  __device__ static void to_float(const uint4& v, float (&f)[8]) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 p = half2_to_float2(w[i]);
      f[2 * i] = p.x, f[2 * i + 1] = p.y;
    }
  }
};
template <>
struct FloatFmt<DType::BF16> {
  static constexpr int kElems = 8;
  __device__ static void to_float(const uint4& v, float (&f)[8]) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) f[2 * i] = bf16_lo(w[i]), f[2 * i + 1] = bf16_hi(w[i]);
  }
};

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

// An attribute of the current device, read once per process (Tessera drives one device per process).
template <cudaDeviceAttr A>
int device_attribute() {
  static const int v = [] {
    int dev = 0, x = 0;
    TESSERA_CUDA_CHECK(cudaGetDevice(&dev));
    TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&x, A, dev));
    return x;
  }();
  return v;
}

// The current device's multiprocessor count.
int sm_count();

// Asks L2 to fetch the line holding p (no register, no fault on an address past the end): bytes in flight for the
// next step without holding them in registers.
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// ---- Programmatic Dependent Launch (PDL) ----
// Decode runs ~300 small kernels per token; between two dependent kernels the GPU drains the first grid, flushes its
// memory and only then starts launching the second (~2 us, even inside a CUDA graph). With PDL the next kernel is
// launched while the previous one still runs: its blocks do what depends on nothing (the GEMVs prefetch their weights
// into L2), then wait in pdl_wait() until the previous grid has finished and its writes are visible.
//
// Every kernel launched through launch() must call pdl_wait() before its first read of anything an earlier kernel
// wrote AND before its first global write, in every block (blocks that return early call it first too): kernel N+1's
// wait covers kernel N only, so the chain is ordered only if every kernel waits before it can finish.

// Waits until the grid this one depends on has completed and its memory is visible, then lets the next grid in the
// stream start launching (its blocks then occupy free slots and run their own pre-wait part). Triggering after the
// wait, not before, keeps at most one grid waiting behind the running one. A no-op without the PDL attribute.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// ---- Thread-block clusters (sm_90) ----
// The block's rank in its cluster, the cluster barrier's two halves, and a store into another block's shared memory
// (the same variable in the block of rank `rank`: distributed shared memory). A block may write into another's shared
// memory only once that block runs (an arrive at the start, the wait before the first remote store), and must not
// exit while others may still write into it.
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
#endif
  return r;
}
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_arrive_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait_acquire() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire;" ::: "memory");
#endif
}
__device__ __forceinline__ void store_cluster_f32(float* local, unsigned rank, float v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const auto a = static_cast<uint32_t>(__cvta_generic_to_shared(local));
  uint32_t remote = 0;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(a), "r"(rank));
  asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(remote), "f"(v) : "memory");
#else
  (void)rank;
  *local = v;
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...) through cudaLaunchKernelEx with the programmatic-stream-serialization
// attribute when PDL is on (CUDA graphs capture it as a programmatic edge), checked like TESSERA_CUDA_CHECK_LAUNCH.
// launch_cluster: the same with clusters of `cluster` blocks along x (grid.x a multiple of it; above 8 the kernel must
// allow non-portable cluster sizes).
template <typename... KArgs, typename... Args>
void launch_cluster(const char* name, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                    cudaStream_t stream, unsigned cluster, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (pdl_enabled()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster;
    attr[n].val.clusterDim.y = 1;
    attr[n++].val.clusterDim.z = 1;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  check_cuda(cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(std::forward<Args>(args))...), name, __FILE__,
             __LINE__);
}

template <typename... KArgs, typename... Args>
void launch(const char* name, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            Args&&... args) {
  launch_cluster(name, kernel, grid, block, smem, stream, 1u, std::forward<Args>(args)...);
}

}  // namespace tessera::cuda::detail
