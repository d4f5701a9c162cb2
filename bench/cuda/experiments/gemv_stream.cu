// GEMV streaming experiment (issue 6, the quantized 8B decoder at 83% / 78% of its byte floor; seventh session).
//
// Question: the quantized GEMVs stream below the bf16 one (ceilings at 14336x4096: bf16 3,142 GB/s, q8_0 2,978,
// q4_1 2,852; the device's read limit 3,110-3,180). Where do the missing bytes per second go: the access pattern of
// the quants (q8_0: each lane reads its 32-byte block as two 16-byte loads, so every warp load instruction touches
// 32 half-used sectors with L1 bypassed), the separate scale stream (2 or 4 bytes per lane per block), the arithmetic,
// or the launch structure itself (one PDL launch per GEMV, the first weights loaded before the wait)?
//
// Every variant runs the 128 GEMVs of a Llama-3-8B decode step (32 layers x q|k|v 6144x4096, o 4096x4096, gate|up
// 28672x4096, down 4096x14336) as one CUDA graph of programmatic-dependent launches, four rows per block, the next
// step's loads issued before this step's arithmetic (as src/backends/cuda/kernels/gemv_quant.cu), threads per block
// as src's defaults for the shape. Variants:
//   cur      src's access pattern: a lane takes one 32-block per row per step (q8_0: two 16-byte loads 16 bytes apart,
//            q4_1: one), its scale from the separate scale array (2 / 4 bytes);
//   coal     q8_0: a lane takes one 16-byte half of a block (each warp load is 512 contiguous bytes), UNROLL halves
//            per row per step; q4_1: the quants repacked in chunks of 64 blocks so that a lane's two blocks are two
//            perfectly coalesced loads and its two (d, m) pairs one 8-byte load;
//   noscale  cur without the scale loads (scale 1): what the scale stream costs;
//   read     cur's loads with an XOR in place of the arithmetic: what this launch structure streams at best;
//   read coal  the same with coal's loads.
// cur and coal are checked against a host reference (every 97th row of the first and the last shape's matrix).
// Reported: median ms per step over the replays (the median of three interleaved rounds), GB/s of weight bytes.
//
// Measured (H100, seventh session, `gemv_stream 20 32`; docs/PERFORMANCE.md has the table): q8_0 cur 2.535 ms per step
// (2,925 GB/s), coal two halves per step 2.501, one half 2.713; q4_1 cur 1.565 (2,788 GB/s), two blocks per step 1.541,
// pairs 1.573; loads alone reach ~3.0 TB/s. Both winners lost inside src's decode graph and were not kept.
//
// Build here (no GPU needed):
//   mkdir -p build-persistent && nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -lineinfo \
//     -o build-persistent/gemv_stream bench/cuda/experiments/gemv_stream.cu
// Run on the GPU machine:   build-persistent/gemv_stream [reps] [layers]
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "exp_common.cuh"

namespace {

using exp_common::ld16;
using exp_common::median;
using exp_common::warp_max;
using exp_common::warp_sum;

constexpr int kQ = 32;
constexpr int kRows = 4;
enum Fmt { kQ8 = 0, kQ41 = 1 };
enum Mode { kCur = 0, kCoal = 1, kNoScale = 2, kRead = 3, kReadCoal = 4 };

struct Mat {
  const uint8_t* q;  // quants: q8_0 [n, k] int8; q4_1 [n, k/32] x 16 bytes (coal: repacked in chunks of 64 blocks)
  const uint8_t* s;  // scales: q8_0 [n, k/32] f16; q4_1 [n, k/32] (d, m) as half2
  float* y;          // [n]
  int n, k;
};

__device__ __forceinline__ uint32_t ld4(const void* p) {
  uint32_t v;
  asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 ld8(const void* p) {
  uint2 v;
  asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t ld2(const void* p) {
  unsigned short v;
  asm("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}

// Work units per row: q8_0 cur: a 32-block; q8_0 coal: a 16-byte half; q4_1 cur: a block; q4_1 coal: two blocks.
template <int F, int M>
__host__ __device__ constexpr int unit_div() {
  return F == kQ8 ? (M == kCoal || M == kReadCoal ? 16 : 32) : (M == kCoal || M == kReadCoal ? 64 : 32);
}

struct Slot {
  int4 w[2];
  uint2 sc;
};

template <int F, int M>
__device__ __forceinline__ void load_unit(const Mat& m, int row, int u, Slot& s) {
  const int nb = m.k / kQ;
  if constexpr (F == kQ8) {
    const uint8_t* qr = m.q + static_cast<size_t>(row) * m.k;
    const uint8_t* sr = m.s + static_cast<size_t>(row) * nb * 2;
    if constexpr (M == kCoal || M == kReadCoal) {
      s.w[0] = ld16(qr + 16 * static_cast<size_t>(u));
      s.sc.x = ld2(sr + 2 * (u / 2));
    } else {
      s.w[0] = ld16(qr + 32 * static_cast<size_t>(u));
      s.w[1] = ld16(qr + 32 * static_cast<size_t>(u) + 16);
      if constexpr (M != kNoScale && M != kRead) s.sc.x = ld2(sr + 2 * u);
    }
  } else {
    const uint8_t* qr = m.q + static_cast<size_t>(row) * nb * 16;
    const uint8_t* sr = m.s + static_cast<size_t>(row) * nb * 4;
    // coal: unit u is chunk c = u / 32, lane l = u % 32; its blocks 64c + 2l + j (j = 0, 1) sit at slot 64c + 32j + l.
    if constexpr (M == kCoal || M == kReadCoal) {
      const int c = u / 32, l = u % 32;
      s.w[0] = ld16(qr + 16 * static_cast<size_t>(64 * c + l));
      s.w[1] = ld16(qr + 16 * static_cast<size_t>(64 * c + 32 + l));
      s.sc = ld8(sr + 4 * static_cast<size_t>(64 * c + 2 * l));
    } else {
      s.w[0] = ld16(qr + 16 * static_cast<size_t>(u));
      if constexpr (M != kNoScale && M != kRead) s.sc.x = ld4(sr + 4 * static_cast<size_t>(u));
    }
  }
}

__device__ __forceinline__ float2 h2f2(uint32_t v) {
  const __half2 h = *reinterpret_cast<const __half2*>(&v);
  return __half22float2(h);
}

__device__ __forceinline__ float q41_block(const int4& w, float2 dm, const int8_t* xq, const float2* xds, int b) {
  const int4 x0 = __ldg(reinterpret_cast<const int4*>(xq) + 2 * b);
  const int4 x1 = __ldg(reinterpret_cast<const int4*>(xq) + 2 * b + 1);
  const float2 ds = __ldg(xds + b);
  const int xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
  const uint32_t wv[4] = {uint32_t(w.x), uint32_t(w.y), uint32_t(w.z), uint32_t(w.w)};
  int s = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    s = __dp4a(static_cast<int>(wv[i] & 0x0F0F0F0Fu), xv[i], s);
    s = __dp4a(static_cast<int>((wv[i] >> 4) & 0x0F0F0F0Fu), xv[i + 4], s);
  }
  return dm.x * ds.x * static_cast<float>(s) + dm.y * ds.y;
}

template <int F, int M>
__device__ __forceinline__ float unit_dot(const Slot& s, const int8_t* __restrict__ xq, const float2* __restrict__ xds,
                                          int u) {
  if constexpr (M == kRead || M == kReadCoal) {
    return __int_as_float((s.w[0].x ^ s.w[0].y ^ s.w[0].z ^ s.w[0].w ^ s.w[1].x ^ s.w[1].w) & 0x007FFFFF);
  } else if constexpr (F == kQ8) {
    if constexpr (M == kCoal) {
      const int4 x = __ldg(reinterpret_cast<const int4*>(xq) + u);
      int v = 0;
      v = __dp4a(s.w[0].x, x.x, v), v = __dp4a(s.w[0].y, x.y, v);
      v = __dp4a(s.w[0].z, x.z, v), v = __dp4a(s.w[0].w, x.w, v);
      const float d = __half2float(__ushort_as_half(static_cast<unsigned short>(s.sc.x)));
      return d * __ldg(xds + u / 2).x * static_cast<float>(v);
    } else {
      const int4 x0 = __ldg(reinterpret_cast<const int4*>(xq) + 2 * u);
      const int4 x1 = __ldg(reinterpret_cast<const int4*>(xq) + 2 * u + 1);
      int v = 0;
      v = __dp4a(s.w[0].x, x0.x, v), v = __dp4a(s.w[0].y, x0.y, v);
      v = __dp4a(s.w[0].z, x0.z, v), v = __dp4a(s.w[0].w, x0.w, v);
      v = __dp4a(s.w[1].x, x1.x, v), v = __dp4a(s.w[1].y, x1.y, v);
      v = __dp4a(s.w[1].z, x1.z, v), v = __dp4a(s.w[1].w, x1.w, v);
      const float d = M == kNoScale ? 1.0f : __half2float(__ushort_as_half(static_cast<unsigned short>(s.sc.x)));
      return d * __ldg(xds + u).x * static_cast<float>(v);
    }
  } else {
    if constexpr (M == kCoal) {
      const int c = u / 32, l = u % 32, b0 = 64 * c + 2 * l;
      return q41_block(s.w[0], h2f2(s.sc.x), xq, xds, b0) + q41_block(s.w[1], h2f2(s.sc.y), xq, xds, b0 + 1);
    } else {
      const float2 dm = M == kNoScale ? make_float2(1.0f, 0.0f) : h2f2(s.sc.x);
      return q41_block(s.w[0], dm, xq, xds, u);
    }
  }
}

template <int F, int M, int T, int U>
__global__ void __launch_bounds__(T) gemv_kernel(Mat m, const int8_t* __restrict__ xq, const float2* __restrict__ xds) {
  const int units = m.k / unit_div<F, M>();
  const int row0 = blockIdx.x * kRows;
  constexpr int kStep = T * U;
  Slot cur[U][kRows] = {}, nxt[U][kRows] = {};
  auto load = [&](int base, Slot(&sl)[U][kRows]) {
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (base + u * T < units) {
#pragma unroll
        for (int r = 0; r < kRows; ++r) load_unit<F, M>(m, min(row0 + r, m.n - 1), base + u * T, sl[u][r]);
      }
  };
  int base = threadIdx.x;
  load(base, cur);
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  float acc[kRows] = {};
  while (base < units) {
    if (base + kStep < units) load(base + kStep, nxt);
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (base + u * T < units) {
#pragma unroll
        for (int r = 0; r < kRows; ++r) acc[r] += unit_dot<F, M>(cur[u][r], xq, xds, base + u * T);
      }
    base += kStep;
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < kRows; ++r) cur[u][r] = nxt[u][r];
  }
  __shared__ float part[kRows][T / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float v = warp_sum(acc[r]);
    if (lane == 0) part[r][warp] = v;
  }
  __syncthreads();
  if (threadIdx.x < kRows) {
    float v = 0;
    for (int w = 0; w < T / 32; ++w) v += part[threadIdx.x][w];
    const int row = row0 + static_cast<int>(threadIdx.x);
    if (row < m.n) m.y[row] = v;
  }
}

__global__ void fill_bytes(uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed ^ static_cast<uint32_t>(i >> 32) * 40503u;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    p[i] = static_cast<uint8_t>(h);
  }
}
// Scales: f16 in [0.5, 1) (q8_0: one per block; q4_1: d then m in [-0.5, 0.5)).
__global__ void fill_scales(__half* p, size_t n, uint32_t seed, bool q41) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2246822519u ^ seed;
    h ^= h >> 13, h *= 2654435761u, h ^= h >> 16;
    const float f = static_cast<float>(h % 1000u) / 1000.0f;
    p[i] = __float2half(q41 && (i & 1) ? f - 0.5f : 0.5f + 0.5f * f);
  }
}

struct Set {
  Fmt f;
  std::vector<Mat> mats;
  size_t bytes = 0;
};

Set make_set(Fmt f, int layers, float* ys, int nmax, std::mt19937& rng) {
  const int shapes[4][2] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}};
  Set s{f, {}, 0};
  for (int l = 0; l < layers; ++l)
    for (int i = 0; i < 4; ++i) {
      const int n = shapes[i][0], k = shapes[i][1];
      const size_t nb = static_cast<size_t>(n) * k / kQ;
      const size_t qb = f == kQ8 ? nb * 32 : nb * 16, sb = f == kQ8 ? nb * 2 : nb * 4;
      uint8_t *q = nullptr, *sc = nullptr;
      CK(cudaMalloc(&q, qb));
      CK(cudaMalloc(&sc, sb));
      fill_bytes<<<1024, 256>>>(q, qb, static_cast<uint32_t>(rng()));
      fill_scales<<<1024, 256>>>(reinterpret_cast<__half*>(sc), sb / 2, static_cast<uint32_t>(rng()), f == kQ41);
      CK(cudaGetLastError());
      s.mats.push_back(Mat{q, sc, ys + static_cast<size_t>(nmax) * (s.mats.size() % 8), n, k});
      s.bytes += qb + sb;
    }
  CK(cudaDeviceSynchronize());
  return s;
}

using Kern = void (*)(Mat, const int8_t*, const float2*);

template <int F, int M, int U>
Kern pick(int threads) {
  switch (threads) {
    case 64:
      return gemv_kernel<F, M, 64, U>;
    case 128:
      return gemv_kernel<F, M, 128, U>;
    default:
      return gemv_kernel<F, M, 256, U>;
  }
}

struct Variant {
  std::string name;
  Fmt f;
  int mode, unroll;
  std::function<Kern(int)> kern;
};

// src's default threads per block for the shape (gemv_default_config).
int threads_for(Fmt f, const Mat& m) {
  if (m.k >= 256 * kQ) return f == kQ8 ? 128 : 256;
  return m.n >= 8192 ? 128 : 64;
}

// Host reference: row `row` of m (bytes copied to the host) against x.
double host_row(Fmt f, bool coal, const std::vector<uint8_t>& q, const std::vector<__half>& sc, int k, int row,
                const std::vector<int8_t>& x, const std::vector<float2>& xds, double* l1) {
  const int nb = k / kQ;
  double acc = 0, a1 = 0;
  for (int b = 0; b < nb; ++b) {
    if (f == kQ8) {
      int s = 0;
      for (int j = 0; j < kQ; ++j) s += int(int8_t(q[static_cast<size_t>(row) * k + b * kQ + j])) * x[b * kQ + j];
      const double t = double(__half2float(sc[static_cast<size_t>(row) * nb + b])) * xds[b].x * s;
      acc += t, a1 += std::fabs(t);
    } else {
      const int slot = coal ? (b / 64) * 64 + (b % 2) * 32 + (b % 64) / 2 : b;
      const uint8_t* blk = q.data() + (static_cast<size_t>(row) * nb + slot) * 16;
      int s = 0;
      for (int j = 0; j < 16; ++j) s += (blk[j] & 15) * x[b * kQ + j] + (blk[j] >> 4) * x[b * kQ + 16 + j];
      const double d = __half2float(sc[(static_cast<size_t>(row) * nb + b) * 2]);
      const double mm = __half2float(sc[(static_cast<size_t>(row) * nb + b) * 2 + 1]);
      const double t = d * xds[b].x * s + mm * xds[b].y;
      acc += t, a1 += std::fabs(d * xds[b].x * s) + std::fabs(mm * xds[b].y);
    }
  }
  *l1 = a1;
  return acc;
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  const int layers = argc > 2 ? std::atoi(argv[2]) : 32;
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  std::mt19937 rng(7);
  const int kmax = 14336, nmax = 28672;
  float* ys = nullptr;
  CK(cudaMalloc(&ys, sizeof(float) * static_cast<size_t>(nmax) * 8));
  Set sets[2] = {make_set(kQ8, layers, ys, nmax, rng), make_set(kQ41, layers, ys, nmax, rng)};
  for (const Set& s : sets)
    std::printf("%s: %zu GEMVs, %.3f GB of weights\n", s.f == kQ8 ? "q8_0" : "q4_1", s.mats.size(), s.bytes / 1e9);

  // Activation: q8 codes, (d, d * sum) per 32.
  std::vector<int8_t> hx(kmax);
  std::vector<float2> hxd(kmax / kQ);
  for (auto& v : hx) v = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
  for (int b = 0; b < kmax / kQ; ++b) {
    int sum = 0;
    for (int j = 0; j < kQ; ++j) sum += hx[b * kQ + j];
    const float d = 1.0f / 127.0f;
    hxd[b] = make_float2(d, d * static_cast<float>(sum));
  }
  int8_t* xq = nullptr;
  float2* xds = nullptr;
  CK(cudaMalloc(&xq, kmax));
  CK(cudaMalloc(&xds, sizeof(float2) * (kmax / kQ)));
  CK(cudaMemcpy(xq, hx.data(), kmax, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(xds, hxd.data(), sizeof(float2) * (kmax / kQ), cudaMemcpyHostToDevice));

  const std::vector<Variant> variants = {
      {"q8_0 cur", kQ8, kCur, 1, pick<kQ8, kCur, 1>},
      {"q8_0 coal u2", kQ8, kCoal, 2, pick<kQ8, kCoal, 2>},
      {"q8_0 coal u1", kQ8, kCoal, 1, pick<kQ8, kCoal, 1>},
      {"q8_0 coal u4", kQ8, kCoal, 4, pick<kQ8, kCoal, 4>},
      {"q8_0 noscale", kQ8, kNoScale, 1, pick<kQ8, kNoScale, 1>},
      {"q8_0 read", kQ8, kRead, 1, pick<kQ8, kRead, 1>},
      {"q8_0 read coal u2", kQ8, kReadCoal, 2, pick<kQ8, kReadCoal, 2>},
      {"q4_1 cur", kQ41, kCur, 1, pick<kQ41, kCur, 1>},
      {"q4_1 cur u2", kQ41, kCur, 2, pick<kQ41, kCur, 2>},
      {"q4_1 coal (pairs)", kQ41, kCoal, 1, pick<kQ41, kCoal, 1>},
      {"q4_1 noscale", kQ41, kNoScale, 1, pick<kQ41, kNoScale, 1>},
      {"q4_1 read", kQ41, kRead, 1, pick<kQ41, kRead, 1>},
      {"q4_1 read coal (pairs)", kQ41, kReadCoal, 1, pick<kQ41, kReadCoal, 1>},
  };
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::vector<cudaGraphExec_t> execs;
  for (const Variant& v : variants) {
    const Set& s = sets[v.f];
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (const Mat& m : s.mats) {
      exp_common::launch_pdl(v.kern(threads_for(v.f, m)), dim3((m.n + kRows - 1) / kRows), dim3(threads_for(v.f, m)), 0,
                             st, m, static_cast<const int8_t*>(xq), static_cast<const float2*>(xds));
    }
    cudaGraph_t g;
    CK(cudaStreamEndCapture(st, &g));
    cudaGraphExec_t e;
    CK(cudaGraphInstantiate(&e, g, 0));
    execs.push_back(e);
  }

  // Correctness: cur and coal against the host, the first matrix (q|k|v of layer 0) and the fourth (down).
  for (size_t vi = 0; vi < variants.size(); ++vi) {
    const Variant& v = variants[vi];
    if (v.mode != kCur && v.mode != kCoal) continue;
    const Set& s = sets[v.f];
    int bad = 0;
    double worst = 0;
    for (int mi : {0, 3}) {
      // Each graph writes matrix i's y to ys slot i % 8: run the graph once, then read slot mi.
      CK(cudaGraphLaunch(execs[vi], st));
      CK(cudaStreamSynchronize(st));
      const Mat& m = s.mats[mi];
      const size_t nb = static_cast<size_t>(m.n) * m.k / kQ;
      std::vector<uint8_t> q(v.f == kQ8 ? nb * 32 : nb * 16);
      std::vector<__half> sc(v.f == kQ8 ? nb : 2 * nb);
      std::vector<float> y(m.n);
      // The last layer's matrices overwrite the first's slots (slot = index % 8, 4 per layer): read the last layer's.
      const Mat& ml = s.mats[s.mats.size() - 4 + mi];
      CK(cudaMemcpy(q.data(), ml.q, q.size(), cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(sc.data(), ml.s, sc.size() * sizeof(__half), cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(y.data(), ml.y, sizeof(float) * m.n, cudaMemcpyDeviceToHost));
      for (int row = 0; row < m.n; row += 97) {
        double l1 = 0;
        const double want = host_row(v.f, v.mode == kCoal, q, sc, m.k, row, hx, hxd, &l1);
        const double err = std::fabs(want - y[row]) / (l1 + 1e-30);
        worst = std::max(worst, err);
        if (err > 1e-5) ++bad;
      }
    }
    std::printf("%-20s vs host reference: %s (worst |err| / sum|terms| %.2e)\n", v.name.c_str(),
                bad ? "MISMATCH" : "ok", worst);
  }

  // Timing: three rounds, every variant `reps` replays per round, in rotating order.
  std::vector<std::vector<float>> round_medians(variants.size());
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int round = 0; round < 3; ++round)
    for (size_t j = 0; j < variants.size(); ++j) {
      const size_t vi = (j + round * 4) % variants.size();
      std::vector<float> ms;
      for (int i = 0; i < reps + 2; ++i) {
        CK(cudaEventRecord(a, st));
        CK(cudaGraphLaunch(execs[vi], st));
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        float t = 0;
        CK(cudaEventElapsedTime(&t, a, b));
        if (i >= 2) ms.push_back(t);
      }
      round_medians[vi].push_back(median(ms));
    }
  std::printf("\n| variant | ms per step (median of 3 rounds; rounds) | GB/s of weight bytes |\n|---|---|---|\n");
  for (size_t vi = 0; vi < variants.size(); ++vi) {
    const float t = median(round_medians[vi]);
    const Set& s = sets[variants[vi].f];
    std::printf("| %s | %.3f (%.3f / %.3f / %.3f) | %.0f |\n", variants[vi].name.c_str(), t, round_medians[vi][0],
                round_medians[vi][1], round_medians[vi][2], s.bytes / (t * 1e-3) / 1e9);
  }
  return 0;
}
