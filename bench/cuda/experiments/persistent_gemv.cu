// Persistent-kernel experiment (issue 6, the quantized decoder's launch cost; docs/CUDA_NOTES.md, "Persistent decode
// kernel: a sketch"). Written in the sixth session; run in the seventh (H100, `persistent 20 32`): graph 2.556 ms per
// step (2,901 GB/s); persistent 3.011 ms at 1,056 blocks, 3.041 at 528; barriers alone 2.61 / 2.15 µs each; outputs
// bit for bit equal. A grid barrier costs more than a PDL boundary (~0.7 µs), so the persistent decoder was not built.
//
// Question: can one persistent kernel, looping over every GEMV of a Llama-3-8B-shaped q8_0 decode step with a
// grid-wide barrier between GEMVs, stream the weights at least as fast as today's chain of one PDL launch per GEMV?
// The decoder's GEMVs alone take 2.84 ms per token inside the graph (fifth session, TESSERA_CUDA_DROP_OPS); the
// persistent design only pays if its GEMV phases are not slower (the warp-group folds of the sixth session ran
// their GEMVs as few fat blocks and lost 3-8%).
//
// Both modes run the same GEMV body (dp4a over q8_0 weights in the split layout: int8 quants [n, k], f16 scales
// [n, k/32]; q8 activations with (d, d * sum) per 32) on the same 128 matrices (32 layers x q|k|v 6144x4096,
// o 4096x4096, gate|up 28672x4096, down 4096x14336; random bytes, ~8.5 GB):
//   graph       one launch per GEMV (64 threads x 4 rows per block, as src/'s default), programmatic dependent launch,
//               the first weights loaded before griddepcontrol.wait, captured once and replayed;
//   persistent  one cooperative launch (blocks = SMs x resident blocks per SM, and x 16, 8, 4 where fewer than the
//               most); each block walks the row groups of a
//               GEMV grid-stride, prefetches its first row group of the next GEMV into L2, and meets the others at a
//               grid barrier (an arrival counter and a generation word);
//   barriers    the persistent kernel with no rows: 128 barriers alone, to price one.
// Each mode's outputs are compared with the other's (same body, same order: bit for bit) and one GEMV with a host
// reference. Reported: median ms per step (128 GEMVs) over the replays, GB/s of weight bytes.
//
// Build here (no GPU needed):
//   mkdir -p build-persistent && nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -lineinfo \
//     -o build-persistent/persistent bench/cuda/experiments/persistent_gemv.cu
// Run on the GPU machine:   build-persistent/persistent [reps] [layers]
#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "exp_common.cuh"

namespace {

using exp_common::ld16;
using exp_common::warp_sum;

constexpr int kQ = 32;
constexpr int kThreads = 64;
constexpr int kRows = 4;

struct Mat {
  const int8_t* q;  // [n, k]
  const __half* d;  // [n, k / 32]
  float* y;         // [n]
  int n, k;
};

__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// One step's weights of one row group: each thread's 32-block b of kRows rows (two 16-byte halves and a scale).
struct Step {
  int4 w[kRows][2];
  __half d[kRows];
};
__device__ __forceinline__ void load_step(const Mat& m, int rg, int b, Step& s) {
  const int nb = m.k / kQ;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int row = min(rg * kRows + r, m.n - 1);
    const int8_t* p = m.q + static_cast<size_t>(row) * m.k + static_cast<size_t>(b) * kQ;
    s.w[r][0] = ld16(p);
    s.w[r][1] = ld16(p + 16);
    s.d[r] = m.d[static_cast<size_t>(row) * nb + b];
  }
}

// y[rows of group rg] = W x, the block's threads striding over the 32-blocks, one step of loads in flight ahead of
// the arithmetic; `first` holds the first step's loads if the caller issued them already (before a wait).
__device__ void gemv_group(const Mat& m, const int8_t* __restrict__ xq, const float2* __restrict__ xds, int rg,
                           Step& first) {
  const int nb = m.k / kQ;
  float acc[kRows] = {};
  Step cur = first;
  for (int b = threadIdx.x; b < nb; b += kThreads) {
    Step nxt;
    if (b + kThreads < nb) load_step(m, rg, b + kThreads, nxt);
    const int4 x0 = __ldg(reinterpret_cast<const int4*>(xq) + 2 * b);
    const int4 x1 = __ldg(reinterpret_cast<const int4*>(xq) + 2 * b + 1);
    const float2 ds = __ldg(xds + b);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      int s = 0;
      s = __dp4a(cur.w[r][0].x, x0.x, s), s = __dp4a(cur.w[r][0].y, x0.y, s);
      s = __dp4a(cur.w[r][0].z, x0.z, s), s = __dp4a(cur.w[r][0].w, x0.w, s);
      s = __dp4a(cur.w[r][1].x, x1.x, s), s = __dp4a(cur.w[r][1].y, x1.y, s);
      s = __dp4a(cur.w[r][1].z, x1.z, s), s = __dp4a(cur.w[r][1].w, x1.w, s);
      acc[r] += __half2float(cur.d[r]) * ds.x * static_cast<float>(s);
    }
    cur = nxt;
  }
  __shared__ float part[kRows][kThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float v = warp_sum(acc[r]);
    if (lane == 0) part[r][warp] = v;
  }
  __syncthreads();
  if (threadIdx.x < kRows) {
    float v = 0;
    for (int w = 0; w < kThreads / 32; ++w) v += part[threadIdx.x][w];
    const int row = rg * kRows + static_cast<int>(threadIdx.x);
    if (row < m.n) m.y[row] = v;
  }
  __syncthreads();  // part[] is reused by the block's next group
}

// ---- graph mode: one launch per GEMV ----
__global__ void __launch_bounds__(kThreads) gemv_launch(Mat m, const int8_t* xq, const float2* xds) {
  Step first{};
  if (static_cast<int>(threadIdx.x) < m.k / kQ) load_step(m, blockIdx.x, threadIdx.x, first);
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  gemv_group(m, xq, xds, blockIdx.x, first);
}

// ---- persistent mode ----
__device__ unsigned g_arrived;
__device__ unsigned g_generation;

__device__ void grid_barrier() {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned gen = ld_acquire(&g_generation);
    __threadfence();  // this block's outputs before its arrival
    if (atomicAdd(&g_arrived, 1u) == gridDim.x - 1) {
      g_arrived = 0;
      __threadfence();
      atomicAdd(&g_generation, 1u);
    } else {
      while (ld_acquire(&g_generation) == gen) {
      }
    }
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads)
    gemv_persistent(const Mat* mats, int count, const int8_t* xq, const float2* xds, int work) {
  for (int i = 0; i < count; ++i) {
    const Mat m = mats[i];
    const int groups = (m.n + kRows - 1) / kRows;
    if (work) {
      for (int rg = blockIdx.x; rg < groups; rg += gridDim.x) {
        Step first{};
        if (static_cast<int>(threadIdx.x) < m.k / kQ) load_step(m, rg, threadIdx.x, first);
        gemv_group(m, xq, xds, rg, first);
      }
      if (i + 1 < count && static_cast<int>(blockIdx.x) < (mats[i + 1].n + kRows - 1) / kRows) {
        // the next GEMV's first row group of this block into L2 while the others finish (two lines per thread)
        const Mat& nx = mats[i + 1];
        const int8_t* p = nx.q + static_cast<size_t>(blockIdx.x) * kRows * nx.k;
        const size_t bytes = static_cast<size_t>(kRows) * nx.k;
        for (size_t off = threadIdx.x * 128u; off < bytes && off < 2u * kThreads * 128u; off += kThreads * 128u)
          prefetch_l2(p + off);
      }
    }
    grid_barrier();
  }
}

// Random weights made on the device (a hash of the index): quants in [-127, 127], scales in [0.5, 1).
__global__ void fill_weights(int8_t* q, __half* d, size_t nq, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < nq; i += gridDim.x * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed ^ static_cast<uint32_t>(i >> 32) * 40503u;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    q[i] = static_cast<int8_t>(static_cast<int>(h % 255u) - 127);
    if (i % kQ == 0) d[i / kQ] = __float2half(0.5f + static_cast<float>((h >> 8) % 1000u) / 2000.0f);
  }
}

struct Timing {
  float median_ms, min_ms;
};
template <typename F>
Timing time_it(cudaStream_t st, F&& f, int reps) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < reps + 2; ++i) {
    CK(cudaEventRecord(a, st));
    f();
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float t = 0;
    CK(cudaEventElapsedTime(&t, a, b));
    if (i >= 2) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return {ms[ms.size() / 2], ms.front()};
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  const int layers = argc > 2 ? std::atoi(argv[2]) : 32;
  const int shapes[4][2] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}};  // {n, k}
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);

  // Weights: one allocation per matrix shape per layer, random bytes (scales in [0.5, 1) as f16).
  std::mt19937 rng(42);
  std::vector<Mat> mats;
  size_t weight_bytes = 0;
  const int kmax = 14336, nmax = 28672;
  float* ys = nullptr;
  CK(cudaMalloc(&ys, sizeof(float) * static_cast<size_t>(nmax) * 4 * layers));
  CK(cudaMemset(ys, 0, sizeof(float) * static_cast<size_t>(nmax) * 4 * layers));
  for (int l = 0; l < layers; ++l)
    for (int s = 0; s < 4; ++s) {
      const int n = shapes[s][0], k = shapes[s][1];
      const size_t nq = static_cast<size_t>(n) * k, nd = nq / kQ;
      int8_t* dq = nullptr;
      __half* dd = nullptr;
      CK(cudaMalloc(&dq, nq));
      CK(cudaMalloc(&dd, nd * sizeof(__half)));
      fill_weights<<<1024, 256>>>(dq, dd, nq, static_cast<uint32_t>(rng()));
      CK(cudaGetLastError());
      mats.push_back(Mat{dq, dd, ys + static_cast<size_t>(nmax) * mats.size(), n, k});
      weight_bytes += nq + nd * sizeof(__half);
    }
  CK(cudaDeviceSynchronize());
  // The first matrix on the host, for the reference check.
  std::vector<int8_t> ref_q(static_cast<size_t>(mats[0].n) * mats[0].k);
  std::vector<__half> ref_d(ref_q.size() / kQ);
  CK(cudaMemcpy(ref_q.data(), mats[0].q, ref_q.size(), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(ref_d.data(), mats[0].d, ref_d.size() * sizeof(__half), cudaMemcpyDeviceToHost));
  std::printf("%zu GEMVs, %.2f GB of weights\n", mats.size(), weight_bytes / 1e9);

  // The activation: q8 codes and (d, d * sum) per 32, random.
  std::vector<int8_t> hx(kmax);
  std::vector<float2> hxd(kmax / kQ);
  for (auto& v : hx) v = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
  for (auto& v : hxd) v = make_float2(1.0f / 127.0f, 0.0f);
  int8_t* xq = nullptr;
  float2* xds = nullptr;
  CK(cudaMalloc(&xq, kmax));
  CK(cudaMalloc(&xds, sizeof(float2) * (kmax / kQ)));
  CK(cudaMemcpy(xq, hx.data(), kmax, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(xds, hxd.data(), sizeof(float2) * (kmax / kQ), cudaMemcpyHostToDevice));
  Mat* dmats = nullptr;
  CK(cudaMalloc(&dmats, sizeof(Mat) * mats.size()));
  CK(cudaMemcpy(dmats, mats.data(), sizeof(Mat) * mats.size(), cudaMemcpyHostToDevice));

  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

  // Graph mode.
  auto launch_all = [&] {
    for (const Mat& m : mats) {
      exp_common::launch_pdl(gemv_launch, dim3((m.n + kRows - 1) / kRows), dim3(kThreads), 0, st, m,
                             static_cast<const int8_t*>(xq), static_cast<const float2*>(xds));
    }
  };
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  launch_all();
  CK(cudaStreamEndCapture(st, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  const Timing tg = time_it(
      st,
      [&] {
        CK(cudaGraphLaunch(exec, st));
        CK(cudaStreamSynchronize(st));
      },
      reps);
  std::vector<float> y_graph(mats[0].n), y_last_graph(mats.back().n);
  CK(cudaMemcpy(y_graph.data(), mats[0].y, sizeof(float) * mats[0].n, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(y_last_graph.data(), mats.back().y, sizeof(float) * mats.back().n, cudaMemcpyDeviceToHost));

  // Host reference for the first matrix (a few rows).
  int bad = 0;
  for (int row = 0; row < mats[0].n; row += 97) {
    double want = 0;
    const int k = mats[0].k;
    for (int b = 0; b < k / kQ; ++b) {
      int s = 0;
      for (int j = 0; j < kQ; ++j) s += int(ref_q[static_cast<size_t>(row) * k + b * kQ + j]) * hx[b * kQ + j];
      want += double(__half2float(ref_d[static_cast<size_t>(row) * (k / kQ) + b])) * hxd[b].x * s;
    }
    if (std::fabs(want - y_graph[row]) > 1e-3 * (std::fabs(want) + 1.0)) ++bad;
  }
  std::printf("graph mode vs host reference (every 97th row of the first GEMV): %s\n", bad ? "MISMATCH" : "ok");

  // Persistent mode: one co-resident wave, at the most resident blocks per SM and at fewer (fewer arrivals per
  // barrier, fewer loads in flight).
  int max_per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&max_per_sm, gemv_persistent, kThreads, 0));
  int count = static_cast<int>(mats.size());
  std::printf("\n| mode | blocks | median ms per step (%d GEMVs) | min ms | GB/s |\n|---|---|---|---|---|\n", count);
  std::printf("| graph (PDL launch per GEMV) | per GEMV | %.3f | %.3f | %.0f |\n", tg.median_ms, tg.min_ms,
              weight_bytes / (tg.median_ms * 1e6));
  bool same = true;
  std::vector<int> candidates{max_per_sm};
  for (int c : {16, 8, 4})
    if (c < max_per_sm) candidates.push_back(c);
  for (int per_sm : candidates) {
    const int blocks = per_sm * prop.multiProcessorCount;
    auto run_persistent = [&](int work) {
      void* args[] = {&dmats, &count, &xq, &xds, &work};
      CK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(gemv_persistent), dim3(blocks), dim3(kThreads), args, 0,
                                     st));
      CK(cudaStreamSynchronize(st));
    };
    CK(cudaMemset(ys, 0, sizeof(float) * static_cast<size_t>(nmax) * 4 * layers));
    const Timing tp = time_it(
        st, [&] { run_persistent(1); }, reps);
    std::vector<float> y_pers(mats[0].n), y_last_pers(mats.back().n);
    CK(cudaMemcpy(y_pers.data(), mats[0].y, sizeof(float) * mats[0].n, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(y_last_pers.data(), mats.back().y, sizeof(float) * mats.back().n, cudaMemcpyDeviceToHost));
    const bool same_here = y_pers == y_graph && y_last_pers == y_last_graph;
    same = same && same_here;
    const Timing tb = time_it(
        st, [&] { run_persistent(0); }, reps);
    std::printf("| persistent (grid barrier per GEMV)%s | %d (%d per SM) | %.3f | %.3f | %.0f |\n",
                same_here ? "" : " OUTPUTS DIFFER FROM GRAPH", blocks, per_sm, tp.median_ms, tp.min_ms,
                weight_bytes / (tp.median_ms * 1e6));
    std::printf("| barriers only | %d | %.3f (%.2f us per barrier) | %.3f | - |\n", blocks, tb.median_ms,
                tb.median_ms * 1e3 / count, tb.min_ms);
  }
  std::printf("persistent vs graph outputs (first and last GEMV): %s\n", same ? "bit for bit" : "DIFFER");
  return bad || !same ? 1 : 0;
}
