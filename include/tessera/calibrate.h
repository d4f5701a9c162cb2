// TEAL calibration (docs/TEAL.md): per layer and matmul input (q|k|v, o, gate|up, down), the magnitude threshold
// below which activations are zeroed, from histograms of those inputs over a calibration text; and the thresholds
// file (JSON) sessions read through SessionOptions::teal.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/model.h"

namespace tessera {

// FNV-1a over every tensor's name, dtype, shape and bytes' first and last 4 KiB: identifies a model's weights without
// reading the whole file (a thresholds file is refused for another model).
uint64_t model_fingerprint(const Model& model);

struct TealThresholds {
  uint64_t model_hash = 0;
  uint64_t text_hash = 0;  // FNV-1a of the calibration text's bytes
  std::string text_name;   // the calibration text's file name, for people
  float sparsity = 0;      // the target
  bool greedy = false;     // TEAL's block-wise greedy allocation (else uniform)
  int64_t tokens = 0;      // calibration tokens
  // [layer][input]: inputs in graph::SparseInput order (qkv, o, gate_up, down); |x| <= threshold is zeroed.
  std::vector<std::array<float, 4>> thresholds;
  // [layer][input]: the sparsity each threshold gave on the calibration text.
  std::vector<std::array<float, 4>> sparsity_at;
};

void save_teal_thresholds(const TealThresholds& t, const std::string& path);
TealThresholds read_teal_thresholds(const std::string& path);
// The thresholds of `path` for `model`: Error (one sentence) when the file is unreadable, malformed or made for another
// model.
std::vector<std::array<float, 4>> load_teal_thresholds(const Model& model, const std::string& path);

struct CalibrateOptions {
  std::string text_path;  // the calibration text (UTF-8)
  float sparsity = 0.5f;  // target share of zeros of every input (uniform), or of the block's weights (greedy)
  bool greedy = false;
  int n_threads = 0;
  int64_t n_ctx = 512;         // tokens per chunk
  int64_t max_tokens = 16384;  // calibration tokens (the text's first ones)
  // Greedy (TEAL's block-wise allocation, docs/TEAL.md): the tokens whose block outputs measure each step's error
  // (the text's first ones, one chunk), and the model-wide sparsity (by each input's share of the block's weights)
  // one step adds: a step raises one input's sparsity by greedy_step / its share.
  int64_t greedy_tokens = 128;
  float greedy_step = 0.0125f;
  std::function<void(std::string_view)> progress;  // one line per step (stderr in the CLI); may be empty
};
TealThresholds calibrate(const Model& model, const CalibrateOptions& o);

}  // namespace tessera
