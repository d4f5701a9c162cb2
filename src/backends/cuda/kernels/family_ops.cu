// The families' elementwise and per-head ops (kernels_family.h). Each is a small fraction of the matmuls around it
// (a few values per weight row read), so the kernels are plain: one thread per output value (one warp per head for
// the head norm), rows read through a stride so column slices of a stacked matmul output need no copy.
#include <cmath>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels_family.h"

namespace tessera::cuda {
namespace detail {
namespace {

constexpr int kFamilyThreads = 256;

// The per-value functions, written as the CPU kernels write them (same operations in the same order; tanhf is
// CUDA's accurate tanh, within 2 ulp of the host's).
struct GeluTanhMul {
  __device__ float operator()(float x, float u) const {
    constexpr float kC = 0.7978845608028654f;  // sqrt(2 / pi)
    return 0.5f * x * (1.0f + tanhf(kC * (x + 0.044715f * x * x * x))) * u;
  }
};

__global__ void __launch_bounds__(kFamilyThreads)
    geglu_rows_kernel(const float* gate, const float* up, int64_t ld_in, float* out, int64_t n, int64_t count) {
  pdl_wait();
  const int64_t i = blockIdx.x * static_cast<int64_t>(kFamilyThreads) + threadIdx.x;
  if (i >= count) return;
  const int64_t r = i / n, c = i - r * n;
  out[i] = GeluTanhMul{}(gate[r * ld_in + c], up[r * ld_in + c]);
}

// kind 0: bias add (p = bias), 1: softcap (s = cap), 2: scale (s = factor).
__global__ void __launch_bounds__(kFamilyThreads)
    unary_rows_kernel(const float* x, int64_t ld_x, const float* __restrict__ p, float s, int kind, float* y, int64_t n,
                      int64_t count) {
  pdl_wait();
  const int64_t i = blockIdx.x * static_cast<int64_t>(kFamilyThreads) + threadIdx.x;
  if (i >= count) return;
  const int64_t r = i / n, c = i - r * n;
  const float v = x[r * ld_x + c];
  float o;
  if (kind == 0)
    o = v + p[c];
  else if (kind == 1)
    o = s * tanhf(v / s);
  else
    o = v * s;
  y[i] = o;
}

__device__ __forceinline__ double warp_sum_f64(double v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One warp per (row, head): the sum of squares in double (the CPU reference's), the scale rounded to float once.
__global__ void __launch_bounds__(kFamilyThreads)
    head_rmsnorm_kernel(const float* x, int64_t ld_x, const float* __restrict__ w, float* y, int64_t n_head, int64_t hd,
                        float eps, int64_t heads_total) {
  pdl_wait();
  const int64_t head = (blockIdx.x * static_cast<int64_t>(kFamilyThreads) + threadIdx.x) / kWarp;
  const int lane = threadIdx.x & (kWarp - 1);
  if (head >= heads_total) return;  // whole warps: heads_total is per warp
  const int64_t r = head / n_head, h = head - r * n_head;
  const float* xr = x + r * ld_x + h * hd;
  float* yr = y + head * hd;
  double ss = 0;
  for (int64_t i = lane; i < hd; i += kWarp) ss += static_cast<double>(xr[i]) * xr[i];
  ss = warp_sum_f64(ss);
  const auto inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(hd) + static_cast<double>(eps)));
  for (int64_t i = lane; i < hd; i += kWarp) yr[i] = xr[i] * inv * w[i];
}

void require_rows(const char* op, int64_t t, int64_t n, int64_t ld) {
  TESSERA_CUDA_REQUIRE(t > 0 && n > 0 && t * n <= (int64_t{1} << 31),
                       std::string(op) + ": " + num(t) + " rows of " + num(n) + " values are outside 1..2^31 values");
  TESSERA_CUDA_REQUIRE(
      ld >= n, std::string(op) + ": the input row stride " + num(ld) + " is smaller than the row width " + num(n));
}

void unary_rows(const char* op, const float* x, int64_t ld_x, const float* p, float s, int kind, float* y, int64_t t,
                int64_t n, cudaStream_t stream) {
  require_rows(op, t, n, ld_x);
  TESSERA_CUDA_REQUIRE(x && y && (kind != 0 || p), std::string(op) + ": a pointer argument is null");
  const int64_t count = t * n;
  launch("unary_rows_kernel", unary_rows_kernel, dim3(ceil_div(count, kFamilyThreads)), dim3(kFamilyThreads), 0, stream,
         x, ld_x, p, s, kind, y, n, count);
}

}  // namespace
}  // namespace detail

void geglu_rows(const float* gate, const float* up, int64_t ld_in, float* out, int64_t t, int64_t n,
                cudaStream_t stream) {
  detail::require_rows("geglu_rows", t, n, ld_in);
  TESSERA_CUDA_REQUIRE(gate && up && out, "geglu_rows: a pointer argument is null");
  const int64_t count = t * n;
  detail::launch("geglu_rows_kernel", detail::geglu_rows_kernel, dim3(detail::ceil_div(count, detail::kFamilyThreads)),
                 dim3(detail::kFamilyThreads), 0, stream, gate, up, ld_in, out, n, count);
}

void head_rmsnorm(const float* x, int64_t ld_x, const float* w, float* y, int64_t t, int64_t n_head, int64_t hd,
                  float eps, cudaStream_t stream) {
  TESSERA_CUDA_REQUIRE(hd > 0 && n_head > 0, "head_rmsnorm: " + detail::num(n_head) + " heads of " + detail::num(hd) +
                                                 " values is not a positive shape");
  detail::require_rows("head_rmsnorm", t, n_head * hd, ld_x);
  TESSERA_CUDA_REQUIRE(x && w && y, "head_rmsnorm: a pointer argument is null");
  const int64_t heads = t * n_head;
  constexpr int kWarpsPerBlock = detail::kFamilyThreads / detail::kWarp;
  detail::launch("head_rmsnorm_kernel", detail::head_rmsnorm_kernel, dim3(detail::ceil_div(heads, kWarpsPerBlock)),
                 dim3(detail::kFamilyThreads), 0, stream, x, ld_x, w, y, n_head, hd, eps, heads);
}

void bias_add_rows(const float* x, int64_t ld_x, const float* b, float* y, int64_t t, int64_t n, cudaStream_t stream) {
  detail::unary_rows("bias_add_rows", x, ld_x, b, 0.0f, 0, y, t, n, stream);
}

void softcap_rows(const float* x, int64_t ld_x, float* y, int64_t t, int64_t n, float cap, cudaStream_t stream) {
  TESSERA_CUDA_REQUIRE(cap != 0.0f, "softcap_rows: the cap is zero");
  detail::unary_rows("softcap_rows", x, ld_x, nullptr, cap, 1, y, t, n, stream);
}

void scale_rows(const float* x, int64_t ld_x, float* y, int64_t t, int64_t n, float s, cudaStream_t stream) {
  detail::unary_rows("scale_rows", x, ld_x, nullptr, s, 2, y, t, n, stream);
}

}  // namespace tessera::cuda
