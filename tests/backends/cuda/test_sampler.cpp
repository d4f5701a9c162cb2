// The device sampler (backends/cuda/device_sampler.h) against runtime::Sampler, draw by draw: the same uniform number
// must pick the same token from the same logits, over every option the chain has. Passing on the H100 since the
// eighth session (docs/CORRECTNESS.md).
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/device_sampler.h"
#include "cuda_test_util.h"
#include "runtime/sampler.h"
#include "tessera/session.h"

namespace tessera::cuda::test {
namespace {

// runtime::Sampler::sample with a given draw: the candidates, then u minus their probabilities until below zero.
int32_t host_draw(runtime::Sampler& s, const std::vector<float>& logits, const std::vector<int32_t>& history, double u,
                  size_t* n) {
  const auto& c = s.candidates(logits, history);
  *n = c.size();
  if (c.size() == 1) return c.front().id;
  for (const auto& x : c) {
    u -= x.p;
    if (u < 0) return x.id;
  }
  return c.back().id;
}

DeviceSamplingParams params_of(const SamplingOptions& o) {
  DeviceSamplingParams p;
  p.temperature = o.temperature, p.top_k = o.top_k, p.top_p = o.top_p, p.min_p = o.min_p;
  p.repeat_penalty = o.repeat_penalty, p.frequency_penalty = o.frequency_penalty;
  p.presence_penalty = o.presence_penalty;
  return p;
}

TEST(CudaSampler, MatchesHostSamplerDrawByDraw) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const int64_t vocab = 32000;
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> logits(vocab);
  for (auto& l : logits) l = nd(rng);
  for (int i = 0; i < 50; ++i) logits[rng() % vocab] = logits[rng() % vocab];  // equal logits: ids decide the order
  logits[10] = 0.0f, logits[11] = -0.0f;                                       // equal too
  logits[12] = std::numeric_limits<float>::quiet_NaN();                        // never a candidate
  logits[13] = -std::numeric_limits<float>::infinity();
  logits[14] = 9.5f, logits[15] = 9.5f;  // the top two tie
  std::vector<int32_t> history(200);
  for (auto& h : history) h = static_cast<int32_t>(rng() % 300);  // repeats: counts above 1
  history[5] = 14, history[9] = 14;                               // a penalized top token

  struct Case {
    const char* name;
    SamplingOptions o;
  };
  std::vector<Case> cases;
  SamplingOptions o;
  o.seed = 1;
  cases.push_back({"defaults (T 0.8, k 40, p 0.95, min-p 0.05)", o});
  o.top_k = 0, o.top_p = 1.0f, o.min_p = 0.0f, o.temperature = 1.0f;
  cases.push_back({"the whole vocabulary", o});
  o.top_p = 0.9f, o.temperature = 0.7f;
  cases.push_back({"top-p only", o});
  o.top_k = 200, o.top_p = 1.0f, o.min_p = 0.1f, o.temperature = 1.3f;
  cases.push_back({"top-k and min-p", o});
  o = SamplingOptions{};
  o.seed = 1, o.repeat_penalty = 1.3f, o.frequency_penalty = 0.2f, o.presence_penalty = 0.1f, o.penalty_last_n = 64;
  cases.push_back({"penalties, last 64", o});
  o.penalty_last_n = -1;
  cases.push_back({"penalties, whole history", o});
  o.temperature = 0.0f;
  cases.push_back({"greedy after penalties", o});
  o = SamplingOptions{};
  o.seed = 1, o.temperature = 0.0f;
  cases.push_back({"greedy", o});

  DeviceSampler ds(vocab);
  DeviceBuffer ld = to_device(logits);
  DeviceBuffer out = poisoned(2 * sizeof(int32_t));
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    runtime::Sampler hs(c.o);
    std::mt19937_64 urng(7);
    std::vector<int32_t> scratch;
    std::vector<std::pair<int32_t, int32_t>> pens;
    runtime::penalty_counts(history, c.o.penalty_last_n, static_cast<size_t>(vocab), scratch, pens);
    const int draws = 100;
    int same_token = 0, same_n = 0;
    std::string mismatches;
    for (int d = 0; d < draws; ++d) {
      const double u = static_cast<double>(urng() >> 11) * 0x1.0p-53;
      size_t n_ref = 0;
      const int32_t ref = host_draw(hs, logits, history, u, &n_ref);
      ds.sample(ld.as<float>(), params_of(c.o), pens, u, out.as<int32_t>(), nullptr);
      synchronize();
      const auto got = to_host<int32_t>(out, 2);
      same_token += got[0] == ref;
      same_n += static_cast<size_t>(got[1]) == n_ref;
      if (got[0] != ref) {
        mismatches += "draw " + std::to_string(d) + " u " + std::to_string(u) + ": device " + std::to_string(got[0]) +
                      ", host " + std::to_string(ref) + "; ";
      }
      if (d == 0) {
        EXPECT_EQ(static_cast<size_t>(got[1]), n_ref) << "candidates";
      }
    }
    // The same logits every draw: the candidate count is the same every time or never; a token may differ only when
    // u lies within a rounding error of a boundary between two candidates (the sums run in another order).
    EXPECT_EQ(same_n, draws);
    EXPECT_GE(same_token, draws - 1) << mismatches;
  }
}

TEST(CudaSampler, AllNanLogitsReportNoCandidate) {
  TESSERA_REQUIRE_GPU();
  const int64_t vocab = 1000;
  DeviceSampler ds(vocab);
  DeviceBuffer ld = to_device(std::vector<float>(vocab, std::numeric_limits<float>::quiet_NaN()));
  DeviceBuffer out = poisoned(2 * sizeof(int32_t));
  ds.sample(ld.as<float>(), DeviceSamplingParams{}, {}, 0.5, out.as<int32_t>(), nullptr);
  synchronize();
  const auto got = to_host<int32_t>(out, 2);
  EXPECT_EQ(got[0], 0);
  EXPECT_EQ(got[1], 0);
}

}  // namespace
}  // namespace tessera::cuda::test
