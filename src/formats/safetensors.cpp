#include "formats/safetensors.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "core/error.h"

namespace tessera::safetensors {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// Tensor entries nest two levels deep; anything deeper is not a safetensors header, and refusing it early keeps a
// hostile header from building a deep tree.
constexpr int kMaxJsonDepth = 8;

// nlohmann's messages start with "[json.exception.parse_error.101] "; the user needs only what follows.
std::string json_reason(const json::exception& e) {
  std::string_view w = e.what();
  if (!w.empty() && w.front() == '[') {
    size_t close = w.find("] ");
    if (close != std::string_view::npos) w.remove_prefix(close + 2);
  }
  return std::string(w);
}

// "an object", "a number", ... for messages.
std::string json_type(const json& v) {
  if (v.is_null()) return "null";
  const std::string t = v.type_name();
  return (t == "object" || t == "array" ? "an " : "a ") + t;
}

// a * b when it fits in int64, else nullopt.
bool mul_fits(uint64_t a, uint64_t b, uint64_t* out) {
  if (a != 0 && b > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / a) return false;
  *out = a * b;
  return true;
}

uint64_t read_offset(const json& v, const std::string& name, const std::string& tensor) {
  if (!v.is_number_unsigned())
    fail("{}: tensor '{}' has a data offset that is not a non-negative integer ({})", name, tensor, v.dump());
  return v.get<uint64_t>();
}

TensorView parse_entry(const std::string& tensor, const json& e, const std::string& name, uint64_t data_size) {
  if (!e.is_object()) fail("{}: tensor '{}' entry is {}, not an object", name, tensor, json_type(e));
  auto dt = e.find("dtype");
  if (dt == e.end()) fail("{}: tensor '{}' has no dtype", name, tensor);
  if (!dt->is_string()) fail("{}: tensor '{}' dtype is {}, not a string", name, tensor, json_type(*dt));
  auto sh = e.find("shape");
  if (sh == e.end()) fail("{}: tensor '{}' has no shape", name, tensor);
  if (!sh->is_array()) fail("{}: tensor '{}' shape is {}, not an array", name, tensor, json_type(*sh));
  auto off = e.find("data_offsets");
  if (off == e.end()) fail("{}: tensor '{}' has no data_offsets", name, tensor);
  if (!off->is_array() || off->size() != 2)
    fail("{}: tensor '{}' data_offsets must be an array of two integers", name, tensor);

  TensorView t;
  t.name = tensor;
  t.dtype = dtype_from_safetensors(dt->get_ref<const std::string&>(), name + ": tensor '" + tensor + "'");
  bool has_zero = false;
  for (const json& d : *sh) {
    if (d.is_number_integer() && !d.is_number_unsigned())
      fail("{}: tensor '{}' has a negative dimension ({})", name, tensor, d.get<int64_t>());
    if (d.is_number_float()) fail("{}: tensor '{}' has a non-integer dimension ({})", name, tensor, d.dump());
    if (!d.is_number_unsigned()) fail("{}: tensor '{}' shape holds {}, not an integer", name, tensor, json_type(d));
    uint64_t v = d.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail("{}: tensor '{}' has a dimension too large ({})", name, tensor, v);
    has_zero = has_zero || v == 0;
    t.shape.push_back(static_cast<int64_t>(v));
  }
  uint64_t numel = 1;
  if (has_zero) {
    numel = 0;
  } else {
    for (int64_t d : t.shape)
      if (!mul_fits(numel, static_cast<uint64_t>(d), &numel))
        fail("{}: tensor '{}' element count overflows", name, tensor);
  }
  uint64_t nbytes = 0;
  if (!mul_fits(numel, dtype_info(t.dtype).type_size, &nbytes))
    fail("{}: tensor '{}' byte size overflows", name, tensor);

  uint64_t begin = read_offset((*off)[0], name, tensor);
  uint64_t end = read_offset((*off)[1], name, tensor);
  if (begin > end) fail("{}: tensor '{}' has data_offsets [{}, {}] with begin after end", name, tensor, begin, end);
  if (end > data_size)
    fail("{}: tensor '{}' has data_offsets [{}, {}] past the end of the data section ({} bytes)", name, tensor, begin,
         end, data_size);
  if (end - begin != nbytes)
    fail("{}: tensor '{}' occupies {} bytes but its shape and dtype need {}", name, tensor, end - begin, nbytes);
  t.offset = begin;  // relative for now; parse_header makes it absolute
  t.nbytes = nbytes;
  return t;
}

bool valid_shard_name(std::string_view s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string_view::npos &&
         s.find('\\') == std::string_view::npos;
}

}  // namespace

DType dtype_from_safetensors(std::string_view s, const std::string& name) {
  static constexpr std::pair<std::string_view, DType> kTable[] = {
      {"F32", DType::F32}, {"F16", DType::F16}, {"BF16", DType::BF16}, {"F64", DType::F64},
      {"I64", DType::I64}, {"I32", DType::I32}, {"I16", DType::I16},   {"I8", DType::I8},
      // Bytes read as bits, never as numbers: BitNet's packed ternary weights (four 2-bit values per byte) are U8,
      // and I8 is the one byte-sized dtype Tessera has (models/ternary_weights.cpp unpacks them).
      {"U8", DType::I8},
  };
  for (const auto& [k, v] : kTable)
    if (s == k) return v;
  // Dtypes the safetensors format defines but Tessera has no row for.
  static constexpr std::string_view kKnown[] = {"BOOL",    "U16",     "U32",     "U64",     "F8_E4M3", "F8_E5M2",
                                                "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4",      "C64"};
  for (std::string_view k : kKnown)
    if (s == k) fail("{} has unsupported dtype {}", name, s);
  fail("{} has unknown dtype '{}'", name, s);
}

Header parse_header(const uint8_t* data, size_t size, const std::string& name) {
  if (size < 8) fail("{}: file is {} bytes, too small to hold a safetensors header length", name, size);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(data[i]) << (8 * i);
  // A length beyond the limit usually means the file is not safetensors at all (a GGUF starts "GGUF" + version).
  if (n > kMaxHeaderBytes) fail("{}: header length {} exceeds the 100 MB limit (is this a safetensors file?)", name, n);
  if (n > size - 8) fail("{}: header length {} extends past the end of the file ({} bytes)", name, n, size);
  const char* text = reinterpret_cast<const char*>(data + 8);
  if (n == 0 || text[0] != '{') fail("{}: header is not a JSON object (it must start with '{{')", name);

  std::set<std::string, std::less<>> top_keys;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t ev, json& parsed) {
    if ((ev == json::parse_event_t::object_start || ev == json::parse_event_t::array_start) && depth > kMaxJsonDepth)
      fail("{}: header JSON nests deeper than {} levels", name, kMaxJsonDepth);
    if (ev == json::parse_event_t::key && depth == 1 && parsed.is_string()) {
      if (!top_keys.insert(parsed.get_ref<const std::string&>()).second)
        fail("{}: tensor '{}' appears twice in the header", name, parsed.get_ref<const std::string&>());
    }
    return true;
  };
  json j;
  try {
    j = json::parse(text, text + n, cb);
  } catch (const json::exception& e) {
    fail("{}: header is not valid JSON: {}", name, json_reason(e));
  }
  if (!j.is_object()) fail("{}: header is not a JSON object", name);

  Header h;
  h.data_offset = 8 + n;
  const uint64_t data_size = size - h.data_offset;
  for (const auto& [key, value] : j.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) fail("{}: __metadata__ is {}, not an object", name, json_type(value));
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) fail("{}: __metadata__ value '{}' is {}, not a string", name, mk, json_type(mv));
        h.metadata.emplace(mk, mv.get<std::string>());
      }
      continue;
    }
    if (key.empty()) fail("{}: header has a tensor with an empty name", name);
    h.tensors.push_back(parse_entry(key, value, name, data_size));
  }

  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorView& a, const TensorView& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.nbytes < b.nbytes;
  });
  // Empty tensors occupy no bytes, so they cannot overlap anything.
  const TensorView* prev = nullptr;
  for (const TensorView& t : h.tensors) {
    if (t.nbytes == 0) continue;
    if (prev != nullptr && t.offset < prev->offset + prev->nbytes)
      fail("{}: tensors '{}' and '{}' overlap in the data section", name, prev->name, t.name);
    prev = &t;
  }
  for (TensorView& t : h.tensors) {
    t.offset += h.data_offset;
    t.data = data + t.offset;
  }
  return h;
}

void read_json_file(const std::string& path, json* out) {
  MappedFile f(path);
  const char* p = reinterpret_cast<const char*>(f.data());
  try {
    *out = json::parse(p, p + f.size());
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", path, json_reason(e));
  }
}

// ---- File ----

File File::open(const std::string& path) {
  File f;
  f.path_ = path;
  f.map_ = std::make_shared<MappedFile>(path);
  f.header_ = parse_header(f.map_->data(), f.map_->size(), path);
  for (size_t i = 0; i < f.header_.tensors.size(); ++i) f.index_.emplace(f.header_.tensors[i].name, i);
  return f;
}

const TensorView* File::find_tensor(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

// ---- Model ----

Model Model::open(const std::string& path) {
  Model m;
  m.path_ = path;
  std::error_code ec;
  const fs::path p(path);
  const fs::file_status st = fs::status(p, ec);
  if (!fs::exists(st)) fail("{}: no such file or directory", path);
  fs::path dir;
  fs::path weights;
  if (fs::is_directory(st)) {
    dir = p;
    if (fs::exists(dir / "model.safetensors", ec)) {
      weights = dir / "model.safetensors";
    } else if (fs::exists(dir / "model.safetensors.index.json", ec)) {
      weights = dir / "model.safetensors.index.json";
    } else {
      fail("{}: directory holds neither model.safetensors nor model.safetensors.index.json", path);
    }
  } else {
    weights = p;
    dir = p.parent_path();
    if (dir.empty()) dir = ".";
  }
  m.weights_path_ = weights.string();
  m.sharded_ = weights.extension() == ".json";

  const fs::path config = dir / "config.json";
  m.config_path_ = config.string();
  if (!fs::exists(config, ec))
    fail("{}: config.json is missing (a Hugging Face model needs it next to its weights)", dir.string());
  auto cfg = std::make_shared<json>();
  read_json_file(m.config_path_, cfg.get());
  if (!cfg->is_object()) fail("{}: holds {}, not a JSON object", m.config_path_, json_type(*cfg));
  m.config_ = std::move(cfg);
  const fs::path tok = dir / "tokenizer.json";
  if (fs::is_regular_file(tok, ec)) m.tokenizer_path_ = tok.string();
  const fs::path tok_cfg = dir / "tokenizer_config.json";
  if (fs::is_regular_file(tok_cfg, ec)) m.tokenizer_config_path_ = tok_cfg.string();

  if (!m.sharded_) {
    m.shard_paths_.push_back(m.weights_path_);
    m.add_file(File::open(m.weights_path_), nullptr, "");
    return m;
  }

  json idx;
  read_json_file(m.weights_path_, &idx);
  const std::string& ip = m.weights_path_;
  if (!idx.is_object()) fail("{}: index holds {}, not a JSON object", ip, json_type(idx));
  auto wm = idx.find("weight_map");
  if (wm == idx.end()) fail("{}: index has no weight_map", ip);
  if (!wm->is_object()) fail("{}: weight_map is {}, not an object", ip, json_type(*wm));
  if (wm->empty()) fail("{}: weight_map lists no tensors", ip);
  std::map<std::string, std::string> weight_map;    // tensor -> shard file name
  std::map<std::string, std::string> first_tensor;  // shard -> a tensor it should hold (for messages)
  for (const auto& [tensor, shard] : wm->items()) {
    if (!shard.is_string()) fail("{}: weight_map entry '{}' is {}, not a file name", ip, tensor, json_type(shard));
    const std::string& s = shard.get_ref<const std::string&>();
    if (!valid_shard_name(s))
      fail("{}: weight_map entry '{}' names shard '{}', which is not a file name in the model directory", ip, tensor,
           s);
    weight_map.emplace(tensor, s);
    first_tensor.emplace(s, tensor);
  }
  // All shards must exist before any is read, so a missing one is reported as such.
  for (const auto& [shard, tensor] : first_tensor) {
    const fs::path sp = dir / shard;
    if (!fs::exists(sp, ec)) fail("{}: shard '{}' (holding tensor '{}') does not exist", ip, shard, tensor);
    m.shard_paths_.push_back(sp.string());
  }
  for (const std::string& sp : m.shard_paths_) m.add_file(File::open(sp), &weight_map, ip);
  for (const auto& [tensor, shard] : weight_map)
    if (m.index_.find(tensor) == m.index_.end())
      fail("{}: tensor '{}' is listed in shard '{}' but that shard does not hold it", ip, tensor, shard);
  return m;
}

void Model::add_file(File f, const std::map<std::string, std::string>* weight_map, const std::string& index_path) {
  const std::string shard = fs::path(f.path()).filename().string();
  for (const TensorView& t : f.tensors()) {
    if (weight_map != nullptr) {
      auto it = weight_map->find(t.name);
      if (it == weight_map->end()) fail("{}: tensor '{}' is not listed in {}", f.path(), t.name, index_path);
      if (it->second != shard)
        fail("{}: holds tensor '{}', which the index assigns to shard '{}'", f.path(), t.name, it->second);
    }
    const size_t pos = tensors_.size();
    tensors_.push_back(t);
    index_.emplace(t.name, pos);
    std::string g = hf_to_gguf_name(t.name);
    if (!g.empty()) gguf_index_.emplace(std::move(g), pos);
  }
  for (const auto& kv : f.metadata()) metadata_.insert(kv);
  files_.push_back(std::move(f));
}

const TensorView* Model::find_tensor(std::string_view hf_name) const {
  auto it = index_.find(hf_name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const TensorView* Model::find_tensor_gguf(std::string_view gguf_name) const {
  auto it = gguf_index_.find(gguf_name);
  return it == gguf_index_.end() ? nullptr : &tensors_[it->second];
}

uint64_t Model::total_bytes() const {
  uint64_t n = 0;
  for (const TensorView& t : tensors_) n += t.nbytes;
  return n;
}

// ---- names ----

std::string hf_to_gguf_name(std::string_view n) {
  if (n == "model.embed_tokens.weight") return "token_embd.weight";
  if (n == "model.norm.weight") return "output_norm.weight";
  if (n == "lm_head.weight") return "output.weight";
  // The MatMul-free LM (hgrn_bit): its embedding, the forget gates' lower bounds [L, E], lm_head's own input norm.
  if (n == "model.embeddings.weight") return "token_embd.weight";
  if (n == "model.lower_bounds") return "lower_bounds";
  if (n == "lm_head.norm.weight") return "output_in_norm.weight";
  constexpr std::string_view kLayers = "model.layers.";
  if (!n.starts_with(kLayers)) return "";
  n.remove_prefix(kLayers.size());
  const size_t dot = n.find('.');
  // Layer numbers are canonical decimals ("7", never "07"), as transformers writes them.
  if (dot == std::string_view::npos || dot == 0 || dot > 9 || (dot > 1 && n[0] == '0')) return "";
  const std::string_view layer = n.substr(0, dot);
  if (!std::all_of(layer.begin(), layer.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
    return "";
  const std::string_view rest = n.substr(dot + 1);
  static constexpr std::pair<std::string_view, std::string_view> kLayerNames[] = {
      {"input_layernorm.weight", "attn_norm.weight"}, {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},   {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},   {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},       {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},       {"self_attn.o_proj.bias", "attn_output.bias"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},    {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
      // Qwen3 and Gemma 3: per-head q/k norms. Gemma 3 also has pre/post-FFN norms; its post_attention_layernorm is
      // a post-norm, not Llama's pre-FFN norm, which models/model_weights.cpp renames once the architecture is known
      // (this map sees names only).
      {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"pre_feedforward_layernorm.weight", "pre_ffw_norm.weight"},
      {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
      // Phi-3: fused q|k|v and gate|up, GGUF's attn_qkv and (fused) ffn_up; models/model_weights.cpp splits them.
      {"self_attn.qkv_proj.weight", "attn_qkv.weight"},
      {"mlp.gate_up_proj.weight", "ffn_up.weight"},
      // BitNet: sub-layer norms (llama.cpp's names) and the ternary linears' scales (transformers' weight_scale,
      // llama.cpp's `.scale`), which models/ternary_weights.cpp folds into their weights.
      {"self_attn.attn_sub_norm.weight", "attn_sub_norm.weight"},
      {"mlp.ffn_sub_norm.weight", "ffn_sub_norm.weight"},
      {"self_attn.q_proj.weight_scale", "attn_q.scale"},
      {"self_attn.k_proj.weight_scale", "attn_k.scale"},
      {"self_attn.v_proj.weight_scale", "attn_v.scale"},
      {"self_attn.o_proj.weight_scale", "attn_output.scale"},
      {"mlp.gate_proj.weight_scale", "ffn_gate.scale"},
      {"mlp.up_proj.weight_scale", "ffn_up.scale"},
      {"mlp.down_proj.weight_scale", "ffn_down.scale"},
      // The MatMul-free LM: the MLGRU's projections and each BitLinear's own input norm. Its mlp.gate_proj is
      // gate|up in one matrix [2F, E] (gate first), named ffn_gate above and split by models/model_weights.cpp
      // after ternarization (its absmean spans both halves).
      {"attn_norm.weight", "attn_norm.weight"},
      {"mlp_norm.weight", "ffn_norm.weight"},
      {"attn.i_proj.weight", "attn_i.weight"},
      {"attn.f_proj.weight", "attn_f.weight"},
      {"attn.g_proj.weight", "attn_g.weight"},
      {"attn.o_proj.weight", "attn_output.weight"},
      {"attn.i_proj.norm.weight", "attn_i_in_norm.weight"},
      {"attn.f_proj.norm.weight", "attn_f_in_norm.weight"},
      {"attn.g_proj.norm.weight", "attn_g_in_norm.weight"},
      {"attn.o_proj.norm.weight", "attn_output_in_norm.weight"},
      {"attn.g_norm.weight", "attn_g_norm.weight"},
      {"mlp.gate_proj.norm.weight", "ffn_gate_in_norm.weight"},
      {"mlp.down_proj.norm.weight", "ffn_down_in_norm.weight"},
  };
  for (const auto& [hf, gg] : kLayerNames)
    if (rest == hf) return "blk." + std::string(layer) + "." + std::string(gg);
  return "";
}

}  // namespace tessera::safetensors
