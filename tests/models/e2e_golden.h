// Shared by the end-to-end golden tests (test_e2e_numpy.cpp, test_e2e_llamacpp.cpp): the compact per-position golden
// record (top-k logits plus the full row's log-sum-exp) and the statistics computed against it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <stdexcept>
#include <vector>

namespace tessera::e2e {

struct GoldenPosition {
  std::vector<int32_t> top_ids;   // [k], by logit descending (ties: lower id first)
  std::vector<float> top_logits;  // [k]
  double lse = 0;                 // log-sum-exp of the whole golden row
  double f32_rel_err = 0;         // numpy reference only: its float32 run's error here (the position's conditioning)
};

inline std::vector<GoldenPosition> parse_positions(const nlohmann::json& arr) {
  std::vector<GoldenPosition> out;
  for (const auto& p : arr) {
    GoldenPosition g;
    g.top_ids = p.at("top_ids").get<std::vector<int32_t>>();
    g.top_logits = p.at("top_logits").get<std::vector<float>>();
    g.lse = p.at("lse").get<double>();
    g.f32_rel_err = p.value("f32_rel_err", 0.0);
    if (g.top_ids.size() < 2 || g.top_ids.size() != g.top_logits.size())
      throw std::runtime_error("golden position with fewer than 2 or mismatched top-k entries");
    out.push_back(std::move(g));
  }
  return out;
}

// Lowest id among equal maxima, as llama.cpp's greedy sampler and the golden scripts pick.
inline int32_t argmax(std::span<const float> row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

inline double log_sum_exp(std::span<const float> row) {  // row: [n_vocab]
  const double mx = *std::max_element(row.begin(), row.end());
  double s = 0;
  for (float x : row) s += std::exp(double(x) - mx);
  return mx + std::log(s);
}

// KL(p || q), p the golden distribution known by its top-k logits and log-sum-exp, q a full row [n_vocab]. The
// tail outside p's top-k is lumped into one bucket on both sides, which by the log-sum inequality can only
// underestimate the full KL; with k = 32 the tail holds little mass at most positions (docs/CORRECTNESS.md).
// Same formula as kl_topk() in python/make_llamacpp_golden.py.
inline double kl_lumped(const GoldenPosition& p, std::span<const float> q_row) {
  const double q_lse = log_sum_exp(q_row);
  double kl = 0, p_top = 0, q_top = 0;
  for (size_t i = 0; i < p.top_ids.size(); ++i) {
    const double lp = double(p.top_logits[i]) - p.lse;
    const double lq = double(q_row[size_t(p.top_ids[i])]) - q_lse;
    kl += std::exp(lp) * (lp - lq);
    p_top += std::exp(lp);
    q_top += std::exp(lq);
  }
  const double p_tail = std::max(0.0, 1.0 - p_top);
  const double q_tail = std::max(1e-30, 1.0 - q_top);
  if (p_tail > 0) kl += p_tail * std::log(p_tail / q_tail);
  return kl;
}

}  // namespace tessera::e2e
