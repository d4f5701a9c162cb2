// The families beyond Llama as a user's GGUF holds them: tests/data/family_gguf/tiny-*.gguf are llama.cpp's own
// convert_hf_to_gguf.py output (--outtype f32) of the tiny Hugging Face models of tests/data/hf, opened here through
// the public API (Model::load, Session) and checked against transformers' float64 logits of the same weights, and
// against llama.cpp's logits of the same file (python/make_family_gguf_golden.py). What this checks that the GGUF files
// Tessera writes cannot: llama.cpp's tensor names and metadata keys (Gemma 3's norms stored as 1 + w, its local rope
// base and window, Phi-3's fused q|k|v and gate|up, Qwen2's biases, Qwen3's q/k norms, the llama q/k row permutation
// of Mistral), and its tokenizer metadata loading with the model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessera/model.h"
#include "tessera/session.h"
#include "test_util.h"

namespace tessera {
namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  nlohmann::json j;
  in >> j;
  return j;
}

// The entry of golden.json for one converted file.
nlohmann::json entry_of(const std::string& file) {
  const nlohmann::json golden = read_json(test::data_path("family_gguf/golden.json"));
  return golden.at("files").at(file);
}

// Logits [T, vocab] of the ids, from Tessera on the converted file.
std::vector<float> tessera_logits(const Model& m, const std::vector<int32_t>& ids, bool reference) {
  SessionOptions so;
  so.n_ctx = 32;
  so.n_batch = 4;  // chunks of 4: the sliding windows (4-6 keys) drop keys of earlier chunks
  so.n_threads = 2;
  so.reference = reference;
  Session s(m, so);
  return s.eval_all_logits(ids);
}

// Compares rows [0, rows) of Tessera's logits with a reference [T][vocab]: every logit within tol times its row's
// largest |logit| (one failure naming the worst logit, not one per logit), and the same top-1; prints the agreement
// (max and mean relative error, top-1 matches).
void expect_rows_near(const std::vector<float>& got, const std::vector<std::vector<double>>& want, size_t rows,
                      double tol, const std::string& what) {
  ASSERT_LE(rows, want.size());
  const size_t V = want[0].size();
  ASSERT_EQ(got.size(), want.size() * V) << what;
  double max_rel = 0, sum_rel = 0;
  size_t worst_t = 0, worst_i = 0, top1 = 0;
  for (size_t t = 0; t < rows; ++t) {
    double scale = 0;
    for (double x : want[t]) scale = std::max(scale, std::fabs(x));
    const float* row = got.data() + t * V;
    for (size_t i = 0; i < V; ++i) {
      const double rel = std::fabs(row[i] - want[t][i]) / scale;
      sum_rel += rel;
      if (rel > max_rel) max_rel = rel, worst_t = t, worst_i = i;
    }
    const size_t a = static_cast<size_t>(std::max_element(row, row + V) - row);
    const size_t b = static_cast<size_t>(std::max_element(want[t].begin(), want[t].end()) - want[t].begin());
    top1 += a == b;
  }
  std::printf("  %-48s max rel %.2e  mean rel %.2e  top-1 %zu/%zu\n", what.c_str(), max_rel,
              sum_rel / double(rows * V), top1, rows);
  EXPECT_LE(max_rel, tol) << what << ": token " << worst_t << " logit " << worst_i << " is "
                          << got[worst_t * V + worst_i] << ", want " << want[worst_t][worst_i];
  EXPECT_EQ(top1, rows) << what;
}

class FamilyGguf : public ::testing::TestWithParam<const char*> {};

// Against transformers: the tiny HF folder's golden.json (float64 logits) when the conversion keeps everything, or
// the reference recomputed from the same weights as llama.cpp reads the file (Gemma 3: every layer local here and
// 1/sqrt(head_dim); Mistral: no window), golden.json's "why" says which.
TEST_P(FamilyGguf, MatchesTransformers) {
  const std::string file = GetParam();
  const nlohmann::json e = entry_of(file);
  const nlohmann::json& tf = e.at("transformers");
  const nlohmann::json ref = tf.contains("golden") ? read_json(test::data_path(tf.at("golden"))) : tf;
  const auto ids = ref.at("ids").get<std::vector<int32_t>>();
  const auto want = ref.at("logits").get<std::vector<std::vector<double>>>();
  const Model m = Model::load(test::data_path("family_gguf/" + file));
  for (bool reference : {true, false}) {
    // f32 weights: the reference path differs from float64 by f32 rounding only; the fast path adds an f16 KV cache
    // and its own accumulation order (FamilyHf's limits).
    const double tol = reference ? 1e-5 : 3e-3;
    expect_rows_near(tessera_logits(m, ids, reference), want, want.size(), tol,
                     file + (reference ? " reference vs transformers" : " fast vs transformers"));
  }
}

// Against llama.cpp on the same file (f32 KV cache, flash attention off): the rows golden.json says are comparable
// (Phi-3: llama.cpp switches its sliding window off, so only the rows the window leaves whole).
TEST_P(FamilyGguf, MatchesLlamaCpp) {
  const std::string file = GetParam();
  const nlohmann::json e = entry_of(file);
  if (!e.contains("llamacpp")) GTEST_SKIP() << "golden.json holds no llama.cpp logits for " << file;
  const nlohmann::json& lc = e.at("llamacpp");
  const auto ids = lc.at("ids").get<std::vector<int32_t>>();
  const auto want = lc.at("logits").get<std::vector<std::vector<double>>>();
  const size_t rows = lc.at("rows").get<size_t>();
  const Model m = Model::load(test::data_path("family_gguf/" + file));
  // llama.cpp's CPU GEGLU (Gemma 3) rounds the gate to f16 and reads GELU from an f16 table (ggml-cpu vec.h,
  // GGML_GELU_FP16): 2^-11 relative on each activation, 6.3e-4 of the row scale measured against transformers, so
  // Gemma 3 gets the f16 limit (3e-3) on both paths.
  const bool f16_gelu = file == "tiny-gemma3.gguf";
  for (bool reference : {true, false}) {
    // Otherwise both sides are f32: each differs from float64 by f32 rounding (under 1e-6 of the row scale
    // measured), so the reference path keeps FamilyHf's 1e-5; the fast path (f16 KV cache) its 3e-3.
    const double tol = reference && !f16_gelu ? 1e-5 : 3e-3;
    expect_rows_near(tessera_logits(m, ids, reference), want, rows, tol,
                     file + (reference ? " reference vs llama.cpp" : " fast vs llama.cpp"));
  }
}

INSTANTIATE_TEST_SUITE_P(Converted, FamilyGguf,
                         ::testing::Values("tiny-gemma3.gguf", "tiny-qwen2.gguf", "tiny-qwen3.gguf", "tiny-mistral.gguf",
                                           "tiny-phi3.gguf"),
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           std::string n = i.param;
                           n = n.substr(5, n.size() - 10);  // "tiny-" ... ".gguf"
                           return n;
                         });

}  // namespace
}  // namespace tessera
