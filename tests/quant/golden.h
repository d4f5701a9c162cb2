// Access to tests/data/quant (written by python/make_quant_golden.py from gguf-py's numpy quantization) and the
// bit-exact comparisons the quant tests share.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace tessera::test {

// tests/data/quant/index.json, parsed once.
const nlohmann::json& quant_index();
// Bytes of tests/data/quant/<entry["file"]>, checked against entry["bytes"].
std::vector<uint8_t> quant_blob(const nlohmann::json& entry);
std::vector<float> quant_floats(const nlohmann::json& entry);
DType dtype_named(const std::string& name);

// Empty when `got` and `want` have the same bits everywhere, else a message naming the mismatch count and the first
// few mismatching indices with both values (as float and as bits).
std::string compare_float_bits(const float* got, const float* want, size_t n);

}  // namespace tessera::test
