// tessera::inspect_model: everything a model file says about itself, from the mapped file (no tensor data is read).
#include "tessera/model_info.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/model_format.h"
#include "formats/safetensors.h"
#include "models/config.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

constexpr const char* kDefaultModel = "SmolLM2-135M-Instruct.Q4_1.gguf";

// Short, single-line rendering of a metadata value; arrays show their length and first elements.
std::string render_value(const gguf::Value& v, int depth = 0) {
  using T = gguf::ValueType;
  switch (v.type) {
    case T::STRING: {
      std::string s(v.s.substr(0, 80));
      for (char& c : s)
        if (c == '\n' || c == '\r' || c == '\t') c = ' ';
      return v.s.size() > 80 ? fmt::format("\"{}...\" ({} bytes)", s, v.s.size()) : fmt::format("\"{}\"", s);
    }
    case T::BOOL:
      return v.u ? "true" : "false";
    case T::FLOAT32:
    case T::FLOAT64:
      return fmt::format("{:g}", v.f);
    case T::INT8:
    case T::INT16:
    case T::INT32:
    case T::INT64:
      return fmt::format("{}", v.i);
    case T::ARRAY: {
      std::string out = fmt::format("[{} x {}", v.len, gguf::value_type_name(v.elem_type));
      if (depth > 0) return out + "]";
      const uint64_t show = std::min<uint64_t>(v.len, 4);
      for (uint64_t i = 0; i < show; ++i) {
        out += i == 0 ? ": " : ", ";
        if (v.elem_type == T::STRING)
          out += fmt::format("\"{}\"", std::string(v.strs[i].substr(0, 24)));
        else if (v.elem_type == T::ARRAY)
          out += render_value(v.items[i], depth + 1);
        else
          out += fmt::format("{:g}", v.number_at(i));
      }
      return out + (v.len > show ? ", ...]" : "]");
    }
    default:
      return fmt::format("{}", v.u);
  }
}

void fill_tensors(ModelInfo& info, const std::vector<TensorView>& tensors) {
  for (const TensorView& t : tensors) {
    TensorInfo ti{t.name, std::string(dtype_name(t.dtype)), t.shape, t.nbytes};
    const auto n = static_cast<uint64_t>(t.numel());
    info.n_params += n;
    info.n_bytes += t.nbytes;
    info.bytes_by_dtype[ti.dtype] += t.nbytes;
    info.params_by_dtype[ti.dtype] += n;
    info.tensors.push_back(std::move(ti));
  }
}

void fill_config(ModelInfo& info, const ModelConfig& c) {
  info.architecture = c.architecture;
  info.name = c.name;
  info.n_layers = c.n_layers;
  info.n_embd = c.n_embd;
  info.n_head = c.n_head;
  info.n_head_kv = c.n_head_kv;
  info.head_dim = c.head_dim;
  info.n_ff = c.n_ff;
  info.n_vocab = c.n_vocab;
  info.n_ctx_train = c.n_ctx_train;
  info.rope_base = c.rope_base;
  info.rope_scaling = c.rope_scaling.type;
  info.rope_scaling_factor = c.rope_scaling.factor;
  info.norm_eps = c.norm_eps;
  info.tied_output = c.tied_output;
}

ModelInfo inspect_gguf(const std::string& path) {
  gguf::File f = gguf::File::open(path);
  ModelInfo info;
  info.path = path;
  info.format = "gguf";
  info.format_version = f.version();
  for (const auto& kv : f.metadata()) info.metadata.emplace_back(kv.key, render_value(kv.value));
  fill_tensors(info, f.tensors());
  fill_config(info, config_from_gguf(f));
  auto kind = f.get_string("tokenizer.ggml.model");
  info.tokenizer_kind = kind ? std::string(*kind) : "none";
  if (const gguf::Value* toks = f.find("tokenizer.ggml.tokens"); toks != nullptr && toks->is_array())
    info.tokenizer_vocab = static_cast<int64_t>(toks->len);
  info.has_chat_template = f.get_string("tokenizer.chat_template").has_value();
  return info;
}

// A Hugging Face model: config.json keys and __metadata__ as metadata, tokenizer facts from tokenizer.json's own fields
// (kind "hf-<model type>", size = highest id + 1) so inspect works even for tokenizers Tessera cannot run.
ModelInfo inspect_safetensors(const std::string& path) {
  safetensors::Model m = safetensors::Model::open(path);
  ModelInfo info;
  info.path = path;
  info.format = "safetensors";
  for (const auto& [k, v] : m.config_json().items()) {
    std::string s = v.dump();
    info.metadata.emplace_back("config." + k, s.size() > 80 ? s.substr(0, 80) + "..." : s);
  }
  for (const auto& [k, v] : m.metadata()) info.metadata.emplace_back("safetensors." + k, v);
  fill_tensors(info, m.tensors());
  fill_config(info, config_from_hf(m.config_json(), m.config_path()));
  info.tokenizer_kind = "none";
  if (!m.tokenizer_path().empty()) {
    nlohmann::json tok;
    safetensors::read_json_file(m.tokenizer_path(), &tok);
    const nlohmann::json* model = tok.is_object() && tok.contains("model") ? &tok["model"] : nullptr;
    std::string type = model != nullptr && model->is_object() ? model->value("type", "unknown") : "unknown";
    std::transform(type.begin(), type.end(), type.begin(), [](unsigned char c) { return std::tolower(c); });
    info.tokenizer_kind = "hf-" + type;
    int64_t max_id = -1;
    auto see = [&](const nlohmann::json& id) {
      if (id.is_number_integer()) max_id = std::max(max_id, id.get<int64_t>());
    };
    if (model != nullptr && model->is_object() && model->contains("vocab")) {
      const nlohmann::json& vocab = (*model)["vocab"];
      if (vocab.is_object())
        for (const auto& [k, id] : vocab.items()) see(id);
      else if (vocab.is_array())
        max_id = static_cast<int64_t>(vocab.size()) - 1;  // Unigram: [piece, score] pairs in id order
    }
    if (tok.is_object() && tok.contains("added_tokens") && tok["added_tokens"].is_array())
      for (const auto& a : tok["added_tokens"])
        if (a.is_object() && a.contains("id")) see(a["id"]);
    info.tokenizer_vocab = max_id + 1;
  }
  if (!m.tokenizer_config_path().empty()) {
    nlohmann::json tc;
    safetensors::read_json_file(m.tokenizer_config_path(), &tc);
    info.has_chat_template = tc.is_object() && tc.contains("chat_template") && !tc["chat_template"].is_null();
  }
  return info;
}

}  // namespace

ModelInfo inspect_model(const std::string& path) {
  return detect_model_format(path) == ModelFormat::GGUF ? inspect_gguf(path) : inspect_safetensors(path);
}

std::string model_format(const std::string& path) {
  return detect_model_format(path) == ModelFormat::GGUF ? "gguf" : "safetensors";
}

std::string model_cache_dir() {
  if (const char* h = std::getenv("TESSERA_HOME"); h != nullptr && *h != '\0') return h;
  // The XDG base directory spec: an absolute $XDG_CACHE_HOME replaces ~/.cache (a relative one is to be ignored).
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && x[0] == '/')
    return std::string(x) + "/tessera/models";
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr ? home : ".") + "/.cache/tessera/models";
}

std::string resolve_model_path(const std::string& path) {
  if (!path.empty()) return path;
  std::string p = model_cache_dir() + "/" + kDefaultModel;
  std::error_code ec;
  TESSERA_CHECK(fs::exists(p, ec), "the default model is not at {}; run scripts/fetch_model.sh to fetch it, or pass -m",
                p);
  return p;
}

}  // namespace tessera
