// Perplexity's per-row reduction on the device (kernels_rows.h, row_scores): an all-row prefill of an 8B model at a
// context of 512 makes 256 x 128,256 logits (131 MB of f32) per chunk; copying them to the host and reducing them
// there takes longer than the prefill itself, so the log-sum-exp and the target's logit are taken where the logits
// are, and 16 bytes per row come back.
#include <cfloat>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels_rows.h"

namespace tessera::cuda {
namespace detail {
namespace {

constexpr int kScoreThreads = 512;

// Merges (m, s) into (M, S), both meaning sum = s * exp(m): the larger max is kept and the other sum rescaled.
__device__ __forceinline__ void merge(double& M, double& S, double m, double s) {
  if (s == 0) return;
  if (S == 0 || m > M) {
    S = s + S * exp(M - m);
    M = m;
  } else {
    S += s * exp(m - M);
  }
}

__global__ void __launch_bounds__(kScoreThreads)
    row_scores_kernel(const float* __restrict__ x, const int32_t* __restrict__ targets, int n,
                      double2* __restrict__ out) {
  pdl_wait();
  const int32_t target = targets[blockIdx.x];
  if (target < 0) {  // a row not scored (the block returns as a whole: no barrier is left waiting)
    if (threadIdx.x == 0) out[blockIdx.x] = make_double2(0.0, 0.0);
    return;
  }
  const float* xr = x + static_cast<size_t>(blockIdx.x) * n;
  // Online softmax denominator over this thread's elements, in float: ~250 terms per thread at a 128k vocabulary.
  float m = -FLT_MAX, s = 0.0f;
  bool nan = false;
  for (int i = threadIdx.x; i < n; i += kScoreThreads) {
    const float v = xr[i];
    nan |= isnan(v);
    if (v > m) {
      s = s * expf(m - v) + 1.0f;
      m = v;
    } else {
      s += expf(v - m);
    }
  }
  __shared__ double sm[kScoreThreads], ss[kScoreThreads];
  __shared__ int snan;
  if (threadIdx.x == 0) snan = 0;
  __syncthreads();
  if (nan) snan = 1;
  sm[threadIdx.x] = m;
  ss[threadIdx.x] = s;
  __syncthreads();
  for (int stride = kScoreThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      double M = sm[threadIdx.x], S = ss[threadIdx.x];
      merge(M, S, sm[threadIdx.x + stride], ss[threadIdx.x + stride]);
      sm[threadIdx.x] = M;
      ss[threadIdx.x] = S;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const double lse = snan ? __longlong_as_double(0x7ff8000000000000LL) : sm[0] + log(ss[0]);
    out[blockIdx.x] = make_double2(lse, static_cast<double>(xr[target]));
  }
}

}  // namespace
}  // namespace detail

void row_scores(const float* x, const int32_t* targets, int64_t t, int64_t n, double2* out, cudaStream_t stream) {
  TESSERA_CUDA_REQUIRE(x && targets && out, "row_scores: a pointer argument is null");
  TESSERA_CUDA_REQUIRE(
      t > 0 && t <= 65535 && n > 0 && n < (int64_t{1} << 31),
      "row_scores: " + detail::num(t) + " rows of " + detail::num(n) + " are outside 1..65535 rows of 1..2^31-1");
  detail::launch("row_scores_kernel", detail::row_scores_kernel, dim3(static_cast<unsigned>(t)),
                 dim3(detail::kScoreThreads), 0, stream, x, targets, static_cast<int>(n), out);
}

}  // namespace tessera::cuda
