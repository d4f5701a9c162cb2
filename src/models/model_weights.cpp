#include "models/model_weights.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <unordered_map>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "graph/graph.h"
#include "models/ternary_weights.h"
#include "quant/quant.h"

namespace tessera {

struct ModelWeights::State {
  ModelConfig config;
  std::string path, format;
  std::shared_ptr<gguf::File> gguf;
  std::shared_ptr<safetensors::Model> st;
  std::vector<TensorView> tensors;  // GGUF names
  std::unordered_map<std::string, size_t> index;
  std::vector<std::shared_ptr<std::vector<float>>> owned;  // f32 copies of 1-D weights
  std::vector<std::shared_ptr<std::vector<uint8_t>>> owned_bytes;  // ternary linears as float (ternary_weights.h)
};

namespace {

bool looks_like_gguf(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) return false;
  std::ifstream f(path, std::ios::binary);
  char magic[4] = {};
  return f.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
}

bool is_norm_weight(std::string_view name) { return name.ends_with("norm.weight"); }

// 1-D weights feed f32-only kernels (norms) or the rope setup: convert them once to aligned f32. Norm weights also
// take the config's offset here (HF Gemma's (1 + w)), so every kernel sees plain RMSNorm weights.
void to_f32_where_needed(ModelWeights::State& s) {
  const float offset = s.config.norm_weight_offset;
  for (TensorView& t : s.tensors) {
    if (t.shape.size() != 1 || t.data == nullptr) continue;
    const bool aligned = reinterpret_cast<uintptr_t>(t.data) % alignof(float) == 0;
    const bool shift = offset != 0 && is_norm_weight(t.name);
    if (t.dtype == DType::F32 && aligned && !shift) continue;
    TESSERA_CHECK(can_dequantize(t.dtype), "{}: tensor '{}' has dtype {}, which cannot be converted to f32", s.path,
                  t.name, dtype_name(t.dtype));
    auto buf = std::make_shared<std::vector<float>>(static_cast<size_t>(t.shape[0]));
    dequantize_row(t.dtype, t.data, buf->data(), t.shape[0]);
    if (shift)
      for (float& v : *buf) v += offset;
    t.dtype = DType::F32;
    t.data = reinterpret_cast<const uint8_t*>(buf->data());
    t.nbytes = buf->size() * sizeof(float);
    s.owned.push_back(std::move(buf));
  }
}

// Rows [row0, row0 + n) of a row-major 2-D tensor as a view of its own (no copy): a row is whole blocks in every
// format, so the view is a valid tensor of the same dtype.
TensorView row_view(const TensorView& t, std::string name, int64_t row0, int64_t n) {
  TensorView v = t;
  const uint64_t row = *dtype_row_bytes(t.dtype, static_cast<uint64_t>(t.shape[1]));
  v.name = std::move(name);
  v.shape = {n, t.shape[1]};
  v.offset = t.offset + static_cast<uint64_t>(row0) * row;
  v.nbytes = static_cast<uint64_t>(n) * row;
  if (t.data != nullptr) v.data = t.data + static_cast<uint64_t>(row0) * row;
  return v;
}

// Phi-3 stores q|k|v as one attn_qkv [(H + 2 Hkv) D, E] and gate|up as one ffn_up [2F, E] (gate first, as both
// transformers' chunk and ggml's swiglu take it): split into the views the builder reads, so every backend runs the
// family's weights as separate matmuls (a backend that stacks matmuls stacks them again).
void split_fused(ModelWeights::State& s) {
  const ModelConfig& c = s.config;
  std::vector<TensorView> out;
  for (TensorView& t : s.tensors) {
    const std::string& n = t.name;
    const bool qkv = n.ends_with(".attn_qkv.weight");
    const bool gate_up = n.ends_with(".ffn_up.weight") && t.shape.size() == 2 && t.shape[0] == 2 * c.n_ff;
    if (!qkv && !gate_up) {
      out.push_back(std::move(t));
      continue;
    }
    const std::string p = n.substr(0, n.rfind('.', n.size() - std::string_view(".weight").size() - 1) + 1);
    if (qkv) {
      const int64_t q = c.n_head * c.head_dim, kv = c.n_head_kv * c.head_dim;
      TESSERA_CHECK(t.shape.size() == 2 && t.shape[0] == q + 2 * kv && t.shape[1] == c.n_embd,
                    "{}: tensor '{}' has shape {}, expected [{}, {}] (q, k and v stacked)", s.path, n,
                    graph::shape_string(t.shape), q + 2 * kv, c.n_embd);
      out.push_back(row_view(t, p + "attn_q.weight", 0, q));
      out.push_back(row_view(t, p + "attn_k.weight", q, kv));
      out.push_back(row_view(t, p + "attn_v.weight", q + kv, kv));
    } else {
      out.push_back(row_view(t, p + "ffn_gate.weight", 0, c.n_ff));
      out.push_back(row_view(t, p + "ffn_up.weight", c.n_ff, c.n_ff));
    }
  }
  s.tensors = std::move(out);
}

void build_index(ModelWeights::State& s) {
  for (size_t i = 0; i < s.tensors.size(); ++i) {
    const bool fresh = s.index.emplace(s.tensors[i].name, i).second;
    TESSERA_CHECK(fresh, "{}: tensor '{}' appears twice", s.path, s.tensors[i].name);
  }
}

}  // namespace

ModelWeights ModelWeights::open(const std::string& path) {
  auto s = std::make_shared<State>();
  s->path = path;
  if (looks_like_gguf(path)) {
    s->format = "gguf";
    s->gguf = std::make_shared<gguf::File>(gguf::File::open(path));
    s->config = config_from_gguf(*s->gguf);
    s->tensors = s->gguf->tensors();
    if (s->config.architecture == "phi3") split_fused(*s);
    load_ternary_weights(s->config, s->path, s->tensors, s->owned_bytes);
  } else {
    s->format = "safetensors";
    s->st = std::make_shared<safetensors::Model>(safetensors::Model::open(path));
    s->config = config_from_hf(s->st->config_json(), s->st->config_path());
    for (const TensorView& t : s->st->tensors()) {
      std::string name = safetensors::hf_to_gguf_name(t.name);
      if (name.empty()) continue;  // buffers such as rotary_emb.inv_freq
      TensorView v = t;
      v.name = std::move(name);
      s->tensors.push_back(std::move(v));
    }
    // Gemma 3's post_attention_layernorm is its attention post-norm and pre_feedforward_layernorm its FFN norm (the
    // name map gave them Llama's meanings, ffn_norm and pre_ffw_norm): GGUF's names, as llama.cpp's converter writes.
    if (s->config.architecture == "gemma3") {
      for (TensorView& t : s->tensors) {
        if (t.name.ends_with(".ffn_norm.weight"))
          t.name.replace(t.name.size() - std::string_view("ffn_norm.weight").size(), std::string::npos,
                         "post_attention_norm.weight");
        else if (t.name.ends_with(".pre_ffw_norm.weight"))
          t.name.replace(t.name.size() - std::string_view("pre_ffw_norm.weight").size(), std::string::npos,
                         "ffn_norm.weight");
      }
    }
    if (s->config.architecture == "phi3") split_fused(*s);
    load_ternary_weights(s->config, s->path, s->tensors, s->owned_bytes);
    if (s->config.architecture == "hgrn_bit") {
      // Its gate|up stack [2F, E] came in as ffn_gate: split it, ternarized as one matrix, as Phi-3's ffn_up.
      for (TensorView& t : s->tensors)
        if (t.name.ends_with(".ffn_gate.weight"))
          t.name.replace(t.name.size() - std::string_view("ffn_gate.weight").size(), std::string::npos,
                         "ffn_up.weight");
      split_fused(*s);
    }
    // Checkpoints with tie_word_embeddings may still ship lm_head.weight; config_from_hf decides, the file confirms.
    if (s->config.tied_output) {
      std::erase_if(s->tensors, [](const TensorView& t) { return t.name == "output.weight"; });
    } else {
      bool has_output = false;
      for (const TensorView& t : s->tensors) has_output |= t.name == "output.weight";
      if (!has_output) s->config.tied_output = true;
    }
  }
  build_index(*s);
  to_f32_where_needed(*s);
  ModelWeights w;
  w.s_ = std::move(s);
  return w;
}

ModelWeights ModelWeights::from_views(ModelConfig config, std::vector<TensorView> views, std::string name) {
  auto s = std::make_shared<State>();
  s->path = std::move(name);
  s->format = "memory";
  s->config = std::move(config);
  s->tensors = std::move(views);
  build_index(*s);
  to_f32_where_needed(*s);
  ModelWeights w;
  w.s_ = std::move(s);
  return w;
}

const ModelConfig& ModelWeights::config() const { return s_->config; }
const std::string& ModelWeights::path() const { return s_->path; }
const std::string& ModelWeights::format() const { return s_->format; }
const std::vector<TensorView>& ModelWeights::tensors() const { return s_->tensors; }
const gguf::File* ModelWeights::gguf_file() const { return s_->gguf.get(); }
const safetensors::Model* ModelWeights::safetensors() const { return s_->st.get(); }

const TensorView* ModelWeights::find(std::string_view gguf_name) const {
  auto it = s_->index.find(std::string(gguf_name));
  return it == s_->index.end() ? nullptr : &s_->tensors[it->second];
}

const TensorView& ModelWeights::require(std::string_view gguf_name, const std::vector<int64_t>& shape) const {
  const TensorView* t = find(gguf_name);
  TESSERA_CHECK(t != nullptr, "{}: tensor '{}' is missing", s_->path, gguf_name);
  TESSERA_CHECK(t->shape == shape, "{}: tensor '{}' has shape {}, expected {}", s_->path, gguf_name,
                graph::shape_string(t->shape), graph::shape_string(shape));
  return *t;
}

}  // namespace tessera
