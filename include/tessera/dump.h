// The TEAL workload dump (tessera dump, docs/TEAL.md): for chosen block matmuls of a model decoding a prompt, each
// matmul's input as the matmul reads it (after TEAL's sparsification) and its output, per decoded token, as .npy files
// with a manifest.json labelling them (layer, block, type, shape, token positions, threshold, achieved sparsity) and
// the weight as a reference into the model file (name, dtype, shape, offset) or, with `weights`, dequantized.
// python/load_dump.py reads a dump and reproduces every output from its input and weight.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/model.h"

namespace tessera {

struct DumpOptions {
  std::string prompt;       // text, tokenized as `run` does (BOS as the model asks, control tokens parsed)
  std::string out_dir;      // created if missing
  float sparsity = 0;       // TEAL top-k per token (SessionOptions::sparsity); 0 and no teal: the dense workload
  std::string teal;         // a `tessera calibrate` thresholds file instead
  int64_t layer_first = 0;  // inclusive
  int64_t layer_last = -1;  // inclusive; -1: the last layer
  std::vector<std::string> ops = {"q", "k", "v", "o", "gate", "up", "down"};
  int64_t tokens = 4;    // decode steps dumped (greedy continuation; the prompt's last token is the first step)
  bool weights = false;  // write the dequantized f32 weights too (else a reference into the model file)
  uint64_t max_bytes = uint64_t{1} << 30;  // refuse a dump estimated larger than this
  int n_threads = 0;
  bool reference = false;                          // the f32 reference path (exact to reproduce in float64)
  std::function<void(std::string_view)> progress;  // one line per step (stderr in the CLI); may be empty
};

struct DumpResult {
  uint64_t bytes = 0;              // written, manifest included (the estimate before writing, to within the manifest)
  int64_t files = 0;               // .npy files written
  int64_t matmuls = 0;             // (layer, op) entries in the manifest
  std::vector<int32_t> generated;  // the tokens decoded after the prompt's last one
  double achieved_sparsity = 0;    // zeros / entries over the dumped inputs
};

// Bytes the dump of `o` would write (its .npy files), for `model`: what dump_workload checks against max_bytes.
uint64_t estimate_dump_bytes(const Model& model, const DumpOptions& o);
// Error (one sentence) on a bad option, an estimate over max_bytes (nothing written then) or a failed write.
DumpResult dump_workload(const Model& model, const DumpOptions& o);

}  // namespace tessera
