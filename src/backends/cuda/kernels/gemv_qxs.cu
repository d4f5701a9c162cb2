// iq4_nl's x-stationary GEMV (gemv_qxs_kernel.cuh), the launch shape GemvConfig::stationary: k / 1024 warps per
// block (one 32-block per lane), 4 rows per block in one step. Compiled only where gemv_default_config picks it
// (k = 4096: four warps; the sweep's best there, w4/r4/p1 at 14336x4096 and 28672x4096), to keep compile time down;
// its own file so that it compiles beside the other GEMV families.
#include "backends/cuda/kernels/gemv_common.cuh"
#include "backends/cuda/kernels/gemv_qxs_kernel.cuh"

namespace tessera::cuda::detail {

void launch_gemv_q_stationary(const GemvConfig& c, const LaunchArgs& a) {
  constexpr int kWarps = kIq4nlXsWarps, kRows = kIq4nlXsRows;
  const int n = static_cast<int>(a.w->n), k = static_cast<int>(a.w->k);
  if (a.w->dtype != DType::IQ4_NL || c.threads != 32 * kWarps || c.rows != kRows || !qxs_config_fits(kWarps, 1, k))
    fail_message("gemv: the x-stationary launch shape has no kernel for these weights (gemv_iq4nl_stationary_fits)");
  launch("gemv_q_stationary", gemv_q_stationary<DType::IQ4_NL, kWarps, kRows, 1>, dim3(ceil_div(n, kRows)),
         dim3(32 * kWarps), 0, a.stream, a.w->quants.as<uint8_t>(), a.w->scales.as<uint8_t>(), a.x->q8, a.x->q8_ds, a.y,
         n, k, a.accumulate, RmsIn{a.x->rms_sumsq, a.x->rms_eps});
}

}  // namespace tessera::cuda::detail
