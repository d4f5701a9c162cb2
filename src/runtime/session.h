// The engine behind tessera::Session: KV caches (one per sequence slot), plans per chunk size, prefill in chunks,
// decode, batched decode of several slots; and the generation loops (sampling, end-of-generation and stop strings,
// streaming, a full context), for one sequence or several together.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "backends/backend.h"
#include "graph/passes/sparsify.h"
#include "models/lora.h"
#include "models/model_weights.h"
#include "runtime/sampler.h"
#include "tessera/session.h"
#include "tessera/tokenizer.h"

namespace tessera::runtime {

struct EngineOptions {
  int64_t n_ctx = 0;  // resolved: positive
  int64_t n_batch = 512;
  int n_threads = 0;
  bool reference = false;
  DType kv_dtype = DType::F16;
  std::string device = "cpu";                // the backend (backends/backend.h registry) that runs the session
  int64_t n_seq = 1;                         // sequence slots, each with its own cache and tokens
  std::vector<std::string> backend_options;  // "key=value" for the backend (SessionOptions::backend_options)
  graph::SparsifyOptions sparsify;           // TEAL (SessionOptions::sparsity; teal's thresholds are set by the API)
  std::shared_ptr<const LoraSet> lora;       // LoRA adapters (SessionOptions::lora, loaded by the API); null: none
};

// Resolves SessionOptions against the model (defaults, limits); Error naming the bad option.
EngineOptions resolve_options(const SessionOptions& o, const ModelConfig& c);

// TEAL's two ways of asking (SessionOptions::sparsity and ::teal, and the graph API's GraphOptions): a sparsity in
// [0, 1), and not both. Error naming the problem.
void check_teal_options(float sparsity, const std::string& teal);

class Engine {
 public:
  // store: the model's weights on options.device, shared by its sessions (null: a store private to this engine).
  Engine(ModelWeights weights, std::shared_ptr<backend::WeightStore> store, const EngineOptions& options);

  const EngineOptions& options() const { return o_; }
  const ModelWeights& weights() const { return w_; }
  int64_t n_ctx() const { return o_.n_ctx; }
  int64_t n_vocab() const { return w_.config().n_vocab; }
  int64_t n_seq() const { return o_.n_seq; }
  // Slot 0 unless a slot is given; Error for a slot outside [0, n_seq).
  int64_t n_past(int64_t seq = 0) const { return static_cast<int64_t>(tokens(seq).size()); }
  const std::vector<int32_t>& tokens(int64_t seq = 0) const;
  int n_threads() const { return dev_->n_threads(); }
  std::pair<uint64_t, uint64_t> sparsity_counts() const { return dev_->sparsity_counts(); }
  void reset_sparsity_counts() { dev_->reset_sparsity_counts(); }
  void record_activation_histograms(bool on) { dev_->record_activation_histograms(on); }
  std::map<int, std::vector<uint64_t>> take_activation_histograms() { return dev_->take_activation_histograms(); }
  void set_node_tap(backend::DeviceSession::NodeTap tap) { dev_->set_node_tap(std::move(tap)); }

  // Appends ids to slot 0 (eval) or `seq` at its n_past in chunks of n_batch. Returns the last token's logits
  // [n_vocab]. With `all` set, also writes the logits of every token into all [ids.size() * n_vocab].
  std::span<const float> eval(std::span<const int32_t> ids, float* all = nullptr) { return eval_seq(0, ids, all); }
  std::span<const float> eval_seq(int64_t seq, std::span<const int32_t> ids, float* all = nullptr);
  // Appends ids to slot 0 as eval does and returns, per row r, the score of its logits against targets[r] (in the
  // vocabulary, or -1 for a row not scored: {0, 0}): log-sum-exp and the target's logit. The logits stay where they
  // were computed on a backend with Capabilities::device_scores (CUDA: t scores come back instead of t * n_vocab
  // logits); logits() is then empty until the next logits-returning call. Errors as eval, and for targets of another
  // length or outside the vocabulary.
  std::vector<backend::RowScore> eval_scores(std::span<const int32_t> ids, std::span<const int32_t> targets);
  bool device_scores() const { return caps_.device_scores; }
  // tokens[i] appended to slot seqs[i] (distinct slots), all in one step. Returns logits [B * n_vocab], row-major,
  // valid until the next call.
  std::span<const float> decode_batch(std::span<const int32_t> tokens, std::span<const int32_t> seqs);
  // The same step for greedy decoding: returns each row's argmax (the first on ties) instead of logits. On CUDA the
  // argmax runs on the device and only B token ids come back (no B * n_vocab copy); the slots' logits() are then
  // empty there until their next logits-returning call.
  std::vector<int32_t> decode_batch_greedy(std::span<const int32_t> tokens, std::span<const int32_t> seqs);
  // Greedy decoding of slot 0 from `first`: evaluates it, then each argmax, at most n tokens in all (fewer when the
  // context fills). on_token gets each step's argmax in order and returns whether to go on (evaluate it next). On CUDA
  // the steps chain on the device (CudaDecoder::generate_greedy: no host round trip per token; steps queued past a
  // stop are dropped). Returns the tokens evaluated (= on_token calls). Errors as decode_batch_greedy.
  int64_t decode_greedy_chain(int32_t first, int64_t n, const std::function<bool(int32_t)>& on_token);
  // Appends `token` to slot 0 and draws the next token from its logits with `sampler` (whose penalties read slot 0's
  // context, `token` included), as eval then sampler.sample would. Where the backend draws on the device
  // (CudaDecoder::decode_sample: only the token comes back, logits(0) fetches the logits if asked) it does; the
  // sampler's generator advances exactly as sample() would advance it. Errors as eval.
  int32_t decode_sampled(int32_t token, Sampler& sampler);
  // The last token's logits of slot `seq` ([] when there are none: nothing evaluated, truncated, or a greedy batch
  // row on CUDA). After a greedy decoder step on CUDA (slot 0) they are fetched from the device on first call.
  std::span<const float> logits(int64_t seq = 0);
  void truncate(int64_t n) { truncate(0, n); }
  void truncate(int64_t seq, int64_t n);

  graph::Graph build_graph(int64_t n_tokens, int64_t n_past, bool all_logits, bool decode_rows = false) const;
  void set_profiling(bool on) { dev_->set_profiling(on); }
  std::vector<uint64_t> profile_ns(int64_t n_tokens) const { return dev_->profile_ns(n_tokens); }
  std::vector<uint64_t> profile_thread_spans(int64_t n_tokens) const { return dev_->profile_thread_spans(n_tokens); }

 private:
  void check_seq(int64_t seq) const;
  // Errors eval refuses before it runs anything: a bad slot, no ids, a full context, an id outside the vocabulary.
  void check_eval(int64_t seq, std::span<const int32_t> ids) const;
  void check_batch(std::span<const int32_t> ids, std::span<const int32_t> seqs) const;
  // Records a step that returned ids only for slots `seqs` (their logits stay on the device, or are gone).
  void stepped_without_logits(std::span<const int32_t> seqs);

  ModelWeights w_;
  EngineOptions o_;
  backend::Capabilities caps_;
  std::unique_ptr<backend::DeviceSession> dev_;
  std::vector<std::vector<int32_t>> tokens_;  // per slot
  std::vector<std::vector<float>> logits_;    // per slot: [n_vocab] of its last token
  std::vector<bool> has_logits_;
  bool device_logits_ = false;        // slot 0's last logits are on the device (an ids-only step), not yet fetched
  std::vector<float> batch_logits_;   // [B, n_vocab] of the last decode_batch
  std::vector<int32_t> pen_scratch_;  // decode_sampled's penalty window
  std::vector<std::pair<int32_t, int32_t>> pen_counts_;
};

// Appends the prompt ids and generates (see tessera::Session::generate_tokens). `tokenizer` may be null: the text
// is then empty and stop strings are not checked.
GenerateResult generate(Engine& engine, const Tokenizer* tokenizer, std::span<const int32_t> prompt,
                        const GenerateOptions& options, const TextCallback& on_text);

// Prompt i goes to slot i (reset first; prompts.size() <= n_seq, none empty); after each prompt's prefill, batched
// decode steps advance every sequence still going until all have stopped. Sequence i samples with seed + i (a fresh
// seed each when the seed is kRandomSeed).
std::vector<GenerateResult> generate_batch(Engine& engine, const Tokenizer* tokenizer,
                                           std::span<const std::vector<int32_t>> prompts,
                                           const GenerateOptions& options);

uint64_t peak_rss_bytes();

}  // namespace tessera::runtime
