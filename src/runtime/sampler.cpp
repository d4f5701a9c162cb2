#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace tessera::runtime {

Sampler::Sampler(const SamplingOptions& options) : o_(options) {
  TESSERA_CHECK(std::isfinite(o_.temperature), "sampling: temperature {} is not a number", o_.temperature);
  TESSERA_CHECK(std::isfinite(o_.top_p) && o_.top_p > 0, "sampling: top-p {} must be in (0, 1]", o_.top_p);
  TESSERA_CHECK(std::isfinite(o_.min_p) && o_.min_p >= 0 && o_.min_p <= 1, "sampling: min-p {} must be in [0, 1]",
                o_.min_p);
  TESSERA_CHECK(std::isfinite(o_.repeat_penalty) && o_.repeat_penalty > 0,
                "sampling: repeat penalty {} must be positive", o_.repeat_penalty);
  TESSERA_CHECK(std::isfinite(o_.frequency_penalty) && std::isfinite(o_.presence_penalty),
                "sampling: frequency and presence penalties must be numbers");
  TESSERA_CHECK(o_.penalty_last_n >= -1, "sampling: penalty window {} must be -1 or more", o_.penalty_last_n);
  seed_ = o_.seed;
  if (seed_ == kRandomSeed) {
    std::random_device rd;
    seed_ = (uint64_t{rd()} << 32 | rd()) & 0x7fffffffffffffffull;  // printable and re-usable as --seed
  }
  rng_.seed(seed_);
}

double Sampler::uniform() {
  if (peeked_) {
    const double u = *peeked_;
    peeked_.reset();
    return u;
  }
  return double(rng_() >> 11) * 0x1.0p-53;
}

double Sampler::peek_uniform() {
  if (!peeked_) peeked_ = double(rng_() >> 11) * 0x1.0p-53;
  return *peeked_;
}

void Sampler::take_uniform() { (void)uniform(); }

void penalty_counts(std::span<const int32_t> history, int32_t last_n, size_t vocab, std::vector<int32_t>& scratch,
                    std::vector<std::pair<int32_t, int32_t>>& out) {
  out.clear();
  if (last_n == 0 || history.empty()) return;
  const size_t n = last_n < 0 ? history.size() : std::min(history.size(), static_cast<size_t>(last_n));
  // Count occurrences by sorting a copy of the window.
  scratch.assign(history.end() - static_cast<std::ptrdiff_t>(n), history.end());
  std::sort(scratch.begin(), scratch.end());
  for (size_t i = 0; i < scratch.size();) {
    size_t j = i;
    while (j < scratch.size() && scratch[j] == scratch[i]) ++j;
    if (scratch[i] >= 0 && static_cast<size_t>(scratch[i]) < vocab)
      out.emplace_back(scratch[i], static_cast<int32_t>(j - i));
    i = j;
  }
}

void Sampler::apply_penalties(std::span<const int32_t> history) {
  const bool any = o_.repeat_penalty != 1.0f || o_.frequency_penalty != 0.0f || o_.presence_penalty != 0.0f;
  if (!any) return;
  penalty_counts(history, o_.penalty_last_n, logits_.size(), window_, counts_);
  for (const auto& [id, n] : counts_) {
    const float count = float(n);
    float& l = logits_[static_cast<size_t>(id)];
    l = l > 0 ? l / o_.repeat_penalty : l * o_.repeat_penalty;
    l -= count * o_.frequency_penalty + o_.presence_penalty;
  }
}

int32_t argmax_first(std::span<const float> values) {
  int32_t best = -1;
  for (size_t i = 0; i < values.size(); ++i)
    if (!std::isnan(values[i]) && (best < 0 || values[i] > values[static_cast<size_t>(best)]))
      best = static_cast<int32_t>(i);
  return best < 0 ? 0 : best;
}

const std::vector<Candidate>& Sampler::candidates(std::span<const float> logits, std::span<const int32_t> history) {
  TESSERA_CHECK(!logits.empty(), "sampling: no logits to sample from");
  logits_.assign(logits.begin(), logits.end());
  apply_penalties(history);
  cands_.clear();
  const auto by_logit = [](const Candidate& a, const Candidate& b) {
    return a.logit != b.logit ? a.logit > b.logit : a.id < b.id;
  };
  if (o_.temperature <= 0) {
    const size_t best = static_cast<size_t>(argmax_first(logits_));
    cands_.push_back(Candidate{static_cast<int32_t>(best), logits_[best], 1.0f});
    return cands_;
  }
  cands_.reserve(logits_.size());
  for (size_t i = 0; i < logits_.size(); ++i)
    if (!std::isnan(logits_[i])) cands_.push_back(Candidate{static_cast<int32_t>(i), logits_[i], 0.0f});
  TESSERA_CHECK(!cands_.empty(), "sampling: every logit is NaN");

  // top-k: the k largest, sorted; without it the whole vocabulary is sorted (top-p needs the order).
  if (o_.top_k > 0 && static_cast<size_t>(o_.top_k) < cands_.size()) {
    std::partial_sort(cands_.begin(), cands_.begin() + o_.top_k, cands_.end(), by_logit);
    cands_.resize(static_cast<size_t>(o_.top_k));
  } else {
    std::sort(cands_.begin(), cands_.end(), by_logit);
  }
  const auto softmax = [&](float temp) {
    const float mx = cands_.front().logit;
    double sum = 0;
    for (Candidate& c : cands_) sum += std::exp(double(c.logit - mx) / temp);
    for (Candidate& c : cands_) c.p = float(std::exp(double(c.logit - mx) / temp) / sum);
  };
  // top-p: the smallest prefix whose probability (at temperature 1) reaches p.
  if (o_.top_p < 1.0f) {
    softmax(1.0f);
    double cum = 0;
    size_t keep = cands_.size();
    for (size_t i = 0; i < cands_.size(); ++i) {
      cum += cands_[i].p;
      if (cum >= o_.top_p) {
        keep = i + 1;
        break;
      }
    }
    cands_.resize(keep);
  }
  // min-p: p >= min_p * p_max  <=>  logit >= max_logit + ln(min_p) (temperature 1).
  if (o_.min_p > 0.0f) {
    const float cut = cands_.front().logit + std::log(o_.min_p);
    size_t keep = 1;
    while (keep < cands_.size() && cands_[keep].logit >= cut) ++keep;
    cands_.resize(keep);
  }
  softmax(o_.temperature);
  return cands_;
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  const auto& c = candidates(logits, history);
  if (c.size() == 1) return c.front().id;
  double u = uniform();
  for (const Candidate& x : c) {
    u -= x.p;
    if (u < 0) return x.id;
  }
  return c.back().id;  // rounding left u a hair above the total
}

}  // namespace tessera::runtime
