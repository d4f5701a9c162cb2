// Sampling on the device (device_sampler.h says what and why).
//
// runtime::Sampler sorts the candidates by (logit descending, id ascending), cuts top-k, top-p (at temperature 1) and
// min-p, applies the temperature and walks the sorted list subtracting probabilities from one uniform draw. Here:
//  1. keys: each logit as order-preserving bits (NaN below every number, -0 as +0), the penalties applied first to
//     the few tokens of the window (the host's arithmetic, term for term);
//  2. CUB's stable radix sort of (key, id) pairs, descending: equal logits keep ascending ids, the host's order;
//  3. one block walks the sorted prefix: the cuts and the draw as block-wide scans in double precision. The sums run
//     in another order than the host's left-to-right loop, so a draw within a rounding error of a boundary may land
//     one candidate over (the test counts them).
#include <algorithm>
#include <cmath>
#include <cub/device/device_radix_sort.cuh>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device_sampler.h"
#include "backends/cuda/kernels/common.cuh"

namespace tessera::cuda {
namespace detail {
namespace {

constexpr int kKeyThreads = 256;
constexpr int kWalkThreads = 512;  // 1,024 threads cap registers at 64: the walk spilled

__device__ __forceinline__ uint32_t order_key(float f) {
  if (isnan(f)) return 0u;  // below every number: sorts last and is no candidate
  if (f == 0.0f) f = 0.0f;  // the host compares -0 and +0 equal (then by id)
  const uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}

__global__ void __launch_bounds__(kKeyThreads)
    sample_keys_kernel(const float* __restrict__ logits, int vocab, uint32_t* __restrict__ keys,
                       int32_t* __restrict__ ids) {
  pdl_wait();
  const int i = blockIdx.x * kKeyThreads + threadIdx.x;
  if (i >= vocab) return;
  keys[i] = order_key(logits[i]);
  ids[i] = i;
}

// One thread per (token, count) of the window (each token once): runtime::Sampler::apply_penalties' arithmetic.
__global__ void __launch_bounds__(kKeyThreads)
    sample_penalty_kernel(const float* __restrict__ logits, const int2* __restrict__ pen, int n_pen, float repeat,
                          float frequency, float presence, uint32_t* __restrict__ keys) {
  pdl_wait();
  const int j = blockIdx.x * kKeyThreads + threadIdx.x;
  if (j >= n_pen) return;
  const int id = pen[j].x;
  const float count = static_cast<float>(pen[j].y);
  float l = logits[id];
  l = l > 0 ? l / repeat : l * repeat;
  l -= count * frequency + presence;
  keys[id] = order_key(l);
}

struct WalkParams {
  float temperature, top_p, min_p;
  int top_k;
  double u;
};

// Block-wide sums (every thread gets the total).
__device__ double block_sum(double v, double* s_warp) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) s_warp[warp] = v;
  __syncthreads();
  double t = lane < kWalkThreads / kWarp ? s_warp[lane] : 0.0;
  for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  return t;
}

// The first index i < n whose inclusive prefix sum of f(0..i) reaches `target` (>= when `inclusive`, > otherwise),
// or -1. Chunks of the block size, a warp scan plus the warp totals, carried across chunks.
template <typename F>
__device__ int first_prefix(int n, F f, double target, bool inclusive, double* s_warp, int* s_first) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  double carry = 0.0;
  for (int base = 0; base < n; base += kWalkThreads) {
    const int i = base + threadIdx.x;
    double v = i < n ? f(i) : 0.0;
    for (int o = 1; o < kWarp; o <<= 1) {
      const double up = __shfl_up_sync(0xffffffffu, v, o);
      if (lane >= o) v += up;
    }
    __syncthreads();
    if (lane == kWarp - 1) s_warp[warp] = v;
    if (threadIdx.x == 0) *s_first = n;
    __syncthreads();
    double before = 0.0;
    for (int w = 0; w < warp; ++w) before += s_warp[w];
    const double total_prefix = carry + before + v;
    const bool hit = i < n && (inclusive ? total_prefix >= target : total_prefix > target);
    if (hit) atomicMin(s_first, i);
    double chunk = 0.0;
    for (int w = 0; w < kWalkThreads / kWarp; ++w) chunk += s_warp[w];
    __syncthreads();
    if (*s_first < n) return *s_first;
    carry += chunk;
  }
  return -1;
}

__global__ void __launch_bounds__(kWalkThreads)
    sample_walk_kernel(const uint32_t* __restrict__ keys, const int32_t* __restrict__ ids, int vocab, WalkParams p,
                       int32_t* __restrict__ out) {
  pdl_wait();
  __shared__ double s_warp[kWalkThreads / kWarp];
  __shared__ int s_first;
  // Candidates: the keys above 0. NaNs are key 0 and sort last, so their count is where the sorted keys reach 0: a
  // binary search by one thread (reading the whole vocabulary in one block would cost microseconds).
  __shared__ int s_valid;
  if (threadIdx.x == 0) {
    int lo = 0, hi = vocab;  // keys[i] > 0 for i < lo, keys[i] == 0 for i >= hi
    while (lo < hi) {
      const int mid = lo + (hi - lo) / 2;
      if (keys[mid] > 0u)
        lo = mid + 1;
      else
        hi = mid;
    }
    s_valid = lo;
  }
  __syncthreads();
  const int n_valid = s_valid;
  const bool lead = threadIdx.x == 0;
  if (n_valid == 0) {  // every logit NaN: greedy takes 0 (argmax_first), anything else is an error for the caller
    if (lead) out[0] = 0, out[1] = 0;
    return;
  }
  if (p.temperature <= 0.0f) {  // greedy: the largest logit, the smallest id among equals
    if (lead) out[0] = ids[0], out[1] = 1;
    return;
  }
  int n = p.top_k > 0 && p.top_k < n_valid ? p.top_k : n_valid;
  const float l0 = key_value(keys[0]);
  // exp((l_i - l0) / T): the host takes it in double of the float difference; expf here (double exp's slow path
  // spills), so a term may differ in its last float bit and a draw at a boundary may move by one candidate.
  const auto term = [&](int i, float t) { return static_cast<double>(expf((key_value(keys[i]) - l0) / t)); };
  if (p.top_p < 1.0f) {  // the smallest prefix whose probability at temperature 1 reaches top_p
    double z = 0.0;
    for (int i = threadIdx.x; i < n; i += kWalkThreads) z += term(i, 1.0f);
    z = block_sum(z, s_warp);
    const auto prob = [&](int i) { return static_cast<double>(static_cast<float>(term(i, 1.0f) / z)); };
    const int first = first_prefix(n, prob, static_cast<double>(p.top_p), true, s_warp, &s_first);
    if (first >= 0) n = first + 1;
  }
  if (p.min_p > 0.0f) {  // a sorted prefix: the candidates with logit >= max + ln(min_p)
    const float cut = l0 + logf(p.min_p);
    double keep = 0.0;
    for (int i = 1 + threadIdx.x; i < n; i += kWalkThreads) keep += key_value(keys[i]) >= cut ? 1.0 : 0.0;
    n = 1 + static_cast<int>(block_sum(keep, s_warp));
  }
  if (n == 1) {
    if (lead) out[0] = ids[0], out[1] = 1;
    return;
  }
  double z = 0.0;
  for (int i = threadIdx.x; i < n; i += kWalkThreads) z += term(i, p.temperature);
  z = block_sum(z, s_warp);
  const auto prob = [&](int i) { return static_cast<double>(static_cast<float>(term(i, p.temperature) / z)); };
  // The host subtracts p from u until u < 0: the first prefix sum above u; rounding past the end takes the last.
  const int first = first_prefix(n, prob, p.u, false, s_warp, &s_first);
  if (lead) out[0] = ids[first >= 0 ? first : n - 1], out[1] = n;
}

}  // namespace
}  // namespace detail

DeviceSampler::DeviceSampler(int64_t vocab) : vocab_(vocab) {
  TESSERA_CUDA_REQUIRE(vocab > 0 && vocab < (int64_t{1} << 30), "DeviceSampler: vocabulary size out of range");
  const size_t n = static_cast<size_t>(vocab);
  keys_in_ = DeviceBuffer(n * sizeof(uint32_t));
  keys_out_ = DeviceBuffer(n * sizeof(uint32_t));
  ids_in_ = DeviceBuffer(n * sizeof(int32_t));
  ids_out_ = DeviceBuffer(n * sizeof(int32_t));
  TESSERA_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(nullptr, temp_bytes_, keys_in_.as<uint32_t>(),
                                                               keys_out_.as<uint32_t>(), ids_in_.as<int32_t>(),
                                                               ids_out_.as<int32_t>(), static_cast<int>(vocab)));
  temp_ = DeviceBuffer(std::max<size_t>(temp_bytes_, 16));
}

DeviceSampler::~DeviceSampler() {
  if (pen_host_ != nullptr) (void)cudaFreeHost(pen_host_);
}

void DeviceSampler::sample(const float* logits, const DeviceSamplingParams& p,
                           const std::vector<std::pair<int32_t, int32_t>>& penalties, double u, int32_t* out,
                           cudaStream_t stream) {
  TESSERA_CUDA_REQUIRE(logits != nullptr && out != nullptr, "DeviceSampler: a pointer argument is null");
  TESSERA_CUDA_REQUIRE(std::isfinite(p.temperature) && std::isfinite(p.top_p) && p.top_p > 0.0f &&
                           std::isfinite(p.min_p) && p.min_p >= 0.0f && p.min_p <= 1.0f && p.repeat_penalty > 0.0f,
                       "DeviceSampler: sampling options out of range (as runtime::Sampler checks them)");
  TESSERA_CUDA_REQUIRE(u >= 0.0 && u < 1.0, "DeviceSampler: the draw must lie in [0, 1)");
  const int v = static_cast<int>(vocab_);
  detail::launch("sample_keys_kernel", detail::sample_keys_kernel, dim3(detail::ceil_div(v, detail::kKeyThreads)),
                 dim3(detail::kKeyThreads), 0, stream, logits, v, keys_in_.as<uint32_t>(), ids_in_.as<int32_t>());
  const bool any = p.repeat_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
  if (any && !penalties.empty()) {
    if (penalties.size() > pen_capacity_) {
      const size_t cap = std::max<size_t>(penalties.size(), 256);
      if (pen_host_ != nullptr) TESSERA_CUDA_CHECK(cudaFreeHost(pen_host_));
      pen_host_ = nullptr;
      TESSERA_CUDA_CHECK(cudaHostAlloc(&pen_host_, cap * sizeof(int2), cudaHostAllocDefault));
      pen_ = DeviceBuffer(cap * sizeof(int2));
      pen_capacity_ = cap;
    }
    auto* host = static_cast<int2*>(pen_host_);
    for (size_t i = 0; i < penalties.size(); ++i) {
      TESSERA_CUDA_REQUIRE(penalties[i].first >= 0 && penalties[i].first < vocab_,
                           "DeviceSampler: a penalty token is outside the vocabulary");
      host[i] = make_int2(penalties[i].first, penalties[i].second);
    }
    // Pinned: the copy is truly asynchronous (the caller synchronizes before the next call rewrites the staging).
    TESSERA_CUDA_CHECK(
        cudaMemcpyAsync(pen_.get(), host, penalties.size() * sizeof(int2), cudaMemcpyHostToDevice, stream));
    const int n_pen = static_cast<int>(penalties.size());
    detail::launch("sample_penalty_kernel", detail::sample_penalty_kernel,
                   dim3(detail::ceil_div(n_pen, detail::kKeyThreads)), dim3(detail::kKeyThreads), 0, stream, logits,
                   pen_.as<int2>(), n_pen, p.repeat_penalty, p.frequency_penalty, p.presence_penalty,
                   keys_in_.as<uint32_t>());
  }
  size_t temp_bytes = temp_bytes_;
  TESSERA_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(temp_.get(), temp_bytes, keys_in_.as<uint32_t>(),
                                                               keys_out_.as<uint32_t>(), ids_in_.as<int32_t>(),
                                                               ids_out_.as<int32_t>(), v, 0, 32, stream));
  const detail::WalkParams w{p.temperature, p.top_p, p.min_p, p.top_k, u};
  detail::launch("sample_walk_kernel", detail::sample_walk_kernel, dim3(1), dim3(detail::kWalkThreads), 0, stream,
                 keys_out_.as<uint32_t>(), ids_out_.as<int32_t>(), v, w, out);
}

}  // namespace tessera::cuda
