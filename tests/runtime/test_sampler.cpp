// The sampler chain against expectations computed here from the definitions: greedy, top-k, top-p, min-p,
// temperature, repetition / frequency / presence penalties, the penalty window, seeded reproducibility, and the
// empirical distribution of draws.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "runtime/sampler.h"
#include "tessera/error.h"

namespace tessera::runtime {
namespace {

SamplingOptions plain(float temp) {
  SamplingOptions o;
  o.temperature = temp;
  o.top_k = 0;
  o.top_p = 1.0f;
  o.min_p = 0.0f;
  o.seed = 1234;
  return o;
}

std::vector<float> random_logits(int n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::vector<float> l(static_cast<size_t>(n));
  for (float& x : l) x = d(g);
  return l;
}

std::vector<double> softmax(const std::vector<float>& l, double temp) {
  const double mx = *std::max_element(l.begin(), l.end());
  std::vector<double> p(l.size());
  double s = 0;
  for (size_t i = 0; i < l.size(); ++i) s += p[i] = std::exp((l[i] - mx) / temp);
  for (double& x : p) x /= s;
  return p;
}

// Token ids sorted by logit, descending.
std::vector<int32_t> order(const std::vector<float>& l) {
  std::vector<int32_t> ids(l.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return l[size_t(a)] > l[size_t(b)]; });
  return ids;
}

TEST(Sampler, GreedyIsArgmaxFirstOnTies) {
  Sampler s(plain(0.0f));
  std::vector<float> l{0.5f, 3.0f, -1.0f, 3.0f};
  EXPECT_EQ(s.sample(l, {}), 1);
  const auto l2 = random_logits(1000, 7);
  EXPECT_EQ(s.sample(l2, {}), order(l2)[0]);
}

TEST(Sampler, TopKKeepsTheKLargest) {
  const auto l = random_logits(500, 1);
  SamplingOptions o = plain(1.0f);
  o.top_k = 7;
  Sampler s(o);
  const auto& c = s.candidates(l, {});
  ASSERT_EQ(c.size(), 7u);
  const auto ord = order(l);
  std::vector<double> kept;
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(c[size_t(i)].id, ord[size_t(i)]);
    kept.push_back(l[size_t(ord[size_t(i)])]);
  }
  // Renormalized softmax over the kept logits.
  std::vector<float> kl(kept.begin(), kept.end());
  const auto p = softmax(kl, 1.0);
  for (size_t i = 0; i < 7; ++i) EXPECT_NEAR(c[i].p, p[i], 1e-6);
}

TEST(Sampler, TopPKeepsSmallestPrefixReachingP) {
  const auto l = random_logits(300, 2);
  for (float top_p : {0.3f, 0.6f, 0.9f}) {
    SamplingOptions o = plain(1.0f);
    o.top_p = top_p;
    Sampler s(o);
    const auto& c = s.candidates(l, {});
    const auto p = softmax(l, 1.0);
    const auto ord = order(l);
    size_t expect = 0;
    double cum = 0;
    while (cum < top_p) cum += p[size_t(ord[expect++])];
    ASSERT_EQ(c.size(), expect) << "top_p " << top_p;
    for (size_t i = 0; i < expect; ++i) EXPECT_EQ(c[i].id, ord[i]);
  }
}

TEST(Sampler, MinPKeepsTokensAboveFractionOfMax) {
  const auto l = random_logits(400, 3);
  SamplingOptions o = plain(1.0f);
  o.min_p = 0.1f;
  Sampler s(o);
  const auto& c = s.candidates(l, {});
  const auto p = softmax(l, 1.0);
  const double pmax = *std::max_element(p.begin(), p.end());
  size_t expect = 0;
  for (double x : p) expect += x >= 0.1 * pmax;
  EXPECT_EQ(c.size(), expect);
  for (const auto& x : c) EXPECT_GE(p[size_t(x.id)], 0.1 * pmax * (1 - 1e-6));
}

TEST(Sampler, TemperatureScalesLogits) {
  const auto l = random_logits(50, 4);
  for (float t : {0.5f, 1.0f, 2.0f}) {
    Sampler s(plain(t));
    const auto& c = s.candidates(l, {});
    const auto p = softmax(l, t);
    ASSERT_EQ(c.size(), l.size());
    for (const auto& x : c) EXPECT_NEAR(x.p, p[size_t(x.id)], 1e-6) << "temp " << t;
  }
}

TEST(Sampler, PenaltiesFollowTheirDefinitions) {
  std::vector<float> l{2.0f, -2.0f, 1.0f, 0.5f, 3.0f};
  SamplingOptions o = plain(1.0f);
  o.repeat_penalty = 2.0f;
  o.frequency_penalty = 0.25f;
  o.presence_penalty = 0.5f;
  o.penalty_last_n = -1;
  Sampler s(o);
  const std::vector<int32_t> history{0, 1, 0, 0, 3};  // counts: 0 -> 3, 1 -> 1, 3 -> 1
  const auto& c = s.candidates(l, history);
  std::map<int32_t, float> got;
  for (const auto& x : c) got[x.id] = x.logit;
  EXPECT_FLOAT_EQ(got[0], 2.0f / 2 - 3 * 0.25f - 0.5f);
  EXPECT_FLOAT_EQ(got[1], -2.0f * 2 - 1 * 0.25f - 0.5f);
  EXPECT_FLOAT_EQ(got[2], 1.0f);
  EXPECT_FLOAT_EQ(got[3], 0.5f / 2 - 0.25f - 0.5f);
  EXPECT_FLOAT_EQ(got[4], 3.0f);
}

TEST(Sampler, PenaltyWindowAndGreedyFlip) {
  // Token 0 leads by a little; a repetition penalty on it hands greedy decoding to token 1.
  std::vector<float> l{2.0f, 1.9f, 0.0f};
  SamplingOptions o = plain(0.0f);
  o.repeat_penalty = 1.5f;
  o.penalty_last_n = 2;
  Sampler s(o);
  EXPECT_EQ(s.sample(l, std::vector<int32_t>{2, 0}), 1);
  // Token 0 is outside the last two tokens of this history: no penalty.
  EXPECT_EQ(s.sample(l, std::vector<int32_t>{0, 2, 2}), 0);
  o.penalty_last_n = 0;
  Sampler off(o);
  EXPECT_EQ(off.sample(l, std::vector<int32_t>{0, 0}), 0);
}

TEST(Sampler, SeedMakesDrawsReproducible) {
  const auto l = random_logits(100, 5);
  SamplingOptions o = plain(1.5f);
  o.seed = 42;
  Sampler a(o), b(o);
  o.seed = 43;
  Sampler c(o);
  std::vector<int32_t> da, db, dc;
  for (int i = 0; i < 64; ++i) {
    da.push_back(a.sample(l, {}));
    db.push_back(b.sample(l, {}));
    dc.push_back(c.sample(l, {}));
  }
  EXPECT_EQ(da, db);
  EXPECT_NE(da, dc);
  EXPECT_EQ(a.seed(), 42u);
  SamplingOptions r = plain(1.0f);
  r.seed = kRandomSeed;
  EXPECT_NE(Sampler(r).seed(), kRandomSeed);
}

// A draw made elsewhere (the CUDA device sampler) peeks the next uniform number and uses it up only when it chose among
// several candidates: mixing such draws with sample() keeps the stream a sampler alone would give.
TEST(Sampler, PeekedUniformKeepsTheStream) {
  const auto l = random_logits(100, 6);
  SamplingOptions o = plain(1.0f);
  o.seed = 99;
  Sampler alone(o), mixed(o);
  std::vector<int32_t> a, m;
  for (int i = 0; i < 40; ++i) {
    a.push_back(alone.sample(l, {}));
    if (i % 3 == 0) {  // a foreign draw: walk the candidates with the peeked number, then use it up
      const double u = mixed.peek_uniform();
      EXPECT_EQ(u, mixed.peek_uniform()) << "peeking twice must not advance";
      double left = u;
      int32_t pick = -1;
      for (const Candidate& c : mixed.candidates(l, {}))
        if ((left -= c.p) < 0) {
          pick = c.id;
          break;
        }
      m.push_back(pick);
      mixed.take_uniform();
    } else if (i % 3 == 1) {  // peeked, then not used up (a one-candidate draw elsewhere), then sample() draws it
      (void)mixed.peek_uniform();
      m.push_back(mixed.sample(l, {}));
    } else {
      m.push_back(mixed.sample(l, {}));
    }
  }
  EXPECT_EQ(a, m);
}

TEST(Sampler, DrawsFollowTheDistribution) {
  std::vector<float> l{1.0f, 0.0f, -1.0f, 0.5f};
  SamplingOptions o = plain(1.0f);
  o.seed = 7;
  Sampler s(o);
  const auto p = softmax(l, 1.0);
  const int n = 20000;
  std::vector<int> counts(l.size());
  for (int i = 0; i < n; ++i) ++counts[size_t(s.sample(l, {}))];
  // Binomial standard deviation is at most sqrt(0.25 / n) = 0.0035; 0.02 is more than 5 of them.
  for (size_t i = 0; i < l.size(); ++i) EXPECT_NEAR(double(counts[i]) / n, p[i], 0.02) << "token " << i;
}

TEST(Sampler, RejectsBadOptions) {
  SamplingOptions o = plain(1.0f);
  o.top_p = 0.0f;
  EXPECT_THROW(Sampler{o}, Error);
  o = plain(1.0f);
  o.min_p = 1.5f;
  EXPECT_THROW(Sampler{o}, Error);
  o = plain(1.0f);
  o.repeat_penalty = 0.0f;
  EXPECT_THROW(Sampler{o}, Error);
  o = plain(NAN);
  EXPECT_THROW(Sampler{o}, Error);
  Sampler s(plain(1.0f));
  EXPECT_THROW(s.sample({}, {}), Error);
}

// The penalty window's counts (what Sampler's penalties and the CUDA device sampler's caller read).
TEST(Sampler, PenaltyCountsMatchTheWindow) {
  const std::vector<int32_t> h = {5, 3, 5, 9, 5, 3, -1, 100000};
  std::vector<int32_t> scratch;
  std::vector<std::pair<int32_t, int32_t>> all, last3, none;
  penalty_counts(h, -1, 1000, scratch, all);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0], (std::pair<int32_t, int32_t>{3, 2}));
  EXPECT_EQ(all[1], (std::pair<int32_t, int32_t>{5, 3}));
  EXPECT_EQ(all[2], (std::pair<int32_t, int32_t>{9, 1}));
  penalty_counts(h, 3, 1000, scratch, last3);  // {3, -1, 100000}: only 3 lies in the vocabulary
  ASSERT_EQ(last3.size(), 1u);
  EXPECT_EQ(last3[0], (std::pair<int32_t, int32_t>{3, 1}));
  none.emplace_back(1, 1);  // cleared by the call
  penalty_counts(h, 0, 1000, scratch, none);
  EXPECT_TRUE(none.empty());
}

}  // namespace
}  // namespace tessera::runtime
