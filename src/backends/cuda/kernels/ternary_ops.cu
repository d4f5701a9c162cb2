// The ternary models' ops (kernels_ternary.h). Each is small beside the matmuls around it, so the kernels are plain:
// one block per row for the activation quantizer (a max reduction, then one pass), one thread per value for the
// gating, one thread per channel for the recurrence (its time steps are sequential by construction).
#include <cmath>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels_ternary.h"

namespace tessera::cuda {
namespace detail {
namespace {

constexpr int kTernaryThreads = 256;

__global__ void __launch_bounds__(kTernaryThreads)
    act_quant_i8_kernel(const float* x, int64_t ld_x, float* y, int64_t n, int8_t* q8, float2* ds) {
  pdl_wait();
  __shared__ float warp_max[kTernaryThreads / kWarp];
  const float* xr = x + blockIdx.x * ld_x;
  float* yr = y + blockIdx.x * n;
  float m = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += kTernaryThreads) m = fmaxf(m, fabsf(xr[i]));
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & (kWarp - 1)) == 0) warp_max[threadIdx.x / kWarp] = m;
  __syncthreads();
  m = warp_max[0];
#pragma unroll
  for (int w = 1; w < kTernaryThreads / kWarp; ++w) m = fmaxf(m, warp_max[w]);
  // As the CPU: s rounded once to f32; x * s rounded to the nearest, ties to even (rintf), then divided by s
  // (IEEE division: the build does not use --use_fast_math).
  const float s = 127.0f / fmaxf(m, 1e-5f);
  for (int64_t i = threadIdx.x; i < n; i += kTernaryThreads) {
    const float v = fminf(fmaxf(rintf(xr[i] * s), -128.0f), 127.0f) / s;
    yr[i] = v;
    // n % 32 == 0: a warp's 32 lanes hold one whole 32-block in every pass (quantize_lane_q8 needs all of them).
    if (q8 != nullptr) q8[blockIdx.x * n + i] = quantize_lane_q8(v, ds + (blockIdx.x * n + i) / kQ);
  }
}

__global__ void __launch_bounds__(kTernaryThreads)
    relu2_glu_kernel(const float* gate, const float* up, int64_t ld_in, float* out, int64_t n, int64_t count) {
  pdl_wait();
  const int64_t i = blockIdx.x * static_cast<int64_t>(kTernaryThreads) + threadIdx.x;
  if (i >= count) return;
  const int64_t r = i / n, c = i - r * n;
  const float g = fmaxf(gate[r * ld_in + c], 0.0f);
  out[i] = __fmul_rn(__fmul_rn(g, g), up[r * ld_in + c]);  // no contraction: the CPU's r * r * u
}

__global__ void __launch_bounds__(kTernaryThreads)
    mlgru_kernel(const float* f_raw, const float* c_raw, const float* __restrict__ lb, float* state, float* y,
                 int64_t t, int64_t d, int64_t n_past) {
  pdl_wait();
  const int64_t j = blockIdx.x * static_cast<int64_t>(kTernaryThreads) + threadIdx.x;
  if (j >= d) return;
  const bool stale = n_past != 0 && state[d] != static_cast<float>(n_past);
  float h = n_past == 0 ? 0.0f : state[j];
  for (int64_t s = 0; s < t; ++s) {
    const int64_t i = s * d + j;
    const float f = lb[j] + (1.0f - lb[j]) / (1.0f + expf(-f_raw[i]));
    const float c = c_raw[i] / (1.0f + expf(-c_raw[i]));
    h = __fadd_rn(__fmul_rn(f, h), __fmul_rn(c, 1.0f - f));
    y[i] = stale ? NAN : h;
  }
  state[j] = h;  // the position (state[d]) is written by mlgru_position_kernel, after every block has read it
}

__global__ void mlgru_position_kernel(float* state, int64_t d, int64_t position) {
  pdl_wait();
  state[d] = static_cast<float>(position);
}

// mlgru_kernel's step with t = 1 for row blockIdx.y, its slot and position read on the device.
__global__ void __launch_bounds__(kTernaryThreads)
    mlgru_rows_kernel(const float* f_raw, const float* c_raw, const float* __restrict__ lb, float* states,
                      const int32_t* seqs, const int32_t* pos, float* y, int64_t d) {
  pdl_wait();
  const int64_t j = blockIdx.x * static_cast<int64_t>(kTernaryThreads) + threadIdx.x;
  if (j >= d) return;
  const int64_t r = blockIdx.y;
  const int64_t slot = seqs != nullptr ? seqs[r] : 0;
  const int64_t n_past = pos[r];
  float* state = states + slot * (d + 1);
  const bool stale = n_past != 0 && state[d] != static_cast<float>(n_past);
  const float h0 = n_past == 0 ? 0.0f : state[j];
  const int64_t i = r * d + j;
  const float f = lb[j] + (1.0f - lb[j]) / (1.0f + expf(-f_raw[i]));
  const float c = c_raw[i] / (1.0f + expf(-c_raw[i]));
  const float h = __fadd_rn(__fmul_rn(f, h0), __fmul_rn(c, 1.0f - f));
  y[i] = stale ? NAN : h;
  state[j] = h;
}

// Row r's position after the step (a launch of its own: every channel's block has read the old one).
__global__ void mlgru_rows_position_kernel(float* states, const int32_t* seqs, const int32_t* pos, int64_t t,
                                           int64_t d) {
  pdl_wait();
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r >= t) return;
  const int64_t slot = seqs != nullptr ? seqs[r] : 0;
  states[slot * (d + 1) + d] = static_cast<float>(pos[r] + 1);
}

}  // namespace
}  // namespace detail

void act_quant_i8_rows(const float* x, int64_t ld_x, float* y, int64_t t, int64_t n, cudaStream_t stream, int8_t* q8,
                       float2* ds) {
  TESSERA_CUDA_REQUIRE(t > 0 && n > 0 && t <= (int64_t{1} << 31) && ld_x >= n,
                       "act_quant_i8_rows: " + detail::num(t) + " rows of " + detail::num(n) + " values (stride " +
                           detail::num(ld_x) + ") is not a valid shape");
  TESSERA_CUDA_REQUIRE(x && y, "act_quant_i8_rows: a pointer argument is null");
  TESSERA_CUDA_REQUIRE((q8 == nullptr) == (ds == nullptr) && (q8 == nullptr || n % detail::kQ == 0),
                       "act_quant_i8_rows: the q8 output needs both its buffers and rows of whole 32-blocks");
  detail::launch("act_quant_i8_kernel", detail::act_quant_i8_kernel, dim3(static_cast<unsigned>(t)),
                 dim3(detail::kTernaryThreads), 0, stream, x, ld_x, y, n, q8, ds);
}

void relu2_glu_rows(const float* gate, const float* up, int64_t ld_in, float* out, int64_t t, int64_t n,
                    cudaStream_t stream) {
  TESSERA_CUDA_REQUIRE(t > 0 && n > 0 && t * n <= (int64_t{1} << 31) && ld_in >= n,
                       "relu2_glu_rows: " + detail::num(t) + " rows of " + detail::num(n) + " values (stride " +
                           detail::num(ld_in) + ") is not a valid shape");
  TESSERA_CUDA_REQUIRE(gate && up && out, "relu2_glu_rows: a pointer argument is null");
  const int64_t count = t * n;
  detail::launch("relu2_glu_kernel", detail::relu2_glu_kernel, dim3(detail::ceil_div(count, detail::kTernaryThreads)),
                 dim3(detail::kTernaryThreads), 0, stream, gate, up, ld_in, out, n, count);
}

void mlgru(const float* f_raw, const float* c_raw, const float* lb, float* state, float* y, int64_t t, int64_t d,
           int64_t n_past, cudaStream_t stream) {
  TESSERA_CUDA_REQUIRE(t > 0 && d > 0 && n_past >= 0 && t * d <= (int64_t{1} << 31),
                       "mlgru: " + detail::num(t) + " steps of " + detail::num(d) + " channels is not a valid shape");
  TESSERA_CUDA_REQUIRE(f_raw && c_raw && lb && state && y, "mlgru: a pointer argument is null");
  detail::launch("mlgru_kernel", detail::mlgru_kernel, dim3(detail::ceil_div(d, detail::kTernaryThreads)),
                 dim3(detail::kTernaryThreads), 0, stream, f_raw, c_raw, lb, state, y, t, d, n_past);
  // The position after every channel's block has read the old one (stream order; PDL waits for the grid above).
  detail::launch("mlgru_position_kernel", detail::mlgru_position_kernel, dim3(1), dim3(1), 0, stream, state, d,
                 n_past + t);
}

void mlgru_rows(const float* f_raw, const float* c_raw, const float* lb, float* states, const int32_t* seqs,
                const int32_t* pos, float* y, int64_t t, int64_t d, cudaStream_t stream) {
  TESSERA_CUDA_REQUIRE(
      t > 0 && t <= 65535 && d > 0 && t * d <= (int64_t{1} << 31),
      "mlgru_rows: " + detail::num(t) + " rows of " + detail::num(d) + " channels is not a valid shape");
  TESSERA_CUDA_REQUIRE(f_raw && c_raw && lb && states && pos && y, "mlgru_rows: a pointer argument is null");
  detail::launch("mlgru_rows_kernel", detail::mlgru_rows_kernel,
                 dim3(static_cast<unsigned>(detail::ceil_div(d, detail::kTernaryThreads)), static_cast<unsigned>(t)),
                 dim3(detail::kTernaryThreads), 0, stream, f_raw, c_raw, lb, states, seqs, pos, y, d);
  detail::launch("mlgru_rows_position_kernel", detail::mlgru_rows_position_kernel,
                 dim3(static_cast<unsigned>(detail::ceil_div(t, detail::kTernaryThreads))),
                 dim3(detail::kTernaryThreads), 0, stream, states, seqs, pos, t, d);
}

}  // namespace tessera::cuda
