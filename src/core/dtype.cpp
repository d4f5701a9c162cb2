#include "core/dtype.h"

#include <array>
#include <cctype>
#include <string>

#include "core/error.h"

namespace tessera {
namespace {

// Block sizes and bytes per block as GGML defines them (QK_K = 256). Which of them Tessera can convert is quant's table.
constexpr DTypeInfo kTable[] = {
    {DType::F32, "f32", 1, 4, false},
    {DType::F16, "f16", 1, 2, false},
    {DType::Q4_0, "q4_0", 32, 18, true},
    {DType::Q4_1, "q4_1", 32, 20, true},
    {DType::Q5_0, "q5_0", 32, 22, true},
    {DType::Q5_1, "q5_1", 32, 24, true},
    {DType::Q8_0, "q8_0", 32, 34, true},
    {DType::Q8_1, "q8_1", 32, 36, true},
    {DType::Q2_K, "q2_k", 256, 84, true},
    {DType::Q3_K, "q3_k", 256, 110, true},
    {DType::Q4_K, "q4_k", 256, 144, true},
    {DType::Q5_K, "q5_k", 256, 176, true},
    {DType::Q6_K, "q6_k", 256, 210, true},
    {DType::Q8_K, "q8_k", 256, 292, true},
    {DType::IQ2_XXS, "iq2_xxs", 256, 66, true},
    {DType::IQ2_XS, "iq2_xs", 256, 74, true},
    {DType::IQ3_XXS, "iq3_xxs", 256, 98, true},
    {DType::IQ1_S, "iq1_s", 256, 50, true},
    {DType::IQ4_NL, "iq4_nl", 32, 18, true},
    {DType::IQ3_S, "iq3_s", 256, 110, true},
    {DType::IQ2_S, "iq2_s", 256, 82, true},
    {DType::IQ4_XS, "iq4_xs", 256, 136, true},
    {DType::I8, "i8", 1, 1, false},
    {DType::I16, "i16", 1, 2, false},
    {DType::I32, "i32", 1, 4, false},
    {DType::I64, "i64", 1, 8, false},
    {DType::F64, "f64", 1, 8, false},
    {DType::IQ1_M, "iq1_m", 256, 56, true},
    {DType::BF16, "bf16", 1, 2, false},
    {DType::TQ1_0, "tq1_0", 256, 54, true},
    {DType::TQ2_0, "tq2_0", 256, 66, true},
    {DType::MXFP4, "mxfp4", 32, 17, true},
};

}  // namespace

const DTypeInfo* dtype_info(uint32_t id) {
  for (const auto& e : kTable)
    if (static_cast<uint32_t>(e.type) == id) return &e;
  return nullptr;
}

const DTypeInfo& dtype_info(DType t) {
  const DTypeInfo* e = dtype_info(static_cast<uint32_t>(t));
  if (e == nullptr) fail("unknown dtype id {}", static_cast<uint32_t>(t));
  return *e;
}

std::string_view dtype_name(DType t) { return dtype_info(t).name; }

std::optional<DType> dtype_from_name(std::string_view name) {
  std::string low(name);
  for (auto& c : low) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const auto& e : kTable)
    if (e.name == low) return e.type;
  return std::nullopt;
}

std::optional<uint64_t> dtype_row_bytes(DType t, uint64_t n) {
  const DTypeInfo& e = dtype_info(t);
  if (n % e.block_size != 0) return std::nullopt;
  uint64_t blocks = n / e.block_size;
  if (blocks != 0 && e.type_size > UINT64_MAX / blocks) return std::nullopt;
  return blocks * e.type_size;
}

}  // namespace tessera
