// How fast can the H100 read a random half of a weight matrix in runs of U bytes? (issue 23, twenty-fourth session)
//
// TEAL's sparse bf16 GEMV reads, per kept input channel, that channel's weights: in src's channel-major copy a run of
// (rows of the block's stripe) x 2 bytes; over a whole column 2 N bytes (28 KiB at 4096->14336). Every form measured
// so far (the sixteenth session's sweep, the nineteenth's copy-engine ring) levels off at 1.7-1.97 TB/s on the bytes
// it reads, with runs of 256 B to 4 KiB. The issue's bar, 22 us at 50% on 58.7 MB, is 2.67 TB/s. Is that rate reachable
// for any run length, that is, would a layout with longer runs (whole columns, with a cross-block reduction to pay
// for) be a lever, or is the bar beyond what a read of the kept bytes can do at all?
//
// No arithmetic: each kernel only loads (16-byte ld.global.nc, L1 not allocated, UNROLL loads in flight per thread)
// the kept runs of a 117,440,512-byte buffer (14336 x 4096 bf16) and folds them into an XOR that is stored only if it
// hits a magic value, so nothing is dropped. Kept runs: exactly half (or 40%) of the runs, chosen by a seeded shuffle,
// in increasing address order (as a kept-channel list is); each block takes an equal contiguous slice of them.
// Controls: every run (the dense read, 117 MB) and the first half as one contiguous range (58.7 MB).
//
// Two timings per pattern:
//   flushed  one call with the L2 flushed before it (a 2x L2 memset), median of `reps`: the issue's method;
//   graph    `copies` back-to-back calls on distinct buffers in one CUDA graph, per call: what a decode step sees
//            (each buffer is larger than the L2, so nothing is served from it).
//
// Build: CMake target exp_gather_ceiling (TESSERA_EXPERIMENTS). Run on the GPU machine:
//   build/bin/experiments/exp_gather_ceiling [reps=100] [copies=24]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "exp_common.cuh"

namespace {

using exp_common::FlushedTimer;
using exp_common::ld16;

constexpr size_t kBytes = size_t{14336} * 4096 * 2;  // one Llama-3-8B gate/up/down matrix in bf16

// Block b reads the kept runs [b * per_block, (b + 1) * per_block) of `runs` (run indices, ascending); each run is
// vec_per_run 16-byte vectors. Threads walk the block's vectors flat, UNROLL loads in flight each.
template <int UNROLL>
__global__ void __launch_bounds__(256) gather(const int4* __restrict__ base, const int* __restrict__ runs, int n_runs,
                                              int vec_per_run, int per_block, int* __restrict__ sink) {
  const int r0 = blockIdx.x * per_block;
  const int r1 = min(n_runs, r0 + per_block);
  if (r0 >= r1) return;
  const long total = static_cast<long>(r1 - r0) * vec_per_run;
  const int* my_runs = runs + r0;
  int acc = 0;
  for (long v = threadIdx.x; v < total; v += static_cast<long>(blockDim.x) * UNROLL) {
    int4 x[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const long w = v + static_cast<long>(u) * blockDim.x;
      if (w < total) {
        const int run = static_cast<int>(w / vec_per_run);
        const int off = static_cast<int>(w - static_cast<long>(run) * vec_per_run);
        x[u] = ld16(base + static_cast<long>(my_runs[run]) * vec_per_run + off);
      } else {
        x[u] = make_int4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) acc ^= x[u].x ^ x[u].y ^ x[u].z ^ x[u].w;
  }
  if (acc == 0x7A5C3E1F) sink[threadIdx.x] = acc;
}

struct Pattern {
  std::string name;
  int run_bytes;
  std::vector<int> runs;  // ascending
};

Pattern make_pattern(const std::string& name, int run_bytes, double keep, uint64_t seed) {
  const int n = static_cast<int>(kBytes / static_cast<size_t>(run_bytes));
  std::vector<int> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  for (int i = n - 1; i > 0; --i) {  // Fisher-Yates with splitmix
    const int j = static_cast<int>(exp_common::splitmix(seed) % static_cast<uint64_t>(i + 1));
    std::swap(all[static_cast<size_t>(i)], all[static_cast<size_t>(j)]);
  }
  all.resize(static_cast<size_t>(static_cast<double>(n) * keep + 0.5));
  std::sort(all.begin(), all.end());
  return {name, run_bytes, std::move(all)};
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 100;
  const int copies = argc > 2 ? std::atoi(argv[2]) : 24;
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const double copy = exp_common::copy_gbps(st, e0, e1);
  std::printf("device %s (%d SMs, L2 %d MB), copy %.0f GB/s; buffer %zu bytes, %d flushed calls, graph of %d\n",
              prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, copy, kBytes, reps, copies);

  std::vector<int4*> bufs(static_cast<size_t>(copies));
  for (auto& b : bufs) {
    CK(cudaMalloc(&b, kBytes));
    CK(cudaMemset(b, 0x3C, kBytes));
  }
  int* sink;
  CK(cudaMalloc(&sink, 1024 * sizeof(int)));

  std::vector<Pattern> pats;
  pats.push_back({"dense 117 MB", 4096, {}});
  for (int i = 0; i < static_cast<int>(kBytes / 4096); ++i) pats.back().runs.push_back(i);
  pats.push_back({"contiguous half", 4096, {}});
  for (int i = 0; i < static_cast<int>(kBytes / 4096 / 2); ++i) pats.back().runs.push_back(i);
  for (int u : {256, 512, 1024, 2048, 4096, 8192, 16384, 28672, 57344})
    pats.push_back(
        make_pattern("50% of " + std::to_string(u) + " B runs", u, 0.5, 0x5EED0000u + static_cast<uint64_t>(u)));
  for (int u : {2048, 28672})
    pats.push_back(
        make_pattern("60% of " + std::to_string(u) + " B runs", u, 0.6, 0x5EED1000u + static_cast<uint64_t>(u)));

  FlushedTimer timer(st, reps, static_cast<size_t>(prop.l2CacheSize));
  const int sms = prop.multiProcessorCount;
  struct Shape {
    int blocks_per_sm, unroll;
  };
  const Shape shapes[] = {{4, 8}, {8, 4}, {8, 8}, {16, 4}};
  std::printf("\n%-22s %10s %9s | %-26s | %-26s\n", "pattern", "MB read", "runs", "best flushed: us GB/s (b,u)",
              "best graph: us GB/s (b,u)");
  for (const Pattern& p : pats) {
    int* d_runs;
    CK(cudaMalloc(&d_runs, p.runs.size() * sizeof(int)));
    CK(cudaMemcpy(d_runs, p.runs.data(), p.runs.size() * sizeof(int), cudaMemcpyHostToDevice));
    const int n_runs = static_cast<int>(p.runs.size());
    const int vpr = p.run_bytes / 16;
    const double bytes = static_cast<double>(n_runs) * p.run_bytes;
    double best_f = 1e30, best_g = 1e30;
    Shape sf{}, sg{};
    for (const Shape& s : shapes) {
      const int blocks = sms * s.blocks_per_sm;
      const int per_block = (n_runs + blocks - 1) / blocks;
      auto launch = [&](int i) {
        const int4* b = bufs[static_cast<size_t>(i) % bufs.size()];
        if (s.unroll == 8)
          gather<8><<<blocks, 256, 0, st>>>(b, d_runs, n_runs, vpr, per_block, sink);
        else
          gather<4><<<blocks, 256, 0, st>>>(b, d_runs, n_runs, vpr, per_block, sink);
      };
      const double f = timer.us([&] { launch(0); });
      const double g = exp_common::graph_us(st, e0, e1, copies, std::max(5, reps / 10), launch);
      CK(cudaGetLastError());
      if (f < best_f) best_f = f, sf = s;
      if (g < best_g) best_g = g, sg = s;
    }
    char a[64], b[64];
    std::snprintf(a, sizeof a, "%7.2f %6.0f (%d,%d)", best_f, bytes / best_f / 1e3, sf.blocks_per_sm, sf.unroll);
    std::snprintf(b, sizeof b, "%7.2f %6.0f (%d,%d)", best_g, bytes / best_g / 1e3, sg.blocks_per_sm, sg.unroll);
    std::printf("%-22s %10.1f %9d | %-26s | %-26s\n", p.name.c_str(), bytes / 1e6, n_runs, a, b);
    CK(cudaFree(d_runs));
  }
  for (auto b : bufs) CK(cudaFree(b));
  CK(cudaFree(sink));
  return 0;
}
