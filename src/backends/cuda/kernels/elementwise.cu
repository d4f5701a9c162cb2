// RMSNorm, SwiGLU, residual add and the q8 activation quantizer. All are tiny next to the GEMVs (a few KB per token);
// what matters is one launch each and, where the next op is a quantized GEMV, writing its q8 input in the same pass.
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/common.cuh"

namespace tessera::cuda {
namespace detail {
namespace {

constexpr int kNormThreads = 256;
constexpr int kEltThreads = 256;

// Four values rounded to 16 bits (common.cuh's to16: bit-identical to gemm_convert.cu's conversion of the f32 output).
__device__ __forceinline__ uint2 pack4(float4 v, bool bf16) {
  return make_uint2(pack16x2(v.x, v.y, bf16), pack16x2(v.z, v.w, bf16));
}

__global__ void __launch_bounds__(kNormThreads)
    rmsnorm_kernel(const float* x /*[t, d]*/, const float* __restrict__ w /*[d]*/, float* y /*[t, d] or null*/, int d,
                   float eps, int8_t* __restrict__ q8 /*[t, d] or null*/, float2* __restrict__ ds /*[t, d/32]*/,
                   uint16_t* __restrict__ y16 /*[t, d] or null*/, bool bf16) {
  pdl_wait();
  const size_t row = blockIdx.x;
  const float* xr = x + row * d;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < d; i += kNormThreads) ss = fmaf(xr[i], xr[i], ss);
  __shared__ float part[kNormThreads / kWarp];
  __shared__ float total;
  ss = warp_sum(ss);
  const int lane = threadIdx.x & (kWarp - 1), warp = threadIdx.x / kWarp;
  if (lane == 0) part[warp] = ss;
  __syncthreads();
  if (warp == 0) {
    float v = lane < kNormThreads / kWarp ? part[lane] : 0.0f;
    v = warp_sum(v);
    if (lane == 0) total = v;
  }
  __syncthreads();
  // Correctly rounded 1/sqrt (not rsqrtf's approximation): this scale multiplies every element of the row.
  const float r = 1.0f / sqrtf(total / static_cast<float>(d) + eps);
  // Warp-uniform loop (base steps by whole warps) so the 32 lanes of a warp hold one quantization block together.
  for (int base = warp * kWarp; base < d; base += kNormThreads) {
    const int i = base + lane;
    const float v = i < d ? xr[i] * r * w[i] : 0.0f;
    if (i < d && y) y[row * d + i] = v;
    if (i < d && y16) y16[row * d + i] = to16(v, bf16);
    if (q8) q8[row * d + i] = quantize_lane_q8(v, ds + (row * d + base) / kQ);
  }
}

// Row-per-block RMSNorm with the row held in registers (VPT float4 vectors per thread, up to 1024 threads): one read
// of x, one reduction, one write. v1 (the scalar kernel above, now the fallback for d % 4 != 0) read x twice with 256
// threads and quantized one element per lane, a 32-lane reduction per block of 32: 3.6 us, 9.2 us with q8, d = 4096.
// Here 8 lanes hold one quantization block (4 values each), so a warp quantizes 4 blocks with 3-step shuffles.
template <int VPT>
__global__ void __launch_bounds__(1024)
    rmsnorm_vec_kernel(const float4* x /*[t, d/4]*/, const float4* __restrict__ w, float4* y /*or null*/, int d4,
                       float eps, int8_t* __restrict__ q8 /*[t, d] or null*/, float2* __restrict__ ds /*[t, d/32]*/,
                       uint2* __restrict__ y16 /*[t, d/4] 4 x 16 bits, or null*/, bool bf16) {
  pdl_wait();
  const size_t row = blockIdx.x;
  const float4* xr = x + row * d4;
  float4 v[VPT];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int i = threadIdx.x + j * blockDim.x;
    v[j] = i < d4 ? xr[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    ss = fmaf(v[j].x, v[j].x, fmaf(v[j].y, v[j].y, fmaf(v[j].z, v[j].z, fmaf(v[j].w, v[j].w, ss))));
  }
  __shared__ float part[1024 / kWarp];
  __shared__ float total;
  const int lane = threadIdx.x & (kWarp - 1), warp = threadIdx.x / kWarp;
  ss = warp_sum(ss);
  if (lane == 0) part[warp] = ss;
  __syncthreads();
  if (warp == 0) {
    float t = lane < static_cast<int>(blockDim.x / kWarp) ? part[lane] : 0.0f;
    t = warp_sum(t);
    if (lane == 0) total = t;
  }
  __syncthreads();
  const float r = 1.0f / sqrtf(total / static_cast<float>(4 * d4) + eps);
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int i = threadIdx.x + j * blockDim.x;
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (i < d4) {
      const float4 wv = w[i];
      o = make_float4(v[j].x * r * wv.x, v[j].y * r * wv.y, v[j].z * r * wv.z, v[j].w * r * wv.w);
      if (y) y[row * d4 + i] = o;
      if (y16) y16[row * d4 + i] = pack4(o, bf16);
    }
    if (q8) {  // all 32 lanes shuffle; a group of 8 lanes (one block of 32) is wholly valid or wholly not
      float amax = fmaxf(fmaxf(fabsf(o.x), fabsf(o.y)), fmaxf(fabsf(o.z), fabsf(o.w)));
#pragma unroll
      for (int off = 4; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
      // Same IEEE operations as quantize_lane_q8 and the host reference, so the result is bit-identical.
      const float d = amax / 127.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      const int q0 = static_cast<int>(roundf(o.x * id)), q1 = static_cast<int>(roundf(o.y * id));
      const int q2 = static_cast<int>(roundf(o.z * id)), q3 = static_cast<int>(roundf(o.w * id));
      int sum = q0 + q1 + q2 + q3;
#pragma unroll
      for (int off = 4; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      if (i < d4) {
        const uint32_t packed = (static_cast<uint32_t>(q0) & 0xFFu) | ((static_cast<uint32_t>(q1) & 0xFFu) << 8) |
                                ((static_cast<uint32_t>(q2) & 0xFFu) << 16) | (static_cast<uint32_t>(q3) << 24);
        reinterpret_cast<uint32_t*>(q8 + row * 4 * d4)[i] = packed;
        if ((lane & 7) == 0) ds[(row * 4 * d4) / kQ + i / 8] = make_float2(d, d * static_cast<float>(sum));
      }
    }
  }
}

__global__ void __launch_bounds__(kEltThreads)
    quantize_q8_kernel(const float* __restrict__ x /*[k]*/, int8_t* __restrict__ q8, float2* __restrict__ ds, int k,
                       float threshold, unsigned long long* zeros) {
  pdl_wait();
  const int i = blockIdx.x * kEltThreads + threadIdx.x;  // k % 32 == 0: whole warps are in or out together
  const int lane = static_cast<int>(threadIdx.x & (kWarp - 1));
  if (i - lane >= k) return;
  float v = x[i];
  if (threshold >= 0.0f && fabsf(v) <= threshold) v = 0.0f;  // SPARSIFY's calibrated rule (a NaN stays)
  q8[i] = quantize_lane_q8(v, ds + i / kQ);
  if (zeros != nullptr) {
    const unsigned zero = __ballot_sync(0xffffffffu, v == 0.0f);
    if (lane == 0) atomicAdd(&zeros[0], static_cast<unsigned long long>(__popc(zero)));
    if (i == 0) atomicAdd(&zeros[1], static_cast<unsigned long long>(k));
  }
}


__global__ void __launch_bounds__(kEltThreads) swiglu_kernel(const float* gate, const float* up, float* out, int n,
                                                             int8_t* __restrict__ q8, float2* __restrict__ ds) {
  pdl_wait();
  const int i = blockIdx.x * kEltThreads + threadIdx.x;
  if (q8) {  // n % 32 == 0: whole warps are in or out together
    if (i - static_cast<int>(threadIdx.x & (kWarp - 1)) >= n) return;
    const float v = silu_mul(gate[i], up[i]);
    out[i] = v;
    q8[i] = quantize_lane_q8(v, ds + i / kQ);
  } else if (i < n) {
    out[i] = silu_mul(gate[i], up[i]);
  }
}

// swiglu_rows: one thread per 4 columns of one row (float4 loads of gate and up, one 16- and/or 8-byte store).
__global__ void __launch_bounds__(kEltThreads)
    swiglu_rows4_kernel(const float* gate, const float* up, int64_t ld_in, float4* out, uint2* out16, bool bf16,
                        int64_t n4, int64_t count) {
  pdl_wait();
  const int64_t i = blockIdx.x * static_cast<int64_t>(kEltThreads) + threadIdx.x;
  if (i >= count) return;
  const int64_t r = i / n4, c = i - r * n4;
  const float4 g = *reinterpret_cast<const float4*>(gate + r * ld_in + 4 * c);
  const float4 u = *reinterpret_cast<const float4*>(up + r * ld_in + 4 * c);
  const float4 v = make_float4(silu_mul(g.x, u.x), silu_mul(g.y, u.y), silu_mul(g.z, u.z), silu_mul(g.w, u.w));
  if (out) out[i] = v;
  if (out16) out16[i] = pack4(v, bf16);
}

__global__ void __launch_bounds__(kEltThreads)
    swiglu_rows_kernel(const float* gate, const float* up, int64_t ld_in, float* out, uint16_t* out16, bool bf16,
                       int64_t n, int64_t count) {
  pdl_wait();
  const int64_t i = blockIdx.x * static_cast<int64_t>(kEltThreads) + threadIdx.x;
  if (i >= count) return;
  const int64_t r = i / n, c = i - r * n;
  const float v = silu_mul(gate[r * ld_in + c], up[r * ld_in + c]);
  if (out) out[i] = v;
  if (out16) out16[i] = to16(v, bf16);
}

__global__ void __launch_bounds__(kEltThreads) add_kernel(float* y, const float* x, int n) {
  pdl_wait();
  const int i = blockIdx.x * kEltThreads + threadIdx.x;
  if (i < n) y[i] += x[i];
}

__global__ void __launch_bounds__(kEltThreads) add4_kernel(float4* y, const float4* x, int n4) {
  pdl_wait();
  const int i = blockIdx.x * kEltThreads + threadIdx.x;
  if (i < n4) {
    float4 a = y[i];
    const float4 b = x[i];
    a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
    y[i] = a;
  }
}

void require_q8_pair(const char* op, const int8_t* q8, const float2* ds, int64_t d) {
  TESSERA_CUDA_REQUIRE((q8 == nullptr) == (ds == nullptr),
                       std::string(op) + ": the quantized output needs both q8 and ds (or neither)");
  if (q8) {
    TESSERA_CUDA_REQUIRE(d % kQ == 0, std::string(op) +
                                          ": a quantized output needs a length that is a multiple of "
                                          "32, got " +
                                          num(d));
  }
}

void require_size(const char* op, int64_t n) {
  TESSERA_CUDA_REQUIRE(n > 0 && n <= (int64_t{1} << 30),
                       std::string(op) + ": length " + num(n) + " is outside 1..2^30");
}

}  // namespace
}  // namespace detail

void rmsnorm(const float* x, const float* w, float* y, int64_t t, int64_t d, float eps, cudaStream_t stream, int8_t* q8,
             float2* ds, void* y16, DType y16_type) {
  detail::require_size("rmsnorm", d);
  detail::require_size("rmsnorm", t * d);
  TESSERA_CUDA_REQUIRE(x && w && (y || y16), "rmsnorm: a pointer argument is null (y may be only when y16 is given)");
  TESSERA_CUDA_REQUIRE(y16_type == DType::BF16 || y16_type == DType::F16,
                       "rmsnorm: the 16-bit output must be bf16 or f16");
  detail::require_q8_pair("rmsnorm", q8, ds, d);
  const bool bf16 = y16_type == DType::BF16;
  const int64_t d4 = d / 4;
  const bool q8_aligned = q8 == nullptr || (reinterpret_cast<uintptr_t>(q8) & 3u) == 0;  // packed 4-byte stores
  const bool y16_aligned = (reinterpret_cast<uintptr_t>(y16) & 7u) == 0;                 // packed 8-byte stores
  if (d % 4 == 0 && d4 <= 4 * 1024 && detail::aligned16(x) && detail::aligned16(w) && detail::aligned16(y) &&
      q8_aligned && y16_aligned) {
    const int vpt = d4 <= 1024 ? 1 : d4 <= 2048 ? 2 : 4;
    const int threads = vpt == 1 ? static_cast<int>((d4 + 31) / 32 * 32) : 1024;
    const auto* xv = reinterpret_cast<const float4*>(x);
    const auto* wv = reinterpret_cast<const float4*>(w);
    auto* yv = reinterpret_cast<float4*>(y);
    const unsigned grid = static_cast<unsigned>(t);
    auto* kernel = vpt == 1   ? detail::rmsnorm_vec_kernel<1>
                   : vpt == 2 ? detail::rmsnorm_vec_kernel<2>
                              : detail::rmsnorm_vec_kernel<4>;
    detail::launch("rmsnorm_vec_kernel", kernel, dim3(grid), dim3(threads), 0, stream, xv, wv, yv, static_cast<int>(d4),
                   eps, q8, ds, static_cast<uint2*>(y16), bf16);
    return;
  }
  detail::launch("rmsnorm_kernel", detail::rmsnorm_kernel, dim3(static_cast<unsigned>(t)), dim3(detail::kNormThreads),
                 0, stream, x, w, y, static_cast<int>(d), eps, q8, ds, static_cast<uint16_t*>(y16), bf16);
}

void quantize_q8(const float* x, int8_t* q8, float2* ds, int64_t k, cudaStream_t stream, float threshold,
                 unsigned long long* zeros) {
  detail::require_size("quantize_q8", k);
  TESSERA_CUDA_REQUIRE(x && q8 && ds, "quantize_q8: a pointer argument is null");
  TESSERA_CUDA_REQUIRE(k % detail::kQ == 0, "quantize_q8: length " + detail::num(k) + " is not a multiple of 32");
  detail::launch("quantize_q8_kernel", detail::quantize_q8_kernel, dim3(detail::ceil_div(k, detail::kEltThreads)),
                 dim3(detail::kEltThreads), 0, stream, x, q8, ds, static_cast<int>(k), threshold,
                 threshold >= 0.0f ? zeros : nullptr);
}

void swiglu(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream, int8_t* q8, float2* ds) {
  detail::require_size("swiglu", n);
  TESSERA_CUDA_REQUIRE(gate && up && out, "swiglu: a pointer argument is null");
  detail::require_q8_pair("swiglu", q8, ds, n);
  detail::launch("swiglu_kernel", detail::swiglu_kernel, dim3(detail::ceil_div(n, detail::kEltThreads)),
                 dim3(detail::kEltThreads), 0, stream, gate, up, out, static_cast<int>(n), q8, ds);
}

void swiglu_rows(const float* gate, const float* up, int64_t ld_in, float* out, void* out16, DType out16_type, int64_t t,
                 int64_t n, cudaStream_t stream) {
  detail::require_size("swiglu_rows", n);
  detail::require_size("swiglu_rows", t);
  detail::require_size("swiglu_rows", t * n);
  TESSERA_CUDA_REQUIRE(gate && up && (out || out16), "swiglu_rows: a pointer argument is null (out may be only when "
                                                     "out16 is given)");
  TESSERA_CUDA_REQUIRE(ld_in >= n, "swiglu_rows: the input row stride " + detail::num(ld_in) +
                                       " is smaller than the row width " + detail::num(n));
  TESSERA_CUDA_REQUIRE(out16 == nullptr || out16_type == DType::BF16 || out16_type == DType::F16,
                       "swiglu_rows: the 16-bit output must be bf16 or f16");
  const bool bf16 = out16_type == DType::BF16;
  const int64_t count = t * n;
  if (n % 4 == 0 && ld_in % 4 == 0 && detail::aligned16(gate) && detail::aligned16(up) && detail::aligned16(out) &&
      (reinterpret_cast<uintptr_t>(out16) & 7u) == 0) {
    detail::launch("swiglu_rows4_kernel", detail::swiglu_rows4_kernel,
                   dim3(detail::ceil_div(count / 4, detail::kEltThreads)), dim3(detail::kEltThreads), 0, stream, gate,
                   up, ld_in, reinterpret_cast<float4*>(out), static_cast<uint2*>(out16), bf16, n / 4, count / 4);
  } else {
    detail::launch("swiglu_rows_kernel", detail::swiglu_rows_kernel, dim3(detail::ceil_div(count, detail::kEltThreads)),
                   dim3(detail::kEltThreads), 0, stream, gate, up, ld_in, out, static_cast<uint16_t*>(out16), bf16, n,
                   count);
  }
}

void add(float* y, const float* x, int64_t n, cudaStream_t stream) {
  detail::require_size("add", n);
  TESSERA_CUDA_REQUIRE(x && y, "add: a pointer argument is null");
  if (n % 4 == 0 && detail::aligned16(x) && detail::aligned16(y)) {
    detail::launch("add4_kernel", detail::add4_kernel, dim3(detail::ceil_div(n / 4, detail::kEltThreads)),
                   dim3(detail::kEltThreads), 0, stream, reinterpret_cast<float4*>(y),
                   reinterpret_cast<const float4*>(x), static_cast<int>(n / 4));
  } else {
    detail::launch("add_kernel", detail::add_kernel, dim3(detail::ceil_div(n, detail::kEltThreads)),
                   dim3(detail::kEltThreads), 0, stream, y, x, static_cast<int>(n));
  }
}

}  // namespace tessera::cuda
