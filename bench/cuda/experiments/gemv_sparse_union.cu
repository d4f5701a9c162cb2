// TEAL in batched decode (issue 23's must-have: "union of the rows' masks or dense, whichever measures faster"):
// written in the twenty-fourth session, run on the H100 in the twenty-fifth (docs/TEAL.md, "The twenty-fifth
// session"): at two rows this file's union walk took 0.82x / 0.85x the dense time at gate|up and down (50%, in a
// graph), 0.99x at q|k|v, 1.05x at o, and src's pipelined form of it (gemv_sparse_x_rows, timed here too) 0.80x /
// 0.86x / 0.93x / 0.95x; at four rows the union lost everywhere. src took the two-row form (--cuda teal_union).
//
// A batch of N decode rows, each thresholded on its own (calibrated thresholds), reads one weight. Three ways:
//   dense   src's matmul (kernels_rows.h) on the zeroed rows: what decode_batch runs today;
//   rows    N launches of src's stripe-form sparse GEMV (gemv_sparse_x), one per row: each row's own kept bytes;
//   union   one stripe-form walk over the union of the rows' kept channels (this file): a block owns R output rows,
//           builds the list of channels any row keeps (with each row's value, 0 where that row dropped it) and walks
//           it once, every channel's 16 bytes feeding N rows' sums. With independent rows at 50% the union keeps
//           1 - 0.5^N of the channels (75% at N = 2, 94% at 4).
// Each is checked against a double reference per row (|y - ref| <= 5e-5 sum|w x| + 1e-6; the dense GEMM on bf16 x
// from matmul_x16_min_t rows: 8e-3) before it is timed, then
// timed as the sweep does: per call in a CUDA graph of `copies` back-to-back calls on distinct weight copies (what a
// decode step sees) and, for reference, flushed. Rows: random x in [-1, 1), each row's threshold its own median
// magnitude (50% kept) or 60th percentile (40% sparsity).
//
// Build: CMake target exp_gemv_sparse_union (TESSERA_EXPERIMENTS). Run on the GPU machine:
//   build/bin/experiments/exp_gemv_sparse_union [reps=100] [copies=12]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/gemv_sparse.h"
#include "backends/cuda/kernels/gemv_sparse_kernel.cuh"
#include "backends/cuda/kernels_rows.h"
#include "backends/cuda/memory.h"
#include "exp_common.cuh"
#include "quant/half.h"

namespace tessera::cuda::detail {

constexpr int kUT = 512;  // threads a block

// Block (slice blockIdx.x, stripe blockIdx.y): rows [stripe * R, + R) of y[r, :] for the NR rows, over the channels of
// its slice that any row keeps. Dynamic shared memory: the list's values [cap][NR], then its 16-bit channels [cap];
// reused for the warps' partial sums [NR][warps][R]; CL: rank 0's [slices][NR][R] slots at red_off.
template <int NR, int G, bool CL>
__global__ void __launch_bounds__(kUT, 1)
    union_kernel(const uint8_t* __restrict__ w /*[k, n_pad] bf16*/, const float* __restrict__ x /*[NR, k]*/,
                 const float* __restrict__ thr /*[NR]*/, float* __restrict__ y /*[NR, n]*/, int n, int n_pad, int k,
                 int cap, int red_off) {
  constexpr int RPT = 8, R = G * RPT, S = kUT / G, kWarps = kUT / kWarp;
  constexpr int U = NR <= 2 ? 8 : (NR == 4 ? 4 : 2);  // channels a group: 16-byte loads in flight vs accumulators
  extern __shared__ __align__(16) uint8_t smem[];
  float* s_val = reinterpret_cast<float*>(smem);                                            // [cap][NR]
  uint16_t* s_idx = reinterpret_cast<uint16_t*>(smem + 4 * NR * static_cast<size_t>(cap));  // [cap]
  __shared__ int s_scan[kWarp];
  const int tid = static_cast<int>(threadIdx.x), lane = tid & (kWarp - 1), warp = tid / kWarp;
  const int slice = static_cast<int>(blockIdx.x), slices = static_cast<int>(gridDim.x);
  const int row0 = static_cast<int>(blockIdx.y) * R;
  const int c0 = static_cast<int>(static_cast<long long>(k) * slice / slices);
  const int c1 = static_cast<int>(static_cast<long long>(k) * (slice + 1) / slices);
  if constexpr (CL) cluster_arrive_relaxed();
  pdl_wait();
  float t[NR];
#pragma unroll
  for (int r = 0; r < NR; ++r) t[r] = thr[r];
  // ---- The union list: thread t takes channels [ca, cb) of the slice, one block scan ----
  const int per = (c1 - c0 + kUT - 1) / kUT;
  const int ca = min(c0 + tid * per, c1), cb = min(ca + per, c1);
  int cnt = 0;
  for (int c = ca; c < cb; ++c) {
    bool any = false;
#pragma unroll
    for (int r = 0; r < NR; ++r) any |= sparse_keep(x[static_cast<size_t>(r) * k + c], t[r]);
    cnt += any;
  }
  int m = 0;
  int pos = block_scan_excl(cnt, &m, s_scan);
  for (int c = ca; c < cb; ++c) {
    float v[NR];
    bool any = false;
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      v[r] = x[static_cast<size_t>(r) * k + c];
      const bool keep = sparse_keep(v[r], t[r]);
      any |= keep;
      v[r] = keep ? v[r] : 0.0f;
    }
    if (any) {
#pragma unroll
      for (int r = 0; r < NR; ++r) s_val[pos * NR + r] = v[r];
      s_idx[pos] = static_cast<uint16_t>(c);
      ++pos;
    }
  }
  __syncthreads();
  // ---- The walk: slot `slot` takes entries slot, slot + S, ...; its G threads read the stripe's R * 2 bytes ----
  const int slot = tid / G, gi = tid - slot * G;
  const size_t chan = static_cast<size_t>(n_pad) * 2;
  const uint8_t* wb = w + static_cast<size_t>(row0 + gi * RPT) * 2;
  float acc[NR][RPT];
#pragma unroll
  for (int r = 0; r < NR; ++r)
#pragma unroll
    for (int i = 0; i < RPT; ++i) acc[r][i] = 0.0f;
  for (int j0 = slot; j0 < m; j0 += U * S) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = j0 + u * S;
      v[u] = j < m ? ld_stream16(wb + static_cast<size_t>(s_idx[j]) * chan) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = j0 + u * S;
      if (j >= m) break;
      float f[8];
      FloatFmt<DType::BF16>::to_float(v[u], f);
#pragma unroll
      for (int r = 0; r < NR; ++r) {
        const float xs = s_val[j * NR + r];
#pragma unroll
        for (int i = 0; i < RPT; ++i) acc[r][i] = fmaf(f[i], xs, acc[r][i]);
      }
    }
  }
  // ---- The sums in a fixed order: lanes l, l ^ G, ... hold the same rows; then the warps; then the slices ----
#pragma unroll
  for (int off = G; off < kWarp; off <<= 1)
#pragma unroll
    for (int r = 0; r < NR; ++r)
#pragma unroll
      for (int i = 0; i < RPT; ++i) acc[r][i] += __shfl_xor_sync(0xffffffffu, acc[r][i], off);
  __syncthreads();
  float* part = reinterpret_cast<float*>(smem);  // [NR][kWarps][R]
  if (lane < G)
#pragma unroll
    for (int r = 0; r < NR; ++r)
#pragma unroll
      for (int i = 0; i < RPT; ++i) part[(r * kWarps + warp) * R + lane * RPT + i] = acc[r][i];
  __syncthreads();
  float* red = reinterpret_cast<float*>(smem + red_off);
  unsigned rank = 0;
  if constexpr (CL) {
    rank = cluster_rank();
    cluster_wait_acquire();
  }
  for (int e = tid; e < NR * R; e += kUT) {
    const int r = e / R, i = e - r * R;
    float sum = 0.0f;
#pragma unroll
    for (int p = 0; p < kWarps; ++p) sum += part[(r * kWarps + p) * R + i];
    if constexpr (CL)
      store_cluster_f32(red + (rank * NR + r) * R + i, 0, sum);
    else if (row0 + i < n)
      y[static_cast<size_t>(r) * n + row0 + i] = sum;
  }
  if constexpr (CL) {
    cluster_arrive_release();
    cluster_wait_acquire();
    if (rank == 0)
      for (int e = tid; e < NR * R; e += kUT) {
        const int r = e / R, i = e - r * R;
        float sum = 0.0f;
        for (int s = 0; s < slices; ++s) sum += red[(s * NR + r) * R + i];
        if (row0 + i < n) y[static_cast<size_t>(r) * n + row0 + i] = sum;
      }
  }
}

}  // namespace tessera::cuda::detail

namespace su {
using namespace tessera;
using namespace tessera::cuda;
using namespace tessera::cuda::detail;
using exp_common::uniform;

using UKern = void (*)(const uint8_t*, const float*, const float*, float*, int, int, int, int, int);
template <int NR>
UKern union_kernel_for(int g, bool cl) {
  switch (g) {
    case 4:
      return cl ? union_kernel<NR, 4, true> : union_kernel<NR, 4, false>;
    case 8:
      return cl ? union_kernel<NR, 8, true> : union_kernel<NR, 8, false>;
    case 16:
      return cl ? union_kernel<NR, 16, true> : union_kernel<NR, 16, false>;
    default:
      return cl ? union_kernel<NR, 32, true> : union_kernel<NR, 32, false>;
  }
}
UKern union_kernel_of(int nr, int g, bool cl) {
  switch (nr) {
    case 1:
      return union_kernel_for<1>(g, cl);
    case 2:
      return union_kernel_for<2>(g, cl);
    case 4:
      return union_kernel_for<4>(g, cl);
    default:
      return union_kernel_for<8>(g, cl);
  }
}

int run(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(3, std::atoi(argv[1])) : 100;
  const int copies = argc > 2 ? std::max(1, std::atoi(argv[2])) : 12;
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  for (int nr : {1, 2, 4, 8})
    for (int g : {4, 8, 16, 32})
      for (bool cl : {false, true}) {
        cudaFuncAttributes fa{};
        CK(cudaFuncGetAttributes(&fa, union_kernel_of(nr, g, cl)));
        CK(cudaFuncSetAttribute(union_kernel_of(nr, g, cl), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(prop.sharedMemPerBlockOptin - fa.sharedSizeBytes)));
      }
  exp_common::FlushedTimer timer(st, reps, static_cast<size_t>(prop.l2CacheSize));
  std::printf("device %s (%d SMs), %d calls flushed, graphs of %d copies\n", prop.name, prop.multiProcessorCount, reps,
              copies);
  struct Shape {
    int n, k;
    const char* what;
  };
  const Shape shapes[] = {{6144, 4096, "q|k|v 4096->6144"},
                          {4096, 4096, "o 4096x4096"},
                          {28672, 4096, "gate|up 4096->28672"},
                          {4096, 14336, "down 14336->4096"}};
  uint64_t seed = 20261127;
  int failures = 0;
  GemmWorkspace gws(8, 14336, 0);
  SparseGemvWorkspace sws(28672);
  for (const Shape& sh : shapes) {
    const int n = sh.n, k = sh.k;
    std::vector<uint16_t> hw(static_cast<size_t>(n) * k);
    for (auto& v : hw) v = f32_to_bf16(uniform(seed, -0.05f, 0.05f));
    std::vector<DeviceWeight> ws(static_cast<size_t>(copies));
    std::vector<SparseWeight> cols;
    for (auto& w : ws) {
      w.dtype = DType::BF16, w.n = n, w.k = k, w.layout = GemvLayout::ROWS;
      w.quants = DeviceBuffer(hw.size() * 2);
      w.quants.upload(hw.data(), hw.size() * 2);
      cols.push_back(make_sparse_columns(w, st));
    }
    CK(cudaStreamSynchronize(st));
    for (float keep : {0.5f, 0.6f}) {
      for (int nr : {1, 2, 4, 8}) {
        // Rows, each thresholded at its own quantile; the zeroed rows for dense; the reference per row.
        std::vector<float> hx(static_cast<size_t>(nr) * k), hz(hx.size()), ht(static_cast<size_t>(nr));
        for (auto& v : hx) v = uniform(seed, -1.0f, 1.0f);
        size_t union_kept = 0;
        std::vector<char> any(static_cast<size_t>(k), 0);
        for (int r = 0; r < nr; ++r) {
          std::vector<float> mags(hx.begin() + static_cast<long>(r) * k, hx.begin() + static_cast<long>(r + 1) * k);
          for (auto& v : mags) v = std::fabs(v);
          std::sort(mags.begin(), mags.end());
          ht[static_cast<size_t>(r)] = mags[static_cast<size_t>(static_cast<double>(k) * (1.0 - keep))];
          for (int c = 0; c < k; ++c) {
            const float v = hx[static_cast<size_t>(r) * k + c];
            const bool kept = !(std::fabs(v) <= ht[static_cast<size_t>(r)]) && v != 0.0f;
            hz[static_cast<size_t>(r) * k + c] = kept ? v : 0.0f;
            any[static_cast<size_t>(c)] |= kept;
          }
        }
        for (char a : any) union_kept += a != 0;
        std::vector<double> ref(static_cast<size_t>(nr) * n), mag(ref.size());
        for (int r = 0; r < nr; ++r)
          for (int i = 0; i < n; ++i) {
            double a = 0, b = 0;
            for (int c = 0; c < k; ++c) {
              const float z = hz[static_cast<size_t>(r) * k + c];
              if (z == 0.0f) continue;
              const double t = static_cast<double>(bf16_to_f32(hw[static_cast<size_t>(i) * k + c])) * z;
              a += t, b += std::fabs(t);
            }
            ref[static_cast<size_t>(r) * n + i] = a, mag[static_cast<size_t>(r) * n + i] = b;
          }
        DeviceBuffer x(hx.size() * 4), z(hz.size() * 4), t(ht.size() * 4), y(ref.size() * 4);
        x.upload(hx.data(), hx.size() * 4);
        z.upload(hz.data(), hz.size() * 4);
        t.upload(ht.data(), ht.size() * 4);
        // From matmul_x16_min_t rows the dense matmul is cuBLASLt's GEMM on x rounded to bf16 (8 significant bits).
        const double dense_rel = nr >= matmul_x16_min_t(DType::BF16) ? 8e-3 : 5e-5;
        auto check = [&](const char* what, const std::function<void(int)>& op, double rel = 5e-5) {
          CK(cudaMemsetAsync(y.get(), 0xFF, ref.size() * 4, st));
          op(copies - 1);
          CK(cudaGetLastError());
          CK(cudaStreamSynchronize(st));
          std::vector<float> h(ref.size());
          y.download(h.data(), h.size() * 4);
          int bad = 0;
          for (size_t i = 0; i < h.size(); ++i)
            if (!(std::fabs(h[i] - ref[i]) <= rel * mag[i] + 1e-6)) ++bad;
          if (bad)
            std::printf("FAIL %s %s N=%d keep %.0f%%: %d of %zu outputs off\n", what, sh.what, nr, 100.0 * keep, bad,
                        h.size());
          failures += bad > 0;
          return bad == 0;
        };
        auto time = [&](const std::function<void(int)>& op) {
          const double f = timer.us([&] { op(0); });
          const double g = exp_common::graph_us(st, e0, e1, copies, std::max(5, reps / 10), op);
          return std::make_pair(f, g);
        };
        // dense: the multi-row matmul on the zeroed rows.
        auto dense = [&](int i) { matmul(ws[static_cast<size_t>(i)], z.as<float>(), y.as<float>(), nr, gws, st); };
        // rows: one stripe-form sparse GEMV per row, its own threshold (the raw row, the calibrated rule).
        auto rows = [&](int i) {
          for (int r = 0; r < nr; ++r)
            gemv_sparse_x(cols[static_cast<size_t>(i)], x.as<float>() + static_cast<size_t>(r) * k, ht[size_t(r)],
                          y.as<float>() + static_cast<size_t>(r) * n, false, sws, st);
        };
        // union: the stripe form's shape for this weight, more slices while the list does not fit.
        const std::pair<int, int> shape = gemv_sparse_x_stripe_shape(cols[0], x.as<float>());
        int srows = shape.first > 0 ? shape.first : 32, slices = shape.first > 0 ? shape.second : 1;
        const int g = srows / 8;
        size_t cap = 0, red_off = 0, smem = 0;
        for (;; slices *= 2) {
          cap = static_cast<size_t>((k + slices - 1) / slices);
          red_off = std::max<size_t>((cap * (4 * nr + 2) + 15) / 16 * 16, static_cast<size_t>(nr) * 16 * srows * 4);
          smem = red_off + (slices > 1 ? static_cast<size_t>(slices) * nr * srows * 4 : 0);
          if (smem <= prop.sharedMemPerBlockOptin - 1024 || slices >= 8) break;
        }
        const int stripes = cols[0].tile / srows;
        if (stripes * slices <= prop.multiProcessorCount)
          smem = std::max(smem, static_cast<size_t>(prop.sharedMemPerMultiprocessor) / 2 + 1024);
        const bool fits = smem <= prop.sharedMemPerBlockOptin - 1024;
        auto uni = [&, g, slices, cap, red_off, smem, stripes](int i) {
          launch_cluster("union_kernel", union_kernel_of(nr, g, slices > 1), dim3(slices, stripes), dim3(kUT), smem, st,
                         static_cast<unsigned>(slices), cols[static_cast<size_t>(i)].data.as<uint8_t>(), x.as<float>(),
                         t.as<float>(), y.as<float>(), n, cols[static_cast<size_t>(i)].tile, k, static_cast<int>(cap),
                         static_cast<int>(red_off));
        };
        std::printf("%-20s keep %.0f%% N=%d (union keeps %.1f%%):", sh.what, 100.0 * keep, nr,
                    100.0 * static_cast<double>(union_kept) / k);
        if (check("dense", dense, dense_rel)) {
          const auto [f, gr] = time(dense);
          std::printf(" dense %.2f / %.2f", f, gr);
        }
        if (check("rows", rows)) {
          const auto [f, gr] = time(rows);
          std::printf(" | rows %.2f / %.2f", f, gr);
        }
        // src's form of the union walk (gemv_sparse_x_rows: the stripe kernel with two rows, software-pipelined). It
        // takes one threshold for all rows, so it reads the zeroed rows (threshold 0: their nonzeros), as the batched
        // decoder reads SPARSIFY's rows.
        if (nr <= 2 && gemv_sparse_x_rows_runs(cols[0], z.as<float>(), nr)) {
          auto src_z = [&](int i) {
            gemv_sparse_x_rows(cols[static_cast<size_t>(i)], z.as<float>(), nr, 0.0f, y.as<float>(), false, st);
          };
          if (check("src rows", src_z)) {
            const auto [f, gr] = time(src_z);
            std::printf(" | src union %.2f / %.2f", f, gr);
          }
        }
        if (!fits) {
          std::printf(" | union: no shape fits\n");
        } else if (check("union", uni)) {
          const auto [f, gr] = time(uni);
          std::printf(" | union (R%d s%d) %.2f / %.2f us (flushed / graph)\n", srows, slices, f, gr);
        } else {
          std::printf("\n");
        }
        std::fflush(stdout);
      }
    }
  }
  std::printf("failures=%d\n", failures);
  return failures ? 1 : 0;
}

}  // namespace su

int main(int argc, char** argv) {
  try {
    return su::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "exp_gemv_sparse_union: %s\n", e.what());
    return 1;
  }
}
