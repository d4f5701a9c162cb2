// The ternary linears of BitNet-style checkpoints as TQ2_0 (ternary values times one fp16 scale per block of 256,
// which the CPU's native ternary kernels run) where rows are whole blocks of 256, else as plain float weights holding
// ternary times scale exactly (f32, or the scale's own 16-bit format when the product is ±scale). One function turns
// every stored form (ModelConfig::ternary: packed four per uint8 with a weight_scale, float with a multiplying scale,
// float to ternarize at load) into that.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "formats/tensor_view.h"
#include "models/config.h"

namespace tessera {

// Rewrites the q, k, v, o, gate, up and down weights (and the MLGRU's i, f, g; output.weight when
// ModelConfig::ternary_output) of every block in `tensors` (GGUF names, blk.N.*.weight) as
// ModelConfig::ternary says, as TQ2_0 where each block of 256 is 0 and ±one scale in fp16's range (one line on stderr
// names the first weight that stays float), and drops their scale tensors (blk.N.*.scale). New bytes are appended to
// `owned`, which must outlive the views. Error naming `path` and the tensor when a weight or scale is missing,
// mis-shaped or not ternary where it must be. A no-op for ternary == "none" (a scale tensor is then an error: its
// meaning is unknown).
void load_ternary_weights(const ModelConfig& c, const std::string& path, std::vector<TensorView>& tensors,
                          std::vector<std::shared_ptr<std::vector<uint8_t>>>& owned);

// Unpacks transformers' BitNet packing (integrations/bitnet.py pack_weights): packed[r, k] holds rows r, r + R,
// r + 2R, r + 3R (R = rows of packed) of the ternary matrix in bits 0-1, 2-3, 4-5, 6-7, each as value + 1.
// packed [R, K] -> out [4R, K] in {-1, 0, 1}; Error on the unused code 3.
void unpack_ternary_rows(const uint8_t* packed, int64_t rows, int64_t k, int8_t* out);

}  // namespace tessera
