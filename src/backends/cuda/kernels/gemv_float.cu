// GEMV kernels for float weights (f32, f16, bf16): y[N] = W[N, K] · x[K] with f32 x and f32 accumulation.
// Why the kernels look the way they do: see gemv.cu; the kernel itself is in gemv_float_kernel.cuh.
#include "backends/cuda/kernels/gemv_float_kernel.cuh"

namespace tessera::cuda::detail {
namespace {

// Launches gemv_float_kernel<D, kShapes[I], NORM, SWIGLU> over grid, its capped copy where use_capped_kernel says so.
template <DType D, int I, bool NORM, bool SWIGLU>
void launch_float(const LaunchArgs& a, dim3 grid, int n, int k, bool accumulate) {
  constexpr Shape S = kShapes[I];
  auto kernel = gemv_float_kernel<D, S.threads, S.rows, S.unroll, S.prefetch, NORM, SWIGLU, false>;
  if constexpr (float_cappable<D>(S)) {
    static const int plain_per_sm = blocks_per_sm(kernel, S.threads);
    static const int capped_per_sm =
        blocks_per_sm(gemv_float_kernel<D, S.threads, S.rows, S.unroll, S.prefetch, NORM, SWIGLU, true>, S.threads);
    if (use_capped_kernel(grid.x, plain_per_sm, capped_per_sm, sm_count(), NORM || SWIGLU))
      kernel = gemv_float_kernel<D, S.threads, S.rows, S.unroll, S.prefetch, NORM, SWIGLU, true>;
  }
  launch("gemv_float_kernel", kernel, grid, dim3(S.threads), 0, a.stream, a.w->quants.as<uint8_t>(), a.x->f32, a.y, n,
         k, accumulate, NORM ? a.x->norm_w : nullptr, NORM ? a.x->norm_eps : 0.0f, early_l2());
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
        launch_float<D, I, true, true>(a, grid, n, k, false);
      else
        launch_float<D, I, false, true>(a, grid, n, k, false);
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
    launch_float<D, I, true, false>(a, grid, n, k, a.accumulate);
  else
    launch_float<D, I, false, false>(a, grid, n, k, a.accumulate);
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
