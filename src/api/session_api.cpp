#include <algorithm>

#include "api/model_impl.h"
#include "core/error.h"
#include "runtime/session.h"
#include "tessera/calibrate.h"
#include "tessera/session.h"

namespace tessera {

std::string_view stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::END_OF_GENERATION:
      return "eos";
    case StopReason::STOP_STRING:
      return "stop";
    case StopReason::MAX_TOKENS:
      return "length";
    case StopReason::CONTEXT_FULL:
      return "context_full";
    case StopReason::CALLBACK:
      return "callback";
  }
  return "?";
}

LoraSpec LoraSpec::parse(const std::string& spec) {
  const auto [path, scale] = parse_lora_spec(spec);
  return {path, scale};
}

struct Session::Impl {
  Model model;
  SessionOptions options;
  std::unique_ptr<runtime::Engine> engine;
};

Session::Session(const Model& model, const SessionOptions& options) : impl_(std::make_unique<Impl>()) {
  TESSERA_CHECK(model.loaded(), "no model is loaded");
  impl_->model = model;
  impl_->options = options;
  Model::Impl& m = *model.impl();
  runtime::EngineOptions eo = runtime::resolve_options(options, m.weights.config());
  if (!options.teal.empty()) eo.sparsify.thresholds = load_teal_thresholds(model, options.teal);
  // Reference sessions run the adapters in f32 (the golden checks' precision), fast ones in f16 (half the bytes); CUDA
  // sessions with ranks padded to a multiple of 8 (LoraSet::rank_multiple).
  eo.lora = m.lora_set(options.lora, options.lora_merge, eo.reference ? DType::F32 : DType::F16,
                       eo.device == "cuda" ? 8 : 1);
  impl_->engine = std::make_unique<runtime::Engine>(m.weights, m.weight_store(eo.device), eo);
}

Session::~Session() = default;
Session::Session(Session&&) noexcept = default;
Session& Session::operator=(Session&&) noexcept = default;

const Model& Session::model() const { return impl_->model; }
int64_t Session::n_ctx() const { return impl_->engine->n_ctx(); }
int64_t Session::n_batch() const { return impl_->engine->options().n_batch; }
int Session::n_threads() const { return impl_->engine->n_threads(); }
std::vector<AdapterInfo> Session::adapters() const {
  std::vector<AdapterInfo> out;
  const std::shared_ptr<const LoraSet>& set = impl_->engine->options().lora;
  if (!set) return out;
  for (size_t i = 0; i < set->adapters.size(); ++i) {
    const LoraAdapter& a = *set->adapters[i];
    AdapterInfo info;
    info.path = a.path;
    info.format = a.format;
    info.matmuls = static_cast<int64_t>(a.targets.size());
    for (const LoraTarget& t : a.targets) info.max_rank = std::max(info.max_rank, t.rank);
    if (i < impl_->options.lora.size()) info.scale = impl_->options.lora[i].scale;
    info.merged = set->merged;
    out.push_back(std::move(info));
  }
  return out;
}
double Session::achieved_sparsity() const {
  const auto [zeros, total] = impl_->engine->sparsity_counts();
  return total ? static_cast<double>(zeros) / static_cast<double>(total) : 0.0;
}
void Session::reset_achieved_sparsity() { impl_->engine->reset_sparsity_counts(); }
void Session::record_activation_histograms(bool on) { impl_->engine->record_activation_histograms(on); }
std::map<int, std::vector<uint64_t>> Session::take_activation_histograms() {
  return impl_->engine->take_activation_histograms();
}
void Session::set_node_tap(std::function<void(const NodeTapEvent&)> tap) {
  if (!tap) {
    impl_->engine->set_node_tap({});
    return;
  }
  impl_->engine->set_node_tap([tap = std::move(tap)](int node, int64_t rows, int64_t pos, const float* in, float* out) {
    tap({node, rows, pos, in, out});
  });
}
bool Session::reference() const { return impl_->engine->options().reference; }
std::string Session::kv_dtype() const { return std::string(dtype_name(impl_->engine->options().kv_dtype)); }
int64_t Session::n_vocab() const { return impl_->engine->n_vocab(); }
const std::vector<int32_t>& Session::tokens() const { return impl_->engine->tokens(); }
int64_t Session::n_past() const { return impl_->engine->n_past(); }
void Session::truncate(int64_t n) { impl_->engine->truncate(n); }
std::span<const float> Session::eval(std::span<const int32_t> ids) { return impl_->engine->eval(ids); }
std::span<const float> Session::logits() const { return impl_->engine->logits(); }

std::vector<float> Session::eval_all_logits(std::span<const int32_t> ids) {
  std::vector<float> out(ids.size() * static_cast<size_t>(n_vocab()));
  impl_->engine->eval(ids, out.data());
  return out;
}

std::vector<double> Session::eval_target_logprobs(std::span<const int32_t> ids, std::span<const int32_t> targets) {
  const std::vector<backend::RowScore> s = impl_->engine->eval_scores(ids, targets);
  std::vector<double> out(s.size());
  for (size_t i = 0; i < s.size(); ++i) out[i] = targets[i] < 0 ? 0.0 : s[i].target_logit - s[i].lse;
  return out;
}

bool Session::scores_on_device() const { return impl_->engine->device_scores(); }

GenerateResult Session::generate(std::string_view prompt, const GenerateOptions& options, const TextCallback& on_text) {
  const Tokenizer& tok = impl_->model.tokenizer();
  // BOS only at the start of a context; control-token text in the prompt (chat markup) becomes those tokens.
  const std::vector<int32_t> ids = tok.encode(prompt, /*add_special=*/n_past() == 0, /*parse_special=*/true);
  TESSERA_CHECK(!ids.empty() || n_past() > 0, "the prompt is empty");
  return generate_tokens(ids, options, on_text);
}

GenerateResult Session::generate_tokens(std::span<const int32_t> prompt, const GenerateOptions& options,
                                        const TextCallback& on_text) {
  const Tokenizer* tok = impl_->model.has_tokenizer() ? &impl_->model.tokenizer() : nullptr;
  return runtime::generate(*impl_->engine, tok, prompt, options, on_text);
}

GraphView Session::graph(int64_t n_tokens, int64_t n_past) const {
  TESSERA_CHECK(n_tokens > 0 && n_past >= 0 && n_past + n_tokens <= n_ctx(),
                "{} tokens at position {} do not fit the context of {}", n_tokens, n_past, n_ctx());
  return make_graph_view(impl_->engine->build_graph(n_tokens, n_past, false));
}

int64_t Session::n_seq() const { return impl_->engine->n_seq(); }
int64_t Session::n_past(int64_t seq) const { return impl_->engine->n_past(seq); }
const std::vector<int32_t>& Session::tokens(int64_t seq) const { return impl_->engine->tokens(seq); }
void Session::truncate(int64_t seq, int64_t n) { impl_->engine->truncate(seq, n); }

std::vector<float> Session::eval_seq(int64_t seq, std::span<const int32_t> ids, bool all_logits) {
  if (all_logits) {
    std::vector<float> out(ids.size() * static_cast<size_t>(n_vocab()));
    impl_->engine->eval_seq(seq, ids, out.data());
    return out;
  }
  const std::span<const float> l = impl_->engine->eval_seq(seq, ids);
  return {l.begin(), l.end()};
}

std::span<const float> Session::decode_batch(std::span<const int32_t> tokens, std::span<const int32_t> seqs) {
  return impl_->engine->decode_batch(tokens, seqs);
}

std::vector<int32_t> Session::decode_batch_greedy(std::span<const int32_t> tokens, std::span<const int32_t> seqs) {
  return impl_->engine->decode_batch_greedy(tokens, seqs);
}

int32_t Session::decode_greedy(int32_t id) {
  const int32_t seq = 0;
  return impl_->engine->decode_batch_greedy(std::span<const int32_t>(&id, 1), std::span<const int32_t>(&seq, 1))[0];
}

int64_t Session::decode_greedy_chain(int32_t id, int64_t n, const std::function<bool(int32_t)>& on_token) {
  return impl_->engine->decode_greedy_chain(id, n, on_token);
}

std::vector<GenerateResult> Session::generate_batch(std::span<const std::vector<int32_t>> prompts,
                                                    const GenerateOptions& options) {
  const Tokenizer* tok = impl_->model.has_tokenizer() ? &impl_->model.tokenizer() : nullptr;
  return runtime::generate_batch(*impl_->engine, tok, prompts, options);
}

void Session::set_profiling(bool on) { impl_->engine->set_profiling(on); }
std::vector<uint64_t> Session::profile_ns(int64_t n_tokens) const { return impl_->engine->profile_ns(n_tokens); }
std::vector<uint64_t> Session::profile_thread_spans(int64_t n_tokens) const {
  return impl_->engine->profile_thread_spans(n_tokens);
}

}  // namespace tessera
