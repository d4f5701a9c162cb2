#include "api/model_impl.h"
#include "core/error.h"
#include "formats/model_format.h"
#include "tessera/model_info.h"

namespace tessera {

Model Model::load(const std::string& path, const ModelOptions& options) {
  const std::string resolved = resolve_model_path(path);
  (void)detect_model_format(resolved);  // one "not a GGUF or safetensors model" for every command
  auto impl = std::make_shared<Impl>();
  impl->path = resolved;
  impl->weights = ModelWeights::open(resolved);
  const ModelConfig& c = impl->weights.config();
  ModelSpec& s = impl->spec;
  s.architecture = c.architecture;
  s.name = c.name;
  s.n_layers = c.n_layers;
  s.n_embd = c.n_embd;
  s.n_head = c.n_head;
  s.n_head_kv = c.n_head_kv;
  s.head_dim = c.head_dim;
  s.n_ff = c.n_ff;
  s.n_vocab = c.n_vocab;
  s.n_ctx_train = c.n_ctx_train;
  s.sliding_window = c.sliding_window;
  s.tied_output = c.tied_output;
  s.rope_scaling = c.rope_scaling.type;
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
