// TEAL thresholds files and calibration (include/tessera/calibrate.h).
#include "tessera/calibrate.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "api/model_impl.h"
#include "core/error.h"

namespace tessera {

namespace {

constexpr uint64_t kFnvOffset = 1469598103934665603ull, kFnvPrime = 1099511628211ull;
void fnv(uint64_t& h, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * kFnvPrime;
}

std::string hex(uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

uint64_t parse_hex(const std::string& s) { return std::stoull(s, nullptr, 16); }

}  // namespace

uint64_t model_fingerprint(const Model& model) {
  TESSERA_CHECK(model.loaded(), "no model is loaded");
  uint64_t h = kFnvOffset;
  for (const TensorView& t : model.impl()->weights.tensors()) {
    fnv(h, t.name.data(), t.name.size());
    const auto d = static_cast<uint32_t>(t.dtype);
    fnv(h, &d, sizeof d);
    for (int64_t s : t.shape) fnv(h, &s, sizeof s);
    const size_t n = static_cast<size_t>(std::min<uint64_t>(t.nbytes, 4096));
    if (t.data != nullptr) {
      fnv(h, t.data, n);
      fnv(h, t.data + (t.nbytes - n), n);
    }
  }
  return h;
}

void save_teal_thresholds(const TealThresholds& t, const std::string& path) {
  nlohmann::json j;
  j["format"] = "tessera-teal-1";
  j["model_hash"] = hex(t.model_hash);
  j["text_hash"] = hex(t.text_hash);
  j["text"] = t.text_name;
  j["sparsity"] = t.sparsity;
  j["method"] = t.greedy ? "greedy" : "uniform";
  j["tokens"] = t.tokens;
  j["inputs"] = {"qkv", "o", "gate_up", "down"};
  j["thresholds"] = t.thresholds;
  j["sparsity_at"] = t.sparsity_at;
  std::ofstream f(path);
  TESSERA_CHECK(f.good(), "cannot write the thresholds file '{}'", path);
  f << j.dump(1) << "\n";
  TESSERA_CHECK(f.good(), "cannot write the thresholds file '{}'", path);
}

TealThresholds read_teal_thresholds(const std::string& path) {
  std::ifstream f(path);
  TESSERA_CHECK(f.good(), "cannot read the thresholds file '{}'", path);
  TealThresholds t;
  try {
    const nlohmann::json j = nlohmann::json::parse(f);
    TESSERA_CHECK(j.at("format") == "tessera-teal-1", "'{}' is not a tessera calibrate thresholds file", path);
    t.model_hash = parse_hex(j.at("model_hash").get<std::string>());
    t.text_hash = parse_hex(j.at("text_hash").get<std::string>());
    t.text_name = j.value("text", "");
    t.sparsity = j.at("sparsity").get<float>();
    t.greedy = j.at("method") == "greedy";
    t.tokens = j.value("tokens", int64_t{0});
    t.thresholds = j.at("thresholds").get<std::vector<std::array<float, 4>>>();
    if (j.contains("sparsity_at")) t.sparsity_at = j.at("sparsity_at").get<std::vector<std::array<float, 4>>>();
  } catch (const nlohmann::json::exception& e) {
    fail("the thresholds file '{}' is malformed: {}", path, e.what());
  }
  return t;
}

std::vector<std::array<float, 4>> load_teal_thresholds(const Model& model, const std::string& path) {
  const TealThresholds t = read_teal_thresholds(path);
  TESSERA_CHECK(t.model_hash == model_fingerprint(model),
                "the thresholds file '{}' was calibrated for another model (hash {}, this model {})", path,
                hex(t.model_hash), hex(model_fingerprint(model)));
  TESSERA_CHECK(static_cast<int64_t>(t.thresholds.size()) == model.impl()->weights.config().n_layers,
                "the thresholds file '{}' has {} layers; the model has {}", path, t.thresholds.size(),
                model.impl()->weights.config().n_layers);
  return t.thresholds;
}

}  // namespace tessera
