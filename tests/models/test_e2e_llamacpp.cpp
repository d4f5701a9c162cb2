// End to end against llama.cpp (the peer) on the default model, through the public API with the default (fast) CPU
// path. For three prompts (prose, code, chat-formatted; ids from llama.cpp's tokenizer):
//   - logits at every prompt position: top-1 agrees at >= 99% of all positions and mean KL(llama.cpp || tessera)
//     < 0.01, both pooled over the three prompts;
//   - greedy generation of 64 tokens equals llama.cpp's, unless a near-tie (top-2 logit gap < 1e-3 at the first
//     divergence, in either engine's logits) explains the difference, which the test reports.
// Golden data: tests/data/golden/llamacpp_smollm2_135m_q4_1.json, from
//   .venv/bin/python python/make_llamacpp_golden.py
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "e2e_golden.h"
#include "tessera/model.h"
#include "tessera/session.h"
#include "test_util.h"

namespace tessera {
namespace {

using e2e::GoldenPosition;

// The bounds. Two correct engines differ here by rounding that 8-bit activation quantization turns into
// logit noise of about 0.1 (llama.cpp against itself with flash attention off and an f32 KV cache: mean KL
// 2e-3..5e-3), so top-1 can flip only where the top-2 gap is of that size; docs/CORRECTNESS.md has the figures.
constexpr double kMinTop1 = 0.99;
constexpr double kMaxMeanKl = 0.01;
constexpr double kNearTieGap = 1e-3;

struct GreedyStep {
  int32_t id = 0, second_id = 0;
  float gap = 0;  // top-1 minus top-2 logit in llama.cpp
};

struct Prompt {
  std::string name;
  std::vector<int32_t> ids;
  std::vector<GoldenPosition> positions;
  std::vector<GreedyStep> greedy;
};

struct PeerGolden {
  std::string model_file;
  std::vector<Prompt> prompts;
};

PeerGolden load_golden() {
  const std::string path = test::data_path("golden/llamacpp_smollm2_135m_q4_1.json");
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  const nlohmann::json j = nlohmann::json::parse(in);
  PeerGolden g;
  g.model_file = j.at("model_file").get<std::string>();
  for (const auto& p : j.at("prompts")) {
    Prompt pr;
    pr.name = p.at("name").get<std::string>();
    pr.ids = p.at("ids").get<std::vector<int32_t>>();
    pr.positions = e2e::parse_positions(p.at("positions"));
    for (const auto& s : p.at("greedy"))
      pr.greedy.push_back({s.at("id").get<int32_t>(), s.at("second_id").get<int32_t>(), s.at("gap").get<float>()});
    if (pr.positions.size() != pr.ids.size()) throw std::runtime_error(path + ": positions and ids differ in count");
    g.prompts.push_back(std::move(pr));
  }
  return g;
}

class E2eLlamaCpp : public ::testing::Test {
 protected:
  void SetUp() override {
    TESSERA_REQUIRE_DEFAULT_MODEL(path);
    golden_ = load_golden();
    ASSERT_EQ(std::filesystem::path(path).filename().string(), golden_.model_file)
        << "the golden data was made for another model file";
    ASSERT_GE(golden_.prompts.size(), 3u);
    model_ = Model::load(path);
    SessionOptions so;
    so.n_threads = 2;
    so.n_ctx = 512;
    session_ = std::make_unique<Session>(model_, so);
  }
  PeerGolden golden_;
  Model model_;
  std::unique_ptr<Session> session_;
};

TEST_F(E2eLlamaCpp, LogitsAtEveryPositionAgree) {
  const size_t v = static_cast<size_t>(session_->n_vocab());
  size_t n = 0, top1 = 0;
  double kl_sum = 0;
  for (const Prompt& p : golden_.prompts) {
    ASSERT_GE(p.ids.size(), 64u) << p.name;
    session_->reset();
    const std::vector<float> logits = session_->eval_all_logits(p.ids);  // [T, n_vocab]
    size_t agree = 0;
    double kl = 0, kl_max = 0;
    std::string misses;
    for (size_t t = 0; t < p.ids.size(); ++t) {
      const std::span<const float> row(logits.data() + t * v, v);
      const GoldenPosition& g = p.positions[t];
      const int32_t ours = e2e::argmax(row);
      if (ours == g.top_ids[0]) {
        ++agree;
      } else {
        char buf[160];
        std::snprintf(buf, sizeof buf, " [pos %zu: llama.cpp %d (gap %.3g), tessera %d]", t, g.top_ids[0],
                      double(g.top_logits[0]) - g.top_logits[1], ours);
        misses += buf;
      }
      const double k = e2e::kl_lumped(g, row);
      kl += k;
      kl_max = std::max(kl_max, k);
    }
    std::printf("[ e2e-llama.cpp ] %-6s %3zu positions: top-1 %5.1f%%, mean KL %.3g, max KL %.3g%s\n", p.name.c_str(),
                p.ids.size(), 100.0 * double(agree) / double(p.ids.size()), kl / double(p.ids.size()), kl_max,
                misses.c_str());
    n += p.ids.size();
    top1 += agree;
    kl_sum += kl;
  }
  const double top1_rate = double(top1) / double(n), mean_kl = kl_sum / double(n);
  std::printf("[ e2e-llama.cpp ] all    %3zu positions: top-1 %5.1f%%, mean KL %.3g\n", n, 100.0 * top1_rate, mean_kl);
  RecordProperty("top1_percent", std::to_string(100.0 * top1_rate));
  RecordProperty("mean_kl", std::to_string(mean_kl));
  EXPECT_GE(top1_rate, kMinTop1);
  EXPECT_LT(mean_kl, kMaxMeanKl);
}

TEST_F(E2eLlamaCpp, GreedyGenerationMatches) {
  for (const Prompt& p : golden_.prompts) {
    // Greedy by hand (the prompt in one eval, then one decode per token, as generate() runs it) so the logits of
    // the first divergence are at hand; generate_tokens() must then give the same ids.
    session_->reset();
    std::span<const float> row = session_->eval(p.ids);
    std::vector<int32_t> ours;
    size_t diverged = p.greedy.size();
    double our_gap = 0;  // at the divergence: our logit of our choice minus our logit of llama.cpp's
    for (size_t s = 0; s < p.greedy.size(); ++s) {
      const int32_t id = e2e::argmax(row);
      if (diverged == p.greedy.size() && id != p.greedy[s].id) {
        diverged = s;
        our_gap = double(row[size_t(id)]) - row[size_t(p.greedy[s].id)];
      }
      ours.push_back(id);
      if (s + 1 < p.greedy.size()) row = session_->decode(id);
    }

    session_->reset();
    GenerateOptions go;
    go.max_tokens = static_cast<int64_t>(p.greedy.size());
    go.sampling.temperature = 0;  // greedy
    go.ignore_eos = true;         // llama.cpp's continuation runs the full length too
    const GenerateResult r = session_->generate_tokens(p.ids, go);
    EXPECT_EQ(r.tokens, ours) << p.name << ": generate_tokens() differs from the eval/decode argmax loop";

    if (diverged == p.greedy.size()) {
      std::printf("[ e2e-llama.cpp ] %-6s greedy %zu tokens identical\n", p.name.c_str(), diverged);
      continue;
    }
    // The prefix before the divergence is the same in both engines, so a near-tie there (top-2 gap under
    // kNearTieGap in llama.cpp's logits, or our two candidates as close in ours) explains the rest.
    const GreedyStep& g = p.greedy[diverged];
    const bool peer_tie = g.second_id == ours[diverged] && g.gap < kNearTieGap;
    const bool our_tie = our_gap < kNearTieGap;
    std::printf(
        "[ e2e-llama.cpp ] %-6s greedy diverges at step %zu of %zu: llama.cpp %d (top-2 gap %.3g), "
        "tessera %d (gap to llama.cpp's choice %.3g): %s\n",
        p.name.c_str(), diverged, p.greedy.size(), g.id, double(g.gap), ours[diverged], our_gap,
        peer_tie || our_tie ? "explained by a near-tie" : "NOT a near-tie");
    EXPECT_TRUE(peer_tie || our_tie) << p.name << ": greedy generation diverges from llama.cpp at step " << diverged
                                     << " without a near-tie (gaps " << g.gap << " and " << our_gap << ")";
  }
}

}  // namespace
}  // namespace tessera
