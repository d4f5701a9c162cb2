// TEAL's sparse bf16 GEMV with the copy engine (issue 23: <= 22 us at 50% activation sparsity at Llama-3-8B's
// 4096->14336 and 14336->4096, batch 1, L2 flushed before each call). src's channel-major form (gemv_sparse_cols.cu)
// and every form of the sixteenth session's sweep (gemv_sparse_sweep.cu: plain 16-byte loads, 1-16 in flight per
// thread, software pipelining, clusters) level off at 1.85-1.97 TB/s on the bytes they read; the dense GEMV streams
// 2.5 TB/s under the same method. This experiment asks whether the limit is the loads themselves: a block owns a
// stripe of R output rows and a slice of the input channels; it builds its slice's list of kept channels (the
// calibrated-threshold rule on the untouched x), and one thread then keeps STAGES groups of G channels in flight with
// cp.async.bulk (each channel's R weights of the stripe are one contiguous run of R * 2 bytes in the channel-major
// copy, make_sparse_columns' layout) into a shared-memory ring guarded by mbarriers. Every thread sums 8 rows from
// shared memory; the slices of one stripe meet in y by f32 red.global.add (y zeroed first: the timed figure includes
// that memset; the kernel alone, what an accumulating GEMV pays, is printed beside it).
//
// Each variant is checked against a double reference over the kept channels first (|y - ref| <= 5e-5 sum|w x| + 1e-6
// per row) and is not timed if it fails. Prints per shape and sparsity: src's dense GEMV on the zeroed x, src's
// gemv_sparse_x (threshold mode), and each variant "R<rows> S<stages> G<channels per stage> s<slices>": us (median of
// the reps, the L2 flushed by a 2x L2 memset before each call), GB/s on the bytes read, and the ratio to src's sparse.
//
// The nineteenth session's figures (docs/PERFORMANCE.md) were measured before the issuing thread fenced the proxies
// ahead of each refill (fence_proxy_async: the stage's generic reads ordered before the copy engine's writes); the
// kernel passed its checks then, and the fence is one instruction per group.
//
// Build here (no GPU needed): target exp_gemv_sparse_tma. Run on the GPU machine (~20 s):
//   build-gpu/bin/experiments/exp_gemv_sparse_tma [reps, default 200]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/gemv_sparse.h"
#include "backends/cuda/kernels/mbarrier.cuh"
#include "backends/cuda/memory.h"
#include "exp_common.cuh"
#include "quant/half.h"

namespace tessera::cuda::detail {

// The barriers and bulk copies: kernels/mbarrier.cuh (src's, as the TMA prefill attention uses them).
__device__ __forceinline__ void red_add(float* p, float v) {
  asm volatile("red.global.add.f32 [%0], %1;" ::"l"(p), "f"(v) : "memory");
}

constexpr int kMaxStages = 16;

// data [k][n] bf16 (channel-major), n a multiple of R = THREADS * 8. grid (n / R, slices); dynamic shared memory:
// the ring (stages * g * R * 2 bytes), then the slice's list (channel index and value per kept channel).
template <int THREADS>
__global__ void __launch_bounds__(THREADS) tma_sparse_kernel(const uint16_t* __restrict__ data,
                                                             const float* __restrict__ x, float threshold,
                                                             float* __restrict__ y, int n, int k, int slice,
                                                             int stages, int g) {
  constexpr int R = THREADS * 8;
  constexpr int kWarps = THREADS / 32;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) uint64_t bars[kMaxStages];
  __shared__ int warp_counts[kWarps];
  __shared__ int total;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int row0 = blockIdx.x * R;
  const int c0 = blockIdx.y * slice, c1 = min(k, c0 + slice);
  const size_t ring_bytes = static_cast<size_t>(stages) * g * R * 2;
  int* list_c = reinterpret_cast<int*>(smem + ring_bytes);
  float* list_x = reinterpret_cast<float*>(list_c + slice);
  if (tid == 0) {
    for (int s = 0; s < stages; ++s) mbar_init(smem_u32(&bars[s]), 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    total = 0;
  }
  __syncthreads();
  // The slice's kept channels in ascending order (a fixed summation order).
  for (int base = c0; base < c1; base += THREADS) {
    const int c = base + tid;
    const float v = c < c1 ? x[c] : 0.0f;
    const bool keep = c < c1 && !(fabsf(v) <= threshold) && v != 0.0f;
    const unsigned ballot = __ballot_sync(0xffffffffu, keep);
    if (lane == 0) warp_counts[warp] = __popc(ballot);
    __syncthreads();
    int off = total;
    for (int w = 0; w < warp; ++w) off += warp_counts[w];
    off += __popc(ballot & ((1u << lane) - 1u));
    if (keep) list_c[off] = c, list_x[off] = v;
    __syncthreads();
    if (tid == 0) {
      int t = 0;
      for (int w = 0; w < kWarps; ++w) t += warp_counts[w];
      total += t;
    }
    __syncthreads();
  }
  const int m = total;
  const int groups = (m + g - 1) / g;
  const uint32_t ring = smem_u32(smem);
  const uint32_t run = R * 2;
  const auto issue = [&](int gi) {
    const int s = gi % stages;
    const int first = gi * g, cnt = min(g, m - first);
    const uint32_t bar = smem_u32(&bars[s]);
    fence_proxy_async();  // the stage's reads by every thread (joined at the barrier before) precede this refill
    mbar_expect_tx(bar, cnt * run);
    for (int j = 0; j < cnt; ++j)
      bulk_load(ring + (s * g + j) * run, data + static_cast<size_t>(list_c[first + j]) * n + row0, run, bar);
  };
  if (tid == 0)
    for (int gi = 0; gi < min(stages, groups); ++gi) issue(gi);
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int gi = 0; gi < groups; ++gi) {
    const int s = gi % stages;
    mbar_wait(smem_u32(&bars[s]), static_cast<uint32_t>((gi / stages) & 1));
    const int first = gi * g, cnt = min(g, m - first);
    for (int j = 0; j < cnt; ++j) {
      const uint4 wv = *reinterpret_cast<const uint4*>(smem + (static_cast<size_t>(s) * g + j) * run + tid * 16);
      const float xv = list_x[first + j];
      const uint32_t wr[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        acc[2 * q] = fmaf(__uint_as_float(wr[q] << 16), xv, acc[2 * q]);
        acc[2 * q + 1] = fmaf(__uint_as_float(wr[q] & 0xffff0000u), xv, acc[2 * q + 1]);
      }
    }
    __syncthreads();  // every thread is done with stage s: it may be refilled
    if (tid == 0 && gi + stages < groups) issue(gi + stages);
  }
  float* yr = y + row0 + tid * 8;
  if (gridDim.y == 1) {
#pragma unroll
    for (int q = 0; q < 8; ++q) yr[q] = acc[q];
  } else {
#pragma unroll
    for (int q = 0; q < 8; ++q) red_add(yr + q, acc[q]);
  }
}

}  // namespace tessera::cuda::detail

namespace {

using namespace tessera;
using namespace tessera::cuda;

using exp_common::FlushedTimer;
using exp_common::uniform;

int run(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(3, std::atoi(argv[1])) : 200;
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const double copy = exp_common::copy_gbps(st, e0, e1);
  std::printf("device %s (%d SMs, L2 %d MB), copy %.0f GB/s, %d calls per point, L2 flushed before each\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, copy, reps);
  for (auto f : {detail::tma_sparse_kernel<128>, detail::tma_sparse_kernel<256>})
    CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  FlushedTimer timer(st, reps, static_cast<size_t>(prop.l2CacheSize));
  struct Shape {
    int n, k;
    const char* what;
  };
  const Shape shapes[] = {{14336, 4096, "4096->14336"}, {4096, 14336, "14336->4096"}, {4096, 4096, "4096x4096"}};
  int failures = 0;
  uint64_t seed = 20261127;
  std::vector<std::string> summary;
  for (const Shape& sh : shapes) {
    const int n = sh.n, k = sh.k;
    std::vector<uint16_t> hw(static_cast<size_t>(n) * k);
    for (auto& v : hw) v = f32_to_bf16(uniform(seed, -0.05f, 0.05f));
    std::vector<float> hx(static_cast<size_t>(k));
    for (auto& v : hx) v = uniform(seed, -1.0f, 1.0f);
    DeviceWeight w;
    w.dtype = DType::BF16;
    w.n = n;
    w.k = k;
    w.layout = GemvLayout::ROWS;
    w.quants = DeviceBuffer(hw.size() * 2);
    w.quants.upload(hw.data(), hw.size() * 2);
    const SparseWeight cols = make_sparse_columns(w, st);  // data[c][r] = W[r][c]: n is a multiple of 64 here
    SparseGemvWorkspace ws(n);
    DeviceBuffer x(sizeof(float) * k), xz(sizeof(float) * k), y(sizeof(float) * n);
    x.upload(hx.data(), sizeof(float) * k);
    CK(cudaStreamSynchronize(st));
    std::vector<float> mags(hx.size());
    for (size_t i = 0; i < hx.size(); ++i) mags[i] = std::fabs(hx[i]);
    std::sort(mags.begin(), mags.end());
    for (float sp : {0.40f, 0.50f}) {
      const int spi = static_cast<int>(std::lround(sp * 100));
      const auto drop = static_cast<size_t>(std::floor(static_cast<double>(sp) * k));
      const float thr = drop > 0 ? mags[drop - 1] : 0.0f;
      std::vector<float> hxz(hx);
      std::vector<int> kept;
      for (int c = 0; c < k; ++c) {
        if (std::fabs(hx[static_cast<size_t>(c)]) <= thr)
          hxz[static_cast<size_t>(c)] = 0.0f;
        else
          kept.push_back(c);
      }
      xz.upload(hxz.data(), sizeof(float) * k);
      std::vector<double> ref(static_cast<size_t>(n)), mag(static_cast<size_t>(n));
      for (int r = 0; r < n; ++r) {
        const uint16_t* wr = hw.data() + static_cast<size_t>(r) * k;
        double a = 0, b = 0;
        for (int c : kept) {
          const double t = static_cast<double>(bf16_to_f32(wr[c])) * hx[static_cast<size_t>(c)];
          a += t, b += std::fabs(t);
        }
        ref[static_cast<size_t>(r)] = a, mag[static_cast<size_t>(r)] = b;
      }
      const double sparse_bytes = static_cast<double>(kept.size()) * n * 2.0 + 4.0 * k + 4.0 * n;
      const double dense_bytes = static_cast<double>(n) * k * 2.0 + 4.0 * k + 4.0 * n;
      auto check = [&](const std::function<void()>& op) {
        op();
        CK(cudaGetLastError());
        CK(cudaStreamSynchronize(st));
        std::vector<float> h(static_cast<size_t>(n));
        y.download(h.data(), sizeof(float) * n);
        int bad = 0;
        for (int r = 0; r < n; ++r) {
          const double d = std::fabs(h[static_cast<size_t>(r)] - ref[static_cast<size_t>(r)]);
          if (!(d <= 5e-5 * mag[static_cast<size_t>(r)] + 1e-6)) ++bad;
        }
        return bad;
      };
      GemvInput in;
      in.f32 = xz.as<float>();
      const auto dense = [&] { gemv(w, in, y.as<float>(), st); };
      const auto src_sparse = [&] { gemv_sparse_x(cols, x.as<float>(), thr, y.as<float>(), false, ws, st); };
      int bad = check(dense);
      if (bad) ++failures, std::printf("FAIL dense %s %d%%: %d rows\n", sh.what, spi, bad);
      bad = check(src_sparse);
      if (bad) ++failures, std::printf("FAIL src sparse %s %d%%: %d rows\n", sh.what, spi, bad);
      const double t_dense = timer.us(dense), t_src = timer.us(src_sparse);
      std::printf("\n%s %d%% (%zu kept): dense %.2f us (%.0f GB/s), src sparse %.2f us (%.0f GB/s)\n", sh.what, spi,
                  kept.size(), t_dense, dense_bytes / (t_dense * 1e3), t_src, sparse_bytes / (t_src * 1e3));
      double best = 1e30;
      std::string best_name;
      const int sms = prop.multiProcessorCount;
      for (const int threads : {128, 256}) {
        const int R = threads * 8;
        if (n % R != 0) continue;
        const int stripes = n / R;
        for (const int waves : {2, 4}) {
          const int slices = std::max(1, std::min(k / 16, (waves * sms + stripes - 1) / stripes));
          const int slice = (k + slices - 1) / slices;
          for (const auto& sg : {std::pair{4, 4}, std::pair{8, 2}, std::pair{8, 4}, std::pair{4, 8}, std::pair{16, 2}}) {
            const int stages = sg.first, gch = sg.second;
            const size_t smem = static_cast<size_t>(stages) * gch * R * 2 + static_cast<size_t>(slice) * 8;
            if (smem > 200 * 1024) continue;
            const auto kern = threads == 128 ? detail::tma_sparse_kernel<128> : detail::tma_sparse_kernel<256>;
            const auto alone = [&] {
              kern<<<dim3(stripes, slices), threads, smem, st>>>(cols.data.as<uint16_t>(), x.as<float>(), thr,
                                                                y.as<float>(), n, k, slice, stages, gch);
            };
            const auto op = [&] {
              if (slices > 1) CK(cudaMemsetAsync(y.get(), 0, sizeof(float) * n, st));
              alone();
            };
            char name[96];
            std::snprintf(name, sizeof(name), "R%d S%d G%d s%d (%d blocks)", R, stages, gch, slices, stripes * slices);
            bad = check(op);
            if (bad) {
              ++failures;
              std::printf("  FAIL %s: %d rows\n", name, bad);
              continue;
            }
            const double t = timer.us(op), ta = timer.us(alone);
            std::printf("  %-34s %7.2f us (alone %6.2f: %5.0f GB/s) %.3fx src sparse\n", name, t, ta,
                        sparse_bytes / (ta * 1e3), t_src / t);
            if (t < best) best = t, best_name = name;
          }
        }
      }
      char line[256];
      std::snprintf(line, sizeof(line), "%s %d%%: dense %.2f, src sparse %.2f, best tma %.2f (%s): %.3fx src",
                    sh.what, spi, t_dense, t_src, best, best_name.c_str(), t_src / best);
      summary.push_back(line);
    }
  }
  return exp_common::finish_sweep(nullptr, copy, "", failures, summary);
}

}  // namespace

int main(int argc, char** argv) { return run(argc, argv); }
