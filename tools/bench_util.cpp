#include "bench_util.h"

#include <fmt/core.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "command.h"
#include "tessera/error.h"
#include "tessera/random_model.h"

namespace tessera::cli {

void add_model_source_flags(CLI::App& app, ModelSource& s) {
  add_model_option(app, s.model);
  std::string archs;
  for (const std::string& a : random_model_archs()) archs += (archs.empty() ? "" : ", ") + a;
  app.add_option("--arch", s.arch,
                 "Synthetic model of this architecture's real size (with --random-weights): " + archs);
  app.add_flag("--random-weights", s.random_weights,
               "Use seeded random weights of the --arch preset instead of a file (nothing is downloaded)");
  app.add_option("--dtype", s.dtype,
                 "Weight dtype of the synthetic model (every format with a quantizer): f32, f16, bf16, q8_0, q4_0 "
                 "(default), q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs, tq1_0, tq2_0; the "
                 "MatMul-free LM presets (mmfreelm-*) keep their weights ternary: tq2_0 (their default), tq1_0, bf16, "
                 "f16 or f32");
  app.add_option("--seed", s.seed, "Seed of the synthetic weights (default 1)");
  app.add_option("--layers", s.layers, "Synthetic model with only this many layers (default: the preset's)");
}

Model load_model_source(const ModelSource& s, bool want_tokenizer) {
  if (!s.random_weights) {
    if (!s.arch.empty()) throw Error("--arch builds a synthetic model and needs --random-weights");
    ModelOptions mo;
    mo.load_tokenizer = want_tokenizer;
    return Model::load(s.model, mo);
  }
  if (s.arch.empty()) throw Error("--random-weights needs --arch NAME (the preset to build)");
  if (!s.model.empty()) throw Error("give either -m MODEL or --arch NAME --random-weights, not both");
  {
    std::string archs;
    bool known = false;
    for (const std::string& x : random_model_archs()) {
      known |= x == s.arch;
      archs += (archs.empty() ? "" : ", ") + x;
    }
    if (!known) throw Error(fmt::format("unknown --arch '{}' (presets: {})", s.arch, archs));
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::string dtype = s.dtype.empty() ? random_model_default_dtype(s.arch) : s.dtype;
  fmt::print(stderr, "tessera: building a random {} ({}, seed {})...\n", s.arch, dtype, s.seed);
  RandomModelOptions ro;
  ro.arch = s.arch;
  ro.dtype = dtype;
  ro.seed = s.seed;
  ro.n_layers = s.layers;
  Model m = make_random_model(ro);
  fmt::print(stderr, "tessera: built in {:.1f} s\n",
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return m;
}

std::string model_label(const Model& m) {
  if (!m.spec().name.empty()) return m.spec().name;
  return std::filesystem::path(m.path()).filename().string();
}

nlohmann::json ceilings_json(const Ceilings& c) {
  nlohmann::json rows = nlohmann::json::array();
  for (const BandwidthCeiling& b : c.bandwidth)
    rows.push_back({{"kind", "bandwidth"},
                    {"name", b.name},
                    {"device", c.device},
                    {"cpu", c.cpu_name},
                    {"n_threads", c.n_threads},
                    {"bytes", b.bytes},
                    {"gbps", b.gbps.median},
                    {"gbps_stddev", b.gbps.stddev},
                    {"gbps_min", b.gbps.min},
                    {"gbps_max", b.gbps.max},
                    {"repeats", b.gbps.n}});
  for (const GemmCeiling& g : c.gemm)
    rows.push_back({{"kind", "gemm"},
                    {"name", g.kernel + " " + g.dtype},
                    {"kernel", g.kernel},
                    {"dtype", g.dtype},
                    {"device", c.device},
                    {"cpu", c.cpu_name},
                    {"n_threads", c.n_threads},
                    {"m", g.m},
                    {"n", g.n},
                    {"k", g.k},
                    {"tflops", g.tflops.median},
                    {"tflops_stddev", g.tflops.stddev},
                    {"tflops_min", g.tflops.min},
                    {"tflops_max", g.tflops.max},
                    {"repeats", g.tflops.n}});
  return rows;
}

void print_ceilings(const Ceilings& c) {
  fmt::print("ceilings: {} ({}), {} threads\n", c.device, c.cpu_name, c.n_threads);
  for (const BandwidthCeiling& b : c.bandwidth)
    fmt::print("  memory {:<22} {:9.2f} GB/s  ± {:.2f}  ({} repeats, {} {} each)\n", b.name, b.gbps.median,
               b.gbps.stddev, b.gbps.n, human_bytes(b.bytes), b.name == "copy" ? "read + written" : "read");
  for (const GemmCeiling& g : c.gemm) {
    const std::string shape = g.m > 0 ? fmt::format("{}x{}x{}", g.m, g.n, g.k) : "registers";
    fmt::print("  gemm   {:<22} {:9.1f} GFLOP/s ± {:.1f}  ({})\n", g.kernel + " " + g.dtype, g.tflops.median * 1e3,
               g.tflops.stddev * 1e3, shape);
  }
}

RoofShare roof_share(double flops, double bytes, double seconds, double peak_tflops, double peak_gbps) {
  RoofShare r;
  if (seconds <= 0) return r;
  // Ridge point: the intensity (FLOP per byte) at which compute and memory take equally long at the peaks.
  const bool have_flops = peak_tflops > 0, have_bytes = peak_gbps > 0;
  bool compute = have_flops && !have_bytes;
  if (have_flops && have_bytes) compute = bytes <= 0 || flops / bytes > peak_tflops * 1e12 / (peak_gbps * 1e9);
  if (compute) {
    r.bound = "compute";
    r.fraction = flops / seconds / (peak_tflops * 1e12);
  } else if (have_bytes) {
    r.bound = "memory";
    r.fraction = bytes / seconds / (peak_gbps * 1e9);
  }
  return r;
}

std::string human_bytes(uint64_t b) {
  const double d = static_cast<double>(b);
  if (d >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", d / (1024.0 * 1024 * 1024));
  if (d >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", d / (1024.0 * 1024));
  if (d >= 1024.0) return fmt::format("{:.1f} KiB", d / 1024.0);
  return fmt::format("{} B", b);
}

}  // namespace tessera::cli
