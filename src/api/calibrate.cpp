// TEAL thresholds files and calibration (include/tessera/calibrate.h).
#include "tessera/calibrate.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>

#include "api/model_impl.h"
#include "core/error.h"
#include "tessera/graph.h"
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

namespace {

// The threshold zeroing at least share `s` of histogram `h`'s entries (the smallest bucket whose cumulative count
// reaches s of the total; its upper edge, so by at most one bucket, 2^-7 relative), and the share it zeroes there.
float threshold_at(const std::vector<uint64_t>& h, double s, float* achieved) {
  uint64_t total = 0;
  for (uint64_t v : h) total += v;
  if (s <= 0 || total == 0) {
    *achieved = 0;
    return 0.0f;  // |x| <= 0: exact zeros only
  }
  uint64_t seen = 0;
  size_t b = 0;
  while (b + 1 < h.size() && static_cast<double>(seen + h[b]) < s * static_cast<double>(total)) seen += h[b++];
  seen += h[b];
  const uint32_t bits = (static_cast<uint32_t>(b) << 16) | 0xFFFFu;
  float thr;
  std::memcpy(&thr, &bits, 4);
  *achieved = static_cast<float>(static_cast<double>(seen) / static_cast<double>(total));
  return thr;
}

int input_of_role(std::string_view role) {
  if (role == "attn_q" || role == "attn_k" || role == "attn_v") return 0;
  if (role == "attn_o") return 1;
  if (role == "ffn_gate" || role == "ffn_up") return 2;
  if (role == "ffn_down") return 3;
  return -1;
}

// TEAL's block-wise greedy allocation (FasterDecoding/TEAL, teal/greedyopt.py), with Tessera's four inputs (q|k|v
// share one threshold, as do gate|up: one SPARSIFY node each) in place of TEAL's seven projections. Every layer starts
// dense; each step tries raising each input's sparsity by greedy_step / (its share of the block's weights), so that
// every try adds the same model-wide (weight-weighted) sparsity, and keeps the try whose block output moved least
// from the dense block output (mean over tokens of the L2 distance), until the weighted sparsity reaches the target.
// As in TEAL each layer is judged on the dense model's input to it: one forward pass per try serves every layer at
// once, because a node tap applies the layer's trial thresholds to its SPARSIFY nodes and, after measuring the block
// output, puts the dense block output back into the residual stream before the next layer reads it. Returns the
// sparsity per [layer][input].
std::vector<std::array<double, 4>> greedy_allocation(const Model& model, const CalibrateOptions& o,
                                                     std::span<const int32_t> ids,
                                                     const std::map<int, std::vector<uint64_t>>& hist) {
  const int64_t layers = model.impl()->weights.config().n_layers;
  const int64_t t = std::min<int64_t>(o.greedy_tokens, static_cast<int64_t>(ids.size()));
  TESSERA_CHECK(t >= 2, "greedy calibration needs at least 2 tokens");
  SessionOptions so;
  so.n_ctx = t;
  so.n_batch = t;
  so.n_threads = o.n_threads;
  so.sparsity = 1e-7f;  // SPARSIFY nodes that zero nothing: the tap applies the trial thresholds
  so.sparsify_prefill = true;
  Session s(model, so);
  const GraphView g = s.graph(t, 0);
  // Per node: {layer, input} of a SPARSIFY node, or {layer, 4} for a block's last node (its output: the residual).
  std::map<int, std::pair<int, int>> role_of;
  std::vector<int> block_out(static_cast<size_t>(layers), -1);
  std::array<double, 4> params = {0, 0, 0, 0};  // weights per input in layer 0: their shares
  int64_t width = 0;                            // the residual's [T, E] row width
  for (const GraphNode& n : g.nodes()) {
    if (n.layer < 0 || n.layer >= layers) continue;
    block_out[static_cast<size_t>(n.layer)] = n.id;
    if (n.op == "sparsify") role_of[n.id] = {n.layer, input_of_role(n.role)};
    if (n.op_class == "matmul" && n.layer == 0 && input_of_role(n.role) >= 0 && n.input_shapes.size() >= 2)
      params[static_cast<size_t>(input_of_role(n.role))] +=
          static_cast<double>(n.input_shapes[1][0]) * static_cast<double>(n.input_shapes[1][1]);
  }
  for (int64_t l = 0; l < layers; ++l) {
    const int id = block_out[static_cast<size_t>(l)];
    TESSERA_CHECK(id >= 0 && g.nodes()[static_cast<size_t>(id)].shape.size() == 2,
                  "greedy calibration: layer {} has no block output", l);
    role_of[id] = {static_cast<int>(l), 4};
    width = g.nodes()[static_cast<size_t>(id)].shape[1];
  }
  double total = 0;
  for (double p : params) total += p;
  TESSERA_CHECK(total > 0 && params[0] > 0 && params[1] > 0 && params[2] > 0 && params[3] > 0,
                "greedy calibration: the blocks lack one of the q|k|v, o, gate|up and down matmuls");
  std::array<double, 4> step{};
  for (size_t p = 0; p < 4; ++p) step[p] = o.greedy_step * total / params[p];

  std::vector<std::vector<float>> dense(static_cast<size_t>(layers));  // [layer][T * E]
  std::vector<std::array<float, 4>> thr(static_cast<size_t>(layers));  // the pass's thresholds; < 0: none
  std::vector<double> err(static_cast<size_t>(layers));
  bool record = true;
  s.set_node_tap([&](const Session::NodeTapEvent& e) {
    auto it = role_of.find(e.node);
    if (it == role_of.end() || e.rows != t) return;
    const auto [l, in] = it->second;
    const auto lz = static_cast<size_t>(l);
    if (in < 4) {
      const float th = record ? -1.0f : thr[lz][static_cast<size_t>(in)];
      if (th < 0) return;
      const int64_t k = g.nodes()[static_cast<size_t>(e.node)].shape[1];
      for (int64_t i = 0; i < t * k; ++i)
        if (std::fabs(e.input[i]) <= th) e.output[i] = 0.0f;
      return;
    }
    std::vector<float>& d = dense[lz];
    if (record) {
      d.assign(e.output, e.output + t * width);
      return;
    }
    double sum = 0;
    for (int64_t r = 0; r < t; ++r) {
      double sq = 0;
      for (int64_t c = 0; c < width; ++c) {
        const double v = static_cast<double>(e.output[r * width + c]) - d[static_cast<size_t>(r * width + c)];
        sq += v * v;
      }
      sum += std::sqrt(sq);
    }
    err[lz] = sum / static_cast<double>(t);
    std::copy(d.begin(), d.end(), e.output);  // the next layer reads the dense residual
  });
  const std::span<const int32_t> chunk = ids.first(static_cast<size_t>(t));
  s.eval(chunk);
  record = false;

  std::vector<std::array<double, 4>> cur(static_cast<size_t>(layers), {0, 0, 0, 0});
  const auto weighted = [&](const std::array<double, 4>& a) {
    double f = 0;
    for (size_t p = 0; p < 4; ++p) f += a[p] * params[p];
    return f / total;
  };
  const int steps = static_cast<int>(std::ceil(o.sparsity / o.greedy_step - 1e-6));
  for (int it = 0; it < steps; ++it) {
    std::vector<std::array<double, 4>> tried(static_cast<size_t>(layers));  // [layer][input]: the error of each try
    for (size_t p = 0; p < 4; ++p) {
      for (int64_t l = 0; l < layers; ++l) {
        const auto lz = static_cast<size_t>(l);
        for (size_t q = 0; q < 4; ++q) {
          const double sp = cur[lz][q] + (q == p ? step[q] : 0.0);
          float achieved;
          thr[lz][q] =
              sp <= 0 ? -1.0f : threshold_at(hist.at(static_cast<int>(l * 4 + q)), std::min(sp, 1.0), &achieved);
        }
        err[lz] = INFINITY;
      }
      s.reset();
      s.eval(chunk);
      for (int64_t l = 0; l < layers; ++l) {
        const auto lz = static_cast<size_t>(l);
        // An input already at 99% sparsity cannot take another step.
        tried[lz][p] = cur[lz][p] + step[p] > 0.99 ? INFINITY : err[lz];
      }
    }
    double mean_err = 0;
    for (int64_t l = 0; l < layers; ++l) {
      const auto lz = static_cast<size_t>(l);
      const size_t best = static_cast<size_t>(std::min_element(tried[lz].begin(), tried[lz].end()) - tried[lz].begin());
      TESSERA_CHECK(std::isfinite(tried[lz][best]), "greedy calibration: layer {} cannot get sparser", l);
      cur[lz][best] += step[best];
      mean_err += tried[lz][best] / static_cast<double>(layers);
    }
    if (o.progress)
      o.progress(
          fmt::format("calibrate: greedy step {}/{}: weighted sparsity {:.1f}%, mean block-output error {:.4g}; "
                      "layer 0 q|k|v {:.0f}% o {:.0f}% gate|up {:.0f}% down {:.0f}%",
                      it + 1, steps, 100 * weighted(cur[0]), mean_err, 100 * cur[0][0], 100 * cur[0][1],
                      100 * cur[0][2], 100 * cur[0][3]));
  }
  // TEAL's baseline: every input at the target (uniform), judged the same way, for the progress line.
  for (int64_t l = 0; l < layers; ++l)
    for (size_t q = 0; q < 4; ++q) {
      float achieved;
      thr[static_cast<size_t>(l)][q] =
          threshold_at(hist.at(static_cast<int>(l * 4 + static_cast<int64_t>(q))), o.sparsity, &achieved);
    }
  s.reset();
  s.eval(chunk);
  double uniform_err = 0;
  for (double e : err) uniform_err += e / static_cast<double>(layers);
  if (o.progress)
    o.progress(fmt::format("calibrate: uniform at {:g}% on the same tokens: mean block-output error {:.4g}",
                           100 * o.sparsity, uniform_err));
  s.set_node_tap({});
  return cur;
}

}  // namespace

TealThresholds calibrate(const Model& model, const CalibrateOptions& o) {
  TESSERA_CHECK(o.sparsity > 0 && o.sparsity < 1, "sparsity {} must be above 0 and below 1", o.sparsity);
  TESSERA_CHECK(o.n_ctx >= 2 && o.max_tokens >= o.n_ctx, "calibration needs at least one chunk of {} tokens", o.n_ctx);
  TESSERA_CHECK(!o.greedy || (o.greedy_step > 0 && o.greedy_step <= o.sparsity),
                "--greedy-step {} must be above 0 and at most the sparsity", o.greedy_step);
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
  t.greedy = o.greedy;
  const std::vector<int32_t> ids = model.tokenizer().encode(text, /*add_special=*/true, /*parse_special=*/false);
  const int64_t chunks = std::min<int64_t>(static_cast<int64_t>(ids.size()), o.max_tokens) / o.n_ctx;
  TESSERA_CHECK(chunks > 0, "the calibration text has {} tokens, fewer than one chunk of {}", ids.size(), o.n_ctx);
  // A sparsity below 1/K zeroes nothing: the model runs dense while its SPARSIFY nodes record their inputs. Every row
  // of a chunk records (sparsify_prefill), which is what decode would see at those positions.
  std::map<int, std::vector<uint64_t>> hist;
  {
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
    hist = s.take_activation_histograms();
  }
  t.tokens = chunks * o.n_ctx;
  const int64_t layers = model.impl()->weights.config().n_layers;
  for (int64_t l = 0; l < layers; ++l)
    for (int in = 0; in < 4; ++in)
      TESSERA_CHECK(hist.count(static_cast<int>(l * 4 + in)), "calibrate: layer {} input {} recorded nothing", l, in);
  // Uniform: every input at the target. Greedy: TEAL's block-wise allocation.
  const std::vector<std::array<double, 4>> alloc =
      o.greedy ? greedy_allocation(model, o, ids, hist)
               : std::vector<std::array<double, 4>>(static_cast<size_t>(layers),
                                                    {o.sparsity, o.sparsity, o.sparsity, o.sparsity});
  t.thresholds.assign(static_cast<size_t>(layers), {0, 0, 0, 0});
  t.sparsity_at.assign(static_cast<size_t>(layers), {0, 0, 0, 0});
  for (int64_t l = 0; l < layers; ++l)
    for (size_t in = 0; in < 4; ++in) {
      const auto lz = static_cast<size_t>(l);
      t.thresholds[lz][in] = threshold_at(hist.at(static_cast<int>(l * 4 + static_cast<int64_t>(in))),
                                          std::min(alloc[lz][in], 1.0), &t.sparsity_at[lz][in]);
    }
  return t;
}

}  // namespace tessera
