// Event-timed benchmark of causal prefill attention (attn_prefill, every launch shape; and cuDNN's fused SDPA through
// attn_prefill_cudnn where cudnn_attention_available()): TFLOP/s counting the causal FLOPs 4 * t^2 * hd * n_head / 2
// (QKᵀ and PV, half the square), next to bench/peer/torch_sdpa.py's PyTorch SDPA at the same shapes (run both in one
// session on one device). The cuDNN row's "build" is the one-time graph build for that shape (not in its times).
//
// Method (device/METHOD.md): random data (never zeros), warm-up, each launch timed alone with events, median of
// `reps` (min and max printed beside it). Inputs are not rotated: the work is O(t^2) arithmetic over O(t) bytes,
// and K/V are re-read from L2 within every launch anyway.
//
// Usage: tessera_bench_attention [--json FILE] [--reps N] [--quick]
#include <cuda_runtime_api.h>
#include <fmt/core.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backends/cuda/attn_cudnn.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device_info.h"
#include "backends/cuda/kernels/attn_prefill_variants.h"
#include "backends/cuda/kernels_rows.h"
#include "backends/cuda/memory.h"
#include "bench_util.h"
#include "core/error.h"

namespace tessera::cuda::bench {
namespace {

using json = nlohmann::json;

struct Shape {
  const char* name;
  int64_t n_head, n_kv, hd, t;
  int64_t p0 = 0;  // > 0: a chunk of t rows after p0 cached positions (chunked prefill)
};

int run(const std::string& json_path, int reps, bool quick) {
  set_device(0);
  cudaDeviceProp prop{};
  TESSERA_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  fmt::print("device: {} ({} SMs), bf16 cache, n_ctx = p0 + t, median of {} launches\n", prop.name,
             prop.multiProcessorCount, reps);
  cudaStream_t stream = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  TESSERA_CUDA_CHECK(cudaEventCreate(&e0));
  TESSERA_CUDA_CHECK(cudaEventCreate(&e1));

  std::vector<Shape> shapes = {{"llama3-8b", 32, 8, 128, 2048},  {"llama3-8b", 32, 8, 128, 8192},
                               {"llama3-8b", 32, 8, 128, 16384}, {"hd64 32/8", 32, 8, 64, 2048},
                               {"smollm2 9/3", 9, 3, 64, 2048},  {"l3 chunk", 32, 8, 128, 512, 7680}};
  if (quick) shapes.resize(1);
  std::string cudnn_why;
  std::unique_ptr<CudnnAttnWorkspace> cudnn;
  if (cudnn_attention_available(&cudnn_why))
    cudnn = std::make_unique<CudnnAttnWorkspace>();
  else
    fmt::print("cuDNN rows skipped: {}\n", cudnn_why);
  json records = json::array();
  fmt::print("{:<12} {:>6} {:>4} {:<20} {:>9} {:>9} {:>9} {:>8}\n", "shape", "t", "hd", "launch shape", "ms", "min",
             "max", "TFLOP/s");
  for (const Shape& s : shapes) {
    const int64_t width = s.n_head * s.hd;
    const int64_t n_ctx = s.p0 + s.t;
    const size_t cache_elems = static_cast<size_t>(s.n_kv * n_ctx * s.hd);
    DeviceBuffer q(sizeof(float) * s.t * width), out(sizeof(float) * s.t * width);
    DeviceBuffer k(2 * cache_elems), v(2 * cache_elems);
    fill_random(FillKind::F32, q.get(), s.t * width, -2.0f, 2.0f, 1, stream);
    fill_random(FillKind::BF16, k.get(), cache_elems, -1.0f, 1.0f, 2, stream);
    fill_random(FillKind::BF16, v.get(), cache_elems, -1.0f, 1.0f, 3, stream);
    KvCacheView cache{DType::BF16, k.get(), v.get(), n_ctx, s.n_kv, s.hd};
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
    // Row i attends p0 + i + 1 keys: 4 * hd * n_head * (t * p0 + t^2 / 2), SDPA's causal count when p0 = 0.
    const double tt = static_cast<double>(s.t);
    const double flops = 4.0 * static_cast<double>(s.hd * s.n_head) * (tt * static_cast<double>(s.p0) + tt * tt / 2);
    const int def = detail::attn_prefill_default_variant(s.hd, s.n_head, s.t);
    auto time_row = [&](const std::string& name, bool is_default, const std::function<void()>& launch,
                        double build_ms) {
      for (int w = 0; w < 3; ++w) launch();
      TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
      std::vector<float> ms;
      for (int r = 0; r < reps; ++r) {
        TESSERA_CUDA_CHECK(cudaEventRecord(e0, stream));
        launch();
        TESSERA_CUDA_CHECK(cudaEventRecord(e1, stream));
        TESSERA_CUDA_CHECK(cudaEventSynchronize(e1));
        float t = 0;
        TESSERA_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
        ms.push_back(t);
      }
      std::sort(ms.begin(), ms.end());
      const double med = ms[ms.size() / 2];
      const double tflops = flops / (med * 1e-3) / 1e12;
      fmt::print("{:<12} {:>6} {:>4} {:<20} {:>9.3f} {:>9.3f} {:>9.3f} {:>8.1f}{}\n", s.name, s.t, s.hd,
                 name + (is_default ? " *" : ""), med, ms.front(), ms.back(), tflops,
                 build_ms > 0 ? fmt::format("  (build {:.0f} ms)", build_ms) : std::string());
      records.push_back({{"shape", s.name},
                         {"n_head", s.n_head},
                         {"n_kv", s.n_kv},
                         {"hd", s.hd},
                         {"t", s.t},
                         {"p0", s.p0},
                         {"launch_shape", name},
                         {"default", is_default},
                         {"ms", med},
                         {"min_ms", ms.front()},
                         {"max_ms", ms.back()},
                         {"tflops", tflops},
                         {"build_ms", build_ms}});
    };
    for (int var = 0; var < detail::attn_prefill_variant_count(); ++var) {
      time_row(detail::attn_prefill_variant_name(var, s.hd), var == def, [&] {
        detail::attn_prefill_variant(var, q.as<float>(), width, cache, 0, s.p0, s.t, out.as<float>(), s.n_head, scale,
                                     stream);
      }, 0);
    }
    if (cudnn) {
      // 16-bit q and out (cuDNN takes the cache's type): the same values' distribution, rounded to bf16.
      DeviceBuffer q16(2 * s.t * width), out16(2 * s.t * width);
      fill_random(FillKind::BF16, q16.get(), s.t * width, -2.0f, 2.0f, 1, stream);
      const double before = cudnn->build_ms();
      cudnn->prepare(cache, width, s.p0, s.t, s.n_head, scale);
      time_row("cudnn sdpa", false, [&] {
        attn_prefill_cudnn(q16.get(), width, cache, 0, s.p0, s.t, out16.get(), s.n_head, scale, *cudnn, stream);
      }, cudnn->build_ms() - before);
      // Variable-length mode (padding mask, lengths on the device; max_t = t here): the cost of one graph for all
      // chunk shapes.
      {
        CudnnAttnWorkspace var(s.t);
        var.prepare(cache, width, s.p0, s.t, s.n_head, scale);
        time_row("cudnn sdpa varlen", false, [&] {
          attn_prefill_cudnn(q16.get(), width, cache, 0, s.p0, s.t, out16.get(), s.n_head, scale, var, stream);
        }, var.build_ms());
      }
      // The same call captured into a CUDA graph and replayed, as an executor would run it: the GPU time without
      // the host-side cost of cuDNN's execute (which the row above includes when the kernel is short).
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      TESSERA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      std::string error;
      try {
        attn_prefill_cudnn(q16.get(), width, cache, 0, s.p0, s.t, out16.get(), s.n_head, scale, *cudnn, stream);
      } catch (const std::exception& e) {
        error = e.what();
      }
      const cudaError_t end = cudaStreamEndCapture(stream, &graph);
      if (error.empty() && end == cudaSuccess && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess) {
        time_row("cudnn sdpa graph", false, [&] { TESSERA_CUDA_CHECK(cudaGraphLaunch(exec, stream)); }, 0);
      } else {
        fmt::print("cudnn capture failed: {}\n", error.empty() ? cudaGetErrorString(end) : error);
        cudaGetLastError();
      }
      if (exec != nullptr) cudaGraphExecDestroy(exec);
      if (graph != nullptr) cudaGraphDestroy(graph);
    }
  }
  fmt::print("(* = the launch shape attn_prefill uses)\n");
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << json{{"device", prop.name}, {"records", records}}.dump(2) << "\n";
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace
}  // namespace tessera::cuda::bench

int main(int argc, char** argv) {
  std::string json_path;
  int reps = 20;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::max(3, std::atoi(argv[++i]));
    } else if (a == "--quick") {
      quick = true;
    } else {
      fmt::print(stderr, "usage: tessera_bench_attention [--json FILE] [--reps N] [--quick]\n");
      return 2;
    }
  }
  try {
    std::string why;
    if (tessera::cuda::list_devices(&why).empty()) {
      fmt::print(stderr, "tessera_bench_attention: no CUDA GPU ({})\n", why);
      return 1;
    }
    return tessera::cuda::bench::run(json_path, reps, quick);
  } catch (const std::exception& e) {
    fmt::print(stderr, "tessera_bench_attention: {}\n", e.what());
    return 1;
  }
}
