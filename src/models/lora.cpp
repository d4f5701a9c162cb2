#include "models/lora.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "quant/half.h"
#include "quant/quant.h"

namespace tessera {

namespace fs = std::filesystem;
using nlohmann::json;

const LoraTarget* LoraAdapter::find(std::string_view weight) const {
  for (const LoraTarget& t : targets)
    if (t.weight == weight) return &t;
  return nullptr;
}

namespace {

// The base weights the graph builder runs as plain matmuls (models/llama.cpp), the only ones an adapter may target.
bool is_matmul_weight(std::string_view name) {
  if (name == "output.weight") return true;
  if (!name.starts_with("blk.")) return false;
  const size_t dot = name.find('.', 4);
  if (dot == std::string_view::npos) return false;
  const std::string_view rest = name.substr(dot + 1);
  for (std::string_view m : {"attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "ffn_gate.weight",
                             "ffn_up.weight", "ffn_down.weight"})
    if (rest == m) return true;
  return false;
}

// A 2-D tensor of any readable format as f32, row by row (a row is whole blocks in every GGUF format). The bytes are
// copied first: safetensors data need not be aligned.
std::vector<float> to_f32(const TensorView& t, const std::string& file) {
  TESSERA_CHECK(t.shape.size() == 2 && t.shape[0] > 0 && t.shape[1] > 0, "{}: tensor '{}' is not a 2-D matrix", file,
                t.name);
  TESSERA_CHECK(can_dequantize(t.dtype), "{}: tensor '{}' has type {}, which Tessera cannot read", file, t.name,
                dtype_name(t.dtype));
  const auto row = dtype_row_bytes(t.dtype, static_cast<uint64_t>(t.shape[1]));
  TESSERA_CHECK(row.has_value() && *row * static_cast<uint64_t>(t.shape[0]) == t.nbytes,
                "{}: tensor '{}' holds {} bytes, not a whole {} matrix of shape {}x{}", file, t.name, t.nbytes,
                dtype_name(t.dtype), t.shape[0], t.shape[1]);
  std::vector<uint8_t> bytes(t.data, t.data + t.nbytes);
  std::vector<float> out(static_cast<size_t>(t.numel()));
  for (int64_t r = 0; r < t.shape[0]; ++r)
    dequantize_row(t.dtype, bytes.data() + static_cast<size_t>(r) * *row, out.data() + r * t.shape[1], t.shape[1]);
  for (float v : out) TESSERA_CHECK(std::isfinite(v), "{}: tensor '{}' holds a value that is not finite", file, t.name);
  return out;
}

// Checks the pair against the base and fills the target (B times the scale).
// GGUF's converter permutes the rows of llama's q and k projections (and so of their adapters' B) for the rotation of
// adjacent pairs: row h·D + 2i + j of GGUF's layout is row h·D + j·D/2 + i of Hugging Face's (i < D/2, j < 2), per head
// h of the projection. An adapter in one layout applied to a base in the other has its B rows moved the same way.
void move_rows(std::vector<float>& b, int64_t rank, int64_t n_head, int64_t head_dim, bool to_gguf) {
  const std::vector<float> old = b;
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < n_head; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t g = h * head_dim + 2 * i + j, hf = h * head_dim + j * half + i;
        const int64_t dst = to_gguf ? g : hf, src = to_gguf ? hf : g;
        std::copy_n(old.begin() + src * rank, rank, b.begin() + dst * rank);
      }
}

LoraTarget make_target(const std::string& file, const std::string& weight, const TensorView& a, const TensorView& b,
                       bool adapter_gguf_rows, bool rslora, float alpha, float user_scale, bool alpha_zero_is_one,
                       const ModelWeights& base) {
  TESSERA_CHECK(is_matmul_weight(weight),
                "{}: the adapter targets '{}', which Tessera does not run as a matmul (supported: the attention and "
                "FFN projections and output.weight)",
                file, weight);
  const TensorView* w = base.find(weight);
  TESSERA_CHECK(w != nullptr && w->shape.size() == 2,
                "{}: the adapter targets '{}', which {} does not have (an adapter made for another base model?)", file,
                weight, base.path());
  LoraTarget t;
  t.weight = weight;
  t.n_out = w->shape[0];
  t.n_in = w->shape[1];
  TESSERA_CHECK(a.shape.size() == 2 && b.shape.size() == 2 && a.shape[0] == b.shape[1] && a.shape[0] > 0,
                "{}: '{}' has lora_a of shape {}x{} and lora_b of shape {}x{}, which are not [r, K] and [N, r]", file,
                weight, a.shape.empty() ? 0 : a.shape[0], a.shape.size() < 2 ? 0 : a.shape[1],
                b.shape.empty() ? 0 : b.shape[0], b.shape.size() < 2 ? 0 : b.shape[1]);
  TESSERA_CHECK(a.shape[1] == t.n_in && b.shape[0] == t.n_out,
                "{}: '{}' adapts a {}x{} matrix but the base's is {}x{} (an adapter made for another base model?)",
                file, weight, b.shape[0], a.shape[1], t.n_out, t.n_in);
  t.rank = a.shape[0];
  const double r = double(t.rank);
  double s = 1.0;
  if (!(alpha_zero_is_one && alpha == 0)) s = rslora ? alpha / std::sqrt(r) : alpha / r;
  t.scale = static_cast<float>(s * user_scale);
  t.a = to_f32(a, file);
  t.b = to_f32(b, file);
  for (float& v : t.b) v *= t.scale;
  const ModelConfig& c = base.config();
  const bool base_gguf_rows = !c.rope_neox;  // configs give Hugging Face layouts NeoX rotation (config_hf.cpp)
  const bool is_q = weight.ends_with(".attn_q.weight"), is_k = weight.ends_with(".attn_k.weight");
  if ((is_q || is_k) && adapter_gguf_rows != base_gguf_rows)
    move_rows(t.b, t.rank, is_q ? c.n_head : c.n_head_kv, c.head_dim, base_gguf_rows);
  for (float v : t.a) t.a16.push_back(f32_to_fp16(v));
  for (float v : t.b) t.b16.push_back(f32_to_fp16(v));
  return t;
}

// PEFT matches rank_pattern / alpha_pattern keys against a module's full name as a suffix at a dot boundary.
const json* pattern_for(const json& patterns, const std::string& module) {
  if (!patterns.is_object()) return nullptr;
  for (auto it = patterns.begin(); it != patterns.end(); ++it) {
    const std::string& k = it.key();
    if (module == k || (module.size() > k.size() && module.ends_with(k) && module[module.size() - k.size() - 1] == '.'))
      return &it.value();
  }
  return nullptr;
}

LoraAdapter load_peft(const fs::path& dir, float user_scale, const ModelWeights& base) {
  const std::string cfg_path = (dir / "adapter_config.json").string();
  const std::string st_path = (dir / "adapter_model.safetensors").string();
  std::error_code ec;
  TESSERA_CHECK(fs::is_regular_file(cfg_path, ec), "{}: no adapter_config.json beside the adapter", dir.string());
  TESSERA_CHECK(fs::is_regular_file(st_path, ec), "{}: no adapter_model.safetensors in the adapter folder",
                dir.string());
  json cfg;
  safetensors::read_json_file(cfg_path, &cfg);
  TESSERA_CHECK(cfg.is_object(), "{}: is not a JSON object", cfg_path);
  const auto get = [&](const char* key) -> const json* {
    auto it = cfg.find(key);
    return it == cfg.end() || it->is_null() ? nullptr : &*it;
  };
  if (const json* t = get("peft_type"))
    TESSERA_CHECK(t->is_string() && t->get<std::string>() == "LORA", "{}: peft_type is {}, not LORA", cfg_path,
                  t->dump());
  const json* r = get("r");
  const json* alpha = get("lora_alpha");
  TESSERA_CHECK(r != nullptr && r->is_number_integer() && r->get<int64_t>() > 0, "{}: 'r' is not a positive integer",
                cfg_path);
  TESSERA_CHECK(alpha != nullptr && alpha->is_number(), "{}: 'lora_alpha' is not a number", cfg_path);
  const auto flag = [&](const char* key) {
    const json* v = get(key);
    TESSERA_CHECK(v == nullptr || v->is_boolean(), "{}: '{}' is not true or false", cfg_path, key);
    return v != nullptr && v->get<bool>();
  };
  const bool rslora = flag("use_rslora");
  TESSERA_CHECK(!flag("use_dora"), "{}: DoRA adapters (use_dora) are not supported", cfg_path);
  TESSERA_CHECK(!flag("fan_in_fan_out"), "{}: fan_in_fan_out adapters (GPT-2's Conv1D layout) are not supported",
                cfg_path);
  if (const json* bias = get("bias"))
    TESSERA_CHECK(bias->is_string() && bias->get<std::string>() == "none",
                  "{}: adapters with trained biases (bias {}) are not supported", cfg_path, bias->dump());
  TESSERA_CHECK(!flag("lora_bias"), "{}: adapters with a bias on lora_B (lora_bias) are not supported", cfg_path);
  if (const json* m = get("modules_to_save"))
    TESSERA_CHECK(m->empty(), "{}: modules_to_save (full copies of modules) are not supported", cfg_path);
  const json empty = json::object();
  const json& rank_pattern = get("rank_pattern") ? *get("rank_pattern") : empty;
  const json& alpha_pattern = get("alpha_pattern") ? *get("alpha_pattern") : empty;
  (void)rank_pattern;  // a module's rank is its tensors' shape; its scale needs only alpha and that rank

  const safetensors::File st = safetensors::File::open(st_path);
  // module (HF name without ".weight") -> (A, B)
  std::map<std::string, std::pair<const TensorView*, const TensorView*>> pairs;
  for (const TensorView& t : st.tensors()) {
    std::string_view n = t.name;
    if (n.starts_with("base_model.model.")) n.remove_prefix(std::string_view("base_model.model.").size());
    bool is_a = false;
    if (n.ends_with(".lora_A.weight")) {
      is_a = true;
      n.remove_suffix(std::string_view(".lora_A.weight").size());
    } else if (n.ends_with(".lora_B.weight")) {
      n.remove_suffix(std::string_view(".lora_B.weight").size());
    } else {
      fail(
          "{}: tensor '{}' is not a LoRA A or B matrix (embedding adapters, DoRA magnitudes and biases are not "
          "supported)",
          st_path, t.name);
    }
    auto& p = pairs[std::string(n)];
    (is_a ? p.first : p.second) = &t;
  }
  TESSERA_CHECK(!pairs.empty(), "{}: holds no LoRA tensors", st_path);
  LoraAdapter ad;
  ad.path = dir.string();
  ad.format = "peft";
  for (const auto& [module, p] : pairs) {
    TESSERA_CHECK(p.first != nullptr && p.second != nullptr, "{}: module '{}' has lora_{} but not lora_{}", st_path,
                  module, p.first ? "A" : "B", p.first ? "B" : "A");
    const std::string weight = safetensors::hf_to_gguf_name(module + ".weight");
    TESSERA_CHECK(!weight.empty(), "{}: module '{}' is not a Llama-family projection Tessera knows", st_path, module);
    float a = alpha->get<float>();
    if (const json* ap = pattern_for(alpha_pattern, module)) {
      TESSERA_CHECK(ap->is_number(), "{}: alpha_pattern of '{}' is not a number", cfg_path, module);
      a = ap->get<float>();
    }
    ad.targets.push_back(make_target(st_path, weight, *p.first, *p.second, /*adapter_gguf_rows=*/false, rslora, a,
                                     user_scale, false, base));
  }
  return ad;
}

LoraAdapter load_gguf(const std::string& path, float user_scale, const ModelWeights& base) {
  const gguf::File f = gguf::File::open(path);
  const auto type = f.get_string("general.type");
  TESSERA_CHECK(type.has_value() && *type == "adapter", "{}: general.type is '{}', not 'adapter' (not a LoRA file)",
                path, type.value_or(""));
  const auto atype = f.get_string("adapter.type");
  TESSERA_CHECK(atype.has_value() && *atype == "lora", "{}: adapter.type is '{}', not 'lora'", path,
                atype.value_or(""));
  const float alpha = static_cast<float>(f.get_float("adapter.lora.alpha").value_or(0.0));
  // Rows in GGUF's permuted q/k layout: llama.cpp's converter permutes them for llama-architecture files only.
  bool gguf_rows = true;
  if (const auto arch = f.get_string("general.architecture"))
    gguf_rows = *arch != "phi3" && *arch != "qwen2" && *arch != "qwen3" && *arch != "gemma3";
  if (const auto arch = f.get_string("general.architecture"))
    TESSERA_CHECK(*arch == base.config().architecture || (*arch == "llama" && base.config().architecture == "mistral"),
                  "{}: the adapter is for a {} model, not {} ({})", path, *arch, base.config().architecture,
                  base.path());
  std::map<std::string, std::pair<const TensorView*, const TensorView*>> pairs;
  for (const TensorView& t : f.tensors()) {
    std::string_view n = t.name;
    bool is_a = false;
    if (n.ends_with(".lora_a")) {
      is_a = true;
      n.remove_suffix(7);
    } else if (n.ends_with(".lora_b")) {
      n.remove_suffix(7);
    } else {
      fail("{}: tensor '{}' is not a lora_a or lora_b matrix", path, t.name);
    }
    auto& p = pairs[std::string(n)];
    (is_a ? p.first : p.second) = &t;
  }
  TESSERA_CHECK(!pairs.empty(), "{}: holds no LoRA tensors", path);
  LoraAdapter ad;
  ad.path = path;
  ad.format = "gguf";
  for (const auto& [weight, p] : pairs) {
    TESSERA_CHECK(p.first != nullptr && p.second != nullptr, "{}: '{}' has lora_{} but not lora_{}", path, weight,
                  p.first ? "a" : "b", p.first ? "b" : "a");
    // llama.cpp: scale = user · alpha / r, or the user's scale alone when alpha is 0.
    ad.targets.push_back(
        make_target(path, weight, *p.first, *p.second, gguf_rows, false, alpha, user_scale, true, base));
  }
  return ad;
}

bool has_gguf_magic(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char m[4] = {};
  in.read(m, 4);
  return in.gcount() == 4 && std::memcmp(m, "GGUF", 4) == 0;
}

}  // namespace

LoraAdapter load_lora_adapter(const std::string& path, float user_scale, const ModelWeights& base) {
  TESSERA_CHECK(std::isfinite(user_scale), "{}: the LoRA scale {} is not a finite number", path, user_scale);
  std::error_code ec;
  TESSERA_CHECK(fs::exists(path, ec), "{}: no such LoRA adapter file or folder", path);
  if (fs::is_directory(path, ec)) return load_peft(fs::path(path), user_scale, base);
  if (has_gguf_magic(path)) return load_gguf(path, user_scale, base);
  const fs::path p(path);
  if (p.extension() == ".safetensors" || p.filename() == "adapter_config.json")
    return load_peft(p.has_parent_path() ? p.parent_path() : fs::path("."), user_scale, base);
  fail("{}: not a LoRA adapter (a PEFT folder, its adapter_model.safetensors, or a GGUF LoRA)", path);
}

std::pair<std::string, float> parse_lora_spec(const std::string& spec) {
  const size_t colon = spec.rfind(':');
  if (colon != std::string::npos && colon + 1 < spec.size()) {
    const std::string tail = spec.substr(colon + 1);
    float v = 0;
    const auto [ptr, err] = std::from_chars(tail.data(), tail.data() + tail.size(), v);
    if (err == std::errc() && ptr == tail.data() + tail.size()) {
      TESSERA_CHECK(std::isfinite(v), "--lora {}: the scale is not a finite number", spec);
      return {spec.substr(0, colon), v};
    }
  }
  return {spec, 1.0f};
}

LoraTarget pad_lora_rank(const LoraTarget& t, int64_t multiple) {
  TESSERA_CHECK(multiple >= 1, "a LoRA rank multiple must be positive, not {}", multiple);
  const int64_t padded = (t.rank + multiple - 1) / multiple * multiple;
  if (padded == t.rank) return t;
  LoraTarget p = t;
  p.rank = padded;
  p.a.resize(static_cast<size_t>(padded * t.n_in), 0.0f);
  p.a16.resize(p.a.size(), 0);  // f16 zero is all bits clear
  p.b.assign(static_cast<size_t>(t.n_out * padded), 0.0f);
  p.b16.assign(p.b.size(), 0);
  for (int64_t n = 0; n < t.n_out; ++n) {
    std::copy_n(t.b.begin() + n * t.rank, t.rank, p.b.begin() + n * padded);
    std::copy_n(t.b16.begin() + n * t.rank, t.rank, p.b16.begin() + n * padded);
  }
  return p;
}

std::shared_ptr<const LoraSet> make_lora_set(std::vector<std::shared_ptr<const LoraAdapter>> adapters, bool merge,
                                             const ModelWeights& base, DType dtype, int64_t rank_multiple) {
  TESSERA_CHECK(dtype == DType::F32 || dtype == DType::F16, "LoRA weights run in f32 or f16, not {}",
                dtype_name(dtype));
  TESSERA_CHECK(rank_multiple >= 1, "a LoRA rank multiple must be positive, not {}", rank_multiple);
  auto set = std::make_shared<LoraSet>();
  set->dtype = dtype;
  set->adapters = std::move(adapters);
  set->merged = merge;
  if (!merge) {
    set->rank_multiple = rank_multiple;
    for (auto& ad : set->adapters) {
      const bool pad = std::any_of(ad->targets.begin(), ad->targets.end(),
                                   [&](const LoraTarget& t) { return t.rank % rank_multiple != 0; });
      if (!pad) continue;
      auto copy = std::make_shared<LoraAdapter>(*ad);
      for (LoraTarget& t : copy->targets) t = pad_lora_rank(t, rank_multiple);
      ad = std::move(copy);
    }
    return set;
  }
  for (const auto& ad : set->adapters) {
    for (const LoraTarget& t : ad->targets) {
      auto [it, fresh] = set->merged_weights.try_emplace(t.weight);
      LoraSet::MergedWeight& m = it->second;
      std::vector<float> w;  // [N, K]
      if (fresh) {
        const TensorView* bw = base.find(t.weight);
        TESSERA_CHECK(bw != nullptr, "{}: the base has no '{}'", ad->path, t.weight);
        w = to_f32(*bw, base.path());
        m.shape = bw->shape;
        m.dtype = bw->dtype;
      } else {
        w.resize(static_cast<size_t>(t.n_out * t.n_in));
        std::memcpy(w.data(), m.data.data(), w.size() * sizeof(float));  // an earlier adapter's sum, kept in f32
      }
      // W[n, :] += Σ_j B[n, j] · A[j, :] (B already scaled).
      for (int64_t n = 0; n < t.n_out; ++n) {
        float* wr = w.data() + n * t.n_in;
        for (int64_t j = 0; j < t.rank; ++j) {
          const float bj = t.b[static_cast<size_t>(n * t.rank + j)];
          const float* ar = t.a.data() + j * t.n_in;
          for (int64_t k = 0; k < t.n_in; ++k) wr[k] += bj * ar[k];
        }
      }
      m.data.resize(w.size() * sizeof(float));
      std::memcpy(m.data.data(), w.data(), m.data.size());
    }
  }
  // Back to the base's format where Tessera writes it, so a merged model runs at the base's speed; f32 otherwise.
  for (auto& [name, m] : set->merged_weights) {
    const int64_t n = m.shape[0], k = m.shape[1];
    const auto row = dtype_row_bytes(m.dtype, static_cast<uint64_t>(k));
    if (m.dtype == DType::F32 || !can_quantize(m.dtype) || !row.has_value()) {
      m.dtype = DType::F32;
      continue;
    }
    std::vector<uint8_t> q(*row * static_cast<size_t>(n));
    const float* src = reinterpret_cast<const float*>(m.data.data());
    for (int64_t r = 0; r < n; ++r) quantize_row(m.dtype, src + r * k, q.data() + static_cast<size_t>(r) * *row, k);
    m.data = std::move(q);
  }
  return set;
}

}  // namespace tessera
