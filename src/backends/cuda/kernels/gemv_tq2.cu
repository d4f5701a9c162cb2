// tq2_0's x-stationary GEMV (gemv_tq2_kernel.cuh), the launch shape GemvConfig::stationary: k / 2048 warps per block
// (one 64-element half-unit per lane), `rows` rows per block in one step. Its own file so that it compiles beside
// the other GEMV families.
#include <utility>

#include "backends/cuda/kernels/gemv_common.cuh"
#include "backends/cuda/kernels/gemv_tq2_kernel.cuh"

namespace tessera::cuda::detail {
namespace {

// The arithmetic per warp count: the masked codes (tq2_half_dot<true>) at two warps, the shifted ones above (the
// sweep's winners at 14336x4096 and 4096x14336; within 1-2% of each other either way).
template <int W, int R>
void launch_w(const LaunchArgs& a) {
  const int n = static_cast<int>(a.w->n), k = static_cast<int>(a.w->k);
  constexpr int kMode = W == 2 ? 1 : 0;
  launch("gemv_tq2_kernel", gemv_tq2_kernel<W, R, R, 1, 1, kMode>, dim3(ceil_div(n, R)), dim3(32 * W), 0, a.stream,
         a.w->quants.as<uint8_t>(), a.w->scales.as<uint8_t>(), a.x->q8, a.x->q8_ds, a.y, n, k, a.accumulate,
         RmsIn{a.x->rms_sumsq, a.x->rms_eps});
}

template <int R, size_t... I>
void launch_warps(int warps, const LaunchArgs& a, std::index_sequence<I...>) {
  ((warps == static_cast<int>(I) + 2 ? launch_w<static_cast<int>(I) + 2, R>(a) : void()), ...);
}

}  // namespace

void launch_gemv_tq2_stationary(const GemvConfig& c, const LaunchArgs& a) {
  const int warps = static_cast<int>(a.w->k / 2048);
  if (c.rows == 8)
    launch_warps<8>(warps, a, std::make_index_sequence<15>{});
  else
    launch_warps<4>(warps, a, std::make_index_sequence<15>{});
}

}  // namespace tessera::cuda::detail
