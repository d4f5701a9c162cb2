// bitnet.cpp's I2_S (microsoft/BitNet, ggml type id 36 in its ggml fork): how its GGUF files store a ternary matrix.
// Read only: the GGUF reader converts every I2_S tensor at load to a format Tessera runs (i2s_convert below).
//
// Layout (what bitnet.cpp's quantize_i2_s writes on x86, where its kernels read blocks of 128): the tensor's elements
// in row-major order, flat across rows, in blocks of 128; block b is 32 bytes at 32 b, and byte p of it holds elements
// p, p + 32, p + 64 and p + 96 of the block in bits 7:6, 5:4, 3:2 and 1:0. A code u is 0, 1 or 2 for w = -1, 0, +1
// (times the scale). After the numel / 4 code bytes comes ONE f32 scale for the whole tensor (the converter's
// max |w|), padded to 32 bytes: a tensor of numel elements takes numel / 4 + 32 bytes.
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace tessera {

inline constexpr uint32_t kGgmlTypeI2S = 36;  // bitnet.cpp's GGML_TYPE_I2_S (no DType: it is converted at load)
inline constexpr int64_t kI2SBlock = 128;

// Bytes of an I2_S tensor of `numel` elements (numel % 128 == 0).
uint64_t i2s_bytes(int64_t numel);
// The code (0..2 for -1, 0, +1; 3 never written) of flat element i, and the tensor's scale.
int i2s_code(const uint8_t* data, int64_t i);
float i2s_scale(const uint8_t* data, int64_t numel);
// All numel weights as floats: (code - 1) * scale.
void i2s_dequantize(const uint8_t* data, int64_t numel, float* out);

// Rewrites an I2_S matrix [n, k] exactly into a format the backends run: TQ2_0 (w = d (u - 1) per row block of 256,
// d = the scale in fp16) when k is a multiple of 256 and the scale is an fp16 value (as a bf16 checkpoint's scale is),
// else F32. A code 3 (never written) reads as +2 in all three formats. Returns the dtype; out holds its n rows.
DType i2s_convert(const uint8_t* data, int64_t n, int64_t k, std::vector<uint8_t>& out);

}  // namespace tessera
