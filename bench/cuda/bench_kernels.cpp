// Event-timed benchmark of the CUDA decode kernels: every number is bytes moved over time, next to the ceilings
// measured in the same run (a device-to-device copy, counting bytes read plus written, and a pure read).
//
// Method (device/METHOD.md): random data (never zeros); warm-up; each measurement is a CUDA graph of `batch` launches
// over rotating copies of the inputs, so weights that fit the 50 MB L2 are still read from memory (the rotation
// covers 4x the L2); replays are timed with events; the median over replays is reported with its min and max.
//
// Usage: tessera_bench_cuda [--json FILE] [--all-configs] [--quick] [--reps N] [--only LIST]
//   --all-configs  time every GEMV launch shape, not only the default (for tuning gemv_default_config)
//   --quick        fewer shapes (a smoke run)
//   --only LIST    only these parts, comma-separated: gemv, ternary, small, attention, projection, chain (the decode
//                  chain runs under --quick only when named here)
// The ternary part (issue #24's goal): the TQ2_0 GEMV beside the bf16 GEMV at Llama-3-8B's 4096x14336 and 14336x4096
// and BitNet b1.58 2B4T's FFN shapes, as the speed-up over bf16 and the share of the pure-read byte floor
// (tessera_bench_cuda --only ternary [--all-configs]).
#include <cuda_runtime_api.h>
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_options.h"
#include "backends/cuda/device_info.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/memory.h"
#include "bench_util.h"
#include "core/error.h"

namespace tessera::cuda::bench {
namespace {

using json = nlohmann::json;

struct Options {
  std::string json_path;
  bool all_configs = false;
  bool quick = false;
  int reps = 20;
  std::string only;  // ",gemv,chain," etc.; empty: every part
  std::vector<std::string> cuda;  // --cuda KEY=VALUE (parse_cuda_option)
};

using Timing = GraphTiming;

bool is_quant(DType t) { return t == DType::Q8_0 || t == DType::Q4_0 || t == DType::Q4_1; }

class Bench {
 public:
  explicit Bench(const Options& opt) : opt_(opt) {
    set_device(0);
    TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    TESSERA_CUDA_CHECK(cudaEventCreate(&e0_));
    TESSERA_CUDA_CHECK(cudaEventCreate(&e1_));
    cudaDeviceProp p{};
    TESSERA_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
    l2_bytes_ = static_cast<size_t>(p.l2CacheSize);
    sm_count_ = p.multiProcessorCount;
    int driver = 0, runtime = 0, sm_clock = 0, mem_clock = 0;
    TESSERA_CUDA_CHECK(cudaDriverGetVersion(&driver));
    TESSERA_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
    TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&sm_clock, cudaDevAttrClockRate, 0));
    TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&mem_clock, cudaDevAttrMemoryClockRate, 0));
    const auto devs = list_devices();
    out_["device"] = {{"name", p.name},
                      {"sm_count", sm_count_},
                      {"cc", fmt::format("{}.{}", p.major, p.minor)},
                      {"l2_bytes", l2_bytes_},
                      {"memory_bytes", p.totalGlobalMem},
                      {"sm_clock_khz", sm_clock},
                      {"mem_clock_khz", mem_clock},
                      {"theoretical_gbps", devs.empty() ? 0.0 : devs[0].memory_bandwidth_gbps},
                      {"driver", driver},
                      {"runtime", runtime}};
    fmt::print("device: {} ({} SMs, L2 {} MB, cc {}.{}), driver {}, runtime {}, theoretical {:.0f} GB/s\n", p.name,
               sm_count_, l2_bytes_ >> 20, p.major, p.minor, driver, runtime,
               devs.empty() ? 0.0 : devs[0].memory_bandwidth_gbps);
  }
  ~Bench() {
    cudaEventDestroy(e0_);
    cudaEventDestroy(e1_);
    cudaStreamDestroy(stream_);
  }

  void ceilings();
  void gemv_suite();
  void ternary_gemv();
  void small_ops();
  void attention();
  void projection();
  void decode_chain();
  void write_json() const;

 private:
  // Per-launch time of launch(i), i in [0, batch), captured into one graph.
  Timing time_graph(const std::function<void(int)>& launch, int batch);
  // Copies of a buffer of `bytes` that make a rotation of at least 4x the L2.
  int rotation(uint64_t bytes) const {
    const uint64_t want = 4 * static_cast<uint64_t>(l2_bytes_);
    return static_cast<int>(std::clamp<uint64_t>((want + bytes - 1) / bytes, 1, 512));
  }
  void record(json r, const Timing& t, uint64_t bytes);

  Options opt_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t e0_ = nullptr, e1_ = nullptr;
  size_t l2_bytes_ = 0;
  int sm_count_ = 0;
  double copy_gbps_ = 0, read_gbps_ = 0;
  json out_;
  json records_ = json::array();
  std::map<std::string, double> gemv_us_;   // "dtype NxK" -> default-config microseconds
  std::map<std::string, double> small_us_;  // op name -> microseconds
  uint64_t seed_ = 1;
};

Timing Bench::time_graph(const std::function<void(int)>& launch, int batch) {
  for (int i = 0; i < std::min(batch, 3); ++i) launch(i);  // warm-up outside the graph (module load, first touch)
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return time_graph_replays(stream_, e0_, e1_, batch, opt_.reps, 2, launch);
}

void Bench::record(json r, const Timing& t, uint64_t bytes) {
  const double gbps = static_cast<double>(bytes) / (t.us * 1e-6) / 1e9;
  r["us"] = t.us;
  r["min_us"] = t.min_us;
  r["max_us"] = t.max_us;
  r["bytes"] = bytes;
  r["gbps"] = gbps;
  r["pct_copy"] = 100.0 * gbps / copy_gbps_;
  r["pct_read"] = 100.0 * gbps / read_gbps_;
  records_.push_back(std::move(r));
}

void Bench::ceilings() {
  // Device-to-device copy of 1 GiB: bytes read plus bytes written over the time.
  const size_t bytes = size_t{1} << 30;
  DeviceBuffer a(bytes), b(bytes);
  fill_random(FillKind::BYTES, a.get(), bytes, 0, 0, seed_++, stream_);
  auto median_ms = [&](const std::function<void()>& op) {
    op();
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
  double best_read = 0;
  int best_blocks = 0;
  for (const int per_sm : {2, 4, 8}) {
    const int blocks = per_sm * sm_count_;
    const float ms = median_ms([&] { read_all(a.get(), bytes, sink.as<uint32_t>(), blocks, stream_); });
    const double gbps = bytes / (ms * 1e-3) / 1e9;
    if (gbps > best_read) best_read = gbps, best_blocks = blocks;
  }
  read_gbps_ = best_read;
  out_["ceilings"] = {
      {"copy_gbps", copy_gbps_}, {"read_gbps", read_gbps_}, {"copy_bytes", bytes}, {"read_blocks", best_blocks}};
  fmt::print("ceilings: device-to-device copy {:.0f} GB/s (read + write, 1 GiB), pure read {:.0f} GB/s\n", copy_gbps_,
             read_gbps_);
}

void Bench::gemv_suite() {
  struct Shape {
    int64_t n, k;
    bool quick;
  };
  // The shapes (Llama-3-8B: 4096/14336/1024; SmolLM2-135M: 576/1536), plus Llama-3-8B's output layer.
  // 6144x4096 and 28672x4096: Llama-3-8B's q|k|v and gate|up weights concatenated (one launch instead of three or
  // two; the projection below shows what that buys).
  const std::vector<Shape> shapes = {{4096, 14336, true}, {14336, 4096, true},  {4096, 4096, true},
                                     {1024, 4096, false}, {2048, 2048, false},  {8192, 2048, false},
                                     {576, 576, true},    {1536, 576, false},   {576, 1536, false},
                                     {6144, 4096, false}, {28672, 4096, false}, {128256, 4096, false}};
  const DType formats[] = {DType::BF16, DType::F16, DType::F32, DType::Q8_0, DType::Q4_0, DType::Q4_1};
  fmt::print("\n{:<6} {:>13} {:>11} {:>10} {:>9} {:>8} {:>7} {:>7}\n", "gemv", "N x K", "config", "us", "(min-max)",
             "GB/s", "%copy", "%read");
  for (DType dtype : formats) {
    for (const Shape& s : shapes) {
      if (opt_.quick && !s.quick) continue;
      const bool huge = s.n * s.k > int64_t{256} << 20;  // the output layer: default config only, one f32 skip
      if (huge && dtype == DType::F32) continue;
      const uint64_t bytes = *dtype_row_bytes(dtype, static_cast<uint64_t>(s.k)) * s.n;
      const int copies = rotation(bytes);
      std::vector<DeviceWeight> ws(copies);
      for (auto& w : ws) {
        w.dtype = dtype;
        w.n = s.n;
        w.k = s.k;
        if (is_quant(dtype)) {
          // The SPLIT_Q layout (kernels.h): random quants, random fp16 scales (and q4_1 mins).
          const uint64_t qbytes = dtype == DType::Q8_0 ? s.n * s.k : s.n * s.k / 2;
          const uint64_t sbytes = (s.n * s.k / 32) * (dtype == DType::Q4_1 ? 4 : 2);
          w.layout = GemvLayout::SPLIT_Q;
          w.quants = DeviceBuffer(qbytes);
          w.scales = DeviceBuffer(sbytes);
          fill_random(FillKind::BYTES, w.quants.get(), qbytes, 0, 0, seed_++, stream_);
          fill_random(FillKind::F16, w.scales.get(), sbytes / 2, -0.01f, 0.01f, seed_++, stream_);
        } else {
          w.layout = GemvLayout::ROWS;
          w.quants = DeviceBuffer(bytes);
          const FillKind kind = dtype == DType::F32   ? FillKind::F32
                                : dtype == DType::F16 ? FillKind::F16
                                                      : FillKind::BF16;
          fill_random(kind, w.quants.get(), bytes / (dtype == DType::F32 ? 4 : 2), -0.05f, 0.05f, seed_++, stream_);
        }
        if (w.bytes() != bytes) fail("bench: weight layout size mismatch for {}", dtype_name(dtype));
      }
      DeviceBuffer x(sizeof(float) * s.k), q8(s.k), ds(sizeof(float2) * (s.k / 32)), y(sizeof(float) * s.n);
      fill_random(FillKind::F32, x.get(), s.k, -1.0f, 1.0f, seed_++, stream_);
      GemvInput in;
      in.f32 = x.as<float>();
      if (is_quant(dtype)) {
        quantize_q8(x.as<float>(), q8.as<int8_t>(), ds.as<float2>(), s.k, stream_);
        in.q8 = q8.as<int8_t>();
        in.q8_ds = ds.as<float2>();
      }
      const GemvConfig def = gemv_default_config(dtype, s.n, s.k);
      std::vector<GemvConfig> configs = {def};
      if (opt_.all_configs && !huge)
        for (const auto& c : gemv_configs())
          if (c.threads != def.threads || c.rows != def.rows || c.unroll != def.unroll || c.prefetch != def.prefetch)
            configs.push_back(c);
      const int batch = std::max(copies, huge ? 4 : 10);
      const std::string key = fmt::format("{} {}x{}", dtype_name(dtype), s.n, s.k);
      Timing best{};
      std::string best_cfg;
      for (size_t ci = 0; ci < configs.size(); ++ci) {
        const GemvConfig c = configs[ci];
        y.fill_bytes(0xFF);
        synchronize();  // the memset runs on the legacy stream, which does not order with stream_
        const Timing t = time_graph([&](int i) { gemv(ws[i % copies], in, y.as<float>(), stream_, &c); }, batch);
        std::vector<float> yh(s.n);
        y.download(yh.data(), sizeof(float) * s.n);
        for (float v : yh)
          if (!std::isfinite(v))
            fail("bench: gemv {} config {}/{}/{} left a non-finite output", key, c.threads, c.rows, c.unroll);
        const std::string cfg = fmt::format("{}/{}/{}{}", c.threads, c.rows, c.unroll, c.prefetch ? "+pf" : "");
        record({{"kind", "gemv"},
                {"dtype", dtype_name(dtype)},
                {"n", s.n},
                {"k", s.k},
                {"config", cfg},
                {"default", ci == 0},
                {"copies", copies},
                {"batch", batch}},
               t, bytes);
        if (ci == 0) gemv_us_[key] = t.us;
        if (best_cfg.empty() || t.us < best.us) best = t, best_cfg = cfg;
        if (ci == 0 || opt_.all_configs) {
          const double gbps = bytes / (t.us * 1e-6) / 1e9;
          if (ci == 0)
            fmt::print("{:<6} {:>13} {:>11} {:>10.2f} {:>4.1f}-{:<4.1f} {:>8.0f} {:>6.1f}% {:>6.1f}%\n",
                       dtype_name(dtype), fmt::format("{}x{}", s.n, s.k), cfg + "*", t.us, t.min_us, t.max_us, gbps,
                       100 * gbps / copy_gbps_, 100 * gbps / read_gbps_);
        }
      }
      if (dtype == DType::BF16 && (s.n == 6144 || s.n == 28672)) {  // the fused-RMSNorm GEMVs of the decode chain
        DeviceBuffer g(sizeof(float) * s.k);
        fill_random(FillKind::F32, g.get(), s.k, 0.9f, 1.1f, seed_++, stream_);
        GemvInput nin = in;
        nin.norm_w = g.as<float>();
        nin.norm_eps = 1e-5f;
        const Timing t = time_graph([&](int i) { gemv(ws[i % copies], nin, y.as<float>(), stream_); }, batch);
        record({{"kind", "gemv_norm"}, {"dtype", dtype_name(dtype)}, {"n", s.n}, {"k", s.k}}, t, bytes);
        const double gbps = bytes / (t.us * 1e-6) / 1e9;
        fmt::print("{:<6} {:>13} {:>11} {:>10.2f} {:>4.1f}-{:<4.1f} {:>8.0f} {:>6.1f}%  (fused rmsnorm)\n", "", "",
                   "+norm", t.us, t.min_us, t.max_us, gbps, 100 * gbps / copy_gbps_);
      }
      if (configs.size() > 1) {
        const double gbps = bytes / (best.us * 1e-6) / 1e9;
        fmt::print("{:<6} {:>13} {:>11} {:>10.2f} {:>4.1f}-{:<4.1f} {:>8.0f} {:>6.1f}%  (best of {})\n", "", "",
                   best_cfg, best.us, best.min_us, best.max_us, gbps, 100 * gbps / copy_gbps_, configs.size());
      }
    }
  }
}

void Bench::ternary_gemv() {
  struct Shape {
    int64_t n, k;
  };
  // Llama-3-8B's ffn_down and gate (the goal: >= 5.5x bf16, >= 70% of the byte floor), its 4096x4096, and
  // BitNet b1.58 2B4T's ffn gate/up and down.
  const Shape shapes[] = {{4096, 14336}, {14336, 4096}, {4096, 4096}, {6912, 2560}, {2560, 6912}};
  fmt::print("\n{:<7} {:>13} {:>11} {:>10} {:>9} {:>8} {:>7} {:>9}\n", "ternary", "N x K", "config", "us", "(min-max)",
             "GB/s", "%read", "x bf16");
  for (const Shape& s : shapes) {
    if (opt_.quick && s.n * s.k != int64_t{4096} * 14336) continue;
    GemvInput in;
    DeviceBuffer x(sizeof(float) * s.k), q8(s.k), ds(sizeof(float2) * (s.k / 32)), y(sizeof(float) * s.n);
    fill_random(FillKind::F32, x.get(), s.k, -1.0f, 1.0f, seed_++, stream_);
    quantize_q8(x.as<float>(), q8.as<int8_t>(), ds.as<float2>(), s.k, stream_);
    in.f32 = x.as<float>();
    in.q8 = q8.as<int8_t>();
    in.q8_ds = ds.as<float2>();
    // bf16 in the same run (the peer of the goal).
    const uint64_t bf_bytes = static_cast<uint64_t>(s.n * s.k) * 2;
    const int bf_copies = rotation(bf_bytes);
    std::vector<DeviceWeight> bw(bf_copies);
    for (auto& w : bw) {
      w.dtype = DType::BF16, w.n = s.n, w.k = s.k, w.layout = GemvLayout::ROWS;
      w.quants = DeviceBuffer(bf_bytes);
      fill_random(FillKind::BF16, w.quants.get(), bf_bytes / 2, -0.05f, 0.05f, seed_++, stream_);
    }
    const GemvConfig bdef = gemv_default_config(DType::BF16, s.n, s.k);
    const Timing tb =
        time_graph([&](int i) { gemv(bw[i % bf_copies], in, y.as<float>(), stream_, &bdef); }, std::max(bf_copies, 10));
    record({{"kind", "ternary_gemv"}, {"dtype", "bf16"}, {"n", s.n}, {"k", s.k}}, tb, bf_bytes);
    bw.clear();
    // tq2_0: random codes 0..2 and fp16 d in the file's blocks, uploaded (split) as the executors upload them.
    const uint64_t tq_bytes = *dtype_row_bytes(DType::TQ2_0, static_cast<uint64_t>(s.k)) * s.n;
    std::vector<uint8_t> host(tq_bytes);
    uint64_t h = 0x9E3779B97F4A7C15ull ^ seed_++;
    for (size_t b = 0; b < host.size(); b += 66) {
      for (int i = 0; i < 64; ++i) {
        uint8_t byte = 0;
        for (int j = 0; j < 4; ++j) {
          h = h * 6364136223846793005ull + 1442695040888963407ull;
          byte |= static_cast<uint8_t>(((h >> 33) % 3) << (2 * j));
        }
        host[b + static_cast<size_t>(i)] = byte;
      }
      host[b + 64] = 0x00, host[b + 65] = 0x20;  // d = 2^-7 (fp16 0x2000)
    }
    const int copies = rotation(tq_bytes);
    std::vector<DeviceWeight> tw;
    for (int c = 0; c < copies; ++c) tw.push_back(upload_weight(DType::TQ2_0, host.data(), s.n, s.k));
    const GemvConfig def = gemv_default_config(DType::TQ2_0, s.n, s.k);
    std::vector<GemvConfig> configs = {def};
    if (opt_.all_configs)
      for (const auto& c : gemv_configs())
        if (gemv_config_supported(DType::TQ2_0, c) &&
            (c.threads != def.threads || c.rows != def.rows || c.unroll != def.unroll || c.prefetch != def.prefetch))
          configs.push_back(c);
    Timing best{};
    std::string best_cfg;
    for (size_t ci = 0; ci < configs.size(); ++ci) {
      const GemvConfig c = configs[ci];
      const Timing t =
          time_graph([&](int i) { gemv(tw[i % copies], in, y.as<float>(), stream_, &c); }, std::max(copies, 10));
      std::vector<float> yh(s.n);
      y.download(yh.data(), sizeof(float) * s.n);
      for (float v : yh)
        if (!std::isfinite(v)) fail("bench: tq2_0 gemv {}x{} left a non-finite output", s.n, s.k);
      const std::string cfg = fmt::format("{}{}/{}/{}{}", c.stationary ? "xs" : "", c.threads, c.rows, c.unroll,
                                          c.prefetch ? "+pf" : "");
      record({{"kind", "ternary_gemv"},
              {"dtype", "tq2_0"},
              {"n", s.n},
              {"k", s.k},
              {"config", cfg},
              {"default", ci == 0},
              {"speedup_vs_bf16", tb.us / t.us}},
             t, tq_bytes);
      if (best_cfg.empty() || t.us < best.us) best = t, best_cfg = cfg;
      if (ci == 0) {
        const double gbps = bf_bytes / (tb.us * 1e-6) / 1e9;
        fmt::print("{:<7} {:>13} {:>11} {:>10.2f} {:>4.1f}-{:<4.1f} {:>8.0f} {:>6.1f}%\n", "bf16",
                   fmt::format("{}x{}", s.n, s.k), "default", tb.us, tb.min_us, tb.max_us, gbps,
                   100 * gbps / read_gbps_);
      }
      const double gbps = tq_bytes / (t.us * 1e-6) / 1e9;
      if (ci == 0 || opt_.all_configs)
        fmt::print("{:<7} {:>13} {:>11} {:>10.2f} {:>4.1f}-{:<4.1f} {:>8.0f} {:>6.1f}% {:>8.2f}x\n", "tq2_0", "",
                   cfg + (ci == 0 ? "*" : ""), t.us, t.min_us, t.max_us, gbps, 100 * gbps / read_gbps_, tb.us / t.us);
    }
    if (configs.size() > 1) {
      const double gbps = tq_bytes / (best.us * 1e-6) / 1e9;
      fmt::print("{:<7} {:>13} {:>11} {:>10.2f} {:>4.1f}-{:<4.1f} {:>8.0f} {:>6.1f}% {:>8.2f}x  (best of {})\n", "", "",
                 best_cfg, best.us, best.min_us, best.max_us, gbps, 100 * gbps / read_gbps_, tb.us / best.us,
                 configs.size());
    }
  }
}

void Bench::small_ops() {
  fmt::print("\n{:<34} {:>10} {:>12} {:>8}\n", "op", "us", "(min-max)", "GB/s");
  auto report = [&](const std::string& name, const Timing& t, uint64_t bytes) {
    record({{"kind", "op"}, {"op", name}}, t, bytes);
    small_us_[name] = t.us;
    fmt::print("{:<34} {:>10.2f} {:>5.1f}-{:<6.1f} {:>8.0f}\n", name, t.us, t.min_us, t.max_us,
               bytes / (t.us * 1e-6) / 1e9);
  };
  const int64_t d = 4096, ff = 14336, vocab = 128256;
  DeviceBuffer x(sizeof(float) * ff), x2(sizeof(float) * ff), w(sizeof(float) * ff), y(sizeof(float) * ff);
  DeviceBuffer q8(ff), ds(sizeof(float2) * ff / 32);
  for (auto* b : {&x, &x2, &w}) fill_random(FillKind::F32, b->get(), ff, -1.0f, 1.0f, seed_++, stream_);
  report("rmsnorm d=4096",
         time_graph([&](int) { rmsnorm(x.as<float>(), w.as<float>(), y.as<float>(), 1, d, 1e-5f, stream_); }, 50),
         3 * d * 4);
  report("rmsnorm+q8 d=4096",
         time_graph(
             [&](int) {
               rmsnorm(x.as<float>(), w.as<float>(), y.as<float>(), 1, d, 1e-5f, stream_, q8.as<int8_t>(),
                       ds.as<float2>());
             },
             50),
         3 * d * 4 + d + d / 4);
  report("quantize_q8 k=4096",
         time_graph([&](int) { quantize_q8(x.as<float>(), q8.as<int8_t>(), ds.as<float2>(), d, stream_); }, 50),
         d * 4 + d + d / 4);
  report("swiglu n=14336",
         time_graph([&](int) { swiglu(x.as<float>(), x2.as<float>(), y.as<float>(), ff, stream_); }, 50), 3 * ff * 4);
  report("swiglu+q8 n=14336",
         time_graph(
             [&](int) {
               swiglu(x.as<float>(), x2.as<float>(), y.as<float>(), ff, stream_, q8.as<int8_t>(), ds.as<float2>());
             },
             50),
         3 * ff * 4 + ff + ff / 4);
  report("add n=4096", time_graph([&](int) { add(y.as<float>(), x.as<float>(), d, stream_); }, 50), 3 * d * 4);

  // Embedding: one bf16 row of Llama-3-8B's table per launch, a different random token each time.
  DeviceWeight table;
  table.dtype = DType::BF16;
  table.n = vocab;
  table.k = d;
  table.quants = DeviceBuffer(sizeof(uint16_t) * vocab * d);
  fill_random(FillKind::BF16, table.quants.get(), vocab * d, -0.05f, 0.05f, seed_++, stream_);
  std::vector<int32_t> ids(64);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 2654435761u) % vocab);
  DeviceBuffer idd(sizeof(int32_t) * ids.size());
  idd.upload(ids.data(), sizeof(int32_t) * ids.size());
  synchronize();
  report("embedding bf16 d=4096",
         time_graph([&](int i) { embedding(table, idd.as<int32_t>() + i, y.as<float>(), 1, stream_); }, 64),
         d * 2 + d * 4);

  DeviceBuffer logits(sizeof(float) * vocab), amax(sizeof(int32_t));
  fill_random(FillKind::F32, logits.get(), vocab, -20.0f, 20.0f, seed_++, stream_);
  ArgmaxWorkspace aws(vocab);
  report("argmax n=128256",
         time_graph([&](int) { argmax(logits.as<float>(), vocab, amax.as<int32_t>(), aws, stream_); }, 50), vocab * 4);

  // RoPE + KV store for Llama-3-8B's heads (32 q, 8 kv, hd 128), bf16 cache.
  const int64_t n_head = 32, n_kv = 8, hd = 128, n_ctx = 8192;
  DeviceBuffer q(sizeof(float) * n_head * hd), k(sizeof(float) * n_kv * hd), v(sizeof(float) * n_kv * hd);
  DeviceBuffer kc(2 * n_kv * n_ctx * hd), vc(2 * n_kv * n_ctx * hd), inv(sizeof(float) * hd / 2), pos(4);
  for (auto* b : {&q, &k, &v}) fill_random(FillKind::F32, b->get(), b->bytes() / 4, -1.0f, 1.0f, seed_++, stream_);
  fill_random(FillKind::F32, inv.get(), hd / 2, 0.0f, 1.0f, seed_++, stream_);
  const int32_t p0 = 100;
  pos.upload(&p0, 4);
  synchronize();  // a pageable upload may still be in flight when cudaMemcpy returns; stream_ does not wait for it
  const KvCacheView cache{DType::BF16, kc.get(), vc.get(), n_ctx, n_kv, hd};
  report("rope_store_kv 32/8/128",
         time_graph(
             [&](int) {
               rope_store_kv(q.as<float>(), k.as<float>(), v.as<float>(), cache, pos.as<int32_t>(), n_head, hd,
                             inv.as<float>(), false, stream_);
             },
             50),
         (n_head * hd * 2 + 2 * n_kv * hd) * 4 + 2 * n_kv * hd * 2);
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void Bench::attention() {
  struct Case {
    const char* name;
    int64_t n_head, n_kv, hd, n_ctx;
    std::vector<int32_t> ctxs;
  };
  const std::vector<Case> cases = {{"llama3-8b", 32, 8, 128, 8192, {128, 256, 512, 1024, 4096, 8192}},
                                   {"llama3.2-1b", 32, 8, 64, 8192, {128, 256, 512, 2048}},
                                   {"smollm2-135m", 9, 3, 64, 8192, {64, 128, 256, 384, 512, 1024, 2048, 4096}},
                                   // caches of the compact kernel's capacity (tessera bench -n 256 makes these)
                                   {"smollm2-135m/256", 9, 3, 64, 256, {64, 128, 256}},
                                   {"llama3.2-1b/256", 32, 8, 64, 256, {128, 256}}};
  // us / fused: attn_decode / attn_decode_rope (rope + cache store fused in, as the decoder runs it), v6 (default:
  // v5 plus the short-context paths); fused nc: CudaOptions::attn_compact = 0 (no compact kernel); v5 / v5 fused:
  // CudaOptions::attn_short = 0. The options are read at launch, so at capture. (v5 without early loads, v4, v3 and
  // v5's clusters: bench/cuda/experiments/attn_decode_versions.cu.)
  fmt::print("\n{:<18} {:>5} {:>7} {:>12} {:>6} {:>8} {:>8} {:>9} {:>9}\n", "attn_decode (bf16)", "ctx", "us",
             "(min-max)", "%copy", "fused", "fused nc", "v5", "v5 fused");
  for (const Case& c : cases) {
    const uint64_t layer_bytes = 2ull * c.n_kv * c.n_ctx * c.hd * 2;
    const int layers = std::clamp(rotation(layer_bytes / 4), 2, 16);  // rotate over several layers' caches
    std::vector<DeviceBuffer> kcs, vcs;
    for (int l = 0; l < layers; ++l) {
      kcs.emplace_back(layer_bytes / 2);
      vcs.emplace_back(layer_bytes / 2);
      fill_random(FillKind::BF16, kcs.back().get(), layer_bytes / 4, -2.0f, 2.0f, seed_++, stream_);
      fill_random(FillKind::BF16, vcs.back().get(), layer_bytes / 4, -2.0f, 2.0f, seed_++, stream_);
    }
    DeviceBuffer q(sizeof(float) * c.n_head * c.hd), out(sizeof(float) * c.n_head * c.hd), pos(4);
    DeviceBuffer kn(sizeof(float) * c.n_kv * c.hd), vn(sizeof(float) * c.n_kv * c.hd), inv(sizeof(float) * c.hd / 2);
    fill_random(FillKind::F32, q.get(), c.n_head * c.hd, -1.0f, 1.0f, seed_++, stream_);
    for (auto* b : {&kn, &vn}) fill_random(FillKind::F32, b->get(), b->bytes() / 4, -1.0f, 1.0f, seed_++, stream_);
    fill_random(FillKind::F32, inv.get(), c.hd / 2, 0.0f, 1.0f, seed_++, stream_);
    KvCacheView cache{DType::BF16, kcs[0].get(), vcs[0].get(), c.n_ctx, c.n_kv, c.hd};
    AttnWorkspace ws(c.n_head, cache);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
    auto view = [&](int i) {
      return KvCacheView{DType::BF16, kcs[i % layers].get(), vcs[i % layers].get(), c.n_ctx, c.n_kv, c.hd};
    };
    for (int32_t ctx : c.ctxs) {
      const int32_t p = ctx - 1;
      pos.upload(&p, 4);
      synchronize();
      const int n = std::max(layers, 16);
      auto plain = [&] {
        return time_graph(
            [&](int i) {
              attn_decode(q.as<float>(), view(i), pos.as<int32_t>(), out.as<float>(), c.n_head, scale, ws, stream_);
            },
            n);
      };
      auto fused = [&] {
        return time_graph(
            [&](int i) {
              attn_decode_rope(q.as<float>(), kn.as<float>(), vn.as<float>(), view(i), pos.as<int32_t>(), c.hd,
                               inv.as<float>(), false, out.as<float>(), c.n_head, scale, ws, stream_);
            },
            n);
      };
      // Runs f with one field of the CUDA options changed (restored afterwards).
      auto with_option = [](int CudaOptions::*field, int value, auto&& f) {
        CudaOptions o = cuda_options();
        o.*field = value;
        const CudaOptionsScope scope(o);
        return f();
      };
      const Timing t = plain(), tf = fused();
      const Timing t5 = with_option(&CudaOptions::attn_short, 0, plain);
      const Timing tf5 = with_option(&CudaOptions::attn_short, 0, fused);
      const Timing tfn = with_option(&CudaOptions::attn_compact, 0, fused);
      const uint64_t bytes = 2ull * c.n_kv * ctx * c.hd * 2 + 2ull * c.n_head * c.hd * 4;
      record({{"kind", "attn_decode"}, {"model", c.name}, {"ctx", ctx}, {"max_splits", ws.max_splits()}}, t, bytes);
      record({{"kind", "attn_decode_rope"}, {"model", c.name}, {"ctx", ctx}}, tf, bytes);
      record({{"kind", "attn_decode_v5"}, {"model", c.name}, {"ctx", ctx}}, t5, bytes);
      record({{"kind", "attn_decode_rope_v5"}, {"model", c.name}, {"ctx", ctx}}, tf5, bytes);
      record({{"kind", "attn_decode_rope_no_compact"}, {"model", c.name}, {"ctx", ctx}}, tfn, bytes);
      small_us_[fmt::format("attn {} {}", c.name, ctx)] = t.us;
      const double gbps = bytes / (t.us * 1e-6) / 1e9;
      fmt::print("{:<18} {:>5} {:>7.2f} {:>5.2f}-{:<6.2f} {:>5.1f}% {:>8.2f} {:>8.2f} {:>9.2f} {:>9.2f}\n", c.name, ctx,
                 t.us, t.min_us, t.max_us, 100 * gbps / copy_gbps_, tf.us, tfn.us, t5.us, tf5.us);
    }
  }
}

// Llama-3-8B decode time per token from the isolated kernels (each measured in a graph of back-to-back launches,
// so launch gaps are in): 32 layers of q, k, v, o, gate, up, down GEMVs plus the small ops, then the output layer.
// A projection, not a decode measurement: the real executor (a later step) must confirm it.
void Bench::projection() {
  json proj = json::array();
  fmt::print("\nprojected Llama-3-8B decode from these kernels (target: bf16 >= 185 tok/s)\n");
  for (const char* dt : {"bf16", "f16", "q8_0", "q4_0", "q4_1"}) {
    auto us = [&](int64_t n, int64_t k) {
      const auto it = gemv_us_.find(fmt::format("{} {}x{}", dt, n, k));
      return it == gemv_us_.end() ? -1.0 : it->second;
    };
    const double q = us(4096, 4096), kv = us(1024, 4096), up = us(14336, 4096), down = us(4096, 14336),
                 head = us(128256, 4096);
    if (q < 0 || kv < 0 || up < 0 || down < 0 || head < 0) continue;
    const double gemv_layer = 2 * q + 2 * kv + 2 * up + down;
    const bool quant = std::string(dt).rfind("q", 0) == 0;
    const double norm = small_us_[quant ? "rmsnorm+q8 d=4096" : "rmsnorm d=4096"];
    const double glu = small_us_[quant ? "swiglu+q8 n=14336" : "swiglu n=14336"];
    const double ops_layer = 2 * norm + small_us_["rope_store_kv 32/8/128"] + glu + 2 * small_us_["add n=4096"] +
                             (quant ? small_us_["quantize_q8 k=4096"] : 0.0);  // o-proj input
    const double tail = small_us_["embedding bf16 d=4096"] + norm + small_us_["argmax n=128256"];
    // Fused plan: q|k|v and gate|up as single GEMVs, residual adds folded into the o and down GEMVs (accumulate).
    const double qkv = us(6144, 4096), gateup = us(28672, 4096);
    const double fused_layer = qkv + q + gateup + down;
    const double fused_ops =
        2 * norm + small_us_["rope_store_kv 32/8/128"] + glu + (quant ? small_us_["quantize_q8 k=4096"] : 0.0);
    for (int ctx : {512, 4096}) {
      const double attn = small_us_[fmt::format("attn llama3-8b {}", ctx)];
      const double total = 32 * (gemv_layer + ops_layer + attn) + head + tail;
      const double gemv_only = 32 * gemv_layer + head;
      fmt::print("  {:<5} ctx {:>4}: {:>7.0f} us/token = {:>5.1f} tok/s (GEMVs alone {:>5.1f} tok/s)", dt, ctx, total,
                 1e6 / total, 1e6 / gemv_only);
      json p = {{"dtype", dt},
                {"ctx", ctx},
                {"us_per_token", total},
                {"tok_s", 1e6 / total},
                {"gemv_only_tok_s", 1e6 / gemv_only}};
      if (qkv > 0 && gateup > 0) {
        const double fused = 32 * (fused_layer + fused_ops + attn) + head + tail;
        fmt::print("; fused plan {:>5.1f} tok/s", 1e6 / fused);
        p["fused_tok_s"] = 1e6 / fused;
      }
      fmt::print("\n");
      proj.push_back(p);
    }
  }
  out_["projection"] = proj;
}

// A whole Llama-3-8B decode step from the real kernels, captured once into a CUDA graph and replayed: embedding, 32
// layers of (rmsnorm, q|k|v GEMV, rope + KV store, attention, o GEMV accumulating into the residual, rmsnorm, gate|up
// GEMV, swiglu, down GEMV accumulating), final rmsnorm, output GEMV, argmax. Random weights (all 32 layers are
// distinct memory, so nothing is served from L2 that a real model would not). The position lives in device memory,
// so one graph serves every context length. This is the kernels' decode speed; the executor must add nothing to it.
// SmolLM2-135M's shapes too (30 small layers: launch gaps, not bytes, bound it), each with Programmatic Dependent
// Launch off and on (set_pdl), to show what PDL saves per kernel.
void Bench::decode_chain() {
  struct Model {
    const char* name;
    int64_t d, ff, n_head, n_kv, hd, vocab;
    int layers;
    std::vector<DType> dtypes;
  };
  const Model models[] = {{"Llama-3-8B", 4096, 14336, 32, 8, 128, 128256, 32, {DType::BF16, DType::Q8_0, DType::Q4_0}},
                          {"SmolLM2-135M", 576, 1536, 9, 3, 64, 49152, 30, {DType::BF16, DType::Q8_0}}};
  json chain = json::array();
  const bool pdl_before = pdl_enabled();  // this part times both settings; the run's own (--cuda pdl=...) comes back
  // rope + KV store + attention in one launch (attn_decode_rope) unless CudaOptions::fuse_attn is off, as the decoder.
  const bool fuse_attn = cuda_options().fuse_attn;
  fmt::print("\ndecode chain: attention {}\n", fuse_attn ? "fused with rope + store (one launch)" : "after rope_store_kv");
  for (const Model& m : models) {
    const int64_t d = m.d, ff = m.ff, n_head = m.n_head, n_kv = m.n_kv, hd = m.hd, vocab = m.vocab, n_ctx = 4096;
    const int layers = m.layers;
    fmt::print(
        "\n{} decode step from the kernels, one CUDA graph, {} layers (targets: 8B bf16 >= 185, 135M bf16 >= "
        "2500 tok/s)\n",
        m.name, layers);
    for (const DType dtype : m.dtypes) {
      const bool quant = is_quant(dtype);
      // Launches per token: embedding; per layer q|k|v, rope, attention, o, gate|up, swiglu, down (quantized weights
      // add two rmsnorms and a quantize_q8); final output GEMV and argmax (+ rmsnorm).
      const int kernels = 1 + layers * ((quant ? 10 : 7) - (fuse_attn ? 1 : 0)) + (quant ? 3 : 2);
      auto make = [&](int64_t n, int64_t k) {
        DeviceWeight w;
        w.dtype = dtype;
        w.n = n;
        w.k = k;
        if (quant) {
          w.layout = GemvLayout::SPLIT_Q;
          w.quants = DeviceBuffer(dtype == DType::Q8_0 ? n * k : n * k / 2);
          w.scales = DeviceBuffer(n * k / 32 * 2);
          fill_random(FillKind::BYTES, w.quants.get(), w.quants.bytes(), 0, 0, seed_++, stream_);
          fill_random(FillKind::F16, w.scales.get(), w.scales.bytes() / 2, -0.002f, 0.002f, seed_++, stream_);
        } else {
          w.quants = DeviceBuffer(2 * n * k);
          fill_random(FillKind::BF16, w.quants.get(), n * k, -0.02f, 0.02f, seed_++, stream_);
        }
        return w;
      };
      struct Layer {
        DeviceWeight qkv, o, gateup, down;
        DeviceBuffer norm1, norm2, kc, vc;
      };
      std::vector<Layer> ls(layers);
      uint64_t weight_bytes = 0;
      for (auto& l : ls) {
        l.qkv = make(d + 2 * n_kv * hd, d);
        l.o = make(d, d);
        l.gateup = make(2 * ff, d);
        l.down = make(d, ff);
        weight_bytes += l.qkv.bytes() + l.o.bytes() + l.gateup.bytes() + l.down.bytes();
        l.norm1 = DeviceBuffer(sizeof(float) * d);
        l.norm2 = DeviceBuffer(sizeof(float) * d);
        fill_random(FillKind::F32, l.norm1.get(), d, 0.9f, 1.1f, seed_++, stream_);
        fill_random(FillKind::F32, l.norm2.get(), d, 0.9f, 1.1f, seed_++, stream_);
        l.kc = DeviceBuffer(2 * n_kv * n_ctx * hd);
        l.vc = DeviceBuffer(2 * n_kv * n_ctx * hd);
        fill_random(FillKind::BF16, l.kc.get(), n_kv * n_ctx * hd, -1.0f, 1.0f, seed_++, stream_);
        fill_random(FillKind::BF16, l.vc.get(), n_kv * n_ctx * hd, -1.0f, 1.0f, seed_++, stream_);
      }
      DeviceWeight head = make(vocab, d);
      weight_bytes += head.bytes();
      DeviceWeight embd;
      embd.dtype = DType::BF16;
      embd.n = vocab;
      embd.k = d;
      embd.quants = DeviceBuffer(2 * vocab * d);
      fill_random(FillKind::BF16, embd.quants.get(), vocab * d, -0.05f, 0.05f, seed_++, stream_);
      DeviceBuffer h(sizeof(float) * d), xn(sizeof(float) * d), qkv(sizeof(float) * (d + 2 * n_kv * hd));
      DeviceBuffer attn(sizeof(float) * d), gu(sizeof(float) * 2 * ff), act(sizeof(float) * ff);
      DeviceBuffer q8(ff), ds(sizeof(float2) * ff / 32), logits(sizeof(float) * vocab), token(4), pos(4),
          inv(4 * hd / 2);
      DeviceBuffer final_norm(sizeof(float) * d);
      fill_random(FillKind::F32, final_norm.get(), d, 0.9f, 1.1f, seed_++, stream_);
      fill_random(FillKind::F32, inv.get(), hd / 2, 0.0f, 1.0f, seed_++, stream_);
      const int32_t tok0 = 9906;
      token.upload(&tok0, 4);
      ArgmaxWorkspace aws(vocab);
      const KvCacheView shape{DType::BF16, ls[0].kc.get(), ls[0].vc.get(), n_ctx, n_kv, hd};
      AttnWorkspace ws(n_head, shape);
      GemvInput xin, ain;
      if (quant) {
        xin.q8 = ain.q8 = q8.as<int8_t>();
        xin.q8_ds = ain.q8_ds = ds.as<float2>();
      } else {
        xin.f32 = xn.as<float>();
        ain.f32 = attn.as<float>();
      }
      int8_t* yq = quant ? q8.as<int8_t>() : nullptr;
      float2* yds = quant ? ds.as<float2>() : nullptr;
      GemvInput act_in = xin;
      if (!quant) act_in.f32 = act.as<float>();
      // Float weights fold each RMSNorm into the GEMV that reads its output (GemvInput::norm_w); quantized weights
      // need x normalized before it is quantized, so they keep the rmsnorm launch (with its q8 output).
      auto normed = [&](const DeviceBuffer& g) {
        if (quant) return xin;
        GemvInput in;
        in.f32 = h.as<float>();
        in.norm_w = g.as<float>();
        in.norm_eps = 1e-5f;
        return in;
      };
      auto norm = [&](const DeviceBuffer& g) {
        if (quant) rmsnorm(h.as<float>(), g.as<float>(), xn.as<float>(), 1, d, 1e-5f, stream_, yq, yds);
      };
      auto step = [&](int) {
        embedding(embd, token.as<int32_t>(), h.as<float>(), 1, stream_);
        for (auto& l : ls) {
          const KvCacheView cache{DType::BF16, l.kc.get(), l.vc.get(), n_ctx, n_kv, hd};
          norm(l.norm1);
          gemv(l.qkv, normed(l.norm1), qkv.as<float>(), stream_);
          if (fuse_attn) {
            attn_decode_rope(qkv.as<float>(), qkv.as<float>() + d, qkv.as<float>() + d + n_kv * hd, cache,
                             pos.as<int32_t>(), hd, inv.as<float>(), false, attn.as<float>(), n_head, 0.08838835f, ws,
                             stream_);
          } else {
            rope_store_kv(qkv.as<float>(), qkv.as<float>() + d, qkv.as<float>() + d + n_kv * hd, cache,
                          pos.as<int32_t>(), n_head, hd, inv.as<float>(), false, stream_);
            attn_decode(qkv.as<float>(), cache, pos.as<int32_t>(), attn.as<float>(), n_head, 0.08838835f, ws, stream_);
          }
          if (quant) quantize_q8(attn.as<float>(), q8.as<int8_t>(), ds.as<float2>(), d, stream_);
          gemv(l.o, ain, h.as<float>(), stream_, nullptr, /*accumulate=*/true);
          norm(l.norm2);
          gemv(l.gateup, normed(l.norm2), gu.as<float>(), stream_);
          swiglu(gu.as<float>(), gu.as<float>() + ff, act.as<float>(), ff, stream_, yq, yds);
          gemv(l.down, act_in, h.as<float>(), stream_, nullptr, /*accumulate=*/true);
        }
        norm(final_norm);
        gemv(head, normed(final_norm), logits.as<float>(), stream_);
        argmax(logits.as<float>(), vocab, token.as<int32_t>(), aws, stream_);
      };
      for (const int32_t ctx : {512, 4096})
        for (const bool pdl : {false, true}) {
          set_pdl(pdl);  // read at launch, so at capture: each setting gets its own graph
          const int32_t p = ctx - 1;
          pos.upload(&p, 4);
          token.upload(&tok0, 4);
          synchronize();
          const Timing t = time_graph(step, 1);
          const double gbps = weight_bytes / (t.us * 1e-6) / 1e9;
          fmt::print(
              "  {:<5} ctx {:>4} pdl {}: {:>7.0f} us/token = {:>6.1f} tok/s ({:.2f} GB of weights at {:.0f} GB/s, "
              "{:.1f}% of copy)\n",
              dtype_name(dtype), ctx, pdl ? "on " : "off", t.us, 1e6 / t.us, weight_bytes / 1e9, gbps,
              100 * gbps / copy_gbps_);
          chain.push_back({{"model", m.name},
                           {"pdl", pdl},
                           {"kernels", kernels},
                           {"dtype", dtype_name(dtype)},
                           {"ctx", ctx},
                           {"us_per_token", t.us},
                           {"tok_s", 1e6 / t.us},
                           {"min_us", t.min_us},
                           {"max_us", t.max_us},
                           {"weight_bytes", weight_bytes},
                           {"gbps", gbps}});
        }
      int32_t tok = -1;
      token.download(&tok, 4);
      if (tok < 0 || tok >= vocab) fail("bench: decode chain produced token {} outside the vocabulary", tok);
    }
  }
  set_pdl(pdl_before);
  out_["decode_chain"] = chain;
}

void Bench::write_json() const {
  if (opt_.json_path.empty()) return;
  json o = out_;
  o["records"] = records_;
  o["reps"] = opt_.reps;
  std::ofstream f(opt_.json_path);
  if (!f) fail("bench: cannot write {}", opt_.json_path);
  f << o.dump(1) << "\n";
  fmt::print("\nwrote {}\n", opt_.json_path);
}

}  // namespace
}  // namespace tessera::cuda::bench

int main(int argc, char** argv) {
  using namespace tessera::cuda::bench;
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      opt.json_path = argv[++i];
    } else if (a == "--all-configs") {
      opt.all_configs = true;
    } else if (a == "--quick") {
      opt.quick = true;
    } else if (a == "--only" && i + 1 < argc) {
      opt.only = "," + std::string(argv[++i]) + ",";
    } else if (a == "--reps" && i + 1 < argc) {
      opt.reps = std::max(3, std::atoi(argv[++i]));
    } else if (a == "--cuda" && i + 1 < argc) {
      opt.cuda.emplace_back(argv[++i]);
    } else {
      fmt::print(stderr,
                 "usage: tessera_bench_cuda [--json FILE] [--all-configs] [--quick] [--reps N] [--only LIST] "
                 "[--cuda KEY=VALUE]...\n"
                 "  --cuda: a CUDA option (cuda_options.h) for every kernel of the run, e.g. --cuda pdl=0\n");
      return 2;
    }
  }
  try {
    tessera::cuda::CudaOptions cuda = tessera::cuda::cuda_options();
    for (const std::string& kv : opt.cuda) tessera::cuda::parse_cuda_option(cuda, kv);
    tessera::cuda::set_cuda_options(cuda);
    std::string why;
    if (tessera::cuda::list_devices(&why).empty()) {
      fmt::print(stderr, "tessera_bench_cuda: no CUDA GPU ({})\n", why);
      return 1;
    }
    Bench b(opt);
    b.ceilings();
    auto want = [&](const char* part) {
      return opt.only.empty() || opt.only.find("," + std::string(part) + ",") != std::string::npos;
    };
    if (want("gemv")) b.gemv_suite();
    if (want("ternary")) b.ternary_gemv();
    if (want("small")) b.small_ops();
    if (want("attention")) b.attention();
    if (want("projection")) b.projection();
    if (want("chain") && (!opt.quick || !opt.only.empty())) b.decode_chain();
    b.write_json();
  } catch (const std::exception& e) {
    fmt::print(stderr, "tessera_bench_cuda: {}\n", e.what());
    return 1;
  }
  return 0;
}
