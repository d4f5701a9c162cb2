// Float (bf16) GEMV experiment (issues 6/7: mid-size and small shapes; Llama-3.2-1B and SmolLM2-135M decode).
// The kernel under test is src/'s own (backends/cuda/kernels/gemv_float_kernel.cuh, included below); the kernel
// before this experiment is kept here verbatim as mode 0, so old and new are timed in the same run. Each variant is
// checked on random data against a double reference (every row, output poisoned first) and against mode 0 bit for bit
// at the same launch shape (the new kernel keeps each row's summation order), then timed like bench/cuda: a CUDA graph
// of back-to-back PDL launches over rotating weight copies >= 4x L2, median of the replays, with the copy bandwidth
// measured in the same run.
//
// Build here (no GPU needed): cmake -DTESSERA_EXPERIMENTS=ON (the default with CUDA), target exp_gemv_float_sweep (it
// links tessera_backend_cuda for gemv_default_config).
// Run on the GPU machine:   build/bin/experiments/exp_gemv_float_sweep [reps] [only-problem-substring]
//
// MODE:
//   0  the kernel in src/ before this experiment: the block's first lines prefetched into L2 before the PDL wait,
//      then steps of ROWS * UNROLL loads, each issued after the previous step's arithmetic, and a one-load tail loop;
//   1  src/'s kernel: the first step's loads into registers before the wait, software-pipelined (step s+1's loads
//      before step s's arithmetic), per-slot guards (the tail is an ordinary step);
//   2  as 1 with __launch_bounds__(T, 1024 / T): at most 64 registers per thread (src/'s CAP instantiation; only
//      the shapes src/ has it for, float_cappable);
//   3  as 1, with griddepcontrol.launch_dependents at the kernel's start instead of after the PDL wait (common.cuh's
//      pdl_wait): the next GEMV launches, and issues its own first loads, as soon as this one's blocks have all
//      started, instead of once they have all passed the wait. Not in src/ (common.cuh is shared by every kernel).
// "new" in the summary is what src/ launches at the old default shape: mode 2 where use_capped_kernel picks it (by the
// occupancy calculator, as gemv_float.cu does), else mode 1. "prev" is the form TESSERA_CUDA_GEMV_PREV_SHAPES=1 used to
// select in src/ (removed: it measured slower): src's kernel at the old default shape with the capped copy only where
// it makes one wave (use_capped_kernel with fused = false); "default" is src's own choice now (gemv_default_config,
// linked from tessera_backend_cuda, and the capped copy always for the fused kinds), the row the others lose to.
// KIND: plain GEMV; +norm (fused RMSNorm, GemvInput::norm_w: the decoder's q|k|v and lm_head); +swiglu (fused RMSNorm
// and SwiGLU epilogue over [gate; up]: the decoder's gate|up).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/gemv_float_kernel.cuh"
#include "exp_common.cuh"
#include "quant/half.h"

namespace sweep {
using namespace tessera;
using namespace tessera::cuda::detail;

// ---- Mode 0: gemv_float_kernel as it was in src/backends/cuda/kernels/gemv_float.cu before this experiment
// (commit 4f92064), unchanged but for its name. ----
template <DType D, int THREADS, int ROWS, int UNROLL, int PF, bool NORM, bool SWIGLU = false>
__global__ void __launch_bounds__(THREADS)
    gemv_float_v0(const uint8_t* __restrict__ w, const float* __restrict__ x, float* __restrict__ y, int n, int k,
                  bool accumulate, const float* __restrict__ norm_w, float norm_eps,
                  EarlyL2 /*src/'s later argument*/) {
  using F = FloatFmt<D>;
  constexpr int E = F::kElems;
  constexpr int kElemBytes = 16 / E;
  constexpr int kStep = THREADS * E;
  const uint8_t* wr[ROWS];
  int row0;
  if constexpr (SWIGLU) {
    constexpr int H = ROWS / 2;
    row0 = blockIdx.x * H;
#pragma unroll
    for (int r = 0; r < H; ++r) {
      wr[r] = w + static_cast<size_t>(min(row0 + r, n - 1)) * k * kElemBytes;
      wr[H + r] = w + static_cast<size_t>(n + min(row0 + r, n - 1)) * k * kElemBytes;
    }
    prefetch_block_l2<THREADS>(wr[0], static_cast<size_t>(min(H, n - row0)) * k * kElemBytes);
    prefetch_block_l2<THREADS>(wr[H], static_cast<size_t>(min(H, n - row0)) * k * kElemBytes);
  } else {
    row0 = blockIdx.x * ROWS;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) wr[r] = w + static_cast<size_t>(min(row0 + r, n - 1)) * k * kElemBytes;
    prefetch_block_l2<THREADS>(wr[0], static_cast<size_t>(min(ROWS, n - row0)) * k * kElemBytes);
  }
  pdl_wait();
  float acc[ROWS] = {};
  float ss = 0.0f;
  int base = threadIdx.x * E;
  for (; base + (UNROLL - 1) * kStep < k; base += kStep * UNROLL) {
    if constexpr (PF > 0) {
      const int next = base + PF * kStep * UNROLL;
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
          if (next + u * kStep < k) prefetch_l2(wr[r] + static_cast<size_t>(next + u * kStep) * kElemBytes);
    }
    uint4 wv[UNROLL][ROWS];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
#pragma unroll
      for (int r = 0; r < ROWS; ++r) wv[u][r] = ld_stream16(wr[r] + static_cast<size_t>(base + u * kStep) * kElemBytes);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      float_step<F, ROWS, NORM>(wv[u], x + base + u * kStep, NORM ? norm_w + base + u * kStep : nullptr, acc, ss);
  }
  for (; base < k; base += kStep) {
    uint4 wv[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) wv[r] = ld_stream16(wr[r] + static_cast<size_t>(base) * kElemBytes);
    float_step<F, ROWS, NORM>(wv, x + base, NORM ? norm_w + base : nullptr, acc, ss);
  }
  float scale = 1.0f;
  if constexpr (NORM) scale = 1.0f / sqrtf(block_sum_all<THREADS>(ss) / static_cast<float>(k) + norm_eps);
  if constexpr (SWIGLU)
    block_sum_store_swiglu<THREADS, ROWS>(acc, y, row0, n, scale);
  else if constexpr (NORM)
    block_sum_store<THREADS, ROWS>(acc, y, row0, n, accumulate, scale);
  else
    block_sum_store<THREADS, ROWS>(acc, y, row0, n, accumulate);
}

// ---- Mode 3: src/'s kernel body, with the next grid's launch triggered at the start. ----
template <int THREADS, int ROWS, int UNROLL, bool NORM, bool SWIGLU>
__global__ void __launch_bounds__(THREADS)
    gemv_float_early(const uint8_t* __restrict__ w, const float* __restrict__ x, float* __restrict__ y, int n, int k,
                     bool accumulate, const float* __restrict__ norm_w, float norm_eps, EarlyL2 early) {
  asm volatile("griddepcontrol.launch_dependents;" :::);
  gemv_float_rows<DType::BF16, THREADS, ROWS, UNROLL, 0, NORM, SWIGLU>(w, x, y, n, k, accumulate, norm_w, norm_eps,
                                                                       early);
}

// ---- Host ----

enum Kind { PLAIN = 0, NORM = 1, SWIGLU = 2 };
const char* kind_name(int kind) { return kind == PLAIN ? "" : kind == NORM ? "+norm" : "+swiglu"; }

using KFn = void (*)(const uint8_t*, const float*, float*, int, int, bool, const float*, float, EarlyL2);
struct Entry {
  Shape c;
  int mode;
  KFn f[3];       // by Kind; null where the shape cannot take it (SwiGLU: >= 128 threads, even rows)
  int per_sm[3];  // resident blocks per SM (occupancy calculator)
};

template <int M, int T, int R, int U, bool N, bool S>
constexpr KFn pick() {
  if constexpr (M == 0)
    return gemv_float_v0<DType::BF16, T, R, U, 0, N, S>;
  else if constexpr (M == 3)
    return gemv_float_early<T, R, U, N, S>;
  else
    return gemv_float_kernel<DType::BF16, T, R, U, 0, N, S, M == 2>;
}

template <int M, size_t I>
void add_entry(std::vector<Entry>& v) {
  constexpr Shape s = kShapes[I];
  if constexpr (s.prefetch == 0 && (M != 2 || float_cappable<DType::BF16>(s))) {
    Entry e{s,
            M,
            {pick<M, s.threads, s.rows, s.unroll, false, false>(), pick<M, s.threads, s.rows, s.unroll, true, false>(),
             nullptr},
            {0, 0, 0}};
    if constexpr (s.rows % 2 == 0 && s.threads >= 128) e.f[SWIGLU] = pick<M, s.threads, s.rows, s.unroll, true, true>();
    v.push_back(e);
  }
}

template <size_t... I>
std::vector<Entry> entries(std::index_sequence<I...>) {
  std::vector<Entry> v;
  (add_entry<0, I>(v), ...);
  (add_entry<1, I>(v), ...);
  (add_entry<2, I>(v), ...);
  (add_entry<3, I>(v), ...);
  for (Entry& e : v)
    for (int kd = 0; kd < 3; ++kd)
      if (e.f[kd]) CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&e.per_sm[kd], e.f[kd], e.c.threads, 0));
  return v;
}

// gemv_default_config's float branch before this experiment (src/backends/cuda/kernels/gemv.cu).
Shape old_default(long k) {
  const long vectors = k * 2 / 16;
  if (vectors >= 384) return {256, 2, 2, 0};
  if (vectors >= 128) return {128, 2, 2, 0};
  return {128, 4, 2, 0};
}

bool same(const Shape& a, const Shape& b) { return a.threads == b.threads && a.rows == b.rows && a.unroll == b.unroll; }

struct Problem {
  const char* name;
  int n, k, kind;  // SWIGLU: n = F output rows, the weight is [2F, k]
};

// splitmix64: fast enough for a 1 GB weight, and every value differs from run to run only by the seed.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform(float lo, float hi) { return lo + (hi - lo) * static_cast<float>(next() >> 40) * 0x1p-24f; }
};

template <typename Fn>
void parallel_rows(long rows, Fn fn) {
  const int nt = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> ts;
  for (int t = 0; t < nt; ++t)
    ts.emplace_back([&, t] {
      for (long i = t; i < rows; i += nt) fn(i);
    });
  for (auto& t : ts) t.join();
}

}  // namespace sweep

int main(int argc, char** argv) {
  using namespace sweep;
  const int reps = argc > 1 ? std::atoi(argv[1]) : 15;
  const char* only = argc > 2 ? argv[2] : nullptr;
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);

  const double copy_gbps = exp_common::copy_gbps(st, e0, e1);
  std::printf("copy %.0f GB/s\n", copy_gbps);

  const std::vector<Entry> all_entries = entries(std::make_index_sequence<kNumShapes>{});
  const Problem problems[] = {
      // SmolLM2-135M (hidden 576): q|k|v, o, gate|up, down
      {"smol.qkv", 960, 576, NORM},
      {"smol.o", 576, 576, PLAIN},
      {"smol.gate_up", 1536, 576, SWIGLU},
      {"smol.down", 576, 1536, PLAIN},
      {"1536x576", 1536, 576, PLAIN},
      // Llama-3.2-1B (hidden 2048)
      {"l1b.qkv", 3072, 2048, NORM},
      {"l1b.o", 2048, 2048, PLAIN},
      {"l1b.gate_up", 8192, 2048, SWIGLU},
      {"l1b.down", 2048, 8192, PLAIN},
      {"l1b.lm_head", 128256, 2048, NORM},
      // the issue's mid-size shapes
      {"1024x4096", 1024, 4096, PLAIN},
      {"8192x2048", 8192, 2048, PLAIN},
      // Llama-3-8B (hidden 4096): must not regress
      {"l8b.qkv", 6144, 4096, NORM},
      {"l8b.o", 4096, 4096, PLAIN},
      {"l8b.gate_up", 14336, 4096, SWIGLU},
      {"l8b.down", 4096, 14336, PLAIN},
      {"14336x4096", 14336, 4096, PLAIN},
      {"l8b.lm_head", 128256, 4096, NORM},
  };
  Rng rng{0x5eed0000ull ^ static_cast<uint64_t>(std::time(nullptr))};
  std::FILE* tsv =
      std::fopen((std::string(std::getenv("OUT") ? std::getenv("OUT") : "/tmp") + "/fsweep.tsv").c_str(), "w");
  std::vector<std::string> summary;
  int failures = 0, differ = 0;
  for (const Problem& p : problems) {
    if (only && !std::strstr(p.name, only)) continue;
    const int wn = p.kind == SWIGLU ? 2 * p.n : p.n;  // weight rows
    const size_t bytes = size_t(wn) * p.k * 2;
    const int copies = static_cast<int>(std::clamp<size_t>((4 * size_t(prop.l2CacheSize) + bytes - 1) / bytes, 1, 512));
    std::vector<uint16_t> hw(size_t(wn) * p.k);
    {
      const uint64_t seed = rng.next();
      parallel_rows(wn, [&](long i) {
        Rng r{seed ^ (0x9e37ull * static_cast<uint64_t>(i + 1))};
        for (int j = 0; j < p.k; ++j) hw[size_t(i) * p.k + j] = f32_to_bf16(r.uniform(-1.0f, 1.0f));
      });
    }
    std::vector<float> hx(p.k), hg(p.k);
    for (auto& v : hx) v = rng.uniform(-3.0f, 3.0f);
    for (auto& v : hg) v = rng.uniform(0.5f, 1.5f);
    // The x the kernel multiplies: with the fused RMSNorm, x / rms(x) * g in double, rounded to f32 as the unfused
    // rmsnorm kernel would hand it over.
    std::vector<double> xe(p.k);
    if (p.kind != PLAIN) {
      double s = 0;
      for (float v : hx) s += double(v) * v;
      const double inv = 1.0 / std::sqrt(s / p.k + 1e-5);
      for (int j = 0; j < p.k; ++j) xe[j] = static_cast<float>(hx[j] * inv * hg[j]);
    } else {
      for (int j = 0; j < p.k; ++j) xe[j] = hx[j];
    }
    std::vector<double> ref(wn), mag(wn);
    parallel_rows(wn, [&](long i) {
      double a = 0, m = 0;
      const uint16_t* row = &hw[size_t(i) * p.k];
      for (int j = 0; j < p.k; ++j) {
        const double t = static_cast<double>(bf16_to_f32(row[j])) * xe[j];
        a += t, m += std::fabs(t);
      }
      ref[i] = a, mag[i] = m;
    });
    uint8_t* dw;
    float *dx, *dg, *dy;
    CK(cudaMalloc(&dw, bytes * copies));
    CK(cudaMemcpy(dw, hw.data(), bytes, cudaMemcpyHostToDevice));
    for (int c = 1; c < copies; ++c) CK(cudaMemcpy(dw + bytes * c, dw, bytes, cudaMemcpyDeviceToDevice));
    CK(cudaMalloc(&dx, sizeof(float) * p.k));
    CK(cudaMalloc(&dg, sizeof(float) * p.k));
    CK(cudaMalloc(&dy, sizeof(float) * wn));
    CK(cudaMemcpy(dx, hx.data(), sizeof(float) * p.k, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dg, hg.data(), sizeof(float) * p.k, cudaMemcpyHostToDevice));
    hw.clear();
    hw.shrink_to_fit();

    auto launch = [&](const Entry& e, int copy) {
      cudaLaunchConfig_t cfg{};
      const int rows_per_block = p.kind == SWIGLU ? e.c.rows / 2 : e.c.rows;
      cfg.gridDim = dim3((p.n + rows_per_block - 1) / rows_per_block);
      cfg.blockDim = dim3(e.c.threads);
      cfg.stream = st;
      cudaLaunchAttribute at[1];
      at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      at[0].val.programmaticStreamSerializationAllowed = 1;
      cfg.attrs = at;
      cfg.numAttrs = 1;
      CK(cudaLaunchKernelEx(&cfg, e.f[p.kind], dw + bytes * copy, static_cast<const float*>(dx), dy, p.n, p.k, false,
                            static_cast<const float*>(p.kind == PLAIN ? nullptr : dg), 1e-5f, EarlyL2{}));
      CK(cudaGetLastError());
    };
    auto pc = [&](float us) { return 100.0 * bytes / (us * 1e-6) / 1e9 / copy_gbps; };

    const Shape od = old_default(p.k);
    const int batch = std::max(copies, 10);
    // What src/ launches at the old default shape (gemv_float.cu's launch_float): mode 2 or mode 1.
    int src_mode = 1;
    {
      const Entry *plain = nullptr, *capped = nullptr;
      for (const Entry& e : all_entries)
        if (same(e.c, od) && e.mode == 1)
          plain = &e;
        else if (same(e.c, od) && e.mode == 2)
          capped = &e;
      const int rows_per_block = p.kind == SWIGLU ? od.rows / 2 : od.rows;
      const int64_t grid = (p.n + rows_per_block - 1) / rows_per_block;
      if (plain && capped &&
          use_capped_kernel(grid, plain->per_sm[p.kind], capped->per_sm[p.kind], prop.multiProcessorCount,
                            p.kind != PLAIN))  // the fused variants always take the capped copy, as in src/
        src_mode = 2;
    }
    // The removed PREV_SHAPES form and src's default: shape and mode (1 plain, 2 capped) of each.
    auto src_pick = [&](const Shape& sh, bool fused) {
      const Entry *plain = nullptr, *capped = nullptr;
      for (const Entry& e : all_entries)
        if (same(e.c, sh) && e.mode == 1)
          plain = &e;
        else if (same(e.c, sh) && e.mode == 2)
          capped = &e;
      const int rows_per_block = p.kind == SWIGLU ? sh.rows / 2 : sh.rows;
      const int64_t grid = (p.n + rows_per_block - 1) / rows_per_block;
      return plain && capped &&
                     use_capped_kernel(grid, plain->per_sm[p.kind], capped->per_sm[p.kind], prop.multiProcessorCount,
                                       fused)
                 ? 2
                 : 1;
    };
    const int prev_mode = src_pick(od, false);
    const tessera::cuda::GemvConfig dc = tessera::cuda::gemv_default_config(DType::BF16, wn, p.k);
    const Shape nd{dc.threads, dc.rows, dc.unroll, dc.prefetch};
    const int def_mode = src_pick(nd, p.kind != PLAIN);
    float prev_us = -1, def_us = -1;
    float old_us = -1, new_def_us = -1, best_us[4] = {1e30f, 1e30f, 1e30f, 1e30f};
    Shape best[4]{};
    std::map<int, std::vector<float>> m0_out;  // mode 0's output by launch shape (bitwise comparison)
    std::vector<float> y(p.n);
    for (const Entry& e : all_entries) {
      const int slot = e.c.threads * 100 + e.c.rows * 10 + e.c.unroll;
      if (!e.f[p.kind]) continue;
      // Correctness: poisoned output, one launch, every row against the reference (and mode 0 bit for bit).
      CK(cudaMemsetAsync(dy, 0xFF, sizeof(float) * wn, st));
      launch(e, 0);
      CK(cudaStreamSynchronize(st));
      CK(cudaMemcpy(y.data(), dy, sizeof(float) * p.n, cudaMemcpyDeviceToHost));
      int bad = 0;
      for (int i = 0; i < p.n; ++i) {
        double want, tol;
        if (p.kind == SWIGLU) {
          // silu(g) * u with |silu'| <= 1.1: the GEMV bound of each sum carried through, plus f32 rounding of the
          // epilogue (expf, the division and the product: a few ulp).
          const double g = ref[i], u = ref[p.n + i];
          const double sg = g / (1.0 + std::exp(-g));
          const double tg = 1e-5 * mag[i] + 2e-6 * std::fabs(g), tu = 1e-5 * mag[p.n + i] + 2e-6 * std::fabs(u);
          want = sg * u;
          tol = 1.1 * std::fabs(u) * tg + std::fabs(sg) * tu + 1e-6 * std::fabs(want) + 1e-30;
        } else {
          want = ref[i];
          tol = 1e-5 * mag[i] + (p.kind == NORM ? 2e-6 * std::fabs(want) : 0.0) + 1e-30;
        }
        if (!(std::fabs(y[i] - want) <= tol)) ++bad;
      }
      if (e.mode == 0) {
        m0_out[slot] = y;
      } else if (m0_out.count(slot) && std::memcmp(m0_out[slot].data(), y.data(), sizeof(float) * p.n) != 0) {
        ++differ;
        std::printf("DIFFERS from mode 0: %s m%d %d/%d/%d\n", p.name, e.mode, e.c.threads, e.c.rows, e.c.unroll);
      }
      if (bad) {
        ++failures;
        std::printf("FAIL %s %dx%d%s %d/%d/%d m%d: %d bad rows\n", p.name, p.n, p.k, kind_name(p.kind), e.c.threads,
                    e.c.rows, e.c.unroll, e.mode, bad);
      }
      // Timing: a graph of `batch` back-to-back launches over rotating copies.
      const float t = exp_common::graph_us(st, e0, e1, batch, reps, [&](int i) { launch(e, i % copies); });
      if (tsv)
        std::fprintf(tsv, "%s\t%dx%d%s\t%d/%d/%d\tm%d\t%.3f\t%.1f\t%d\n", p.name, p.n, p.k, kind_name(p.kind),
                     e.c.threads, e.c.rows, e.c.unroll, e.mode, t, pc(t), bad);
      if (same(e.c, od) && e.mode == 0) old_us = t;
      if (same(e.c, od) && e.mode == src_mode) new_def_us = t;
      if (same(e.c, od) && e.mode == prev_mode) prev_us = t;
      if (same(e.c, nd) && e.mode == def_mode) def_us = t;
      if (t < best_us[e.mode]) best_us[e.mode] = t, best[e.mode] = e.c;
    }
    char line[512];
    int len = std::snprintf(line, sizeof line, "%-12s %6dx%-5d %-7s %3d/%d/%d%s %6.2f %5.1f%% %6.2f %5.1f%% |", p.name,
                            wn, p.k, kind_name(p.kind), od.threads, od.rows, od.unroll, src_mode == 2 ? "c" : " ",
                            old_us, pc(old_us), new_def_us, pc(new_def_us));
    for (int m = 0; m < 4; ++m)
      len += std::snprintf(line + len, sizeof line - len, " %3d/%d/%d %6.2f %5.1f%%|", best[m].threads, best[m].rows,
                           best[m].unroll, best_us[m], pc(best_us[m]));
    len += std::snprintf(line + len, sizeof line - len, " prev %6.2f%s | default %3d/%d/%d%s %6.2f", prev_us,
                         prev_mode == 2 ? "c" : " ", nd.threads, nd.rows, nd.unroll, def_mode == 2 ? "c" : " ", def_us);
    summary.push_back(line);
    std::printf("%s\n", line);
    std::fflush(stdout);
    CK(cudaFree(dw));
    CK(cudaFree(dx));
    CK(cudaFree(dg));
    CK(cudaFree(dy));
  }
  if (tsv) std::fclose(tsv);
  std::printf(
      "\n== summary (copy %.0f GB/s) failures=%d differ=%d. old: mode 0, new: src/ (mode 1, or 2 where marked c), "
      "both at the old default shape; then the best shape of modes 0-3\n",
      copy_gbps, failures, differ);
  std::printf("%-12s %12s %-7s %-9s %6s %6s %6s %6s | %-22s| %-22s| %-22s| %-22s|\n", "problem", "N x K", "kind",
              "default", "old us", "%copy", "new us", "%copy", "m0 best", "m1 best", "m2 best (capped)",
              "m3 best (early trig)");
  std::printf("(then: prev = the removed PREV_SHAPES form, default = src's gemv_default_config; c: capped copy)\n");
  for (const auto& s : summary) std::printf("%s\n", s.c_str());
  return failures || differ ? 1 : 0;
}
