// Shared by `tessera bench` and `tessera profile`: where the model comes from (a file or a synthetic preset), the
// ceilings as JSON and text, and number formatting.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "tessera/bench.h"
#include "tessera/model.h"

namespace tessera::cli {

struct ModelSource {
  std::string model;  // -m
  std::string arch;   // --arch
  bool random_weights = false;
  std::string dtype;  // "": the preset's default (random_model_default_dtype)
  uint64_t seed = 1;
  int64_t layers = 0;
};

// -m, --arch, --random-weights, --dtype, --seed, --layers.
void add_model_source_flags(CLI::App& app, ModelSource& s);
// Checks the combination (one sentence on a bad one) and loads the model; synthetic models report progress on stderr.
Model load_model_source(const ModelSource& s, bool want_tokenizer);
// "SmolLM2 135M" or the file name when the model has no name.
std::string model_label(const Model& m);

nlohmann::json ceilings_json(const Ceilings& c);  // an array of rows (bandwidth and gemm)
void print_ceilings(const Ceilings& c);

// Roofline: the fraction of the limit a rate reaches, by whichever resource binds at this arithmetic intensity.
struct RoofShare {
  double fraction = 0;      // 0 when the needed ceiling was not measured
  const char* bound = "-";  // "compute" or "memory"
};
RoofShare roof_share(double flops, double bytes, double seconds, double peak_tflops, double peak_gbps);

std::string human_bytes(uint64_t b);  // "92.1 MiB"

}  // namespace tessera::cli
