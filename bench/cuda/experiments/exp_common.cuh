// Helpers shared by the single-file experiments in this directory (persistent_gemv.cu, gemv_stream.cu, attn_oproj.cu,
// attn_decode_versions.cu, and the GEMV sweeps). CMake builds them all (TESSERA_EXPERIMENTS, CMakeLists.txt here); the
// standalone ones still build alone with one nvcc command, this header beside it.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

// A cuBLASLt call, checked (for the experiments that include cublasLt.h).
#define LT(x)                                                                                         \
  do {                                                                                                \
    cublasStatus_t s_ = (x);                                                                          \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cublasLtGetStatusString(s_)); \
      std::exit(1);                                                                                   \
    }                                                                                                 \
  } while (0)

namespace exp_common {

// 16 bytes of weights that are read once: no L1 allocation.
__device__ __forceinline__ int4 ld16(const void* p) {
  int4 v;
  asm("ld.global.nc.L1::no_allocate.v4.s32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
inline float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// f() on stream st: 3 untimed runs, then the median of `reps` runs between CUDA events, in microseconds.
template <typename F>
float time_us(F&& f, int reps, cudaStream_t st) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int i = 0; i < 3; ++i) f();
  std::vector<float> v;
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(e0, st));
    f();
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    v.push_back(ms * 1e3f);
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return median(std::move(v));
}

// The copy ceiling: a 1 GiB device-to-device copy, bytes read + written per second (GB/s), median of 10 after 2.
inline double copy_gbps(cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1) {
  const size_t bytes = size_t{1} << 30;
  void *a, *b;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  CK(cudaMemset(a, 0x5A, bytes));
  std::vector<float> ms;
  for (int i = 0; i < 12; ++i) {
    CK(cudaEventRecord(e0, st));
    CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float t;
    CK(cudaEventElapsedTime(&t, e0, e1));
    if (i >= 2) ms.push_back(t);
  }
  CK(cudaFree(a));
  CK(cudaFree(b));
  return 2.0 * static_cast<double>(bytes) / (median(ms) * 1e-3) / 1e9;
}

// Microseconds per launch(i), i in [0, batch): three warm-up launches, then one CUDA graph of the batch replayed
// `reps` times (after one replay), median.
template <typename F>
float graph_us(cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1, int batch, int reps, F&& launch) {
  for (int i = 0; i < 3; ++i) launch(i);
  CK(cudaStreamSynchronize(st));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < batch; ++i) launch(i);
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphLaunch(ge, st));
  std::vector<float> us;
  for (int r = 0; r < reps; ++r) {
    CK(cudaEventRecord(e0, st));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    us.push_back(ms * 1000.0f / static_cast<float>(batch));
  }
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  return median(us);
}

// Microseconds of op() alone with the L2 flushed before each call (a cudaMemsetAsync of twice the L2 in between, each
// call between its own pair of events), median of `reps` after one untimed call: the sparse-GEMV sweeps' method
// (bench_sparse.cpp's).
class FlushedTimer {
 public:
  FlushedTimer(cudaStream_t st, int reps, size_t l2) : st_(st), reps_(reps), flush_bytes_(2 * l2), ev0_(reps), ev1_(reps) {
    CK(cudaMalloc(&flush_, flush_bytes_));
    for (int i = 0; i < reps; ++i) {
      CK(cudaEventCreate(&ev0_[static_cast<size_t>(i)]));
      CK(cudaEventCreate(&ev1_[static_cast<size_t>(i)]));
    }
  }
  ~FlushedTimer() {
    for (auto e : ev0_) cudaEventDestroy(e);
    for (auto e : ev1_) cudaEventDestroy(e);
    cudaFree(flush_);
  }
  FlushedTimer(const FlushedTimer&) = delete;
  FlushedTimer& operator=(const FlushedTimer&) = delete;
  template <typename F>
  double us(F&& op) {
    op();
    CK(cudaStreamSynchronize(st_));
    for (int i = 0; i < reps_; ++i) {
      CK(cudaMemsetAsync(flush_, i & 0xff, flush_bytes_, st_));
      CK(cudaEventRecord(ev0_[static_cast<size_t>(i)], st_));
      op();
      CK(cudaEventRecord(ev1_[static_cast<size_t>(i)], st_));
    }
    CK(cudaStreamSynchronize(st_));
    CK(cudaGetLastError());
    std::vector<double> v;
    for (int i = 0; i < reps_; ++i) {
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, ev0_[static_cast<size_t>(i)], ev1_[static_cast<size_t>(i)]));
      v.push_back(ms * 1e3);
    }
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  }

 private:
  cudaStream_t st_;
  int reps_;
  size_t flush_bytes_;
  void* flush_ = nullptr;
  std::vector<cudaEvent_t> ev0_, ev1_;
};

// A seeded stream of uniform floats in [lo, hi) (splitmix64), the same on every machine.
inline uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
inline float uniform(uint64_t& s, float lo, float hi) {
  return lo + (hi - lo) * static_cast<float>(splitmix(s) >> 40) * (1.0f / 16777216.0f);
}

// A sweep's end: closes its TSV (if open), prints "== summary (copy C GB/s[; note]) failures=F" and its summary lines,
// and returns the exit code (1 if any variant failed its check).
inline int finish_sweep(std::FILE* tsv, double copy_gbps, const char* note, int failures,
                        const std::vector<std::string>& summary) {
  if (tsv) std::fclose(tsv);
  std::printf("\n== summary (copy %.0f GB/s%s%s) failures=%d\n", copy_gbps, note[0] ? "; " : "", note, failures);
  for (const std::string& s : summary) std::printf("%s\n", s.c_str());
  return failures ? 1 : 0;
}

// Launches kernel with programmatic dependent launch (as src's launch() does), so back-to-back launches overlap.
template <typename... KArgs, typename... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  CK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

}  // namespace exp_common
