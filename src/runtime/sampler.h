// The sampler chain: penalties, then greedy argmax or top-k, top-p, min-p, temperature and a seeded random draw.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "tessera/session.h"

namespace tessera::runtime {

struct Candidate {
  int32_t id;
  float logit;
  float p;  // probability after the chain (set by candidates())
};

// The index of the largest value: the first on ties, NaNs skipped, 0 when every value is NaN (the answer the CUDA
// argmax kernels give). Greedy sampling and the engine's greedy decoding both use it.
int32_t argmax_first(std::span<const float> values);

// The penalty window: each token of the last `last_n` of `history` (-1: all of it, 0: none) once, ascending, with
// its occurrences; ids outside [0, vocab) dropped. `scratch` is reused between calls (no allocation once grown).
// Sampler's penalties and the CUDA device sampler's caller read the same counts.
void penalty_counts(std::span<const int32_t> history, int32_t last_n, size_t vocab, std::vector<int32_t>& scratch,
                    std::vector<std::pair<int32_t, int32_t>>& out);

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& options);

  // Picks the next token from logits [n_vocab]; `history` is the context so far (the penalties read its tail).
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history);
  // The tokens the draw chooses from and their probabilities (sorted by probability, descending), after every
  // filter and the temperature. Greedy sampling returns the argmax alone with p = 1.
  const std::vector<Candidate>& candidates(std::span<const float> logits, std::span<const int32_t> history);

  uint64_t seed() const { return seed_; }
  const SamplingOptions& options() const { return o_; }

  // For a draw made elsewhere (the CUDA device sampler): the uniform number sample() would draw next, without using
  // it up; take_uniform() uses it up (the caller calls it when the draw chose among more than one candidate, as
  // sample() draws only then). The stream of numbers is the same either way.
  double peek_uniform();
  void take_uniform();

 private:
  void apply_penalties(std::span<const int32_t> history);
  double uniform();  // [0, 1), from 53 random bits: the same on every platform for a given seed; peeked first if so

  SamplingOptions o_;
  uint64_t seed_;
  std::mt19937_64 rng_;
  std::optional<double> peeked_;  // drawn by peek_uniform, not yet used
  std::vector<Candidate> cands_;
  std::vector<float> logits_;    // penalized copy [n_vocab]
  std::vector<int32_t> window_;  // the tokens the penalties look at, sorted
  std::vector<std::pair<int32_t, int32_t>> counts_;  // penalty_counts of the window
};

}  // namespace tessera::runtime
