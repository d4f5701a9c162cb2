// Quantized GEMV experiment (issue 6/7: q4_0/q4_1 at 4096x14336 and 14336x4096 >= 90% of copy; mid-size shapes).
// The kernel under test is src/'s own (backends/cuda/kernels/gemv_quant_kernel.cuh, included below, with its block
// dot products and loads); the kernels before this experiment are kept here as modes 0 and 1 (built on src's block
// arithmetic), so old and new are timed in the same run. Each variant is checked against a double reference on random
// data and timed like bench/cuda (a CUDA graph of back-to-back PDL launches over rotating weight copies >= 4x L2,
// median of the replays), with the copy bandwidth measured in the same run.
//
// Build here (no GPU needed): cmake -DTESSERA_EXPERIMENTS=ON (the default with CUDA), target exp_gemv_quant_sweep (it
// links tessera_backend_cuda for the kernel header's host helpers).
// Run on the GPU machine:     build/bin/experiments/exp_gemv_quant_sweep [reps]
//
// MODE (the variable under test):
//   0  the kernel in src/ before this experiment: L2 prefetch of the first lines before the PDL wait, then steps of
//      ROWS * UNROLL loads, each step's loads issued after the previous step's arithmetic, and a one-load tail loop;
//   1  the first step's weight loads issued into registers before the PDL wait (weights never depend on an earlier
//      kernel), loads guarded per slot so the tail is part of the loop;
//   2  src/'s kernel: as 1, and software-pipelined (step s+1's loads are issued before step s's arithmetic);
//   3  src/'s kernel without the early L2 prefetch (EarlyL2::blocks = 0);
//   4  src/'s register-capped copy, __launch_bounds__(T, 1024 / T): at most 64 registers, so 1024 threads fit per SM
//      (one wave of 2048 64-thread blocks at 4096x14336).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/gemv_quant_kernel.cuh"
#include "exp_common.cuh"

namespace sweep {
using namespace tessera;
using namespace tessera::cuda::detail;

enum class Fmt { Q8_0, Q4_0, Q4_1 };

// Modes 0 and 1: the kernels before this experiment, on src's block arithmetic (load_block, quant_step).
template <DType D, int T, int R, int U, int MODE>
__global__ void __launch_bounds__(T, 1)
    kq(const uint8_t* __restrict__ quants, const uint8_t* __restrict__ scales, const int8_t* __restrict__ xq,
       const float2* __restrict__ xds, float* __restrict__ y, int n, int k) {
  constexpr int QB = QuantFmt<D>::kQuantBytes, SB = QuantFmt<D>::kScaleBytes, V = QuantFmt<D>::kVecs;
  const int nb = k / 32;
  const int row0 = blockIdx.x * R;
  const uint8_t* qr[R];
  const uint8_t* sr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const size_t row = static_cast<size_t>(min(row0 + r, n - 1));
    qr[r] = quants + row * nb * QB;
    sr[r] = scales + row * nb * SB;
  }
  const int rows_here = min(R, n - row0);
  prefetch_block_l2<T>(qr[0], static_cast<size_t>(rows_here) * nb * QB, EarlyL2{});
  prefetch_block_l2<T>(sr[0], static_cast<size_t>(rows_here) * nb * SB, EarlyL2{});
  float acc[R] = {};
  if constexpr (MODE == 0) {
    pdl_wait();
    int b = threadIdx.x;
    for (; b + (U - 1) * T < nb; b += T * U) {
      uint4 wv[U][R][V];
      uint32_t sc[U][R];
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int r = 0; r < R; ++r) load_block<QB, SB>(qr[r], sr[r], b + u * T, wv[u][r], sc[u][r]);
#pragma unroll
      for (int u = 0; u < U; ++u) quant_step<D, R>(wv[u], sc[u], xq, xds, b + u * T, acc);
    }
    for (; b < nb; b += T) {
      uint4 wv[R][V];
      uint32_t sc[R];
#pragma unroll
      for (int r = 0; r < R; ++r) load_block<QB, SB>(qr[r], sr[r], b, wv[r], sc[r]);
      quant_step<D, R>(wv, sc, xq, xds, b, acc);
    }
  } else {
    constexpr int S = T * U;
    int b = threadIdx.x;
    uint4 wv[U][R][V] = {};
    uint32_t sc[U][R] = {};
    auto load_guarded = [&](int b0) {
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (b0 + u * T < nb) {
#pragma unroll
          for (int r = 0; r < R; ++r) load_block<QB, SB>(qr[r], sr[r], b0 + u * T, wv[u][r], sc[u][r]);
        }
    };
    load_guarded(b);
    pdl_wait();
    while (b < nb) {
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (b + u * T < nb) quant_step<D, R>(wv[u], sc[u], xq, xds, b + u * T, acc);
      b += S;
      if (b < nb) load_guarded(b);
    }
  }
  block_sum_store<T, R>(acc, y, row0, n, false, 1.0f);
}

// src's kernel at mode 2 (plain), 3 (plain, no early prefetch) and 4 (capped).
template <DType D, int T, int R, int U, int MODE>
constexpr auto src_kernel() {
  return gemv_quant_kernel<D, T, R, U, 0, MODE == 4>;
}

// ---------------------------------------------------------------------------------------------------------------------
// Host

struct Cfg {
  int t, r, u, mode;
};
using KFn = void (*)(const uint8_t*, const uint8_t*, const int8_t*, const float2*, float*, int, int);
using SFn = void (*)(const uint8_t*, const uint8_t*, const int8_t*, const float2*, float*, int, int, bool, RmsIn,
                     NormOut, EarlyL2);
struct Entry {
  Cfg c;
  KFn f[3];  // by Fmt, modes 0 and 1
  SFn g[3];  // by Fmt, modes 2-4 (src's kernel)
};

template <int T, int R, int U, int M>
constexpr Entry entry() {
  if constexpr (M <= 1)
    return {{T, R, U, M},
            {kq<DType::Q8_0, T, R, U, M>, kq<DType::Q4_0, T, R, U, M>, kq<DType::Q4_1, T, R, U, M>},
            {nullptr, nullptr, nullptr}};
  else
    return {{T, R, U, M},
            {nullptr, nullptr, nullptr},
            {src_kernel<DType::Q8_0, T, R, U, M>(), src_kernel<DType::Q4_0, T, R, U, M>(),
             src_kernel<DType::Q4_1, T, R, U, M>()}};
}
#define E(T, R, U, M) entry<T, R, U, M>()
#define SHAPES(M)                                                                                                  \
  E(64, 1, 4, M), E(64, 2, 1, M), E(64, 2, 2, M), E(64, 2, 4, M), E(64, 4, 1, M), E(64, 4, 2, M), E(128, 1, 4, M), \
      E(128, 2, 1, M), E(128, 2, 2, M), E(128, 2, 4, M), E(128, 4, 1, M), E(128, 4, 2, M), E(256, 2, 1, M),        \
      E(256, 2, 2, M), E(256, 4, 1, M), E(256, 4, 2, M)
const Entry kEntries[] = {SHAPES(0), SHAPES(1), SHAPES(2), SHAPES(3), SHAPES(4)};

// The repository's gemv_default_config before this experiment (quantized branch).
Cfg old_default(Fmt f, long n, long k) {
  const long blocks = k / 32;
  if (blocks >= 256 || (n >= 8192 && blocks <= 64)) return {64, 2, 2, 0};
  if (f != Fmt::Q8_0 && blocks <= 128 && n >= 4096) return {128, 4, 2, 0};
  return {128, 2, 2, 0};
}

const char* fname(Fmt f) { return f == Fmt::Q8_0 ? "q8_0" : f == Fmt::Q4_0 ? "q4_0" : "q4_1"; }

struct Problem {
  Fmt f;
  int n, k;
  int copies;
  std::vector<uint8_t*> q, s;
  int8_t* xq;
  float2* xds;
  float* y;
  std::vector<double> ref, mag;
  size_t bytes;
};

void launch(const Problem& p, const Entry& e, int copy, cudaStream_t st) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3((p.n + e.c.r - 1) / e.c.r);
  cfg.blockDim = dim3(e.c.t);
  cfg.stream = st;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  const int f = static_cast<int>(p.f);
  if (e.c.mode <= 1) {
    CK(cudaLaunchKernelEx(&cfg, e.f[f], p.q[copy], p.s[copy], p.xq, p.xds, p.y, p.n, p.k));
  } else {
    EarlyL2 early;
    if (e.c.mode == 3) early.blocks = 0;
    CK(cudaLaunchKernelEx(&cfg, e.g[f], p.q[copy], p.s[copy], p.xq, p.xds, p.y, p.n, p.k, false, RmsIn{nullptr, 0.0f},
                          NormOut{}, early));
  }
}

int run(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 15;
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);

  const double copy_gbps = exp_common::copy_gbps(st, e0, e1);  // bytes read + written
  std::printf("copy %.0f GB/s\n", copy_gbps);

  const int shapes[][2] = {{4096, 14336}, {14336, 4096}, {6144, 4096}, {4096, 4096}, {28672, 4096}, {1024, 4096}};
  const Fmt fmts[] = {Fmt::Q4_0, Fmt::Q4_1, Fmt::Q8_0};
  std::mt19937 rng(12345);
  std::FILE* all =
      std::fopen((std::string(std::getenv("OUT") ? std::getenv("OUT") : "/tmp") + "/sweep.tsv").c_str(), "w");
  std::vector<std::string> summary;
  int failures = 0;
  for (Fmt f : fmts) {
    for (const auto& sh : shapes) {
      Problem p;
      p.f = f, p.n = sh[0], p.k = sh[1];
      const int nb = p.k / 32;
      const int qb = f == Fmt::Q8_0 ? 32 : 16, sb = f == Fmt::Q4_1 ? 4 : 2;
      const size_t qbytes = size_t(p.n) * nb * qb, sbytes = size_t(p.n) * nb * sb;
      p.bytes = qbytes + sbytes;
      p.copies = static_cast<int>(std::clamp<size_t>((4 * size_t(prop.l2CacheSize) + p.bytes - 1) / p.bytes, 1, 64));
      std::vector<uint8_t> hq(qbytes), hs(sbytes);
      for (auto& v : hq) v = static_cast<uint8_t>(rng());
      std::uniform_real_distribution<float> ud(-0.01f, 0.01f);
      for (size_t i = 0; i < sbytes / 2; ++i) {
        const __half h = __float2half(ud(rng));
        std::memcpy(&hs[2 * i], &h, 2);
      }
      std::vector<int8_t> hx(p.k);
      std::vector<float2> hds(nb);
      std::uniform_int_distribution<int> qd(-127, 127);
      std::uniform_real_distribution<float> dd(0.001f, 0.02f);
      for (int b = 0; b < nb; ++b) {
        int sum = 0;
        for (int j = 0; j < 32; ++j) sum += (hx[b * 32 + j] = static_cast<int8_t>(qd(rng)));
        const float d = dd(rng);
        hds[b] = make_float2(d, d * static_cast<float>(sum));
      }
      // Double reference (the same algebra as the kernel: x is its q8 form).
      p.ref.assign(p.n, 0.0), p.mag.assign(p.n, 0.0);
      for (int i = 0; i < p.n; ++i) {
        double acc = 0, mag = 0;
        for (int b = 0; b < nb; ++b) {
          const uint8_t* qp = &hq[(size_t(i) * nb + b) * qb];
          const uint8_t* sp = &hs[(size_t(i) * nb + b) * sb];
          __half h0, h1;
          std::memcpy(&h0, sp, 2);
          const double d = __half2float(h0);
          double m = 0;
          if (f == Fmt::Q4_1) std::memcpy(&h1, sp + 2, 2), m = __half2float(h1);
          for (int j = 0; j < 32; ++j) {
            double w;
            if (f == Fmt::Q8_0)
              w = d * static_cast<int8_t>(qp[j]);
            else {
              const int q = j < 16 ? (qp[j] & 15) : (qp[j - 16] >> 4);
              w = f == Fmt::Q4_0 ? d * (q - 8) : d * q + m;
            }
            const double t = w * hds[b].x * hx[b * 32 + j];
            acc += t, mag += std::fabs(t);
          }
        }
        p.ref[i] = acc, p.mag[i] = mag;
      }
      p.q.resize(p.copies), p.s.resize(p.copies);
      for (int c = 0; c < p.copies; ++c) {
        CK(cudaMalloc(&p.q[c], qbytes));
        CK(cudaMalloc(&p.s[c], sbytes));
        CK(cudaMemcpy(p.q[c], hq.data(), qbytes, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(p.s[c], hs.data(), sbytes, cudaMemcpyHostToDevice));
      }
      CK(cudaMalloc(&p.xq, p.k));
      CK(cudaMalloc(&p.xds, sizeof(float2) * nb));
      CK(cudaMalloc(&p.y, sizeof(float) * p.n));
      CK(cudaMemcpy(p.xq, hx.data(), p.k, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(p.xds, hds.data(), sizeof(float2) * nb, cudaMemcpyHostToDevice));

      const Cfg od = old_default(f, p.n, p.k);
      float old_us = -1, best_us = 1e30f, best_mode_us[5] = {1e30f, 1e30f, 1e30f, 1e30f, 1e30f};
      Cfg best{}, best_mode[5]{};
      const int batch = std::max(p.copies, 10);
      std::vector<float> y(p.n);
      for (const Entry& e : kEntries) {
        // Correctness: poisoned output, one launch, every row against the reference.
        CK(cudaMemsetAsync(p.y, 0xFF, sizeof(float) * p.n, st));
        launch(p, e, 0, st);
        CK(cudaStreamSynchronize(st));
        CK(cudaMemcpy(y.data(), p.y, sizeof(float) * p.n, cudaMemcpyDeviceToHost));
        int bad = 0;
        for (int i = 0; i < p.n; ++i)
          if (!(std::fabs(y[i] - p.ref[i]) <= 1e-5 * p.mag[i] + 1e-30)) ++bad;
        if (bad) {
          ++failures;
          std::printf("FAIL %s %dx%d %d/%d/%d m%d: %d bad rows\n", fname(f), p.n, p.k, e.c.t, e.c.r, e.c.u, e.c.mode,
                      bad);
        }
        // Timing: a graph of `batch` back-to-back launches over rotating copies.
        const float t = exp_common::graph_us(st, e0, e1, batch, reps, [&](int i) { launch(p, e, i % p.copies, st); });
        const double pct = 100.0 * p.bytes / (t * 1e-6) / 1e9 / copy_gbps;
        if (all)
          std::fprintf(all, "%s\t%dx%d\t%d/%d/%d\tm%d\t%.3f\t%.1f\t%d\n", fname(f), p.n, p.k, e.c.t, e.c.r, e.c.u,
                       e.c.mode, t, pct, bad);
        if (e.c.mode == 0 && e.c.t == od.t && e.c.r == od.r && e.c.u == od.u) old_us = t;
        if (t < best_us) best_us = t, best = e.c;
        if (t < best_mode_us[e.c.mode]) best_mode_us[e.c.mode] = t, best_mode[e.c.mode] = e.c;
      }
      auto pc = [&](float t) { return 100.0 * p.bytes / (t * 1e-6) / 1e9 / copy_gbps; };
      char line[512];
      int len = std::snprintf(line, sizeof line, "%s %5dx%-5d old %d/%d/%d %6.2fus %5.1f%% |", fname(f), p.n, p.k, od.t,
                              od.r, od.u, old_us, pc(old_us));
      for (int m = 0; m < 5; ++m)
        len += std::snprintf(line + len, sizeof line - len, " m%d %d/%d/%d %5.2f %5.1f%% |", m, best_mode[m].t,
                             best_mode[m].r, best_mode[m].u, best_mode_us[m], pc(best_mode_us[m]));
      std::snprintf(line + len, sizeof line - len, " best %d/%d/%d m%d", best.t, best.r, best.u, best.mode);
      summary.push_back(line);
      std::printf("%s\n", line);
      std::fflush(stdout);
      for (int c = 0; c < p.copies; ++c) {
        CK(cudaFree(p.q[c]));
        CK(cudaFree(p.s[c]));
      }
      CK(cudaFree(p.xq));
      CK(cudaFree(p.xds));
      CK(cudaFree(p.y));
    }
  }
  return exp_common::finish_sweep(all, copy_gbps, "best launch shape per mode", failures, summary);
}

}  // namespace sweep

int main(int argc, char** argv) { return sweep::run(argc, argv); }
