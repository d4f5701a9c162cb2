// Public API: perplexity and KL divergence of a model on a text, computed as llama.cpp's llama-perplexity computes
// them, so that the numbers compare.
//
// The method (llama-perplexity's default, not its --ppl-stride variant): the whole text is tokenized once (BOS as the
// model asks); the tokens are cut into chunks of n_ctx (the tail that does not fill a chunk is dropped); each chunk is
// evaluated from an empty cache, with its first token replaced by BOS when the model adds BOS; only the second half
// is scored: the logits at positions first = n_ctx/2 .. n_ctx-2 against the tokens that follow them (n_ctx - first - 1
// per chunk). PPL = exp(mean nll), its error ppl * sqrt((mean nll^2 - mean nll^2) / (count - 1)).
//
//   tessera::Session s(model, {.n_ctx = 512});
//   tessera::PerplexityResult r = tessera::perplexity(s, text, {.n_chunks = 40});  // r.ppl, r.ppl_err
//
// KL divergence: a reference run saves, per scored position, the base model's top-k log-probabilities, the log of the
// mass outside them and the log-probability of the true next token (logits file, format below); a compared run reads
// that file and reports what llama-perplexity --kl-divergence reports.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/session.h"

namespace tessera {

// ---- Scoring math (no model): the pieces perplexity() is made of, usable on any logits.

// -log softmax(logits)[target]: the row's max is subtracted and the exponentials summed in double, as llama.cpp does.
double token_nll(std::span<const float> logits, int32_t target);

// Running sums of the scored tokens' nll; the estimate llama-perplexity prints.
struct NllStats {
  double sum = 0, sum2 = 0;  // of nll and nll^2
  int64_t count = 0;
  void add(double nll) { sum += nll, sum2 += nll * nll, ++count; }
  double ppl() const;      // exp(sum / count); 0 before any token
  double ppl_err() const;  // ppl * sqrt((sum2/count - (sum/count)^2) / (count - 1)); 0 when undefined
};

// The chunks of `n_tokens` tokens at context n_ctx: min(n_chunks, n_tokens / n_ctx) (all when n_chunks <= 0).
int64_t perplexity_chunk_count(int64_t n_tokens, int64_t n_ctx, int64_t n_chunks);
// Chunk `i` as it is evaluated: tokens[i*n_ctx .. (i+1)*n_ctx) with the first replaced by `bos` when bos >= 0.
std::vector<int32_t> perplexity_chunk(std::span<const int32_t> tokens, int64_t i, int64_t n_ctx, int32_t bos);

// ---- Logits file (--save-logits / --kl-base), little-endian:
//   header: char magic[8] = "TSRPPL01"; uint32 n_ctx, n_vocab, top_k, n_chunks; uint64 text_hash, tokens_hash,
//           vocab_hash (FNV-1a 64 of the text's bytes, of the evaluated token ids as int32, of the vocabulary's token
//           texts each followed by a 0 byte)
//   then per chunk, per scored position (n_ctx - n_ctx/2 - 1 of them), one record of 8 + 8 * top_k bytes:
//     float logp_target  log-probability of the true next token
//     float logp_rest    log of the probability mass outside the top-k (-inf when the top-k hold all of it)
//     top_k x { int32 id; float logp }   the most probable tokens, in decreasing probability (ties: smaller id first)
// A base is refused unless text, tokens, context and vocabulary all match.
inline constexpr char kLogitsMagic[9] = "TSRPPL01";

struct LogitsHeader {
  uint32_t n_ctx = 0, n_vocab = 0, top_k = 0, n_chunks = 0;
  uint64_t text_hash = 0, tokens_hash = 0, vocab_hash = 0;
};

// One scored position of the base model, as stored.
struct BaseRow {
  float logp_target = 0;
  float logp_rest = 0;
  std::vector<int32_t> ids;  // [top_k]
  std::vector<float> logp;   // [top_k]
};

// The base row of `logits` ([n_vocab]) for `target`: the top_k most probable tokens (top_k <= n_vocab).
BaseRow make_base_row(std::span<const float> logits, int32_t target, int64_t top_k);

// KL divergence of the compared model's distribution Q from the base's P at one position, from the base's stored
// top-k: sum over the top-k of p (log p - log q), plus r_p (log r_p - log r_q) for the mass r outside them (exact
// when the top-k hold every token; otherwise a lower bound that misses only how differently the two spread the rest,
// r_p times the KL of their normalized tails).
struct KlRow {
  double kld = 0;         // as above
  double nll = 0;         // -log q(target)
  double nll_base = 0;    // -log p(target)
  double p_diff = 0;      // q(target) - p(target)
  bool same_top = false;  // argmax of Q (the first on ties) is the base's most probable token
};
KlRow kl_row(std::span<const float> logits, int32_t target, const BaseRow& base);

// llama-perplexity --kl-divergence's statistics over every scored position.
struct KlStats {
  double sum_nll = 0, sum_nll2 = 0, sum_nll_base = 0, sum_nll_base2 = 0, sum_nll_nll_base = 0;
  double sum_kld = 0, sum_kld2 = 0, sum_p_diff = 0, sum_p_diff2 = 0, sum_p_diff4 = 0;
  double max_p_diff = 0;
  int64_t n_same_top = 0, count = 0;
  std::vector<float> kld_values, p_diff_values;  // per position, in order
  void add(const KlRow& r);
};

// Summary numbers, each as llama-perplexity computes it (its mean_and_uncertainty, percentile and covariance).
struct KlSummary {
  double ppl = 0, ppl_err = 0;                    // PPL(Q)
  double ppl_base = 0, ppl_base_err = 0;          // PPL(base)
  double ln_ppl_ratio = 0, ln_ppl_ratio_err = 0;  // mean ln(PPL(Q)/PPL(base))
  double kld = 0, kld_err = 0;                    // mean KLD
  double kld_max = 0, kld_p999 = 0, kld_p99 = 0, kld_p95 = 0, kld_p90 = 0, kld_median = 0, kld_p10 = 0, kld_p5 = 0,
         kld_p1 = 0, kld_p01 = 0, kld_min = 0;
  double p_diff_mean = 0, p_diff_mean_err = 0;  // mean Δp (fraction, not %)
  double p_diff_rms = 0, p_diff_rms_err = 0;    // RMS Δp
  double p_diff_max = 0, p_diff_min = 0;
  double same_top = 0, same_top_err = 0;  // fraction of positions whose most probable token agrees
  int64_t count = 0;
};
KlSummary summarize(const KlStats& s);

// ---- The whole run through a Session.

struct PerplexityOptions {
  int64_t n_chunks = -1;  // <= 0: every whole chunk of the text
  // KL divergence and saving: paths of the logits file; "" for none. save_logits writes the base; kl_base reads one.
  std::string save_logits;
  std::string kl_base;
  int64_t top_k = 1024;  // the base's stored tokens per position when saving (clamped to n_vocab; docs/QUALITY.md)
};

struct PerplexityChunk {
  int64_t index = 0;  // 0-based
  int64_t n_chunks = 0;
  double seconds = 0;           // this chunk's evaluation and scoring
  NllStats nll;                 // running, all chunks so far
  const KlStats* kl = nullptr;  // running, when comparing with a base
};

struct PerplexityResult {
  int64_t n_tokens = 0;  // of the whole text
  int64_t n_ctx = 0;
  int64_t n_chunks = 0;  // evaluated (fewer than planned when the callback stopped the run)
  int64_t n_chunks_planned = 0;
  bool interrupted = false;
  double ppl = 0, ppl_err = 0;
  std::vector<double> running;  // the estimate after each chunk (llama-perplexity's [1]x,[2]y,...)
  NllStats nll;
  double tokenize_seconds = 0;
  double eval_seconds = 0;         // evaluation and scoring of the chunks
  double first_chunk_seconds = 0;  // of which the first chunk (it also builds the backend's prefill plans)
  double score_seconds = 0;        // of which scoring (log-softmax, top-k, KL, the logits file)
  int64_t evaluated_tokens = 0;    // n_chunks * n_ctx
  bool has_kl = false;
  KlSummary kl;
};

// Checks that `text` is UTF-8; Error naming the byte offset of the first invalid sequence.
void check_utf8(std::string_view text);

// Scores `text` with the session's context as n_ctx (the session is reset for each chunk; its n_batch is the prefill
// chunk). Errors (one sentence): invalid UTF-8 (with its byte offset), an empty text, fewer than 2 * n_ctx tokens, a
// context below 4, a logits file that cannot be written, or a base made from another text, context or vocabulary.
// on_chunk runs after each chunk; returning false stops the run after it (the result then holds the chunks so far,
// interrupted = true).
PerplexityResult perplexity(Session& session, std::string_view text, const PerplexityOptions& options,
                            const std::function<bool(const PerplexityChunk&)>& on_chunk = {});
// The same run over token ids the caller gives (no tokenizer; each chunk starts with the ids as they are): a synthetic
// model's throughput, or a text tokenized elsewhere. A logits file made from ids refuses a run on other ids.
PerplexityResult perplexity_tokens(Session& session, std::span<const int32_t> tokens, const PerplexityOptions& options,
                                   const std::function<bool(const PerplexityChunk&)>& on_chunk = {});

}  // namespace tessera
