// The TEAL workload dump (include/tessera/dump.h). The session's node tap (Session::set_node_tap) hands over each
// chosen matmul's input and output as the decode step computes them; rows stream into .npy files whose headers are
// written first (their shapes are known: one row per decoded token), so a dump never holds more than a row in memory.
#include "tessera/dump.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "api/model_impl.h"
#include "core/dtype.h"
#include "core/error.h"
#include "quant/quant.h"
#include "tessera/calibrate.h"
#include "tessera/graph.h"
#include "tessera/session.h"

namespace tessera {

namespace {

// The dump's op names, the graph roles they are, and the TEAL input each reads (calibrate.h's order).
struct OpName {
  const char* op;
  const char* role;
  const char* block;
  int input;  // 0 qkv, 1 o, 2 gate_up, 3 down
};
constexpr OpName kOps[] = {{"q", "attn_q", "attention", 0}, {"k", "attn_k", "attention", 0},
                           {"v", "attn_v", "attention", 0}, {"o", "attn_o", "attention", 1},
                           {"gate", "ffn_gate", "ffn", 2},  {"up", "ffn_up", "ffn", 2},
                           {"down", "ffn_down", "ffn", 3}};
constexpr const char* kInputNames[] = {"qkv", "o", "gate_up", "down"};

const OpName* op_by_role(std::string_view role) {
  for (const OpName& o : kOps)
    if (role == o.role) return &o;
  return nullptr;
}

// One selected matmul of the decode graph.
struct Target {
  int node = -1;
  const OpName* op = nullptr;
  int64_t layer = 0;
  int64_t n = 0, k = 0;     // weight [n, k]
  std::string input_name;   // the tensor it reads (shared by q|k|v and by gate|up)
  std::string weight_name;  // the weight tensor's graph name
};

std::vector<Target> select_targets(const GraphView& g, const DumpOptions& o, int64_t n_layers) {
  std::set<std::string> want(o.ops.begin(), o.ops.end());
  for (const std::string& s : want) {
    bool known = false;
    for (const OpName& k : kOps) known |= s == k.op;
    TESSERA_CHECK(known, "unknown op '{}' in --ops (the block matmuls are q, k, v, o, gate, up, down)", s);
  }
  TESSERA_CHECK(!want.empty(), "--ops names no matmul (the block matmuls are q, k, v, o, gate, up, down)");
  const int64_t last = o.layer_last < 0 ? n_layers - 1 : o.layer_last;
  TESSERA_CHECK(o.layer_first >= 0 && o.layer_first <= last && last < n_layers,
                "--layers {}-{} is outside the model's layers 0-{}", o.layer_first, last, n_layers - 1);
  std::vector<Target> out;
  for (const GraphNode& nd : g.nodes()) {
    if (nd.op_class != "matmul" || nd.layer < o.layer_first || nd.layer > last) continue;
    const OpName* op = op_by_role(nd.role);
    if (op == nullptr || !want.count(op->op)) continue;
    TESSERA_CHECK(nd.input_shapes.size() >= 2 && nd.input_shapes[1].size() == 2,
                  "dump: the matmul {} has no [N, K] weight", nd.name);
    out.push_back({nd.id, op, nd.layer, nd.input_shapes[1][0], nd.input_shapes[1][1], nd.inputs[0], nd.inputs[1]});
  }
  TESSERA_CHECK(!out.empty(), "no matmul of the model matches --layers and --ops");
  return out;
}

// .npy version 1.0, little-endian float32, C order; the header is padded so the data starts at a multiple of 64 bytes.
std::string npy_header(const std::vector<int64_t>& shape) {
  std::string dims;
  for (int64_t d : shape) dims += fmt::format("{}, ", d);
  if (shape.size() > 1) dims.resize(dims.size() - 1);  // (3,) for one dimension, (3, 4) for two
  std::string h = fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}), }}", dims);
  const size_t total = 10 + h.size() + 1;
  h.append((64 - total % 64) % 64, ' ');
  h.push_back('\n');
  std::string out = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
  out.push_back(static_cast<char>(h.size() & 0xff));
  out.push_back(static_cast<char>(h.size() >> 8));
  return out + h;
}

uint64_t npy_bytes(const std::vector<int64_t>& shape) {
  uint64_t n = 4;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return npy_header(shape).size() + n;
}

class NpyWriter {
 public:
  NpyWriter(const std::filesystem::path& path, const std::vector<int64_t>& shape) : path_(path.string()) {
    f_.open(path, std::ios::binary | std::ios::trunc);
    TESSERA_CHECK(f_.good(), "cannot create the dump file '{}'", path_);
    const std::string h = npy_header(shape);
    f_.write(h.data(), static_cast<std::streamsize>(h.size()));
  }
  void write(const float* p, int64_t n) {
    f_.write(reinterpret_cast<const char*>(p), static_cast<std::streamsize>(n * 4));
    TESSERA_CHECK(f_.good(), "writing the dump file '{}' failed (disk full?)", path_);
  }

 private:
  std::string path_;
  std::ofstream f_;
};

// "812 bytes", "9.7 MiB"
std::string human_bytes(uint64_t b) {
  if (b < 1024) return fmt::format("{} bytes", b);
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b) / 1024;
  int u = 0;
  while (v >= 1024 && u < 3) {
    v /= 1024;
    ++u;
  }
  return fmt::format("{:.1f} {}", v, units[u]);
}

void check_options(const DumpOptions& o) {
  TESSERA_CHECK(!o.out_dir.empty(), "give the dump's directory with -o DIR");
  TESSERA_CHECK(!o.prompt.empty(), "give the prompt with -p PROMPT");
  TESSERA_CHECK(o.tokens >= 1 && o.tokens <= 65536, "--tokens {} must be between 1 and 65536", o.tokens);
  TESSERA_CHECK(o.sparsity >= 0 && o.sparsity < 1, "--sparsity {} must be at least 0 and below 1", o.sparsity);
  TESSERA_CHECK(o.sparsity == 0 || o.teal.empty(), "give --sparsity or --teal, not both");
}

}  // namespace

uint64_t estimate_dump_bytes(const Model& model, const DumpOptions& o) {
  check_options(o);
  const GraphView g = build_graph(model, 1);
  const std::vector<Target> targets = select_targets(g, o, model.impl()->weights.config().n_layers);
  uint64_t bytes = 0;
  std::set<std::string> inputs;
  for (const Target& t : targets) {
    if (inputs.insert(t.input_name).second) bytes += npy_bytes({o.tokens, t.k});
    bytes += npy_bytes({o.tokens, t.n});
    if (o.weights) bytes += npy_bytes({t.n, t.k});
  }
  return bytes;
}

DumpResult dump_workload(const Model& model, const DumpOptions& o) {
  TESSERA_CHECK(model.loaded(), "no model is loaded");
  const uint64_t estimate = estimate_dump_bytes(model, o);  // checks the options too
  TESSERA_CHECK(estimate <= o.max_bytes,
                "the dump would write {}, more than --max-bytes {} (choose fewer --layers, --ops or --tokens, or raise "
                "--max-bytes)",
                human_bytes(estimate), human_bytes(o.max_bytes));
  const ModelWeights& w = model.impl()->weights;
  const std::vector<int32_t> ids = model.tokenizer().encode(o.prompt, /*add_special=*/true, /*parse_special=*/true);
  TESSERA_CHECK(!ids.empty(), "the prompt has no tokens");
  std::vector<std::array<float, 4>> thresholds;
  if (!o.teal.empty()) thresholds = load_teal_thresholds(model, o.teal);

  SessionOptions so;
  so.n_ctx = static_cast<int64_t>(ids.size()) + o.tokens;
  so.n_threads = o.n_threads;
  so.reference = o.reference;
  so.sparsity = o.sparsity;
  so.teal = o.teal;
  Session s(model, so);
  // The prompt but its last token is prefill (dense, as TEAL runs it); every dumped row is a one-token decode step.
  if (ids.size() > 1) s.eval(std::span<const int32_t>(ids.data(), ids.size() - 1));
  const GraphView g = s.graph(1, s.n_past());
  const std::vector<Target> targets = select_targets(g, o, w.config().n_layers);

  const std::filesystem::path dir(o.out_dir);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  TESSERA_CHECK(!ec && std::filesystem::is_directory(dir), "cannot create the dump directory '{}'", o.out_dir);

  DumpResult r;
  // One input file per distinct input (q, k and v read one tensor; so do gate and up), one output file per matmul.
  std::map<std::string, std::unique_ptr<NpyWriter>> in_files;
  std::map<std::string, std::string> in_file_name;
  std::map<std::string, std::vector<double>> in_sparsity, in_cut;  // per input, per token
  std::vector<std::unique_ptr<NpyWriter>> out_files;
  std::map<int, size_t> target_of_node;
  for (size_t i = 0; i < targets.size(); ++i) {
    const Target& t = targets[i];
    target_of_node[t.node] = i;
    if (!in_files.count(t.input_name)) {
      const std::string name = fmt::format("blk.{}.{}.x.npy", t.layer, kInputNames[t.op->input]);
      in_files[t.input_name] = std::make_unique<NpyWriter>(dir / name, std::vector<int64_t>{o.tokens, t.k});
      in_file_name[t.input_name] = name;
      ++r.files;
    }
    out_files.push_back(std::make_unique<NpyWriter>(dir / fmt::format("blk.{}.{}.y.npy", t.layer, t.op->op),
                                                    std::vector<int64_t>{o.tokens, t.n}));
    ++r.files;
  }
  std::set<std::string> written_this_step;
  uint64_t zeros = 0, entries = 0;
  s.set_node_tap([&](const Session::NodeTapEvent& e) {
    auto it = target_of_node.find(e.node);
    if (e.rows != 1 || it == target_of_node.end()) return;
    const Target& t = targets[it->second];
    out_files[it->second]->write(e.output, t.n);
    if (written_this_step.insert(t.input_name).second) {
      in_files[t.input_name]->write(e.input, t.k);
      int64_t z = 0;
      float cut = INFINITY;  // the smallest magnitude kept: every zeroed entry is at most this
      for (int64_t c = 0; c < t.k; ++c) {
        z += e.input[c] == 0.0f;
        if (e.input[c] != 0.0f) cut = std::min(cut, std::fabs(e.input[c]));
      }
      zeros += static_cast<uint64_t>(z);
      entries += static_cast<uint64_t>(t.k);
      in_sparsity[t.input_name].push_back(static_cast<double>(z) / static_cast<double>(t.k));
      in_cut[t.input_name].push_back(std::isfinite(cut) ? cut : 0.0);
    }
  });
  std::vector<int64_t> positions;
  int32_t token = ids.back();
  for (int64_t step = 0; step < o.tokens; ++step) {
    written_this_step.clear();
    positions.push_back(s.n_past());
    const std::span<const float> logits = s.decode(token);
    token = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    r.generated.push_back(token);
    if (o.progress) o.progress(fmt::format("dump: token {}/{} at position {}", step + 1, o.tokens, positions.back()));
  }
  s.set_node_tap({});
  r.achieved_sparsity = entries ? static_cast<double>(zeros) / static_cast<double>(entries) : 0.0;

  nlohmann::json m;
  m["format"] = "tessera-dump-1";
  m["model"] = w.path();
  m["model_format"] = w.format();
  m["prompt_tokens"] = ids;
  m["generated_tokens"] = r.generated;
  m["positions"] = positions;
  m["sparsity"] = o.sparsity;
  m["teal"] = o.teal;
  m["rule"] = !o.teal.empty() ? "threshold" : o.sparsity > 0 ? "top-k" : "dense";
  m["reference_path"] = o.reference;
  m["convention"] = "y[t] = x[t] @ W.T; x [tokens, K] (after sparsification), W [N, K], y [tokens, N]; float32";
  m["achieved_sparsity"] = r.achieved_sparsity;
  nlohmann::json list = nlohmann::json::array();
  for (size_t i = 0; i < targets.size(); ++i) {
    const Target& t = targets[i];
    nlohmann::json e;
    e["layer"] = t.layer;
    e["block"] = t.op->block;
    e["type"] = t.op->op;
    e["input"] = kInputNames[t.op->input];
    e["x"] = in_file_name[t.input_name];
    e["y"] = fmt::format("blk.{}.{}.y.npy", t.layer, t.op->op);
    e["x_shape"] = {o.tokens, t.k};
    e["y_shape"] = {o.tokens, t.n};
    e["dtype"] = "float32";
    e["positions"] = positions;
    if (!thresholds.empty())
      e["threshold"] = thresholds[static_cast<size_t>(t.layer)][static_cast<size_t>(t.op->input)];
    else
      e["threshold"] = nullptr;
    if (o.sparsity > 0) e["kept"] = t.k - static_cast<int64_t>(std::floor(static_cast<double>(o.sparsity) * t.k));
    e["min_kept_magnitude"] = in_cut[t.input_name];
    e["achieved_sparsity"] = in_sparsity[t.input_name];
    const TensorView* tv = w.find(t.weight_name);
    nlohmann::json wj;
    wj["name"] = t.weight_name;
    wj["shape"] = {t.n, t.k};
    if (tv != nullptr) {
      wj["dtype"] = std::string(dtype_name(tv->dtype));
      wj["file"] = w.path();
      wj["offset"] = tv->offset;
      wj["nbytes"] = tv->nbytes;
    }
    if (o.weights) {
      TESSERA_CHECK(tv != nullptr && tv->data != nullptr, "dump: the weight {} is not in the model file",
                    t.weight_name);
      const std::string name = fmt::format("blk.{}.{}.w.npy", t.layer, t.op->op);
      NpyWriter wf(dir / name, {t.n, t.k});
      const uint64_t row_bytes = dtype_row_bytes(tv->dtype, static_cast<uint64_t>(t.k)).value_or(0);
      std::vector<float> row(static_cast<size_t>(t.k));  // [K]
      for (int64_t n = 0; n < t.n; ++n) {
        dequantize_row(tv->dtype, tv->data + static_cast<uint64_t>(n) * row_bytes, row.data(), t.k);
        wf.write(row.data(), t.k);
      }
      wj["weight_file"] = name;
      ++r.files;
    }
    e["weight"] = wj;
    list.push_back(e);
  }
  m["matmuls"] = list;
  r.matmuls = static_cast<int64_t>(targets.size());
  const std::string manifest = m.dump(1) + "\n";
  std::ofstream mf(dir / "manifest.json", std::ios::trunc);
  mf << manifest;
  TESSERA_CHECK(mf.good(), "cannot write '{}'", (dir / "manifest.json").string());
  r.bytes = estimate + manifest.size();
  return r;
}

}  // namespace tessera
