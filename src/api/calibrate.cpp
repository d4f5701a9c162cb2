// TEAL thresholds files and calibration (include/tessera/calibrate.h).
#include "tessera/calibrate.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>

#include "api/model_impl.h"
#include "core/error.h"
#include "tessera/session.h"

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

TealThresholds calibrate(const Model& model, const CalibrateOptions& o) {
  TESSERA_CHECK(!o.greedy, "--greedy (TEAL's block-wise greedy allocation) is not implemented yet; calibrate uniform");
  TESSERA_CHECK(o.sparsity > 0 && o.sparsity < 1, "sparsity {} must be above 0 and below 1", o.sparsity);
  TESSERA_CHECK(o.n_ctx >= 2 && o.max_tokens >= o.n_ctx, "calibration needs at least one chunk of {} tokens", o.n_ctx);
  std::ifstream f(o.text_path, std::ios::binary);
  TESSERA_CHECK(f.good(), "cannot read the calibration text '{}'", o.text_path);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  TealThresholds t;
  t.model_hash = model_fingerprint(model);
  t.text_hash = kFnvOffset;
  fnv(t.text_hash, text.data(), text.size());
  t.text_name = o.text_path.substr(o.text_path.find_last_of('/') + 1);
  t.sparsity = o.sparsity;
  const std::vector<int32_t> ids = model.tokenizer().encode(text, /*add_special=*/true, /*parse_special=*/false);
  const int64_t chunks = std::min<int64_t>(static_cast<int64_t>(ids.size()), o.max_tokens) / o.n_ctx;
  TESSERA_CHECK(chunks > 0, "the calibration text has {} tokens, fewer than one chunk of {}", ids.size(), o.n_ctx);
  // A sparsity below 1/K zeroes nothing: the model runs dense while its SPARSIFY nodes record their inputs. Every row
  // of a chunk records (sparsify_prefill), which is what decode would see at those positions.
  SessionOptions so;
  so.n_ctx = o.n_ctx;
  so.n_batch = o.n_ctx;
  so.n_threads = o.n_threads;
  so.sparsity = 1e-7f;
  so.sparsify_prefill = true;
  Session s(model, so);
  s.record_activation_histograms(true);
  for (int64_t c = 0; c < chunks; ++c) {
    s.reset();
    s.eval(std::span<const int32_t>(ids.data() + c * o.n_ctx, static_cast<size_t>(o.n_ctx)));
    if (o.progress) o.progress(fmt::format("calibrate: chunk {}/{} ({} tokens)", c + 1, chunks, (c + 1) * o.n_ctx));
  }
  s.record_activation_histograms(false);
  const std::map<int, std::vector<uint64_t>> hist = s.take_activation_histograms();
  t.tokens = chunks * o.n_ctx;
  const int64_t layers = model.impl()->weights.config().n_layers;
  t.thresholds.assign(static_cast<size_t>(layers), {0, 0, 0, 0});
  t.sparsity_at.assign(static_cast<size_t>(layers), {0, 0, 0, 0});
  for (int64_t l = 0; l < layers; ++l) {
    for (int in = 0; in < 4; ++in) {
      auto it = hist.find(static_cast<int>(l * 4 + in));
      TESSERA_CHECK(it != hist.end(), "calibrate: layer {} input {} recorded nothing", l, in);
      const std::vector<uint64_t>& h = it->second;
      uint64_t total = 0;
      for (uint64_t v : h) total += v;
      // Uniform: the smallest bucket whose cumulative count reaches S of the total; the threshold is its upper edge,
      // so |x| <= threshold zeroes at least S of the calibration entries (by at most one bucket, 2^-7 relative).
      uint64_t seen = 0;
      size_t b = 0;
      while (b + 1 < h.size() && static_cast<double>(seen + h[b]) < o.sparsity * static_cast<double>(total))
        seen += h[b++];
      seen += h[b];
      const uint32_t bits = (static_cast<uint32_t>(b) << 16) | 0xFFFFu;
      float thr;
      std::memcpy(&thr, &bits, 4);
      t.thresholds[static_cast<size_t>(l)][static_cast<size_t>(in)] = thr;
      t.sparsity_at[static_cast<size_t>(l)][static_cast<size_t>(in)] =
          static_cast<float>(static_cast<double>(seen) / static_cast<double>(std::max<uint64_t>(total, 1)));
    }
  }
  return t;
}

}  // namespace tessera
