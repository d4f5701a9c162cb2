// Perplexity and KL divergence (include/tessera/perplexity.h): the scoring against numpy golden data
// (python/make_ppl_golden.py), the chunk layout, a model against its own logits, the whole run against a hand-rolled
// loop over Session::eval_all_logits, and `tessera perplexity` (output, --json, --save-logits / --kl-base, refusals,
// bad input, interruption).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessera/error.h"
#include "tessera/model.h"
#include "tessera/perplexity.h"
#include "tessera/session.h"
#include "test_util.h"

namespace {

using nlohmann::json;
using tessera::test::cli_path;
using tessera::test::run_command;
namespace fs = std::filesystem;

json golden() {
  std::ifstream f(tessera::test::data_path("golden/ppl_synthetic.json"));
  return json::parse(f);
}

std::vector<float> row_of(const json& j) { return j.get<std::vector<float>>(); }

// Golden values are float64 numpy; the C++ side sums expf of float differences and stores float log-probs, so it
// agrees to float rounding: 1e-6 relative on PPL (nll ~ 7.5, float's 6e-8 relative), 2e-6 absolute on KL terms
// (a float log-prob of magnitude ~10 is good to ~5e-7, a KL sums a few such differences weighted by p).
constexpr double kPplRel = 1e-6;
constexpr double kKlAbs = 2e-6;

TEST(PerplexityScoring, ChunkLayoutAsLlamaPerplexity) {
  const json g = golden();
  const std::vector<int32_t> tokens = g["tokens"].get<std::vector<int32_t>>();
  const int64_t n_ctx = g["n_ctx"];
  EXPECT_EQ(tessera::perplexity_chunk_count(static_cast<int64_t>(tokens.size()), n_ctx, -1), 3);
  EXPECT_EQ(tessera::perplexity_chunk_count(static_cast<int64_t>(tokens.size()), n_ctx, 2), 2);
  EXPECT_EQ(tessera::perplexity_chunk_count(static_cast<int64_t>(tokens.size()), n_ctx, 99), 3);
  const std::vector<int32_t> c1 = tessera::perplexity_chunk(tokens, 1, n_ctx, 1);
  ASSERT_EQ(static_cast<int64_t>(c1.size()), n_ctx);
  EXPECT_EQ(c1[0], 1);  // BOS replaces the chunk's first token
  for (int64_t k = 1; k < n_ctx; ++k) EXPECT_EQ(c1[k], tokens[n_ctx + k]);
  EXPECT_EQ(tessera::perplexity_chunk(tokens, 1, n_ctx, -1)[0], tokens[n_ctx]);  // no BOS: kept
  EXPECT_THROW(tessera::perplexity_chunk(tokens, 3, n_ctx, -1), tessera::Error);
}

TEST(PerplexityScoring, PplAndErrorMatchNumpy) {
  const json g = golden();
  const std::vector<int32_t> tokens = g["tokens"].get<std::vector<int32_t>>();
  const int64_t n_ctx = g["n_ctx"], first = n_ctx / 2;
  tessera::NllStats s;
  std::vector<double> running;
  for (int64_t c = 0; c < g["n_chunks"].get<int64_t>(); ++c) {
    for (int64_t r = 0; r < n_ctx - first - 1; ++r)
      s.add(tessera::token_nll(row_of(g["compared_logits"][c][r]), tokens[c * n_ctx + first + r + 1]));
    running.push_back(s.ppl());
  }
  EXPECT_EQ(s.count, g["count"].get<int64_t>());
  EXPECT_NEAR(s.ppl(), g["ppl"].get<double>(), kPplRel * g["ppl"].get<double>());
  EXPECT_NEAR(s.ppl_err(), g["ppl_err"].get<double>(), kPplRel * 10 * g["ppl_err"].get<double>());
  ASSERT_EQ(running.size(), g["running"].size());
  for (size_t i = 0; i < running.size(); ++i)
    EXPECT_NEAR(running[i], g["running"][i].get<double>(), kPplRel * running[i]);
}

void expect_kl_matches(const json& g, int64_t top_k, const json& want) {
  const std::vector<int32_t> tokens = g["tokens"].get<std::vector<int32_t>>();
  const int64_t n_ctx = g["n_ctx"], first = n_ctx / 2;
  tessera::KlStats st;
  for (int64_t c = 0; c < g["n_chunks"].get<int64_t>(); ++c)
    for (int64_t r = 0; r < n_ctx - first - 1; ++r) {
      const int32_t t = tokens[c * n_ctx + first + r + 1];
      const tessera::BaseRow b = tessera::make_base_row(row_of(g["base_logits"][c][r]), t, top_k);
      ASSERT_EQ(static_cast<int64_t>(b.ids.size()), top_k);
      for (size_t k = 1; k < b.logp.size(); ++k) ASSERT_GE(b.logp[k - 1], b.logp[k]);
      st.add(tessera::kl_row(row_of(g["compared_logits"][c][r]), t, b));
    }
  const tessera::KlSummary s = tessera::summarize(st);
  SCOPED_TRACE("top_k " + std::to_string(top_k));
  EXPECT_EQ(s.count, g["count"].get<int64_t>());
  const auto rel = [&](const char* k, double got) {
    EXPECT_NEAR(got, want[k].get<double>(), kPplRel * 10 * std::fabs(want[k].get<double>())) << k;
  };
  const auto abs = [&](const char* k, double got) { EXPECT_NEAR(got, want[k].get<double>(), kKlAbs) << k; };
  rel("ppl", s.ppl), rel("ppl_err", s.ppl_err), rel("ppl_base", s.ppl_base), rel("ppl_base_err", s.ppl_base_err);
  abs("ln_ppl_ratio", s.ln_ppl_ratio), abs("ln_ppl_ratio_err", s.ln_ppl_ratio_err);
  abs("kld", s.kld), abs("kld_err", s.kld_err), abs("kld_max", s.kld_max), abs("kld_min", s.kld_min);
  abs("kld_median", s.kld_median), abs("kld_p999", s.kld_p999), abs("kld_p99", s.kld_p99);
  abs("kld_p95", s.kld_p95), abs("kld_p90", s.kld_p90), abs("kld_p10", s.kld_p10), abs("kld_p5", s.kld_p5);
  abs("kld_p1", s.kld_p1), abs("kld_p01", s.kld_p01);
  abs("p_diff_mean", s.p_diff_mean), abs("p_diff_mean_err", s.p_diff_mean_err), abs("p_diff_rms", s.p_diff_rms);
  abs("p_diff_rms_err", s.p_diff_rms_err), abs("p_diff_max", s.p_diff_max), abs("p_diff_min", s.p_diff_min);
  EXPECT_DOUBLE_EQ(s.same_top, want["same_top"].get<double>());
  abs("same_top_err", s.same_top_err);
}

TEST(PerplexityScoring, KlFromTopKMatchesNumpy) {
  const json g = golden();
  expect_kl_matches(g, g["top_k"].get<int64_t>(), g["kl_top_k"]);
}

TEST(PerplexityScoring, KlFromWholeRowsIsTheExactKl) {
  const json g = golden();
  expect_kl_matches(g, g["n_vocab"].get<int64_t>(), g["kl_full"]);
  EXPECT_NEAR(g["kl_full"]["kld"].get<double>(), g["kld_exact_mean"].get<double>(), 1e-12);
  // The lumped rest makes a top-k KL a lower bound; here, a strict one.
  EXPECT_LT(g["kl_top_k"]["kld"].get<double>(), g["kl_full"]["kld"].get<double>());
}

TEST(PerplexityScoring, ARowAgainstItselfIsExactlyZero) {
  const json g = golden();
  for (const int64_t k : {int64_t{1}, int64_t{5}, g["n_vocab"].get<int64_t>()}) {
    const std::vector<float> l = row_of(g["base_logits"][0][3]);
    const tessera::BaseRow b = tessera::make_base_row(l, 7, k);
    const tessera::KlRow r = tessera::kl_row(l, 7, b);
    EXPECT_EQ(r.kld, 0.0) << k;
    EXPECT_EQ(r.p_diff, 0.0) << k;
    EXPECT_NEAR(r.nll, r.nll_base, 1e-6 * r.nll) << k;  // nll in double (the PPL of a plain run), the base's float
    EXPECT_TRUE(r.same_top) << k;
  }
}

TEST(PerplexityScoring, Utf8CheckNamesTheOffset) {
  EXPECT_NO_THROW(tessera::check_utf8("plain, \xc3\xa9t\xc3\xa9, \xe2\x82\xac, \xf0\x9f\x98\x80"));
  const auto msg = [](std::string_view s) {
    try {
      tessera::check_utf8(s);
    } catch (const tessera::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg("abc\xff").find("byte 3"), std::string::npos) << msg("abc\xff");
  EXPECT_NE(msg("ab\xc3").find("byte 2"), std::string::npos);           // cut off at the end
  EXPECT_NE(msg("a\xe2\x28\xa1 x").find("byte 1"), std::string::npos);  // bad continuation
  EXPECT_NE(msg("xy\xc0\xaf").find("byte 2"), std::string::npos);       // overlong
  EXPECT_NE(msg("x\xed\xa0\x80").find("byte 1"), std::string::npos);    // surrogate
}

// ---- With the default model.

fs::path scratch(const std::string& name) {
  return fs::temp_directory_path() / ("tessera_ppl_" + std::to_string(::getpid()) + "_" + name);
}

// A text of a few hundred tokens: numbered lines of varied prose.
std::string sample_text(int lines, const std::string& salt = "") {
  static const char* words[] = {"river", "lantern", "quietly", "mountain", "seven", "harbor", "because", "winter",
                                "the",   "of",      "copper",  "and",      "under", "bright", "ships",   "old"};
  std::string s;
  for (int i = 0; i < lines; ++i) {
    s += std::to_string(i + 1) + salt + ". ";
    for (int w = 0; w < 9; ++w) s += std::string(words[(i * 7 + w * 3 + w * w) % 16]) + (w == 8 ? ".\n" : " ");
  }
  return s;
}

void write_file(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

TEST(Perplexity, RunEqualsAHandRolledLoopOverEvalAllLogits) {
  TESSERA_REQUIRE_DEFAULT_MODEL(path);
  const tessera::Model m = tessera::Model::load(path);
  const std::string text = sample_text(40);
  tessera::Session s(m, {.n_ctx = 64, .n_threads = 2});
  std::vector<double> seen;
  const tessera::PerplexityResult r =
      tessera::perplexity(s, text, {.n_chunks = 3}, [&](const tessera::PerplexityChunk& c) {
        seen.push_back(c.nll.ppl());
        return true;
      });
  ASSERT_EQ(r.n_chunks, 3);
  EXPECT_EQ(r.nll.count, 3 * (64 - 32 - 1));
  EXPECT_EQ(seen, r.running);
  // The method written out once more: whole chunks through eval_all_logits (one pass, every row's logits).
  const std::vector<int32_t> tokens = m.tokenizer().encode(text, true, false);
  const int32_t bos = m.tokenizer().add_bos() ? m.tokenizer().bos_id() : -1;
  tessera::NllStats ref;
  for (int64_t c = 0; c < 3; ++c) {
    s.reset();
    const std::vector<int32_t> chunk = tessera::perplexity_chunk(tokens, c, 64, bos);
    const std::vector<float> all = s.eval_all_logits(chunk);
    for (int64_t p = 32; p < 63; ++p)
      ref.add(tessera::token_nll(std::span<const float>(all.data() + p * s.n_vocab(), s.n_vocab()),
                                 tokens[c * 64 + p + 1]));
  }
  // Half-then-half evaluation and one pass differ only in how rows are blocked through the kernels.
  EXPECT_NEAR(r.ppl, ref.ppl(), 2e-3 * ref.ppl());
  EXPECT_GT(r.ppl, 1.0);
  EXPECT_NEAR(r.ppl_err, ref.ppl_err(), 0.05 * ref.ppl_err());
}

TEST(Perplexity, TargetLogprobsEqualTheLogSoftmaxOfEveryRow) {
  TESSERA_REQUIRE_DEFAULT_MODEL(path);
  const tessera::Model m = tessera::Model::load(path);
  tessera::Session s(m, {.n_ctx = 64, .n_batch = 16, .n_threads = 2});
  const std::vector<int32_t> ids = m.tokenizer().encode(sample_text(4), true, false);
  ASSERT_GE(ids.size(), 40u);
  const std::span<const int32_t> x(ids.data(), 39), targets(ids.data() + 1, 39);
  const std::vector<float> all = s.eval_all_logits(x);
  s.reset();
  const std::vector<double> lp = s.eval_target_logprobs(x, targets);  // three chunks of n_batch 16
  ASSERT_EQ(lp.size(), 39u);
  EXPECT_EQ(s.n_past(), 39);
  // The same logits; token_nll's log-sum-exp adds the exponentials in another order.
  for (size_t r = 0; r < lp.size(); ++r) {
    const std::span<const float> row(all.data() + r * s.n_vocab(), s.n_vocab());
    EXPECT_NEAR(lp[r], -tessera::token_nll(row, targets[r]), 1e-7) << "row " << r;
  }
  // -1: a row not scored (0 comes back), the others as before.
  std::vector<int32_t> some(targets.begin(), targets.end());
  for (size_t r = 0; r < some.size(); r += 2) some[r] = -1;
  s.reset();
  const std::vector<double> lp2 = s.eval_target_logprobs(x, some);
  for (size_t r = 0; r < lp2.size(); ++r) EXPECT_EQ(lp2[r], r % 2 == 0 ? 0.0 : lp[r]) << "row " << r;
  std::vector<int32_t> bad(targets.begin(), targets.end());
  bad[5] = static_cast<int32_t>(s.n_vocab());
  s.reset();
  EXPECT_THROW(s.eval_target_logprobs(x, bad), tessera::Error);
  EXPECT_THROW(s.eval_target_logprobs(x, targets.first(3)), tessera::Error);
  EXPECT_FALSE(s.scores_on_device());  // the CPU scores every row on the host
}

TEST(Perplexity, TokensRunEqualsTheTextRunOnTheSameIds) {
  TESSERA_REQUIRE_DEFAULT_MODEL(path);
  const tessera::Model m = tessera::Model::load(path);
  tessera::Session s(m, {.n_ctx = 64, .n_threads = 2});
  const std::string text = sample_text(40);
  const tessera::PerplexityResult a = tessera::perplexity(s, text, {.n_chunks = 2});
  // perplexity() puts BOS at the start of each chunk where the model asks for one; given ids are taken as they are.
  std::vector<int32_t> ids = m.tokenizer().encode(text, true, false);
  if (m.tokenizer().add_bos())
    for (size_t c = 0; c + 64 <= ids.size(); c += 64) ids[c] = m.tokenizer().bos_id();
  const tessera::PerplexityResult b = tessera::perplexity_tokens(s, ids, {.n_chunks = 2});
  EXPECT_EQ(b.n_tokens, a.n_tokens);
  EXPECT_DOUBLE_EQ(b.ppl, a.ppl);
  EXPECT_THROW(tessera::perplexity_tokens(s, std::span<const int32_t>(ids.data(), 100), {}), tessera::Error);
}

TEST(Perplexity, StopsWhenTheCallbackSaysSo) {
  TESSERA_REQUIRE_DEFAULT_MODEL(path);
  const tessera::Model m = tessera::Model::load(path);
  tessera::Session s(m, {.n_ctx = 64, .n_threads = 2});
  const tessera::PerplexityResult r =
      tessera::perplexity(s, sample_text(40), {}, [](const tessera::PerplexityChunk&) { return false; });
  EXPECT_EQ(r.n_chunks, 1);
  EXPECT_TRUE(r.interrupted);
  EXPECT_GT(r.n_chunks_planned, 1);
  EXPECT_EQ(r.running.size(), 1u);
}

TEST(Perplexity, AnInterruptedBaseHoldsTheChunksItWrote) {
  TESSERA_REQUIRE_DEFAULT_MODEL(path);
  const tessera::Model m = tessera::Model::load(path);
  tessera::Session s(m, {.n_ctx = 64, .n_threads = 2});
  const fs::path base = scratch("stopped.tplg");
  const std::string text = sample_text(40);
  int calls = 0;
  const tessera::PerplexityResult saved =
      tessera::perplexity(s, text, {.save_logits = base.string(), .top_k = 8},
                          [&](const tessera::PerplexityChunk&) { return ++calls < 2; });
  ASSERT_TRUE(saved.interrupted);
  ASSERT_EQ(saved.n_chunks, 2);
  EXPECT_EQ(fs::file_size(base), 48u + 2u * 31u * (8u + 8u * 8u));
  // The header was rewritten to 2 chunks (and their tokens' hash), so the base is accepted and compared in full.
  const tessera::PerplexityResult kl = tessera::perplexity(s, text, {.kl_base = base.string()});
  EXPECT_EQ(kl.n_chunks, 2);
  ASSERT_TRUE(kl.has_kl);
  EXPECT_EQ(kl.kl.kld, 0.0);
  EXPECT_EQ(kl.kl.same_top, 1.0);
  EXPECT_DOUBLE_EQ(kl.ppl, saved.ppl);
  fs::remove(base);
}

std::string cli() { return cli_path() + " perplexity "; }

TEST(PerplexityCli, PrintsRunningEstimatesAndTheFinalLine) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  const fs::path t = scratch("a.txt");
  write_file(t, sample_text(40));
  std::string out;
  ASSERT_EQ(run_command(cli() + "-m " + model + " -f " + t.string() + " -c 64 --chunks 3 -t 2", &out), 0) << out;
  EXPECT_NE(out.find("[1]"), std::string::npos) << out;
  EXPECT_NE(out.find(",[3]"), std::string::npos) << out;
  EXPECT_NE(out.find("Final estimate: PPL = "), std::string::npos) << out;
  EXPECT_NE(out.find(" +/- "), std::string::npos) << out;
  EXPECT_NE(out.find("tokens/s"), std::string::npos) << out;
  EXPECT_NE(out.find("ETA"), std::string::npos) << out;
  fs::remove(t);
}

TEST(PerplexityCli, SavedLogitsAgainstTheSameModelGiveZeroKl) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  const fs::path t = scratch("b.txt"), base = scratch("b.tplg"), other = scratch("c.txt");
  write_file(t, sample_text(60));
  write_file(other, sample_text(60, "x"));
  const std::string common = cli() + "-m " + model + " -c 64 -t 2 ";
  std::string out;
  ASSERT_EQ(run_command("{ " + common + "-f " + t.string() + " --chunks 5 --json --save-logits " + base.string() +
                            " 2>/dev/null; }",
                        &out),
            0)
      << out;
  const json ref = json::parse(out);
  EXPECT_EQ(ref["n_chunks"], 5);
  // Header 48 bytes, then 5 chunks x 31 positions x (8 + 8 * 1024): the default --kl-top-k.
  EXPECT_EQ(fs::file_size(base), 48u + 5u * 31u * (8u + 8u * 1024u));
  ASSERT_EQ(
      run_command("{ " + common + "-f " + t.string() + " --json --kl-base " + base.string() + " 2>/dev/null; }", &out),
      0)
      << out;
  const json kl = json::parse(out);
  EXPECT_EQ(kl["n_chunks"], 5);  // the base's chunks
  EXPECT_EQ(kl["ppl"].get<double>(), ref["ppl"].get<double>());
  EXPECT_EQ(kl["kl"]["kld_mean"].get<double>(), 0.0);
  EXPECT_EQ(kl["kl"]["kld_max"].get<double>(), 0.0);
  EXPECT_EQ(kl["kl"]["same_top"].get<double>(), 1.0);
  EXPECT_EQ(kl["kl"]["dp_rms"].get<double>(), 0.0);
  EXPECT_NEAR(kl["kl"]["ppl_base"].get<double>(), ref["ppl"].get<double>(), 1e-5 * ref["ppl"].get<double>());
  // The text form prints llama-perplexity's statistics.
  ASSERT_EQ(run_command(common + "-f " + t.string() + " --kl-base " + base.string(), &out), 0) << out;
  EXPECT_NE(out.find("Mean    KLD:   0.000000"), std::string::npos) << out;
  EXPECT_NE(out.find("Same top p: 100.000"), std::string::npos) << out;
  // Refused: another text, another context, a count of chunks that is not the base's.
  ASSERT_EQ(run_command(common + "-f " + other.string() + " --kl-base " + base.string(), &out), 1) << out;
  EXPECT_NE(out.find("another text"), std::string::npos) << out;
  ASSERT_EQ(run_command(cli() + "-m " + model + " -c 32 -t 2 -f " + t.string() + " --kl-base " + base.string(), &out),
            1)
      << out;
  EXPECT_NE(out.find("context of 64"), std::string::npos) << out;
  ASSERT_EQ(run_command(common + "-f " + t.string() + " --chunks 2 --kl-base " + base.string(), &out), 1) << out;
  EXPECT_NE(out.find("holds 5 chunks"), std::string::npos) << out;
  ASSERT_EQ(run_command(common + "-f " + t.string() + " --kl-base " + t.string(), &out), 1) << out;
  EXPECT_NE(out.find("not a tessera logits file"), std::string::npos) << out;
  fs::remove(t), fs::remove(base), fs::remove(other);
}

TEST(PerplexityCli, BadInputIsOneSentence) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  const fs::path empty = scratch("empty.txt"), shortt = scratch("short.txt"), bad = scratch("bad.txt");
  write_file(empty, "\n");
  write_file(shortt, "Just a few words here.");
  write_file(bad, "good text, then \xff there");
  const std::string common = cli() + "-m " + model + " -t 2 ";
  const auto one_error = [](const std::string& out, const std::string& what) {
    EXPECT_EQ(out.rfind("tessera: error: ", 0), 0u) << out;
    EXPECT_NE(out.find(what), std::string::npos) << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  };
  std::string out;
  EXPECT_EQ(run_command(common + "-f " + empty.string(), &out), 1);
  one_error(out, "the text is empty");
  EXPECT_EQ(run_command(common + "-f " + shortt.string() + " -c 64", &out), 1);
  one_error(out, "needs at least 128 (2 x the context)");
  EXPECT_EQ(run_command(common + "-f " + bad.string(), &out), 1);
  one_error(out, "not valid UTF-8: byte 16");
  EXPECT_EQ(run_command(common + "-f " + scratch("missing.txt").string(), &out), 1);
  one_error(out, "cannot open the text file");
  EXPECT_EQ(run_command(common + "-f " + empty.string() + " -c 2", &out), 1);
  one_error(out, "at least 4 tokens");
  fs::remove(empty), fs::remove(shortt), fs::remove(bad);
}

TEST(PerplexityCli, RandomTokensTimeASyntheticModel) {
  const std::string common = cli() + "--random-weights --arch smollm2-135m --layers 2 -t 2 -c 64 ";
  std::string out;
  ASSERT_EQ(run_command(common + "--random-tokens 256 --json", &out), 0) << out;
  ASSERT_NE(out.find('{'), std::string::npos) << out;  // after the synthetic model's progress lines
  const nlohmann::json j = nlohmann::json::parse(out.substr(out.find('{'), out.rfind('}') - out.find('{') + 1));
  EXPECT_EQ(j["n_chunks"], 4);
  EXPECT_EQ(j["scored_tokens"], 4 * 31);
  EXPECT_GT(j["ppl"].get<double>(), 1.0);
  EXPECT_EQ(j["text"], "256 random ids");
  EXPECT_EQ(run_command(common + "--random-tokens 256 -f /dev/null", &out), 1);
  EXPECT_NE(out.find("not both"), std::string::npos) << out;
  EXPECT_EQ(run_command(cli() + "--random-weights --arch smollm2-135m --layers 2 -c 64", &out), 1);
  EXPECT_NE(out.find("--random-tokens N"), std::string::npos) << out;
}

TEST(PerplexityCli, InterruptPrintsTheEstimateSoFar) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  const fs::path t = scratch("long.txt");
  write_file(t, sample_text(3000));  // ~90k tokens: minutes of chunks, interrupted after the first
  std::string out;
  // SIGINT after 5 s (loading and tokenizing take well under 1 s); the run stops after the chunk in flight.
  // --foreground: without it timeout sends the signal twice (to the child, then to its process group), and the
  // second, arriving after the handler ran, is the "second Ctrl-C" that ends the run at once.
  const int rc = run_command(
      "timeout --foreground --preserve-status -s INT 5 " + cli() + "-m " + model + " -f " + t.string() + " -c 256 -t 2", &out);
  EXPECT_EQ(rc, 130) << out;
  EXPECT_NE(out.find("Interrupted after "), std::string::npos) << out;
  EXPECT_NE(out.find("Final estimate: PPL = "), std::string::npos) << out;
  fs::remove(t);
}

}  // namespace
