// f32 prefill GEMM through OpenBLAS when the build found it (src/CMakeLists.txt defines TESSERA_HAVE_OPENBLAS for this
// file only). Measured on the 2-core Zen 5 this was tuned on (bench: openblas_sgemm/... vs matmul/f32/..., T = 512,
// one thread, CPU time because the machine was shared): OpenBLAS 0.3.21 reaches ~105 GFLOP/s against ~70-87 for
// matmul_float_avx2.cpp's register-tiled dot products, so f32 weights at T >= kBlasMinTokens go to sgemm. Each pool
// task calls a single-threaded sgemm on its slice of rows: OpenBLAS's own threads would spin against the pool's.
#include "backends/cpu/kernels/matmul_internal.h"

#if defined(TESSERA_HAVE_OPENBLAS)
#include <cblas.h>

#include <algorithm>
#include <mutex>
#endif

namespace tessera::cpu::detail {

bool matmul_f32_blas(ThreadPool& pool, const float* w, const float* x, float* y, int64_t t, int64_t n, int64_t k) {
#if defined(TESSERA_HAVE_OPENBLAS)
  if (t < kBlasMinTokens || n > INT32_MAX || k > INT32_MAX || t > INT32_MAX) return false;
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
  // Slices of rows, multiples of 16 (OpenBLAS's panel width), at least 64 rows each.
  const int64_t slices = std::max<int64_t>(1, std::min<int64_t>(pool.n_threads() * 2, n / 64));
  pool.parallel_for(slices, [&](int64_t s, int) {
    const int64_t r0 = (n * s / slices) & ~int64_t{15},
                  r1 = s + 1 == slices ? n : (n * (s + 1) / slices) & ~int64_t{15};
    if (r1 <= r0) return;
    // y[:, r0:r1] = x[t, k] · W[r0:r1, k]^T, written into the strided columns of y.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(t), static_cast<int>(r1 - r0),
                static_cast<int>(k), 1.0f, x, static_cast<int>(k), w + r0 * k, static_cast<int>(k), 0.0f, y + r0,
                static_cast<int>(n));
  });
  return true;
#else
  (void)pool, (void)w, (void)x, (void)y, (void)t, (void)n, (void)k;
  return false;
#endif
}

}  // namespace tessera::cpu::detail
