// tessera inspect: format, hyperparameters, tokenizer, tensor table and totals of a model file.
#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>
#include <string_view>

#include "command.h"
#include "tessera/model_info.h"

namespace tessera::cli {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Names compared with their digit runs as numbers: blk.2 before blk.10, as a reader counts layers.
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const bool da = std::isdigit(static_cast<unsigned char>(a[i])) != 0;
    const bool db = std::isdigit(static_cast<unsigned char>(b[j])) != 0;
    if (da && db) {
      size_t ie = i, je = j;
      while (ie < a.size() && std::isdigit(static_cast<unsigned char>(a[ie]))) ++ie;
      while (je < b.size() && std::isdigit(static_cast<unsigned char>(b[je]))) ++je;
      const std::string_view na = std::string_view(a).substr(i, ie - i), nb = std::string_view(b).substr(j, je - j);
      const size_t za = na.find_first_not_of('0'), zb = nb.find_first_not_of('0');
      const std::string_view ta = za == std::string_view::npos ? "" : na.substr(za);
      const std::string_view tb = zb == std::string_view::npos ? "" : nb.substr(zb);
      if (ta.size() != tb.size()) return ta.size() < tb.size();
      if (ta != tb) return ta < tb;
      i = ie, j = je;
      continue;
    }
    if (a[i] != b[j]) return a[i] < b[j];
    ++i, ++j;
  }
  return a.size() - i < b.size() - j;
}

std::string human_bytes(uint64_t b) {
  if (b >= (1ull << 30)) return fmt::format("{:.2f} GiB", b / double(1ull << 30));
  if (b >= (1ull << 20)) return fmt::format("{:.2f} MiB", b / double(1ull << 20));
  if (b >= (1ull << 10)) return fmt::format("{:.2f} KiB", b / double(1ull << 10));
  return fmt::format("{} B", b);
}

nlohmann::json to_json(const ModelInfo& m) {
  nlohmann::json j;
  j["path"] = m.path;
  j["format"] = m.format;
  j["format_version"] = m.format_version;
  j["architecture"] = m.architecture;
  j["name"] = m.name;
  j["n_layers"] = m.n_layers;
  j["n_embd"] = m.n_embd;
  j["n_head"] = m.n_head;
  j["n_head_kv"] = m.n_head_kv;
  j["head_dim"] = m.head_dim;
  j["n_ff"] = m.n_ff;
  j["n_vocab"] = m.n_vocab;
  j["n_ctx_train"] = m.n_ctx_train;
  j["rope_base"] = m.rope_base;
  j["rope_scaling"] = {{"type", m.rope_scaling}, {"factor", m.rope_scaling_factor}};
  j["norm_eps"] = m.norm_eps;
  j["tied_output"] = m.tied_output;
  j["tokenizer"] = {{"kind", m.tokenizer_kind}, {"n_vocab", m.tokenizer_vocab}};
  j["has_chat_template"] = m.has_chat_template;
  j["n_params"] = m.n_params;
  j["n_bytes"] = m.n_bytes;
  j["bytes_by_dtype"] = m.bytes_by_dtype;
  j["params_by_dtype"] = m.params_by_dtype;
  nlohmann::json meta = nlohmann::json::object();
  for (const auto& [k, v] : m.metadata) meta[k] = v;
  j["metadata"] = meta;
  nlohmann::json ts = nlohmann::json::array();
  for (const auto& t : m.tensors)
    ts.push_back({{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape}, {"bytes", t.bytes}});
  j["tensors"] = ts;
  return j;
}

void print_text(const ModelInfo& m, bool show_metadata) {
  fmt::print("file          {}\n", m.path);
  fmt::print("format        {}{}\n", m.format, m.format_version ? fmt::format(" v{}", m.format_version) : "");
  fmt::print("architecture  {}{}\n", m.architecture, m.name.empty() ? "" : " (" + m.name + ")");
  fmt::print("layers        {}\n", m.n_layers);
  fmt::print("width         {}\n", m.n_embd);
  fmt::print("heads         {} (kv {}, head dim {})\n", m.n_head, m.n_head_kv, m.head_dim);
  fmt::print("ffn width     {}\n", m.n_ff);
  fmt::print("vocab         {}\n", m.n_vocab);
  fmt::print("context       {}\n", m.n_ctx_train);
  fmt::print("rope          base {:g}, scaling {}{}\n", m.rope_base, m.rope_scaling,
             m.rope_scaling == "none" ? "" : fmt::format(" x{:g}", m.rope_scaling_factor));
  fmt::print("norm eps      {:g}\n", m.norm_eps);
  fmt::print("output        {}\n", m.tied_output ? "tied to token embedding" : "separate matrix");
  fmt::print("tokenizer     {} ({} tokens), chat template {}\n", m.tokenizer_kind, m.tokenizer_vocab,
             m.has_chat_template ? "present" : "absent");
  if (show_metadata) {
    fmt::print("\nmetadata ({} keys)\n", m.metadata.size());
    for (const auto& [k, v] : m.metadata) fmt::print("  {:<44} {}\n", k, v);
  }
  fmt::print("\ntensors ({})\n", m.tensors.size());
  size_t w = 4;  // Hugging Face names run longer than GGUF's: size the column to the longest
  for (const auto& t : m.tensors) w = std::max(w, t.name.size());
  fmt::print("  {:<{}} {:<6} {:<16} {:>12}\n", "name", w, "dtype", "shape", "bytes");
  std::vector<const TensorInfo*> sorted;
  for (const auto& t : m.tensors) sorted.push_back(&t);
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const TensorInfo* x, const TensorInfo* y) { return natural_less(x->name, y->name); });
  for (const TensorInfo* tp : sorted)
    fmt::print("  {:<{}} {:<6} {:<16} {:>12}\n", tp->name, w, tp->dtype, shape_str(tp->shape), tp->bytes);
  fmt::print("\ntotals        {:.2f}M parameters, {}\n", m.n_params / 1e6, human_bytes(m.n_bytes));
  for (const auto& [dt, b] : m.bytes_by_dtype)
    fmt::print("  {:<6} {:>12} params  {:>12}\n", dt, m.params_by_dtype.at(dt), human_bytes(b));
}

const int kRegistered = register_command(
    {"inspect",
     "Show a model file's format, hyperparameters, tokenizer, tensors and totals (maps the file, reads no weights)",
     [](CLI::App& app) -> Runner {
       auto model = std::make_shared<std::string>();
       auto json = std::make_shared<bool>(false);
       auto meta = std::make_shared<bool>(false);
       add_model_option(app, *model);
       app.add_flag("--json", *json,
                    "Print one JSON object (architecture, n_layers, n_embd, ..., tensors) instead of text");
       app.add_flag("--metadata", *meta, "Also list every metadata key and value (text output; JSON always has them)");
       return [=] {
         ModelInfo m = inspect_model(resolve_model_path(*model));
         if (*json)
           fmt::print("{}\n", to_json(m).dump(2));
         else
           print_text(m, *meta);
         return 0;
       };
     }});

}  // namespace
}  // namespace tessera::cli
