#include "golden.h"

#include <fmt/core.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "quant/half.h"
#include "test_util.h"

namespace tessera::test {

const nlohmann::json& quant_index() {
  static const nlohmann::json index = [] {
    std::ifstream f(data_path("quant/index.json"));
    if (!f) throw std::runtime_error("tests/data/quant/index.json missing (python/make_quant_golden.py writes it)");
    return nlohmann::json::parse(f);
  }();
  return index;
}

std::vector<uint8_t> quant_blob(const nlohmann::json& entry) {
  const std::string name = entry.at("file").get<std::string>();
  std::ifstream f(data_path("quant/" + name), std::ios::binary);
  if (!f) throw std::runtime_error("tests/data/quant/" + name + " missing");
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (bytes.size() != entry.at("bytes").get<size_t>())
    throw std::runtime_error(fmt::format("tests/data/quant/{} has {} bytes, index.json says {}", name, bytes.size(),
                                         entry.at("bytes").get<size_t>()));
  return bytes;
}

std::vector<float> quant_floats(const nlohmann::json& entry) {
  const std::vector<uint8_t> bytes = quant_blob(entry);
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

DType dtype_named(const std::string& name) {
  const auto t = dtype_from_name(name);
  if (!t) throw std::runtime_error("unknown dtype '" + name + "' in tests/data/quant/index.json");
  return *t;
}

std::string compare_float_bits(const float* got, const float* want, size_t n) {
  size_t bad = 0;
  std::string first;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t g = f32_bits(got[i]), w = f32_bits(want[i]);
    if (g == w) continue;
    if (++bad <= 8)
      first += fmt::format("\n  [{}] (block of 32: {}, of 256: {}) got {:.9g} (0x{:08x}) want {:.9g} (0x{:08x})", i,
                           i / 32, i / 256, got[i], g, want[i], w);
  }
  if (bad == 0) return "";
  return fmt::format("{} of {} values differ{}", bad, n, first);
}

}  // namespace tessera::test
