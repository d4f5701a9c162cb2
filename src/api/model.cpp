#include <fmt/core.h>

#include "api/model_impl.h"
#include "core/error.h"
#include "formats/gguf.h"
#include "formats/model_format.h"
#include "tessera/model_info.h"

namespace tessera {

namespace {

// A GGUF holds its vocabulary and its embedding together, so their sizes must agree, as llama.cpp requires: with
// fewer tokens than rows the model generates ids the tokenizer cannot decode. (A safetensors config.json's
// vocab_size is often padded past its tokenizer.json; the tokenizer check in Model::load covers that case.)
void check_gguf_vocabulary(const ModelWeights& w, const ModelConfig& c, const std::string& path) {
  const gguf::File* f = w.gguf_file();
  if (f == nullptr) return;
  const gguf::Value* tokens = f->find("tokenizer.ggml.tokens");
  const int64_t n_tokens = tokens != nullptr && tokens->is_array() ? static_cast<int64_t>(tokens->len) : c.n_vocab;
  std::string differs;  // what disagrees with the token count, for the one sentence
  auto add = [&](const std::string& part) {
    if (!differs.empty()) differs.append(" and ");
    differs.append(part);
  };
  for (const char* name : {"token_embd.weight", "output.weight"}) {
    const TensorView* t = w.find(name);  // output.weight is absent when tied to the embedding
    if (t != nullptr && !t->shape.empty() && t->shape[0] != n_tokens) {
      add(fmt::format("{} has {} rows", name, t->shape[0]));
    }
  }
  if (c.n_vocab != n_tokens) add(fmt::format("{}.vocab_size is {}", c.architecture, c.n_vocab));
  TESSERA_CHECK(differs.empty(), "{}: the vocabulary (tokenizer.ggml.tokens) has {} tokens but {}; they must be equal",
                path, n_tokens, differs);
}

}  // namespace

Model Model::load(const std::string& path, const ModelOptions& options) {
  const std::string resolved = resolve_model_path(path);
  (void)detect_model_format(resolved);  // one "not a GGUF or safetensors model" for every command
  auto impl = std::make_shared<Impl>();
  impl->path = resolved;
  impl->weights = ModelWeights::open(resolved);
  const ModelConfig& c = impl->weights.config();
  check_gguf_vocabulary(impl->weights, c, resolved);
  impl->spec = spec_of(c);
  if (options.load_tokenizer) {
    impl->tokenizer.emplace(Tokenizer::from_model(resolved));
    TESSERA_CHECK(impl->tokenizer->n_vocab() <= c.n_vocab,
                  "{}: the tokenizer has {} tokens but the model's vocabulary only {}", resolved,
                  impl->tokenizer->n_vocab(), c.n_vocab);
  }
  Model m;
  m.impl_ = std::move(impl);
  return m;
}

Model::Model() = default;
Model::~Model() = default;
Model::Model(const Model&) = default;
Model& Model::operator=(const Model&) = default;

namespace {
const Model::Impl& need(const std::shared_ptr<Model::Impl>& impl) {
  TESSERA_CHECK(impl != nullptr, "no model is loaded");
  return *impl;
}
}  // namespace

std::shared_ptr<const LoraSet> Model::Impl::lora_set(const std::vector<LoraSpec>& specs, bool merge, DType dtype,
                                                     int64_t rank_multiple) {
  if (specs.empty()) return nullptr;
  std::lock_guard<std::mutex> lock(lora_mu);
  std::string set_key = merge ? "merged" : fmt::format("unmerged {} ranks x{}", dtype_name(dtype), rank_multiple);
  std::vector<std::shared_ptr<const LoraAdapter>> adapters;
  for (const LoraSpec& s : specs) {
    const std::string key = fmt::format("{}:{}", s.scale, s.path);
    set_key += "\n" + key;
    auto& a = lora_adapters[key];
    if (!a) a = std::make_shared<const LoraAdapter>(load_lora_adapter(s.path, s.scale, weights));
    adapters.push_back(a);
  }
  auto& set = lora_sets[set_key];
  if (!set) set = make_lora_set(std::move(adapters), merge, weights, dtype, rank_multiple);
  return set;
}

const std::string& Model::path() const { return need(impl_).path; }
const std::string& Model::format() const { return need(impl_).weights.format(); }
const ModelSpec& Model::spec() const { return need(impl_).spec; }
bool Model::has_tokenizer() const { return impl_ != nullptr && impl_->tokenizer.has_value(); }

const Tokenizer& Model::tokenizer() const {
  const Impl& m = need(impl_);
  TESSERA_CHECK(m.tokenizer.has_value(), "{}: the model was loaded without a tokenizer", m.path);
  return *m.tokenizer;
}

}  // namespace tessera
