// Measurement backbone: statistics, the work of a graph, and this machine's ceilings (bandwidth, GEMM rate).
#include <dlfcn.h>

#include "tessera/bench.h"
#if defined(__x86_64__)
#include <immintrin.h>
#define TESSERA_BENCH_X86 1
#endif
#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <thread>

#include "api/model_impl.h"
#include "backends/backend.h"
#include "backends/cpu/kernels.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "quant/format_support.h"
#include "quant/quant.h"

namespace tessera {

Stats summarize(std::span<const double> samples) {
  Stats s;
  s.n = samples.size();
  if (s.n == 0) return s;
  std::vector<double> v(samples.begin(), samples.end());
  std::sort(v.begin(), v.end());
  s.min = v.front();
  s.max = v.back();
  s.median = s.n % 2 ? v[s.n / 2] : 0.5 * (v[s.n / 2 - 1] + v[s.n / 2]);
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / double(s.n);
  if (s.n > 1) {
    double ss = 0;
    for (double x : v) ss += (x - s.mean) * (x - s.mean);
    s.stddev = std::sqrt(ss / double(s.n - 1));
  }
  return s;
}

WorkCost work_cost(const GraphView& view) {
  const graph::Graph& g = view.impl().graph;
  WorkCost c;
  std::map<DType, uint64_t> matmul_bytes_by_dtype;
  for (const graph::Node& n : g.nodes()) {
    c.flops += n.flops;
    c.bytes += n.bytes;
    // Model weights feed matmuls, the embedding and the norms; other WEIGHT tensors are constants the graph derives
    // (rope inverse frequencies), which stay in cache and are not part of the model.
    if (!graph::is_matmul_like(n.op) && n.op != graph::Op::EMBED && n.op != graph::Op::RMSNORM) continue;
    for (int id : n.inputs) {
      const graph::Tensor& t = g.tensor(id);
      if (t.kind != graph::TensorKind::WEIGHT) continue;
      if (n.op == graph::Op::EMBED) {
        // A lookup reads one row per token, not the table (whose bytes count once more if tied to the output).
        const uint64_t rows = t.shape.empty() ? 1 : static_cast<uint64_t>(std::max<int64_t>(t.shape[0], 1));
        c.weight_bytes += static_cast<uint64_t>(g.n_tokens()) * (t.nbytes() / rows);
      } else {
        c.weight_bytes += t.nbytes();
        if (graph::is_matmul_like(n.op)) matmul_bytes_by_dtype[t.dtype] += t.nbytes();
      }
    }
    if (graph::is_matmul_like(n.op)) c.matmul_flops += n.flops;
  }
  uint64_t best = 0;
  for (const auto& [dt, b] : matmul_bytes_by_dtype)
    if (b > best) {
      best = b;
      c.matmul_dtype = std::string(dtype_name(dt));
    }
  return c;
}

void check_device(const std::string& device) { (void)backend::get(device); }

uint64_t peak_host_bytes() {
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) != 0) return 0;
  return static_cast<uint64_t>(u.ru_maxrss) * 1024;  // Linux reports KiB
}

bool reset_peak_host_bytes() {
  std::ofstream f("/proc/self/clear_refs");
  return f && (f << "5").flush();
}

int hardware_threads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

double Ceilings::read_gbps() const {
  for (const BandwidthCeiling& b : bandwidth)
    if (b.name == "read") return b.gbps.median;
  return 0;
}

double Ceilings::gemm_tflops(const std::string& dtype) const {
  for (const GemmCeiling& g : gemm)
    if (g.kernel == "tessera" && g.dtype == dtype) return g.tflops.median;
  return 0;
}

double Ceilings::fma_peak_tflops() const {
  for (const GemmCeiling& g : gemm)
    if (g.kernel.rfind("fma-peak", 0) == 0) return g.tflops.median;
  return 0;
}

std::string cpu_matmul_dtype(const std::string& weight_dtype) {
  const std::optional<DType> dt = dtype_from_name(weight_dtype);
  TESSERA_CHECK(dt.has_value(), "unknown dtype '{}'", weight_dtype);
  return cpu::matmul_supports(*dt) ? std::string(dtype_name(*dt)) : "f16";
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string read_cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        size_t b = line.find_first_not_of(" \t", colon + 1);
        return b == std::string::npos ? "" : line.substr(b);
      }
    }
  return "unknown cpu";
}

// ---------------------------------------------------------------------------------------------------------------------
// Bandwidth

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// 2 MiB alignment lets the kernel back the buffer with huge pages, so the ceiling is not lowered by TLB misses that
// a well-tuned engine would avoid too.
std::unique_ptr<uint8_t, FreeDeleter> alloc_buffer(uint64_t bytes) {
  constexpr uint64_t kAlign = 2ull << 20;
  const uint64_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, rounded);
  TESSERA_CHECK(p != nullptr, "cannot allocate {} MiB for the bandwidth measurement", rounded >> 20);
  madvise(p, rounded, MADV_HUGEPAGE);
  return std::unique_ptr<uint8_t, FreeDeleter>(static_cast<uint8_t*>(p));
}

#ifdef TESSERA_BENCH_X86
__attribute__((target("avx2"))) uint64_t read_sum_avx2(const uint8_t* p, uint64_t n) {
  // Four independent accumulators keep several loads in flight per core; adds are far cheaper than the loads, so the
  // loop is bound by memory, which is what it measures.
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  uint64_t i = 0;
  for (; i + 128 <= n; i += 128) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  const __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  uint64_t r = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  for (; i < n; ++i) r += p[i];
  return r;
}
#endif

uint64_t read_sum_scalar(const uint8_t* p, uint64_t n) {
  uint64_t a = 0, b = 0, i = 0;
  for (; i + 16 <= n; i += 16) {
    uint64_t x, y;
    std::memcpy(&x, p + i, 8);
    std::memcpy(&y, p + i + 8, 8);
    a += x;
    b += y;
  }
  for (; i < n; ++i) a += p[i];
  return a + b;
}

// Chunks of a few MiB spread the buffer over the pool's dynamic scheduler evenly; each chunk is a multiple of 128.
constexpr uint64_t kChunk = 4ull << 20;

BandwidthCeiling measure_read(ThreadPool& pool, const uint8_t* buf, uint64_t bytes, int repeats) {
#ifdef TESSERA_BENCH_X86
  const bool avx2 = __builtin_cpu_supports("avx2");
#endif
  const int64_t chunks = static_cast<int64_t>((bytes + kChunk - 1) / kChunk);
  std::vector<uint64_t> sink(static_cast<size_t>(pool.n_threads()) * 8);  // 64 bytes apart: no false sharing
  std::vector<double> gbps;
  for (int r = -1; r < repeats; ++r) {  // r == -1: warm-up
    const auto t0 = Clock::now();
    pool.parallel_for(chunks, [&](int64_t c, int thread) {
      const uint64_t b = static_cast<uint64_t>(c) * kChunk, e = std::min(bytes, b + kChunk);
#ifdef TESSERA_BENCH_X86
      if (avx2) {
        sink[static_cast<size_t>(thread) * 8] += read_sum_avx2(buf + b, e - b);
        return;
      }
#endif
      sink[static_cast<size_t>(thread) * 8] += read_sum_scalar(buf + b, e - b);
    });
    const double s = seconds_since(t0);
    if (r >= 0) gbps.push_back(double(bytes) / s / 1e9);
  }
  volatile uint64_t keep = 0;
  for (uint64_t v : sink) keep = keep + v;
  return {"read", bytes, summarize(gbps)};
}

BandwidthCeiling measure_copy(ThreadPool& pool, uint8_t* dst, const uint8_t* src, uint64_t bytes, int repeats) {
  const int64_t chunks = static_cast<int64_t>((bytes + kChunk - 1) / kChunk);
  std::vector<double> gbps;
  for (int r = -1; r < repeats; ++r) {
    const auto t0 = Clock::now();
    pool.parallel_for(chunks, [&](int64_t c, int) {
      const uint64_t b = static_cast<uint64_t>(c) * kChunk, e = std::min(bytes, b + kChunk);
      std::memcpy(dst + b, src + b, e - b);
    });
    const double s = seconds_since(t0);
    if (r >= 0) gbps.push_back(2.0 * double(bytes) / s / 1e9);  // every byte is read once and written once
  }
  return {"copy", 2 * bytes, summarize(gbps)};
}

// ---------------------------------------------------------------------------------------------------------------------
// GEMM

// y[m, n] = x[m, k] · Wᵀ with the engine's matmul. m = 512 is a full prefill chunk; n = k = 2048 makes the weight
// (4 to 16 MiB) stream from L2/L3 while each of its bytes is used 512 times, so the kernel is compute-bound.
constexpr int64_t kGemmM = 512, kGemmN = 2048, kGemmK = 2048;

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

template <typename F>
Stats time_tflops(double flops, int repeats, F&& run) {
  std::vector<double> tf;
  for (int r = -1; r < repeats; ++r) {
    const auto t0 = Clock::now();
    run();
    const double s = seconds_since(t0);
    if (r >= 0) tf.push_back(flops / s / 1e12);
  }
  return summarize(tf);
}

GemmCeiling measure_gemm_tessera(ThreadPool& pool, DType dt, int repeats) {
  const std::vector<float> wf = random_floats(static_cast<size_t>(kGemmN * kGemmK), 1);
  const std::vector<float> x = random_floats(static_cast<size_t>(kGemmM * kGemmK), 2);
  const uint64_t row_bytes = *dtype_row_bytes(dt, kGemmK);
  std::vector<uint8_t> w(static_cast<size_t>(row_bytes * kGemmN));  // [N, K] in dt
  for (int64_t r = 0; r < kGemmN; ++r) quantize_row(dt, wf.data() + r * kGemmK, w.data() + r * row_bytes, kGemmK);
  const cpu::PackedWeight pw = cpu::prepare_weight(dt, w.data(), kGemmN, kGemmK);
  std::vector<float> y(static_cast<size_t>(kGemmM * kGemmN));  // [M, N]
  GemmCeiling g{std::string(dtype_name(dt)), "tessera", kGemmM, kGemmN, kGemmK, {}};
  g.tflops =
      time_tflops(2.0 * kGemmM * kGemmN * kGemmK, repeats, [&] { cpu::matmul(pool, pw, x.data(), y.data(), kGemmM); });
  return g;
}

// OpenBLAS is loaded at run time when present, so the build needs no BLAS, and an independent f32 GEMM stands next
// to ours. The enum values are the CBLAS standard's.
using SgemmFn = void (*)(int order, int trans_a, int trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                         const float* b, int ldb, float beta, float* c, int ldc);
using SetThreadsFn = void (*)(int);

bool measure_gemm_openblas(int n_threads, int repeats, GemmCeiling* out) {
  void* lib = nullptr;
  for (const char* name : {"libopenblas.so.0", "libopenblas.so"})
    if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
  if (lib == nullptr) return false;
  auto sgemm = reinterpret_cast<SgemmFn>(dlsym(lib, "cblas_sgemm"));
  auto set_threads = reinterpret_cast<SetThreadsFn>(dlsym(lib, "openblas_set_num_threads"));
  if (sgemm == nullptr) return false;  // the library stays loaded: unloading OpenBLAS with live threads is unsafe
  if (set_threads != nullptr) set_threads(n_threads);
  const std::vector<float> w = random_floats(static_cast<size_t>(kGemmN * kGemmK), 1);  // [N, K]
  const std::vector<float> x = random_floats(static_cast<size_t>(kGemmM * kGemmK), 2);  // [M, K]
  std::vector<float> y(static_cast<size_t>(kGemmM * kGemmN));                           // [M, N]
  constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
  *out = GemmCeiling{"f32", "openblas", kGemmM, kGemmN, kGemmK, {}};
  out->tflops = time_tflops(2.0 * kGemmM * kGemmN * kGemmK, repeats, [&] {
    sgemm(kRowMajor, kNoTrans, kTrans, int(kGemmM), int(kGemmN), int(kGemmK), 1.0f, x.data(), int(kGemmK), w.data(),
          int(kGemmK), 0.0f, y.data(), int(kGemmN));
  });
  return true;
}

// The arithmetic peak: independent FMA chains on registers, no memory traffic. Ten accumulators cover the FMA
// latency (4 cycles) times the two FMA pipes of current x86 cores with room to spare.
constexpr int64_t kFmaIters = 1 << 22;

#ifdef TESSERA_BENCH_X86

__attribute__((target("avx2,fma"))) float fma_loop_avx2(float seed) {
  __m256 acc[10];
  for (int i = 0; i < 10; ++i) acc[i] = _mm256_set1_ps(seed + float(i));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < kFmaIters; ++it)
    for (int i = 0; i < 10; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  __m256 s = acc[0];
  for (int i = 1; i < 10; ++i) s = _mm256_add_ps(s, acc[i]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, s);
  return lanes[0];
}

__attribute__((target("avx512f"))) float fma_loop_avx512(float seed) {
  __m512 acc[10];
  for (int i = 0; i < 10; ++i) acc[i] = _mm512_set1_ps(seed + float(i));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < kFmaIters; ++it)
    for (int i = 0; i < 10; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  __m512 s = acc[0];
  for (int i = 1; i < 10; ++i) s = _mm512_add_ps(s, acc[i]);
  alignas(64) float lanes[16];  // not _mm512_reduce_add_ps: GCC 12 warns inside it (-Wuninitialized)
  _mm512_store_ps(lanes, s);
  return lanes[0] + lanes[15];
}
#endif

bool measure_fma_peak(ThreadPool& pool, int repeats, GemmCeiling* out) {
#ifndef TESSERA_BENCH_X86
  (void)pool, (void)repeats, (void)out;
  return false;
#else
  const bool avx512 = __builtin_cpu_supports("avx512f");
  if (!avx512 && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) return false;
  const int lanes = avx512 ? 16 : 8;
  const int n = pool.n_threads();
  std::vector<float> sink(static_cast<size_t>(n) * 16);
  *out = GemmCeiling{"f32", avx512 ? "fma-peak-avx512" : "fma-peak-avx2", 0, 0, 0, {}};
  out->tflops = time_tflops(2.0 * double(kFmaIters) * 10 * lanes * n, repeats, [&] {
    pool.parallel_for(n, [&](int64_t task, int thread) {
      const float v = avx512 ? fma_loop_avx512(float(task)) : fma_loop_avx2(float(task));
      sink[static_cast<size_t>(thread) * 16] += v;
    });
  });
  volatile float keep = 0;
  for (float v : sink) keep = keep + v;
  return true;
#endif
}

}  // namespace

Ceilings measure_ceilings(const CeilingOptions& o) {
  check_device(o.device);
  TESSERA_CHECK(o.n_threads >= 0 && o.n_threads <= 1024, "thread count {} must be between 0 (all cores) and 1024",
                o.n_threads);
  TESSERA_CHECK(o.repeats >= 1 && o.repeats <= 1000, "repeat count {} must be between 1 and 1000", o.repeats);
  TESSERA_CHECK(o.buffer_bytes >= (1ull << 20) && o.buffer_bytes <= (1ull << 40),
                "bandwidth buffer of {} bytes must be between 1 MiB and 1 TiB", o.buffer_bytes);
  Ceilings c;
  c.device = o.device;
  if (o.device != "cpu") {
    backend::CeilingsRequest r;
    r.buffer_bytes = o.buffer_bytes;
    r.repeats = o.repeats;
    r.bandwidth = o.bandwidth;
    r.gemm = o.gemm;
    const backend::Backend& b = backend::get(o.device);
    for (const std::string& name : o.gemm_dtypes) {
      const std::optional<DType> dt = dtype_from_name(name);
      TESSERA_CHECK(dt.has_value() && b.native_weight_format(*dt), "dtype '{}' has no {} kernel to measure", name,
                    o.device);
      r.dtypes.push_back(*dt);
    }
    const backend::Ceilings dc = b.measure_ceilings(r);
    c.cpu_name = dc.device_name;
    for (const auto& x : dc.bandwidth) c.bandwidth.push_back({x.name, x.bytes, summarize(x.gbps)});
    for (const auto& g : dc.gemm) c.gemm.push_back({g.dtype, g.kernel, g.m, g.n, g.k, summarize(g.tflops)});
    return c;
  }
  c.cpu_name = read_cpu_name();
  ThreadPool pool(o.n_threads);
  c.n_threads = pool.n_threads();

  if (o.bandwidth) {
    const uint64_t bytes = o.buffer_bytes / 128 * 128;
    auto src = alloc_buffer(bytes);
    auto dst = alloc_buffer(bytes);
    // Touch every page first (in parallel, as the measurement will): page faults are not bandwidth.
    const int64_t chunks = static_cast<int64_t>((bytes + kChunk - 1) / kChunk);
    pool.parallel_for(chunks, [&](int64_t ch, int) {
      const uint64_t b = static_cast<uint64_t>(ch) * kChunk, e = std::min(bytes, b + kChunk);
      std::memset(src.get() + b, int(ch & 0x7f) + 1, e - b);
      std::memset(dst.get() + b, 0, e - b);
    });
    c.bandwidth.push_back(measure_read(pool, src.get(), bytes, o.repeats));
    c.bandwidth.push_back(measure_copy(pool, dst.get(), src.get(), bytes, o.repeats));
  }

  if (o.gemm) {
    std::vector<DType> dtypes;
    if (o.gemm_dtypes.empty()) {
      dtypes = {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1};
    } else {
      for (const std::string& name : o.gemm_dtypes) {
        const std::optional<DType> dt = dtype_from_name(name);
        TESSERA_CHECK(dt.has_value(), "unknown dtype '{}' for the GEMM ceiling", name);
        TESSERA_CHECK(cpu::matmul_supports(*dt) && can_quantize(*dt),
                      "dtype '{}' has no CPU matmul kernel to measure ({} have)", name,
                      cpu::matmul_formats().native_names());
        if (std::find(dtypes.begin(), dtypes.end(), *dt) == dtypes.end()) dtypes.push_back(*dt);
      }
    }
    for (DType dt : dtypes) c.gemm.push_back(measure_gemm_tessera(pool, dt, o.repeats));
    GemmCeiling g;
    if (measure_gemm_openblas(c.n_threads, o.repeats, &g)) c.gemm.push_back(g);
    if (measure_fma_peak(pool, o.repeats, &g)) c.gemm.push_back(g);
  }
  return c;
}

}  // namespace tessera
