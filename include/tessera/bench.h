// Public API: the measurement backbone behind `tessera bench` and `tessera profile`: summary statistics of repeated
// timings, the work a graph does (FLOPs, weight bytes read), and this machine's ceilings (memory bandwidth, peak GEMM
// rate per dtype), so that every figure can be shown next to the limit it is bounded by.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tessera/graph.h"

namespace tessera {

// Median and spread of repeated measurements (any unit). stddev is the sample standard deviation (n - 1), 0 for n < 2.
struct Stats {
  size_t n = 0;
  double median = 0, mean = 0, stddev = 0, min = 0, max = 0;
};
Stats summarize(std::span<const double> samples);

// What one forward pass of a graph costs. weight_bytes counts the bytes of model weights the pass must read: every
// matmul weight in full, the embedding rows of its tokens (not the whole table), and the norm weights. It is the
// numerator of a decode step's achieved bandwidth ("GB/s of weight bytes").
struct WorkCost {
  uint64_t flops = 0;
  uint64_t matmul_flops = 0;
  uint64_t weight_bytes = 0;
  uint64_t bytes = 0;        // everything the cost model says is read or written (activations and KV cache included)
  std::string matmul_dtype;  // the dtype holding most matmul weight bytes ("q4_0", ...)
};
WorkCost work_cost(const GraphView& graph);

// "cpu" is accepted; "cuda" fails with one sentence (not built with CUDA support, or not available yet in these
// tools); anything else fails naming the accepted values.
void check_device(const std::string& device);

struct CeilingOptions {
  std::string device = "cpu";
  int n_threads = 0;                   // 0: one per hardware thread
  uint64_t buffer_bytes = 1ull << 30;  // per buffer; >= 1 GiB keeps the data far outside every cache
  int repeats = 5;                     // after one warm-up
  // GEMM dtypes to measure; empty: every dtype the CPU matmul kernels run (f32, f16, bf16, q8_0, q4_0, q4_1).
  std::vector<std::string> gemm_dtypes;
  bool bandwidth = true;
  bool gemm = true;
};

struct BandwidthCeiling {
  std::string name;  // "read" (vectorized sum of a buffer), "copy" (memcpy; bytes read + bytes written)
  uint64_t bytes = 0;
  Stats gbps;  // 1e9 bytes per second
};

struct GemmCeiling {
  std::string dtype;   // weight dtype ("f32", "q4_0", ...)
  std::string kernel;  // "tessera" (the engine's own matmul), "openblas" (cblas_sgemm), "fma-peak" (registers only)
  int64_t m = 0, n = 0, k = 0;  // y[m, n] = x[m, k] · W[n, k]ᵀ
  Stats tflops;                 // 1e12 FLOP per second
};

struct Ceilings {
  std::string device;    // "cpu"
  std::string cpu_name;  // "AMD EPYC", from /proc/cpuinfo
  int n_threads = 0;
  std::vector<BandwidthCeiling> bandwidth;
  std::vector<GemmCeiling> gemm;

  // The memory limit a decode step is held to: the median read bandwidth (0 when not measured).
  double read_gbps() const;
  // The median TFLOP/s of the engine's own matmul for `dtype` (0 when not measured); the prefill limit.
  double gemm_tflops(const std::string& dtype) const;
  // The arithmetic peak of f32 FMAs on this machine (0 when not measured): the limit of ops other than matmul.
  double fma_peak_tflops() const;
};

// The dtype the CPU matmul computes in for weights stored as `weight_dtype`: itself where a kernel exists, else f16
// (the weights are converted once at load). Error for an unknown dtype name.
std::string cpu_matmul_dtype(const std::string& weight_dtype);

// Measures bandwidth (multi-threaded vectorized read and copy over buffers of buffer_bytes, median of repeats) and
// GEMM rates (the engine's own matmul per dtype on a compute-bound shape; OpenBLAS sgemm when the library can be
// loaded at run time; an f32 FMA loop on registers, the arithmetic peak). Takes a few seconds and, while it runs,
// about 2 * buffer_bytes of memory (measure after anything whose peak memory is reported).
Ceilings measure_ceilings(const CeilingOptions& options);

// Peak resident memory of this process so far (getrusage ru_maxrss), bytes.
uint64_t peak_host_bytes();
// Restarts the peak from the current resident size (Linux /proc/self/clear_refs), so that a setup phase, such as
// building a synthetic model, does not count. False where the system does not allow it.
bool reset_peak_host_bytes();
// Hardware threads available to this process.
int hardware_threads();

}  // namespace tessera
