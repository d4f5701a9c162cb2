// A GGUF LoRA converted with llama.cpp's convert_lora_to_gguf.py gives llama.cpp's logits (issue 25): the tiny LoRA
// model of tests/data/lora as a GGUF (base.gguf, by llama.cpp's convert_hf_to_gguf.py) with adapter_a.gguf, through
// the public Session API, against llama.cpp's own logits of the same two files (golden_llamacpp.json, written by
// python/make_lora_llamacpp_golden.py: llama.cpp on CPU, f32 KV cache, flash attention off, so both engines are f32
// throughout), without the adapter and with it at scale 1.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fmt/core.h>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tessera/session.h"
#include "test_util.h"

namespace tessera {
namespace {

using Rows = std::vector<std::vector<double>>;

struct Golden {
  std::vector<int32_t> ids;
  Rows base, a;  // llama.cpp's logits [T][vocab] without and with adapter_a.gguf
};

const Golden& golden() {
  static const Golden g = [] {
    nlohmann::json j;
    std::ifstream(test::data_path("lora/golden_llamacpp.json")) >> j;
    return Golden{j["ids"].get<std::vector<int32_t>>(), j["base"].get<Rows>(), j["a"].get<Rows>()};
  }();
  return g;
}

std::string path(const char* name) { return test::data_path(std::string("lora/") + name); }

// The fast path runs with an f32 KV cache, as llama.cpp does here (test_lora.cpp says why an f16 one is too coarse
// for these strong adapters).
std::vector<float> run(const std::vector<LoraSpec>& lora, bool merge, bool reference) {
  SessionOptions so;
  so.n_ctx = 32;
  so.n_batch = 4;  // chunks: prefill graphs of 4 rows and the T = 2 tail
  so.n_threads = 2;
  so.reference = reference;
  so.kv_dtype = "f32";
  so.lora = lora;
  so.lora_merge = merge;
  Session s(Model::load(path("base.gguf"), {.load_tokenizer = false}), so);
  return s.eval_all_logits(golden().ids);
}

struct Agreement {
  double max_rel = 0;  // largest |got - want| over the row's max |want| (test_lora.cpp's measure)
  double nmse = 0;     // sum (got - want)^2 / sum want^2
  int top1 = 0;        // positions whose argmax agrees
};

Agreement compare(const std::vector<double>& got, const Rows& want) {
  const size_t V = want[0].size();
  EXPECT_EQ(got.size(), want.size() * V);
  Agreement r;
  double num = 0, den = 0;
  for (size_t t = 0; t < want.size() && (t + 1) * V <= got.size(); ++t) {
    double scale = 0, err = 0;
    size_t g1 = 0, w1 = 0;
    for (size_t i = 0; i < V; ++i) {
      const double g = got[t * V + i], w = want[t][i];
      scale = std::max(scale, std::fabs(w));
      err = std::max(err, std::fabs(g - w));
      num += (g - w) * (g - w);
      den += w * w;
      if (g > got[t * V + g1]) g1 = i;
      if (w > want[t][w1]) w1 = i;
    }
    r.max_rel = std::max(r.max_rel, err / scale);
    r.top1 += g1 == w1;
  }
  r.nmse = num / den;
  return r;
}

Agreement compare(const std::vector<float>& got, const Rows& want) {
  return compare(std::vector<double>(got.begin(), got.end()), want);
}

// Measured (Release, AVX-512 CPU, 2 threads): the f32 paths (reference; fast without an adapter or merged) within
// 2.7e-7 of the row's scale of llama.cpp without the adapter and 2.2e-6 with it, i.e. two f32 engines' rounding; the
// fast unmerged path within 2.8e-3 (it runs the adapter's two products in f16, LoraSet::dtype). A missing adapter or
// a wrong scale is more than 1.2 of the row's scale off (AWrongScaleOrAMissingAdapterFails), far past both limits.
constexpr double kF32Tol = 2e-5;
constexpr double kF16LoraTol = 6e-3;  // test_lora.cpp's limit for the unmerged f16 adapter products

void expect_agrees(const std::vector<float>& got, const Rows& want, double tol, const std::string& what) {
  const Agreement r = compare(got, want);
  std::printf("  %-40s nMSE %.3g, max error %.3g of the row's scale, top-1 %d/%zu\n", what.c_str(), r.nmse, r.max_rel,
              r.top1, want.size());
  EXPECT_LE(r.max_rel, tol) << what;
  EXPECT_EQ(r.top1, static_cast<int>(want.size())) << what;
}

TEST(LoraLlamaCpp, BaseGgufMatchesLlamaCpp) {
  for (bool reference : {true, false})
    expect_agrees(run({}, false, reference), golden().base, kF32Tol,
                  fmt::format("no adapter, reference={}", reference));
}

TEST(LoraLlamaCpp, GgufAdapterMatchesLlamaCpp) {
  for (bool reference : {true, false})
    for (bool merge : {false, true})
      expect_agrees(run({{path("adapter_a.gguf")}}, merge, reference), golden().a,
                    reference || merge ? kF32Tol : kF16LoraTol,
                    fmt::format("adapter_a.gguf, reference={} merge={}", reference, merge));
}

// The PEFT folder the GGUF adapter was converted from, on the GGUF base: its B rows of q and k are permuted to the
// GGUF layout at load (docs/LORA.md), which llama.cpp's converter did to adapter_a.gguf.
TEST(LoraLlamaCpp, PeftFormOnTheGgufBaseMatchesLlamaCpp) {
  expect_agrees(run({{path("adapter_a")}}, false, true), golden().a, kF32Tol, "adapter_a (PEFT), reference");
}

// What the adapter adds (logits with it minus without) agrees with what it adds in llama.cpp, not only the sums.
TEST(LoraLlamaCpp, AdapterEffectMatchesLlamaCpp) {
  const std::vector<float> with = run({{path("adapter_a.gguf")}}, false, true), without = run({}, false, true);
  ASSERT_EQ(with.size(), without.size());
  std::vector<double> effect(with.size());
  for (size_t i = 0; i < with.size(); ++i) effect[i] = double(with[i]) - without[i];
  Rows want = golden().a;
  double largest = 0;
  for (size_t t = 0; t < want.size(); ++t)
    for (size_t i = 0; i < want[t].size(); ++i) {
      want[t][i] -= golden().base[t][i];
      largest = std::max(largest, std::fabs(want[t][i]));
    }
  const Agreement r = compare(effect, want);
  std::printf("  adapter effect: largest %.3f, nMSE %.3g, max error %.3g of the row's scale\n", largest, r.nmse,
              r.max_rel);
  EXPECT_GT(largest, 0.5);  // the adapter moves the logits visibly
  EXPECT_LT(r.nmse, 1e-8);
}

// The golden data is right, not only shared: llama.cpp's logits with and without the adapter equal transformers +
// peft's float64 ones of the same base and PEFT adapter (golden.json, python/make_lora_golden.py), so llama.cpp's
// scale of a converted adapter (alpha / r, from adapter.lora.alpha) is peft's.
TEST(LoraLlamaCpp, LlamaCppEqualsPeft) {
  nlohmann::json hf;
  std::ifstream(path("golden.json")) >> hf;
  ASSERT_EQ(hf["ids"].get<std::vector<int32_t>>(), golden().ids);
  for (const auto& [key, want] : {std::pair{"base", &golden().base}, std::pair{"a", &golden().a}}) {
    std::vector<double> got;
    for (const auto& row : *want) got.insert(got.end(), row.begin(), row.end());
    const Agreement r = compare(got, hf[key].get<Rows>());
    std::printf("  llama.cpp against peft, %-4s nMSE %.3g, max error %.3g of the row's scale\n", key, r.nmse,
                r.max_rel);
    EXPECT_LE(r.max_rel, kF32Tol) << key;
  }
}

// The limits above fail a wrong adapter scale (llama.cpp's alpha / r taken as 1, or applied twice) and a missing
// adapter: each of those is far past the looser (f16) limit against llama.cpp's logits with the adapter.
TEST(LoraLlamaCpp, AWrongScaleOrAMissingAdapterFails) {
  const struct {
    float scale;  // of adapter_a.gguf (alpha 8, r 4: scale 1 is an update of 2·B·A); 0: no adapter
    const char* what;
  } wrong[] = {{0.0f, "no adapter"}, {0.5f, "scale 1 instead of alpha / r"}, {2.0f, "alpha / r applied twice"}};
  for (const auto& w : wrong) {
    const std::vector<LoraSpec> lora =
        w.scale == 0 ? std::vector<LoraSpec>{} : std::vector<LoraSpec>{{path("adapter_a.gguf"), w.scale}};
    const Agreement r = compare(run(lora, false, true), golden().a);
    std::printf("  %-40s nMSE %.3g, max error %.3g of the row's scale, top-1 %d/%zu\n", w.what, r.nmse, r.max_rel,
                r.top1, golden().a.size());
    EXPECT_GT(r.max_rel, 10 * kF16LoraTol) << w.what;
  }
}

}  // namespace
}  // namespace tessera
