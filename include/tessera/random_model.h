// Public API: real-size synthetic models. A preset names an architecture's true hyperparameters (layers, widths,
// heads, vocabulary, rope); the weights are seeded random values in any dtype Tessera can quantize to, so speed can
// be measured at sizes no offline file offers, with no download.
//
//   tessera::Model m = tessera::make_random_model({.arch = "llama3-8b", .dtype = "q4_0"});
//
// The model is written as a GGUF file (with a placeholder vocabulary of byte tokens and "<tN>" pieces, so peers such
// as llama.cpp load it too) and then mapped; make_random_model unlinks the file right after mapping it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/model.h"

namespace tessera {

struct RandomModelOptions {
  std::string arch;   // a preset of random_model_archs()
  std::string dtype;  // matmul and embedding weights (norms stay f32); "": random_model_default_dtype(arch)
  uint64_t seed = 1;
  int64_t n_layers = 0;  // 0: the preset's; fewer layers make a quick, smaller stand-in
  std::string dir;       // where the temporary file goes; "": $TMPDIR, else /tmp
};

struct RandomModelPreset {
  std::string name;         // "llama3-8b"
  std::string description;  // "Meta Llama 3 8B"
  ModelSpec spec;           // the hyperparameters written to the file
};

// The Llama-shaped presets: llama3-8b, llama3.1-8b, llama3.2-1b, llama3.2-3b, llama2-7b, llama2-13b, mistral-7b,
// tinyllama-1.1b, smollm2-135m, smollm2-360m, smollm2-1.7b, and the ternary families' shapes as Llamas:
// bitnet-2b4t-llama, mmfreelm-370m-llama.
const std::vector<RandomModelPreset>& random_model_presets();
// The MatMul-free LM's released shapes (architecture "hgrn_bit", src/models/hgrn_bit.h): mmfreelm-370m,
// mmfreelm-1.3b, mmfreelm-2.7b, written in its own graph's tensor layout with ternary weights (every linear and
// lm_head ternary times one scale, the embedding float, random forget-gate lower bounds), as the engine runs the
// checkpoints. They hold ternary values exactly only in tq2_0 (default), tq1_0, bf16, f16 and f32; other dtypes are
// refused. Not Llama-shaped: the Llama graph builders of the presets above do not take them.
const std::vector<RandomModelPreset>& random_model_hgrn_bit_presets();
// Every preset name write_random_model takes: random_model_presets(), then random_model_hgrn_bit_presets().
std::vector<std::string> random_model_archs();
// The dtype a preset is built in when none is asked for: q4_0, and tq2_0 for the MatMul-free LM.
std::string random_model_default_dtype(const std::string& arch);

// Writes the synthetic model to `path` (GGUF). Error naming the preset, dtype or path at fault.
void write_random_model(const RandomModelOptions& options, const std::string& path);
// Writes it to a temporary file, loads it (tokenizer off unless asked) and deletes the file (the mapping stays valid).
Model make_random_model(const RandomModelOptions& options,
                        const ModelOptions& model_options = {.load_tokenizer = false});

}  // namespace tessera
