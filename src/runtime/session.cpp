#include "runtime/session.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/error.h"
#include "models/llama.h"
#include "runtime/sampler.h"

namespace tessera::runtime {

namespace {

constexpr int64_t kMaxBatch = 1 << 14;
constexpr int64_t kDefaultCtxWithoutMetadata = 4096;
// Plans kept beyond the decode and full-batch ones (prompt remainders of other lengths).
constexpr size_t kMaxPlans = 6;

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
    if (c.sliding_window > 0) e.n_ctx = std::min(e.n_ctx, c.sliding_window);
  } else {
    TESSERA_CHECK(limit == 0 || o.n_ctx <= limit, "context size {} exceeds the model's trained context of {} tokens",
                  o.n_ctx, limit);
    TESSERA_CHECK(c.sliding_window == 0 || o.n_ctx <= c.sliding_window,
                  "context size {} exceeds the model's sliding window of {} tokens (sliding-window attention is not "
                  "supported yet)",
                  o.n_ctx, c.sliding_window);
    e.n_ctx = o.n_ctx;
  }
  TESSERA_CHECK(o.n_batch > 0 && o.n_batch <= kMaxBatch, "batch size {} must be between 1 and {}", o.n_batch,
                kMaxBatch);
  e.n_batch = std::min(o.n_batch, e.n_ctx);
  TESSERA_CHECK(o.n_threads >= 0 && o.n_threads <= 1024, "thread count {} must be between 0 (all cores) and 1024",
                o.n_threads);
  e.n_threads = o.n_threads;
  e.reference = o.reference;
  if (o.kv_dtype.empty()) {
    e.kv_dtype = o.reference ? DType::F32 : DType::F16;
  } else if (o.kv_dtype == "f16") {
    e.kv_dtype = DType::F16;
  } else if (o.kv_dtype == "f32") {
    e.kv_dtype = DType::F32;
  } else {
    fail("kv cache type '{}' is not supported (f16 or f32)", o.kv_dtype);
  }
  if (o.device == "cuda") {
#ifndef TESSERA_HAVE_CUDA
    fail("device 'cuda' is not available: this build of Tessera has no CUDA backend (nvcc was not found at configure "
         "time)");
#else
    std::string why;
    TESSERA_CHECK(cuda::cuda_available(&why), "device 'cuda' is not available: {}", why);
    TESSERA_CHECK(!o.reference, "the reference path runs on the CPU only, not on device 'cuda'");
    TESSERA_CHECK(e.kv_dtype == DType::F16, "kv cache type '{}' is not supported on device 'cuda' (f16)", o.kv_dtype);
    e.cuda = true;
#endif
  } else {
    TESSERA_CHECK(o.device == "cpu", "device '{}' is not supported (cpu or cuda)", o.device);
  }
  return e;
}

Engine::Engine(ModelWeights weights, std::shared_ptr<cpu::WeightCache> cache, const EngineOptions& options)
    : w_(std::move(weights)),
      o_(options),
      backend_(cpu::BackendOptions{options.n_threads, options.reference}, std::move(cache)),
      kv_(w_.config().n_layers, w_.config().n_head_kv, options.n_ctx, w_.config().head_dim, options.kv_dtype) {
  logits_.assign(static_cast<size_t>(w_.config().n_vocab), 0.0f);
#ifdef TESSERA_HAVE_CUDA
  if (o_.cuda) {
    // Uploading every weight now keeps it out of the first prompt's timing.
    cuda_ = std::make_unique<cuda::CudaDecoder>(build_graph(1, 0, false));
    return;
  }
#endif
  // Compiling the decode plan prepares (repacks) every weight now, so the first prompt's timing measures the
  // forward pass alone.
  plan_for(1, false);
}

graph::Graph Engine::build_graph(int64_t n_tokens, int64_t n_past, bool all_logits) const {
  return build_llama_graph(w_, LlamaGraphOptions{.n_tokens = n_tokens,
                                                 .n_past = n_past,
                                                 .n_ctx = std::max(o_.n_ctx, n_past + n_tokens),
                                                 .kv_dtype = o_.kv_dtype,
                                                 .all_logits = all_logits});
}

cpu::Plan& Engine::plan_for(int64_t n_tokens, bool all_logits) {
  const auto key = std::make_pair(n_tokens, all_logits);
  auto it = plans_.find(key);
  if (it == plans_.end()) {
    if (plans_.size() >= kMaxPlans)
      for (auto p = plans_.begin(); p != plans_.end();)
        p = (p->first == std::make_pair(int64_t{1}, false) || p->first == std::make_pair(o_.n_batch, false))
                ? std::next(p)
                : plans_.erase(p);
    it = plans_.emplace(key, backend_.compile(build_graph(n_tokens, 0, all_logits), kv_.bindings())).first;
  }
  cpu::Plan& plan = *it->second;
  if (profiling_) {
    auto& v = profile_[n_tokens];
    v.resize(plan.graph().nodes().size());
    plan.node_ns = &v;
  } else {
    plan.node_ns = nullptr;
  }
  return plan;
}

std::span<const float> Engine::eval(std::span<const int32_t> ids, float* all) {
  TESSERA_CHECK(!ids.empty(), "nothing to evaluate: the token list is empty");
  const int64_t n = static_cast<int64_t>(ids.size());
  TESSERA_CHECK(n_past() + n <= o_.n_ctx,
                "the context is full: {} more tokens do not fit after {} of {} (raise the context size with -c)", n,
                n_past(), o_.n_ctx);
  const int64_t vocab = n_vocab();
  for (int32_t id : ids)
    TESSERA_CHECK(id >= 0 && id < vocab, "token id {} is outside the vocabulary of {} tokens", id, vocab);
#ifdef TESSERA_HAVE_CUDA
  if (cuda_) {
    // The GPU runs the one-token decode graph only, so a prompt goes through it token by token.
    for (int64_t i = 0; i < n; ++i) {
      has_logits_ = false;
      const std::span<const float> out = cuda_->decode(ids[static_cast<size_t>(i)], n_past());
      tokens_.push_back(ids[static_cast<size_t>(i)]);
      if (all != nullptr) std::memcpy(all + i * vocab, out.data(), static_cast<size_t>(vocab) * sizeof(float));
      if (i == n - 1) std::memcpy(logits_.data(), out.data(), static_cast<size_t>(vocab) * sizeof(float));
    }
    has_logits_ = true;
    return logits_;
  }
#endif
  for (int64_t done = 0; done < n;) {
    const int64_t chunk = std::min(o_.n_batch, n - done);
    cpu::Plan& plan = plan_for(chunk, all != nullptr);
    std::memcpy(plan.input("tokens"), ids.data() + done, static_cast<size_t>(chunk) * sizeof(int32_t));
    has_logits_ = false;
    backend_.execute(plan, n_past());
    tokens_.insert(tokens_.end(), ids.begin() + done, ids.begin() + done + chunk);
    const float* out = plan.output("output");
    const int64_t rows = all != nullptr ? chunk : 1;
    if (all != nullptr) std::memcpy(all + done * vocab, out, static_cast<size_t>(chunk * vocab) * sizeof(float));
    std::memcpy(logits_.data(), out + (rows - 1) * vocab, static_cast<size_t>(vocab) * sizeof(float));
    has_logits_ = true;
    done += chunk;
  }
  return logits_;
}

std::span<const float> Engine::logits() const {
  return has_logits_ ? std::span<const float>(logits_) : std::span<const float>();
}

void Engine::truncate(int64_t n) {
  TESSERA_CHECK(n >= 0, "cannot keep {} tokens", n);
  if (n >= n_past()) return;
  tokens_.resize(static_cast<size_t>(n));
  has_logits_ = false;  // the logits belonged to a token that is gone
}

std::vector<uint64_t> Engine::profile_ns(int64_t n_tokens) const {
  auto it = profile_.find(n_tokens);
  return it == profile_.end() ? std::vector<uint64_t>{} : it->second;
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

}  // namespace

GenerateResult generate(Engine& engine, const Tokenizer* tokenizer, std::span<const int32_t> prompt,
                        const GenerateOptions& options, const TextCallback& on_text) {
  GenerateResult r;
  Sampler sampler(options.sampling);
  r.seed = sampler.seed();
  std::vector<std::string> stops;
  for (const std::string& s : options.stop)
    if (!s.empty()) stops.push_back(s);
  size_t longest_stop = 0;
  for (const std::string& s : stops) longest_stop = std::max(longest_stop, s.size());

  const auto t_prompt = std::chrono::steady_clock::now();
  std::span<const float> logits;
  if (!prompt.empty()) {
    logits = engine.eval(prompt);
    r.timings.prompt_tokens = static_cast<int64_t>(prompt.size());
  } else {
    logits = engine.logits();
    TESSERA_CHECK(!logits.empty(), "nothing to generate from: the prompt is empty and so is the context");
  }
  r.timings.prompt_ms = ms_since(t_prompt);

  const auto t_gen = std::chrono::steady_clock::now();
  std::optional<StreamDecoder> decoder;
  if (tokenizer != nullptr) decoder.emplace(*tokenizer, options.render_special);
  size_t emitted = 0;
  bool stopped_by_string = false;
  const auto emit_upto = [&](size_t end) {
    if (end <= emitted) return true;
    const bool go_on = !on_text || on_text(std::string_view(r.text).substr(emitted, end - emitted));
    emitted = end;
    return go_on;
  };
  r.stop_reason = StopReason::MAX_TOKENS;
  for (;;) {
    if (options.max_tokens >= 0 && static_cast<int64_t>(r.tokens.size()) >= options.max_tokens) {
      r.stop_reason = StopReason::MAX_TOKENS;
      break;
    }
    const int32_t id = sampler.sample(logits, engine.tokens());
    if (!options.ignore_eos && tokenizer != nullptr && tokenizer->is_eog(id)) {
      r.stop_reason = StopReason::END_OF_GENERATION;
      break;
    }
    r.tokens.push_back(id);
    if (decoder) {
      const size_t before = r.text.size();
      r.text += decoder->push(id);
      if (!stops.empty()) {
        const size_t from = before >= longest_stop ? before - longest_stop + 1 : 0;
        size_t at = std::string::npos;
        for (const std::string& s : stops) at = std::min(at, r.text.find(s, from));
        if (at != std::string::npos) {
          r.text.resize(at);
          emit_upto(at);
          stopped_by_string = true;
          r.stop_reason = StopReason::STOP_STRING;
          break;
        }
      }
      if (!emit_upto(r.text.size() - held_back(r.text, stops))) {
        r.stop_reason = StopReason::CALLBACK;
        break;
      }
    }
    if (engine.n_past() >= engine.n_ctx()) {
      r.stop_reason = StopReason::CONTEXT_FULL;
      break;
    }
    logits = engine.eval(std::span<const int32_t>(&id, 1));
  }
  if (decoder && !stopped_by_string) {
    r.text += decoder->flush();
    if (r.stop_reason != StopReason::CALLBACK) emit_upto(r.text.size());
  }
  r.timings.generated_tokens = static_cast<int64_t>(r.tokens.size());
  r.timings.generate_ms = ms_since(t_gen);
  r.timings.peak_rss_bytes = peak_rss_bytes();
  return r;
}

}  // namespace tessera::runtime
