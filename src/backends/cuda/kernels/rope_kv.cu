// RoPE for one decode token, fused with storing k and v into the KV cache: one launch instead of three, and k never
// goes back to memory in f32 after its rotation.
#include <algorithm>
#include <cstdint>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/common.cuh"

namespace tessera::cuda {
namespace detail {
namespace {

constexpr int kMaxHd = 512;

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

// Blocks [0, n_head): q heads; [n_head, n_head + n_kv): k heads; then n_kv v heads (copied, not rotated).
template <typename T>
__global__ void rope_store_kv_kernel(float* q /*[n_head, hd]*/, const float* __restrict__ k /*[n_kv, hd]*/,
                                     const float* __restrict__ v /*[n_kv, hd]*/, T* __restrict__ kc,
                                     T* __restrict__ vc /*[n_kv, n_ctx, hd]*/, const int32_t* __restrict__ pos_ptr,
                                     int n_head, int n_kv, int hd, int n_ctx, int rope_dim,
                                     const float* __restrict__ inv_freq /*[rope_dim/2]*/, bool neox) {
  __shared__ float xs[kMaxHd];
  const int pos = *pos_ptr;
  const bool valid = pos >= 0 && pos < n_ctx;
  const int head = blockIdx.x;
  const bool is_q = head < n_head;
  const bool is_v = head >= n_head + n_kv;
  const int kvh = is_q ? 0 : (is_v ? head - n_head - n_kv : head - n_head);
  const float* src = is_q ? q + static_cast<size_t>(head) * hd : (is_v ? v : k) + static_cast<size_t>(kvh) * hd;
  if (!valid) {
    if (is_q)
      for (int e = threadIdx.x; e < hd; e += blockDim.x)
        q[static_cast<size_t>(head) * hd + e] = __int_as_float(0x7fc00000);
    return;
  }
  T* cache_row = (is_v ? vc : kc) + (static_cast<size_t>(kvh) * n_ctx + pos) * hd;
  if (is_v) {
    for (int e = threadIdx.x; e < hd; e += blockDim.x) cache_row[e] = from_float<T>(src[e]);
    return;
  }
  for (int e = threadIdx.x; e < hd; e += blockDim.x) xs[e] = src[e];
  __syncthreads();
  const int half_dim = rope_dim / 2;
  for (int e = threadIdx.x; e < hd; e += blockDim.x) {
    float out = xs[e];
    if (e < rope_dim) {
      // The pair (a, b) rotates by theta: a' = a cos - b sin, b' = a sin + b cos.
      const int i = neox ? e % half_dim : e / 2;
      const bool first = neox ? e < half_dim : (e & 1) == 0;
      const int ia = neox ? i : 2 * i;
      const int ib = neox ? i + half_dim : 2 * i + 1;
      const float theta = static_cast<float>(pos) * inv_freq[i];
      float s, c;
      sincosf(theta, &s, &c);  // the accurate version: theta reaches thousands of radians at long contexts
      out = first ? xs[ia] * c - xs[ib] * s : xs[ia] * s + xs[ib] * c;
    }
    if (is_q)
      q[static_cast<size_t>(head) * hd + e] = out;
    else
      cache_row[e] = from_float<T>(out);
  }
}

}  // namespace
}  // namespace detail

void rope_store_kv(float* q, const float* k, const float* v, const KvCacheView& cache, const int32_t* pos,
                   int64_t n_head, int64_t rope_dim, const float* inv_freq, bool neox, cudaStream_t stream) {
  using detail::num;
  TESSERA_CUDA_REQUIRE(q && k && v && pos && cache.k && cache.v, "rope_store_kv: a pointer argument is null");
  TESSERA_CUDA_REQUIRE(cache.dtype == DType::F16 || cache.dtype == DType::BF16,
                       "rope_store_kv: the KV cache must be f16 or bf16");
  TESSERA_CUDA_REQUIRE(cache.hd > 0 && cache.hd <= detail::kMaxHd,
                       "rope_store_kv: head size " + num(cache.hd) + " is outside 1..512");
  TESSERA_CUDA_REQUIRE(rope_dim >= 0 && rope_dim % 2 == 0 && rope_dim <= cache.hd,
                       "rope_store_kv: rope_dim " + num(rope_dim) + " must be even and at most the head size");
  TESSERA_CUDA_REQUIRE(rope_dim == 0 || inv_freq != nullptr, "rope_store_kv: inv_freq is null");
  TESSERA_CUDA_REQUIRE(
      n_head > 0 && cache.n_kv > 0 && n_head % cache.n_kv == 0 && n_head + 2 * cache.n_kv < 65536,
      "rope_store_kv: " + num(n_head) + " query heads do not group over " + num(cache.n_kv) + " kv heads");
  TESSERA_CUDA_REQUIRE(cache.n_ctx > 0 && cache.n_ctx * cache.n_kv * cache.hd < (int64_t{1} << 40),
                       "rope_store_kv: the cache size is invalid");
  const int threads = std::max(32, std::min(256, static_cast<int>((cache.hd + 31) / 32 * 32)));
  const unsigned blocks = static_cast<unsigned>(n_head + 2 * cache.n_kv);
  const int nh = static_cast<int>(n_head), nkv = static_cast<int>(cache.n_kv), hd = static_cast<int>(cache.hd);
  const int nctx = static_cast<int>(std::min<int64_t>(cache.n_ctx, INT32_MAX)), rd = static_cast<int>(rope_dim);
  if (cache.dtype == DType::F16) {
    detail::rope_store_kv_kernel<__half><<<blocks, threads, 0, stream>>>(q, k, v, static_cast<__half*>(cache.k),
                                                                         static_cast<__half*>(cache.v), pos, nh, nkv,
                                                                         hd, nctx, rd, inv_freq, neox);
  } else {
    detail::rope_store_kv_kernel<__nv_bfloat16><<<blocks, threads, 0, stream>>>(
        q, k, v, static_cast<__nv_bfloat16*>(cache.k), static_cast<__nv_bfloat16*>(cache.v), pos, nh, nkv, hd, nctx, rd,
        inv_freq, neox);
  }
  TESSERA_CUDA_CHECK_LAUNCH("rope_store_kv_kernel");
}

}  // namespace tessera::cuda
