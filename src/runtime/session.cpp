#include "runtime/session.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string_view>

#include "core/error.h"
#include "models/model_graph.h"
#include "runtime/sampler.h"

namespace tessera::runtime {

namespace {

constexpr int64_t kMaxBatch = 1 << 14;
constexpr int64_t kMaxSeq = 1024;
constexpr int64_t kDefaultCtxWithoutMetadata = 4096;

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

uint64_t peak_rss_bytes() {
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) != 0) return 0;
  return static_cast<uint64_t>(u.ru_maxrss) * 1024;  // Linux reports KiB
}

EngineOptions resolve_options(const SessionOptions& o, const ModelConfig& c) {
  EngineOptions e;
  TESSERA_CHECK(o.n_ctx >= 0, "context size {} must not be negative", o.n_ctx);
  const int64_t limit = c.n_ctx_train > 0 ? c.n_ctx_train : 0;
  if (o.n_ctx == 0) {
    e.n_ctx = limit > 0 ? limit : kDefaultCtxWithoutMetadata;
    // A model whose every layer slides (Mistral) keeps its default context within the window, where the window
    // changes nothing and every backend runs it (the CUDA executors run no sliding window yet); a longer context is
    // asked for explicitly and runs on the CPU.
    bool every_layer_slides = c.sliding_window > 0;
    for (int64_t l = 0; l < c.n_layers; ++l) every_layer_slides &= c.is_local_layer(l);
    if (every_layer_slides) e.n_ctx = std::min(e.n_ctx, c.sliding_window);
  } else {
    TESSERA_CHECK(limit == 0 || o.n_ctx <= limit, "context size {} exceeds the model's trained context of {} tokens",
                  o.n_ctx, limit);
    e.n_ctx = o.n_ctx;
  }
  TESSERA_CHECK(o.n_batch > 0 && o.n_batch <= kMaxBatch, "batch size {} must be between 1 and {}", o.n_batch,
                kMaxBatch);
  e.n_batch = std::min(o.n_batch, e.n_ctx);
  TESSERA_CHECK(o.n_threads >= 0 && o.n_threads <= 1024, "thread count {} must be between 0 (all cores) and 1024",
                o.n_threads);
  e.n_threads = o.n_threads;
  e.reference = o.reference;
  TESSERA_CHECK(o.n_seq >= 1 && o.n_seq <= kMaxSeq, "sequence count {} must be between 1 and {}", o.n_seq, kMaxSeq);
  e.n_seq = o.n_seq;
  if (o.kv_dtype.empty()) {
    e.kv_dtype = o.reference ? DType::F32 : DType::F16;
  } else if (o.kv_dtype == "f16") {
    e.kv_dtype = DType::F16;
  } else if (o.kv_dtype == "f32") {
    e.kv_dtype = DType::F32;
  } else {
    fail("kv cache type '{}' is not supported (f16 or f32)", o.kv_dtype);
  }
  // The registry says why a device cannot run here (unknown, not built in, no GPU or driver); the backend checks
  // the rest of the options against what it can do when the session opens.
  const backend::Backend& dev = backend::get(o.device);
  TESSERA_CHECK(!o.reference || dev.capabilities().reference_mode,
                "the reference path runs on the CPU only, not on device '{}'", o.device);
  e.device = o.device;
  e.backend_options = o.backend_options;
  check_teal_options(o.sparsity, o.teal);
  e.sparsify.sparsity = o.sparsity;
  e.sparsify.all_rows = o.sparsify_prefill;
  return e;
}

void check_teal_options(float sparsity, const std::string& teal) {
  TESSERA_CHECK(sparsity >= 0 && sparsity < 1, "sparsity {} must be at least 0 and below 1", sparsity);
  TESSERA_CHECK(sparsity == 0 || teal.empty(),
                "--sparsity and --teal both set the activation sparsity; give one of them");
}

Engine::Engine(ModelWeights weights, std::shared_ptr<backend::WeightStore> store, const EngineOptions& options)
    : w_(std::move(weights)), o_(options) {
  const size_t n_seq = static_cast<size_t>(o_.n_seq);
  tokens_.resize(n_seq);
  logits_.assign(n_seq, std::vector<float>(static_cast<size_t>(w_.config().n_vocab), 0.0f));
  has_logits_.assign(n_seq, false);
  const backend::Backend& b = backend::get(o_.device);
  caps_ = b.capabilities();
  if (!store) store = b.make_weight_store();
  backend::SessionConfig c;
  c.n_ctx = o_.n_ctx;
  c.n_batch = o_.n_batch;
  c.n_seq = o_.n_seq;
  c.n_threads = o_.n_threads;
  c.reference = o_.reference;
  c.kv_dtype = o_.kv_dtype;
  c.options = o_.backend_options;
  c.build_graph = [this](int64_t n_tokens, bool all_logits, bool decode_rows) {
    return build_graph(n_tokens, 0, all_logits, decode_rows);
  };
  dev_ = b.open(c, std::move(store));
}

graph::Graph Engine::build_graph(int64_t n_tokens, int64_t n_past, bool all_logits, bool decode_rows) const {
  // Batched decode rows are decode steps: TEAL thresholds each of them (a prompt chunk stays dense unless asked).
  graph::SparsifyOptions so = o_.sparsify;
  so.all_rows |= decode_rows;
  return graph::sparsify(build_model_graph(w_, ModelGraphOptions{.n_tokens = n_tokens,
                                                                 .n_past = n_past,
                                                                 .n_ctx = std::max(o_.n_ctx, n_past + n_tokens),
                                                                 .kv_dtype = o_.kv_dtype,
                                                                 .all_logits = all_logits,
                                                                 .lora = o_.lora.get()}),
                         so);
}

void Engine::check_seq(int64_t seq) const {
  TESSERA_CHECK(seq >= 0 && seq < o_.n_seq, "sequence {} is outside the {} sequences of this session", seq, o_.n_seq);
}

const std::vector<int32_t>& Engine::tokens(int64_t seq) const {
  check_seq(seq);
  return tokens_[static_cast<size_t>(seq)];
}

void Engine::stepped_without_logits(std::span<const int32_t> seqs) {
  for (int32_t sq : seqs) has_logits_[static_cast<size_t>(sq)] = false;
}

void Engine::check_eval(int64_t seq, std::span<const int32_t> ids) const {
  check_seq(seq);
  TESSERA_CHECK(!ids.empty(), "nothing to evaluate: the token list is empty");
  const int64_t n = static_cast<int64_t>(ids.size());
  TESSERA_CHECK(n_past(seq) + n <= o_.n_ctx,
                "the context is full: {} more tokens do not fit after {} of {} (raise the context size with -c)", n,
                n_past(seq), o_.n_ctx);
  const int64_t vocab = n_vocab();
  for (int32_t id : ids)
    TESSERA_CHECK(id >= 0 && id < vocab, "token id {} is outside the vocabulary of {} tokens", id, vocab);
}

std::span<const float> Engine::eval_seq(int64_t seq, std::span<const int32_t> ids, float* all) {
  check_eval(seq, ids);
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t vocab = n_vocab();
  const size_t s = static_cast<size_t>(seq);
  std::vector<int32_t>& toks = tokens_[s];
  if (seq == 0) device_logits_ = false;
  for (int64_t done = 0; done < n;) {
    const int64_t chunk = std::min(o_.n_batch, n - done);
    const std::span<const int32_t> part = ids.subspan(static_cast<size_t>(done), static_cast<size_t>(chunk));
    has_logits_[s] = false;
    const float* out = dev_->eval(seq, part, n_past(seq), all != nullptr).data();
    toks.insert(toks.end(), part.begin(), part.end());
    // A one-token chunk's logits are its only row, whichever graph ran it.
    const int64_t rows = all != nullptr ? chunk : 1;
    if (all != nullptr) std::memcpy(all + done * vocab, out, static_cast<size_t>(chunk * vocab) * sizeof(float));
    std::memcpy(logits_[s].data(), out + (rows - 1) * vocab, static_cast<size_t>(vocab) * sizeof(float));
    has_logits_[s] = true;
    done += chunk;
  }
  return logits_[s];
}

std::vector<backend::RowScore> Engine::eval_scores(std::span<const int32_t> ids, std::span<const int32_t> targets) {
  TESSERA_CHECK(targets.size() == ids.size(), "scoring {} tokens needs as many targets, not {}", ids.size(),
                targets.size());
  check_eval(0, ids);
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t vocab = n_vocab();
  for (int32_t t : targets)  // -1: a row not scored
    TESSERA_CHECK(t >= -1 && t < vocab, "target token {} is outside the vocabulary of {} tokens", t, vocab);
  std::vector<backend::RowScore> out;
  out.reserve(ids.size());
  std::vector<int32_t>& toks = tokens_[0];
  device_logits_ = false;
  for (int64_t done = 0; done < n;) {
    const int64_t chunk = std::min(o_.n_batch, n - done);
    const auto part = ids.subspan(static_cast<size_t>(done), static_cast<size_t>(chunk));
    has_logits_[0] = false;
    const std::span<const backend::RowScore> s =
        dev_->eval_scores(0, part, n_past(0), targets.subspan(static_cast<size_t>(done), static_cast<size_t>(chunk)));
    toks.insert(toks.end(), part.begin(), part.end());
    out.insert(out.end(), s.begin(), s.end());
    done += chunk;
  }
  return out;
}

void Engine::check_batch(std::span<const int32_t> ids, std::span<const int32_t> seqs) const {
  TESSERA_CHECK(!ids.empty(), "nothing to decode: the token list is empty");
  TESSERA_CHECK(ids.size() == seqs.size(), "batched decode got {} tokens for {} sequences", ids.size(), seqs.size());
  TESSERA_CHECK(static_cast<int64_t>(ids.size()) <= o_.n_seq,
                "batched decode of {} tokens exceeds the {} sequences of this session", ids.size(), o_.n_seq);
  const int64_t vocab = n_vocab();
  std::vector<bool> seen(static_cast<size_t>(o_.n_seq), false);
  for (size_t i = 0; i < ids.size(); ++i) {
    check_seq(seqs[i]);
    TESSERA_CHECK(!seen[static_cast<size_t>(seqs[i])], "sequence {} appears twice in one batched decode step", seqs[i]);
    seen[static_cast<size_t>(seqs[i])] = true;
    TESSERA_CHECK(ids[i] >= 0 && ids[i] < vocab, "token id {} is outside the vocabulary of {} tokens", ids[i], vocab);
    TESSERA_CHECK(n_past(seqs[i]) < o_.n_ctx, "the context of sequence {} is full ({} tokens)", seqs[i], o_.n_ctx);
  }
}

std::vector<int32_t> Engine::decode_batch_greedy(std::span<const int32_t> ids, std::span<const int32_t> seqs) {
  check_batch(ids, seqs);
  if (!caps_.device_argmax) {
    const std::span<const float> l = decode_batch(ids, seqs);
    const size_t vocab = static_cast<size_t>(n_vocab());
    std::vector<int32_t> out(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) out[i] = argmax_first(l.subspan(i * vocab, vocab));
    return out;
  }
  std::vector<int32_t> pos(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) pos[i] = static_cast<int32_t>(n_past(seqs[i]));
  std::vector<int32_t> out = dev_->decode_rows_argmax(ids, seqs, pos);
  for (size_t i = 0; i < ids.size(); ++i) tokens_[static_cast<size_t>(seqs[i])].push_back(ids[i]);
  stepped_without_logits(seqs);  // only the argmax came back
  // A lone slot-0 step ran on the decoder, whose logits logits(0) can fetch; a batch's rows are gone.
  device_logits_ = ids.size() == 1 && seqs[0] == 0;
  return out;
}

int64_t Engine::decode_greedy_chain(int32_t first, int64_t n, const std::function<bool(int32_t)>& on_token) {
  const int32_t slot = 0;
  check_batch(std::span<const int32_t>(&first, 1), std::span<const int32_t>(&slot, 1));
  n = std::min(n, o_.n_ctx - n_past(0));
  if (n <= 0) return 0;
  if (caps_.chained_greedy) {
    device_logits_ = false;  // slot 0 moves on
    has_logits_[0] = false;
    std::vector<int32_t>& toks = tokens_[0];
    const size_t before = toks.size();
    toks.push_back(first);  // evaluated by the first step; each accepted argmax but the last is evaluated next
    int64_t calls = 0;
    int64_t evaluated = 0;
    try {
      evaluated = dev_->generate_greedy(first, static_cast<int64_t>(before), n, [&](int32_t id) {
        ++calls;
        if (!on_token(id)) return false;
        if (calls < n) toks.push_back(id);
        return true;
      });
    } catch (...) {
      toks.resize(before);  // what was evaluated is unknown: the context goes back to before the call
      throw;
    }
    device_logits_ = true;  // logits(0) fetches them if the device still holds them
    return evaluated;
  }
  int64_t done = 0;
  for (int32_t t = first; done < n;) {
    t = decode_batch_greedy(std::span<const int32_t>(&t, 1), std::span<const int32_t>(&slot, 1))[0];
    ++done;
    if (!on_token(t)) break;
  }
  return done;
}

int32_t Engine::decode_sampled(int32_t token, Sampler& sampler) {
  if (caps_.device_sampling) {
    const int32_t slot = 0;
    check_batch(std::span<const int32_t>(&token, 1), std::span<const int32_t>(&slot, 1));
    const SamplingOptions& so = sampler.options();
    std::vector<int32_t>& toks = tokens_[0];
    const int64_t pos = n_past(0);
    toks.push_back(token);  // the penalty window includes it, as the context after eval does for Sampler::sample
    pen_counts_.clear();
    if (so.repeat_penalty != 1.0f || so.frequency_penalty != 0.0f || so.presence_penalty != 0.0f)
      penalty_counts(toks, so.penalty_last_n, static_cast<size_t>(n_vocab()), pen_scratch_, pen_counts_);
    backend::SampleRequest req{so.temperature,
                               so.top_k,
                               so.top_p,
                               so.min_p,
                               so.repeat_penalty,
                               so.frequency_penalty,
                               so.presence_penalty,
                               &pen_counts_,
                               sampler.peek_uniform()};
    std::optional<std::pair<int32_t, int32_t>> r;
    device_logits_ = false;
    has_logits_[0] = false;
    try {
      r = dev_->decode_sample(token, pos, req);
    } catch (...) {
      toks.pop_back();
      throw;
    }
    if (r) {
      device_logits_ = true;  // logits(0) fetches them if asked
      // Sampler::sample draws a number only when more than one candidate is left; greedy on all-NaN logits gives 0.
      if (r->second > 1) sampler.take_uniform();
      TESSERA_CHECK(r->second > 0 || so.temperature <= 0, "sampling: every logit is NaN");
      return r->first;
    }
    toks.pop_back();  // the backend declined (sampling on the host by option): nothing was evaluated
  }
  const std::span<const float> l = eval(std::span<const int32_t>(&token, 1));
  return sampler.sample(l, tokens_[0]);
}

std::span<const float> Engine::decode_batch(std::span<const int32_t> ids, std::span<const int32_t> seqs) {
  check_batch(ids, seqs);
  if (std::find(seqs.begin(), seqs.end(), 0) != seqs.end()) device_logits_ = false;  // slot 0 moves on
  const int64_t b = static_cast<int64_t>(ids.size());
  const int64_t vocab = n_vocab();
  if (caps_.batched_decode) {
    std::vector<int32_t> pos(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) pos[i] = static_cast<int32_t>(n_past(seqs[i]));
    stepped_without_logits(seqs);
    // The executor's pinned buffer is returned as is: it stays valid until that executor's next step.
    const std::span<const float> out = dev_->decode_rows(ids, seqs, pos);
    for (size_t i = 0; i < ids.size(); ++i) {
      const size_t sq = static_cast<size_t>(seqs[i]);
      tokens_[sq].push_back(ids[i]);
      std::memcpy(logits_[sq].data(), out.data() + i * static_cast<size_t>(vocab),
                  static_cast<size_t>(vocab) * sizeof(float));
      has_logits_[sq] = true;
    }
    return out;
  }
  batch_logits_.resize(static_cast<size_t>(b * vocab));
  // The CPU runs the rows one after another (correct, not fast): each through its slot's decode plan.
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::span<const float> l = eval_seq(seqs[i], ids.subspan(i, 1));
    std::memcpy(batch_logits_.data() + i * static_cast<size_t>(vocab), l.data(),
                static_cast<size_t>(vocab) * sizeof(float));
  }
  return batch_logits_;
}

std::span<const float> Engine::logits(int64_t seq) {
  check_seq(seq);
  const size_t s = static_cast<size_t>(seq);
  if (s == 0 && !has_logits_[0] && device_logits_) {
    const std::span<const float> l = dev_->last_logits();  // empty when a dropped chained step overwrote them
    if (l.size() == logits_[0].size()) {
      std::memcpy(logits_[0].data(), l.data(), l.size() * sizeof(float));
      has_logits_[0] = true;
    }
    device_logits_ = false;
  }
  return has_logits_[s] ? std::span<const float>(logits_[s]) : std::span<const float>();
}

void Engine::truncate(int64_t seq, int64_t n) {
  check_seq(seq);
  TESSERA_CHECK(n >= 0, "cannot keep {} tokens", n);
  if (n >= n_past(seq)) return;
  tokens_[static_cast<size_t>(seq)].resize(static_cast<size_t>(n));
  has_logits_[static_cast<size_t>(seq)] = false;  // the logits belonged to a token that is gone
  if (seq == 0) device_logits_ = false;
}

// ---------------------------------------------------------------------------------------------------------------------
// Generation

namespace {

// Bytes at the end of `text` that might begin a stop string: they are held back until the next token decides.
size_t held_back(const std::string& text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const std::string& s : stops)
    for (size_t k = std::min(s.size() - 1, text.size()); k > hold; --k)
      if (text.compare(text.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  return hold;
}

// One sequence's generation state: sampling, end-of-generation, stop strings (text held back while it may still
// begin one), streaming. The caller evaluates each token next() returns and feeds back the logits that follow.
class Generation {
 public:
  Generation(const Tokenizer* tokenizer, const GenerateOptions& options, const SamplingOptions& sampling,
             const TextCallback* on_text)
      : options_(options), tokenizer_(tokenizer), sampler_(sampling), on_text_(on_text) {
    r_.seed = sampler_.seed();
    for (const std::string& s : options.stop)
      if (!s.empty()) stops_.push_back(s);
    for (const std::string& s : stops_) longest_stop_ = std::max(longest_stop_, s.size());
    if (tokenizer != nullptr) decoder_.emplace(*tokenizer, options.render_special);
    r_.stop_reason = StopReason::MAX_TOKENS;
  }

  GenerateResult& result() { return r_; }

  // Samples the next token from `logits` (penalties look at `context`); the token to evaluate next, or none when the
  // generation stopped (the reason is in the result). `full`: the context has no room for another token.
  std::optional<int32_t> next(std::span<const float> logits, const std::vector<int32_t>& context, bool full) {
    if (at_max_tokens()) return std::nullopt;
    return accept(sampler_.sample(logits, context), full);
  }

  // As next(), for a token already picked (greedy decoding with the argmax on the device).
  std::optional<int32_t> next_picked(int32_t id, bool full) {
    if (at_max_tokens()) return std::nullopt;
    return accept(id, full);
  }

  // Steps a greedy loop may still evaluate before max_tokens stops it (the step whose pick would exceed it included,
  // as the step-by-step loop evaluates it); unbounded without max_tokens.
  int64_t steps_left() const {
    if (options_.max_tokens < 0) return std::numeric_limits<int64_t>::max();
    return std::max<int64_t>(0, options_.max_tokens - static_cast<int64_t>(r_.tokens.size()) + 1);
  }

  // Whether next() would sample after the token just accepted (false: max_tokens reached, it returns none).
  bool wants_more() const {
    return options_.max_tokens < 0 || static_cast<int64_t>(r_.tokens.size()) < options_.max_tokens;
  }
  Sampler& sampler() { return sampler_; }

  // Greedy without penalties: the sampler would return the logits' argmax, which the engine can pick by itself.
  static bool plain_greedy(const SamplingOptions& s) {
    return s.temperature <= 0 && s.repeat_penalty == 1.0f && s.frequency_penalty == 0.0f && s.presence_penalty == 0.0f;
  }

 private:
  bool at_max_tokens() {
    if (wants_more()) return false;
    r_.stop_reason = StopReason::MAX_TOKENS;
    return true;
  }

  std::optional<int32_t> accept(int32_t id, bool full) {
    if (!options_.ignore_eos && tokenizer_ != nullptr && tokenizer_->is_eog(id)) {
      r_.stop_reason = StopReason::END_OF_GENERATION;
      return std::nullopt;
    }
    r_.tokens.push_back(id);
    if (decoder_) {
      const size_t before = r_.text.size();
      r_.text += decoder_->push(id);
      if (!stops_.empty()) {
        const size_t from = before >= longest_stop_ ? before - longest_stop_ + 1 : 0;
        size_t at = std::string::npos;
        for (const std::string& s : stops_) at = std::min(at, r_.text.find(s, from));
        if (at != std::string::npos) {
          r_.text.resize(at);
          emit_upto(at);
          stopped_by_string_ = true;
          r_.stop_reason = StopReason::STOP_STRING;
          return std::nullopt;
        }
      }
      if (!emit_upto(r_.text.size() - held_back(r_.text, stops_))) {
        r_.stop_reason = StopReason::CALLBACK;
        return std::nullopt;
      }
    }
    if (full) {
      r_.stop_reason = StopReason::CONTEXT_FULL;
      return std::nullopt;
    }
    return id;
  }

 public:
  // Flushes held-back text and fills the timings (generate_ms measured from t_gen).
  GenerateResult finish(std::chrono::steady_clock::time_point t_gen) {
    if (decoder_ && !stopped_by_string_) {
      r_.text += decoder_->flush();
      if (r_.stop_reason != StopReason::CALLBACK) emit_upto(r_.text.size());
    }
    r_.timings.generated_tokens = static_cast<int64_t>(r_.tokens.size());
    r_.timings.generate_ms = ms_since(t_gen);
    r_.timings.peak_rss_bytes = peak_rss_bytes();
    return std::move(r_);
  }

 private:
  bool emit_upto(size_t end) {
    if (end <= emitted_) return true;
    const bool go_on =
        on_text_ == nullptr || !*on_text_ || (*on_text_)(std::string_view(r_.text).substr(emitted_, end - emitted_));
    emitted_ = end;
    return go_on;
  }

  const GenerateOptions& options_;
  const Tokenizer* tokenizer_;
  Sampler sampler_;
  const TextCallback* on_text_;
  std::vector<std::string> stops_;
  size_t longest_stop_ = 0;
  std::optional<StreamDecoder> decoder_;
  size_t emitted_ = 0;
  bool stopped_by_string_ = false;
  GenerateResult r_;
};

}  // namespace

GenerateResult generate(Engine& engine, const Tokenizer* tokenizer, std::span<const int32_t> prompt,
                        const GenerateOptions& options, const TextCallback& on_text) {
  Generation gen(tokenizer, options, options.sampling, &on_text);
  const auto t_prompt = std::chrono::steady_clock::now();
  std::span<const float> logits;
  if (!prompt.empty()) {
    logits = engine.eval(prompt);
    gen.result().timings.prompt_tokens = static_cast<int64_t>(prompt.size());
  } else {
    logits = engine.logits();
    TESSERA_CHECK(!logits.empty(), "nothing to generate from: the prompt is empty and so is the context");
  }
  gen.result().timings.prompt_ms = ms_since(t_prompt);

  const auto t_gen = std::chrono::steady_clock::now();
  std::optional<int32_t> id = gen.next(logits, engine.tokens(), engine.n_past() >= engine.n_ctx());
  if (Generation::plain_greedy(options.sampling)) {
    // The engine picks the argmax itself (on CUDA on the device, chained: the steps queue up on the GPU and one token
    // id comes back per step, not the logits). The k-th picked token follows k evaluated ones.
    if (id) {
      const int64_t start = engine.n_past();
      int64_t k = 0;
      // Bounded by max_tokens too: the chain then launches no step past the last one the loop would evaluate.
      engine.decode_greedy_chain(*id, std::min(engine.n_ctx() - start, gen.steps_left()), [&](int32_t picked) {
        ++k;
        id = gen.next_picked(picked, start + k >= engine.n_ctx());
        return id.has_value();
      });
    }
  } else {
    while (id) {
      if (!gen.wants_more()) {  // the last token is evaluated (it stays in the context), nothing is drawn
        engine.eval(std::span<const int32_t>(&*id, 1));
        id = gen.next({}, engine.tokens(), true);  // none: max_tokens
        break;
      }
      // Evaluates the token and draws the next (on CUDA on the device: one token comes back, not the logits).
      const int32_t picked = engine.decode_sampled(*id, gen.sampler());
      id = gen.next_picked(picked, engine.n_past() >= engine.n_ctx());
    }
  }
  return gen.finish(t_gen);
}

std::vector<GenerateResult> generate_batch(Engine& engine, const Tokenizer* tokenizer,
                                           std::span<const std::vector<int32_t>> prompts,
                                           const GenerateOptions& options) {
  const int64_t b = static_cast<int64_t>(prompts.size());
  TESSERA_CHECK(b >= 1, "nothing to generate: no prompts were given");
  TESSERA_CHECK(b <= engine.n_seq(), "{} prompts exceed the {} sequences of this session (raise n_seq)", b,
                engine.n_seq());
  for (int64_t i = 0; i < b; ++i)
    TESSERA_CHECK(!prompts[static_cast<size_t>(i)].empty(), "prompt {} of the batch is empty", i);
  std::vector<std::unique_ptr<Generation>> gens;
  std::vector<std::vector<float>> logits(static_cast<size_t>(b));
  for (int64_t i = 0; i < b; ++i) {
    SamplingOptions so = options.sampling;
    if (so.seed != kRandomSeed) so.seed += static_cast<uint64_t>(i);
    gens.push_back(std::make_unique<Generation>(tokenizer, options, so, nullptr));
    engine.truncate(i, 0);
    const auto t_prompt = std::chrono::steady_clock::now();
    const std::span<const float> l = engine.eval_seq(i, prompts[static_cast<size_t>(i)]);
    logits[static_cast<size_t>(i)].assign(l.begin(), l.end());
    Timings& t = gens.back()->result().timings;
    t.prompt_tokens = static_cast<int64_t>(prompts[static_cast<size_t>(i)].size());
    t.prompt_ms = ms_since(t_prompt);
  }
  const auto t_gen = std::chrono::steady_clock::now();
  std::vector<GenerateResult> results(static_cast<size_t>(b));
  std::vector<int32_t> active(static_cast<size_t>(b));
  for (int64_t i = 0; i < b; ++i) active[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  const int64_t vocab = engine.n_vocab();
  while (!active.empty()) {
    std::vector<int32_t> ids, seqs;
    for (int32_t i : active) {
      const size_t k = static_cast<size_t>(i);
      const std::optional<int32_t> id = gens[k]->next(logits[k], engine.tokens(i), engine.n_past(i) >= engine.n_ctx());
      if (id) {
        ids.push_back(*id);
        seqs.push_back(i);
      } else {
        results[k] = gens[k]->finish(t_gen);
      }
    }
    active = seqs;
    if (ids.empty()) break;
    const std::span<const float> out = engine.decode_batch(ids, seqs);
    for (size_t r = 0; r < seqs.size(); ++r)
      logits[static_cast<size_t>(seqs[r])].assign(out.begin() + static_cast<ptrdiff_t>(r * vocab),
                                                  out.begin() + static_cast<ptrdiff_t>((r + 1) * vocab));
  }
  return results;
}

}  // namespace tessera::runtime
