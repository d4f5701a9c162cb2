// Helpers shared by the GGUF reader, writer and value code (not part of the formats API).
#pragma once

#include <bit>
#include <cstdint>
#include <string>
#include <string_view>

#include "formats/gguf.h"

namespace tessera::gguf::detail {

// The file format is little-endian and we read it with memcpy; a big-endian host would need byte swaps everywhere.
static_assert(std::endian::native == std::endian::little, "GGUF reading assumes a little-endian host");

inline constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32

inline bool is_known_value_type(uint32_t t) { return t <= static_cast<uint32_t>(ValueType::FLOAT64); }
inline bool is_power_of_two(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// Strict UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF.
bool is_valid_utf8(std::string_view s);
// A name as it may appear inside a one-line error message: control bytes and invalid UTF-8 escaped as \xNN,
// shortened to about 80 bytes.
std::string printable(std::string_view s);

}  // namespace tessera::gguf::detail
