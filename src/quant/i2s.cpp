// bitnet.cpp's I2_S read and converted (i2s.h).
#include "quant/i2s.h"

#include <cstring>

#include "core/error.h"
#include "quant/blocks.h"
#include "quant/half.h"

namespace tessera {

uint64_t i2s_bytes(int64_t numel) {
  TESSERA_CHECK(numel > 0 && numel % kI2SBlock == 0, "i2_s: {} elements are not a whole number of blocks of 128",
                numel);
  return static_cast<uint64_t>(numel) / 4 + 32;
}

int i2s_code(const uint8_t* data, int64_t i) {
  const int64_t j = i % kI2SBlock;
  return (data[i / kI2SBlock * 32 + j % 32] >> (6 - 2 * (j / 32))) & 3;
}

float i2s_scale(const uint8_t* data, int64_t numel) {
  float s;
  std::memcpy(&s, data + numel / 4, sizeof(s));
  return s;
}

void i2s_dequantize(const uint8_t* data, int64_t numel, float* out) {
  const float s = i2s_scale(data, numel);
  for (int64_t i = 0; i < numel; ++i) out[i] = static_cast<float>(i2s_code(data, i) - 1) * s;
}

DType i2s_convert(const uint8_t* data, int64_t n, int64_t k, std::vector<uint8_t>& out) {
  TESSERA_CHECK(n > 0 && k > 0 && k % kI2SBlock == 0, "i2_s: rows of {} elements are not whole blocks of 128", k);
  const int64_t numel = n * k;
  const float s = i2s_scale(data, numel);
  const uint16_t d = f32_to_fp16(s);
  if (k % kQKK != 0 || fp16_to_f32(d) != s) {
    out.resize(static_cast<size_t>(numel) * sizeof(float));
    i2s_dequantize(data, numel, reinterpret_cast<float*>(out.data()));
    return DType::F32;
  }
  // A TQ2_0 half block of 128 is an I2_S block with each byte's four 2-bit fields in the opposite order (element
  // p + 32 i sits in bits 2 i there, in bits 6 - 2 i here), and rows are whole blocks of both.
  uint8_t reverse[256];
  for (int b = 0; b < 256; ++b)
    reverse[b] = static_cast<uint8_t>(((b >> 6) & 3) | (((b >> 4) & 3) << 2) | (((b >> 2) & 3) << 4) | ((b & 3) << 6));
  const int64_t blocks = numel / kQKK;
  out.resize(static_cast<size_t>(blocks) * sizeof(BlockTQ2_0));
  for (int64_t b = 0; b < blocks; ++b) {
    BlockTQ2_0 t;
    for (int i = 0; i < kQKK / 4; ++i) t.qs[i] = reverse[data[b * (kQKK / 4) + i]];
    t.d = d;
    std::memcpy(out.data() + b * sizeof(BlockTQ2_0), &t, sizeof(t));
  }
  return DType::TQ2_0;
}

}  // namespace tessera
