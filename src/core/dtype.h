// Element types. Values equal GGML's type ids so a GGUF tensor's type field maps directly.
// Layout facts live here (core); the conversion functions of each format live in quant/quant.h, indexed the same way.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace tessera {

enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
};

struct DTypeInfo {
  DType type;
  std::string_view name;   // as GGUF tools print it: "f32", "q4_1", ...
  uint32_t block_size;     // elements per block (1 for plain types)
  uint32_t type_size;      // bytes per block
  bool is_quantized;
};

// Traits of a known dtype id, or nullopt for an id GGML never defined (a file naming it is rejected).
const DTypeInfo* dtype_info(uint32_t id);
const DTypeInfo& dtype_info(DType t);
std::string_view dtype_name(DType t);
// Parses "f32", "bf16", "q4_1", ... (case-insensitive).
std::optional<DType> dtype_from_name(std::string_view name);

// Bytes of a row of `n` elements; nullopt when n is not a multiple of the block size or the size overflows.
std::optional<uint64_t> dtype_row_bytes(DType t, uint64_t n);

}  // namespace tessera
