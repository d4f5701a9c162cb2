// Public API: a Session runs a Model: it owns the KV cache, evaluates tokens (prefill in chunks, decode one at a
// time), exposes logits, and generates text with a sampler chain.
//
//   tessera::Model m = tessera::Model::load("");
//   tessera::Session s(m, {.n_threads = 2});
//   tessera::GenerateOptions g;
//   g.max_tokens = 64;
//   g.sampling.temperature = 0;  // greedy
//   auto r = s.generate("The capital of France is", g, [](std::string_view piece) { fputs(...); return true; });
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/graph.h"
#include "tessera/model.h"

namespace tessera {

struct SessionOptions {
  int64_t n_ctx = 0;      // context in tokens; 0: the model's trained context (Mistral: its sliding window)
  int64_t n_batch = 512;  // prefill chunk: tokens evaluated per forward pass
  int n_threads = 0;      // 0: one per hardware thread
  // The f32 reference path: every op runs its scalar reference kernel on weights dequantized to f32, with no 8-bit
  // activation quantization and an f32 KV cache. Slow; for checking against independent implementations.
  bool reference = false;
  std::string kv_dtype;  // "f16" or "f32"; "" means f16 (f32 in reference mode)
  // "cpu", or "cuda": run on the GPU (prefill in chunks, decode, batched decode; needs a build with CUDA and a GPU).
  std::string device = "cpu";
  // Sequences (KV cache slots) this session holds: independent contexts that decode_batch advances together. The
  // single-sequence calls (eval, decode, generate, tokens, ...) act on slot 0.
  int64_t n_seq = 1;
  // Switches of the device's backend, "key=value" each, checked when the session opens (one sentence naming an unknown
  // key or a bad value). cpu: "isa=scalar|avx2|avx2_vnni|avx512_vnni" (the kernels' instruction set; default the best
  // this CPU runs), "teal_walk=all|none" (TEAL's sparse kernels, or (default) the dense ones on the zeroed input).
  // cuda: the fields of cuda::CudaOptions (src/backends/cuda/cuda_options.h: "graph=0", "sample=0", "attn_tma=0",
  // ...); the process holds one set, which each CUDA session makes its own again whenever another set others.
  std::vector<std::string> backend_options;
  // TEAL activation sparsity (docs/TEAL.md): zero this share of each matmul input's entries by magnitude, per token
  // (top-k), in the blocks' q|k|v, o, gate|up and down inputs; decode then skips the weights of zeroed inputs.
  // 0: dense. Exclusive with `teal`.
  float sparsity = 0;
  // A thresholds file made by `tessera calibrate` for this model: per layer and input, a magnitude threshold.
  std::string teal;
  // Sparsify prompt chunks too (perplexity: every scored position as decode sees it); prefill is otherwise dense.
  bool sparsify_prefill = false;
  // LoRA adapters this session runs, all at once (their updates add up). Each session of a model has its own list;
  // adapters are read once per model and (path, scale) and shared by the sessions that name them. Error (one
  // sentence) for a malformed adapter or one made for another base.
  std::vector<LoraSpec> lora;
  // Merge the adapters into copies of the weights they adapt when the session opens (W + s·B·A, in the base weight's
  // format: quantized bases are requantized): decode at the base model's speed, a copy of each adapted weight held.
  // Unmerged (false), each adapted matmul runs two small extra products per adapter.
  bool lora_merge = false;
};

inline constexpr uint64_t kRandomSeed = ~uint64_t{0};

// The sampler chain, applied in this order: penalties, top-k, top-p, min-p, temperature, random draw.
struct SamplingOptions {
  float temperature = 0.8f;        // <= 0: greedy (argmax after penalties)
  int32_t top_k = 40;              // <= 0: off
  float top_p = 0.95f;             // >= 1: off
  float min_p = 0.05f;             // <= 0: off; keeps tokens with p >= min_p * p_max
  float repeat_penalty = 1.0f;     // 1: off; logit / penalty if positive, * penalty if negative
  float frequency_penalty = 0.0f;  // logit -= count * frequency_penalty
  float presence_penalty = 0.0f;   // logit -= presence_penalty if the token occurred
  int32_t penalty_last_n = 64;     // tokens of context the penalties look at; -1: all of it, 0: none
  uint64_t seed = kRandomSeed;     // kRandomSeed: a fresh random seed (reported in the result)
};

struct GenerateOptions {
  int64_t max_tokens = 256;  // < 0: until end of generation or a full context
  SamplingOptions sampling;
  std::vector<std::string> stop;  // stop strings; the text ends before the first one found
  bool ignore_eos = false;        // keep going past end-of-generation tokens
  bool render_special = false;    // include control tokens' text in the output
};

enum class StopReason { END_OF_GENERATION, STOP_STRING, MAX_TOKENS, CONTEXT_FULL, CALLBACK };
std::string_view stop_reason_name(StopReason r);  // "eos", "stop", "length", "context_full", "callback"

struct Timings {
  int64_t prompt_tokens = 0;  // tokens evaluated before the first sample
  double prompt_ms = 0;
  int64_t generated_tokens = 0;  // tokens sampled
  double generate_ms = 0;        // sampling plus the forward passes of generated tokens
  uint64_t peak_rss_bytes = 0;   // of the process, so far
  double prompt_tokens_per_s() const { return prompt_ms > 0 ? prompt_tokens * 1000.0 / prompt_ms : 0; }
  double generated_tokens_per_s() const { return generate_ms > 0 ? generated_tokens * 1000.0 / generate_ms : 0; }
};

struct GenerateResult {
  std::string text;             // generated text (stop string excluded)
  std::vector<int32_t> tokens;  // generated ids (an end-of-generation token excluded)
  StopReason stop_reason = StopReason::MAX_TOKENS;
  Timings timings;
  uint64_t seed = 0;  // the seed the sampler used
};

// Receives text as it is generated (always whole UTF-8 characters); return false to stop.
using TextCallback = std::function<bool(std::string_view piece)>;

class Session {
 public:
  explicit Session(const Model& model, const SessionOptions& options = {});
  ~Session();
  Session(Session&&) noexcept;
  Session& operator=(Session&&) noexcept;

  const Model& model() const;
  int64_t n_ctx() const;
  int64_t n_batch() const;
  int n_threads() const;
  // Share of matmul-input entries the TEAL sparsification zeroed since the session opened or the last reset (0 when
  // it is off): measured, not the requested sparsity. CPU: the counters are process-wide, so with several sessions
  // open it counts all of them since the latest opening or reset.
  // The LoRA adapters this session runs (SessionOptions::lora, in order; empty without any).
  std::vector<AdapterInfo> adapters() const;
  double achieved_sparsity() const;
  void reset_achieved_sparsity();
  // Calibration (tessera calibrate, include/tessera/calibrate.h): while on, the sparsification nodes add their inputs'
  // magnitudes to a histogram per (layer, input); take returns them (key layer * 4 + input, 65536 buckets by the top
  // 16 bits of |x|'s float bits) and clears them. CPU only; process-wide.
  void record_activation_histograms(bool on);
  std::map<int, std::vector<uint64_t>> take_activation_histograms();
  // The activations as they are computed (tessera dump, greedy calibration): after each node of every forward pass,
  // tap(e) with the node's index in graph(e.rows, ...) (the graph the session runs, TEAL's rewrite included), its
  // first input and its output, valid during the call only. The tap may rewrite the output, and the nodes after it
  // read what it wrote (greedy calibration applies trial thresholds and restores the dense residual stream this way).
  // An empty function turns it off. CPU only: Error on a device whose activations are not on the host.
  struct NodeTapEvent {
    int node = -1;
    int64_t rows = 0;               // tokens of the pass
    int64_t n_past = 0;             // position of its first row
    const float* input = nullptr;   // the node's first input, [rows, its width]
    float* output = nullptr;        // [rows, its width]; nullptr for a node writing the KV cache
  };
  void set_node_tap(std::function<void(const NodeTapEvent&)> tap);
  bool reference() const;
  std::string kv_dtype() const;
  int64_t n_vocab() const;

  // The context: tokens evaluated so far (their keys and values are in the cache).
  const std::vector<int32_t>& tokens() const;
  int64_t n_past() const;
  // Forgets everything after the first n tokens (the cache is reused for what is kept).
  void truncate(int64_t n);
  void reset() { truncate(0); }

  // Appends `ids` to the context (prefill in chunks of n_batch) and returns the logits [n_vocab] of the last one,
  // valid until the next call. Error when ids would overflow the context or an id is outside the vocabulary.
  std::span<const float> eval(std::span<const int32_t> ids);
  std::span<const float> decode(int32_t id) { return eval(std::span<const int32_t>(&id, 1)); }
  // Greedy decoding: appends `id` and returns the next token, the argmax of the logits (the first on ties). On CUDA
  // the argmax runs on the device and only the id comes back (what a generation loop needs; no logits copy), so
  // logits() may be empty afterwards, until the next logits-returning call.
  int32_t decode_greedy(int32_t id);
  // Greedy generation without a host round trip per token: appends `id`, then each next token while on_token(next)
  // returns true, at most n tokens appended in all (fewer when the context fills). On CUDA the steps are chained on
  // the device (each step's argmax feeds the next; the host reads the tokens as they land, up to three launches of 8
  // steps behind; steps queued past a stop are dropped); elsewhere it is a decode_greedy loop. Returns the tokens
  // appended (= on_token calls: the last token passed to on_token is not appended).
  int64_t decode_greedy_chain(int32_t id, int64_t n, const std::function<bool(int32_t)>& on_token);
  std::span<const float> logits() const;  // of the last evaluated token ([] before any)
  // Appends `ids` and returns the logits of every one of them: [ids.size() * n_vocab], row-major.
  std::vector<float> eval_all_logits(std::span<const int32_t> ids);
  // Appends `ids` and returns log p(targets[r]) under row r's logits, for every row (each target an id in the
  // vocabulary, or -1 for a row not scored, which gets 0): what perplexity needs. Where the backend can (CUDA) the
  // log-softmax is reduced on the device and only the scores come back; logits() is then empty until the next
  // logits-returning call.
  std::vector<double> eval_target_logprobs(std::span<const int32_t> ids, std::span<const int32_t> targets);
  // Whether eval_target_logprobs reduces on the device (else it scores every row on the host, one after another).
  bool scores_on_device() const;

  // Appends `prompt` to the context (tokenized; BOS as the model asks when the context is empty; control-token text
  // such as "<|im_start|>" is parsed) and generates. The generated tokens stay in the context, so a later call
  // continues the conversation; only a token that ended generation (end-of-generation, stop string, callback, full
  // context) is not evaluated.
  GenerateResult generate(std::string_view prompt, const GenerateOptions& options, const TextCallback& on_text = {});
  GenerateResult generate_tokens(std::span<const int32_t> prompt, const GenerateOptions& options,
                                 const TextCallback& on_text = {});

  // ---- Several sequences (slots 0 .. n_seq - 1). Error for a slot outside that range.
  int64_t n_seq() const;
  int64_t n_past(int64_t seq) const;
  const std::vector<int32_t>& tokens(int64_t seq) const;
  void truncate(int64_t seq, int64_t n);
  // Appends ids to sequence `seq` (prefill in chunks); returns the last logits [n_vocab], or with all_logits=true
  // every row's [ids.size() * n_vocab].
  std::vector<float> eval_seq(int64_t seq, std::span<const int32_t> ids, bool all_logits);
  // One token for each of several distinct sequences at once: tokens[i] is appended to seqs[i]. Returns logits
  // [tokens.size() * n_vocab] row-major, valid until the next call. Error for a repeated or unknown slot, a full
  // context or a token outside the vocabulary (then nothing is evaluated).
  std::span<const float> decode_batch(std::span<const int32_t> tokens, std::span<const int32_t> seqs);
  // The same step for greedy decoding: returns each row's next token (the argmax of its logits, the first on ties),
  // computed on the device on CUDA (B ids come back instead of B * n_vocab logits; the slots' logits() may then be
  // empty). Errors as decode_batch.
  std::vector<int32_t> decode_batch_greedy(std::span<const int32_t> tokens, std::span<const int32_t> seqs);
  // Generates for several prompts together (prompt i in slot i, reset first; at most n_seq prompts): prefill each,
  // then batched decode steps until every sequence stops. Sequence i samples with seed + i (fresh seeds when the
  // seed is kRandomSeed); stop strings and end-of-generation apply per sequence.
  std::vector<GenerateResult> generate_batch(std::span<const std::vector<int32_t>> prompts,
                                             const GenerateOptions& options);

  // The graph this session runs for `n_tokens` tokens at position `n_past` (shapes, FLOPs, bytes).
  GraphView graph(int64_t n_tokens, int64_t n_past = 0) const;
  // Accumulated per-node wall time in ns of plans run while profiling is on (index = node id of graph(T)).
  void set_profiling(bool on);
  std::vector<uint64_t> profile_ns(int64_t n_tokens) const;
  // Where each worker thread ran in each node of the last profiled step of `n_tokens` tokens: for node i and thread
  // j, [2 * (i * n_threads() + j)] the first task's start and [+ 1] the last task's end, in ns after the node's start,
  // plus 1 (0: thread j ran none of node i's tasks). Empty on a device without worker threads (CUDA).
  std::vector<uint64_t> profile_thread_spans(int64_t n_tokens) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
