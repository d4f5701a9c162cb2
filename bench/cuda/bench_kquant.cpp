// Event-timed benchmark of the K-quant kernels (q4_K, q5_K, q6_K) beside q4_1 and q8_0, at Llama-3-8B's shapes: the
// decode GEMV (T = 1) as µs, GB/s and % of the byte floor (weight bytes over the copy bandwidth measured in the same
// run, the yardstick of docs/CUDA_NOTES.md; a GEMV only reads, so it can pass 100%), the multi-row GEMV at t = 8
// (batched decode), and the prefill path's expansion to bf16 (bytes read plus written).
//
// Method as bench_kernels.cpp: random data (quants random bytes, scales small random fp16 bits), a CUDA graph of
// back-to-back launches over rotating copies of the weights (>= 4x the L2), event-timed replays, median of --reps.
//
// Usage: tessera_bench_kquant [--all-configs] [--reps N] [--formats q4_k,q6_k,...]
//   --all-configs  also time every launch shape the format has a kernel for (gemv_config_supported) and print the best
//   --formats      only these formats (dtype names, comma-separated; default: q8_0, q4_1, q4_k, q5_k, q6_k, iq4_nl,
//                  iq4_xs)
// Every (format, shape) also prints one line for scripts: "pick FMT NxK default T/R/U P% best T/R/U P% expand G GB/s"
// (P: % of the byte floor; G: the bf16 expansion's bytes read plus written per second).
#include <cuda_runtime_api.h>
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device_info.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/gemm_paths.h"
#include "backends/cuda/memory.h"
#include "bench_util.h"
#include "core/error.h"

namespace tessera::cuda::bench {
namespace {

struct Options {
  bool all_configs = false;
  int reps = 20;
  std::vector<DType> formats = {DType::Q8_0, DType::Q4_1,   DType::Q4_K,  DType::Q5_K,
                                DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS};
};

class KquantBench {
 public:
  explicit KquantBench(const Options& opt) : opt_(opt) {
    set_device(0);
    TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    TESSERA_CUDA_CHECK(cudaEventCreate(&e0_));
    TESSERA_CUDA_CHECK(cudaEventCreate(&e1_));
    cudaDeviceProp p{};
    TESSERA_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
    l2_bytes_ = static_cast<size_t>(p.l2CacheSize);
    fmt::print("device: {} ({} SMs, L2 {} MB)\n", p.name, p.multiProcessorCount, l2_bytes_ >> 20);
  }
  ~KquantBench() {
    cudaEventDestroy(e0_);
    cudaEventDestroy(e1_);
    cudaStreamDestroy(stream_);
  }

  void ceilings();
  void run();

 private:
  GraphTiming time(const std::function<void(int)>& launch, int batch) {
    for (int i = 0; i < std::min(batch, 3); ++i) launch(i);
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return time_graph_replays(stream_, e0_, e1_, batch, opt_.reps, 2, launch);
  }
  int rotation(uint64_t bytes) const {
    const uint64_t want = 4 * static_cast<uint64_t>(l2_bytes_);
    return static_cast<int>(std::clamp<uint64_t>((want + bytes - 1) / bytes, 1, 512));
  }
  // A weight of dtype [n, k] in its SPLIT_Q layout with random contents (the fp16 fields finite).
  DeviceWeight random_weight(DType dtype, int64_t n, int64_t k) {
    const uint64_t bytes = *dtype_row_bytes(dtype, static_cast<uint64_t>(k)) * static_cast<uint64_t>(n);
    // Quant bytes per element of each layout (split_layout.h); the rest of a block's bytes are its scales (and tail).
    const double qpe = dtype == DType::Q8_0 ? 1.0 : dtype == DType::Q6_K ? 0.75 : dtype == DType::Q5_K ? 0.625 : 0.5;
    const uint64_t qbytes = static_cast<uint64_t>(qpe * static_cast<double>(n * k));
    DeviceWeight w;
    w.dtype = dtype;
    w.n = n;
    w.k = k;
    w.layout = GemvLayout::SPLIT_Q;
    w.quants = DeviceBuffer(qbytes);
    w.scales = DeviceBuffer(bytes - qbytes);
    fill_random(FillKind::BYTES, w.quants.get(), qbytes, 0, 0, seed_++, stream_);
    fill_random(FillKind::F16, w.scales.get(), (bytes - qbytes) / 2, -0.01f, 0.01f, seed_++, stream_);
    if (w.bytes() != bytes) fail("bench: layout size mismatch for {}", dtype_name(dtype));
    return w;
  }

  Options opt_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t e0_ = nullptr, e1_ = nullptr;
  size_t l2_bytes_ = 0;
  double copy_gbps_ = 0, read_gbps_ = 0;
  uint64_t seed_ = 1;
};

void KquantBench::ceilings() {
  const size_t bytes = size_t{1} << 30;
  DeviceBuffer a(bytes), b(bytes);
  fill_random(FillKind::BYTES, a.get(), bytes, 0, 0, seed_++, stream_);
  auto median_ms = [&](const std::function<void()>& op) {
    op();
    std::vector<float> ms;
    for (int r = 0; r < 10; ++r) {
      TESSERA_CUDA_CHECK(cudaEventRecord(e0_, stream_));
      op();
      TESSERA_CUDA_CHECK(cudaEventRecord(e1_, stream_));
      TESSERA_CUDA_CHECK(cudaEventSynchronize(e1_));
      float t = 0;
      TESSERA_CUDA_CHECK(cudaEventElapsedTime(&t, e0_, e1_));
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };
  const float copy_ms = median_ms(
      [&] { TESSERA_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, stream_)); });
  copy_gbps_ = 2.0 * bytes / (copy_ms * 1e-3) / 1e9;
  DeviceBuffer sink(sizeof(uint32_t) * 4096);
  int sms = 0;
  TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  for (const int per_sm : {2, 4, 8}) {
    const float ms = median_ms([&] { read_all(a.get(), bytes, sink.as<uint32_t>(), per_sm * sms, stream_); });
    read_gbps_ = std::max(read_gbps_, bytes / (ms * 1e-3) / 1e9);
  }
  fmt::print("ceilings: device-to-device copy {:.0f} GB/s (read + write), pure read {:.0f} GB/s\n", copy_gbps_,
             read_gbps_);
}

void KquantBench::run() {
  struct Shape {
    int64_t n, k;
    const char* what;
  };
  // y[N] = W[N, K] x[K]: K -> N.
  const Shape shapes[] = {{4096, 4096, "4096->4096 (o)"},
                          {14336, 4096, "4096->14336 (gate, up)"},
                          {4096, 14336, "14336->4096 (down)"},
                          {6144, 4096, "4096->6144 (q|k|v)"},
                          {28672, 4096, "4096->28672 (gate|up)"},
                          // Llama-3.2-1B's short rows (K = 2048: 8 super-blocks, 32 K-quant units per row)
                          {3072, 2048, "2048->3072 (1B q|k|v)"},
                          {2048, 2048, "2048->2048 (1B o)"},
                          {16384, 2048, "2048->16384 (1B gate|up)"},
                          {2048, 8192, "8192->2048 (1B down)"}};
  const std::vector<DType>& formats = opt_.formats;
  fmt::print("\n{:<5} {:<24} {:>11} {:>9} {:>11} {:>7} {:>9} {:>7} {:>9} {:>10} {:>9}\n", "fmt", "shape", "config",
             "us", "(min-max)", "GB/s", "floor us", "%floor", "rows8 us", "bf16 us", "bf16 GB/s");
  for (DType dtype : formats) {
    for (const Shape& s : shapes) {
      const uint64_t bytes = *dtype_row_bytes(dtype, static_cast<uint64_t>(s.k)) * static_cast<uint64_t>(s.n);
      const int copies = rotation(bytes);
      std::vector<DeviceWeight> ws;
      for (int i = 0; i < copies; ++i) ws.push_back(random_weight(dtype, s.n, s.k));
      constexpr int kRows = 8;
      DeviceBuffer x(sizeof(float) * s.k * kRows), q8(s.k * kRows), ds(sizeof(float2) * (s.k / 32) * kRows);
      DeviceBuffer y(sizeof(float) * s.n * kRows);
      fill_random(FillKind::F32, x.get(), s.k * kRows, -1.0f, 1.0f, seed_++, stream_);
      quantize_q8(x.as<float>(), q8.as<int8_t>(), ds.as<float2>(), s.k * kRows, stream_);
      GemvInput in;
      in.q8 = q8.as<int8_t>();
      in.q8_ds = ds.as<float2>();
      const int batch = std::max(copies, 10);
      const GemvConfig def = gemv_default_config(dtype, s.n, s.k);
      std::vector<GemvConfig> configs = {def};
      if (opt_.all_configs)
        for (const GemvConfig& c : gemv_configs())
          if (gemv_config_supported(dtype, c) &&
              (c.stationary != def.stationary || c.threads != def.threads || c.rows != def.rows ||
               c.unroll != def.unroll || c.prefetch != def.prefetch))
            configs.push_back(c);
      GraphTiming first{}, best{};
      std::string best_cfg;
      for (size_t ci = 0; ci < configs.size(); ++ci) {
        const GemvConfig c = configs[ci];
        const GraphTiming t = time([&](int i) { gemv(ws[i % copies], in, y.as<float>(), stream_, &c); }, batch);
        std::vector<float> yh(static_cast<size_t>(s.n));
        y.download(yh.data(), sizeof(float) * s.n);
        for (float v : yh)
          if (!std::isfinite(v)) fail("bench: {} {}x{} left a non-finite output", dtype_name(dtype), s.n, s.k);
        const std::string cfg =
            fmt::format("{}{}/{}/{}{}", c.stationary ? "xs" : "", c.threads, c.rows, c.unroll, c.prefetch ? "+pf" : "");
        if (ci == 0) first = t;
        if (best_cfg.empty() || t.us < best.us) best = t, best_cfg = cfg;
      }
      // Multi-row GEMV at t = 8 (batched decode: the weights read once for all 8 rows).
      const GraphTiming rows = time(
          [&](int i) {
            detail::launch_gemm_rows_quant(ws[i % copies], q8.as<int8_t>(), ds.as<float2>(), y.as<float>(), kRows,
                                           stream_, false);
          },
          batch);
      // Prefill's expansion of one matrix to bf16 (the cuBLASLt path's operand).
      DeviceBuffer deq(static_cast<size_t>(s.n * s.k) * 2);
      const GraphTiming expand =
          time([&](int i) { detail::launch_dequant_bf16(ws[i % copies], deq.get(), stream_); }, copies);
      const double floor_us = bytes / (copy_gbps_ * 1e3);
      const double gbps = bytes / (first.us * 1e3);
      const double bf16_gbps = (bytes + static_cast<double>(s.n * s.k) * 2) / (expand.us * 1e3);
      fmt::print(
          "{:<5} {:<24} {:>11} {:>9.2f} {:>5.1f}-{:<5.1f} {:>7.0f} {:>9.2f} {:>6.1f}% {:>9.2f} {:>10.2f} {:>9.0f}\n",
          dtype_name(dtype), s.what,
          fmt::format("{}{}/{}/{}*", def.stationary ? "xs" : "", def.threads, def.rows, def.unroll), first.us,
          first.min_us, first.max_us, gbps, floor_us, 100.0 * floor_us / first.us, rows.us, expand.us, bf16_gbps);
      if (configs.size() > 1)
        fmt::print("{:<5} {:<24} {:>11} {:>9.2f} {:>5.1f}-{:<5.1f} {:>7.0f} {:>9} {:>6.1f}%  (best of {})\n", "", "",
                   best_cfg, best.us, best.min_us, best.max_us, bytes / (best.us * 1e3), "", 100.0 * floor_us / best.us,
                   configs.size());
      fmt::print("pick {} {}x{} default {}/{}/{} {:.1f}% best {} {:.1f}% expand {:.0f} GB/s\n", dtype_name(dtype), s.n,
                 s.k, def.threads, def.rows, def.unroll, 100.0 * floor_us / first.us, best_cfg.empty() ? "-" : best_cfg,
                 100.0 * floor_us / best.us, bf16_gbps);
    }
  }
}

int run_main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--all-configs") {
      opt.all_configs = true;
    } else if (a == "--reps" && i + 1 < argc) {
      opt.reps = std::max(3, std::atoi(argv[++i]));
    } else if (a == "--formats" && i + 1 < argc) {
      opt.formats.clear();
      std::string list = argv[++i];
      for (size_t p = 0; p <= list.size();) {
        const size_t q = std::min(list.find(',', p), list.size());
        const std::string name = list.substr(p, q - p);
        const std::optional<DType> d = dtype_from_name(name);
        if (!d || !gemv_supports(*d)) fail("--formats: '{}' is not a format with a CUDA GEMV", name);
        opt.formats.push_back(*d);
        p = q + 1;
      }
    } else {
      fmt::print(stderr, "usage: tessera_bench_kquant [--all-configs] [--reps N] [--formats q4_k,q6_k,...]\n");
      return 2;
    }
  }
  std::string why;
  if (list_devices(&why).empty()) {
    fmt::print(stderr, "tessera_bench_kquant: no CUDA GPU ({})\n", why);
    return 1;
  }
  KquantBench b(opt);
  b.ceilings();
  b.run();
  return 0;
}

}  // namespace
}  // namespace tessera::cuda::bench

int main(int argc, char** argv) {
  try {
    return tessera::cuda::bench::run_main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera_bench_kquant: %s\n", e.what());
    return 1;
  }
}
