// Event-timed benchmark of causal prefill attention (attn_prefill, every launch shape; and cuDNN's fused SDPA through
// attn_prefill_cudnn where cudnn_attention_available(); attn_prefill_tma where supported): TFLOP/s counting the causal
// FLOPs 4 * t^2 * hd * n_head / 2 (QKᵀ and PV, half the square), next to bench/peer/torch_sdpa.py's PyTorch SDPA at the
// same shapes (run both in one session on one device). The cuDNN row's "build" is the one-time graph build for that
// shape (not in its times), "tune" the one-time timing of its candidate plans at the first call (attn_cudnn.h; only
// with --autotune 1 or 2, else none: the heuristics' first plan), "plan c/n" the plan it runs. The "varlen"
// row is the variable-length graph as prefill uses it (exact_full_chunk off, the default). --plans adds a row per
// candidate plan of both graphs (forced, untuned), and a line per plan with cuDNN's engine tag and its tuning median.
//
// Method (device/METHOD.md): random data (never zeros), warm-up, each launch timed alone with events, median of
// `reps` (min and max printed beside it). Inputs are not rotated: the work is O(t^2) arithmetic over O(t) bytes,
// and K/V are re-read from L2 within every launch anyway.
//
// Usage: tessera_bench_attention [--json FILE] [--reps N] [--quick] [--t N,N,...] [--cudnn-only] [--plans]
//                                [--autotune 0|1|2] [--exact-first]
//   --t: only the Llama-3-8B shapes (32/8 heads, hd 128, p0 = 0) at these t; --cudnn-only: no attn_prefill rows;
//   --autotune, --exact-first: the cuDNN workspace's options (CudnnAttnOptions::autotune, exact_full_chunk; the engine
//   leaves both at their defaults, 0 and off).
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

struct Flags {
  std::string json_path;
  int reps = 20;
  bool quick = false;
  std::vector<int64_t> only_t;  // --t
  bool cudnn_only = false;
  bool plans = false;
  CudnnAttnOptions cudnn;  // --autotune, --exact-first
};

std::string plan_note(const CudnnGraphInfo& g) {
  return fmt::format("tune {:.0f} ms, plan {}/{}", g.tune_ms, g.chosen, g.plans.size());
}

// The graph of `ws` for (t, s_kv, varlen); null when absent.
std::unique_ptr<CudnnGraphInfo> find_graph(const CudnnAttnWorkspace& ws, int64_t t, int64_t s_kv, bool varlen) {
  for (const CudnnGraphInfo& g : ws.graph_info())
    if (g.t == t && g.s_kv == s_kv && g.varlen == varlen) return std::make_unique<CudnnGraphInfo>(g);
  return nullptr;
}

int run(const Flags& fl) {
  const std::string& json_path = fl.json_path;
  const int reps = fl.reps;
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
  if (!fl.only_t.empty()) {
    shapes.clear();
    for (int64_t t : fl.only_t) shapes.push_back({"llama3-8b", 32, 8, 128, t});
  }
  if (fl.quick) shapes.resize(1);
  std::string cudnn_why;
  std::unique_ptr<CudnnAttnWorkspace> cudnn;
  const CudnnAttnOptions opt = fl.cudnn;
  if (cudnn_attention_available(&cudnn_why)) {
    cudnn = std::make_unique<CudnnAttnWorkspace>(0, opt);
    fmt::print("cuDNN: autotune {} (--autotune), exact first chunk {} (--exact-first)\n", opt.autotune,
               opt.exact_full_chunk ? "on" : "off");
  } else {
    fmt::print("cuDNN rows skipped: {}\n", cudnn_why);
  }
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
                        double build_ms, const std::string& note = std::string()) {
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
      std::string extra = build_ms > 0 ? fmt::format("build {:.0f} ms", build_ms) : std::string();
      if (!note.empty()) extra += (extra.empty() ? "" : ", ") + note;
      fmt::print("{:<12} {:>6} {:>4} {:<20} {:>9.3f} {:>9.3f} {:>9.3f} {:>8.1f}{}\n", s.name, s.t, s.hd,
                 name + (is_default ? " *" : ""), med, ms.front(), ms.back(), tflops,
                 extra.empty() ? std::string() : "  (" + extra + ")");
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
                         {"build_ms", build_ms},
                         {"note", note}});
    };
    for (int var = 0; var < (fl.cudnn_only ? 0 : detail::attn_prefill_variant_count()); ++var) {
      time_row(detail::attn_prefill_variant_name(var, s.hd), var == def, [&] {
        detail::attn_prefill_variant(var, q.as<float>(), width, cache, 0, s.p0, s.t, out.as<float>(), s.n_head, scale,
                                     stream);
      }, 0);
    }
    // 16-bit q and out for our Hopper kernel and cuDNN (both take the cache's type): the same values' distribution,
    // rounded to bf16.
    const bool tma = attn_prefill_tma_supported(cache, s.n_head);
    DeviceBuffer q16, out16;
    if (tma || cudnn) {
      q16 = DeviceBuffer(2 * s.t * width);
      out16 = DeviceBuffer(2 * s.t * width);
      fill_random(FillKind::BF16, q16.get(), s.t * width, -2.0f, 2.0f, 1, stream);
    }
    if (tma)
      time_row(
          "tma (attn_prefill_tma)", false,
          [&] { attn_prefill_tma(q16.get(), width, cache, 0, s.p0, s.t, out16.get(), s.n_head, scale, stream); }, 0);
    if (cudnn) {
      const double before = cudnn->build_ms();
      cudnn->prepare(cache, width, s.p0, s.t, s.n_head, scale);
      const double built = cudnn->build_ms() - before;
      auto exact = [&] {
        attn_prefill_cudnn(q16.get(), width, cache, 0, s.p0, s.t, out16.get(), s.n_head, scale, *cudnn, stream);
      };
      // The first call tunes (not timed: the warm-up launches of time_row); the row says what it chose.
      exact();
      TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
      const auto exact_info = find_graph(*cudnn, s.t, s.p0 + s.t, false);
      time_row("cudnn sdpa", false, exact, built, exact_info ? plan_note(*exact_info) : "");
      // One row per candidate plan, forced (the tuning medians are in the plan lines below).
      auto plan_rows = [&](CudnnAttnWorkspace& ws, const CudnnGraphInfo* info, const char* tag,
                           const std::function<void()>& launch) {
        if (!fl.plans || info == nullptr) return;
        for (size_t p = 0; p < info->plans.size(); ++p) {
          ws.force_plan(static_cast<int64_t>(p));
          time_row(fmt::format("cudnn {}p{}", tag, p), false, launch, 0,
                   p == static_cast<size_t>(info->chosen) ? "chosen" : "");
        }
        ws.force_plan(-1);
        for (size_t p = 0; p < info->plans.size(); ++p)
          fmt::print("    {}plan {}{}: {} (workspace {} B, tuning median {:.3f} ms)\n", tag, p,
                     p == static_cast<size_t>(info->chosen) ? " (chosen)" : "", info->plans[p].name,
                     info->plans[p].workspace_bytes, info->plans[p].tune_ms);
      };
      plan_rows(*cudnn, exact_info.get(), "", exact);
      // Variable-length mode (padding mask, lengths on the device; max_t = t here): the cost of one graph for all
      // chunk shapes (a full first chunk, p0 = 0 and t = max_t, would take an exact graph: turned off here).
      {
        CudnnAttnOptions vopt = opt;
        vopt.exact_full_chunk = false;
        CudnnAttnWorkspace var(s.t, vopt);
        var.prepare(cache, width, s.p0, s.t, s.n_head, scale);
        auto launch = [&] {
          attn_prefill_cudnn(q16.get(), width, cache, 0, s.p0, s.t, out16.get(), s.n_head, scale, var, stream);
        };
        launch();
        TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
        const auto info = find_graph(var, s.t, n_ctx, true);
        time_row("cudnn sdpa varlen", false, launch, var.build_ms(), info ? plan_note(*info) : "");
        plan_rows(var, info.get(), "v", launch);
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

// "2048,8192" -> {2048, 8192}; empty on a malformed list.
std::vector<int64_t> parse_list(const std::string& text) {
  std::vector<int64_t> out;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t end = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, end - at);
    char* stop = nullptr;
    const long long v = std::strtoll(item.c_str(), &stop, 10);
    if (item.empty() || stop == nullptr || *stop != '\0' || v <= 0) return {};
    out.push_back(v);
    at = end + 1;
  }
  return out;
}

}  // namespace
}  // namespace tessera::cuda::bench

int main(int argc, char** argv) {
  tessera::cuda::bench::Flags fl;
  auto usage = [] {
    fmt::print(stderr,
               "usage: tessera_bench_attention [--json FILE] [--reps N] [--quick] [--t N,N,...] [--cudnn-only] "
               "[--plans] [--autotune 0|1|2] [--exact-first]\n");
    return 2;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      fl.json_path = argv[++i];
    } else if (a == "--reps" && i + 1 < argc) {
      fl.reps = std::max(3, std::atoi(argv[++i]));
    } else if (a == "--quick") {
      fl.quick = true;
    } else if (a == "--t" && i + 1 < argc) {
      fl.only_t = tessera::cuda::bench::parse_list(argv[++i]);
      if (fl.only_t.empty()) return usage();
    } else if (a == "--cudnn-only") {
      fl.cudnn_only = true;
    } else if (a == "--plans") {
      fl.plans = true;
    } else if (a == "--autotune" && i + 1 < argc) {
      const std::string v = argv[++i];
      if (v != "0" && v != "1" && v != "2") return usage();
      fl.cudnn.autotune = std::stoi(v);
    } else if (a == "--exact-first") {
      fl.cudnn.exact_full_chunk = true;
    } else {
      return usage();
    }
  }
  try {
    std::string why;
    if (tessera::cuda::list_devices(&why).empty()) {
      fmt::print(stderr, "tessera_bench_attention: no CUDA GPU ({})\n", why);
      return 1;
    }
    return tessera::cuda::bench::run(fl);
  } catch (const std::exception& e) {
    fmt::print(stderr, "tessera_bench_attention: {}\n", e.what());
    return 1;
  }
}
