// Event-timed benchmark of the T-row matmul (kernels_rows.h) at Llama-3-8B's projection shapes: prefill (t = 2048,
// TFLOP/s against the 8192^3 bf16 cuBLASLt peak measured in the same run) and batched decode (t = 2..128, weight bytes
// per second against the device-to-device copy), for bf16, q8_0 and q4_0 weights, each path (multi-row GEMV,
// cuBLASLt) timed separately so gemm_default_path can be checked against the figures.
//
// Method as tessera_bench_cuda (device/METHOD.md): random data, warm-up, a CUDA graph of `batch` launches over
// rotating weight copies covering 4x the L2 (so small weights are still read from memory), event-timed replays,
// median. Every timing includes what matmul does in front of the GEMM (x to bf16 or q8, dequantization).
//
// --tile: instead, the quantized prefill GEMM of every format with a tile kernel (q4_K, q5_K, q6_K, q2_K, q3_K, q5_0,
// q5_1, iq4_nl, iq4_xs): matmul_x16 (bf16 x, as prefill feeds it) under quant_gemm=expand (dequantize to bf16, then
// cuBLASLt) and quant_gemm=tile (gemm_quant_tile.cu) at t = 64 .. 2048, per shape and summed over the layer's four
// matrices, so that the auto rule's row limit (gemm_paths.h, quant_tile_auto_max_t) can be checked per format. Weights
// are random bytes in the SPLIT_Q layout (both paths read the same bytes; timing does not depend on the values).
//
// Usage: tessera_bench_gemm [--json FILE] [--quick] [--reps N] [--tile [FMT,...]]
#include <cuda_runtime_api.h>
#include <fmt/core.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_options.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/gemm_paths.h"
#include "backends/cuda/kernels_rows.h"
#include "backends/cuda/memory.h"
#include "backends/cuda/split_layout.h"
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
  bool tile = false;
  std::vector<DType> tile_formats;  // --tile's formats (empty: all with a tile kernel)
};

bool is_quant(DType t) { return t == DType::Q8_0 || t == DType::Q4_0 || t == DType::Q4_1; }

// Bytes per block of a SPLIT_Q format's quants and scales (its tail included), or false for a format without one.
bool split_bytes(DType d, int64_t& block, int64_t& quant, int64_t& scale) {
  return with_split_layout(d, [&](auto tag) {
    using L = SplitLayout<decltype(tag)::value>;
    block = Format<decltype(tag)::value>::kBlockSize;
    quant = L::kQuantBytes;
    scale = L::kScaleBytes + L::kTailBytes;
  });
}

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
  void tile_suite();
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
  int64_t block = 0, qb = 0, sb = 0;
  if (!is_quant(dtype) && split_bytes(dtype, block, qb, sb)) {
    const uint64_t nb = static_cast<uint64_t>(n * k / block);
    w.layout = GemvLayout::SPLIT_Q;
    w.quants = DeviceBuffer(nb * qb);
    w.scales = DeviceBuffer(nb * sb);
    fill_random(FillKind::BYTES, w.quants.get(), nb * qb, 0, 0, seed_++, stream_);
    fill_random(FillKind::BYTES, w.scales.get(), nb * sb, 0, 0, seed_++, stream_);
  } else if (is_quant(dtype)) {
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

void Bench::tile_suite() {
  struct Shape {
    const char* name;
    int64_t n, k;
  };
  const std::vector<Shape> shapes = {
      {"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate_up", 28672, 4096}, {"down", 4096, 14336}};
  std::vector<DType> formats = opt_.tile_formats;
  if (formats.empty())
    formats = {DType::Q4_K, DType::Q5_K, DType::Q6_K,   DType::Q2_K,  DType::Q3_K,
               DType::Q5_0, DType::Q5_1, DType::IQ4_NL, DType::IQ4_XS};
  std::vector<int64_t> ts = {64, 128, 256, 512, 1024, 2048};
  if (opt_.quick) ts = {128, 512};
  const int64_t max_t = ts.back(), max_k = 14336;
  GemmWorkspace ws(max_t, max_k, 28672 * 4096);
  DeviceBuffer y(sizeof(float) * max_t * 28672), x16(2 * max_t * max_k);
  fill_random(FillKind::BF16, x16.get(), max_t * max_k, -1.0f, 1.0f, seed_++, stream_);
  fmt::print("\n{:<7} {:<8} {:>5} {:>10} {:>10} {:>7} {:>8}\n", "fmt", "shape", "t", "expand us", "tile us", "ratio",
             "auto");
  for (const DType dtype : formats) {
    if (!detail::gemm_quant_tile_format(dtype)) fail("tessera_bench_gemm: {} has no tile kernel", dtype_name(dtype));
    std::vector<std::vector<DeviceWeight>> weights(shapes.size());
    std::vector<int> copies(shapes.size());
    for (size_t i = 0; i < shapes.size(); ++i) {
      const uint64_t bytes = *dtype_row_bytes(dtype, static_cast<uint64_t>(shapes[i].k)) * shapes[i].n;
      copies[i] = rotation(bytes);
      for (int c = 0; c < copies[i]; ++c) weights[i].push_back(random_weight(dtype, shapes[i].n, shapes[i].k));
    }
    for (const int64_t t : ts) {
      double layer[2] = {0, 0};
      for (size_t i = 0; i < shapes.size(); ++i) {
        double us[2] = {0, 0};
        for (int m = 0; m < 2; ++m) {
          CudaOptions o = cuda_options();
          o.quant_gemm = m == 0 ? QuantGemm::EXPAND : QuantGemm::TILE;
          const CudaOptionsScope scope(o);
          us[m] = time_graph(
              [&](int j) { matmul_x16(weights[i][j % copies[i]], x16.get(), y.as<float>(), t, ws, stream_); },
              std::max(copies[i], t >= 1024 ? 3 : 8));
          layer[m] += us[m];
        }
        const bool auto_tile = detail::matmul_x16_path(weights[i][0], x16.get(), t) == GemmPath::TILE;
        fmt::print("{:<7} {:<8} {:>5} {:>10.1f} {:>10.1f} {:>6.3f}x {:>8}\n", dtype_name(dtype), shapes[i].name, t,
                   us[0], us[1], us[0] / us[1], auto_tile ? "tile" : "expand");
        records_.push_back({{"dtype", dtype_name(dtype)},
                            {"shape", shapes[i].name},
                            {"n", shapes[i].n},
                            {"k", shapes[i].k},
                            {"t", t},
                            {"expand_us", us[0]},
                            {"tile_us", us[1]},
                            {"auto", auto_tile ? "tile" : "expand"}});
      }
      fmt::print("{:<7} {:<8} {:>5} {:>10.1f} {:>10.1f} {:>6.3f}x\n", dtype_name(dtype), "layer", t, layer[0], layer[1],
                 layer[0] / layer[1]);
      records_.push_back(
          {{"dtype", dtype_name(dtype)}, {"shape", "layer"}, {"t", t}, {"expand_us", layer[0]}, {"tile_us", layer[1]}});
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
    else if (!std::strcmp(argv[i], "--tile")) {
      opt.tile = true;
      if (i + 1 < argc && argv[i + 1][0] != '-') {
        std::string list = argv[++i];
        for (size_t at = 0; at <= list.size();) {
          const size_t end = std::min(list.find(',', at), list.size());
          const std::optional<tessera::DType> d = tessera::dtype_from_name(list.substr(at, end - at));
          if (!d) {
            fmt::print(stderr, "tessera_bench_gemm: --tile: unknown format '{}'\n", list.substr(at, end - at));
            return 2;
          }
          opt.tile_formats.push_back(*d);
          at = end + 1;
        }
      }
    } else {
      fmt::print(stderr, "usage: tessera_bench_gemm [--json FILE] [--quick] [--reps N] [--tile [FMT,...]]\n");
      return 2;
    }
  }
  try {
    Bench b(opt);
    b.ceilings();
    if (opt.tile)
      b.tile_suite();
    else
      b.suite();
    b.write_json();
  } catch (const std::exception& e) {
    fmt::print(stderr, "tessera_bench_gemm: {}\n", e.what());
    return 1;
  }
  return 0;
}
