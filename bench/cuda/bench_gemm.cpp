// Event-timed benchmark of the T-row matmul (kernels_rows.h) at Llama-3-8B's projection shapes: prefill (t = 2048,
// TFLOP/s against the 8192^3 bf16 cuBLASLt peak measured in the same run) and batched decode (t = 2..128, weight bytes
// per second against the device-to-device copy), for bf16, q8_0 and q4_0 weights, each path (multi-row GEMV,
// cuBLASLt) timed separately so gemm_default_path can be checked against the figures.
//
// Method as tessera_bench_cuda (device/METHOD.md): random data, warm-up, a CUDA graph of `batch` launches over
// rotating weight copies covering 4x the L2 (so small weights are still read from memory), event-timed replays,
// median. Every timing includes what matmul does in front of the GEMM (x to bf16 or q8, dequantization).
//
// Usage: tessera_bench_gemm [--json FILE] [--quick] [--reps N]
#include <cuda_runtime_api.h>
#include <fmt/core.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/gemm_paths.h"
#include "backends/cuda/kernels_rows.h"
#include "backends/cuda/memory.h"
#include "bench_util.h"
#include "core/error.h"

namespace tessera::cuda::bench {
namespace {

using json = nlohmann::json;
using detail::GemmPath;

struct Options {
  std::string json_path;
  bool quick = false;
  int reps = 15;
};

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
    out_["device"] = {{"name", p.name}, {"sm_count", p.multiProcessorCount}, {"l2_bytes", l2_bytes_}};
    fmt::print("device: {} ({} SMs, L2 {} MB)\n", p.name, p.multiProcessorCount, l2_bytes_ >> 20);
  }
  ~Bench() {
    cudaEventDestroy(e0_);
    cudaEventDestroy(e1_);
    cudaStreamDestroy(stream_);
  }

  void ceilings();
  void suite();
  void write_json() const {
    if (opt_.json_path.empty()) return;
    json o = out_;
    o["records"] = records_;
    std::ofstream(opt_.json_path) << o.dump(1) << "\n";
  }

 private:
  // Median per-launch microseconds of launch(i), i in [0, batch), captured into one graph.
  double time_graph(const std::function<void(int)>& launch, int batch);
  int rotation(uint64_t bytes) const {
    const uint64_t want = 4 * static_cast<uint64_t>(l2_bytes_);
    return static_cast<int>(std::clamp<uint64_t>((want + bytes - 1) / bytes, 1, 64));
  }
  DeviceWeight random_weight(DType dtype, int64_t n, int64_t k);

  Options opt_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t e0_ = nullptr, e1_ = nullptr;
  size_t l2_bytes_ = 0;
  double copy_gbps_ = 0, peak_tflops_ = 0;
  json out_;
  json records_ = json::array();
  uint64_t seed_ = 1;
};

double Bench::time_graph(const std::function<void(int)>& launch, int batch) {
  for (int i = 0; i < std::min(batch, 2); ++i) launch(i);  // warm-up outside the graph (plans, module load)
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return time_graph_replays(stream_, e0_, e1_, batch, opt_.reps, 1, launch).us;
}

DeviceWeight Bench::random_weight(DType dtype, int64_t n, int64_t k) {
  DeviceWeight w;
  w.dtype = dtype;
  w.n = n;
  w.k = k;
  if (is_quant(dtype)) {
    const uint64_t qbytes = dtype == DType::Q8_0 ? n * k : n * k / 2;
    const uint64_t sbytes = (n * k / 32) * (dtype == DType::Q4_1 ? 4 : 2);
    w.layout = GemvLayout::SPLIT_Q;
    w.quants = DeviceBuffer(qbytes);
    w.scales = DeviceBuffer(sbytes);
    fill_random(FillKind::BYTES, w.quants.get(), qbytes, 0, 0, seed_++, stream_);
    fill_random(FillKind::F16, w.scales.get(), sbytes / 2, -0.01f, 0.01f, seed_++, stream_);
  } else {
    const uint64_t elems = n * k;
    w.layout = GemvLayout::ROWS;
    w.quants = DeviceBuffer(elems * (dtype == DType::F32 ? 4 : 2));
    const FillKind kind = dtype == DType::F32 ? FillKind::F32 : dtype == DType::F16 ? FillKind::F16 : FillKind::BF16;
    fill_random(kind, w.quants.get(), elems, -0.05f, 0.05f, seed_++, stream_);
  }
  return w;
}

void Bench::ceilings() {
  const size_t bytes = size_t{1} << 30;
  DeviceBuffer a(bytes), b(bytes);
  fill_random(FillKind::BYTES, a.get(), bytes, 0, 0, seed_++, stream_);
  const double copy_us = time_graph(
      [&](int) { TESSERA_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, stream_)); }, 3);
  copy_gbps_ = 2.0 * bytes / (copy_us * 1e-6) / 1e9;
  // The peak: an 8192^3 bf16 GEMM through the same cuBLASLt call matmul makes (bf16 operands, f32 accumulate, f32 D).
  const int64_t s = 8192;
  DeviceBuffer w(s * s * 2), x(s * s * 2), y(s * s * 4);
  fill_random(FillKind::BF16, w.get(), s * s, -1.0f, 1.0f, seed_++, stream_);
  fill_random(FillKind::BF16, x.get(), s * s, -1.0f, 1.0f, seed_++, stream_);
  GemmWorkspace ws(1, 1, 0);
  const double us = time_graph(
      [&](int) { detail::gemm_lt(ws, DType::BF16, w.get(), x.get(), y.as<float>(), s, s, s, stream_, false); }, 3);
  peak_tflops_ = 2.0 * s * s * s / (us * 1e-6) / 1e12;
  out_["ceilings"] = {{"copy_gbps", copy_gbps_}, {"peak_bf16_tflops", peak_tflops_}, {"peak_us", us}};
  fmt::print(
      "ceilings: device-to-device copy {:.0f} GB/s (read + write); cuBLASLt bf16 8192^3 {:.0f} TFLOP/s "
      "({:.0f} us, f32 D)\n",
      copy_gbps_, peak_tflops_, us);
}

void Bench::suite() {
  struct Shape {
    const char* name;
    int64_t n, k;
  };
  // Llama-3-8B: q|k|v and gate|up concatenated (one matmul each), attention output, FFN down.
  const std::vector<Shape> shapes = {
      {"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate_up", 28672, 4096}, {"down", 4096, 14336}};
  const DType formats[] = {DType::BF16, DType::Q8_0, DType::Q4_0};
  std::vector<int64_t> ts = {2, 4, 8, 16, 32, 64, 128, 2048};
  if (opt_.quick) ts = {8, 32, 2048};
  const int64_t max_t = 2048, max_k = 14336;
  GemmWorkspace ws(max_t, max_k, 28672 * 4096);
  DeviceBuffer x(sizeof(float) * max_t * max_k), y(sizeof(float) * max_t * 28672);
  fill_random(FillKind::F32, x.get(), max_t * max_k, -1.0f, 1.0f, seed_++, stream_);
  // x already in bf16 (what rmsnorm / swiglu_rows write in prefill): matmul_x16's input, no conversion pass.
  DeviceBuffer x16(2 * max_t * max_k);
  fill_random(FillKind::BF16, x16.get(), max_t * max_k, -1.0f, 1.0f, seed_++, stream_);
  fmt::print("\n{:<5} {:<8} {:>5} {:>9} {:>9} {:>7} {:>5} {:>8} {:>6} {:>8} {:>6}\n", "fmt", "shape", "t", "rows us",
             "cublas us", "x16 us", "auto", "TFLOP/s", "%peak", "wt GB/s", "%copy");
  for (DType dtype : formats) {
    for (const Shape& s : shapes) {
      const uint64_t bytes = *dtype_row_bytes(dtype, static_cast<uint64_t>(s.k)) * s.n;
      const int copies = rotation(bytes);
      std::vector<DeviceWeight> weights;
      for (int c = 0; c < copies; ++c) weights.push_back(random_weight(dtype, s.n, s.k));
      for (int64_t t : ts) {
        double us[2] = {0, 0};  // rows, cublas
        for (const GemmPath path : {GemmPath::ROWS, GemmPath::CUBLAS}) {
          // The multi-row GEMV past a few hundred rows would only re-read the weights t / 8 times: not timed.
          if (path == GemmPath::ROWS && t > 256) continue;
          const int batch = std::max(copies, t >= 1024 ? 3 : 8);
          us[path == GemmPath::ROWS ? 0 : 1] = time_graph(
              [&](int i) {
                detail::matmul_path(weights[i % copies], x.as<float>(), y.as<float>(), t, ws, stream_, false, path);
              },
              batch);
        }
        // matmul_x16 (bf16 x), from the t where the executor uses it.
        double us16 = 0;
        if (t >= matmul_x16_min_t(dtype))
          us16 = time_graph([&](int i) { matmul_x16(weights[i % copies], x16.get(), y.as<float>(), t, ws, stream_); },
                            std::max(copies, t >= 1024 ? 3 : 8));
        const GemmPath pick = detail::gemm_default_path(dtype, t, s.n, s.k);
        const double best = pick == GemmPath::ROWS ? us[0] : us[1];
        const double tflops = 2.0 * t * s.n * s.k / (best * 1e-6) / 1e12;
        const double gbps = static_cast<double>(bytes) / (best * 1e-6) / 1e9;
        fmt::print("{:<5} {:<8} {:>5} {:>9.1f} {:>9.1f} {:>7.1f} {:>5} {:>8.1f} {:>5.1f}% {:>8.0f} {:>5.1f}%\n",
                   dtype_name(dtype), s.name, t, us[0], us[1], us16, pick == GemmPath::ROWS ? "rows" : "lt", tflops,
                   100.0 * tflops / peak_tflops_, gbps, 100.0 * gbps / copy_gbps_);
        records_.push_back({{"dtype", dtype_name(dtype)},
                            {"shape", s.name},
                            {"n", s.n},
                            {"k", s.k},
                            {"t", t},
                            {"rows_us", us[0]},
                            {"cublas_us", us[1]},
                            {"x16_us", us16},
                            {"auto", detail::gemm_path_name(pick)},
                            {"tflops", tflops},
                            {"pct_peak", 100.0 * tflops / peak_tflops_},
                            {"weight_gbps", gbps},
                            {"pct_copy", 100.0 * gbps / copy_gbps_}});
      }
    }
  }
}

}  // namespace
}  // namespace tessera::cuda::bench

int main(int argc, char** argv) {
  using namespace tessera::cuda::bench;
  Options opt;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc)
      opt.json_path = argv[++i];
    else if (!std::strcmp(argv[i], "--quick"))
      opt.quick = true;
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
      opt.reps = std::max(3, std::atoi(argv[++i]));
    else {
      fmt::print(stderr, "usage: tessera_bench_gemm [--json FILE] [--quick] [--reps N]\n");
      return 2;
    }
  }
  try {
    Bench b(opt);
    b.ceilings();
    b.suite();
    b.write_json();
  } catch (const std::exception& e) {
    fmt::print(stderr, "tessera_bench_gemm: {}\n", e.what());
    return 1;
  }
  return 0;
}
