// GEMV kernels for float weights (f32, f16, bf16): y[N] = W[N, K] · x[K] with f32 x and f32 accumulation.
// Why the kernels look the way they do: see gemv.cu.
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

// NORM is a template parameter, not a run-time flag: as a flag (run 3) the plain kernel lost 2-6% at the issue's
// shapes, ptxas scheduling the loads around the never-taken branch. SWIGLU (GemvInput::swiglu): w is [gate; up]
// (2n rows), a block takes ROWS/2 gate rows and the matching up rows, and writes y[n] = silu(gate · x) * (up · x):
// the swiglu launch after the merged gate|up GEMV disappears. Each row's sum is computed exactly as without it.
template <DType D, int THREADS, int ROWS, int UNROLL, int PF, bool NORM, bool SWIGLU = false>
__global__ void __launch_bounds__(THREADS)
    gemv_float_kernel(const uint8_t* __restrict__ w /*[n, k], SWIGLU: [2n, k]*/, const float* __restrict__ x /*[k]*/,
                      float* __restrict__ y /*[n]*/, int n, int k, bool accumulate,
                      const float* __restrict__ norm_w /*[k] or null*/, float norm_eps) {
  using F = FloatFmt<D>;
  constexpr int E = F::kElems;
  constexpr int kElemBytes = 16 / E;
  constexpr int kStep = THREADS * E;
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
    prefetch_block_l2<THREADS>(wr[0], static_cast<size_t>(min(H, n - row0)) * k * kElemBytes);
    prefetch_block_l2<THREADS>(wr[H], static_cast<size_t>(min(H, n - row0)) * k * kElemBytes);
  } else {
    row0 = blockIdx.x * ROWS;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) wr[r] = w + static_cast<size_t>(min(row0 + r, n - 1)) * k * kElemBytes;
    prefetch_block_l2<THREADS>(wr[0], static_cast<size_t>(min(ROWS, n - row0)) * k * kElemBytes);
  }
  pdl_wait();
  float acc[ROWS] = {};
  float ss = 0.0f;  // sum of x^2 for the fused RMSNorm (every block streams all of x, so it can norm by itself)
  // Full steps: UNROLL * ROWS unconditional loads, all issued before the first use. (An earlier version guarded each
  // load with idx < k; ptxas then interleaved loads with the FMAs, leaving one or two loads in flight per thread.)
  int base = threadIdx.x * E;
  for (; base + (UNROLL - 1) * kStep < k; base += kStep * UNROLL) {
    if constexpr (PF > 0) {
      const int next = base + PF * kStep * UNROLL;
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
          if (next + u * kStep < k) prefetch_l2(wr[r] + static_cast<size_t>(next + u * kStep) * kElemBytes);
    }
    uint4 wv[UNROLL][ROWS];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
#pragma unroll
      for (int r = 0; r < ROWS; ++r) wv[u][r] = ld_stream16(wr[r] + static_cast<size_t>(base + u * kStep) * kElemBytes);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      float_step<F, ROWS, NORM>(wv[u], x + base + u * kStep, NORM ? norm_w + base + u * kStep : nullptr, acc, ss);
  }
  // The rest of the row: fewer than UNROLL vectors per thread.
  for (; base < k; base += kStep) {
    uint4 wv[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) wv[r] = ld_stream16(wr[r] + static_cast<size_t>(base) * kElemBytes);
    float_step<F, ROWS, NORM>(wv, x + base, NORM ? norm_w + base : nullptr, acc, ss);
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

template <DType D, int I>
void launch_shape(const LaunchArgs& a) {
  constexpr Shape s = kShapes[I];
  const int k = static_cast<int>(a.w->k);
  if (a.x->swiglu) {
    // Instantiated only for the shapes of >= 128 threads that pair rows and do not prefetch (those gemv_default_config
    // picks for float weights), to keep the compile time of this file in check.
    if constexpr (s.rows % 2 == 0 && s.prefetch == 0 && s.threads >= 128) {
      const int n = static_cast<int>(a.w->n / 2);
      const dim3 grid(ceil_div(n, s.rows / 2));
      if (a.x->norm_w)
        launch("gemv_float_kernel", gemv_float_kernel<D, s.threads, s.rows, s.unroll, 0, true, true>, grid,
               dim3(s.threads), 0, a.stream, a.w->quants.as<uint8_t>(), a.x->f32, a.y, n, k, false, a.x->norm_w,
               a.x->norm_eps);
      else
        launch("gemv_float_kernel", gemv_float_kernel<D, s.threads, s.rows, s.unroll, 0, false, true>, grid,
               dim3(s.threads), 0, a.stream, a.w->quants.as<uint8_t>(), a.x->f32, a.y, n, k, false, nullptr, 0.0f);
    } else {
      fail_message(
          "gemv: the SwiGLU epilogue needs a launch shape of >= 128 threads, an even number of rows and no "
          "prefetch");
    }
    return;
  }
  const int n = static_cast<int>(a.w->n);
  const dim3 grid(ceil_div(n, s.rows));
  if (a.x->norm_w)
    launch("gemv_float_kernel", gemv_float_kernel<D, s.threads, s.rows, s.unroll, s.prefetch, true>, grid,
           dim3(s.threads), 0, a.stream, a.w->quants.as<uint8_t>(), a.x->f32, a.y, n, k, a.accumulate, a.x->norm_w,
           a.x->norm_eps);
  else
    launch("gemv_float_kernel", gemv_float_kernel<D, s.threads, s.rows, s.unroll, s.prefetch, false>, grid,
           dim3(s.threads), 0, a.stream, a.w->quants.as<uint8_t>(), a.x->f32, a.y, n, k, a.accumulate, nullptr, 0.0f);
}

template <DType D, size_t... I>
void launch_indexed(int index, const LaunchArgs& a, std::index_sequence<I...>) {
  ((index == static_cast<int>(I) ? launch_shape<D, static_cast<int>(I)>(a) : void()), ...);
}

}  // namespace

void launch_gemv_float(int index, const LaunchArgs& a) {
  switch (a.w->dtype) {
    case DType::F32:
      launch_indexed<DType::F32>(index, a, std::make_index_sequence<kNumShapes>{});
      break;
    case DType::F16:
      launch_indexed<DType::F16>(index, a, std::make_index_sequence<kNumShapes>{});
      break;
    case DType::BF16:
      launch_indexed<DType::BF16>(index, a, std::make_index_sequence<kNumShapes>{});
      break;
    default:
      fail_message("gemv: no float kernel for this dtype");
  }
}

}  // namespace tessera::cuda::detail
